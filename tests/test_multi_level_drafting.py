"""Multi-level drafting (`assistant_model` together with `prompt_lookup_num_tokens`, FLy's multi-level acceleration):
the draft model confirms n-gram candidates in one forward, so it drafts the tokens it would have drafted alone (greedy)
or tokens distributed as its own q (sampling) in fewer forwards. Pinned here: every rule's greedy output and rounds
equal those of the draft alone (dynamic and static caches, batches, pruned drafters, compiled); greedy `exact` is plain
greedy; the drafter's worked steps; sampled drafts distributed as q; every rule and policy runs; the statistics."""

from __future__ import annotations

import pytest
import torch
from conftest import EOS, VOCAB, batch_of, prompt, tiny_llama
from test_batched import PAD, left_padded, new_tokens
from test_exact_rule import chi_square_p_value
from test_prompt_lookup import REPEATING
from test_static_cache import cpu_compile_config, fresh_compiler, plain_greedy  # noqa: F401 (a fixture)

import hf_semspec
from hf_semspec import drafting
from hf_semspec.draft_length import POLICIES
from hf_semspec.drafting import ModelDrafter
from hf_semspec.ngram import NgramIndex, PromptLookup, RowContexts
from hf_semspec.processors import BatchProcessors
from hf_semspec.rules import RULES
from transformers import LogitsProcessorList

NEW_TOKENS = 40


def greedy_rules() -> list[str]:
    return [name for name in hf_semspec.available_rules() if RULES.get(name).supports_greedy]


@pytest.fixture(scope="module")
def same_draft(target):
    """A draft that is the target's copy: on the target's cyclic greedy text it confirms every candidate."""
    draft = type(target)(target.config).eval()
    draft.load_state_dict(target.state_dict())
    return draft


def rounds(stats) -> tuple:
    return stats.drafted_per_round, stats.accepted_per_round, stats.num_new_tokens


def drafter(model, ids, mask=None, num_tokens=4, do_sample=False, return_probs=False):
    """A `ModelDrafter` over `ids` with multi-level drafting (`num_tokens` = k), or without it (`num_tokens=None`)."""
    contexts = None if num_tokens is None else RowContexts(ids, mask, PromptLookup(num_tokens, 2))
    return ModelDrafter(model, BatchProcessors(LogitsProcessorList(), ids.shape[0]), do_sample=do_sample,
                        return_probs=return_probs, output_device=ids.device, vocab_size=VOCAB, contexts=contexts)


# -- the drafter's steps ----------------------------------------------------------------------------------------------


def test_a_round_drafts_what_the_draft_drafts_alone_in_fewer_forwards(target, same_draft):
    """On the target's own cyclic text, with the target's copy as draft, every candidate is confirmed: 8 drafts from
    2 forwards (k = 4: 4 candidates + the draft's own token, then 2 candidates + its own), the same 8 tokens the
    draft drafts alone in 8 forwards."""
    ids = plain_greedy(target, prompt(8), max_new_tokens=40, eos_token_id=None)  # ends in a short cycle
    alone = drafter(same_draft, ids, num_tokens=None).draft(batch_of(ids), max_tokens=8)
    multi = drafter(same_draft, ids, num_tokens=4).draft(batch_of(ids), max_tokens=8)
    assert torch.equal(multi.tokens, alone.tokens) and alone.num_forwards == 8
    assert multi.num_forwards == 2 and multi.num_ngram_drafts == 6
    assert multi.from_ngram == (True,) * 4 + (False,) + (True,) * 2 + (False,)


def test_a_rounds_drafts_leave_the_context_when_it_ends():
    """The drafts extend a row's context while the round looks up its candidates (`mark`), and leave it, with the
    n-grams they added, when the round ends (`rollback`): the next round searches only what the target kept."""
    index = NgramIndex(2, [5, 6, 7, 8])
    before = ([dict(d) for d in index.first], list(index.tokens))
    index.mark()
    index.extend([9, 5, 6])
    assert index.lookup(2) == [7, 8] and (6, 7) in index.first[1] and (9, 5) in index.first[1]
    index.rollback()
    assert ([dict(d) for d in index.first], index.tokens) == before
    assert index.lookup(2) == []
    index.extend([5])  # appended after the round: kept
    assert index.lookup(2) == [6, 7]


