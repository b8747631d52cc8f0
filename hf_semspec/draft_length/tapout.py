"""`tapout`: TapOut, a multi-armed bandit that picks, each round, which draft-length policy drafts it.

Paper: A. Sridhar, N. Sinnadurai, S. Lie, V. Thangarasa, "TapOut: A Bandit-Based Approach to Dynamic Speculative
Decoding" (arXiv:2511.02017), https://arxiv.org/abs/2511.02017.

The paper (abstract): "an online, training-free, plug-and-play algorithm for dynamic speculation policy selection
using multi-armed bandits … a meta-algorithm that selects among multiple parameter-free dynamic speculation
strategies based on past reward and exploration". Here the arms are registered policies, built through the registry
with their default options (nothing for the user to tune). At the start of round t the bandit picks an arm a_t
(sequence-level: one arm for the whole draft); `max_tokens` and `keep_drafting` are that arm's; after verification
the arm observes the round (it keeps learning, e.g. AdaEDL's λ) and the bandit records its reward r_t.

Rewards (k drafted, n accepted, the round emitted n + 1 tokens in s seconds):

    "tokens_per_second"                  r = (n + 1) / s          throughput, what speculative decoding is for
    "tokens_per_fitted_second" (default) r = (n + 1) / t̂(k)       the same with the round's time read off every timed
                                                                  round: t̂(k) = (S_k + 2·ŝ(k)) / (N_k + 2), the
                                                                  mean time of the N_k rounds that drafted k (S_k
                                                                  seconds) shrunk toward the least squares line
                                                                  ŝ(k) = t_0 + t_1·k (`round_time="per_length"`),
                                                                  or t̂(k) = ŝ(k) (`"line"`); until two lengths are
                                                                  timed, the mean time at k; the rewards are
                                                                  re-priced whenever the times move
    "tokens_per_forward"                 r = n + 1                tokens per target forward; ignores draft cost, so
                                                                  it favours the arm that drafts longest
    "blended"                            r = ½ · n / L + ½ · n / k  accepted length (L: the largest budget seen so
                                                                  far) blended with the acceptance rate (0 if k = 0)

Bandits, with N_a the rounds arm a was played, μ_a its mean reward, t = Σ_a N_a and R the largest reward seen so far
(rewards are divided by R so that both bandits see rewards in [0, 1] whatever their unit); each arm is played once
first, ties go to the earlier arm:

    "ucb1"                a_t = argmax_a  μ_a / R + sqrt(2 ln t / N_a)                  (Auer et al., 2002)
    "ucb_tuned" (default) a_t = argmax_a  μ_a / R + sqrt(ln t / N_a · min(1/4, V_a)),   (Auer et al., 2002, §4)
                          V_a = σ_a² / R² + sqrt(2 ln t / N_a)                          σ_a²: arm a's reward variance
    "thompson"            a_t = argmax_a  θ_a,  θ_a ~ N(μ_a / R, 1 / (N_a + 1))        (Gaussian Thompson sampling,
                                                                                       Agrawal & Goyal, 2013; seeded)

Sources and what is ours. The paper's body was not reachable from here; what is known of it comes from its abstract
and two public summaries: its arms are parameter-free stopping rules — Max-Confidence, SVIP, AdaEDL and two it
introduces, SVIPDifference and LogitMargin; the bandit can act per draft ("sequence-level") or per position
("token-level"), sequence-level UCB1 being its main variant, with Thompson sampling and UCB-Tuned also tried; and its
reward "balances accepted length and rate". Its exact reward formula, weights and arm thresholds were not reachable.
So: the arms are registered policies; `arms=[...]` takes any registered names, each optionally with ":<length>" for
the arm's length option, e.g. ["constant:3", "constant:8", "adaedl"] (fixed lengths as arms: γ = 3 and γ = 8, and
adaedl capped at 40 as by default), or a dict that names the policy and sets options of its config, e.g.
{"name": "cost_aware", "calibration_discount": 0.98} (shown as `cost_aware(calibration_discount=0.98)` in
`arm_values()`). The time-based rewards and the "tokens_per_forward" option are the package's
choice; "blended" is our reading of the summaries, not the paper's formula. The division by R, playing each arm once
first and the Gaussian form of Thompson sampling are ours. Arms given without a length whose length option is unset
(heuristic's initial length, constant's length) get `num_tokens` (num_assistant_tokens, else the acceptance rule's
default); the per-token arms keep their own caps (40 for adaedl and svip, 24 for cost_aware). The first round of a
`generate()` call also pays the prompt's prefill (`RoundOutcome.includes_prefill`), so with the time-based reward it
updates the arm but not the bandit.

Defaults (ours, measured; every figure, and the ideas that did not help, in `docs/draft-length-research.md`):
- Arms `cost_aware` and `svip`: like the paper's, stopping rules that read the draft's confidence, one of the paper's
  (SVIP) and this package's strongest single policy. The bandit cannot tell arms a few percent apart within one
  benchmark, so every weak arm costs rounds: replayed on the reference pair's `exact` traces (30 / 29 prompts × 128
  tokens) these two make 1.10 / 1.09 of the best fixed length, adding `adaedl` 1.07 / 1.09, the previous defaults
  ["adaedl", "svip", "heuristic"] 0.99 / 1.01 (pass `arms=` those for the previous behaviour).
- UCB-Tuned over "tokens_per_fitted_second": one round's wall time is a noisy reward (the same round timed twice
  differed by up to a third on the reference CPU), while what an arm changes is k and the accepted tokens; so the
  reward prices k by the timed rounds. Against UCB1 over the measured time (the paper's main variant) it gained 1 to
  5 points of the ratio to the best fixed length, in all eight comparisons, replayed and live (pass
  `bandit="ucb1", reward="tokens_per_second"` for the previous behaviour).
- `round_time="per_length"`: a CPU's verify forward is not linear in its tokens (on the reference one, 0.52 s at
  k = 0, 0.97 s at k = 2, 0.69 s at k = 3), so a line misprices short rounds; per length gained up to 3 points with
  `exact` and tied with `fly`.
- With `fly` these arms mostly end rounds before `fly`'s window (W + 1 = 7 drafts) can keep a mismatch. Pooled over
  66 prompts × 64 tokens (7 a category, `draft-length-fly-7-per-category.md`), `tapout` makes 1.10 ± 0.01 of the best
  fixed length, within 3% of it in 8 of 10 categories, short in math (0.96 ± 0.06) and math_reasoning (0.88 ± 0.06),
  where γ = 16 is best. A long fixed arm, `cost_aware` pricing the window and switching on a prompt signal each
  gained there and lost as much or more elsewhere; a shorter calibration memory did not make those rounds longer.
  Answers of 256 tokens did not close it (1.04 overall and 0.90 of γ = 16 on math_reasoning's prompt, one prompt a
  category) unless the bandit learned on math alone.

State: `draft_length="tapout"` keeps its instance for the next call with the same models (dtypes and devices), rule,
options and decoding mode (the bandit's statistics and the arms' state go on; `hf_semspec.forget_draft_length_state()`
starts afresh), because one call rarely makes enough rounds to learn from: replayed on the `exact` traces, 128 tokens
a prompt, a fresh bandit per prompt made 1.04 / 1.03 of the best fixed length against 1.08 / 1.10 going on across
prompts (`replay-exact-3x128-per-call.md`, `…-held-out-per-call.md`, against `…-by-length.md`). Pass an instance
(`draft_length=TapOutPolicy(...)`) to choose what it shares. One instance per kind of request did not pay, even with a
perfect key: one per Spec-Bench category made 1.06 against 1.09 shared, replayed with `exact`, and 1.10 as shared,
live with `fly`; 1.07 with `cost_aware` pricing `fly`'s window per category (`docs/draft-length-research.md`).
`arm_values()` shows what it learned.

Worked example (UCB1, three arms played once with rewards 100, 200 and 150 tokens/s): R = 200, t = 3, every N_a = 1,
so the indices are 0.5 + sqrt(2 ln 3) = 1.982, 1.0 + 1.482 = 2.482 and 0.75 + 1.482 = 2.232: round 4 goes to the
second arm. If it then earns 100 tokens/s, its mean falls to 150 (index 0.75 + sqrt(2 ln 4 / 2) = 1.927) and round 5
goes to the third arm (0.75 + sqrt(2 ln 4) = 2.415, against 0.5 + 1.665 = 2.165 for the first).

UCB-Tuned on the same rewards: after round 3 every V_a = 0 + sqrt(2 ln 3) > 1/4, so every bonus is
sqrt(ln 3 · 1/4) = 0.524 and the indices are 1.024, 1.524 and 1.274 (round 4: the second arm). Its rewards 200 and 100
then give σ² / R² = 0.0625; with t = 4 the indices are 0.5 + 0.589 = 1.089, 0.75 + sqrt(ln 4 / 2 · 1/4) = 1.166 and
0.75 + 0.589 = 1.339 (round 5: the third arm). Its bonus is at most half of UCB1's (the factor 1/4 under the root
against 2) and shrinks further once an arm's V_a < 1/4, i.e. after about 32 ln t pulls for a low-variance arm; so it
commits sooner when the arms' rewards differ by little.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import random
from dataclasses import dataclass, field

import torch

from ..component_config import Range, default_of
from ..errors import SemSpecConfigError, invalid_value
from ._round_cost import RoundCostFit
from .base import (
    POLICIES,
    UNSET_LENGTH_FALLBACK,
    DraftLengthConfig,
    DraftLengthPolicy,
    RoundOutcome,
    default_length,
    register_policy,
)

DEFAULT_ARMS = ("cost_aware", "svip")
EXAMPLE_ARMS = ("constant:3", "constant:8", "adaedl")
EXAMPLE_ARM_WITH_OPTIONS = {"name": "cost_aware", "calibration_discount": 0.98}
ARM_LENGTHS = Range(1, 128)
BANDITS = ("ucb1", "ucb_tuned", "thompson")
REWARDS = ("tokens_per_second", "tokens_per_fitted_second", "tokens_per_forward", "blended")
ROUND_TIMES = ("per_length", "line")  # how "tokens_per_fitted_second" reads a round's time off the timed rounds
TIMED_REWARDS = ("tokens_per_second", "tokens_per_fitted_second")  # a prefill round's time would mislead them
_SHORTEST_SECONDS = 1e-9  # a round's time as rewards divide by it, at least this
HISTORY_LENGTH = 1000  # rounds kept in `TapOutPolicy.history`


def split_arm(arm: str | dict) -> tuple[str | None, str | None]:
    """`"constant:3"` → ("constant", "3"); `"adaedl"` → ("adaedl", None); an arm with options,
    `{"name": "cost_aware", ...}` → ("cost_aware", None) (None for a dict without a name: validation names it)."""
    if isinstance(arm, dict):
        return arm.get("name"), None
    name, colon, length = arm.partition(":")
    return name, (length if colon else None)


def arm_options(arm: str | dict) -> dict:
    """The options an arm sets on its policy's config: a dict arm's keys other than "name"; none for a name."""
    return {k: v for k, v in arm.items() if k != "name"} if isinstance(arm, dict) else {}


def arm_config(arm: str | dict, num_tokens: int | None) -> DraftLengthConfig:
    """The validated config of an arm's policy: its options, and in its length field the arm's ':<length>', else
    tapout's `num_tokens` (or `UNSET_LENGTH_FALLBACK` outside `generate()`) where the options leave it None.
    Raises `SemSpecConfigError` from the arm's own config."""
    return _arm_config(arm, num_tokens)[0]


