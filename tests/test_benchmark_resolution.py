"""How the draft-length comparisons are read: benchmarks/resolution.py (fixed-length references, standard errors)
and benchmarks/verify_cost.py (pricing a generation by the lengths of its rounds)."""

import json
import math

import pytest

from benchmarks import anchored, metrics, report, resolution, verify_cost

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
    # Against constant:3, best over all prompts: a 1.00 >= 0.97 · 0.874, b 1.00 >= 0.97 · 1.00.
    assert "Within 3% of the one length best over all prompts (`constant:3`): `tapout` 2 of 2." in text
    # tapout at 1 tok/s on p1: (1 · 2 · 2 / 12)^(1/3) = 0.69 < 0.97 · 0.79 on a.
    slower = {**SPEEDS, "p1": ("a", 2.0, 4.0, 1.0)}
    text = "\n".join(resolution.section(_methods(), _records(slower), COSTS))
    assert "| a | 3 | `constant:8` | 0.79 | 0.87 | 1.19 | 0.69 ± 0." in text
    assert "Within 3% of the length tuned on the other prompts: `tapout` 0 of 1." in text
    assert "Within 3% of the one length best over all prompts (`constant:3`): `tapout` 1 of 2." in text  # 0.69 < 0.85
    # tapout at 2.5 tok/s on p1: (2.5 · 2 · 2 / 12)^(1/3) = 0.941 on a: short of a's best length, not of constant:3's.
    text = "\n".join(resolution.section(_methods(), _records({**SPEEDS, "p1": ("a", 2.0, 4.0, 2.5)}), COSTS))
    assert "`tapout` 1 of 2. Within 3% of the length tuned" in text
    assert "Within 3% of the one length best over all prompts (`constant:3`): `tapout` 2 of 2." in text
    # One prompt a category (the quick profile's runs): no leave-one-out and no errors, but the one length best over
    # all prompts is still a reference. p1: constant:3 2, constant:8 4, tapout 3; q1: 3, 1, 3. Over both, constant:3
    # (sqrt(6) > sqrt(4)) is best overall; tapout is 3 / 2 = 1.5 of it on a and 1.00 on b, but 0.75 of a's best.
    single = {p: v for p, v in SPEEDS.items() if p in ("p1", "q1")}
    text = "\n".join(resolution.section(_methods(), _records(single), COSTS))
    assert "`fly` has one prompt a category" in text
    assert "| a | 1 | `constant:8` | – | 0.50 | 1.00 | 0.75 |" in text
    assert "Categories within 3% of their best fixed length: best overall 1 of 2, each prompt's best 2 of 2, " \
           "`tapout` 1 of 2. Within 3% of the one length best over all prompts (`constant:3`): `tapout` 2 of 2." in text
    assert "tuned on the other prompts 0 of 0" not in text and "Median standard error" not in text
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
    assert "priced at 1.000 s per target forward + 0.000 s per drafted token." in (tmp_path / "pooled.md").read_text()
    # Replays priced by length (replay.py --verify-cost) pool alike: every round drafted nothing, v(0) = 1 s, so the
    # same table, and the header names the measurement.
    per_length = {"verify_seconds": {"0": 1.0}, "seconds_per_draft_forward": 0.0, "cached_tokens": 51,
                  "source": "verify.json"}
    for path, results in zip(paths, (first, second)):
        records = [{**r, "rounds_by_length": {"0": r["target_forwards"]}} for r in results["records"]]
        path.with_name(f"by_length_{path.name}").write_text(
            json.dumps({**results, "costs": per_length, "records": records}), encoding="utf-8")
    resolution.main([str(p.with_name(f"by_length_{p.name}")) for p in paths]
                    + ["--name", "pooled_by_length", "--output-dir", str(tmp_path)])
    text = (tmp_path / "pooled_by_length.md").read_text()
    assert ("priced at per-length costs measured in `verify.json` (51 cached tokens): v(k) + 0.000 s per drafted "
            "token (v(0) = 1.000 s).") in text
    assert "| a | 3 | `constant:8` | 0.79 | 0.87 | 1.19 | 1.00 ± 0.26 |" in text
    with pytest.raises(ValueError, match=r"run0.json: prompts \['p1', 'q1'\] are already in an earlier file"):
        resolution.pool([paths[0], paths[0]])
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**second, "methods": _methods()[:3]}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"other.json: its methods .* are not those of .*run0.json"):
        resolution.pool([paths[0], other])
    # The same names run with other options, or replayed in another setting, are another experiment: refused.
    changed = [{**m, "draft_length_config": {"bandit": "ucb1"}} if m["name"].endswith("tapout") else m
               for m in _methods()]
    other.write_text(json.dumps({**second, "methods": changed}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"other.json: its setting differs .*'methods': \{'semspec:fly/tapout': "
                                         r"\{'draft_length_config': \(None, \{'bandit': 'ucb1'\}\)\}\}"):
        resolution.pool([paths[0], other])
    # As merge compares them: the rule's options too, and the run's sampling (they were pooled as one experiment).
    changed = [{**m, "rule_kwargs": {"window": 1}} if m["rule"] == "fly" else m for m in _methods()]
    other.write_text(json.dumps({**second, "methods": changed}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"its setting differs .*'semspec:fly/constant:3': \{'rule_kwargs': "
                                         r"\(None, \{'window': 1\}\)\}"):
        resolution.pool([paths[0], other])
    other.write_text(json.dumps({**second, "config": {"sample": True}}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"its setting differs .*'sample': \(False, True\)"):
        resolution.pool([paths[0], other])
    # Records decoded with other budgets, or a draft in another dtype, are another experiment too.
    other.write_text(json.dumps({**second, "records": [{**r, "max_new_tokens": 256} for r in second["records"]]}),
                     encoding="utf-8")
    with_budget = tmp_path / "with_budget.json"
    with_budget.write_text(json.dumps({**first, "records": [{**r, "max_new_tokens": 64} for r in first["records"]]}),
                           encoding="utf-8")
    with pytest.raises(ValueError, match=r"its setting differs .*'max_new_tokens \(a\)': \(\[64\], \[256\]\)"):
        resolution.pool([with_budget, other])
    other.write_text(json.dumps({**second, "models": {"draft_dtype": "float32"}}), encoding="utf-8")
    with_budget.write_text(json.dumps({**first, "models": {"draft_dtype": "bfloat16"}}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"its setting differs .*'draft_dtype': \('bfloat16', 'float32'\)"):
        resolution.pool([with_budget, other])
    replays = []
    for path, results, state, cost in zip(paths, (first, second), ("run", "category"), (1.0, 1.0 + 1e-15)):
        replays.append(path.with_name(f"replay_{path.name}"))
        replays[-1].write_text(json.dumps({**results, "round_time_noise": 0.0, "seed": 0, "seeds": 1,
                                           "policy_state": state,
                                           "costs": {**COSTS, "seconds_per_target_forward": cost}}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"its setting differs .*\{'policy_state': \('run', 'category'\)\}"):
        resolution.pool(replays)
    replays[1].write_text(json.dumps({**json.loads(replays[1].read_text()), "policy_state": "run"}), encoding="utf-8")
    assert len(resolution.pool(replays)[1]) == len(first["records"] + second["records"])  # costs equal to 9 digits


# benchmarks/verify_cost.py: pricing a generation by its rounds' lengths.


def test_rounds_by_length_reads_the_per_position_counts():
    # 5 rounds drafted position 1, 3 position 2, 3 position 3, 1 position 4: 2 rounds of k = 1, 2 of k = 3, 1 of
    # k = 4; 6 target forwards, so one round drafted nothing.
    record = {"target_forwards": 6, "draft_forwards": 12,
              "acceptance_stats": {"drafted_per_position": [5, 3, 3, 1]}}
    assert metrics.rounds_by_length(record) == {1: 2, 3: 2, 4: 1, 0: 1}
    assert metrics.rounds_by_length({"target_forwards": 9, "acceptance_stats": None}) == {0: 9}  # plain
    assert metrics.rounds_by_length({"rounds_by_length": {"2": 3}}) == {2: 3}  # a replayed record's, keys from JSON
    # 1·v(0) + 2·v(1) + 2·v(3) + 1·v(4) + 12 drafts · 0.1 = 0.5 + 1.2 + 1.4 + 0.8 + 1.2.
    costs = {"verify_seconds": {0: 0.5, 1: 0.6, 2: 0.9, 3: 0.7, 4: 0.8}, "seconds_per_draft_forward": 0.1}
    assert metrics.modeled_seconds(record, costs) == pytest.approx(5.1)
    assert metrics.round_seconds(costs, 2) == pytest.approx(0.9 + 2 * 0.1)
    assert metrics.round_seconds({"seconds_per_target_forward": 1.0, "seconds_per_draft_forward": 0.1}, 2) == 1.2
    short = {**costs, "verify_seconds": {k: v for k, v in costs["verify_seconds"].items() if k < 4}}
    with pytest.raises(ValueError, match=r"no verify time measured for k = \[4\] .*\(measured up to 3\).*--max-k"):
        metrics.modeled_seconds(record, short)
    with pytest.raises(ValueError, match=r"k = \[7\]"):
        metrics.round_seconds(short, 7)


def test_reprice_ranks_by_the_per_length_cost():
    # Two fixed lengths and a policy on one prompt, 60 new tokens each. By the line (1 s per forward, 0.1 per
    # draft): constant:3 makes 20 rounds of 3 (26 s), constant:8 10 rounds of 8 (18 s), the policy 15 rounds of 2
    # (18 s): the policy ties constant:8. By length, a 3-token forward (k = 2) costing 2 s and the others 1 s:
    # constant:3 26 s, constant:8 18 s, the policy 15·2 + 3 = 33 s: 18 / 33 of the best.
    def record(method, rounds, k):
        return {"prompt_id": "p", "category": "c", "method": method, "new_tokens": 60, "target_forwards": rounds,
                "draft_forwards": rounds * k, "acceptance_stats": {"drafted_per_position": [rounds] * k}}

    results = {"methods": [{"name": n, "rule": "fly", "draft_length": n.split("/")[1].split(":")[0]}
                           for n in ("semspec:fly/constant:3", "semspec:fly/constant:8", "semspec:fly/tapout")],
               "records": [record("semspec:fly/constant:3", 20, 3), record("semspec:fly/constant:8", 10, 8),
                           record("semspec:fly/tapout", 15, 2)],
               "aggregates": {"cost_model": {"seconds_per_target_forward": 1.0, "seconds_per_draft_forward": 0.1}}}
    verify = {k: 1.0 for k in range(9)} | {2: 2.0}
    rows = verify_cost.reprice(results, verify, 0.1)["fly"]["rows"]
    label, best_linear, best_length, ratios = rows[0]
    assert (label, best_linear, best_length) == ("overall", "semspec:fly/constant:8", "semspec:fly/constant:8")
    assert ratios["semspec:fly/tapout"] == pytest.approx((1.0, 18 / 33))


# benchmarks/anchored.py: measured speed over an anchor of the same run.


def test_over_anchor_divides_by_the_anchor_on_the_same_prompt_and_run(tmp_path):
    def run(speeds):
        return {"records": [{"prompt_id": p, "method": m, "tokens_per_s": v}
                            for m, by_prompt in speeds.items() for p, v in by_prompt.items()]}

    policy = "semspec:fly/cost_aware(flip_prior=0.5)"  # a name with "=" in it, as options give
    first = run({"semspec:fly/constant:3": {"p1": 2.0, "p2": 4.0}, policy: {"p1": 3.0, "p2": 4.0}})
    second = run({"semspec:fly/constant:3": {"p3": 1.0}, policy: {"p3": 1.5}})  # a slower machine
    assert anchored.over_anchor(first, policy, "semspec:fly/constant:3") == {"p1": 1.5, "p2": 1.0}
    with pytest.raises(ValueError, match=r"no records of 'semspec:fly/svip' in this run .*'semspec:fly/cost_aware"):
        anchored.over_anchor(first, "semspec:fly/svip", "semspec:fly/constant:3")
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, results in zip(paths, (first, second)):
        path.write_text(json.dumps(results), encoding="utf-8")
    summary = anchored.main(["--anchor", "semspec:fly/constant:3", "--name", "anchored", "--output-dir",
                             str(tmp_path), "--runs", f"cost_aware(flip_prior=0.5)@abc1234={paths[0]},{paths[1]}"])
    entry = summary["methods"]["cost_aware(flip_prior=0.5)@abc1234"]
    assert entry["method"] == policy
    # Over all three prompts: (1.5 · 1.0 · 1.5)^(1/3).
    assert entry["prompts"] == 3 and entry["geomean"] == pytest.approx(2.25 ** (1 / 3))
    table = (tmp_path / "anchored.md").read_text()
    assert "| `cost_aware(flip_prior=0.5)@abc1234` | 1.225 (2) / 1.500 (1) | 1.310 (3) |" in table
    with pytest.raises(ValueError, match=r"--runs: got 'tapout'; expected LABEL=FILE"):
        anchored.main(["--anchor", "semspec:fly/constant:3", "--name", "x", "--runs", "tapout"])
    # A merge holds the added run's records of the policy next to the base run's of the anchor: refused.
    merged = {**first, "merged": {"base": "a.json", "added": "b.json"}}
    with pytest.raises(ValueError, match=r"a merge of runs \(a.json \+ b.json\).*Fix: pass the runs it merges"):
        anchored.over_anchor(merged, policy, "semspec:fly/constant:3")
    # Two files of one name: the second replaced the first (2 prompts counted instead of 4). Refused.
    (tmp_path / "copy").mkdir()
    same_name = tmp_path / "copy" / "a.json"
    same_name.write_text(json.dumps(second), encoding="utf-8")
    with pytest.raises(ValueError, match=r"--runs 'cost_aware\(flip_prior=0.5\)': two files named 'a.json'\. Fix: "):
        anchored.main(["--anchor", "semspec:fly/constant:3", "--name", "x", "--output-dir", str(tmp_path),
                       "--runs", f"cost_aware(flip_prior=0.5)={paths[0]},{same_name}"])
    # A run whose anchor made other forwards (other rule options, sampling) is another experiment. Refused.
    anchor_method = {"name": "semspec:fly/constant:3", "rule": "fly", "rule_kwargs": {}}
    for change, message in (({"methods": [{**anchor_method, "rule_kwargs": {"window": 1}}]}, r"constant:3 options"),
                            ({"methods": [anchor_method], "config": {"sample": True}}, r"'--sample': \(False, True\)")):
        paths[0].write_text(json.dumps({**first, "methods": [anchor_method]}), encoding="utf-8")
        paths[1].write_text(json.dumps({**second, **change}), encoding="utf-8")
        with pytest.raises(ValueError, match=rf"b.json: not the same experiment as .*a.json .*{message}"):
            anchored.main(["--anchor", "semspec:fly/constant:3", "--name", "x", "--output-dir", str(tmp_path),
                           "--runs", f"cost_aware(flip_prior=0.5)={paths[0]},{paths[1]}"])
    # One label over two runs whose policy of that name had other options (a bandit, say): two methods. Refused.
    measured = {"name": policy, "rule": "fly", "draft_length": "cost_aware", "draft_length_config": {"flip_prior": 0.5}}
    other = {**measured, "draft_length_config": {"flip_prior": 0.5, "calibration_discount": 0.98}}
    paths[0].write_text(json.dumps({**first, "methods": [anchor_method, measured]}), encoding="utf-8")
    paths[1].write_text(json.dumps({**second, "methods": [anchor_method, other]}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"b.json: semspec:fly/cost_aware\(flip_prior=0.5\) is not the method of "
                                          r".*a.json that --runs 'cost_aware\(flip_prior=0.5\)' pools .*"
                                          r"'draft_length_config'.*Fix: give each configuration its own label"):
        anchored.main(["--anchor", "semspec:fly/constant:3", "--name", "x", "--output-dir", str(tmp_path),
                       "--runs", f"cost_aware(flip_prior=0.5)={paths[0]},{paths[1]}"])
    paths[1].write_text(json.dumps({**second, "methods": [anchor_method, measured]}), encoding="utf-8")
    assert anchored.main(["--anchor", "semspec:fly/constant:3", "--name", "x", "--output-dir", str(tmp_path),
                          "--runs", f"cost_aware(flip_prior=0.5)={paths[0]},{paths[1]}"])["methods"]


def test_fitted_line_goes_through_the_lengths_the_rounds_drafted():
    # One round of k = 0 (plain) and one of k = 2: the line through v(0) = 1 and v(2) = 5, whatever v(1) is.
    records = [{"target_forwards": 1, "acceptance_stats": None},
               {"target_forwards": 1, "acceptance_stats": {"drafted_per_position": [1, 1]}}]
    line = verify_cost.fitted_line({0: 1.0, 1: 9.0, 2: 5.0}, records)
    assert line == pytest.approx({0: 1.0, 1: 3.0, 2: 5.0})


def test_verify_cost_refuses_measuring_options_with_a_reused_measurement(tmp_path, capsys):
    # They were accepted and ignored, and the report said the current thread count, not the measurement's.
    with pytest.raises(SystemExit):
        verify_cost.main(["--measured", str(tmp_path / "m.json"), "--threads", "1", "--max-k", "40"])
    assert "re-uses that measurement, so --max-k, --threads would not apply" in capsys.readouterr().err
