"""Shared by the policies that learn what a round costs (`best_constant`, tapout's fitted-time reward).

Not a policy: importing this module registers nothing.
"""

from __future__ import annotations

UNFITTED_COST_RATIO = 0.1  # t_1 / t_0 assumed until two draft lengths have been timed
LINE_PRIOR_ROUNDS = 2.0  # weight of the line, in rounds, in the time of one length (`length_seconds`)


class RoundCostFit:
    """Least squares of a round's seconds on its drafted tokens, s = t_0 + t_1·k, over every round it was given.

    One round's wall time scatters widely around that line on a shared machine (the same round timed twice differed
    by up to a third on the reference CPU), while the line itself is a property of the models and the machine; so a
    policy that prices rounds by the line, not by their own seconds, learns from accepted tokens without the noise.
    """

    def __init__(self):
        self.count = 0
        self.sum_k = self.sum_kk = self.sum_s = self.sum_ks = 0.0
        self.lengths: set[int] = set()
        self.seconds_by_length: dict[int, list[float]] = {}  # k → [rounds, Σ seconds]

    def add(self, num_drafted: int, seconds: float) -> None:
        self.count += 1
        self.sum_k += num_drafted
        self.sum_kk += num_drafted * num_drafted
        self.sum_s += seconds
        self.sum_ks += num_drafted * seconds
        self.lengths.add(num_drafted)
        timed = self.seconds_by_length.setdefault(num_drafted, [0, 0.0])
        timed[0] += 1
        timed[1] += seconds

    def coefficients(self) -> tuple[float, float] | None:
        """(t_0, t_1), or None while the lengths seen do not determine a fit with t_0 > 0 and t_1 > 0."""
        spread = self.count * self.sum_kk - self.sum_k**2
        if len(self.lengths) < 2 or spread <= 0:
            return None
        per_token = (self.count * self.sum_ks - self.sum_k * self.sum_s) / spread
        fixed = (self.sum_s - per_token * self.sum_k) / self.count
        return (fixed, per_token) if fixed > 0 and per_token > 0 else None

    def seconds(self, num_drafted: int) -> float | None:
        """The time of a round drafting `num_drafted`: t_0 + t_1·k once the fit is determined, until then the mean
        of the rounds timed at that length (None if there are none)."""
        fit = self.coefficients()
        if fit is not None:
            return fit[0] + fit[1] * num_drafted
        timed = self.seconds_by_length.get(num_drafted)
        return timed[1] / timed[0] if timed else None

    def length_seconds(self, num_drafted: int) -> float | None:
        """t̂(k): the mean time of the rounds that drafted `num_drafted`, shrunk toward the line by
        `LINE_PRIOR_ROUNDS` pseudo-rounds (the line's value alone for a length never timed); None until the line is
        determined.

        Why not the line alone: a verify forward's time is not linear in its tokens. On the reference CPU the 1.5B
        target's forward over 3 tokens took 0.88 s and over 4 tokens 0.57 s (MKL picks its kernels by shape), so a
        round drafting 2 costs more than one drafting 3, and a line fitted to rounds of 1 and 2 drafts prices every
        draft at twice its cost."""
        fit = self.coefficients()
        if fit is None:
            return None
        line = fit[0] + fit[1] * num_drafted
        rounds, total = self.seconds_by_length.get(num_drafted, (0, 0.0))
        return (total + LINE_PRIOR_ROUNDS * line) / (rounds + LINE_PRIOR_ROUNDS)
