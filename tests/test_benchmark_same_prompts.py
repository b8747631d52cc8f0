"""benchmarks/same_prompts.py: a policy against the best fixed length on the prompts two runs share, each run priced
and judged on its own."""

import json
import math
from pathlib import Path

import pytest

from benchmarks import same_prompts

# Modeled tokens/s = 60 new tokens / F at 1 s per target forward and nothing per draft.
COSTS = {"seconds_per_target_forward": 1.0, "seconds_per_draft_forward": 0.0}
C3, C8, C16, POLICY = "semspec:fly/constant:3", "semspec:fly/constant:8", "semspec:fly/constant:16", "semspec:fly/tapout"


def _run(speeds: dict, fixed: list[str], policies: tuple[str, ...] = (POLICY,)) -> dict:
    """speeds: prompt → (category, {method: tokens/s})."""
    methods = [{"name": "plain", "rule": None, "draft_length": None}] + [
        {"name": n, "rule": "fly", "draft_length": n.split("/")[1].split(":")[0]} for n in fixed + list(policies)]
    records = [{"prompt_id": p, "category": c, "method": n, "target_forwards": 60 / v, "draft_forwards": 0,
                "new_tokens": 60} for p, (c, values) in speeds.items() for n, v in values.items()]
    return {"methods": methods, "records": records, "aggregates": {"cost_model": COSTS}}


RUN_A = _run({"p1": ("a", {C3: 2.0, C16: 4.0, POLICY: 3.0}),
              "p2": ("a", {C3: 2.0, C16: 1.5, POLICY: 2.0}),
              "q1": ("b", {C3: 3.0, C16: 1.0, POLICY: 3.0})}, [C3, C16])
# Another setting of the same prompts in another order, a prompt of its own and a fixed length A did not run (twice
# as fast as any other: it must not be the reference).
RUN_B = _run({"r1": ("b", {C3: 1.0, C8: 10.0, C16: 1.0, POLICY: 1.0}),
              "q1": ("b", {C3: 3.0, C8: 10.0, C16: 1.0, POLICY: 2.0}),
              "p2": ("a", {C3: 2.0, C8: 10.0, C16: 1.5, POLICY: 1.5}),
              "p1": ("a", {C3: 2.0, C8: 10.0, C16: 5.0, POLICY: 5.0})}, [C3, C8, C16])
PATHS = [Path("a.json"), Path("b.json")]


def test_each_run_is_judged_against_its_own_best_fixed_length_on_worked_numbers():
    out = same_prompts.compare([RUN_A, RUN_B], PATHS, POLICY)
    assert out["fixed"] == [C3, C16]  # constant:8 is B's only
    assert out["prompts"] == ["p1", "p2", "q1"]  # the first run's order; r1 is B's only
    assert out["categories"] == {"a": ["p1", "p2"], "b": ["q1"]}
    a, b = (run["rows"] for run in out["runs"])
    # A, prompt by prompt: p1's best is constant:16 (4), 3 / 4; p2's and q1's constant:3, 2 / 2 and 3 / 3.
    assert a["p1"] == {"best": C16, "ratio": pytest.approx(0.75)}
    assert a["p2"]["best"] == C3 and a["q1"]["best"] == C3 and a["q1"]["ratio"] == pytest.approx(1.0)
    # Category a: constant:16's geometric mean sqrt(4 · 1.5) = 2.449 beats constant:3's 2, so the ratio is
    # sqrt(3/4 · 2/1.5) = 1 although constant:3 is best on p2.
    assert a["a"] == {"best": C16, "ratio": pytest.approx(1.0)}
    # Overall: constant:3 (12^(1/3) = 2.289 against 6^(1/3) = 1.817): (3/2 · 2/2 · 3/3)^(1/3).
    assert a["overall"] == {"best": C3, "ratio": pytest.approx(1.5 ** (1 / 3))}
    # B on the same prompts: p1 5 / 5; q1 2 / 3; overall constant:3 again (12^(1/3) against 7.5^(1/3)):
    # (5/2 · 1.5/2 · 2/3)^(1/3) = 1.25^(1/3).
    assert b["p1"] == {"best": C16, "ratio": pytest.approx(1.0)}
    assert b["q1"]["ratio"] == pytest.approx(2 / 3)
    assert b["overall"] == {"best": C3, "ratio": pytest.approx(1.25 ** (1 / 3))}
    assert "r1" not in b and math.isclose(out["runs"][1]["costs"]["seconds_per_target_forward"], 1.0)


def test_cli_writes_the_table(tmp_path):
    for path, run in zip(PATHS, [RUN_A, RUN_B]):
        (tmp_path / path.name).write_text(json.dumps(run))
    summary = same_prompts.main([str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--policy", POLICY,
                                 "--name", "cmp", "--output-dir", str(tmp_path)])
    text = (tmp_path / "cmp.md").read_text()
    assert "| a | p1 | `constant:16` | 0.75 | `constant:16` | 1.00 |" in text
    assert "| a | all | `constant:16` | 1.00 | `constant:16` | " in text  # B: sqrt(5/5 · 1.5/1.5) = 1 too
    assert "| b | q1 | `constant:3` | 1.00 | `constant:3` | 0.67 |" in text
    assert "| b | all |" not in text  # one prompt: its category row would repeat it
    assert "| overall | 3 | `constant:3` | 1.14 | `constant:3` | 1.08 |" in text
    assert json.loads((tmp_path / "cmp.json").read_text())["policy"] == summary["policy"] == POLICY


def test_bad_input_names_what_is_missing():
    with pytest.raises(ValueError, match=r"b\.json: --policy 'semspec:fly/svip' is not one of its methods"):
        same_prompts.compare([_run({"p1": ("a", {C3: 1.0, C16: 1.0, "semspec:fly/svip": 1.0})}, [C3, C16],
                                   ("semspec:fly/svip",)), RUN_B], PATHS, "semspec:fly/svip")
    only_c3 = _run({"p1": ("a", {C3: 2.0, POLICY: 2.0})}, [C3])
    with pytest.raises(ValueError, match=r"share 1 fixed length\(s\) of rule 'fly'.*needs two or more"):
        same_prompts.compare([RUN_A, only_c3], PATHS, POLICY)
    elsewhere = _run({"z9": ("a", {C3: 2.0, C16: 2.0, POLICY: 2.0})}, [C3, C16])
    with pytest.raises(ValueError, match="no prompt has 'semspec:fly/tapout' in every run"):
        same_prompts.compare([RUN_A, elsewhere], PATHS, POLICY)
    with pytest.raises(SystemExit):
        same_prompts.main(["a.json", "--policy", POLICY, "--name", "x"])
