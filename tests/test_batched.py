"""Batched speculative decoding: several prompts, left-padded, in one `generate()` call.

Rows accept different numbers of drafts each round; the rejected drafts of a row stay in the caches as masked holes
(hf_semspec/batch.py), so every row decodes as it would alone.
"""

from __future__ import annotations

import pytest
import torch
from conftest import EOS, VOCAB, perturbed_copy, prompt, tiny_llama
from test_exact_rule import chi_square_p_value
from test_static_cache import fresh_compiler  # noqa: F401 (a fixture)
from transformers import StoppingCriteria, StoppingCriteriaList

import hf_semspec

PAD = 0
LENGTHS = [5, 9, 7]
POLICIES = ["constant", "heuristic", "svip", "adaedl", "cost_aware", "best_constant", "tapout"]


def left_padded(lengths=LENGTHS, seed=0):
    """Prompts of `lengths` tokens, left-padded with PAD, and their attention mask."""
    rows = [prompt(n, seed=seed + i)[0] for i, n in enumerate(lengths)]
    width = max(lengths)
    ids = torch.full((len(rows), width), PAD, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = row
        mask[i, width - len(row):] = 1
    return rows, ids, mask


def alone(model, row, **kwargs):
    """The new tokens of plain batch-1 greedy decoding of one prompt."""
    return type(model).generate(model, row[None], do_sample=False, **kwargs)[0, len(row):]


def new_tokens(out_row, width):
    """A batched output row's new tokens, without the right padding."""
    tokens = out_row[width:].tolist()
    while tokens and tokens[-1] == PAD:
        tokens.pop()
    return tokens


@pytest.mark.parametrize("policy", POLICIES)
def test_each_row_equals_its_prompt_decoded_alone(attached, close_draft, policy):
    rows, ids, mask = left_padded()
    out = attached.generate(ids, attention_mask=mask, assistant_model=close_draft, acceptance="exact",
                            draft_length=policy, max_new_tokens=24, pad_token_id=PAD, eos_token_id=None,
                            return_dict_in_generate=True)
    width = ids.shape[1]
    for i, row in enumerate(rows):
        assert out.sequences[i, width:].tolist() == alone(attached, row, max_new_tokens=24, eos_token_id=None).tolist()
    per_row = out.acceptance_stats_per_row
    assert [s.num_new_tokens for s in per_row] == [24] * len(rows)
    total = out.acceptance_stats
    assert total.num_new_tokens == sum(s.num_new_tokens for s in per_row)
    assert total.num_accepted == sum(s.num_accepted for s in per_row)
    assert total.num_target_forwards == max(s.num_target_forwards for s in per_row)


def test_rows_that_accept_different_counts_leave_holes_and_still_decode_alone(target):
    """One row's prompt makes the draft agree, another's not: the rounds accept different counts per row, which
    leaves rejected drafts in the caches (masked), and each row still equals its own greedy decoding."""
    draft = perturbed_copy(target, scale=0.6, seed=5)
    hf_semspec.attach(target)
    rows, ids, mask = left_padded([6, 6, 8, 4], seed=3)
    out = target.generate(ids, attention_mask=mask, assistant_model=draft, acceptance="exact", num_assistant_tokens=5,
                          max_new_tokens=30, pad_token_id=PAD, eos_token_id=None, return_dict_in_generate=True)
    rounds = [s.accepted_per_round for s in out.acceptance_stats_per_row]
    assert any(len(set(per_round)) > 1 for per_round in zip(*rounds))  # some round's rows accepted differently
    for i, row in enumerate(rows):
        assert out.sequences[i, ids.shape[1]:].tolist() == alone(target, row, max_new_tokens=30,
                                                                 eos_token_id=None).tolist()
    hf_semspec.detach(target)


def test_rows_that_end_early_are_padded_and_stop_costing(attached):
    """An EOS ends its row mid-round: the row is padded after it, leaves the batch (no more drafts for it), and the
    others go on."""
    rows, ids, mask = left_padded()
    width = ids.shape[1]
    reference = [alone(attached, row, max_new_tokens=24, eos_token_id=None).tolist() for row in rows]
    eos = reference[1][6]  # row 1's 7th new token; rows 0 and 2 may or may not meet it
    out = attached.generate(ids, attention_mask=mask, assistant_model=attached, acceptance="exact",
                            num_assistant_tokens=4, max_new_tokens=24, pad_token_id=PAD, eos_token_id=eos,
                            return_dict_in_generate=True)
    for i, row in enumerate(rows):
        expected = alone(attached, row, max_new_tokens=24, eos_token_id=eos).tolist()
        assert new_tokens(out.sequences[i], width) == expected
        assert out.acceptance_stats_per_row[i].num_new_tokens == len(expected)
    assert out.sequences[1, width + 7:].eq(PAD).all() and out.sequences.shape[1] > width + 7
    per_row = out.acceptance_stats_per_row
    assert per_row[1].num_target_forwards < max(s.num_target_forwards for s in per_row)


def test_processors_that_read_the_prefix_see_each_row_s_own(attached, close_draft):
    rows, ids, mask = left_padded()
    options = dict(max_new_tokens=20, repetition_penalty=1.3, no_repeat_ngram_size=2, min_new_tokens=12,
                   eos_token_id=EOS)
    out = attached.generate(ids, attention_mask=mask, assistant_model=close_draft, acceptance="exact",
                            pad_token_id=PAD, **options)
    for i, row in enumerate(rows):
        assert new_tokens(out[i], ids.shape[1]) == alone(attached, row, **options).tolist()


class LastTokenIs(StoppingCriteria):
    def __init__(self, token):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


def test_a_stopping_criterion_ends_each_row_where_it_fires(attached, close_draft):
    rows, ids, mask = left_padded()
    stop = alone(attached, rows[2], max_new_tokens=20, eos_token_id=None)[4].item()
    criteria = StoppingCriteriaList([LastTokenIs(stop)])
    out = attached.generate(ids, attention_mask=mask, assistant_model=close_draft, acceptance="exact",
                            max_new_tokens=20, pad_token_id=PAD, eos_token_id=None, stopping_criteria=criteria)
    for i, row in enumerate(rows):
        expected = type(attached).generate(attached, row[None], do_sample=False, max_new_tokens=20, eos_token_id=None,
                                           stopping_criteria=StoppingCriteriaList([LastTokenIs(stop)]))
        assert new_tokens(out[i], ids.shape[1]) == expected[0, len(row):].tolist()


class RecordsScores(StoppingCriteria):
    """Never fires; keeps what each call was given."""

    def __init__(self):
        self.calls = []

    def __call__(self, input_ids, scores, **kwargs):
        self.calls.append((input_ids.clone(), scores))
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def test_a_stopping_criterion_gets_each_row_s_scores_so_far(attached, close_draft):
    """With output_scores, a criterion sees the scores of every token of the row so far, as at batch 1."""
    rows, ids, mask = left_padded()
    criterion = RecordsScores()
    out = attached.generate(ids, attention_mask=mask, assistant_model=close_draft, acceptance="exact",
                            max_new_tokens=12, pad_token_id=PAD, eos_token_id=None, output_scores=True,
                            return_dict_in_generate=True, stopping_criteria=StoppingCriteriaList([criterion]))
    assert len(criterion.calls) >= 12 * len(rows)  # each row's prefixes, one by one
    returned = torch.stack(out.scores, dim=1)  # (rows, steps, vocab)
    width = ids.shape[1]
    called_for = set()
    for input_ids, scores in criterion.calls:
        # The row a call is about is the one whose tokens it was given (the prompts differ).
        (row,) = [r for r in range(len(rows)) if torch.equal(input_ids[0, :width], ids[r])]
        called_for.add(row)
        assert input_ids.shape[0] == 1 and torch.equal(input_ids[0], out.sequences[row, : input_ids.shape[1]])
        assert scores is not None and len(scores) == input_ids.shape[1] - width
        assert all(score.shape == (1, VOCAB) for score in scores)
        assert torch.equal(torch.cat(scores), returned[row, : len(scores)])  # that row's own scores
    assert called_for == set(range(len(rows)))


@pytest.mark.parametrize("name", hf_semspec.available_rules())
@pytest.mark.parametrize("do_sample", [False, True])
def test_every_rule_decodes_a_batch(attached, close_draft, rdk_draft, name, do_sample):
    """Each row checked against its own prompt: sampled with top-k = 3 (or greedy with a lossless rule), every token
    a row emits is among the target's three most likely at that row's prefix (a relaxed rule keeps only drafts the
    processors allow, and a row given another row's tokens or logits would break it); greedy, each row is also the
    text it gets alone (tests/test_batch_rows.py has that for both cache types). Greedy decoding applies no top-k, so
    a greedy relaxed rule may keep a draft outside the top 3 (`ears` at β 0.5 on a flat tiny target keeps any)."""
    rule = hf_semspec.rules.RULES.get(name)
    if not (rule.supports_sampling if do_sample else rule.supports_greedy):
        pytest.skip(f"{name} does not define do_sample={do_sample}")
    rows, ids, mask = left_padded()
    draft = rdk_draft if rule.redistributes_draft else close_draft
    options = dict(assistant_model=draft, acceptance=name, do_sample=do_sample, top_k=3, max_new_tokens=16,
                   min_new_tokens=16)
    torch.manual_seed(0)
    out = attached.generate(ids, attention_mask=mask, pad_token_id=PAD, return_dict_in_generate=True, **options)
    width = ids.shape[1]
    assert out.sequences.shape == (len(rows), width + 16)
    for i, row in enumerate(rows):
        new = out.sequences[i, width:]
        with torch.no_grad():
            logits = attached(torch.cat([row, new])[None]).logits[0, len(row) - 1 : -1]
        if do_sample or rule.lossless:
            assert bool((logits.topk(3, -1).indices == new[:, None]).any(-1).all()), f"row {i}"
        if not do_sample:
            assert new.tolist() == attached.generate(row[None], **options)[0, len(row):].tolist(), f"row {i}"
        stats = out.acceptance_stats_per_row[i]
        # min_new_tokens: no EOS cuts a round, so each round the row took part in emitted its accepted drafts + 1, but
        # its last, which max_length may cut
        assert stats.num_new_tokens == 16
        *before_last, last = stats.accepted_per_round
        assert sum(before_last) + len(before_last) < 16 <= sum(before_last) + len(before_last) + last + 1
        assert sum(stats.accepted_per_position) == stats.num_accepted == sum(stats.accepted_per_round)
    assert torch.equal(out.sequences[:, :width], ids)


def test_a_pruned_drafter_decodes_a_batch(attached, pruned_draft):
    rows, ids, mask = left_padded()
    out = attached.generate(ids, attention_mask=mask, assistant_model=pruned_draft, acceptance="exact",
                            max_new_tokens=16, pad_token_id=PAD, eos_token_id=None)
    for i, row in enumerate(rows):
        assert out[i, ids.shape[1]:].tolist() == alone(attached, row, max_new_tokens=16, eos_token_id=None).tolist()


def test_sampled_exact_keeps_each_row_s_distribution():
    """Two rows sampled together, many times: each row's first three new tokens are distributed as that prompt's
    plain sampling (chi-square on the first token and on the second given the first's most frequent value)."""
    target = tiny_llama(seed=0, vocab_size=16)
    draft = perturbed_copy(target, scale=0.8, seed=4)
    hf_semspec.attach(target)
    first, second = prompt(4, seed=0)[0] % 16, prompt(6, seed=1)[0] % 16
    ids = torch.stack([torch.cat([torch.full((2,), PAD), first]), second])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6])
    runs = 400
    torch.manual_seed(11)
    batched = target.generate(ids.repeat(runs, 1), attention_mask=mask.repeat(runs, 1), assistant_model=draft,
                              acceptance="exact", do_sample=True, temperature=1.5, max_new_tokens=3, min_new_tokens=3,
                              num_assistant_tokens=3, pad_token_id=PAD)[:, 6:].view(runs, 2, 3)
    for row, prefix in enumerate((first, second)):
        with torch.no_grad():
            p = torch.softmax(target(prefix[None]).logits[0, -1] / 1.5, -1)
        counts = torch.bincount(batched[:, row, 0], minlength=16)
        assert chi_square_p_value(counts[p > 0.02], p[p > 0.02] / p[p > 0.02].sum()) > 1e-3
    hf_semspec.detach(target)


