"""`drafting="auto"`: the drafting that pays on this machine, chosen from measured costs in a call's first rounds.

A draft model can draft three ways, and which is fastest depends on the CPU or GPU as much as on the text:

- **draft**: the draft model alone, one forward per draft token (`ModelDrafter`);
- **multi_level**: the draft model confirming prompt-lookup candidates, several drafts per forward (FLy's multi-level
  drafting, `ModelDrafter` with `RowContexts`): the same drafts in fewer forwards, each over 1 + k tokens;
- **lookup**: prompt lookup alone, no draft model (`NgramDrafter`): no draft cost, but only what the context repeats.

Greedy, all three give the draft alone's text with a lossless rule (`exact`): multi-level drafting drafts the draft
model's own tokens, and prompt lookup's drafts are verified by the same rule. A lossy rule accepts other drafts from
prompt lookup than from the draft model, so with one the choice is between the first two only (the text stays the
draft alone's).

The choice prices one round of each way, in seconds per committed token:

    draft:        (D · c₁ + c_v) / T
    multi_level:  (W · c_w + S · c₁ + c_v) / T
    lookup:       c_v / T_lookup

with c₁ the draft's one-token forward, c_w its (1 + k)-wide forward, c_v the rest of a round (the target's verify
forward, the verification, the bookkeeping), D the drafts per round, T the tokens a round commits with the draft
model's drafts (the same for draft and multi_level: the same drafts), W and S the wide and one-token forwards per
round that multi-level drafting makes for those drafts, and T_lookup = 1 + the drafts a lookup at the round's start
would have had accepted (its candidates against the tokens the call then committed: the target's own, so this is what
lookup alone gets, greedy, and in expectation when sampling). A lookup round that finds nothing verifies one token;
it is priced at c_v all the same (an over-estimate: the choice errs towards the draft model).

What is measured where:

- c₁, c_w, c_v: timed in the first rounds (not the first, which prefills the prompt; and each cost's first timing in
  a call is dropped: it may hold a compilation), kept per process for the pair of models, their dtypes and devices,
  the lookup's k and n, the cache kind, compiled forwards or not, the batch size and γ (`costs_for`), so that a
  later call with the same models reuses them. c₁ from rounds of the draft alone (their time over their forwards:
  on static caches, a compiled round's), c_w from multi-level rounds (their time less their one-token forwards,
  over their wide forwards), c_v from the time between one round's drafts and the next's (the lookups scored and
  the replay below are timed in neither). On an accelerator the devices are synchronized around the drafts in these
  rounds only.
- D, T, W, S, T_lookup: counted in this call (the text decides them). W and S in a draft-alone round are those
  multi-level drafting would have made for its drafts, found by replaying its lookups on the host
  (`multi_level_forwards`).

The call explores for `EXPLORE_ROUNDS` rounds after its first (the draft alone while c₁ is unmeasured, then
multi-level drafting while c_w is, then the cheaper of the two), then runs the cheapest way for the rest of the call.
What the text repeats changes as it goes: prompt lookup alone, once chosen, is priced again every `REVIEW_ROUNDS`
of its rounds from its last `REVIEW_WINDOW` rounds' tokens, and gives way for good to the draft model's cheaper way
where that now costs less (on dynamic caches: the draft's cache catches up on the tokens it missed in one forward;
on static caches, whose compiled forward would compile that shape, lookup stays to the end). A way with a figure still
unmeasured is not chosen; ties go to the draft alone. The call's statistics say what was chosen and why
(`AcceptanceStats.drafting`, `drafting_reason`).
"""

from __future__ import annotations

import statistics
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from .batch import DecodingBatch
from .draft_length import DraftLengthPolicy
from .draft_block import DraftBlock
from .drafting import ModelDrafter
from .errors import invalid_value
from .ngram import NgramDrafter, PromptLookup, RowContexts

