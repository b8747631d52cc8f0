"""What "within 3% of the best fixed length of each category" can tell with a few prompts per category.

The draft-length tables (`report._policy_tables`) judge a policy by its ratio to the best fixed length of each
category, and pick that length on the same prompts the policy is judged on. With three prompts a category, the pick
is partly the prompts': a fixed length that wins on them need not win on the category's next prompt. This section
puts three fixed-length references next to the policies, all priced by the run's cost model (modeled tokens/s, so no
timing noise) and divided by the category's best fixed length, like the policies:

- "tuned on the other prompts": for each prompt, the fixed length that is best on the category's *other* prompts
  (leave one prompt out). A length tuned for the category, judged on a prompt it was not tuned on: how well a
  per-category tuning transfers within the category. Needs two prompts or more.
- "best overall": the one fixed length that is best over all prompts, the same for every category: the length a
  user who sweeps γ once over the whole workload would keep. The counts under the table also say in how many
  categories each policy is within 3% of it.
- "each prompt's best": the best fixed length of each prompt, an oracle no fixed schedule reaches.

Each policy's ratio comes with its standard error: with x_p = ln(policy_p / best_p) per prompt, the category's ratio
is exp(mean x) (the ratio of the geometric means) and its standard error sd(x) / sqrt(n), which for small values is
the relative error of the ratio. A 3% target needs that error well below 0.03.

Why a separate table: the table above it stays the issue's measure; this one says how far that measure can be read.

    python -m benchmarks.resolution RESULTS.json [MORE.json ...] --name NAME

pools the records of results files of the same methods on different prompts (replays or runs), prices them at the
first file's cost model and writes `benchmarks/results/NAME.md` and `NAME.json`.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from . import markdown, metrics

RESULTS_DIR = Path(__file__).resolve().parent / "results"
WITHIN = 0.97  # the "within 3%"


def per_prompt_values(records: list[dict], costs: dict) -> dict[str, dict[str, float]]:
    """method → prompt → modeled tokens/s (geometric mean over a prompt's records, e.g. a replay's seeds)."""
    grouped: dict[str, dict[str, list[float]]] = {}
    for r in records:
        grouped.setdefault(r["method"], {}).setdefault(r["prompt_id"], []).append(
            metrics.modeled_tokens_per_s(r, costs))
    return {method: {p: metrics.geometric_mean(v) for p, v in by_prompt.items()} for method, by_prompt in
            grouped.items()}


def fixed_lengths(methods: list[dict], rule: str) -> list[str]:
    """The names of `rule`'s `constant` draft-length methods (its fixed lengths), in the order of `methods`."""
    return [m["name"] for m in methods if m.get("draft_length") == "constant" and m["rule"] == rule]


def adaptive_policies(methods: list[dict], rule: str) -> list[str]:
    """The names of `rule`'s other draft-length methods (the policies judged against its fixed lengths), in the order
    of `methods`."""
    return [m["name"] for m in methods
            if m.get("draft_length") and m["draft_length"] != "constant" and m["rule"] == rule]


def cost_model(results: dict) -> dict:
    """A results dict's cost model (`metrics.run_cost_model`); raises when it has none to price records at."""
    costs = metrics.run_cost_model(results)
    if costs is None:
        raise ValueError("the run has no cost model and its records do not determine one (metrics.fit_round_costs). "
                         "Fix: pass a benchmarks/run.py results file with several hf_semspec methods per prompt.")
    return costs


def modeled_speeds(results: dict, methods: list[str], fix: str,
                   costs: dict | None = None) -> dict[str, dict[str, float]]:
    """`per_prompt_values` of a results dict's records of `methods`, at `costs` (default: its run's `cost_model`, for a
    caller that does not keep it). Raises when the run lacks one of them (the error ends with `fix`, the caller's)."""
    present = sorted({r["method"] for r in results["records"]})
    missing = [m for m in methods if m not in present]
    if missing:
        raise ValueError(f"the run has no {' or '.join(missing)} (its methods: {present}). Fix: {fix}")
    costs = cost_model(results) if costs is None else costs
    return per_prompt_values([r for r in results["records"] if r["method"] in methods], costs)


