"""One suite for every registered acceptance rule: a rule that registers itself is tested here automatically.

Model-free properties on hand-built logits (verification is a pure function), then each rule end to end on tiny
models in greedy and sampling mode (or a clear error where the rule does not define that mode).
"""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch
from conftest import prompt

import hf_semspec
from hf_semspec.errors import SemSpecConfigError
from hf_semspec.rules import RULES, VerificationInput

RULE_NAMES = hf_semspec.available_rules()
MODES = [False, True]  # do_sample
VOCAB, HIDDEN = 11, 64
# A fixed LM head: target logits are always `hidden @ HEAD.T`, so rules that re-run the head (DropMatch) see the same
# model as rules that read the logits. Rows are near-orthogonal unit vectors in 64 dimensions.
HEAD = torch.nn.functional.normalize(torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(0)), dim=-1)


# Rules whose sampled test keeps a draft the target all but rules out, by design: no one-hot target rejects it surely.
KEEPS_UNLIKELY_DRAFTS = {
    "ensemble": "ensemble keeps any allowed draft with probability ≥ 1 − w (tests/test_ensemble_rule.py checks its "
                "emitted distribution)",
}


def rule_and_mode():
    return [pytest.param(name, do_sample, id=f"{name}-{'sample' if do_sample else 'greedy'}") for name in RULE_NAMES for do_sample in MODES]


def make_rule(name):
    return RULES.build(name, {})


def skip_unsupported(rule, do_sample):
    if not (rule.supports_sampling if do_sample else rule.supports_greedy):
        pytest.skip(f"{rule.name} does not define do_sample={do_sample} (checked in test_end_to_end_on_tiny_models)")


def make_inputs(hidden, draft_ids, do_sample, seed=0, draft_probs=None):
    """A VerificationInput with everything any rule may ask for; target logits = `hidden @ HEAD.T`. Seeds torch's
    global RNG, where the rules draw from, with `seed + 1`."""
    batch, gamma = draft_ids.shape
    torch.manual_seed(seed + 1)
    g = torch.Generator().manual_seed(seed)
    if draft_probs is None:
        draft_probs = torch.softmax(torch.randn(batch, gamma, VOCAB, generator=g), -1)
        # keep q(x̂) > 0 as for a token actually drawn from q
        draft_probs = draft_probs.scatter(-1, draft_ids[..., None], 0.5)
        draft_probs = draft_probs / draft_probs.sum(-1, keepdim=True)
    return VerificationInput(
        draft_token_ids=draft_ids,
        target_logits=hidden @ HEAD.T,
        draft_probs=draft_probs,
        target_hidden_states=hidden,
        lm_head_weight=HEAD,
        lm_head_bias=None,
        do_sample=do_sample,
    )


def one_hot_hidden(tokens, margin=60.0):
    """Hidden states whose logits put (numerically) all mass on `tokens` (shape `(batch, γ + 1)`): h = margin·w_t,
    so the token's logit is `margin` and every other logit is `margin·⟨w_t, w_j⟩`, far below it."""
    return HEAD[tokens] * margin


def random_hidden(*shape, generator, scale=3.0):
    return torch.randn(*shape, HIDDEN, generator=generator) * scale


@pytest.mark.parametrize("name,do_sample", rule_and_mode())
def test_draft_equal_to_confident_target_is_fully_accepted(name, do_sample):
    rule = make_rule(name)
    skip_unsupported(rule, do_sample)
    target_tokens = torch.tensor([[4, 7, 1, 9, 2], [0, 0, 3, 10, 5]])
    inputs = make_inputs(one_hot_hidden(target_tokens), target_tokens[:, :-1], do_sample)
    result = rule.verify(inputs)
    assert result.num_accepted.tolist() == [4, 4]
    assert result.next_token.tolist() == [2, 5]  # the bonus token


