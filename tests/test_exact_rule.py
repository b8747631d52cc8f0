"""`exact`: the worked example of its docstring with patched randomness, and a statistical proof that rejection
sampling is lossless (emitted tokens are distributed as the target's p)."""

from __future__ import annotations

import pytest
import torch

from hf_semspec.rules import VerificationInput
from hf_semspec.rules.exact import ExactRule


def worked_example_inputs():
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.6, 0.2])
    bonus = torch.tensor([0.1, 0.1, 0.8])
    return VerificationInput(
        draft_token_ids=torch.tensor([[1]]),
        target_logits=torch.stack([p.log(), bonus.log()])[None],
        draft_probs=q[None, None],
        do_sample=True,
    )


@pytest.mark.parametrize("u, accepted", [(0.4, True), (0.49, True), (0.51, False), (0.7, False)])
def test_worked_example_accepts_iff_u_below_p_over_q(patch_rng, u, accepted):
    drawn = patch_rng(uniform=u, categorical="argmax")
    result = ExactRule().verify(worked_example_inputs())
    assert result.num_accepted.item() == (1 if accepted else 0)
    if accepted:
        assert result.next_token.item() == 2  # bonus drawn from p_2 (patched draw = argmax)
    else:
        # residual norm(max(p − q, 0)) = [1, 0, 0] → token 0
        torch.testing.assert_close(drawn[-1], torch.tensor([[1.0, 0.0, 0.0]]))
        assert result.next_token.item() == 0


def test_greedy_accepts_prefix_of_argmax_matches():
    logits = torch.tensor([[[0.0, 5, 1], [3, 0, 1], [0, 0, 9], [1, 2, 3]]])
    inputs = VerificationInput(draft_token_ids=torch.tensor([[1, 0, 1]]), target_logits=logits)
    result = ExactRule().verify(inputs)
    assert result.accepted.tolist() == [[True, True, False]]
    assert result.num_accepted.item() == 2 and result.next_token.item() == 2


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square goodness of fit; p-value from the regularized upper incomplete gamma function."""
    n = counts.sum()
    expected = probs.double() * n
    statistic = ((counts.double() - expected) ** 2 / expected).sum()
    dof = torch.tensor(float(len(probs) - 1), dtype=torch.float64)
    return torch.special.gammaincc(dof / 2, statistic / 2).item()


def simulated_rounds(rule, p: torch.Tensor, q: torch.Tensor, rounds: int):
    """`rounds` sampled rounds at once with position-wise fixed target rows p_0..p_γ `(γ + 1, vocab)` and draft rows
    q_0..q_{γ−1} `(γ, vocab)`, drafts drawn from q: the rule's `VerificationResult` and the emitted tokens
    `(rounds, γ + 1)` (each round's accepted prefix, then the rule's token; zeros after)."""
    generator = torch.Generator().manual_seed(99)
    draft_ids = torch.multinomial(q, rounds, replacement=True, generator=generator).T  # (rounds, γ), row i ~ q_i
    inputs = VerificationInput(
        draft_token_ids=draft_ids,
        target_logits=p.log()[None].expand(rounds, -1, -1),
        draft_probs=q[None].expand(rounds, -1, -1),
        do_sample=True,
    )
    torch.manual_seed(2024)  # the rule's draws: torch's global RNG (not 99: that stream drew the drafts)
    result = rule.verify(inputs)
    emitted = torch.cat([draft_ids, torch.zeros(rounds, 1, dtype=torch.long)], 1)
    emitted[torch.arange(rounds), result.num_accepted] = result.next_token
    return result, emitted


def test_rejection_sampling_is_lossless():
    """Target with position-wise independent distributions p_0..p_γ (logits fixed per position), draft q_i ≠ p_i.
    Over 200k vectorized rounds: the first emitted token ~ p_0, and, in rounds that accepted position 0, the second
    emitted token ~ p_1 (the draw at position 1 is independent of what happened at position 0)."""
    torch.manual_seed(1234)
    vocab, gamma, rounds = 6, 3, 200_000
    p = torch.softmax(torch.randn(gamma + 1, vocab) * 1.5, -1)
    q = torch.softmax(torch.randn(gamma, vocab) * 1.5, -1)
    result, emitted = simulated_rounds(ExactRule(), p, q, rounds)
    n = result.num_accepted

    first = torch.bincount(emitted[:, 0], minlength=vocab)
    assert chi_square_p_value(first, p[0]) > 1e-3
    second = torch.bincount(emitted[n >= 1, 1], minlength=vocab)
    assert chi_square_p_value(second, p[1]) > 1e-3
    bonus = torch.bincount(result.next_token[n == gamma], minlength=vocab)
    assert bonus.sum() > 1000 and chi_square_p_value(bonus, p[gamma]) > 1e-3
    # The test has power: the same counts are clearly not distributed as the draft's q_0.
    assert chi_square_p_value(first, q[0]) < 1e-6
    # And acceptance follows Σ_x min(p, q) at position 0.
    expected_rate = torch.minimum(p[0], q[0]).sum().item()
    assert (n >= 1).float().mean().item() == pytest.approx(expected_rate, abs=0.01)
