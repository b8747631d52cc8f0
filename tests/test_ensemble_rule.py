"""`ensemble` (transformers' `assistant_ensemble_weight`): the worked example of its docstring, greedy tokens equal to
stock transformers' with the same weight, the emitted distribution checked by simulation (chi-square), the compiled
verification, prompt lookup refused, and `assistant_ensemble_weight` honoured with `exact` and refused with the other
rules. (Batches, static caches, multi-level drafting and tensor parallelism run every registered rule, this one
included: test_batched.py, test_static_cache.py, test_multi_level_drafting.py, test_tensor_parallel.py.)"""

from __future__ import annotations

import pytest
import torch
from conftest import perturbed_copy, prompt, tiny_llama
from test_ears_rule import chi_square_p_value
from test_exact_rule import simulated_rounds
from test_static_cache import counted_compiled, cpu_compile_config, fresh_compiler  # noqa: F401 (a fixture)
from transformers import GenerationConfig

import hf_semspec
from hf_semspec.errors import SemSpecConfigError
from hf_semspec.rules import RULES, VerificationInput
from hf_semspec.rules.ensemble import EnsembleRule, emitted_distribution, mixture


def ensemble(weight: float = 0.5) -> EnsembleRule:
    return RULES.build("ensemble", {"weight": weight})


def one_position(p, q, draft=1, bonus=(0.1, 0.1, 0.8), do_sample=False) -> VerificationInput:
    """γ = 1 over a vocabulary of 3: target p at the draft position, a bonus row, draft distribution q."""
    return VerificationInput(
        draft_token_ids=torch.tensor([[draft]]),
        target_logits=torch.stack([torch.tensor(p).log(), torch.tensor(bonus).log()])[None],
        draft_probs=torch.tensor(q)[None, None],
        do_sample=do_sample,
    )


P, Q = [0.5, 0.3, 0.2], [0.2, 0.6, 0.2]


def test_worked_example_greedy():
    """ν = 0.5·p + 0.5·q = [0.35, 0.45, 0.2]: x̂ = 1 is its argmax and is kept, where `exact` emits token 0."""
    torch.testing.assert_close(mixture(torch.tensor(P), torch.tensor(Q), 0.5), torch.tensor([0.35, 0.45, 0.2]))
    kept = ensemble(0.5).verify(one_position(P, Q))
    assert kept.num_accepted.tolist() == [1] and kept.next_token.tolist() == [2]  # the bonus: argmax p₁
    assert RULES.build("exact", {}).verify(one_position(P, Q)).next_token.tolist() == [0]
    # w = 0.7: ν = [0.41, 0.39, 0.2], so the draft is rejected and argmax ν (0) emitted
    rejected = ensemble(0.7).verify(one_position(P, Q))
    assert rejected.num_accepted.tolist() == [0] and rejected.next_token.tolist() == [0]


def test_greedy_rejection_emits_argmax_of_the_mixture_not_of_p():
    """transformers emits argmax ν at the first mismatch: with p = [0.4, 0.35, 0.25] and q = [0, 0.3, 0.7],
    w = 0.5, ν = [0.2, 0.325, 0.475], a draft of 0 is rejected and 2 (not p's 0) is emitted."""
    result = ensemble(0.5).verify(one_position([0.4, 0.35, 0.25], [0.0, 0.3, 0.7], draft=0))
    assert result.num_accepted.tolist() == [0] and result.next_token.tolist() == [2]


def test_greedy_never_emits_a_token_the_target_forbids():
    """A draft model whose q was not processed as p was cannot outvote a −inf target logit."""
    inputs = one_position([0.5, 0.5, 1e-9], [0.0, 0.05, 0.95], draft=2)
    inputs.target_logits[0, 0, 2] = float("-inf")
    result = ensemble(0.3).verify(inputs)
    assert result.num_accepted.tolist() == [0] and result.next_token.tolist() == [1]  # argmax ν over tokens 0, 1


@pytest.mark.parametrize("u,kept", [(0.74, True), (0.76, False)])
def test_worked_example_sampling(patch_rng, u, kept):
    """Accepted with probability 1 − w + w·p/q = 0.5 + 0.5·0.5 = 0.75; a rejection draws from `exact`'s residual
    norm(max(p − q, 0)) = [1, 0, 0]."""
    drawn = patch_rng(uniform=u, categorical="argmax")
    result = ensemble(0.5).verify(one_position(P, Q, do_sample=True))
    assert result.num_accepted.tolist() == [int(kept)]
    if not kept:
        assert result.next_token.tolist() == [0]
        torch.testing.assert_close(drawn[-1], torch.tensor([[1.0, 0.0, 0.0]]))