@pytest.mark.parametrize("name,do_sample", rule_and_mode())
@pytest.mark.parametrize("mismatch_at", [0, 2, 3])
def test_one_hot_target_rejects_a_mismatch_and_emits_its_token(name, do_sample, mismatch_at):
    rule = make_rule(name)
    skip_unsupported(rule, do_sample)
    if do_sample and name in KEEPS_UNLIKELY_DRAFTS:
        pytest.skip(KEEPS_UNLIKELY_DRAFTS[name])
    target_tokens = torch.tensor([[4, 7, 1, 9, 2]])
    draft = target_tokens[:, :-1].clone()
    draft[0, mismatch_at] = 6
    result = rule.verify(make_inputs(one_hot_hidden(target_tokens), draft, do_sample))
    assert result.num_accepted.tolist() == [mismatch_at]
    assert result.next_token.tolist() == [target_tokens[0, mismatch_at].item()]


@pytest.mark.parametrize("name", [n for n in RULE_NAMES if RULES.get(n).lossless and RULES.get(n).supports_sampling])
def test_lossless_rules_accept_everything_when_q_equals_p(name):
    rule = make_rule(name)
    hidden = torch.zeros(3, 6, HIDDEN)  # uniform target
    draft_ids = torch.randint(0, VOCAB, (3, 5), generator=torch.Generator().manual_seed(0))
    inputs = make_inputs(hidden, draft_ids, True, draft_probs=torch.full((3, 5, VOCAB), 1.0 / VOCAB))
    assert rule.verify(inputs).num_accepted.tolist() == [5, 5, 5]


@pytest.mark.parametrize("name,do_sample", rule_and_mode())
def test_invariants_on_random_logits(name, do_sample):
    rule = make_rule(name)
    skip_unsupported(rule, do_sample)
    g = torch.Generator().manual_seed(0)
    for gamma in (1, 3, 8):
        hidden = random_hidden(16, gamma + 1, generator=g)
        draft_ids = torch.randint(0, VOCAB, (16, gamma), generator=g)
        inputs = make_inputs(hidden, draft_ids, do_sample, seed=gamma)
        before = {k: v.clone() for k, v in dataclasses.asdict(inputs).items() if isinstance(v, torch.Tensor)}
        result = rule.verify(inputs)
        assert result.num_accepted.shape == (16,) and result.next_token.shape == (16,)
        assert ((result.num_accepted >= 0) & (result.num_accepted <= gamma)).all()
        assert ((result.next_token >= 0) & (result.next_token < VOCAB)).all()
        assert result.accepted.shape == (16, gamma)
        # n is the length of the all-accepted prefix of the rule's verdicts
        prefix = result.accepted.long().cumprod(-1).sum(-1)
        assert torch.equal(prefix, result.num_accepted)
        for key, value in before.items():  # logits and every other input untouched
            assert torch.equal(getattr(inputs, key), value), key


@pytest.mark.parametrize("name,do_sample", rule_and_mode())
def test_same_seed_same_result(name, do_sample):
    rule = make_rule(name)
    skip_unsupported(rule, do_sample)
    g = torch.Generator().manual_seed(3)
    hidden = random_hidden(32, 5, generator=g)
    draft_ids = torch.randint(0, VOCAB, (32, 4), generator=g)
    # A fresh rule for each, as generate() builds one per call (a rule with its own seeded generator, dropmatch's
    # masks, draws fresh values each round of a call).
    first = rule.verify(make_inputs(hidden, draft_ids, do_sample, seed=7))
    second = make_rule(name).verify(make_inputs(hidden, draft_ids, do_sample, seed=7))
    assert torch.equal(first.num_accepted, second.num_accepted) and torch.equal(first.next_token, second.next_token)


@pytest.mark.parametrize("name,do_sample", rule_and_mode())
def test_zero_draft_tokens_emits_the_target_token(name, do_sample):
    rule = make_rule(name)
    skip_unsupported(rule, do_sample)
    hidden = one_hot_hidden(torch.tensor([[8], [2]]))
    result = rule.verify(make_inputs(hidden, torch.zeros(2, 0, dtype=torch.long), do_sample))
    assert result.num_accepted.tolist() == [0, 0] and result.next_token.tolist() == [8, 2]


