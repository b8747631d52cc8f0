"""`dropmatch`: the worked example of its docstring with explicit masks, the heads as one batched matmul, the reduction
to exact matching when nothing is dropped, vote vs js, seeding, sampling mode, config errors, and end to end."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import prompt
from torch.utils._python_dispatch import TorchDispatchMode

from hf_semspec.errors import SemSpecConfigError
from hf_semspec.rules import RULES, VerificationInput
from hf_semspec.rules import base as rules_base
from hf_semspec.rules import dropmatch as dropmatch_module
from hf_semspec.rules.dropmatch import DropMatchConfig, DropMatchRule, dropout_head_logits, js_divergence

# ---------------------------------------------------------------------------------------------------------------
# The docstring's worked example: H = 3, V = 4, K = 3, p = 0.5; four rows (batch) of one draft position each.
W = torch.tensor([[2.5, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.5], [0.0, 0.0, 0.0]])
MASKS = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0], [0.0, 0.0, 1.0]])  # m⁽¹⁾, m⁽²⁾, m⁽³⁾
DRAFTS = torch.tensor([[1], [0], [0], [3]])
Q = torch.tensor([[0.2, 0.7, 0.05, 0.05], [0.6, 0.3, 0.05, 0.05], [0.8, 0.1, 0.05, 0.05], [0.1, 0.1, 0.1, 0.7]])


def worked_example_inputs(drafts=DRAFTS, q=Q, do_sample=False):
    batch = drafts.shape[0]
    hidden = torch.ones(batch, 2, 3)  # h = [1, 1, 1] at the draft position and at the bonus position
    return VerificationInput(
        draft_token_ids=drafts,
        target_logits=hidden @ W.T,  # [2.5, 3, 0.5, 0]: the target's token is 1
        draft_probs=q[:, None],
        target_hidden_states=hidden,
        lm_head_weight=W,
        do_sample=do_sample,
    )


def patch_masks(monkeypatch, masks, u=0.5):
    """Mask uniforms 0.9 (keep) / 0.1 (drop) for every row, so `u >= p` reproduces `masks` (K, H) for p = 0.5;
    every other uniform draw (the standard sampling test, `AcceptanceRule.standard_accept`) returns `u`."""
    calls = []

    def uniform(shape, device, generator):
        calls.append(tuple(shape))
        if len(shape) == 4:  # (K, batch, γ, H): the dropout masks of seed=None
            return torch.where(masks.bool(), 0.9, 0.1)[:, None, None, :].expand(shape).clone()
        if len(shape) == 3:  # (γ, K, H): one row's dropout masks
            return torch.where(masks.bool(), 0.9, 0.1)[None].expand(shape).clone()
        return torch.full(shape, u)

    monkeypatch.setattr(dropmatch_module, "sample_uniform", uniform)
    monkeypatch.setattr(rules_base, "sample_uniform", uniform)
    return calls


def worked_rule(**kwargs):
    return RULES.build("dropmatch", {"num_heads": 3, "dropout": 0.5, **kwargs})


def test_worked_example_heads_centroid_and_thresholds(monkeypatch):
    patch_masks(monkeypatch, MASKS)
    inputs = worked_example_inputs()
    rule = worked_rule()
    keep = rule.draw_masks(inputs)
    assert keep.shape == (3, 4, 1, 3) and torch.equal(keep[:, 0, 0], MASKS.bool())
    logits = rule.head_logits(inputs, keep)[:, 0, 0]
    torch.testing.assert_close(logits, torch.tensor([[5.0, 4, 0, 0], [0, 4, 1, 0], [0, 2, 1, 0]]))
    assert logits.argmax(-1).tolist() == [0, 1, 1]  # y⁽¹⁾, y⁽²⁾, y⁽³⁾
    centroid = logits.mean(0).softmax(-1)
    torch.testing.assert_close(centroid, torch.tensor([0.1460, 0.7728, 0.0537, 0.0276]), atol=1e-4, rtol=0)
    per_head = js_divergence(logits.softmax(-1), centroid)
    torch.testing.assert_close(per_head, torch.tensor([0.1854, 0.0334, 0.0446]), atol=1e-4, rtol=0)
    js_q = js_divergence(Q, centroid)
    torch.testing.assert_close(js_q, torch.tensor([0.0047, 0.1298, 0.2732, 0.3464]), atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "rule_name, kwargs, accepted",
    [
        ("exact", {}, [True, False, False, False]),
        ("dropmatch", {"criterion": "vote", "min_votes": 1}, [True, True, True, False]),
        ("dropmatch", {}, [True, False, False, False]),  # default: two votes
        ("dropmatch", {"criterion": "js"}, [True, True, False, False]),
    ],
)
def test_worked_example_verdicts(monkeypatch, rule_name, kwargs, accepted):
    patch_masks(monkeypatch, MASKS)
    rule = worked_rule(**kwargs) if rule_name == "dropmatch" else RULES.build("exact", {})
    result = rule.verify(worked_example_inputs())
    assert result.accepted[:, 0].tolist() == accepted
    assert result.next_token.tolist() == [1, 1, 1, 1]  # rejections emit the target's token; the bonus is also 1


def test_all_kept_masks_reduce_both_criteria_to_exact_matching(patch_rng):
    """With every u ≥ p nothing is dropped: each head is the target scaled by 1/(1 − p) (no bias), all heads vote the
    target's argmax, the JS threshold is 0, and the verdicts are exact matching's."""
    patch_rng(uniform=0.99)
    g = torch.Generator().manual_seed(0)
    vocab, hidden_size = 13, 16
    weight = torch.randn(vocab, hidden_size, generator=g)
    hidden = torch.randn(6, 5, hidden_size, generator=g)
    target_logits = hidden @ weight.T
    random_tokens = torch.randint(0, vocab, (6, 4), generator=g)
    drafts = torch.where(torch.rand(6, 4, generator=g) < 0.5, target_logits[:, :-1].argmax(-1), random_tokens)
    q = torch.softmax(torch.randn(6, 4, vocab, generator=g), -1)
    inputs = VerificationInput(drafts, target_logits, q, hidden, weight)
    exact = RULES.build("exact", {}).verify(inputs)
    assert 0 < exact.accepted.sum() < exact.accepted.numel()  # a case with both verdicts
    for criterion in ("vote", "js"):
        for matches in (True, False):
            rule = RULES.build("dropmatch", {"criterion": criterion, "accept_target_matches": matches})
            keep = rule.draw_masks(inputs)
            assert keep.all()
            scaled = (target_logits[:, :4] / 0.7).expand(5, -1, -1, -1)
            torch.testing.assert_close(rule.head_logits(inputs, keep), scaled)
            result = rule.verify(inputs)
            assert torch.equal(result.accepted, exact.accepted), (criterion, matches)
            assert torch.equal(result.next_token, exact.next_token)


def test_tiny_dropout_reproduces_the_processed_target_logits():
    """p → 0: the heads are the target logits the rule was given, also when logits processors made them differ from
    `hidden @ W.T` (temperature-like scaling and a banned token at −inf), so `vote` is exact matching."""
    g = torch.Generator().manual_seed(1)
    vocab, hidden_size = 11, 8
    weight = torch.randn(vocab, hidden_size, generator=g)
    hidden = torch.randn(3, 6, hidden_size, generator=g)
    processed = (hidden @ weight.T) / 0.7
    processed[..., 4] = -math.inf
    drafts = processed[:, :-1].argmax(-1).clone()
    drafts[:, 1] = (drafts[:, 1] + 1) % vocab
    inputs = VerificationInput(drafts, processed, None, hidden, weight)
    rule = RULES.build("dropmatch", {"dropout": 1e-6, "criterion": "vote", "seed": 0})
    heads = rule.head_logits(inputs, rule.draw_masks(inputs))
    assert heads.shape == (5, 3, 5, vocab)
    assert torch.isneginf(heads[..., 4]).all()
    finite = torch.isfinite(processed[:, :5])
    torch.testing.assert_close(heads[:, finite], processed[:, :5][finite].expand(5, -1), atol=1e-4, rtol=1e-5)
    result = rule.verify(inputs)
    assert torch.equal(result.accepted, RULES.build("exact", {}).verify(inputs).accepted)
    assert result.num_accepted.tolist() == [1, 1, 1]


def test_a_token_the_processors_forbid_is_never_a_head_token(patch_rng):
    """The heads add the dropout perturbation to the processed logits: a token at −inf stays at −inf, so `vote`
    cannot accept it even when the raw head (hidden @ W.T) would pick it."""
    patch_rng(uniform=0.99)  # all kept: the raw heads would all vote token 6
    hidden = torch.nn.functional.one_hot(torch.tensor([[6, 6]]), 11).float() * 10.0
    weight = torch.eye(11)
    processed = hidden @ weight.T
    processed[..., 6] = -math.inf  # e.g. EOS before min_new_tokens
    inputs = VerificationInput(torch.tensor([[6]]), processed, None, hidden, weight)
    result = RULES.build("dropmatch", {"min_votes": 1}).verify(inputs)
    assert result.accepted.tolist() == [[False]] and result.next_token.item() != 6


class _CountMatmuls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.bmm, torch.ops.aten.addmm, torch.ops.aten.baddbmm):
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_heads_are_one_batched_matmul_equal_to_a_loop_over_heads():
    g = torch.Generator().manual_seed(2)
    K, batch, gamma, hidden_size, vocab, p = 6, 2, 4, 24, 50, 0.3
    weight = torch.randn(vocab, hidden_size, generator=g)
    bias = torch.randn(vocab, generator=g)
    hidden = torch.randn(batch, gamma + 1, hidden_size, generator=g)
    keep = torch.rand(K, batch, gamma, hidden_size, generator=g) >= p
    target_logits = hidden @ weight.T + bias  # no processors
    heads = dropout_head_logits(hidden[:, :gamma], keep, p, weight, target_logits[:, :gamma])
    reference = torch.stack([(hidden[:, :gamma] * keep[k] / (1 - p)) @ weight.T + bias for k in range(K)])
    torch.testing.assert_close(heads, reference, atol=1e-4, rtol=1e-5)

    inputs = VerificationInput(
        torch.randint(0, vocab, (batch, gamma), generator=g),
        target_logits,
        torch.softmax(torch.randn(batch, gamma, vocab, generator=g), -1),
        hidden,
        weight,
        bias,
    )
    for criterion in ("js", "vote"):
        rule = RULES.build("dropmatch", {"num_heads": K, "criterion": criterion, "seed": 0})
        with _CountMatmuls() as counter:
            rule.verify(inputs)
        assert counter.count == 1, criterion


def test_chunked_rows_give_the_same_verdicts(monkeypatch):
    g = torch.Generator().manual_seed(3)
    vocab, hidden_size = 40, 12
    weight = torch.randn(vocab, hidden_size, generator=g)
    hidden = torch.randn(3, 8, hidden_size, generator=g) * 2
    inputs = VerificationInput(
        torch.randint(0, vocab, (3, 7), generator=g),
        hidden @ weight.T,
        torch.softmax(torch.randn(3, 7, vocab, generator=g), -1),
        hidden,
        weight,
    )
    whole = RULES.build("dropmatch", {"seed": 5}).verify(inputs)
    monkeypatch.setattr(dropmatch_module, "_CHUNK_ELEMENTS", 5 * vocab * 2)  # 2 rows per chunk: 11 chunks
    chunked = RULES.build("dropmatch", {"seed": 5}).verify(inputs)
    assert torch.equal(whole.accepted, chunked.accepted)


# ---------------------------------------------------------------------------------------------------------------
def test_vote_and_js_differ_both_ways(monkeypatch):
    """Row 0: ŷ = 0 is one head's vote but q is far from the centroid → vote accepts, js rejects.
    Row 1: ŷ = 2 is no head's vote but q is close to the centroid (JS 0.0047 ≤ 0.1854) → js accepts, vote rejects."""
    patch_masks(monkeypatch, MASKS)
    inputs = lambda: worked_example_inputs(torch.tensor([[0], [2]]), Q[[2, 0]])  # noqa: E731
    assert worked_rule(criterion="vote", min_votes=1).verify(inputs()).accepted[:, 0].tolist() == [True, False]
    assert worked_rule(criterion="js").verify(inputs()).accepted[:, 0].tolist() == [False, True]


