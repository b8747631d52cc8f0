"""`cost_aware`: draft another token only while its expected tokens per second beat the decoding's running rate.

A round drafts tokens 1, 2, … and is verified by one target forward; it emits 1 + (accepted drafts) tokens in t̂(k)
seconds (k drafted). After drafting token j, whose draft distribution has entropy H_j, the policy asks whether some
longer round is worth its extra time:

    acceptance     p̂(H) = (a_b + m·π_b) / (n_b + m)              b: the entropy bin of H; a_b / n_b: accepted / tested
                                                                  drafts of that bin so far (discounted by δ_c per
                                                                  tested draft); π_b: the prior, SVIP's bound
                                                                  1 − sqrt(0.15·H) at the bin's middle; m = 1
    survival       P_j = Π_{i ≤ j} p̂(H_i)                         the chance that drafts 1..j are all accepted
    next draft     p̄ = (a + m/2) / (n + m)                       the acceptance of any tested draft (H_{j+1} is not
                                                                  known before paying for it)
    round time     t̂(k) = (S_k + 2·(t_0 + t_1·k)) / (N_k + 2)    S_k / N_k: seconds / rounds timed at length k;
                                                                  t_0 + t_1·k: least squares of the rounds' seconds on k
    running rate   R̃ = Σ_t δ_r^(T−t)·(n_t + 1) / Σ_t δ_r^(T−t)·t̂(k_t)     tokens per second, over the rounds

    keep drafting while   max_{j < m ≤ cap}  P_j·(p̄ + p̄² + … + p̄^(m−j)) − R̃·(t̂(m) − t̂(j))  ≥  0

Why this rule. Drafting tokens j + 1..m adds P_j·(p̄ + … + p̄^(m−j)) expected tokens to the round and t̂(m) − t̂(j)
seconds. The throughput R* = E[tokens] / E[seconds] of a stopping policy, repeated round after round, is largest when
each round maximizes E[tokens] − R*·E[seconds] (renewal reward; Dinkelbach's method for a ratio), so the round goes on
while some continuation adds more tokens than R* times its time. With a linear time, t̂(k) = t_0 + t_1·k, the
expected tokens of the next draft only fall, so the first step decides: draft on while P_j·p̄ ≥ ρ·(R*·t_0), ρ = t_1/t_0,
a threshold on the probability that some draft is rejected, the form SpecDec++ proves optimal (below). R̃ is R*
measured on the decoding so far, priced by t̂ rather than the rounds' own noisy seconds.

Why a time per length, not a line (ours). A verify forward's time is not linear in its tokens: on the reference CPU
the 1.5B target's forward over 3 tokens took 0.88 s and over 4 tokens 0.57 s (MKL picks its kernels by shape), so a
round of 2 drafts costs more than a round of 3. Live with `fly` on the quick profile's first three prompts
(instrumented), rounds of 1 and 2 drafts fitted ρ = 0.3–1.1 against 0.27 over all lengths, and the one-step rule
(this policy until then) drafted mostly one token per round: 0.74 of the best fixed length on the reasoning prompt
(`draft-length-final-all`, that run merged into the full sweep). Hence t̂(k), the mean time measured at k, shrunk
toward the line by 2 pseudo-rounds (the line alone at a length never timed), and the look-ahead over every longer
round, which then sees that 3 drafts cost less than 2.

Paper: K. Huang, X. Guo, M. Wang, "SpecDec++: Boosting Speculative Decoding via Adaptive Candidate Lengths"
(COLM 2025, arXiv:2405.19715), https://arxiv.org/abs/2405.19715: the candidate-length choice as a Markov decision
process whose optimal policy stops "when the probability of getting a rejection exceeds a threshold value".

Sources and what is ours. SpecDec++ predicts acceptance with a trained head and sweeps its threshold; here both are
training-free and learned while decoding, which is ours: acceptance is read off the draft's entropy (the premise of
SVIP and AdaEDL) through a calibration table learned from the verified rounds — drafts 1..n of a round with n
accepted were accepted, draft n + 1 was rejected, later ones were not tested — and the threshold comes from the
measured round times and the running rate above. The bins, the SVIP prior, m, the discounts and the prior 1/2 of p̄
are ours. δ_c = 0.995
(a memory of about 200 tested drafts) lets the calibration follow the text: the same entropy is accepted less often
in code than in prose on the reference pair. δ_r = 0.8 (about 5 rounds) lets the rate follow it. Until two draft
lengths have been timed, t̂(k) = 1 + 0.1·k (in units of t_0); `cost_ratio=` fixes t̂(k) = 1 + ρ·k instead (e.g. from a
profile) and skips the timing. Before any round R̃ = 1 / t̂(0) (plain decoding's one token per target forward).

Why δ_c = 0.995, not a memory of about one prompt (measured; `docs/draft-length-research.md`): 0.98 gained a
point or two replayed and in one live `fly` run (1.11 against 1.09 of the best fixed length), but under `tapout` on 20
held-out prompts it made 1.09 against the default's 1.12, and on a stationary stream it costs about a point. Pass
`calibration_discount=0.98` for text that changes from prompt to prompt. Calibrations by context and by draft position,
and a per-call log-odds shift of p̂ (trial patches, not kept), did no better replayed.

Exploration (ours). The slope t_1 is only learned from rounds of different lengths, and a wrong slope can stop every
round at the same length, which then never corrects it. Live on the reference pair with `fly`, the first timed rounds
(k = 2 in 1.40 s, with one-off costs, then k = 1 in 1.00 s) fitted ρ = 0.64 where the machine's was 0.27; the
threshold then stopped every round after one draft, for the whole run (0.87 of the best fixed length). So after
`explore_after` (10) rounds in a row of one length, the next round drafts 2 past its stop. A per-token rule varies its
length with the text, so in normal operation this never happens; stuck, it costs two drafts every eleventh round until
the fit has moved.

The cap (ours): 24 drafts, not svip's and adaedl's 40. The rule is risk-neutral, and a draft can be confidently wrong:
live on the reference pair's math prompt (`exact`, 64 tokens) four rounds drafted 28–38 tokens after an unsure one and
none was accepted past position 11 (188 drafts for 64 tokens, 0.65 of γ = 3). Replayed, caps of 16 to 40 give the
same speed (1.116–1.121 of the best fixed length on both prompt sets), while on a faster draft the best fixed length
of predictable text reaches 12–16; 24 leaves that room and bounds the waste.

The first draft of a round is always made (the loop asks after a token is drafted), and the token that ends the round
is still proposed. With a batch the entropy is the largest of the rows'. Each decision reads one value from the
device: one host sync per drafted token. With the relaxed rules the learned acceptance is that rule's.

Under a deferred window (`fly`; ours; opt-in with `flip_prior`). `fly` keeps a draft that fails its own test Δ (a
mismatch) only if the W drafts after it are in the same round and the first W − 1 of them match (W = 6 by default),
so a draft's acceptance depends on how long the round goes on, and a rule that prices the next draft by its own
acceptance stops at the unsure drafts that `fly` would keep. The rule tells the policy its W (`set_deferred_window`),
and each round reports how many drafts passed Δ before the first that failed it (`RoundOutcome.num_matched`, s).
With `flip_prior` set, the calibration learns p̂ from drafts 1..s + 1 (Δ, not the window's verdict), and the policy
learns

    flip rate      φ = (f + m·φ_0) / (u + m)         u: first mismatches with W drafts after them in the round; f: those
                                                     the rule kept (accepted past s); φ_0 = `flip_prior`; both counts
                                                     forgotten at the calibration's pace δ_c, so that where flips stop
                                                     coming φ drifts back toward φ_0 and a round now and then tests the
                                                     window again

and prices a round of k drafts by its expected accepted drafts E_k, drafts i ≤ j at their p̂ and later ones at p̄:

    e(i) = p_i·(1 + e(i + 1)) + (1 − p_i)·φ·1[i + W ≤ k]·(W + e(i + W)),   e(k + 1) = 0,   E_k = e(1)

(a kept mismatch at i comes with the W − 1 matches after it: W accepted drafts, then draft i + W is judged afresh),
and drafts on while max_{j < m ≤ cap} E_m − E_j − R̃·(t̂(m) − t̂(j)) ≥ 0. With φ = 0, E_m − E_j is the exact rules'
P_j·(p̄ + … + p̄^(m−j)). φ lumps the gate, the window's W − 1 matches and the kept mismatches after the first;
measured on the reference pair (`fly-window-flips.md` in git history at ba51d65: `fly`, γ = 16, the quick profile's 10
prompts × 64 tokens) it is small, 13 of 80 first mismatches kept (0.16), from 1 of 19 on the writing prompt to 1 of 2
on the coding one. Each decision then costs about 41 µs instead of 3 µs (E_m for every m up to the cap), against the
230 µs of the entropy over the 152k-token vocabulary and a 110 ms draft step.

Why it is off by default (measured; `docs/draft-length-research.md`). Under `tapout` (φ_0 = 0.5, 30 prompts × 64
tokens, ratio to the best fixed length) it gained where `fly`'s flips pay (reasoning 0.97 → 1.07, coding 0.95 → 1.00,
math 0.97 → 1.00) and lost as much where γ = 3 wins (roleplay 1.10 → 0.96, translation 1.13 → 0.97): 1.07 overall
against 1.08. φ is one number, learned across prompts of every category, so it cannot follow the category; learned
per category (one `tapout` per Spec-Bench category, 66 prompts) it made 1.07, still 0.93 in math and math_reasoning.

Worked example with a window (`flip_prior=0.5`, W = 2, φ = 0.5, cap 4, ρ = 0.2, R̃ = 2, p̄ = 0.9): drafts with
p̂ = 0.99, 0.3, 0.95.
    After draft 2 the exact pricing stops (P_2·p̄ = 0.267 < 0.4). Under the window: E_2 = 0.99·1.3 = 1.287; E_4:
    e(4) = 0.9, e(3) = 1.71, e(2) = 0.3·2.71 + 0.7·0.5·(2 + 0.9) = 1.828, e(1) = 0.99·2.828 + 0.01·0.5·(2 + 1.71) =
    2.818; m = 4 gains 2.818 − 1.287 − 2·0.2·2 = 0.731 ≥ 0 → keep drafting (m = 3 cannot keep draft 2: 2 + W > 3).
    After draft 3: E_3 = 1.584, E_4 = 2.847, gain 0.863 → keep drafting: the round proposes 4 drafts.

Measured (`replay-exact-3x128-*` in git history at ba51d65, the reference pair's `exact` traces replayed with the
reference CPU's fitted round time): 1.11× the best fixed γ's speed on the 30 prompts it was designed on and 1.13×
on 29 held-out ones, within 3% of it in 10 and 9 of 10 categories (`svip`: 1.07× and 1.08×); the replay's times
are linear in k, where both rules decide alike. Live (`draft-length-final-cost-table.md`, ibid., quick
profile, 10 prompts × 64 tokens), measured speed-up over the best fixed length's (γ = 3) in the same run: 1.04 with
`exact` and 1.00 with `fly`, against 0.92 and 0.96 for the one-step rule with the fitted line.

Worked example, linear time (`cost_ratio=0.2`: t̂(k) = 1 + 0.2·k in units of t_0; R̃ = 2, so the first step's
threshold is 0.4; p̄ = 0.8):
    draft 1, p̂ = 0.99: P = 0.99,   P·p̄ = 0.792 ≥ 0.4 → keep drafting;
    draft 2, p̂ = 0.95: P = 0.9405, P·p̄ = 0.7524 → keep drafting;
    draft 3, p̂ = 0.6:  P = 0.5643, P·p̄ = 0.4514 → keep drafting;
    draft 4, p̂ = 0.8:  P = 0.4514, P·p̄ = 0.3612 < 0.4 → stop: the round proposes 4 drafts.
With a cheaper draft (ρ = 0.1, threshold 0.2) the same round drafts on.

Worked example, measured times t̂(1) = 0.76, t̂(2) = 1.10, t̂(3) = 0.90 s, cap 3, R̃ = 2.5 tokens/s, p̄ = 0.8:
    draft 1, p̂ = 0.9: m = 2 gives 0.72 − 2.5·0.34 = −0.13, m = 3 gives 0.72 + 0.576 − 2.5·0.14 = 0.946 → keep drafting
    (the one-step rule would stop here); draft 2, p̂ = 0.9: m = 3 gives 0.648 − 2.5·(−0.20) = 1.148 → keep drafting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..component_config import POSITIVE, Range
from ._entropy import entropy
from ._round_cost import UNFITTED_COST_RATIO, RoundCostFit
from .base import DraftLengthConfig, DraftLengthPolicy, RoundOutcome, register_policy

# Entropy bins (nats): bin b holds EDGES[b − 1] <= H < EDGES[b]; the last one is open. Finer where acceptance changes
# fastest (H < 1 nat on the reference pair: ~99% accepted below 0.4 nats, ~83% at 0.6–1, ~32% above 3).
ENTROPY_BIN_EDGES = (0.05, 0.1, 0.2, 0.4, 0.7, 1.0, 1.5, 2.0, 3.0)
_LAST_BIN_ENTROPY = 4.0  # where the open last bin's prior is read
_SVIP_ENTROPY_SCALE = 0.15  # the prior 1 − sqrt(0.15·H): SVIP's bound (svip.py), a pessimistic start
_PRIOR_RANGE = (0.05, 0.99)  # no bin starts certain either way
_NEXT_DRAFT_PRIOR = 0.5
EXPLORATION_DRAFTS = 2  # drafts past the stop in an exploration round


def entropy_bin(entropy_nats: float) -> int:
    """The calibration bin of an entropy in nats."""
    return sum(entropy_nats >= edge for edge in ENTROPY_BIN_EDGES)


def _prior(entropy_nats: float) -> float:
    low, high = _PRIOR_RANGE
    return min(high, max(low, 1.0 - math.sqrt(_SVIP_ENTROPY_SCALE * entropy_nats)))


_BIN_MIDDLES = [(lo + hi) / 2 for lo, hi in zip((0.0,) + ENTROPY_BIN_EDGES[:-1], ENTROPY_BIN_EDGES)]
BIN_PRIORS = tuple(_prior(h) for h in _BIN_MIDDLES + [_LAST_BIN_ENTROPY])


@dataclass
class CostAwareConfig(DraftLengthConfig):
    component_name = "cost_aware"
    max_tokens: int = field(
        default=24,
        metadata={
            "help": "most tokens drafted per round (it bounds what a wrong long draft wastes; see the module "
            "docstring); num_assistant_tokens sets it",
            "range": Range(1, 128),
        },
    )
    prior_strength: float = field(
        default=1.0,
        metadata={"help": "m: weight of the prior, in tested drafts, of each acceptance estimate", "range": POSITIVE},
    )
    calibration_discount: float = field(
        default=0.995,
        metadata={
            "help": "δ_c: weight of a tested draft in the acceptance estimates, per later tested draft (1 = never "
            "forget)",
            "range": Range(0, 1, low_inclusive=False),
        },
    )
    rate_discount: float = field(
        default=0.8,
        metadata={
            "help": "δ_r: weight of a round in the running rate R̃, per later round (1 = never forget)",
            "range": Range(0, 1, low_inclusive=False),
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
    flip_prior: float | None = field(
        default=None,
        metadata={
            "help": "with a rule that has a deferred window (fly): φ_0, the prior chance that a first mismatch with W "
            "drafts after it in the round is kept (weight prior_strength), which turns on pricing the window; "
            "None = price each draft by its own acceptance, as for the other rules (the default: measured faster "
            "with tapout, see the module docstring)",
            "range": Range(0, 1),
        },
    )
    explore_after: int = field(
        default=10,
        metadata={
            "help": f"after this many rounds in a row of one length, the next round drafts {EXPLORATION_DRAFTS} past "
            "its stop, so that the cost fit sees another length; 0 = never",
            "range": Range(0, 1000),
        },
    )


@register_policy
class CostAwarePolicy(DraftLengthPolicy):
    """Keeps drafting while some longer round adds more expected tokens than R̃ times its extra time; see the module
    docstring."""

    name = "cost_aware"
    config_class = CostAwareConfig
    paper = "https://arxiv.org/abs/2405.19715"
    length_field = "max_tokens"
    decides_per_token = True
    keeps_state_across_calls = True
    reads_draft_probs = True

    def __init__(self, config: CostAwareConfig | None = None):
        super().__init__(config)
        num_bins = len(ENTROPY_BIN_EDGES) + 1
        self.accepted = [0.0] * num_bins  # a_b
        self.tested = [0.0] * num_bins  # n_b
        self.costs = RoundCostFit()
        self.rate_tokens = 0.0  # discounted Σ of the tokens each round emitted (n + 1, or n in a cut round)
        self.rate_rounds: dict[int, float] = {}  # k → discounted count of the rounds that drafted k
        self.round_bins: list[int] = []  # bins of this round's drafts that keep_drafting saw, in order
        self.survival = 1.0  # P_j of this round
        # What this round's decisions read, fixed until observe(): t̂(k) for k = 1..cap, R̃ and p̄ (set in max_tokens).
        self.round_prices: dict[int, float] = {}
        self.round_rate = self.round_next_acceptance = 0.0
        self.last_length, self.same_length_rounds = 0, 0  # the latest round's k, and how many rounds in a row drafted it
        self.drafts_past_stop = 0
        # A rule's deferred window (set_deferred_window): W, and the discounted kept / tested first mismatches that
        # had W drafts after them; round_acceptances: p̂ of this round's drafts, for the window's expectation.
        self.window: int | None = None
        self.flips = self.flip_trials = 0.0
        self.round_acceptances: list[float] = []
        self.round_flip = 0.0

    # The estimates.

    def acceptance(self, bin_index: int) -> float:
        """p̂ of a draft in that entropy bin."""
        m = self.config.prior_strength
        return (self.accepted[bin_index] + m * BIN_PRIORS[bin_index]) / (self.tested[bin_index] + m)

    def next_draft_acceptance(self) -> float:
        """p̄: the acceptance of a tested draft, whatever its entropy."""
        m = self.config.prior_strength
        return (sum(self.accepted) + m * _NEXT_DRAFT_PRIOR) / (sum(self.tested) + m)

    @property
    def prices_window(self) -> bool:
        """Whether rounds are priced under the rule's deferred window: the rule has one and `flip_prior` is set."""
        return self.window is not None and self.config.flip_prior is not None

    def flip_probability(self) -> float:
        """φ: the chance that the rule keeps a first mismatch that has W drafts after it in the round (0 when the
        window is not priced)."""
        if not self.prices_window:
            return 0.0
        m = self.config.prior_strength
        return (self.flips + m * self.config.flip_prior) / (self.flip_trials + m)

    def cost_ratio(self) -> float:
        """ρ = t_1 / t_0 of the line: given, fitted, or 0.1 while the fit is undetermined."""
        if self.config.cost_ratio is not None:
            return self.config.cost_ratio
        fit = self.costs.coefficients()
        return fit[1] / fit[0] if fit is not None else UNFITTED_COST_RATIO

    def round_seconds(self, num_drafted: int) -> float:
        """t̂(k), the time of a round drafting k: with `cost_ratio` given, 1 + ρ·k (in units of t_0); once two
        lengths are timed, the rounds' mean time at k shrunk toward the fitted line (`RoundCostFit.length_seconds`);
        before that, 1 + 0.1·k."""
        measured = self.costs.length_seconds(num_drafted) if self.config.cost_ratio is None else None
        return measured if measured is not None else 1.0 + self.cost_ratio() * num_drafted

    def running_rate(self) -> float:
        """R̃: tokens per unit of t̂ over the discounted rounds (1 / t̂(0) before any round: plain decoding)."""
        if not self.rate_rounds:
            return 1.0 / self.round_seconds(0)
        return self.rate_tokens / sum(weight * self.round_seconds(k) for k, weight in self.rate_rounds.items())

    def drafting_gain(self, num_drafted: int) -> float:
        """max over m in (j, cap] of  P_j·(p̄ + … + p̄^(m−j)) − R̃·(t̂(m) − t̂(j)),  j = `num_drafted`: what the best
        continuation of the round adds to E[tokens] − R̃·t̂ over stopping now (≥ 0: draft on). Reads t̂, R̃ and p̄
        as `max_tokens()` fixed them for the round."""
        prices, seconds_now = self.round_prices, self.round_prices[num_drafted]
        best, expected_tokens, survival = -math.inf, 0.0, self.survival
        for m in range(num_drafted + 1, self.config.max_tokens + 1):
            survival *= self.round_next_acceptance
            expected_tokens += survival
            best = max(best, expected_tokens - self.round_rate * (prices[m] - seconds_now))
        return best

    def expected_accepted(self, acceptances: list[float], num_drafted: int) -> float:
        """E[accepted drafts] of a round of k = `num_drafted` drafts under a deferred window W, `acceptances[i − 1]`
        being draft i's chance to pass the rule's own test (p̂ or p̄) and φ the round's flip probability:

            e(i) = p_i·(1 + e(i + 1)) + (1 − p_i)·φ·1[i + W ≤ k]·(W + e(i + W)),   e(k + 1) = 0,   E = e(1)

        (a kept mismatch at i brings the W − 1 matches after it: W accepted drafts). With φ = 0 it is the exact
        rules' Σ_i Π_{l ≤ i} p_l."""
        window, flip = self.window, self.round_flip
        after = [0.0] * (num_drafted + 2)  # after[i] = e(i)
        for i in range(num_drafted, 0, -1):
            p = acceptances[i - 1]
            value = p * (1.0 + after[i + 1])
            if i + window <= num_drafted:
                value += (1.0 - p) * flip * (window + after[i + window])
            after[i] = value
        return after[1]

    def window_drafting_gain(self, num_drafted: int) -> float:
        """`drafting_gain` under a deferred window: max over m in (j, cap] of E_m − E_j − R̃·(t̂(m) − t̂(j)), E_k
        the expected accepted drafts of a round of k (`expected_accepted`), drafts after j priced at p̄."""
        cap = self.config.max_tokens
        acceptances = self.round_acceptances + [self.round_next_acceptance] * (cap - num_drafted)
        now, seconds_now = self.expected_accepted(acceptances, num_drafted), self.round_prices[num_drafted]
        return max(
            (
                self.expected_accepted(acceptances, m) - now - self.round_rate * (self.round_prices[m] - seconds_now)
                for m in range(num_drafted + 1, cap + 1)
            ),
            default=-math.inf,
        )

    @property
    def exploring(self) -> bool:
        """Whether this round drafts EXPLORATION_DRAFTS past its stop: `explore_after` rounds in a row had one length."""
        return 0 < self.config.explore_after <= self.same_length_rounds

    # The policy interface.

    def max_tokens(self) -> int:
        self.round_bins, self.round_acceptances = [], []
        self.survival = 1.0
        self.drafts_past_stop = 0
        # Under a window the flips are worth pricing only when a round can hold one (W + 1 drafts).
        holds_window = self.prices_window and self.window < self.config.max_tokens
        self.round_flip = self.flip_probability() if holds_window else 0.0
        # Only observe() changes the times, the rate and p̄: read them once per round, not once per drafted token.
        self.round_prices = {k: self.round_seconds(k) for k in range(1, self.config.max_tokens + 1)}
        self.round_rate, self.round_next_acceptance = self.running_rate(), self.next_draft_acceptance()
        return self.config.max_tokens

    def keep_drafting(self, num_drafted: int, probs: torch.Tensor | None) -> bool:
        if probs is None:
            return True
        bin_index = entropy_bin(float(entropy(probs).max()))  # the host sync of this decision
        self.round_bins.append(bin_index)
        acceptance = self.acceptance(bin_index)
        self.round_acceptances.append(acceptance)
        self.survival *= acceptance
        gain = self.window_drafting_gain(num_drafted) if self.round_flip > 0 else self.drafting_gain(num_drafted)
        if self.drafts_past_stop == 0 and gain >= 0:
            return True
        # The rule weighed stopping now against every longer round, so its stop is final; an exploration round goes on.
        if self.exploring and self.drafts_past_stop < EXPLORATION_DRAFTS:
            self.drafts_past_stop += 1
            return True
        return False

    def set_deferred_window(self, window: int | None) -> None:
        self.window = window

    def observe(self, outcome: RoundOutcome) -> None:
        k, n = outcome.num_drafted, outcome.num_accepted
        # Pricing the window, p̂ is a draft's chance to pass the rule's own test: drafts 1..s passed it and draft
        # s + 1 failed it. Otherwise p̂ is its chance to be accepted, s = n. Later drafts were tested after a
        # mismatch, or not at all, so they say nothing of p̂. The last draft of a round is not seen by keep_drafting
        # (nothing is decided after it), so round_bins may stop short of k.
        matched = outcome.matched if self.prices_window else n
        # In a round cut at the output's end (a drafted EOS, a stop), draft s + 1 was tested only if it came before
        # the cut (a mismatch the window kept, s < n); otherwise every output draft passed and the rest are unknown.
        saw_failure = not outcome.cut or matched < n
        tested = self.round_bins[: matched + int(saw_failure)]
        forget = self.config.calibration_discount ** len(tested)
        self.accepted = [a * forget for a in self.accepted]
        self.tested = [t * forget for t in self.tested]
        for position, bin_index in enumerate(tested, start=1):
            self.tested[bin_index] += 1.0
            self.accepted[bin_index] += float(position <= matched)
        # A first mismatch (draft s + 1) with W drafts after it tests φ: kept if the round accepted past it. φ is
        # forgotten at the calibration's pace, so both follow the text alike.
        if self.prices_window:
            self.flips *= forget
            self.flip_trials *= forget
            if saw_failure and outcome.tested_window(self.window):
                self.flips += float(n > matched)
                self.flip_trials += 1.0
        self.round_bins, self.round_acceptances = [], []
        if k > 0 and not outcome.includes_prefill:  # a prefill round's time says little about drafting
            self.costs.add(k, outcome.seconds)
        if k > 0:
            self.same_length_rounds = self.same_length_rounds + 1 if k == self.last_length else 1
            self.last_length = k
        r = self.config.rate_discount
        self.rate_tokens = r * self.rate_tokens + outcome.num_emitted
        self.rate_rounds = {length: r * weight for length, weight in self.rate_rounds.items()}
        self.rate_rounds[k] = self.rate_rounds.get(k, 0.0) + 1.0
