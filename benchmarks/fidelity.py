"""`python -m benchmarks.fidelity RUN.json [RUN.json ...] --name NAME`: GSM8K fidelity of each rule against `exact`.

What a relaxed rule is for is more speed than `exact` for almost no accuracy. This report reads one or more runs of
`benchmarks/run.py` on GSM8K (slices of the problems, `--gsm8k-problems START:END`, or the same problems with other
`--seed`s when sampling) and gives, per method, over every (problem, seed) the runs hold:

- accuracy: problems whose final number is the reference's (`metrics.parse_final_number`);
- paired flips against the baseline on the same problem and seed: `+` the method is right where the baseline is
  wrong, `−` the reverse, and the net (`+` minus `−`); a rule that keeps the baseline's accuracy has net ≥ −2 per 100;
- τ: new tokens / target forwards (ratio of sums), tok/s: new tokens / wall seconds (ratio of sums);
- speed-up over the baseline: the per-problem ratio of tokens/s against the baseline's *in the same run* (the
  methods of a run are interleaved per problem, so machine drift hits both), summarized by its geometric mean and
  median, and the geometric mean's 95% interval, geomean · exp(±t · sd(ln ratio) / sqrt(n)) (t: Student's 97.5%
  quantile, n − 1 degrees of freedom), which says whether a target such as 1.15× is resolved by the problems run; a slice run therefore has to include the baseline;
- identical: the fraction of outputs token-identical to the baseline's (greedy: how often a rule left plain's text,
  since `exact`'s greedy text is plain decoding's).

The baseline is `--baseline` (default: the run's `exact` at its default length: `semspec:exact/constant`, else
`semspec:exact`). Runs must share models, dtypes, decoding mode and token budget, and no (problem, seed) may be in
two runs. Writes `<output-dir>/<name>.md` and `.json` (default `benchmarks/results/`).

    # greedy, 100 problems in 10 slices (see benchmarks/README.md for the run command), then:
    python -m benchmarks.fidelity benchmarks/results/fidelity/fidelity-greedy-*-*.json \
        --output-dir benchmarks/results/fidelity --name fidelity-greedy
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from . import markdown, metrics

DEFAULT_OUTPUT_DIR = Path(__file__).resolve().parent / "results"


def default_baseline(methods: list[dict]) -> str:
    """The `exact` method at its default length: `semspec:exact/constant` (a `--draft-lengths` run), else
    `semspec:exact`; an error naming the methods when neither ran."""
    names = [m["name"] for m in methods]
    for name in ("semspec:exact/constant", "semspec:exact"):
        if name in names:
            return name
    raise ValueError(f"no `exact` method at its default length in {names}. Fix: run `exact` in every slice, or pass "
                     "--baseline METHOD.")


def check_runs(runs: dict[str, dict], baseline: str) -> None:
    """Refuses runs that do not measure the same thing: other models or budgets, another decoding mode, no baseline,
    or a (problem, seed) twice."""
    first_name, first = next(iter(runs.items()))
    seen: dict[tuple[str, int], str] = {}
    for name, results in runs.items():
        differing = metrics.differing_setups(first, results)
        if bool(results["config"].get("sample")) != bool(first["config"].get("sample")):
            differing["sample"] = (first["config"].get("sample"), results["config"].get("sample"))
        if differing:
            raise ValueError(f"{name} and {first_name} differ in " + "; ".join(
                f"{what}: {a!r} vs {b!r}" for what, (a, b) in differing.items()) + ". Fix: report runs of one setting "
                "together.")
        if baseline not in [m["name"] for m in results["methods"]]:
            raise ValueError(f"{name} has no method {baseline!r} (its methods: {[m['name'] for m in results['methods']]})"
                             ". Fix: run the baseline in every slice: the speed-up is taken within each run.")
        for record in graded_records(results):
            key = (record["prompt_id"], results["config"].get("seed"))
            if key in seen and seen[key] != name:
                raise ValueError(f"{key[0]} with --seed {key[1]} is in both {seen[key]} and {name}. Fix: pass slices "
                                 "of other problems (--gsm8k-problems) or other seeds.")
            seen[key] = name


def graded_records(results: dict) -> list[dict]:
    return [r for r in results["records"] if r.get("gsm8k") is not None]


def paired_records(runs: dict[str, dict], baseline: str) -> dict[str, list[tuple[dict, dict]]]:
    """method → [(record, the baseline's record on the same problem in the same run)], over every run."""
    pairs: dict[str, list[tuple[dict, dict]]] = {}
    for results in runs.values():
        records = graded_records(results)
        base = {r["prompt_id"]: r for r in records if r["method"] == baseline}
        for record in records:
            pairs.setdefault(record["method"], []).append((record, base[record["prompt_id"]]))
    return pairs


def summarize(pairs: list[tuple[dict, dict]]) -> dict:
    """Accuracy, paired flips, τ, tok/s and speed-up over the baseline of one method's (record, baseline) pairs."""
    records = [r for r, _ in pairs]
    correct = [r["gsm8k"]["correct"] for r in records]
    wins = sum(r["gsm8k"]["correct"] and not b["gsm8k"]["correct"] for r, b in pairs)
    losses = sum(b["gsm8k"]["correct"] and not r["gsm8k"]["correct"] for r, b in pairs)
    new_tokens = sum(r["new_tokens"] for r in records)
    forwards = sum(r["target_forwards"] for r in records)
    wall = sum(r["wall_s"] for r in records)
    ratios = [r["tokens_per_s"] / b["tokens_per_s"] for r, b in pairs]
    return {
        "problems": len(records),
        "correct": sum(correct),
        "accuracy": sum(correct) / len(records),
        "flips_won": wins,
        "flips_lost": losses,
        "net_flips": wins - losses,
        "net_flips_per_100": 100 * (wins - losses) / len(records),
        "new_tokens": new_tokens,
        "tau": new_tokens / forwards if forwards else 0.0,
        "tokens_per_s": new_tokens / wall if wall else 0.0,
        "speedup_vs_baseline": metrics.ratio_summary(ratios),
        "identical_to_baseline": statistics.fmean(r["new_token_ids"] == b["new_token_ids"] for r, b in pairs),
    }


def fidelity(runs: dict[str, dict], baseline: str | None = None) -> dict:
    """The report's figures: `{"baseline", "runs", "sample", "seeds", "methods": {method: summary}}`."""
    if not runs:
        raise ValueError("no runs given. Fix: pass one or more results JSON of benchmarks/run.py.")
    first = next(iter(runs.values()))
    baseline = baseline or default_baseline(first["methods"])
    check_runs(runs, baseline)
    pairs = paired_records(runs, baseline)
    order = list(dict.fromkeys(m["name"] for results in runs.values() for m in results["methods"]))
    described = {m["name"]: m for results in runs.values() for m in results["methods"]}
    summaries = {}
    for method in order:
        if method in pairs:
            summaries[method] = {**summarize(pairs[method]), "rule": described[method].get("rule"),
                                 "rule_kwargs": described[method].get("rule_kwargs"),
                                 "draft_length": described[method].get("draft_length"),
                                 "gamma": described[method].get("gamma")}
    return {
        "baseline": baseline,
        "runs": {name: {"prompts": sorted({r["prompt_id"] for r in graded_records(results)},
                                          key=lambda p: int(p.split(":")[-1]) if p.split(":")[-1].isdigit() else p),
                        "seed": results["config"].get("seed"),
                        "commit": (results.get("machine") or {}).get("git")} for name, results in runs.items()},
        "sample": bool(first["config"].get("sample")),
        "models": {k: first["models"].get(k) for k in ("target", "draft", "target_dtype", "draft_dtype")},
        "max_new_tokens": metrics.token_budgets(first).get("gsm8k"),
        "methods": summaries,
    }


def render(report: dict) -> str:
    """The markdown report."""
    baseline = report["baseline"]
    problems = {p for run in report["runs"].values() for p in run["prompts"]}
    seeds = sorted({run["seed"] for run in report["runs"].values()}, key=str)
    mode = "sampling" if report["sample"] else "greedy"
    lines = [
        f"# GSM8K fidelity against `{baseline}` ({mode})",
        "",
        f"- Target `{report['models']['target']}`, draft `{report['models']['draft']}` "
        f"({report['models'].get('target_dtype')} / {report['models'].get('draft_dtype')}); "
        f"max_new_tokens {report['max_new_tokens']}; {len(problems)} problems"
        + (f" with seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}" if report["sample"] else "")
        + f"; {len(report['runs'])} run{'s' if len(report['runs']) > 1 else ''}: "
        + ", ".join(f"`{name}`" for name in report["runs"]) + ".",
        f"- Flips are paired with `{baseline}` on the same problem and seed: `+` the method is right and the baseline "
        "wrong, `−` the reverse. Speed-up: per-problem tokens/s over the baseline's in the same run (geometric mean / "
        "median); the 95% interval is the geometric mean's, from the spread of the per-problem ratios. τ = new "
        "tokens per target forward.",
        "",
    ]
    rows = []
    for method, s in report["methods"].items():
        speed = s["speedup_vs_baseline"]
        interval = "–" if speed["ci95"] is None else f"{speed['ci95'][0]:.2f}–{speed['ci95'][1]:.2f}"
        rows.append([f"`{method}`", str(s["problems"]), f"{s['accuracy']:.3f} ({s['correct']})",
                     f"+{s['flips_won']} / −{s['flips_lost']}", f"{s['net_flips']:+d} ({s['net_flips_per_100']:+.1f})",
                     f"{s['tau']:.2f}", f"{s['tokens_per_s']:.2f}",
                     f"{speed['geomean']:.3f}× / {speed['median']:.2f}×", interval,
                     f"{s['identical_to_baseline']:.2f}"])
    lines += markdown.table(["method", "n", "accuracy (correct)", "flips vs baseline", "net (per 100)", "τ", "tok/s",
                             "speed-up vs baseline", "95% interval", "identical"], rows)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fidelity", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="results JSON of benchmarks/run.py (GSM8K slices)")
    parser.add_argument("--name", required=True, help="output file stem, e.g. fidelity-greedy")
    parser.add_argument("--baseline", default=None, help="method to pair with (default: exact at its default length)")
    parser.add_argument("--output-dir", type=Path, default=DEFAULT_OUTPUT_DIR)
    args = parser.parse_args(argv)
    markdown.check_distinct_file_names(args.runs, "runs")
    runs = {path.name: markdown.load_results(path, "run", "runs") for path in args.runs}
    report = fidelity(runs, args.baseline)
    markdown.write_summary(args.output_dir, args.name, render(report), report)
    return report


if __name__ == "__main__":
    main()
