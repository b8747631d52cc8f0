"""benchmarks/resolution.py: the fixed-length references and standard errors next to the draft-length tables."""

import json
import math

import pytest

from benchmarks import report, resolution

# Modeled tokens/s = 60 new tokens / F at 1 s per target forward and nothing per draft.
COSTS = {"seconds_per_target_forward": 1.0, "seconds_per_draft_forward": 0.0}
FIXED = ["semspec:fly/constant:3", "semspec:fly/constant:8"]
POLICY = "semspec:fly/tapout"
# prompt → (category, tokens/s of constant:3, constant:8, tapout)
SPEEDS = {"p1": ("a", 2.0, 4.0, 3.0), "p2": ("a", 2.0, 1.2, 2.0), "p3": ("a", 2.0, 2.5, 2.0),
          "q1": ("b", 3.0, 1.0, 3.0)}


def _methods():
    return [{"name": "plain", "rule": None, "draft_length": None}] + [
        {"name": n, "rule": "fly", "draft_length": n.split("/")[1].split(":")[0]} for n in FIXED + [POLICY]]


def _records(speeds=SPEEDS):
    return [{"prompt_id": p, "category": c, "method": n, "target_forwards": 60 / v, "draft_forwards": 0,
             "new_tokens": 60} for p, (c, *values) in speeds.items() for n, v in zip(FIXED + [POLICY], values)]


def test_references_and_standard_error_on_worked_numbers():
    rows = {row["label"]: row for row in resolution.rows(_methods(), _records(), COSTS, "fly")}
    a = rows["a"]
    # Geometric means on a: constant:3 2, constant:8 (4 · 1.2 · 2.5)^(1/3) = 12^(1/3) = 2.289 → best constant:8.
    assert a["best"] == "semspec:fly/constant:8" and a["prompts"] == 3
    # Leave one out: p1 → constant:3 (on p2, p3: 2 > sqrt(1.2 · 2.5) = 1.73), so 2; p2 → constant:8 (sqrt(10) > 2),
    # so 1.2; p3 → constant:8 (sqrt(4.8) = 2.19 > 2), so 2.5: (6 / 12)^(1/3) = 0.794 of the best.
    assert a["references"]["tuned on the other prompts"] == pytest.approx(0.5 ** (1 / 3))
    # Each prompt's best: 4, 2, 2.5 → (20 / 12)^(1/3) = 1.186.
    assert a["references"]["each prompt's best"] == pytest.approx((20 / 12) ** (1 / 3))
    # Over all four prompts constant:3 is best (24^(1/4) > 12^(1/4)): on a, 2 / 2.289 = 0.874.
    assert a["overall_best"] == "semspec:fly/constant:3"
    assert a["references"]["best overall"] == pytest.approx(2 / 12 ** (1 / 3))
    # tapout 3, 2, 2 against 4, 1.2, 2.5: log ratios −0.288, 0.511, −0.223, mean 0 → ratio 1; sd 0.444 / sqrt(3).
    ratio, error = a["policies"][POLICY]
    logs = [math.log(3 / 4), math.log(2 / 1.2), math.log(2 / 2.5)]
    assert ratio == pytest.approx(1.0)
    assert error == pytest.approx(math.sqrt(sum(x * x for x in logs) / 2) / math.sqrt(3))
    assert error == pytest.approx(0.2561, abs=1e-4)
    # One prompt: no leave-one-out and no error; so the overall row has no tuned reference either.
    b = rows["b"]
    assert b["references"]["tuned on the other prompts"] is None and b["policies"][POLICY] == (1.0, None)
    assert rows["overall"]["references"]["tuned on the other prompts"] is None
    assert rows["overall"]["references"]["best overall"] == pytest.approx(1.0)


def test_section_renders_the_table_and_counts():
    text = "\n".join(resolution.section(_methods(), _records(), COSTS))
    assert "| a | 3 | `constant:8` | 0.79 | 0.87 | 1.19 | 1.00 ± 0.26 |" in text
    assert "| b | 1 | `constant:3` | – | 1.00 | 1.00 | 1.00 |" in text
    assert ("tuned on the other prompts 0 of 1, best overall 1 of 2, each prompt's best 2 of 2, `tapout` 2 of 2"
            in text)
    assert "Within 3% of the length tuned on the other prompts: `tapout` 1 of 1." in text  # 1.00 >= 0.97 · 0.79
    # tapout at 1 tok/s on p1: (1 · 2 · 2 / 12)^(1/3) = 0.69 < 0.97 · 0.79 on a.
    slower = {**SPEEDS, "p1": ("a", 2.0, 4.0, 1.0)}
    text = "\n".join(resolution.section(_methods(), _records(slower), COSTS))
    assert "| a | 3 | `constant:8` | 0.79 | 0.87 | 1.19 | 0.69 ± 0." in text
    assert "Within 3% of the length tuned on the other prompts: `tapout` 0 of 1." in text
    # One prompt a category gives nothing to read: no section (the quick profile's runs).
    single = {p: v for p, v in SPEEDS.items() if p in ("p1", "q1")}
    assert resolution.section(_methods(), _records(single), COSTS) == []
    # Without two fixed lengths there is no best fixed length to compare with.
    no_sweep = [m for m in _methods() if m["name"] != FIXED[1]]
    assert resolution.section(no_sweep, [r for r in _records() if r["method"] != FIXED[1]], COSTS) == []


def test_draft_length_section_of_a_run_includes_it():
    summary = {"prompts": 1, "speedup_vs_plain": {"geomean": 1.0, "median": 1.0}}
    names = [m["name"] for m in _methods()]
    results = {"methods": _methods(), "records": _records(),
               "aggregates": {"overall": {n: summary for n in names},
                              "per_category": {c: {n: summary for n in names} for c in ("a", "b")},
                              "cost_model": {**COSTS, "r2": 1.0, "residual_relative_sd": 0.0, "generations": 12,
                                             "prompts": 4}}}
    text = "\n".join(report.draft_length_section(results))
    assert "How far the per-category comparison can be read" in text
    assert "| a | 3 | `constant:8` | 0.79 |" in text


def test_pool_writes_the_table_over_files_and_refuses_what_it_cannot_pool(tmp_path):
    first, second = ({"methods": _methods(), "costs": COSTS,
                      "records": [r for r in _records() if r["prompt_id"] in prompts]}
                     for prompts in (("p1", "q1"), ("p2", "p3")))
    paths = []
    for i, results in enumerate((first, second)):
        paths.append(tmp_path / f"run{i}.json")
        paths[-1].write_text(json.dumps(results), encoding="utf-8")
    summary = resolution.main([str(p) for p in paths] + ["--name", "pooled", "--output-dir", str(tmp_path)])
    assert [row["label"] for row in summary["rows"]["fly"]] == ["a", "b", "overall"]
    assert "| a | 3 | `constant:8` | 0.79 | 0.87 | 1.19 | 1.00 ± 0.26 |" in (tmp_path / "pooled.md").read_text()
    assert json.loads((tmp_path / "pooled.json").read_text())["rows"]["fly"][0]["prompts"] == 3
    with pytest.raises(ValueError, match=r"run0.json: prompts \['p1', 'q1'\] are already in an earlier file"):
        resolution.pool([paths[0], paths[0]])
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**second, "methods": _methods()[:3]}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"other.json: its methods .* are not those of .*run0.json"):
        resolution.pool([paths[0], other])
