"""`cost_aware`: the docstring's worked example, each estimate on worked numbers (calibration, p̄, ρ, R̃), the
optimality of the rule on geometric streams (it drafts the best fixed length of Leviathan et al.'s formula), what it
learns from entropy, and its errors. End to end it runs in the registry-built matrix of test_draft_length_policies."""

from __future__ import annotations

import collections
import math
import random
from collections.abc import Callable

import pytest
from conftest import with_entropy

from hf_semspec.draft_length import POLICIES, RoundOutcome
from hf_semspec.draft_length import cost_aware as cost_aware_module
from hf_semspec.draft_length._round_cost import LINE_PRIOR_ROUNDS, RoundCostFit
from hf_semspec.draft_length.cost_aware import BIN_PRIORS, CostAwareConfig, CostAwarePolicy, entropy_bin
from hf_semspec.errors import SemSpecConfigError

# Draft distributions in known calibration bins (edges 0.05, 0.1, 0.2, 0.4, 0.7, 1.0, 1.5, 2.0, 3.0 nats).
Q_BIN = {b: with_entropy(h) for b, h in {0: 0.02, 2: 0.15, 5: 0.8, 6: 1.2, 7: 1.7, 9: 3.5}.items()}


def outcome(drafted: int, accepted: int, seconds: float = 1.0, prefill: bool = False) -> RoundOutcome:
    return RoundOutcome(num_drafted=drafted, num_accepted=accepted, seconds=seconds, includes_prefill=prefill)


def test_entropy_bins_and_priors():
    assert [entropy_bin(h) for h in (0.0, 0.049, 0.05, 0.3, 0.99, 1.0, 2.5, 3.0, 7.0)] == [0, 0, 1, 3, 5, 6, 8, 9, 9]
    assert all(entropy_bin(float(-(q * q.log()).nansum())) == b for b, q in Q_BIN.items())
    # SVIP's bound 1 − sqrt(0.15·H) at each bin's middle, kept within [0.05, 0.99]; the open last bin reads H = 4.
    assert BIN_PRIORS[0] == pytest.approx(1 - math.sqrt(0.15 * 0.025))
    assert BIN_PRIORS[5] == pytest.approx(1 - math.sqrt(0.15 * 0.85))
    assert BIN_PRIORS[9] == pytest.approx(1 - math.sqrt(0.15 * 4.0))
    assert list(BIN_PRIORS) == sorted(BIN_PRIORS, reverse=True)


def test_docstring_worked_example():
    # ρ = 0.2 and R̃ = 2 (threshold 0.4), p̄ = 0.8; drafts with p̂ = 0.99, 0.95, 0.6, 0.8 → stop after the fourth.
    policy = CostAwarePolicy(CostAwareConfig(cost_ratio=0.2))
    policy.rate_tokens, policy.rate_rounds = 2.0, {0: 1.0}  # one round, 2 tokens in t̂(0) = 1: R̃ = 2
    assert policy.running_rate() == pytest.approx(2.0)
    p_hat = {0: 0.99, 2: 0.95, 7: 0.6, 5: 0.8}
    policy.acceptance = p_hat.__getitem__
    policy.next_draft_acceptance = lambda: 0.8
    policy.max_tokens()
    decisions = [policy.keep_drafting(j, Q_BIN[b]) for j, b in enumerate(p_hat, start=1)]
    assert decisions == [True, True, True, False]
    assert policy.survival == pytest.approx(0.99 * 0.95 * 0.6 * 0.8)
    # A cheaper draft (ρ = 0.1, threshold 0.2) drafts on after the same four.
    cheaper = CostAwarePolicy(CostAwareConfig(cost_ratio=0.1))
    cheaper.rate_tokens, cheaper.rate_rounds = 2.0, {0: 1.0}
    cheaper.acceptance, cheaper.next_draft_acceptance = p_hat.__getitem__, (lambda: 0.8)
    cheaper.max_tokens()
    assert [cheaper.keep_drafting(j, Q_BIN[b]) for j, b in enumerate(p_hat, start=1)] == [True] * 4