def test_a_candidate_the_draft_disagrees_with_ends_the_step_with_the_drafts_own_token(close_draft):
    """Candidates from a context the draft does not continue that way: the step keeps only what the draft confirms
    and then drafts its own token, so the round is still the draft's own greedy drafts."""
    ids = prompt(30, seed=3)
    alone = drafter(close_draft, ids, num_tokens=None).draft(batch_of(ids), max_tokens=10)
    for k in (1, 3, 6):
        multi = drafter(close_draft, ids, num_tokens=k).draft(batch_of(ids), max_tokens=10)
        assert torch.equal(multi.tokens, alone.tokens), k
        assert multi.num_forwards + multi.num_ngram_drafts == 10


def test_sampled_steps_with_every_candidate_accepted_or_rejected(monkeypatch, close_draft, same_draft, target):
    """Worked steps of speculative sampling with the one-hot proposal c: u = 0 accepts every candidate (the drafts
    are the candidates, then the draft's own draw, one forward); u = 1 rejects the first, whose draw comes from
    q₀ without c₁ (the argmax draw below picks the best other token)."""
    monkeypatch.setattr(drafting, "sample_categorical", lambda probs, generator: probs.argmax(-1))
    ids = plain_greedy(target, prompt(8), max_new_tokens=40, eos_token_id=None)
    contexts = RowContexts(ids, None, PromptLookup(3, 2))
    candidates = contexts.found(0, 3)
    assert len(candidates) == 3
    monkeypatch.setattr(drafting, "sample_uniform", lambda shape, device, generator: torch.zeros(shape))
    block = drafter(close_draft, ids, num_tokens=3, do_sample=True, return_probs=True).draft(batch_of(ids), 4)
    assert block.tokens[0].tolist()[:3] == candidates and block.num_forwards == 1 and block.num_ngram_drafts == 3
    assert block.tokens[0, 3] == block.probs[0, 3].argmax()  # the draft's own draw after the candidates
    # u = 1 rejects c₁, which the target's copy would have drafted itself: the draw comes from q₀ without it
    monkeypatch.setattr(drafting, "sample_uniform", lambda shape, device, generator: torch.ones(shape))
    block = drafter(same_draft, ids, num_tokens=3, do_sample=True, return_probs=True).draft(batch_of(ids), 2)
    q0 = block.probs[0, 0].clone()
    assert q0.argmax() == candidates[0]
    q0[candidates[0]] = 0
    assert block.tokens[0, 0] == q0.argmax() != candidates[0] and block.num_ngram_drafts == 0


def test_sampled_drafts_are_distributed_as_the_drafts_q(close_draft):
    """2000 rounds of sampled drafts whose first step confirms up to 2 candidates from the context in one forward: the
    first draft is distributed as q₀ and the second as Σ q₀(x) q₁(· | x), as the draft alone would draw them
    (accepting every candidate, counting acceptances past a rejection, or drawing from q again after a rejection,
    fails)."""
    model = tiny_llama(seed=7, vocab_size=16)
    ids = torch.tensor([[7, 11, 13, 10, 13, 5, 11]])  # the bigram (5, 11) is new, 11 → candidates 13 10 13
    with torch.no_grad():
        logits = model(ids).logits[0, -1] / 2
        q0 = logits.softmax(-1)
        q1 = torch.stack([(model(torch.cat([ids, torch.tensor([[x]])], 1)).logits[0, -1] / 2).softmax(-1)
                          for x in range(16)])
    # candidates the test can tell apart from "always" and "never accepted", at both positions
    assert 0.1 < q0[13] < 0.7 and 0.1 < q1[13, 10] < 0.7
    from transformers import TemperatureLogitsWarper

    processors = BatchProcessors(LogitsProcessorList([TemperatureLogitsWarper(2.0)]), 1)
    torch.manual_seed(0)
    firsts, seconds = torch.zeros(16), torch.zeros(16)
    confirmed = 0
    for _ in range(2000):
        contexts = RowContexts(ids, None, PromptLookup(3, 2))
        multi = ModelDrafter(model, processors, do_sample=True, return_probs=True, output_device=ids.device,
                             vocab_size=16, contexts=contexts)
        block = multi.draft(batch_of(ids), max_tokens=3)  # a first step over 2 candidates
        firsts[block.tokens[0, 0]] += 1
        seconds[block.tokens[0, 1]] += 1
        confirmed += block.num_ngram_drafts
    assert torch.allclose(block.probs[0, 0], q0, atol=1e-5)  # the rule gets q of each draft
    assert chi_square_p_value(firsts, q0) > 1e-3
    expected = q0 @ q1
    assert chi_square_p_value(seconds, expected) > 1e-3
    assert 0.1 * 2000 < confirmed < 2000  # (candidates were accepted, and rejected)


