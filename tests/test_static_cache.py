"""The static-cache path (`cache_implementation="static"`) and its compiled forwards (`compile_config`).

On a CPU transformers compiles only with `compile_config._compile_all_devices`; the compiled tests use the cheap
`aot_eager` backend, which runs the traced graphs without generating code (CUDA graphs need a GPU: benchmarks/gpu.py).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import EOS, prompt, tiny_llama, tiny_tokenizer
from transformers import CompileConfig, StaticCache

import hf_semspec
from hf_semspec import decoding
from hf_semspec._transformers_compat import CACHE_ARGUMENT
from hf_semspec.drafters import prune_vocabulary

POLICIES = ["constant", "heuristic", "svip", "adaedl", "cost_aware", "best_constant", "tapout"]
TIMED_POLICIES = ("cost_aware", "best_constant", "tapout")  # their lengths follow the clock


def plain_greedy(model, ids, **kwargs):
    return type(model).generate(model, ids, do_sample=False, **kwargs)


@pytest.fixture
def fresh_compiler():
    """Compiled forwards of every model share transformers' forward wrapper's code object, whose compiled variants
    torch caps (`recompile_limit`, 8): the suite builds many tiny models, so each compiled test starts afresh."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def cpu_compile_config() -> CompileConfig:
    config = CompileConfig(backend="aot_eager", mode=None, fullgraph=True)
    config._compile_all_devices = True  # transformers' own switch for compiling off a GPU (its tests use it)
    return config


@pytest.mark.parametrize("gamma", range(1, 9))
def test_greedy_exact_on_static_caches_equals_plain_and_the_dynamic_path(attached, close_draft, gamma):
    """Every γ: rounds that reject at every position move the static caches' write position back, never a tensor."""
    ids = prompt(8)
    kwargs = dict(assistant_model=close_draft, acceptance="exact", num_assistant_tokens=gamma, max_new_tokens=30,
                  return_dict_in_generate=True)
    static = attached.generate(ids, cache_implementation="static", **kwargs)
    dynamic = attached.generate(ids, **kwargs)
    assert torch.equal(static.sequences, plain_greedy(attached, ids, max_new_tokens=30))
    assert torch.equal(static.sequences, dynamic.sequences)
    assert static.acceptance_stats == dynamic.acceptance_stats
    assert 0 < static.acceptance_stats.num_accepted < static.acceptance_stats.num_drafted  # rejections happened
    cache = getattr(static, CACHE_ARGUMENT)
    assert isinstance(cache, StaticCache)
    assert int(cache.get_seq_length()) == static.sequences.shape[1] - 1  # ends where the output does, less its last


@pytest.mark.parametrize("max_new_tokens", [1, 2, 7, 13])
def test_max_length_mid_round_on_static_caches(attached, close_draft, max_new_tokens):
    ids = prompt(8)
    out = attached.generate(ids, assistant_model=close_draft, acceptance="exact", num_assistant_tokens=6,
                            max_new_tokens=max_new_tokens, cache_implementation="static")
    assert torch.equal(out, plain_greedy(attached, ids, max_new_tokens=max_new_tokens))


