"""Replay fixed-budget draft-length policies on recorded acceptance traces of `exact` greedy decoding.

    python -m benchmarks.replay --prompts-per-category 3 --max-new-tokens 128 \\
        --costs benchmarks/results/draft-length-bandits.json \\
        --draft-lengths constant:3,constant:5,constant:8,constant:12,constant:16,heuristic,best_constant --name replay

Why: with the `exact` rule and greedy decoding, whether a draft token is accepted depends only on the text before it,
and that text is the target's own greedy output. So one plain generation, then one teacher-forced forward of the
draft over it, give the draft's greedy prediction at every position, and from them

    run[i] = how many tokens from position i on the draft predicts right in a row     (the accepted run N at i)

A round that starts at position p and drafts k tokens accepts min(run[p], k) and emits one more; that replays any
policy's rounds (F rounds, D drafted tokens) without running the models again, for dozens of prompts and answers
longer than the live benchmark can afford on this CPU (one 64-token generation per method and prompt takes ~30 s).
Each round is timed by the cost model of a live run, t = a + b·k (`metrics.fit_round_costs`), which the policies see
as the round's seconds; modeled tokens/s = new tokens / (a·F + b·D), as in the live report's modeled tables.

Limits: `exact` and greedy only (a relaxed rule's acceptance depends on more than the prefix); policies that decide
per drafted token (`adaedl`, `svip`, tapout arms among them) need the draft's distribution on its own continuation,
so they are refused. `--check RESULTS.json` compares the replayed F and D of every method that the live run also
measured, prompt by prompt (the draft is bf16 and runs incrementally live, so a near-tie can go the other way).
"""

from __future__ import annotations

import argparse
import json
import time
import os
from pathlib import Path

os.environ.setdefault("MKL_CBWR", "AUTO")  # as benchmarks/run.py, before torch is imported

import torch

from hf_semspec.draft_length import DraftLengthPolicy, RoundOutcome
from hf_semspec.draft_length.tapout import TapOutPolicy
from hf_semspec.rules import RULES

from . import data, methods, metrics, models, report


def accepted_runs(draft_predictions: list[int], tokens: list[int]) -> list[int]:
    """run[i] = the number of positions j ≥ i, in a row, where the draft's prediction equals the output token."""
    runs = [0] * (len(tokens) + 1)
    for i in range(len(tokens) - 1, -1, -1):
        runs[i] = runs[i + 1] + 1 if draft_predictions[i] == tokens[i] else 0
    return runs[:-1]


def fixed_budget(policy: DraftLengthPolicy) -> bool:
    """True when the policy never ends a round early (for tapout: none of its arms does)."""
    if isinstance(policy, TapOutPolicy):
        return all(not arm.decides_per_token for arm in policy.arms)
    return not policy.decides_per_token


def replay(policy: DraftLengthPolicy, runs: list[int], max_new_tokens: int, costs: dict) -> dict:
    """The rounds `policy` would make over one output whose accepted runs are `runs` (its length is the output's).

    As the live loop: a round drafts min(policy budget, max_new_tokens − emitted − 1) tokens, the rule accepts
    min(run, drafted), the round emits one more token (cut at the end of the output), and the policy observes the round
    with the cost model's seconds. Returns `{"target_forwards": F, "draft_forwards": D, "new_tokens"}`.
    """
    if not fixed_budget(policy):
        raise ValueError(f"replay: {type(policy).__name__} decides per drafted token, which needs the draft's "
                         "distribution on its own continuation. Fix: replay fixed-budget policies only.")
    a, b = costs["seconds_per_target_forward"], costs["seconds_per_draft_forward"]
    emitted = forwards = drafted = 0
    while emitted < len(runs):
        budget = max(0, min(policy.max_tokens(), max_new_tokens - emitted - 1))
        accepted = min(runs[emitted], budget)
        policy.observe(RoundOutcome(budget, accepted, a + b * budget, includes_prefill=forwards == 0))
        forwards += 1
        drafted += budget
        emitted = min(emitted + accepted + 1, len(runs))
    return {"target_forwards": forwards, "draft_forwards": drafted, "new_tokens": len(runs)}