def test_calibration_learns_the_tested_drafts_only():
    policy = CostAwarePolicy(CostAwareConfig(calibration_discount=0.5))
    policy.max_tokens()
    for j, b in enumerate([0, 0, 6, 9], start=1):
        policy.keep_drafting(j, Q_BIN[b])
    policy.observe(outcome(5, 2))  # drafts 1-2 accepted, 3 rejected, 4-5 never tested
    assert policy.tested == [2, 0, 0, 0, 0, 0, 1, 0, 0, 0]
    assert policy.accepted == [2, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    assert policy.acceptance(0) == pytest.approx((2 + BIN_PRIORS[0]) / 3)
    assert policy.acceptance(6) == pytest.approx(BIN_PRIORS[6] / 2)
    assert policy.acceptance(9) == BIN_PRIORS[9]  # untested: the prior
    assert policy.next_draft_acceptance() == pytest.approx((2 + 0.5) / (3 + 1))
    # Next round, 2 drafts both accepted: the last draft of a round is never seen (nothing is decided after it), so
    # one tested draft, which weighs the old counts by δ_c = 0.5.
    policy.max_tokens()
    policy.keep_drafting(1, Q_BIN[6])
    policy.observe(outcome(2, 2))
    assert policy.tested[0] == pytest.approx(1.0) and policy.accepted[0] == pytest.approx(1.0)
    assert policy.tested[6] == pytest.approx(1.5) and policy.accepted[6] == pytest.approx(1.0)


def test_cost_ratio_and_running_rate_worked_numbers():
    policy = CostAwarePolicy()
    assert policy.cost_ratio() == cost_aware_module.UNFITTED_COST_RATIO and policy.running_rate() == 1.0
    policy.observe(outcome(6, 6, seconds=50.0, prefill=True))  # the prompt's prefill: not a drafting cost
    policy.observe(outcome(2, 2, seconds=1.4))
    assert policy.cost_ratio() == cost_aware_module.UNFITTED_COST_RATIO  # one timed length: no fit yet
    policy.observe(outcome(4, 4, seconds=1.8))
    # s = 1.0 + 0.2·k through (2, 1.4) and (4, 1.8): ρ = 0.2. R̃ over the three rounds with δ_r = 0.8:
    # tokens 0.64·7 + 0.8·3 + 5 = 11.88, rounds 0.64 + 0.8 + 1 = 2.44, drafted 0.64·6 + 0.8·2 + 4 = 9.44.
    assert policy.cost_ratio() == pytest.approx(0.2)
    assert policy.running_rate() == pytest.approx(11.88 / (2.44 + 0.2 * 9.44))


def linear_time(rho: float, base_seconds: float = 1.0) -> Callable[[int], float]:
    """The time of a round drafting k: base_seconds·(1 + ρ·k)."""
    return lambda k: base_seconds * (1.0 + rho * k)


def best_fixed_length(alpha: float, seconds: Callable[[int], float], cap: int = 24) -> tuple[int, Callable]:
    """argmax_γ E_γ / seconds(γ), E_γ = (1 − α^(γ+1)) / (1 − α) (Leviathan et al. 2023, §3), and that rate; cap: the
    policy's."""
    def rate(gamma: int) -> float:
        return (1 - alpha ** (gamma + 1)) / (1 - alpha) / seconds(gamma)
    return max(range(1, cap + 1), key=rate), rate


def draft_round(policy: CostAwarePolicy, q_of_draft, limit: int | None = None) -> int:
    """One round's drafting as the decoding loop does it: the first draft is always made, then one more while the
    policy says so, up to its cap (and `limit`); `q_of_draft(j)` is draft j's distribution. Returns k."""
    cap, drafted = policy.max_tokens(), 1
    cap = min(cap, limit) if limit is not None else cap
    while drafted < cap and policy.keep_drafting(drafted, q_of_draft(drafted)):
        drafted += 1
    return drafted


def simulate_geometric(alpha: float, seconds: Callable[[int], float], rounds: int, seed: int,
                       policy: CostAwarePolicy | None = None) -> tuple[CostAwarePolicy, list[int]]:
    """Rounds where every draft has the same entropy and is accepted with probability α, a round drafting k timed
    seconds(k); `policy` defaults to a fresh `CostAwarePolicy()`."""
    rng = random.Random(seed)
    policy, q = policy or CostAwarePolicy(), with_entropy(0.5)
    lengths = []
    for _ in range(rounds):
        drafted = draft_round(policy, lambda j: q)
        accepted = 0
        while accepted < drafted and rng.random() < alpha:
            accepted += 1
        policy.observe(outcome(drafted, accepted, seconds=seconds(drafted)))
        lengths.append(drafted)
    return policy, lengths


@pytest.mark.parametrize("alpha, rho, best", [(0.8, 0.2, 4), (0.8, 0.1, 6), (0.6, 0.2, 2), (0.9, 0.05, 13)])
def test_drafts_the_best_fixed_length_on_a_geometric_stream(alpha, rho, best):
    # With one entropy everywhere P_j = α^j, so the rule is a fixed length, and its fixed point is the best one.
    assert best_fixed_length(alpha, linear_time(rho))[0] == best
    rate = best_fixed_length(alpha, linear_time(rho))[1]
    for seed in range(2):
        policy, lengths = simulate_geometric(alpha, linear_time(rho), rounds=1500, seed=seed)
        settled = lengths[500:]
        assert policy.cost_ratio() == pytest.approx(rho)  # fitted from the rounds' times
        # R̃'s noise moves the length around γ* (by ±2 where the optimum is flat: at α = 0.9, ρ = 0.05, γ = 15 has
        # 0.996 of γ* = 13's rate), which costs under 1% of the best fixed length's throughput.
        assert abs(collections.Counter(settled).most_common(1)[0][0] - best) <= 2
        assert sum(rate(k) for k in settled) / len(settled) / rate(best) > 0.99


def test_learns_which_entropies_are_accepted_and_stops_after_an_unsure_draft():
    # Sure drafts (bin 0) are always accepted, unsure ones (bin 7) one time in five: after training the round goes on
    # through sure drafts and stops right after an unsure one.
    rng = random.Random(0)
    policy = CostAwarePolicy(CostAwareConfig(cost_ratio=0.2))
    for _ in range(300):
        kinds = [7 if rng.random() < 0.2 else 0 for _ in range(12)]
        drafted = draft_round(policy, lambda j: Q_BIN[kinds[j - 1]], limit=12)
        accepted = 0
        while accepted < drafted and (kinds[accepted] == 0 or rng.random() < 0.2):
            accepted += 1
        policy.observe(outcome(drafted, accepted))
    assert policy.acceptance(0) > 0.97 and 0.05 < policy.acceptance(7) < 0.4
    policy.max_tokens()
    assert all(policy.keep_drafting(j, Q_BIN[0]) for j in range(1, 9))
    assert not policy.keep_drafting(9, Q_BIN[7])


def test_a_cheaper_draft_drafts_longer_on_the_same_stream():
    short = simulate_geometric(0.85, linear_time(0.3), rounds=400, seed=0)[1][200:]
    long = simulate_geometric(0.85, linear_time(0.05), rounds=400, seed=0)[1][200:]
    assert sum(long) / len(long) > 2 * sum(short) / len(short)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"max_tokens": 0}, r"`draft_length_kwargs\['max_tokens'\]` = 0 .*\[1, 128\]"),
        ({"prior_strength": 0}, r"`draft_length_kwargs\['prior_strength'\]` = 0 .*\(0, inf\)"),
        ({"calibration_discount": 0.0}, r"`draft_length_kwargs\['calibration_discount'\]` = 0.0 .*\(0, 1\]"),
        ({"rate_discount": 1.5}, r"`draft_length_kwargs\['rate_discount'\]` = 1.5 .*\(0, 1\]"),
        ({"cost_ratio": -0.1}, r"`draft_length_kwargs\['cost_ratio'\]` = -0.1 "),
        ({"explore_after": -1}, r"`draft_length_kwargs\['explore_after'\]` = -1 .*\[0, 1000\]"),
        ({"flip_prior": 1.5}, r"`draft_length_kwargs\['flip_prior'\]` = 1.5 .*\[0, 1\]"),
        ({"threshold": 0.3}, r"unknown option\(s\) \['threshold'\] for 'cost_aware'"),
    ],
)
def test_bad_options_name_the_field(options, message):
    with pytest.raises(SemSpecConfigError, match=message):
        POLICIES.build("cost_aware", options)


