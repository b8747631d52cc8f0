"""The frontier runner (`benchmarks/frontier.py`): the grids and `--skip`, the γ each rule runs at, slices end to end
on tiny models (two slices merged give what one run over both prompt sets gives, sampled ones too), the merged
figures and the dominated points on worked numbers, the errors, and the plot. No timing is asserted."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from conftest import prompt, tiny_llama

import hf_semspec
from benchmarks import frontier, models
from hf_semspec.comparison import parse_configuration
from hf_semspec.errors import SemSpecConfigError
from test_benchmark_harness import thread_count_kept, write_tiny_data

# fly with an empty window and no entropy gate keeps most of an unrelated draft's tokens: outputs leave exact's.
FLIP = "fly@window=1@entropy_threshold=0"


def tiny_pair(pair: str, **_options) -> models.ModelPair:
    """Tiny random Llamas, the draft unrelated to the target (so relaxed rules change the text), and a decoder whose
    answer depends on the output: "the answer is 5" for an even sum of ids, else 16 (GSM8K problem 0's and 1's
    reference numbers in `write_tiny_data`), so answers differ between outputs."""
    target, draft = tiny_llama(seed=0), tiny_llama(seed=1)

    def encode(text: str) -> dict:
        ids = torch.tensor([[4 + ord(c) % 120 for c in text[:12]]])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    def decode(ids) -> str:
        return f"the answer is {5 if sum(ids) % 2 == 0 else 16}"

    return models.ModelPair(target, draft, encode, decode, "tiny-target", "tiny-draft",
                            {"target_dtype": "float32", "draft_dtype": "float32"})


def must_not_load(*_args, **_kwargs):
    pytest.fail("no model may load before the arguments are checked")


# ---------------------------------------------------------------------------------------------------------------------
# Grids, --configs, --skip, γ
# ---------------------------------------------------------------------------------------------------------------------


def test_the_grids_are_the_issues_and_parse_to_their_options():
    fly = frontier.grid_configurations("fly")
    assert [parse_configuration(c).options for c in fly] == [
        {"entropy_threshold": theta, "window": window} for window in (4, 6) for theta in (0.3, 0.6, 1.0)]
    assert [parse_configuration(c).options for c in frontier.grid_configurations("ears")] == [
        {"beta": 0.1}, {"beta": 0.3}, {"beta": 0.5}]
    assert [parse_configuration(c).options for c in frontier.grid_configurations("dropmatch")] == [
        {"min_votes": 1}, {"min_votes": 2}, {"min_votes": 3}]
    assert [parse_configuration(c).options for c in frontier.grid_configurations("ensemble")] == [
        {"weight": 0.3}, {"weight": 0.5}, {"weight": 0.7}]
    every = frontier.grid_configurations("all")
    assert len(every) == 15 and len({parse_configuration(c).key for c in every}) == 15
    assert frontier.grid_configurations("ears,dropmatch") == frontier.grid_configurations("all")[6:12]
    assert frontier.grid_configurations("fly,all") == every  # a point named twice runs once
    with pytest.raises(SemSpecConfigError, match=r"`--grid` = 'fly,flyy' is not valid: allowed one or more "
                                                 r"\(comma-separated\) of fly, ears, dropmatch, ensemble, all\. Fix"):
        frontier.grid_configurations("fly,flyy")


def test_skip_and_configs_select_by_setting_not_by_spelling():
    chosen = frontier.select_configurations("fly", ["ears@beta=0.2", "exact", "fly@window=4@entropy_threshold=0.3"],
                                            ["fly@window=6@entropy_threshold=1.0"])  # the grid writes θ first
    assert chosen == [c for c in frontier.grid_configurations("fly") if c != "fly@entropy_threshold=1.0@window=6"] \
        + ["ears@beta=0.2"]  # exact runs anyway; θ 0.3 W 4 is the grid's first point again
    with pytest.raises(SemSpecConfigError, match=r"`--skip` = 'ears@beta=0.9' is not valid: allowed one of the "
                                                 r"selected.*Fix"):
        frontier.select_configurations("fly", [], ["ears@beta=0.9"])
    with pytest.raises(SemSpecConfigError, match=r"at least one configuration besides exact"):
        frontier.select_configurations("ears", [], frontier.grid_configurations("ears"))
    with pytest.raises(SemSpecConfigError, match=r"window"):
        frontier.select_configurations(None, ["fly@window=0"])


def test_each_rule_runs_at_its_own_gamma_when_none_is_given(target, unrelated_draft):
    """What the slices rely on: compare() passes one set of generate() arguments to every configuration, and with
    no num_assistant_tokens generate() gives each rule its own γ (fly 15, exact 5)."""
    assert frontier.rule_gamma("fly@window=4", None) == 15
    assert [frontier.rule_gamma(c, None) for c in ("exact", "ears@beta=0.3", "dropmatch@min_votes=1")] == [5, 5, 5]
    assert frontier.rule_gamma("fly", 8) == 8
    hf_semspec.attach(target)
    try:
        for rule, gamma in (("exact", 5), ("fly", 15)):
            ids = prompt(8)
            out = target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=unrelated_draft,
                                  acceptance=rule, max_new_tokens=40, do_sample=False, return_dict_in_generate=True)
            assert max(out.acceptance_stats.drafted_per_round) == gamma
    finally:
        hf_semspec.detach(target)


# ---------------------------------------------------------------------------------------------------------------------
# End to end on tiny models
# ---------------------------------------------------------------------------------------------------------------------


def run_slice(folder: Path, *extra: str) -> dict:
    argv = ["run", "--data-dir", str(folder / "data"), "--output-dir", str(folder / "out"), "--max-new-tokens", "10",
            "--threads", "1", "--no-progress", "--warmup-max-new-tokens", "2", "--configs", FLIP, "--grid", "ears",
            *extra]
    with thread_count_kept():
        return frontier.main(argv, load_pair=tiny_pair)


COUNTS = ("prompts", "prompt_ids", "identical_share", "new_tokens", "answer_wins", "answer_losses", "accuracy",
          "mean_first_divergence", "gamma")


@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
def test_two_slices_merged_are_one_run_over_both(tmp_path, sample):
    write_tiny_data(tmp_path / "data")
    mode = ["--sample", "--temperature", "0.7", "--top-p", "0.9", "--seed", "3"] if sample else []
    first = run_slice(tmp_path, "--gsm8k-problems", "0:1", *mode)
    second = run_slice(tmp_path, "--gsm8k-problems", "1:2", *mode)
    whole = run_slice(tmp_path, "--gsm8k-problems", "0:2", *mode, "--name", "whole")
    stem = "sample-s3" if sample else "greedy"
    assert first["name"] == f"slice-{stem}-ears-configs-gsm8k-0-1" and whole["prompt_ids"] == ["gsm8k:0", "gsm8k:1"]
    assert [c["name"] for c in first["configurations"]] == ["exact", *frontier.grid_configurations("ears"), FLIP]
    assert {c["name"]: c["gamma"] for c in first["configurations"]}[FLIP] == 15
    out = tmp_path / "out"
    merged = frontier.main(["merge", str(out / f"{first['name']}.json"), str(out / f"{second['name']}.json"),
                            "--name", "split", "--output-dir", str(out), "--no-plot"])
    one = frontier.main(["merge", str(out / "whole.json"), "--name", "one", "--output-dir", str(out), "--no-plot"])
    assert [r["name"] for r in merged["configurations"]] == [r["name"] for r in one["configurations"]]
    for split_row, one_row in zip(merged["configurations"], one["configurations"]):
        assert {k: split_row[k] for k in COUNTS} == {k: one_row[k] for k in COUNTS}, split_row["name"]
        assert split_row["tau"] == pytest.approx(one_row["tau"])
        assert split_row["nll_increase"] == pytest.approx(one_row["nll_increase"], abs=1e-6)
        assert split_row["prompts"] == 2 and split_row["all_prompts"]
    # the pooled figures are the slices' own per-prompt ones: τ from each prompt's tokens and τ, flips against exact
    flip = next(r for r in merged["configurations"] if r["name"] == FLIP)
    per_prompt = [next(row for row in s["report"]["configurations"] if row["name"] == FLIP)["per_prompt"][0]
                  for s in (first, second)]
    exact = [next(row for row in s["report"]["configurations"] if row["name"] == "exact")["per_prompt"][0]
             for s in (first, second)]
    assert flip["tau"] == pytest.approx(sum(p["new_tokens"] for p in per_prompt)
                                        / sum(p["new_tokens"] / p["tau"] for p in per_prompt))
    assert flip["answer_wins"] == sum(p["score"] > e["score"] for p, e in zip(per_prompt, exact))
    assert flip["answer_losses"] == sum(p["score"] < e["score"] for p, e in zip(per_prompt, exact))
    assert flip["identical_share"] < 1 and flip["nll_increase"] != 0  # the rule does change the text
    assert per_prompt[0]["text"].startswith("the answer is ")  # texts decoded for reading
    if sample:  # prompt i of the source is seeded with seed + i, whichever slice runs it
        for s, index in ((first, 0), (second, 1)):
            for row in s["report"]["configurations"]:
                whole_row = next(r for r in whole["report"]["configurations"] if r["name"] == row["name"])
                assert row["per_prompt"][0]["new_token_ids"] == whole_row["per_prompt"][index]["new_token_ids"]
    text = (out / "frontier-split.md").read_text()
    assert "# Frontier: gsm8k" in text and f"`{FLIP}`" in text and "frontier-split.png" not in text
    assert json.loads((out / "frontier-split.json").read_text())["kind"] == frontier.REPORT_KIND
    with pytest.raises(ValueError, match=r"gsm8k:0 of ears@beta=0.1 is in both .* Fix: merge slices of other "
                                         r"prompts"):
        frontier.main(["merge", str(out / f"{first['name']}.json"), str(out / "whole.json"), "--name", "twice",
                       "--output-dir", str(out), "--no-plot"])


def test_spec_bench_slices_have_no_scorer_and_other_settings_do_not_merge(tmp_path):
    write_tiny_data(tmp_path / "data")
    bench = run_slice(tmp_path, "--spec-bench", "quick", "--spec-bench-prompts", "0:1")
    gsm8k = run_slice(tmp_path, "--gsm8k-problems", "0:1")
    assert bench["name"] == "slice-greedy-ears-configs-specbench-quick-0-1" and bench["scorer"] is None
    assert bench["prompt_ids"] == ["specbench_question:2"]  # the quick profile's first: the shortest writing prompt
    assert all(p["score"] is None for row in bench["report"]["configurations"] for p in row["per_prompt"])
    out = tmp_path / "out"
    report = frontier.main(["merge", str(out / f"{bench['name']}.json"), "--name", "bench", "--output-dir", str(out),
                            "--no-plot"])
    assert all(r["accuracy"] is None and r["answer_wins"] is None for r in report["configurations"])
    with pytest.raises(ValueError, match=r"differ in source: 'spec-bench quick' vs 'gsm8k'.*Fix"):
        frontier.main(["merge", str(out / f"{bench['name']}.json"), str(out / f"{gsm8k['name']}.json"), "--name",
                       "mixed", "--output-dir", str(out), "--no-plot"])
    with pytest.raises(ValueError, match=r"expected a frontier slice.*Fix: pass the slice JSONs"):
        frontier.main(["merge", str(out / "frontier-bench.json"), "--name", "again", "--output-dir", str(out),
                       "--no-plot"])


def test_bad_arguments_fail_before_any_model_loads(tmp_path, capsys):
    write_tiny_data(tmp_path / "data")
    common = ["run", "--data-dir", str(tmp_path / "data"), "--output-dir", str(tmp_path / "out")]
    for extra, message in (
        (["--grid", "fly", "--gsm8k-problems", "0:1", "--skip", "ears@beta=0.1"], "`--skip` = 'ears@beta=0.1'"),
        (["--configs", "fly@window=0", "--gsm8k-problems", "0:1"], "window"),
        (["--grid", "fly", "--gsm8k-problems", "0:1", "--temperature", "0.7"], "add --sample"),
        (["--gsm8k-problems", "0:1"], "no configurations"),
        (["--grid", "fly", "--gsm8k-problems", "0:1", "--spec-bench-prompts", "0:1"], "--spec-bench quick"),
        (["--grid", "fly", "--gsm8k-problems", "2:1"], "START:END"),
    ):
        with pytest.raises(SystemExit):
            frontier.main(common + extra, load_pair=must_not_load)
        assert message in capsys.readouterr().err, extra
    with pytest.raises(SemSpecConfigError, match=r"`--spec-bench-prompts` = '0:9'.*within the 2 prompts"):
        frontier.main(common + ["--grid", "fly", "--spec-bench", "quick", "--spec-bench-prompts", "0:9"],
                      load_pair=must_not_load)


def test_a_dry_run_prints_the_plan_and_loads_nothing(tmp_path, capsys):
    write_tiny_data(tmp_path / "data")
    plan = frontier.main(["run", "--grid", "fly", "--gsm8k-problems", "0:2", "--data-dir", str(tmp_path / "data"),
                          "--dry-run", "--skip", "fly@entropy_threshold=1.0@window=4"], load_pair=must_not_load)
    assert plan["name"] == "slice-greedy-fly-gsm8k-0-2" and len(plan["configurations"]) == 5
    assert plan["gammas"]["exact"] == 5 and all(plan["gammas"][c] == 15 for c in plan["configurations"])
    assert plan["expected_seconds"] == 6 * 2 * frontier.SECONDS_PER_CALL["gsm8k", False]
    assert "expected about 15 min" in capsys.readouterr().out
    assert frontier.estimate_seconds(7, 10, "gsm8k", False, 512) > frontier.SLICE_BUDGET_S * 0.95  # the plan's S1


# ---------------------------------------------------------------------------------------------------------------------
# Merged figures and domination on worked numbers
# ---------------------------------------------------------------------------------------------------------------------


def fake_slice(name: str, prompt_ids: list[str], rows: dict[str, list[tuple]], exact_scores: list[float],
               target: str = "t") -> dict:
    """A slice as `frontier.py run` writes it, from per-prompt (speed-up, NLL increase, score, new tokens,
    forwards) per configuration."""
    configurations = []
    for config, values in [("exact", [(1.0, 0.0, s, 10, 5) for s in exact_scores]), *rows.items()]:
        parsed = parse_configuration(config)
        configurations.append({"name": config, "rule": parsed.rule, "options": parsed.options, "per_prompt": [
            {"prompt_index": i, "speedup": speed, "nll_increase": nll, "identical": nll == 0,
             "first_divergence": None if nll == 0 else 3, "score": score, "new_tokens": tokens,
             "tau": tokens / forwards, "seconds": 1.0}
            for i, (speed, nll, score, tokens, forwards) in enumerate(values)]})
    return {"kind": frontier.SLICE_KIND, "name": name, "prompt_ids": prompt_ids, "skip": [],
            "configurations": [{"name": c["name"], "gamma": 15 if c["rule"] == "fly" else 5} for c in configurations],
            "source": {"kind": "gsm8k"}, "decoding": {"max_new_tokens": 512, "do_sample": False, "seed": None},
            "models": {"target": target, "draft": "d", "target_dtype": "float32", "draft_dtype": "bfloat16"},
            "report": {"configurations": configurations}}


def worked_slices(folder: Path) -> list[Path]:
    """Two slices of two GSM8K problems each. `fly@window=4` (A): speed-ups 2, 0.5, 1, 4 (geometric mean √2), NLL
    increases 0.1..0.4 (mean 0.25); `fly@window=5` (B): 1.2× at +0.3 everywhere, so A dominates it; `fly@window=3`
    (C): 2× at +0.5, faster than A but further: not dominated; `ears@beta=0.2`: better than every fly point, but
    another rule; `fly@window=2` (E), only in the first slice (skipped later): 1.1× at +0.35, dominated by B there."""
    first = fake_slice("s0", ["gsm8k:0", "gsm8k:1"], {
        "fly@window=4": [(2.0, 0.1, 0.0, 10, 5), (0.5, 0.2, 1.0, 20, 10)],
        "fly@window=5": [(1.2, 0.3, 1.0, 10, 5)] * 2,
        "fly@window=3": [(2.0, 0.5, 0.0, 10, 5)] * 2,
        "ears@beta=0.2": [(3.0, 0.01, 1.0, 10, 5)] * 2,
        "fly@window=2": [(1.1, 0.35, 1.0, 10, 5)] * 2,
    }, exact_scores=[1.0, 0.0])
    second = fake_slice("s1", ["gsm8k:2", "gsm8k:3"], {
        "fly@window=4": [(1.0, 0.3, 1.0, 30, 10), (4.0, 0.4, 1.0, 40, 20)],
        "fly@window=5": [(1.2, 0.3, 1.0, 10, 5)] * 2,
        "fly@window=3": [(2.0, 0.5, 0.0, 10, 5)] * 2,
        "ears@beta=0.2": [(3.0, 0.01, 1.0, 10, 5)] * 2,
    }, exact_scores=[1.0, 0.0])
    paths = []
    for results in (first, second):
        paths.append(folder / f"{results['name']}.json")
        paths[-1].write_text(json.dumps(results))
    return paths


def test_dominated_points_on_worked_numbers():
    points = {"fly@a": ("fly", 1.2, 0.05), "fly@b": ("fly", 1.1, 0.07), "fly@c": ("fly", 1.3, 0.10),
              "fly@d": ("fly", 1.2, 0.06),  # as fast as a: a tie in speed is no domination by a
              "ears@x": ("ears", 1.5, 0.01), "exact": ("exact", 1.0, 0.0), "fly@e": ("fly", None, 0.01)}
    assert frontier.dominated_points(points) == {"fly@b": ["fly@a", "fly@d"]}
    assert frontier.dominates((1.2, 0.05), (1.1, 0.07)) and not frontier.dominates((1.2, 0.05), (1.2, 0.07))
    assert not frontier.dominates((1.3, 0.10), (1.1, 0.07))


def test_merge_pools_the_slices_per_prompt_and_marks_dominated_points(tmp_path, capsys):
    paths = worked_slices(tmp_path)
    report = frontier.main(["merge", *map(str, paths), "--name", "worked", "--output-dir", str(tmp_path), "--no-plot"])
    rows = {r["name"]: r for r in report["configurations"]}
    assert list(rows)[0] == "exact" and report["prompts"] == 4
    a = rows["fly@window=4"]
    assert a["speedup"] == pytest.approx(math.sqrt(2)) and a["nll_increase"] == pytest.approx(0.25)
    logs = [math.log(r) for r in (2.0, 0.5, 1.0, 4.0)]
    sd = (sum((x - sum(logs) / 4) ** 2 for x in logs) / 3) ** 0.5
    t = 3.18245  # Student's t₀.₉₇₅ at 3 degrees of freedom (4 prompts)
    assert a["speedup_ci95"] == pytest.approx([math.sqrt(2) * math.exp(-t * sd / 2),
                                              math.sqrt(2) * math.exp(t * sd / 2)], rel=1e-5)
    assert a["tau"] == pytest.approx(100 / 45)  # pooled: 10 + 20 + 30 + 40 tokens over 5 + 10 + 10 + 20 forwards
    # exact's answers 1, 0, 1, 0; A's 0, 1, 1, 1: it wins problems 1 and 3 and loses problem 0
    assert (a["answer_wins"], a["answer_losses"], a["net_answer_flips"], a["accuracy"]) == (2, 1, 1, 0.75)
    assert a["identical_share"] == 0.0 and a["mean_first_divergence"] == 3 and a["gamma"] == 15
    assert rows["fly@window=5"]["dominated_by"] == ["fly@window=4"]
    assert rows["fly@window=3"]["dominated_by"] == [] and rows["ears@beta=0.2"]["dominated_by"] == []
    skipped = rows["fly@window=2"]
    assert skipped["prompts"] == 2 and not skipped["all_prompts"] and skipped["dominated_by"] == ["fly@window=5"]
    assert report["dominated"] == {"fly@window=5": ["fly@window=4"], "fly@window=2": ["fly@window=5"]}
    text = (tmp_path / "frontier-worked.md").read_text()
    assert "| `fly@window=5` | 15 | 4 | 1.200× [1.200, 1.200] | +0.3000 [0.3000, 0.3000] |" in text
    assert "+2 / −1 (+1)" in text and "`fly@window=2` (2 prompts)" in text
    capsys.readouterr()
    # `dominated`: judged on the prompts every configuration ran (problems 0 and 1): A is 1.0× at +0.15 there, so B
    # no longer falls behind it, and E still falls behind B
    found = frontier.main(["dominated", *map(str, paths)])
    assert found["prompts"] == ["gsm8k:0", "gsm8k:1"] and found["dominated"] == {"fly@window=2": ["fly@window=5"]}
    assert "--skip fly@window=2" in capsys.readouterr().out
    assert frontier.main(["dominated", *map(str, paths), "--gsm8k-problems", "0:4"])["dominated"] == report["dominated"]


def test_slices_of_two_grids_on_one_prompt_set_share_exact(tmp_path):
    """As the plan's first two slices: fly's grid and another on problems 0 and 1, each with its own exact; a
    configuration's flips and speed-ups are against the exact of its own slice."""
    paths = worked_slices(tmp_path)
    other = fake_slice("s2", ["gsm8k:0", "gsm8k:1"], {"dropmatch@min_votes=1": [(1.5, 0.2, 0.0, 10, 5)] * 2},
                       exact_scores=[0.0, 1.0])  # exact right on problem 1 only in this slice
    paths.append(tmp_path / "s2.json")
    paths[-1].write_text(json.dumps(other))
    report = frontier.main(["merge", *map(str, paths), "--name", "grids", "--output-dir", str(tmp_path),
                            "--no-plot"])
    rows = {r["name"]: r for r in report["configurations"]}
    assert [r["rule"] for r in report["configurations"]] == ["exact", *["fly"] * 4, "ears", "dropmatch"]  # by rule
    assert rows["exact"]["prompts"] == 4 and rows["exact"]["accuracy"] == 0.5  # s0's and s1's, s2's not added
    votes = rows["dropmatch@min_votes=1"]
    assert (votes["prompts"], votes["answer_wins"], votes["answer_losses"]) == (2, 0, 1)  # against s2's exact
    assert votes["speedup"] == pytest.approx(1.5) and not votes["all_prompts"]


