"""benchmarks/gpu.py, run end to end on tiny random models on the CPU (compiled with the cheap `aot_eager` backend):
what a GPU session runs, so that it works the first time a GPU is lent."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # `benchmarks/` is not part of the installed package
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import gpu  # noqa: E402

GAMMA = 3


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu")
    results = gpu.main([
        "--target", "tiny", "--draft", "tiny", "--device", "cpu", "--dtype", "float32", "--compile-backend",
        "aot_eager", "--compile-mode", "none", "--new-tokens", "12", "--prompt-length", "8", "--repeats", "1",
        "--gamma", str(GAMMA), "--gammas", "1,3,4", "--batch-sizes", "2",
        "--batch-new-tokens", "6", "--rules", "dropmatch,exact,fly", "--output-dir", str(out), "--name", "smoke",
    ])
    return results, out


def test_every_section_is_written(smoke_run):
    results, out = smoke_run
    saved = json.loads((out / "smoke.json").read_text())
    assert set(saved) >= {"setup", "machine", "costs", "live", "modeled", "batched"}
    text = (out / "smoke.md").read_text()
    for heading in ("## Costs (ms)", "## Live, batch 1", "## Modeled at the reference pair's acceptance: spec-bench",
                    "## Batched"):
        assert heading in text
    assert set(results["costs"]["verification"]) == {"dropmatch", "exact", "fly"}
    assert sorted(results["costs"]["verify_eager"]) == [1, 3, 4] and list(results["costs"]["verify_compiled"]) == [GAMMA]
    # the report renders the same from the JSON read back (string γ keys) as from the run's own dict
    assert gpu.render(saved) == text


def test_compiled_costs_are_read_from_the_live_run(smoke_run):
    results, _ = smoke_run
    exact = next(r for r in results["live"] if r["rule"] == "exact" and r["compiled"])
    # `exact`'s compiled forwards (not the first rule's: `dropmatch` keeps its target forward eager), timed inside its
    # run: draft steps of one token, verify forwards of γ + 1
    assert exact["draft_step_ms"] > 0 and exact["verify_ms"] > 0
    assert results["costs"]["draft_step_compiled"] == exact["draft_step_ms"]
    assert results["costs"]["verify_compiled"][GAMMA] == exact["verify_ms"]
    # its host time is the round less γ steps, verify and verification
    expected = exact["round_ms"] - (GAMMA * exact["draft_step_ms"] + exact["verify_ms"]
                                    + results["costs"]["verification"]["exact"])
    assert exact["overhead_ms"] == pytest.approx(expected)


def test_the_live_runs_cover_every_method(smoke_run):
    results, _ = smoke_run
    seen = {(r["method"], r["rule"], r["compiled"], r.get("draft")) for r in results["live"]}
    assert {("plain", None, False, None), ("plain", None, True, None), ("stock", None, False, "target's weights")} <= seen
    for rule in ("exact", "fly"):
        assert ("semspec", rule, False, "target's weights") in seen
        assert ("semspec", rule, True, "independent") in seen
    for record in results["live"]:
        if record.get("draft") == "target's weights" and record["method"] == "semspec":
            # the target drafting for itself: (nearly) every draft accepted, so a round makes about γ + 1 tokens
            assert record["tau"] > GAMMA


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