def test_an_exploration_round_follows_explore_after_rounds_of_one_length():
    policy = CostAwarePolicy(CostAwareConfig(cost_ratio=0.2, explore_after=3))
    policy.acceptance, policy.next_draft_acceptance = (lambda b: 0.9), (lambda: 0.9)
    policy.rate_tokens, policy.rate_rounds = 2.0, {0: 1.0}  # threshold 0.4: P·p̄ = 0.9^(j+1) stops after j = 8

    def round_length() -> int:
        drafted = draft_round(policy, lambda j: Q_BIN[0])
        policy.observe(outcome(drafted, drafted))
        policy.rate_tokens, policy.rate_rounds = 2.0, {0: 1.0}  # keep R̃ = 2
        return drafted

    assert [round_length() for _ in range(8)] == [8, 8, 8, 10, 8, 8, 8, 10]  # 8 three times in a row → 8 + 2
    assert not CostAwarePolicy(CostAwareConfig(explore_after=0)).exploring


def test_gets_out_of_a_cost_fit_locked_by_slow_first_rounds():
    # Live on the reference pair (fly): the first timed rounds, k = 2 in 1.40 s (one-off costs) and k = 1 in 1.00 s,
    # fitted ρ = 0.64 where the machine's was 0.27; every later round then stopped after one draft, and rounds that
    # all draft one token never move the slope. After `explore_after` rounds of one length a round drafts two past its
    # stop, which gives the fit other lengths: the policy comes back to the lengths the true costs call for.
    def run(explore_after: int) -> tuple[CostAwarePolicy, list[int]]:
        policy = CostAwarePolicy(CostAwareConfig(explore_after=explore_after))
        policy.observe(outcome(2, 2, seconds=1.40))
        policy.observe(outcome(1, 1, seconds=1.00))
        # Then the machine's true costs: 0.75 + 0.2·k seconds, ρ = 0.2 / 0.75; drafts accepted with α = 0.85.
        return simulate_geometric(0.85, linear_time(0.2 / 0.75, 0.75), rounds=600, seed=0, policy=policy)

    locked, locked_lengths = run(explore_after=0)
    assert locked.cost_ratio() > 0.5 and set(locked_lengths[-100:]) == {1}
    best, rate = best_fixed_length(0.85, linear_time(0.2 / 0.75))
    recovered, lengths = run(explore_after=10)
    assert recovered.cost_ratio() == pytest.approx(0.2 / 0.75, rel=0.15)
    settled = lengths[300:]
    assert sum(rate(k) for k in settled) / len(settled) / rate(best) > 0.97


