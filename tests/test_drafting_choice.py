"""`drafting="auto"` (hf_semspec.drafting_choice): the choice between the draft model alone, multi-level drafting and
prompt lookup alone. Pinned here: the prices and the choice on given costs; the host replay of multi-level drafting
against the drafter's own forwards; greedy output of each way equal to the draft alone's (every greedy rule; `exact`
equal to plain greedy, prompt lookup included), on dynamic and static caches and in a batch; the costs kept per
process and pair; what the statistics say; the field's validation and its JSON round trip."""

from __future__ import annotations

import pytest
import torch
from conftest import batch_of, perturbed_copy, prompt
from test_batched import PAD, alone, left_padded
from test_multi_level_drafting import drafter, greedy_rules
from test_prompt_lookup import REPEATING
from test_static_cache import plain_greedy

import hf_semspec
from hf_semspec import drafting_choice
from hf_semspec.drafting_choice import (
    DRAFT,
    LOOKUP,
    MULTI_LEVEL,
    DraftingCosts,
    DraftingCounts,
    choose_drafting,
    costs_for,
    multi_level_forwards,
    predicted_seconds_per_token,
)
from hf_semspec.errors import SemSpecConfigError
from hf_semspec.ngram import PromptLookup, RowContexts
from transformers import GenerationConfig

ALL = (DRAFT, MULTI_LEVEL, LOOKUP)
NEW_TOKENS = 40


def costs(step=None, wide=None, verify=None) -> DraftingCosts:
    given = DraftingCosts()
    for name, value in (("step", step), ("wide", wide), ("verify", verify)):
        if value is not None:
            given.record(name, value)
    return given


def counts(rounds=10, drafts=5.0, tokens=4.0, wide=1.0, steps=2.0, lookups=10, lookup_tokens=1.5) -> DraftingCounts:
    """Per-round figures, as the sums `DraftingCounts` keeps."""
    return DraftingCounts(model_rounds=rounds, drafts=drafts * rounds, tokens=tokens * rounds,
                          multi_level_rounds=rounds, wide_forwards=wide * rounds, step_forwards=steps * rounds,
                          lookups=lookups, lookup_tokens=lookup_tokens * lookups)


# -- the prices and the choice ---------------------------------------------------------------------------------------


def test_the_prices_are_the_documented_formulas():
    """draft (D·c₁ + c_v)/T, multi_level (W·c_w + S·c₁ + c_v)/T, lookup c_v/T_lookup, each from per-round means
    (the lookups scored need not be as many as the rounds counted)."""
    prices = predicted_seconds_per_token(costs(step=0.1, wide=0.3, verify=0.5), counts(lookups=7), ALL)
    assert prices[DRAFT] == pytest.approx((5 * 0.1 + 0.5) / 4)
    assert prices[MULTI_LEVEL] == pytest.approx((1 * 0.3 + 2 * 0.1 + 0.5) / 4)
    assert prices[LOOKUP] == pytest.approx(0.5 / 1.5)


def test_a_wide_forward_that_costs_little_makes_multi_level_drafting_the_choice():
    """AVX-512 BF16-like: a 7-wide draft forward 1.4 steps; 1 wide + 2 one-token forwards draft the round's 5."""
    chosen, reason = choose_drafting(costs(step=0.09, wide=0.126, verify=0.3), counts(), ALL)
    assert chosen == MULTI_LEVEL
    assert reason["ms_per_token"][MULTI_LEVEL] < reason["ms_per_token"][DRAFT] < reason["ms_per_token"][LOOKUP]
    assert reason["draft_wide_ms"] == pytest.approx(126.0)


def test_a_wide_forward_that_costs_several_steps_keeps_the_draft_alone():
    """The AVX2 bf16 case of the README: a 7-wide draft forward costs 4.7 one-token steps."""
    chosen, reason = choose_drafting(costs(step=0.092, wide=0.43, verify=0.3), counts(), ALL)
    assert chosen == DRAFT
    assert reason["ms_per_token"][MULTI_LEVEL] > reason["ms_per_token"][DRAFT]


