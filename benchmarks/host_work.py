"""The host's work in a compiled round, counted: what a host-free GPU round has to remove (issue 59).

    python benchmarks/host_work.py                   # CPU: the reference shapes' layer counts at width 64, inductor
    python benchmarks/host_work.py --device cuda --width 0 --target qwen2.5-7b   # a GPU, the real shapes

Plain compiled decoding (per token) and speculative `exact` with the independent random draft (per round, γ =
`--gamma`), greedy, static caches, compiled forwards, at each of `--batch-sizes`. From one call under torch.profiler:

- `compiled_calls`: calls into torch.compile'd code ("Torch-Compiled Region" ranges);
- `launches`: eager ATen ops outside them that do work (on a GPU: launch a kernel or copy), by the loop's named range
  (`draft`, `target_forward`, `logits_processors`, `verify`, `sync`; `rest`: the loop's own code between them, and all
  of plain decoding's). Ops that only make views or read metadata (`VIEW_OPS`) and ops nested in another op are not
  counted;
- `host_ms_outside`: profiled wall ms outside the compiled calls (Python, eager ops, and dynamo's guard checks before
  each compiled call: on a GPU, the host work that the device waits for unless it is busy with earlier work), and
  `ms_inside` the compiled calls (on a GPU their host side, e.g. the CUDA-graph replay; on a CPU also their kernels,
  which are tiny at width 64);
- `between_rounds_ms` (speculative runs): the median host ms from the end of a round's read (`hf_semspec.sync`) to
  the next compiled call, the next round's first draft step: the loop's work between rounds (settling rows,
  statistics, the batch's bookkeeping, the next round's set-up), during which a GPU has nothing queued;

and from the same call unprofiled, `wall_ms`. Each figure but `between_rounds_ms` (the longer call's median) is the
difference between a call of `--new-tokens` and one of a third as many, over the difference of their rounds (tokens
for plain decoding), so set-up, the prefill and the output are not counted. Random weights: the draft is almost never
right (α ≈ 0), so a round drafts γ tokens and keeps one, and both calls end in the same shorter rounds near
`max_new_tokens`, which the difference cancels.

At `--width 64` (default on a CPU) the models keep the reference shapes' layer counts (28 and 24) and heads' layout but
are 64 wide with a 512-token vocabulary, so the kernels are tiny and what is timed is the host's: the Python and the
launch path a GPU run also has. The launch counts are the device's too; the milliseconds are a CPU's, not a GPU's.
Results: `<output-dir>/host-work-<device>.{json,md}`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from benchmarks import markdown, profiling, report  # noqa: E402
from benchmarks import gpu  # noqa: E402
from benchmarks.gpu import SHAPES  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
RANGES = profiling.LOOP_RANGES


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-7b", choices=sorted(SHAPES))
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--width", type=int, default=None,
                        help="hidden size of both models, 0 for the real shapes (default: 64 on a CPU, 0 elsewhere)")
    parser.add_argument("--dtype", default=None, help="default: float32 on a CPU, bfloat16 elsewhere")
    parser.add_argument("--gamma", type=int, default=5)
    parser.add_argument("--batch-sizes", default="1")
    parser.add_argument("--prompt-length", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--compile-backend", default="inductor")
    parser.add_argument("--compile-mode", default=None,
                        help="torch.compile mode, 'none' for the backend's default (default: reduce-overhead on a "
                             "GPU, none elsewhere)")
    parser.add_argument("--output-dir", type=Path, default=REPO_ROOT / "benchmarks" / "results" / "gpu")
    parser.add_argument("--name", default=None, help="results name (default host-work-<device>)")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def narrowed(shape: str, width: int) -> dict:
    """The `gpu.random_model` overrides that keep `shape`'s layer count and head layout at `width` (16-wide heads, a
    512-token vocabulary); none for `width` 0, the real shape."""
    if not width:
        return {}
    heads, kv_heads = SHAPES[shape]["num_attention_heads"], SHAPES[shape]["num_key_value_heads"]
    return dict(hidden_size=width, intermediate_size=2 * width, vocab_size=512,
                num_attention_heads=max(width // 16, 1), num_key_value_heads=max(width // 16 * kv_heads // heads, 1))


def call_lengths(args) -> tuple[int, int]:
    """The new tokens of the shorter and the longer call, whose difference is measured."""
    return max(args.new_tokens // 3, args.gamma + 2), args.new_tokens


def measure(target, draft, args, batch_size: int, speculative: bool) -> dict:
    """Per round (per token for plain decoding): the difference between a long and a short call."""
    prompt = torch.randint(1, 500, (batch_size, args.prompt_length), generator=torch.Generator().manual_seed(args.seed))
    prompt = prompt.to(args.device)
    kwargs = dict(do_sample=False, cache_implementation="static", compile_config=gpu.compile_config(args),
                  return_dict_in_generate=True)
    if speculative:
        kwargs.update(assistant_model=draft, acceptance="exact", num_assistant_tokens=args.gamma,
                      draft_length="constant")
    lengths = call_lengths(args)

    def call(new_tokens: int):
        out = target.generate(prompt, max_new_tokens=new_tokens, **kwargs)
        if torch.device(args.device).type == "cuda":
            torch.cuda.synchronize(args.device)
        if speculative:
            return out.acceptance_stats.num_target_forwards
        return out.sequences.shape[1] - prompt.shape[1]

    with torch.no_grad():
        for new_tokens in reversed(lengths):  # compiles every shape (the longer first: transformers keeps its cache)
            call(new_tokens)
        figures = []
        for new_tokens in lengths:
            walls = []
            for _ in range(3):
                started = time.perf_counter()
                rounds = call(new_tokens)
                walls.append((time.perf_counter() - started) * 1e3)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                started = time.perf_counter()
                call(new_tokens)
                profiled_ms = (time.perf_counter() - started) * 1e3
            figures.append(dict(rounds=rounds, wall_ms=statistics.median(walls), profiled_ms=profiled_ms,
                                **profiling.host_counts(prof)))
    short, long = figures
    rounds = long["rounds"] - short["rounds"]

    def per(key):
        return (long[key] - short[key]) / rounds

    gaps = long["gaps_ms"]
    launches = {where: (long["launches"].get(where, 0) - short["launches"].get(where, 0)) / rounds
                for where in (*RANGES, "rest")}
    return {
        "method": "exact" if speculative else "plain", "batch_size": batch_size,
        "gamma": args.gamma if speculative else None, "unit": "round" if speculative else "token",
        "rounds_counted": rounds, "wall_ms": per("wall_ms"), "compiled_calls": per("compiled_calls"),
        "launches": sum(launches.values()), "launches_by_range": launches,
        "ms_inside": per("ms_inside"), "host_ms_outside": per("profiled_ms") - per("ms_inside"),
        "between_rounds_ms": statistics.median(gaps) if gaps else None,
    }


def render(results: dict) -> str:
    setup = results["setup"]
    lines = [
        "# Host work per compiled round", "",
        f"Target `{setup['target']}`, draft `{setup['draft']}`"
        + (f" at width {setup['width']} (their layer counts; 512-token vocabulary)" if setup["width"] else "")
        + f", {setup['dtype']}, {setup['device']}, `{setup['compile_backend']}`"
        + (f" `{setup['compile_mode']}`" if setup["compile_mode"] not in (None, "none") else "")
        + f", γ = {setup['gamma']}, greedy, static caches; per round (plain decoding: per token), the difference of "
        "two calls (benchmarks/host_work.py says how each figure is taken).", "",
    ]
    header = ["method", "batch", "unit", "compiled calls", "launches outside", *RANGES, "rest",
              "host ms outside", "between rounds ms", "ms inside compiled", "wall ms"]
    rows = []
    for r in results["records"]:
        rows.append([r["method"], str(r["batch_size"]), r["unit"], f"{r['compiled_calls']:.1f}", f"{r['launches']:.1f}",
                     *(f"{r['launches_by_range'][k]:.1f}" for k in (*RANGES, "rest")),
                     f"{r['host_ms_outside']:.2f}",
                     "–" if r["between_rounds_ms"] is None else f"{r['between_rounds_ms']:.2f}",
                     f"{r['ms_inside']:.2f}", f"{r['wall_ms']:.2f}"])
    lines += markdown.table(header, rows)
    machine = results["machine"]
    lines += ["", f"Machine: {machine.get('cpu_model', '?')} ({machine.get('cpu_cores', '?')} cores), torch "
              f"{machine.get('torch', '?')}, transformers {machine.get('transformers', '?')}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    on_gpu = torch.device(args.device).type == "cuda"
    if args.width is None:
        args.width = 0 if on_gpu else 64
    args.dtype = args.dtype or ("bfloat16" if on_gpu else "float32")
    args.compile_mode = args.compile_mode or ("reduce-overhead" if on_gpu else "none")  # (gpu.compile_config's form)
    short, long = call_lengths(args)
    if short >= long:
        raise SystemExit(f"--new-tokens {args.new_tokens}: at least 3·(γ + 2) = {3 * (args.gamma + 2)} at --gamma "
                         f"{args.gamma}, so that the shorter call's {short} tokens are fewer. Fix: pass "
                         f"--new-tokens {3 * (args.gamma + 2)} or more")
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    dtype = getattr(torch, args.dtype)
    target = gpu.random_model(args.target, dtype, args.device, args.seed, **narrowed(args.target, args.width))
    draft = gpu.random_model(args.draft, dtype, args.device, args.seed + 1, **narrowed(args.draft, args.width))
    results = {"setup": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
               "machine": report.machine_info(), "records": []}
    for batch_size in [int(b) for b in args.batch_sizes.split(",") if b]:
        for speculative in (False, True):
            record = measure(target, draft, args, batch_size, speculative)
            results["records"].append(record)
            print(json.dumps(record), flush=True)
    name = args.name or f"host-work-{'gpu' if on_gpu else 'cpu'}"
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / f"{name}.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    (args.output_dir / f"{name}.md").write_text(render(results), encoding="utf-8")
    return results


if __name__ == "__main__":
    main()
