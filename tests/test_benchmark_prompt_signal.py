"""The per-prompt signal of benchmarks/prompt_signal.py: the user message's span, the draft's hits on it, Spearman's ρ
and the per-prompt gain of a long fixed length, on worked numbers (no model)."""

import math

import pytest
import torch

from benchmarks import prompt_signal

LONG, SHORT = "semspec:fly/constant:16", "semspec:fly/constant:3"


def test_user_span_leaves_out_the_template_head_and_tail():
    empty = [1, 2, 3, 8, 9]  # head 1 2 3, tail 8 9
    assert prompt_signal.user_span([1, 2, 3, 10, 11, 8, 9], empty) == (3, 5)
    # A message that ends like the tail: the tail stops where the two stop matching from the end.
    assert prompt_signal.user_span([1, 2, 3, 10, 9, 8, 9], empty) == (3, 5)


def test_user_span_of_an_empty_message_is_an_error():
    with pytest.raises(ValueError, match="no user message"):
        prompt_signal.user_span([1, 2, 3, 8, 9], [1, 2, 3, 8, 9])


def test_hits_and_agreement_on_worked_logits():
    ids = torch.tensor([5, 0, 1, 2, 3])  # message = ids[1:4] = 0 1 2
    greedy = [0, 1, 3, 3, 0]  # predictions at positions 0..4: position j − 1 predicts ids[j]
    draft = torch.nn.functional.one_hot(torch.tensor(greedy), 4).float()
    target = torch.nn.functional.one_hot(torch.tensor([0, 2, 3, 3, 0]), 4).float()
    # ids[1] = 0 ← 0 ✓, ids[2] = 1 ← 1 ✓, ids[3] = 2 ← 3 ✗.
    assert prompt_signal.predicted_right(draft, ids, 1, 4).tolist() == [True, True, False]
    # Positions 0, 1, 2: draft 0 1 3, target 0 2 3.
    assert prompt_signal.same_prediction(draft, target, 1, 4).tolist() == [True, False, True]


def test_spearman_on_worked_ranks():
    assert prompt_signal.ranks([10.0, 30.0, 20.0, 20.0]) == [1.0, 4.0, 2.5, 2.5]
    assert prompt_signal.spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)  # 1 − 6·2 / (4·15)
    assert prompt_signal.spearman([1, 2, 3], [9, 5, 1]) == pytest.approx(-1.0)
    assert math.isnan(prompt_signal.spearman([1, 2, 3], [4, 4, 4]))
    with pytest.raises(ValueError, match="same length"):
        prompt_signal.spearman([1, 2], [1])


def _results(records):
    return {"aggregates": {"cost_model": {"seconds_per_target_forward": 1.0, "seconds_per_draft_forward": 0.1}},
            "records": records}


def _record(prompt, method, forwards, drafted):
    return {"prompt_id": prompt, "category": "math", "method": method, "new_tokens": 64, "target_forwards": forwards,
            "draft_forwards": drafted}


def test_gain_is_the_modeled_speed_ratio_of_the_two_lengths():
    results = _results([_record("p", LONG, 8, 112), _record("p", SHORT, 20, 60), _record("q", SHORT, 20, 60)])
    # 64 / (8 + 11.2) over 64 / (20 + 6) = 26 / 19.2; q lacks the long length and is left out.
    assert prompt_signal.gains(results, LONG, SHORT) == {"p": {"category": "math", "gain": pytest.approx(26 / 19.2)}}


def test_gain_of_a_run_without_the_method_names_it():
    with pytest.raises(ValueError, match="constant:16.*--long"):
        prompt_signal.gains(_results([_record("p", SHORT, 20, 60)]), LONG, SHORT)


def test_gain_of_a_run_without_a_cost_model_says_so():
    # No stored cost model, and records without acceptance statistics cannot be fitted (metrics.fit_round_costs).
    results = {"aggregates": {}, "records": [_record("p", LONG, 8, 112), _record("p", SHORT, 20, 60)]}
    with pytest.raises(ValueError, match="no cost model"):
        prompt_signal.gains(results, LONG, SHORT)


def test_a_prompt_in_two_runs_counts_once_with_its_first_run():
    rows = [{"prompt_id": "p", "run": "a", "gain": 2.0}, {"prompt_id": "q", "run": "a", "gain": 1.0},
            {"prompt_id": "p", "run": "b", "gain": 0.5}]
    assert prompt_signal.first_of_each_prompt(rows) == rows[:2]