def test_lookups_that_hit_make_prompt_lookup_alone_the_choice_only_where_it_is_a_way():
    """Code-like text: a lookup at a round's start would have committed 5 tokens, at no draft cost."""
    measured, hits = costs(step=0.09, wide=0.126, verify=0.3), counts(lookup_tokens=5.0)
    assert choose_drafting(measured, hits, ALL)[0] == LOOKUP
    chosen, reason = choose_drafting(measured, hits, (DRAFT, MULTI_LEVEL))  # a lossy rule
    assert chosen == MULTI_LEVEL and LOOKUP not in reason["ms_per_token"]


def test_a_way_with_an_unmeasured_cost_is_not_chosen_and_ties_go_to_the_draft_alone():
    hits = counts(lookup_tokens=50.0)
    chosen, reason = choose_drafting(costs(step=0.09, verify=None), hits, ALL)
    assert chosen == DRAFT and reason["ms_per_token"] == {DRAFT: None, MULTI_LEVEL: None, LOOKUP: None}
    chosen, reason = choose_drafting(costs(step=0.09, verify=0.3), counts(), (DRAFT, MULTI_LEVEL))
    assert chosen == DRAFT and reason["ms_per_token"][MULTI_LEVEL] is None  # c_w unmeasured, W > 0
    # No wide forward to pay for: multi-level costs what the draft alone does, and the tie keeps the draft alone.
    chosen, reason = choose_drafting(costs(step=0.1, verify=0.3), counts(wide=0.0, steps=5.0), (DRAFT, MULTI_LEVEL))
    assert reason["ms_per_token"][MULTI_LEVEL] == reason["ms_per_token"][DRAFT] and chosen == DRAFT


def test_each_cost_is_the_median_of_its_last_timings():
    kept = DraftingCosts()
    for seconds in [5.0] + [1.0] * 40 + [9.0, 9.0]:
        kept.record("step", seconds)
    assert len(kept.step) == 32 and kept.estimate("step") == 1.0 and kept.estimate("wide") is None


# -- the replay of multi-level drafting ------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [0.0, 0.05])
def test_the_host_replay_counts_the_forwards_multi_level_drafting_makes(target, scale):
    """A draft-alone round's drafts replayed on the host give the wide and one-token forwards that multi-level
    drafting makes for the same drafts: the target's copy (every candidate confirmed) and a noisy draft."""
    draft = perturbed_copy(target, scale, seed=3)
    ids = plain_greedy(target, prompt(8), max_new_tokens=24, eos_token_id=None)
    for max_tokens in (1, 3, 8):
        alone = drafter(draft, ids, num_tokens=None).draft(batch_of(ids), max_tokens=max_tokens)
        multi = drafter(draft, ids, num_tokens=4).draft(batch_of(ids), max_tokens=max_tokens)
        assert torch.equal(multi.tokens, alone.tokens)
        contexts = RowContexts(ids, None, PromptLookup(4, 2))
        wide, steps = multi_level_forwards(contexts, [0], alone.tokens.tolist(), 4)
        assert (wide, wide + steps) == (multi.num_wide_forwards, multi.num_forwards)
        assert contexts.found(0, 4) == RowContexts(ids, None, PromptLookup(4, 2)).found(0, 4)  # rolled back


def test_the_replay_takes_the_fewest_candidates_and_matches_over_the_rows(target):
    """Two rows: a step confirms what every row confirms (the row that found fewer candidates, or matched fewer,
    limits the step), as the drafter's own multi-level step does for a batch."""
    draft = perturbed_copy(target, 0.05, seed=3)
    # the target's own cyclic text (every lookup confirmed), and a random one of the same length
    rows = [plain_greedy(target, prompt(8), max_new_tokens=16, eos_token_id=None), prompt(24, seed=5)]
    ids = torch.cat(rows)
    batch = batch_of(ids)
    alone = drafter(draft, ids, num_tokens=None).draft(batch, max_tokens=8)
    multi = drafter(draft, ids, num_tokens=4).draft(batch_of(ids), max_tokens=8)
    assert torch.equal(multi.tokens, alone.tokens)
    wide, steps = multi_level_forwards(RowContexts(ids, None, PromptLookup(4, 2)), [0, 1], alone.tokens.tolist(), 4)
    assert (wide, wide + steps) == (multi.num_wide_forwards, multi.num_forwards)
    one_row = [multi_level_forwards(RowContexts(row, None, PromptLookup(4, 2)), [0], alone.tokens[i : i + 1].tolist(), 4)
               for i, row in enumerate(rows)]
    assert one_row[0] != one_row[1]  # (the rows differ, so the batch's count is a choice between them)