def test_emitted_distribution_properties():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(400, 7, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(400, 7, generator=g) * 2, -1)
    for weight in (0.3, 0.5, 0.9):
        pi = emitted_distribution(p, q, weight)
        assert (pi >= -1e-6).all()
        torch.testing.assert_close(pi.sum(-1), torch.ones(400))
    torch.testing.assert_close(emitted_distribution(p, p, 0.3), p)  # q = p: every draft kept, distributed as p
    # w → 1 is `exact`, lossless
    torch.testing.assert_close(emitted_distribution(p, q, 1.0 - 1e-7), p, atol=1e-5, rtol=0)
    # a forbidden token (p = 0) is never emitted, however much the draft wants it
    p0 = p.clone()
    p0[:, 0] = 0
    p0 = p0 / p0.sum(-1, keepdim=True)
    assert (emitted_distribution(p0, q, 0.3)[:, 0] == 0).all()


def test_sampled_tokens_follow_the_rule_s_distribution():
    """200k vectorized rounds, w = 0.3: the first emitted token is distributed as π, the mixture ν (and not as p),
    the second, in rounds that kept the first draft, as π₁, the bonus as p_γ; position 0 is accepted
    with probability Σ q·a."""
    torch.manual_seed(1234)
    vocab, gamma, rounds, weight = 6, 2, 200_000, 0.3
    p = torch.softmax(torch.randn(gamma + 1, vocab) * 1.5, -1)
    q = torch.softmax(torch.randn(gamma, vocab) * 1.5, -1)
    pi = emitted_distribution(p[:gamma], q, weight)
    result, emitted = simulated_rounds(ensemble(weight), p, q, rounds)
    n = result.num_accepted

    first = torch.bincount(emitted[:, 0], minlength=vocab)
    assert chi_square_p_value(first, pi[0]) > 1e-3
    assert chi_square_p_value(first, p[0]) < 1e-6  # not lossless, and the test can tell
    torch.testing.assert_close(pi, mixture(p[:gamma], q, weight))  # speculative sampling of ν: π is ν where p > 0
    second = torch.bincount(emitted[n >= 1, 1], minlength=vocab)
    assert chi_square_p_value(second, pi[1]) > 1e-3
    bonus = torch.bincount(result.next_token[n == gamma], minlength=vocab)
    assert bonus.sum() > 1000 and chi_square_p_value(bonus, p[gamma]) > 1e-3
    rate = (q[0] * (1 - weight + weight * p[0] / q[0]).clamp_max(1)).sum().item()
    assert (n >= 1).float().mean().item() == pytest.approx(rate, abs=0.005)


def test_config_range_is_transformers_open_interval():
    for bad in (0, 1, 1.5, -0.1):
        with pytest.raises(SemSpecConfigError, match=r"acceptance_kwargs\['weight'\].*\(0, 1\)"):
            RULES.build("ensemble", {"weight": bad})
    assert ensemble(0.3).config.weight == 0.3


# --- end to end ---


@pytest.fixture(scope="module")
def models():
    target = hf_semspec.attach(tiny_llama(seed=0))
    return target, perturbed_copy(target, scale=0.3, seed=2), tiny_llama(seed=1)


def stock_with_weight(target, draft, ids, weight, gamma, monkeypatch, **kwargs):
    """Stock transformers' assisted generation with `assistant_ensemble_weight`: γ fixed on the draft's config, and
    its confidence stop (a default of 0.4 that ends rounds early, which changes a lossy rule's text) off: 0, since
    transformers fills a None with the default."""
    monkeypatch.setattr(draft.generation_config, "num_assistant_tokens", gamma)
    monkeypatch.setattr(draft.generation_config, "num_assistant_tokens_schedule", "constant")
    monkeypatch.setattr(draft.generation_config, "assistant_confidence_threshold", 0.0)
    return type(target).generate(target, ids, assistant_model=draft, assistant_ensemble_weight=weight,
                                 do_sample=False, **kwargs)