def test_each_rules_default_is_marked_however_it_is_spelled(tmp_path):
    """`fly@window=6` is fly's default (θ 0.3 and W 6), spelled with one option; `fly@window=4` and `exact` are not
    marked."""
    paths = [tmp_path / "d.json"]
    paths[0].write_text(json.dumps(fake_slice("d", ["gsm8k:0"], {
        "fly@window=6": [(1.2, 0.02, 1.0, 10, 5)], "fly@window=4": [(1.3, 0.03, 1.0, 10, 5)],
        "dropmatch": [(0.9, 0.01, 1.0, 10, 5)]}, exact_scores=[1.0])))
    report = frontier.main(["merge", *map(str, paths), "--name", "d", "--output-dir", str(tmp_path), "--no-plot"])
    marked = {r["name"]: r["is_default"] for r in report["configurations"]}
    assert marked == {"exact": False, "fly@window=6": True, "fly@window=4": False, "dropmatch": True}
    text = (tmp_path / "frontier-d.md").read_text()
    assert "| `fly@window=6` (default) | 15 |" in text and "| `fly@window=4` | 15 |" in text
    # the default options at another γ than the rule's (fly's is 15) are not the default
    results = json.loads(paths[0].read_text())
    results["configurations"] = [{**c, "gamma": 5} for c in results["configurations"]]
    paths[0].write_text(json.dumps(results))
    report = frontier.main(["merge", *map(str, paths), "--name", "d", "--output-dir", str(tmp_path), "--no-plot"])
    assert {r["name"]: r["is_default"] for r in report["configurations"]}["fly@window=6"] is False


