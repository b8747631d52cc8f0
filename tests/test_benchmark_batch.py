"""benchmarks/batch.py end to end on tiny models (fake tokenizer, tiny GSM8K file)."""

from __future__ import annotations

import json

import torch
from conftest import perturbed_copy, tiny_llama

from benchmarks import batch, data, models


def tiny_pair(pair: str, **_options) -> models.ModelPair:
    """Tiny random Llamas and a fake tokenizer whose prompts differ in length (so batches are padded)."""
    target = tiny_llama(seed=0)
    draft = perturbed_copy(target, scale=0.3, seed=2)

    def encode(text: str) -> dict:
        ids = torch.tensor([[4 + ord(c) % 120 for c in text[: 6 + len(text) % 7]]])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    return models.ModelPair(target, draft, encode, lambda ids: " ".join(map(str, ids)), "tiny-target", "tiny-draft")


def test_every_batch_size_compares_the_three_methods_on_the_same_prompts(tmp_path):
    problems = [{"question": f"What is {i} + {i * 7}? Show the steps.", "answer": f"#### {8 * i}"} for i in range(4)]
    (tmp_path / data.GSM8K_FILE).write_text("".join(json.dumps(p) + "\n" for p in problems))
    results = batch.main(["--batch-sizes", "1,4", "--new-tokens", "10", "--gammas", "2,3", "--repeats", "2",
                          "--data-dir", str(tmp_path), "--output-dir", str(tmp_path / "out")], load_pair=tiny_pair)
    assert [e["batch_size"] for e in results["sizes"]] == [1, 4]
    for entry in results["sizes"]:
        size, plain = entry["batch_size"], entry["plain"]
        assert sorted(entry["exact"]) == ["2", "3"]
        assert len(plain["repeats_seconds"]) == 2 and plain["seconds"] == min(plain["repeats_seconds"])
        for run in entry["exact"].values():
            # greedy exact writes plain decoding's text: every method returned the same tokens, row by row
            assert run["batched"]["identical_to_alone"] == plain["identical_to_alone"] == size
            assert plain["tokens"] == run["batched"]["tokens"] == run["row_by_row"]["tokens"]
            assert run["batched_over_plain"] == run["batched"]["tokens_per_s"] / plain["tokens_per_s"]
            assert run["batched_over_row_by_row"] == run["batched"]["tokens_per_s"] / run["row_by_row"]["tokens_per_s"]
            assert len(run["batched"]["tau_per_row"]) == size
    # header, rule, one row per size and γ
    assert (tmp_path / "out" / "batch-cpu.md").read_text().count("\n|") == 2 + 2 * 2
