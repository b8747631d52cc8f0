"""Prompt-lookup drafts (`prompt_lookup_num_tokens`, no `assistant_model`) verified by every rule: the lookup is
transformers' (which n-gram, which occurrence, how many drafts), greedy `exact` is plain greedy decoding on dynamic and
static caches and in batches, sampled `exact` is distributed as the target, every rule and policy runs, the statistics
count lookups and no draft forwards, and bad settings are refused before any forward."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import EOS, batch_of, prompt, tiny_llama
from test_batched import PAD, left_padded, new_tokens
from test_exact_rule import chi_square_p_value
from test_static_cache import cpu_compile_config, fresh_compiler, plain_greedy  # noqa: F401 (a fixture)
from transformers import GenerationConfig
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

import hf_semspec
from hf_semspec import SemSpecConfigError
from hf_semspec.draft_length import POLICIES
from hf_semspec.ngram import NgramDrafter, NgramIndex, PromptLookup, ngram_drafts
from hf_semspec.rules import RULES

# A prompt whose last bigram (5, 9) occurred at its start: the first round drafts 14 22 5 9 ...
REPEATING = torch.tensor([[5, 9, 14, 22, 5, 9, 14, 22, 5, 9]])
NEW_TOKENS = 40


def _takes_lookup_drafts(name: str) -> bool:
    try:
        RULES.build(name, {}).check_assistant_model(None)
    except SemSpecConfigError:
        return False
    return True


def lookup_rules() -> list[str]:
    """The rules that verify drafts made without a draft model: all but those that say they need one (`rdk`
    redistributes a drafter's q; `ensemble` mixes the draft's q into p, and prompt lookup's q is one-hot)."""
    return [name for name in hf_semspec.available_rules() if _takes_lookup_drafts(name)]


def test_the_rules_that_need_a_draft_model_are_the_expected_ones():
    assert sorted(set(hf_semspec.available_rules()) - set(lookup_rules())) == ["ensemble", "rdk"]


# -- the lookup ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "context, num_tokens, max_ngram_size, drafts",
    [
        # the bigram 5 6 occurred at 0 and at 3: the first occurrence wins (transformers' choice), not the latest
        ([5, 6, 7, 5, 6, 9, 5, 6], 3, 2, [7, 5, 6]),
        # n from the largest down: the bigram 5 2 (first at 3) wins over the unigram 2 (first at 1) ...
        ([9, 2, 7, 5, 2, 8, 5, 2], 3, 2, [8, 5, 2]),
        # ... which is all that n = 1 looks for
        ([9, 2, 7, 5, 2, 8, 5, 2], 3, 1, [7, 5, 2]),
        # the bigram 8 6 never occurred before, the unigram 6 did
        ([5, 6, 7, 8, 6], 3, 2, [7, 8, 6]),
        # nothing recurs: no drafts
        ([5, 6, 7, 8], 3, 2, []),
        # fewer than k tokens after the occurrence: the context ends there
        ([5, 6, 5], 3, 2, [6, 5]),
        # n larger than the context allows: n = length − 1 at most
        ([4, 4], 5, 3, [4]),
        ([4], 5, 2, []),
        ([], 5, 2, []),
        # a trigram match, k = 1
        ([1, 2, 3, 4, 9, 1, 2, 3], 1, 3, [4]),
    ],
)
def test_lookup_worked_examples(context, num_tokens, max_ngram_size, drafts):
    assert ngram_drafts(context, num_tokens, max_ngram_size) == drafts


def transformers_drafts(context: list[int], num_tokens: int, max_ngram_size: int) -> list[int]:
    """transformers' own prompt lookup (no EOS, no logits processors) on `context`."""
    generator = PromptLookupCandidateGenerator(num_output_tokens=num_tokens, max_matching_ngram_size=max_ngram_size,
                                               max_length=10_000)
    ids = torch.tensor([context])
    candidates, _ = generator.get_candidates(ids)
    return candidates[0, len(context):].tolist()