def categories_of(results: dict) -> dict[str, str]:
    """prompt id → its category, in the order of the records."""
    return {r["prompt_id"]: r["category"] for r in results["records"]}


def log_ratio(policy: dict[str, float], reference: dict[str, float], prompts: list[str]) -> tuple[float, float | None]:
    """(exp(mean x), sd(x) / sqrt(n)) of x_p = ln(policy_p / reference_p) over `prompts`; the error is None for one
    prompt."""
    ratios = [policy[p] / reference[p] for p in prompts]
    return metrics.geometric_mean(ratios), metrics.log_standard_error(ratios)


def best_fixed(values: dict[str, dict[str, float]], fixed: list[str], prompts: list[str]) -> str:
    """The fixed length with the largest geometric mean over `prompts` (the earlier in `fixed` on a tie)."""
    return max(fixed, key=lambda m: (metrics.geometric_mean([values[m][p] for p in prompts]), -fixed.index(m)))


def leave_one_out(values: dict[str, dict[str, float]], fixed: list[str], prompts: list[str]) -> dict[str, float] | None:
    """prompt → modeled tokens/s of the fixed length best on the other `prompts` (None for fewer than two)."""
    if len(prompts) < 2:
        return None
    return {p: values[best_fixed(values, fixed, [q for q in prompts if q != p])][p] for p in prompts}


def rows(methods: list[dict], records: list[dict], costs: dict, rule: str) -> list[dict]:
    """One row per category (then "overall") for `rule`'s draft-length methods; empty without two fixed lengths. With
    one prompt a category (the quick profile) only "best overall" and "each prompt's best" are defined, and no error.

    A row: `label`, `prompts`, `best` (the best fixed method), `references` ({"tuned on the other prompts",
    "best overall", "each prompt's best"} → ratio to the best, None where undefined) and `policies` (name →
    (ratio, standard error)). Prompts where a fixed length did not run are left out."""
    mine = [m for m in methods if m.get("draft_length") and m["rule"] == rule]
    fixed = fixed_lengths(mine, rule)
    policies = adaptive_policies(mine, rule)
    if len(fixed) < 2:
        return []
    values = per_prompt_values([r for r in records if r["method"] in fixed + policies], costs)
    categories: dict[str, list[str]] = {}
    for r in records:
        if r["method"] in fixed and all(r["prompt_id"] in values.get(m, {}) for m in fixed):
            categories.setdefault(r["category"], [])
            if r["prompt_id"] not in categories[r["category"]]:
                categories[r["category"]].append(r["prompt_id"])
    all_prompts = [p for prompts in categories.values() for p in prompts]
    overall_best = best_fixed(values, fixed, all_prompts)
    tuned = {c: leave_one_out(values, fixed, prompts) for c, prompts in categories.items()}
    out = []
    for label, prompts in list(categories.items()) + [("overall", all_prompts)]:
        best = best_fixed(values, fixed, prompts)
        tuned_here = ({p: tuned[c][p] for c, ps in categories.items() if tuned[c] for p in ps}
                      if label == "overall" else tuned[label])
        covered = [p for p in prompts if tuned_here and p in tuned_here]
        oracle = {p: max(values[m][p] for m in fixed) for p in prompts}
        tuned_ratio = log_ratio(tuned_here, values[best], covered)[0] if covered == prompts else None
        references = {
            "tuned on the other prompts": tuned_ratio,
            "best overall": log_ratio(values[overall_best], values[best], prompts)[0],
            "each prompt's best": log_ratio(oracle, values[best], prompts)[0],
        }
        out.append({
            "label": label, "prompts": len(prompts), "best": best, "overall_best": overall_best,
            "references": references,
            "policies": {n: log_ratio(values[n], values[best], [p for p in prompts if p in values[n]])
                         for n in policies if any(p in values[n] for p in prompts)},
        })
    return out


def _ratio(value: float | None, error: float | None = None) -> str:
    if value is None:
        return "–"
    return f"{value:.2f}" if error is None else f"{value:.2f} ± {error:.2f}"


