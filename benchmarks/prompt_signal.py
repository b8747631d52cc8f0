"""Does the draft's fit to the prompt say which prompts gain from long rounds? A per-prompt signal, measured.

    python -m benchmarks.prompt_signal benchmarks/results/draft-length-fly-3-per-category.json \\
        benchmarks/results/draft-length-fly-math-reasoning-held-out.json --name fly-prompt-signal

Why: with `fly` the best fixed length is 3 on prose and 12–16 on math, code and math_reasoning
(`draft-length-fly-9-math-reasoning.md`), and `tapout` learns one behaviour across prompts, so it falls short where
long rounds win (`draft-length-findings.md`). A policy could only tell those prompts apart from something it sees
before or while decoding. This measures one such thing, read off the prompt before the first round: teacher-forced
on the prompt's user message (the chat template's fixed head and tail left out, `user_span`),

    hit   = share of the message's tokens that the draft's greedy prediction gets right
    agree = share of its positions where the draft's and the target's greedy predictions are the same token

and, per prompt of the given runs (fixed-length sweeps with greedy decoding),

    gain  = modeled tokens/s of `--long` over `--short` (γ = 16 over γ = 3 by default), each run's cost model

then Spearman's rank correlation of hit and agree with log gain, per run and over all prompts (a prompt in two runs
counted once, with its first run's gain). Costs two forwards over each prompt, no generation. Written to
`benchmarks/results/<name>.json` and `.md`.

With `--cut H`, a hit fixed before the runs (say, the median of earlier prompts), it also tests that cut on them: how
many prompts on each side the long length won, and `splice`, the speed of taking `--above`'s records (default
`--long`) on the prompts above the cut and `--below`'s (default `tapout`) on the others, against the best fixed length.
"""

from __future__ import annotations

import os

os.environ.setdefault("MKL_CBWR", "AUTO")  # before torch, as in run.py

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from . import data, markdown, metrics, resolution  # noqa: E402
from .models import load_pair  # noqa: E402

RESULTS_DIR = data.REPO_ROOT / "benchmarks" / "results"
MISSING_METHOD_FIX = "pass a fixed-length sweep and name its methods with --long, --short, --above and --below."


def user_span(ids: list[int], empty_ids: list[int]) -> tuple[int, int]:
    """(start, stop): the tokens of `ids` (a chat-templated prompt) that are not in `empty_ids` (the same template
    around an empty message), i.e. ids[start:stop] is the user's message. Raises when nothing is left."""
    head = 0
    while head < min(len(ids), len(empty_ids)) and ids[head] == empty_ids[head]:
        head += 1
    tail = 0
    while tail < min(len(ids), len(empty_ids)) - head and ids[-1 - tail] == empty_ids[-1 - tail]:
        tail += 1
    if head == 0 or len(ids) - tail <= head:
        raise ValueError(f"no user message between the template's {head} head and {tail} tail tokens of a "
                         f"{len(ids)}-token prompt. Fix: pass a prompt with a non-empty message.")
    return head, len(ids) - tail


