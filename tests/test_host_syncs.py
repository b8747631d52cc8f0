"""One host sync per round on the compiled static path (`cache_implementation="static"`, `compile_config`, the
`constant` draft-length policy), every rule, one prompt and a left-padded batch of 3.

A CPU has no device to wait for, so what is counted is what would wait on a GPU: the ops that read a tensor's value
back to the host, seen by the profiler (`aten::_local_scalar_dense`: `.item()`, `bool()`, `int()`, `float()`; and the
ops whose output size depends on values: `nonzero`, `masked_select`, `unique`), plus the reads that on a CPU tensor
dispatch no op at all (`.tolist()`, `.numpy()`, `.cpu()`), counted by wrapping those methods. Not counted: `.to()`
between devices (on a CPU every tensor is on one device) and host-to-device copies (which do not wait for the
device). The forwards are compiled (and every shape warmed up) before counting, and the counted calls must compile
nothing, so the count is the loop's and not the compiler's.

The loop's own sync is `decoding.speculative_decode`'s step 5 (`torch.cat([...]).tolist()`). Setting up a call, the
prefill and building the output read a few values once per call: rounds are counted as the difference between two
calls of different lengths, divided by the difference of their rounds.
"""

from __future__ import annotations

import traceback
from contextlib import contextmanager

import pytest
import torch
from conftest import VOCAB, tiny_llama
from torch.profiler import ProfilerActivity, profile
from transformers import CompileConfig

import hf_semspec
from hf_semspec.rules import RULES, VerificationInput

SYNCING_OPS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::unique",
               "aten::_unique", "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive")
UNDISPATCHED_READS = ("tolist", "numpy", "cpu")
GAMMA = 3


def compiled_graphs() -> int:
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


@contextmanager
def host_reads():
    """Counts what would make the host wait for a GPU while open: `reads["count"]`, and in `reads["where"]` the
    innermost hf_semspec or transformers frame (file:line) of each wrapped read (`.tolist()`, `.numpy()`, `.cpu()`)."""
    reads = {"count": 0, "where": [], "ops": {}}
    originals = {name: getattr(torch.Tensor, name) for name in UNDISPATCHED_READS}

    def wrapped(name):
        original = originals[name]

        def read(self, *args, **kwargs):
            reads["count"] += 1
            frames = [f for f in traceback.extract_stack()[:-1] if "hf_semspec" in f.filename
                      or "transformers" in f.filename]
            reads["where"].append(f"{frames[-1].filename.split('/')[-1]}:{frames[-1].lineno}" if frames else "?")
            return original(self, *args, **kwargs)

        return read

    for name in UNDISPATCHED_READS:
        setattr(torch.Tensor, name, wrapped(name))
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            yield reads
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
    reads["ops"] = {event.key: event.count for event in prof.key_averages() if event.key in SYNCING_OPS}
    reads["count"] += sum(reads["ops"].values())


def cpu_compile_config() -> CompileConfig:
    config = CompileConfig(backend="aot_eager", mode=None, fullgraph=True)
    config._compile_all_devices = True
    return config


@pytest.fixture(scope="module")
def models(close_draft, rdk_draft):
    """A target of its own (its compiled forward is not shared with other tests' models), the close draft and the
    pruned drafter with a kernel (rdk)."""
    torch._dynamo.reset()
    limit = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = 64  # two models, two batch sizes, two cache lengths
    target = hf_semspec.attach(tiny_llama(seed=0))
    yield target, close_draft, rdk_draft
    torch._dynamo.config.recompile_limit = limit
    torch._dynamo.reset()


def prompts(batch_size: int) -> tuple[torch.LongTensor, torch.LongTensor]:
    """`batch_size` prompts of 8, 6, 4, … tokens, left-padded to 8."""
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(4, VOCAB, (batch_size, 8), generator=g)
    mask = torch.ones_like(ids)
    for row in range(batch_size):
        mask[row, : 2 * row] = 0
        ids[row, : 2 * row] = 0
    return ids, mask


# Found, not fixed here (transformers code): reads in forwards that stay eager. `dropmatch`'s target forward stays eager
# (its hook, decoding._static_caches) and reads one scalar per round inside transformers: with a padded batch in
# its mask preparation (`masking_utils._ignore_causal_mask_sdpa`, `fast_all(padding_mask)`, masking_utils.py:297-298
# in transformers 5.24); at batch 1 no mask is passed any more (`DecodingBatch.masked` drops an all-ones mask), and a
# read remains. `rdk` in a padded batch reads a few times more per call than the rounds account for (2 in 16 here).
KNOWN_EXTRA_READS = {
    ("dropmatch", 1): "its eager target forward reads one scalar back per round inside transformers "
                      "(aten::_local_scalar_dense; no mask is passed once an all-ones mask is dropped)",
    ("dropmatch", 3): "its eager target forward: transformers' mask check reads the padding mask once per round",
    ("rdk", 3): "transformers' mask check (masking_utils.py:297-298) in an eager forward of the pruned drafter",
}