# -- through generate(): every rule's greedy rounds are the draft's own ----------------------------------------------


@pytest.mark.parametrize("cache_implementation", [None, "static"])
@pytest.mark.parametrize("name", greedy_rules())
def test_greedy_rounds_of_every_rule_equal_the_draft_alone(attached, close_draft, name, cache_implementation):
    if RULES.get(name).redistributes_draft:
        pytest.skip("rdk drafts from a pruned drafter: test_pruned_drafters_draft_as_alone")
    forwards = {"alone": 0, "multi": 0}
    for ids in (REPEATING, prompt(8)):
        options = dict(assistant_model=close_draft, acceptance=name, num_assistant_tokens=6, max_new_tokens=NEW_TOKENS,
                       eos_token_id=None, cache_implementation=cache_implementation, return_dict_in_generate=True)
        alone = attached.generate(ids, **options)
        multi = attached.generate(ids, prompt_lookup_num_tokens=4, **options)
        assert torch.equal(multi.sequences, alone.sequences)
        assert rounds(multi.acceptance_stats) == rounds(alone.acceptance_stats)
        forwards["alone"] += alone.acceptance_stats.num_draft_forwards
        forwards["multi"] += multi.acceptance_stats.num_draft_forwards
        if name == "exact":
            assert torch.equal(multi.sequences,
                               plain_greedy(attached, ids, max_new_tokens=NEW_TOKENS, eos_token_id=None))
    assert forwards["multi"] < forwards["alone"]


@pytest.mark.parametrize("cache_implementation", [None, "static"])
def test_a_batch_of_left_padded_rows_is_plain_greedy_row_by_row(attached, same_draft, cache_implementation):
    """Rows find candidates of different lengths, confirm different numbers and finish at different rounds (an EOS):
    each row is its plain greedy text, and the batch's rounds are those of the draft alone."""
    rows, ids, mask = left_padded()
    eos = plain_greedy(attached, rows[1][None], max_new_tokens=NEW_TOKENS, eos_token_id=None)[0, len(rows[1]) + 20]
    options = dict(assistant_model=same_draft, acceptance="exact", num_assistant_tokens=6, max_new_tokens=NEW_TOKENS,
                   eos_token_id=int(eos), cache_implementation=cache_implementation, return_dict_in_generate=True,
                   attention_mask=mask, pad_token_id=PAD)
    multi = attached.generate(ids, prompt_lookup_num_tokens=5, **options)
    alone = attached.generate(ids, **options)
    width = ids.shape[1]
    for i, row in enumerate(rows):
        expected = plain_greedy(attached, row[None], max_new_tokens=NEW_TOKENS, eos_token_id=int(eos))[0, len(row):]
        assert new_tokens(multi.sequences[i], width) == expected.tolist(), f"row {i}"
        assert rounds(multi.acceptance_stats_per_row[i]) == rounds(alone.acceptance_stats_per_row[i]), f"row {i}"
    assert multi.acceptance_stats.num_draft_forwards < alone.acceptance_stats.num_draft_forwards
    assert multi.acceptance_stats.num_ngram_drafts > 0


