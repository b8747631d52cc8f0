"""`best_constant`: each round, the fixed draft length that the rounds so far say is fastest.

No paper of its own: this is the optimal-γ analysis of Leviathan, Kalman & Matias, "Fast Inference from Transformers
via Speculative Decoding" (ICML 2023, §3: expected tokens per step, the cost coefficient c and the choice of γ;
https://arxiv.org/abs/2211.17192), with its two inputs learned online instead of assumed: the acceptance profile
(the paper assumes every draft is accepted with the same α) and the cost of a drafted token relative to the target's
forward (the paper's c).

A round that drafts γ tokens emits 1 + min(N, γ) tokens, where N is the round's *accepted run*: how many leading
drafts the rule would accept if drafting had no limit. A verified round with k drafted and n accepted shows N = n when
n < k (a rejection at position n + 1) and only N ≥ k when n = k (censored). So one round informs every fixed length,
not only the one it drafted, and the policy needs no exploration arm by arm:

    survival     S_0 = 1,  S_j = Π_{i ≤ j} (1 − ĥ_i)           the probability that N ≥ j
    hazard       ĥ_j = (d_j + h̄) / (r_j + 1)                     discounted Kaplan–Meier, shrunk by one pseudo-round
                                                                 towards the pooled hazard h̄ below
    pooled       h̄ = (Σ_j d_j + ½) / (Σ_j r_j + 1)
    at risk      r_j = Σ_t δ^(T−t) · [k_t ≥ j and n_t ≥ j − 1]   rounds that drafted position j with 1..j−1 accepted
    rejected     d_j = Σ_t δ^(T−t) · [n_t = j − 1 < k_t]         rounds whose first rejection was position j
    tokens       E_γ = Σ_{j=0..γ} S_j                            expected tokens of a round that drafts γ
    time         C_γ = t_0 + t_1 · γ                              least squares over the timed rounds' seconds
    next length  γ* = argmax_{1 ≤ γ ≤ max_tokens} E_γ / C_γ
                    = argmax E_γ / (1 + ρ·γ)                      ρ = t_1 / t_0 (the paper's c, per drafted token)

With a constant hazard h this is the paper's expected-tokens formula, E_γ = (1 − α^(γ+1)) / (1 − α) with α = 1 − h,
and its cost-normalized optimum; positions never yet drafted get the pooled hazard, i.e. that geometric tail.

Sources and what is ours. The estimator (Kaplan–Meier with the discount δ, the one-pseudo-round shrinkage and the
pooled ½ / 1 prior), the cost fit and its fallbacks are ours. The discount (default 0.9, a memory of about 10 rounds,
about half a 64-token answer at τ ≈ 3) lets the length follow the text: the best fixed length changes with the task
(on the reference pair, γ = 3 for prose and γ = 8 for translation). On synthetic streams (geometric runs, hazards
0.1–0.5) it drafts lengths whose throughput is 98.5–99.9% of the best length's, against 99.0–99.9% with δ = 0.95,
and it comes down from a long length after a switch to hard text in half the rounds. The first round of a
`generate()` call drafts `initial_tokens`; its time includes the prompt's prefill, so it feeds the survival estimate
but not the cost fit. Until two different lengths have been timed, ρ is 0.1; `cost_ratio=` fixes ρ instead (e.g.
from a profile) and skips the fit.

Exploration (ours). A round that drafts γ* never shows whether position γ* + 1 would have been accepted, and a cost
fit over one or two lengths is at the mercy of a few slow rounds. Without exploration the policy locked itself in
live: two slow early rounds at γ = 2 (1.0 s against 0.62 s at γ = 1) fitted ρ = 1.6, so γ = 1 looked best and was all
it drafted from then on, on every prompt (0.81 of the best fixed length, where replayed rounds at the true costs gave
0.97). So every `explore_every`-th round (default 10) drafts γ* + 2 (γ* − 2 at the cap): at these costs such a round
is a few percent slower than γ*, about 0.5% over all rounds; and until two lengths have been timed, each round
drafts a length not timed yet. With the relaxed rules (`fly`'s deferred window) the accepted count is not exactly a run
length; the estimate then treats it as one. Fixed budget per round: no host sync while drafting.

Worked example (ρ = 0.2; rounds with a constant hazard h = 0.3, so S_j = 0.7^j):
    γ = 1: E = 1.7,   E / (1 + 0.2) = 1.4167
    γ = 2: E = 2.19,  E / (1 + 0.4) = 1.5643
    γ = 3: E = 2.533, E / (1 + 0.6) = 1.5831   ← the best length
    γ = 4: E = 2.773, E / (1 + 0.8) = 1.5406
With ρ = 0.1 (a cheaper draft) the best length is γ = 4 (E / C = 1.9808, against 1.9485 at γ = 3 and 1.9608 at γ = 5).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..component_config import POSITIVE, Range
from ._round_cost import UNFITTED_COST_RATIO, RoundCostFit
from .base import DraftLengthConfig, DraftLengthPolicy, InitialLengthMixin, RoundOutcome, register_policy


@dataclass
class BestConstantConfig(InitialLengthMixin, DraftLengthConfig):
    component_name = "best_constant"
    initial_tokens: int | None = field(
        default=None,
        metadata={
            "help": "draft length of the first round, before any verification; None = num_assistant_tokens, else "
            "the draft's generation_config.num_assistant_tokens, else the acceptance rule's default",
            "range": Range(1, 128),
        },
    )
    max_tokens: int = field(
        default=32,
        metadata={"help": "longest draft the policy may choose", "range": Range(1, 128)},
    )
    discount: float = field(
        default=0.9,
        metadata={
            "help": "δ: weight of a round in the acceptance estimate, per later round (1 = never forget)",
            "range": Range(0, 1, low_inclusive=False),
        },
    )
    explore_every: int = field(
        default=10,
        metadata={
            "help": "every n-th round drafts γ* + 2 instead of γ*, so that the acceptance past γ* and the cost of "
            "another length stay measured; 0 = never",
            "range": Range(0, 1000),
        },
    )
    cost_ratio: float | None = field(
        default=None,
        metadata={
            "help": "ρ = t_1/t_0, the time of one drafted token over the rest of a round; None = fitted to the "
            "rounds' times",
            "range": POSITIVE,
        },
    )


@register_policy
class BestConstantPolicy(DraftLengthPolicy):
    """Drafts argmax_γ E_γ / (1 + ρ·γ) from a discounted survival estimate of the accepted run; see the module
    docstring."""

    name = "best_constant"
    config_class = BestConstantConfig
    paper = "https://arxiv.org/abs/2211.17192"
    length_field = "initial_tokens"
    keeps_state_across_calls = True

    def __init__(self, config: BestConstantConfig | None = None):
        super().__init__(config)
        size = self.config.max_tokens + 1  # index j = 1..max_tokens; 0 unused
        self.at_risk = [0.0] * size
        self.rejected = [0.0] * size
        self.costs = RoundCostFit()
        self.rounds = 0  # verified rounds observed
        self.num_tokens = self.config.first_length()

    def cost_ratio(self) -> float:
        """ρ = t_1 / t_0: given, fitted, or 0.1 while the fit is undetermined."""
        if self.config.cost_ratio is not None:
            return self.config.cost_ratio
        fit = self.costs.coefficients()
        return fit[1] / fit[0] if fit is not None else UNFITTED_COST_RATIO

    def survival(self) -> list[float]:
        """S_0 .. S_max_tokens from the discounted counts."""
        pooled = (sum(self.rejected) + 0.5) / (sum(self.at_risk) + 1.0)
        values = [1.0]
        for j in range(1, self.config.max_tokens + 1):
            hazard = (self.rejected[j] + pooled) / (self.at_risk[j] + 1.0)
            values.append(values[-1] * (1.0 - hazard))
        return values

    def best_length(self) -> int:
        """argmax_γ E_γ / (1 + ρ·γ) over 1 ≤ γ ≤ max_tokens; ties go to the shorter length."""
        rho = self.cost_ratio()
        survival = self.survival()
        best, best_rate, expected = 1, float("-inf"), survival[0]
        for gamma in range(1, self.config.max_tokens + 1):
            expected += survival[gamma]
            rate = expected / (1.0 + rho * gamma)
            if rate > best_rate:
                best, best_rate = gamma, rate
        return best

    def max_tokens(self) -> int:
        return self.num_tokens

    def observe(self, outcome: RoundOutcome) -> None:
        k, n = outcome.num_drafted, outcome.num_accepted
        if k <= 0:
            return
        delta = self.config.discount
        self.at_risk = [delta * r for r in self.at_risk]
        self.rejected = [delta * d for d in self.rejected]
        # Drafts 1..n were accepted and draft n + 1 rejected; in a round cut at the output's end (a drafted EOS, a
        # stop) drafts 1..n were accepted and the rest are censored, not rejected.
        tested = n if outcome.cut else min(n + 1, k)
        for j in range(1, min(tested, self.config.max_tokens) + 1):
            self.at_risk[j] += 1.0
        if not outcome.cut and n < k and n + 1 <= self.config.max_tokens:
            self.rejected[n + 1] += 1.0
        if not outcome.includes_prefill:
            self.costs.add(k, outcome.seconds)
        self.rounds += 1
        best = self.best_length()
        if self.config.cost_ratio is None and len(self.costs.lengths) < 2:
            # The cost fit needs two lengths: draft one not timed yet.
            cap, timed = self.config.max_tokens, self.costs.lengths
            untimed = [g for g in (best, self.exploration_length(best), best + 1, best - 1) if 1 <= g <= cap]
            self.num_tokens = next((g for g in untimed if g not in timed), best)
        elif self.config.explore_every and self.rounds % self.config.explore_every == 0:
            self.num_tokens = self.exploration_length(best)
        else:
            self.num_tokens = best

    def exploration_length(self, best: int) -> int:
        """γ* + 2, or γ* − 2 (at least 1) when that passes max_tokens: a length that is not the chosen one."""
        cap = self.config.max_tokens
        return best + 2 if best + 2 <= cap else max(1, best - 2)
