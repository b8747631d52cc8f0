"""What a round costs at each draft length on this machine, and what the draft-length tables look like priced by it.

    python -m benchmarks.verify_cost                        # k = 0..40, 5 repeats, ~5 min
    python -m benchmarks.verify_cost --cached-tokens 160 --name verify-cost-160   # a cache as long as late rounds'
    python -m benchmarks.verify_cost --reprice benchmarks/results/draft-length-every-policy-fly-after-review.json

Why: the draft-length reports price a generation by a line, a·F + b·D (target forwards F, drafted tokens D;
`metrics.fit_round_costs`). A round drafting k tokens then costs a + b·k. But the target's verify forward over k + 1
tokens is not linear in k on a CPU (MKL picks its kernels by shape), so a policy whose rounds are longer or shorter
than the sweep's average can be priced wrong, and its measured speed-up can differ from the modeled one.

What it measures (reference pair, target fp32, draft bf16; forwards only, no decoding): the prompt of the quick
profile's first prompt is prefilled into a `DynamicCache`; then, in `--repeats` passes over the lengths in a rotating
order, the target's forward over k + 1 new tokens (the verify of k drafts) and the draft's one-token forward (a draft
step) are timed, and the cache is cropped back after each. Per k: the median v(k); the draft step d is the median
over all its timings.

With `--reprice FILE.json`, every generation of that report is priced again as Σ_k n_k·v(k) + D·d, n_k being its
rounds that drafted k (from `acceptance_stats.drafted_per_position`; plain's forwards are k = 0), and the report's
draft-length comparison (ratio of each policy to the best fixed length, geometric means over prompts) is shown
under both pricings. Written to `benchmarks/results/<name>.json` and `.md`.
"""

from __future__ import annotations

import os

os.environ.setdefault("MKL_CBWR", "AUTO")  # before torch, as in run.py

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks import data, markdown, metrics, resolution  # noqa: E402
from benchmarks.resolution import WITHIN  # noqa: E402

RESULTS_DIR = data.REPO_ROOT / "benchmarks" / "results"


def fitted_line(verify_seconds: dict[int, float], records: list[dict]) -> dict[int, float]:
    """k → α + β·k, least squares through the measured v(k) weighted by how many of the records' rounds drafted k:
    the line a report would fit to today's costs, so that line vs v(k) isolates the shape of the verify cost."""
    weights: dict[int, float] = {}
    for record in records:
        for k, n in metrics.rounds_by_length(record).items():
            weights[k] = weights.get(k, 0) + n
    total = sum(weights.values())
    mean_k = sum(w * k for k, w in weights.items()) / total
    mean_v = sum(w * verify_seconds[k] for k, w in weights.items()) / total
    spread = sum(w * (k - mean_k) ** 2 for k, w in weights.items())
    slope = sum(w * (k - mean_k) * (verify_seconds[k] - mean_v) for k, w in weights.items()) / spread
    return {k: mean_v + slope * (k - mean_k) for k in verify_seconds}


def reprice(results: dict, verify_seconds: dict[int, float], draft_step: float) -> dict[str, dict]:
    """Per rule: {"rows": [(label, best_linear, best_length, {policy: (linear ratio, per-length ratio)})]}."""
    costs = metrics.run_cost_model(results)
    by_length = {"verify_seconds": verify_seconds, "seconds_per_draft_forward": draft_step}
    records = results["records"]
    described = [m for m in results["methods"] if m.get("draft_length")]
    out = {}
    for rule in dict.fromkeys(m["rule"] for m in described):
        fixed = resolution.fixed_lengths(described, rule)
        policies = resolution.adaptive_policies(described, rule)
        labels = ["overall"] + list(dict.fromkeys(r["category"] for r in records))
        rows = []
        for label in labels:
            def speed(name: str, linear: bool) -> float:
                mine = [r for r in records if r["method"] == name and label in ("overall", r["category"])]
                return metrics.geometric_mean([
                    metrics.modeled_tokens_per_s(r, costs if linear else by_length) for r in mine])
            best_linear = max(fixed, key=lambda n: speed(n, True))
            best_length = max(fixed, key=lambda n: speed(n, False))
            rows.append((label, best_linear, best_length, {
                n: (speed(n, True) / speed(best_linear, True), speed(n, False) / speed(best_length, False))
                for n in policies}))
        out[rule] = {"rows": rows}
    return out