def test_eos_mid_round_on_static_caches(attached, target):
    ids = prompt(8)
    reference = plain_greedy(attached, ids, max_new_tokens=30, eos_token_id=None)
    eos = int(reference[0, 8 + 9])  # the 10th new token: inside a round of the draft = target (γ = 6, all accepted)
    out = attached.generate(ids, assistant_model=target, acceptance="exact", num_assistant_tokens=6,
                            max_new_tokens=30, eos_token_id=eos, cache_implementation="static")
    assert torch.equal(out, plain_greedy(attached, ids, max_new_tokens=30, eos_token_id=eos))
    assert out[0, -1] == eos and out.shape[1] <= 8 + 10


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", hf_semspec.available_rules())
@pytest.mark.parametrize("do_sample", [False, True])
def test_every_rule_and_policy_decode_the_same_on_static_and_dynamic_caches(
    attached, close_draft, rdk_draft, name, policy, do_sample
):
    """Same drafts, same verification, same draws from the RNG: the cache is all that differs. (Policies that time
    their rounds may pick other lengths on another run, which changes the text of a relaxed rule and of sampling:
    they are compared on greedy `exact`, whose text does not depend on the lengths.)"""
    rule = hf_semspec.rules.RULES.get(name)
    if not (rule.supports_sampling if do_sample else rule.supports_greedy):
        pytest.skip(f"{name} does not define do_sample={do_sample}")
    if policy in TIMED_POLICIES and (name != "exact" or do_sample):
        pytest.skip("a timed policy's lengths vary from run to run, and so does the text, but greedy exact's")
    draft = rdk_draft if rule.redistributes_draft else close_draft
    kwargs = dict(assistant_model=draft, acceptance=name, draft_length=policy, do_sample=do_sample,
                  max_new_tokens=20, return_dict_in_generate=True)
    outputs = []
    for cache_implementation in ("static", "dynamic"):
        hf_semspec.forget_draft_length_state()
        torch.manual_seed(0)
        outputs.append(attached.generate(prompt(8), cache_implementation=cache_implementation, **kwargs))
    static, dynamic = outputs
    assert torch.equal(static.sequences, dynamic.sequences)
    if policy not in TIMED_POLICIES:
        assert static.acceptance_stats == dynamic.acceptance_stats


class CountingCalls:
    """Wraps a callable, counts its calls and records the shape of each call's `input_ids`."""

    def __init__(self, inner):
        self.inner, self.calls, self.shapes = inner, 0, []

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if "input_ids" in kwargs:
            self.shapes.append(tuple(kwargs["input_ids"].shape))
        return self.inner(*args, **kwargs)


def counted_compiled_forwards(monkeypatch) -> dict:
    """The compiled forwards the loop builds from now on, by model, each wrapped in `CountingCalls`."""
    compiled = {}
    real = decoding.compiled_forward

    def counting(model, config):
        compiled[model] = CountingCalls(real(model, config))
        return compiled[model]

    monkeypatch.setattr(decoding, "compiled_forward", counting)
    return compiled


def counted_compiled(monkeypatch, name: str) -> list[CountingCalls]:
    """The compiled functions `decoding.<name>` hands the loop from now on (`compiled_round`: the draft's round;
    `compiled_verification`: the rule's verification), one per `generate()` call, each wrapped in `CountingCalls`."""
    made = []
    real = getattr(decoding, name)

    def counting(config):
        made.append(CountingCalls(real(config)))
        return made[-1]

    monkeypatch.setattr(decoding, name, counting)
    return made


@pytest.mark.parametrize("do_sample", [False, True])
@pytest.mark.slow
def test_compiled_forwards_decode_as_plain_decoding(monkeypatch, close_draft, fresh_compiler, do_sample):
    """With a compile_config the target's verify forwards run compiled (all but the first, which prefills the prompt),
    and so do the draft's: greedy, a round's γ steps in one compiled call (every round, the first after an eager
    prefill of the prompt), and greedy `exact` still equals plain greedy decoding; sampled, step by step (all steps
    but the first)."""
    target = tiny_llama(seed=0)  # its own compiled forward, not shared with other tests' models
    hf_semspec.attach(target)
    compiled = counted_compiled_forwards(monkeypatch)
    rounds, verifications = counted_compiled(monkeypatch, "compiled_round"), counted_compiled(
        monkeypatch, "compiled_verification")
    ids = prompt(8)
    torch.manual_seed(0)
    out = target.generate(ids, assistant_model=close_draft, acceptance="exact", num_assistant_tokens=4,
                          do_sample=do_sample, max_new_tokens=24, cache_implementation="static",
                          compile_config=cpu_compile_config(), return_dict_in_generate=True)
    stats = out.acceptance_stats
    assert compiled[target].calls == stats.num_target_forwards - 1
    round_calls = sum(counted.calls for counted in rounds)
    if do_sample:  # (sampled verification stays eager: inductor would draw other numbers than the eager path)
        assert round_calls == 0 and verifications == []
        assert compiled[close_draft].calls == stats.num_drafted - 1
    else:
        assert torch.equal(out.sequences, plain_greedy(target, ids, max_new_tokens=24))
        assert round_calls == sum(1 for drafted in stats.drafted_per_round if drafted)  # every round that drafted
        assert set(rounds[0].shapes) == {(1, 2)}  # the two catch-up slots, then the drafts inside the call
        assert close_draft not in compiled or compiled[close_draft].calls == 0
        # the rule's verification, compiled for the rounds at γ; the last ones, cut short by max_length, eager
        assert 0 < verifications[0].calls == stats.drafted_per_round.count(4) < stats.num_target_forwards


