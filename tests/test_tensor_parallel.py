"""A target split over several devices with transformers' tensor parallelism (`tp_plan="auto"`), the draft whole on
each rank (docs/gpu.md, "Several GPUs").

One launch of this file as a script, `torchrun --standalone --nproc-per-node 2` on the CPU (gloo), loads a tiny seeded
Llama target saved to a temporary folder with `distributed_config=DistributedConfig(tp_plan="auto")` in each rank
(attention heads, MLP and LM head sharded over the 2 ranks), and decodes with every registered rule, greedy and
sampled (the same `torch.manual_seed` on both ranks), one prompt and a left-padded batch of 3, on dynamic and static
caches. Each rank writes what it decoded as JSON; the tests below compare the ranks with each other and with plain
greedy decoding of the same sharded target. One launch serves every test (starting two processes that import
transformers costs more than all the decoding).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch

if not torch.distributed.is_available():
    pytest.skip("torch.distributed is not available in this torch build: no process group can be started",
                allow_module_level=True)
if not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed has no gloo backend in this torch build: no CPU process group can be started",
                allow_module_level=True)

from conftest import (  # noqa: E402
    EOS,
    VOCAB,
    SlicedHeadDrafter,
    nearest_neighbour_kernel,
    perturbed_copy,
    prompt,
    tiny_llama,
)
from test_batched import PAD, left_padded  # noqa: E402

import hf_semspec  # noqa: E402
from hf_semspec.rules import RULES  # noqa: E402

WORLD_SIZE = 2
MAX_NEW_TOKENS = 16
# The whole launch (two processes, every case) takes about 35 s on two cores; a hung collective must not hang CI.
LAUNCH_TIMEOUT_S = 300
COLLECTIVE_TIMEOUT = timedelta(seconds=120)
TESTS = Path(__file__).resolve().parent
# (rule, do_sample, batched, static) for every registered rule
CASES = [
    (name, do_sample, batched, static)
    for name in hf_semspec.available_rules()
    for do_sample in (False, True)
    for batched in (False, True)
    for static in (False, True)
]


def case_id(name: str, do_sample: bool, batched: bool, static: bool) -> str:
    return "-".join([name, "sample" if do_sample else "greedy", "batch" if batched else "one",
                     "static" if static else "dynamic"])


def inputs(batched: bool) -> tuple[torch.LongTensor, torch.LongTensor]:
    """One prompt of 8 tokens, or the 3 left-padded prompts of tests/test_batched.py, and their attention mask."""
    if batched:
        _, ids, mask = left_padded()
        return ids, mask
    ids = prompt(8)
    return ids, torch.ones_like(ids)


def kept_token_ids() -> torch.LongTensor:
    """The pruned drafter's vocabulary, as conftest's `kept_ids`: half of it, special tokens included."""
    return torch.tensor(sorted({0, 1, EOS} | set(range(4, VOCAB, 2))))


# ---------------------------------------------------------------------------------------------------------------
# One rank (run as a script under torchrun)
# ---------------------------------------------------------------------------------------------------------------


def _sharding(model: torch.nn.Module, draft: torch.nn.Module) -> dict:
    """What the rank holds: the local rows of the target's LM head and first q projection, and the draft's."""
    from torch.distributed.tensor import DTensor

    def local_rows(weight: torch.Tensor) -> int:
        return weight.to_local().shape[0] if isinstance(weight, DTensor) else weight.shape[0]

    return {
        "lm_head_is_dtensor": isinstance(model.lm_head.weight, DTensor),
        "lm_head_rows": local_rows(model.lm_head.weight),
        "q_proj_rows": local_rows(model.model.layers[0].self_attn.q_proj.weight),
        "draft_is_dtensor": any(isinstance(p, DTensor) for p in draft.parameters()),
        "draft_lm_head_rows": draft.lm_head.weight.shape[0],
    }


def _dropmatch_heads(model: torch.nn.Module) -> dict:
    """`dropout_head_logits` on the sharded head against the same with the whole head (gathered here, for reference)."""
    from torch.distributed.tensor import DTensor

    from hf_semspec.rules.dropmatch import dropout_head_logits

    weight = model.lm_head.weight
    whole = weight.full_tensor()
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, whole.shape[1], generator=g)  # (rows, hidden)
    keep = torch.rand(5, 3, whole.shape[1], generator=g) >= 0.3  # (K, rows, hidden)
    target_logits = hidden @ whole.T
    heads = dropout_head_logits(hidden, keep, 0.3, weight, target_logits)
    reference = dropout_head_logits(hidden, keep, 0.3, whole, target_logits)
    return {
        "is_plain_tensor": not isinstance(heads, DTensor),
        "shape": list(heads.shape),
        "max_abs_diff": float((heads - reference).abs().max()),
        "scale": float(reference.abs().max()),
        "heads": heads.tolist(),
    }


def _decode(model, draft, rdk_draft, name: str, do_sample: bool, batched: bool, static: bool) -> dict:
    rule = RULES.get(name)
    if not (rule.supports_sampling if do_sample else rule.supports_greedy):
        return {"unsupported": True}
    ids, mask = inputs(batched)
    kwargs = dict(cache_implementation="static") if static else {}
    torch.manual_seed(1234)  # the same on both ranks: sampling and every rule's draws must agree
    try:
        out = model.generate(ids, attention_mask=mask, assistant_model=rdk_draft if rule.redistributes_draft else draft,
                             acceptance=name, do_sample=do_sample, max_new_tokens=MAX_NEW_TOKENS, pad_token_id=PAD,
                             return_dict_in_generate=True, **kwargs)
    except Exception as error:  # recorded, so that the other cases still run and the test names it
        return {"error": f"{type(error).__name__}: {error}"}
    return {
        "tokens": out.sequences.tolist(),
        "accepted_per_round": [stats.accepted_per_round for stats in out.acceptance_stats_per_row],
        "num_drafted": out.acceptance_stats.num_drafted,
        "num_accepted": out.acceptance_stats.num_accepted,
    }


def _decode_compiled(model, draft) -> dict:
    """Greedy `exact` on static caches with compiled forwards, as a GPU compiles them by default (here the cheap
    `aot_eager` backend, forced on the CPU): the sharded target's verify forward must compile with static shapes."""
    from test_static_cache import cpu_compile_config

    ids = prompt(8)
    try:
        out = model.generate(ids, assistant_model=draft, acceptance="exact", num_assistant_tokens=3,
                             max_new_tokens=MAX_NEW_TOKENS, cache_implementation="static",
                             compile_config=cpu_compile_config(), return_dict_in_generate=True)
    except Exception as error:
        return {"error": f"{type(error).__name__}: {error}"}
    # transformers' `get_compiled_call` keeps the config it compiled the target's forward with
    compiled_with = getattr(model, "_last_compile_config", None)
    return {
        "tokens": out.sequences.tolist(),
        "accepted_per_round": out.acceptance_stats.accepted_per_round,
        "target_compiled": compiled_with is not None,
        "target_dynamic": None if compiled_with is None else compiled_with.dynamic,
    }