def section(methods: list[dict], records: list[dict], costs: dict, heading: str = "###") -> list[str]:
    """Markdown: per rule, the references and the policies' ratios with their standard errors (see the module
    docstring); empty when no rule has two fixed lengths."""
    lines: list[str] = []
    for rule in dict.fromkeys(m["rule"] for m in methods if m.get("draft_length")):
        table = rows(methods, records, costs, rule)
        if not table:
            continue
        if not lines:
            lines = [
                f"{heading} How far the per-category comparison can be read (modeled decode time)", "",
                "Each category's best fixed length is picked on the prompts it is judged on. References, as ratios to "
                "it: *tuned on the other prompts*, for each prompt the fixed length best on the category's other "
                "prompts (leave one out); *best overall*, the one fixed length best over all prompts; *each prompt's "
                "best*, an oracle. ± is the standard error of a policy's ratio (sd of its per-prompt log ratios / "
                "sqrt(n)); a 3% goal needs it well below 0.03. `benchmarks/resolution.py` explains.", "",
            ]
        overall = table[-1]
        names = list(overall["policies"])
        if all(row["prompts"] < 2 for row in table[:-1]):
            lines += [f"`{rule}` has one prompt a category: each category's ratio is one generation's, with no "
                      "standard error and no length tuned on other prompts to compare with.", ""]
        header = (["category", "prompts", "best fixed", "tuned on the other prompts",
                   f"best overall (`{overall['overall_best'].split('/', 1)[1]}`)", "each prompt's best"]
                  + [f"`{n.split('/', 1)[1]}`" for n in names])
        body = [[row["label"], str(row["prompts"]), f"`{row['best'].split('/', 1)[1]}`"]
                + [_ratio(v) for v in row["references"].values()]
                + [_ratio(*row["policies"][n]) if n in row["policies"] else "–" for n in names] for row in table]
        lines += [f"`{rule}`:", ""] + markdown.table(header, body) + [""]
        categories = table[:-1]

        def count(label: str, pairs: list[tuple[float, float]]) -> str:
            """`label k of n`: the pairs (value, reference ratio) with value >= 0.97 × reference."""
            return f"{label} {sum(v >= WITHIN * ref for v, ref in pairs)} of {len(pairs)}"

        def policies_against(reference: str) -> list[str]:
            """Each policy's count against one reference, over the categories where both are defined."""
            rows_with = [row for row in categories if row["references"][reference] is not None]
            return [count(f"`{n.split('/', 1)[1]}`", [(row["policies"][n][0], row["references"][reference])
                                                      for row in rows_with if n in row["policies"]])
                    for n in names]

        # A reference defined nowhere (leave-one-out with one prompt a category) gets no count rather than "0 of 0".
        defined = [ref for ref in overall["references"]
                   if any(row["references"][ref] is not None for row in categories)]
        to_best = [count(ref, [(row["references"][ref], 1.0) for row in categories
                               if row["references"][ref] is not None]) for ref in defined]
        to_best += [count(f"`{n.split('/', 1)[1]}`", [(row["policies"][n][0], 1.0) for row in categories
                                                      if n in row["policies"]]) for n in names]
        to_tuned = (f" Within 3% of the length tuned on the other prompts: "
                    f"{', '.join(policies_against('tuned on the other prompts'))}."
                    if "tuned on the other prompts" in defined else "")
        # The reading where a user sweeps γ once over the whole workload and keeps that one length everywhere.
        to_overall = policies_against("best overall")
        errors = [row["policies"][n][1] for row in categories for n in names
                  if n in row["policies"] and row["policies"][n][1] is not None]
        lines.append(f"Categories within 3% of their best fixed length: {', '.join(to_best)}.{to_tuned} Within 3% of "
                     f"the one length best over all prompts (`{overall['overall_best'].split('/', 1)[1]}`): "
                     f"{', '.join(to_overall)}."
                     + (f" Median standard error of a policy's category ratio: {statistics.median(errors):.3f}."
                        if errors else ""))
        lines.append("")
    return lines


