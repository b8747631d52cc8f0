"""Where the time goes: one generation under torch.profiler, split into the decoding loop's named ranges.

hf_semspec's loop marks its phases with `torch.profiler.record_function` ranges (`hf_semspec.draft`,
`hf_semspec.target_forward`, `hf_semspec.logits_processors`, `hf_semspec.verify`); the rest of the wall time is
overhead (transformers' set-up, cache bookkeeping, host syncs, Python). Stock `generate()` has no such ranges, so for
`plain` and `stock_assisted` the draft / target shares come from the forward timers (`ForwardMeter`) instead; the
`source` field says which.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from torch.profiler import ProfilerActivity, profile

RANGES = ("hf_semspec.draft", "hf_semspec.target_forward", "hf_semspec.verify", "hf_semspec.logits_processors")
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