def _run_rank(workdir: Path) -> None:
    from transformers import DistributedConfig, LlamaForCausalLM

    rank = int(os.environ["RANK"])
    # Started here (transformers would start one too) for a short timeout: a rank waiting on a collective the other
    # never makes fails in 2 minutes instead of transformers' 2 hours.
    torch.distributed.init_process_group("gloo", timeout=COLLECTIVE_TIMEOUT)
    model = LlamaForCausalLM.from_pretrained(workdir / "target", distributed_config=DistributedConfig(tp_plan="auto"))
    draft = LlamaForCausalLM.from_pretrained(workdir / "draft").eval()  # whole on every rank
    kept = kept_token_ids()
    rdk_draft = SlicedHeadDrafter(draft, kept, *nearest_neighbour_kernel(draft, kept))
    results = {"rank": rank, "sharding": _sharding(model, draft), "dropmatch_heads": _dropmatch_heads(model),
               "plain": {}, "cases": {}}
    for batched in (False, True):
        for static in (False, True):
            ids, mask = inputs(batched)
            kwargs = dict(cache_implementation="static") if static else {}
            plain = type(model).generate(model, ids, attention_mask=mask, do_sample=False,
                                         max_new_tokens=MAX_NEW_TOKENS, pad_token_id=PAD, **kwargs)
            results["plain"][case_id("plain", False, batched, static)] = plain.tolist()
    hf_semspec.attach(model)
    for case in CASES:
        results["cases"][case_id(*case)] = _decode(model, draft, rdk_draft, *case)
    results["compiled"] = _decode_compiled(model, draft)
    (workdir / f"rank{rank}.json").write_text(json.dumps(results))
    torch.distributed.destroy_process_group()