def test_lookup_matches_transformers_prompt_lookup_and_grows_incrementally():
    """Random contexts over a few ids (many repeats), every k and n: the index, grown token by token as the loop grows
    it, drafts what transformers' `PromptLookupCandidateGenerator` proposes."""
    rng = random.Random(0)
    compared = hits = 0
    for _ in range(60):
        context = [rng.randrange(4 + rng.randrange(4)) for _ in range(rng.randrange(2, 24))]
        for max_ngram_size in (1, 2, 3):
            index = NgramIndex(max_ngram_size, context[:1])
            for end in range(2, len(context) + 1):
                index.extend(context[end - 1 : end])
                for num_tokens in (1, 3, 6):
                    expected = transformers_drafts(context[:end], num_tokens, max_ngram_size)
                    assert index.lookup(num_tokens) == expected, (context[:end], num_tokens, max_ngram_size)
                    compared, hits = compared + 1, hits + bool(expected)
    assert compared > 1000 and 0.3 < hits / compared < 1  # (the comparison saw matches and misses)


def test_the_drafter_pads_rows_that_found_fewer_and_reports_their_counts():
    """Three rows, left-padded: row 0 finds 3 drafts, row 1 one (its context ends), row 2 none. On dynamic caches γ is
    the most found; on static caches (`fixed_length`) the budget. q is one-hot on each draft; the padding is not in a
    row's context (row 1's padding 0s would otherwise match)."""
    ids = torch.tensor([[7, 5, 6, 8, 5, 6], [0, 0, 0, 9, 4, 4], [0, 0, 0, 1, 2, 0]])
    mask = (torch.arange(6) >= torch.tensor([[0], [3], [3]])).long()
    for fixed_length, gamma in ((False, 3), (True, 4)):
        drafter = NgramDrafter(ids, mask, PromptLookup(num_tokens=5), return_probs=True, vocab_size=16,
                               output_device=ids.device, fixed_length=fixed_length)
        batch = batch_of(ids, mask)
        block = drafter.draft(batch, max_tokens=4)
        assert block.num_tokens == gamma and block.num_per_row == (3, 1, 0) and block.num_forwards == 0
        assert block.tokens[0, :3].tolist() == [8, 5, 6] and block.tokens[1, 0].item() == 4
        assert torch.equal(block.probs, torch.nn.functional.one_hot(block.tokens, 16).float())
        assert batch.ids[:, 6 : 6 + gamma].tolist() == block.tokens.tolist()  # written into the round's slots
    # the loop hands over each row's new tokens: row 2, 1 2 0, now ends with a repeat of its 2
    drafter.append_tokens(2, [2])
    assert drafter.contexts.indexes[2].lookup(5) == [0, 2]
    # no row found anything: no drafts at all (a round of plain decoding), even with fixed_length
    lonely = NgramDrafter(ids[2:], mask[2:], PromptLookup(5), return_probs=False, vocab_size=16,
                          output_device=ids.device, fixed_length=True)
    block = lonely.draft(batch_of(ids[2:], mask[2:]), max_tokens=4)
    assert block.num_tokens == 0 and block.num_per_row == (0,) and block.probs is None


def test_drafts_end_at_the_first_eos():
    ids = torch.tensor([[5, 6, EOS, 7, 5, 6]])
    drafter = NgramDrafter(ids, None, PromptLookup(4), return_probs=False, vocab_size=16, output_device=ids.device,
                           stop_token_ids=frozenset({EOS}))
    block = drafter.draft(batch_of(ids), max_tokens=4)
    assert block.tokens.tolist() == [[EOS]] and block.num_per_row == (1,)


# -- greedy `exact` is plain greedy decoding ----------------------------------------------------------------------


@pytest.mark.parametrize("cache_implementation", [None, "static"])
@pytest.mark.parametrize("num_tokens", [1, 3, 10])
def test_greedy_exact_with_lookup_drafts_is_plain_greedy(attached, cache_implementation, num_tokens):
    for ids in (REPEATING, prompt(8)):
        out = attached.generate(ids, acceptance="exact", prompt_lookup_num_tokens=num_tokens,
                                max_new_tokens=NEW_TOKENS, eos_token_id=None, cache_implementation=cache_implementation,
                                return_dict_in_generate=True)
        assert torch.equal(out.sequences, plain_greedy(attached, ids, max_new_tokens=NEW_TOKENS, eos_token_id=None))
        stats = out.acceptance_stats
        assert stats.num_new_tokens == NEW_TOKENS and stats.num_draft_forwards == 0
        assert stats.num_ngram_hits > 0 and stats.num_drafted > 0
        assert max(stats.drafted_per_round) <= num_tokens