def setting(results: dict) -> dict:
    """What must agree for two files' records to pool as one experiment: each method's options (as merge compares
    them: kind, length, rule and its options, policy and its config, draft; and which prompts shared its instance), the
    run's sampling and stock threshold, and a replay's own setting (how its policies kept state, the round times'
    noise and seeds, the costs it priced rounds at, which steer the policies that learn from time)."""
    methods = {m["name"]: {**{key: m.get(key) for key in metrics.SAME_METHOD_OPTIONS},
                           "policy_state": m.get("policy_state", "run")} for m in results["methods"]}
    if "traces" not in results and "round_time_noise" not in results:
        return {"methods": methods, **metrics.run_options(results)}
    return {"methods": methods, **metrics.run_options(results), "policy_state": replay_policy_state(results),
            "costs": _to_9_digits(results.get("costs")),
            **{k: results.get(k) for k in ("round_time_noise", "seed", "seeds")}}


def replay_policy_state(results: dict) -> str:
    """A replay's --policy-state (`benchmarks/replay.py`); files written before it record only `fresh_per_prompt`."""
    return results.get("policy_state") or ("prompt" if results.get("fresh_per_prompt") else "run")


def _to_9_digits(value):
    """`value` with its floats to 9 significant digits: a cost model fitted twice from the same records differs in the
    last bits (summation order)."""
    if isinstance(value, dict):
        return {k: _to_9_digits(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_9_digits(v) for v in value]
    return float(f"{value:.9g}") if isinstance(value, float) else value


def pool(paths: list[Path]) -> tuple[list[dict], list[dict], dict]:
    """(methods, records, costs) of results files with the same methods and setting (`setting`) on different
    prompts, at the first file's costs (its `costs`, a replay's, or its run's cost model)."""
    files = [json.loads(p.read_text(encoding="utf-8")) for p in paths]
    first = files[0]
    costs = first.get("costs") or metrics.run_cost_model(first)
    names = [m["name"] for m in first["methods"]]
    first_setting = setting(first)
    records, seen = [], set()
    for path, results in zip(paths, files):
        if [m["name"] for m in results["methods"]] != names:
            raise ValueError(f"{path}: its methods {[m['name'] for m in results['methods']]} are not those of "
                             f"{paths[0]} ({names}); pool results of the same methods")
        differ = {key: (first_setting.get(key), value) for key, value in setting(results).items()
                  if value != first_setting.get(key)}
        differ.update(metrics.differing_setups(first, results))  # models, dtypes, token budgets
        if differ:
            if "methods" in differ:
                a, b = differ["methods"]
                differ["methods"] = {n: {key: (a[n][key], b[n][key]) for key in a[n] if a[n][key] != b[n][key]}
                                     for n in names if a[n] != b[n]}
            raise ValueError(f"{path}: its setting differs from {paths[0]}'s ({differ}, as (first, this)); pool "
                             "results of one experiment on different prompts. Fix: run both with the same options")
        prompts = {r["prompt_id"] for r in results["records"]}
        if prompts & seen:
            raise ValueError(f"{path}: prompts {sorted(prompts & seen)} are already in an earlier file; pool results "
                             "on different prompts")
        seen |= prompts
        records += results["records"]
    return first["methods"], records, costs


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, nargs="+", help="results JSON files (benchmarks/run.py, merge.py or "
                        "replay.py) of the same methods on different prompts")
    parser.add_argument("--name", required=True, help="writes benchmarks/results/<name>.md and .json")
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    methods, records, costs = pool(args.results)
    rules = list(dict.fromkeys(m["rule"] for m in methods if m.get("draft_length")))
    summary = {"sources": [str(p) for p in args.results], "costs": costs,
               "rows": {rule: rows(methods, records, costs, rule) for rule in rules}}
    prompts = len({r["prompt_id"] for r in records})
    text = "\n".join([f"# Per-category resolution: {prompts} prompts from {len(args.results)} file(s)", "",
                      f"Sources: {', '.join(f'`{p.name}`' for p in args.results)}; priced at "
                      f"{metrics.describe_costs(costs)}.", ""]
                     + section(methods, records, costs, heading="##")) + "\n"
    markdown.write_summary(args.output_dir, args.name, text, summary)
    return summary


if __name__ == "__main__":
    main()