def test_a_sliding_window_model_takes_one_prompt_at_a_time(attached):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    draft = MistralForCausalLM(MistralConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=VOCAB, sliding_window=6, eos_token_id=EOS, pad_token_id=PAD,
    )).eval()
    _, ids, mask = left_padded()
    with pytest.raises(hf_semspec.SemSpecConfigError, match=r"batch size\)` = 3.*assistant_model has sliding-window"):
        attached.generate(ids, attention_mask=mask, assistant_model=draft, acceptance="exact", max_new_tokens=4)


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_a_batch_on_static_caches_decodes_each_row_as_alone(close_draft, compiled, fresh_compiler):
    """Static caches keep the batch's shape: a row that ends stays, masked, until all have; holes fit in the slots
    sized for the policy's length. Compiled (aot_eager on the CPU): the same."""
    from test_static_cache import cpu_compile_config

    target = tiny_llama(seed=0)
    hf_semspec.attach(target)
    rows, ids, mask = left_padded()
    reference = [alone(target, row, max_new_tokens=24, eos_token_id=None).tolist() for row in rows]
    eos = reference[0][5]  # row 0 ends early
    extra = {"compile_config": cpu_compile_config()} if compiled else {}
    out = target.generate(ids, attention_mask=mask, assistant_model=close_draft, acceptance="exact",
                          num_assistant_tokens=4, max_new_tokens=24, pad_token_id=PAD, eos_token_id=eos,
                          cache_implementation="static", return_dict_in_generate=True, **extra)
    for i, row in enumerate(rows):
        assert new_tokens(out.sequences[i], ids.shape[1]) == alone(target, row, max_new_tokens=24,
                                                                   eos_token_id=eos).tolist()
    assert out.acceptance_stats_per_row[0].num_target_forwards < out.acceptance_stats.num_target_forwards
    hf_semspec.detach(target)


