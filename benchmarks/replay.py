"""Replay draft-length policies on recorded acceptance traces of greedy decoding: `exact`, and `fly` along a live run's
outputs.

    python -m benchmarks.replay --prompts-per-category 3 --max-new-tokens 128 \\
        --costs benchmarks/results/draft-length-every-policy-exact-after-review.json \\
        --draft-lengths constant:3,constant:5,constant:8,constant:12,constant:16,heuristic,best_constant --name replay

Why: with the `exact` rule and greedy decoding, whether a draft token is accepted depends only on the text before it,
and that text is the target's own greedy output. So one plain generation, then one teacher-forced forward of the
draft over it, give the draft's greedy prediction at every position, and from them

    run[i] = how many tokens from position i on the draft predicts right in a row     (the accepted run N at i)

A round that starts at position p and drafts k tokens accepts min(run[p], k) and emits one more; that replays any
policy's rounds (F rounds, D drafted tokens) without running the models again, for dozens of prompts and answers
longer than the live benchmark can afford on this CPU (one 64-token generation per method and prompt takes ~30 s).
Each round is timed by the cost model of a live run, t = a + b·k (`metrics.fit_round_costs`), which the policies see
as the round's seconds; modeled tokens/s = new tokens / (a·F + b·D), as in the live report's modeled tables. With
`--verify-cost` (a `benchmarks/verify_cost.py` measurement) a round of k drafts costs v(k) + d·k instead, the verify
forward's measured time at that length plus k draft steps, which on a CPU is not linear in k.

Policies that end a round early (`adaedl`, `svip`, and tapout over them) decide after each drafted token from the
entropy H(q) of the distribution the token was drawn from, so the trace also keeps the draft's teacher-forced
entropy at every position. Up to and including a round's first wrong draft the draft conditions on the target's own
text, so those entropies, the decisions made on them, the accepted tokens and hence F are exact. Past it the live
draft continues from its own wrong token, whose entropies no trace of the target's text holds; the replay uses the
entropies at the same positions of the target's text. That only changes how many already-rejected tokens the round
drafts (D), and through the round's time and k what an adaptive policy learns from it. The draft is surer on the
target's text than after its own wrong token, so the replay drafts more: `adaedl` 130 tokens against 83 live on the
coding prompt of `replay-exact-1x64`, and 0.96 of its live modeled speed over that run. Read an entropy policy's
replayed speed as a lower bound. A per-token round ends after the draft drafts the output's EOS, as live.

`fly` (`--rule fly --along RUN.json --along-method METHOD`). A relaxed rule keeps mismatches, so its output depends
on the rounds: no one output is every policy's. The replay follows the outputs that one method of a live run wrote,
and over them records the draft's and the target's teacher-forced predictions, the target's gate entropy and the
draft's entropy; a round then accepts by the rule's Δ, deferred window and gate along that text (`FlyRounds`). The
method whose outputs it follows replays its own rounds exactly (numerics aside); any other policy is judged on a text
it did not write: a mismatch the recorded run kept and its shorter round cannot keep counts as a rejection, and the
replay goes on along the recorded text, where live the target's token would change what follows. Comparing
policies along the outputs of two or three methods shows how much a category's figures owe to the text.

Limits: greedy only, and `fly` only along recorded outputs (the other relaxed rules read more of the distributions
than a trace keeps); a per-token policy is replayed only if it reads q through H(q) alone (`ENTROPY_POLICIES`).
`--check RESULTS.json` compares the replayed F and D of every method that the live run also measured, prompt by
prompt (the draft is bf16 and runs incrementally live, so a near-tie can go the other way).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import time
from pathlib import Path

os.environ.setdefault("MKL_CBWR", "AUTO")  # as benchmarks/run.py, before torch is imported

import torch

from hf_semspec.draft_length import DraftLengthPolicy, RoundOutcome
from hf_semspec.draft_length._entropy import entropy
from hf_semspec.draft_length.tapout import TapOutPolicy
from hf_semspec.rules import RULES
from hf_semspec.rules.fly import FLyConfig, deferred_window, target_entropy

from . import data, markdown, methods, metrics, models, report, resolution


def accepted_runs(draft_predictions: list[int], tokens: list[int]) -> list[int]:
    """run[i] = the number of positions j ≥ i, in a row, where the draft's prediction equals the output token."""
    runs = [0] * (len(tokens) + 1)
    for i in range(len(tokens) - 1, -1, -1):
        runs[i] = runs[i + 1] + 1 if draft_predictions[i] == tokens[i] else 0
    return runs[:-1]