def test_slices_of_other_models_do_not_merge(tmp_path):
    paths = worked_slices(tmp_path)
    other = json.loads(paths[1].read_text())
    other["models"]["target"] = "another"
    paths[1].write_text(json.dumps(other))
    with pytest.raises(ValueError, match=r"s1.json and s0.json differ in models.*Fix"):
        frontier.main(["merge", *map(str, paths), "--name", "x", "--output-dir", str(tmp_path), "--no-plot"])


def test_the_plot_is_written_next_to_the_json(tmp_path):
    pytest.importorskip("matplotlib")
    paths = worked_slices(tmp_path)
    frontier.main(["merge", *map(str, paths), "--name", "worked", "--output-dir", str(tmp_path)])
    png = tmp_path / "frontier-worked.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert "![the frontier](frontier-worked.png)" in (tmp_path / "frontier-worked.md").read_text()
    assert frontier.option_label({"entropy_threshold": 0.3, "window": 4}) == "θ0.3 W4"


def test_without_matplotlib_merge_names_the_fix(tmp_path, monkeypatch):
    paths = worked_slices(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # an import of it raises ImportError
    with pytest.raises(SystemExit, match=r"matplotlib is not installed.*\.\[benchmarks\].*--no-plot"):
        frontier.main(["merge", *map(str, paths), "--name", "worked", "--output-dir", str(tmp_path)])
    assert not (tmp_path / "frontier-worked.json").exists()  # refused before any work


def test_merge_refuses_slices_of_another_isa_or_thread_count(tmp_path):
    """A speed-up measured on an AVX2 CPU is not one measured with AVX-512 BF16: slices tagged with different ISAs
    or thread counts, or one tagged and one not, are not pooled."""
    paths = worked_slices(tmp_path)
    for first_machine, second_machine in (({}, {"cpu_isa": "AVX2", "torch_threads": 2}),
                                          ({"cpu_isa": "AVX2", "torch_threads": 2},
                                           {"cpu_isa": "AVX-512 BF16", "torch_threads": 2}),
                                          ({"cpu_isa": "AVX2", "torch_threads": 2},
                                           {"cpu_isa": "AVX2", "torch_threads": 1})):
        for path, machine in zip(paths, (first_machine, second_machine)):
            results = json.loads(path.read_text())
            results["machine"] = machine
            path.write_text(json.dumps(results))
        with pytest.raises(ValueError, match=r"differ in cpu: .* vs .*Fix: merge slices of one setting \(.*CPU ISA "
                                             r"and threads\)"):
            frontier.main(["merge", *map(str, paths), "--name", "mixed", "--output-dir", str(tmp_path), "--no-plot"])


def test_the_stock_peer_runs_at_exact_s_gamma_and_is_no_rule_s_default():
    assert frontier.rule_gamma("transformers@assistant_ensemble_weight=0.5", None) == 5
    assert frontier.rule_gamma("transformers@assistant_ensemble_weight=0.5", 7) == 7
    assert frontier.PEER.format(weight=0.5) == "transformers@assistant_ensemble_weight=0.5"
    chosen = frontier.select_configurations("ensemble", [frontier.PEER.format(weight=0.5)])
    assert chosen[-1] == "transformers@assistant_ensemble_weight=0.5" and len(chosen) == 4
