"""Each rule's speed/fidelity frontier on the reference pair: `hf_semspec.compare` over a grid of options, in slices.

    python benchmarks/frontier.py run --grid fly --gsm8k-problems 0:10          # one slice (--dry-run: the plan)
    F=benchmarks/results/fidelity/frontier
    python benchmarks/frontier.py dominated $F/slice-greedy-*-gsm8k-0-10.json
    python benchmarks/frontier.py merge $F/slice-greedy-*-gsm8k-*.json --name greedy-gsm8k

`run` decodes one slice: `exact` and the chosen configurations (`--grid fly|ears|dropmatch|all`, several
comma-separated, and/or `--configs`, less `--skip`) on one set of prompts (`--gsm8k-problems START:END`, or
`--spec-bench quick` with an optional `--spec-bench-prompts START:END`), greedy or `--sample`, 512 new tokens, in one
`compare()` call: the configurations are interleaved per prompt in a rotating order, so the speed-up over `exact` is
a ratio within the slice, and one timed call per prompt and configuration (`--repeats 1`) is enough on a CPU. Every
slice runs `exact`: its rules' speed-ups and flips are against that one. On GSM8K the scorer is the answer match
(`metrics.parse_final_number` of the output against the reference number, 1 or 0). Each configuration runs at its
rule's own γ (`default_num_draft_tokens`: `fly` 15, `exact` and the others 5), as `generate()` picks it when no
`num_assistant_tokens` is given. Sampled, prompt i of the source is seeded with `--seed` + i whichever slice runs it.
A slice's JSON (`<output-dir>/slice-<greedy|sample-sSEED>-<grids>-<source>.json`) keeps `compare()`'s whole report
(every prompt's output, speed-up, NLL increase, score, τ) with the prompts' ids; a slice stopped part way is lost.

`merge` pools slices of one setting (models, decoding, token budget, data source) into `frontier-<name>.{json,md,png}`:
per configuration the speed-up over `exact` (geometric mean of the per-prompt ratios, 95% interval), the target's NLL
increase over `exact` (mean, 95% interval), the identical share, the answer flips against `exact` (GSM8K), τ (new
tokens per target forward, pooled) and the points of the same rule that dominate it (a higher speed-up *and* a lower
NLL increase, on the prompts the two share); the plot is speed-up against NLL increase, a line per rule through its
undominated points from `exact` at (0, 1) (needs matplotlib, the `benchmarks` extra, or `--no-plot`).

Each rule's default setting (the options and γ a rule takes today when none are given) is marked "(default)" in
the table and ringed in the plot.

`dominated` lists the grid points the slices show to be dominated (on the prompts every configuration ran, or
`--gsm8k-problems`), and the `--skip` value that leaves them out of later slices.

The plan (issue 60). Grids: `fly` θ ∈ {0.3, 0.6, 1.0} × W ∈ {4, 6}, `ears` β ∈ {0.1, 0.3, 0.5}, `dropmatch`
min_votes ∈ {1, 2, 3}: 12 points. Time: about 75 s per configuration and GSM8K problem greedy (the fidelity slices
measured 68-71 s, 4.6 tok/s, on the 2-core AVX2 CPU; plus the NLL forward), 90 s sampled, an estimated 100 s per
Spec-Bench prompt (longer answers); `--dry-run` prints a slice's expected minutes, each slice records `elapsed_s`
(slower than that: fewer prompts a slice).

    F=benchmarks/results/fidelity/frontier; run="python benchmarks/frontier.py run"
    # G1, G2: every point on GSM8K 0-9, 7 configurations × 10 × 75 s ≈ 88 min each
    $run --grid fly --gsm8k-problems 0:10
    $run --grid ears,dropmatch --gsm8k-problems 0:10
    python benchmarks/frontier.py dominated $F/slice-greedy-*-gsm8k-0-10.json  # prints --skip LIST: SKIP=LIST
    # the k survivors together on GSM8K 10-29, n problems a slice (below), e.g. k ≤ 6: 10:20 and 20:30
    $run --grid all --skip "$SKIP" --gsm8k-problems 10:20
    $run --grid all --skip "$SKIP" --gsm8k-problems 20:30
    python benchmarks/frontier.py merge $F/slice-greedy-*-gsm8k-*.json --name greedy-gsm8k
    # Spec-Bench quick (10 prompts, 512 tokens), the same survivors, e.g. k ≤ 9: two halves
    $run --grid all --skip "$SKIP" --spec-bench quick --spec-bench-prompts 0:5
    $run --grid all --skip "$SKIP" --spec-bench quick --spec-bench-prompts 5:10
    python benchmarks/frontier.py merge $F/slice-greedy-*-specbench-quick-*.json --name greedy-specbench
    # sampling: each rule's chosen setting (its default), GSM8K 0-19, one seed, 4 configurations × 10 × 90 s a slice
    CHOSEN=fly,ears,dropmatch
    $run --configs "$CHOSEN" --sample --temperature 0.7 --top-p 0.9 --seed 0 --gsm8k-problems 0:10
    $run --configs "$CHOSEN" --sample --temperature 0.7 --top-p 0.9 --seed 0 --gsm8k-problems 10:20
    python benchmarks/frontier.py merge $F/slice-sample-s0-*-gsm8k-*.json --name sample-gsm8k

What ran (results/README.md): G1 and G2 (G1 in two slices, 0-3 and 3-10, the second without θ 1.0 W 6, equal to
θ 1.0 W 4 on 0-2); `dropmatch@min_votes=1` was the one point dominated. The defaults were chosen from them, then the
sampled slice on 0-9 with `CHOSEN` and Spec-Bench quick 0-4 with `--configs fly`. GSM8K 10-29, Spec-Bench's other
half and the sampled 10-19 did not fit the CPU time. Issue 67, on the AVX-512 BF16 CPU (2 threads; slices record
their ISA and threads, and `merge` refuses to pool another's): `--grid ensemble --configs
transformers@assistant_ensemble_weight=0.5,fly` on GSM8K 0-4 (38 min); 5-9 and Spec-Bench quick not run.

After G1 and G2, with k of the 12 points left: a GSM8K slice of n problems takes (k + 1) × n × 75 s, a Spec-Bench
one (k + 1) × n × 100 s, n the most under 90 minutes; in all 295 min + (k + 1) × 42 min of CPU time.

    k left    GSM8K 10-29: n, slices    Spec-Bench: n, slices    slices in all    CPU time
    ≤ 6       10, 2                     5, 2                     8                9.8 h at k = 6
    7-8       8-9, 3                    5-6, 2                   9                11 h at k = 8
    9         7, 3                      5, 2                     9                12 h
    10-11     6, 4                      4, 3                     11               13 h at k = 11
    12        5, 4                      4, 3                     11               14 h
"""

