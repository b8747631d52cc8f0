"""A batch behaves like its rows: each row's greedy text is the one it gets alone, for every rule and on dynamic and
static caches; a round is one step for the draft-length policy, however many rows it verified; per-token policies
read the rows still decoding only; `num_return_sequences` samples a batch of one prompt's rows."""

from __future__ import annotations

import pytest
import torch
from conftest import perturbed_copy, prompt, tiny_llama
from test_batched import PAD, left_padded
from test_exact_rule import chi_square_p_value

import hf_semspec
from hf_semspec.draft_length import POLICIES
from hf_semspec.rules import RULES

NEW_TOKENS = 24


def alone(model, row, **kwargs):
    """The new tokens of `row` decoded by itself with the same options."""
    return model.generate(row[None], **kwargs)[0, len(row):].tolist()


@pytest.mark.parametrize("cache_implementation", [None, "static"])
@pytest.mark.parametrize("name", RULES.names())
def test_each_greedy_row_is_the_text_it_gets_alone(attached, close_draft, rdk_draft, name, cache_implementation):
    """γ = 7 (fly's window of 6 can flip), 24 new tokens: rows of different prompt lengths reach max_length in rounds
    where the batch drafts more than they may use. A row's text must not depend on the others: dropmatch's dropout
    masks come from each row's own generator, and a row near its end is verified with the drafts it would have
    made alone."""
    if not RULES.get(name).supports_greedy:
        pytest.skip(f"{name} does not define greedy decoding")
    draft = rdk_draft if RULES.get(name).redistributes_draft else close_draft
    options = dict(assistant_model=draft, acceptance=name, num_assistant_tokens=7, max_new_tokens=NEW_TOKENS,
                   eos_token_id=None, cache_implementation=cache_implementation)
    rows, ids, mask = left_padded()
    out = attached.generate(ids, attention_mask=mask, pad_token_id=PAD, return_dict_in_generate=True, **options)
    for i, row in enumerate(rows):
        single = attached.generate(row[None], return_dict_in_generate=True, **options)
        assert out.sequences[i, ids.shape[1]:].tolist() == single.sequences[0, len(row):].tolist(), f"row {i}"
        # and its statistics: the drafts it could use each round, the ones it accepted
        assert out.acceptance_stats_per_row[i].drafted_per_round == single.acceptance_stats.drafted_per_round
        assert out.acceptance_stats_per_row[i].accepted_per_round == single.acceptance_stats.accepted_per_round


def test_greedy_dropmatch_rows_do_not_depend_on_the_other_prompts(attached, close_draft):
    """The same prompt in two different batches, at different indices: the same text."""
    options = dict(assistant_model=close_draft, acceptance="dropmatch", max_new_tokens=NEW_TOKENS, eos_token_id=None,
                   pad_token_id=PAD)
    rows, ids, mask = left_padded()
    _, other_ids, other_mask = left_padded([9, 4], seed=10)
    other_ids[1, -5:], other_mask[1] = rows[0], torch.tensor([0] * 4 + [1] * 5)  # rows[0] at index 1, beside another
    first = attached.generate(ids, attention_mask=mask, **options)
    second = attached.generate(other_ids, attention_mask=other_mask, **options)
    assert first[0, ids.shape[1]:].tolist() == second[1, other_ids.shape[1]:].tolist()


@pytest.mark.parametrize("policy_name", ["heuristic", "adaedl"])
def test_a_round_is_one_step_for_the_policy(attached, close_draft, policy_name):
    """Four copies of one prompt take the rounds the prompt takes alone, and leave a policy instance in the same
    state: the policy learns from each round once, not once per row."""
    row = prompt(8, seed=4)[0]
    states = []
    for batch_size in (1, 4):
        policy = POLICIES.build(policy_name, {})
        out = attached.generate(row[None].repeat(batch_size, 1), assistant_model=close_draft, acceptance="exact",
                                draft_length=policy, max_new_tokens=40, eos_token_id=None, pad_token_id=PAD,
                                return_dict_in_generate=True)
        rounds = [s.drafted_per_round for s in out.acceptance_stats_per_row]
        assert all(r == rounds[0] for r in rounds)
        states.append((rounds[0], {k: v for k, v in vars(policy).items() if isinstance(v, (int, float))}))
    (single_rounds, single_state), (batch_rounds, batch_state) = states
    assert batch_rounds == single_rounds and len(set(single_rounds)) > 1  # (a policy that moved)
    assert batch_state == single_state


def test_a_per_token_policy_reads_only_the_rows_still_decoding(attached, close_draft, monkeypatch):
    """On static caches a finished row stays for the caches' shape; `keep_drafting` must not read its q."""
    rows, ids, mask = left_padded()
    reference = alone(attached, rows[0], max_new_tokens=NEW_TOKENS, eos_token_id=None, do_sample=False)
    eos = reference[3]  # row 0 ends after its 4th new token
    policy = POLICIES.build("svip", {"threshold": 100.0, "max_tokens": 4})  # never stops a round early
    seen = []
    real = policy.keep_drafting
    monkeypatch.setattr(policy, "keep_drafting", lambda n, probs: seen.append(probs.shape[0]) or real(n, probs))
    out = attached.generate(ids, attention_mask=mask, assistant_model=close_draft, acceptance="exact",
                            draft_length=policy, max_new_tokens=NEW_TOKENS, eos_token_id=eos,
                            pad_token_id=PAD, cache_implementation="static", return_dict_in_generate=True)
    finished_rows = sum(1 for s in out.acceptance_stats_per_row
                        if s.num_target_forwards < out.acceptance_stats.num_target_forwards)
    assert finished_rows >= 1
    assert seen[0] == 3 and min(seen) == 3 - finished_rows < 3