def test_accept_target_matches_keeps_the_targets_own_token(monkeypatch):
    """All three heads keep [1, 1, 0] and vote 0, the target's token is 1: the draft ŷ = 1 with a confident q is far
    from the centroid and not the majority, so the criterion alone rejects it — and then emits that same token 1."""
    patch_masks(monkeypatch, MASKS[[0, 0, 0]])
    inputs = lambda: worked_example_inputs(torch.tensor([[1]]), torch.tensor([[0.05, 0.85, 0.05, 0.05]]))  # noqa: E731
    strict = worked_rule(accept_target_matches=False).verify(inputs())
    assert strict.num_accepted.tolist() == [0] and strict.next_token.tolist() == [1]
    relaxed = worked_rule().verify(inputs())
    assert relaxed.num_accepted.tolist() == [1]


# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("u, accepted_row2", [(0.5, False), (0.4, True)])
def test_sampling_keeps_every_draft_the_standard_test_accepts(monkeypatch, patch_rng, u, accepted_row2):
    """Sampling, worked example: row 2 (ŷ = 0, q(0) = 0.8, p(0) = 0.3489) is rejected by the criterion, so it is kept
    iff u < p/q = 0.436; row 3 (ŷ = 3, p/q = 0.041) is rejected and the correction is drawn from
    norm(max(p − q, 0)) = [0.3437, 0.6563, 0, 0] (the patched draw takes its argmax, token 1)."""
    drawn = patch_rng(categorical="argmax")
    patch_masks(monkeypatch, MASKS, u=u)
    inputs = worked_example_inputs(DRAFTS[2:], Q[2:], do_sample=True)
    result = worked_rule(criterion="js").verify(inputs)
    assert result.accepted[:, 0].tolist() == [accepted_row2, False]
    residual = drawn[-1][-1]  # the correction distribution of row 3
    torch.testing.assert_close(residual, torch.tensor([0.3437, 0.6563, 0.0, 0.0]), atol=1e-4, rtol=0)
    assert result.next_token[1].item() == 1