# -- what the drafter counts while it explores ------------------------------------------------------------------------


def auto_drafter(model, ids, lookup=PromptLookup(3, 2)) -> drafting_choice.AutoDrafter:
    from hf_semspec.ngram import NgramDrafter

    model_drafter = drafter(model, ids, num_tokens=lookup.num_tokens)
    model_drafter.contexts = RowContexts(ids, None, lookup)
    lookup_drafter = NgramDrafter(ids, None, lookup, return_probs=False, vocab_size=model.config.vocab_size,
                                  output_device=ids.device)
    return drafting_choice.AutoDrafter(model_drafter, lookup_drafter, DraftingCosts(), ids.device)


def test_a_lookup_is_scored_against_the_tokens_the_row_then_commits(close_draft):
    """Context 5 9 14 22 5 9 14 22 5 9: the lookup at the round's start proposes 14 22 5. Committed 14 22 then 7: it
    would have had 2 drafts accepted (a round of 3 tokens). A lookup still matching when the call chooses counts what
    it matched so far."""
    auto = auto_drafter(close_draft, REPEATING)
    batch = batch_of(REPEATING)
    auto._open_lookups(batch, max_tokens=5)
    auto.append_tokens(0, [14])
    assert auto.counts.lookups == 0  # still open: its first candidate matched
    auto.append_tokens(0, [22, 7, 8])
    assert (auto.counts.lookups, auto.counts.lookup_tokens) == (1, 3)
    auto._open_lookups(batch, max_tokens=5)  # the context now ends 22 7 8: nothing recurs
    auto.append_tokens(0, [1])
    assert (auto.counts.lookups, auto.counts.lookup_tokens) == (2, 4)  # found nothing: a round of 1
    auto.append_tokens(0, [14, 22, 5, 9])
    auto._open_lookups(batch, max_tokens=2)  # ... 14 22 5 9: proposes 14 22 (k capped by the round's budget)
    auto.append_tokens(0, [14])
    auto._close_lookups()
    assert (auto.counts.lookups, auto.counts.lookup_tokens) == (3, 6)


def test_a_rounds_tokens_are_counted_per_decoding_row(close_draft):
    ids = torch.cat([REPEATING, REPEATING])
    auto = auto_drafter(close_draft, ids)
    batch = batch_of(ids)
    block = auto.model_drafter.draft(batch, max_tokens=3, multi_level=False)
    auto._count_round(DRAFT, batch, block)
    auto.append_tokens(0, [1, 2, 3, 4])
    auto.append_tokens(1, [1, 2])
    assert (auto.counts.model_rounds, auto.counts.drafts, auto.counts.tokens) == (1, 3, 3.0)  # 6 tokens over 2 rows


def test_the_first_timing_of_each_cost_in_a_call_is_dropped(close_draft):
    auto = auto_drafter(close_draft, REPEATING)
    auto._record("step", 9.0)  # a compilation, say
    auto._record("step", 0.1)
    auto._record("wide", 5.0)
    assert auto.costs.step == [0.1] and auto.costs.wide == []


# -- greedy output: each way gives the draft alone's -----------------------------------------------------------------


@pytest.fixture
def forced(monkeypatch):
    """`force(mode)`: the choice made after the exploration is `mode`, whatever was measured."""
    def force(mode):
        monkeypatch.setattr(drafting_choice, "choose_drafting",
                            lambda costs, counts, modes: (mode, {"ms_per_token": {}, "forced": True}))
    return force