def _arm_config(arm: str | dict, num_tokens: int | None) -> tuple[DraftLengthConfig, bool]:
    """`arm_config`, and whether the arm's length is `num_tokens`'s (or the fallback's, while that is None)."""
    name, length = split_arm(arm)
    policy_class = POLICIES.get(name)
    config = policy_class.config_class.from_kwargs(arm_options(arm))
    length_field = policy_class.length_field
    takes_num_tokens = length is None and length_field is not None and getattr(config, length_field) is None
    if length is not None:
        setattr(config, length_field, int(length))
    elif takes_num_tokens:
        setattr(config, length_field, default_length(config, length_field, num_tokens or UNSET_LENGTH_FALLBACK))
    config.validate()
    return config, takes_num_tokens


def arm_label(arm: str | dict) -> str:
    """How an arm is named in `arm_values()`: the string itself, or `name(option=value;...)` for a dict arm (its name
    alone without options)."""
    if not isinstance(arm, dict):
        return arm
    options = arm_options(arm)
    return f"{arm['name']}({';'.join(f'{k}={v}' for k, v in options.items())})" if options else arm["name"]


@dataclass
class TapOutConfig(DraftLengthConfig):
    component_name = "tapout"
    arms: list[str | dict] | None = field(
        default=None,
        metadata={
            "help": "registered policy names to choose from, each optionally with ':<length>' for its length option "
            f"(e.g. {list(EXAMPLE_ARMS)}), or a dict naming the policy and options of its config (e.g. "
            f"{EXAMPLE_ARM_WITH_OPTIONS}); None = {list(DEFAULT_ARMS)}"
        },
    )
    bandit: str = field(
        default="ucb_tuned",
        metadata={
            "help": "how the arm is picked each round: UCB1, UCB-Tuned or (seeded) Thompson sampling",
            "choices": BANDITS,
        },
    )
    reward: str = field(
        default="tokens_per_fitted_second",
        metadata={
            "help": "what a round earns the arm that drafted it: accepted tokens per second (measured, or priced by "
            "the fitted line of round time against draft length), per target forward, or blended; see the module "
            "docstring",
            "choices": REWARDS,
        },
    )
    round_time: str = field(
        default="per_length",
        metadata={
            "help": "with reward='tokens_per_fitted_second', the time a round of k drafts is priced at: the mean time "
            "of the rounds that drafted k, shrunk toward the least squares line through every timed round "
            "('per_length', as cost_aware prices rounds), or the line alone ('line', the default before a verify "
            "forward's time was measured not to be linear in k); see the module docstring",
            "choices": ROUND_TIMES,
        },
    )
    num_tokens: int | None = field(
        default=None,
        metadata={
            "help": "length for arms whose own length option is unset (heuristic's initial, constant's; an initial "
            "length no higher than the arm's max_tokens); None = num_assistant_tokens, else the draft's "
            "generation_config.num_assistant_tokens, else the acceptance rule's default",
            "range": Range(1, 128),
        },
    )
    seed: int = field(
        default=0, metadata={"help": "seed of Thompson sampling's random draws", "range": Range(0, 2**63 - 1)}
    )

    def _validate_extra(self) -> None:
        if self.round_time != "per_length" and self.reward != "tokens_per_fitted_second":
            raise invalid_value(
                f"{self.argument_name}['round_time']", self.round_time,
                f"'per_length' (the default) with reward={self.reward!r}: only reward='tokens_per_fitted_second' "
                "prices rounds by a fitted time",
                "drop round_time, or pass reward='tokens_per_fitted_second'")
        if self.arms is not None:
            self._validate_arm_names()
        built: dict[tuple, str | dict] = {}  # (policy, its config) → the first arm that builds it
        normalized: list[str | dict] = []  # the arms, a dict arm's options as its config stores them (1 → 1.0)
        for arm in self.arms if self.arms is not None else DEFAULT_ARMS:  # each as it will be built, with its length
            try:
                config, takes_num_tokens = _arm_config(arm, self.num_tokens)
            except SemSpecConfigError as error:
                length = self.num_tokens or UNSET_LENGTH_FALLBACK
                raise invalid_value(
                    f"{self.argument_name}['arms']", self.arms if self.arms is not None else list(DEFAULT_ARMS),
                    f"arms that their policy accepts with the length they get (num_tokens={length}, which "
                    f"num_assistant_tokens sets, where an arm sets none): {arm!r} gives {error}",
                    "give the arm a length within its policy's limits, or lower num_tokens / num_assistant_tokens",
                ) from error
            # Compared as built, so that spellings of one policy ("constant:03" and "constant:3", a dict arm and a
            # name with the same options) count as the same arm: two identical arms only split its rounds. An arm
            # whose length is num_tokens's, still unset (generate() sets it from num_assistant_tokens or the rule,
            # then validates again), is not compared by the fallback length it has now.
            name = split_arm(arm)[0]
            values = config.all_options()
            if takes_num_tokens and self.num_tokens is None:
                values.pop(POLICIES.get(name).length_field)
            key = (name, repr(sorted(values.items())))
            if key in built:
                raise invalid_value(
                    f"{self.argument_name}['arms']", self.arms,
                    f"each arm once ({built[key]!r} and {arm!r} build the same policy with the same options)",
                    "remove the repeated arm")
            built[key] = arm
            # A None the user gave is left out where it is the field's default, so the arm reads as without it (the
            # config holds the fallback length there until num_tokens is set).
            defaults = {f.name: default_of(f) for f in dataclasses.fields(config)}
            normalized.append({"name": name, **{k: getattr(config, k) for k, v in arm_options(arm).items()
                                                if not (v is None and defaults.get(k) is None)}}
                              if isinstance(arm, dict) else arm)
        if self.arms is not None:  # a new list: the caller's is never changed
            self.arms = normalized

    def _validate_arm_names(self) -> None:
        label = f"{self.argument_name}['arms']"
        registered = [n for n in POLICIES.names() if n != self.component_name]
        fix = (f"pass a list of registered policy names, each optionally with ':<length>', e.g. {list(EXAMPLE_ARMS)}, "
               f"or dicts naming the policy and its options, e.g. {EXAMPLE_ARM_WITH_OPTIONS}")
        if not self.arms or not all(isinstance(a, (str, dict)) for a in self.arms):
            raise invalid_value(label, self.arms, f"a non-empty list of names from {registered} or dicts", fix)
        bad = [a for a in self.arms if split_arm(a)[0] not in registered]
        if bad:
            allowed = f"names from {registered} ({bad} are not; tapout cannot be its own arm)"
            raise invalid_value(label, self.arms, allowed, fix)
        for arm in self.arms:
            name, length = split_arm(arm)
            if isinstance(arm, dict):
                try:  # the arm's own config checks its options: unknown names, types, ranges
                    POLICIES.get(name).config_class.from_kwargs(arm_options(arm))
                except SemSpecConfigError as error:
                    raise invalid_value(label, self.arms, f"options that {name!r} accepts ({error})", fix) from error
                continue
            if length is None:
                continue
            if POLICIES.get(name).length_field is None:
                raise invalid_value(label, self.arms, f"no ':<length>' after {name!r}, which has no length option", fix)
            if not (length.isascii() and length.isdigit()) or int(length) not in ARM_LENGTHS:
                raise invalid_value(label, self.arms, f"lengths in {ARM_LENGTHS} after ':' ({arm!r} is not)", fix)