# Per-token policies whose `keep_drafting` reads q only through its entropy H(q): a trace's entropies replay them.
ENTROPY_POLICIES = frozenset({"adaedl", "cost_aware", "svip"})
# Which prompts share a policy instance (--policy-state): the live benchmark's choices, and none ("prompt").
REPLAY_POLICY_STATES = (*methods.POLICY_STATES, "prompt")
POLICY_STATE_TEXT = {
    "run": "- Each policy keeps one instance across the prompts, in the order below, as in the live benchmark. ",
    "prompt": "- Each policy starts every prompt untrained (`--fresh-per-prompt`): a fresh policy for every prompt, as "
              "a call to `generate()` gets when nothing is kept across calls. ",
    "category": "- Each policy keeps one instance per category (`--policy-state category`), going on across that "
                "category's prompts: what a server that knew each request's kind could keep. ",
}


def replayable(policy: DraftLengthPolicy) -> bool:
    """True when every round of `policy` (for tapout: of each arm) has a fixed budget or ends on H(q) alone."""
    parts = policy.arms if isinstance(policy, TapOutPolicy) else [policy]
    return all(not part.decides_per_token or part.name in ENTROPY_POLICIES for part in parts)


def probs_with_entropy(entropy_nats: float) -> torch.Tensor:
    """A distribution q of shape `(1, n)` with H(q) = `entropy_nats`: one token at x, the other n − 1 sharing 1 − x.

    H falls from ln n at x = 1/n to 0 at x = 1, so with n = ⌈e^H⌉ + 1 a bisection on x finds it. The entropy
    policies read q only through H(q), so this stands for the draft's distribution at a recorded position."""
    n = max(2, math.ceil(math.exp(entropy_nats)) + 1)

    def h(x: float) -> float:
        rest = (1 - x) / (n - 1)
        return -(x * math.log(x) if x > 0 else 0.0) - ((n - 1) * rest * math.log(rest) if rest > 0 else 0.0)

    low, high = 1 / n, 1.0  # h(low) = ln n ≥ entropy_nats ≥ 0 = h(high)
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if h(middle) > entropy_nats else (low, middle)
    x = (low + high) / 2
    return torch.tensor([[x] + [(1 - x) / (n - 1)] * (n - 1)], dtype=torch.float64)


class ExactRounds:
    """`exact` greedy along a trace: a round that starts at output position `start` and drafts k tokens accepts
    min(run[start], k) (`accepted_runs`)."""

    window = None  # the rule keeps no mismatch on later evidence

    def __init__(self, runs: list[int]):
        self.runs = runs

    def __len__(self) -> int:
        return len(self.runs)

    def round(self, start: int, drafted: int) -> tuple[int, int | None]:
        """(accepted drafts, drafts that passed the rule's own test before the first that failed it, or None when
        the rule judges each draft alone)."""
        return min(self.runs[start], drafted), None


class FlyRounds:
    """Greedy `fly` along a recorded output x of that rule (`--along`): the rule of `hf_semspec/rules/fly.py` (Δ, the
    deferred window, the gate) applied to what the trace holds at each output position i:

        Δ_i    = 1[d_i = x_i = t_i]             d_i, t_i: the draft's and the target's greedy predictions, teacher-
                                                 forced on x
        keep_i = 1[d_i = x_i  ∧  H_i ≥ θ]        the gate lets the draft's token through, and it is x's token
        A_j    = D_j ∧ (Δ_j ∨ keep_j)            D_j: `deferred_window` of the round's Δ, with the rule's W

    A round from s drafting k accepts the drafts before its first j with A_j = 0. Where d_i ≠ x_i the live draft goes
    on from its own token, which the trace does not hold, so that mismatch is never kept (keep_i = 0); the recorded
    run did not keep it either (x_i is then the target's token). Where the recorded run kept a mismatch
    (x_i = d_i ≠ t_i) and a replayed round cannot (too short for the window), the live text would go on from t_i,
    and the replay goes on along x: the replayed text is the recorded one whatever the policy, the limit of this
    replay (module docstring)."""

    def __init__(self, matched: list[bool], keepable: list[bool], window: int):
        self.matched, self.keepable, self.window = matched, keepable, window

    @classmethod
    def of_trace(cls, trace: dict) -> FlyRounds:
        """The rounds of a `record_trace_along` trace, under the rule options it was recorded with."""
        tokens, options = trace["tokens"], trace["rule_options"]
        same = [d == x for d, x in zip(trace["draft_predictions"], tokens)]
        matched = [s and t == x for s, t, x in zip(same, trace["target_predictions"], tokens)]
        keepable = [s and h >= options["entropy_threshold"] for s, h in zip(same, trace["gate_entropies"])]
        return cls(matched, keepable, options["window"])

    def __len__(self) -> int:
        return len(self.matched)

    def round(self, start: int, drafted: int) -> tuple[int, int | None]:
        if drafted == 0:
            return 0, 0
        # Drafts past the output's end are never accepted. Live, drafts after a drafted EOS are verified like any
        # others and can complete a window before the output is cut at the EOS: at most one round more in the replay.
        inside = range(start, start + drafted)
        delta = torch.tensor([[i < len(self) and self.matched[i] for i in inside]])
        keep = torch.tensor([[i < len(self) and self.keepable[i] for i in inside]])
        accepted = deferred_window(delta, self.window) & (delta | keep)
        return _leading_true(accepted[0]), _leading_true(delta[0])