AUTO = "auto"
# The values of `generate(drafting=...)` besides None (the drafting the other fields select).
DRAFTING_VALUES = (AUTO,)
DRAFT, MULTI_LEVEL, LOOKUP = "draft", "multi_level", "lookup"
# The prompt lookup `drafting="auto"` uses where `prompt_lookup_num_tokens` is unset: k = 6 candidates, n-grams of
# up to 4 tokens (the setting of the committed multi-level measurements, benchmarks/results/ngram/).
DEFAULT_LOOKUP = PromptLookup(num_tokens=6, max_ngram_size=4)
# Rounds timed and counted before the choice, after the first (which prefills).
EXPLORE_ROUNDS = 4
# Prompt lookup alone, once chosen, is priced again every REVIEW_ROUNDS of its rounds, from its last REVIEW_WINDOW.
REVIEW_ROUNDS = 4
REVIEW_WINDOW = 8
# Timings kept per cost (the median of the last ones is the estimate).
_KEPT_SAMPLES = 32


def check_drafting(value: Any, field_name: str = "drafting") -> str | None:
    """`drafting` validated: None (the drafting `assistant_model` and `prompt_lookup_num_tokens` select) or "auto"."""
    if value is None or value in DRAFTING_VALUES:
        return value
    raise invalid_value(
        field_name, value,
        f"None (the drafting assistant_model and prompt_lookup_num_tokens select) or {AUTO!r} (the cheapest of the "
        "draft model alone, multi-level drafting and prompt lookup alone, measured in the call's first rounds)",
        f"pass {field_name}='auto', or drop it",
    )


def auto_lookup(drafting: str | None, assistant_model, prompt_lookup: PromptLookup | None,
                field_name: str = "drafting") -> PromptLookup | None:
    """The lookup a call drafts with: with `drafting="auto"`, `prompt_lookup` or `DEFAULT_LOOKUP` (refused without
    a draft model, `field_name` naming where "auto" came from); otherwise `prompt_lookup` as given."""
    if drafting != AUTO:
        return prompt_lookup
    if assistant_model is None:
        raise invalid_value(
            field_name, drafting, "None without assistant_model ('auto' chooses how a draft model drafts: alone, "
            "multi-level with prompt lookup, or replaced by prompt lookup)",
            f"pass assistant_model=<draft model>, or drop {field_name} (prompt lookup alone then drafts)",
        )
    return prompt_lookup if prompt_lookup is not None else DEFAULT_LOOKUP


@dataclass
class DraftingCosts:
    """Timings of one pair of models on one machine (seconds), kept per process (`costs_for`): the draft's one-token
    forward (`step`), its (1 + k)-wide forward (`wide`), and the rest of a round (`verify`: the target's forward,
    the verification, the bookkeeping). Each estimate is the median of the last timings; None until one is taken."""

    step: list[float] = field(default_factory=list)
    wide: list[float] = field(default_factory=list)
    verify: list[float] = field(default_factory=list)

    def record(self, name: str, seconds: float) -> None:
        samples = getattr(self, name)
        samples.append(seconds)
        del samples[:-_KEPT_SAMPLES]

    def estimate(self, name: str) -> float | None:
        samples = getattr(self, name)
        return statistics.median(samples) if samples else None


@dataclass
class DraftingCounts:
    """What one call's rounds drafted and committed (the module docstring's D, T, W, S, T_lookup), as sums."""

    model_rounds: int = 0  # rounds drafted by the draft model (alone or multi-level)
    drafts: float = 0.0  # D · rounds: drafts per round (mean over the batch's decoding rows)
    tokens: float = 0.0  # T · rounds: tokens committed per round, with the draft model's drafts
    multi_level_rounds: int = 0  # rounds with W and S known (run multi-level, or replayed)
    wide_forwards: float = 0.0
    step_forwards: float = 0.0
    lookups: int = 0  # lookups at a round's start whose outcome is known
    lookup_tokens: float = 0.0  # Σ (1 + the drafts lookup alone would have had accepted)