def test_round_time_per_length_is_the_measured_mean_shrunk_toward_the_line():
    costs = RoundCostFit()
    assert costs.length_seconds(3) is None  # no line yet
    for k, seconds in [(1, 0.7), (1, 0.8), (2, 1.1), (4, 1.1)]:
        costs.add(k, seconds)
    # Least squares through (1, 0.7), (1, 0.8), (2, 1.1), (4, 1.1): mean k 2, mean s 0.925, t_1 = 0.70 / 6, t_0 =
    # 0.925 − 2·t_1.
    t_0, t_1 = costs.coefficients()
    assert t_1 == pytest.approx(0.70 / 6) and t_0 == pytest.approx(0.925 - 2 * 0.70 / 6)
    # k = 1: rounds 1.5 s over 2, plus 2 pseudo-rounds of the line; k = 3 was never timed: the line.
    assert costs.length_seconds(1) == pytest.approx((1.5 + LINE_PRIOR_ROUNDS * (t_0 + t_1)) / (2 + LINE_PRIOR_ROUNDS))
    assert costs.length_seconds(3) == pytest.approx(t_0 + 3 * t_1)


def test_docstring_worked_example_with_measured_times_looks_past_an_expensive_length():
    # t̂(1) = 0.76, t̂(2) = 1.10, t̂(3) = 0.90 s (a 3-token verify forward is slower than a 4-token one);
    # R̃ = 2.5, p̄ = 0.8.
    policy = CostAwarePolicy(CostAwareConfig(max_tokens=3))
    policy.round_seconds = {1: 0.76, 2: 1.10, 3: 0.90}.__getitem__
    policy.running_rate, policy.next_draft_acceptance, policy.acceptance = (lambda: 2.5), (lambda: 0.8), (lambda b: 0.9)
    policy.max_tokens()
    assert policy.keep_drafting(1, Q_BIN[0])  # P_1 = 0.9
    assert policy.drafting_gain(1) == pytest.approx(0.72 + 0.576 - 2.5 * 0.14)  # m = 3; m = 2 alone gives −0.13
    assert policy.keep_drafting(2, Q_BIN[0])  # P_2 = 0.81: m = 3 gives 0.648 + 2.5·0.20
    assert policy.drafting_gain(2) == pytest.approx(0.648 + 2.5 * 0.20)
    # The same numbers with a line through t̂(1) and t̂(2) (t_1 = 0.34 s): the one step to 2 drafts does not pay.
    linear = CostAwarePolicy(CostAwareConfig(max_tokens=3))
    linear.round_seconds = lambda k: 0.42 + 0.34 * k
    linear.running_rate, linear.next_draft_acceptance, linear.acceptance = (lambda: 2.5), (lambda: 0.8), (lambda b: 0.9)
    linear.max_tokens()
    assert not linear.keep_drafting(1, Q_BIN[0])