def predicted_right(logits: torch.Tensor, ids: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Whether the greedy prediction at position j − 1 (`logits` of shape `(length, vocab)`) is ids[j], for j in
    [start, stop): shape `(stop − start,)`, bool."""
    return logits[start - 1 : stop - 1].argmax(-1) == ids[start:stop]


def same_prediction(draft_logits: torch.Tensor, target_logits: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Whether the two models' greedy predictions agree at positions start − 1 … stop − 2 (those predicting the
    message's tokens): shape `(stop − start,)`, bool."""
    return draft_logits[start - 1 : stop - 1].argmax(-1) == target_logits[start - 1 : stop - 1].argmax(-1)


def ranks(values: list[float]) -> list[float]:
    """Ranks 1..n, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    result = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for position in order[i : j + 1]:
            result[position] = (i + j) / 2 + 1
        i = j + 1
    return result


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation: Pearson's on the ranks (nan when either side is constant)."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError(f"spearman needs two lists of the same length ≥ 2, got {len(xs)} and {len(ys)}")
    rx, ry = ranks(xs), ranks(ys)
    mean = (len(xs) + 1) / 2
    covariance = sum((a - mean) * (b - mean) for a, b in zip(rx, ry))
    spread = math.sqrt(sum((a - mean) ** 2 for a in rx) * sum((b - mean) ** 2 for b in ry))
    return covariance / spread if spread > 0 else math.nan


def gains(results: dict, long: str, short: str) -> dict[str, dict]:
    """prompt id → {"category", "gain"}: modeled tokens/s of `long` over `short` on that prompt, at the run's cost
    model. Raises when the run lacks either method."""
    values = resolution.modeled_speeds(results, [long, short], MISSING_METHOD_FIX)
    category = resolution.categories_of(results)
    return {p: {"category": category[p], "gain": values[long][p] / values[short][p]}
            for p in values[long] if p in values[short]}


def splice(values: dict[str, dict[str, float]], categories: dict[str, str], hits: dict[str, float], cut: float,
           above: str, below: str, fixed: list[str]) -> list[dict]:
    """What switching on the signal would have given, read off the run's records (nothing is decoded, and each
    method's records come from a run that did not switch, so it estimates a policy that reads the hit before its first
    round; it is not one): on each prompt of `categories`, `above`'s speed where its hit > `cut`, else `below`'s. Per
    category, then "overall": the geometric mean over the prompts of the splice and of `below` alone, each as a ratio
    to the best of the `fixed` methods there (`resolution.best_fixed`). `values` as `resolution.modeled_speeds`;
    raises when a prompt lacks a method or a hit."""
    for p in categories:
        missing = [m for m in [*fixed, above, below] if p not in values.get(m, {})]
        missing += ["its hit"] if p not in hits else []
        if missing:
            raise ValueError(f"prompt {p} has no {', '.join(missing)}. Fix: pass runs in which every prompt ran every "
                             "method, and measure the hit of each.")
    spliced = {p: values[above][p] if hits[p] > cut else values[below][p] for p in categories}
    rows = []
    for label in sorted(set(categories.values())) + ["overall"]:
        chosen = [p for p, category in categories.items() if label in ("overall", category)]
        best = resolution.best_fixed(values, fixed, chosen)
        reference = metrics.geometric_mean([values[best][p] for p in chosen])
        rows.append({"category": label, "prompts": len(chosen), "best_fixed": best,
                     "below": metrics.geometric_mean([values[below][p] for p in chosen]) / reference,
                     "splice": metrics.geometric_mean([spliced[p] for p in chosen]) / reference})
    return rows


def first_of_each_prompt(rows: list[dict]) -> list[dict]:
    """Each prompt's first row: a prompt that two runs measured (say, held-out prompts of one category in both) counts
    once when the runs are pooled."""
    first: dict[str, dict] = {}
    for row in rows:
        first.setdefault(row["prompt_id"], row)
    return list(first.values())


def cut_section(runs: dict[str, dict], rows: list[dict], cut: float, above: str, below: str) -> list[str]:
    """The markdown of `--cut`: the prompts on each side of the cut and how many of them the long length won, then
    `splice` over every run's prompts (each run at its own cost model)."""
    chosen = first_of_each_prompt(rows)
    sides = [("above", [r for r in chosen if r["hit"] > cut]), ("at or below", [r for r in chosen if r["hit"] <= cut])]
    lines = ["", f"## A cut fixed beforehand: hit > {cut:g}", ""]
    lines += markdown.table(["side", "prompts", "long wins"],
                            [[name, str(len(side)), str(sum(r["gain"] > 1 for r in side))] for name, side in sides])
    hits = {r["prompt_id"]: r["hit"] for r in chosen}
    for run_name, results in runs.items():
        # first: names a method the run lacks
        values = resolution.modeled_speeds(results, [above, below], MISSING_METHOD_FIX)
        rule = next(m["rule"] for m in results["methods"] if m["name"] == below)
        fixed = resolution.fixed_lengths(results["methods"], rule)
        values.update(resolution.modeled_speeds(results, fixed, MISSING_METHOD_FIX))
        categories = {p: c for p, c in resolution.categories_of(results).items() if p in hits}
        table = [[r["category"], str(r["prompts"]), f"`{r['best_fixed']}`", f"{r['below']:.2f}", f"{r['splice']:.2f}"]
                 for r in splice(values, categories, hits, cut, above, below, fixed)]
        lines += ["", f"`{run_name}`: modeled tokens/s (the run's cost model) as a ratio to the best fixed length; "
                  f"*splice*: `{above}` on the prompts above the cut, `{below}` on the others.", ""]
        lines += markdown.table(["category", "prompts", "best fixed", f"`{below}`", "splice"], table)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="results JSONs of fixed-length sweeps (benchmarks/run.py)")
    parser.add_argument("--long", default="semspec:fly/constant:16", help="the long fixed length's method name")
    parser.add_argument("--short", default="semspec:fly/constant:3", help="the short fixed length's method name")
    parser.add_argument("--cut", type=float, default=None,
                        help="a hit fixed before these runs (e.g. from earlier ones): report how it splits the prompts "
                        "and what --above above it and --below below it would have given (`splice`)")
    parser.add_argument("--above", default=None, help="with --cut, the method above it (default: --long)")
    parser.add_argument("--below", default="semspec:fly/tapout", help="with --cut, the method below it")
    parser.add_argument("--data-dir", type=Path, default=data.DEFAULT_DATA_DIR)
    parser.add_argument("--name", default="fly-prompt-signal")
    args = parser.parse_args(argv)

    try:
        markdown.check_distinct_file_names(args.runs, "runs")
    except ValueError as error:
        parser.error(str(error))
    runs = {path.name: json.loads(path.read_text(encoding="utf-8")) for path in args.runs}
    texts = {p.prompt_id: p.text for p in data.load_question_prompts(args.data_dir / data.SPECBENCH_FILE, 64)}
    pair = load_pair("qwen")
    empty_ids = pair.encode("")["input_ids"][0].tolist()
    signals: dict[str, dict] = {}  # prompt id → its signal, measured once however many runs have the prompt

    def signal(prompt_id: str) -> dict:
        if prompt_id not in signals:
            ids = pair.encode(texts[prompt_id])["input_ids"]
            start, stop = user_span(ids[0].tolist(), empty_ids)
            with torch.no_grad():
                draft_logits = pair.draft(input_ids=ids).logits[0].float()
                target_logits = pair.target(input_ids=ids).logits[0].float()
            signals[prompt_id] = {
                "message_tokens": stop - start,
                "hit": float(predicted_right(draft_logits, ids[0], start, stop).float().mean()),
                "agree": float(same_prediction(draft_logits, target_logits, start, stop).float().mean())}
        return signals[prompt_id]

    rows = []
    for run_name, results in runs.items():
        for prompt_id, gain in gains(results, args.long, args.short).items():
            rows.append({"run": run_name, "prompt_id": prompt_id, **gain, **signal(prompt_id)})
            print(f"{rows[-1]['category']:15s} {prompt_id}: hit {rows[-1]['hit']:.2f}, agree "
                  f"{rows[-1]['agree']:.2f}, gain {gain['gain']:.2f}", flush=True)

    def correlations(chosen: list[dict]) -> list[str]:
        log_gain = [math.log(r["gain"]) for r in chosen]
        return [f"{spearman([r[key] for r in chosen], log_gain):+.2f}" for key in ("hit", "agree")]

    groups = [(name, [r for r in rows if r["run"] == name]) for name in runs] + [("all", first_of_each_prompt(rows))]
    summary = [[f"`{name}`", str(len(chosen)), *correlations(chosen),
                f"{sum(r['gain'] > 1 for r in chosen)}"] for name, chosen in groups]
    by_hit = [[f"{r['hit']:.2f}", f"{r['agree']:.2f}", f"{r['gain']:.2f}", r["category"], r["prompt_id"],
               str(r["message_tokens"]), f"`{r['run']}`"] for r in sorted(rows, key=lambda r: r["hit"])]
    lines = [f"# The draft's fit to the prompt against the gain of `{args.long}` over `{args.short}`", "",
             "hit: share of the user message's tokens the draft predicts (greedy, teacher-forced on the prompt); "
             "agree: share of those positions where the draft and the target predict the same token; gain: modeled "
             "tokens/s of the long length over the short one on the prompt (each run's cost model). Spearman's ρ "
             "with log gain; *long wins*: prompts with gain > 1.", ""]
    lines += markdown.table(["run", "prompts", "ρ(hit, gain)", "ρ(agree, gain)", "long wins"], summary)
    lines += ["", "Prompts by hit:", ""]
    lines += markdown.table(["hit", "agree", "gain", "category", "prompt", "message tokens", "run"], by_hit)
    if args.cut is not None:
        lines += cut_section(runs, rows, args.cut, args.above or args.long, args.below)
    # write_json writes the Paths among the arguments as strings
    markdown.write_summary(RESULTS_DIR, args.name, "\n".join(lines) + "\n",
                           {"config": vars(args), "torch": torch.__version__, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