from __future__ import annotations

import os

# Before torch is imported, as benchmarks/run.py (whose docstring says why).
os.environ.setdefault("MKL_CBWR", "AUTO")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterable, Mapping, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks import data, markdown, metrics, models, report as machine  # noqa: E402
from hf_semspec.comparison import (  # noqa: E402
    REFERENCE,
    STOCK,
    Configuration,
    compare,
    geometric_mean_interval,
    mean_interval,
    parse_configuration,
)
from hf_semspec.errors import SemSpecConfigError, invalid_value  # noqa: E402
from hf_semspec.rules import RULES  # noqa: E402

DEFAULT_OUTPUT_DIR = data.REPO_ROOT / "benchmarks" / "results" / "fidelity" / "frontier"
SLICE_KIND = "frontier-slice"
REPORT_KIND = "frontier-report"
DEFAULT_MAX_NEW_TOKENS = 512

# The grids (issue 60). fly's γ is its rule default, 15; the others run at theirs, 5, as `exact` does.
GRIDS: dict[str, list[str]] = {
    "fly": [f"fly@entropy_threshold={theta}@window={window}" for window in (4, 6) for theta in (0.3, 0.6, 1.0)],
    "ears": [f"ears@beta={beta}" for beta in (0.1, 0.3, 0.5)],
    "dropmatch": [f"dropmatch@min_votes={votes}" for votes in (1, 2, 3)],
    # issue 67: transformers' own lossy rule, run by hf_semspec's loop
    "ensemble": [f"ensemble@weight={weight}" for weight in (0.3, 0.5, 0.7)],
}
# Stock transformers' own `assistant_ensemble_weight` through its own generate() (compare's peer configuration, at
# hf_semspec's γ), a row beside `ensemble` at the same weight: --configs transformers@assistant_ensemble_weight=W.
PEER = "transformers@assistant_ensemble_weight={weight}"
GRID_NAMES = (*GRIDS, "all")

# Seconds one configuration takes on one prompt (decoding plus its share of the NLL forward), for the plan printed
# before a slice runs (`--dry-run`). Measured on the 2-core AVX2 CPU of benchmarks/results/fidelity/ at 512 tokens:
# greedy 68-71 s per rule and GSM8K problem (about 4.6 tok/s, ~320 new tokens), sampled 84-97 s. Spec-Bench's answers
# run longer (most reach 512 tokens): an estimate, not a measurement.
SECONDS_PER_CALL = {("gsm8k", False): 75.0, ("gsm8k", True): 90.0,
                    ("spec-bench", False): 100.0, ("spec-bench", True): 110.0}
SLICE_BUDGET_S = 90 * 60  # issue 60: slices of at most about 90 minutes

# Short labels of the grid's options, for the plot.
OPTION_LABELS = {"entropy_threshold": "θ", "window": "W", "beta": "β", "min_votes": "votes"}
RULE_COLOURS = {"fly": "tab:blue", "ears": "tab:orange", "dropmatch": "tab:green", "rdk": "tab:red",
                "ensemble": "tab:purple", STOCK: "tab:gray"}


# ---------------------------------------------------------------------------------------------------------------------
# Configurations: the grids, --configs and --skip
# ---------------------------------------------------------------------------------------------------------------------


def grid_configurations(grid: str) -> list[str]:
    """The configurations of named grids: `fly`, `ears`, `dropmatch`, `all` (every grid, in order), or several,
    comma-separated (`ears,dropmatch`), in the order given."""
    names = split_entries(grid)
    if not names or any(name not in GRID_NAMES for name in names):
        raise invalid_value("--grid", grid, f"one or more (comma-separated) of {', '.join(GRID_NAMES)}",
                            "pass e.g. --grid fly or --grid ears,dropmatch")
    out = []
    for name in names:
        out += [c for c in (sum(GRIDS.values(), []) if name == "all" else GRIDS[name]) if c not in out]
    return out


def split_entries(text: str | None) -> list[str]:
    """`"a,b"` → ["a", "b"]: a comma-separated list of configurations (blank entries dropped)."""
    return [entry.strip() for entry in (text or "").split(",") if entry.strip()]


def _key(entry: str | Configuration) -> str:
    configuration = parse_configuration(entry)
    return configuration.key


def select_configurations(grid: str | None, configs: Sequence[str] = (), skip: Sequence[str] = ()) -> list[str]:
    """The relaxed configurations a slice runs (`exact` runs anyway): the grid's, then `configs`, without `skip`.

    Each entry is checked as `compare()` checks it (a bad rule or option is an error naming it). A configuration given
    twice (also as two spellings of one setting) is run once; a `skip` entry that is not in the selection is an error
    (a typo would otherwise run the point it meant to skip); no configuration left is an error."""
    chosen: dict[str, str] = {}
    for entry in (grid_configurations(grid) if grid else []) + list(configs):
        key = _key(entry)
        if key != _key(REFERENCE):
            chosen.setdefault(key, entry)
    for entry in skip:
        key = _key(entry)
        if key not in chosen:
            raise invalid_value("--skip", entry, f"one of the selected configurations: {', '.join(chosen.values())}",
                                "skip only points of this slice's --grid / --configs (spelled as `dominated` "
                                "prints them)")
        del chosen[key]
    if not chosen:
        raise invalid_value("--grid / --configs", grid or ",".join(configs),
                            f"at least one configuration besides exact: a grid ({', '.join(GRID_NAMES)}) or "
                            "--configs rule@option=value,...", "pass --grid fly, or --configs with what --skip leaves")
    return list(chosen.values())