@torch.no_grad()
def record_trace(pair: models.ModelPair, prompt: data.Prompt, eos_ids: list[int]) -> dict:
    """The target's greedy output for `prompt` and the draft's teacher-forced predictions over it."""
    inputs = pair.encode(prompt.text)
    length = inputs["input_ids"].shape[1]
    out = type(pair.target).generate(pair.target, **inputs, do_sample=False, max_new_tokens=prompt.max_new_tokens)
    tokens = metrics.new_token_ids(out, length, eos_ids)
    full = out[:, : length + len(tokens)]
    logits = pair.draft(input_ids=full, attention_mask=torch.ones_like(full)).logits
    predictions = logits[0, length - 1 : length - 1 + len(tokens)].argmax(-1).tolist()
    return {"prompt_id": prompt.prompt_id, "category": prompt.category, "prompt_tokens": length,
            "max_new_tokens": prompt.max_new_tokens, "tokens": tokens, "runs": accepted_runs(predictions, tokens)}


def load_costs(path: Path) -> dict:
    results = json.loads(path.read_text(encoding="utf-8"))
    costs = results["aggregates"].get("cost_model") or metrics.fit_round_costs(results["records"])
    if costs is None:
        raise ValueError(f"--costs {path}: the run has no determined cost model. Fix: use a run with several "
                         "draft lengths (e.g. benchmarks/results/draft-length-bandits.json).")
    return {**costs, "source": path.name}


def check_against(results_path: Path, records: list[dict]) -> dict:
    """Per method that both measured: how many prompts' replayed (F, D) equal the live run's."""
    live = {(r["method"], r["prompt_id"]): (r["target_forwards"], r["draft_forwards"])
            for r in json.loads(results_path.read_text(encoding="utf-8"))["records"]}
    checked: dict[str, list[bool]] = {}
    for r in records:
        key = (r["method"], r["prompt_id"])
        if key in live:
            checked.setdefault(r["method"], []).append(live[key] == (r["target_forwards"], r["draft_forwards"]))
    return {name: {"identical": sum(same), "prompts": len(same)} for name, same in checked.items()}


