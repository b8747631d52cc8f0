"""Drafting with a pruned-vocabulary drafter (logits over kept ids only) and RDK redistribution; `rdk` stays
lossless."""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB, batch_of, nearest_neighbour_kernel, prompt
from test_exact_rule import chi_square_p_value
from transformers import LogitsProcessorList, TemperatureLogitsWarper

from hf_semspec.drafting import ModelDrafter, redistribute
from hf_semspec.errors import SemSpecConfigError
from hf_semspec.processors import BatchProcessors
from hf_semspec.rules import RULES, VerificationInput


def drafter_for(model, do_sample, redistribute_=False, processors=None):
    return ModelDrafter(
        model, BatchProcessors(processors or LogitsProcessorList(), 1), do_sample=do_sample, return_probs=True,
        output_device=torch.device("cpu"), vocab_size=VOCAB, redistribute=redistribute_,
    )


def test_redistribute_equals_dense_kernel_product(close_draft, kept_ids):
    indices, weights = nearest_neighbour_kernel(close_draft, kept_ids)
    dense = torch.zeros(VOCAB, VOCAB)
    dense[kept_ids[:, None], indices] = weights  # row = kept token, column = target id
    q = torch.zeros(3, VOCAB)
    q[:, kept_ids] = torch.softmax(torch.randn(3, len(kept_ids)), -1)
    r = redistribute(q, kept_ids, indices, weights)
    torch.testing.assert_close(r, q @ dense)
    torch.testing.assert_close(r.sum(-1), torch.ones(3))
    assert (r[:, kept_ids].sum(-1) < 1).all()  # some mass moved onto pruned tokens


def test_redistribute_leaves_mass_a_processor_put_on_a_pruned_id(close_draft, kept_ids):
    # A forced BOS or EOS on a pruned id puts q's mass outside the kept ids: r summed to 0 there, not a distribution.
    indices, weights = nearest_neighbour_kernel(close_draft, kept_ids)
    pruned = next(i for i in range(VOCAB) if i not in set(kept_ids.tolist()))
    q = torch.zeros(2, VOCAB)
    q[0, pruned] = 1.0  # all of it forced onto the pruned id
    q[1, kept_ids] = torch.softmax(torch.randn(len(kept_ids)), -1) * 0.5
    q[1, pruned] = 0.5
    r = redistribute(q, kept_ids, indices, weights)
    torch.testing.assert_close(r.sum(-1), torch.ones(2))
    torch.testing.assert_close(r[0], q[0])
    kept_only = q[1].clone()
    kept_only[pruned] = 0
    torch.testing.assert_close(r[1], redistribute(kept_only[None], kept_ids, indices, weights)[0] + 0.5 * (
        torch.arange(VOCAB) == pruned).float())


@pytest.mark.parametrize("do_sample", [False, True])
def test_pruned_drafter_only_proposes_kept_tokens(pruned_draft, kept_ids, do_sample):
    torch.manual_seed(0)
    block = drafter_for(pruned_draft, do_sample).draft(batch_of(prompt(8)), 12)
    drafts = block.tokens[0]
    assert set(drafts.tolist()) <= set(kept_ids.tolist())
    pruned = torch.ones(VOCAB, dtype=torch.bool)
    pruned[kept_ids] = False
    assert block.probs.shape == (1, 12, VOCAB)
    assert block.probs[..., pruned].abs().max() == 0
    torch.testing.assert_close(block.probs.sum(-1), torch.ones(1, 12))


def test_greedy_fast_path_matches_full_vocabulary_path(pruned_draft):
    fast = drafter_for(pruned_draft, do_sample=False)
    fast.return_probs = False  # no q needed: argmax over kept logits, mapped to target ids
    full = drafter_for(pruned_draft, do_sample=False)
    ids = prompt(8)
    assert torch.equal(fast.draft(batch_of(ids), 10).tokens, full.draft(batch_of(ids), 10).tokens)


def test_rdk_drafter_proposes_pruned_tokens_and_returns_r(rdk_draft, kept_ids):
    torch.manual_seed(0)
    processors = LogitsProcessorList([TemperatureLogitsWarper(1.5)])

    def fresh():  # a drafter's cache follows one sequence
        return drafter_for(rdk_draft, do_sample=True, redistribute_=True, processors=processors)

    tokens = torch.cat([fresh().draft(batch_of(prompt(8, seed=s)), 10).tokens[0] for s in range(6)])
    assert not set(tokens.tolist()) <= set(kept_ids.tolist())  # out-of-vocabulary drafts happen
    block = fresh().draft(batch_of(prompt(8)), 4)
    assert (block.probs.gather(-1, block.tokens[..., None]) > 0).all()  # drawn from r, so r(x̂) > 0
    torch.testing.assert_close(block.probs.sum(-1), torch.ones(1, 4))