def rule_gamma(configuration: str, num_assistant_tokens: int | None) -> int:
    """The γ a configuration runs at: `num_assistant_tokens` where given (every configuration alike), else its rule's
    `default_num_draft_tokens`."""
    if num_assistant_tokens is not None:
        return num_assistant_tokens
    rule = parse_configuration(configuration).rule
    return RULES.get(REFERENCE if rule == STOCK else rule).default_num_draft_tokens  # (stock: at exact's γ)


def option_label(options: Mapping) -> str:
    """`{"entropy_threshold": 0.3, "window": 4}` → `"θ0.3 W4"` (the plot's point labels)."""
    return " ".join(f"{OPTION_LABELS.get(k, k + '=')}{v}" for k, v in options.items()) or "defaults"


# ---------------------------------------------------------------------------------------------------------------------
# Prompts and the scorer
# ---------------------------------------------------------------------------------------------------------------------


def select_prompts(args: argparse.Namespace) -> tuple[list[data.Prompt], dict]:
    """The slice's prompts and a description of where they come from: `{"kind": "gsm8k", "problems": [s, e]}` or
    `{"kind": "spec-bench", "profile": ..., "prompts": [s, e] or None}`. `offset` is the first prompt's index in its
    source: prompt i of the slice is seeded with `--seed` + offset + i, so a sampled slice draws what a run over the
    whole source draws on its prompts."""
    if args.gsm8k_problems is not None:
        start, end = args.gsm8k_problems
        prompts = data.load_gsm8k_slice(args.data_dir / data.GSM8K_FILE, start, end, args.max_new_tokens)
        return prompts, {"kind": "gsm8k", "problems": [start, end], "offset": start, "label": f"gsm8k-{start}-{end}"}
    from benchmarks.run import PROFILES  # the profiles' selection rules live there

    profile = PROFILES[args.spec_bench]
    pool = data.load_question_prompts(args.data_dir / data.SPECBENCH_FILE, args.max_new_tokens)
    pool, _ = data.drop_long(pool, profile.max_prompt_chars)
    prompts = data.select_balanced(pool, profile.per_category, profile.selection)
    label, offset, window = f"specbench-{args.spec_bench}", 0, None
    if args.spec_bench_prompts is not None:
        start, end = args.spec_bench_prompts
        if end > len(prompts):
            raise invalid_value("--spec-bench-prompts", f"{start}:{end}",
                                f"START:END within the {len(prompts)} prompts of the {args.spec_bench} profile",
                                f"pass an END of at most {len(prompts)}")
        prompts, offset, window, label = prompts[start:end], start, [start, end], f"{label}-{start}-{end}"
    return prompts, {"kind": "spec-bench", "profile": args.spec_bench, "prompts": window, "offset": offset,
                     "label": label}


def gsm8k_scorer(decode: Callable[[Sequence[int]], str]) -> Callable[[Mapping, object], float]:
    """`score(prompt, output)` for `compare()`: 1.0 when the output's final number (`metrics.parse_final_number`, as
    benchmarks/run.py grades GSM8K) is the prompt's reference `gold`, else 0.0. `output` is the list of new token ids
    (compare() gets no tokenizer here: the pair's chat encoder has it), decoded with `decode`."""

    def score(prompt: Mapping, output: object) -> float:
        text = output if isinstance(output, str) else decode(list(output))
        return float(metrics.parse_final_number(text) == prompt["gold"])

    return score


def estimate_seconds(num_configurations: int, num_prompts: int, kind: str, sample: bool, max_new_tokens: int) -> float:
    """The expected wall time of a slice: configurations (with `exact`) × prompts × `SECONDS_PER_CALL`, scaled by the
    token budget where it is under 512 (answers longer than the budget are cut)."""
    per_call = SECONDS_PER_CALL[kind, bool(sample)] * min(1.0, max_new_tokens / DEFAULT_MAX_NEW_TOKENS)
    return num_configurations * num_prompts * per_call


# ---------------------------------------------------------------------------------------------------------------------
# run: one slice
# ---------------------------------------------------------------------------------------------------------------------


def default_slice_name(args: argparse.Namespace, source: dict) -> str:
    """`slice-<greedy|sample-s<seed>>-<grid or configs>-<source>`, e.g. `slice-greedy-fly-gsm8k-0-10`."""
    mode = f"sample-s{args.seed}" if args.sample else "greedy"
    grid = "-".join(split_entries(args.grid))
    what = grid if grid and not args.configs else "configs" if not grid else f"{grid}-configs"
    return f"slice-{mode}-{what}-{source['label']}"