@pytest.mark.parametrize("weight", [0.3, 0.5, 0.7])
@pytest.mark.parametrize("gamma", [1, 4, 7])
@pytest.mark.parametrize("draft_name", ["close", "unrelated"])
def test_greedy_equals_stock_transformers_token_for_token(models, monkeypatch, weight, gamma, draft_name):
    target, close, unrelated = models
    draft = close if draft_name == "close" else unrelated
    texts = set()
    for seed in range(3):
        ids = prompt(6 + seed, seed=seed)
        ours = target.generate(ids, assistant_model=draft, acceptance="ensemble", acceptance_kwargs={"weight": weight},
                               num_assistant_tokens=gamma, max_new_tokens=40)
        stock = stock_with_weight(target, draft, ids, weight, gamma, monkeypatch, max_new_tokens=40)
        assert torch.equal(ours, stock), (seed, ours, stock)
        exact = target.generate(ids, assistant_model=draft, acceptance="exact", num_assistant_tokens=gamma,
                                max_new_tokens=40)
        texts.add(torch.equal(ours, exact))
    if weight < 0.7 or draft_name == "unrelated":
        assert False in texts, "the mixture changed no output: the comparison would not tell the rules apart"


def test_assistant_ensemble_weight_with_exact_runs_ensemble(models, monkeypatch):
    """As in transformers: `exact` with the weight is `ensemble` at that weight, from the call, a passed
    GenerationConfig or the model's own, and the statistics name the rule that ran."""
    target, draft, _ = models
    ids = prompt(8)
    common = dict(assistant_model=draft, num_assistant_tokens=4, max_new_tokens=30, return_dict_in_generate=True)
    wanted = target.generate(ids, acceptance="ensemble", acceptance_kwargs={"weight": 0.3}, **common)
    assert wanted.acceptance_stats.acceptance == "ensemble"
    from_call = target.generate(ids, acceptance="exact", assistant_ensemble_weight=0.3, **common)
    from_config = target.generate(ids, generation_config=GenerationConfig(acceptance="exact",
                                                                          assistant_ensemble_weight=0.3), **common)
    monkeypatch.setattr(target.generation_config, "assistant_ensemble_weight", 0.3, raising=False)
    from_model = target.generate(ids, acceptance="exact", **common)
    exact = target.generate(ids, acceptance="exact", assistant_ensemble_weight=None, **common)
    for out in (from_call, from_config, from_model):
        assert torch.equal(out.sequences, wanted.sequences)
        assert out.acceptance_stats.acceptance == "ensemble"
        assert out.acceptance_stats.acceptance_kwargs == {"weight": 0.3}
    assert exact.acceptance_stats.acceptance == "exact"  # the call's None turned the model's weight off
    assert not torch.equal(exact.sequences, wanted.sequences)


def test_assistant_ensemble_weight_sets_ensemble_s_weight(models):
    target, draft, _ = models
    ids = prompt(8)
    common = dict(assistant_model=draft, num_assistant_tokens=4, max_new_tokens=20)
    assert torch.equal(
        target.generate(ids, acceptance="ensemble", assistant_ensemble_weight=0.3, **common),
        target.generate(ids, acceptance="ensemble", acceptance_kwargs={"weight": 0.3}, **common),
    )
    with pytest.raises(SemSpecConfigError, match=r"`assistant_ensemble_weight` = 0.7.*same weight as "
                                                 r"acceptance_kwargs\['weight'\]=0.3"):
        target.generate(ids, acceptance="ensemble", acceptance_kwargs={"weight": 0.3}, assistant_ensemble_weight=0.7,
                        **common)


@pytest.mark.parametrize("name", [n for n in hf_semspec.available_rules() if n not in ("exact", "ensemble")])
def test_assistant_ensemble_weight_with_another_rule_is_refused(models, name):
    target, draft, _ = models
    with pytest.raises(SemSpecConfigError, match=rf"`assistant_ensemble_weight` = 0.3 is not valid.*None with "
                                                 rf"acceptance='{name}'.*do not compose.*Fix: drop "
                                                 r"assistant_ensemble_weight"):
        target.generate(prompt(8), assistant_model=draft, acceptance=name, assistant_ensemble_weight=0.3,
                        max_new_tokens=4)
    with pytest.raises(SemSpecConfigError, match=r"`generation_config.assistant_ensemble_weight` = 0.3"):
        target.generate(prompt(8), assistant_model=draft, max_new_tokens=4,
                        generation_config=GenerationConfig(acceptance=name, assistant_ensemble_weight=0.3))


