"""The ways in (`attach`, `enable()`, a Hub `custom_generate` repo) and the import-time guard between them: a call
that names a rule on a model none of them covers raises an error naming the fixes; one without our fields reaches
transformers' `generate()` untouched."""

from __future__ import annotations

import pytest
import torch
from conftest import perturbed_copy, prompt, tiny_llama, tiny_tokenizer
from transformers import GenerationConfig, GenerationMixin, pipeline

import hf_semspec
from hf_semspec import _transformers_compat as compat
from hf_semspec import enabling
from hf_semspec.errors import SemSpecConfigError

NOT_ENABLED = r"hf_semspec is not enabled for this model.*hf_semspec\.attach\(model\).*hf_semspec\.enable\(\)"


@pytest.fixture
def pair():
    target = tiny_llama(seed=0)
    return target, perturbed_copy(target, scale=0.3, seed=2)


@pytest.fixture
def enabled():
    hf_semspec.enable()
    yield
    hf_semspec.disable()


def transformers_generate():
    """transformers' own `generate()`, behind the guard that `import hf_semspec` installed (and `enable()`'s)."""
    function = compat.class_generate()
    assert getattr(function, "__hf_semspec__", None) in ("guard", "enabled")
    while getattr(function, "__hf_semspec__", None) is not None:
        function = function.__wrapped__
    return function


@pytest.mark.parametrize("field, value", [
    ("acceptance", "exact"), ("acceptance_kwargs", {"window": 3}), ("draft_length", "tapout"),
    ("draft_length_kwargs", {"max_tokens": 4}),
])
def test_a_field_in_the_call_of_an_unattached_model_names_the_fixes(pair, field, value):
    target, draft = pair
    with pytest.raises(SemSpecConfigError, match=rf"got {field}=.*{NOT_ENABLED}"):
        target.generate(prompt(8), assistant_model=draft, max_new_tokens=4, **{field: value})


def test_a_rule_in_a_generation_config_is_refused_where_it_would_decode(pair):
    target, draft = pair
    ids = prompt(8)
    with pytest.raises(SemSpecConfigError, match=r"got generation_config\.acceptance='exact'.*" + NOT_ENABLED):
        target.generate(ids, generation_config=GenerationConfig(acceptance="exact", max_new_tokens=4))
    target.generation_config.acceptance = "fly"  # as a saved default reloads
    with pytest.raises(SemSpecConfigError, match=r"model\.generation_config\.acceptance='fly' \(with assistant_model"):
        target.generate(ids, assistant_model=draft, max_new_tokens=4)
    # The model's default without a draft stays plain decoding (as for an attached model), and acceptance=None turns
    # it off: stock assisted generation, whose calls of the draft's generate() carry the target's config, rule included.
    plain = transformers_generate()(target, ids, max_new_tokens=6, do_sample=False)
    assert torch.equal(target.generate(ids, max_new_tokens=6, do_sample=False), plain)
    assisted = target.generate(ids, assistant_model=draft, acceptance=None, max_new_tokens=6, do_sample=False)
    assert torch.equal(assisted, plain)


def test_a_call_without_our_fields_reaches_transformers_as_it_was(pair):
    target, draft = pair
    ids = prompt(8)
    stock = transformers_generate()
    for kwargs in ({}, {"assistant_model": draft}, {"do_sample": True, "top_k": 5}):
        torch.manual_seed(3)
        through_guard = target.generate(ids, max_new_tokens=6, **kwargs)
        torch.manual_seed(3)
        assert torch.equal(through_guard, stock(target, ids, max_new_tokens=6, **kwargs))

    received = []
    guarded = enabling._guarded(lambda model, *args, **kwargs: received.append((model, args, kwargs)) or "out")
    config = GenerationConfig(max_new_tokens=3)
    assert guarded(target, ids, config, assistant_model=draft, foo=1) == "out"
    ((model, args, kwargs),) = received
    assert model is target and args[0] is ids and args[1] is config and kwargs == {"assistant_model": draft, "foo": 1}


def test_custom_generate_goes_through_untouched(pair):
    target, draft = pair
    received = []
    guarded = enabling._guarded(lambda model, *args, **kwargs: received.append(kwargs))
    guarded(target, custom_generate="user/repo", trust_remote_code=True, assistant_model=draft, acceptance="exact")
    assert received == [{"custom_generate": "user/repo", "trust_remote_code": True, "assistant_model": draft,
                         "acceptance": "exact"}]


def test_enable_covers_every_model_and_disable_restores_exactly_what_was_there(pair, monkeypatch):
    target, draft = pair
    before = compat.class_generate()
    hf_semspec.enable()
    hf_semspec.enable()  # idempotent
    try:
        assert hf_semspec.is_enabled()
        out = target.generate(prompt(8), assistant_model=draft, acceptance="exact", max_new_tokens=8,
                              return_dict_in_generate=True)
        assert out.acceptance_stats.num_drafted > 0
        plain = transformers_generate()(target, prompt(8), max_new_tokens=8, do_sample=False)
        assert torch.equal(out.sequences, plain)
        # Stock assisted generation with a default rule turned off: the draft's own calls stay stock.
        target.generation_config.acceptance = "exact"
        assisted = target.generate(prompt(8), assistant_model=draft, acceptance=None, max_new_tokens=8)
        assert torch.equal(assisted, plain)
        # An attached model stays attached.
        hf_semspec.attach(target)
        assert target.generate(prompt(8), assistant_model=draft, max_new_tokens=8, return_dict_in_generate=True).acceptance_stats
    finally:
        hf_semspec.detach(target)
        hf_semspec.disable()
    hf_semspec.disable()  # idempotent
    assert compat.class_generate() is before and not hf_semspec.is_enabled()
    with pytest.raises(SemSpecConfigError, match=NOT_ENABLED):
        target.generate(prompt(8), assistant_model=draft, max_new_tokens=4)

    hf_semspec.enable()
    monkeypatch.setattr(GenerationMixin, "generate", lambda *a, **k: None)  # someone else's patch on top of ours
    with pytest.raises(RuntimeError, match=r"replaced after hf_semspec.enable\(\).*undo that replacement first"):
        hf_semspec.disable()
    monkeypatch.undo()
    hf_semspec.disable()
    assert compat.class_generate() is before


def test_a_pipeline_from_a_saved_path_takes_acceptance_after_enable(tmp_path, pair, monkeypatch):
    target, draft = pair
    target.save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    pipe = pipeline("text-generation", model=str(tmp_path))
    call = dict(assistant_model=draft, acceptance="exact", max_new_tokens=6, do_sample=False, return_full_text=False)
    with pytest.raises(SemSpecConfigError, match=r"got acceptance='exact'.*" + NOT_ENABLED):
        pipe("abcdef", **call)

    loops = []
    loop = hf_semspec.generation.speculative_decode
    monkeypatch.setattr(hf_semspec.generation, "speculative_decode", lambda *a, **k: loops.append(1) or loop(*a, **k))
    hf_semspec.enable()
    try:
        text = pipe("abcdef", **call)[0]["generated_text"]
    finally:
        hf_semspec.disable()
    assert loops == [1]  # our loop ran
    assert text == pipe("abcdef", max_new_tokens=6, do_sample=False, return_full_text=False)[0]["generated_text"]