@pytest.mark.slow
def test_a_rule_compiles_its_verification_only_when_it_says_so(monkeypatch, close_draft, fresh_compiler):
    """`compiles_verification` is the rule's promise that its greedy `verify` reads nothing back and keeps no Python
    state; without it (a rule registered elsewhere) the loop verifies eagerly, and decodes the same."""
    from hf_semspec.rules.exact import ExactRule

    target = hf_semspec.attach(tiny_llama(seed=0))
    monkeypatch.setattr(ExactRule, "compiles_verification", False)
    made = counted_compiled(monkeypatch, "compiled_verification")
    out = target.generate(prompt(8), assistant_model=close_draft, acceptance="exact", num_assistant_tokens=4,
                          max_new_tokens=12, cache_implementation="static", compile_config=cpu_compile_config())
    assert made == []
    assert torch.equal(out, plain_greedy(target, prompt(8), max_new_tokens=12))


ROUND_CASES = {
    "γ 1": dict(num_assistant_tokens=1),
    "γ 8, max_length inside a round": dict(num_assistant_tokens=8, max_new_tokens=13),
    "fly": dict(acceptance="fly", num_assistant_tokens=6),
    "dropmatch (its target forward eager)": dict(acceptance="dropmatch", num_assistant_tokens=4),
    "pruned drafter": dict(num_assistant_tokens=4, draft="pruned"),
    "EOS inside a round": dict(num_assistant_tokens=6, draft="target", eos_at=9),
    "a batch whose first row ends early (kept, masked)": dict(num_assistant_tokens=4, batch_size=3, eos_at=5),
}


@pytest.mark.parametrize("case", ROUND_CASES)
@pytest.mark.slow
def test_a_compiled_round_drafts_as_the_step_by_step_path(monkeypatch, close_draft, kept_ids, fresh_compiler, case):
    """The compiled round (a round's greedy γ steps in one compiled call) and the compiled verification against the
    same compiled decoding that drafts step by step and verifies eagerly: the same tokens and the same rounds (drafts
    and verdicts), for one row and a left-padded batch with a row that ends early, `fly` and `dropmatch` (`ears` is
    `exact`'s subclass), a pruned drafter, and rounds cut short by max_length or ended by an EOS; `exact`'s text is
    plain greedy decoding's. (Few cases: each compiles its graphs twice; the suite's time is kept under 15 minutes.)"""
    options = dict(ROUND_CASES[case])
    batch_size, draft, eos_at = options.pop("batch_size", 1), options.pop("draft", "close"), options.pop("eos_at", None)
    target = hf_semspec.attach(tiny_llama(seed=0))
    if draft == "pruned":  # the library's pruned drafter, whose backbone compiles (conftest's test double does not)
        draft = prune_vocabulary(close_draft, tiny_tokenizer(), keep_ids=kept_ids.tolist())
    else:
        draft = {"close": close_draft, "target": tiny_llama(seed=0)}[draft]
    ids, mask = prompt(8).repeat(batch_size, 1), torch.ones(batch_size, 8, dtype=torch.long)
    for row in range(1, batch_size):
        ids[row, : 2 * row], mask[row, : 2 * row] = 0, 0
        ids[row, 2 * row :] = prompt(8 - 2 * row, seed=row)
    options.setdefault("max_new_tokens", 20)
    options.setdefault("acceptance", "exact")
    if eos_at is not None:
        reference = plain_greedy(target, ids[:1], max_new_tokens=30, eos_token_id=None)
        options["eos_token_id"] = int(reference[0, 8 + eos_at])
    kwargs = dict(attention_mask=mask, assistant_model=draft, cache_implementation="static",
                  compile_config=cpu_compile_config(), return_dict_in_generate=True, **options)
    rounds = counted_compiled(monkeypatch, "compiled_round")
    torch.manual_seed(0)
    with_round = target.generate(ids, **kwargs)
    drafting_rounds = sum(1 for drafted in with_round.acceptance_stats.drafted_per_round if drafted)
    assert sum(counted.calls for counted in rounds) == drafting_rounds
    # without them the drafter drafts step by step, and the rule verifies eagerly
    monkeypatch.setattr(decoding, "compiled_round", lambda config: None)
    monkeypatch.setattr(decoding, "compiled_verification", lambda config: None)
    torch.manual_seed(0)
    step_by_step = target.generate(ids, **kwargs)
    assert torch.equal(with_round.sequences, step_by_step.sequences)
    ignore_forwards = dict(num_draft_forwards=0)  # (a round cut short still runs its γ draft forwards)
    assert replace(with_round.acceptance_stats, **ignore_forwards) == replace(step_by_step.acceptance_stats,
                                                                             **ignore_forwards)
    if options["acceptance"] == "exact":
        for row in range(batch_size):
            start = 2 * row
            alone = plain_greedy(target, ids[row : row + 1, start:], max_new_tokens=options["max_new_tokens"],
                                 **({"eos_token_id": options["eos_token_id"]} if eos_at is not None else {}))
            new = alone[0, 8 - start :]
            assert torch.equal(with_round.sequences[row, 8 : 8 + new.shape[0]], new)
    if eos_at is not None:  # row 0 ended at it
        assert options["eos_token_id"] in with_round.sequences[0, 8:].tolist()