@pytest.mark.parametrize("mode", [DRAFT, MULTI_LEVEL, LOOKUP])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_greedy_exact_gives_plain_greedy_whichever_way_drafts(attached, close_draft, forced, mode, cache):
    forced(mode)
    ids = REPEATING
    options = {} if cache == "dynamic" else {"cache_implementation": "static"}
    out = attached.generate(ids, assistant_model=close_draft, acceptance="exact", drafting="auto",
                            max_new_tokens=NEW_TOKENS, return_dict_in_generate=True, **options)
    assert torch.equal(out.sequences, plain_greedy(attached, ids, max_new_tokens=NEW_TOKENS))
    stats = out.acceptance_stats
    assert stats.drafting == mode and stats.drafting_reason["decided_at_round"] == drafting_choice.EXPLORE_ROUNDS + 1
    assert stats.num_new_tokens == NEW_TOKENS
    rounds_after = len(stats.drafted_per_round) - drafting_choice.EXPLORE_ROUNDS - 1
    assert rounds_after > 0  # the choice decoded part of the call
    if mode == LOOKUP:  # the draft model stopped: only the exploration's forwards
        assert stats.num_ngram_hits > 0


# (rdk needs a pruned drafter with a kernel: test_multi_level_drafting.test_pruned_drafters_draft_as_alone)
@pytest.mark.parametrize("rule", [name for name in greedy_rules() if name != "rdk"])
def test_every_greedy_rule_gives_the_draft_alones_text_and_rounds_with_the_draft_models_ways(
        attached, close_draft, forced, rule):
    """Multi-level drafting drafts the draft's own tokens, so every rule accepts what it accepts from the draft
    alone; prompt lookup alone is a way for a lossless rule only (a lossy one accepts other drafts from it)."""
    kwargs = dict(assistant_model=close_draft, acceptance=rule, max_new_tokens=NEW_TOKENS, eos_token_id=None,
                  return_dict_in_generate=True, num_assistant_tokens=3)  # (past the exploration's rounds)
    unforced = attached.generate(REPEATING, drafting="auto", **kwargs)
    lossless = hf_semspec.rules.RULES.get(rule).lossless
    assert (LOOKUP in unforced.acceptance_stats.drafting_reason["ms_per_token"]) == lossless
    forced(MULTI_LEVEL)
    alone = attached.generate(REPEATING, **kwargs)
    auto = attached.generate(REPEATING, drafting="auto", **kwargs)
    assert auto.acceptance_stats.drafting == MULTI_LEVEL
    assert torch.equal(auto.sequences, alone.sequences)
    assert auto.acceptance_stats.drafted_per_round == alone.acceptance_stats.drafted_per_round
    assert auto.acceptance_stats.accepted_per_round == alone.acceptance_stats.accepted_per_round


def test_rows_that_end_during_and_after_the_exploration_get_their_text_alone(attached, close_draft, forced):
    """A dynamic batch whose rows end at EOS, some while the call explores, some after it chose prompt lookup alone
    (rows leave the batch, and the drafters' caches and contexts follow): each row's text is its own, and a row that
    ended before the choice reports none."""
    forced(LOOKUP)
    rows, ids, mask = left_padded()
    reference = [alone(attached, row, max_new_tokens=30, eos_token_id=None).tolist() for row in rows]
    eos = reference[1][3]  # row 1's 4th new token: it ends in the first rounds
    out = attached.generate(ids, attention_mask=mask, assistant_model=close_draft, acceptance="exact",
                            drafting="auto", max_new_tokens=30, pad_token_id=PAD, eos_token_id=eos,
                            num_assistant_tokens=2, return_dict_in_generate=True)
    for i, row in enumerate(rows):
        expected = alone(attached, row, max_new_tokens=30, eos_token_id=eos).tolist()
        assert out.sequences[i, ids.shape[1] : ids.shape[1] + len(expected)].tolist() == expected
    per_row = out.acceptance_stats_per_row
    assert per_row[1].drafting is None and per_row[1].num_new_tokens <= 4
    assert any(stats.drafting == LOOKUP for stats in per_row)