@pytest.mark.parametrize("bad", [1.0, 0, -0.5, "0.3", True])
def test_a_bad_weight_is_refused_naming_the_field(models, bad):
    target, draft, _ = models
    with pytest.raises(SemSpecConfigError, match=r"`assistant_ensemble_weight` = .*a float in \(0, 1\)"):
        target.generate(prompt(8), assistant_model=draft, acceptance="exact", assistant_ensemble_weight=bad,
                        max_new_tokens=4)


def test_without_a_rule_the_weight_stays_transformers(models, monkeypatch):
    """No rule: stock assisted generation, which reads the weight itself."""
    target, draft, _ = models
    ids = prompt(8)
    monkeypatch.setattr(draft.generation_config, "num_assistant_tokens", 4)
    monkeypatch.setattr(draft.generation_config, "num_assistant_tokens_schedule", "constant")
    monkeypatch.setattr(draft.generation_config, "assistant_confidence_threshold", 0.0)
    through_attach = target.generate(ids, assistant_model=draft, assistant_ensemble_weight=0.3, max_new_tokens=20)
    stock = type(target).generate(target, ids, assistant_model=draft, assistant_ensemble_weight=0.3,
                                  max_new_tokens=20)
    assert torch.equal(through_attach, stock)


def test_prompt_lookup_alone_is_refused_and_multi_level_drafting_is_the_draft_s_own(models):
    target, draft, _ = models
    ids = prompt(8).repeat(1, 3)  # repeats: the lookup finds candidates
    with pytest.raises(SemSpecConfigError, match=r"`acceptance` = 'ensemble'.*one-hot.*Fix: pass assistant_model="):
        target.generate(ids, acceptance="ensemble", prompt_lookup_num_tokens=4, max_new_tokens=8)
    with pytest.raises(SemSpecConfigError, match=r"`acceptance` = 'ensemble'"):
        target.generate(ids, acceptance="exact", assistant_ensemble_weight=0.3, prompt_lookup_num_tokens=4,
                        max_new_tokens=8)
    common = dict(assistant_model=draft, acceptance="ensemble", num_assistant_tokens=6, max_new_tokens=30,
                  return_dict_in_generate=True)
    alone = target.generate(ids, **common)
    multi_level = target.generate(ids, prompt_lookup_num_tokens=4, **common)
    assert torch.equal(multi_level.sequences, alone.sequences)
    assert multi_level.acceptance_stats.num_ngram_drafts > 0  # the lookup did draft


@pytest.mark.slow
def test_compiled_verification_decodes_as_the_eager_path(monkeypatch, fresh_compiler):  # noqa: F811
    """Greedy `ensemble` on static caches with a compile_config: its verification compiled (q passed in), the text
    of the eager dynamic path."""
    target = hf_semspec.attach(tiny_llama(seed=0))
    draft = perturbed_copy(target, scale=0.3, seed=2)
    made = counted_compiled(monkeypatch, "compiled_verification")
    ids = prompt(8)
    common = dict(assistant_model=draft, acceptance="ensemble", acceptance_kwargs={"weight": 0.3},
                  num_assistant_tokens=4, max_new_tokens=24, return_dict_in_generate=True)
    compiled = target.generate(ids, cache_implementation="static", compile_config=cpu_compile_config(), **common)
    eager = target.generate(ids, **common)
    assert torch.equal(compiled.sequences, eager.sequences)
    assert made and made[0].calls == compiled.acceptance_stats.drafted_per_round.count(4) > 0


def test_a_model_default_rule_without_a_draft_leaves_the_weight_to_transformers(models, monkeypatch):
    """The model's default rule decodes only with a draft: without one this is stock decoding, and a weight in the
    model's config is transformers' business (no refusal for a rule that does not run)."""
    target, _, _ = models
    monkeypatch.setattr(target.generation_config, "acceptance", "fly", raising=False)
    monkeypatch.setattr(target.generation_config, "assistant_ensemble_weight", 0.3, raising=False)
    out = target.generate(prompt(8), max_new_tokens=6, do_sample=False)
    assert torch.equal(out, type(target).generate(target, prompt(8), max_new_tokens=6, do_sample=False))
