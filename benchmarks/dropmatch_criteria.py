"""`dropmatch`'s criteria along `exact`'s greedy text: how many of the draft's mismatches each one accepts, and how
many of those change a number.

    python -m benchmarks.dropmatch_criteria benchmarks/results/dropmatch/dropmatch-criteria-gsm8k-10.json \\
        --output benchmarks/results/dropmatch/dropmatch-criteria-along-exact

A live run gives accuracy, but on a few problems and with texts that diverge after the first accepted mismatch. This
reads the outputs of a run's `exact` method (plain greedy decoding's text) and teacher-forces the target (its logits
and LM-head input) and the draft (its greedy token) over each prompt and answer. At every position where the draft's
token differs from the target's, each criterion of `dropmatch` judges it with the rule's own code and its default
masks (seed 0, K = 5, p = 0.3): `vote` with min_votes 1..K, and `js`. Reported per criterion: the share of mismatch
positions it accepts, and of those the share where the draft's token and the target's differ in a digit (a number
changed: on GSM8K the likeliest way to lose an answer).
"""

from __future__ import annotations

import os

os.environ.setdefault("MKL_CBWR", "AUTO")  # before torch

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks import data, markdown, models  # noqa: E402
from hf_semspec.model_calls import capture_lm_head_input  # noqa: E402
from hf_semspec.rules import RULES, VerificationInput  # noqa: E402
from hf_semspec.rules.dropmatch import dropout_head_logits  # noqa: E402


@torch.no_grad()
def judge(pair: models.ModelPair, prompt_ids: torch.Tensor, answer_ids: list[int]):
    """Per mismatch position of one answer: the draft and target tokens, the heads' votes for the draft token (K = 5
    default heads) and the `js` criterion's verdict."""
    ids = torch.cat([prompt_ids, torch.tensor([answer_ids])], dim=1)
    start = prompt_ids.shape[1]
    with capture_lm_head_input(pair.target) as captured:
        target_logits = pair.target(input_ids=ids).logits[:, start - 1 : -1].float()
    hidden = captured[0][:, start - 1 : -1].float()
    draft_logits = pair.draft(input_ids=ids).logits[:, start - 1 : -1].float()
    drafts = draft_logits.argmax(-1)
    targets = target_logits.argmax(-1)
    rows = torch.nonzero(drafts[0] != targets[0]).flatten()
    # One "round" whose drafts are the draft's greedy tokens at every position, judged on the mismatch rows only (the
    # verdicts are per position: the loop's cut plays no part); the masks are drawn for every position, as in a round.
    inputs = VerificationInput(drafts, torch.cat([target_logits, target_logits[:, -1:]], dim=1),
                               torch.softmax(draft_logits, -1), torch.cat([hidden, hidden[:, -1:]], dim=1),
                               pair.target.get_output_embeddings().weight)
    vote = RULES.build("dropmatch", {"accept_target_matches": False})
    keep = vote.draw_masks(inputs).reshape(vote.config.num_heads, drafts.shape[1], -1)[:, rows]
    heads = dropout_head_logits(hidden[0, rows], keep, vote.config.dropout, inputs.lm_head_weight,
                                target_logits[0, rows])
    votes = (heads.argmax(-1) == drafts[0, rows]).sum(0)
    js = RULES.build("dropmatch", {"criterion": "js", "accept_target_matches": False})
    js_keep = js.draw_masks(inputs).reshape(js.config.num_heads, drafts.shape[1], -1)
    return drafts[0, rows], targets[0, rows], votes, js.criterion_verdicts(inputs, js_keep, rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="results JSON of a greedy benchmarks/run.py run with `exact` on GSM8K")
    parser.add_argument("--method", default="semspec:exact", help="whose outputs to follow (default: semspec:exact)")
    parser.add_argument("--output", type=Path, default=None, help="write <output>.md and <output>.json")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    run = markdown.load_results(args.run, "run", "run")
    if run["config"].get("sample"):
        raise SystemExit(f"{args.run}: a sampled run; this follows a greedy text. Fix: pass a greedy run.")
    info = run["models"]
    pair = models.load_pair(run["config"]["pair"], target_dtype=info["target_dtype"], draft_dtype=info["draft_dtype"])
    records = [r for r in run["records"] if r["method"] == args.method]
    gsm8k = {p.prompt_id: p for p in data.load_gsm8k_slice(
        Path(run["config"]["data_dir"]) / data.GSM8K_FILE, 0, 1 + max(int(r["prompt_id"].split(":")[1])
                                                                      for r in records), 1)}
    options = [f"vote, min_votes={k}" for k in range(1, 6)] + ["js"]
    accepted = {name: 0 for name in options}
    digits = {name: 0 for name in options}
    mismatches = 0
    for record in records:
        prompt_ids = pair.encode(gsm8k[record["prompt_id"]].text)["input_ids"]
        draft_tokens, target_tokens, votes, js = judge(pair, prompt_ids, record["new_token_ids"])
        changes_digit = torch.tensor([
            any(c.isdigit() for c in pair.decode([d]) + pair.decode([t]))
            for d, t in zip(draft_tokens.tolist(), target_tokens.tolist())], dtype=torch.bool)
        mismatches += len(changes_digit)
        verdicts = {**{f"vote, min_votes={k}": votes >= k for k in range(1, 6)}, "js": js}
        for name, verdict in verdicts.items():
            accepted[name] += int(verdict.sum())
            digits[name] += int((verdict & changes_digit).sum())
        print(f"{record['prompt_id']}: {len(changes_digit)} mismatches", file=sys.stderr, flush=True)
    rows = [[name, f"{accepted[name] / mismatches:.3f} ({accepted[name]})",
             f"{digits[name] / accepted[name]:.3f} ({digits[name]})" if accepted[name] else "-"] for name in options]
    text = "\n".join([
        f"Along the `{args.method}` outputs of `{args.run.name}` ({len(records)} GSM8K answers, "
        f"{sum(len(r['new_token_ids']) for r in records)} tokens): {mismatches} positions where the draft's greedy "
        "token is not the target's. Masks: seed 0, K = 5, p = 0.3 (the defaults); criterion alone "
        "(accept_target_matches=False).", ""] + markdown.table(
        ["criterion", "mismatches accepted", "of those, a digit changed"], rows))
    print(text)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.with_suffix(".md").write_text("# dropmatch criteria along exact's text\n\n" + text + "\n")
        args.output.with_suffix(".json").write_text(json.dumps(
            {"run": str(args.run), "method": args.method, "mismatches": mismatches, "accepted": accepted,
             "accepted_changing_a_digit": digits}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