def test_sampling_without_target_matches_draws_the_correction_from_p(monkeypatch, patch_rng):
    drawn = patch_rng(categorical="argmax")
    patch_masks(monkeypatch, MASKS, u=0.0)  # u = 0 would accept every draft under the standard test
    inputs = worked_example_inputs(DRAFTS[3:], Q[3:], do_sample=True)
    result = worked_rule(accept_target_matches=False).verify(inputs)
    assert result.accepted.tolist() == [[False]]
    torch.testing.assert_close(drawn[-1], inputs.target_probs[:, 0])


# ---------------------------------------------------------------------------------------------------------------
def random_inputs(seed=4, batch=16, gamma=4, vocab=30, hidden_size=20):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(vocab, hidden_size, generator=g)
    hidden = torch.randn(batch, gamma + 1, hidden_size, generator=g)
    target_logits = hidden @ weight.T
    drafts = torch.randint(0, vocab, (batch, gamma), generator=g)
    q = torch.softmax(torch.randn(batch, gamma, vocab, generator=g), -1)
    return VerificationInput(drafts, target_logits, q, hidden, weight)


def test_same_seed_same_masks_and_verdicts_other_seed_differs():
    inputs = random_inputs()

    def run(seed):
        rule = RULES.build("dropmatch", {"seed": seed, "criterion": "vote"})
        return rule.draw_masks(inputs), rule.verify(inputs).accepted

    masks_a, verdicts_a = run(1)
    masks_b, verdicts_b = run(1)
    masks_c, verdicts_c = run(2)
    assert torch.equal(masks_a, masks_b) and torch.equal(verdicts_a, verdicts_b)
    assert not torch.equal(masks_a, masks_c)
    assert not torch.equal(verdicts_a, verdicts_c)