def run_slice(args: argparse.Namespace, load_pair: Callable[..., models.ModelPair]) -> dict:
    """Runs one slice and writes `<output-dir>/<name>.json` and `.md`; with `--dry-run`, prints the plan only."""
    configurations = select_configurations(args.grid, split_entries(args.configs), split_entries(args.skip))
    prompts, source = select_prompts(args)
    name = args.name or default_slice_name(args, source)
    path = args.output_dir / f"{name}.json"
    seconds = estimate_seconds(len(configurations) + 1, len(prompts), source["kind"], args.sample, args.max_new_tokens)
    gammas = {c: rule_gamma(c, args.num_assistant_tokens) for c in [REFERENCE, *configurations]}
    print(f"{name}: {len(prompts)} prompts ({source['label']}) × {len(configurations) + 1} configurations: "
          + ", ".join(f"{c} (γ {g})" for c, g in gammas.items())
          + f"; expected about {seconds / 60:.0f} min on the reference CPU"
          + (f", over the {SLICE_BUDGET_S // 60}-min slice budget: split the prompts" if seconds > SLICE_BUDGET_S
             else ""), flush=True)
    if args.dry_run:
        return {"name": name, "configurations": configurations, "prompts": [p.prompt_id for p in prompts],
                "gammas": gammas, "expected_seconds": seconds}
    if path.exists() and not args.overwrite:
        raise FileExistsError(f"{path} exists. Fix: pass another --name, or --overwrite to replace it.")
    torch.set_num_threads(args.threads)
    pair = load_pair(args.pair)
    if args.num_assistant_tokens is None:
        # generate() reads γ from the call, else the target's generation config, else the draft's, else the rule's
        # default: the rules' own γ (fly 15, exact 5) needs the two configs unset.
        for role, model in (("target", pair.target), ("draft", pair.draft)):
            if getattr(model.generation_config, "num_assistant_tokens", None) is not None:
                print(f"the {role}'s generation_config.num_assistant_tokens "
                      f"({model.generation_config.num_assistant_tokens}) reset to None: each rule runs at its own γ",
                      file=sys.stderr)
                model.generation_config.num_assistant_tokens = None
    items = [{"input_ids": pair.encode(p.text)["input_ids"][0].tolist(), "prompt_id": p.prompt_id, "gold": p.gold}
             for p in prompts]
    scorer = gsm8k_scorer(pair.decode) if source["kind"] == "gsm8k" else None
    decoding = {"max_new_tokens": args.max_new_tokens, "do_sample": bool(args.sample)}
    if args.sample:
        decoding.update({k: v for k, v in (("temperature", args.temperature), ("top_p", args.top_p)) if v is not None})
    if args.num_assistant_tokens is not None:
        decoding["num_assistant_tokens"] = args.num_assistant_tokens
    seed = args.seed + source["offset"]
    machine_before = machine.machine_info()
    if args.warmup_max_new_tokens:
        # Untimed and short (compare()'s own warm-up would decode the whole budget once per configuration): weights
        # paged in, kernels chosen, and a configuration that cannot run fails here, before the long part.
        compare(pair.target, pair.draft, items[:1], rules=configurations, repeats=1, seed=seed, warmup=False,
                progress=False, **{**decoding, "max_new_tokens": args.warmup_max_new_tokens})
    started = time.perf_counter()
    result = compare(pair.target, pair.draft, items, rules=configurations, score=scorer, repeats=args.repeats,
                     seed=seed, warmup=False, progress=not args.no_progress, **decoding)
    elapsed = time.perf_counter() - started
    report = result.to_dict()
    for row in report["configurations"]:
        for entry in row["per_prompt"]:
            entry["text"] = pair.decode(entry["new_token_ids"])  # compare() had no tokenizer: the text, for reading
    results = {
        "kind": SLICE_KIND,
        "name": name,
        "grid": args.grid,
        "configs": split_entries(args.configs),
        "skip": split_entries(args.skip),
        "configurations": [{"name": c, "gamma": gammas[c]} for c in [REFERENCE, *configurations]],
        "source": source,
        "prompt_ids": [p.prompt_id for p in prompts],
        "golds": [p.gold for p in prompts],
        "scorer": "GSM8K answer match (metrics.parse_final_number == gold)" if scorer else None,
        "decoding": {**decoding, "seed": args.seed if args.sample else None},
        "repeats": args.repeats,
        "models": {"pair": args.pair, "target": pair.target_name, "draft": pair.draft_name, **pair.info},
        "machine": {**machine_before, "load_average_end": os.getloadavg() if hasattr(os, "getloadavg") else None},
        "elapsed_s": elapsed,
        "expected_s": seconds,
        "report": report,
    }
    args.output_dir.mkdir(parents=True, exist_ok=True)
    markdown.write_json(path, results)
    header = (f"# Frontier slice `{name}`\n\n{pair.target_name} / {pair.draft_name}; {source['label']}; "
              f"{elapsed / 60:.1f} min (expected {seconds / 60:.0f}). γ: "
              + ", ".join(f"`{c}` {g}" for c, g in gammas.items()) + ".\n\n")
    (args.output_dir / f"{name}.md").write_text(header + result.to_markdown(), encoding="utf-8")
    print(result.to_markdown())
    print(f"wrote {path} ({elapsed / 60:.1f} min)", file=sys.stderr)
    return results


# ---------------------------------------------------------------------------------------------------------------------
# Reading slices back: per configuration, per prompt
# ---------------------------------------------------------------------------------------------------------------------


def load_slice(path: Path) -> dict:
    """A slice's JSON; anything else (a merged report, a run.py result) is an error naming the file and the fix."""
    results = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(results, dict) or results.get("kind") != SLICE_KIND:
        found = results.get("kind") if isinstance(results, dict) else type(results).__name__
        raise ValueError(f"{path}: expected a frontier slice (kind {SLICE_KIND!r}, from `frontier.py run`), got "
                         f"{found or 'a file without a kind'}. Fix: pass the slice JSONs, not a merged report.")
    return results


def slice_isa(results: dict) -> str:
    """The CPU's ISA a slice ran on (`report.cpu_isa`); slices written before it was recorded say so (they ran on
    the 2-core AVX2 CPU of benchmarks/results/fidelity/)."""
    return (results.get("machine") or {}).get("cpu_isa") or "not recorded"