@pytest.mark.parametrize("policy, gamma", [("constant", 3), ("heuristic", 4)])
@pytest.mark.parametrize("batch_size", [1, 2])
@pytest.mark.slow
def test_a_compiled_verify_forward_keeps_one_shape_and_compiles_once(
    monkeypatch, close_draft, fresh_compiler, policy, gamma, batch_size
):
    """Rounds shorter than the policy's length (near max_length; a policy that varies γ) re-feed cached slots, so the
    verify forward keeps the shape (B, γ + 1) and compiles one graph; rounds longer than it (heuristic's growth) keep
    their own; the text is plain greedy decoding's."""
    target = tiny_llama(seed=0)
    hf_semspec.attach(target)
    compiled = counted_compiled_forwards(monkeypatch)
    # constant: a draft with the target's weights, so every round drafts γ and emits γ + 1 = 4 tokens until the
    # last, whose budget max_length cuts to 2 (20 new tokens after 5 rounds, 3 left); heuristic: lengths that vary
    draft = tiny_llama(seed=0) if policy == "constant" else close_draft
    ids, mask = prompt(8).repeat(batch_size, 1), torch.ones(batch_size, 8, dtype=torch.long)
    if batch_size == 2:
        ids[1, :3], mask[1, :3] = 0, 0  # a left-padded row: positions come from the mask
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    out = target.generate(ids, attention_mask=mask, assistant_model=draft, acceptance="exact",
                          draft_length=policy, num_assistant_tokens=gamma, max_new_tokens=23,
                          cache_implementation="static", compile_config=cpu_compile_config(),
                          return_dict_in_generate=True)
    for row in range(batch_size):
        start = 3 if row else 0
        alone = plain_greedy(target, ids[row : row + 1, start:], max_new_tokens=23)[0, 8 - start :]
        assert torch.equal(out.sequences[row, 8 : 8 + alone.shape[0]], alone)
    verify_shapes = compiled[target].shapes
    assert len(verify_shapes) == out.acceptance_stats.num_target_forwards - 1
    if policy == "constant":
        # every round's verify forward, the last ones near max_length (fewer drafts) too, at one shape
        assert set(verify_shapes) == {(batch_size, gamma + 1)}
        assert out.acceptance_stats.num_target_forwards == 6
        assert out.acceptance_stats.num_drafted == batch_size * (5 * gamma + 2)  # the last round drafts 2
        # the verify forward, the draft's compiled round (the last round, cut short, runs it too) and the rule's
        # verification (the last round's runs eagerly): three graphs, none recompiled
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs == 3
    else:  # rounds at most the initial length share its shape; longer ones have their own
        assert all(width >= gamma + 1 for _, width in verify_shapes)
        assert (batch_size, gamma + 1) in set(verify_shapes)