def test_sampled_num_return_sequences_gives_rows_distributed_as_the_target():
    """One prompt, 600 sequences in one call: transformers repeats the prompt before the loop; each row's first token
    is distributed as plain sampling's (chi-square), and the rows differ."""
    target = tiny_llama(seed=0, vocab_size=16)
    draft = perturbed_copy(target, scale=0.8, seed=4)
    hf_semspec.attach(target)
    ids = prompt(5, seed=0) % 16  # (holds the pad id 0: the mask keeps it a token, as the forward below sees it)
    torch.manual_seed(5)
    out = target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=draft, acceptance="exact", do_sample=True, temperature=1.5,
                          num_return_sequences=600, max_new_tokens=3, min_new_tokens=3, num_assistant_tokens=3,
                          pad_token_id=PAD)
    hf_semspec.detach(target)
    assert out.shape == (600, 8) and torch.equal(out[:, :5], ids.expand(600, -1))
    with torch.no_grad():
        p = torch.softmax(target(ids).logits[0, -1] / 1.5, -1)
    counts = torch.bincount(out[:, 5], minlength=16)
    assert chi_square_p_value(counts[p > 0.02], p[p > 0.02] / p[p > 0.02].sum()) > 1e-3
    assert len({tuple(r) for r in out[:, 5:].tolist()}) > 100


# --- near max_length: a row verified with the drafts it may use (`VerificationInput.draft_limits`) ---


def test_fly_flips_only_where_the_row_s_own_window_fits():
    """γ = 7, W = 6, the first draft a mismatch and the rest right, a flat target (the gate open): with all 7 drafts
    the window defers the mismatch (1 + 6 ≤ 7); a row limited to 3 drafts, alone, could not: none accepted, and its
    num_matched stops at its limit."""
    from hf_semspec.rules import VerificationInput

    torch.manual_seed(0)
    logits = torch.randn(1, 8, 16) * 0.01  # near-uniform: top-3 entropy above fly's threshold
    greedy = logits.argmax(-1)
    drafts = greedy[:, :7].clone()
    drafts[0, 0] = (greedy[0, 0] + 1) % 16
    rule = RULES.build("fly", {"window": 6})
    assert rule.verify(VerificationInput(drafts, logits)).num_accepted.tolist() == [7]
    limited = rule.verify(VerificationInput(drafts, logits, draft_limits=(3,)))
    assert limited.num_accepted.tolist() == [0] and limited.next_token.tolist() == [int(greedy[0, 0])]
    drafts[0, 0] = greedy[0, 0]  # all right: the row matches its 3, not the batch's 7
    assert rule.verify(VerificationInput(drafts, logits, draft_limits=(3,))).num_matched.tolist() == [3]


def test_a_row_that_accepts_all_its_drafts_samples_its_bonus_from_p(patch_rng):
    """Sampling, a row limited to 2 of the round's 4 drafts that accepts both: its next token is drawn from p at
    position 2 (its bonus), not from the residual of the draft there, as alone."""
    from hf_semspec.rules import VerificationInput

    patch_rng(uniform=0.0, categorical="argmax")  # u = 0: every draft passes the standard test; draws take argmax
    p = torch.softmax(torch.randn(1, 5, 8, generator=torch.Generator().manual_seed(1)), -1)
    top = int(p[0, 2].argmax())
    drafts = torch.tensor([[1, 2, top, 4]])
    q = torch.full((1, 4, 8), 0.01).scatter(-1, drafts[..., None], 0.93)
    # The draft at the row's bonus position is p's top token with q(top) = 0.93 > p(top): the residual
    # norm(max(p − q, 0)) there has another argmax, so a residual draw would show.
    assert int((p[0, 2] - q[0, 2]).clamp_min(0).argmax()) != top
    result = RULES.build("exact", {}).verify(
        VerificationInput(drafts, p.log(), q, do_sample=True, draft_limits=(2,)))
    assert result.num_accepted.tolist() == [2]
    assert result.next_token.tolist() == [top]  # the bonus, drawn from p itself


def test_the_policy_learns_from_the_median_row(attached, monkeypatch):
    """Three rows that accept 0, 2 and all of their drafts: the policy sees the middle one, once per round."""
    from hf_semspec import decoding
    from hf_semspec.draft_length import RoundOutcome

    rows = [RoundOutcome(5, 5, 0.0, cut=True), RoundOutcome(5, 0, 0.0), RoundOutcome(5, 2, 0.0, num_matched=1)]
    median = decoding._round_outcome(rows, seconds=0.3, first_round=False)
    assert (median.num_accepted, median.num_matched, median.cut, median.seconds) == (2, 1, False, 0.3)
    assert decoding._round_outcome(rows[:2], 0.3, True).num_accepted == 0  # the lower median of two
    limited = decoding._round_outcome([RoundOutcome(3, 3, 0.0)], 0.3, False)
    assert (limited.num_drafted, limited.num_accepted) == (3, 3)  # a row's own drafts, not the round's γ
