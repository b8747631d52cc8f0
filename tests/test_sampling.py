"""The one categorical sampler (`rules.base.sample_categorical`): its distribution, and that sampled decoding reads
nothing back from the device while drafting with a fixed-budget policy (on a GPU each read is a host sync)."""

from __future__ import annotations

import pytest
import torch
from conftest import perturbed_copy, prompt, tiny_llama
from test_exact_rule import chi_square_p_value
from torch.profiler import ProfilerActivity, profile

import hf_semspec
from hf_semspec import drafting
from hf_semspec.rules.base import sample_categorical


def test_sample_categorical_draws_from_the_distribution():
    probs = torch.tensor([0.5, 0.0, 0.3, 0.15, 0.05, 0.0])
    generator = torch.Generator().manual_seed(0)
    draws = sample_categorical(probs.expand(40_000, -1), generator)
    counts = torch.bincount(draws, minlength=len(probs))
    assert counts[probs == 0].sum() == 0  # a token of probability 0 is never drawn
    assert chi_square_p_value(counts[probs > 0], probs[probs > 0]) > 1e-3
    # Unnormalized rows draw the same distribution, and the generator makes the draws repeatable.
    again = sample_categorical(3 * probs.expand(40_000, -1), torch.Generator().manual_seed(0))
    assert torch.equal(draws, again)


def test_a_race_draw_of_zero_does_not_pick_a_token_of_probability_zero(monkeypatch):
    # A float32 Exp(1) draw can be 0 (probability ~2^-24 per entry): q/0 would be NaN for q = 0, which argmax picks.
    probs = torch.tensor([[0.0, 1.0, 0.0]])
    monkeypatch.setattr(torch.Tensor, "exponential_", lambda self, generator=None: self.fill_(0.0))
    assert sample_categorical(probs, None).tolist() == [1]


@pytest.mark.parametrize("policy", ["constant", "heuristic", "svip"])
def test_sampled_drafting_reads_from_the_device_only_for_a_per_token_decision(monkeypatch, policy):
    """Counted with the profiler's `aten::_local_scalar_dense` (a `.item()`/`.tolist()`), the op that blocks on a
    GPU: none while drafting with a fixed budget, greedy or sampled, and one per decision for a per-token policy.
    (torch.multinomial read its input twice per draw.)"""
    target = tiny_llama(seed=0)
    draft = perturbed_copy(target, scale=0.3, seed=2)
    draft_rounds = drafting.ModelDrafter.draft
    counted = {"reads": 0, "drafted": 0, "rounds": 0}

    def counting(self, batch, *args, **kwargs):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            block = draft_rounds(self, batch, *args, **kwargs)
        counted["reads"] += sum(e.count for e in prof.key_averages() if e.key == "aten::_local_scalar_dense")
        counted["drafted"] += block.num_tokens
        counted["rounds"] += 1
        return block

    monkeypatch.setattr(drafting.ModelDrafter, "draft", counting)
    decisions = []
    if policy == "svip":
        from hf_semspec.draft_length.svip import SVIPPolicy

        decide = SVIPPolicy.keep_drafting
        monkeypatch.setattr(SVIPPolicy, "keep_drafting", lambda self, n, q: decisions.append(n) or decide(self, n, q))
    torch.manual_seed(0)
    hf_semspec.generate(target, prompt(6), assistant_model=draft, acceptance="exact", draft_length=policy,
                        do_sample=True, max_new_tokens=24, eos_token_id=2)
    assert counted["drafted"] > 0
    if policy == "svip":  # its decision's read, and the EOS read after it (which waits for nothing)
        assert decisions and len(decisions) <= counted["reads"] <= 2 * len(decisions)
    else:
        assert counted["reads"] == 0