def test_pruned_drafters_draft_as_alone(attached, pruned_draft, rdk_draft):
    for draft, rule in ((pruned_draft, "exact"), (rdk_draft, "rdk")):
        options = dict(assistant_model=draft, acceptance=rule, num_assistant_tokens=5, max_new_tokens=30,
                       eos_token_id=None, return_dict_in_generate=True)
        alone = attached.generate(REPEATING, **options)
        multi = attached.generate(REPEATING, prompt_lookup_num_tokens=4, **options)
        assert torch.equal(multi.sequences, alone.sequences), rule
        assert rounds(multi.acceptance_stats) == rounds(alone.acceptance_stats), rule
        assert multi.acceptance_stats.num_draft_forwards < alone.acceptance_stats.num_draft_forwards, rule


@pytest.mark.parametrize("name", ["exact", "fly"])
def test_processors_that_read_the_prefix_and_a_per_token_policy_see_the_drafts_alone(attached, close_draft, name):
    """A repetition penalty (below 1: repeats favoured, so candidates get confirmed) reads each position's prefix
    (the candidates before it, in the step's one forward), and `svip` is asked after every draft with its q: the
    drafts, the rounds the policy ends and the text are those of the draft alone."""
    for policy in ("constant", "svip"):
        options = dict(assistant_model=close_draft, acceptance=name, num_assistant_tokens=8, draft_length=policy,
                       repetition_penalty=0.8, max_new_tokens=NEW_TOKENS, eos_token_id=None,
                       return_dict_in_generate=True)
        alone = attached.generate(REPEATING, **options)
        multi = attached.generate(REPEATING, prompt_lookup_num_tokens=4, **options)
        assert torch.equal(multi.sequences, alone.sequences), policy
        assert rounds(multi.acceptance_stats) == rounds(alone.acceptance_stats), policy
        assert multi.acceptance_stats.num_ngram_drafts > 0, policy


@pytest.mark.slow
def test_compiled_draft_steps_keep_the_text(fresh_compiler, same_draft):
    """Static caches and compiled forwards (aot_eager): the candidate block is always k wide, padded where a lookup
    finds fewer; the text is plain greedy and the rounds are the eager path's."""
    target = hf_semspec.attach(tiny_llama(seed=0))
    options = dict(assistant_model=same_draft, acceptance="exact", num_assistant_tokens=6, max_new_tokens=30,
                   eos_token_id=None, cache_implementation="static", return_dict_in_generate=True,
                   prompt_lookup_num_tokens=3)
    compiled = target.generate(REPEATING, compile_config=cpu_compile_config(), **options)
    eager = target.generate(REPEATING, disable_compile=True, **options)
    assert torch.equal(compiled.sequences, plain_greedy(target, REPEATING, max_new_tokens=30, eos_token_id=None))
    assert rounds(compiled.acceptance_stats) == rounds(eager.acceptance_stats)
    assert compiled.acceptance_stats.num_draft_forwards == eager.acceptance_stats.num_draft_forwards
    assert compiled.acceptance_stats.num_ngram_drafts > 0


# -- sampling ---------------------------------------------------------------------------------------------------------


def test_sampled_exact_with_multi_level_drafts_is_distributed_as_the_target():
    """1000 rows of one prompt whose end recurs, with a draft that gives the candidates a fair chance: sampled `exact`
    keeps the first new token distributed as the target's p. (In a batch this wide some row always rejects its first
    candidate, so each step keeps the rows' own draws at position 0, accepted candidates or draws from q without them:
    the accepted runs of one row are pinned by `test_sampled_drafts_are_distributed_as_the_drafts_q`.)"""
    target = hf_semspec.attach(tiny_llama(seed=0, vocab_size=16))
    draft = tiny_llama(seed=7, vocab_size=16)
    ids = torch.tensor([[7, 11, 13, 10, 13, 5, 11]])
    with torch.no_grad():
        logits = target(ids).logits[0, -1] / 2
    logits[EOS] = float("-inf")  # (min_new_tokens forbids it)
    p = torch.softmax(logits, -1)
    torch.manual_seed(5)
    out = target.generate(ids, assistant_model=draft, acceptance="exact", prompt_lookup_num_tokens=3,
                          num_assistant_tokens=4, do_sample=True, temperature=2.0, num_return_sequences=1000,
                          max_new_tokens=3, min_new_tokens=3, pad_token_id=PAD, return_dict_in_generate=True)
    first = out.sequences[:, ids.shape[1]]
    counts = torch.bincount(first, minlength=16)
    keep = p > 0.01
    assert chi_square_p_value(counts[keep], p[keep] / p[keep].sum()) > 1e-3
    assert out.acceptance_stats.num_accepted > 100  # (drafts were accepted, and rejected)
    assert out.acceptance_stats.num_accepted < out.acceptance_stats.num_drafted / 2


