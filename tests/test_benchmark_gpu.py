"""benchmarks/gpu.py, run end to end on tiny random models on the CPU (compiled with the cheap `aot_eager` backend):
what a GPU session runs, so that it works the first time a GPU is lent."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import gpu

GAMMA = 3


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu")
    results = gpu.main([
        "--target", "tiny", "--draft", "tiny", "--device", "cpu", "--dtype", "float32", "--compile-backend",
        "aot_eager", "--compile-mode", "none", "--new-tokens", "12", "--prompt-length", "8", "--repeats", "1",
        "--gamma", str(GAMMA), "--gammas", "1,3,4", "--batch-sizes", "2", "--compiled-batch-sizes", "1,2",
        "--batch-new-tokens", "8", "--rules", "dropmatch,exact,fly", "--parts", "eager,batched,compiled,mla",
        "--mla-k", "4", "--output-dir", str(out), "--name", "smoke",
    ])
    return results, out


@pytest.mark.slow
def test_every_section_is_written(smoke_run):
    results, out = smoke_run
    saved = json.loads((out / "smoke.json").read_text())
    assert set(saved) >= {"setup", "machine", "costs", "live", "modeled", "batched"}
    text = (out / "smoke.md").read_text()
    for heading in ("## Costs (ms)", "## Live", "## Modeled at the reference pair's acceptance: spec-bench",
                    "## Batched", "## Warm-up (s)", "## Multi-level drafting (modeled)"):
        assert heading in text
    assert set(results["costs"]["verification"]) == {"dropmatch", "exact", "fly"}
    assert sorted(results["costs"]["verify_eager"]) == [1, 3, 4] and list(results["costs"]["verify_compiled"]) == [GAMMA]
    # the report renders the same from the JSON read back (string γ keys) as from the run's own dict
    assert gpu.render(saved) == text


@pytest.mark.slow
def test_compiled_costs_are_read_from_the_live_run(smoke_run):
    results, _ = smoke_run
    exact = next(r for r in results["live"] if r["rule"] == "exact" and r["compiled"])
    # `exact`'s compiled forwards (not the first rule's: `dropmatch` keeps its target forward eager), timed inside its
    # run: the draft's rounds of γ steps (a step: a γ-th of one), verify forwards of γ + 1
    assert exact["draft_round_ms"] > 0 and exact["verify_ms"] > 0
    assert exact["draft_step_ms"] == pytest.approx(exact["draft_round_ms"] / GAMMA)
    assert results["costs"]["draft_step_compiled"] == exact["draft_step_ms"]
    assert results["costs"]["verify_compiled"][GAMMA] == exact["verify_ms"]
    # its host time is the round less the device time of the forwards it made and the verification
    assert exact["forward_ms_per_round"] > GAMMA * exact["draft_step_ms"]
    expected = exact["round_ms"] - exact["forward_ms_per_round"] - results["costs"]["verification"]["exact"]
    assert exact["overhead_ms"] == pytest.approx(expected)


@pytest.mark.slow
def test_the_live_runs_cover_every_method(smoke_run):
    results, _ = smoke_run
    seen = {(r["method"], r["rule"], r["compiled"], r.get("draft")) for r in results["live"]}
    assert {("plain", None, False, None), ("plain", None, True, None), ("stock", None, False, "target's weights")} <= seen
    for rule in ("exact", "fly"):
        assert ("semspec", rule, False, "target's weights") in seen
        assert ("semspec", rule, True, "independent") in seen
    for record in results["live"]:
        if record.get("draft") == "target's weights" and record["method"] != "plain":  # stock too
            # the target drafting for itself: (nearly) every draft accepted, so a round makes about γ + 1 tokens
            assert record["tau"] > GAMMA


@pytest.mark.slow
def test_every_live_record_keeps_the_contract(smoke_run):
    """What the next GPU session reads: every live record has compiled, batch_size, rule and alpha; speculative runs
    tau; every compiled speculative run, batched ones too, overhead_ms."""
    results, _ = smoke_run
    gpu.check_live_records(results["live"])
    for record in results["live"]:
        assert {"compiled", "batch_size", "rule", "alpha", "first_call_s"} <= set(record)
        assert (record["rule"] is None) == (record["method"] in ("plain", "stock"))
        if record["method"] != "plain":
            assert record["tau"] >= 1
        if record["compiled"] and record["method"] != "plain":
            assert isinstance(record["overhead_ms"], float)
    with pytest.raises(ValueError, match=r"live\[0\].*missing \['overhead_ms'\]"):
        gpu.check_live_records([{"method": "semspec", "rule": "exact", "compiled": True, "batch_size": 2,
                                 "alpha": "1", "tau": 4.0}])


@pytest.mark.slow
def test_compiled_batches_and_alpha_one_run_live(smoke_run):
    results, _ = smoke_run
    compiled = [r for r in results["live"] if r["compiled"]]
    for batch_size in (1, 2):
        seen = {(r["method"], r["rule"], r["alpha"]) for r in compiled if r["batch_size"] == batch_size}
        assert {("plain", None, None), ("semspec", "exact", "independent"), ("plain", None, "1"),
                ("semspec", "exact", "1")} <= seen
    for record in compiled:
        if record["alpha"] == "1" and record["method"] == "semspec":
            # both final norms zeroed: every draft right, so each round makes γ + 1 tokens (12 and 8 new tokens are
            # whole rounds at γ = 3), and every row's text is plain decoding's (all token 0)
            assert record["tau"] == pytest.approx(GAMMA + 1)
            assert record["agrees_with_plain"] == 1.0
    batched = [r for r in compiled if r["batch_size"] > 1 and r["method"] == "semspec"]
    assert batched and all("overhead_ms" in r for r in batched)
    assert set(results["verification_by_batch"]) == {1, 2}


@pytest.mark.slow
def test_warm_up_and_graphs_are_recorded(smoke_run):
    results, _ = smoke_run
    warmup = results["warmup"]
    assert warmup["plain"]["rule"] is None and warmup["speculative"]["rule"] == "exact"
    assert warmup["plain"]["warmup_s"] > 0 and warmup["speculative"]["warmup_s"] > 0
    assert warmup["ratio"] == pytest.approx(warmup["speculative"]["warmup_s"] / warmup["plain"]["warmup_s"])
    # plain decoding compiles the target's step; the first speculative call the draft's round, the verify forward
    # and the verification
    assert warmup["plain"]["graphs_compiled"] >= 1 and warmup["speculative"]["graphs_compiled"] >= 3
    assert {g["what"] for g in results["graph_plan"]} >= {"draft round", "verification"}
    plan = results["graph_plan"]
    assert len([g for g in plan if g["batch_size"] == 1 and g["what"] != "multi-level drafting's forward"]) == 4
    assert len(plan) == 4 + 4 + 1  # batch 1, batch 2, the MLA forward
    assert results["graphs_compiled"] >= 1 and results["skipped"] == []


@pytest.mark.slow
def test_a_compiled_rounds_host_time_is_split_by_the_loops_ranges(smoke_run):
    results, out = smoke_run
    host = results["host_breakdown"]
    names = {"draft", "target_forward", "logits_processors", "verify", "sync", "rest"}
    assert set(host["ms_per_round"]) == names and host["rounds"] > 1
    # every range ran in every round (the draft, the verify forward, the verification, the round's read)
    assert all(host["ms_per_round"][name] > 0 for name in ("draft", "target_forward", "verify", "sync"))
    assert sum(host["ms_per_round"].values()) == pytest.approx(host["wall_ms_per_round"], rel=1e-6)
    # three compiled calls a round: the draft's round (its γ steps in one graph), the verify forward and the
    # verification (eager in the last rounds, which max_new_tokens cuts short); the host's work between rounds
    assert 2 < host["compiled_calls_per_round"] <= 3
    assert host["launches_per_round"]["verify"] > 0 and host["between_rounds_ms"] > 0
    assert "## Host time of a compiled round" in (out / "smoke.md").read_text()


@pytest.mark.slow
def test_multi_level_drafting_is_modeled_from_its_forward(smoke_run):
    results, _ = smoke_run
    mla = results["mla_modeled"]
    assert mla["k"] == 4 and mla["forward_tokens"] == 5 and mla["draft_forward_ms"] > 0
    assert mla["draft_ms_per_drafted_token"] == pytest.approx(0.5 * mla["draft_forward_ms"])
    costs = results["costs"]
    exact = next(r for r in results["live"] if r["rule"] == "exact" and r["compiled"] and r["batch_size"] == 1
                 and r["alpha"] == "independent")
    reference = json.loads(gpu.DEFAULT_ACCEPTANCE.read_text())["sets"]["gsm8k"]["per_position_acceptance"]
    gamma = 2
    round_ms = (gamma * 0.5 * mla["draft_forward_ms"] + costs["verify_compiled"][GAMMA]
                + costs["verification"]["exact"] + max(exact["overhead_ms"], 0.0))
    entry = mla["sets"]["gsm8k"]
    assert entry["tokens_per_s"][gamma] == pytest.approx((1 + sum(reference[:gamma])) * 1e3 / round_ms)
    assert entry["best"]["tokens_per_s"] == max(entry["tokens_per_s"].values())


@pytest.mark.slow
def test_a_group_past_the_budget_is_skipped_with_its_command(tmp_path):
    results = gpu.main(["--target", "tiny", "--draft", "tiny", "--device", "cpu", "--dtype", "float32",
                        "--compile-backend", "aot_eager", "--compile-mode", "none", "--prompt-length", "8",
                        "--repeats", "1", "--gammas", "1", "--rules", "exact", "--parts", "compiled,mla",
                        "--compiled-batch-sizes", "1,4", "--budget-s", "0", "--output-dir", str(tmp_path)])
    assert [(s["part"], s["batch_size"]) for s in results["skipped"]] == [("compiled", 1), ("compiled", 4), ("mla", 1)]
    assert "--parts compiled --compiled-batch-sizes 4" in results["skipped"][1]["command"]
    assert not [r for r in results["live"] if r["compiled"]] and "mla_modeled" not in results


@pytest.mark.slow
def test_the_warmup_part_times_first_calls_from_the_caches(tmp_path):
    """`--parts warmup`: the first plain and speculative compiled calls of the process (here after a reset, as the
    suite compiled before), timed with the graphs they compiled (the `eager` backend: dynamo's graphs only)."""
    results = gpu.main(["--target", "tiny", "--draft", "tiny", "--device", "cpu", "--dtype", "float32",
                        "--compile-backend", "eager", "--compile-mode", "none", "--prompt-length", "8",
                        "--new-tokens", "8", "--repeats", "1", "--gammas", "1", "--gamma", "3", "--rules", "exact",
                        "--parts", "warmup", "--output-dir", str(tmp_path)])
    entry = results["warmup"]["from_caches"]
    assert entry["plain"]["graphs_compiled"] >= 1 and entry["speculative"]["graphs_compiled"] >= 3
    assert entry["ratio"] == pytest.approx(entry["speculative"]["warmup_s"] / entry["plain"]["warmup_s"])
    assert "## Warm-up (s)" in (tmp_path / "gpu-tiny-float32.md").read_text()


def test_always_token_zero_makes_every_draft_right_and_restores_the_weights():
    model = gpu.random_model("tiny", torch.float32, "cpu", 0)
    before = model.model.norm.weight.clone()
    with gpu.always_token_zero(model):
        logits = model(torch.randint(1, 500, (2, 5))).logits
        assert torch.equal(logits, torch.zeros_like(logits)) and logits.argmax(-1).eq(0).all()
    assert torch.equal(model.model.norm.weight, before)
    with pytest.raises(ValueError, match="model.model.norm.weight"):
        with gpu.always_token_zero(torch.nn.Linear(2, 2)):
            pass


@pytest.mark.slow
def test_the_modeled_speed_prices_the_measured_costs_at_the_reference_acceptance(smoke_run):
    results, _ = smoke_run
    costs = results["costs"]
    reference = json.loads(gpu.DEFAULT_ACCEPTANCE.read_text())["sets"]["gsm8k"]["per_position_acceptance"]
    entry = results["modeled"]["gsm8k"]
    overhead = max(next(r["overhead_ms"] for r in results["live"] if r.get("rule") == "exact"
                        and not r["compiled"] and r.get("draft") == "target's weights"), 0.0)
    gamma = 4
    round_ms = gamma * costs["draft_step_eager"] + costs["verify_eager"][4] + costs["verification"]["exact"] + overhead
    assert entry["eager"][gamma] == pytest.approx((1 + sum(reference[:gamma])) * 1e3 / round_ms)
    best = entry["best_eager"]
    assert best["tokens_per_s"] == max(entry["eager"].values())


def test_interpolated_costs():
    costs = {1: 2.0, 5: 4.0}
    assert gpu.interpolated(costs, 3) == pytest.approx(3.0)
    assert gpu.interpolated(costs, 0) == 2.0 and gpu.interpolated(costs, 9) == 4.0
    assert gpu.expected_tokens([0.5, 0.25], 2) == 1.75


def test_forward_times_record_the_loops_forwards_and_restore_the_method(tmp_path):
    original = gpu.CachedModel.forward
    times = gpu.ForwardTimes("cpu")
    target = gpu.random_model("tiny", torch.float32, "cpu", 0)
    args = gpu.build_parser().parse_args(["--target", "tiny", "--draft", "tiny", "--device", "cpu",
                                          "--prompt-length", "8", "--gamma", "2"])
    gpu.live(target, target, args, gpu.Timer("cpu"), "semspec", "exact", new_tokens=9, times=times)
    assert gpu.CachedModel.forward is original
    steps = [c for c in times.calls if c[1] == 1]
    verifies = [c for c in times.calls if c[1] == 3]
    # the target drafting for itself accepts every draft: 9 tokens are 3 rounds of 2 drafts and a verify forward, the
    # first of which also prefills the 8 prompt slots (and is left out of the verify cost, which takes 3 slots)
    assert [c[0] for c in verifies] == [8 + 2, 3, 3]
    assert len(steps) == 6 and times.median_ms(3, 3) > 0 and times.median_ms(4, 4) is None


def test_parts_are_checked():
    with pytest.raises(SystemExit, match="--parts"):
        gpu.main(["--parts", "eager,fast", "--device", "cpu", "--target", "tiny", "--draft", "tiny"])


def test_a_padded_target_pairs_with_the_draft_as_the_7b_does():
    """`--target qwen2.5-7b` has 152064 rows against the draft's 151936: the live runs pass a tokenizer of the shared
    size, as `tiny-padded` (520 rows) does with `tiny` (512) here, and draw prompts below it."""
    assert gpu.SHAPES["qwen2.5-7b"]["vocab_size"] == 152064 > gpu.SHAPES["qwen2.5-coder-0.5b"]["vocab_size"]
    target = gpu.random_model("tiny-padded", torch.float32, "cpu", 0)
    draft = gpu.random_model("tiny", torch.float32, "cpu", 1)
    args = gpu.build_parser().parse_args(["--target", "tiny-padded", "--draft", "tiny", "--device", "cpu",
                                          "--prompt-length", "8", "--gamma", "3"])
    record = gpu.live(target, draft, args, gpu.Timer("cpu"), "semspec", "exact", new_tokens=12)
    plain = gpu.live(target, None, args, gpu.Timer("cpu"), "plain", new_tokens=12)
    assert record["text"] == plain["text"] and record["tau"] >= 1