def test_seeded_rule_draws_fresh_masks_each_round_and_leaves_the_global_rng_alone():
    inputs = random_inputs()
    rule = RULES.build("dropmatch", {"seed": 1})
    torch.manual_seed(0)
    first, second = rule.draw_masks(inputs), rule.draw_masks(inputs)
    after = torch.rand(3)
    torch.manual_seed(0)
    assert torch.equal(after, torch.rand(3))
    assert not torch.equal(first, second)


def test_default_greedy_call_is_reproducible_and_leaves_the_global_rng_alone(attached, close_draft):
    """The default seed: the same greedy call gives the same text after an unrelated torch.manual_seed, and torch's
    global RNG is where the call found it. With seed=None the masks come from that RNG (the old default): it moves."""
    common = dict(assistant_model=close_draft, max_new_tokens=12, do_sample=False, num_assistant_tokens=5,
                  acceptance="dropmatch")
    outputs = []
    for unrelated in (1, 2):
        torch.manual_seed(unrelated)
        state = torch.get_rng_state()
        outputs.append(attached.generate(prompt(8, seed=3), **common))
        assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(outputs[0], outputs[1])
    torch.manual_seed(1)
    state = torch.get_rng_state()
    attached.generate(prompt(8, seed=3), acceptance_kwargs={"seed": None}, **common)
    assert not torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("do_sample", [False, True])