def test_learns_to_skip_a_length_that_costs_more_than_a_longer_one():
    # Rounds timed as on the reference CPU: t(k) = target forward over k + 1 tokens + 0.11 s per draft, where the
    # 3-token forward (k = 2) is the slowest. On a geometric stream (α = 0.8) the best fixed length is 3; the policy
    # gets within 2% of its throughput, drafting 3 far more often than the expensive 2.
    target_forward = {1: 0.50, 2: 0.645, 3: 0.879, 4: 0.574, 5: 0.657, 6: 0.647}

    def seconds(k: int) -> float:
        return target_forward.get(k + 1, 0.647 + 0.0205 * (k - 5)) + 0.11 * k

    best, rate = best_fixed_length(0.8, seconds)
    assert best == 3
    lengths = simulate_geometric(0.8, seconds, rounds=800, seed=0)[1]
    settled = collections.Counter(lengths[300:])
    assert settled[3] > 5 * settled[2]
    assert sum(rate(k) * n for k, n in settled.items()) / 500 / rate(3) > 0.98


# --- under a rule's deferred window (fly) ------------------------------------------------------------------------


def windowed_policy(window: int = 2, **options) -> CostAwarePolicy:
    policy = CostAwarePolicy(CostAwareConfig(**{"flip_prior": 0.5, **options}))
    policy.set_deferred_window(window)
    return policy


def test_window_expectation_worked_numbers():
    # W = 2, φ = 0.5, k = 3, p = 0.5, 0.8, 0.9. Only draft 1 has W drafts after it. It passes (0.5): drafts 2 and 3
    # as under exact, 1 + 0.8 + 0.72 = 2.52; it fails and is kept (0.5·0.5): drafts 1-2 accepted, draft 3 fresh, 2.9.
    policy = windowed_policy(2)
    policy.round_flip = 0.5
    assert policy.expected_accepted([0.5, 0.8, 0.9], 3) == pytest.approx(0.5 * 2.52 + 0.25 * 2.9)
    # With φ = 0 it is the exact rules' Σ_i Π_{l ≤ i} p_l, on any numbers.
    rng = random.Random(0)
    policy.round_flip = 0.0
    for _ in range(20):
        p = [rng.random() for _ in range(8)]
        assert policy.expected_accepted(p, 8) == pytest.approx(sum(math.prod(p[:i]) for i in range(1, 9)))


