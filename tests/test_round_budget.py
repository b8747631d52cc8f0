"""Every round drafts what the policy asks for: on dynamic caches the loop grows its buffers before a round, so only
`max_length` (and, on static caches, their free slots) shortens one.

Worked case: the draft is the target itself, so every draft is accepted and each round emits γ + 1 tokens; 200 new
tokens at γ = 6 take ceil(200 / 7) = 29 target forwards (28 rounds of 7 tokens, then one of 4: γ = 3, cut by the
room left). A loop that capped γ by the free slots of a buffer it had not grown yet took 32.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import prompt, tiny_llama

import hf_semspec
from hf_semspec.decoding import round_budget

NEW_TOKENS, GAMMA, PROMPT = 200, 6, 8


@pytest.fixture(scope="module")
def model():
    # room for 8 + 200 positions
    model = tiny_llama(seed=0, max_position_embeddings=512)
    hf_semspec.attach(model)
    yield model
    hf_semspec.detach(model)


def count_forwards(model):
    calls = []
    handle = model.register_forward_pre_hook(lambda module, args: calls.append(1))
    return calls, handle


@pytest.mark.parametrize("cache_implementation", [None, "static"])
def test_one_prompt_takes_ceil_new_tokens_over_gamma_plus_one_forwards(model, cache_implementation):
    ids = prompt(PROMPT, seed=0)
    calls, handle = count_forwards(model)
    try:
        out = model.generate(ids, assistant_model=model, acceptance="exact", num_assistant_tokens=GAMMA,
                             max_new_tokens=NEW_TOKENS, eos_token_id=None, cache_implementation=cache_implementation,
                             return_dict_in_generate=True)
    finally:
        handle.remove()
    stats = out.acceptance_stats
    expected = math.ceil(NEW_TOKENS / (GAMMA + 1))  # 29
    # The target's forwards: one per round (the draft is the same module: its forwards are the drafts' γ per round
    # plus its own catch-up, counted apart below).
    assert stats.num_target_forwards == expected
    assert stats.drafted_per_round == [GAMMA] * (expected - 1) + [NEW_TOKENS - (expected - 1) * (GAMMA + 1) - 1]
    assert stats.num_new_tokens == NEW_TOKENS
    # Every call of the module: each round's target forward and the draft's γ steps.
    assert len(calls) == expected + sum(stats.drafted_per_round)


def test_a_batch_takes_as_many_rounds_as_one_of_its_rows(model):
    """Three left-padded prompts, all of whose drafts are accepted: the rounds of one row, not more."""
    rows = [prompt(n, seed=i)[0] for i, n in enumerate([PROMPT, 5, 7])]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, width - len(row):], mask[i, width - len(row):] = row, 1
    out = model.generate(ids, attention_mask=mask, assistant_model=model, acceptance="exact",
                         num_assistant_tokens=GAMMA, max_new_tokens=NEW_TOKENS, eos_token_id=None, pad_token_id=0,
                         return_dict_in_generate=True)
    expected = math.ceil(NEW_TOKENS / (GAMMA + 1))
    assert out.acceptance_stats.num_target_forwards == expected
    assert [s.num_target_forwards for s in out.acceptance_stats_per_row] == [expected] * len(rows)
    assert all(s.drafted_per_round[:-1] == [GAMMA] * (expected - 1) for s in out.acceptance_stats_per_row)


def test_round_budget_caps_by_free_slots_only_on_static_caches():
    assert round_budget(wanted=6, room=150, free_slots=None, holes=False) == 6  # dynamic: the buffer grows
    assert round_budget(wanted=6, room=150, free_slots=2, holes=False) == 2  # static: its slots
    assert round_budget(wanted=6, room=4, free_slots=None, holes=False) == 3  # max_length: a round adds γ + 1
    assert round_budget(wanted=6, room=1, free_slots=None, holes=False) == 0


def test_a_round_with_no_drafts_teaches_heuristic_nothing():
    """Near max_length a round may draft nothing; 0 of 0 is not "every draft accepted" (+2)."""
    from hf_semspec.draft_length import POLICIES, RoundOutcome

    policy = POLICIES.build("heuristic", {"initial_tokens": 5})
    policy.observe(RoundOutcome(0, 0, 0.1))
    assert policy.max_tokens() == 5
    policy.observe(RoundOutcome(5, 5, 0.1))
    assert policy.max_tokens() == 7