@pytest.mark.parametrize("name", RULE_NAMES)
def test_rule_class_is_documented_and_config_roundtrips(name):
    cls = RULES.get(name)
    assert cls.paper.startswith("https://"), "each rule links its paper"
    module_doc = __import__(cls.__module__, fromlist=["_"]).__doc__
    assert module_doc and "Worked example" in module_doc, "each rule's docstring carries a worked example"
    config = cls.config_class()
    assert cls.config_class.from_kwargs(json.loads(json.dumps(config.to_dict()))) == config
    for row in cls.config_class.field_docs():
        assert row["help"], f"{name}.{row['name']} needs a help string"
    assert 1 <= cls.default_num_draft_tokens <= 128


@pytest.mark.parametrize("name", RULE_NAMES)
def test_unknown_option_is_rejected_for_every_rule(name):
    with pytest.raises(SemSpecConfigError, match=rf"unknown option\(s\) \['no_such_option'\] for '{name}'"):
        RULES.build(name, {"no_such_option": 1})


@pytest.mark.parametrize("name,do_sample", rule_and_mode())
def test_end_to_end_on_tiny_models(attached, close_draft, rdk_draft, name, do_sample):
    rule_class = RULES.get(name)
    ids = prompt(8)
    draft = rdk_draft if rule_class.redistributes_draft else close_draft
    kwargs = dict(assistant_model=draft, acceptance=name, max_new_tokens=16, min_new_tokens=16, do_sample=do_sample,
                  return_dict_in_generate=True)  # (min_new_tokens: no EOS cuts a round, so each round emits n + 1)
    supported = rule_class.supports_sampling if do_sample else rule_class.supports_greedy
    if not supported:
        with pytest.raises(SemSpecConfigError, match=rf"`do_sample` = {do_sample}.*acceptance='{name}'"):
            attached.generate(ids, **kwargs)
        return
    torch.manual_seed(0)
    out = attached.generate(ids, **kwargs)
    new = out.sequences.shape[1] - ids.shape[1]
    assert new == 16
    stats = out.acceptance_stats
    assert stats.num_new_tokens == new
    # The statistics against the output: every round emitted its accepted drafts and one target token.
    assert stats.num_accepted + stats.num_target_forwards == new
    assert sum(stats.accepted_per_position) == stats.num_accepted and sum(stats.drafted_per_position) == stats.num_drafted
    assert all(a <= d for a, d in zip(stats.accepted_per_position, stats.drafted_per_position))
    torch.manual_seed(0)
    assert torch.equal(attached.generate(ids, **kwargs).sequences, out.sequences)


@pytest.mark.parametrize("name", RULE_NAMES)
def test_rule_configs_copy_equal(name):
    a = make_rule(name)
    assert copy.deepcopy(a.config) == a.config


FORBIDDEN_LOGITS = {"-inf": float("-inf"), "lowest finite": torch.finfo(torch.float32).min,
                    "lowest finite / temperature 1.5": torch.finfo(torch.float32).min / 1.5}


