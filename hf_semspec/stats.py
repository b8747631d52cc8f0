"""Acceptance statistics: what was drafted, what the rule accepted, how many tokens each target forward produced."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch


@dataclass
class AcceptanceStats:
    """Counts of one `generate()` call (or several, merged with `+`).

    Attributes:
        num_target_forwards (`int`): target forward passes made by the speculative loop (one per round).
        num_drafted (`int`): draft tokens proposed to the target.
        num_accepted (`int`): draft tokens the acceptance rule accepted: its verdicts, so in a last round cut at
            an EOS or a stopping criterion the drafts accepted after the cut count too (then `mean_accepted_drafts`
            can exceed τ − 1). The draft-length policy is told only the ones output.
        num_new_tokens (`int`): tokens appended to the sequence (accepted drafts + one target token per round,
            less what EOS, a stopping criterion or the length limit cut off).
        drafted_per_position (`list[int]`): `drafted_per_position[i]` = rounds that drafted a token at position `i`.
        accepted_per_position (`list[int]`): `accepted_per_position[i]` = rounds that accepted positions `0..i`.
        drafted_per_round (`list[int]`): `drafted_per_round[r]` = draft tokens proposed in round `r` (γ of that round,
            times the rows of a batched verification): the lengths a draft-length policy chose, in order.
        accepted_per_round (`list[int]`): `accepted_per_round[r]` = draft tokens the rule accepted in round `r` (its
            verdicts, as `num_accepted`, summed over the rows).
    """

    num_target_forwards: int = 0
    num_drafted: int = 0
    num_accepted: int = 0
    num_new_tokens: int = 0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    drafted_per_round: list[int] = field(default_factory=list)
    accepted_per_round: list[int] = field(default_factory=list)

    @property
    def mean_accepted_length(self) -> float:
        """τ: new tokens per target forward, the usual "mean accepted length" (accepted drafts + 1 per round)."""
        return self.num_new_tokens / self.num_target_forwards if self.num_target_forwards else 0.0

    @property
    def mean_accepted_drafts(self) -> float:
        """Accepted draft tokens per round."""
        return self.num_accepted / self.num_target_forwards if self.num_target_forwards else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted draft tokens."""
        return self.num_accepted / self.num_drafted if self.num_drafted else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        """`[i]` = P(positions 0..i all accepted | a token was drafted at position i)."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position)]

    def __radd__(self, other: "AcceptanceStats | int") -> "AcceptanceStats":
        """`sum(stats_of_each_call)`: `sum` starts from 0."""
        if other == 0:
            return self
        return NotImplemented

    def __add__(self, other: "AcceptanceStats") -> "AcceptanceStats":
        """Counts summed, positions padded with zeros, and the rounds of `self` followed by those of `other`."""
        n = max(len(self.drafted_per_position), len(other.drafted_per_position))

        def padded(values: list[int]) -> list[int]:
            return values + [0] * (n - len(values))

        return AcceptanceStats(
            num_target_forwards=self.num_target_forwards + other.num_target_forwards,
            num_drafted=self.num_drafted + other.num_drafted,
            num_accepted=self.num_accepted + other.num_accepted,
            num_new_tokens=self.num_new_tokens + other.num_new_tokens,
            drafted_per_position=[a + b for a, b in zip(padded(self.drafted_per_position), padded(other.drafted_per_position))],
            accepted_per_position=[
                a + b for a, b in zip(padded(self.accepted_per_position), padded(other.accepted_per_position))
            ],
            drafted_per_round=self.drafted_per_round + other.drafted_per_round,
            accepted_per_round=self.accepted_per_round + other.accepted_per_round,
        )

    def to_dict(self) -> dict:
        """Counts plus the derived rates, JSON-ready."""
        out = asdict(self)
        out.update(
            mean_accepted_length=self.mean_accepted_length,
            mean_accepted_drafts=self.mean_accepted_drafts,
            acceptance_rate=self.acceptance_rate,
            per_position_acceptance=self.per_position_acceptance,
        )
        return out


class AcceptanceCounters:
    """Device-side accumulation used during decoding: no host sync per round, one at the end (`to_stats`)."""

    def __init__(self) -> None:
        self.drafted_per_position: list[int] = []
        self.drafted_per_round: list[int] = []  # summed in `to_stats` for the total drafted
        self._accepted_per_position: torch.Tensor | None = None
        self._accepted_per_round: list[torch.Tensor] = []  # 0-d tensors, read once in `to_stats`

    def record(self, num_draft_tokens: int, num_accepted: torch.LongTensor) -> None:
        """Records one verification of `num_draft_tokens` drafts per row, `num_accepted` of shape `(batch,)`."""
        batch_size = num_accepted.shape[0]
        if len(self.drafted_per_position) < num_draft_tokens:
            self.drafted_per_position += [0] * (num_draft_tokens - len(self.drafted_per_position))
        for i in range(num_draft_tokens):
            self.drafted_per_position[i] += batch_size
        self.drafted_per_round.append(num_draft_tokens * batch_size)
        self._accepted_per_round.append(num_accepted.sum())

        positions = torch.arange(num_draft_tokens, device=num_accepted.device)
        accepted_here = (positions[None, :] < num_accepted[:, None]).sum(0)
        if self._accepted_per_position is None:
            self._accepted_per_position = torch.zeros(0, dtype=torch.long, device=num_accepted.device)
        if self._accepted_per_position.shape[0] < num_draft_tokens:
            grow = num_draft_tokens - self._accepted_per_position.shape[0]
            self._accepted_per_position = torch.cat([self._accepted_per_position, accepted_here.new_zeros(grow)])
        self._accepted_per_position[:num_draft_tokens] += accepted_here

    def to_stats(self, num_target_forwards: int, num_new_tokens: int) -> AcceptanceStats:
        accepted = [] if self._accepted_per_position is None else self._accepted_per_position.tolist()
        accepted_per_round = torch.stack(self._accepted_per_round).tolist() if self._accepted_per_round else []
        return AcceptanceStats(
            num_target_forwards=num_target_forwards,
            num_drafted=sum(self.drafted_per_round),
            num_accepted=sum(accepted_per_round),
            num_new_tokens=num_new_tokens,
            drafted_per_position=list(self.drafted_per_position),
            accepted_per_position=accepted + [0] * (len(self.drafted_per_position) - len(accepted)),
            drafted_per_round=list(self.drafted_per_round),
            accepted_per_round=accepted_per_round,
        )
