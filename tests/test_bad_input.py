"""Every bad input gets an error naming the field, the value received, what is allowed and the fix — raised before
any decoding starts."""

from __future__ import annotations

import pytest
import torch
from conftest import prompt, tiny_llama
from transformers import GenerationConfig, StaticCache

import hf_semspec
from hf_semspec import SemSpecConfigError
from hf_semspec._transformers_compat import CACHE_ARGUMENT


@pytest.fixture
def no_forward(monkeypatch, attached, close_draft):
    """Fails the test if any model forward runs: errors must come before decoding starts."""

    def forbidden(*args, **kwargs):
        raise AssertionError("a forward pass ran before the bad input was rejected")

    for model in (attached, close_draft):
        # In the instance's __dict__, removed afterwards: pytest < 9.2's monkeypatch.setattr restores the bound class
        # method there, which then shadows a later test's patch of the class's forward on these session-wide models.
        monkeypatch.setitem(vars(model), "forward", forbidden)
    return attached, close_draft


def generate(models, **kwargs):
    target, draft = models
    kwargs.setdefault("assistant_model", draft)
    kwargs.setdefault("max_new_tokens", 5)
    return target.generate(kwargs.pop("input_ids", prompt(6)), **kwargs)


def test_unknown_rule_lists_available(no_forward):
    with pytest.raises(SemSpecConfigError, match=r"`acceptance` = 'exactt'.*allowed one of \[.*'exact'.*\]"):
        generate(no_forward, acceptance="exactt")


def test_unknown_acceptance_kwarg(no_forward):
    with pytest.raises(SemSpecConfigError, match=r"unknown option\(s\) \['beta'\] for 'exact'.*Fix"):
        generate(no_forward, acceptance="exact", acceptance_kwargs={"beta": 0.1})


def test_acceptance_kwargs_not_a_dict(no_forward):
    with pytest.raises(SemSpecConfigError, match=r"`acceptance_kwargs` = \[1\].*a dict of options"):
        generate(no_forward, acceptance="exact", acceptance_kwargs=[1])


def test_acceptance_kwargs_without_acceptance(no_forward):
    with pytest.raises(SemSpecConfigError, match=r"`acceptance_kwargs`.*only together with `acceptance`"):
        generate(no_forward, acceptance_kwargs={})


def test_acceptance_without_assistant_model(no_forward):
    with pytest.raises(SemSpecConfigError, match=r"`assistant_model` = None.*acceptance='exact'.*Fix: pass assistant_model"):
        generate(no_forward, acceptance="exact", assistant_model=None)


def test_a_misspelled_field_in_a_generation_config_is_named(no_forward, tmp_path, monkeypatch):
    # A GenerationConfig keeps unknown keys, which nothing read: decoding went on silently without the rule.
    from transformers import GenerationConfig

    GenerationConfig(acceptence="fly", max_new_tokens=4).save_pretrained(tmp_path)
    loaded = GenerationConfig.from_pretrained(tmp_path)
    with pytest.raises(SemSpecConfigError, match=r"`generation_config.acceptence` = 'fly' is not valid: allowed one of "
                                                 r"the fields hf_semspec reads .*Fix: rename it to 'acceptance'"):
        generate(no_forward, generation_config=loaded)
    target, _ = no_forward
    monkeypatch.setattr(target.generation_config, "draft_lenght", "svip", raising=False)
    with pytest.raises(SemSpecConfigError, match=r"`model.generation_config.draft_lenght` = 'svip' .*'draft_length'"):
        generate(no_forward, acceptance="exact")


def test_a_batch_with_a_processor_that_holds_the_whole_batch(no_forward):
    with pytest.raises(SemSpecConfigError, match=r"batch size.*= 2.*1 with prefix_allowed_tokens_fn.*call generate\(\) "
                                                 r"once per prompt"):
        generate(no_forward, acceptance="exact", input_ids=torch.cat([prompt(6), prompt(6, seed=1)]),
                 prefix_allowed_tokens_fn=lambda batch_id, ids: [4, 5])


def test_greedy_num_return_sequences_gets_transformers_own_error(no_forward):
    """Sampled `num_return_sequences` decodes (tests/test_batch_rows.py); greedy, transformers itself refuses."""
    with pytest.raises(ValueError, match=r"Greedy methods .* do not support `num_return_sequences`"):
        generate(no_forward, acceptance="exact", num_return_sequences=2, do_sample=False)