@pytest.mark.parametrize("criterion", ["vote", "js"])
def test_heads_only_for_rows_the_standard_test_rejects_give_the_same_verdicts(monkeypatch, do_sample, criterion):
    """On CPU the heads run only on the drafts `exact` would reject (the others are kept anyway): the same verdicts
    as computing every row, from a matrix product over fewer rows."""
    g = torch.Generator().manual_seed(7)
    batch, gamma, vocab, hidden_size = 3, 6, 40, 16
    weight = torch.randn(vocab, hidden_size, generator=g)
    hidden = torch.randn(batch, gamma + 1, hidden_size, generator=g)
    target_logits = hidden @ weight.T
    drafts = torch.where(torch.rand(batch, gamma, generator=g) < 0.6, target_logits[:, :-1].argmax(-1),
                         torch.randint(0, vocab, (batch, gamma), generator=g))
    q = torch.softmax(torch.randn(batch, gamma, vocab, generator=g), -1)

    def verify(all_rows):
        if all_rows:
            monkeypatch.setattr(DropMatchRule, "rows_to_test", staticmethod(lambda standard, n, device: None))
        torch.manual_seed(0)  # the standard test's uniforms when sampling
        rule = RULES.build("dropmatch", {"criterion": criterion, "dropout": 0.5, "seed": 1})
        with _CountMatmulRows() as rows:
            result = rule.verify(VerificationInput(drafts, target_logits, q, hidden, weight, do_sample=do_sample))
        monkeypatch.undo()
        return result, rows.rows

    selected, selected_rows = verify(all_rows=False)
    every, every_rows = verify(all_rows=True)
    assert torch.equal(selected.accepted, every.accepted) and torch.equal(selected.num_accepted, every.num_accepted)
    assert every_rows == [5 * batch * gamma]
    assert 0 < selected_rows[0] < every_rows[0]  # only the rows exact rejects, K heads each
    assert 0 < every.accepted.sum() < every.accepted.numel()


