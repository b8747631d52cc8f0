"""The one table of `GenerationConfig` fields (`hf_semspec.generation_fields`): it names every field of the installed
transformers, a field it does not name fails here (shown with a fake one), and every field it limits is refused with
its own error, one test per field built from the table."""

from __future__ import annotations

import pytest
from conftest import perturbed_copy, prompt, tiny_llama
from transformers import GenerationConfig

import hf_semspec
from hf_semspec.errors import SemSpecConfigError
from hf_semspec.generation_fields import (
    GENERATION_FIELDS,
    IN_GENERATE,
    KINDS,
    REFUSED,
    FieldUse,
    unclassified_fields,
)


def installed_fields() -> list[str]:
    return sorted(vars(GenerationConfig()))


def test_every_field_of_the_installed_generation_config_is_classified():
    missing = unclassified_fields(installed_fields())
    assert missing == [], (
        f"transformers' GenerationConfig has fields hf_semspec's table does not name: {missing}. Classify each in "
        "hf_semspec/generation_fields.py (honoured by the loop, handed to transformers' processors, refused with a "
        "fix, or irrelevant)"
    )


def test_a_field_the_table_does_not_name_fails_the_check():
    """What the next transformers release looks like: a config with one more field."""

    class NextGenerationConfig(GenerationConfig):
        def __init__(self, **kwargs):
            self.speculation_budget = kwargs.pop("speculation_budget", None)
            super().__init__(**kwargs)

    assert unclassified_fields(vars(NextGenerationConfig())) == ["speculation_budget"]
    assert unclassified_fields(["_private", "max_length"]) == []  # private attributes are not fields


def test_the_table_covers_the_fields_the_issue_names():
    for name in ("assistant_ensemble_weight", "speculation_type", "continuous_batching_config", "top_h",
                 "use_mtp", "prefill_chunk_size"):
        assert name in GENERATION_FIELDS
    assert GENERATION_FIELDS["speculation_type"].kind == REFUSED


def test_entries_are_well_formed():
    for name, use in GENERATION_FIELDS.items():
        assert use.kind in KINDS and use.why, name
    with pytest.raises(ValueError, match="REFUSED field needs `allowed`"):
        FieldUse(REFUSED, "why")
    with pytest.raises(ValueError, match="needs a `fix` and an `example`"):
        FieldUse("loop", "why", allowed=(True,))
    with pytest.raises(ValueError, match="use one of"):
        FieldUse("ignored", "why")


LIMITED = sorted(name for name, use in GENERATION_FIELDS.items() if use.allowed is not None)


@pytest.fixture(scope="module")
def pair():
    target = hf_semspec.attach(tiny_llama(seed=0))
    return target, perturbed_copy(target, scale=0.3, seed=2)


@pytest.mark.parametrize("name", LIMITED)
@pytest.mark.parametrize("where", ["call", "generation_config"])
def test_every_limited_field_is_refused_naming_itself(pair, name, where):
    target, draft = pair
    use = GENERATION_FIELDS[name]
    value = use.example
    kwargs = {name: value} if where == "call" else {"generation_config": GenerationConfig(**{name: value})}
    field = name if where == "call" or use.checked != IN_GENERATE else f"generation_config.{name}"
    with pytest.raises(SemSpecConfigError, match=rf"`({field}|{name})` = .*Fix: "):
        target.generate(prompt(8), assistant_model=draft, acceptance="exact", max_new_tokens=4, **kwargs)


@pytest.mark.parametrize("name", [n for n in LIMITED if GENERATION_FIELDS[n].checked != IN_GENERATE])
def test_neutral_values_pass(pair, name):
    """None, transformers' default and the allowed values decode."""
    target, draft = pair
    for value in GENERATION_FIELDS[name].allowed:
        out = target.generate(prompt(8), assistant_model=draft, acceptance="exact", max_new_tokens=4, **{name: value})
        assert out.shape[1] == 12, (name, value)