def slice_setting(results: dict) -> dict:
    """What two slices must share to be pooled: models, decoding (seed included), repeats, the data source, and the
    CPU's ISA and thread count (a speed-up measured on AVX2 is not one measured with AVX-512 BF16)."""
    source = results["source"]
    threads = (results.get("machine") or {}).get("torch_threads")
    return {"models": {k: results["models"].get(k) for k in ("target", "draft", "target_dtype", "draft_dtype")},
            "decoding": results["decoding"],
            "source": source["kind"] if source["kind"] == "gsm8k" else f"spec-bench {source['profile']}",
            "cpu": f"{slice_isa(results)}, {threads} thread{'s' if threads != 1 else ''}"}


def configuration_records(results: dict) -> dict[str, dict]:
    """`{key: {"name", "rule", "options", "gamma", "prompts": {prompt_id: record}}}` of one slice, a record holding
    what `merge` pools: `speedup`, `nll_increase`, `identical`, `first_divergence`, `score` and `exact`'s
    (`exact_score`), `new_tokens`, `forwards` (new tokens / the prompt's τ: τ is new tokens per target forward at
    batch 1), `seconds`, and the slice's name."""
    ids = results["prompt_ids"]
    gammas = {c["name"]: c["gamma"] for c in results["configurations"]}
    rows = results["report"]["configurations"]
    exact = next(row for row in rows if row["name"] == REFERENCE)
    exact_scores = {p["prompt_index"]: p["score"] for p in exact["per_prompt"]}
    out: dict[str, dict] = {}
    for row in rows:
        configuration = Configuration(row["rule"], dict(row["options"]))
        entry = out.setdefault(configuration.key, {"name": row["name"], "rule": row["rule"],
                                                   "options": dict(row["options"]),
                                                   "gamma": gammas.get(row["name"]), "prompts": {}})
        for p in row["per_prompt"]:
            entry["prompts"][ids[p["prompt_index"]]] = {
                "slice": results["name"],
                "speedup": p["speedup"],
                "nll_increase": p["nll_increase"],
                "identical": p["identical"],
                "first_divergence": p["first_divergence"],
                "score": p["score"],
                "exact_score": exact_scores[p["prompt_index"]],
                "new_tokens": p["new_tokens"],
                "forwards": round(p["new_tokens"] / p["tau"]) if p["tau"] else 0,
                "seconds": p["seconds"],
            }
    return out


def pool_slices(slices: dict[str, dict]) -> tuple[dict[str, dict], dict]:
    """The slices' records pooled per configuration (`configuration_records`), and their shared setting. Refuses
    slices of other settings and a prompt that two slices ran for one configuration other than `exact` (which every
    slice runs: two grids' slices on one prompt set both hold it; the first slice's record is kept, and each
    configuration's speed-up and flips stay against the `exact` of its own slice)."""
    if not slices:
        raise ValueError("no slices given. Fix: pass the slice JSONs of `frontier.py run`.")
    first_name, first = next(iter(slices.items()))
    setting = slice_setting(first)
    pooled: dict[str, dict] = {}
    for name, results in slices.items():
        other = slice_setting(results)
        differing = [f"{k}: {setting[k]!r} vs {other[k]!r}" for k in setting if setting[k] != other[k]]
        if differing:
            raise ValueError(f"{name} and {first_name} differ in " + "; ".join(differing) + ". Fix: merge slices of "
                             "one setting (models, decoding, seed, data source, CPU ISA and threads) together.")
        for key, entry in configuration_records(results).items():
            target = pooled.setdefault(key, {**entry, "prompts": {}})
            if target["gamma"] != entry["gamma"]:
                raise ValueError(f"{entry['name']} ran at γ {target['gamma']} in one slice and {entry['gamma']} in "
                                 f"{name}. Fix: merge slices run at one γ.")
            for prompt_id, record in entry["prompts"].items():
                if prompt_id in target["prompts"] and entry["rule"] == REFERENCE:
                    continue  # every slice runs exact: slices of other grids on one prompt set share it (first kept)
                if prompt_id in target["prompts"]:
                    earlier = target["prompts"][prompt_id]["slice"]
                    raise ValueError(f"{prompt_id} of {entry['name']} is in both {earlier} and {name}. Fix: merge "
                                     "slices of other prompts.")
                target["prompts"][prompt_id] = record
    return pooled, setting


def summarize(entry: dict, prompt_ids: Iterable[str] | None = None) -> dict:
    """One configuration's figures over its prompts (or those of `prompt_ids` it has)."""
    records = entry["prompts"]
    chosen = sorted(records if prompt_ids is None else set(prompt_ids) & set(records), key=_prompt_order)
    rows = [records[p] for p in chosen]
    speedup, speedup_ci95 = geometric_mean_interval([r["speedup"] for r in rows if r["speedup"] is not None])
    nll_increase, nll_ci95 = mean_interval([r["nll_increase"] for r in rows if r["nll_increase"] is not None])
    divergences = [r["first_divergence"] for r in rows if r["first_divergence"] is not None]
    scored = [r for r in rows if r["score"] is not None and r["exact_score"] is not None]
    new_tokens, forwards = sum(r["new_tokens"] for r in rows), sum(r["forwards"] for r in rows)
    seconds = sum(r["seconds"] for r in rows)
    wins = sum(r["score"] > r["exact_score"] for r in scored)
    losses = sum(r["score"] < r["exact_score"] for r in scored)
    return {
        "name": entry["name"], "rule": entry["rule"], "options": entry["options"], "gamma": entry["gamma"],
        "prompts": len(rows), "prompt_ids": chosen,
        "speedup": speedup, "speedup_ci95": speedup_ci95,
        "nll_increase": nll_increase, "nll_increase_ci95": nll_ci95,
        "identical_share": statistics.fmean(r["identical"] for r in rows) if rows else None,
        "mean_first_divergence": statistics.fmean(divergences) if divergences else None,
        "tau": new_tokens / forwards if forwards else None,
        "new_tokens": new_tokens,
        "tokens_per_s": new_tokens / seconds if seconds else None,
        "accuracy": statistics.fmean(r["score"] for r in scored) if scored else None,
        "answer_wins": wins if scored else None, "answer_losses": losses if scored else None,
        "net_answer_flips": wins - losses if scored else None,
    }


