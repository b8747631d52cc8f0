"""GPU benchmark: speculative decoding with random-weight models built from real configs (no weights to download).

    python benchmarks/gpu.py --target qwen2.5-7b      # the full run: compiled, α ≈ 0 and α = 1, MLA, warm-up
    python benchmarks/gpu.py --target qwen2.5-7b --parts warmup   # a second process: first calls from torch's caches
    python benchmarks/gpu.py --parts eager,batched    # the eager parts (Qwen2.5-Coder-1.5B target / 0.5B draft shapes)
    python benchmarks/gpu.py --target tiny --draft tiny --device cpu --dtype float32 --compile-backend aot_eager \
        --new-tokens 8 --prompt-length 8               # a smoke run (what tests/test_benchmark_gpu.py runs)

Random weights decide nothing about acceptance, so the benchmark measures costs, runs the two ends of acceptance live
(α ≈ 0: an independent draft; α = 1: both models' final norms zeroed, `always_token_zero`, so that both always pick
token 0 while every forward does its full work) and prices the middle at the acceptance the reference pair really
has. Parts (`--parts`; default `compiled,mla,warmup`), each written to `<output-dir>/gpu-<name>.{json,md}` as soon as
it is done:

1. `eager`: live tokens/s at batch 1: plain decoding, stock assisted and every rule with the target's own weights as
   the draft (α = "self"), and `exact` with an independent draft. Before any part: eager costs in ms (synchronized
   timers, median of `--repeats`): the draft's and the target's one-token steps, the target's verify forward at each
   γ of `--gammas` (dynamic caches) and each rule's verification at γ (`rule.verify` on random logits).
2. `batched` (`--batch-sizes`, eager, dynamic caches): plain and `exact` (draft = the target's weights), live, and
   `exact` modeled at the first reference acceptance.
3. `compiled` (static caches, `compile_config`), at each of `--compiled-batch-sizes` (default 1, 8): plain decoding,
   every rule (batches: `exact`) with the independent draft, then plain and `exact` at α = 1. Every forward of a
   speculative run is timed (CUDA events, `ForwardTimes`), so its host time per round (`overhead_ms`) is its wall time
   less its forwards and the rule's verification (timed at its batch size); batch 1's `exact` run gives the compiled
   costs. The first call of each run is timed too (`first_call_s`, compilation included): the first plain and the
   first speculative compiled calls of the process are the warm-up (`warmup`).
4. `mla`: multi-level drafting, modeled: the draft's compiled forward over 1 + `--mla-k` tokens (their logits kept),
   timed; a round drafts γ tokens in γ · `--mla-draft-forwards-per-token` such forwards (`mla_modeled`).
5. `warmup`: after `torch._dynamo.reset()` (or first thing in a fresh process), the first plain and speculative
   compiled calls again, from torch's compile caches (`warmup.from_caches`).

Every live record has `compiled`, `batch_size`, `rule` (None for plain and stock), `alpha` (`ALPHAS`), `first_call_s`,
`tau` for speculative runs and `overhead_ms` for compiled speculative runs (`check_live_records`).

Time: compilation takes most of a GPU run: 70-80 s a graph for a 28-layer model (H100 host, inductor,
`reduce-overhead`).
The compiled parts compile one graph per model and input shape (`graph_plan`, stored as `graph_plan`; what torch
really compiled is counted, `graphs_compiled`): at each batch size, plain decoding's step, the verify forward (γ + 1),
the verification (small) and the draft's round (its 2-token and 1-token step shapes, compiled once each as nested
regions: about 2 graphs' time): about 4 graphs; α = 1 adds none (weights zeroed in place, the same graphs); `mla` 1
(the draft over 1 + k tokens); `warmup` recompiles batch 1's from the caches (cheaper, not measured yet). The default
7B run is thus about 4 + 4 + 1 graphs, about 11 minutes at 75 s a graph, plus about 1.5 minutes of runs: more than
8 minutes. `--budget-s` (480) keeps a call within its time: before each group (a batch size, `mla`, `warmup`) the run
prices it at `--graph-seconds` a graph (75, replaced by the run's own measure once its first compiled call is timed) and
the runs at twice the slowest run so far; a group that does not fit is skipped and listed in `skipped`, with the
command that runs it alone. At 75 s a graph the default call runs batch 1 (4 graphs, about 6 minutes), then `mla`
if a graph's time is left, and skips batch 8 and `warmup`: `--parts compiled --compiled-batch-sizes 8` runs batch 8 in
a second call (about 6 minutes).

Then speed is modeled at the reference pair's acceptance (`--acceptance`: the per-position acceptance of the committed
CPU runs on Spec-Bench and on GSM8K): per γ, E[tokens per round] / (γ·draft step + verify(γ) + verification + the live
`exact` runs' host time per round), against the live plain runs.
"""

from __future__ import annotations

import argparse
import json
from contextlib import contextmanager, nullcontext
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from transformers import CompileConfig, DynamicCache, Qwen2Config, Qwen2ForCausalLM, StaticCache  # noqa: E402

import hf_semspec  # noqa: E402
from benchmarks import markdown, profiling, report  # noqa: E402
from hf_semspec._transformers_compat import CACHE_ARGUMENT, rewind_cache  # noqa: E402
from hf_semspec.model_calls import CachedModel  # noqa: E402
from hf_semspec.rules import RULES, VerificationInput  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
# The shapes of the models' config.json (checked against the reference pair's converted configs); `tiny` for smoke runs.
SHAPES = {
    "qwen2.5-coder-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                               num_key_value_heads=2, vocab_size=151936),
    "qwen2.5-coder-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                               num_key_value_heads=2, vocab_size=151936),
    # Qwen2.5-7B's shape, its vocabulary padded to 152064 rows where the small models' is padded to 151936: the same
    # tokenizer (TOKENIZER_SIZES), paired as hf_semspec pairs padded vocabularies (`generate(tokenizer=...)`).
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512),
    # `tiny` with 8 padding rows more: the padded pair in a smoke run (`--target tiny-padded --draft tiny`).
    "tiny-padded": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=520),
}
# The ids each shape's tokenizer produces: Qwen2.5's 151,665 (151,643 and 22 added tokens); the rows past them, up to
# `vocab_size`, are padding. Prompts are drawn below it, and the speculative calls pass a tokenizer of that size.
TOKENIZER_SIZES = {"qwen2.5-coder-1.5b": 151665, "qwen2.5-coder-0.5b": 151665, "qwen2.5-7b": 151665, "tiny": 512,
                   "tiny-padded": 512}


class TokenizerOfSize:
    """Stands in for the models' tokenizer, whose files a random-weight run does not have: `generate(tokenizer=...)`
    reads only its size (`len`) to pair a target and a draft whose vocabularies differ by padding."""

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size
DEFAULT_ACCEPTANCE = REPO_ROOT / "benchmarks" / "results" / "reference-acceptance.json"


