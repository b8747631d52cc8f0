"""`ears`: the worked examples of its docstring with patched randomness, β = 0 being `exact`, the tolerance vanishing
for a confident target, the greedy extension, the emitted distribution π = p + E − ΣE·r checked by simulation (the
price of the extra acceptances), config validation, and end to end on the tiny models."""

from __future__ import annotations

import pytest
import torch
from conftest import prompt
from test_exact_rule import simulated_rounds

import hf_semspec
from hf_semspec.errors import SemSpecConfigError
from hf_semspec.rules import RULES, VerificationInput
from hf_semspec.rules.ears import EARSConfig, EARSRule, emitted_distribution, uncertainty_tolerance
from hf_semspec.rules.exact import ExactRule


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square goodness of fit over the cells with positive expected count."""
    n = counts.sum()
    keep = probs > 0
    assert counts[~keep].sum() == 0, "a token of probability 0 was emitted"
    expected = probs[keep].double() * n
    statistic = ((counts[keep].double() - expected) ** 2 / expected).sum()
    dof = torch.tensor(float(keep.sum() - 1), dtype=torch.float64)
    return torch.special.gammaincc(dof / 2, statistic / 2).item()


def ears(beta: float = 0.1) -> EARSRule:
    return RULES.build("ears", {"beta": beta})


def one_position(p, q=None, draft=1, bonus=(0.1, 0.1, 0.8), do_sample=True) -> VerificationInput:
    """γ = 1 over a vocabulary of 3: target p at the draft position, a bonus row, draft distribution q."""
    p = torch.tensor(p)
    return VerificationInput(
        draft_token_ids=torch.tensor([[draft]]),
        target_logits=torch.stack([p.log(), torch.tensor(bonus).log()])[None],
        draft_probs=None if q is None else torch.tensor(q)[None, None],
        do_sample=do_sample,
    )


# --- worked examples (module docstring) ---

P, Q = [0.5, 0.3, 0.2], [0.2, 0.6, 0.2]  # p(x̂)/q(x̂) = 0.5, t = 0.1·(1 − 0.5) = 0.05


@pytest.mark.parametrize(
    "u, exact_accepts, ears_accepts",
    [(0.40, True, True), (0.52, False, True), (0.54, False, True), (0.58, False, False), (0.70, False, False)],
)
def test_worked_example_tolerance_accepts_what_exact_rejects(patch_rng, u, exact_accepts, ears_accepts):
    for rule, accepts in ((ExactRule(), exact_accepts), (ears(0.1), ears_accepts)):
        drawn = patch_rng(uniform=u, categorical="argmax")
        result = rule.verify(one_position(P, Q))
        assert result.num_accepted.item() == int(accepts), (rule.name, u)
        if accepts:
            assert result.next_token.item() == 2  # bonus drawn from p_2 (patched draw = argmax)
        else:
            # unchanged Leviathan residual norm(max(p − q, 0)) = [1, 0, 0] → token 0
            torch.testing.assert_close(drawn[-1], torch.tensor([[1.0, 0.0, 0.0]]))
            assert result.next_token.item() == 0


def test_worked_example_price_in_output_distribution():
    p, q = torch.tensor(P), torch.tensor(Q)
    assert uncertainty_tolerance(p, 0.1).item() == pytest.approx(0.05)
    pi = emitted_distribution(p, q, 0.1)
    torch.testing.assert_close(pi, torch.tensor([0.47, 0.33, 0.20]))
    assert (pi - p).abs().sum().item() / 2 == pytest.approx(0.03, abs=1e-6)  # TV(π, p)
    # acceptance = Σ q·a = Σ min(p, q) + TV = 0.70 + 0.03
    accept = torch.minimum(torch.ones(3), p / q + 0.05) @ q
    assert accept.item() == pytest.approx(0.73, abs=1e-6)


@pytest.mark.parametrize(
    "p, draft, beta, kept, next_token",
    [
        ([0.40, 0.35, 0.25], 1, 0.1, True, 2),  # bar = 0.40 − 0.1·0.6 = 0.34 < 0.35: kept, then the bonus argmax
        ([0.40, 0.35, 0.25], 2, 0.1, False, 0),  # 0.25 < 0.34: rejected, emit argmax p
        ([0.40, 0.35, 0.25], 0, 0.1, True, 2),  # the argmax itself is always kept
        ([0.98, 0.015, 0.005], 1, 0.1, False, 0),  # confident: bar = 0.978
        ([0.98, 0.015, 0.005], 1, 1.0, False, 0),  # even at β = 1 the bar is 0.96
    ],
)
def test_greedy_worked_example(p, draft, beta, kept, next_token):
    inputs = one_position(p, draft=draft, do_sample=False)
    result = ears(beta).verify(inputs)
    assert result.num_accepted.item() == int(kept)
    assert result.next_token.item() == next_token
    exact = ExactRule().verify(one_position(p, draft=draft, do_sample=False))
    assert exact.num_accepted.item() == int(draft == 0)  # `exact` keeps only the argmax


# --- β = 0 is `exact`; β > 0 only adds acceptances ---


def random_inputs(do_sample: bool, seed: int, batch=256, gamma=5, vocab=11, scale=2.0) -> VerificationInput:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, gamma + 1, vocab, generator=g) * scale
    q = torch.softmax(logits[:, :-1] + torch.randn(batch, gamma, vocab, generator=g), -1)  # a related draft
    draft = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(batch, gamma)
    torch.manual_seed(seed + 1000)  # the rule's draws (torch's global RNG): the same for every rule given these inputs
    return VerificationInput(
        draft_token_ids=draft,
        target_logits=logits,
        draft_probs=q,
        do_sample=do_sample,
    )


@pytest.mark.parametrize("do_sample", [False, True])
def test_beta_zero_reproduces_exact(do_sample):
    for seed in range(3):
        ours = ears(0.0).verify(random_inputs(do_sample, seed))
        exact = ExactRule().verify(random_inputs(do_sample, seed))
        assert torch.equal(ours.accepted, exact.accepted)
        assert torch.equal(ours.num_accepted, exact.num_accepted)
        assert torch.equal(ours.next_token, exact.next_token)
        assert 0 < exact.accepted.float().mean() < 1  # the comparison is not vacuous


@pytest.mark.parametrize("do_sample", [False, True])
def test_tolerance_only_adds_acceptances(do_sample):
    """Same random numbers: every draft `exact` accepts, `ears` accepts too, and it accepts strictly more."""
    ours = ears(0.3).verify(random_inputs(do_sample, 0))
    exact = ExactRule().verify(random_inputs(do_sample, 0))
    assert (ours.accepted >= exact.accepted).all()
    assert ours.accepted.sum() > exact.accepted.sum()
    assert ours.num_accepted.sum() > exact.num_accepted.sum()


def test_confident_target_gets_no_tolerance(patch_rng):
    """u = 0.001 and p(x̂)/q(x̂) ≈ 2e-9: `exact` rejects. A confident target (max p ≈ 1) leaves no tolerance, so
    `ears` rejects too, even at β = 1; an uncertain target with the same ratio gives t = β·(1 − max p) ≫ u."""
    patch_rng(uniform=0.001, categorical="argmax")
    confident = torch.tensor([20.0, 0.0, 0.0])  # max p = 1 − 4e-9
    uncertain = torch.tensor([0.0, -20.0, 0.0])  # max p = 0.5
    for logits, ears_accepts in ((confident, False), (uncertain, True)):
        inputs = VerificationInput(
            draft_token_ids=torch.tensor([[1]]),
            target_logits=torch.stack([logits, torch.zeros(3)])[None],
            draft_probs=torch.tensor([[[0.25, 0.5, 0.25]]]),
            do_sample=True,
        )
        assert ExactRule().verify(inputs).num_accepted.item() == 0
        assert ears(1.0).verify(inputs).num_accepted.item() == int(ears_accepts)
    assert uncertainty_tolerance(torch.softmax(confident, -1), 1.0).item() < 1e-6
    assert uncertainty_tolerance(torch.softmax(uncertain, -1), 1.0).item() == pytest.approx(0.5)


def test_draft_of_probability_zero_is_never_accepted(patch_rng):
    """A token masked by the processors (p(x̂) = 0) stays rejected even with u = 0 and the largest tolerance."""
    patch_rng(uniform=0.0, categorical="argmax")
    inputs = VerificationInput(
        draft_token_ids=torch.tensor([[1]]),
        target_logits=torch.tensor([[[0.0, -float("inf"), 0.0], [0.0, 0.0, 0.0]]]),  # max p = 0.5, t = 0.5
        draft_probs=torch.tensor([[[0.2, 0.6, 0.2]]]),
        do_sample=True,
    )
    result = ears(1.0).verify(inputs)
    assert result.num_accepted.item() == 0 and result.next_token.item() in (0, 2)


def test_greedy_keeps_near_argmax_drafts_but_never_masked_ones():
    """A flat target (max p = 0.25 < β/(1 + β) at β = 1) drops the bar below 0: every draft with p > 0 is kept,
    a masked one (p = 0) is not."""
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0, -float("inf")], [0.0] * 5]])
    for draft, kept in ((3, True), (4, False)):
        inputs = VerificationInput(draft_token_ids=torch.tensor([[draft]]), target_logits=logits, do_sample=False)
        result = ears(1.0).verify(inputs)
        assert result.num_accepted.item() == int(kept)
        assert result.next_token.item() == 0  # bonus argmax, or the argmax at the rejected position


# --- the price: the emitted distribution ---


def test_emitted_distribution_formula_properties():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(500, 9, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(500, 9, generator=g) * 2, -1)
    torch.testing.assert_close(emitted_distribution(p, q, 0.0), p)
    torch.testing.assert_close(emitted_distribution(p, p, 1.0), p)  # q = p: nothing to gain, nothing to lose
    for beta in (0.1, 0.5, 1.0):
        pi = emitted_distribution(p, q, beta)
        assert (pi >= -1e-6).all()
        torch.testing.assert_close(pi.sum(-1), torch.ones(500))
        tv = (pi - p).abs().sum(-1) / 2
        bound = torch.minimum(uncertainty_tolerance(p, beta), (p - q).abs().sum(-1) / 2)
        assert (tv <= bound + 1e-6).all()
        # acceptance gained over `exact` = TV(π, p), exactly
        t = uncertainty_tolerance(p, beta)[:, None]
        gain = ((torch.minimum(torch.ones_like(p), p / q + t) - torch.minimum(torch.ones_like(p), p / q)) * q).sum(-1)
        torch.testing.assert_close(gain, tv, atol=1e-5, rtol=0)


def test_emitted_tokens_follow_the_derived_distribution():
    """200k vectorized rounds with position-wise fixed p_0..p_γ and q_0..q_{γ−1}, β = 0.5: the first emitted token
    is distributed as π_0 (and not as p_0), the second — in rounds that accepted position 0 — as π_1, the bonus as
    p_γ, and the acceptance rate at position 0 is Σ min(p, q) + TV(π_0, p_0)."""
    torch.manual_seed(1234)
    vocab, gamma, rounds, beta = 6, 2, 200_000, 0.5
    p = torch.softmax(torch.randn(gamma + 1, vocab) * 1.5, -1)
    q = torch.softmax(torch.randn(gamma, vocab) * 1.5, -1)
    pi = emitted_distribution(p[:gamma], q, beta)
    tv = (pi - p[:gamma]).abs().sum(-1) / 2
    assert (tv > 0.03).all(), "the distortion must be large enough for the test to have power"
    result, emitted = simulated_rounds(ears(beta), p, q, rounds)
    n = result.num_accepted

    first = torch.bincount(emitted[:, 0], minlength=vocab)
    assert chi_square_p_value(first, pi[0]) > 1e-3
    assert chi_square_p_value(first, p[0]) < 1e-6  # EARS is not lossless, and the test can tell
    second = torch.bincount(emitted[n >= 1, 1], minlength=vocab)
    assert chi_square_p_value(second, pi[1]) > 1e-3
    bonus = torch.bincount(result.next_token[n == gamma], minlength=vocab)
    assert bonus.sum() > 1000 and chi_square_p_value(bonus, p[gamma]) > 1e-3
    expected_rate = torch.minimum(p[0], q[0]).sum().item() + tv[0].item()
    assert (n >= 1).float().mean().item() == pytest.approx(expected_rate, abs=0.005)


# --- config and registration ---


def test_registered_with_its_attributes():
    assert "ears" in hf_semspec.available_rules()
    assert RULES.get("ears") is EARSRule
    assert EARSRule.lossless is False and EARSRule.supports_greedy and EARSRule.supports_sampling
    assert not EARSRule.requires_draft_probs and EARSRule.paper == "https://arxiv.org/abs/2512.13194"
    assert EARSRule().config == EARSConfig(beta=0.5)
    assert EARSConfig.field_docs()[0]["allowed"] == "[0, 1]"


@pytest.mark.parametrize("beta", [0, 0.0, 0.25, 1, 1.0])
def test_beta_bounds_are_allowed(beta):
    assert RULES.build("ears", {"beta": beta}).config.beta == beta


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"beta": 1.5}, r"`acceptance_kwargs\['beta'\]` = 1.5 is not valid: allowed values in \[0, 1\] for 'ears'"),
        ({"beta": -0.1}, r"`acceptance_kwargs\['beta'\]` = -0.1 .*values in \[0, 1\].*the default is 0.5"),
        ({"beta": "0.1"}, r"`acceptance_kwargs\['beta'\]` = '0.1' .*type float"),
        ({"beta": True}, r"`acceptance_kwargs\['beta'\]` = True .*type float"),
        ({"beta": None}, r"`acceptance_kwargs\['beta'\]` = None .*type float"),
        ({"bta": 0.2}, r"unknown option\(s\) \['bta'\] for 'ears'.*allowed \['beta'\]"),
    ],
)
def test_config_validation(kwargs, pattern):
    with pytest.raises(SemSpecConfigError, match=pattern):
        RULES.build("ears", kwargs)


def test_bad_beta_fails_before_decoding(attached, close_draft):
    with pytest.raises(SemSpecConfigError, match=r"`acceptance_kwargs\['beta'\]` = 2.0 .*values in \[0, 1\]"):
        attached.generate(prompt(8), assistant_model=close_draft, acceptance="ears", acceptance_kwargs={"beta": 2.0})


# --- end to end on the tiny models ---


def accepted_drafts_per_round(model, draft, acceptance, kwargs, do_sample, prompts, seeds):
    """Σ over runs (prompts × seeds) of acceptance_stats.mean_accepted_drafts, and the runs' sequences."""
    total, sequences = 0.0, []
    for prompt_seed in prompts:
        for seed in seeds:
            torch.manual_seed(seed)
            out = model.generate(
                prompt(8, seed=prompt_seed), assistant_model=draft, acceptance=acceptance, acceptance_kwargs=kwargs,
                do_sample=do_sample, max_new_tokens=16, return_dict_in_generate=True,
            )
            total += out.acceptance_stats.mean_accepted_drafts
            sequences.append(out.sequences)
    return total, sequences


