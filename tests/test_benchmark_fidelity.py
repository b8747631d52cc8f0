"""The fidelity report (`benchmarks/fidelity.py`) and the harness options it relies on: GSM8K slices
(`--gsm8k-problems`), rule variants in `--rules`, `--skip-plain`; on worked records, then end to end on tiny models."""

from __future__ import annotations

import json

import pytest

from benchmarks import data, fidelity, methods, run
from test_benchmark_harness import thread_count_kept, tiny_pair, write_tiny_data


def record(method, problem, correct, tokens_per_s, new_tokens=10, forwards=5, ids=(1, 2)):
    return {"method": method, "prompt_id": f"gsm8k:{problem}", "category": "gsm8k", "new_tokens": new_tokens,
            "target_forwards": forwards, "wall_s": new_tokens / tokens_per_s, "tokens_per_s": tokens_per_s,
            "new_token_ids": list(ids), "max_new_tokens": 64,
            "gsm8k": {"gold": "1", "predicted": "1" if correct else "2", "correct": correct}}


def results(records, seed=0, sample=False, target="t"):
    names = list(dict.fromkeys(r["method"] for r in records))
    return {"config": {"seed": seed, "sample": sample}, "models": {"target": target, "draft": "d"},
            "methods": [{"name": n, "rule": n.split(":")[-1]} for n in names], "records": records}


def test_flips_accuracy_tau_and_speedup_on_worked_records():
    """Two slices. Problem 0: both right; 1: exact right, rule wrong (−); 2: exact wrong, rule right (+);
    3: both wrong. The rule's speed-ups over exact in their own runs are 2, 1, 1.5, 0.5 (geomean 1.107)."""
    first = results([record("semspec:exact", 0, True, 2.0), record("semspec:fly", 0, True, 4.0, ids=(1, 3)),
                     record("semspec:exact", 1, True, 2.0), record("semspec:fly", 1, False, 2.0, forwards=2)])
    second = results([record("semspec:exact", 2, False, 4.0), record("semspec:fly", 2, True, 6.0),
                      record("semspec:exact", 3, False, 4.0), record("semspec:fly", 3, False, 2.0)])
    report = fidelity.fidelity({"a.json": first, "b.json": second})
    assert report["baseline"] == "semspec:exact"
    rule = report["methods"]["semspec:fly"]
    assert (rule["problems"], rule["correct"], rule["accuracy"]) == (4, 2, 0.5)
    assert (rule["flips_won"], rule["flips_lost"], rule["net_flips"]) == (1, 1, 0)
    assert rule["tau"] == pytest.approx(40 / 17)
    assert rule["tokens_per_s"] == pytest.approx(40 / (10 / 4 + 10 / 2 + 10 / 6 + 10 / 2))
    assert rule["speedup_vs_baseline"]["geomean"] == pytest.approx((2 * 1 * 1.5 * 0.5) ** 0.25)
    assert rule["identical_to_baseline"] == 0.75
    exact = report["methods"]["semspec:exact"]
    assert (exact["accuracy"], exact["net_flips"], exact["speedup_vs_baseline"]["geomean"]) == (0.5, 0, 1.0)
    text = fidelity.render(report)
    assert "| `semspec:fly` | 4 | 0.500 (2) | +1 / −1 | +0 (+0.0) | 2.35 |" in text
    assert "| 1.000× / 1.00× | 1.00–1.00 | 1.00 |" in text  # exact against itself: every ratio 1, no spread
    low, high = rule["speedup_vs_baseline"]["ci95"]
    assert low < (2 * 1 * 1.5 * 0.5) ** 0.25 < high and f"| {low:.2f}–{high:.2f} | 0.75 |" in text


def test_sampling_seeds_pair_on_problem_and_seed():
    """The same problem under two seeds is two pairs; the same problem and seed in two runs is refused."""
    seed0 = results([record("semspec:exact", 0, True, 2.0), record("semspec:ears", 0, False, 2.0)], seed=0, sample=True)
    seed1 = results([record("semspec:exact", 0, False, 2.0), record("semspec:ears", 0, True, 2.0)], seed=1, sample=True)
    report = fidelity.fidelity({"s0.json": seed0, "s1.json": seed1})
    assert report["sample"] and report["methods"]["semspec:ears"]["problems"] == 2
    assert (report["methods"]["semspec:ears"]["flips_won"], report["methods"]["semspec:ears"]["flips_lost"]) == (1, 1)
    with pytest.raises(ValueError, match=r"gsm8k:0 with --seed 0 is in both s0.json and again.json"):
        fidelity.fidelity({"s0.json": seed0, "again.json": seed0})


@pytest.mark.parametrize("change, message", [
    (lambda r: r["models"].update(target="other"), r"differ in target: 't' vs 'other'"),
    (lambda r: r["config"].update(sample=True), r"differ in sample"),
    (lambda r: r["methods"].pop(0), r"has no method 'semspec:exact'"),
])
def test_runs_that_do_not_measure_the_same_thing_are_refused(change, message):
    first = results([record("semspec:exact", 0, True, 2.0)])
    second = results([record("semspec:exact", 1, True, 2.0)])
    change(second)
    with pytest.raises(ValueError, match=message):
        fidelity.fidelity({"a.json": first, "b.json": second}, baseline="semspec:exact")