@register_policy
class TapOutPolicy(DraftLengthPolicy):
    """A bandit over draft-length policies; see the module docstring."""

    name = "tapout"
    config_class = TapOutConfig
    paper = "https://arxiv.org/abs/2511.02017"
    length_field = "num_tokens"
    # Class-level: some arm may decide per token and read q. Each round narrows these on the instance to the chosen
    # arm's (set in max_tokens(), which the loop calls before drafting), so a heuristic round costs no host sync.
    decides_per_token = True
    keeps_state_across_calls = True
    reads_draft_probs = True

    def __init__(self, config: TapOutConfig | None = None):
        super().__init__(config)
        arms = list(self.config.arms) if self.config.arms is not None else list(DEFAULT_ARMS)
        self.arm_names = [arm_label(arm) for arm in arms]
        self.arms = [self._build_arm(arm) for arm in arms]
        self.pulls = [0] * len(self.arms)
        self.reward_sums = [0.0] * len(self.arms)
        self.reward_square_sums = [0.0] * len(self.arms)  # for UCB-Tuned's variance
        self.reward_scale = 0.0  # R, the largest reward seen
        # "tokens_per_fitted_second": the line ŝ(k) and, per arm, k → [Σ (n+1), Σ (n+1)², max (n+1)] over its
        # rounds, so that every reward is re-priced when the line moves.
        self.round_costs = RoundCostFit()
        self.tokens_by_length: list[dict[int, list[float]]] = [{} for _ in self.arms]
        self.largest_budget = 0  # L of the blended reward
        self.current: int | None = None  # the arm drafting this round
        # The arms of the last HISTORY_LENGTH rewarded rounds, in order (prefill rounds are not): bounded, since a
        # policy kept by name lives as long as the process that serves with it.
        self.history: collections.deque[int] = collections.deque(maxlen=HISTORY_LENGTH)
        self._rng = random.Random(self.config.seed)

    def _build_arm(self, arm: str | dict) -> DraftLengthPolicy:
        return POLICIES.get(split_arm(arm)[0])(arm_config(arm, self.config.num_tokens))

    # The bandit.

    @property
    def _fitted(self) -> bool:
        return self.config.reward == "tokens_per_fitted_second"

    def round_seconds(self, num_drafted: int) -> float | None:
        """t̂(k), the price of a round that drafted k under the fitted-time reward (`round_time`): the line ŝ(k), or the
        rounds' mean time at k shrunk toward it (`RoundCostFit.length_seconds`); the mean time at k until two lengths
        are timed (None before any round at k)."""
        seconds = None
        if self.config.round_time == "per_length":
            seconds = self.round_costs.length_seconds(num_drafted)
        if seconds is None:
            seconds = self.round_costs.seconds(num_drafted)
        # Rewards divide by it: a clock too coarse to time a round (0 s) must not crash the bandit.
        return None if seconds is None else max(seconds, _SHORTEST_SECONDS)

    def _reward_sums(self, arm: int) -> tuple[float, float]:
        """(Σ r, Σ r²) over the arm's rewarded rounds."""
        if not self._fitted:
            return self.reward_sums[arm], self.reward_square_sums[arm]
        total = square = 0.0
        for k, (tokens, tokens_squared, _) in self.tokens_by_length[arm].items():
            seconds = self.round_seconds(k)
            total += tokens / seconds
            square += tokens_squared / seconds**2
        return total, square

    def _scale(self) -> float:
        """R, the largest reward of a round so far (at the current prices for the fitted reward)."""
        if not self._fitted:
            return self.reward_scale
        return max(
            (most / self.round_seconds(k) for by_length in self.tokens_by_length
             for k, (_, _, most) in by_length.items()),
            default=0.0,
        )

    def _normalized_mean(self, arm: int) -> float:
        mean = self._reward_sums(arm)[0] / self.pulls[arm]
        scale = self._scale()
        return mean / scale if scale > 0 else 0.0

    def ucb_index(self, arm: int) -> float:
        """UCB1's index μ_a / R + sqrt(2 ln t / N_a) of a played arm."""
        return self._normalized_mean(arm) + math.sqrt(2 * math.log(sum(self.pulls)) / self.pulls[arm])

    def ucb_tuned_index(self, arm: int) -> float:
        """UCB-Tuned's index μ_a / R + sqrt(ln t / N_a · min(1/4, V_a)) of a played arm."""
        pulls, log_t = self.pulls[arm], math.log(sum(self.pulls))
        mean = self._normalized_mean(arm)
        scale = self._scale() or 1.0
        variance = max(0.0, self._reward_sums(arm)[1] / pulls / scale**2 - mean**2)
        bound = variance + math.sqrt(2 * log_t / pulls)
        return mean + math.sqrt(log_t / pulls * min(0.25, bound))

    def choose_arm(self) -> int:
        """The arm for the next round (advances Thompson sampling's random stream)."""
        for arm, pulls in enumerate(self.pulls):
            if pulls == 0:
                return arm
        if self.config.bandit == "ucb1":
            scores = [self.ucb_index(a) for a in range(len(self.arms))]
        elif self.config.bandit == "ucb_tuned":
            scores = [self.ucb_tuned_index(a) for a in range(len(self.arms))]
        else:
            scores = [
                self._rng.gauss(self._normalized_mean(a), 1 / math.sqrt(n + 1)) for a, n in enumerate(self.pulls)
            ]
        return max(range(len(scores)), key=lambda a: (scores[a], -a))

    def reward(self, outcome: RoundOutcome) -> float:
        """What the round earns the arm that drafted it (`reward` option)."""
        tokens = outcome.num_emitted
        if self.config.reward == "tokens_per_second":
            return tokens / max(outcome.seconds, _SHORTEST_SECONDS)
        if self._fitted:
            seconds = self.round_seconds(outcome.num_drafted)
            return tokens / (seconds if seconds is not None else max(outcome.seconds, _SHORTEST_SECONDS))
        if self.config.reward == "tokens_per_forward":
            return float(tokens)
        length = outcome.num_accepted / max(self.largest_budget, 1)
        rate = outcome.num_accepted / outcome.num_drafted if outcome.num_drafted > 0 else 0.0
        return 0.5 * length + 0.5 * rate

    def arm_values(self) -> dict[str, dict[str, float]]:
        """Per arm: rounds played and mean reward (the paper's interpretable "arm values")."""
        return {
            name: {"pulls": n, "mean_reward": self._reward_sums(a)[0] / n if n else 0.0}
            for a, (name, n) in enumerate(zip(self.arm_names, self.pulls))
        }

    # The policy interface, delegated to the round's arm.

    def max_tokens(self) -> int:
        self.current = self.choose_arm()
        arm = self.arms[self.current]
        self.decides_per_token = arm.decides_per_token
        self.reads_draft_probs = arm.reads_draft_probs
        budget = arm.max_tokens()
        self.largest_budget = max(self.largest_budget, budget)
        return budget

    def keep_drafting(self, num_drafted: int, probs: torch.Tensor | None) -> bool:
        if self.current is None:
            return True
        arm = self.arms[self.current]
        if not arm.decides_per_token or (arm.reads_draft_probs and probs is None):
            return True
        return arm.keep_drafting(num_drafted, probs if arm.reads_draft_probs else None)

    def set_deferred_window(self, window: int | None) -> None:
        for arm in self.arms:
            arm.set_deferred_window(window)

    def observe(self, outcome: RoundOutcome) -> None:
        if self.current is None:
            return
        arm = self.current
        self.arms[arm].observe(outcome)
        self.current = None
        if outcome.includes_prefill and self.config.reward in TIMED_REWARDS:
            return  # the prompt's prefill dominates this round's time: no evidence about the arm
        if outcome.num_drafted == 0:
            return  # one token left of max_new_tokens: the round drafted nothing, whatever the arm
        self.pulls[arm] += 1
        self.history.append(arm)
        if self._fitted:
            self.round_costs.add(outcome.num_drafted, outcome.seconds)
            tokens = outcome.num_emitted
            stats = self.tokens_by_length[arm].setdefault(outcome.num_drafted, [0.0, 0.0, 0.0])
            stats[0] += tokens
            stats[1] += tokens * tokens
            stats[2] = max(stats[2], tokens)
            return
        value = self.reward(outcome)
        self.reward_sums[arm] += value
        self.reward_square_sums[arm] += value * value
        self.reward_scale = max(self.reward_scale, value)