def predicted_seconds_per_token(costs: DraftingCosts, counts: DraftingCounts, modes: tuple[str, ...]
                                ) -> dict[str, float | None]:
    """Seconds per committed token of each way in `modes` (the module docstring's formulas); None where a figure it
    needs is unmeasured."""
    step, wide, verify = costs.estimate("step"), costs.estimate("wide"), costs.estimate("verify")
    prices: dict[str, float | None] = {}
    model_known = verify is not None and step is not None and counts.model_rounds > 0 and counts.tokens > 0
    for mode in modes:
        price = None
        if mode == DRAFT and model_known:
            price = (counts.drafts * step + counts.model_rounds * verify) / counts.tokens
        elif mode == MULTI_LEVEL and model_known and counts.multi_level_rounds > 0:
            wide_forwards = counts.wide_forwards / counts.multi_level_rounds
            if wide_forwards == 0 or wide is not None:
                per_round = (wide_forwards * (wide or 0.0) + counts.step_forwards / counts.multi_level_rounds * step
                             + verify)
                price = per_round * counts.model_rounds / counts.tokens
        elif mode == LOOKUP and verify is not None and counts.lookups > 0:
            price = verify * counts.lookups / counts.lookup_tokens
        prices[mode] = price
    return prices


def choose_drafting(costs: DraftingCosts, counts: DraftingCounts, modes: tuple[str, ...]) -> tuple[str, dict]:
    """The cheapest way of `modes` by `predicted_seconds_per_token` (ties and unpriced ways: the draft alone), and
    the reason: each way's predicted ms per token and the figures behind them."""
    prices = predicted_seconds_per_token(costs, counts, modes)
    priced = {mode: price for mode, price in prices.items() if price is not None}
    chosen = DRAFT
    if priced:
        best = min(priced.values())
        if priced.get(DRAFT) is None or best < priced[DRAFT]:
            chosen = min(priced, key=priced.get)
    return chosen, _reason(costs, counts, prices)


def _reason(costs: DraftingCosts, counts: DraftingCounts, prices: dict[str, float | None]) -> dict:
    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1000, 3)

    def per(total: float, rounds: int) -> float | None:
        return round(total / rounds, 3) if rounds else None

    return {
        "ms_per_token": {mode: ms(price) for mode, price in prices.items()},
        "draft_step_ms": ms(costs.estimate("step")),
        "draft_wide_ms": ms(costs.estimate("wide")),
        "verify_ms": ms(costs.estimate("verify")),
        "tokens_per_round": per(counts.tokens, counts.model_rounds),
        "drafts_per_round": per(counts.drafts, counts.model_rounds),
        "multi_level_wide_forwards_per_round": per(counts.wide_forwards, counts.multi_level_rounds),
        "multi_level_step_forwards_per_round": per(counts.step_forwards, counts.multi_level_rounds),
        "lookup_tokens_per_round": per(counts.lookup_tokens, counts.lookups),
        "rounds_counted": counts.model_rounds,
    }


# Costs per process: draft model → target → {(dtypes, devices, lookup, caches, batch size, γ): DraftingCosts}.
_COSTS: "weakref.WeakKeyDictionary[torch.nn.Module, weakref.WeakKeyDictionary]" = weakref.WeakKeyDictionary()
_COSTS_LOCK = threading.Lock()


def costs_for(model: torch.nn.Module, assistant_model: torch.nn.Module, lookup: PromptLookup, static: bool,
              compiled: bool = False, batch_size: int = 1, gamma: int | None = None) -> DraftingCosts:
    """The costs this process measured for `assistant_model` drafting for `model` with the same dtypes and devices,
    lookup, cache kind (`static`, `compiled` forwards), batch size and policy length `gamma` (the verify forward's
    width): empty the first time."""
    key = (*_placement(model), *_placement(assistant_model), lookup.num_tokens, lookup.max_ngram_size, static,
           compiled, batch_size, gamma)
    with _COSTS_LOCK:
        of_target = _COSTS.setdefault(assistant_model, weakref.WeakKeyDictionary())
        return of_target.setdefault(model, {}).setdefault(key, DraftingCosts())


def forget_drafting_costs() -> None:
    """Drops every cost `drafting="auto"` measured in this process: the next call measures again."""
    with _COSTS_LOCK:
        _COSTS.clear()


def _placement(model: torch.nn.Module) -> tuple[str, str]:
    return str(getattr(model, "dtype", "")), str(getattr(model, "device", ""))


def assistant_device(drafter: ModelDrafter) -> torch.device:
    return drafter.model.device