@pytest.mark.parametrize("cache_implementation", [None, "static"])
def test_a_batch_of_left_padded_rows_decodes_each_row_as_alone(attached, cache_implementation):
    """Rows find different numbers of drafts each round (padded, verified on their own), finish at different rounds
    (an EOS), and each row is its plain greedy text; on dynamic caches each row's statistics are those it gets alone
    (the drafts it found, those accepted, its rounds and hits)."""
    rows, ids, mask = left_padded()
    eos = plain_greedy(attached, rows[1][None], max_new_tokens=NEW_TOKENS, eos_token_id=None)[0, len(rows[1]) + 20]
    options = dict(acceptance="exact", prompt_lookup_num_tokens=4, max_new_tokens=NEW_TOKENS, eos_token_id=int(eos),
                   cache_implementation=cache_implementation, return_dict_in_generate=True)
    out = attached.generate(ids, attention_mask=mask, pad_token_id=PAD, **options)
    width = ids.shape[1]
    for i, row in enumerate(rows):
        expected = plain_greedy(attached, row[None], max_new_tokens=NEW_TOKENS, eos_token_id=int(eos))[0, len(row):]
        assert new_tokens(out.sequences[i], width) == expected.tolist(), f"row {i}"
        if cache_implementation is None:
            single = attached.generate(row[None], **options).acceptance_stats
            assert out.acceptance_stats_per_row[i] == single, f"row {i}"
    per_row = out.acceptance_stats_per_row
    assert sum(s.num_ngram_hits for s in per_row) == out.acceptance_stats.num_ngram_hits > 0
    # rows of one round found different counts, so some row was verified on fewer drafts than γ
    assert any(len(set(found)) > 1 for found in zip(*(s.drafted_per_round for s in per_row)))


def test_compiled_verify_with_lookup_drafts_is_plain_greedy(fresh_compiler):
    target = hf_semspec.attach(tiny_llama(seed=0))  # its own compiled forward
    out = target.generate(REPEATING, acceptance="exact", prompt_lookup_num_tokens=4, max_new_tokens=24,
                          cache_implementation="static", compile_config=cpu_compile_config())
    assert torch.equal(out, plain_greedy(target, REPEATING, max_new_tokens=24))


def test_the_same_from_a_passed_or_the_models_generation_config(attached):
    """k and n are read as transformers reads them; in a passed config they decode as in the call."""
    call = attached.generate(REPEATING, acceptance="exact", prompt_lookup_num_tokens=3, max_matching_ngram_size=1,
                             max_new_tokens=20, return_dict_in_generate=True)
    config = GenerationConfig(acceptance="exact", prompt_lookup_num_tokens=3, max_matching_ngram_size=1,
                              max_new_tokens=20, return_dict_in_generate=True)
    passed = attached.generate(REPEATING, generation_config=config)
    assert torch.equal(call.sequences, passed.sequences) and call.acceptance_stats == passed.acceptance_stats
    assert config.prompt_lookup_num_tokens == 3  # the caller's config is not changed
    model = hf_semspec.attach(tiny_llama(seed=0))
    model.generation_config.prompt_lookup_num_tokens = 3
    model.generation_config.max_matching_ngram_size = 1
    from_model = model.generate(REPEATING, acceptance="exact", max_new_tokens=20, return_dict_in_generate=True)
    assert from_model.acceptance_stats == call.acceptance_stats
    # an explicit None in the call turns the model's off: then acceptance needs a draft model
    with pytest.raises(SemSpecConfigError, match=r"`assistant_model` = None .*prompt_lookup_num_tokens=<tokens"):
        model.generate(REPEATING, acceptance="exact", prompt_lookup_num_tokens=None, max_matching_ngram_size=None,
                       max_new_tokens=4)


def test_a_models_default_rule_leaves_prompt_lookup_to_transformers(target):
    """A rule saved as the model's default decodes only with an assistant_model; prompt lookup alone stays stock."""
    model = hf_semspec.attach(tiny_llama(seed=0), acceptance="exact")
    out = model.generate(REPEATING, prompt_lookup_num_tokens=3, max_new_tokens=12, return_dict_in_generate=True)
    assert not hasattr(out, "acceptance_stats")
    assert torch.equal(out.sequences, plain_greedy(target, REPEATING, max_new_tokens=12))


# -- sampling: lossless ---------------------------------------------------------------------------------------------


