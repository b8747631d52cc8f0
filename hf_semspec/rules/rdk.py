"""`rdk`: Redistributing Drafter Kernels — out-of-vocabulary sampling for pruned-vocabulary drafters.

Timor et al., "Out-of-Vocabulary Sampling Boosts Speculative Decoding", 2025 (https://arxiv.org/abs/2506.03206).
A drafter whose output vocabulary was pruned can never propose a pruned token, so where the target puts mass on
those, every draft is rejected. RDK moves the drafter's mass onto them through a row-stochastic token-affinity
kernel M: the drafter samples from

    r = M^T q'        (q' = the drafter's distribution over its kept tokens; `hf_semspec.drafting.redistribute`)

and may therefore propose a pruned token. Verification is Leviathan et al.'s rejection sampling against r instead
of q: accept x̂_i if u_i < min(1, p_i(x̂_i) / r_i(x̂_i)), at the first rejection emit y ~ norm(max(p_i − r_i, 0)),
bonus y ~ p_{γ+1}. Since the emitted tokens follow p whatever distribution the draft came from, RDK stays
lossless; it changes only how often drafts are accepted. Greedy decoding drafts argmax r and accepts exact matches.

The drafter side (keep set, kernel construction) lives in `hf_semspec.drafters`; this rule asks the drafter to
redistribute (`redistributes_draft`) and checks, before decoding, that the draft model carries a kernel.

Measured on the reference pair, it does not pay: no kernel we built raised the sampling acceptance of the pruned
drafter over `exact` with the same drafter, at 10% or 25% of the vocabulary kept (acceptance α 0.7399 without a
kernel, 0.7371 with the default one, at 10% kept; 0.8023 unpruned), and the drafter also spends a scatter-add per
draft token. The numbers and why are in `hf_semspec.drafters.kernel` (`benchmarks/results/rdk-kernels.md`); use
`acceptance="exact"` with a pruned drafter.

Worked example (target vocabulary {0, 1, 2}, token 2 pruned): q' = [0.6, 0.4] over the kept tokens {0, 1};
kernel rows 0 → {0: 0.5, 2: 0.5} and 1 → {1: 1.0} give r = [0.3, 0.4, 0.3]. A draft of the pruned token 2 drawn
from r meets the target p = [0.2, 0.2, 0.6]: p(2)/r(2) = 2 ≥ 1, so it is accepted for any u. Without
redistribution token 2 is never drafted, and with x̂ = 0 (p/q' = 0.2/0.6) a draw u = 0.5 rejects it and emits a
draw from norm(max(p − q, 0)) = norm([0, 0, 0.6]), i.e. token 2.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import RuleConfig, register_rule
from .exact import ExactRule


@dataclass
class RDKConfig(RuleConfig):
    """`rdk` has no verification options: the kernel (neighbours m, temperature) is built with the drafter."""

    component_name = "rdk"


@register_rule
class RDKRule(ExactRule):
    name = "rdk"
    config_class = RDKConfig
    paper = "https://arxiv.org/abs/2506.03206"
    lossless = True
    redistributes_draft = True