@pytest.mark.parametrize("mode", [MULTI_LEVEL, LOOKUP])
def test_a_batch_gives_each_row_its_text_alone(attached, close_draft, forced, mode):
    forced(mode)
    rows, ids, mask = left_padded()
    out = attached.generate(ids, attention_mask=mask, assistant_model=close_draft, acceptance="exact",
                            drafting="auto", max_new_tokens=24, pad_token_id=PAD, eos_token_id=None,
                            num_assistant_tokens=3, return_dict_in_generate=True)
    for i, row in enumerate(rows):
        assert out.sequences[i, ids.shape[1]:].tolist() == alone(attached, row, max_new_tokens=24,
                                                                 eos_token_id=None).tolist()
    assert out.acceptance_stats.drafting == mode


def test_the_choice_is_what_the_measured_figures_price_cheapest(attached, close_draft):
    """Unforced: the drafting chosen is `choose_drafting`'s on the figures the statistics report."""
    out = attached.generate(REPEATING, assistant_model=close_draft, acceptance="exact", drafting="auto",
                            max_new_tokens=NEW_TOKENS, return_dict_in_generate=True)
    reason = out.acceptance_stats.drafting_reason
    priced = {mode: ms for mode, ms in reason["ms_per_token"].items() if ms is not None}
    assert set(priced) == set(ALL)  # every figure was measured in the first call
    cheapest = min(priced, key=priced.get)
    assert out.acceptance_stats.drafting == (cheapest if priced[cheapest] < priced[DRAFT] else DRAFT)
    assert torch.equal(out.sequences, plain_greedy(attached, REPEATING, max_new_tokens=NEW_TOKENS))


def test_patched_costs_decide_the_choice(attached, close_draft, monkeypatch):
    """The process's costs for the pair given, timing switched off: a cheap wide forward with a lossy rule chooses
    multi-level drafting, an expensive one the draft alone (the text is the draft alone's either way)."""
    monkeypatch.setattr(DraftingCosts, "record", lambda self, name, seconds: None)
    kwargs = dict(assistant_model=close_draft, acceptance="fly", max_new_tokens=NEW_TOKENS, eos_token_id=None,
                  num_assistant_tokens=4, return_dict_in_generate=True, drafting="auto")
    lookup = drafting_choice.DEFAULT_LOOKUP
    chosen = {}
    for wide in (0.11, 0.9):
        hf_semspec.forget_drafting_costs()
        kept = costs_for(attached, close_draft, lookup, static=False, gamma=4)
        kept.step[:], kept.wide[:], kept.verify[:] = [0.1], [wide], [0.5]
        out = attached.generate(REPEATING, **kwargs)
        chosen[wide] = out.acceptance_stats.drafting
        assert out.acceptance_stats.drafting_reason["draft_wide_ms"] == pytest.approx(wide * 1000)
    assert chosen == {0.11: MULTI_LEVEL, 0.9: DRAFT}


# -- the costs kept per process --------------------------------------------------------------------------------------


def test_costs_are_kept_per_pair_dtype_and_cache_kind_and_forgotten_on_request(attached, close_draft):
    lookup = drafting_choice.DEFAULT_LOOKUP
    attached.generate(REPEATING, assistant_model=close_draft, acceptance="exact", drafting="auto",
                      max_new_tokens=NEW_TOKENS)
    kept = costs_for(attached, close_draft, lookup, static=False, gamma=5)
    assert kept.estimate("step") is not None and kept.estimate("verify") is not None
    for other in (dict(static=True, gamma=5), dict(static=False, gamma=4), dict(static=False, gamma=5, batch_size=2),
                  dict(static=False, gamma=5, compiled=True)):
        assert costs_for(attached, close_draft, lookup, **other).estimate("step") is None
    assert costs_for(attached, close_draft, PromptLookup(3, 2), static=False, gamma=5).estimate("step") is None
    samples = len(kept.verify)
    second = attached.generate(REPEATING, assistant_model=close_draft, acceptance="exact", drafting="auto",
                               max_new_tokens=NEW_TOKENS, return_dict_in_generate=True)
    # The second call adds to the first's (and starts with them). Its verify forwards are timed in every exploring
    # round but the first two; which of the draft's costs it times again depends on the way it explores (the cheaper
    # by the timings so far), so those are not counted here.
    assert len(kept.verify) > samples
    assert second.acceptance_stats.drafting_reason["draft_step_ms"] is not None
    hf_semspec.forget_drafting_costs()
    assert costs_for(attached, close_draft, lookup, static=False, gamma=5).estimate("step") is None