def test_end_to_end_sampling_accepts_more_than_exact(attached, close_draft):
    """Measured on these models: exact 5.5, ears (β = 0.1) 7.0, ears (β = 1) 22 accepted drafts per round, summed."""
    prompts, seeds = (0, 1, 2), (0, 1)
    exact, _ = accepted_drafts_per_round(attached, close_draft, "exact", {}, True, prompts, seeds)
    mild, _ = accepted_drafts_per_round(attached, close_draft, "ears", {"beta": 0.1}, True, prompts, seeds)
    loose, _ = accepted_drafts_per_round(attached, close_draft, "ears", {"beta": 1.0}, True, prompts, seeds)
    assert exact > 0
    assert mild >= exact
    assert loose > 2 * exact


def test_end_to_end_greedy(attached, close_draft):
    """β = 0 decodes token for token as `exact`; β > 0 keeps more drafts (exact 1.3, β = 0.1: 2.1, β = 1: 18)."""
    prompts, seeds = (0, 1, 2, 3), (0,)
    exact, exact_sequences = accepted_drafts_per_round(attached, close_draft, "exact", {}, False, prompts, seeds)
    zero, zero_sequences = accepted_drafts_per_round(
        attached, close_draft, "ears", {"beta": 0.0}, False, prompts, seeds
    )
    mild, _ = accepted_drafts_per_round(attached, close_draft, "ears", {"beta": 0.1}, False, prompts, seeds)
    loose, _ = accepted_drafts_per_round(attached, close_draft, "ears", {"beta": 1.0}, False, prompts, seeds)
    assert zero == exact and all(torch.equal(a, b) for a, b in zip(zero_sequences, exact_sequences))
    assert exact > 0
    assert mild >= exact
    assert loose > 2 * exact