def _leading_true(flags: torch.Tensor) -> int:
    """How many `True` values a 1-D bool tensor starts with."""
    rejected = (~flags).nonzero()
    return int(rejected[0, 0]) if len(rejected) else len(flags)


def replay(
    policy: DraftLengthPolicy,
    rounds: list[int] | ExactRounds | FlyRounds,
    max_new_tokens: int,
    costs: dict,
    entropies: list[float] | None = None,
    time_noise: float = 0.0,
    rng: random.Random | None = None,
) -> dict:
    """The rounds `policy` would make over one output: `rounds` says what a round accepts (`FlyRounds`, or
    `ExactRounds`, which a list of accepted runs stands for); its length is the output's.

    As the live loop: a round's budget is min(policy budget, max_new_tokens − emitted − 1); a per-token policy is
    asked after each drafted token but the last of the budget whether to go on, with the distribution of the token
    at that position (`entropies[i]`: H of the draft's q for output token i; past the output's end, the last one),
    and its round ends after the draft, right so far, drafts the output's EOS (an output shorter than
    `max_new_tokens` ends with one), as the live drafter ends a per-token round after an EOS;
    the rule accepts what `rounds` says (`exact`: min(run, drafted)), the round emits one more token (cut at the end of
    the output), and the policy, told the rule's deferred window first as `generate()` tells it, observes the round
    with the cost model's seconds (`metrics.round_seconds`: the line a + b·k, or v(k) + k·d for
    per-length costs), times exp(σ·z), z ~ N(0, 1) from `rng`, with σ = `time_noise` (a live round's time scatters
    around the model; the returned counts are still priced without noise). Returns
    `{"target_forwards": F, "draft_forwards": D, "new_tokens", "rounds_by_length": {k: rounds that drafted k}}`.
    """
    if not replayable(policy):
        raise ValueError(f"replay: {type(policy).__name__} decides per drafted token from more than the draft's "
                         f"entropy, which a trace does not hold. Fix: replay fixed-budget policies or "
                         f"{sorted(ENTROPY_POLICIES)}.")
    if not isinstance(rounds, (ExactRounds, FlyRounds)):
        rounds = ExactRounds(rounds)
    length = len(rounds)
    ended_by_eos = length < max_new_tokens  # the output's last token is an EOS
    policy.set_deferred_window(rounds.window)
    emitted = forwards = drafted_total = 0
    rounds_by_length: dict[int, int] = {}
    while emitted < length:
        budget = max(0, min(policy.max_tokens(), max_new_tokens - emitted - 1))
        drafted = budget
        if policy.decides_per_token and budget > 1:  # read after max_tokens(): tapout narrows it to the round's arm
            if entropies is None:
                raise ValueError("replay: a per-token policy needs the trace's draft entropies, which this trace "
                                 "does not hold. Fix: record the traces again (without --traces).")
            drafted = 0
            while drafted < budget:
                drafted += 1
                position = min(emitted + drafted - 1, len(entropies) - 1)
                if drafted == budget:
                    break
                # As the live drafter: the policy is asked first, then a round whose draft, right so far, drafted
                # the output's EOS stops there.
                probs = probs_with_entropy(entropies[position]) if policy.reads_draft_probs else None
                if not policy.keep_drafting(drafted, probs):
                    break
                if ended_by_eos and position == length - 1 and rounds.round(emitted, drafted)[0] >= drafted:
                    break
        accepted, matched = rounds.round(emitted, drafted)
        noise = math.exp(time_noise * rng.gauss(0.0, 1.0)) if time_noise > 0 else 1.0
        seconds = metrics.round_seconds(costs, drafted) * noise
        # The drafts reach the output's end (its EOS, drafted and accepted): the live round is cut there.
        cut = emitted + accepted >= length
        policy.observe(RoundOutcome(drafted, accepted, seconds, includes_prefill=forwards == 0,
                                    num_matched=matched, cut=cut))
        forwards += 1
        drafted_total += drafted
        rounds_by_length[drafted] = rounds_by_length.get(drafted, 0) + 1
        emitted = min(emitted + accepted + 1, length)
    return {"target_forwards": forwards, "draft_forwards": drafted_total, "new_tokens": length,
            "rounds_by_length": rounds_by_length}


def logits_over_output(model: torch.nn.Module, full: torch.LongTensor, prompt_length: int, count: int) -> torch.Tensor:
    """`model`'s teacher-forced logits `(count, vocab)` at the positions that predict the `count` tokens after the
    prompt in `full` (`(1, prompt_length + count)`), in the model's dtype."""
    logits = model(input_ids=full, attention_mask=torch.ones_like(full)).logits
    return logits[0, prompt_length - 1 : prompt_length - 1 + count]


def _rounded(values: torch.Tensor) -> list[float]:
    """A trace's floats: 6 decimals keep the JSON small and the bins exact."""
    return [round(v, 6) for v in values.tolist()]


