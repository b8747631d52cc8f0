"""The ways in (`attach`, `enable()`, a Hub `custom_generate` repo) and the import-time guard between them: a call
that names a rule on a model none of them covers raises an error naming the fixes; one without our fields reaches
transformers' `generate()` untouched."""

from __future__ import annotations

import functools
import importlib
import itertools
import threading

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


def test_a_generation_config_or_draft_passed_by_position_is_checked_too(pair):
    target, draft = pair
    ids = prompt(8)
    # generate(inputs, generation_config, logits_processor, stopping_criteria, prefix_allowed_tokens_fn, synced_gpus,
    # assistant_model, ...): a guard that read keywords only would hand both calls to transformers, which decodes
    # without the rule.
    with pytest.raises(SemSpecConfigError, match=r"got generation_config\.acceptance='fly'.*" + NOT_ENABLED):
        target.generate(ids, GenerationConfig(acceptance="fly", max_new_tokens=4))
    target.generation_config.acceptance = "fly"
    with pytest.raises(SemSpecConfigError, match=r"model\.generation_config\.acceptance='fly' \(with assistant_model"):
        target.generate(ids, GenerationConfig(max_new_tokens=4), None, None, None, None, draft)


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

    # Someone else's patch on top of ours, which disable() would undo too: one made with functools.wraps (which copies
    # our marks onto it, and records what it wraps), then one that hides what it replaced.
    hf_semspec.enable()
    monkeypatch.setattr(GenerationMixin, "generate", functools.wraps(compat.class_generate())(lambda *a, **k: None))
    assert hf_semspec.is_enabled()
    with pytest.raises(RuntimeError, match=r"replaced after hf_semspec.enable\(\).*undo that replacement first"):
        hf_semspec.disable()
    monkeypatch.setattr(GenerationMixin, "generate", lambda *a, **k: None)
    with pytest.raises(RuntimeError, match=r"replaced after hf_semspec was imported.*undo that replacement first"):
        hf_semspec.disable()
    monkeypatch.undo()
    hf_semspec.disable()
    assert compat.class_generate() is before


def layers(mark):
    """How many of hf_semspec's functions marked `mark` stand in front of transformers' `generate()`."""
    function, count = compat.class_generate(), 0
    while getattr(function, "__hf_semspec__", None) is not None:
        count += getattr(function, "__hf_semspec__") == mark
        function = function.__wrapped__
    return count


def test_enable_survives_a_reload_of_its_module(monkeypatch):
    before = compat.class_generate()
    monkeypatch.setattr(GenerationMixin, "generate", before)  # put back after the test, whatever it leaves
    lock = enabling._LOCK
    hf_semspec.enable()
    importlib.reload(enabling)
    assert enabling._LOCK is lock
    assert enabling.is_enabled() and hf_semspec.is_enabled()
    enabling.enable()  # still enabled: changes nothing
    assert layers("enabled") == 1
    enabling.disable()
    assert compat.class_generate() is before and not hf_semspec.is_enabled()

    enabling.enable()
    importlib.reload(enabling)
    assert enabling.is_enabled()
    hf_semspec.disable()  # the function from before both reloads
    assert compat.class_generate() is before and not enabling.is_enabled()


@pytest.mark.parametrize("install, mark", [("enable", "enabled"), ("install_guard", "guard")])
def test_two_threads_installing_at_once_leave_one_layer(monkeypatch, install, mark):
    start_from = transformers_generate() if mark == "guard" else compat.class_generate()
    monkeypatch.setattr(GenerationMixin, "generate", start_from)  # and back after the test
    # Each thread's first look at GenerationMixin.generate is its check. Without a lock around check and act, this
    # order: both threads check, then one installs, then the other, on top.
    read, write = compat.class_generate, compat.set_class_generate
    arrival, checked = itertools.count(), threading.local()
    second_checked, first_installed = threading.Event(), threading.Event()

    def class_generate():
        function = read()
        if threading.current_thread().name == "installer" and not getattr(checked, "done", False):
            checked.done = True
            if next(arrival) == 0:
                second_checked.wait(timeout=1)  # with the lock, the other thread waits for this one to finish
            else:
                second_checked.set()
                first_installed.wait(timeout=1)
        return function

    monkeypatch.setattr(compat, "class_generate", class_generate)
    monkeypatch.setattr(compat, "set_class_generate", lambda function: write(function) or first_installed.set())
    errors = []

    def run():
        try:
            getattr(hf_semspec, install)()
        except BaseException as error:  # noqa: BLE001 -- reported by the assertion below
            errors.append(error)

    threads = [threading.Thread(target=run, name="installer") for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors and second_checked.is_set() and layers(mark) == 1


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