def test_the_emitted_distribution_leaves_out_what_the_target_forbids():
    # A token with p = 0 (outside top-k, a bad word) gets no relaxed mass: p = [0.5, 0.5, 0], q = [0.2, 0.3, 0.5],
    # β = 0.1. Accepting x̂ = 2 would need u < 0/0.5 + 0.1·(1 − 0.5) = 0.05, but p(2) = 0 is refused outright, so the
    # emitted distribution is p itself (without that check: [0.485, 0.49, 0.025]).
    p, q = torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.2, 0.3, 0.5])
    torch.testing.assert_close(emitted_distribution(p, q, 0.1), p)


def test_greedy_with_beta_zero_keeps_only_the_first_argmax_as_exact_does():
    # Logits [1, 1, 0]: tokens 0 and 1 tie for the max. β = 0 must decide as `exact`, whose argmax is token 0, so a
    # draft of token 1 is rejected and 0 emitted.
    logits = torch.tensor([[[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]])
    inputs = VerificationInput(draft_token_ids=torch.tensor([[1]]), target_logits=logits)
    ears = EARSRule(EARSConfig(beta=0.0)).verify(inputs)
    exact = ExactRule().verify(inputs)
    assert ears.num_accepted.tolist() == exact.num_accepted.tolist() == [0]
    assert ears.next_token.tolist() == exact.next_token.tolist() == [0]