@pytest.mark.parametrize("name,do_sample,forbidden", [
    pytest.param(name, do_sample, forbidden, id=f"{name}-{'sample' if do_sample else 'greedy'}-{forbidden}")
    for name in RULE_NAMES for do_sample in MODES for forbidden in FORBIDDEN_LOGITS
    if do_sample or "temperature" not in forbidden  # greedy decoding applies no temperature
])
def test_a_draft_the_processors_forbid_is_never_accepted(name, do_sample, forbidden):
    """Whatever the rule: a draft whose target logit is −inf (outside top-k / top-p, a bad word) is rejected, also
    where `remove_invalid_values=True` wrote −inf as the lowest finite float, which sampling then divides by its
    temperature (transformers runs that processor before the warpers). A uniform target makes the relaxed rules
    accept everything else: a flat first row, then rows certain of the drafts after it (fly flips it: high entropy,
    the window matches, in both modes)."""
    rule = make_rule(name)
    skip_unsupported(rule, do_sample)
    draft = torch.tensor([[3, 0, 0, 0, 0, 0, 0, 0]])
    hidden = torch.cat([torch.zeros(1, 1, HIDDEN), one_hot_hidden(torch.zeros(1, 8, dtype=torch.long))], dim=1)
    inputs = make_inputs(hidden, draft, do_sample)
    inputs.target_logits[0, 0, 3] = FORBIDDEN_LOGITS[forbidden]  # the processors forbid the first draft
    result = rule.verify(inputs)
    assert result.num_accepted.tolist() == [0]
    assert result.next_token.item() != 3


@pytest.mark.parametrize("name", [n for n in RULE_NAMES if RULES.get(n).supports_sampling and not RULES.get(n).redistributes_draft])
def test_sampled_output_stays_inside_the_processors_support(attached, name):
    """End to end with top_k: every emitted token has a finite processed target score (fly's window and dropmatch's
    JS test emitted tokens outside the target's top-k before the base class rejected forbidden drafts)."""
    from conftest import perturbed_copy

    draft = perturbed_copy(attached, scale=0.6, seed=2)  # its top-3 often differs from the target's
    options = {"fly": {"window": 2}}.get(name, {})
    emitted = 0
    for seed in range(4):
        torch.manual_seed(seed)
        ids = prompt(8, seed=seed)
        out = attached.generate(ids, assistant_model=draft, acceptance=name, acceptance_kwargs=options, do_sample=True,
                                top_k=3, num_assistant_tokens=8, max_new_tokens=24, return_dict_in_generate=True,
                                output_scores=True)
        for i, token in enumerate(out.sequences[0, ids.shape[1]:].tolist()):
            assert out.scores[i][0, token] > float("-inf"), (name, seed, i)
            emitted += 1
    assert emitted > 24  # (a generation may end early at an EOS)


@pytest.mark.parametrize("name,do_sample", rule_and_mode())
def test_inputs_of_the_wrong_shape_get_a_clear_error(name, do_sample):
    """verify() is a public pure function: logits for γ positions instead of γ + 1, or a missing q where the rule
    reads it, name the field and the shape (they were raw AttributeError / RuntimeError tracebacks)."""
    rule = make_rule(name)
    skip_unsupported(rule, do_sample)
    draft = torch.tensor([[1, 2]])
    inputs = make_inputs(random_hidden(1, 3, generator=torch.Generator().manual_seed(0)), draft, do_sample)
    too_few = dataclasses.replace(inputs, target_logits=inputs.target_logits[:, :2], _memo={})
    with pytest.raises(SemSpecConfigError, match=r"`target_logits` = 'a tensor of shape \(1, 2, 11\)' is not valid: "
                                                 r"allowed shape \(batch, γ \+ 1, vocab\) = \(1, 3, vocab\)"):
        rule.verify(too_few)
    without_q = dataclasses.replace(inputs, draft_probs=None, _memo={})
    misshaped_q = dataclasses.replace(inputs, draft_probs=inputs.draft_probs[..., :-1], _memo={})
    # Sampling: the standard test u < p/q reads q in every rule but fly with greedy drafts.
    if do_sample and not rule.greedy_drafts or rule.requires_draft_probs:
        for wrong, received in ((without_q, "None"), (misshaped_q, r"'a tensor of shape \(1, 2, 10\)'")):
            with pytest.raises(SemSpecConfigError, match=rf"`draft_probs` = {received} is not valid: allowed the "
                                                         r"distribution each draft was drawn from, shape \(batch, γ, "
                                                         r"vocab\) = \(1, 2, 11\)"):
                rule.verify(wrong)
    else:  # the rule does not read q here
        assert rule.verify(without_q).num_accepted.shape == (1,)