@pytest.mark.slow
def test_compiled_sampling_draws_as_the_eager_path(close_draft, fresh_compiler):
    target = tiny_llama(seed=0)
    hf_semspec.attach(target)
    outputs = []
    for extra in ({"compile_config": cpu_compile_config()}, {}):
        torch.manual_seed(3)
        outputs.append(target.generate(prompt(8), assistant_model=close_draft, acceptance="exact", do_sample=True,
                                       temperature=0.8, top_k=20, num_assistant_tokens=4, max_new_tokens=16,
                                       cache_implementation="static", **extra))
    assert torch.equal(*outputs)


def test_no_compiled_forward_without_a_compile_switch(monkeypatch, attached, close_draft):
    """On a CPU, as in transformers' own `generate()`, a static cache alone compiles nothing."""
    monkeypatch.setattr(decoding, "compiled_forward", lambda *a: pytest.fail("compiled on a CPU without the switch"))
    attached.generate(prompt(8), assistant_model=close_draft, acceptance="exact", max_new_tokens=8,
                      cache_implementation="static")


def test_a_sliding_window_model_is_refused_with_static_caches(attached):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    draft = MistralForCausalLM(MistralConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=attached.config.vocab_size, sliding_window=6, eos_token_id=EOS, pad_token_id=0,
    )).eval()
    with pytest.raises(hf_semspec.SemSpecConfigError, match=r"draft without sliding-window layers.*'dynamic'"):
        attached.generate(prompt(8), assistant_model=draft, acceptance="exact", max_new_tokens=4,
                          cache_implementation="static")


def test_a_max_length_criterion_longer_than_the_static_cache_is_refused(close_draft):
    """transformers sizes the static cache from generation_config.max_length (a model keeps its static cache from call
    to call, so a fresh one here); a user's longer MaxLengthCriteria, which the loop stops at, would run out of slots
    mid-call."""
    from transformers import MaxLengthCriteria, StoppingCriteriaList

    model = hf_semspec.attach(tiny_llama(seed=0))
    ids = prompt(8)
    criteria = StoppingCriteriaList([MaxLengthCriteria(max_length=8 + 30)])
    refused = r"`stopping_criteria` = 'MaxLengthCriteria\(max_length=38\)'.*static cache's 17 slots.*max_length=38"
    with pytest.raises(hf_semspec.SemSpecConfigError, match=refused):
        model.generate(ids, assistant_model=close_draft, acceptance="exact", max_new_tokens=10,
                       stopping_criteria=criteria, cache_implementation="static")
    # within the cache it decodes as plain decoding, stopping at the criterion
    criteria = StoppingCriteriaList([MaxLengthCriteria(max_length=8 + 6)])
    out = model.generate(ids, assistant_model=close_draft, acceptance="exact", max_new_tokens=10,
                         stopping_criteria=criteria, cache_implementation="static")
    assert torch.equal(out, plain_greedy(model, ids, max_new_tokens=6))


# -- inductor: the code generation that runs on a CPU or a GPU -------------------------------------------------------


def test_cpu_compile_config_is_what_makes_generate_compile_on_a_cpu(attached):
    """transformers compiles a static cache's forward off a GPU only when told to: `hf_semspec.cpu_compile_config`
    tells it (inductor, no CUDA graphs, one graph per shape); a plain `CompileConfig` does not."""
    from hf_semspec._transformers_compat import compiles_forward

    cache = StaticCache(config=attached.config, max_cache_len=16)
    config = hf_semspec.cpu_compile_config(fullgraph=False)
    assert config.to_dict() == {**CompileConfig().to_dict(), "backend": "inductor", "mode": None,
                                "fullgraph": False, "dynamic": False}
    assert compiles_forward(attached, cache, replace_compile_config(attached, config))
    assert not compiles_forward(attached, cache, replace_compile_config(attached, CompileConfig(mode=None)))


