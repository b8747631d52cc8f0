"""`svip`: SVIP, the self-verification length policy: stop drafting when the draft's entropy says the next token is
unlikely to be accepted.

Paper: Z. Zhang, J. Xu, T. Liang, X. Chen, Z. He, R. Wang, Z. Tu, "Draft Model Knows When to Stop: A Self-Verification
Length Policy for Speculative Decoding" (arXiv:2411.18462; v2 "… Self-Verification Speculative Decoding for
Long-Form Generation", EMNLP 2025), https://arxiv.org/abs/2411.18462. Authors' code:
https://github.com/Geralt-Targaryen/SVIP (`vanilla-sd/eval_specbench.py`).

The paper (abstract): "the discrepancy between the draft and target models can be approximated by the draft model's
prediction entropy: a high entropy indicates a low acceptance rate of draft tokens", so SVIP "adaptively determines
the lengths of draft sequences by referring to the draft entropy". With q the draft distribution of the token just
drafted and H(q) = −Σ_v q(v) ln q(v) in nats, the rule as the authors' code applies it after each drafted token:

    stop drafting when   sqrt(γ · H(q)) > h                                        (γ = 0.15, h = 0.3)

i.e. when the entropy bound on the acceptance rate, 1 − sqrt(γ·H(q)), falls below 1 − h; equivalently when
H(q) > h² / γ = 0.6 nats. There is no adaptation. The drafted token that triggers the stop is still proposed.

Sources and what is ours. The paper's body was not reachable from here (only its abstract), so γ = 0.15 and h = 0.3
are the authors' code's constant and default `entropy_threshold` (also in its `config.json`), and the variable names γ
and h are ours. The cap of 40 tokens per round is also the authors' code's. Differences from that code: it computes H
from the draft's raw logits (temperature 1), we use q after the logits processors (the same at temperature 1 without
top-k/top-p; with a temperature or truncation H is that of the distribution actually sampled); with a batch, the round
stops as soon as one row's entropy is above the threshold. Each decision reads one value from the device: one host
sync per drafted token.

Worked example (γ = 0.15, h = 0.3; the boundary is H = 0.6 nats):
    q = (0.8, 0.2, 0, …): H = 0.5004 nats, sqrt(0.15 · 0.5004) = 0.2740 ≤ 0.3 → keep drafting;
    q = (0.5, 0.5, 0, …): H = ln 2 = 0.6931 nats, sqrt(0.15 · 0.6931) = 0.3224 > 0.3 → stop.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..component_config import POSITIVE, Range
from ._entropy import entropy
from .base import DraftLengthConfig, DraftLengthPolicy, register_policy

@dataclass
class SVIPConfig(DraftLengthConfig):
    component_name = "svip"
    max_tokens: int = field(
        default=40,
        metadata={
            "help": "most tokens drafted per round (40 in the authors' code); num_assistant_tokens sets it",
            "range": Range(1, 128),
        },
    )
    entropy_scale: float = field(
        default=0.15,
        metadata={"help": "γ in sqrt(γ·H(q)) (the authors' code's constant)", "range": POSITIVE},
    )
    threshold: float = field(
        default=0.3,
        metadata={"help": "h: stop when sqrt(γ·H(q)) > h (the authors' entropy_threshold)", "range": POSITIVE},
    )


@register_policy
class SVIPPolicy(DraftLengthPolicy):
    """Stops drafting when sqrt(γ·H(q)) > h. See the module docstring."""

    name = "svip"
    config_class = SVIPConfig
    paper = "https://arxiv.org/abs/2411.18462"
    length_field = "max_tokens"
    decides_per_token = True
    reads_draft_probs = True

    def max_tokens(self) -> int:
        return self.config.max_tokens

    def score(self, probs: torch.Tensor) -> torch.Tensor:
        """sqrt(γ·H(q)) per row, on the device (no host sync)."""
        return (self.config.entropy_scale * entropy(probs)).sqrt()

    def keep_drafting(self, num_drafted: int, probs: torch.Tensor | None) -> bool:
        if probs is None:
            return True
        return not bool((self.score(probs) > self.config.threshold).any())
