"""The same prompts in two runs: a draft-length policy against the fixed lengths, in each run apart.

    python -m benchmarks.same_prompts A.json B.json --policy semspec:fly/tapout --name NAME

Why: a policy's shortfall in a category can come from the prompts or from the setting (e.g. 64 against 256 new
tokens: more rounds per prompt to learn from), and two runs on different prompts cannot tell which. On the prompts
both runs measured, each run's figures here are priced at its own cost model (modeled tokens/s, as its report does)
and compared only within that run:

    policy / best fixed    the policy's modeled tokens/s over that of the fixed length (`constant` of the policy's
                           rule, measured in both runs) with the largest geometric mean over the row's prompts: one
                           prompt, its category's prompts, or all of them

as a geometric mean of the per-prompt ratios, the issue's measure. The rows follow the first run's prompt order.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import markdown, metrics, resolution

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def _method(results: dict, name: str, path: Path) -> dict:
    names = [m["name"] for m in results["methods"]]
    if name not in names:
        raise ValueError(f"{path}: --policy {name!r} is not one of its methods {names}; pass one of them")
    return next(m for m in results["methods"] if m["name"] == name)


def shared_fixed(runs: list[dict], rule: str) -> list[str]:
    """The `constant` methods of `rule` that every run measured, in the first run's order."""
    fixed = [resolution.fixed_lengths(r["methods"], rule) for r in runs]
    return [name for name in fixed[0] if all(name in f for f in fixed[1:])]


def compare(runs: list[dict], paths: list[Path], policy: str) -> dict:
    """For the prompts every run measured: per run, each row's best fixed length and the policy's ratio to it.

    Returns {"fixed": [...], "prompts": [...], "categories": {category: [prompt, ...]}, "runs": [{"costs": ...,
    "rows": {label: {"best": name, "ratio": float}}}]}, rows labelled by prompt id, category and "overall"."""
    rule = _method(runs[0], policy, paths[0])["rule"]
    for results, path in zip(runs[1:], paths[1:]):
        _method(results, policy, path)
    fixed = shared_fixed(runs, rule)
    if len(fixed) < 2:
        raise ValueError(f"the runs share {len(fixed)} fixed length(s) of rule {rule!r} ({fixed}); comparing a policy "
                         "with the best fixed length needs two or more (--draft-lengths constant:3,constant:16,...)")
    category_of = resolution.categories_of(runs[0])
    measured = [{r["prompt_id"] for r in results["records"] if r["method"] == policy} for results in runs]
    prompts = [p for p in category_of if all(p in m for m in measured)]
    if not prompts:
        raise ValueError(f"no prompt has {policy!r} in every run ({', '.join(map(str, paths))}); compare runs of the "
                         "same prompts")
    categories: dict[str, list[str]] = {}
    for p in prompts:
        categories.setdefault(category_of[p], []).append(p)
    groups = {p: [p] for p in prompts} | categories | {"overall": prompts}
    out = {"fixed": fixed, "prompts": prompts, "categories": categories, "runs": []}
    for results in runs:
        costs = resolution.cost_model(results)
        values = resolution.modeled_speeds(results, fixed + [policy], "compare runs whose records include every method "
                                            "they list.", costs)
        rows = {}
        for label, group in groups.items():
            best = resolution.best_fixed(values, fixed, group)
            rows[label] = {"best": best, "ratio": resolution.log_ratio(values[policy], values[best], group)[0]}
        out["runs"].append({"costs": costs, "rows": rows})
    return out


def render(comparison: dict, paths: list[Path], policy: str) -> str:
    def short(name: str) -> str:
        return name.split("/", 1)[-1]

    runs = comparison["runs"]
    head = ["category", "prompt"] + [c for path in paths for c in (f"{path.stem}: best fixed",
                                                                    f"{path.stem}: `{short(policy)}` / best")]
    table = []
    for category, prompts in comparison["categories"].items():
        for label, shown in [(p, p) for p in prompts] + ([(category, "all")] if len(prompts) > 1 else []):
            table.append([category, shown] + [c for run in runs for c in (
                f"`{short(run['rows'][label]['best'])}`", f"{run['rows'][label]['ratio']:.2f}")])
    table.append(["overall", str(len(comparison["prompts"]))] + [c for run in runs for c in (
        f"`{short(run['rows']['overall']['best'])}`", f"{run['rows']['overall']['ratio']:.2f}")])
    lines = [f"# `{policy}` against the fixed lengths on the same {len(comparison['prompts'])} prompts in "
             f"{len(paths)} runs", "",
             f"Sources: {', '.join(f'`{p.name}`' for p in paths)}. Fixed lengths measured in every run: "
             f"{', '.join(f'`{short(n)}`' for n in comparison['fixed'])}. Each run priced at its own cost model: "
             + "; ".join(f"`{p.stem}` {metrics.describe_costs(r['costs'])}" for p, r in zip(paths, runs)) + ".", "",
             "Ratio: the policy's modeled tokens/s over that of the fixed length best on the row's prompts (a prompt, "
             "its category's prompts, or all), geometric mean over the prompts.", ""]
    return "\n".join(lines + markdown.table(head, table)) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, nargs="+", help="results JSON files (benchmarks/run.py or merge.py) "
                        "with the policy and two or more of the same fixed lengths, on overlapping prompts")
    parser.add_argument("--policy", required=True, help="the method to compare, e.g. semspec:fly/tapout")
    parser.add_argument("--name", required=True, help="writes benchmarks/results/<name>.md and .json")
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if len(args.results) < 2:
        parser.error(f"results: got {len(args.results)} file; pass two or more runs of the same prompts")
    runs = [json.loads(p.read_text(encoding="utf-8")) for p in args.results]
    comparison = compare(runs, args.results, args.policy)
    summary = {"sources": [str(p) for p in args.results], "policy": args.policy, **comparison}
    markdown.write_summary(args.output_dir, args.name, render(comparison, args.results, args.policy), summary)
    return summary


if __name__ == "__main__":
    main()