def _prompt_order(prompt_id: str) -> tuple:
    source, _, index = prompt_id.rpartition(":")
    return (source, int(index)) if index.isdigit() else (source, math.inf, index)


# ---------------------------------------------------------------------------------------------------------------------
# Domination
# ---------------------------------------------------------------------------------------------------------------------


def dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether point `a` = (speed-up, NLL increase) dominates `b`: strictly faster *and* strictly closer to `exact`
    (a tie in either is no domination)."""
    return a[0] > b[0] and a[1] < b[1]


def dominated_points(points: Mapping[str, tuple[str, float | None, float | None]]) -> dict[str, list[str]]:
    """`{name: (rule, speed-up, NLL increase)}` → `{dominated name: [the same rule's names that dominate it]}`; a
    point without both figures neither dominates nor is dominated; `exact` is no rule's point."""
    out: dict[str, list[str]] = {}
    for name, (rule, speed, nll) in points.items():
        if rule == REFERENCE or speed is None or nll is None:
            continue
        by = [other for other, (other_rule, s, n) in points.items() if other != name and other_rule == rule
              and s is not None and n is not None and dominates((s, n), (speed, nll))]
        if by:
            out[name] = by
    return out


def domination(pooled: dict[str, dict], prompt_ids: Iterable[str] | None = None) -> dict[str, list[str]]:
    """Dominated configurations of the pooled records: each pair of one rule's points compared on the prompts the
    two share (within `prompt_ids` where given), so a point left out of later slices is judged where it ran."""
    keys = list(pooled)
    wanted = None if prompt_ids is None else set(prompt_ids)
    out: dict[str, list[str]] = {}
    for key in keys:
        a = pooled[key]
        if a["rule"] == REFERENCE:
            continue
        for other in keys:
            b = pooled[other]
            if other == key or b["rule"] != a["rule"]:
                continue
            common = set(a["prompts"]) & set(b["prompts"])
            if wanted is not None:
                common &= wanted
            if not common:
                continue
            pa, pb = summarize(a, common), summarize(b, common)
            points = {a["name"]: (a["rule"], pa["speedup"], pa["nll_increase"]),
                      b["name"]: (b["rule"], pb["speedup"], pb["nll_increase"])}
            if a["name"] in dominated_points(points):
                out.setdefault(a["name"], []).append(b["name"])
    return out


# ---------------------------------------------------------------------------------------------------------------------
# merge and dominated
# ---------------------------------------------------------------------------------------------------------------------


def merge(slices: dict[str, dict]) -> dict:
    """The merged report of slices of one setting (see the module docstring): `{"kind", "setting", "slices",
    "configurations": [summary, ...], "dominated": {name: [by]}}`, `exact` first, then the rules in grid order."""
    pooled, setting = pool_slices(slices)
    exact_key = _key(REFERENCE)
    if exact_key not in pooled:
        raise ValueError("no `exact` in the slices. Fix: pass slices of `frontier.py run` (each runs exact).")
    beaten = domination(pooled)
    rows = []
    exact_prompts = set(pooled[exact_key]["prompts"])
    for key, entry in pooled.items():
        row = summarize(entry)
        row["dominated_by"] = beaten.get(entry["name"], [])
        row["all_prompts"] = set(entry["prompts"]) == exact_prompts
        row["is_default"] = (entry["rule"] not in (REFERENCE, STOCK)
                             and key == _key(Configuration(entry["rule"], {}))
                             and entry["gamma"] in (None, RULES.get(entry["rule"]).default_num_draft_tokens))
        rows.append(row)
    rule_order = list(dict.fromkeys(entry["rule"] for entry in pooled.values()))  # as the slices ran them
    rows.sort(key=lambda r: (r["rule"] != REFERENCE, rule_order.index(r["rule"])))
    return {
        "kind": REPORT_KIND,
        "setting": setting,
        "slices": {name: {"prompts": results["prompt_ids"], "configurations": [c["name"] for c in
                                                                              results["configurations"]],
                          "skip": results.get("skip", []), "elapsed_s": results.get("elapsed_s"),
                          "commit": (results.get("machine") or {}).get("git"), "isa": slice_isa(results),
                          "threads": (results.get("machine") or {}).get("torch_threads")}
                   for name, results in slices.items()},
        "prompts": len(exact_prompts),
        "configurations": rows,
        "dominated": beaten,
    }


def _interval(values: list[float] | None, digits: int) -> str:
    return "" if values is None else f" [{values[0]:.{digits}f}, {values[1]:.{digits}f}]"