def render(results: dict) -> str:
    costs = results["costs"]
    lines = [
        "# Replayed draft-length policies (`exact`, greedy)", "",
        f"- Target `{results['models']['target']}`, draft `{results['models']['draft']}`; "
        f"{results['selection']}.",
        f"- Rounds replayed on the recorded accepted runs (`benchmarks/replay.py`), each timed by the cost model of "
        f"`{costs['source']}`: {costs['seconds_per_target_forward']:.3f} s per target forward + "
        f"{costs['seconds_per_draft_forward']:.3f} s per drafted token. Modeled tokens/s = new tokens / (a·F + b·D), "
        "geometric mean over the prompts; no timing noise, and no measurement either: a model of this machine.",
        f"- Each policy keeps one instance across the prompts, in the order below, as in the live benchmark. "
        f"Traces recorded in {results['trace_seconds']:.0f} s.",
    ]
    if results.get("check"):
        checks = ", ".join(f"`{name.split('/', 1)[1]}` {c['identical']} of {c['prompts']}"
                           for name, c in results["check"].items())
        lines.append(f"- Against the live run `{results['check_source']}`: prompts where the replayed F and D equal the "
                     f"measured ones: {checks}.")
    values: dict[str, dict[str, float]] = {}
    for label in ["overall"] + list(dict.fromkeys(t["category"] for t in results["traces"])):
        for m in results["methods"]:
            mine = [r for r in results["records"] if r["method"] == m["name"] and label in ("overall", r["category"])]
            values.setdefault(label, {})[m["name"]] = metrics.geometric_mean(
                [metrics.modeled_tokens_per_s(r, costs) for r in mine])
    lines += ["", "## Modeled tokens/s: best fixed length vs the policies", "",
              "In brackets, the ratio to the best `constant` length in the row.", ""]
    lines += report._policy_tables(results["methods"], values, " tok/s")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None, load_pair=models.load_pair) -> dict:
    """Records (or reloads) the traces, replays every policy, writes <name>.json and <name>.md; returns the results.
    `load_pair` is injectable, as in `benchmarks/run.py`, so the tests run it on tiny models."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draft-lengths", required=True, help="fixed-budget policies, as in benchmarks/run.py")
    parser.add_argument("--costs", type=Path, required=True, help="a live run's results JSON: its cost model times "
                        "the rounds")
    parser.add_argument("--traces", type=Path, default=None, help="reuse the traces of an earlier replay's JSON")
    parser.add_argument("--check", type=Path, default=None, help="a live run on the same prompts to compare F, D with")
    parser.add_argument("--data-dir", type=Path, default=data.DEFAULT_DATA_DIR)
    parser.add_argument("--prompts-per-category", type=int, default=1)
    parser.add_argument("--selection", choices=("shortest", "spread", "first"), default="shortest")
    parser.add_argument("--max-prompt-chars", type=int, default=300)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--output-dir", type=Path, default=data.REPO_ROOT / "benchmarks" / "results")
    parser.add_argument("--name", default="replay")
    args = parser.parse_args(argv)

    # 1. Methods and costs first: a bad entry fails before any model loads.
    specs = methods.parse_draft_lengths(args.draft_lengths)
    default_tokens = RULES.get("exact").default_num_draft_tokens
    built = [(f"semspec:exact/{s.label}", s, methods.build_policy(s.policy, s.tokens, default_tokens, dict(s.options)))
             for s in specs]
    for name, _, policy in built:
        if not fixed_budget(policy):
            raise ValueError(f"--draft-lengths: {name} decides per drafted token; replay takes fixed-budget policies")
    costs = load_costs(args.costs)

    # 2. Traces: the target's greedy output and the draft's predictions over it, per prompt.
    if args.traces is not None:
        saved = json.loads(args.traces.read_text(encoding="utf-8"))
        traces, selection, model_names, trace_seconds = (saved["traces"], saved["selection"], saved["models"],
                                                         saved["trace_seconds"])
    else:
        pool = data.load_question_prompts(args.data_dir / data.SPECBENCH_FILE, args.max_new_tokens)
        pool, _ = data.drop_long(pool, args.max_prompt_chars or None)
        prompts = data.select_balanced(pool, args.prompts_per_category, args.selection)
        selection = (f"{len(prompts)} Spec-Bench prompts ({args.prompts_per_category} per category, `{args.selection}` "
                     f"selection, <= {args.max_prompt_chars} characters), max_new_tokens={args.max_new_tokens}")
        pair = load_pair("qwen", cache_dir=args.cache_dir)
        model_names = {"target": pair.target_name, "draft": pair.draft_name}
        eos_ids = metrics.eos_ids_of(pair.target)
        start = time.perf_counter()
        traces = []
        for i, prompt in enumerate(prompts):
            traces.append(record_trace(pair, prompt, eos_ids))
            print(f"trace {i + 1}/{len(prompts)}: {prompt.prompt_id} ({prompt.category}), "
                  f"{len(traces[-1]['tokens'])} tokens", flush=True)
        trace_seconds = time.perf_counter() - start

    # 3. Replay every policy over the prompts, one instance each.
    records = []
    for name, spec, policy in built:
        for trace in traces:
            counts = replay(policy, trace["runs"], trace["max_new_tokens"], costs)
            records.append({"method": name, "prompt_id": trace["prompt_id"], "category": trace["category"], **counts})
    results = {
        "models": model_names, "selection": selection, "costs": costs, "trace_seconds": trace_seconds,
        "methods": [{"name": name, "rule": "exact", "draft_length": spec.policy,
                     "draft_length_kwargs": dict(spec.options), "gamma": spec.tokens} for name, spec, _ in built],
        "records": records, "traces": traces,
    }
    if args.check is not None:
        results["check"], results["check_source"] = check_against(args.check, records), args.check.name
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / f"{args.name}.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    markdown = render(results)
    (args.output_dir / f"{args.name}.md").write_text(markdown, encoding="utf-8")
    print(markdown)
    return results


if __name__ == "__main__":
    main()
