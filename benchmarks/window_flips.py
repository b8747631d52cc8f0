"""How often `fly` keeps a mismatch that its deferred window could keep: φ, the rate `cost_aware` learns.

    python benchmarks/window_flips.py                     # γ = 16, the quick profile's 10 prompts x 64 tokens, ~6 min
    python benchmarks/window_flips.py --gamma 8 --prompts-per-category 2 --skip-per-category 1

Reference pair (target fp32, draft bf16), greedy, `fly` with its default options and a fixed γ (long enough for the
window W to fit after most mismatches). For every round the decoding loop reports k (drafted), n (accepted) and s
(`RoundOutcome.num_matched`: drafts before the first that failed Δ). A round whose first mismatch has W drafts after
it (s + 1 + W ≤ k) is a *trial*; the rule *kept* it when n > s. φ = kept / trials, per category and overall, with the
share of rounds that accepted all k drafts, τ (tokens per round) and Σ (n − s) over Σ n: the accepted drafts that the
window added to what judging each draft alone would have accepted. Written to `benchmarks/results/<name>.json` (every
round) and `.md` (the table).
"""

from __future__ import annotations

import os

os.environ.setdefault("MKL_CBWR", "AUTO")  # before torch, as in run.py

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import hf_semspec  # noqa: E402
from benchmarks import data, markdown  # noqa: E402
from benchmarks.models import load_pair  # noqa: E402
from hf_semspec.draft_length import RoundOutcome  # noqa: E402
from hf_semspec.draft_length.constant import ConstantConfig, ConstantPolicy  # noqa: E402

RESULTS_DIR = data.REPO_ROOT / "benchmarks" / "results"


class RecordingConstant(ConstantPolicy):
    """`constant` that keeps every round's outcome and the rule's window."""

    def __init__(self, config: ConstantConfig):
        super().__init__(config)
        self.window: int | None = None
        self.rounds: list[RoundOutcome] = []

    def set_deferred_window(self, window: int | None) -> None:
        self.window = window

    def observe(self, outcome: RoundOutcome) -> None:
        self.rounds.append(outcome)


def trials_and_kept(rounds: list[RoundOutcome], window: int) -> tuple[int, int]:
    """(first mismatches with `window` drafts after them in the round, those the rule kept)."""
    trials = [r for r in rounds if r.tested_window(window)]
    return len(trials), sum(r.num_accepted > r.matched for r in trials)


def round_shares(rounds: list[dict]) -> dict:
    """Over rounds `{"k", "n", "s"}` (drafted, accepted, matched before the first that failed Δ): the share that
    accepted all k drafts, τ = tokens per round (n + 1 each), the accepted drafts and those at or after a first
    mismatch, Σ (n − s), which judging each draft alone would not have accepted."""
    accepted = sum(r["n"] for r in rounds)
    return {"all_accepted": sum(r["n"] == r["k"] for r in rounds) / len(rounds),
            "tau": (accepted + len(rounds)) / len(rounds), "accepted": accepted,
            "past_mismatch": sum(r["n"] - r["s"] for r in rounds)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gamma", type=int, default=16, help="fixed draft length (default 16)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompts-per-category", type=int, default=1)
    parser.add_argument("--skip-per-category", type=int, default=0, help="held-out prompts, as in run.py")
    parser.add_argument("--max-prompt-chars", type=int, default=300, help="the quick profile's cap")
    parser.add_argument("--data-dir", type=Path, default=data.DEFAULT_DATA_DIR)
    parser.add_argument("--name", default="fly-window-flips")
    args = parser.parse_args(argv)

    pool = data.load_question_prompts(args.data_dir / data.SPECBENCH_FILE, args.max_new_tokens)
    pool, _ = data.drop_long(pool, args.max_prompt_chars)
    prompts = data.select_balanced(pool, args.prompts_per_category, "shortest", args.skip_per_category)
    pair = load_pair("qwen")
    hf_semspec.attach(pair.target)
    records = []
    for prompt in prompts:
        policy = RecordingConstant(ConstantConfig(num_tokens=args.gamma))
        start = time.perf_counter()
        pair.target.generate(**pair.encode(prompt.text), assistant_model=pair.draft, acceptance="fly",
                             draft_length=policy, max_new_tokens=args.max_new_tokens, do_sample=False)
        trials, kept = trials_and_kept(policy.rounds, policy.window)
        print(f"{prompt.category:15s} {prompt.prompt_id}: {len(policy.rounds)} rounds, {trials} trials, {kept} kept "
              f"({time.perf_counter() - start:.0f} s)", flush=True)
        records.append({"prompt_id": prompt.prompt_id, "category": prompt.category, "window": policy.window,
                        "rounds": [{"k": r.num_drafted, "n": r.num_accepted, "s": r.matched} for r in policy.rounds],
                        "trials": trials, "kept": kept})

    rows = []
    for category in data.categories_in_order(prompts) + ["all"]:
        chosen = [r for r in records if category in ("all", r["category"])]
        trials, kept = sum(r["trials"] for r in chosen), sum(r["kept"] for r in chosen)
        rate = f"{kept / trials:.2f}" if trials else "–"
        rounds = [r for record in chosen for r in record["rounds"]]
        shares = round_shares(rounds)
        past, accepted = shares["past_mismatch"], shares["accepted"]
        rows.append([category, str(len(rounds)), str(trials), str(kept), rate, f"{shares['all_accepted']:.2f}",
                     f"{shares['tau']:.2f}", f"{past} of {accepted} ({past / max(accepted, 1):.2f})"])
    lines = [f"# `fly`'s kept mismatches (φ): γ = {args.gamma}, {len(prompts)} prompts x {args.max_new_tokens} tokens",
             "",
             "*all accepted*: rounds that accepted every draft. *τ*: tokens per round. *past a mismatch*: accepted "
             "drafts at or after the first that failed the rule's own test (n − s per round), i.e. what `fly`'s window "
             "added to the round over judging each draft alone, of all accepted drafts.",
             ""] + markdown.table(["category", "rounds", "trials", "kept", "φ", "all accepted", "τ",
                                   "past a mismatch"], rows)
    # write_json writes the Paths among the arguments as strings
    markdown.write_summary(RESULTS_DIR, args.name, "\n".join(lines) + "\n",
                           {"config": vars(args), "torch": torch.__version__, "records": records})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