def test_sampled_exact_with_lookup_drafts_is_distributed_as_the_target():
    """1000 rows of one prompt whose last token occurred before, so every row's first round drafts the token after
    it (x): `exact` with q one-hot on x must keep the first new token distributed as p, i.e. accept x with
    probability p(x) and otherwise draw from p without x (drawing from p again, or always accepting, fails)."""
    target = hf_semspec.attach(tiny_llama(seed=0, vocab_size=16))
    ids = torch.tensor([[7, 11, 4, 9, 13, 11]])  # the unigram 11 first occurred at 1: x = 4
    with torch.no_grad():
        logits = target(ids).logits[0, -1] / 1.5
    logits[EOS] = float("-inf")  # (min_new_tokens forbids it)
    p = torch.softmax(logits, -1)
    assert 0.05 < p[4] < 0.7  # a draft the test can tell apart from "always" and "never accepted"
    torch.manual_seed(5)
    out = target.generate(ids, acceptance="exact", prompt_lookup_num_tokens=3, do_sample=True, temperature=1.5,
                          num_return_sequences=1000, max_new_tokens=3, min_new_tokens=3, pad_token_id=PAD,
                          return_dict_in_generate=True)
    first = out.sequences[:, ids.shape[1]]
    counts = torch.bincount(first, minlength=16)
    keep = p > 0.01
    assert chi_square_p_value(counts[keep], p[keep] / p[keep].sum()) > 1e-3
    assert out.acceptance_stats.num_ngram_hits >= 1000  # every row's first round drafted x
    assert len({tuple(r) for r in out.sequences[:, ids.shape[1]:].tolist()}) > 100


# -- every rule, every policy ---------------------------------------------------------------------------------------


def test_rdk_is_refused_without_a_draft_model(attached, monkeypatch):
    monkeypatch.setitem(vars(attached), "forward", lambda *a, **k: pytest.fail("a forward ran"))
    with pytest.raises(SemSpecConfigError, match=r"`acceptance` = 'rdk' is not valid: allowed a rule that verifies "
                                                 r"drafts made without a draft model \(prompt_lookup_num_tokens\).*"
                                                 r"Fix: use acceptance='exact'"):
        attached.generate(REPEATING, acceptance="rdk", prompt_lookup_num_tokens=3, max_new_tokens=4)


@pytest.mark.parametrize("do_sample", [False, True])
@pytest.mark.parametrize("policy", POLICIES.names())
@pytest.mark.parametrize("name", lookup_rules())
def test_every_rule_and_policy_decodes_with_lookup_drafts(attached, name, policy, do_sample):
    rule = RULES.get(name)
    if not (rule.supports_sampling if do_sample else rule.supports_greedy):
        pytest.skip(f"{name} does not define do_sample={do_sample}")
    torch.manual_seed(0)
    out = attached.generate(REPEATING, acceptance=name, draft_length=policy, prompt_lookup_num_tokens=6,
                            do_sample=do_sample, max_new_tokens=16, eos_token_id=None, return_dict_in_generate=True)
    stats = out.acceptance_stats
    assert out.sequences.shape == (1, REPEATING.shape[1] + 16) and stats.num_new_tokens == 16
    assert stats.num_ngram_hits >= 1 and stats.num_draft_forwards == 0  # (the prompt's first round always hits)
    assert max(stats.drafted_per_round) <= 6
    if name == "exact" and not do_sample:  # whatever the lengths, greedy exact is plain greedy decoding
        assert torch.equal(out.sequences, plain_greedy(attached, REPEATING, max_new_tokens=16, eos_token_id=None))


# -- statistics -----------------------------------------------------------------------------------------------------


def test_lookup_drafts_are_accepted_on_repetitive_text(attached):
    """Greedy decoding of the tiny model falls into a cycle: once it has, the lookups find the next tokens and `exact`
    accepts them, several per forward."""
    out = attached.generate(prompt(8), acceptance="exact", prompt_lookup_num_tokens=8, max_new_tokens=120,
                            eos_token_id=None, return_dict_in_generate=True)
    stats = out.acceptance_stats
    assert stats.num_accepted > 0 and stats.mean_accepted_length > 1.5
    assert stats.num_target_forwards < 120 / 1.5
    assert stats.num_draft_forwards == 0 and stats.draft_forwards_per_drafted_token == 0.0
    assert 0 < stats.num_ngram_hits <= stats.num_target_forwards
    assert stats.to_dict()["num_ngram_hits"] == stats.num_ngram_hits