def _number(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def render(report: dict) -> str:
    """The merged report as Markdown: the setting, a row per configuration, the legend."""
    setting, rows = report["setting"], report["configurations"]
    decoding = setting["decoding"]
    mode = (f"sampling (T {decoding.get('temperature')}, top-p {decoding.get('top_p')}, seed {decoding.get('seed')})"
            if decoding["do_sample"] else "greedy")
    scored = any(r["accuracy"] is not None for r in rows)
    lines = [f"# Frontier: {setting['source']}, {mode}", "",
             f"- Target `{setting['models']['target']}`, draft `{setting['models']['draft']}` "
             f"({setting['models'].get('target_dtype')} / {setting['models'].get('draft_dtype')}); max_new_tokens "
             f"{decoding['max_new_tokens']}; CPU: {setting.get('cpu', 'not recorded')}; {report['prompts']} prompts "
             f"in {len(report['slices'])} slice"
             f"{'s' if len(report['slices']) > 1 else ''}: " + ", ".join(f"`{n}`" for n in report["slices"]) + ".",
             "- Speed-up: per prompt, tokens/s over `exact`'s in the same slice (the configurations are interleaved "
             "per prompt), geometric mean with its 95% interval. NLL increase: the target's per-token NLL of the "
             "output minus `exact`'s, mean ± t·sd/√n (Student's t, n − 1 degrees of freedom). τ: new tokens per "
             "target forward, pooled. "
             + ("Flips: prompts where the answer is right and `exact`'s wrong (+) or the reverse (−). " if scored
                else "")
             + "Dominated by: the same rule's points with a higher speed-up and a lower NLL increase on the prompts "
             "the two share. (default): the rule's default options and γ today.", ""]
    header = ["configuration", "γ", "n", "speed-up [95% CI]", "NLL increase [95% CI]", "identical",
              "first divergence", "τ", "tok/s"] + (["accuracy", "flips (net)"] if scored else []) + ["dominated by"]
    table = []
    for r in rows:
        cells = [f"`{r['name']}`" + " (default)" * r.get("is_default", False), str(r["gamma"]), str(r["prompts"]),
                 _number(r["speedup"], ".3f") + "×" * (r["speedup"] is not None) + _interval(r["speedup_ci95"], 3),
                 _number(r["nll_increase"], "+.4f") + _interval(r["nll_increase_ci95"], 4),
                 _number(r["identical_share"], ".0%"), _number(r["mean_first_divergence"], ".1f"),
                 _number(r["tau"], ".2f"), _number(r["tokens_per_s"], ".2f")]
        if scored:
            cells += [_number(r["accuracy"], ".3f"),
                      "—" if r["answer_wins"] is None else
                      f"+{r['answer_wins']} / −{r['answer_losses']} ({r['net_answer_flips']:+d})"]
        cells.append(", ".join(f"`{b}`" for b in r["dominated_by"]) or "—")
        table.append(cells)
    lines += markdown.table(header, table)
    partial = [r for r in rows if not r["all_prompts"]]
    if partial:
        lines += ["", "Not run on every prompt (left out of later slices with `--skip`): "
                  + ", ".join(f"`{r['name']}` ({r['prompts']} prompts)" for r in partial) + "."]
    return "\n".join(lines) + "\n"


def require_matplotlib():
    """`matplotlib.pyplot` (Agg backend), or an error naming the fix."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("matplotlib is not installed: the frontier plot needs it. Fix: "
                         "python -m pip install -e \".[benchmarks]\" (or python -m pip install matplotlib), or pass "
                         "--no-plot for the JSON and Markdown alone.") from None
    return plt


def write_plot(path: Path, report: dict) -> None:
    """Speed-up over `exact` (y) against the NLL increase (x): a line per rule through its non-dominated points (from
    `exact` at (0, 1)), dominated points hollow, every point labelled with its options, 95% intervals as bars."""
    plt = require_matplotlib()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    ax.axhline(1.0, color="gray", linewidth=0.7, linestyle="--")
    ax.axvline(0.0, color="gray", linewidth=0.7, linestyle="--")
    ax.plot([0], [1], marker="*", markersize=14, color="black", linestyle="none", label="exact", zorder=4)
    rules = list(dict.fromkeys(r["rule"] for r in report["configurations"] if r["rule"] != REFERENCE))
    for index, rule in enumerate(rules):
        colour = RULE_COLOURS.get(rule, f"C{index + 4}")
        points = [r for r in report["configurations"] if r["rule"] == rule
                  and r["speedup"] is not None and r["nll_increase"] is not None]
        front = sorted((r for r in points if not r["dominated_by"]), key=lambda r: r["nll_increase"])
        ax.plot([0] + [r["nll_increase"] for r in front], [1] + [r["speedup"] for r in front], color=colour,
                marker="o", label=rule, zorder=3)
        for r in points:
            x, y = r["nll_increase"], r["speedup"]
            xerr = None if r["nll_increase_ci95"] is None else [[x - r["nll_increase_ci95"][0]],
                                                                [r["nll_increase_ci95"][1] - x]]
            yerr = None if r["speedup_ci95"] is None else [[y - r["speedup_ci95"][0]], [r["speedup_ci95"][1] - y]]
            ax.errorbar([x], [y], xerr=xerr, yerr=yerr, color=colour, alpha=0.35, linewidth=0.8, capsize=2,
                        linestyle="none", zorder=2)
            ax.plot([x], [y], marker="o", markersize=6, color=colour, linestyle="none", zorder=3,
                    markerfacecolor="white" if r["dominated_by"] else colour)
            if r.get("is_default"):
                ax.plot([x], [y], marker="o", markersize=13, markerfacecolor="none", markeredgecolor="black",
                        linestyle="none", zorder=4)
            ax.annotate(option_label(r["options"]) + ("" if r["all_prompts"] else f" (n {r['prompts']})"), (x, y),
                        textcoords="offset points", xytext=(5, 4), fontsize=7, color=colour)
    setting = report["setting"]
    mode = "sampled" if setting["decoding"]["do_sample"] else "greedy"
    ax.set_xlabel("target NLL increase over exact (nats per token)")
    ax.set_ylabel("speed-up over exact (geometric mean)")
    ax.set_title(f"{setting['models']['target']} / {setting['models']['draft']}: {setting['source']}, {mode}, "
                 f"{report['prompts']} prompts", fontsize=9)
    ax.legend(fontsize=8, title="hollow: dominated; ringed: the default", title_fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def read_slices(paths: Sequence[Path]) -> dict[str, dict]:
    markdown.check_distinct_file_names(list(paths), "slices")
    return {Path(path).name: load_slice(path) for path in paths}


def merge_main(args: argparse.Namespace) -> dict:
    if not args.no_plot:
        require_matplotlib()  # before any work: the error says how to get it, or to pass --no-plot
    report = merge(read_slices(args.slices))
    name = f"frontier-{args.name}"
    markdown.write_summary(args.output_dir, name, render(report) + ("" if args.no_plot else
                                                                    f"\n![the frontier]({name}.png)\n"), report)
    if not args.no_plot:
        write_plot(args.output_dir / f"{name}.png", report)
    return report


def dominated_main(args: argparse.Namespace) -> dict:
    """Prints the dominated points (on `--prompts`, default the prompts every configuration ran) and the `--skip`
    value that leaves them out."""
    pooled, _ = pool_slices(read_slices(args.slices))
    if args.gsm8k_problems is not None:
        prompt_ids = [f"gsm8k:{i}" for i in range(*args.gsm8k_problems)]
    else:
        prompt_ids = sorted(set.intersection(*(set(e["prompts"]) for e in pooled.values())), key=_prompt_order)
    beaten = domination(pooled, prompt_ids)
    rows = []
    for entry in pooled.values():
        s = summarize(entry, prompt_ids)
        rows.append([f"`{entry['name']}`", str(s["prompts"]), _number(s["speedup"], ".3f"),
                     _number(s["nll_increase"], "+.4f"), ", ".join(f"`{b}`" for b in beaten.get(entry["name"], []))
                     or "—"])
    skip = ",".join(beaten)
    print("\n".join(markdown.table(["configuration", "n", "speed-up", "NLL increase", "dominated by"], rows)))
    print(f"\nprompts: {', '.join(prompt_ids)}")
    print(f"--skip {skip}" if skip else "no dominated point: nothing to skip")
    return {"prompts": prompt_ids, "dominated": beaten, "skip": skip}


# ---------------------------------------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------------------------------------


def _slice_arg(text: str) -> tuple[int, int]:
    try:
        return data.parse_slice(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python benchmarks/frontier.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="one slice: exact and the grid's configurations on a set of prompts")
    run.add_argument("--grid", help="named grids, comma-separated: " + "; ".join(
        f"{g}: {', '.join(c)}" for g, c in GRIDS.items()) + "; all: every grid")
    run.add_argument("--configs", help="more configurations, comma-separated rule@option=value (as compare())")
    run.add_argument("--skip", help="configurations of the selection to leave out, comma-separated (`dominated` "
                     "prints the list)")
    source = run.add_mutually_exclusive_group(required=True)
    source.add_argument("--gsm8k-problems", type=_slice_arg, metavar="START:END",
                        help="GSM8K test problems START..END-1 in file order; scored by answer match")
    source.add_argument("--spec-bench", choices=("quick", "full"), help="the Spec-Bench prompts of run.py's profile")
    run.add_argument("--spec-bench-prompts", type=_slice_arg, metavar="START:END",
                     help="with --spec-bench: that profile's prompts START..END-1 only (a slice of them)")
    run.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    run.add_argument("--sample", action="store_true", help="sample (default: greedy)")
    run.add_argument("--temperature", type=float)
    run.add_argument("--top-p", type=float)
    run.add_argument("--seed", type=int, default=0, help="prompt i of the source is seeded with seed + i")
    run.add_argument("--num-assistant-tokens", type=int,
                     help="one γ for every configuration (default: each rule's own: fly 15, the others 5)")
    run.add_argument("--repeats", type=int, default=1, help="timed calls per prompt and configuration (default 1: "
                     "on a CPU the interleaving already pairs each ratio; more repeats multiply the time)")
    run.add_argument("--warmup-max-new-tokens", type=int, default=32,
                     help="the untimed warm-up's budget, each configuration once on the first prompt (0: none)")
    run.add_argument("--pair", default="qwen", choices=models.PAIR_NAMES)
    run.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    run.add_argument("--data-dir", type=Path, default=data.DEFAULT_DATA_DIR)
    run.add_argument("--name", help="the slice's file stem (default slice-<mode>-<grid>-<source>)")
    run.add_argument("--overwrite", action="store_true", help="replace a slice of the same name")
    run.add_argument("--dry-run", action="store_true", help="print the configurations, prompts and expected time")
    run.add_argument("--no-progress", action="store_true")
    merged = commands.add_parser("merge", help="merge slices into frontier-<name>.{json,md,png}")
    merged.add_argument("slices", nargs="+", type=Path)
    merged.add_argument("--name", required=True, help="e.g. greedy-gsm8k: writes frontier-greedy-gsm8k.*")
    merged.add_argument("--no-plot", action="store_true", help="JSON and Markdown only (no matplotlib needed)")
    dominated = commands.add_parser("dominated", help="the grid points the slices show to be dominated")
    dominated.add_argument("slices", nargs="+", type=Path)
    dominated.add_argument("--gsm8k-problems", type=_slice_arg, metavar="START:END",
                           help="judge on these GSM8K problems (default: the prompts every configuration ran)")
    for command in (run, merged):
        command.add_argument("--output-dir", type=Path, default=DEFAULT_OUTPUT_DIR)
    return parser


def main(argv: Sequence[str] | None = None, load_pair: Callable[..., models.ModelPair] = models.load_pair) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "run":
        if args.spec_bench_prompts is not None and args.spec_bench is None:
            parser.error("--spec-bench-prompts selects among --spec-bench's prompts. Fix: add --spec-bench quick, or "
                         "drop it (GSM8K: --gsm8k-problems START:END)")
        if not args.sample and (args.temperature is not None or args.top_p is not None):
            parser.error("--temperature / --top-p with greedy decoding would be ignored. Fix: add --sample, or drop "
                         "them")
        if args.grid is None and not args.configs:
            parser.error("no configurations. Fix: pass --grid fly|ears|dropmatch|all, or --configs rule@option=value")
        try:  # everything the user wrote is checked before any model loads
            select_configurations(args.grid, split_entries(args.configs), split_entries(args.skip))
        except SemSpecConfigError as error:
            parser.error(str(error))
        return run_slice(args, load_pair)
    if args.command == "merge":
        return merge_main(args)
    return dominated_main(args)


if __name__ == "__main__":
    main()