class _CountMatmulRows(TorchDispatchMode):
    """The number of rows of each matrix product's first operand."""

    def __init__(self):
        super().__init__()
        self.rows = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.bmm, torch.ops.aten.addmm):
            first = args[1] if func.overloadpacket is torch.ops.aten.addmm else args[0]
            self.rows.append(first.reshape(-1, first.shape[-1]).shape[0])
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("min_votes, accepted", [(1, [True, True, True, False]), (2, [True, False, False, False]),
                                                  (3, [False, False, False, False])])
def test_min_votes_on_the_worked_example(monkeypatch, min_votes, accepted):
    """Heads vote 0, 1, 1: ŷ = 1 has two votes, ŷ = 0 one, ŷ = 3 none (criterion alone, no target-match rescue)."""
    patch_masks(monkeypatch, MASKS)
    rule = worked_rule(min_votes=min_votes, accept_target_matches=False)
    assert rule.verify(worked_example_inputs()).accepted[:, 0].tolist() == accepted


def test_js_divergence_matches_a_float64_reference():
    g = torch.Generator().manual_seed(6)
    a = torch.softmax(torch.randn(4, 3, 1000, generator=g) * 3, -1)
    b = torch.softmax(torch.randn(3, 1000, generator=g) * 3, -1)
    a[..., :10] = 0  # supports that differ
    a = a / a.sum(-1, keepdim=True)
    a64, b64 = a.double(), b.double()
    m = (a64 + b64) / 2
    kl = lambda x, y: torch.special.xlogy(x, x / y).nan_to_num().sum(-1)  # noqa: E731
    reference = 0.5 * kl(a64, m) + 0.5 * kl(b64.expand_as(a64), m)
    torch.testing.assert_close(js_divergence(a, b).double(), reference, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(js_divergence(b, a).double(), reference, atol=1e-6, rtol=1e-5)  # symmetric
    assert js_divergence(b, b).abs().max() < 1e-6
    disjoint = js_divergence(torch.tensor([1.0, 0, 0]), torch.tensor([0.0, 0.5, 0.5]))
    torch.testing.assert_close(disjoint, torch.tensor(math.log(2)))


# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"num_heads": 0}, r"`acceptance_kwargs\['num_heads'\]` = 0 .*values in \[1, inf\] for 'dropmatch'"),
        ({"num_heads": 2.0}, r"`acceptance_kwargs\['num_heads'\]` = 2.0 .*type int"),
        ({"dropout": 0}, r"`acceptance_kwargs\['dropout'\]` = 0 .*values in \(0, 1\) for 'dropmatch'"),
        ({"dropout": 1.0}, r"`acceptance_kwargs\['dropout'\]` = 1.0 .*values in \(0, 1\)"),
        ({"dropout": -0.2}, r"`acceptance_kwargs\['dropout'\]` = -0.2 .*values in \(0, 1\)"),
        ({"criterion": "kl"}, r"`acceptance_kwargs\['criterion'\]` = 'kl' .*one of \['vote', 'js'\]"),
        ({"seed": -1}, r"`acceptance_kwargs\['seed'\]` = -1 .*values in \[0, "),
        ({"min_votes": 0}, r"`acceptance_kwargs\['min_votes'\]` = 0 .*values in \[1, inf\]"),
        ({"min_votes": 6}, r"`acceptance_kwargs\['min_votes'\]` = 6 .*at most num_heads = 5 .*Fix: pass min_votes in "
                           r"\[1, 5\], or raise num_heads"),
        ({"accept_target_matches": "yes"}, r"`acceptance_kwargs\['accept_target_matches'\]` = 'yes' .*type bool"),
        ({"heads": 5}, r"unknown option\(s\) \['heads'\] for 'dropmatch'"),
    ],
)
def test_config_validation(kwargs, pattern):
    with pytest.raises(SemSpecConfigError, match=pattern):
        RULES.build("dropmatch", kwargs)