def test_beams(no_forward):
    with pytest.raises(SemSpecConfigError, match=r"`num_beams` = 3.*remove num_beams"):
        generate(no_forward, acceptance="exact", num_beams=3)


def test_vocab_mismatch(no_forward):
    target, _ = no_forward
    other_vocab = tiny_llama(seed=3, vocab_size=96)
    with pytest.raises(SemSpecConfigError, match=r"vocab_size\)` = 96.*target's vocab_size 128"):
        generate((target, other_vocab), acceptance="exact")


def test_assistant_model_not_a_model(no_forward):
    with pytest.raises(SemSpecConfigError, match=r"`assistant_model` = 'str'.*causal LM"):
        generate(no_forward, acceptance="exact", assistant_model="draft")


@pytest.mark.parametrize("value", [0, -1, 1000, 2.5, True])
def test_num_assistant_tokens_out_of_range(no_forward, value):
    with pytest.raises(SemSpecConfigError, match=r"`num_assistant_tokens` = .*an int in \[1, 128\]"):
        generate(no_forward, acceptance="exact", num_assistant_tokens=value)


def test_schedule_conflicting_with_draft_length_is_rejected(no_forward):
    with pytest.raises(SemSpecConfigError, match=r"`num_assistant_tokens_schedule` = 'heuristic'.*draft_length='constant'"):
        generate(no_forward, acceptance="exact", draft_length="constant", num_assistant_tokens_schedule="heuristic")


def test_empty_prompt(no_forward):
    with pytest.raises(SemSpecConfigError, match=r"prompt length\)` = 0.*non-empty prompt"):
        generate(no_forward, acceptance="exact", input_ids=torch.zeros(1, 0, dtype=torch.long))


@pytest.mark.parametrize("value", [0, -3])
def test_empty_max_new_tokens(no_forward, value):
    # transformers itself rejects this before our loop runs; the message names the field.
    with pytest.raises(ValueError, match=r"max_new_tokens"):
        generate(no_forward, acceptance="exact", max_new_tokens=value)


@pytest.mark.parametrize("implementation", ["offloaded", "offloaded_static"])
def test_cache_implementations_other_than_dynamic_or_static(no_forward, implementation):
    with pytest.raises(SemSpecConfigError, match=rf"`cache_implementation` = '{implementation}' .*allowed one of "
                                                 r"\(None, 'dynamic', 'static'\)"):
        generate(no_forward, acceptance="exact", cache_implementation=implementation)


def test_a_static_cache_passed_by_the_user(no_forward):
    target, _ = no_forward
    static = StaticCache(config=target.config, max_cache_len=32)
    with pytest.raises(SemSpecConfigError, match=rf"`{CACHE_ARGUMENT}` = 'StaticCache' .*allowed a DynamicCache.*"
                                                 rf"Fix: pass {CACHE_ARGUMENT}=DynamicCache"):
        generate(no_forward, acceptance="exact", **{CACHE_ARGUMENT: static})


@pytest.mark.parametrize(
    "given, message",
    [
        ({"penalty_alpha": 0.6, "top_k": 4}, r"`penalty_alpha` = 0.6 .*None with an acceptance rule \(contrastive search"),
        ({"dola_layers": "low"}, r"`dola_layers` = 'low' .*\(DoLa decoding is another"),
        ({"assistant_early_exit": 1}, r"`assistant_early_exit` = 1 .*\(early-exit self-drafting .*Fix: remove"),
        ({"use_mtp": True}, r"`use_mtp` = True .*\(multi-token-prediction drafting .*Fix: remove use_mtp"),
        ({"prefill_chunk_size": 4}, r"`prefill_chunk_size` = 4 .*prefills the prompt in one forward.*Fix: remove"),
    ],
)
def test_other_decoding_methods_are_not_silently_dropped(no_forward, given, message):
    # transformers ignores them once a decoding loop is passed to it: greedy decoding would run instead.
    with pytest.raises(SemSpecConfigError, match=message):
        generate(no_forward, acceptance="exact", **given)


