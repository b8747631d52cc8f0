"""benchmarks/divergence.py: which logits row decided each token, the argmax contract of lossless greedy decoding, the
figures at a flip (worked numbers), and the whole script on tiny models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import tiny_llama

import hf_semspec
from benchmarks import data, divergence, methods
from benchmarks.divergence import Forward
from test_benchmark_harness import tiny_pair, write_tiny_data  # tiny models, fake tokenizer, data


def one_hot_rows(tokens: list[int], vocab: int = 8) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(tokens), vocab).float()


def test_each_position_takes_the_row_of_the_last_forward_that_fed_its_kept_token():
    # Prompt 5 6 7, then tokens 1 2 3 4. Prefill keeps only the last row (position 2, deciding 1). A verify forward
    # feeds 1 and drafts 2 9 at positions 3..5; 9 is rejected and 3 emitted from position 4's row. The next forward
    # feeds 3 4 at positions 5, 6.
    sequence = [5, 6, 7, 1, 2, 3, 4]
    forwards = [Forward(0, [5, 6, 7], one_hot_rows([1])),
                Forward(3, [1, 2, 9], one_hot_rows([2, 3, 0])),
                Forward(5, [3, 4], one_hot_rows([4, 6]))]
    rows = divergence.rows_by_position(forwards, sequence)
    assert sorted(rows) == [2, 3, 4, 5, 6]
    assert [int(rows[p].argmax()) for p in (2, 3, 4, 5)] == [1, 2, 3, 4]  # not the row computed after the rejected 9
    assert divergence.contract_breaches(sequence, 3, rows) == []
    # A draft that happens to equal the kept token after a rejected one was computed over the wrong prefix: no row.
    coincidence = [Forward(0, [5, 6, 7], one_hot_rows([1])), Forward(3, [1, 9, 3], one_hot_rows([2, 3, 4]))]
    assert sorted(divergence.rows_by_position(coincidence, sequence)) == [2, 3]
    # A position fed only with a token the sequence does not hold has no row: the recording is not of this sequence.
    with pytest.raises(ValueError, match=r"no recorded forward computed logits at position 5, .* Fix: record"):
        divergence.contract_breaches(sequence, 3, divergence.rows_by_position(forwards[:2], sequence))


def test_a_token_that_is_not_the_first_argmax_breaches_the_contract():
    sequence = [5, 1, 2]
    tied = torch.tensor([0.0, 3.0, 3.0, 1.0])  # tokens 1 and 2 tie: argmax is the first, 1
    rows = {0: tied, 1: tied}
    assert divergence.contract_breaches(sequence, 1, rows) == [2]
    assert divergence.contract_breaches([5, 1, 1], 1, rows) == []


def test_dtype_step_is_the_spacing_of_the_dtype_at_the_value():
    assert divergence.dtype_step(18.625, torch.bfloat16) == 0.125  # 2^4 · 2^-7
    assert divergence.dtype_step(-18.625, torch.bfloat16) == 0.125
    assert divergence.dtype_step(1.0, torch.float32) == 2.0 ** -23


def test_a_flip_is_within_rounding_only_when_both_gaps_fit_in_the_paths_difference_on_other_tokens():
    # The traced bf16 case (Spec-Bench 144): plain's step gives " which" 18.75 and " and" 18.625; the verify forward
    # gives both 18.625, and its first index on the tie is " and". On another token the two rows differ by 0.25.
    plain = torch.tensor([18.75, 18.625, 10.0, 5.0])
    method = torch.tensor([18.625, 18.625, 10.25, 5.0])
    figures = divergence.explain_flip(plain, method, 0, 1, torch.bfloat16)
    assert figures["plain_logits"] == [18.75, 18.625] and figures["method_logits"] == [18.625, 18.625]
    assert figures["gap_plain"] == 0.125 and figures["gap_method"] == 0.0
    assert figures["max_difference"] == 0.25 and figures["dtype_step"] == 0.125
    assert figures["within_rounding"]
    # The rows agree on every other token: nothing but a and b moved, which rounding does not explain.
    alone = divergence.explain_flip(torch.tensor([18.75, 18.625, 10.0]), torch.tensor([18.625, 18.75, 10.0]), 0, 1,
                                    torch.bfloat16)
    assert alone["max_difference"] == 0.0 and alone["gap_method"] == -0.125
    assert not alone["within_rounding"]
    # Plain's gap of 3 against differences of at most 0.5 elsewhere: decisive in plain's path.
    decisive = divergence.explain_flip(torch.tensor([20.0, 17.0, 10.0]), torch.tensor([19.5, 19.6, 10.5]), 0, 1,
                                       torch.bfloat16)
    assert decisive["gap_plain"] == 3.0 and decisive["max_difference"] == 0.5
    assert not decisive["within_rounding"]


def test_first_difference():
    assert divergence.first_difference([1, 2, 3], [1, 2, 4]) == 2
    assert divergence.first_difference([1, 2, 3], [1, 2, 3]) is None


def test_the_report_says_the_contract_broke_when_either_path_emitted_a_token_its_forward_did_not_rank_first():
    def row(breaches, plain_breaches):
        return {"category": "qa", "method": "semspec:exact/constant:3", "reproduced": True, "tokens_checked": 8,
                "breaches": breaches, "plain_breaches": plain_breaches, "first_difference": None}

    kept = [row([], [])]
    assert not divergence.broke_contract(kept[0])
    assert "Every generated token traced is the argmax" in "\n".join(divergence.report_lines("r", "bfloat16", kept, []))
    for broken in (row([3], []), row([], [5])):
        assert divergence.broke_contract(broken)
        text = "\n".join(divergence.report_lines("r", "bfloat16", kept + [broken], []))
        assert "**The contract broke** in 1 generation(s)" in text and "Every generated token" not in text


def _method(name, rule="exact", draft_length="constant", gamma=3, draft="draft"):
    return {"name": name, "kind": "semspec", "gamma": gamma, "rule": rule, "rule_kwargs": {},
            "draft_length": draft_length, "draft_length_kwargs": {}, "draft": draft}


OLD_RECORD = {"acceptance_stats": {"num_drafted": 6}}  # from a run before the stats kept each round's length
RECORD_WITH_ROUNDS = {"acceptance_stats": {"num_drafted": 6, "drafted_per_round": [4, 2, 0]}}


def test_lossless_methods_of_the_draft_are_traced_at_a_fixed_length_or_with_their_recorded_rounds():
    assert divergence.traceable(_method("semspec:exact/constant:3"), OLD_RECORD) is None
    assert divergence.traceable(_method("semspec:exact", draft_length=None), OLD_RECORD) is None
    tapout = _method("semspec:exact/tapout", draft_length="tapout", gamma=None)
    assert "did not keep its round lengths" in divergence.traceable(tapout, OLD_RECORD)
    assert divergence.traceable(tapout, RECORD_WITH_ROUNDS) is None
    assert "not lossless" in divergence.traceable(_method("semspec:fly/constant:3", rule="fly"), RECORD_WITH_ROUNDS)
    assert "pruned drafter" in divergence.traceable(_method("semspec:rdk/constant:3", rule="rdk", draft="pruned_draft"),
                                                    RECORD_WITH_ROUNDS)
    assert divergence.traceable({"name": "plain", "kind": "plain"}, {}) == "not hf_semspec's loop"


def test_a_learning_policys_generation_decodes_again_with_the_round_lengths_it_kept(tiny):
    # tapout learns from earlier prompts and the clock; its record's rounds, played back, give its forwards again.
    pair, inputs = tiny
    tapout = methods.Method("semspec:exact/tapout", "semspec", rule="exact", draft_length="tapout",
                            policy=methods.build_policy("tapout", None, 5))
    for _ in range(2):  # what it drafts on the second prompt depends on the first
        out = methods.generate(tapout, pair, inputs, 24, do_sample=False)
    recorded = out.acceptance_stats.drafted_per_round
    assert len(set(recorded)) > 1  # lengths a fixed γ would not give
    record = {"acceptance_stats": out.acceptance_stats.to_dict()}
    replay = divergence.run_method(_method("semspec:exact/tapout", draft_length="tapout", gamma=None),
                                   divergence.recorded_lengths(record))
    sequence, _, breaches, rounds = divergence.decode_and_record(replay, pair, inputs, 24, [])
    assert rounds == recorded and breaches == []
    assert sequence == out.sequences[0].tolist()
    # past the recorded rounds the playback drafts nothing (one-token steps), rather than guess
    policy, budgets = divergence.RecordedLengths([3, 1]), []
    for _ in range(3):
        budgets.append(policy.max_tokens())
        policy.observe(None)
    assert budgets == [3, 1, 0]


@pytest.fixture
def tiny():
    pair = tiny_pair("tiny")
    hf_semspec.attach(pair.target)
    return pair, pair.encode("Write a poem about the sea.")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_exact_keeps_the_contract_on_tiny_models(tiny, dtype):
    pair, inputs = tiny
    pair.target.to(dtype)
    pair.draft.to(dtype)
    plain, plain_rows, plain_breaches, no_rounds = divergence.decode_and_record(methods.Method("plain", "plain"), pair,
                                                                                inputs, 24, [])
    exact = divergence.run_method(_method("semspec:exact/constant:3"), divergence.recorded_lengths(OLD_RECORD))
    sequence, rows, breaches, rounds = divergence.decode_and_record(exact, pair, inputs, 24, [])
    assert no_rounds is None and rounds[0] == max(rounds) == 3  # γ = 3, less where max_length caps a round
    length = inputs["input_ids"].shape[1]
    assert len(sequence) == len(plain) == length + 24
    assert plain_breaches == [] and breaches == []  # in bf16 too, whatever the text
    assert set(range(length - 1, len(sequence) - 1)) <= set(rows)
    if dtype == torch.float32:
        # The rows are the verify forwards' own: in fp32 they match plain's steps to rounding, and so does the text.
        assert sequence == plain
        assert all(torch.allclose(rows[p], plain_rows[p], atol=1e-4) for p in range(length - 1, len(sequence) - 1))


def test_a_rule_that_keeps_non_argmax_drafts_breaches_the_contract(tiny):
    # EARS at β = 1 keeps a greedy draft x̂ with p(x̂) > max(2·max p − 1, 0): any draft where the target is unsure. The
    # unrelated draft proposes tokens the target does not rank first, and the check must catch them.
    pair, inputs = tiny
    pair.draft = tiny_llama(seed=1)
    lenient = methods.Method("semspec:ears/constant:3", "semspec", gamma=3, rule="ears", rule_kwargs={"beta": 1.0},
                             draft_length="constant")
    sequence, _, breaches, _ = divergence.decode_and_record(lenient, pair, inputs, 24, [])
    assert breaches and all(inputs["input_ids"].shape[1] <= m < len(sequence) for m in breaches)


def _run_file(tmp_path: Path, data_dir: Path) -> Path:
    methods_described = [{"name": "plain", "kind": "plain", "gamma": None, "rule": None, "rule_kwargs": {},
                          "draft_length": None, "draft_length_kwargs": {}, "draft": "draft"},
                         _method("semspec:exact/constant:3"), _method("semspec:fly/constant:3", rule="fly"),
                         _method("semspec:exact/tapout", draft_length="tapout", gamma=None),
                         _method("semspec:exact/heuristic", draft_length="heuristic", gamma=None)]

    def record(method, text, identical, rounds=None):
        return {"prompt_id": "specbench_question:1", "category": "writing", "method": method, "max_new_tokens": 12,
                "text": text, "identical_to_plain": identical,
                "acceptance_stats": None if rounds is None else {"drafted_per_round": rounds}}

    results = {"config": {"pair": "qwen", "sample": False, "prompts": None, "data_dir": str(data_dir)},
               "models": {"target_dtype": "float32", "draft_dtype": "float32"}, "methods": methods_described,
               "aggregates": {}, "records": [record("plain", "?", None),
                                             record("semspec:exact/constant:3", "a text from another machine", False),
                                             record("semspec:fly/constant:3", "?", False),
                                             record("semspec:exact/tapout", "?", False),
                                             record("semspec:exact/heuristic", "?", False, rounds=[1, 1])]}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(results))
    return path


def test_the_script_traces_what_it_can_and_names_what_it_cannot(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "specbench_question.jsonl").write_text(
        json.dumps({"question_id": 1, "category": "writing", "turns": ["Write a poem about the sea."]}) + "\n")
    run_file = _run_file(tmp_path, data_dir)
    code = divergence.main([str(run_file), "--output-dir", str(tmp_path / "out"), "--name", "d"], load_pair=tiny_pair)
    assert code == 0
    saved = json.loads((tmp_path / "out" / "d.json").read_text())
    traced, replayed = saved["traced"]
    # The tiny fp32 models give exact plain's text again, which is not the text the run file says: not reproduced.
    assert traced["method"] == "semspec:exact/constant:3" and traced["first_difference"] is None
    assert traced["reproduced"] is False and traced["breaches"] == [] and traced["tokens_checked"] == 12
    assert traced["rounds_replayed"] is False
    # heuristic kept its rounds: two of one draft each (1 or 2 tokens each), then one-token steps to 12 tokens, as the
    # playback does past the recorded rounds; more rounds than recorded, so not reproduced either
    assert replayed["method"] == "semspec:exact/heuristic" and replayed["rounds_replayed"] is True
    assert 2 + 12 - 4 <= replayed["rounds"] <= 2 + 12 - 2
    assert replayed["reproduced"] is False and replayed["breaches"] == [] and replayed["tokens_checked"] == 12
    assert {s["method"]: s["reason"].split(":")[0] for s in saved["not_traced"]} == {
        "semspec:fly/constant:3": "rule 'fly' is not lossless",
        "semspec:exact/tapout": "draft length 'tapout' depends on what the policy learned earlier in the run, and "
                                "the run did not keep its round lengths"}
    text = (tmp_path / "out" / "d.md").read_text()
    assert "| writing | `semspec:exact/constant:3` | no | 12 of 12 | none (same text now) |" in text
    assert "Every generated token traced is the argmax of the forward that decided it." in text


def must_not_load(*args, **kwargs):
    raise AssertionError("models were loaded before the run was checked")


def test_the_prompt_pool_holds_every_spec_bench_and_gsm8k_prompt_as_the_run_built_it(tmp_path):
    write_tiny_data(tmp_path)
    pool = divergence.prompts_of({"prompts": None}, tmp_path)
    assert sorted(pool) == ["gsm8k:0", "gsm8k:1"] + [f"specbench_question:{i}" for i in (1, 2, 3, 4)]
    for problem in data.load_gsm8k(tmp_path / data.GSM8K_FILE, 2, 0):
        assert pool[problem.prompt_id] == problem
    for question in data.load_question_prompts(tmp_path / data.SPECBENCH_FILE, 0):
        assert pool[question.prompt_id] == question


def test_the_script_refuses_a_sampled_run_before_loading_models(tmp_path, capsys):
    run_file = _run_file(tmp_path, tmp_path)
    results = json.loads(run_file.read_text())
    results["config"]["sample"] = True
    run_file.write_text(json.dumps(results))
    with pytest.raises(SystemExit) as exit_info:
        divergence.main([str(run_file)], load_pair=must_not_load)
    assert exit_info.value.code == 2
    assert "it sampled (--sample)" in capsys.readouterr().err


def test_the_script_refuses_prompts_missing_from_the_data_before_loading_models(tmp_path, capsys):
    (tmp_path / "specbench_question.jsonl").write_text(
        json.dumps({"question_id": 2, "category": "qa", "turns": ["Who?"]}) + "\n")
    with pytest.raises(SystemExit) as exit_info:
        divergence.main([str(_run_file(tmp_path, tmp_path))], load_pair=must_not_load)
    assert exit_info.value.code == 2
    assert "1 prompt(s) to trace are not in its data (e.g. ['specbench_question:1']). Fix: pass the run's data " \
        "folder with --data-dir." in " ".join(capsys.readouterr().err.split())


def test_a_run_with_nothing_to_trace_is_reported_without_loading_models(tmp_path):
    run_file = _run_file(tmp_path, tmp_path)
    results = json.loads(run_file.read_text())
    for record in results["records"]:
        record["identical_to_plain"] = None if record["method"] == "plain" else True
    run_file.write_text(json.dumps(results))
    (tmp_path / "specbench_question.jsonl").write_text("")
    assert divergence.main([str(run_file), "--output-dir", str(tmp_path / "out")], load_pair=must_not_load) == 0
    text = (tmp_path / "out" / "divergence-run.md").read_text()
    assert "No greedy record of a lossless rule that can be traced differs from plain's." in text
    assert "Not traced" not in text and "argmax of the forward" not in text
