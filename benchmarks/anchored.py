"""Measured speed of methods that ran in different runs, each over an anchor measured in the same run.

    python -m benchmarks.anchored --anchor semspec:fly/constant:3 --name NAME \\
        --runs "tapout=RUN_A.json,RUN_B.json" "tapout@491e890=RUN_C.json,RUN_D.json"

Why: a merged or pooled report (`benchmarks/merge.py`) shows each method's measured speed-up against its own run's
plain decoding, and the machine moves between runs: on the reference CPU the draft step cost 0.23 to 0.30 of a target
step from one run to the next, and `fly` with γ = 3, the same target forwards and drafts in every run, measured 1.18×
to 1.45× plain. So the measured speed-ups of methods from different runs are not comparable. Within a run the methods
are interleaved per prompt, so the method's tokens/s over the anchor's on the same prompt, in the same run, is.

For each entry LABEL=FILE[,FILE...] (the method is LABEL's part before '@', prefixed with the anchor's rule): the
geometric mean over the files' prompts of method tokens/s / anchor tokens/s, per file and over all of them. Written to
`benchmarks/results/<name>.md` and `.json`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import markdown, metrics

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def over_anchor(results: dict, method: str, anchor: str) -> dict[str, float]:
    """prompt → the method's measured tokens/s over the anchor's on that prompt, in this run. Refuses a merge of
    runs (`benchmarks/merge.py`): there a method's records and the anchor's may come from different runs."""
    if "merged" in results:
        merged = results["merged"]
        raise ValueError(f"a merge of runs ({merged.get('base')} + {merged.get('added')}): its records of {method!r} "
                         f"and of {anchor!r} may come from different runs, which makes their ratio compare two "
                         "machines' states. Fix: pass the runs it merges, or read its table 'Measured over <anchor> in "
                         "the same run'.")
    speeds: dict[str, dict[str, float]] = {}
    for r in results["records"]:
        if r["method"] in (method, anchor):
            speeds.setdefault(r["method"], {})[r["prompt_id"]] = r["tokens_per_s"]
    for name in (method, anchor):
        if name not in speeds:
            measured = sorted({r["method"] for r in results["records"]})
            raise ValueError(f"no records of {name!r} in this run (its methods: {measured}); name a method and an "
                             "anchor that both ran in it")
    return {p: speed / speeds[anchor][p] for p, speed in speeds[method].items() if p in speeds[anchor]}


def method_options(run: dict, name: str) -> dict:
    """The options that make `name` the same method in another run (`metrics.SAME_METHOD_OPTIONS`)."""
    described = next((m for m in run.get("methods", []) if m["name"] == name), {})
    return {key: described.get(key) for key in metrics.SAME_METHOD_OPTIONS}


def check_same_method(first: dict, results: dict, method: str, first_path: str, path: str, label: str) -> None:
    """Raises unless `results` ran `method` with the options `first` ran it with: a label pools one method's ratios,
    not two policies that share a name."""
    a, b = method_options(first, method), method_options(results, method)
    if a != b:
        raise ValueError(f"{path}: {method} is not the method of {first_path} that --runs {label!r} pools "
                         f"({ {k: (a[k], b[k]) for k in a if a[k] != b[k]} }, as (first, this)). Fix: give each "
                         "configuration its own label.")


def check_same_anchor(first: dict, results: dict, anchor: str, first_path: str, path: str) -> None:
    """Raises unless `results` ran `anchor` as `first` did: the same models, dtypes and token budgets, decoding mode
    and anchor options (rule, its options, policy and its config), which is what makes it the same forwards in both."""
    def anchor_options(run: dict) -> dict:
        return method_options(run, anchor)

    differ = metrics.differing_setups(first, results)
    for what, (a, b) in ((f"{anchor} options", (anchor_options(first), anchor_options(results))),
                         ("--sample", (metrics.run_options(first)["sample"], metrics.run_options(results)["sample"]))):
        if a != b:
            differ[what] = (a, b)
    if differ:
        raise ValueError(f"{path}: not the same experiment as {first_path} ({differ}, as (first, this)): the anchor "
                         "must make the same forwards in every run. Fix: pass runs of one pair, budget, decoding mode "
                         "and anchor.")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--anchor", required=True, help="a method every run measured with the same forwards")
    parser.add_argument("--runs", nargs="+", required=True, help="LABEL=FILE[,FILE...]: the method (LABEL before "
                        "'@', with the anchor's rule) and the runs it was measured in")
    parser.add_argument("--name", required=True)
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    rule = args.anchor.split("/", 1)[0]
    rows, summary = [], {"anchor": args.anchor, "methods": {}}
    first: tuple[str, dict] | None = None  # the first file read: every other must be the same experiment
    for entry in args.runs:
        label, equals, files = entry.rpartition("=")  # a label may hold "=" (options), the files do not
        if not equals or not files:
            raise ValueError(f"--runs: got {entry!r}; expected LABEL=FILE[,FILE...], e.g. "
                             "tapout=benchmarks/results/draft-length-every-policy-fly-after-review.json")
        method = f"{rule}/{label.split('@', 1)[0]}"
        markdown.check_distinct_file_names(files.split(","), f"--runs {label!r}")
        per_file = {}
        first_of_label: tuple[str, dict] | None = None  # the label's first file: its method's options for the rest
        for name in files.split(","):
            results = json.loads(Path(name).read_text(encoding="utf-8"))
            first = first or (name, results)
            check_same_anchor(first[1], results, args.anchor, first[0], name)
            first_of_label = first_of_label or (name, results)
            check_same_method(first_of_label[1], results, method, first_of_label[0], name, label)
            per_file[Path(name).name] = over_anchor(results, method, args.anchor)
        pooled = [v for ratios in per_file.values() for v in ratios.values()]
        summary["methods"][label] = {"method": method, "per_file": per_file,
                                     "geomean": metrics.geometric_mean(pooled), "prompts": len(pooled)}
        cells = [f"{metrics.geometric_mean(list(r.values())):.3f} ({len(r)})" for r in per_file.values()]
        rows.append([f"`{label}`", " / ".join(cells), f"{metrics.geometric_mean(pooled):.3f} ({len(pooled)})"])
    text = "\n".join([
        f"# Measured tokens/s over `{args.anchor.split('/', 1)[1]}` in the same run", "",
        "Geometric mean over prompts of the method's measured tokens/s over the anchor's on the same prompt in the "
        "same run (in brackets, prompts); per run, then over all. `benchmarks/anchored.py` explains.", "",
        *markdown.table(["method", "per run", "all"], rows)]) + "\n"
    markdown.write_summary(args.output_dir, args.name, text, summary)
    return summary


if __name__ == "__main__":
    main()