PARTS = ("eager", "batched", "compiled", "mla", "warmup")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b", choices=sorted(SHAPES))
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--prompt-length", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--gamma", type=int, default=5, help="draft tokens per round of the live runs")
    parser.add_argument("--gammas", default="1,2,3,4,5,6,8,12,16", help="γ at which verify forwards are timed (eager)")
    parser.add_argument("--parts", default="compiled,mla,warmup",
                        help=f"which parts to run, a comma-separated subset of {','.join(PARTS)} (the docstring says "
                             "what each does)")
    parser.add_argument("--rules", default=",".join(hf_semspec.available_rules()))
    parser.add_argument("--batch-sizes", default="1,8,32", help="batch sizes of the eager `batched` part")
    parser.add_argument("--compiled-batch-sizes", default="1,8",
                        help="batch sizes of the `compiled` part, in order (1 first: the costs, and the warm-up)")
    parser.add_argument("--batch-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=20, help="timed repeats of each cost")
    parser.add_argument("--compile-backend", default="inductor")
    parser.add_argument("--compile-mode", default="reduce-overhead", help="'none' for the backend's default")
    parser.add_argument("--mla-k", type=int, default=6,
                        help="multi-level drafting: n-gram candidates the draft verifies in one forward of 1 + k "
                             "tokens")
    parser.add_argument("--mla-draft-forwards-per-token", type=float, default=0.5,
                        help="multi-level drafting: the draft's forwards per drafted token (modeled)")
    parser.add_argument("--budget-s", type=float, default=480.0,
                        help="seconds the run may take: a group of compiled runs that would not fit is skipped, "
                             "with the command that runs it")
    parser.add_argument("--graph-seconds", type=float, default=75.0,
                        help="seconds one compiled graph takes, until the run has measured its own")
    parser.add_argument("--save-compile-cache", type=Path, default=None,
                        help="write torch's compile caches of this run to this file (torch.compiler."
                             "save_cache_artifacts), for --load-compile-cache on another machine")
    parser.add_argument("--load-compile-cache", type=Path, default=None,
                        help="load torch's compile caches from this file first (torch.compiler.load_cache_artifacts)")
    parser.add_argument("--acceptance", type=Path, default=DEFAULT_ACCEPTANCE)
    parser.add_argument("--output-dir", type=Path, default=REPO_ROOT / "benchmarks" / "results" / "gpu")
    parser.add_argument("--name", default=None, help="results name (default gpu-<target>-<dtype>)")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def random_model(shape: str, dtype: torch.dtype, device: str, seed: int, **overrides) -> Qwen2ForCausalLM:
    """A Qwen2 causal LM of `shape` with random weights (normal, std 0.02, as transformers initializes them);
    `overrides` replace fields of the shape (benchmarks/host_work.py narrows it)."""
    torch.manual_seed(seed)
    config = Qwen2Config(**{**SHAPES[shape], **overrides}, tie_word_embeddings=False, max_position_embeddings=32768,
                         eos_token_id=None, bos_token_id=None, pad_token_id=0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype).eval()
    model.generation_config.eos_token_id = None  # random weights: every run makes exactly its new tokens
    return hf_semspec.attach(model)


# What a live record's `alpha` says of its drafts: the target's own weights drafting (every draft right; the eager
# part), the draft of `--draft`'s shape with its own random weights (about nothing accepted), or both models' final
# norms zeroed (`always_token_zero`: every draft right at the compiled costs of real forwards). None for plain
# decoding of the random weights.
ALPHAS = {"self": "the target's weights as the draft", "independent": "an independent draft (α ≈ 0)",
          "1": "both final norms zeroed (α = 1)"}


def final_norm(model: torch.nn.Module) -> torch.nn.Module:
    """The norm before `model`'s LM head (Qwen2, Llama: `model.model.norm`)."""
    norm = getattr(getattr(model, "model", None), "norm", None)
    if norm is None or getattr(norm, "weight", None) is None:
        raise ValueError(
            f"model: {type(model).__name__} has no final norm with a weight at `model.model.norm.weight`, which "
            "always_token_zero zeroes. Fix: pass a Qwen2- or Llama-style causal LM (benchmarks/gpu.py builds Qwen2)."
        )
    return norm


@contextmanager
def always_token_zero(*models: torch.nn.Module):
    """α = 1 with the costs of real forwards: while open, each model's final-norm weight is 0, so its last hidden
    states, and its logits (a head without bias), are 0 at every position, and greedy decoding picks token 0 (argmax
    returns the first of equal values) in the target and in the draft alike: every draft is right, while every
    forward still does all of its work. The weights are zeroed in place (their tensors keep their addresses, so the
    graphs compiled, and the CUDA graphs captured, for the random weights serve unchanged) and restored on exit."""
    weights = [final_norm(model).weight for model in models]
    saved = [weight.detach().clone() for weight in weights]
    try:
        with torch.no_grad():
            for weight in weights:
                weight.zero_()
        yield models
    finally:
        with torch.no_grad():
            for weight, kept in zip(weights, saved):
                weight.copy_(kept)


class Timer:
    """Wall time of a block, synchronized with the device before and after."""

    def __init__(self, device: str):
        self.device = torch.device(device)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def median_ms(self, call, repeats: int) -> float:
        call()  # warm-up (and compilation)
        times = []
        for _ in range(repeats):
            self.sync()
            start = time.perf_counter()
            call()
            self.sync()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    def run(self, call) -> tuple[object, float]:
        self.sync()
        start = time.perf_counter()
        out = call()
        self.sync()
        return out, time.perf_counter() - start


def compile_config(args) -> CompileConfig:
    mode = None if args.compile_mode == "none" else args.compile_mode
    config = CompileConfig(backend=args.compile_backend, mode=mode, fullgraph=True)
    if torch.device(args.device).type != "cuda":
        config._compile_all_devices = True  # transformers' switch for compiling off a GPU (smoke runs)
    return config


def forward_costs(model, args, timer: Timer, batch_size: int, gammas: list[int]) -> dict:
    """ms of an eager forward over γ + 1 new tokens after a prompt of `--prompt-length` (dynamic cache), for each γ in
    `gammas` (γ = 0: a one-token step)."""
    prompt = torch.randint(1, TOKENIZER_SIZES[args.target], (batch_size, args.prompt_length), device=args.device)
    costs = {}
    with torch.no_grad():
        for gamma in gammas:
            cache = DynamicCache(config=model.config)
            model(prompt, use_cache=True, **{CACHE_ARGUMENT: cache})
            new = prompt[:, : gamma + 1]
            positions = torch.arange(args.prompt_length, args.prompt_length + gamma + 1, device=args.device)

            def step():
                out = model(input_ids=new, position_ids=positions.expand(batch_size, -1), use_cache=True,
                            logits_to_keep=gamma + 1, **{CACHE_ARGUMENT: cache})
                out.logits.float()
                rewind_cache(cache, gamma + 1)

            costs[gamma] = timer.median_ms(step, args.repeats)
    return costs


class ForwardTimes:
    """The device time of every forward the speculative loop makes (`CachedModel.forward`, and the compiled draft
    round's γ steps as one, `CachedModel.greedy_round`) while the context is open: the costs of exactly the graphs a
    live run compiled, at no compilation of their own. CUDA events, read once the runs are over (no sync inside the
    loop); wall time on a CPU. Draft steps keep one logit, verify forwards γ + 1.
    Not `metrics.ForwardMeter`: its module hooks would run inside a compiled forward, and it reads the host's clock
    without a sync, which on a GPU times kernel launches, not kernels."""

    def __init__(self, device: str):
        self.cuda = torch.device(device).type == "cuda"
        self.calls: list[tuple[int, int, object, object]] = []  # (new tokens, logits kept, start, end)
        self.rounds: list[tuple[int, object, object]] = []  # compiled draft rounds: (γ, start, end)

    def _mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    @contextmanager
    def recording(self):
        original = CachedModel.forward

        def timed(runner, batch, end, num_logits, **kwargs):
            new_tokens, start = end - runner.cached, self._mark()
            logits = original(runner, batch, end, num_logits, **kwargs)
            self.calls.append((new_tokens, num_logits, start, self._mark()))
            return logits

        original_round = CachedModel.greedy_round

        def timed_round(runner, batch, end, num_steps, round_function, **pick):
            start = self._mark()
            tokens = original_round(runner, batch, end, num_steps, round_function, **pick)
            self.rounds.append((num_steps, start, self._mark()))
            return tokens

        CachedModel.forward, CachedModel.greedy_round = timed, timed_round
        try:
            yield self
        finally:
            CachedModel.forward, CachedModel.greedy_round = original, original_round

    def _ms(self, start, end) -> float:
        return start.elapsed_time(end) if self.cuda else (end - start) * 1e3

    def median_ms(self, new_tokens: int, num_logits: int) -> float | None:
        """Median ms of the recorded forwards over `new_tokens` slots keeping `num_logits` logits (None if none)."""
        if self.cuda:
            torch.cuda.synchronize()
        times = [self._ms(start, end) for n, k, start, end in self.calls if n == new_tokens and k == num_logits]
        return statistics.median(times) if times else None

    def round_ms(self, num_steps: int) -> float | None:
        """Median ms of the recorded compiled draft rounds of `num_steps` steps (None if none)."""
        if self.cuda:
            torch.cuda.synchronize()
        times = [self._ms(start, end) for steps, start, end in self.rounds if steps == num_steps]
        return statistics.median(times) if times else None

    def total_ms(self) -> float:
        """ms of every recorded forward and compiled draft round, summed."""
        if self.cuda:
            torch.cuda.synchronize()
        return sum(self._ms(start, end) for *_, start, end in self.calls + self.rounds)


def interpolated(costs: dict[int, float], gamma: int) -> float:
    """costs at `gamma`, linear between the measured γ (constant past the ends)."""
    known = sorted(costs)
    if gamma in costs:
        return costs[gamma]
    lower = max((g for g in known if g < gamma), default=known[0])
    upper = min((g for g in known if g > gamma), default=known[-1])
    if lower == upper:
        return costs[lower]
    return costs[lower] + (costs[upper] - costs[lower]) * (gamma - lower) / (upper - lower)


def verification_costs(args, timer: Timer, rules: list[str], gamma: int, target, batch_size: int = 1) -> dict:
    """ms of each rule's `verify` at γ on random logits of `batch_size` rows (greedy; dropmatch with the target's
    head)."""
    vocab = SHAPES[args.target]["vocab_size"]
    hidden_size = target.config.hidden_size
    logits = torch.randn(batch_size, gamma + 1, vocab, device=args.device)
    drafts = logits[:, :-1].argmax(-1)
    hidden = torch.randn(batch_size, gamma + 1, hidden_size, device=args.device, dtype=target.dtype)
    head = target.get_output_embeddings()
    costs = {}
    for name in rules:
        rule = RULES.build(name, {})
        inputs = dict(draft_token_ids=drafts, target_logits=logits, do_sample=False)
        if rule.requires_target_hidden_states:
            inputs.update(target_hidden_states=hidden, lm_head_weight=head.weight)
        if rule.requires_draft_probs or rule.redistributes_draft:
            inputs.update(draft_probs=torch.softmax(logits[:, :-1], -1))

        def verify(rule=rule, inputs=inputs):
            result = rule.verify(VerificationInput(**inputs))
            result.num_accepted.tolist()  # the round's host sync

        costs[name] = timer.median_ms(verify, args.repeats)
    return costs


def live(target, draft, args, timer: Timer, method: str, rule: str | None = None, compiled: bool = False,
         batch_size: int = 1, new_tokens: int | None = None, times: ForwardTimes | None = None,
         alpha: str | None = None) -> dict:
    """One timed generation (after an untimed one that compiles what it needs, timed as `first_call_s`); `times`
    records the timed one's forwards.

    Returns the live record: `method` (plain, stock, semspec), `rule` (None for plain and stock), `compiled`,
    `batch_size`, `alpha` (`ALPHAS`), `new_tokens` (all rows'), `seconds`, `tokens_per_s`, `first_call_s` (the first
    call: compilation, CUDA-graph capture and allocation included), `graphs_compiled` (the graphs torch compiled in
    the first call: `compiled_graphs`) and, for speculative runs, `tau` and `round_ms` (`stock`: τ counted from the
    target's forwards); `text`, the new tokens, which `main` compares with plain decoding's and drops."""
    new_tokens = new_tokens or args.new_tokens
    # The same prompt for every method at a batch size, so that each run's text can be compared with plain decoding's.
    generator = torch.Generator().manual_seed(args.seed * 1000 + batch_size)
    prompt = torch.randint(1, TOKENIZER_SIZES[args.target], (batch_size, args.prompt_length),
                           generator=generator).to(args.device)
    common = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    if compiled:
        common.update(cache_implementation="static", compile_config=compile_config(args))
    if method == "plain":
        def call():
            return type(target).generate(target, prompt, **common)
    elif method == "stock":
        draft.generation_config.num_assistant_tokens = args.gamma
        draft.generation_config.num_assistant_tokens_schedule = "constant"
        draft.generation_config.assistant_confidence_threshold = 0.0

        def call():
            return type(target).generate(target, prompt, assistant_model=draft, **common)
    else:
        def call():
            return target.generate(prompt, assistant_model=draft, acceptance=rule, num_assistant_tokens=args.gamma,
                                   tokenizer=TokenizerOfSize(TOKENIZER_SIZES[args.target]),
                                   return_dict_in_generate=True, **common)
    target_forwards = []
    with torch.no_grad():
        graphs_before = compiled_graphs()
        _, first_call_s = timer.run(call)  # compiles, captures, allocates
        graphs = compiled_graphs() - graphs_before
        # stock assisted generation reports no rounds: the target's forwards are counted (it stays eager), those
        # outside the draft's nested `generate()` (the draft may be the target itself)
        hook, drafting = None, []
        if method == "stock":
            hook = target.register_forward_hook(lambda *_: None if drafting else target_forwards.append(1))
            draft_generate, attached = draft.generate, vars(draft).get("generate")  # (hf_semspec.attach sets one)

            def flagged(*a, **k):
                drafting.append(1)
                try:
                    return draft_generate(*a, **k)
                finally:
                    drafting.pop()

            draft.generate = flagged  # the instance's: the target's own call goes through its class
        try:
            with times.recording() if times is not None else nullcontext():
                out, seconds = timer.run(call)
        finally:
            if hook is not None:
                hook.remove()
                if attached is None:
                    del draft.generate
                else:
                    draft.generate = attached
    sequences = out if isinstance(out, torch.Tensor) else out.sequences
    record = {"method": method, "rule": rule, "compiled": compiled, "batch_size": batch_size, "alpha": alpha,
              "new_tokens": new_tokens * batch_size, "seconds": seconds,
              "tokens_per_s": new_tokens * batch_size / seconds, "first_call_s": first_call_s,
              "graphs_compiled": graphs, "text": sequences[:, args.prompt_length:].tolist()}
    stats = getattr(out, "acceptance_stats", None)
    if stats is not None:
        # τ per row (pooled over a batch's rows) and, for batches, the batch's tokens per forward
        record.update(tau=stats.mean_accepted_length, tokens_per_forward=stats.tokens_per_forward,
                      rounds=stats.num_target_forwards,
                      round_ms=seconds * 1e3 / stats.num_target_forwards)
    elif target_forwards:
        record.update(tau=new_tokens / len(target_forwards), rounds=len(target_forwards),
                      round_ms=seconds * 1e3 / len(target_forwards))
    return record


def compiled_graphs() -> int:
    """Graphs torch has compiled in this process so far (dynamo's `unique_graphs`, which `torch._dynamo.reset()`
    does not clear): the difference around a call is what it compiled."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def host_overhead(record: dict, times: ForwardTimes, verification_ms: float) -> dict:
    """The host's share of a compiled speculative run's rounds (`overhead_ms`), from its own recorded forwards: the
    run's wall time less the device time of every forward it made (`ForwardTimes`: the prefill, each draft step and
    catch-up, each verify forward) and the rule's verification (`verification_ms`, timed apart at the run's batch
    size), per round. Also `forward_ms_per_round`, and the medians of the draft's one-token step (`draft_step_ms`) and
    of the verify forward at γ (`verify_ms`)."""
    forward_ms = times.total_ms()
    rounds = record["rounds"]
    record["forward_ms_per_round"] = forward_ms / rounds
    record["verification_ms"] = verification_ms
    record["overhead_ms"] = (record["seconds"] * 1e3 - forward_ms) / rounds - verification_ms
    return record


HOST_RANGES = profiling.RANGES + ("hf_semspec.sync",)


def host_breakdown(target, draft, args, new_tokens: int) -> dict:
    """Where a compiled round's host time goes: one more batch-1 `exact` call (its graphs compiled already) under
    torch.profiler, host activity only. Per round, the host milliseconds inside each of the loop's named ranges
    (`draft`, `target_forward`, `logits_processors`, `verify`, and `sync`, the round's one read, where the host
    waits for the device) and `rest`, the wall time outside them (the loop's Python: settling rows, statistics,
    the batch's bookkeeping). On a GPU the ranges other than `sync` are launch and Python time (the device runs
    behind them), so `rest` plus the ranges but `sync` is the host work a host-free round would remove."""
    from torch.profiler import ProfilerActivity, profile

    prompt = torch.randint(1, TOKENIZER_SIZES[args.target], (1, args.prompt_length),
                           generator=torch.Generator().manual_seed(args.seed * 1000 + 1)).to(args.device)
    kwargs = dict(assistant_model=draft, acceptance="exact", num_assistant_tokens=args.gamma, do_sample=False,
                  max_new_tokens=new_tokens, min_new_tokens=new_tokens, cache_implementation="static",
                  compile_config=compile_config(args), tokenizer=TokenizerOfSize(TOKENIZER_SIZES[args.target]),
                  return_dict_in_generate=True)
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        started = time.perf_counter()
        out = target.generate(prompt, **kwargs)
        if torch.device(args.device).type == "cuda":
            torch.cuda.synchronize(args.device)
        wall_ms = (time.perf_counter() - started) * 1e3
    totals = {name: 0.0 for name in HOST_RANGES}
    raw = getattr(getattr(prof, "profiler", None), "kineto_results", None)  # (fast: see profiling.range_totals_us)
    for name, ms in (((e.name(), e.duration_ns() / 1e6) for e in raw.events()) if raw is not None else
                     ((e.name, e.cpu_time_total / 1e3) for e in prof.events())):
        if name in totals:
            totals[name] += ms
    rounds = out.acceptance_stats.num_target_forwards
    per_round = {name.split(".", 1)[1]: ms / rounds for name, ms in totals.items()}
    per_round["rest"] = max(0.0, wall_ms / rounds - sum(per_round.values()))
    # The counts of the rounds after the first (whose forwards prefill the prompt eagerly), per round.
    counts = profiling.host_counts(prof, after_first_read=True)
    later = max(counts["reads"] - 1, 1)
    return {"rounds": rounds, "wall_ms_per_round": wall_ms / rounds, "ms_per_round": per_round,
            "compiled_calls_per_round": counts["compiled_calls"] / later,
            "launches_per_round": {name: n / later for name, n in counts["launches"].items()},
            "between_rounds_ms": statistics.median(counts["gaps_ms"]) if counts["gaps_ms"] else None,
            "note": "host ms per round under the profiler (which adds its own overhead); see host_breakdown()"}


def drafts_in_one_round(rule: str) -> bool:
    """Whether `rule`'s greedy runs draft with the compiled round (`ModelDrafter`: no q kept, no redistribution; the
    live runs have no logits processor)."""
    instance = RULES.get(rule)()
    return not (instance.requires_draft_probs or instance.redistributes_draft)


def graph_plan(args, rules: list[str], parts: list[str]) -> list[dict]:
    """The distinct graphs the compiled parts compile, one per model and input shape `(batch, new tokens)`: at each
    batch size of `--compiled-batch-sizes` (its rules: all at batch 1, `exact` in batches), plain decoding's step (the
    target, 1 token), the verify forward (the target, γ + 1 tokens) and the rules' verification (no forward: priced
    at nothing; neither for `dropmatch` alone, whose target forward stays eager), the draft's round (γ forwards in one
    graph whose two step shapes compile once each, `forwards`: priced as 2 graphs) for the rules that draft greedily
    in one call (`drafts_in_one_round`) and
    the draft's step (1 token) and catch-up step (2 tokens) for the others; `mla`, the draft's forward over 1 + k
    tokens keeping their logits; `warmup`, the batch-1 graphs again after `torch._dynamo.reset()`, from torch's
    compile caches (`cached`: cheaper, not free). α = 1 runs add none: they zero weights in place
    (`always_token_zero`). torch may compile a shape once more with dynamic sizes (its automatic dynamic shapes); the
    run counts what it really compiled (`graphs_compiled`)."""
    plan = []
    if "compiled" in parts:
        for batch_size in ints(args.compiled_batch_sizes):
            here = [r for r in rules if not RULES.get(r).redistributes_draft] if batch_size == 1 else ["exact"]
            plan.append(dict(model="target", batch_size=batch_size, tokens=1, what="plain decoding's step"))
            if any(rule != "dropmatch" for rule in here):
                plan.append(dict(model="target", batch_size=batch_size, tokens=args.gamma + 1, what="verify forward"))
                plan.append(dict(model="target", batch_size=batch_size, tokens=0, what="verification", forwards=0))
            if any(drafts_in_one_round(rule) for rule in here):  # (two step shapes, each compiled once: 2 graphs)
                plan.append(dict(model="draft", batch_size=batch_size, tokens=2, forwards=2, what="draft round"))
            if not all(drafts_in_one_round(rule) for rule in here):
                plan.append(dict(model="draft", batch_size=batch_size, tokens=1, what="draft step"))
                plan.append(dict(model="draft", batch_size=batch_size, tokens=2, what="draft catch-up step"))
    if "mla" in parts:
        plan.append(dict(model="draft", batch_size=1, tokens=1 + args.mla_k, what="multi-level drafting's forward"))
    if "warmup" in parts:
        plan += [{**graph, "cached": True} for graph in plan
                 if graph["batch_size"] == 1 and graph["what"] != "multi-level drafting's forward"]
    return plan


class Budget:
    """`--budget-s` seconds from `started`, and the seconds a graph compiles in: `--graph-seconds` until the run has
    timed a first call that compiled (then its first call's time less its steady one's, per graph compiled)."""

    def __init__(self, seconds: float, graph_seconds: float, started: float):
        self.seconds, self.graph_seconds, self.started = seconds, graph_seconds, started
        self.measured = False
        self.run_seconds = 0.0  # the slowest timed run so far: each run of a group is priced at twice it

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.started)

    def estimate(self, graphs: int, runs: int, scale: float = 1.0) -> float:
        return graphs * self.graph_seconds + runs * 2 * self.run_seconds * scale

    def learn(self, record: dict) -> None:
        self.run_seconds = max(self.run_seconds, record["seconds"])
        if record["graphs_compiled"] and not self.measured:
            self.graph_seconds = max(record["first_call_s"] - record["seconds"], 0.0) / record["graphs_compiled"]
            self.measured = True


def draft_forward_ms(model, args, timer: Timer, num_tokens: int) -> tuple[float, int]:
    """ms of `model`'s compiled forward over `num_tokens` new tokens that keeps the logits of all of them (what the
    draft verifying n-gram candidates needs), batch 1, on a static cache after a prompt of `--prompt-length` (the live
    runs' length), and the graphs its compilation took. Device time (CUDA events) on a GPU, median of `--repeats`."""
    from hf_semspec.decoding import compiled_forward

    length = args.prompt_length + args.new_tokens
    cache = StaticCache(config=model.config, max_cache_len=length)
    prompt = torch.randint(1, TOKENIZER_SIZES[args.draft], (1, args.prompt_length), device=args.device)
    forward = compiled_forward(model, compile_config(args))
    ids = prompt[:, :num_tokens]
    positions = torch.arange(args.prompt_length, args.prompt_length + num_tokens, device=args.device)[None]
    times = ForwardTimes(args.device)
    with torch.no_grad():
        model(prompt, use_cache=True, **{CACHE_ARGUMENT: cache})  # the prompt, eagerly (as the loop's prefill)

        def step():
            start = times._mark()
            out = forward(input_ids=ids, position_ids=positions, use_cache=True, logits_to_keep=num_tokens,
                          **{CACHE_ARGUMENT: cache})
            out.logits.float()
            times.calls.append((num_tokens, num_tokens, start, times._mark()))
            rewind_cache(cache, num_tokens)

        graphs_before = compiled_graphs()
        step()  # compiles
        graphs = compiled_graphs() - graphs_before
        times.calls.clear()
        for _ in range(args.repeats):
            step()
    return times.median_ms(num_tokens, num_tokens), graphs


CONTRACT = {
    "every live record": ("compiled", "batch_size", "rule", "alpha"),
    "a speculative run (method other than plain)": ("tau",),
    "a compiled speculative run": ("overhead_ms",),
}


def check_live_records(records: list[dict]) -> None:
    """What the next GPU session reads from `live` (docs/gpu.md): every record has `compiled`, `batch_size`, `rule`
    (None for plain decoding) and `alpha`; speculative runs `tau`; compiled speculative runs `overhead_ms` (host ms
    per round). Raises naming the record and the field."""
    for index, record in enumerate(records):
        needed = list(CONTRACT["every live record"])
        if record.get("method") != "plain":
            needed += CONTRACT["a speculative run (method other than plain)"]
            if record.get("compiled"):
                needed += CONTRACT["a compiled speculative run"]
        missing = [field for field in needed if field not in record]
        if missing:
            raise ValueError(
                f"live[{index}] ({record.get('method')}, rule {record.get('rule')}, compiled {record.get('compiled')}, "
                f"batch {record.get('batch_size')}): missing {missing}; every live record needs "
                f"{CONTRACT['every live record']}, speculative ones also tau, compiled speculative ones overhead_ms. "
                "Fix: record them where benchmarks/gpu.py adds the run (live, host_overhead)."
            )


def first_call(record: dict) -> dict:
    """A run's warm-up: its first call (compilation, CUDA-graph capture and allocation included) against a steady
    call, and the graphs the first one compiled."""
    return {"method": record["method"], "rule": record["rule"], "batch_size": record["batch_size"],
            "warmup_s": record["first_call_s"], "steady_s": record["seconds"],
            "graphs_compiled": record["graphs_compiled"]}


def inductor_cache_dir() -> str:
    """Where inductor keeps its compile caches on disk (`TORCHINDUCTOR_CACHE_DIR`, default
    /tmp/torchinductor_<user>)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return cache_dir()


def expected_tokens(acceptance: list[float], gamma: int) -> float:
    """E[tokens per round] at γ: the target's token plus each draft i accepted with its prefix, Σ_{i<γ} A_i
    (A_i = P(drafts 0..i accepted), the per-position acceptance of a run with γ ≥ i + 1)."""
    return 1.0 + sum(acceptance[:gamma])


def modeled(acceptance: list[float], draft_ms: float, verify: dict[int, float], verification_ms: float,
            overhead_ms: float, gammas: list[int], batch_size: int = 1) -> dict:
    """tokens/s per γ at `acceptance`: each row of a batch keeps its own accepted drafts (holes), so a round yields
    `batch_size` times a row's expected tokens."""
    out = {}
    for gamma in gammas:
        if gamma > len(acceptance):
            continue
        round_ms = gamma * draft_ms + interpolated(verify, gamma) + verification_ms + overhead_ms
        out[gamma] = batch_size * expected_tokens(acceptance, gamma) * 1e3 / round_ms
    return out


def write(args, results: dict) -> None:
    name = args.name or f"gpu-{args.target}-{args.dtype}"
    args.output_dir.mkdir(parents=True, exist_ok=True)
    markdown.write_json(args.output_dir / f"{name}.json", results)
    (args.output_dir / f"{name}.md").write_text(render(results), encoding="utf-8")


def render(results: dict) -> str:
    lines = [f"# GPU benchmark: {results['setup']['target']} / {results['setup']['draft']}, "
             f"{results['setup']['dtype']}, {results['machine'].get('device_name')}", ""]
    lines += [f"torch {results['machine']['torch']}, transformers {results['machine']['transformers']}; prompt "
              f"{results['setup']['prompt_length']} tokens, {results['setup']['new_tokens']} new, γ = "
              f"{results['setup']['gamma']}, greedy, random weights.", ""]
    costs = results.get("costs")
    if costs:
        # γ keys are ints in memory and strings once read back from the JSON
        costs = {k: ({int(g): ms for g, ms in v.items()} if k.startswith("verify_") else v) for k, v in costs.items()}
        lines += ["## Costs (ms)", ""]
        compiled = "verify_compiled" in costs  # absent while (or if) the compiled part has not run
        gamma = results["setup"]["gamma"]
        rows = [[f"draft step ({results['setup']['draft']})", f"{costs['draft_step_eager']:.2f}",
                 f"{costs['draft_step_compiled']:.2f}" if compiled else "–"],
                [f"target step ({results['setup']['target']})", f"{costs['target_step_eager']:.2f}", "–"]]
        compiled_verify = costs.get("verify_compiled", {})
        rows += [[f"verify γ = {g}"] + [f"{by_gamma[g]:.2f}" if g in by_gamma else "–"
                                        for by_gamma in (costs["verify_eager"], compiled_verify)]
                 for g in sorted(set(costs["verify_eager"]) | set(compiled_verify))]
        rows += [[f"verification `{name}` (γ = {gamma})", f"{ms:.3f}", ""]
                 for name, ms in costs["verification"].items()]
        lines += markdown.table(["", "eager", "compiled"], rows) + [""]
    records = results.get("live")
    if records:
        def plain_of(r: dict, compiled: bool) -> float | None:
            """Plain decoding's tok/s at `r`'s batch size (random weights)."""
            return next((p["tokens_per_s"] for p in records if p["method"] == "plain" and p["compiled"] == compiled
                         and p["batch_size"] == r["batch_size"] and p.get("alpha") is None), None)

        lines += ["## Live", ""]
        rows = []
        for r in records:
            label = r["method"] if r["rule"] is None else f"`{r['rule']}`"
            plain_eager, plain_compiled = plain_of(r, False), plain_of(r, True)
            rows.append([label, str(r["batch_size"]), r.get("alpha") or "", "compiled" if r["compiled"] else "eager",
                         f"{r['tokens_per_s']:.1f}", f"{r['tau']:.2f}" if "tau" in r else "–",
                         f"{r['tokens_per_s'] / plain_eager:.2f}×" if plain_eager else "–",
                         f"{r['tokens_per_s'] / plain_compiled:.2f}×" if plain_compiled else "–",
                         f"{r['overhead_ms']:.2f}" if "overhead_ms" in r else "–",
                         f"{r['first_call_s']:.1f}" if "first_call_s" in r else "–",
                         f"{r['agrees_with_plain']:.0%}" if "agrees_with_plain" in r else "–"])
        lines += markdown.table(["method", "B", "α", "", "tok/s", "τ", "of plain eager", "of plain compiled",
                                 "host ms / round", "first call s", "text as plain's*"], rows)
        lines += ["", "α: " + "; ".join(f"{k}, {v}" for k, v in ALPHAS.items()) + ". \\* the share of new tokens "
                  "before the first difference from plain decoding's text (same mode, batch and weights, same prompt); "
                  "bf16 rounding can part greedy texts at a near tie of random weights.", ""]
    warmup = results.get("warmup")
    if warmup:
        lines += ["## Warm-up (s)", ""]
        rows = []
        for label, entry in (("first compiled calls", warmup), ("again, from torch's compile caches",
                                                                warmup.get("from_caches", {}))):
            for side in ("plain", "speculative"):
                if side in entry:
                    w = entry[side]
                    rows.append([label, side if w["rule"] is None else f"{side} (`{w['rule']}`)",
                                 f"{w['warmup_s']:.1f}", f"{w['steady_s']:.2f}", str(w["graphs_compiled"])])
        lines += markdown.table(["", "call", "first call", "steady call", "graphs compiled"], rows) + [""]
        if "ratio" in warmup:
            lines.append(f"- The first speculative call took {warmup['ratio']:.2f}× plain decoding's first call.")
        caches = warmup.get("from_caches")
        if caches:
            how = "a fresh process" if caches["process_fresh"] else "after torch._dynamo.reset()"
            lines.append(f"- From the caches ({how}, {caches['cache_files_before']} files in {caches['cache_dir']}): "
                         f"the speculative first call took {caches['ratio']:.2f}× plain's.")
        lines.append("")
    host = results.get("host_breakdown")
    if host:
        lines += ["## Host time of a compiled round (batch 1, `exact`, under the profiler)", ""]
        lines += markdown.table(["range", "host ms / round"],
                                [[f"`{name}`", f"{ms:.2f}"] for name, ms in host["ms_per_round"].items()]) + [""]
        lines += [f"- {host['rounds']} rounds, {host['wall_ms_per_round']:.2f} ms a round. `sync` is the round's one "
                  "read (the host waits for the device there); the other ranges and `rest` are host work."]
        if "compiled_calls_per_round" in host:  # (results written before the counts have none)
            launches = ", ".join(f"{name} {n:.1f}" for name, n in sorted(host["launches_per_round"].items()))
            gap = host["between_rounds_ms"]
            lines += [f"- Per round after the first: {host['compiled_calls_per_round']:.1f} compiled calls; eager "
                      "launches outside "
                      f"them: {launches}; from a round's read to the next round's first compiled call "
                      + ("–" if gap is None else f"{gap:.2f} ms") + " (median; the device has nothing queued then)."]
        lines.append("")
    mla = results.get("mla_modeled")
    if mla:
        lines += ["## Multi-level drafting (modeled)", "",
                  f"The draft's compiled forward over 1 + k = {mla['forward_tokens']} tokens: "
                  f"{mla['draft_forward_ms']:.2f} ms; at {mla['draft_forwards_per_token']} forwards per drafted token, "
                  f"{mla['draft_ms_per_drafted_token']:.2f} ms per drafted token"
                  + (f" (one-token step: {mla['draft_step_ms']:.2f} ms)." if mla.get("draft_step_ms") else "."), ""]
        if mla.get("missing"):
            lines += [f"Not modeled: needs {mla['missing']}.", ""]
        for set_name, entry in mla["sets"].items():
            best = entry["best"]
            of_plain = f", {best['of_plain_compiled']:.2f}× plain compiled" if best["of_plain_compiled"] else ""
            lines.append(f"- {set_name}: best γ = {best['gamma']}, {best['tokens_per_s']:.1f} tok/s{of_plain}, "
                         f"{best['of_standard_best']:.2f}× the best of one-token draft steps.")
        lines.append("")
    if results.get("skipped"):
        lines += ["## Skipped (budget)", ""] + [f"- {s['part']} at batch {s['batch_size']}: {s['reason']}; "
                                                 f"`{s['command']}`" for s in results["skipped"]] + [""]
    for set_name, entry in results.get("modeled", {}).items():
        lines += [f"## Modeled at the reference pair's acceptance: {set_name}", "", entry["source"] + ".", ""]
        modes = [m for m in ("eager", "compiled") if m in entry]
        per_mode = {m: {int(g): v for g, v in entry[m].items()} for m in modes}  # string keys once read from JSON
        gammas = sorted({g for m in modes for g in per_mode[m]})
        rows = [[str(g)] + [f"{per_mode[m][g]:.1f}" if g in per_mode[m] else "–" for m in modes] for g in gammas]
        lines += markdown.table(["γ"] + [f"{m} tok/s" for m in modes], rows) + [""]
        for mode in modes:
            best = entry[f"best_{mode}"]
            ratios = [f"{best[f'of_plain_{m}']:.2f}× plain {m}" for m in ("eager", "compiled")
                      if best.get(f"of_plain_{m}") is not None]
            lines.append(f"- {mode}: best γ = {best['gamma']}, {best['tokens_per_s']:.1f} tok/s, {', '.join(ratios)}.")
        lines.append("")
    batched = results.get("batched")
    if batched:
        lines += ["## Batched (eager, dynamic caches)", ""]
        rows = [[str(b["batch_size"]), f"{b['plain_tokens_per_s']:.1f}", f"{b['exact_tokens_per_s']:.1f}",
                 f"{b['exact_tokens_per_s'] / b['plain_tokens_per_s']:.2f}×",
                 f"{b['modeled_exact_tokens_per_s']:.1f}", f"{b['modeled_exact_tokens_per_s'] / b['plain_tokens_per_s']:.2f}×",
                 f"{b['exact_agrees_with_plain']:.0%}"]
                for b in batched]
        lines += markdown.table(["B", "plain tok/s", "`exact` tok/s (all accepted)", "of plain",
                                 "`exact` modeled at the reference acceptance", "of plain", "text as plain's*"],
                                rows) + [""]
    return "\n".join(lines)


def agreement(record: dict, reference: dict) -> float:
    """The share of new tokens that `record`'s rows keep before their first difference from `reference`'s (plain
    decoding, same prompt): 1.0 where the texts are equal. In bf16 a verify forward over γ + 1 tokens and a one-token
    step round differently, and random weights give near-flat logits, so greedy texts may part on a near tie."""
    shares = []
    for row, plain_row in zip(record["text"], reference["text"]):
        same = next((i for i, (a, b) in enumerate(zip(row, plain_row)) if a != b), min(len(row), len(plain_row)))
        shares.append(same / max(len(plain_row), 1))
    return sum(shares) / len(shares)


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    # Every model's compiled forward shares transformers' forward wrapper, whose compiled variants torch caps at 8
    # (`recompile_limit`); this run compiles two models at several shapes (docs/gpu.md, Limits).
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    dtype = getattr(torch, args.dtype)
    timer = Timer(args.device)
    rules = [r for r in args.rules.split(",") if r]
    unknown = sorted(set(rules) - set(hf_semspec.available_rules()))
    if unknown:
        raise SystemExit(f"--rules: unknown {unknown}; allowed {hf_semspec.available_rules()}")
    parts = [p for p in args.parts.split(",") if p]
    if not parts or set(parts) - set(PARTS):
        raise SystemExit(f"--parts: {args.parts!r}; allowed a comma-separated subset of {','.join(PARTS)}")
    if args.load_compile_cache is not None:  # torch's compile caches saved by an earlier run (`--save-compile-cache`)
        torch.compiler.load_cache_artifacts(args.load_compile_cache.read_bytes())
    acceptance_sets = json.loads(args.acceptance.read_text(encoding="utf-8"))["sets"]
    machine = report.machine_info()
    if torch.device(args.device).type == "cuda":
        machine["device_name"] = torch.cuda.get_device_name(args.device)
    results = {"setup": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
               "machine": machine, "step_seconds": {}}
    started = time.perf_counter()
    graphs_at_start = compiled_graphs()
    budget = Budget(args.budget_s, args.graph_seconds, started)
    results["graph_plan"] = plan = graph_plan(args, rules, parts)
    results["skipped"] = []

    def skip_unless_fits(part: str, batch_size: int, graphs: int, runs: int, scale: float = 1.0) -> bool:
        """Whether `graphs` compilations (of one forward each) and `runs` runs fit what is left of `--budget-s`; if
        not, the group is recorded in `skipped` with the command that runs it alone."""
        needed, left = budget.estimate(graphs, runs, scale), budget.left()
        if needed <= left:
            return True
        command = (f"python benchmarks/gpu.py --target {args.target} --draft {args.draft} --parts {part}"
                   + (f" --compiled-batch-sizes {batch_size}" if part == "compiled" else ""))
        results["skipped"].append({
            "part": part, "batch_size": batch_size, "estimated_s": needed, "left_s": left,
            "reason": f"needs about {needed:.0f} s ({graphs} graphs at {budget.graph_seconds:.0f} s, {runs} runs) "
                      f"with {left:.0f} s left of --budget-s {args.budget_s:.0f}",
            "command": command})
        print(f"skipped {part} at batch {batch_size}: {results['skipped'][-1]['reason']}; run: {command}",
              file=sys.stderr)
        return False

    target = random_model(args.target, dtype, args.device, args.seed)
    independent = random_model(args.draft, dtype, args.device, args.seed + 1)
    records = results["live"] = []
    plain_text = {}

    def add(record: dict) -> dict:
        """A live record, its text compared with plain decoding's of the same mode, then dropped."""
        key = (record["compiled"], record["new_tokens"], record["alpha"] == "1")
        if record["method"] == "plain":
            plain_text[key] = record
        elif key in plain_text:
            record["agrees_with_plain"] = agreement(record, plain_text[key])
        records.append({k: v for k, v in record.items() if k != "text"})
        return records[-1]

    def done(part: str, since: float) -> float:
        results["step_seconds"][part] = time.perf_counter() - since
        write(args, results)
        return time.perf_counter()

    # Eager costs (cheap: no compilation); every part prices its rounds with them.
    step_started = time.perf_counter()
    results["costs"] = costs = {
        "draft_step_eager": forward_costs(independent, args, timer, 1, [0])[0],
        "target_step_eager": forward_costs(target, args, timer, 1, [0])[0],
        "verify_eager": forward_costs(target, args, timer, 1, ints(args.gammas)),
        "verification": verification_costs(args, timer, rules, args.gamma, target),
    }
    step_started = done("costs_eager", step_started)
    spec_rules = [r for r in rules if not RULES.get(r).redistributes_draft]  # rdk needs a pruned drafter with a kernel

    # 1. Live, batch 1, eager.
    if "eager" in parts:
        add(live(target, None, args, timer, "plain"))
        add({**live(target, target, args, timer, "stock", alpha="self"), "draft": "target's weights"})
        for rule in spec_rules:
            add({**live(target, target, args, timer, "semspec", rule, alpha="self"), "draft": "target's weights"})
        add({**live(target, independent, args, timer, "semspec", "exact", new_tokens=max(8, args.new_tokens // 4),
                    alpha="independent"), "draft": "independent"})
        step_started = done("eager", step_started)

    # 2. Batched (eager, dynamic caches).
    if "batched" in parts:
        results["batched"] = batched = []
        reference = next(iter(acceptance_sets.values()))["per_position_acceptance"]
        for batch_size in ints(args.batch_sizes):
            plain_b = live(target, None, args, timer, "plain", batch_size=batch_size, new_tokens=args.batch_new_tokens)
            exact_b = live(target, target, args, timer, "semspec", "exact", batch_size=batch_size,
                           new_tokens=args.batch_new_tokens)
            step = forward_costs(independent, args, timer, batch_size, [0])[0]
            target_step = forward_costs(target, args, timer, batch_size, [0])[0]
            verify = forward_costs(target, args, timer, batch_size, [args.gamma])
            overhead = max(exact_b["round_ms"] - args.gamma * target_step - verify[args.gamma]
                           - costs["verification"]["exact"], 0.0)
            model_b = modeled(reference, step, verify, costs["verification"]["exact"], overhead, [args.gamma],
                              batch_size)
            batched.append({"batch_size": batch_size, "plain_tokens_per_s": plain_b["tokens_per_s"],
                            "exact_tokens_per_s": exact_b["tokens_per_s"], "exact_tau": exact_b["tau"],
                            "exact_agrees_with_plain": agreement(exact_b, plain_b),
                            "draft_step_ms": step, "target_step_ms": target_step, "verify_ms": verify[args.gamma],
                            "overhead_ms": overhead,
                            "modeled_exact_tokens_per_s": model_b.get(args.gamma, float("nan"))})
            write(args, results)
        step_started = done("batched", step_started)

    # 3. Compiled (static caches), at each of `--compiled-batch-sizes` that fits the budget: plain decoding, every
    # rule with the independent draft (batches: `exact`), then plain and `exact` at α = 1 (both final norms zeroed in
    # place: the same graphs). Each speculative run's forwards are timed (`host_overhead`); batch 1's `exact` run,
    # the first speculative call of the process, gives the compiled costs and the warm-up's speculative side.
    if "compiled" in parts:
        warmup = results["warmup"] = {}
        for batch_size in ints(args.compiled_batch_sizes):
            tokens = args.new_tokens if batch_size == 1 else args.batch_new_tokens
            batch_rules = ["exact"] + [r for r in spec_rules if r != "exact"] if batch_size == 1 else ["exact"]
            graphs = [g for g in plan if g["batch_size"] == batch_size and "cached" not in g
                      and g["what"] != "multi-level drafting's forward"]
            forwards = sum(graph.get("forwards", 1) for graph in graphs)  # the draft's round compiles as 2 graphs
            if not skip_unless_fits("compiled", batch_size, forwards, len(batch_rules) + 3,
                                    tokens * batch_size / args.new_tokens):
                continue
            verification = (costs["verification"] if batch_size == 1 else
                            verification_costs(args, timer, batch_rules, args.gamma, target, batch_size))
            results.setdefault("verification_by_batch", {})[batch_size] = verification
            common = dict(compiled=True, batch_size=batch_size, new_tokens=tokens)
            plain_record = add(live(target, None, args, timer, "plain", **common))
            budget.learn(plain_record)

            def speculative(rule: str, alpha: str) -> dict:
                times = ForwardTimes(args.device)
                record = add({**live(target, independent, args, timer, "semspec", rule, times=times, alpha=alpha,
                                     **common), "draft": "independent"})
                budget.learn(record)
                record["draft_step_ms"] = times.median_ms(1, 1)
                record["draft_round_ms"] = times.round_ms(args.gamma)
                if record["draft_round_ms"] is not None:  # greedy drafts: one compiled call a round, a step its share
                    record["draft_step_ms"] = record["draft_round_ms"] / args.gamma
                record["verify_ms"] = times.median_ms(args.gamma + 1, args.gamma + 1)
                return host_overhead(record, times, verification[rule])

            for rule in batch_rules:
                record = speculative(rule, "independent")
                # `exact`'s run gives the compiled costs (`dropmatch`'s target forward stays eager: its hook)
                if batch_size == 1 and rule == "exact" and None not in (record["draft_step_ms"], record["verify_ms"]):
                    costs["draft_step_compiled"] = record["draft_step_ms"]
                    costs["verify_compiled"] = {args.gamma: record["verify_ms"]}
                if batch_size == 1 and rule == "exact":
                    warmup["plain"] = first_call(plain_record)
                    warmup["speculative"] = first_call(record)
                    warmup["ratio"] = record["first_call_s"] / plain_record["first_call_s"]
                    results["host_breakdown"] = host_breakdown(target, independent, args, tokens)
                write(args, results)
            with always_token_zero(target, independent):
                add({**live(target, None, args, timer, "plain", alpha="1", **common)})
                speculative("exact", "1")
            write(args, results)
        step_started = done("compiled", step_started)

    # 4. Multi-level drafting, modeled: the draft verifying k n-gram candidates in one forward of 1 + k tokens (its
    # logits at all of them), timed compiled; a round drafts γ tokens in γ · `--mla-draft-forwards-per-token` such
    # forwards; the rest of the round (verify forward, verification, host time) is batch 1's compiled `exact` run's.
    if "mla" in parts:
        if skip_unless_fits("mla", 1, 1, 0):
            forward_ms, graphs = draft_forward_ms(independent, args, timer, 1 + args.mla_k)
            per_token = args.mla_draft_forwards_per_token
            entry = results["mla_modeled"] = {
                "k": args.mla_k, "draft_forwards_per_token": per_token, "forward_tokens": 1 + args.mla_k,
                "draft_forward_ms": forward_ms, "draft_ms_per_drafted_token": per_token * forward_ms,
                "draft_step_ms": costs.get("draft_step_compiled"), "graphs_compiled": graphs, "sets": {},
            }
            exact_compiled = next((r for r in records if r.get("rule") == "exact" and r["compiled"]
                                   and r["batch_size"] == 1 and r["alpha"] == "independent"), None)
            plain_compiled = next((r for r in records if r["method"] == "plain" and r["compiled"]
                                   and r["batch_size"] == 1 and r["alpha"] is None), None)
            if exact_compiled is None or "verify_compiled" not in costs:
                entry["missing"] = ("the compiled part's batch-1 `exact` run (its verify forward and host time): run "
                                    "--parts compiled,mla")
            else:
                overhead = max(exact_compiled["overhead_ms"], 0.0)
                for set_name, reference in acceptance_sets.items():
                    acceptance = reference["per_position_acceptance"]
                    gammas = list(range(1, len(acceptance) + 1))
                    args_common = (costs["verify_compiled"], costs["verification"]["exact"], overhead, gammas)
                    mla = modeled(acceptance, per_token * forward_ms, *args_common)
                    standard = modeled(acceptance, costs["draft_step_compiled"], *args_common)
                    best, best_standard = max(mla, key=mla.get), max(standard, key=standard.get)
                    entry["sets"][set_name] = {
                        "tokens_per_s": mla, "standard_tokens_per_s": standard,
                        "best": {"gamma": best, "tokens_per_s": mla[best],
                                 "of_plain_compiled": (mla[best] / plain_compiled["tokens_per_s"]
                                                       if plain_compiled else None),
                                 "of_standard_best": mla[best] / standard[best_standard]},
                    }
            write(args, results)
        step_started = done("mla", step_started)

    # 5. Warm-up from torch's compile caches: after `torch._dynamo.reset()` (this process compiled before) or in a
    # fresh process (`--parts warmup` alone: what a second process pays, reading the caches the first one wrote), the
    # first batch-1 plain and speculative calls, timed with what they compile.
    if "warmup" in parts:
        warmup = results.setdefault("warmup", {})
        if skip_unless_fits("warmup", 1, 4, 2):  # priced as full compilations: what the caches save is unmeasured
            fresh = compiled_graphs() == 0
            if not fresh:
                torch._dynamo.reset()
            cache_dir = Path(inductor_cache_dir())
            entry = warmup["from_caches"] = {
                "process_fresh": fresh, "cache_dir": str(cache_dir),
                "cache_files_before": sum(1 for f in cache_dir.rglob("*") if f.is_file()) if cache_dir.is_dir() else 0,
            }
            plain_again = live(target, None, args, timer, "plain", compiled=True)
            spec_again = live(target, independent, args, timer, "semspec", "exact", compiled=True,
                              alpha="independent")
            entry.update(plain=first_call(plain_again), speculative=first_call(spec_again),
                         ratio=spec_again["first_call_s"] / plain_again["first_call_s"])
            write(args, results)
        step_started = done("warmup", step_started)

    # The host's share of each live eager speculative round at batch 1: its time less the draft steps, verify and
    # verification (compiled runs have theirs from their own forwards: `host_overhead`).
    for r in records:
        if r["method"] != "semspec" or r["compiled"] or r["batch_size"] != 1 or "verify_eager" not in costs:
            continue
        step = costs["draft_step_eager"] if r["draft"] == "independent" else costs["target_step_eager"]
        r["overhead_ms"] = r["round_ms"] - (args.gamma * step + interpolated(costs["verify_eager"], args.gamma)
                                            + costs["verification"][r["rule"]])

    # Modeled at the reference acceptance, for each mode whose plain run and costs were measured (host time: the
    # live `exact` run's per round: the target drafting for itself eager, the independent draft compiled).
    plain = {r["compiled"]: r["tokens_per_s"] for r in records
             if r["method"] == "plain" and r["batch_size"] == 1 and r["alpha"] is None}
    results["modeled"] = model = {}
    for set_name, reference in acceptance_sets.items():
        acceptance = reference["per_position_acceptance"]
        entry = {"source": reference["source"]}
        for compiled, mode in ((False, "eager"), (True, "compiled")):
            if compiled not in plain or f"verify_{mode}" not in costs:
                continue
            overhead = next((r["overhead_ms"] for r in records if r.get("rule") == "exact"
                             and r["compiled"] == compiled and "overhead_ms" in r and r["batch_size"] == 1
                             and r["alpha"] == ("independent" if compiled else "self")), 0.0)
            per_gamma = modeled(acceptance, costs[f"draft_step_{mode}"], costs[f"verify_{mode}"],
                                costs["verification"]["exact"], max(overhead, 0.0),
                                list(range(1, len(acceptance) + 1)))
            entry[mode] = per_gamma
            best = max(per_gamma, key=per_gamma.get)
            entry[f"best_{mode}"] = {"gamma": best, "tokens_per_s": per_gamma[best],
                                     "of_plain_eager": per_gamma[best] / plain[False] if False in plain else None,
                                     "of_plain_compiled": per_gamma[best] / plain[True] if True in plain else None}
        if "eager" in entry or "compiled" in entry:
            model[set_name] = entry
    results["seconds"] = time.perf_counter() - started
    results["graphs_compiled"] = compiled_graphs() - graphs_at_start
    check_live_records(records)
    if args.save_compile_cache is not None:
        saved = torch.compiler.save_cache_artifacts()
        if saved is not None:
            args.save_compile_cache.write_bytes(saved[0])
    write(args, results)
    print(render(results))
    return results


if __name__ == "__main__":
    main()