def test_round_budget_keeps_a_slot_for_every_token_the_slowest_row_may_still_need():
    from hf_semspec.decoding import round_budget

    assert round_budget(wanted=8, room=5, free_slots=100, holes=False) == 4  # a round adds up to γ + 1 tokens
    assert round_budget(wanted=8, room=50, free_slots=6, holes=False) == 6  # the caches' free slots
    # 20 free slots, the slowest row still needs 15 tokens: this round may take γ + 1 = 6 slots, leaving 14 for 14
    # rounds of one slot each (the row gains at least one token a round)
    assert round_budget(wanted=8, room=15, free_slots=20, holes=True) == 6
    assert round_budget(wanted=8, room=15, free_slots=14, holes=True) == 0
    assert round_budget(wanted=8, room=1, free_slots=1, holes=True) == 0


def test_a_batch_on_static_caches_never_writes_past_them(attached, close_draft, monkeypatch):
    """The budget keeps every round within the slots; one round more than they hold would fail in the cache."""
    from hf_semspec import decoding

    real = decoding._typical_length
    monkeypatch.setattr(decoding, "_typical_length", lambda policy: 0)  # slots = tokens: no room for holes
    rows, ids, mask = left_padded()
    out = attached.generate(ids, attention_mask=mask, assistant_model=close_draft, acceptance="exact",
                            num_assistant_tokens=6, max_new_tokens=20, pad_token_id=PAD, eos_token_id=None,
                            cache_implementation="static", return_dict_in_generate=True)
    for i, row in enumerate(rows):
        assert out.sequences[i, ids.shape[1]:].tolist() == alone(attached, row, max_new_tokens=20,
                                                                 eos_token_id=None).tolist()
    assert real(hf_semspec.draft_length.POLICIES.build("constant", {"num_tokens": 6})) == 6