def test_a_draft_model_counts_one_forward_per_drafted_token(attached, close_draft):
    out = attached.generate(prompt(8), assistant_model=close_draft, acceptance="exact", num_assistant_tokens=4,
                            max_new_tokens=30, return_dict_in_generate=True)
    stats = out.acceptance_stats
    assert stats.num_draft_forwards == stats.num_drafted > 0 and stats.num_ngram_hits == 0
    assert stats.draft_forwards_per_drafted_token == 1.0
    # a batch's forwards draft for every row: the call's are the longest row's, not their sum
    rows, ids, mask = left_padded()
    out = attached.generate(ids, attention_mask=mask, pad_token_id=PAD, assistant_model=close_draft,
                            acceptance="exact", num_assistant_tokens=4, max_new_tokens=20, eos_token_id=None,
                            return_dict_in_generate=True)
    per_row = out.acceptance_stats_per_row
    assert out.acceptance_stats.num_draft_forwards == max(s.num_draft_forwards for s in per_row)
    assert out.acceptance_stats.num_draft_forwards < sum(s.num_draft_forwards for s in per_row)


def test_merged_statistics_keep_the_new_counts():
    a = hf_semspec.AcceptanceStats(num_draft_forwards=4, num_ngram_hits=1)
    b = hf_semspec.AcceptanceStats(num_draft_forwards=0, num_ngram_hits=3)
    assert (a + b).num_draft_forwards == 4 and (a + b).num_ngram_hits == 4
    from benchmarks.metrics import acceptance_from_dict

    old = {k: v for k, v in a.to_dict().items() if k not in ("num_draft_forwards", "num_ngram_hits")}
    assert acceptance_from_dict(old).num_ngram_hits == 0  # files written before these counts still load
    assert acceptance_from_dict(a.to_dict()) == a


# -- refused settings -----------------------------------------------------------------------------------------------


@pytest.fixture
def no_forward(monkeypatch, attached, close_draft):
    """Fails the test if any model forward runs: errors must come before decoding starts."""
    for model in (attached, close_draft):
        monkeypatch.setitem(vars(model), "forward", lambda *a, **k: pytest.fail("a forward ran before the error"))
    return attached


@pytest.mark.parametrize("value", [0, 129, 2.5, True, "3"])
def test_a_bad_number_of_lookup_tokens_is_refused(no_forward, value):
    with pytest.raises(SemSpecConfigError, match=rf"`prompt_lookup_num_tokens` = {value!r} is not valid: allowed an int "
                                                 r"in \[1, 128\].*Fix: pass e.g. prompt_lookup_num_tokens=10"):
        no_forward.generate(REPEATING, acceptance="exact", prompt_lookup_num_tokens=value, max_new_tokens=4)


@pytest.mark.parametrize("value", [0, -1, 1.5])
def test_a_bad_ngram_size_is_refused(no_forward, value):
    with pytest.raises(SemSpecConfigError, match=rf"`max_matching_ngram_size` = {value!r} is not valid: allowed an "
                                                 r"int ≥ 1 .*Fix: pass e.g. max_matching_ngram_size=2"):
        no_forward.generate(REPEATING, acceptance="exact", prompt_lookup_num_tokens=3, max_matching_ngram_size=value,
                            max_new_tokens=4)


def test_an_ngram_size_without_lookup_tokens_is_refused(no_forward, close_draft):
    for extra in ({}, {"assistant_model": close_draft}):
        with pytest.raises(SemSpecConfigError, match=r"`max_matching_ngram_size` = 3 is not valid: allowed only "
                                                     r"together with prompt_lookup_num_tokens"):
            no_forward.generate(REPEATING, acceptance="exact", max_matching_ngram_size=3, max_new_tokens=4, **extra)


def test_a_models_lookup_setting_with_a_draft_model_drafts_multi_level_unless_turned_off(close_draft):
    model = hf_semspec.attach(tiny_llama(seed=0))
    model.generation_config.prompt_lookup_num_tokens = 3
    out = model.generate(REPEATING, assistant_model=close_draft, acceptance="exact", max_new_tokens=40,
                         return_dict_in_generate=True)
    stats = out.acceptance_stats
    assert 0 < stats.num_draft_forwards < stats.num_drafted and stats.num_ngram_drafts > 0
    # turned off for the call: the draft model drafts alone
    out = model.generate(REPEATING, assistant_model=close_draft, acceptance="exact", prompt_lookup_num_tokens=None,
                         max_new_tokens=8, return_dict_in_generate=True)
    stats = out.acceptance_stats
    assert stats.num_draft_forwards == stats.num_drafted > 0 and stats.num_ngram_hits == stats.num_ngram_drafts == 0