def test_gsm8k_slices_and_rule_entries_parse():
    assert data.parse_slice("3:10") == (3, 10)
    for bad in ("10:3", "3", "a:b", "5:5"):
        with pytest.raises(ValueError, match="expected START:END"):
            data.parse_slice(bad)
    assert methods.split_entries('exact, dropmatch(criterion=js;min_votes=2),fly(window=["a","b"])') == [
        "exact", "dropmatch(criterion=js;min_votes=2)", 'fly(window=["a","b"])']
    assert methods.parse_rule_entry("dropmatch(criterion=js;min_votes=2)") == (
        "dropmatch", {"criterion": "js", "min_votes": 2})
    with pytest.raises(ValueError, match=r"--rules: 'exact:3' must be <rule> or <rule>\(<option>=<value>;...\)"):
        methods.parse_rule_entry("exact:3")


def test_rule_variants_are_methods_of_their_own_and_bad_options_fail_early():
    from conftest import tiny_llama

    built, _ = methods.build_methods(["exact", "dropmatch", "dropmatch(min_votes=2)"], {"dropmatch": {"num_heads": 4}},
                                     None, False, tiny_llama(seed=1), include_stock=False, include_plain=False)
    assert [m.name for m in built] == ["semspec:exact", "semspec:dropmatch", "semspec:dropmatch(min_votes=2)"]
    assert built[2].rule == "dropmatch" and built[2].rule_kwargs == {"num_heads": 4, "min_votes": 2}
    from hf_semspec.errors import SemSpecConfigError

    with pytest.raises(SemSpecConfigError, match=r"min_votes'\]` = 9"):
        methods.check_method_options(["dropmatch(min_votes=9)"], {}, None)


def test_end_to_end_two_slices_make_one_report(tmp_path):
    """Tiny models: two GSM8K slices without plain, rule variants and two draft-length entries, then the report."""
    write_tiny_data(tmp_path / "data")
    common = ["--data-dir", str(tmp_path / "data"), "--output-dir", str(tmp_path / "out"), "--limit", "0",
              "--gsm8k-max-new-tokens", "8", "--threads", "1", "--skip-stock", "--skip-plain",
              "--no-profile-breakdown", "--rules", "exact,dropmatch,dropmatch(min_votes=2)",
              "--draft-lengths", "constant,constant:2"]
    with thread_count_kept():
        first = run.main(common + ["--gsm8k-problems", "0:1", "--name", "slice-0"], load_pair=tiny_pair)
        run.main(common + ["--gsm8k-problems", "1:2", "--name", "slice-1"], load_pair=tiny_pair)
    assert [r["prompt_id"] for r in first["records"]] == ["gsm8k:0"] * 6
    assert "plain" not in {r["method"] for r in first["records"]}
    report = fidelity.main([str(tmp_path / "out" / "slice-0.json"), str(tmp_path / "out" / "slice-1.json"),
                            "--name", "fidelity-tiny", "--output-dir", str(tmp_path / "out")])
    assert report["baseline"] == "semspec:exact/constant"
    assert list(report["methods"]) == [
        "semspec:exact/constant", "semspec:exact/constant:2", "semspec:dropmatch/constant",
        "semspec:dropmatch/constant:2", "semspec:dropmatch(min_votes=2)/constant",
        "semspec:dropmatch(min_votes=2)/constant:2"]
    assert all(s["problems"] == 2 for s in report["methods"].values())
    assert report["methods"]["semspec:exact/constant:2"]["identical_to_baseline"] == 1.0  # exact stays plain's text
    stored = json.loads((tmp_path / "out" / "fidelity-tiny.json").read_text())
    assert stored["methods"].keys() == report["methods"].keys()
    assert "GSM8K fidelity against `semspec:exact/constant` (greedy)" in (tmp_path / "out" / "fidelity-tiny.md").read_text()


def test_sampling_temperature_and_top_p_reach_every_method(tmp_path):
    write_tiny_data(tmp_path / "data")
    pairs = []

    def recording_pair(name, **options):
        pairs.append(tiny_pair(name, **options))
        return pairs[-1]

    common = ["--data-dir", str(tmp_path / "data"), "--output-dir", str(tmp_path / "out"), "--limit", "0",
              "--gsm8k-problems", "0:1", "--gsm8k-max-new-tokens", "4", "--threads", "1", "--skip-stock",
              "--no-profile-breakdown", "--rules", "exact", "--temperature", "0.7", "--top-p", "0.9"]
    with pytest.raises(ValueError, match=r"--temperature 0.7 without --sample: greedy decoding ignores it"):
        run.main(common, load_pair=recording_pair)
    assert not pairs  # refused before loading any model
    with thread_count_kept():
        results = run.main(common + ["--sample", "--seed", "3"], load_pair=recording_pair)
    config = pairs[0].target.generation_config
    assert (config.temperature, config.top_p) == (0.7, 0.9)
    assert (results["config"]["temperature"], results["config"]["top_p"]) == (0.7, 0.9)