@torch.no_grad()
def record_trace(pair: models.ModelPair, prompt: data.Prompt, eos_ids: list[int]) -> dict:
    """The target's greedy output for `prompt`, and over it the draft's teacher-forced predictions and the entropy
    (nats) of its distribution at each position, computed as the live draft loop computes q (softmax of the logits)."""
    inputs = pair.encode(prompt.text)
    length = inputs["input_ids"].shape[1]
    out = type(pair.target).generate(pair.target, **inputs, do_sample=False, max_new_tokens=prompt.max_new_tokens)
    tokens = metrics.new_token_ids(out, length, eos_ids)
    over_output = logits_over_output(pair.draft, out[:, : length + len(tokens)], length, len(tokens))
    predictions = over_output.argmax(-1).tolist()
    entropies = _rounded(entropy(over_output.softmax(-1)))
    return {"prompt_id": prompt.prompt_id, "category": prompt.category, "prompt_tokens": length,
            "max_new_tokens": prompt.max_new_tokens, "tokens": tokens, "runs": accepted_runs(predictions, tokens),
            "entropies": entropies}


@torch.no_grad()
def record_trace_along(pair: models.ModelPair, prompt: data.Prompt, tokens: list[int], rule_options: dict) -> dict:
    """Over a recorded output `tokens` of `fly` (`along_outputs`): the draft's and the target's teacher-forced greedy
    predictions, the target's gate entropy (the rule's `entropy` kind) and the draft's entropy at each position, as
    `FlyRounds` reads them; `rule_options` are the recorded run's `fly` options (`FLyConfig`, all fields)."""
    inputs = pair.encode(prompt.text)
    length = inputs["input_ids"].shape[1]
    full = torch.cat([inputs["input_ids"], torch.tensor([tokens], dtype=inputs["input_ids"].dtype)], dim=1)
    target_logits = logits_over_output(pair.target, full, length, len(tokens)).float()
    draft_logits = logits_over_output(pair.draft, full, length, len(tokens)).float()
    return {"prompt_id": prompt.prompt_id, "category": prompt.category, "prompt_tokens": length,
            "max_new_tokens": prompt.max_new_tokens, "tokens": tokens, "rule_options": rule_options,
            "draft_predictions": draft_logits.argmax(-1).tolist(),
            "target_predictions": target_logits.argmax(-1).tolist(),
            "gate_entropies": _rounded(target_entropy(target_logits.softmax(-1), rule_options["entropy"])),
            "entropies": _rounded(entropy(draft_logits.softmax(-1)))}


def along_outputs(path: Path, method: str, pair: models.ModelPair, data_dir: Path) -> tuple[list[tuple], dict, str]:
    """What `--along` replays: for each prompt of the live run at `path`, in its order, (prompt, output ids of
    `method`), the method's `fly` options (all fields) and a description. The ids are the record's `new_token_ids`
    (runs since they are kept), else its text encoded again by the pair's tokenizer, checked to decode to the same
    text with the run's count of new tokens (an EOS that decoding dropped put back)."""
    results = markdown.load_results(path, "run", "--along")
    if results["config"].get("sample"):
        raise ValueError(f"--along {path.name}: that run sampled (--sample), and the replay follows greedy `fly` only "
                         "(a sampled round's verdict depends on its draws). Fix: pass a greedy run.")
    described = {m["name"]: m for m in results["methods"]}
    fly_methods = sorted(name for name, m in described.items() if m.get("rule") == "fly")
    if described.get(method, {}).get("rule") != "fly":
        raise ValueError(f"--along-method {method!r}: {path.name} has no `fly` method of that name; its `fly` methods "
                         f"are {fly_methods}. Fix: pass one of them.")
    config = FLyConfig(**described[method].get("rule_kwargs", {}))
    config.validate()
    pool = {p.prompt_id: p for p in data.load_question_prompts(Path(data_dir) / data.SPECBENCH_FILE, 0)}
    records = {r["prompt_id"]: r for r in results["records"] if r["method"] == method}
    eos_ids = metrics.eos_ids_of(pair.target)
    outputs = []
    for prompt_id in results["selection"]["prompt_ids"]:
        if prompt_id not in pool or prompt_id not in records:
            where = "the data" if prompt_id not in pool else f"{method}'s records"
            raise ValueError(f"--along {path.name}: prompt {prompt_id!r} is not in {where}. Fix: pass the --data-dir "
                             "the run used, or a run whose every prompt has a record of the method.")
        record = records[prompt_id]
        ids = record.get("new_token_ids")
        if ids is None:
            if pair.tokenize is None:
                raise ValueError(f"--along {path.name}: the records hold no new_token_ids and this pair has no "
                                 "tokenizer to encode their text. Fix: run the live benchmark again, which keeps them.")
            ids = pair.tokenize(record["text"])
            if len(ids) == record["new_tokens"] - 1 and eos_ids:
                ids = ids + eos_ids[:1]  # the EOS that ended the output, which decoding dropped
            if len(ids) != record["new_tokens"] or pair.decode(ids) != record["text"]:
                raise ValueError(f"--along {path.name}: {method}'s text for {prompt_id!r} does not encode back to its "
                                 f"{record['new_tokens']} new tokens (got {len(ids)}). Fix: run the live benchmark "
                                 "again, which keeps the ids (new_token_ids).")
        prompt = pool[prompt_id]
        outputs.append((data.Prompt(prompt.prompt_id, prompt.category, prompt.text, record["max_new_tokens"]), ids))
    return outputs, config.all_options(), f"{len(outputs)} prompts of `{path.name}`, along the outputs of `{method}`"