def test_docstring_worked_example_with_a_window():
    # ρ = 0.2, R̃ = 2, p̄ = 0.9, cap 4, W = 2, φ = 0.5; drafts with p̂ = 0.99, 0.3, 0.95.
    def round_length(window: int | None) -> tuple[CostAwarePolicy, int]:
        policy = CostAwarePolicy(CostAwareConfig(cost_ratio=0.2, max_tokens=4, flip_prior=0.5))
        policy.set_deferred_window(window)
        policy.rate_tokens, policy.rate_rounds = 2.0, {0: 1.0}
        policy.acceptance = {0: 0.99, 9: 0.3, 2: 0.95}.__getitem__
        policy.next_draft_acceptance = lambda: 0.9
        return policy, draft_round(policy, [None, Q_BIN[0], Q_BIN[9], Q_BIN[2]].__getitem__)

    exact_policy, exact_length = round_length(None)
    assert exact_length == 2  # P_2·p̄ = 0.99·0.3·0.9 = 0.267 < 0.4
    policy, length = round_length(2)
    assert length == 4
    # After draft 2: E_2 = 0.99·1.3 = 1.287, E_4 = 2.81827 (draft 2 kept with 0.7·0.5), so m = 4 gains 0.731 > 0;
    # m = 3 cannot keep draft 2 (2 + W > 3) and gains 0.99·0.3·0.9 − 0.4 < 0.
    policy.max_tokens()
    policy.round_acceptances = [0.99, 0.3]
    assert policy.expected_accepted([0.99, 0.3, 0.9, 0.9], 2) == pytest.approx(1.287)
    assert policy.expected_accepted([0.99, 0.3, 0.9, 0.9], 4) == pytest.approx(2.81827)
    assert policy.window_drafting_gain(2) == pytest.approx(2.81827 - 1.287 - 0.8)
    # After draft 3 (p̂ = 0.95): E_3 = 1.5839, E_4 = 2.84696.
    policy.round_acceptances = [0.99, 0.3, 0.95]
    assert policy.window_drafting_gain(3) == pytest.approx(2.84696 - 1.5839 - 0.4)


