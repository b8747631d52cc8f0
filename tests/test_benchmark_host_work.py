"""benchmarks/host_work.py on tiny random models on the CPU (`aot_eager`): what it counts per compiled round."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from benchmarks import host_work, profiling

GAMMA = 3


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    out = tmp_path_factory.mktemp("host")
    results = host_work.main([
        "--target", "tiny", "--draft", "tiny", "--width", "0", "--compile-backend", "aot_eager", "--gamma",
        str(GAMMA), "--new-tokens", "18", "--prompt-length", "8", "--batch-sizes", "1,2", "--output-dir", str(out),
        "--name", "probe",
    ])
    return results, out


@pytest.mark.slow
def test_compiled_calls_are_one_per_token_plain_and_three_per_round(probe):
    results, out = probe
    records = {(r["method"], r["batch_size"]): r for r in results["records"]}
    assert set(records) == {("plain", 1), ("exact", 1), ("plain", 2), ("exact", 2)}
    for batch_size in (1, 2):
        assert records["plain", batch_size]["compiled_calls"] == 1  # transformers' one compiled step per token
        # the draft's round (its γ steps in one call), the verify forward and the rule's verification, one compiled
        # call each (a random draft is almost never right: both calls' rounds are alike but for the rare accepted
        # draft), where drafting step by step made γ + 1 calls and verified eagerly
        spec = records["exact", batch_size]
        assert spec["compiled_calls"] == pytest.approx(3, abs=0.3) and GAMMA + 1 > 3
        assert spec["rounds_counted"] > 0 and spec["unit"] == "round"
        # nothing of the verification launches outside its compiled call; the round's read is counted
        assert spec["launches_by_range"]["verify"] == 0 and spec["launches_by_range"]["sync"] > 0
        assert spec["launches"] == pytest.approx(sum(spec["launches_by_range"].values()))
        assert spec["host_ms_outside"] > 0 and 0 < spec["between_rounds_ms"] < spec["wall_ms"]
        assert records["plain", batch_size]["between_rounds_ms"] is None  # (no rounds, no reads of ours)
    saved = json.loads((out / "probe.json").read_text())
    assert saved["records"] == results["records"]
    text = (out / "probe.md").read_text()
    assert "| exact | 1 | round |" in text and "| plain | 2 | token |" in text


def fake_event(name, start, end, parent=None):
    """A profiler event as `profiling.host_counts` reads it (times in µs)."""
    made = SimpleNamespace(name=name, cpu_parent=parent, cpu_time_total=float(end - start),
                           time_range=SimpleNamespace(start=start, end=end), cpu_children=[])
    if parent is not None:
        parent.cpu_children.append(made)
    return made


def test_views_and_nested_ops_are_not_counted_and_gaps_run_from_a_read_to_the_next_compiled_call():
    draft = fake_event("hf_semspec.draft", 0, 5000)
    region = fake_event("Torch-Compiled Region: 0/1", 1000, 3000, parent=draft)
    inner = fake_event("Torch-Compiled Region: 1/0", 1200, 1500, parent=region)  # nested: inside the outer call
    argmax = fake_event("aten::argmax", 3000, 3100, parent=draft)
    converts = fake_event("aten::to", 3300, 3400, parent=draft)  # `.float()` of bf16 logits: a copy
    stays = fake_event("aten::to", 3500, 3510, parent=draft)  # `.to()` of a tensor already there: nothing
    viewed = fake_event("aten::reshape", 3600, 3610, parent=draft)  # a reshape that only views
    copied = fake_event("aten::reshape", 3700, 3800, parent=draft)  # one that copies
    reads = fake_event("aten::is_nonzero", 3900, 3950, parent=draft)  # bool(tensor): a read, it waits on a GPU
    other = fake_event("hf_semspec.tokenize", 5000, 5400)  # a range that is not one of the loop's: "rest"
    sync = fake_event("hf_semspec.sync", 6000, 6500)
    later = fake_event("Torch-Compiled Region: 0/1", 7250, 8000)
    events = [draft, region, inner, fake_event("aten::mm", 1100, 1200, parent=region), argmax,
              fake_event("aten::empty", 3000, 3010, parent=argmax), fake_event("aten::copy_", 3050, 3060, parent=argmax),
              converts, fake_event("aten::_to_copy", 3300, 3390, parent=converts), stays, viewed,
              fake_event("aten::_reshape_alias", 3600, 3605, parent=viewed), copied,
              fake_event("aten::clone", 3700, 3790, parent=copied), reads,
              fake_event("aten::item", 3900, 3940, parent=reads), other,
              fake_event("aten::cat", 5500, 5600, parent=other), sync, later, fake_event("hf_semspec.sync", 9000, 9100),
              fake_event("aten::add", 9200, 9300)]
    counted = profiling.host_counts(SimpleNamespace(events=lambda: events))
    # two compiled calls (the nested one and every op inside them not counted); in the draft range argmax, the
    # converting `.to()`, the copying reshape and the read (their nested ops not, nor the `.to()` and the reshape
    # that did nothing); cat under a range of no round's step and the add after the last read: "rest". One gap,
    # from the first read's end to the next call (the last read has no round after it).
    assert counted == {"compiled_calls": 2, "launches": {"draft": 4, "rest": 2}, "ms_inside": 2.75,
                       "gaps_ms": [0.75], "reads": 2}
    # from the first read on: the second call, the add, the gap
    assert profiling.host_counts(SimpleNamespace(events=lambda: events), after_first_read=True) == {
        "compiled_calls": 1, "launches": {"rest": 1}, "ms_inside": 0.75, "gaps_ms": [0.75], "reads": 2}