def cached_ids(pair, data_dir: Path, cached_tokens: int | None) -> torch.Tensor:
    """`[1, L]` ids to prefill: the quick profile's first prompt (L = 51 with the reference tokenizer), or, with
    `cached_tokens`, the quick profile's prompts chat-encoded one after another and cut to that many tokens, so that
    the verify forwards attend over a cache as long as a round's late in a 128-token answer."""
    from benchmarks.models import quick_profile_ids

    return quick_profile_ids(pair.encode, data_dir, cached_tokens, "--cached-tokens")


def measure(max_k: int, repeats: int, data_dir: Path,
            cached_tokens: int | None = None) -> tuple[dict[int, list[float]], list[float], int]:
    """(k → verify seconds of each pass, draft-step seconds, cached prompt tokens) on the reference pair."""
    from benchmarks.models import load_pair
    from hf_semspec._transformers_compat import CACHE_ARGUMENT
    from transformers import DynamicCache

    pair = load_pair("qwen")
    ids = cached_ids(pair, data_dir, cached_tokens)
    length = ids.shape[1]
    verify: dict[int, list[float]] = {k: [] for k in range(max_k + 1)}
    draft_steps: list[float] = []
    with torch.inference_mode():
        target_cache, draft_cache = DynamicCache(), DynamicCache()
        pair.target(input_ids=ids, **{CACHE_ARGUMENT: target_cache}, use_cache=True)
        pair.draft(input_ids=ids, **{CACHE_ARGUMENT: draft_cache}, use_cache=True)
        lengths = list(range(max_k + 1))
        for repeat in range(repeats):
            shift = repeat * len(lengths) // repeats  # each pass starts elsewhere, so no length always runs first
            for k in lengths[shift:] + lengths[:shift]:
                new = ids[:, -(k + 1):] if k + 1 <= length else ids[:, :1].repeat(1, k + 1)
                start = time.perf_counter()
                pair.target(input_ids=new, **{CACHE_ARGUMENT: target_cache}, use_cache=True)
                verify[k].append(time.perf_counter() - start)
                target_cache.crop(-(k + 1))  # a negative count: the tokens to remove (as decoding.py does)
                start = time.perf_counter()
                pair.draft(input_ids=ids[:, -1:], **{CACHE_ARGUMENT: draft_cache}, use_cache=True)
                draft_steps.append(time.perf_counter() - start)
                draft_cache.crop(-1)
            print(f"pass {repeat + 1}/{repeats}: v(0) {verify[0][-1]:.3f} s, v({max_k}) {verify[max_k][-1]:.3f} s",
                  flush=True)
    return verify, draft_steps, length


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-k", type=int, default=None,
                        help="longest draft measured (a forward over k + 1 tokens; default 40)")
    parser.add_argument("--repeats", type=int, default=None, help="passes over k = 0..max-k (default 5)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads, as in run.py (default 2)")
    parser.add_argument("--reprice", type=Path, nargs="*", default=[], help="draft-length reports to price again")
    parser.add_argument("--measured", type=Path, default=None, help="reuse the measurement of an earlier JSON")
    parser.add_argument("--cached-tokens", type=int, default=None, help="tokens in the cache the verify forwards "
                        "attend over (default: the first quick-profile prompt's, 51)")
    parser.add_argument("--data-dir", type=Path, default=data.DEFAULT_DATA_DIR)
    parser.add_argument("--name", default="verify-cost")
    args = parser.parse_args(argv)
    if args.measured is not None:
        # Re-used, not measured: the options of a measurement would be recorded without having applied.
        given = [flag for flag, value in (("--max-k", args.max_k), ("--repeats", args.repeats),
                                          ("--threads", args.threads), ("--cached-tokens", args.cached_tokens))
                 if value is not None]
        if given:
            parser.error(f"--measured {args.measured} re-uses that measurement, so {', '.join(given)} would not "
                         "apply. Fix: drop them, or measure again without --measured.")
        previous = json.loads(args.measured.read_text(encoding="utf-8"))
        verify = {int(k): v for k, v in previous["verify_seconds_per_pass"].items()}
        draft_steps, prompt_tokens = previous["draft_step_seconds"], previous["prompt_tokens"]
        threads, torch_version = previous.get("threads"), previous.get("torch")
    else:
        threads, torch_version = args.threads if args.threads is not None else 2, torch.__version__
        torch.set_num_threads(threads)
        verify, draft_steps, prompt_tokens = measure(args.max_k if args.max_k is not None else 40,
                                                     args.repeats if args.repeats is not None else 5, args.data_dir,
                                                     args.cached_tokens)
    medians = {k: statistics.median(v) for k, v in verify.items()}
    draft_step = statistics.median(draft_steps)
    lines = [f"# Verify cost by draft length: reference pair, {threads} threads, "
             f"{prompt_tokens} cached prompt tokens, {len(verify[0])} passes", "",
             f"Draft step (one-token forward of the draft), median: {draft_step:.3f} s.", ""]
    lines += markdown.table(
        ["k (drafts)", "target forward over k + 1 tokens, median", "min", "max", "/ k = 0"],
        [[str(k), f"{medians[k]:.3f} s", f"{min(v):.3f}", f"{max(v):.3f}", f"{medians[k] / medians[0]:.2f}"]
         for k, v in verify.items()])
    summary = {"prompt_tokens": prompt_tokens, "threads": threads, "torch": torch_version,
               "verify_seconds_per_pass": verify, "verify_seconds": medians, "draft_step_seconds": draft_steps,
               "draft_step": draft_step, "repriced": {}}
    RESULTS_DIR.mkdir(exist_ok=True)
    markdown.write_json(RESULTS_DIR / f"{args.name}.json", summary)  # the measurement, before repricing can fail
    for path in args.reprice:
        results = json.loads(path.read_text(encoding="utf-8"))
        costs = metrics.run_cost_model(results)
        repriced = reprice(results, medians, draft_step)
        line = fitted_line(medians, [r for r in results["records"] if r.get("acceptance_stats")])
        on_line = reprice(results, line, draft_step)
        summary["repriced"][path.name] = {"by_length": repriced, "todays_line": on_line}
        lines += ["", f"## `{path.name}` priced by the line and by length", "",
                  f"The report's line: {metrics.describe_costs(costs)}. By length: v(k) above + "
                  f"{draft_step:.3f} s per drafted token. Today's line: v(k) replaced by the line through it, weighted "
                  "by the report's rounds at each k (`fitted_line`), which separates the shape of v(k) from the change "
                  "of costs since the run. Each cell: ratio to the best fixed length of the row, priced by the "
                  "report's line → today's line → by length.", ""]
        for rule, table in repriced.items():
            rows, line_rows = table["rows"], on_line[rule]["rows"]  # [0] is "overall", then the categories
            names = list(rows[0][3])
            body = [[label, f"`{best_linear.split('/', 1)[1]}` → `{best_length.split('/', 1)[1]}`"]
                    + [f"{ratios[n][0]:.2f} → {line_row[3][n][1]:.2f} → {ratios[n][1]:.2f}" for n in names]
                    for (label, best_linear, best_length, ratios), line_row in zip(rows, line_rows)]
            lines += [f"`{rule}`:", ""] + markdown.table(
                ["category", "best fixed (report's line → by length)"] + [f"`{n.split('/', 1)[1]}`" for n in names],
                body)

            def within(category_rows: list, name: str, pricing: int) -> int:
                """Categories where `name`'s ratio under `pricing` (0: the report's line, 1: the v(k) given) is
                within 3% of the best fixed length."""
                return sum(row[3][name][pricing] >= WITHIN for row in category_rows[1:])

            counts = [f"`{n.split('/', 1)[1]}` {within(rows, n, 0)} → {within(line_rows, n, 1)} → "
                      f"{within(rows, n, 1)} of {len(rows) - 1}" for n in names]
            lines += ["", f"Categories within 3% of the best fixed length (report's line → today's line → by length): "
                      f"{', '.join(counts)}.", ""]
    markdown.write_summary(RESULTS_DIR, args.name, "\n".join(lines) + "\n", summary)
    return summary


if __name__ == "__main__":
    main()