def test_window_learns_the_flip_rate_and_calibrates_on_the_own_test():
    policy = windowed_policy(2, calibration_discount=0.5, flip_prior=0.5)
    assert policy.flip_probability() == 0.5  # the prior

    def verified_round(bins: list[int], drafted: int, accepted: int, matched: int) -> None:
        policy.max_tokens()
        for j, b in enumerate(bins, start=1):
            policy.keep_drafting(j, Q_BIN[b])
        policy.observe(RoundOutcome(drafted, accepted, 1.0, num_matched=matched))

    # Draft 2 failed Δ and was kept (4 accepted): drafts 1-2 calibrate (1 passed, 1 failed), one kept flip.
    verified_round([0, 6, 0, 0], drafted=5, accepted=4, matched=1)
    assert policy.tested == [1, 0, 0, 0, 0, 0, 1, 0, 0, 0] and policy.accepted == [1, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    assert (policy.flips, policy.flip_trials) == (1.0, 1.0) and policy.flip_probability() == pytest.approx(1.5 / 2)
    # Draft 1 failed and was not kept, W = 2 drafts after it: a failed trial, both counts forgotten by δ_c^1 first.
    verified_round([6, 0], drafted=3, accepted=0, matched=0)
    assert (policy.flips, policy.flip_trials) == (0.5, 1.5)
    # Draft 2 failed with only one draft after it: no trial; the counts are forgotten by δ_c² (two tested drafts).
    verified_round([0, 6], drafted=3, accepted=1, matched=1)
    assert policy.flip_trials == pytest.approx(1.5 * 0.25)


def simulate_unsure_drafts(
    window: int | None, accepted_of: Callable, rounds: int, **options
) -> tuple[CostAwarePolicy, list[int]]:
    """Rounds of sure drafts (bin 0, always pass Δ) and unsure ones (bin 7, one in five, never pass it), up to 12 per
    round, told `window` as a rule would; `accepted_of(rng, kinds, drafted, matched)` is the rule's accepted count.
    Returns the policy (cost_ratio 0.1, cap 12, `options`) and each round's length."""
    rng = random.Random(0)
    policy = CostAwarePolicy(CostAwareConfig(cost_ratio=0.1, max_tokens=12, **options))
    policy.set_deferred_window(window)
    lengths = []
    for _ in range(rounds):
        kinds = [7 if rng.random() < 0.2 else 0 for _ in range(12)]
        drafted = draft_round(policy, lambda j: Q_BIN[kinds[j - 1]], limit=12)
        matched = next((i for i, kind in enumerate(kinds[:drafted]) if kind == 7), drafted)
        accepted = accepted_of(rng, kinds, drafted, matched)
        # A rule without a window reports no num_matched.
        policy.observe(RoundOutcome(drafted, accepted, 1.0, num_matched=matched if window else None))
        lengths.append(drafted)
    return policy, lengths


def test_window_rounds_reach_past_an_unsure_draft_while_flips_pay_and_not_after():
    # The rule keeps a failed draft that has W = 3 drafts after it, the next two sure, with probability `flip_rate`.
    # Priced as exact (no window), a round stops right after an unsure draft; with flips that pay, it drafts on to
    # give the draft its window; where flips never come, it learns so and drafts about as the exact pricing does.
    def run(flip_rate: float, window: int | None = 3) -> tuple[CostAwarePolicy, list[int]]:
        def accepted_of(rng, kinds, drafted, matched):
            accepted = matched
            while (accepted + 3 < drafted and kinds[accepted] == 7 and kinds[accepted + 1: accepted + 3] == [0, 0]
                   and rng.random() < flip_rate):
                accepted += 3
                while accepted < drafted and kinds[accepted] == 0:
                    accepted += 1
            return accepted

        policy, lengths = simulate_unsure_drafts(window, accepted_of, rounds=300, flip_prior=0.5)
        return policy, lengths[100:]

    paying, paying_lengths = run(flip_rate=0.9)
    never, never_lengths = run(flip_rate=0.0)
    _, exact_lengths = run(flip_rate=0.0, window=None)
    # φ is the chance that a mismatch with W drafts after it is kept, its window included (about 0.8² · 0.9). Where
    # none is ever kept, the discounted trials fade and φ drifts back toward its prior 0.5, so a round now and then
    # tests the window again: 12% more drafts than the exact pricing on this stream.
    assert paying.flip_probability() > 0.5 and never.flip_probability() < 0.2
    assert sum(paying_lengths) > 1.5 * sum(exact_lengths)
    assert sum(never_lengths) < 1.15 * sum(exact_lengths)
    paying.max_tokens()
    assert all(paying.keep_drafting(j, Q_BIN[0]) for j in (1, 2)) and paying.keep_drafting(3, Q_BIN[7])


def test_without_flip_prior_a_window_changes_nothing():
    # The default (flip_prior=None): under fly's window the policy drafts and learns as it does for exact, from the
    # rule's accepted count, whatever num_matched says.
    def half_kept(rng, kinds, drafted, matched):
        return drafted if rng.random() < 0.5 else matched  # the window kept the mismatch half the time

    unpriced, unpriced_lengths = simulate_unsure_drafts(6, half_kept, rounds=200)
    plain, plain_lengths = simulate_unsure_drafts(None, half_kept, rounds=200)
    assert unpriced_lengths == plain_lengths and unpriced.accepted == plain.accepted
    assert not unpriced.prices_window and unpriced.flip_probability() == 0.0 and unpriced.flip_trials == 0.0
    assert len(set(plain_lengths)) > 1  # the stream does move the lengths


def test_tapout_tells_its_arms_the_window():
    policy = POLICIES.build("tapout", {})
    policy.set_deferred_window(6)
    assert [getattr(arm, "window", "n/a") for arm in policy.arms] == [6, "n/a"]  # cost_aware reads it; svip does not


def test_a_cut_round_counts_the_mismatch_the_window_kept_before_the_cut():
    # `fly` with W = 2, flip_prior set: 6 drafts, draft 1 passed Δ (s = 1), draft 2 failed it and the window kept it,
    # and the output ended at an EOS after the 4th accepted draft (cut). Draft 2 was tested and failed Δ before the
    # cut, so the calibration counts drafts 1..2 (tested 2, accepted 1) and φ one trial, one flip. (Counting a cut
    # round's drafts as passed dropped the failure: tested 1, no flip trial, acceptance biased up.)
    policy = CostAwarePolicy(CostAwareConfig(flip_prior=0.5, max_tokens=8, explore_after=0))
    policy.set_deferred_window(2)
    policy.max_tokens()
    for position in range(1, 6):
        policy.keep_drafting(position, Q_BIN[0])
    policy.observe(RoundOutcome(num_drafted=6, num_accepted=4, seconds=1.0, num_matched=1, cut=True))
    assert (policy.tested[0], policy.accepted[0]) == (2.0, 1.0)
    assert (policy.flip_trials, policy.flips) == (1.0, 1.0)
