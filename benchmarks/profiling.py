"""Where the time goes: one generation under torch.profiler, split into the decoding loop's named ranges.

hf_semspec's loop marks its phases with `torch.profiler.record_function` ranges (`hf_semspec.draft`,
`hf_semspec.target_forward`, `hf_semspec.logits_processors`, `hf_semspec.verify`); the rest of the wall time is
overhead (transformers' set-up, cache bookkeeping, host syncs, Python). Stock `generate()` has no such ranges, so for
`plain` and `stock_assisted` the draft / target shares come from the forward timers (`ForwardMeter`) instead; the
`source` field says which.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from torch.profiler import ProfilerActivity, profile

RANGES = ("hf_semspec.draft", "hf_semspec.target_forward", "hf_semspec.verify", "hf_semspec.logits_processors")
# Every named range of a round, short names, the round's one read (`sync`) included.
LOOP_RANGES = ("draft", "target_forward", "logits_processors", "verify", "sync")
SHORT = {name: name.split(".", 1)[1] for name in RANGES}


def range_totals_us(prof) -> dict[str, float]:
    """Total time (µs) of each named range in a finished profile.

    Reads the raw Kineto events: building `prof.key_averages()` walks every recorded op in Python and takes tens of
    seconds for one generation here, summing the few named ranges from the raw events takes well under a second.
    Falls back to `key_averages()` if a future torch moves the raw results.
    """
    totals = {name: 0.0 for name in RANGES}
    raw = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    if raw is not None:
        for event in raw.events():
            if event.name() in totals:
                totals[event.name()] += event.duration_ns() / 1e3
        return totals
    for event in prof.key_averages():
        if event.key in totals:
            totals[event.key] += event.cpu_time_total
    return totals


def breakdown_from_ranges(wall_s: float, totals_us: dict[str, float]) -> dict:
    """Seconds and shares of wall time per range, plus `rest` = wall − Σ ranges (the ranges do not nest)."""
    seconds = {SHORT[name]: totals_us[name] / 1e6 for name in RANGES}
    seconds["rest"] = max(0.0, wall_s - sum(seconds.values()))
    return {
        "source": "torch.profiler ranges",
        "wall_s": wall_s,
        "seconds": seconds,
        "share": {k: v / wall_s for k, v in seconds.items()},
    }


def breakdown_from_meters(wall_s: float, target_s: float, draft_s: float) -> dict:
    """The same split for stock `generate()`: draft / target model forwards (forward hooks), the rest overhead."""
    seconds = {"draft": draft_s, "target_forward": target_s, "verify": None, "logits_processors": None}
    seconds["rest"] = max(0.0, wall_s - target_s - draft_s)
    return {
        "source": "forward hooks (stock generate() has no hf_semspec ranges)",
        "wall_s": wall_s,
        "seconds": seconds,
        "share": {k: (v / wall_s if v is not None else None) for k, v in seconds.items()},
    }


def profiled(run: Callable[[], dict]) -> tuple[dict, dict[str, float], float]:
    """Runs `run()` (which returns a per-prompt record) under the CPU profiler; returns (record, range totals in µs,
    wall seconds of the profiled call)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        record = run()
        wall = time.perf_counter() - start
    return record, range_totals_us(prof), wall


COMPILED_REGION = "Torch-Compiled Region"
# ATen ops that make a view, allocate without writing, or read metadata: no kernel, no copy on a GPU; those of
# `MAYBE_COPY` count where an op under them does work (`.to()` that converts, `reshape` that copies).
MAYBE_COPY = frozenset({"aten::to", "aten::reshape", "aten::flatten"})
VIEW_OPS = frozenset(f"aten::{name}" for name in (
    "alias", "as_strided", "chunk", "detach", "diagonal", "empty", "empty_like", "empty_strided", "expand",
    "expand_as", "flatten", "lift_fresh", "movedim", "narrow", "permute", "_reshape_alias", "reshape", "resize_",
    "resolve_conj", "resolve_neg", "result_type", "select", "slice", "split", "split_with_sizes", "squeeze",
    "swapaxes", "t", "to", "transpose", "unbind", "unflatten", "unsqueeze", "_unsafe_view", "view", "view_as",
))


def does_work(event) -> bool:
    """Whether a profiled ATen op launches work on a GPU (a kernel or a copy): not a view or metadata op
    (`VIEW_OPS`), unless an op under it does work (`MAYBE_COPY`)."""
    if event.name not in VIEW_OPS:
        return True
    return event.name in MAYBE_COPY and any(does_work(child) for child in event.cpu_children)


def host_counts(prof, after_first_read: bool = False) -> dict:
    """From a finished profile: compiled calls, counted launches by range (reads of a value, `.item()`, `bool()`,
    count as work: on a GPU they wait for it), ms inside the compiled calls, and the host's ms from the end of each
    round's read (`hf_semspec.sync`) to the start of the next compiled call (`gaps_ms`: the loop's work between
    rounds, dynamo's guard checks of that call included, during which a GPU has nothing queued). `after_first_read`:
    only what starts after the first round's read (not the set-up, the prefills, the first round), for figures per
    round of one call; `reads` is the number of rounds' reads."""
    events = list(prof.events())
    sync_ends = sorted(event.time_range.end for event in events if event.name == "hf_semspec.sync")
    since = sync_ends[0] if after_first_read and sync_ends else float("-inf")
    calls, inside_us = 0, 0.0
    launches: Counter = Counter()
    starts = []
    for event in events:
        if event.time_range.start < since:
            continue
        ancestors = []
        parent = event.cpu_parent
        while parent is not None:
            ancestors.append(parent.name)
            parent = parent.cpu_parent
        in_compiled = any(name.startswith(COMPILED_REGION) for name in ancestors)
        if event.name.startswith(COMPILED_REGION):
            if not in_compiled:
                calls += 1
                inside_us += event.cpu_time_total
                starts.append(event.time_range.start)
            continue
        if not event.name.startswith("aten::") or in_compiled or not does_work(event):
            continue
        if any(name.startswith("aten::") for name in ancestors):
            continue
        where = next((name.split(".", 1)[1] for name in ancestors if name.startswith("hf_semspec.")), "rest")
        launches[where if where in LOOP_RANGES else "rest"] += 1
    starts.sort()
    gaps = []
    for end in sync_ends:
        following = next((start for start in starts if start >= end), None)
        if following is not None:  # (the last round's read is followed by the output, not by a round)
            gaps.append((following - end) / 1e3)
    return {"compiled_calls": calls, "launches": dict(launches), "ms_inside": inside_us / 1e3, "gaps_ms": gaps,
            "reads": len(sync_ends)}