def multi_level_forwards(contexts: RowContexts, rows: list[int], drafts: list[list[int]], num_tokens: int
                         ) -> tuple[int, int]:
    """`(wide, one-token)` forwards multi-level drafting would have made to draft `drafts` (each row's, the same
    count) with the lookup `contexts` (as they stood at the round's start): `ModelDrafter._multi_level_step`'s
    decisions replayed on the host. At each draft position, with more than one draft left, each row looks up to
    min(k, drafts left − 1) candidates; where every row found some, one wide forward confirms the prefix that matches
    the row's drafts (the fewest over the rows, m) and drafts m + 1; otherwise one forward drafts one."""
    wide = steps = index = 0
    total = len(drafts[0]) if drafts else 0
    contexts.begin_round(rows)
    try:
        while index < total:
            wanted = min(num_tokens, total - index - 1)
            found = [contexts.found(row, wanted) for row in rows] if wanted >= 1 else []
            if found and min(len(candidates) for candidates in found) > 0:
                width = min(len(candidates) for candidates in found)
                matched = min(_common_prefix(candidates[:width], row_drafts[index:])
                              for candidates, row_drafts in zip(found, drafts))
                taken, wide = matched + 1, wide + 1
            else:
                taken, steps = 1, steps + 1
            for row, row_drafts in zip(rows, drafts):
                contexts.append_tokens(row, row_drafts[index : index + taken])
            index += taken
    finally:
        contexts.end_round(rows)
    return wide, steps


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class AutoDrafter:
    """The drafter of `drafting="auto"` (the module docstring): a `ModelDrafter` with a lookup (`contexts`), which
    drafts alone or multi-level round by round, and, where the rule allows prompt lookup alone, an `NgramDrafter`.
    The loop's drafter interface: `draft()`, `append_tokens()`, `keep_rows()`, `cache`, `extra_slots`.

    Args:
        model_drafter (`ModelDrafter`): with `contexts` (its lookup's k and n are the choice's).
        lookup_drafter (`NgramDrafter`, *optional*): prompt lookup alone, where the rule verifies it as it verifies
            the draft model (`exact`); None leaves the choice to the draft model's two ways.
        costs (`DraftingCosts`): this process's timings for the pair (`costs_for`), which the call adds to.
        device (`torch.device`): the batch's device; it and the draft model's are synchronized around timed drafts
            where they are accelerators.
        leaves_lookup (`bool`): prompt lookup alone, once chosen, is reviewed and may give way to the draft model
            (`_review_lookup`); False on static caches, whose compiled draft forward would compile the catch-up's
            shape.
    """

    def __init__(self, model_drafter: ModelDrafter, lookup_drafter: NgramDrafter | None, costs: DraftingCosts,
                 device: torch.device, leaves_lookup: bool = True):
        self.model_drafter = model_drafter
        self.lookup_drafter = lookup_drafter
        self.costs = costs
        self.counts = DraftingCounts()
        self.modes = (DRAFT, MULTI_LEVEL) + ((LOOKUP,) if lookup_drafter is not None else ())
        self.devices = [d for d in {device, assistant_device(model_drafter)} if d.type != "cpu"]
        self.chosen: str | None = None
        self.rows_at_choice: set[int] = set()  # the rows still decoding when the way was chosen
        self.leaves_lookup = leaves_lookup
        self._lookup_rounds: list[float] = []  # tokens of each round drafted by prompt lookup alone (row mean)
        self._seen: set[str] = set()  # the costs timed once in this call (the first timing is dropped)
        self.reason: dict | None = None
        self.round = 0
        self._drafts_ended: float | None = None  # when the last timed round's drafts were ready
        self._pending: dict[int, list[list]] = {}  # row → [candidates, matched so far] of lookups still open
        self._round_rows: list[int] = []
        self._round_drafts: list[list[int]] | None = None

    @property
    def cache(self):
        return self.model_drafter.cache

    @property
    def extra_slots(self) -> int:
        return self.model_drafter.extra_slots

    @property
    def contexts(self) -> RowContexts:
        return self.model_drafter.contexts

    def draft(self, batch: DecodingBatch, max_tokens: int, policy: DraftLengthPolicy | None = None,
              cut_short: bool = False) -> DraftBlock:
        """This round's drafts, by the way `_mode` picks; timed and counted while the call explores. The timed
        window holds the draft model's forwards only (the lookups scored and the replay run outside it), and the
        first timing of each kind in a call is dropped: it may hold a compilation (a compiled forward's first
        shape) or a cold cache."""
        if self.chosen is None and self.round > EXPLORE_ROUNDS:
            self._close_lookups()
            self.chosen, self.reason = choose_drafting(self.costs, self.counts, self.modes)
            self.reason["decided_at_round"] = self.round
            self.rows_at_choice = {row for row, decoding in zip(batch.rows, batch.decoding) if decoding}
        if self.chosen == LOOKUP and self.leaves_lookup:
            self._review_lookup()
        mode = self._mode()
        self.round += 1
        if mode == LOOKUP:
            self._round_rows = [row for row, decoding in zip(batch.rows, batch.decoding) if decoding]
            self._lookup_rounds.append(0.0)  # (its tokens arrive with `append_tokens`)
            return self.lookup_drafter.draft(batch, max_tokens, policy, cut_short)
        exploring = self.chosen is None
        if exploring:
            self._open_lookups(batch, max_tokens)
        timed = exploring and self.round > 1  # (not the first round: it prefills the prompt)
        start = self._clock() if timed else None
        if timed and self._drafts_ended is not None:
            self._record("verify", start - self._drafts_ended)  # the rest of the round between two timed drafts
        block = self.model_drafter.draft(batch, max_tokens, policy, cut_short, multi_level=mode == MULTI_LEVEL)
        if timed:
            self._record_draft_time(mode, block, self._clock() - start)
        if exploring:
            self._count_round(mode, batch, block)
        self._drafts_ended = self._clock() if timed else None
        return block

    def _review_lookup(self) -> None:
        """Prompt lookup alone was chosen from the first rounds' lookups, and what the text repeats changes as it
        goes: every `REVIEW_ROUNDS` rounds its price is taken again from its last `REVIEW_WINDOW` rounds' tokens,
        and where the draft model's cheaper way (priced from the exploration) now costs less, the call goes back to
        it for good (the draft's cache catches up on the tokens it missed in one forward)."""
        done = len(self._lookup_rounds)  # (each with its tokens: they came after its verification)
        if done < REVIEW_ROUNDS or done % REVIEW_ROUNDS:
            return
        recent = self._lookup_rounds[-REVIEW_WINDOW:]
        verify = self.costs.estimate("verify")
        prices = predicted_seconds_per_token(self.costs, self.counts, (DRAFT, MULTI_LEVEL))
        priced = {mode: price for mode, price in prices.items() if price is not None}
        if verify is None or not priced or sum(recent) == 0:
            return
        lookup_price = verify * len(recent) / sum(recent)
        best = min(priced, key=priced.get)
        if priced[best] < lookup_price:
            self.chosen = best
            self.reason.update(left_lookup_at_round=self.round, lookup_ms_per_token_then=round(1000 * lookup_price, 3))

    def _mode(self) -> str:
        """The chosen way; while exploring: the draft alone in the first round (it prefills) and while c₁ is
        unmeasured, multi-level drafting while c_w is, then the cheaper of the two by the figures so far."""
        if self.chosen is not None:
            return self.chosen
        if self.round == 0 or self.costs.estimate("step") is None:
            return DRAFT
        if self.costs.estimate("wide") is None:
            return MULTI_LEVEL
        prices = predicted_seconds_per_token(self.costs, self.counts, (DRAFT, MULTI_LEVEL))
        if prices[MULTI_LEVEL] is not None and prices[DRAFT] is not None and prices[MULTI_LEVEL] < prices[DRAFT]:
            return MULTI_LEVEL
        return DRAFT

    def _clock(self) -> float:
        for device in self.devices:  # (an accelerator's work is asynchronous: wait for it where it runs)
            torch.accelerator.synchronize(device)
        return time.perf_counter()

    def _record(self, name: str, seconds: float) -> None:
        """A timing of cost `name`, but the call's first (the module docstring: it may hold a compilation)."""
        if name in self._seen:
            self.costs.record(name, seconds)
        self._seen.add(name)

    def _record_draft_time(self, mode: str, block: DraftBlock, seconds: float) -> None:
        """c₁ from a round of the draft alone; c_w from a multi-level round with a wide forward, once c₁ is known."""
        if block.num_forwards == 0:
            return
        if mode == DRAFT:
            self._record("step", seconds / block.num_forwards)
            return
        step = self.costs.estimate("step")
        if block.num_wide_forwards > 0 and step is not None:
            steps = block.num_forwards - block.num_wide_forwards
            self._record("wide", max(0.0, seconds - steps * step) / block.num_wide_forwards)

    def _count_round(self, mode: str, batch: DecodingBatch, block: DraftBlock) -> None:
        """Drafts and forwards of the round; its committed tokens arrive with `append_tokens`."""
        rows = [row for row, decoding in zip(batch.rows, batch.decoding) if decoding]
        self.counts.model_rounds += 1
        self.counts.drafts += block.num_tokens
        if mode == MULTI_LEVEL:
            wide, steps = block.num_wide_forwards, block.num_forwards - block.num_wide_forwards
        elif block.num_tokens:
            index = [i for i, decoding in enumerate(batch.decoding) if decoding]
            drafts = block.tokens[index].tolist()  # (the loop reads them this round anyway)
            wide, steps = multi_level_forwards(self.contexts, rows, drafts, self.contexts.lookup.num_tokens)
        else:
            wide = steps = 0
        self.counts.multi_level_rounds += 1
        self.counts.wide_forwards += wide
        self.counts.step_forwards += steps
        self._round_rows = rows

    def _open_lookups(self, batch: DecodingBatch, max_tokens: int) -> None:
        """While exploring: what prompt lookup alone would draft now for each decoding row, to score against the
        tokens the rows commit (`append_tokens`)."""
        if self.chosen is not None or LOOKUP not in self.modes:
            return
        wanted = min(self.contexts.lookup.num_tokens, max_tokens)
        for row, decoding in zip(batch.rows, batch.decoding):
            if decoding and wanted > 0:
                self._pending.setdefault(row, []).append([self.contexts.found(row, wanted), 0])

    def append_tokens(self, row: int, tokens: list[int]) -> None:
        """Row `row` took `tokens`: both drafters' contexts follow, and while exploring the round's tokens and the
        open lookups are counted."""
        self.model_drafter.append_tokens(row, tokens)
        if self.lookup_drafter is not None:
            self.lookup_drafter.append_tokens(row, tokens)
        if self.chosen == LOOKUP and row in self._round_rows:
            self._lookup_rounds[-1] += len(tokens) / len(self._round_rows)
        if self.chosen is not None:
            return
        if row in self._round_rows:
            self.counts.tokens += len(tokens) / len(self._round_rows)
        still_open = []
        for lookup in self._pending.get(row, []):
            candidates, matched = lookup
            for token in tokens:
                if matched == len(candidates) or candidates[matched] != token:
                    break
                matched += 1
            else:
                if matched < len(candidates):
                    lookup[1] = matched
                    still_open.append(lookup)
                    continue
            self.counts.lookups += 1
            self.counts.lookup_tokens += 1 + matched
        self._pending[row] = still_open

    def _close_lookups(self) -> None:
        """Counts the lookups still open (every candidate so far matched): at what they matched so far, a lower
        bound."""
        for lookups in self._pending.values():
            for _, matched in lookups:
                self.counts.lookups += 1
                self.counts.lookup_tokens += 1 + matched
        self._pending.clear()

    def keep_rows(self, index: torch.LongTensor) -> None:
        self.model_drafter.keep_rows(index)

    def drafting_of(self, row: int) -> str | None:
        """What row `row`'s statistics say: the way chosen where it still decoded then, else None (it ended while the
        call explored)."""
        return self.chosen if row in self.rows_at_choice else None

    def explained(self) -> dict:
        """The reason for the choice (`choose_drafting`'s), or, for a call that ended while exploring, the figures
        it had (`decided_at_round` None)."""
        if self.reason is not None:
            return self.reason
        self._close_lookups()
        return {**choose_drafting(self.costs, self.counts, self.modes)[1], "decided_at_round": None}