def held_out_selection(pool: list[data.Prompt], per_category: int, skip_per_category: int, strategy: str,
                       max_prompt_chars: int, max_new_tokens: int) -> tuple[list[data.Prompt], str]:
    """The prompts of `data.select_balanced(pool, per_category + skip_per_category, strategy)` less those of a selection
    of `skip_per_category` (for `shortest` and `first`: the next `per_category` of each category), and its description."""
    prompts = data.select_balanced(pool, per_category, strategy, skip_per_category)
    after = f" after the {skip_per_category} it takes first" if skip_per_category else ""
    return prompts, (f"{len(prompts)} Spec-Bench prompts ({per_category} per category{after}, `{strategy}` selection, "
                     f"<= {max_prompt_chars} characters), max_new_tokens={max_new_tokens}")


def load_costs(path: Path) -> dict:
    results = markdown.load_results(path, "run", "--costs")
    costs = metrics.run_cost_model(results)
    if costs is None:
        raise ValueError(f"--costs {path}: the run has no determined cost model. Fix: use a run with several "
                         "draft lengths (e.g. benchmarks/results/draft-length-every-policy-exact-after-review.json).")
    return {**costs, "source": path.name}


def check_against(results_path: Path, records: list[dict], costs: dict, methods: list[dict] = ()) -> dict:
    """Per method that both measured: how many prompts' replayed (F, D) equal the live run's, and the geometric mean
    over the prompts of replayed / live modeled tokens/s (how far a mismatch moves the comparison). A method whose
    two runs both record its policy's options (`draft_length_config`) and disagree is a different policy under the
    same name (a default changed in between) and is left out."""
    results = markdown.load_results(results_path, "run", "--check")
    live = {(r["method"], r["prompt_id"]): r for r in results["records"]}
    live_configs = {m["name"]: m.get("draft_length_config") for m in results.get("methods", [])}
    different = {m["name"] for m in methods
                 if None not in (m.get("draft_length_config"), live_configs.get(m["name"]))
                 and m["draft_length_config"] != live_configs[m["name"]]}
    checked: dict[str, list[bool]] = {}
    ratios: dict[str, list[float]] = {}
    for r in records:
        measured = live.get((r["method"], r["prompt_id"]))
        if measured is None or r["method"] in different:
            continue
        counts = ("target_forwards", "draft_forwards")
        checked.setdefault(r["method"], []).append(all(measured[c] == r[c] for c in counts))
        ratios.setdefault(r["method"], []).append(
            metrics.modeled_tokens_per_s(r, costs) / metrics.modeled_tokens_per_s(measured, costs))
    return {name: {"identical": sum(same), "prompts": len(same), "modeled_ratio": metrics.geometric_mean(ratios[name])}
            for name, same in checked.items()}


def round_counts_table(methods: list[dict], records: list[dict]) -> list[str]:
    """Markdown rows of each method's τ (new tokens per target forward) and drafted tokens per round, pooled over its
    records (every prompt, and every seed), the live report's "τ" and "γ (drafted/round)" columns."""
    lines = ["| method | τ | drafted / round | target forwards | drafted tokens |", "| --- | --- | --- | --- | --- |"]
    for m in methods:
        mine = [r for r in records if r["method"] == m["name"]]
        forwards = sum(r["target_forwards"] for r in mine)
        drafted = sum(r["draft_forwards"] for r in mine)
        tokens = sum(r["new_tokens"] for r in mine)
        lines.append(f"| `{m['name'].split('/', 1)[1]}` | {tokens / forwards:.2f} | {drafted / forwards:.1f} | "
                     f"{forwards} | {drafted} |")
    return lines


