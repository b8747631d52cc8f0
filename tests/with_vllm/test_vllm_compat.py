"""What hf_semspec/_vllm_compat.py touches in vLLM's private API, pinned: a vLLM release that changes any of it
fails here, not in a user's engine."""

from __future__ import annotations

import inspect

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed: these tests run in the vLLM venv (.ci/run)")

from vllm.v1.sample import rejection_sampler  # noqa: E402

from hf_semspec import _vllm_compat  # noqa: E402


def test_the_installed_vllm_is_in_the_supported_range():
    _vllm_compat.check_version()


def test_rejection_sample_and_the_sampler_take_what_the_hooks_pass():
    _vllm_compat.install(lambda *a: None, lambda *a: None)  # (idempotent: the engine tests install it too)
    original = rejection_sampler.rejection_sample
    assert rejection_sampler._hf_semspec_installed
    # the hook wraps vLLM's function; its closure holds the original, whose parameters are the ones passed on
    vllm_function = next(cell.cell_contents for cell in original.__closure__
                         if getattr(cell.cell_contents, "__name__", "") == "rejection_sample")
    assert list(inspect.signature(vllm_function).parameters)[:8] == [
        "draft_token_ids", "num_draft_tokens", "max_spec_len", "cu_num_draft_tokens", "draft_probs", "target_logits",
        "bonus_token_ids", "sampling_metadata"]
    vllm_init = next(cell.cell_contents for cell in rejection_sampler.RejectionSampler.__init__.__closure__
                     if getattr(cell.cell_contents, "__name__", "") == "__init__")
    assert list(inspect.signature(vllm_init).parameters) == ["self", "sampler", "spec_config", "device"]
    assert rejection_sampler.PLACEHOLDER_TOKEN_ID == -1 and rejection_sampler.GREEDY_TEMPERATURE == 0


def test_sampling_metadata_has_the_flags_the_hook_reads():
    from vllm.v1.sample.metadata import SamplingMetadata

    fields = set(SamplingMetadata.__dataclass_fields__)
    assert {"all_greedy", "all_random", "temperature"} <= fields


def test_the_placeholder_is_the_plugin_s():
    from hf_semspec.vllm_plugin import PLACEHOLDER_TOKEN_ID

    assert PLACEHOLDER_TOKEN_ID == rejection_sampler.PLACEHOLDER_TOKEN_ID


def test_an_engine_on_model_runner_v2_that_names_a_rule_fails_with_the_fix():
    """Model Runner V2 (GPUs with Triton) has a rejection sampler the hooks do not reach: refused, never ignored."""
    from types import SimpleNamespace

    from hf_semspec.errors import SemSpecConfigError
    from hf_semspec.vllm_plugin import rule_for_engine
    from vllm.v1.worker.gpu.spec_decode import rejection_sampler as sampler_v2

    _vllm_compat.install(rule_for_engine, lambda *a: None)
    assert any(getattr(cell.cell_contents, "__name__", "") == "__init__"
               for cell in sampler_v2.RejectionSampler.__init__.__closure__)  # wrapped
    spec = SimpleNamespace(method="draft_model", rejection_sample_method="standard")
    with pytest.raises(SemSpecConfigError, match=r"`VLLM_USE_V2_MODEL_RUNNER`.*Fix: set VLLM_USE_V2_MODEL_RUNNER=0"):
        _vllm_compat.check_model_runner_v2(rule_for_engine,
                                           SimpleNamespace(additional_config={"hf_semspec": {"acceptance": "fly"}}),
                                           spec)
    for additional_config in ({}, {"hf_semspec": {"acceptance": "exact"}}):  # vLLM's own verification: fine there
        _vllm_compat.check_model_runner_v2(rule_for_engine, SimpleNamespace(additional_config=additional_config), spec)
