"""Draft-length policies: the interface as the loop uses it, the resolution of `draft_length` /
`num_assistant_tokens`, and one suite run on every registered policy."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field

import pytest
import torch
from conftest import prompt
from transformers import GenerationConfig

import hf_semspec
from hf_semspec.component_config import Range
from hf_semspec.draft_length import POLICIES, DraftLengthConfig, DraftLengthPolicy, RoundOutcome, register_policy
from hf_semspec.errors import SemSpecConfigError

POLICY_NAMES = hf_semspec.available_draft_length_policies()


@dataclass
class _StopAfterConfig(DraftLengthConfig):
    component_name = "stop_after_test"
    stop_after: int = field(default=2, metadata={"help": "drafts per round", "range": Range(1, 16)})
    cap: int | None = field(default=None, metadata={"help": "budget", "range": Range(1, 128)})


class _StopAfterPolicy(DraftLengthPolicy):
    """Test policy: budget `cap`, but stops after `stop_after` drafts; records every call."""

    name = "stop_after_test"
    config_class = _StopAfterConfig
    length_field = "cap"
    decides_per_token = True
    reads_draft_probs = True

    def __init__(self, config=None):
        super().__init__(config)
        self.asked, self.outcomes, self.windows = [], [], []

    def set_deferred_window(self, window):
        self.windows.append(window)

    def max_tokens(self):
        return self.config.cap

    def keep_drafting(self, num_drafted, probs):
        self.asked.append((num_drafted, None if probs is None else probs.sum(-1)))
        return num_drafted < self.config.stop_after

    def observe(self, outcome):
        self.outcomes.append(outcome)


@pytest.fixture
def stop_after_registered():
    register_policy(_StopAfterPolicy)
    yield
    POLICIES.unregister("stop_after_test")


def generate(model, draft, **kwargs):
    return model.generate(prompt(8), assistant_model=draft, acceptance="exact", max_new_tokens=24,
                          min_new_tokens=24, return_dict_in_generate=True, **kwargs)


def test_a_numpy_int_is_a_draft_length(attached, close_draft):
    # np.int64(3) was refused as "3 is not valid: allowed an int in [1, 64]".
    import numpy as np

    a = generate(attached, close_draft, num_assistant_tokens=np.int64(3))
    b = generate(attached, close_draft, num_assistant_tokens=3)
    c = generate(attached, close_draft, draft_length="constant", draft_length_kwargs={"num_tokens": np.int64(3)})
    assert torch.equal(a.sequences, b.sequences) and torch.equal(c.sequences, b.sequences)
    assert a.acceptance_stats.num_drafted == b.acceptance_stats.num_drafted == c.acceptance_stats.num_drafted
    # and any option: stored as Python's numbers, so that the config's JSON holds them
    config = POLICIES.get("cost_aware").config_class.from_kwargs(
        {"max_tokens": np.int64(8), "calibration_discount": np.float32(0.5)})
    assert type(config.max_tokens) is int and type(config.calibration_discount) is float
    assert json.loads(json.dumps(config.to_dict())) == {"max_tokens": 8, "calibration_discount": 0.5}
    adaptive = POLICIES.get("adaedl").config_class.from_kwargs({"adaptive": np.False_})
    assert adaptive.adaptive is False
    # np.float64 is a float subclass whose repr differs from the float's: two equal arms must still be one
    with pytest.raises(SemSpecConfigError, match=r"arms"):
        POLICIES.get("tapout").config_class.from_kwargs({"arms": [
            {"name": "cost_aware", "calibration_discount": np.float64(0.98)},
            {"name": "cost_aware", "calibration_discount": 0.98}]})


def test_num_assistant_tokens_and_constant_kwargs_agree(attached, close_draft):
    a = generate(attached, close_draft, num_assistant_tokens=3)
    b = generate(attached, close_draft, draft_length="constant", draft_length_kwargs={"num_tokens": 3})
    assert torch.equal(a.sequences, b.sequences)
    assert a.acceptance_stats == b.acceptance_stats
    assert len(a.acceptance_stats.drafted_per_position) == 3


def test_a_length_from_the_call_wins_over_the_models_and_two_in_one_place_conflict(attached, close_draft,
                                                                                      monkeypatch):
    # As every other setting: the call, then a passed config, then the model's. Once, the model's saved
    # num_assistant_tokens was an error beside a length given in the call's options.
    monkeypatch.setattr(attached.generation_config, "num_assistant_tokens", 4)
    out = generate(attached, close_draft, draft_length="constant", draft_length_kwargs={"num_tokens": 6})
    assert len(out.acceptance_stats.drafted_per_position) == 6
    passed = GenerationConfig(draft_length="constant", draft_length_kwargs={"num_tokens": 2})
    assert len(generate(attached, close_draft, generation_config=passed).acceptance_stats.drafted_per_position) == 2
    monkeypatch.setattr(attached.generation_config, "draft_length", "constant", raising=False)
    monkeypatch.setattr(attached.generation_config, "draft_length_kwargs", {"num_tokens": 6}, raising=False)
    assert len(generate(attached, close_draft, num_assistant_tokens=3).acceptance_stats.drafted_per_position) == 3
    with pytest.raises(SemSpecConfigError, match=r"`draft_length_kwargs\['num_tokens'\]` = 6 is not valid: allowed "
                                                 r"the same value as num_assistant_tokens=4 when both are given"):
        generate(attached, close_draft)  # both in the model's config
    with pytest.raises(SemSpecConfigError, match=r"= 2 is not valid: allowed the same value as num_assistant_tokens=3"):
        generate(attached, close_draft, num_assistant_tokens=3, draft_length_kwargs={"num_tokens": 2})


def test_a_cap_in_the_call_caps_the_models_initial_length(attached, close_draft, monkeypatch):
    monkeypatch.setattr(attached.generation_config, "num_assistant_tokens", 20)
    out = generate(attached, close_draft, draft_length="heuristic", draft_length_kwargs={"max_tokens": 10})
    assert out.acceptance_stats.drafted_per_round[0] == 10
    with pytest.raises(SemSpecConfigError, match=r"`num_assistant_tokens` = 20 .*at most draft_length_kwargs"):
        generate(attached, close_draft, num_assistant_tokens=20, draft_length="heuristic",
                 draft_length_kwargs={"max_tokens": 10})  # both in the call: which one was meant is not known


def test_passing_the_models_own_config_asks_for_no_schedule_or_length(attached, close_draft, monkeypatch):
    # Evaluation harnesses pass generation_config=model.generation_config: its schedule and length are the model's
    # defaults, which a named policy or an instance sets aside, not the caller's request that conflicts with them.
    from hf_semspec.draft_length.svip import SVIPPolicy

    monkeypatch.setattr(attached.generation_config, "num_assistant_tokens_schedule", "constant")
    monkeypatch.setattr(attached.generation_config, "num_assistant_tokens", 4)
    for config in (attached.generation_config, copy.deepcopy(attached.generation_config)):
        assert generate(attached, close_draft, generation_config=config, draft_length="svip").acceptance_stats
        assert generate(attached, close_draft, generation_config=config, draft_length=SVIPPolicy()).acceptance_stats
    changed = copy.deepcopy(attached.generation_config)
    changed.num_assistant_tokens_schedule = "heuristic"  # the caller's own request: it conflicts
    with pytest.raises(SemSpecConfigError, match=r"`num_assistant_tokens_schedule` = 'heuristic'.*draft_length='svip'"):
        generate(attached, close_draft, generation_config=changed, draft_length="svip")


def test_a_drafts_length_above_the_cap_is_an_error_that_says_where_it_came_from(attached, close_draft, monkeypatch):
    # transformers' "heuristic" schedule adds 2 per fully accepted round and writes γ back to the draft, without a
    # cap: 449 after four long calls with an agreeing draft. Capped silently, it drafted 128 tokens a round.
    monkeypatch.setattr(close_draft.generation_config, "num_assistant_tokens", 449)
    monkeypatch.setattr(close_draft.generation_config, "num_assistant_tokens_schedule", "heuristic")
    call = dict(assistant_model=close_draft, acceptance="exact", max_new_tokens=12, return_dict_in_generate=True)
    with pytest.raises(SemSpecConfigError, match=(
        r"`assistant_model\.generation_config\.num_assistant_tokens` = 449 is not valid: allowed an int in \[1, 128\]"
        r".*Fix: pass num_assistant_tokens=<draft tokens per round> with the call .*reset the draft's: "
        r"assistant_model\.generation_config\.num_assistant_tokens = 20 .*'heuristic' of the draft raises it by 2")):
        attached.generate(prompt(8), **call)
    for draft_length in ("constant", "tapout"):  # whichever policy starts from it
        with pytest.raises(SemSpecConfigError, match=r"num_assistant_tokens` = 449"):
            attached.generate(prompt(8), draft_length=draft_length, **call)
    # The call's length wins, and the draft's is not read; reset, the draft's value is γ again.
    assert attached.generate(prompt(8), num_assistant_tokens=4, **call).acceptance_stats.drafted_per_round[0] == 4
    close_draft.generation_config.num_assistant_tokens = 6
    monkeypatch.setattr(close_draft.generation_config, "num_assistant_tokens_schedule", "constant")
    assert attached.generate(prompt(8), **call).acceptance_stats.drafted_per_round[0] == 6
    close_draft.generation_config.num_assistant_tokens = 129  # set by hand: the message leaves the schedule out
    with pytest.raises(SemSpecConfigError, match=r"= 129 .*\(transformers' default\)$"):
        attached.generate(prompt(8), **call)


def test_default_length_is_the_rules(attached, close_draft):
    stats = generate(attached, close_draft).acceptance_stats
    assert len(stats.drafted_per_position) == hf_semspec.rules.RULES.get("exact").default_num_draft_tokens


def test_per_token_policy_stops_early_and_learns(attached, close_draft, stop_after_registered):
    policy = _StopAfterPolicy(_StopAfterConfig(stop_after=2, cap=6))
    out = generate(attached, close_draft, draft_length=policy)
    stats = out.acceptance_stats
    assert len(stats.drafted_per_position) == 2  # never more than 2 drafts although the budget was 6
    plain = type(attached).generate(attached, prompt(8), do_sample=False, max_new_tokens=24, min_new_tokens=24)
    assert torch.equal(out.sequences, plain)  # still lossless
    # asked after the 1st and 2nd draft of each full round, with q (rows sum to 1)
    assert {n for n, _ in policy.asked} == {1, 2}
    assert all(torch.allclose(s, torch.ones_like(s)) for _, s in policy.asked)
    # one outcome per round, consistent with the stats
    assert len(policy.outcomes) == stats.num_target_forwards
    assert sum(o.num_drafted for o in policy.outcomes) == stats.num_drafted
    assert sum(o.num_accepted for o in policy.outcomes) == stats.num_accepted
    assert all(o.seconds > 0 for o in policy.outcomes)
    # and round by round: the stats keep the lengths the policy chose and what the rule accepted of each
    assert stats.drafted_per_round == [o.num_drafted for o in policy.outcomes]
    assert stats.accepted_per_round == [o.num_accepted for o in policy.outcomes]


def test_policy_is_told_the_rules_window_and_each_rounds_own_test_prefix(attached, close_draft, stop_after_registered):
    """`fly` (W = 3): the policy hears W once per call, and each round's `num_matched` (drafts before the first that
    failed Δ) is at most its accepted count, below it where the window kept a mismatch. `exact` has no window."""
    policy = _StopAfterPolicy(_StopAfterConfig(stop_after=6, cap=6))
    for seed in range(3):
        attached.generate(prompt(8, seed=seed), assistant_model=close_draft, acceptance="fly",
                          acceptance_kwargs={"window": 3}, draft_length=policy, max_new_tokens=12, do_sample=False)
    assert policy.windows == [3, 3, 3]
    assert all(o.num_matched is not None and o.num_matched <= o.num_accepted for o in policy.outcomes)
    assert any(o.num_matched < o.num_accepted for o in policy.outcomes)  # the window kept a mismatch
    exact = _StopAfterPolicy(_StopAfterConfig(stop_after=6, cap=6))
    generate(attached, close_draft, draft_length=exact)
    assert exact.windows == [None] and all(o.num_matched is None for o in exact.outcomes)
    assert all(o.matched == o.num_accepted for o in exact.outcomes)


def test_policy_instance_keeps_state_across_calls(attached, close_draft, stop_after_registered):
    policy = _StopAfterPolicy(_StopAfterConfig(stop_after=3, cap=4))
    first = generate(attached, close_draft, draft_length=policy).acceptance_stats.num_target_forwards
    second = generate(attached, close_draft, draft_length=policy).acceptance_stats.num_target_forwards
    assert len(policy.outcomes) == first + second


def test_policy_by_name_from_generation_config_json(attached, close_draft, stop_after_registered, tmp_path):
    GenerationConfig(
        max_new_tokens=24, min_new_tokens=24, acceptance="exact", draft_length="stop_after_test",
        draft_length_kwargs={"stop_after": 1}, num_assistant_tokens=5,
    ).save_pretrained(tmp_path)
    out = attached.generate(
        prompt(8), assistant_model=close_draft, generation_config=GenerationConfig.from_pretrained(tmp_path),
        return_dict_in_generate=True,
    )
    assert len(out.acceptance_stats.drafted_per_position) == 1


@pytest.mark.parametrize("name, options", [("svip", {"threshold": 0.4}), ("adaedl", {"threshold": 0.6}),
                                           ("cost_aware", {"prior_strength": 2.0})])
def test_a_config_instance_in_a_generation_config_reads_the_same_after_json(attached, close_draft, tmp_path, name,
                                                                           options):
    # Saved with every field, the instance's cap (left at its default, so num_assistant_tokens may set it) read back
    # as given, and conflicted with num_assistant_tokens: a config that worked failed after save / load.
    config = POLICIES.get(name).config_class(**options)
    assert config.to_dict() == options
    saved = GenerationConfig(max_new_tokens=12, acceptance="exact", draft_length=name, draft_length_kwargs=config,
                             num_assistant_tokens=8)
    before = attached.generate(prompt(8), assistant_model=close_draft, generation_config=saved)
    saved.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "generation_config.json").read_text())["draft_length_kwargs"] == options
    after = attached.generate(prompt(8), assistant_model=close_draft,
                              generation_config=GenerationConfig.from_pretrained(tmp_path))
    assert torch.equal(before, after)


def test_a_length_field_that_the_config_lacks_is_refused_at_registration():
    class _MisnamedLength(DraftLengthPolicy):
        name = "misnamed_length_test"
        config_class = _StopAfterConfig
        length_field = "num_tokens"

        def max_tokens(self):
            return 1

    with pytest.raises(ValueError, match=r"its `length_field` = 'num_tokens' is not a field of _StopAfterConfig "
                                         r"\(\['stop_after', 'cap'\]\)"):
        register_policy(_MisnamedLength)
    assert "misnamed_length_test" not in hf_semspec.available_draft_length_policies()


def test_orphan_policy_options_in_the_models_config_are_an_error_when_a_rule_decodes(attached, close_draft,
                                                                                      monkeypatch):
    # They were dropped: the call ran with constant's default length, nothing said so.
    monkeypatch.setattr(attached.generation_config, "draft_length_kwargs", {"num_tokens": 2}, raising=False)
    with pytest.raises(SemSpecConfigError, match=r"`model.generation_config.draft_length_kwargs` = \{'num_tokens': 2\}"
                                                 r" is not valid: allowed only together with `draft_length`"):
        generate(attached, close_draft)
    monkeypatch.setattr(attached.generation_config, "draft_length", "constant", raising=False)
    assert generate(attached, close_draft).acceptance_stats.drafted_per_position[2:] == []  # 2 a round: its options


def test_conflicting_lengths_are_rejected(attached, close_draft):
    with pytest.raises(SemSpecConfigError, match=r"`draft_length_kwargs\['num_tokens'\]` = 4.*num_assistant_tokens=6"):
        generate(attached, close_draft, num_assistant_tokens=6, draft_length="constant", draft_length_kwargs={"num_tokens": 4})


def test_unknown_policy_and_options(attached, close_draft):
    with pytest.raises(SemSpecConfigError, match=r"`draft_length` = 'fast'.*allowed one of \[.*'constant'"):
        generate(attached, close_draft, draft_length="fast")
    with pytest.raises(SemSpecConfigError, match=r"unknown option\(s\) \['gamma'\] for 'constant'"):
        generate(attached, close_draft, draft_length="constant", draft_length_kwargs={"gamma": 3})
    with pytest.raises(SemSpecConfigError, match=r"`draft_length_kwargs\['num_tokens'\]` = 0"):
        generate(attached, close_draft, draft_length="constant", draft_length_kwargs={"num_tokens": 0})
    with pytest.raises(SemSpecConfigError, match=r"`draft_length_kwargs`.*only together with `draft_length`.*available_draft_length_policies"):
        generate(attached, close_draft, draft_length_kwargs={"num_tokens": 3})


def test_instance_with_kwargs_is_rejected(attached, close_draft):
    with pytest.raises(SemSpecConfigError, match=r"`draft_length_kwargs`.*policy instance"):
        generate(attached, close_draft, draft_length=POLICIES.build("constant", {"num_tokens": 2}), draft_length_kwargs={})


def test_unknown_schedule_is_rejected(attached, close_draft):
    with pytest.raises(SemSpecConfigError, match=r"`num_assistant_tokens_schedule` = 'bogus'"):
        generate(attached, close_draft, num_assistant_tokens_schedule="bogus")


# One suite for every registered policy.


def built(name):
    policy_class = POLICIES.get(name)
    config = policy_class.config_class.from_kwargs({})
    if policy_class.length_field and getattr(config, policy_class.length_field) is None:
        setattr(config, policy_class.length_field, 6)
    return policy_class(config)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_policy_budget_stays_in_range_under_any_outcomes(name):
    policy = built(name)
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        budget = policy.max_tokens()
        assert isinstance(budget, int) and 1 <= budget <= 128
        drafted = budget
        if policy.decides_per_token:
            for n in range(1, budget):
                probs = torch.softmax(torch.randn(1, 50, generator=g) * 3, -1) if policy.reads_draft_probs else None
                keep = policy.keep_drafting(n, probs)
                assert isinstance(keep, bool)
                if not keep:
                    drafted = n
                    break
        accepted = int(torch.randint(0, drafted + 1, (1,), generator=g))
        policy.observe(RoundOutcome(drafted, accepted, seconds=0.01 * (drafted + 1)))


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_policy_documented_and_config_roundtrips(name):
    policy_class = POLICIES.get(name)
    assert "Worked example" in (__import__(policy_class.__module__, fromlist=["_"]).__doc__ or "")
    config = policy_class.config_class()
    assert policy_class.config_class.from_kwargs(json.loads(json.dumps(config.to_dict()))) == config
    assert all(row["help"] for row in policy_class.config_class.field_docs())


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_policy_end_to_end_exact_stays_lossless(attached, close_draft, name):
    out = generate(attached, close_draft, draft_length=name)
    plain = type(attached).generate(attached, prompt(8), do_sample=False, max_new_tokens=24, min_new_tokens=24)
    assert torch.equal(out.sequences, plain)
    stats = out.acceptance_stats
    assert stats.num_drafted > 0
    assert len(stats.drafted_per_round) == len(stats.accepted_per_round) == stats.num_target_forwards
    assert sum(stats.drafted_per_round) == stats.num_drafted and sum(stats.accepted_per_round) == stats.num_accepted
    assert all(0 <= a <= d for a, d in zip(stats.accepted_per_round, stats.drafted_per_round))


CLOCKLESS_TAPOUT = {"reward": "tokens_per_forward", "arms": ["adaedl", "svip", "heuristic"]}


@pytest.mark.parametrize("name, options", [("constant", None), ("heuristic", None), ("svip", None), ("adaedl", None),
                                           ("tapout", CLOCKLESS_TAPOUT)])
def test_a_policy_that_reads_no_clock_repeats_its_sampled_text_after_forgetting(attached, close_draft, name, options):
    """The README's advice for repeatable text: these policies' lengths follow the rounds they saw, not their times,
    so after `forget_draft_length_state()` the same sampled `fly` call returns its first text again (what the learning
    ones kept changes the text in between; 96 tokens: with fly's sampling floor, adaedl's λ after one 48-token call
    still gave the same lengths, and so the same text)."""

    def sampled_call():
        torch.manual_seed(0)
        return attached.generate(prompt(8), assistant_model=close_draft, acceptance="fly", draft_length=name,
                                 draft_length_kwargs=options, do_sample=True, max_new_tokens=96, min_new_tokens=96)

    first = sampled_call()
    later = [sampled_call() for _ in range(2)]
    hf_semspec.forget_draft_length_state()
    assert torch.equal(sampled_call(), first)
    if POLICIES.get(name).keeps_state_across_calls:
        assert any(not torch.equal(text, first) for text in later)


@dataclass
class _LearningConfig(_StopAfterConfig):
    component_name = "learning_test"


class _LearningPolicy(_StopAfterPolicy):
    """Test policy that keeps its state across calls when built from its name; records every instance built and can
    run one nested `generate()` from inside a round (`nested_call`) or fail in one (`fail_once`)."""

    name = "learning_test"
    config_class = _LearningConfig
    keeps_state_across_calls = True
    instances: list = []
    nested_call = None
    fail_once = False

    def __init__(self, config=None):
        super().__init__(config)
        type(self).instances.append(self)

    def observe(self, outcome):
        super().observe(outcome)
        nested, type(self).nested_call = type(self).nested_call, None
        if nested is not None:
            nested()
        if type(self).fail_once:
            type(self).fail_once = False
            raise RuntimeError("round failed")


class _ForgetfulPolicy(_LearningPolicy):
    name = "forgetful_test"
    keeps_state_across_calls = False


@pytest.fixture
def learning_registered():
    _LearningPolicy.instances, _LearningPolicy.nested_call, _LearningPolicy.fail_once = [], None, False
    register_policy(_LearningPolicy)
    register_policy(_ForgetfulPolicy)
    yield
    POLICIES.unregister("learning_test")
    POLICIES.unregister("forgetful_test")


@pytest.mark.parametrize("name, instances", [("learning_test", 1), ("forgetful_test", 2)])
def test_a_policy_that_learns_goes_on_across_calls_by_name(attached, close_draft, learning_registered, name,
                                                           instances):
    first = generate(attached, close_draft, draft_length=name).acceptance_stats.num_target_forwards
    second = generate(attached, close_draft, draft_length=name).acceptance_stats.num_target_forwards
    assert len(_LearningPolicy.instances) == instances
    if instances == 1:  # one instance saw both calls' rounds
        assert len(_LearningPolicy.instances[0].outcomes) == first + second


def test_kept_policies_are_per_models_rule_and_options(attached, close_draft, unrelated_draft, learning_registered):
    generate(attached, close_draft, draft_length="learning_test")
    generate(attached, close_draft, draft_length="learning_test", draft_length_kwargs={"stop_after": 3})
    generate(attached, close_draft, draft_length="learning_test", num_assistant_tokens=4)
    generate(attached, unrelated_draft, draft_length="learning_test")
    generate(attached, close_draft, draft_length="learning_test", acceptance_kwargs={})  # the same rule options
    attached.generate(prompt(8), assistant_model=close_draft, acceptance="ears", draft_length="learning_test",
                      max_new_tokens=8)
    assert len(_LearningPolicy.instances) == 5
    hf_semspec.forget_draft_length_state(unrelated_draft)
    generate(attached, close_draft, draft_length="learning_test")  # still kept
    generate(attached, unrelated_draft, draft_length="learning_test")  # forgotten: a new one
    assert len(_LearningPolicy.instances) == 6
    hf_semspec.forget_draft_length_state()
    generate(attached, close_draft, draft_length="learning_test")
    assert len(_LearningPolicy.instances) == 7


def test_kept_policies_are_per_dtype_of_the_models(attached, close_draft, learning_registered):
    # A learned round time or calibration is the dtype's: a call after the draft moved to bf16 starts afresh, and one
    # after it moved back goes on with what the first learned.
    draft = copy.deepcopy(close_draft)
    first = generate(attached, draft, draft_length="learning_test").acceptance_stats.num_target_forwards
    draft.to(torch.bfloat16)
    generate(attached, draft, draft_length="learning_test")
    assert len(_LearningPolicy.instances) == 2
    draft.to(torch.float32)
    again = generate(attached, draft, draft_length="learning_test").acceptance_stats.num_target_forwards
    assert len(_LearningPolicy.instances) == 2
    assert len(_LearningPolicy.instances[0].outcomes) == first + again


def test_kept_policies_are_per_decoding_mode_as_transformers_resolves_it(attached, close_draft, learning_registered,
                                                                         monkeypatch):
    # Greedy and sampled rounds accept differently. do_sample comes from the call, else the passed config, else the
    # model's config: the kept policy follows the same order.
    monkeypatch.setattr(attached.generation_config, "do_sample", True)

    def rounds(**kwargs):
        out = generate(attached, close_draft, draft_length="learning_test", **kwargs)
        return out.acceptance_stats.num_target_forwards

    sampled_rounds = rounds() + rounds(do_sample=True)  # the model's config, then the call: sampling both times
    assert len(_LearningPolicy.instances) == 1
    greedy_rounds = rounds(generation_config=GenerationConfig(do_sample=False)) + rounds(do_sample=False)
    greedy_rounds += rounds(do_sample=None)  # the call's None: transformers decodes greedily, whatever the model says
    sampled_rounds += rounds(do_sample=True)
    sampled, greedy = _LearningPolicy.instances
    assert len(sampled.outcomes) == sampled_rounds and len(greedy.outcomes) == greedy_rounds


def test_the_heuristic_schedules_length_carries_over_whatever_the_dtype(attached, close_draft):
    # transformers keeps the schedule's length on the draft, across a change of dtype: so does the kept `heuristic`.
    from hf_semspec import generation

    draft = copy.deepcopy(close_draft)
    kwargs = dict(num_assistant_tokens=3, num_assistant_tokens_schedule="heuristic")
    generate(attached, draft, **kwargs)
    [kept] = generation._KEPT_POLICIES[draft][attached].values()
    draft.to(torch.bfloat16)
    generate(attached, draft, **kwargs)
    assert list(generation._KEPT_POLICIES[draft][attached].values()) == [kept]


def test_a_call_while_the_kept_policy_is_in_use_gets_a_fresh_one(attached, close_draft, learning_registered):
    inner = []
    _LearningPolicy.nested_call = lambda: inner.append(generate(attached, close_draft, draft_length="learning_test"))
    outer = generate(attached, close_draft, draft_length="learning_test")
    kept, fresh = _LearningPolicy.instances
    assert len(fresh.outcomes) == inner[0].acceptance_stats.num_target_forwards
    assert len(kept.outcomes) == outer.acceptance_stats.num_target_forwards
    generate(attached, close_draft, draft_length="learning_test")  # the kept one again: the fresh one was not kept
    assert len(_LearningPolicy.instances) == 2 and len(kept.outcomes) > outer.acceptance_stats.num_target_forwards


def test_kept_policies_drop_the_least_recently_used(attached, close_draft, learning_registered, monkeypatch):
    # One policy was kept per distinct options for the models' lifetime: a server varying an option per request
    # grew the table without bound.
    from hf_semspec import generation

    monkeypatch.setattr(generation, "_KEPT_PER_MODEL_PAIR", 2)
    hf_semspec.forget_draft_length_state()
    for stop_after in (1, 2, 1, 3):  # 1 is used again before 3 arrives, so 2 is the least recently used
        generate(attached, close_draft, draft_length="learning_test", draft_length_kwargs={"stop_after": stop_after})
    kept = generation._KEPT_POLICIES[close_draft][attached]
    assert [policy.config.stop_after for policy in kept.values()] == [1, 3]
    assert len(_LearningPolicy.instances) == 3
    generate(attached, close_draft, draft_length="learning_test", draft_length_kwargs={"stop_after": 2})
    assert len(_LearningPolicy.instances) == 4  # dropped, so built afresh
    hf_semspec.forget_draft_length_state()


def test_an_instance_in_use_by_another_call_is_refused_then_freed(attached, close_draft, learning_registered):
    # Two calls would interleave their rounds in the instance's per-round state (a thread, or a nested call).
    policy = _LearningPolicy(_LearningConfig(stop_after=3, cap=4))
    refused = []

    def nested():
        with pytest.raises(SemSpecConfigError, match=r"`draft_length` = 'a _LearningPolicy instance that another "
                           r"generate\(\) call is using'.*Fix: give each thread its own instance"):
            generate(attached, close_draft, draft_length=policy)
        refused.append(True)

    _LearningPolicy.nested_call = nested
    outer = generate(attached, close_draft, draft_length=policy)
    assert refused == [True] and len(policy.outcomes) == outer.acceptance_stats.num_target_forwards
    again = generate(attached, close_draft, draft_length=policy)  # freed when the call ended
    assert len(policy.outcomes) == (outer.acceptance_stats.num_target_forwards
                                    + again.acceptance_stats.num_target_forwards)
    _LearningPolicy.fail_once = True
    with pytest.raises(RuntimeError, match="round failed"):
        generate(attached, close_draft, draft_length=policy)
    generate(attached, close_draft, draft_length=policy)  # and when a call failed


def test_an_interrupt_right_after_the_policy_is_taken_frees_it(attached, close_draft, monkeypatch):
    # The release's try/finally began a statement after the policy was marked in use: an interrupt there (Ctrl-C)
    # left a passed instance refused by every later call, and a kept policy replaced by unkept copies for good.
    import types

    from hf_semspec import generation

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    policy = hf_semspec.draft_length.tapout.TapOutPolicy()
    monkeypatch.setattr(generation, "functools", types.SimpleNamespace(partial=interrupted))
    for draft_length in (policy, "tapout"):
        with pytest.raises(KeyboardInterrupt):
            generate(attached, close_draft, draft_length=draft_length)
    monkeypatch.undo()
    generate(attached, close_draft, draft_length=policy)  # not "another generate() call is using"
    assert not generation._POLICIES_IN_USE


def test_a_failed_call_frees_its_kept_policy(attached, close_draft, learning_registered):
    _LearningPolicy.fail_once = True
    with pytest.raises(RuntimeError, match="round failed"):
        generate(attached, close_draft, draft_length="learning_test")
    generate(attached, close_draft, draft_length="learning_test")
    assert len(_LearningPolicy.instances) == 1


@pytest.mark.parametrize("where", ["passed", "model"])
def test_a_policy_instance_in_a_generation_config_is_refused_with_the_fix(attached, close_draft, where):
    # It failed with "allowed one of [policy names]", pointing away from the fix (pass it with the call).
    policy = hf_semspec.draft_length.tapout.TapOutPolicy()
    kwargs = {}
    if where == "passed":
        kwargs["generation_config"] = GenerationConfig(draft_length=policy)
    else:
        attached.generation_config.draft_length = policy
    try:
        with pytest.raises(SemSpecConfigError, match=r"draft_length in .* = 'a TapOutPolicy instance'.*Fix: pass the "
                           r"instance with the call, generate\(\.\.\., draft_length=policy\)"):
            generate(attached, close_draft, **kwargs)
        # A value that takes precedence over it leaves it unread, as it leaves a name unread.
        overridden = generate(attached, close_draft, draft_length="constant", num_assistant_tokens=2, **kwargs)
        assert overridden.acceptance_stats.drafted_per_position[2:] == []
        if where == "model":
            generate(attached, close_draft, generation_config=GenerationConfig(draft_length="constant"))
    finally:
        attached.generation_config.draft_length = None
