"""What `dropmatch`'s K dropout heads cost per round on this CPU, with and without computing only the rows that can
change a verdict.

    python benchmarks/dropmatch_cost.py --output benchmarks/results/dropmatch-cost     # ~1 min

The rule's `accept()` on the reference target's LM-head shape (V = 151,936, H = 1536, float32 weight, random values:
the cost does not depend on them), γ = 5, K = 5, greedy. `all rows`: heads on every draft position (what an
accelerator computes); `rows exact rejects`: the default on CPU, heads only where the draft is not the target's
argmax, here `--mismatches` of the γ positions (GSM8K with `exact` keeps 84% of the drafts: about one mismatch per
round of 5). Both give the same verdicts (tests/test_dropmatch_rule.py). Medians over `--repeats` rounds, in one
process, interleaved.
"""

from __future__ import annotations

import os

os.environ.setdefault("MKL_CBWR", "AUTO")  # before torch

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from hf_semspec.rules import RULES, VerificationInput  # noqa: E402
from hf_semspec.rules.dropmatch import DropMatchRule  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--hidden", type=int, default=1536)
    parser.add_argument("--gamma", type=int, default=5)
    parser.add_argument("--mismatches", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(args.vocab, args.hidden, generator=g) * 0.02
    hidden = torch.randn(1, args.gamma + 1, args.hidden, generator=g)
    logits = hidden @ weight.T
    drafts = logits[:, :-1].argmax(-1).clone()
    drafts[0, : args.mismatches] = (drafts[0, : args.mismatches] + 1) % args.vocab
    select = DropMatchRule.__dict__["rows_to_test"]  # the staticmethod object, to put back as it was

    def one_round(all_rows: bool) -> float:
        DropMatchRule.rows_to_test = staticmethod(lambda s, n, d: None) if all_rows else select
        try:
            rule = RULES.build("dropmatch", {})
            start = time.perf_counter()
            rule.accept(VerificationInput(drafts, logits, None, hidden, weight))
            return time.perf_counter() - start
        finally:
            DropMatchRule.rows_to_test = select

    timings = {"all rows": [], "rows exact rejects": []}
    one_round(True), one_round(False)  # warm-up
    for _ in range(args.repeats):
        for name in timings:
            timings[name].append(one_round(name == "all rows"))
    medians = {name: 1000 * statistics.median(values) for name, values in timings.items()}
    lines = [f"dropmatch heads per round (K = 5, γ = {args.gamma}, {args.mismatches} mismatch(es), V = {args.vocab:,}, "
             f"H = {args.hidden}, float32, {args.threads} threads), median of {args.repeats}:", "",
             "| heads on | ms per round |", "| --- | --- |"]
    lines += [f"| {name} | {ms:.1f} |" for name, ms in medians.items()]
    lines += ["", f"Ratio: {medians['rows exact rejects'] / medians['all rows']:.2f}."]
    text = "\n".join(lines)
    print(text)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.with_suffix(".md").write_text("# dropmatch: cost of the heads\n\n" + text + "\n")
        args.output.with_suffix(".json").write_text(json.dumps(
            {"config": {k: str(v) for k, v in vars(args).items()}, "median_ms": medians,
             "timings_s": timings}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