@pytest.mark.parametrize("do_sample", [False, True])
def test_exact_with_pruned_drafter_is_lossless_end_to_end(attached, pruned_draft, rdk_draft, do_sample):
    ids = prompt(8)
    for draft, rule in ((pruned_draft, "exact"), (rdk_draft, "rdk")):
        torch.manual_seed(0)
        out = attached.generate(ids, assistant_model=draft, acceptance=rule, do_sample=do_sample, max_new_tokens=20,
                                return_dict_in_generate=True)
        assert out.acceptance_stats.num_drafted > 0
        if not do_sample:
            plain = type(attached).generate(attached, ids, do_sample=False, max_new_tokens=20)
            assert torch.equal(out.sequences, plain)


def test_rdk_without_kernel_is_a_clear_error(attached, pruned_draft, close_draft):
    for draft in (close_draft, pruned_draft):
        with pytest.raises(SemSpecConfigError, match=r"`assistant_model` = .*RDK kernel when acceptance='rdk'.*prune_vocabulary"):
            attached.generate(prompt(8), assistant_model=draft, acceptance="rdk", max_new_tokens=5)


def test_rdk_verification_is_lossless_with_out_of_vocabulary_drafts():
    """As the `exact` proof, but the draft distribution is r = q'·M over a pruned vocabulary: tokens outside the
    drafter's vocabulary are drafted, and the emitted tokens still follow p."""
    torch.manual_seed(7)
    vocab, gamma, rounds = 6, 2, 200_000
    kept = torch.tensor([0, 2, 4])
    indices = torch.tensor([[0, 1], [2, 3], [4, 5]])
    weights = torch.tensor([[0.7, 0.3], [0.5, 0.5], [0.6, 0.4]])
    q = torch.zeros(gamma, vocab)
    q[:, kept] = torch.softmax(torch.randn(gamma, 3) * 1.5, -1)
    r = redistribute(q, kept, indices, weights)
    assert (r[:, [1, 3, 5]] > 0).all()
    p = torch.softmax(torch.randn(gamma + 1, vocab) * 1.5, -1)
    generator = torch.Generator().manual_seed(3)
    draft_ids = torch.multinomial(r, rounds, replacement=True, generator=generator).T
    torch.manual_seed(2024)  # the rule's draws: torch's global RNG (not 3: that stream drew the drafts)
    result = RULES.build("rdk", {}).verify(
        VerificationInput(draft_token_ids=draft_ids, target_logits=p.log()[None].expand(rounds, -1, -1),
                          draft_probs=r[None].expand(rounds, -1, -1), do_sample=True)
    )
    first = torch.where(result.num_accepted >= 1, draft_ids[:, 0], result.next_token)
    assert chi_square_p_value(torch.bincount(first, minlength=vocab), p[0]) > 1e-3
    assert chi_square_p_value(torch.bincount(first, minlength=vocab), r[0]) < 1e-6
    # acceptance at position 0 is Σ min(p, r), higher than with q' alone when p has mass on pruned tokens
    rate = (result.num_accepted >= 1).float().mean().item()
    assert rate == pytest.approx(torch.minimum(p[0], r[0]).sum().item(), abs=0.01)


@pytest.mark.parametrize("rule", ["exact", "rdk"])
def test_sampling_when_the_processors_allow_no_kept_token(attached, pruned_draft, rdk_draft, kept_ids, rule):
    """Constrained decoding that allows only pruned tokens (here: every kept id suppressed): the drafter's logits are
    all −inf and their softmax NaN, which made sampling fail. The drafter then drafts from its kept tokens uniformly,
    and the output is still the target's: only tokens the constraint allows."""
    from transformers import SuppressTokensLogitsProcessor

    suppressed = kept_ids.tolist()
    draft = {"exact": pruned_draft, "rdk": rdk_draft}[rule]
    torch.manual_seed(0)
    out = attached.generate(prompt(8), assistant_model=draft, acceptance=rule, do_sample=True, max_new_tokens=12,
                            suppress_tokens=suppressed, return_dict_in_generate=True)
    assert not set(out.sequences[0, 8:].tolist()) & set(suppressed)
    assert out.acceptance_stats.num_drafted > 0
    processors = LogitsProcessorList([SuppressTokensLogitsProcessor(suppressed)])
    block = drafter_for(pruned_draft, True, processors=processors).draft(batch_of(prompt(8)), 3)
    torch.testing.assert_close(block.probs[0, :, kept_ids], torch.full((3, len(kept_ids)), 1 / len(kept_ids)))