def test_use_mtp_false_asks_for_no_other_method(attached, close_draft):
    with_false = generate((attached, close_draft), acceptance="exact", use_mtp=False)
    assert torch.equal(with_false, generate((attached, close_draft), acceptance="exact"))


def test_token_healing_and_stop_strings_without_a_tokenizer(no_forward):
    with pytest.raises(SemSpecConfigError, match=r"`token_healing` = True .*Fix: heal the prompt first"):
        generate(no_forward, acceptance="exact", token_healing=True)
    with pytest.raises(SemSpecConfigError, match=r"`tokenizer` = None .*stop_strings=\['x'\].*Fix: pass tokenizer="):
        generate(no_forward, acceptance="exact", stop_strings=["x"])


@pytest.mark.parametrize("in_generation_config", [False, True])
def test_assistant_confidence_threshold_is_not_silently_dropped(no_forward, in_generation_config):
    given = {"assistant_confidence_threshold": 0.4}
    if in_generation_config:
        given = {"generation_config": GenerationConfig(**given)}
    with pytest.raises(SemSpecConfigError, match=r"`assistant_confidence_threshold` = 0.4.*Fix: remove it; draft_len"):
        generate(no_forward, acceptance="exact", **given)


def test_output_attentions(no_forward):
    with pytest.raises(SemSpecConfigError, match=r"`output_attentions` = True"):
        generate(no_forward, acceptance="exact", output_attentions=True, return_dict_in_generate=True)


def test_custom_generate_conflict(no_forward):
    with pytest.raises(SemSpecConfigError, match=r"`custom_generate`.*None together with `acceptance`"):
        generate(no_forward, acceptance="exact", custom_generate=lambda *a, **k: None)


def test_inputs_embeds(no_forward):
    with pytest.raises(SemSpecConfigError, match=r"`inputs_embeds`.*input_ids only"):
        target, draft = no_forward
        target.generate(inputs_embeds=torch.zeros(1, 4, 64), assistant_model=draft, acceptance="exact")


def test_attach_rejects_non_models():
    with pytest.raises(SemSpecConfigError, match=r"`model` = 'Linear'.*GenerationMixin"):
        hf_semspec.attach(torch.nn.Linear(2, 2))


def test_attach_validates_default_acceptance():
    with pytest.raises(SemSpecConfigError, match=r"`acceptance` = 'nope'"):
        hf_semspec.attach(tiny_llama(seed=0), acceptance="nope")


def test_draft_in_other_dtype_works(attached):
    draft = tiny_llama(seed=0).to(torch.float64)
    ids = prompt(6)
    out = attached.generate(ids, assistant_model=draft, acceptance="exact", max_new_tokens=10)
    plain = type(attached).generate(attached, ids, do_sample=False, max_new_tokens=10)
    assert torch.equal(out, plain)


def test_draft_length_without_acceptance(no_forward):
    with pytest.raises(SemSpecConfigError, match=r"`draft_length` = 'heuristic'.*only together with an acceptance rule"):
        generate(no_forward, draft_length="heuristic")


def test_num_assistant_tokens_with_a_policy_instance_is_not_silently_dropped(no_forward):
    from hf_semspec.draft_length.constant import ConstantConfig, ConstantPolicy

    policy = ConstantPolicy(ConstantConfig(num_tokens=4))
    with pytest.raises(SemSpecConfigError, match=r"`num_assistant_tokens` = 2 .*None when draft_length is a policy "
                                                 r"instance. Fix: set the length in the instance's config "
                                                 r"\(ConstantConfig\(num_tokens=\.\.\.\)\)"):
        generate(no_forward, acceptance="exact", draft_length=policy, num_assistant_tokens=2)
    with pytest.raises(SemSpecConfigError, match=r"`num_assistant_tokens` = 3 .*policy instance"):
        generate(no_forward, acceptance="exact", draft_length=policy,
                 generation_config=GenerationConfig(num_assistant_tokens=3, max_new_tokens=5))


def test_num_assistant_tokens_above_an_initial_lengths_cap(no_forward):
    with pytest.raises(SemSpecConfigError, match=r"`num_assistant_tokens` = 8 .*at most draft_length_kwargs"
                                                 r"\['max_tokens'\]=3 .*Fix: lower num_assistant_tokens or raise"):
        generate(no_forward, acceptance="exact", draft_length="heuristic", draft_length_kwargs={"max_tokens": 3},
                 num_assistant_tokens=8)