# -- statistics -------------------------------------------------------------------------------------------------------


def test_the_statistics_say_how_every_call_drafted(attached, close_draft):
    common = dict(acceptance="exact", max_new_tokens=12, return_dict_in_generate=True)
    alone = attached.generate(REPEATING, assistant_model=close_draft, **common).acceptance_stats
    multi = attached.generate(REPEATING, assistant_model=close_draft, prompt_lookup_num_tokens=3,
                              **common).acceptance_stats
    lookup = attached.generate(REPEATING, prompt_lookup_num_tokens=3, **common).acceptance_stats
    assert (alone.drafting, multi.drafting, lookup.drafting) == (DRAFT, MULTI_LEVEL, LOOKUP)
    assert alone.drafting_reason is None
    assert (alone + alone).drafting == DRAFT and (alone + lookup).drafting == hf_semspec.stats.MIXED
    short = attached.generate(REPEATING, assistant_model=close_draft, drafting="auto", **common).acceptance_stats
    # 12 tokens end the call while it explores: nothing chosen, the figures it had
    assert short.drafting is None and short.drafting_reason["decided_at_round"] is None
    assert short.to_dict()["drafting_reason"]["rounds_counted"] >= 1


def test_sampling_with_auto_runs_and_explains(attached, close_draft):
    torch.manual_seed(0)
    out = attached.generate(REPEATING, assistant_model=close_draft, acceptance="exact", drafting="auto",
                            do_sample=True, max_new_tokens=NEW_TOKENS, eos_token_id=None,
                            return_dict_in_generate=True)
    stats = out.acceptance_stats
    assert stats.num_new_tokens == NEW_TOKENS and stats.drafting in ALL
    assert stats.drafting_reason["decided_at_round"] == drafting_choice.EXPLORE_ROUNDS + 1


# -- the field --------------------------------------------------------------------------------------------------------


def test_an_unknown_value_is_refused_naming_the_field_and_the_values(attached, close_draft):
    with pytest.raises(SemSpecConfigError, match=r"`drafting` = 'fast' is not valid: allowed None .* or 'auto'"):
        attached.generate(REPEATING, assistant_model=close_draft, acceptance="exact", drafting="fast")
    config = GenerationConfig(drafting="multi", max_new_tokens=4)
    with pytest.raises(SemSpecConfigError, match=r"`generation_config.drafting` = 'multi'"):
        attached.generate(REPEATING, assistant_model=close_draft, acceptance="exact", generation_config=config)


def test_auto_needs_a_draft_model_and_a_rule(attached):
    with pytest.raises(SemSpecConfigError, match=r"`drafting` = 'auto' .* None without assistant_model"):
        attached.generate(REPEATING, acceptance="exact", prompt_lookup_num_tokens=3, drafting="auto")
    with pytest.raises(SemSpecConfigError, match=r"`drafting` = 'auto' .* only together with an acceptance rule"):
        attached.generate(REPEATING, drafting="auto", max_new_tokens=4)


def test_the_models_default_is_read_and_an_explicit_none_turns_it_off(close_draft, monkeypatch):
    from conftest import tiny_llama

    target = hf_semspec.attach(tiny_llama(seed=0))
    target.generation_config.drafting = "auto"
    common = dict(assistant_model=close_draft, acceptance="exact", max_new_tokens=24, return_dict_in_generate=True)
    assert target.generate(REPEATING, **common).acceptance_stats.drafting_reason is not None
    off = target.generate(REPEATING, drafting=None, **common).acceptance_stats
    assert off.drafting == DRAFT and off.drafting_reason is None