# ---------------------------------------------------------------------------------------------------------------
# The launch and the tests
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """Both ranks' results, from one `torchrun --standalone --nproc-per-node 2` launch of this file."""
    if importlib.util.find_spec("accelerate") is None:
        pytest.fail("accelerate is not installed: transformers refuses to load a model with a tp_plan without it. "
                    "Install the test extra: pip install -e '.[test]'")
    workdir = tmp_path_factory.mktemp("tensor_parallel")
    target = tiny_llama(seed=0)  # hidden 64, 4 query / 2 key-value heads, vocab 128: all divisible by 2
    target.save_pretrained(workdir / "target")
    perturbed_copy(target, scale=0.3, seed=2).save_pretrained(workdir / "draft")  # conftest's close_draft
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD_SIZE}",
               str(Path(__file__).resolve()), str(workdir)]
    root = str(TESTS.parent)
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [root, str(TESTS), os.environ.get("PYTHONPATH")]))}
    posix = hasattr(os, "killpg")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                               cwd=root, start_new_session=posix)
    try:
        output, _ = process.communicate(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        if posix:  # the launcher and both ranks: the launch runs in its own process group
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.kill()
        output, _ = process.communicate()
        pytest.fail(f"the 2-process launch did not finish within {LAUNCH_TIMEOUT_S} s; its output:\n{output[-6000:]}")
    if process.returncode != 0:
        pytest.fail(f"the 2-process launch exited with {process.returncode}; its output:\n{output[-6000:]}")
    return [json.loads((workdir / f"rank{rank}.json").read_text()) for rank in range(WORLD_SIZE)]


def decoded(ranks: list[dict], case: tuple) -> list[dict]:
    """Each rank's result of one case; fails naming the error a rank met, skips a mode the rule does not define."""
    results = [rank["cases"][case_id(*case)] for rank in ranks]
    for rank, result in enumerate(results):
        if "error" in result:
            pytest.fail(f"rank {rank}, {case_id(*case)}: {result['error']}")
    if any(result.get("unsupported") for result in results):
        pytest.skip(f"{case[0]} does not define do_sample={case[1]}")
    return results


@pytest.mark.slow
def test_the_target_is_sharded_and_the_draft_is_whole(ranks):
    """Otherwise every other test here would pass without tensor parallelism."""
    for rank in ranks:
        sharding = rank["sharding"]
        assert sharding["lm_head_is_dtensor"]
        assert sharding["lm_head_rows"] == VOCAB // WORLD_SIZE
        assert sharding["q_proj_rows"] == 64 // WORLD_SIZE  # hidden_size 64: the query heads are split
        assert not sharding["draft_is_dtensor"] and sharding["draft_lm_head_rows"] == VOCAB


@pytest.mark.parametrize("case", CASES, ids=[case_id(*case) for case in CASES])
@pytest.mark.slow
def test_both_ranks_decode_the_same_tokens(ranks, case):
    """Every rule, greedy and sampled, one prompt and a batch, dynamic and static caches: the ranks emit the same
    tokens in the same rounds (so they also made the same collectives)."""
    first, second = decoded(ranks, case)
    assert first["tokens"] == second["tokens"]
    assert first["accepted_per_round"] == second["accepted_per_round"]
    ids, _ = inputs(case[2])
    tokens = torch.tensor(first["tokens"])
    assert torch.equal(tokens[:, : ids.shape[1]], ids)  # the prompts, kept
    assert ids.shape[1] < tokens.shape[1] <= ids.shape[1] + MAX_NEW_TOKENS
    assert first["num_drafted"] > 0


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
@pytest.mark.parametrize("batched", [False, True], ids=["one", "batch"])
@pytest.mark.parametrize("name", [name for name in hf_semspec.available_rules() if RULES.get(name).lossless])
@pytest.mark.slow
def test_greedy_lossless_rules_equal_plain_greedy_under_tensor_parallelism(ranks, name, batched, static):
    """Greedy `exact` (and every lossless rule, `rdk` with its pruned drafter) emits plain greedy decoding's tokens
    of the same sharded target (`type(model).generate` without an assistant), with rejections along the way."""
    for rank, result in zip(ranks, decoded(ranks, (name, False, batched, static))):
        plain = rank["plain"][case_id("plain", False, batched, static)]
        assert result["tokens"] == plain
        assert 0 < result["num_accepted"] < result["num_drafted"]  # the draft was right and wrong: verification ran
    assert ranks[0]["plain"] == ranks[1]["plain"]


@pytest.mark.slow
def test_compiled_static_caches_equal_plain_greedy_under_tensor_parallelism(ranks):
    """With a compiled verify forward (what `cache_implementation="static"` gets on a GPU), the sharded target is
    compiled with static shapes (torch fails to trace a DTensor forward with symbolic ones), and greedy `exact`
    still emits plain greedy decoding's tokens on both ranks."""
    first, second = (rank["compiled"] for rank in ranks)
    for rank, result in enumerate((first, second)):
        assert "error" not in result, f"rank {rank}: {result.get('error')}"
        assert result["target_compiled"] and result["target_dynamic"] is False
        assert result["tokens"] == ranks[rank]["plain"][case_id("plain", False, False, True)]
    assert first["accepted_per_round"] == second["accepted_per_round"]


@pytest.mark.slow
def test_dropmatch_heads_on_a_sharded_head_equal_the_whole_head_s_on_every_rank(ranks):
    """`dropout_head_logits` with the DTensor (vocabulary-sharded) head: a plain tensor of every vocabulary entry,
    the heads the whole head gives, the same on both ranks."""
    first, second = (rank["dropmatch_heads"] for rank in ranks)
    for heads in (first, second):
        assert heads["is_plain_tensor"]
        assert heads["shape"] == [5, 3, VOCAB]
        assert heads["max_abs_diff"] <= 1e-5 * max(1.0, heads["scale"])
    assert first["heads"] == second["heads"]


if __name__ == "__main__":  # one rank, started by the `ranks` fixture through torchrun
    _run_rank(Path(sys.argv[1]))