def test_tapout_arm_beyond_its_policys_cap_is_refused_when_configured(no_forward):
    with pytest.raises(SemSpecConfigError, match=r"`draft_length_kwargs\['arms'\]` = \['best_constant:40', 'svip'\] "
                                                 r".*'best_constant:40' gives .*at most max_tokens=32"):
        generate(no_forward, acceptance="exact", draft_length="tapout",
                 draft_length_kwargs={"arms": ["best_constant:40", "svip"]})


def test_a_policy_given_another_policys_config():
    from hf_semspec.draft_length.adaedl import AdaEDLConfig
    from hf_semspec.draft_length.svip import SVIPPolicy

    with pytest.raises(SemSpecConfigError, match=r"`config` = 'AdaEDLConfig' .*allowed a SVIPConfig for 'svip'"):
        SVIPPolicy(AdaEDLConfig())


def test_assistant_tokenizer_is_refused(no_forward):
    # transformers drops it for a custom decoding loop: a draft with another tokenizer would be verified against
    # the wrong ids.
    with pytest.raises(SemSpecConfigError, match=r"`assistant_tokenizer` = '\w+' .*universal "
                                                 r"assisted decoding .* Fix: drop assistant_tokenizer"):
        from conftest import tiny_tokenizer

        generate(no_forward, acceptance="exact", tokenizer=tiny_tokenizer(), assistant_tokenizer=tiny_tokenizer())


@pytest.mark.parametrize("field", ["draft_length", "draft_length_kwargs", "acceptance_kwargs"])
def test_fields_of_a_passed_config_without_a_rule_are_errors(no_forward, field):
    # As the same fields given to the call are: without a rule anywhere, stock decoding would drop them.
    value = {"draft_length": "svip"}.get(field, {})
    config = GenerationConfig(max_new_tokens=5, **{field: value})
    with pytest.raises(SemSpecConfigError, match=rf"`generation_config.{field}` = .*only together with"):
        generate(no_forward, generation_config=config)


def test_a_model_without_an_lm_head(no_forward):
    from transformers import LlamaModel

    base = LlamaModel(tiny_llama(seed=0).config)
    with pytest.raises(SemSpecConfigError, match=r"`model` = 'LlamaModel' .*GenerationMixin"):
        hf_semspec.generate(base, prompt(6), assistant_model=no_forward[1], acceptance="exact")
    with pytest.raises(SemSpecConfigError, match=r"`assistant_model` = 'LlamaModel' .*an LM head"):
        generate(no_forward, acceptance="exact", assistant_model=base)


def test_attach_validates_before_installing():
    model = tiny_llama(seed=0)
    for bad in ({"acceptance": "exactt"}, {"acceptance_kwargs": {}}, {"acceptance": "fly", "acceptance_kwargs": {"w": 1}}):
        with pytest.raises(SemSpecConfigError):
            hf_semspec.attach(model, **bad)
        assert "generate" not in vars(model), bad  # left as it was: stock generate()
        assert getattr(model.generation_config, "acceptance", None) is None


def test_synthid_watermarking_is_refused(no_forward):
    # Its processor keeps state per call (the contexts it saw); the loop's calls on rejected drafts corrupt it, and
    # even `exact` sampling then differs from plain sampling.
    from transformers import LogitsProcessorList
    from transformers.generation import SynthIDTextWatermarkingConfig, SynthIDTextWatermarkLogitsProcessor

    config = SynthIDTextWatermarkingConfig(keys=[654, 400, 836, 123, 340, 443, 597, 160, 57, 29], ngram_len=3)
    with pytest.raises(SemSpecConfigError, match=r"`watermarking_config` = .*SynthID.* Fix: drop the SynthID"):
        generate(no_forward, acceptance="exact", do_sample=True, watermarking_config=config)
    processor = config.construct_processor(128, "cpu")  # passed in logits_processor= instead
    assert isinstance(processor, SynthIDTextWatermarkLogitsProcessor)
    with pytest.raises(SemSpecConfigError, match=r"`watermarking_config`"):
        generate(no_forward, acceptance="exact", do_sample=True, logits_processor=LogitsProcessorList([processor]))