def test_defaults_and_class_attributes():
    config = DropMatchConfig()
    assert (config.num_heads, config.dropout, config.criterion, config.min_votes, config.seed) == (5, 0.3, "vote", 2, 0)
    assert config.accept_target_matches is True
    assert DropMatchRule.requires_target_hidden_states and not RULES.build("dropmatch", {}).requires_draft_probs
    assert not DropMatchRule.lossless and DropMatchRule.supports_sampling


def test_missing_inputs_name_the_fix():
    inputs = random_inputs()
    no_hidden = VerificationInput(inputs.draft_token_ids, inputs.target_logits, inputs.draft_probs)
    with pytest.raises(SemSpecConfigError, match=r"`target_hidden_states / lm_head_weight` = None is not valid: "
                                                 r"allowed the target's LM-head input"):
        RULES.build("dropmatch", {}).verify(no_hidden)
    no_q = VerificationInput(
        inputs.draft_token_ids, inputs.target_logits, None, inputs.target_hidden_states, inputs.lm_head_weight
    )
    with pytest.raises(SemSpecConfigError, match=r"`draft_probs` = None .*with criterion='js' compares it with the "
                                                 r"heads'\. Fix: pass draft_probs, or use acceptance_kwargs="
                                                 r"\{'criterion': 'vote'\}"):
        RULES.build("dropmatch", {"criterion": "js"}).verify(no_q)
    assert RULES.build("dropmatch", {}).verify(no_q).accepted.shape == (16, 4)


# ---------------------------------------------------------------------------------------------------------------
def test_end_to_end_accepts_more_drafts_per_round_than_exact(attached, close_draft):
    """Greedy, close draft, three prompts: dropmatch keeps at least as many drafts per round as exact (here it keeps
    several times more: the tiny model's 64-dimensional head input makes the dropout paths spread widely)."""
    common = dict(assistant_model=close_draft, max_new_tokens=10, do_sample=False, num_assistant_tokens=5)
    common["return_dict_in_generate"] = True
    totals, sequences = {}, {}
    for name, kwargs in [("exact", {}), ("dropmatch", {"seed": 0})]:
        stats = None
        for seed in range(3):
            out = attached.generate(prompt(8, seed=seed), acceptance=name, acceptance_kwargs=kwargs, **common)
            stats = out.acceptance_stats if stats is None else stats + out.acceptance_stats
            sequences[name, seed] = out.sequences
        totals[name] = stats
    assert totals["dropmatch"].mean_accepted_drafts >= totals["exact"].mean_accepted_drafts
    assert totals["dropmatch"].num_accepted > totals["exact"].num_accepted
    assert totals["dropmatch"].num_target_forwards < totals["exact"].num_target_forwards
    # A seed makes the call reproducible without touching torch's global RNG.
    again = attached.generate(prompt(8, seed=0), acceptance="dropmatch", acceptance_kwargs={"seed": 0}, **common)
    assert torch.equal(again.sequences, sequences["dropmatch", 0])


def test_vote_criterion_does_not_ask_the_drafter_for_q(attached, close_draft):
    assert RULES.build("dropmatch", {"criterion": "js"}).requires_draft_probs
    assert not RULES.build("dropmatch", {"criterion": "vote"}).requires_draft_probs
    out = attached.generate(
        prompt(8), assistant_model=close_draft, acceptance="dropmatch", acceptance_kwargs={"criterion": "vote"},
        max_new_tokens=12, return_dict_in_generate=True,
    )
    assert out.acceptance_stats.num_drafted > 0


@pytest.mark.parametrize("option, value, neutral", [("logits_scaling", 16.0, 1.0), ("logit_scale", 0.0625, 1.0),
                                                    ("final_logit_softcapping", 30.0, 0.0)])
