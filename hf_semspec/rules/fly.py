"""`fly`: Training-Free Loosely Speculative Decoding (FLy), a lossy rule that keeps "differently worded" drafts.

Li et al., "Training-Free Loosely Speculative Decoding: Accepting Semantically Correct Drafts Beyond Exact Match",
ICLR 2026 (https://arxiv.org/abs/2511.22972); authors' code: https://github.com/AMD-AGI/FLy (`fly/models/FLy.py`,
`SPDGenerate.generate_chunks`, default settings in `fly_config/FLy_Llama3_70b.json`).

A draft token that disagrees with the target is not necessarily wrong: it may be another wording of the same
continuation. FLy keeps such a mismatch when (1) the target "self-corrects" around it, i.e. it goes on agreeing
exactly with the draft for the next W − 1 tokens (token-level deferred window), and (2) the target was genuinely
uncertain at that position (entropy-level gate). The rule is lossy: the output is no longer the target's greedy
output (or a sample from p).

The rule, with positions i = 0 … γ − 1 of a block of γ drafts x̂ (the authors' `spd_k` = k = γ, `win_len` = W,
`entropy_thre` = θ) and p_i the target's distribution at position i (after the logits processors):

    Δ_i = 1[x̂_i = argmax p_i]                                         (greedy: raw, exact acceptance)
    Δ_i = 1[x̂_i ∈ {y_i⁽¹⁾, y_i⁽²⁾}] ∨ 1[u_i·q_i(x̂_i) < p_i(x̂_i)]        (sampling, `sampling="floor"`, default)
    Δ_i = 1[x̂_i ∈ {y_i⁽¹⁾, y_i⁽²⁾}],  x̂_i = argmax q_i                  (sampling, `sampling="greedy_drafts"`)
    D_i = Δ_i ∨ (i + W < γ ∧ Δ_{i+1} ∧ … ∧ Δ_{i+W−1})                   (deferred window, on the raw Δ)
    A_i = D_i ∧ (Δ_i ∨ H_i ≥ θ)                                        (entropy gate, applied after the window)
    H_i = −Σ_{v ∈ top-3(p_i)} p_i(v) ln p_i(v)                         (`entropy="top3"`, default)
    H_i = −Σ_v p_i(v) ln p_i(v) / ln |V|                               (`entropy="normalized_full"`)

with y_i⁽¹⁾, y_i⁽²⁾ ~ p_i two target draws and u_i ~ U[0, 1). With n = the first i where A_i = 0 (n = γ if none), the
round emits x̂_0 … x̂_{n−1}, then the target's token at n: argmax p_n when greedy; when sampling, a draw from the
standard residual norm(max(p_n − q_n, 0)) (`floor`) or the first draw y_n⁽¹⁾ (`greedy_drafts`); after γ acceptances
the bonus token from p_γ. The window looks at the raw Δ of the following positions, so a second
mismatch inside the window blocks the first one (no chaining of flips).

Where the paper text, the issue and the authors' code differ, this module follows the code:

- Entropy. The paper text (as quoted in the issue) gates on the normalised full-vocabulary entropy; the code
  (`calculate_topk_entropy(target_logits, 3)` in `rej_by_entropy`) uses the unnormalised Shannon entropy,
  natural log, of the three largest full-softmax probabilities, *not* renormalised over the top 3 (so it lies in
  [0, ln 3]). The shipped θ = 0.3 goes with the latter, which is the default here; `entropy="normalized_full"` gives the
  paper's reading (in [0, 1]).
- Block end. The issue reads "positions without a full window inside the block fall back to strict", i.e. flips
  for i + W − 1 ≤ γ − 1. The code forces the *last W* positions back to their raw verdict, so position γ − W,
  whose window ends exactly at the last draft, is strict as well: flips need i + W < γ (i ≤ γ − W − 1). With
  γ ≤ W nothing is flipped (the code skips the window when k < W; with k = W the only window is at position 0,
  which is among the last W).
- Which entropy. The code computes H on the raw target logits (temperature 1, no top-k/top-p) even when sampling
  with a temperature; here H is computed from `target_logits`, which are the logits *after* the logits processors
  (temperature, top-k, …), the only logits the rule is given. In greedy decoding without processors both agree.
  Likewise the code's two samples come from softmax(logits / T) without other warpers; here they come from
  `target_probs`, i.e. from the same processed distribution transformers samples from.
- Threshold. The code treats any `entropy_thre` ≤ 0.01 as "gate off"; here θ is applied as given (θ = 0 turns the
  gate off, since H ≥ 0).
- Not part of the acceptance rule, hence not here: the code's n-gram/self-speculative drafting ("multi-level
  acceleration"), its greedy-only drafter, tree verification, and the `abla_no_window` ablation.

Sampling (`do_sample=True`). The authors' code drafts greedily and tests a draft against two target samples. With
drafts *sampled* from q, as the rest of this package samples them, that test alone accepts less than `exact` does
with the same draft (a sampled draft rarely equals one of two target draws where p is flat, where the standard test
u < p/q often keeps it): in the issue's tiny-model run fly kept 4 of 303 drafts against `exact`'s 10 of 89. Two
ways out, both options of `sampling`:

- `"floor"` (default): keep the sampled drafts and let the standard test count as a match in Δ, so every draft that
  `exact` keeps with the same uniforms is kept (tested), the window and the gate can only add to that, and a
  rejection emits the standard residual;
- `"greedy_drafts"`: follow the authors (the drafter proposes argmax q; Δ is the two-draw test alone). This does not
  guarantee exact's acceptance: where p is flat and q ≈ p, P(x̂ ∈ {y⁽¹⁾, y⁽²⁾}) = 1 − (1 − p(x̂))² is below exact's
  Σ min(p, q).

Measured. Tiny models (tests/conftest: a target and its perturbed copy, temperature 1, 3 seeds × 40 tokens, EOS
held back; `test_sampled_fly_is_not_slower_per_forward_than_exact_with_the_same_draft`), tokens per target forward at
each rule's default γ: exact 1.86, fly with the old two-draw test on sampled drafts 1.37, `greedy_drafts` 2.11,
`floor` 3.56 (at γ = 5 for all: 1.86, 1.31, 1.80, 2.81). Reference pair at T = 0.7, top-p 0.9
(`benchmarks/results/fly-sampling-gsm8k.md`: GSM8K problems 0-3 × 96 tokens, one seed per problem, each rule at
its default γ, interleaved per problem on a loaded 2-core machine): tokens per target forward exact 4.63,
`floor` 8.73, `greedy_drafts` 9.60; tokens/s over exact's (geometric mean of the per-problem ratios) `floor` 0.89×,
`greedy_drafts` 1.02×. Both multiply τ by about two, and at γ = 15 the drafting eats the gain either way (a
draft-length policy such as `tapout` is the lever there). The default is `floor` because it is the one that keeps
the guarantee asked of it (never fewer drafts kept than `exact` with the same draws; `greedy_drafts` kept fewer on
the tiny models at γ = 5) and it moves the output less from p (`greedy_drafts` accepts the draft's argmax x̂ with
probability 1 − (1 − p(x̂))², more than p(x̂)); `greedy_drafts` was the faster of the two on the reference pair in
this small run and stays an option.

Draft length. The paper drafts long blocks (k = 15, `spd_k` in `fly_config/FLy_Llama3_70b.json`), and with the
default W = 6 only positions i ≤ γ − 7 can be flipped: at this package's usual γ = 5 the window could never fire and
greedy `fly` would equal `exact` (sampled, its two-draw test still differs). `default_num_draft_tokens` is
therefore 15 (nine flippable positions per round).

Worked example (greedy, γ = 5, W = 3, θ = 0.3, vocabulary of 5, target argmax 0 at every position). Positions are
either "flat", p = [0.4, 0.3, 0.2, 0.05, 0.05] with H = −(0.4 ln 0.4 + 0.3 ln 0.3 + 0.2 ln 0.2) = 1.0496, or
"peaked", p = [0.96, 0.01, 0.01, 0.01, 0.01] with H = −(0.96 ln 0.96 + 2 · 0.01 ln 0.01) = 0.1313. A draft is 0
(match, ✓) or 1 (mismatch, ✗). Flips are possible at i ≤ γ − W − 1 = 1 only.

    (a) ✗✓✓✗✓, all flat: i = 0 has Δ_1 = Δ_2 = 1 and H_0 = 1.05 ≥ 0.3 → accepted; i = 3 > 1 is strict
        → n = 3, emits argmax p_3 = 0.
    (b) ✗✓✗✓✓, all flat: the window of i = 0 contains the mismatch at 2 → n = 0.
    (c) ✓✗✓✓✓, position 1 peaked: window complete, but H_1 = 0.131 < 0.3 → gate rejects → n = 1.
    (d) ✓✗✓✓✓, all flat: window complete and H_1 = 1.05 ≥ 0.3 → all accepted → n = 5, plus the bonus token.
    (e) ✓✓✗✓✓, all flat: the window of i = 2 (positions 3, 4) is inside the block, but i = 2 > 1 → strict → n = 2
        (the issue's reading would accept it; the authors' code does not).

Entropy options on p = [0.9, 0.05, 0.03, 0.01, 0.01]: top-3 H = 0.3498 ≥ 0.3 (the gate lets a mismatch through),
normalised full H = 0.4419 / ln 5 = 0.2746 < 0.3 (the gate blocks it).

Sampling (`greedy_drafts`), one flat position with patched draws y⁽¹⁾ = 2, y⁽²⁾ = 1: draft 1 is accepted (it equals
the second draw); draft 3 is rejected and the round emits y⁽¹⁾ = 2 — the first draw, not the argmax 0. With `floor`
and q = [0.1, 0.6, 0.1, 0.1, 0.1], draws (2, 3) miss draft 1 but p/q = 0.3/0.6 = 0.5, so u = 0.4 keeps it; u = 0.6
rejects it and the round emits a draw from norm(max(p − q, 0)) = [0.75, 0, 0.25, 0, 0].
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..component_config import Range
from ..errors import invalid_value
from .base import (
    AcceptanceRule,
    RuleConfig,
    VerificationInput,
    gather_rows,
    register_rule,
    sample_categorical,
)

ENTROPY_KINDS = ("top3", "normalized_full")
SAMPLING_MODES = ("floor", "greedy_drafts")
# Largest value each entropy can take: three tokens of 1/3 each for top-3 (−p ln p grows on [0, 1/e] and 1/3 < 1/e),
# and 1 for an entropy normalised by ln |V|.
MAX_ENTROPY = {"top3": math.log(3), "normalized_full": 1.0}


@dataclass
class FLyConfig(RuleConfig):
    """Options of `fly` (`acceptance_kwargs`).

    Args:
        window (`int`, defaults to 6): W, the authors' `win_len`. A mismatch at position i is accepted only if the
            W − 1 following drafts are exact matches and i + W < γ. W = 1 makes the window empty (every mismatch
            but the last position's may pass, subject to the entropy gate).
        entropy_threshold (`float`, defaults to 0.3): θ, the authors' `entropy_thre`. A mismatch at a position
            whose target entropy is below θ is never accepted; 0 turns the gate off. θ 0.3 with W 6 accepts the most
            of the measured grid within a target NLL increase of 0.025 nats per token (reference pair, greedy,
            GSM8K 0–9: τ 12.37, 1.22× `exact`, +0.0205; W 4: τ 12.79, 1.24×, +0.027; θ 0.6: less of both;
            docs/rules.md).
        entropy (`str`, defaults to `"top3"`): `"top3"` — unnormalised entropy (natural log) of the three largest
            target probabilities, as in the authors' code; `"normalized_full"` — full-vocabulary entropy divided by
            ln |V|, as in the paper text.
        sampling (`str`, defaults to `"floor"`): how `do_sample=True` works (greedy decoding ignores it).
            `"floor"`: drafts are sampled from q and a draft passes its own test Δ when the standard test
            u < p(x̂)/q(x̂) keeps it *or* it equals one of the two target draws; rejections emit the standard
            residual norm(max(p − q, 0)). So `fly` keeps every draft `exact` would keep with the same draws.
            `"greedy_drafts"`: the drafter proposes argmax q, as the authors' code does, Δ is the two-draw test
            alone and a rejection emits the first draw. See the module docstring for the measurements behind the
            default.
    """

    component_name = "fly"

    window: int = field(
        default=6,
        metadata={
            "help": "W: a mismatch is kept only if the W-1 following drafts match exactly and it lies before the "
            "last W positions of the block (authors' win_len)",
            "range": Range(1, math.inf),
        },
    )
    entropy_threshold: float = field(
        default=0.3,
        metadata={
            "help": "theta: a mismatch where the target's entropy is below theta is always rejected (0 = no gate)",
            "range": Range(0, math.inf),
        },
    )
    entropy: str = field(
        default="top3",
        metadata={
            "help": "'top3': entropy of the 3 largest target probabilities, natural log, not renormalised "
            "(authors' code); 'normalized_full': full-vocabulary entropy / ln|V| (paper text)",
            "choices": ENTROPY_KINDS,
        },
    )
    sampling: str = field(
        default="floor",
        metadata={
            "help": "do_sample=True: 'floor' keeps a sampled draft if the standard test u < p/q or the two-draw "
            "test keeps it (never fewer than exact); 'greedy_drafts' drafts argmax q as the authors' code and uses "
            "the two-draw test alone",
            "choices": SAMPLING_MODES,
        },
    )

    def _validate_extra(self) -> None:
        highest = MAX_ENTROPY[self.entropy]
        if self.entropy_threshold > highest:
            raise invalid_value(
                f"{self.argument_name}['entropy_threshold']",
                self.entropy_threshold,
                f"at most {highest:.4f} with entropy='{self.entropy}' for 'fly' (a larger threshold blocks every "
                "mismatch, which is acceptance='exact')",
                f"choose a threshold in [0, {highest:.4f}]; the default is 0.3",
            )


def target_entropy(probs: torch.Tensor, kind: str = "top3") -> torch.FloatTensor:
    """The gate's entropy H of each distribution in `probs`.

    Args:
        probs (`torch.FloatTensor` of shape `(..., vocab)`): target probabilities (full softmax).
        kind (`str`): `"top3"` — −Σ p ln p over the three largest probabilities, not renormalised;
            `"normalized_full"` — −Σ p ln p over the vocabulary divided by ln |V| (0 when |V| = 1).

    Returns:
        `torch.FloatTensor` of shape `(...)`. Zero probabilities (e.g. masked by top-k) contribute 0, not NaN.
    """
    probs = probs.float()
    vocab_size = probs.shape[-1]
    if kind == "top3":
        top = probs.topk(min(3, vocab_size), dim=-1).values
        return torch.special.entr(top).sum(-1)
    if kind == "normalized_full":
        full = torch.special.entr(probs).sum(-1)
        return full / math.log(vocab_size) if vocab_size > 1 else torch.zeros_like(full)
    raise ValueError(f"unknown entropy kind {kind!r}; expected one of {ENTROPY_KINDS}")


def deferred_window(delta: torch.BoolTensor, window: int, limit: torch.LongTensor | None = None) -> torch.BoolTensor:
    """D_i = Δ_i ∨ (i + W < γ ∧ Δ_{i+1} ∧ … ∧ Δ_{i+W−1}), vectorized over batch and positions.

    Args:
        delta (`torch.BoolTensor` of shape `(batch, γ)`): raw (exact) acceptance Δ.
        window (`int`): W ≥ 1.
        limit (`torch.LongTensor` of shape `(batch,)`, *optional*): each row's own γ where it drafted fewer than the
            batch (`VerificationInput.draft_limit`): its flips need i + W < its γ, as alone.

    Returns:
        `torch.BoolTensor` of shape `(batch, γ)`: Δ with the mismatches the window defers turned to `True`.
    """
    gamma = delta.shape[-1]
    window = min(window, gamma)  # W ≥ γ flips nothing; the clamp keeps `positions + window` from overflowing int64
    # mismatches_before[:, j] = number of mismatches at positions < j, so positions a … b − 1 hold
    # mismatches_before[:, b] − mismatches_before[:, a] of them.
    mismatches_before = torch.nn.functional.pad((~delta).long().cumsum(-1), (1, 0))
    positions = torch.arange(gamma, device=delta.device)
    start = (positions + 1).clamp(max=gamma)
    end = (positions + window).clamp(max=gamma)
    window_clean = mismatches_before[:, end] == mismatches_before[:, start]
    # The authors' code resets the last W positions to their raw verdict: flips only where i + W < γ.
    flippable = positions + window < (gamma if limit is None else limit.to(delta.device)[:, None])
    return delta | (window_clean & flippable)


@register_rule
class FLyRule(AcceptanceRule):
    """FLy (Li et al., ICLR 2026): exact acceptance, loosened by a deferred window and gated by target entropy.

    Greedy and sampling are both defined; q (the draft's probabilities) is read only by the sampling floor. In
    sampling mode `accept()` draws the two target samples y⁽¹⁾, y⁽²⁾ per position with one vectorized
    `sample_categorical` call (and the floor's uniforms), memoised on the round's `VerificationInput` (`inputs.once`),
    so that `own_test()` sees the same draws and `rejection_token()` emits the *same* first sample y⁽¹⁾
    (`greedy_drafts`) at the first rejection.
    """

    name = "fly"
    config_class = FLyConfig
    paper = "https://arxiv.org/abs/2511.22972"
    lossless = False
    compiles_verification = True
    supports_greedy = True
    supports_sampling = True
    requires_draft_probs = False
    requires_target_hidden_states = False
    default_num_draft_tokens = 15  # the paper's k; with W = 6 flips need γ ≥ 7 (see the module docstring)

    def __init__(self, config: FLyConfig | None = None):
        super().__init__(config)
        self.greedy_drafts = self.config.sampling == "greedy_drafts"

    def target_samples(self, inputs: VerificationInput) -> torch.LongTensor:
        """Two draws from p_i at every draft position, shape `(batch, γ, 2)`; `[..., 0]` is the correction token.

        Drawn once per round (one `sample_categorical` call over `(batch, γ, 2, vocab)`) and reused afterwards.
        """
        probs = inputs.target_probs[:, :-1]
        return inputs.once(
            "fly_target_samples",
            lambda: sample_categorical(probs.unsqueeze(-2).expand(-1, -1, 2, -1), None),
        )

    def standard_test(self, inputs: VerificationInput) -> torch.BoolTensor:
        """`exact`'s sampling test u·q(x̂) < p(x̂), shape `(batch, γ)`, with one uniform per draft drawn once per round."""
        return inputs.once("fly_standard_test", lambda: self.standard_accept(inputs))

    def raw_acceptance(self, inputs: VerificationInput) -> torch.BoolTensor:
        """Δ, shape `(batch, γ)`: draft = target argmax (greedy); draft ∈ {y⁽¹⁾, y⁽²⁾} (sampling), or the standard
        test's verdict (`sampling="floor"`)."""
        drafts = inputs.draft_token_ids
        if not inputs.do_sample:
            return drafts == inputs.target_greedy_ids[:, :-1]
        two_draws = (self.target_samples(inputs) == drafts[..., None]).any(-1)
        if self.config.sampling == "floor":
            return two_draws | self.standard_test(inputs)
        return two_draws

    @property
    def deferred_window(self) -> int:
        return self.config.window

    def own_test(self, inputs: VerificationInput) -> torch.BoolTensor:
        return self.raw_acceptance(inputs)

    def accept(self, inputs: VerificationInput) -> torch.BoolTensor:
        delta = self.raw_acceptance(inputs)
        deferred = deferred_window(delta, self.config.window, inputs.draft_limit)
        entropy = target_entropy(inputs.target_probs[:, :-1], self.config.entropy)
        return deferred & (delta | (entropy >= self.config.entropy_threshold))

    def rejection_token(self, inputs: VerificationInput, position: torch.LongTensor) -> torch.LongTensor:
        if not inputs.do_sample:
            return self.target_token(inputs, position)
        if self.config.sampling == "floor":
            return self.residual_token(inputs, position)
        return gather_rows(self.target_samples(inputs)[..., 0], position)