def test_rdk_never_chooses_prompt_lookup_alone(attached, rdk_draft):
    """rdk redistributes the drafter's q through its kernel: prompt lookup alone has neither (and is refused for it)."""
    out = attached.generate(REPEATING, assistant_model=rdk_draft, acceptance="rdk", drafting="auto",
                            max_new_tokens=NEW_TOKENS, eos_token_id=None, num_assistant_tokens=3,
                            return_dict_in_generate=True)
    assert set(out.acceptance_stats.drafting_reason["ms_per_token"]) == {DRAFT, MULTI_LEVEL}


def test_the_field_survives_json_and_the_model_default_is_read(attached, close_draft, tmp_path):
    config = GenerationConfig(acceptance="exact", drafting="auto", prompt_lookup_num_tokens=3, max_new_tokens=24)
    config.save_pretrained(tmp_path)
    loaded = GenerationConfig.from_pretrained(tmp_path)
    assert loaded.drafting == "auto"
    out = attached.generate(REPEATING, assistant_model=close_draft, generation_config=loaded,
                            return_dict_in_generate=True)
    assert out.acceptance_stats.drafting_reason is not None
    assert costs_for(attached, close_draft, PromptLookup(3, 2), static=False, gamma=5).estimate("step") is not None


def test_prompt_lookup_gives_way_when_its_recent_rounds_cost_more_than_the_draft_models(close_draft, monkeypatch):
    """Chosen from the first rounds' lookups, prompt lookup alone is priced again every REVIEW_ROUNDS rounds from its
    last REVIEW_WINDOW: rounds of 1 token at c_v each cost more than the draft alone's (D·c₁ + c_v)/T, so the call
    goes back to the draft alone; rounds that commit many tokens keep it; static caches never leave it."""
    auto = auto_drafter(close_draft, REPEATING)
    auto.costs.step[:], auto.costs.verify[:] = [0.1], [0.5]
    auto.counts = counts(drafts=5.0, tokens=4.0)  # the draft alone: (5·0.1 + 0.5)/4 = 0.25 s a token
    auto.chosen, auto.reason = LOOKUP, {}
    auto._lookup_rounds = [5.0] * drafting_choice.REVIEW_ROUNDS  # 0.1 s a token: lookup stays
    auto._review_lookup()
    assert auto.chosen == LOOKUP
    auto._lookup_rounds += [1.0] * drafting_choice.REVIEW_ROUNDS  # the last 8: 3 tokens a round → 0.167: stays
    auto._review_lookup()
    assert auto.chosen == LOOKUP
    auto._lookup_rounds += [1.0] * drafting_choice.REVIEW_ROUNDS  # the last 8: 1 a round → 0.5 s a token: leaves
    auto._review_lookup()
    assert auto.chosen == DRAFT and auto.reason["lookup_ms_per_token_then"] == pytest.approx(500.0)


@pytest.mark.parametrize("static", [False, True])
def test_a_call_that_leaves_lookup_still_gives_plain_greedy(attached, close_draft, forced, monkeypatch, static):
    """Forced to lookup, then reviewed with every lookup round priced above the draft's: on dynamic caches the call
    goes back to the draft (its cache catches up on what it missed), on static ones it stays; the text is plain
    greedy decoding's either way."""
    forced(LOOKUP)
    monkeypatch.setattr(drafting_choice, "predicted_seconds_per_token",
                        lambda costs, counts, modes: {mode: 1e-9 for mode in modes})
    options = {"cache_implementation": "static"} if static else {}
    ids = prompt(8)
    out = attached.generate(ids, assistant_model=close_draft, acceptance="exact", drafting="auto",
                            max_new_tokens=NEW_TOKENS, eos_token_id=None, num_assistant_tokens=2,
                            return_dict_in_generate=True, **options)
    assert torch.equal(out.sequences, plain_greedy(attached, ids, max_new_tokens=NEW_TOKENS, eos_token_id=None))
    reason = out.acceptance_stats.drafting_reason
    if static:
        assert out.acceptance_stats.drafting == LOOKUP and "left_lookup_at_round" not in reason
    else:
        assert out.acceptance_stats.drafting == DRAFT
        assert reason["left_lookup_at_round"] == drafting_choice.EXPLORE_ROUNDS + 1 + drafting_choice.REVIEW_ROUNDS