def test_a_target_that_transforms_its_logits_after_the_head_is_refused(
    attached, close_draft, monkeypatch, option, value, neutral
):
    # Its K heads would be target_logits + W·(h_k − h) at the raw head's scale: for Granite (logits / 16) that put the
    # heads' argmax elsewhere in 27 of 30 positions. The error names the values that leave the logits alone.
    monkeypatch.setattr(attached.config, option, value, raising=False)
    with pytest.raises(
        SemSpecConfigError, match=rf"`model.config.{option}` = {value} .*None or {neutral} .*Fix: use acceptance='fly'"
    ):
        attached.generate(prompt(6), assistant_model=close_draft, acceptance="dropmatch", max_new_tokens=4)
    # The neutral value is the plain head's output: accepted.
    monkeypatch.setattr(attached.config, option, neutral, raising=False)
    attached.generate(prompt(6), assistant_model=close_draft, acceptance="dropmatch", max_new_tokens=4)


def test_the_lm_head_capture_ignores_other_threads_forwards():
    # The hook sat on the shared head: another thread's generate() on the same target overwrote the captured hidden
    # states between this call's forward and its read, and `dropmatch` verified with the other call's (a changed text,
    # no error).
    import threading

    from conftest import tiny_llama

    from hf_semspec.model_calls import capture_lm_head_input

    model, ids = tiny_llama(seed=0), prompt(6, seed=1)
    with torch.no_grad(), capture_lm_head_input(model) as captured:
        other = threading.Thread(target=lambda: model(input_ids=ids))
        other.start()
        other.join()
        assert captured == []
        model(input_ids=ids[:, :3])
        assert captured[0].shape[:2] == (1, 3)


@pytest.mark.slow
def test_the_lm_head_capture_traces_under_a_fullgraph_compile():
    # The thread check read threading.get_ident(), which torch.compile cannot trace: a target compiled with
    # fullgraph=True (transformers' documented pattern) failed every `dropmatch` call.
    from conftest import tiny_llama

    from hf_semspec.model_calls import capture_lm_head_input

    model, ids = tiny_llama(seed=0), prompt(6, seed=1)
    model.forward = torch.compile(model.forward, backend="eager", fullgraph=True)
    with torch.no_grad(), capture_lm_head_input(model) as captured:
        model(input_ids=ids[:, :4])
    assert captured[0].shape[:2] == (1, 4)


def test_the_lm_head_capture_takes_an_input_passed_by_name():
    # The pre-hook read args[0]: a forward calling its head as `self.lm_head(input=hidden)` raised an IndexError.
    from conftest import tiny_llama

    from hf_semspec.model_calls import capture_lm_head_input

    model, ids = tiny_llama(seed=0), prompt(6, seed=1)
    with torch.no_grad(), capture_lm_head_input(model) as captured:
        hidden = model.model(input_ids=ids).last_hidden_state
        logits = model.get_output_embeddings()(input=hidden)
    assert captured[0] is hidden and torch.equal(logits, model(input_ids=ids).logits)


def test_a_target_that_never_calls_its_head_is_named_not_an_index_error(attached, close_draft, monkeypatch):
    # Its logits come another way (here a second module sharing the head's weight): there is no input of the module
    # get_output_embeddings() returns to read, and the loop raised an IndexError.
    original = type(attached).forward

    def forward_with_another_head(self, *args, **kwargs):
        head = self.lm_head
        other_head = torch.nn.Linear(head.in_features, head.out_features, bias=False)
        other_head.weight = head.weight
        # Swapped by hand, not with monkeypatch: pytest ≥ 9.2 undoes a patched attribute that was not in the
        # instance's __dict__ by deleting it, and a submodule lives in _modules: the session target lost its head.
        self.lm_head = other_head
        try:
            return original(self, *args, **kwargs)
        finally:
            self.lm_head = head

    monkeypatch.setattr(type(attached), "forward", forward_with_another_head)
    with pytest.raises(SemSpecConfigError, match=r"`model` = 'LlamaForCausalLM' is not valid: allowed a target whose "
                                                 r"forward computes its logits with get_output_embeddings\(\).*Fix: "):
        attached.generate(prompt(6), assistant_model=close_draft, acceptance="dropmatch", max_new_tokens=4)