def render(results: dict) -> str:
    costs = results["costs"]
    if "verify_seconds" in costs:
        priced = f"the {metrics.describe_costs(costs)}. Modeled tokens/s = new tokens / (Σ_k n_k·v(k) + d·D)"
    else:
        priced = (f"the cost model of `{costs['source']}`: {metrics.describe_costs(costs)}. Modeled tokens/s = new "
                  "tokens / (a·F + b·D)")
    rule = results.get("rule", "exact")
    lines = [
        f"# Replayed draft-length policies (`{rule}`, greedy)", "",
        f"- Target `{results['models']['target']}`, draft `{results['models']['draft']}`; "
        f"{results['selection']}.",
        f"- Rounds replayed on the recorded {'outputs' if rule == 'fly' else 'accepted runs'} "
        f"(`benchmarks/replay.py`), each timed by {priced}, geometric mean over the prompts; no timing noise, and no "
        "measurement either: a model of this machine.",
        POLICY_STATE_TEXT[resolution.replay_policy_state(results)]
        + f"Traces recorded in {results['trace_seconds']:.0f} s.",
    ]
    if rule == "fly":
        options = results["traces"][0]["rule_options"] if results["traces"] else {}
        lines.append(f"- Greedy `fly` (W = {options.get('window')}, θ = {options.get('entropy_threshold')}, "
                     f"`{options.get('entropy')}` entropy) along one text per prompt, whatever the policy: a mismatch "
                     "the recorded run kept and a shorter round cannot keep counts as a rejection, and the text goes "
                     "on as recorded (`FlyRounds`). The method that wrote it replays its own rounds; any other is "
                     "judged on a text it did not write.")
    seeds = sorted({r.get("seed", results["seed"]) for r in results["records"]})
    if results.get("round_time_noise"):
        seeds_text = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {seeds[0]} to {seeds[-1]}, a fresh policy each"
        lines.append(f"- The policies saw each round's modeled seconds times exp(σ·z), z ~ N(0, 1), σ = "
                     f"{results['round_time_noise']} ({seeds_text}), as live rounds scatter; the table prices their "
                     "rounds without noise" + (", and shows the mean over the seeds." if len(seeds) > 1 else "."))
    if results.get("check"):
        checks = ", ".join(f"`{name.split('/', 1)[1]}` {c['identical']} of {c['prompts']} "
                           f"({c['modeled_ratio']:.2f})" for name, c in results["check"].items())
        lines.append(f"- Against the live run `{results['check_source']}`: prompts where the replayed F and D equal the "
                     f"measured ones (in brackets, replayed / live modeled tokens/s, geometric mean): {checks}.")
    values: dict[str, dict[str, float]] = {}
    overall_per_seed: dict[str, list[float]] = {}
    for label in ["overall"] + list(dict.fromkeys(t["category"] for t in results["traces"])):
        for m in results["methods"]:
            per_seed = []
            for seed in seeds:
                mine = [r for r in results["records"] if r["method"] == m["name"] and r.get("seed", seeds[0]) == seed
                        and label in ("overall", r["category"])]
                per_seed.append(metrics.geometric_mean([metrics.modeled_tokens_per_s(r, costs) for r in mine]))
            values.setdefault(label, {})[m["name"]] = sum(per_seed) / len(per_seed)
            if label == "overall":
                overall_per_seed[m["name"]] = per_seed
    lines += ["", "## Modeled tokens/s: best fixed length vs the policies", "",
              "In brackets, the ratio to the best `constant` length in the row.", ""]
    lines += report._policy_tables(results["methods"], values, " tok/s")
    lines += ["", "## Rounds", "", "τ = new tokens per target forward, over all the prompts" +
              (" and seeds" if len(seeds) > 1 else "") + "; drafted / round = drafted tokens per target forward.", ""]
    lines += round_counts_table(results["methods"], results["records"])
    readable = resolution.section(results["methods"], results["records"], costs, heading="##")
    lines += [""] + readable if readable else []  # a blank line ends the table above, or the heading joins it
    if len(seeds) > 1:
        fixed = {m["name"] for m in results["methods"] if m["draft_length"] == "constant"}
        lines += ["", f"Overall modeled tokens/s over the {len(seeds)} seeds (the fixed lengths do not depend on them):",
                  "", "| method | mean | min | max |", "| --- | --- | --- | --- |"]
        lines += [f"| `{name.split('/', 1)[1]}` | {sum(v) / len(v):.2f} | {min(v):.2f} | {max(v):.2f} |"
                  for name, v in overall_per_seed.items() if name not in fixed]
    return "\n".join(lines) + "\n"


REPLAY_RULES = ("exact", "fly")


def check_along(args: argparse.Namespace, selecting: list[str]) -> None:
    """`--along` and `--along-method` go with `--rule fly` (unless its traces are reused), and choose the prompts."""
    if args.rule == "exact" and (args.along is not None or args.along_method is not None):
        raise ValueError(f"--along {args.along} / --along-method {args.along_method} with --rule exact: `exact` is "
                         "replayed along the target's own greedy output. Fix: drop them, or pass --rule fly.")
    if args.rule != "fly":
        return
    if args.traces is not None:
        if args.along is not None or args.along_method is not None:
            raise ValueError(f"--along {args.along} / --along-method {args.along_method} with --traces "
                             f"{args.traces}: the saved traces already follow their outputs. Fix: drop --along and "
                             "--along-method, or --traces.")
        return
    if args.along is None or args.along_method is None:
        raise ValueError(f"--rule fly needs --along RESULTS.json and --along-method NAME (got {args.along}, "
                         f"{args.along_method}): a relaxed rule's output depends on the rounds, so the replay follows "
                         "a live run's. Fix: e.g. --along benchmarks/results/draft-length-fly-7-per-category-avx512.json "
                         "--along-method semspec:fly/constant:16.")
    if selecting:
        raise ValueError(f"{', '.join(selecting)} with --along: the prompts and budgets are the live run's. Fix: drop "
                         "them.")


