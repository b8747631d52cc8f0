"""`CallFields`: a call's fields, resolved once from the call, a passed `GenerationConfig` and the model's, read the
three ways docs/usage.md states (`merged`, `chosen`, `component`), and `given` for what was set for this call."""

import pytest
from transformers import GenerationConfig

from hf_semspec.call_fields import CALL, MODEL, PASSED_CONFIG, CallFields
from hf_semspec.errors import SemSpecConfigError


def fields(call=None, passed=None, **model_fields) -> CallFields:
    model = GenerationConfig()
    for name, value in model_fields.items():
        setattr(model, name, value)
    return CallFields(model, passed, call or {})


def test_merged_reads_as_transformers_merges_an_explicit_none_included():
    assert fields({"max_matching_ngram_size": 3}, GenerationConfig(max_matching_ngram_size=4),
                  max_matching_ngram_size=5).merged("max_matching_ngram_size") == (3, "max_matching_ngram_size")
    # the call's None wins over both configs (transformers reads it as unset there)
    assert fields({"stop_strings": None}, GenerationConfig(stop_strings=["x"]),
                  stop_strings=["y"]).merged("stop_strings") == (None, "stop_strings")
    assert fields({}, GenerationConfig(stop_strings=["x"]), stop_strings=["y"]).merged("stop_strings") == (
        ["x"], "generation_config.stop_strings")
    assert fields({}, GenerationConfig(), stop_strings=["y"]).merged("stop_strings") == (
        ["y"], "model.generation_config.stop_strings")
    assert fields().merged("drafting") == (None, "model.generation_config.drafting")


def test_chosen_skips_a_passed_copy_of_the_model_s_own_and_a_prepared_default():
    assert fields({"num_assistant_tokens": 3}, GenerationConfig(num_assistant_tokens=4),
                  num_assistant_tokens=6).chosen("num_assistant_tokens") == (3, CALL)
    assert fields({}, GenerationConfig(num_assistant_tokens=4),
                  num_assistant_tokens=6).chosen("num_assistant_tokens") == (4, PASSED_CONFIG)
    # a passed config equal to the model's own asks for nothing: the value is the model's
    assert fields({}, GenerationConfig(num_assistant_tokens=6),
                  num_assistant_tokens=6).chosen("num_assistant_tokens") == (6, MODEL)
    # the call's None is not a value here: the next place decides
    assert fields({"num_assistant_tokens": None}, None, num_assistant_tokens=6).chosen("num_assistant_tokens") == (
        6, MODEL)
    assert fields().chosen("assistant_confidence_threshold", (CALL, PASSED_CONFIG)) == (None, None)


def test_passed_ignores_what_transformers_filled_in_a_prepared_config():
    model = GenerationConfig()
    model.num_assistant_tokens = None
    model.assistant_confidence_threshold = None
    from hf_semspec._transformers_compat import generation_defaults

    prepared = GenerationConfig(**{k: v for k, v in generation_defaults().items() if v is not None})
    call = CallFields(model, prepared, {})
    assert call.passed("assistant_confidence_threshold") is None  # transformers' 0.4, not the caller's
    prepared.assistant_confidence_threshold = 0.3
    assert call.passed("assistant_confidence_threshold") == 0.3


def test_given_is_the_call_then_a_passed_config_never_the_model_s():
    assert fields({"draft_length": None, "draft_length_kwargs": {"a": 1}}).given(
        "draft_length", "draft_length_kwargs") == ("draft_length_kwargs", {"a": 1})
    assert fields({}, GenerationConfig(draft_length="tapout")).given("draft_length_kwargs", "draft_length") == (
        "generation_config.draft_length", "tapout")
    assert fields({}, None, draft_length="tapout").given("draft_length") is None
    # a call's value comes before any passed config's, whatever the order of the names
    assert fields({"drafting": "auto"}, GenerationConfig(draft_length="tapout")).given(
        "draft_length", "drafting") == ("drafting", "auto")


def test_component_keeps_a_name_with_its_own_options():
    model = {"acceptance": "fly", "acceptance_kwargs": {"window": 2}}
    assert fields({}, None, **model).component("acceptance", "acceptance_kwargs", listing_function="f") == (
        "fly", {"window": 2}, "model")
    assert fields({"acceptance": "ears"}, None, **model).component(
        "acceptance", "acceptance_kwargs", listing_function="f") == ("ears", None, "call")
    copy_of_model = GenerationConfig(acceptance="fly", acceptance_kwargs={"window": 2})
    assert fields({}, copy_of_model, **model).component("acceptance", "acceptance_kwargs",
                                                        listing_function="f")[2] == "model"
    with pytest.raises(SemSpecConfigError, match=r"`generation_config.acceptance_kwargs` = \{'window': 3\} .*only "
                                                 r"together with `acceptance`.*f\(\) lists the names"):
        fields({}, GenerationConfig(acceptance_kwargs={"window": 3})).component(
            "acceptance", "acceptance_kwargs", listing_function="f")
    # the model's own orphans are an error only where asked
    orphan = fields({}, None, draft_length_kwargs={"initial_tokens": 3})
    assert orphan.component("draft_length", "draft_length_kwargs", listing_function="f") == (None, None, None)
    with pytest.raises(SemSpecConfigError, match=r"`model.generation_config.draft_length_kwargs`"):
        orphan.component("draft_length", "draft_length_kwargs", listing_function="f", model_orphans_are_errors=True)


def test_place_of_finds_the_object_s_place():
    options = {"initial_tokens": 3}
    passed = GenerationConfig(draft_length_kwargs={"initial_tokens": 4})
    call = fields({"draft_length_kwargs": options}, passed)
    assert call.place_of("draft_length_kwargs", options) == CALL
    assert call.place_of("draft_length_kwargs", passed.draft_length_kwargs) == PASSED_CONFIG
    assert call.place_of("draft_length_kwargs", {"initial_tokens": 3}) == MODEL  # equal, not the call's object


def test_for_transformers_hides_a_field_the_loop_read():
    # in the call or the model's config: the call's None overrides it
    kwargs = {"prompt_lookup_num_tokens": 4}
    passed = GenerationConfig(prompt_lookup_num_tokens=5)
    assert fields(kwargs).for_transformers("prompt_lookup_num_tokens", kwargs, passed) is passed
    assert kwargs == {"prompt_lookup_num_tokens": None}
    # only in a passed config: cleared in a copy, the caller's config untouched
    kwargs = {}
    handed = fields({}, passed).for_transformers("prompt_lookup_num_tokens", kwargs, passed)
    assert handed is not passed and handed.prompt_lookup_num_tokens is None and passed.prompt_lookup_num_tokens == 5
    assert kwargs == {}
    kwargs = {}
    fields({}, None, prompt_lookup_num_tokens=3).for_transformers("prompt_lookup_num_tokens", kwargs, None)
    assert kwargs == {"prompt_lookup_num_tokens": None}