def test_inductor_freezing_is_refused_where_generate_compiles(attached, close_draft, monkeypatch):
    """Freezing folds a static cache's tensors into the graph (a later call decodes wrong tokens or fails): refused
    by `cpu_compile_config()` and before the loop compiles anything, naming where it was set."""
    import torch._inductor.config as inductor_config

    compiled = []
    monkeypatch.setattr(decoding, "compiled_forward", lambda *args: compiled.append(args))
    refused = hf_semspec.SemSpecConfigError
    with pytest.raises(refused, match=r"`compile_config.options\['freezing'\]` = True is not valid: allowed False "
                                      r"when generate\(\) compiles"):
        hf_semspec.cpu_compile_config(options={"freezing": True})
    config = hf_semspec.cpu_compile_config()
    # an eager backend has nothing to freeze
    decoding.check_no_freezing(CompileConfig(backend="aot_eager", options={"freezing": True}))
    monkeypatch.setattr(inductor_config, "freezing", True)
    with pytest.raises(refused, match=r"`torch._inductor.config.freezing` = True .*Fix: set "
                                      r"torch._inductor.config.freezing = False"):
        hf_semspec.cpu_compile_config()
    with pytest.raises(refused, match=r"`torch._inductor.config.freezing` = True"):
        attached.generate(prompt(6), assistant_model=close_draft, acceptance="exact", max_new_tokens=8,
                          cache_implementation="static", compile_config=config)
    assert compiled == []
    monkeypatch.setattr(inductor_config, "freezing", False)
    attached.generate(prompt(6), assistant_model=close_draft, acceptance="exact", max_new_tokens=8,
                      cache_implementation="static", compile_config=config)
    assert len(compiled) == 2  # the target's forward and the draft's, once freezing is off


def replace_compile_config(model, config: CompileConfig):
    generation_config = type(model.generation_config)(**model.generation_config.to_dict())
    generation_config.compile_config = config
    return generation_config


@pytest.mark.slow
def test_inductor_decodes_as_eager_plain_and_speculative(monkeypatch, close_draft, fresh_compiler):
    """Inductor's generated code (not `aot_eager`'s traced graphs): transformers' own compiled plain decoding, and
    `exact` with its compiled round, verify forward and verification, then multi-level drafting's fixed-width steps,
    each give plain greedy decoding's tokens (fp32) in the eager path's rounds (the same drafts: a compiled round
    that drafted wrong tokens would still give the right text, at a lower acceptance), and a second prompt of another
    length reuses the first's graphs (one `max_cache_len`)."""
    target = hf_semspec.attach(tiny_llama(seed=0))
    config = hf_semspec.cpu_compile_config()
    compiled = counted_compiled_forwards(monkeypatch)
    rounds = counted_compiled(monkeypatch, "compiled_round")
    verifications = counted_compiled(monkeypatch, "compiled_verification")
    static = dict(cache_implementation="static", compile_config=config, max_cache_len=64, max_new_tokens=16)
    graphs = []
    for ids in (prompt(8), prompt(11, seed=1)):
        expected = plain_greedy(target, ids, max_new_tokens=16)
        assert torch.equal(plain_greedy(target, ids, **static), expected)  # transformers' loop, compiled
        speculative = dict(assistant_model=close_draft, acceptance="exact", num_assistant_tokens=3,
                           return_dict_in_generate=True)
        eager = target.generate(ids, max_new_tokens=16, **speculative).acceptance_stats
        out = target.generate(ids, **speculative, **static)
        assert torch.equal(out.sequences, expected)
        assert out.acceptance_stats.accepted_per_round == eager.accepted_per_round
        multi = target.generate(ids, prompt_lookup_num_tokens=2, **speculative, **static)
        assert torch.equal(multi.sequences, expected)
        assert multi.acceptance_stats.accepted_per_round == eager.accepted_per_round
        graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    assert compiled[target].calls > 0 and sum(r.calls for r in rounds) > 0 and sum(v.calls for v in verifications) > 0
    assert compiled[close_draft].calls > 0  # multi-level drafting's steps
    assert graphs[1] == graphs[0] > 0  # the second prompt compiled nothing (dynamic=False: a new shape would)