TAPOUT = "semspec:fly/tapout"


def test_splice_takes_the_long_length_above_the_cut_and_the_policy_below():
    # p: hit above the cut, takes 4; q: below, 2; r: above, where the long length loses, 1.
    values = {LONG: {"p": 4.0, "q": 1.5, "r": 1.0}, SHORT: {"p": 2.0, "q": 2.0, "r": 3.0},
              TAPOUT: {"p": 3.0, "q": 2.0, "r": 2.0}}
    categories = {"p": "math", "q": "math", "r": "qa"}
    rows = prompt_signal.splice(values, categories, {"p": 0.6, "q": 0.2, "r": 0.5}, 0.4, LONG, TAPOUT, [SHORT, LONG])
    # math: the best fixed length is LONG (√6 against √4); qa: SHORT; overall: SHORT (∛12 against ∛6).
    assert rows == [
        {"category": "math", "prompts": 2, "best_fixed": LONG, "below": pytest.approx(1.0),
         "splice": pytest.approx(math.sqrt(4 * 2) / math.sqrt(6))},
        {"category": "qa", "prompts": 1, "best_fixed": SHORT, "below": pytest.approx(2 / 3),
         "splice": pytest.approx(1 / 3)},
        {"category": "overall", "prompts": 3, "best_fixed": SHORT, "below": pytest.approx(1.0),
         "splice": pytest.approx((4 * 2 * 1 / 12) ** (1 / 3))},
    ]


def test_cut_section_counts_each_side_and_splices_the_run():
    records = [_record("p", LONG, 8, 112), _record("p", SHORT, 20, 60), _record("p", TAPOUT, 12, 40),
               _record("q", LONG, 30, 160), _record("q", SHORT, 20, 60), _record("q", TAPOUT, 20, 50)]
    methods = [{"name": name, "rule": "fly", "draft_length": name.split("/")[1].split(":")[0]}
               for name in (LONG, SHORT, TAPOUT)]
    runs = {"a.json": {**_results(records), "methods": methods}}
    gain = prompt_signal.gains(runs["a.json"], LONG, SHORT)
    rows = [{"prompt_id": p, "run": "a.json", "hit": hit, **gain[p]} for p, hit in [("p", 0.6), ("q", 0.2)]]
    lines = prompt_signal.cut_section(runs, rows, 0.4, LONG, TAPOUT)
    assert "| above | 1 | 1 |" in lines and "| at or below | 1 | 0 |" in lines  # p gains from γ = 16, q does not
    # Speeds at 1 s a forward and 0.1 s a draft: p takes LONG's 64 / 19.2, q TAPOUT's 64 / 25; the best fixed length
    # overall is SHORT at 64 / 26 on both (LONG: √(64/19.2 · 64/46)); TAPOUT alone: √(64/16 · 64/25).
    splice = math.sqrt(64 / 19.2 * 64 / 25) / (64 / 26)
    tapout = math.sqrt(64 / 16 * 64 / 25) / (64 / 26)
    assert f"| overall | 2 | `{SHORT}` | {tapout:.2f} | {splice:.2f} |" in lines


def test_splice_of_a_prompt_without_a_method_names_both():
    values = {LONG: {"p": 4.0}, SHORT: {"p": 2.0}}
    with pytest.raises(ValueError, match="prompt p has no semspec:fly/tapout"):
        prompt_signal.splice(values, {"p": "math"}, {"p": 0.6}, 0.4, LONG, TAPOUT, [SHORT, LONG])


def test_two_runs_of_one_file_name_are_refused_before_any_model_loads(tmp_path, monkeypatch, capsys):
    # Runs are keyed by file name: the second would have replaced the first and its prompts gone uncounted.
    paths = []
    for folder in ("first", "second"):
        (tmp_path / folder).mkdir()
        paths.append(tmp_path / folder / "sweep.json")
        paths[-1].write_text("{}", encoding="utf-8")
    monkeypatch.setattr(prompt_signal, "load_pair", lambda *a, **k: pytest.fail("loaded models before the check"))
    with pytest.raises(SystemExit) as exit_info:
        prompt_signal.main([str(p) for p in paths])
    assert exit_info.value.code == 2
    assert "runs: two files named 'sweep.json'. Fix: give the runs distinct file names" in capsys.readouterr().err
