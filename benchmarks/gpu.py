"""GPU benchmark: speculative decoding with random-weight models built from real configs (no weights to download).

    python benchmarks/gpu.py                          # Qwen2.5-Coder-1.5B target / 0.5B draft shapes, bf16, cuda
    python benchmarks/gpu.py --target qwen2.5-7b      # a 7B-class target (its vocabulary padded to 152064 rows)
    python benchmarks/gpu.py --batch-sizes 1,8,32     # batched rows (eager, dynamic caches)
    python benchmarks/gpu.py --target tiny --draft tiny --device cpu --dtype float32 --compile-backend aot_eager \
        --new-tokens 8 --prompt-length 8               # a smoke run (what tests/test_benchmark_gpu.py runs)

Random weights decide nothing about acceptance, so the benchmark measures costs and prices them at the acceptance the
reference pair really has. Three parts (`--parts`, all by default), each written to `<output-dir>/gpu-<name>.{json,md}`
as soon as it is done; compilation takes most of a run (70-80 s a graph for a 28-layer model on an H100's host), so the
compiled part compiles only what a user's call compiles:

1. `eager`: costs in ms (synchronized timers, median of `--repeats`): the draft's and the target's one-token steps and
   the target's verify forward at each γ of `--gammas` (dynamic caches), and each rule's verification at γ
   (`rule.verify` on random logits); then live tokens/s at batch 1: plain decoding, stock assisted and every rule with
   the target's own weights as the draft (every draft accepted: the best case), and `exact` with an independent draft
   of the draft's shape (nothing accepted: the worst case).
2. `batched` (`--batch-sizes`, eager, dynamic caches): plain batched decoding and batched `exact` (draft = the target's
   weights), live, and batched `exact` modeled at the first reference acceptance from the eager costs at that size.
3. `compiled` (static caches, `compile_config`): plain compiled decoding (transformers' own static-cache path) and every
   rule with the independent draft, live. The compiled costs are read inside these runs: every forward of the loop is
   timed by CUDA events (`ForwardTimes`), so the draft's step and the verify forward at γ cost no compilation of their
   own; the verify forward is priced the same at every γ (measured flat, 3.7-3.9 ms for γ = 1-8, on an H100).

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
from transformers import CompileConfig, DynamicCache, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

import hf_semspec  # noqa: E402
from benchmarks import markdown, report  # noqa: E402
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
    parser.add_argument("--parts", default="eager,batched,compiled",
                        help="which parts to run: eager, batched, compiled (the docstring says what each does)")
    parser.add_argument("--rules", default=",".join(hf_semspec.available_rules()))
    parser.add_argument("--batch-sizes", default="1,8,32")
    parser.add_argument("--batch-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=20, help="timed repeats of each cost")
    parser.add_argument("--compile-backend", default="inductor")
    parser.add_argument("--compile-mode", default="reduce-overhead", help="'none' for the backend's default")
    parser.add_argument("--acceptance", type=Path, default=DEFAULT_ACCEPTANCE)
    parser.add_argument("--output-dir", type=Path, default=REPO_ROOT / "benchmarks" / "results")
    parser.add_argument("--name", default=None, help="results name (default gpu-<target>-<dtype>)")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def random_model(shape: str, dtype: torch.dtype, device: str, seed: int) -> Qwen2ForCausalLM:
    """A Qwen2 causal LM of `shape` with random weights (normal, std 0.02, as transformers initializes them)."""
    torch.manual_seed(seed)
    config = Qwen2Config(**SHAPES[shape], tie_word_embeddings=False, max_position_embeddings=32768,
                         eos_token_id=None, bos_token_id=None, pad_token_id=0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype).eval()
    model.generation_config.eos_token_id = None  # random weights: every run makes exactly its new tokens
    return hf_semspec.attach(model)


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
    """The device time of every forward the speculative loop makes (`CachedModel.forward`) while the context is open:
    the costs of exactly the graphs a live run compiled, at no compilation of their own. CUDA events, read once the
    runs are over (no sync inside the loop); wall time on a CPU. Draft steps keep one logit, verify forwards γ + 1.
    Not `metrics.ForwardMeter`: its module hooks would run inside a compiled forward, and it reads the host's clock
    without a sync, which on a GPU times kernel launches, not kernels."""

    def __init__(self, device: str):
        self.cuda = torch.device(device).type == "cuda"
        self.calls: list[tuple[int, int, object, object]] = []  # (new tokens, logits kept, start, end)

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

        CachedModel.forward = timed
        try:
            yield self
        finally:
            CachedModel.forward = original

    def median_ms(self, new_tokens: int, num_logits: int) -> float | None:
        """Median ms of the recorded forwards over `new_tokens` slots keeping `num_logits` logits (None if none)."""
        if self.cuda:
            torch.cuda.synchronize()
        times = [start.elapsed_time(end) if self.cuda else (end - start) * 1e3
                 for n, k, start, end in self.calls if n == new_tokens and k == num_logits]
        return statistics.median(times) if times else None


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


def verification_costs(args, timer: Timer, rules: list[str], gamma: int, target) -> dict:
    """ms of each rule's `verify` at γ on random logits (greedy; dropmatch with the target's head)."""
    vocab = SHAPES[args.target]["vocab_size"]
    hidden_size = target.config.hidden_size
    logits = torch.randn(1, gamma + 1, vocab, device=args.device)
    drafts = logits[:, :-1].argmax(-1)
    hidden = torch.randn(1, gamma + 1, hidden_size, device=args.device, dtype=target.dtype)
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
         batch_size: int = 1, new_tokens: int | None = None, times: ForwardTimes | None = None) -> dict:
    """One timed generation (after an untimed one that compiles what it needs); `times` records the timed one's
    forwards."""
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
    with torch.no_grad():
        call()  # compiles, captures, allocates
        with times.recording() if times is not None else nullcontext():
            out, seconds = timer.run(call)
    sequences = out if isinstance(out, torch.Tensor) else out.sequences
    record = {"method": method, "rule": rule, "compiled": compiled, "batch_size": batch_size,
              "new_tokens": new_tokens * batch_size, "seconds": seconds,
              "tokens_per_s": new_tokens * batch_size / seconds,
              "text": sequences[:, args.prompt_length:].tolist()}
    stats = getattr(out, "acceptance_stats", None)
    if stats is not None:
        # τ per row (pooled over a batch's rows) and, for batches, the batch's tokens per forward
        record.update(tau=stats.mean_accepted_length, tokens_per_forward=stats.tokens_per_forward,
                      rounds=stats.num_target_forwards,
                      round_ms=seconds * 1e3 / stats.num_target_forwards)
    return record


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
        plain_eager = next((r["tokens_per_s"] for r in records if r["method"] == "plain" and not r["compiled"]), None)
        plain_compiled = next((r["tokens_per_s"] for r in records if r["method"] == "plain" and r["compiled"]), None)
        lines += ["## Live, batch 1", ""]
        rows = []
        for r in records:
            label = r["method"] if r["rule"] is None else f"`{r['rule']}`"
            rows.append([label, r.get("draft", ""), "compiled" if r["compiled"] else "eager",
                         f"{r['tokens_per_s']:.1f}", f"{r['tau']:.2f}" if "tau" in r else "–",
                         f"{r['tokens_per_s'] / plain_eager:.2f}×" if plain_eager else "–",
                         f"{r['tokens_per_s'] / plain_compiled:.2f}×" if plain_compiled else "–",
                         f"{r['overhead_ms']:.2f}" if "overhead_ms" in r else "–",
                         f"{r['agrees_with_plain']:.0%}" if "agrees_with_plain" in r else "–"])
        lines += markdown.table(["method", "draft", "", "tok/s", "τ", "of plain eager", "of plain compiled",
                                 "host ms / round", "text as plain's*"], rows)
        lines += ["", "\\* the share of new tokens before the first difference from plain decoding's text (same "
                  "mode, same prompt); bf16 rounding can part greedy texts at a near tie of random weights.", ""]
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
    if not parts or set(parts) - {"eager", "batched", "compiled"}:
        raise SystemExit(f"--parts: {args.parts!r}; allowed a comma-separated subset of eager,batched,compiled")
    acceptance_sets = json.loads(args.acceptance.read_text(encoding="utf-8"))["sets"]
    machine = report.machine_info()
    if torch.device(args.device).type == "cuda":
        machine["device_name"] = torch.cuda.get_device_name(args.device)
    results = {"setup": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
               "machine": machine, "step_seconds": {}}
    started = time.perf_counter()
    target = random_model(args.target, dtype, args.device, args.seed)
    independent = random_model(args.draft, dtype, args.device, args.seed + 1)
    records = results["live"] = []
    plain_text = {}

    def add(record: dict) -> dict:
        """A live record, its text compared with plain decoding's of the same mode, then dropped."""
        key = (record["compiled"], record["new_tokens"])
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
        add({**live(target, target, args, timer, "stock"), "draft": "target's weights"})
        for rule in spec_rules:
            add({**live(target, target, args, timer, "semspec", rule), "draft": "target's weights"})
        add({**live(target, independent, args, timer, "semspec", "exact", new_tokens=max(8, args.new_tokens // 4)),
             "draft": "independent"})
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

    # 3. Live, batch 1, compiled: plain decoding, then every rule with the independent draft, each run's forwards
    # timed (`exact`'s give the compiled costs: the draft's step and the verify forward at γ).
    if "compiled" in parts:
        add(live(target, None, args, timer, "plain", compiled=True))
        for rule in spec_rules:
            times = ForwardTimes(args.device)
            record = add({**live(target, independent, args, timer, "semspec", rule, compiled=True, times=times),
                          "draft": "independent"})
            record["draft_step_ms"] = times.median_ms(1, 1)
            record["verify_ms"] = times.median_ms(args.gamma + 1, args.gamma + 1)
            # `exact`'s run gives the compiled costs (`dropmatch`'s target forward stays eager: its hook)
            if rule == "exact" and None not in (record["draft_step_ms"], record["verify_ms"]):
                costs["draft_step_compiled"] = record["draft_step_ms"]
                costs["verify_compiled"] = {args.gamma: record["verify_ms"]}
            write(args, results)
        step_started = done("compiled", step_started)

    # The host's share of each live speculative round: its time less the draft steps, verify and verification.
    for r in records:
        if "round_ms" not in r:
            continue
        mode = "compiled" if r["compiled"] else "eager"
        if f"verify_{mode}" not in costs:
            continue
        step = costs[f"draft_step_{mode}"] if r["draft"] == "independent" else costs["target_step_eager"]
        r["overhead_ms"] = r["round_ms"] - (args.gamma * step + interpolated(costs[f"verify_{mode}"], args.gamma)
                                            + costs["verification"][r["rule"]])

    # Modeled at the reference acceptance, for each mode whose plain run and costs were measured (host time: the
    # live `exact` run's per round: the target drafting for itself eager, the independent draft compiled).
    plain = {r["compiled"]: r["tokens_per_s"] for r in records if r["method"] == "plain"}
    results["modeled"] = model = {}
    for set_name, reference in acceptance_sets.items():
        acceptance = reference["per_position_acceptance"]
        entry = {"source": reference["source"]}
        for compiled, mode in ((False, "eager"), (True, "compiled")):
            if compiled not in plain or f"verify_{mode}" not in costs:
                continue
            overhead = next((r["overhead_ms"] for r in records if r.get("rule") == "exact"
                             and r["compiled"] == compiled and "overhead_ms" in r
                             and r["draft"] == ("independent" if compiled else "target's weights")), 0.0)
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
    write(args, results)
    print(render(results))
    return results


if __name__ == "__main__":
    main()