SELECTION_DEFAULTS = {"data_dir": data.DEFAULT_DATA_DIR, "prompts_per_category": 1, "skip_per_category": 0,
                      "selection": "shortest", "max_prompt_chars": 300, "max_new_tokens": 64}


def main(argv: list[str] | None = None, load_pair=models.load_pair) -> dict:
    """Records (or reloads) the traces, replays every policy, writes <name>.json and <name>.md; returns the results.
    `load_pair` is injectable, as in `benchmarks/run.py`, so the tests run it on tiny models."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draft-lengths", required=True, help="policies as in benchmarks/run.py: fixed-budget ones, "
                        "adaedl, svip, and tapout over such arms")
    parser.add_argument("--costs", type=Path, default=None, help="a live run's results JSON: its cost model (a line "
                        "a + b·k) times the rounds")
    parser.add_argument("--verify-cost", type=Path, default=None, help="instead of --costs, a "
                        "benchmarks/verify_cost.py JSON: a round drafting k costs its measured v(k) + k·d")
    parser.add_argument("--rule", choices=REPLAY_RULES, default="exact", help="the acceptance rule, greedy: 'exact' "
                        "(default) along the target's own greedy output, or 'fly' along a live run's outputs (--along)")
    parser.add_argument("--along", type=Path, default=None, help="with --rule fly: a live run's results JSON, whose "
                        "prompts are replayed along the outputs of --along-method")
    parser.add_argument("--along-method", default=None, help="with --along: the `fly` method of that run whose outputs "
                        "the rounds follow, e.g. semspec:fly/constant:16")
    parser.add_argument("--traces", type=Path, default=None, help="reuse the traces of an earlier replay's JSON")
    parser.add_argument("--check", type=Path, default=None, help="a live run on the same prompts to compare F, D with")
    parser.add_argument("--round-time-noise", type=float, default=0.0, help="σ: the policies see each round's "
                        "modeled seconds times exp(σ·z), z ~ N(0, 1), as live rounds scatter (0 = none)")
    parser.add_argument("--policy-state", choices=REPLAY_POLICY_STATES, default="run",
                        help="which prompts share a policy instance: 'run' (default) all, as generate() keeps a "
                        "policy that learns; 'prompt' none, as each generate() call would get if nothing were kept "
                        "across calls; 'category' those of one category, as a server that knew each request's kind "
                        "could keep one per kind")
    parser.add_argument("--fresh-per-prompt", dest="policy_state", action="store_const", const="prompt",
                        help="the same as --policy-state prompt")
    parser.add_argument("--seed", type=int, default=0, help="seed of the round-time noise (one stream per policy)")
    parser.add_argument("--seeds", type=int, default=1, help="with --round-time-noise: replay every policy this many "
                        "times, from a fresh instance, with seeds seed, seed+1, ...; the table averages them")
    # Which prompts to trace (defaults in SELECTION_DEFAULTS): with --traces, the saved ones are replayed instead.
    parser.add_argument("--data-dir", type=Path, default=None, help=f"default: {data.DEFAULT_DATA_DIR}")
    parser.add_argument("--prompts-per-category", type=int, default=None, help="default: 1")
    parser.add_argument("--skip-per-category", type=int, default=None, help="leave out the prompts that a selection of "
                        "this many per category takes, e.g. 3 after tuning on --prompts-per-category 3: held-out "
                        "prompts (default: 0)")
    parser.add_argument("--selection", choices=("shortest", "spread", "first"), default=None, help="default: shortest")
    parser.add_argument("--max-prompt-chars", type=int, default=None, help="default: 300")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: 64")
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--output-dir", type=Path, default=data.REPO_ROOT / "benchmarks" / "results")
    parser.add_argument("--name", default="replay")
    args = parser.parse_args(argv)
    given = [f"--{name.replace('_', '-')}" for name in SELECTION_DEFAULTS if getattr(args, name) is not None]
    if args.traces is not None and given:
        raise ValueError(f"{', '.join(given)} with --traces: the saved traces' prompts and budgets are replayed, so "
                         "these would do nothing. Fix: drop them, or drop --traces to trace a new selection.")
    check_along(args, [flag for flag in given if flag != "--data-dir"])
    for name, default in SELECTION_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)

    # 1. Methods and costs first: a bad entry fails before any model loads.
    specs = methods.parse_draft_lengths(args.draft_lengths)
    default_tokens = RULES.get(args.rule).default_num_draft_tokens
    built = [(f"semspec:{args.rule}/{s.label}", s,
              methods.build_policy(s.policy, s.tokens, default_tokens, dict(s.options))) for s in specs]
    for name, _, policy in built:
        if not replayable(policy):
            raise ValueError(f"--draft-lengths: {name} decides per drafted token from more than the draft's entropy; "
                             f"replay takes fixed-budget policies and {sorted(ENTROPY_POLICIES)}")
    if args.skip_per_category < 0:
        raise ValueError(f"--skip-per-category: got {args.skip_per_category}; expected >= 0. Fix: pass 0 to skip none.")
    if args.round_time_noise < 0:
        raise ValueError(f"--round-time-noise: got {args.round_time_noise}; expected σ >= 0. Fix: pass 0 for none.")
    if args.seeds < 1 or (args.seeds > 1 and args.round_time_noise == 0):
        raise ValueError(f"--seeds: got {args.seeds} with --round-time-noise {args.round_time_noise}; expected 1, or "
                         "more only with noise (without it every seed replays the same rounds). Fix: pass "
                         "--round-time-noise σ > 0, or --seeds 1.")
    if (args.costs is None) == (args.verify_cost is None):
        raise ValueError(f"--costs {args.costs} and --verify-cost {args.verify_cost}: expected exactly one. Fix: "
                         "pass a live run's results JSON as --costs (a line a + b·k), or a verify_cost JSON as "
                         "--verify-cost (per-length costs).")
    costs = load_costs(args.costs) if args.costs is not None else metrics.per_length_costs(args.verify_cost)

    # 2. Traces: per prompt, the output (`exact`: the target's greedy one; `fly`: a live run's) and the models'
    # predictions over it.
    if args.traces is not None:
        saved = markdown.load_results(args.traces, "replay", "--traces")
        if saved.get("rule", "exact") != args.rule:
            raise ValueError(f"--traces {args.traces}: its traces are of rule {saved.get('rule', 'exact')!r}, not "
                             f"--rule {args.rule!r}. Fix: pass --rule {saved.get('rule', 'exact')}, or other traces.")
        traces, selection, model_names, trace_seconds = (saved["traces"], saved["selection"], saved["models"],
                                                         saved["trace_seconds"])
    elif args.rule == "fly":
        pair = load_pair("qwen", cache_dir=args.cache_dir)
        model_names = {"target": pair.target_name, "draft": pair.draft_name}
        outputs, rule_options, selection = along_outputs(args.along, args.along_method, pair, args.data_dir)
        start = time.perf_counter()
        traces = []
        for i, (prompt, tokens) in enumerate(outputs):
            traces.append(record_trace_along(pair, prompt, tokens, rule_options))
            print(f"trace {i + 1}/{len(outputs)}: {prompt.prompt_id} ({prompt.category}), {len(tokens)} tokens",
                  flush=True)
        trace_seconds = time.perf_counter() - start
    else:
        pool = data.load_question_prompts(args.data_dir / data.SPECBENCH_FILE, args.max_new_tokens)
        pool, _ = data.drop_long(pool, args.max_prompt_chars or None)
        prompts, selection = held_out_selection(pool, args.prompts_per_category, args.skip_per_category,
                                                args.selection, args.max_prompt_chars, args.max_new_tokens)
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

    # 3. Replay every policy over the prompts: one instance per key of --policy-state (the run, a prompt, a category).
    rounds_of = [FlyRounds.of_trace(trace) if args.rule == "fly" else trace["runs"] for trace in traces]
    records = []
    for name, spec, _ in built:
        for seed in range(args.seed, args.seed + args.seeds):
            instances = {}  # every seed replays from untrained policies
            rng = random.Random(seed)
            for trace, rounds in zip(traces, rounds_of):
                key = methods.policy_key(args.policy_state, trace["prompt_id"], trace["category"])
                if key not in instances:
                    instances[key] = methods.build_policy(spec.policy, spec.tokens, default_tokens, dict(spec.options))
                policy = instances[key]
                counts = replay(policy, rounds, trace["max_new_tokens"], costs, trace.get("entropies"),
                                args.round_time_noise, rng)
                records.append({"method": name, "prompt_id": trace["prompt_id"], "category": trace["category"],
                                "seed": seed, **counts})
    results = {
        "models": model_names, "selection": selection, "costs": costs, "trace_seconds": trace_seconds,
        "round_time_noise": args.round_time_noise, "seed": args.seed, "seeds": args.seeds,
        "policy_state": args.policy_state, "rule": args.rule,
        "methods": [{"name": name, "rule": args.rule, "draft_length": spec.policy,
                     "draft_length_kwargs": dict(spec.options), "gamma": spec.tokens,
                     "draft_length_config": policy.config.all_options()} for name, spec, policy in built],
        "records": records, "traces": traces,
    }
    if args.check is not None:
        first_seed = [r for r in records if r["seed"] == args.seed]
        results["check"], results["check_source"] = check_against(args.check, first_seed, costs, results["methods"]), args.check.name
    markdown.write_summary(args.output_dir, args.name, render(results), results)
    return results


if __name__ == "__main__":
    main()
