"""`python -m benchmarks.merge BASE.json ADDED.json --name NAME [--pool]`: one report for methods measured in two runs.

Why: to judge a new draft-length policy against the fixed-length sweep of an earlier run without running the sweep
again (17 methods × 10 prompts took 72 min on the reference CPU). Under greedy decoding a method's target forwards F,
drafted tokens D and output are deterministic, so the sweep's counts stay valid; only their timings are of that run.

What is checked (a `ValueError` naming what differs, otherwise):
- the same target and draft, greedy decoding, the same `max_new_tokens` and the same prompts;
- at least one *anchor*: an hf_semspec method that both runs measured. Every anchor must have made the same F, D and
  new tokens on every prompt in both runs — the determinism the merge relies on.

`--changed METHOD ...` names methods that both runs measured but whose code changed in between (a policy improved
since the base run): they are not anchors, and the added run's records join the report as `METHOD@<added commit>`,
next to the base run's.

`--pool` joins runs of the same methods on *different* prompts into one report over all their prompts (e.g. a sweep
on held-out prompts added to the quick profile's, to judge a policy on more prompts per category than one run could
afford). Every method of the added run must have run in the base run with the same options; `--base-method
NEW=OLD` names the base run's method for one whose name differs there (e.g. `semspec:fly/tapout` for the
`semspec:fly/tapout@2cc35ec` of an earlier merge). The pooled report has the added run's methods; its modeled tables
price both runs' generations at the base run's costs, and the added run's own fit is recorded to show how far the
machine moved.

What is written: the base run (its methods, records, machine and settings) plus the added run's records of the
methods the base lacks, under `merged` the two files, the anchors and the machine drift (geometric mean over the
prompts of plain's tokens/s in the added run over the base run's). Each record keeps the speed-up vs plain of its own
run (the two runs' plain on the same prompt), so the measured table mixes two runs' noise. What does compare across
the runs is each method's measured tokens/s over an anchor's in the run that timed both (`measured_over_anchor`, the
report's "Measured over the anchor" table, as `benchmarks/anchored.py` computes it): the methods are interleaved per
prompt within a run, and the anchor made the same forwards in both. Merging into a merge, the base's rows are those
its own merge recorded. The modeled table prices every method's F and D at the base run's costs
(`metrics.fit_round_costs` of the base records), so it compares what the methods did, independently of the run they
were timed in.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from . import anchored, markdown, metrics, report


def _counts(results: dict, method: str) -> dict[str, tuple[int, int, int]]:
    return {r["prompt_id"]: (r["target_forwards"], r["draft_forwards"], r["new_tokens"])
            for r in results["records"] if r["method"] == method}


def _texts(results: dict, method: str) -> dict[str, str | None]:
    return {r["prompt_id"]: r.get("text") for r in results["records"] if r["method"] == method}


def _require_same_setting(base: dict, added: dict, same_prompts: bool = True) -> None:
    # Models, dtypes and the token budgets the records were decoded with (not the flag: None means the profile's).
    checks = metrics.differing_setups(base, added)
    if same_prompts:  # as sets: records are matched by prompt id, and a pooled base lists its runs one after another
        checks["prompts"] = (sorted(base["selection"]["prompt_ids"]), sorted(added["selection"]["prompt_ids"]))
    differing = [f"{what}: {a!r} vs {b!r}" for what, (a, b) in checks.items() if a != b]
    if differing:
        raise ValueError("the runs differ in " + "; ".join(differing) + ". Fix: run the added methods with the base "
                         "run's pair, --max-new-tokens" + (" and prompt selection." if same_prompts else "."))
    if not same_prompts:
        shared = sorted(set(base["selection"]["prompt_ids"]) & set(added["selection"]["prompt_ids"]))
        if shared:
            raise ValueError(f"--pool: both runs measured {shared}, so pooling would count those prompts twice. Fix: "
                             "run the added methods on other prompts (benchmarks/run.py --skip-per-category), or "
                             "merge runs on the same prompts without --pool.")
    if base["config"]["sample"] or added["config"]["sample"]:
        raise ValueError("a run used --sample: sampled outputs are not deterministic, so their forwards cannot be "
                         "compared across runs. Fix: merge greedy runs only.")
    base_options, added_options = metrics.run_options(base), metrics.run_options(added)
    threshold = "stock_confidence_threshold"
    if threshold in base_options and threshold in added_options and base_options[threshold] != added_options[threshold]:
        raise ValueError(f"the runs' stock baselines used --stock-confidence-threshold {base_options[threshold]!r} vs "
                         f"{added_options[threshold]!r}, so 'stock_assisted' is not one method in both. Fix: run the "
                         "added methods with the base run's threshold, or with --skip-stock.")


def _rename_changed(added: dict, changed: list[str], base_names: list[str]) -> dict:
    """`added` with each method of `changed` renamed `<name>@<added commit>` (methods and records)."""
    added_names = [m["name"] for m in added["methods"]]
    unknown = [name for name in changed if name not in base_names or name not in added_names]
    if unknown:
        raise ValueError(f"--changed: {unknown} were not measured in both runs (base: {base_names}; added: "
                         f"{added_names}). Fix: name methods of both runs, as their reports spell them.")
    suffix = "@" + added["machine"]["git"]["commit"][:7]
    renamed = {name: name + suffix for name in changed}
    return {
        **added,
        "methods": [{**m, "name": renamed.get(m["name"], m["name"])} for m in added["methods"]],
        "records": [{**r, "method": renamed.get(r["method"], r["method"])} for r in added["records"]],
    }


def merge_runs(base: dict, added: dict, base_path: str, added_path: str, changed: list[str] = ()) -> dict:
    """The merged results dict (see the module docstring); raises `ValueError` when the runs cannot be merged."""
    _require_same_setting(base, added)
    base_names = [m["name"] for m in base["methods"]]
    if changed:
        added = _rename_changed(added, list(changed), base_names)
    anchors = [m["name"] for m in added["methods"] if m["name"] in base_names and m["kind"] == "semspec"]
    if not anchors:
        raise ValueError(f"no hf_semspec method was measured in both runs (base: {base_names}). Fix: add one of the "
                         "base run's methods to the added run, e.g. --draft-lengths 'constant:3,<new policy>'.")
    mismatches = []
    for name in anchors:
        then, now = _counts(base, name), _counts(added, name)
        mismatches += [f"{name} on {pid}: (F, D, new tokens) {then.get(pid)} vs {now.get(pid)}"
                       for pid in sorted(set(then) | set(now)) if then.get(pid) != now.get(pid)]
        # The report says the anchors' outputs were identical too: same counts can hide another text.
        then_texts, now_texts = _texts(base, name), _texts(added, name)
        mismatches += [f"{name} on {pid}: another output text" for pid in sorted(set(then_texts) & set(now_texts))
                       if then.get(pid) == now.get(pid) and then_texts[pid] != now_texts[pid]]
    if mismatches:
        raise ValueError("the anchors did not repeat exactly, so the runs' counts are not comparable: "
                         + "; ".join(mismatches[:5]) + ". Fix: use the same commit, models and dtypes as the base run.")
    new_methods = [m for m in added["methods"] if m["name"] not in base_names]
    new_names = {m["name"] for m in new_methods}
    records = base["records"] + [r for r in added["records"] if r["method"] in new_names]
    methods = base["methods"] + new_methods
    aggregates = metrics.aggregate(records, [m["name"] for m in methods])
    aggregates["cost_model"] = metrics.run_cost_model(base)
    _keep_per_length_costs(base, aggregates)
    plain_then, plain_now = ({r["prompt_id"]: r["tokens_per_s"] for r in run["records"] if r["method"] == "plain"}
                             for run in (base, added))
    drift = [plain_now[p] / plain_then[p] for p in plain_then if p in plain_now]
    over_anchor = {anchor: {**_base_over_anchor(base, base_path, anchor),
                            **{m["name"]: _measured_over_anchor(added, m["name"], anchor, added_path)
                               for m in new_methods}}
                   for anchor in anchors}
    merged = {
        "base": base_path,
        "added": added_path,
        "added_commit": added["machine"]["git"]["commit"],
        "added_methods": [m["name"] for m in new_methods],
        "anchors": anchors,
        "anchor_generations": sum(len(_counts(added, name)) for name in anchors),
        "plain_speed_added_over_base": metrics.geometric_mean(drift) if drift else None,
        "measured_over_anchor": over_anchor,
    }
    return {**base, "methods": methods, "aggregates": aggregates, "records": records, "merged": merged}


def _keep_per_length_costs(base: dict, aggregates: dict) -> None:
    """The base run's per-length costs (`--verify-cost`), if it has them: a measurement of the machine, not of the
    records, so they hold for the merged records too."""
    if "per_length_costs" in base["aggregates"]:
        aggregates["per_length_costs"] = base["aggregates"]["per_length_costs"]


def _measured_over_anchor(run: dict, method: str, anchor: str, run_file: str) -> dict:
    """The geometric mean over prompts of the method's measured tokens/s over the anchor's in `run` (read from
    `run_file`), and the prompts it is over."""
    ratios = anchored.over_anchor(run, method, anchor)
    return {"run": run_file, "ratio": metrics.geometric_mean(list(ratios.values())) if ratios else None,
            "prompts": len(ratios)}


def _base_over_anchor(base: dict, base_path: str, anchor: str) -> dict[str, dict]:
    """`measured_over_anchor` of the base run's methods. A base that is itself a merge holds records of several
    runs, so a method's records and the anchor's may not share a run: its rows are the ones its own merge recorded
    (none for a merge made before the table existed)."""
    if "merged" in base:
        return dict(base["merged"].get("measured_over_anchor", {}).get(anchor, {}))
    return {m["name"]: _measured_over_anchor(base, m["name"], anchor, base_path)
            for m in base["methods"] if m["name"] != anchor}


def pool_runs(base: dict, added: dict, base_path: str, added_path: str,
              base_methods: dict[str, str] | None = None) -> dict:
    """The pooled results dict (`--pool`, see the module docstring); raises `ValueError` when the runs cannot be
    pooled. `base_methods[name]` is the base run's name of the added run's method `name` (default: the same name)."""
    _require_same_setting(base, added, same_prompts=False)
    base_methods = dict(base_methods or {})
    added_by_name = {m["name"]: m for m in added["methods"]}
    base_by_name = {m["name"]: m for m in base["methods"]}
    unknown = sorted(set(base_methods) - set(added_by_name))
    if unknown:
        raise ValueError(f"--base-method: {unknown} are not methods of the added run ({list(added_by_name)}). Fix: "
                         "name the added run's method before '=' and the base run's after it.")
    source = {name: base_methods.get(name, name) for name in added_by_name}
    missing = [f"{old!r}" + (f" (for {name!r})" if old != name else "") for name, old in source.items()
               if old not in base_by_name]
    if missing:
        raise ValueError(f"--pool: the base run has no method {', '.join(missing)} (its methods: {list(base_by_name)})."
                         " Fix: pool runs of the same methods, naming a renamed one with --base-method NEW=OLD.")
    differing = [f"{name}: {key} {base_by_name[old].get(key)!r} vs {added_by_name[name].get(key)!r}"
                 for name, old in source.items() for key in metrics.SAME_METHOD_OPTIONS
                 if base_by_name[old].get(key) != added_by_name[name].get(key)]
    if differing:
        raise ValueError("--pool: a method ran with other options in the two runs (" + "; ".join(differing[:5])
                         + "). Fix: pool runs of the same methods and options.")
    renamed = {old: name for name, old in source.items()}
    records = [{**r, "method": renamed[r["method"]]} for r in base["records"] if r["method"] in renamed]
    records += added["records"]
    names = [m["name"] for m in added["methods"]]
    aggregates = metrics.aggregate(records, names)
    aggregates["cost_model"] = metrics.run_cost_model(base)
    _keep_per_length_costs(base, aggregates)
    selection = {
        "summary": f"{base['selection']['summary']}; pooled with {added['selection']['summary']}",
        "prompt_ids": base["selection"]["prompt_ids"] + added["selection"]["prompt_ids"],
    }
    pooled = {
        "base": base_path,
        "added": added_path,
        "added_commit": added["machine"]["git"]["commit"],
        "base_methods": {name: old for name, old in source.items() if old != name},
        "base_prompts": len(base["selection"]["prompt_ids"]),
        "added_prompts": len(added["selection"]["prompt_ids"]),
        "added_cost_model": metrics.run_cost_model(added),
    }
    pooled_results = {**base, "methods": added["methods"], "selection": selection, "aggregates": aggregates,
                      "records": records, "pooled": pooled}
    if "merged" in base:  # a merged base keeps its header; its measured-over-anchor table covers its prompts only
        pooled_results["merged"] = {k: v for k, v in base["merged"].items() if k != "measured_over_anchor"}
    return pooled_results


def _name_pairs(pairs: list[str]) -> dict[str, str]:
    """`["NEW=OLD", ...]` → {NEW: OLD}."""
    bad = [p for p in pairs if p.count("=") != 1 or not all(p.split("="))]
    if bad:
        raise ValueError(f"--base-method: got {bad}; expected NEW=OLD, e.g. "
                         "semspec:fly/tapout=semspec:fly/tapout@2cc35ec. Fix: one '=' between the added run's method "
                         "name and the base run's.")
    return dict(p.split("=") for p in pairs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", type=Path, help="results JSON of the run with the reference methods (the sweep)")
    parser.add_argument("added", type=Path, help="results JSON of a run with new methods and at least one anchor")
    parser.add_argument("--name", required=True, help="stem of the merged .json/.md/.png")
    parser.add_argument("--output-dir", type=Path, default=None, help="default: the base run's folder")
    parser.add_argument("--changed", nargs="+", default=[], help="methods of both runs whose code changed in "
                        "between: not anchors; the added run's join as METHOD@<added commit>")
    parser.add_argument("--pool", action="store_true", help="the runs measured the same methods on different "
                        "prompts: one report over both runs' prompts")
    parser.add_argument("--base-method", nargs="+", default=[], metavar="NEW=OLD", help="with --pool: the base "
                        "run's name OLD of the added run's method NEW")
    args = parser.parse_args(argv)
    if (args.pool and args.changed) or (args.base_method and not args.pool):
        parser.error("--changed goes with a merge, --base-method with --pool; got "
                     f"--pool={args.pool}, --changed={args.changed}, --base-method={args.base_method}")
    base, added = (markdown.load_results(p, "run", flag) for p, flag in ((args.base, "base"), (args.added, "added")))
    if args.pool:
        results = pool_runs(base, added, args.base.name, args.added.name, _name_pairs(args.base_method))
    else:
        results = merge_runs(base, added, args.base.name, args.added.name, args.changed)
    folder = args.output_dir or args.base.parent
    folder.mkdir(parents=True, exist_ok=True)
    markdown.write_json(folder / f"{args.name}.json", results)
    (folder / f"{args.name}.md").write_text(report.render_markdown(results), encoding="utf-8")
    report.write_plot(folder / f"{args.name}.png", results)
    print(f"Wrote {args.name}.json/.md to {folder}")


if __name__ == "__main__":
    main()