@pytest.mark.parametrize("batch_size", [1, 3])
@pytest.mark.parametrize("name", hf_semspec.available_rules())
@pytest.mark.slow
def test_one_host_sync_per_round_on_the_compiled_static_path(models, name, batch_size, monkeypatch, request):
    if (name, batch_size) in KNOWN_EXTRA_READS:  # runs, and fails the suite once it passes (then drop the entry)
        request.node.add_marker(pytest.mark.xfail(reason=KNOWN_EXTRA_READS[name, batch_size], strict=True))
    target, close_draft, rdk_draft = models
    rule = RULES.get(name)
    if name == "dropmatch":  # its accelerator path (on a CPU it selects rows with `nonzero`, which waits for nothing)
        monkeypatch.setattr(rule, "rows_to_test", staticmethod(lambda standard, num_rows, device: None))
    draft = rdk_draft if rule.redistributes_draft else close_draft
    ids, mask = prompts(batch_size)
    if batch_size == 1:
        ids, mask = ids[:1], None
    kwargs = dict(assistant_model=draft, acceptance=name, num_assistant_tokens=GAMMA, draft_length="constant",
                  do_sample=not rule.supports_greedy, cache_implementation="static",
                  compile_config=cpu_compile_config(), return_dict_in_generate=True, attention_mask=mask)
    lengths = (9, 25)
    for new_tokens in reversed(lengths):  # compiles every shape (the longer first: transformers keeps its cache)
        torch.manual_seed(0)
        target.generate(ids, max_new_tokens=new_tokens, **kwargs)
    counted = []
    for new_tokens in lengths:
        graphs = compiled_graphs()
        torch.manual_seed(0)
        with host_reads() as reads:
            out = target.generate(ids, max_new_tokens=new_tokens, **kwargs)
        assert compiled_graphs() == graphs, "the counted call compiled: its count would be the compiler's"
        counted.append((reads["count"], out.acceptance_stats.num_target_forwards, reads["where"], reads["ops"]))
    (short_reads, short_rounds, _, short_ops), (long_reads, long_rounds, where, ops) = counted
    assert long_rounds > short_rounds
    per_round = (long_reads - short_reads) / (long_rounds - short_rounds)
    assert per_round == 1, (f"{per_round} host reads per round; wrapped reads at {sorted(set(where))}; ops "
                            f"{ops} ({long_rounds} rounds) against {short_ops} ({short_rounds} rounds)")
    # the round's one read is the loop's `.tolist()` (step 5), once per round
    assert sum("decoding.py" in w for w in where) >= long_rounds


@pytest.mark.parametrize("do_sample", [False, True])
@pytest.mark.parametrize("name", hf_semspec.available_rules())
def test_a_rules_verification_reads_nothing_back(name, do_sample, monkeypatch):
    """`rule.verify` is tensor ops only: the loop's one read per round is all a round needs. (On a CPU dropmatch
    selects the rows its heads can change with `nonzero`; on an accelerator it computes every row instead, which is
    the path counted here.)"""
    rule_class = RULES.get(name)
    if not (rule_class.supports_sampling if do_sample else rule_class.supports_greedy):
        pytest.skip(f"{name} does not define do_sample={do_sample}")
    rule = RULES.build(name, {})
    if name == "dropmatch":
        monkeypatch.setattr(type(rule), "rows_to_test", staticmethod(lambda standard, num_rows, device: None))
    torch.manual_seed(0)
    batch, vocab, hidden_size = 3, VOCAB, 16
    logits = torch.randn(batch, GAMMA + 1, vocab)
    drafts = torch.randint(0, vocab, (batch, GAMMA))
    inputs = dict(draft_token_ids=drafts, target_logits=logits, do_sample=do_sample,
                  draft_probs=torch.softmax(torch.randn(batch, GAMMA, vocab), -1), row_ids=(0, 1, 2))
    if rule.requires_target_hidden_states:
        head = torch.nn.Linear(hidden_size, vocab, bias=False)
        inputs.update(target_hidden_states=torch.randn(batch, GAMMA + 1, hidden_size), lm_head_weight=head.weight)
    rule.verify(VerificationInput(**inputs))  # (a first call may set up state)
    with host_reads() as reads:
        result = rule.verify(VerificationInput(**inputs))
    assert reads["count"] == 0, f"{name}.verify read {reads['count']} values back: {reads['where']}"
    assert result.num_accepted.shape == (batch,)
