"""`adaedl`: AdaEDL, early draft stopping from an entropy-based lower bound on the acceptance probability.

Paper: S. Agrawal, W. Jeon, M. Lee, "AdaEDL: Early Draft Stopping for Speculative Decoding of Large Language Models
via an Entropy-based Lower Bound on Token Acceptance Probability", NeurIPS 2024 ENLSP workshop (PMLR 262),
https://proceedings.mlr.press/v262/agrawal24a.html (arXiv:2410.18351).

The paper (abstract): AdaEDL "allows for early stopping of the token drafting process by approximating a lower
bound on the expected acceptance probability of the drafted token based on the currently observed entropy of the
drafted logits". With q the draft distribution of the token just drafted (after the logits processors, so it
includes the temperature) and H(q) = −Σ_v q(v) ln q(v) its entropy in nats:

    stop drafting when   1 − sqrt(γ · H(q)) < λ                                   (γ = 0.2)

and the threshold λ adapts after every verified round (drafted k tokens, n of them accepted, budget L):

    AR ← β1 · AR + (1 − β1) · n / k                                                 (β1 = 0.5)
    λ' = λ + ε   if AR < α                                                          (α = 0.9, ε = 0.01)
         λ − ε   else if n ≠ L
         λ       otherwise
    λ  ← β2 · λ + (1 − β2) · λ'                                                     (β2 = 0.9)

so λ rises (shorter drafts) while the smoothed acceptance rate is below the target α and falls (longer drafts) when
it is above, by (1 − β2) · ε = 0.001 per round.

Sources and what is ours. The paper's body (Section 3, Algorithm 1) was not reachable from here: only its title and
abstract (PMLR PDF first page). The bound, γ = 0.2, the update above and β1 = 0.5, β2 = 0.9, α = 0.9, ε = 0.01 are
taken from two independent public re-implementations that cite the paper's Section 3.1 and Algorithm 1 and agree
with each other (a third one lowers λ only when all L drafts were accepted; we follow the majority). Ours: the
initial threshold λ_0 = 0.5 (the paper does not fix one, by those accounts), AR starting at the first round's rate,
rounds with no draft skipped, λ clipped to [0, 1], and — because our loop asks after a token is drafted — the token
whose bound fell below λ is still proposed for verification (drafting stops after it), as transformers'
`assistant_confidence_threshold` and the SVIP authors' code also do. The cap `max_tokens` (L) defaults to 40, the
cap of the SVIP authors' code, so that the bound, not the cap, ends most rounds. With a batch, the round stops as
soon as one row's bound is below λ. Each decision reads one value from the device: one host sync per drafted token.

Worked example (γ = 0.2, λ = 0.5; the boundary is H = (1 − λ)² / γ = 1.25 nats):
    q = (0.8, 0.2, 0, …): H = 0.5004 nats, bound 1 − sqrt(0.2 · 0.5004) = 0.6836 ≥ 0.5 → keep drafting;
    q uniform on 4 tokens: H = ln 4 = 1.3863 nats, bound 1 − sqrt(0.2773) = 0.4734 < 0.5 → stop.
Threshold updates from λ = 0.5 with L = 40, rounds (k, n) = (4, 1), (4, 4), (4, 4), (4, 4), (40, 40):
    AR = 0.25, 0.625, 0.8125, 0.90625, 0.953125 and λ = 0.501, 0.502, 0.503, 0.502, 0.502 — up while AR < 0.9, down
    once AR ≥ 0.9 with n = 4 ≠ L, unchanged when all L = 40 drafts were accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..component_config import POSITIVE, Range
from ._entropy import entropy
from .base import DraftLengthConfig, DraftLengthPolicy, RoundOutcome, register_policy

@dataclass
class AdaEDLConfig(DraftLengthConfig):
    component_name = "adaedl"
    max_tokens: int = field(
        default=40,
        metadata={
            "help": "most tokens drafted per round (the paper's L); num_assistant_tokens sets it",
            "range": Range(1, 128),
        },
    )
    entropy_scale: float = field(
        default=0.2,
        metadata={"help": "γ in the bound 1 − sqrt(γ·H(q))", "range": POSITIVE},
    )
    threshold: float = field(
        default=0.5,
        metadata={
            "help": "initial λ: stop when the bound falls below it (ours; the paper sweeps it)",
            "range": Range(0, 1),
        },
    )
    adaptive: bool = field(
        default=True,
        metadata={
            "help": "adapt λ after each round (the paper's Algorithm 1); False keeps λ fixed",
            "choices": (True, False),
        },
    )
    target_acceptance: float = field(
        default=0.9,
        metadata={
            "help": "α: λ rises while the smoothed acceptance rate is below it",
            "range": Range(0, 1, low_inclusive=False),
        },
    )
    threshold_step: float = field(
        default=0.01,
        metadata={"help": "ε: the step of the proposed λ' = λ ± ε", "range": Range(0, 1)},
    )
    beta1: float = field(
        default=0.5,
        metadata={"help": "β1: smoothing of the acceptance rate AR", "range": Range(0, 1, high_inclusive=False)},
    )
    beta2: float = field(
        default=0.9,
        metadata={"help": "β2: smoothing of λ towards λ'", "range": Range(0, 1, high_inclusive=False)},
    )


@register_policy
class AdaEDLPolicy(DraftLengthPolicy):
    """Stops drafting when 1 − sqrt(γ·H(q)) < λ; adapts λ from the acceptance rate. See the module docstring."""

    name = "adaedl"
    config_class = AdaEDLConfig
    paper = "https://proceedings.mlr.press/v262/agrawal24a.html"
    length_field = "max_tokens"
    decides_per_token = True
    keeps_state_across_calls = True
    reads_draft_probs = True

    def __init__(self, config: AdaEDLConfig | None = None):
        super().__init__(config)
        self.threshold = self.config.threshold  # λ, the current threshold
        self.acceptance_rate: float | None = None  # AR, the smoothed acceptance rate (None before the first round)

    def max_tokens(self) -> int:
        return self.config.max_tokens

    def lower_bound(self, probs: torch.Tensor) -> torch.Tensor:
        """1 − sqrt(γ·H(q)) per row, on the device (no host sync)."""
        return 1.0 - (self.config.entropy_scale * entropy(probs)).sqrt()

    def keep_drafting(self, num_drafted: int, probs: torch.Tensor | None) -> bool:
        if probs is None:
            return True
        return not bool((self.lower_bound(probs) < self.threshold).any())

    def observe(self, outcome: RoundOutcome) -> None:
        if not self.config.adaptive or outcome.num_drafted <= 0 or outcome.cut:
            return  # (a round cut at the output's end saw no rejection: its drafts after the cut say nothing)
        c = self.config
        rate = outcome.num_accepted / outcome.num_drafted
        previous = self.acceptance_rate
        self.acceptance_rate = rate if previous is None else c.beta1 * previous + (1 - c.beta1) * rate
        if self.acceptance_rate < c.target_acceptance:
            proposed = self.threshold + c.threshold_step
        elif outcome.num_accepted != c.max_tokens:
            proposed = self.threshold - c.threshold_step
        else:
            proposed = self.threshold
        self.threshold = min(1.0, max(0.0, c.beta2 * self.threshold + (1 - c.beta2) * proposed))
