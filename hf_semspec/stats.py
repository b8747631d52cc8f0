"""Acceptance statistics: what was drafted, what the rule accepted, how many tokens each target forward produced."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


# `AcceptanceStats.acceptance` of statistics merged from calls that ran different rules.
MIXED = "mixed"


def _merged(mine, theirs, differ):
    """One field of two merged statistics: the one given (None: not recorded), or `differ` where both are and differ."""
    if mine is None or mine == theirs:
        return theirs
    return mine if theirs is None else differ


@dataclass
class AcceptanceStats:
    """Counts of one `generate()` call (or several, merged with `+`).

    Two figures a batch tells apart: `tokens_per_forward`, the new tokens of every row per target forward (one
    forward verifies all rows: the batch's yield per forward), and `mean_accepted_length`, τ, the rows' tokens per
    forward of the rounds each took part in, pooled over the rows (Σ tokens / Σ `num_row_forwards`): the τ the same
    prompts give one by one, merged with `+`. With one row they are the same number.

    Attributes:
        num_target_forwards (`int`): target forward passes made by the speculative loop (one per round).
        num_drafted (`int`): draft tokens proposed to the target (with prompt lookup, the drafts each row found).
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
        num_row_forwards (`int`): target forwards counted once per row they verified: each row's rounds, summed
            over the rows (`num_target_forwards` for one row; filled from it when not given).
        num_draft_forwards (`int`): forward passes of the draft model, one per drafted token (fewer with multi-level
            drafting; more in a compiled round that `max_length` cut short, which still runs its γ steps; a batch's
            are shared by its rows: a row counts those of the rounds it took part in); 0 with prompt-lookup drafts
            alone.
        num_ngram_hits (`int`): with prompt-lookup drafts, the rounds in which a row's lookup found drafts it could
            use, summed over the rows (`num_target_forwards − num_ngram_hits` rounds of one row verified no draft);
            0 with a draft model.
        num_ngram_drafts (`int`): with multi-level drafting (a draft model and prompt lookup), the drafts that were
            n-gram candidates the draft model confirmed, drafted without a forward of their own (at most the row's
            drafts of the round); 0 otherwise.
        acceptance (`str`, *optional*): the rule that ran, e.g. `"ensemble"` for `acceptance="exact"` with
            transformers' `assistant_ensemble_weight`; `MIXED` for statistics merged from calls of different rules.
        acceptance_kwargs (`dict`, *optional*): that rule's options, all of them (defaults included); `None` when
            merged from calls with different ones.
        drafting (`str`, *optional*): how the call drafted: `"draft"` (the draft model alone), `"multi_level"` (the
            draft model confirming prompt-lookup candidates) or `"lookup"` (prompt lookup alone); with
            `drafting="auto"` the way it chose (`hf_semspec.drafting_choice`), None if the call ended before it
            chose; `MIXED` for statistics merged from calls that drafted differently.
        drafting_reason (`dict`, *optional*): with `drafting="auto"`, why: each way's predicted ms per token
            (`ms_per_token`, None where unmeasured), the measured costs (`draft_step_ms`, `draft_wide_ms`,
            `verify_ms`), the counts behind them and `decided_at_round`; None otherwise.
    """

    num_target_forwards: int = 0
    num_drafted: int = 0
    num_accepted: int = 0
    num_new_tokens: int = 0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    drafted_per_round: list[int] = field(default_factory=list)
    accepted_per_round: list[int] = field(default_factory=list)
    num_row_forwards: int | None = None
    num_draft_forwards: int = 0
    num_ngram_hits: int = 0
    num_ngram_drafts: int = 0
    acceptance: str | None = None
    acceptance_kwargs: dict | None = None
    drafting: str | None = None
    drafting_reason: dict | None = None

    def __post_init__(self):
        if self.num_row_forwards is None:  # one row's statistics (or a file written before the field)
            self.num_row_forwards = self.num_target_forwards

    @property
    def tokens_per_forward(self) -> float:
        """New tokens of all rows per target forward (a batch's yield per forward; τ for one row)."""
        return self.num_new_tokens / self.num_target_forwards if self.num_target_forwards else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """τ: new tokens per target forward, the usual "mean accepted length" (accepted drafts + 1 per round); for a
        batch, per forward of each row, pooled over the rows (`tokens_per_forward` counts every row's tokens per
        forward)."""
        return self.num_new_tokens / self.num_row_forwards if self.num_row_forwards else 0.0

    @property
    def mean_accepted_drafts(self) -> float:
        """Accepted draft tokens per round."""
        return self.num_accepted / self.num_target_forwards if self.num_target_forwards else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted draft tokens."""
        return self.num_accepted / self.num_drafted if self.num_drafted else 0.0

    @property
    def draft_forwards_per_drafted_token(self) -> float:
        """Draft-model forwards per draft token proposed: 1 for one row drafted by a model (less with multi-level
        drafting, and for a batch, whose forwards draft for every row at once), 0 for prompt-lookup drafts alone."""
        return self.num_draft_forwards / self.num_drafted if self.num_drafted else 0.0

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
            num_row_forwards=self.num_row_forwards + other.num_row_forwards,
            num_draft_forwards=self.num_draft_forwards + other.num_draft_forwards,
            num_ngram_hits=self.num_ngram_hits + other.num_ngram_hits,
            num_ngram_drafts=self.num_ngram_drafts + other.num_ngram_drafts,
            acceptance=_merged(self.acceptance, other.acceptance, MIXED),
            acceptance_kwargs=_merged(self.acceptance_kwargs, other.acceptance_kwargs, None),
            drafting=_merged(self.drafting, other.drafting, MIXED),
            drafting_reason=_merged(self.drafting_reason, other.drafting_reason, None),
        )

    def record_round(self, num_drafted: int, num_accepted: int, num_new_tokens: int, num_draft_forwards: int = 0,
                     ngram_hit: bool = False, num_ngram_drafts: int = 0) -> None:
        """Adds one round of one row: `num_drafted` drafts, of which the rule accepted the first `num_accepted` (its
        verdicts), and the `num_new_tokens` the row's sequence took (fewer than `num_accepted + 1` where the output
        ended inside the round); the draft model's `num_draft_forwards` of the round, and whether the row's prompt
        lookup found drafts (`ngram_hit`), and the drafts multi-level drafting took from confirmed n-gram candidates
        (`num_ngram_drafts`). The loop reads these on the host with the round's one sync."""
        self.num_target_forwards += 1
        self.num_row_forwards += 1
        self.num_drafted += num_drafted
        self.num_accepted += num_accepted
        self.num_new_tokens += num_new_tokens
        self.num_draft_forwards += num_draft_forwards
        self.num_ngram_hits += int(ngram_hit)
        self.num_ngram_drafts += num_ngram_drafts
        self.drafted_per_round.append(num_drafted)
        self.accepted_per_round.append(num_accepted)
        grow = num_drafted - len(self.drafted_per_position)
        if grow > 0:
            self.drafted_per_position += [0] * grow
            self.accepted_per_position += [0] * grow
        for i in range(num_drafted):
            self.drafted_per_position[i] += 1
            self.accepted_per_position[i] += int(i < num_accepted)

    @classmethod
    def of_batch(cls, rows: list["AcceptanceStats"]) -> "AcceptanceStats":
        """A batched call's statistics from its rows': every count summed, except target and draft forwards, one
        per round (a batched forward verifies, or drafts for, every row; a row's rounds are the first ones, while it
        was decoding, so the longest row's are the call's), per round the drafts and accepted drafts of all the rows
        in it; `num_row_forwards` keeps every row's forwards, so `mean_accepted_length` is the rows' pooled τ and
        `tokens_per_forward` the batch's yield."""
        total = sum(rows, cls())
        rounds = max((len(r.drafted_per_round) for r in rows), default=0)
        total.num_target_forwards = rounds
        total.num_draft_forwards = max((r.num_draft_forwards for r in rows), default=0)
        total.drafted_per_round = [sum(r.drafted_per_round[i] for r in rows if i < len(r.drafted_per_round))
                                   for i in range(rounds)]
        total.accepted_per_round = [sum(r.accepted_per_round[i] for r in rows if i < len(r.accepted_per_round))
                                    for i in range(rounds)]
        return total

    def to_dict(self) -> dict:
        """Counts plus the derived rates, JSON-ready."""
        out = asdict(self)
        out.update(
            tokens_per_forward=self.tokens_per_forward,
            mean_accepted_length=self.mean_accepted_length,
            mean_accepted_drafts=self.mean_accepted_drafts,
            acceptance_rate=self.acceptance_rate,
            per_position_acceptance=self.per_position_acceptance,
            draft_forwards_per_drafted_token=self.draft_forwards_per_drafted_token,
        )
        return out