def test_a_row_cut_by_a_stop_keeps_writing_its_drafts_within_the_buffer():
    """A row that accepted 4 drafts but stopped at the first (EOS) stays in a static batch: its next rounds' drafts go
    after its 6 tokens, not after the 10 its accepted drafts would have made, so a buffer sized from the rows'
    lengths holds them (worked numbers: prompts of 5 tokens, max_length 12)."""
    from hf_semspec.batch import DecodingBatch

    ids = torch.arange(1, 11).view(2, 5)
    batch = DecodingBatch(ids, None, slot_capacity=40, token_capacity=13, grow=False)
    for index in range(4):
        batch.write_draft(index, torch.tensor([20 + index, 30 + index]))
    # row 0 accepts all 4 drafts, and its first is an EOS: it keeps 1 token; row 1 accepts none and goes on
    batch.commit(torch.tensor([4, 0]), torch.tensor([24, 40]), accepted=[4, 0], kept=[1, 1])
    batch.finish(0)
    assert batch.lengths == [6, 6]
    assert batch.draft_starts.tolist() == [6, 6]
    # row 1 has 6 tokens of room left; a round of 5 drafts (budget = room − 1) fills the buffer sized for it
    batch.reserve_tokens(max(batch.lengths) + 5 + 1)
    for index in range(5):
        batch.write_draft(index, torch.tensor([50 + index, 60 + index]))
    batch.commit(torch.tensor([5, 5]), torch.tensor([55, 65]), accepted=[5, 5], kept=[0, 6])
    assert batch.tokens[1, 6:12].tolist() == [60, 61, 62, 63, 64, 65]
    assert batch.draft_starts.tolist() == [6, 12]