# -- every rule, every policy -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("do_sample", [False, True])
@pytest.mark.parametrize("policy", POLICIES.names())
@pytest.mark.parametrize("name", hf_semspec.available_rules())
def test_every_rule_and_policy_drafts_multi_level(attached, close_draft, rdk_draft, name, policy, do_sample):
    rule = RULES.get(name)
    if not (rule.supports_sampling if do_sample else rule.supports_greedy):
        pytest.skip(f"{name} does not define do_sample={do_sample}")
    draft = rdk_draft if rule.redistributes_draft else close_draft
    torch.manual_seed(0)
    out = attached.generate(REPEATING, assistant_model=draft, acceptance=name, draft_length=policy,
                            prompt_lookup_num_tokens=4, do_sample=do_sample, max_new_tokens=16, eos_token_id=None,
                            return_dict_in_generate=True)
    stats = out.acceptance_stats
    assert out.sequences.shape == (1, REPEATING.shape[1] + 16) and stats.num_new_tokens == 16
    assert 0 < stats.num_draft_forwards <= stats.num_drafted
    assert stats.num_draft_forwards + stats.num_ngram_drafts >= stats.num_drafted  # each draft: a forward or a hit
    if name == "exact" and not do_sample:
        assert torch.equal(out.sequences, plain_greedy(attached, REPEATING, max_new_tokens=16, eos_token_id=None))


# -- statistics -------------------------------------------------------------------------------------------------------


def test_draft_forwards_per_drafted_token_drop_below_one_on_repetitive_text(attached, same_draft):
    out = attached.generate(prompt(8), assistant_model=same_draft, acceptance="exact", num_assistant_tokens=8,
                            prompt_lookup_num_tokens=8, max_new_tokens=120, eos_token_id=None,
                            return_dict_in_generate=True)
    stats = out.acceptance_stats
    assert stats.draft_forwards_per_drafted_token < 0.5
    assert stats.num_ngram_drafts > stats.num_drafted / 2
    assert stats.num_ngram_hits == 0  # (rounds whose drafts prompt lookup alone found: not this mode)
    assert stats.to_dict()["num_ngram_drafts"] == stats.num_ngram_drafts
    assert (stats + stats).num_ngram_drafts == 2 * stats.num_ngram_drafts


def test_a_round_leaves_the_contexts_as_the_target_kept_them(close_draft):
    """`ModelDrafter.draft` ends the round it began in the n-gram contexts: its drafts, searched by its own later steps,
    are gone once it returns, so the next round's lookup searches only the tokens the loop appends (what the target
    kept). (Keeping rejected drafts would be a choice to measure, not a side effect.)"""
    ids = torch.tensor([[5, 9, 14, 22, 5, 9, 14, 22]])
    d = drafter(close_draft, ids, num_tokens=4)
    before = list(d.contexts.indexes[0].tokens)
    block = d.draft(batch_of(ids), max_tokens=6)
    assert block.num_tokens == 6
    assert d.contexts.indexes[0].tokens == before


def test_a_step_where_a_decoding_row_finds_no_candidate_drafts_one_token(close_draft):
    """Row 0's context repeats (its lookup finds candidates), row 1's does not: the step cannot confirm any candidate
    for row 1 (m = 0), so it drafts one token the usual way, a forward over the unseen slots only, not a forward widened
    by row 0's candidates."""
    ids = torch.tensor([[5, 9, 14, 22, 5, 9, 14, 22], [40, 41, 42, 43, 44, 45, 46, 47]])
    d = drafter(close_draft, ids, num_tokens=4)
    assert d.contexts.found(0, 1) and not d.contexts.found(1, 1)
    widths = []
    handle = close_draft.register_forward_pre_hook(
        lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        block = d.draft(batch_of(ids), max_tokens=2)
    finally:
        handle.remove()
    assert widths == [8, 1] and block.num_ngram_drafts == 0
