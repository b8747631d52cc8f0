"""What is measured, defined once for every method: new tokens, target forwards, GSM8K answers, speed-up ratios.

- `new_token_ids` / `count_new_tokens`: the ONE token counter (generated ids after the prompt, up to and including
  the first EOS if one was emitted).
- `ForwardMeter`: counts (and times) the forward calls of a model with hooks, so τ = new tokens / target forwards is
  counted the same way for plain (τ = 1 by construction), stock assisted and hf_semspec.
- `parse_final_number`: the final number of a model's GSM8K answer.
- `ratio_summary` / `aggregate`: per-prompt speed-up ratios summarized by median and geometric mean (with the
  geomean's standard error and 95% interval).
- `fit_round_costs` / `modeled_tokens_per_s`: a cost model fitted on the run's own timings, so that draft-length
  policies can be compared without the timing noise of a shared machine (see `fit_round_costs`).
"""

from __future__ import annotations

import json
import math
import re
import statistics
import time
from collections.abc import Iterable, Sequence
from decimal import Decimal, InvalidOperation
from pathlib import Path

import torch

from hf_semspec.comparison import t_quantile_975
from hf_semspec.stats import AcceptanceStats

# The per-round lists of `AcceptanceStats`: each record keeps its own; summaries over prompts leave them out.
PER_ROUND_FIELDS = ("drafted_per_round", "accepted_per_round")
# Fields of `AcceptanceStats` that files written before them lack (they then take their defaults).
OPTIONAL_FIELDS = PER_ROUND_FIELDS + ("num_row_forwards", "num_draft_forwards", "num_ngram_hits", "num_ngram_drafts",
                                      "acceptance", "acceptance_kwargs", "drafting", "drafting_reason")

# ---------------------------------------------------------------------------------------------------------------------
# Tokens and forwards
# ---------------------------------------------------------------------------------------------------------------------


def new_token_ids(sequences: torch.Tensor, prompt_length: int, eos_token_ids: Iterable[int] = ()) -> list[int]:
    """Generated ids after the prompt, cut after the first EOS (kept: it was generated, and it costs a forward).

    `sequences` is `(1, length)` or `(length,)`; ids after an EOS (padding, in batched outputs) are not counted.
    """
    row = sequences[0] if sequences.dim() == 2 else sequences
    if row.shape[0] < prompt_length:
        raise ValueError(f"output of {row.shape[0]} ids is shorter than the prompt ({prompt_length})")
    ids = row[prompt_length:].tolist()
    eos = set(eos_token_ids)
    for i, token in enumerate(ids):
        if token in eos:
            return ids[: i + 1]
    return ids


def count_new_tokens(sequences: torch.Tensor, prompt_length: int, eos_token_ids: Iterable[int] = ()) -> int:
    """Number of new tokens, as defined by `new_token_ids`; used for every method."""
    return len(new_token_ids(sequences, prompt_length, eos_token_ids))


def eos_ids_of(model: torch.nn.Module) -> list[int]:
    """The EOS ids of a model's generation config (an int, a list, or none)."""
    eos = model.generation_config.eos_token_id
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


class ForwardMeter:
    """Counts the top-level forward calls of `model` and the wall time spent inside them.

    A forward pre-hook counts the call and starts a clock, a forward hook stops it. Whatever calls the model — stock
    `generate()`, transformers' assisted decoding, hf_semspec's loop — goes through `module.__call__`, so every
    method is counted the same way. Use as a context manager (hooks removed on exit); `reset()` between runs.
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.calls = 0
        self.seconds = 0.0
        self._started: float | None = None
        self._handles: list = []

    def reset(self) -> None:
        self.calls, self.seconds, self._started = 0, 0.0, None

    def _pre_hook(self, module, args) -> None:
        self.calls += 1
        self._started = time.perf_counter()

    def _post_hook(self, module, args, output) -> None:
        if self._started is not None:
            self.seconds += time.perf_counter() - self._started
            self._started = None

    def __enter__(self) -> "ForwardMeter":
        self._handles = [
            self.model.register_forward_pre_hook(self._pre_hook),
            self.model.register_forward_hook(self._post_hook),
        ]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


# ---------------------------------------------------------------------------------------------------------------------
# GSM8K answers
# ---------------------------------------------------------------------------------------------------------------------

# A number: optional sign and `$`, thousands separators, decimals. The sign counts only when it is not glued to a
# word or digit before it, so "16-3-4=9" reads 16, 3, 4, 9 and not 16, -3, -4, 9. U+2212 (−) is a minus too.
_NUMBER = re.compile(
    r"(?<![\w.])(?P<sign>[-−]?)\\?\$?(?P<sign2>[-−]?)"
    r"(?P<body>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)(?!\d)"
)
_FRACTION = re.compile(r"\\d?frac\{\s*(-?\d+(?:\.\d+)?)\s*\}\{\s*(-?\d+(?:\.\d+)?)\s*\}")
_ANSWER_MARKER = re.compile(r"(?:final\s+answer|answer\s*(?:is|:|=|would\s+be|will\s+be))", re.IGNORECASE)


def normalize_number(text: str) -> str | None:
    """The last number in `text` as a canonical string ("1,234.50" → "1234.5", "18.00" → "18"), or None."""
    matches = list(_NUMBER.finditer(text))
    if not matches:
        return None
    m = matches[-1]
    negative = bool(m.group("sign") or m.group("sign2"))
    return _canonical(("-" if negative else "") + m.group("body").replace(",", ""))


def _canonical(number: str) -> str | None:
    try:
        value = Decimal(number)
    except InvalidOperation:
        return None
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def _last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (nested braces allowed), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return text[i + 1 :]  # unclosed (output cut by max_new_tokens): take what is there


def parse_final_number(text: str) -> str | None:
    """The final numeric answer of a model's text, canonical (see `normalize_number`), or None.

    Priority: the last `\\boxed{...}` (a `\\frac{a}{b}` in it is a/b); then the number after the last `####`; then
    the first number after the last "answer is" / "answer:" / "final answer"; else the last number in the text.
    Commas, `$`, `%`, trailing periods, negative (also −) and decimal numbers are handled.
    """
    boxed = _last_boxed(text)
    if boxed is not None:
        fraction = _FRACTION.search(boxed)
        if fraction and Decimal(fraction.group(2)) != 0:
            return _canonical(str(Decimal(fraction.group(1)) / Decimal(fraction.group(2))))
        value = normalize_number(boxed)
        if value is not None:
            return value
    for marker in (re.compile(r"####"), _ANSWER_MARKER):
        found = list(marker.finditer(text))
        if found:
            first = _NUMBER.search(text, found[-1].end())
            if first is not None:
                return normalize_number(first.group(0))
    return normalize_number(text)


# ---------------------------------------------------------------------------------------------------------------------
# Aggregation
# ---------------------------------------------------------------------------------------------------------------------


def geometric_mean(values: Sequence[float]) -> float:
    if not values or any(v <= 0 for v in values):
        raise ValueError(f"geometric mean needs positive values, got {list(values)}")
    return math.exp(sum(math.log(v) for v in values) / len(values))


def log_standard_error(ratios: Sequence[float]) -> float | None:
    """The standard error of ln(geometric mean) of per-prompt ratios: sd(ln r) / sqrt(n), which for small values is
    the relative error of the geometric mean; None under two ratios."""
    if len(ratios) < 2:
        return None
    return statistics.stdev(math.log(r) for r in ratios) / math.sqrt(len(ratios))


def ratio_summary(ratios: Sequence[float]) -> dict | None:
    """Median and geometric mean of per-prompt ratios (the geomean is the right mean of ratios: a 2× and a 0.5×
    average to 1×), with min/max/n, the standard error of ln(geomean) (`log_se`) and the 95% interval of the geomean
    it gives, geomean · exp(±t · log_se) with t Student's 97.5% quantile at n − 1 degrees of freedom (`ci95`, None
    under two ratios: `hf_semspec.comparison.t_quantile_975`); None when there are none."""
    if not ratios:
        return None
    geomean = geometric_mean(ratios)
    error = log_standard_error(ratios)
    t = t_quantile_975(len(ratios) - 1) if error is not None else None
    return {
        "median": statistics.median(ratios),
        "geomean": geomean,
        "min": min(ratios),
        "max": max(ratios),
        "n": len(ratios),
        "log_se": error,
        "ci95": None if error is None else [geomean * math.exp(-t * error), geomean * math.exp(t * error)],
    }


def add_per_prompt_ratios(records: list[dict], plain: str = "plain", stock: str = "stock_assisted") -> None:
    """Sets `speedup_vs_plain` / `speedup_vs_stock` on every record: its tokens/s over the baseline's tokens/s on the
    same prompt (None when the baseline did not run), and `identical_to_plain` (token-identical to plain's output)."""
    by_prompt: dict[str, dict[str, dict]] = {}
    for r in records:
        by_prompt.setdefault(r["prompt_id"], {})[r["method"]] = r
    for r in records:
        same_prompt = by_prompt[r["prompt_id"]]
        for key, baseline in (("speedup_vs_plain", plain), ("speedup_vs_stock", stock)):
            base = same_prompt.get(baseline)
            r[key] = r["tokens_per_s"] / base["tokens_per_s"] if base else None
        base = same_prompt.get(plain)
        r["identical_to_plain"] = (r["new_token_ids"] == base["new_token_ids"]) if base else None


def acceptance_from_dict(d: dict) -> AcceptanceStats:
    """Rebuilds `AcceptanceStats` from its `to_dict()` (counts only; the rates are derived). Files written before the
    stats kept each round (`drafted_per_round`, `accepted_per_round`) rebuild with those lists empty."""
    fields = AcceptanceStats.__dataclass_fields__
    # (`num_row_forwards`, absent from files written before it, is then filled from `num_target_forwards`.)
    return AcceptanceStats(**{k: d[k] for k in fields if k in d or k not in OPTIONAL_FIELDS})


def pooled_acceptance(stats: AcceptanceStats) -> dict:
    """`stats.to_dict()` without the per-round lists: a summary over prompts keeps the counts and rates (each record
    keeps its own rounds)."""
    return {k: v for k, v in stats.to_dict().items() if k not in PER_ROUND_FIELDS}


def summarize_records(records: list[dict]) -> dict:
    """Aggregates of one method over some prompts (all, or one category)."""
    new_tokens = sum(r["new_tokens"] for r in records)
    wall = sum(r["wall_s"] for r in records)
    forwards = sum(r["target_forwards"] for r in records)
    accepted = [acceptance_from_dict(r["acceptance_stats"]) for r in records if r.get("acceptance_stats")]
    merged = sum(accepted[1:], accepted[0]) if accepted else None
    identical = [r["identical_to_plain"] for r in records if r.get("identical_to_plain") is not None]
    graded = [r["gsm8k"]["correct"] for r in records if r.get("gsm8k")]
    return {
        "prompts": len(records),
        "new_tokens": new_tokens,
        "wall_s": wall,
        "tokens_per_s": new_tokens / wall if wall else 0.0,
        "speedup_vs_plain": ratio_summary([r["speedup_vs_plain"] for r in records if r.get("speedup_vs_plain")]),
        "speedup_vs_stock": ratio_summary([r["speedup_vs_stock"] for r in records if r.get("speedup_vs_stock")]),
        # τ over the prompts: ratio of sums (a long answer weighs in by its number of forwards, as in the papers).
        "target_forwards": forwards,
        "tau": new_tokens / forwards if forwards else 0.0,
        "tau_per_prompt_median": statistics.median([r["tau"] for r in records]) if records else None,
        "acceptance": pooled_acceptance(merged) if merged is not None else None,
        "drafting": drafting_summary(records),
        "identical_to_plain": sum(identical) / len(identical) if identical else None,
        "gsm8k_accuracy": sum(graded) / len(graded) if graded else None,
        "gsm8k_graded": len(graded),
        "model_seconds": {
            "target_forward": sum(r["target_forward_s"] for r in records),
            "draft_forward": sum(r["draft_forward_s"] for r in records),
        },
    }


def drafting_summary(records: list[dict]) -> dict | None:
    """How a method's drafts were made, over `records` (None without hf_semspec's statistics: plain, stock). Summed
    from each record's statistics, a missing count read as 0 (files written before it, or statistics without it):

    - `draft_forwards_per_drafted_token`: the draft model's forwards per draft token proposed (its statistics'
      `num_draft_forwards` / `num_drafted`): 1 drafting token by token, 0 by prompt lookup alone, below 1 where
      multi-level drafting confirms n-gram candidates in fewer forwards;
    - `ngram_hit_rate`: the rounds whose prompt lookup found drafts (`num_ngram_hits`) per round of a row
      (`num_row_forwards`);
    - `ngram_draft_share`: the drafts the draft model confirmed from an n-gram candidate (`num_ngram_drafts`) per draft;
    - `draft_model_forwards`: the draft model's forwards counted by the hook on it (its prefills too), the same
      counter for every method.
    """
    stats = [r["acceptance_stats"] for r in records if r.get("acceptance_stats")]
    if not stats:
        return None

    def total(name: str) -> int:
        return sum(s.get(name) or 0 for s in stats)

    drafted, rounds = total("num_drafted"), sum(s.get("num_row_forwards") or s["num_target_forwards"] for s in stats)
    forwards, hits, confirmed = total("num_draft_forwards"), total("num_ngram_hits"), total("num_ngram_drafts")
    return {
        "num_drafted": drafted,
        "num_row_forwards": rounds,
        "num_draft_forwards": forwards,
        "num_ngram_hits": hits,
        "num_ngram_drafts": confirmed,
        "draft_forwards_per_drafted_token": forwards / drafted if drafted else None,
        "ngram_hit_rate": hits / rounds if rounds else None,
        "ngram_draft_share": confirmed / drafted if drafted else None,
        "draft_model_forwards": sum(r.get("draft_forwards") or 0 for r in records if r.get("acceptance_stats")),
    }


def speedup_over(records: list[dict], method: str, baseline: str) -> dict | None:
    """`ratio_summary` of `method`'s tokens/s over `baseline`'s on each prompt both ran (None where none): e.g. a
    drafting's speed-up over `semspec:exact` in the run that timed both."""
    by_prompt: dict[str, dict[str, dict]] = {}
    for r in records:
        by_prompt.setdefault(r["prompt_id"], {})[r["method"]] = r
    ratios = [p[method]["tokens_per_s"] / p[baseline]["tokens_per_s"] for p in by_prompt.values()
              if method in p and baseline in p and p[baseline]["tokens_per_s"] > 0 and p[method]["tokens_per_s"] > 0]
    return ratio_summary(ratios)


def aggregate(records: list[dict], method_names: list[str]) -> dict:
    """`{"overall": {method: summary}, "per_category": {category: {method: summary}}}`."""
    categories = list(dict.fromkeys(r["category"] for r in records))
    overall = {m: summarize_records([r for r in records if r["method"] == m]) for m in method_names}
    per_category = {
        c: {m: summarize_records([r for r in records if r["method"] == m and r["category"] == c]) for m in method_names}
        for c in categories
    }
    return {"overall": overall, "per_category": per_category}


# ---------------------------------------------------------------------------------------------------------------------
# Cost model: comparing policies without the timing noise
# ---------------------------------------------------------------------------------------------------------------------


def token_budgets(results: dict) -> dict[str, list[int]]:
    """The `max_new_tokens` the prompts of each category were decoded with (GSM8K's budget is its own), from a run's
    records or a replay's traces: what two results files must share to be compared, whatever the command line
    spelled (a profile's default, or the same number given explicitly)."""
    budgets: dict[str, set[int]] = {}
    for item in results.get("records", []) + results.get("traces", []):
        if item.get("max_new_tokens") is not None:
            budgets.setdefault(item.get("category", ""), set()).add(int(item["max_new_tokens"]))
    return {category: sorted(values) for category, values in sorted(budgets.items())}


# A method's options that must agree for its records in two results files to count as one method's (merge, pool,
# resolution): what ran, at which length, with which rule and policy options, with which draft.
# (`prompt_lookup`: None for methods with a draft model alone, as in files written before it.)
SAME_METHOD_OPTIONS = ("kind", "gamma", "rule", "rule_kwargs", "draft_length", "draft_length_config", "draft",
                       "prompt_lookup")


def run_options(results: dict) -> dict:
    """The run-wide options that change what every method (or the stock baseline) does: sampling, and the stock
    method's confidence threshold where the run has one (replays record neither: greedy, no stock)."""
    config = results.get("config") or {}
    options = {"sample": bool(config.get("sample", False))}
    if any(m.get("kind") == "stock" for m in results.get("methods", [])):
        options["stock_confidence_threshold"] = config.get("stock_confidence_threshold")
    return options


def differing_setups(first: dict, other: dict) -> dict[str, tuple]:
    """What differs between two results files' models (names and dtypes, where both record them) and token budgets
    (in the categories both hold), as `{what: (first's, other's)}`."""
    differ = {}
    models_a, models_b = first.get("models") or {}, other.get("models") or {}
    for key in ("target", "draft", "target_dtype", "draft_dtype"):
        if key in models_a and key in models_b and models_a[key] != models_b[key]:
            differ[key] = (models_a[key], models_b[key])
    budgets_a, budgets_b = token_budgets(first), token_budgets(other)
    for category in sorted(set(budgets_a) & set(budgets_b)):
        if budgets_a[category] != budgets_b[category]:
            differ[f"max_new_tokens ({category})"] = (budgets_a[category], budgets_b[category])
    return differ


def fit_round_costs(records: list[dict]) -> dict | None:
    """Least-squares fit, over the run's hf_semspec generations that draft with the draft model alone (not by prompt
    lookup: `drafting` "lookup" or "mla", whose drafts cost no draft forward each), of

        wall_s = c_p + a · F + b · D

    with `F` the generation's target forwards, `D` its draft forwards (one per drafted token) and `c_p` one intercept
    per prompt (the prompt's prefills and fixed costs, shared by every method on it). A target forward over q tokens
    costs t0 + t1 · q, and a round verifies γ + 1 tokens, so Σ over rounds = F · (t0 + t1) + D · t1: `a` is the cost
    of a target forward and `b` that of a drafted token (draft step + its share of verification), both per run.

    Why: on a shared machine the same computation varies by tens of percent from run to run, more than the
    differences between draft lengths. With greedy decoding `F` and `D` are deterministic, so `a · F + b · D` (the
    *modeled* decode time) ranks policies by what they do, with the machine's own costs.

    Returns `{"seconds_per_target_forward", "seconds_per_draft_forward", "r2", "residual_relative_sd",
    "generations", "prompts"}`, or None when the fit is not determined (F and D do not vary independently of the
    prompts and of each other, or there are no more generations than unknowns) or not physical (a cost ≤ 0, which a
    few noisy generations can give: then modeled speeds would be negative).
    """
    # Drafts by prompt lookup (alone or checked by the draft model, MLA) cost no draft forward each: not this line.
    used = [r for r in records if r.get("acceptance_stats") and r["wall_s"] > 0
            and r.get("drafting", "model") in (None, "model")]
    prompts = list(dict.fromkeys(r["prompt_id"] for r in used))
    if len(used) <= len(prompts) + 2:
        return None
    design = torch.zeros(len(used), len(prompts) + 2, dtype=torch.float64)
    for i, r in enumerate(used):
        design[i, prompts.index(r["prompt_id"])] = 1.0
        design[i, -2] = r["target_forwards"]
        design[i, -1] = r["draft_forwards"]
    wall = torch.tensor([r["wall_s"] for r in used], dtype=torch.float64)
    if int(torch.linalg.matrix_rank(design)) < design.shape[1]:
        return None
    coefficients = torch.linalg.lstsq(design, wall.unsqueeze(1)).solution.squeeze(1)
    if float(coefficients[-2]) <= 0 or float(coefficients[-1]) <= 0:
        return None
    residual = wall - design @ coefficients
    total = ((wall - wall.mean()) ** 2).sum()
    return {
        "seconds_per_target_forward": float(coefficients[-2]),
        "seconds_per_draft_forward": float(coefficients[-1]),
        "r2": float(1 - (residual**2).sum() / total) if total > 0 else 1.0,
        "residual_relative_sd": float((residual / wall).std()),
        "generations": len(used),
        "prompts": len(prompts),
    }


def run_cost_model(results: dict) -> dict | None:
    """A results dict's cost model: the one its run stored (`aggregates.cost_model`), else fitted from its records
    (files written before the cost model existed)."""
    return results["aggregates"].get("cost_model") or fit_round_costs(results["records"])


def rounds_by_length(record: dict) -> dict[int, int]:
    """k → rounds of the generation that drafted k tokens; plain decoding's forwards are rounds of k = 0.

    A replayed record stores them (`rounds_by_length`). For a live one, `drafted_per_position[i]` counts the rounds
    that drafted position i + 1, so the rounds that drafted exactly k are its (k − 1)-th entry minus its k-th, and the
    rounds that drafted nothing are the target forwards left over."""
    if "rounds_by_length" in record:
        return {int(k): n for k, n in record["rounds_by_length"].items()}
    stats = record.get("acceptance_stats")
    if not stats:
        return {0: record["target_forwards"]}
    drafted = list(stats["drafted_per_position"]) + [0]
    rounds = {k: drafted[k - 1] - drafted[k] for k in range(1, len(drafted)) if drafted[k - 1] > drafted[k]}
    if record["target_forwards"] > drafted[0]:
        rounds[0] = record["target_forwards"] - drafted[0]
    return rounds


def per_length_costs(path: Path) -> dict:
    """The cost model of a `benchmarks/verify_cost.py` measurement: a round drafting k costs v(k) + k·d, v(k) being
    the measured median of the target's forward over k + 1 tokens and d the draft step (`modeled_seconds`)."""
    measured = json.loads(Path(path).read_text(encoding="utf-8"))
    if "verify_seconds" not in measured:
        raise ValueError(f"{path}: no 'verify_seconds' in it. Fix: pass the JSON that benchmarks/verify_cost.py wrote "
                         "(e.g. benchmarks/results/verify-cost-160.json).")
    return {"verify_seconds": {int(k): v for k, v in measured["verify_seconds"].items()},
            "seconds_per_draft_forward": measured["draft_step"], "cached_tokens": measured["prompt_tokens"],
            "source": Path(path).name}


def describe_costs(costs: dict, lengths=(0, 2, 3, 8)) -> str:
    """In words, what a round costs under `costs`: the line's two prices, or, for per-length costs, their source and
    v(k) at those of `lengths` that were measured."""
    per_draft = f"{costs['seconds_per_draft_forward']:.3f} s per drafted token"
    if "verify_seconds" not in costs:
        return f"{costs['seconds_per_target_forward']:.3f} s per target forward + {per_draft}"
    verify = {int(k): v for k, v in costs["verify_seconds"].items()}
    measured = ", ".join(f"v({k}) = {verify[k]:.3f} s" for k in lengths if k in verify)
    return (f"per-length costs measured in `{costs['source']}` ({costs['cached_tokens']} cached tokens): v(k) + "
            f"{per_draft} ({measured})")


def _verify_seconds(costs: dict, lengths) -> dict[int, float]:
    """Per-length `costs`' k → v(k) (int keys also after a JSON round trip); raises when one of `lengths` is missing."""
    verify = {int(k): v for k, v in costs["verify_seconds"].items()}
    missing = sorted(k for k in lengths if k not in verify)
    if missing:
        raise ValueError(f"no verify time measured for k = {missing} in {costs.get('source', 'the costs')} "
                         f"(measured up to {max(verify)}). Fix: rerun benchmarks/verify_cost.py with a larger --max-k")
    return verify


def round_seconds(costs: dict, num_drafted: int) -> float:
    """What a round drafting `num_drafted` costs under `costs`: v(k) + k·d per length, else the line a + b·k."""
    if "verify_seconds" in costs:
        return _verify_seconds(costs, [num_drafted])[num_drafted] + costs["seconds_per_draft_forward"] * num_drafted
    return costs["seconds_per_target_forward"] + costs["seconds_per_draft_forward"] * num_drafted


def modeled_seconds(record: dict, costs: dict) -> float:
    """The generation's modeled decode time (prefill left out, see `fit_round_costs`): `a · F + b · D` under a fitted
    line, or Σ_k n_k·v(k) + D·d under per-length costs (n_k: its rounds that drafted k, `rounds_by_length`)."""
    if "verify_seconds" in costs:
        rounds = rounds_by_length(record)
        verify = _verify_seconds(costs, rounds)
        drafting = costs["seconds_per_draft_forward"] * record["draft_forwards"]
        return sum(n * verify[k] for k, n in rounds.items()) + drafting
    return (costs["seconds_per_target_forward"] * record["target_forwards"]
            + costs["seconds_per_draft_forward"] * record["draft_forwards"])


def modeled_tokens_per_s(record: dict, costs: dict) -> float:
    """New tokens per modeled decode second (`modeled_seconds`)."""
    return record["new_tokens"] / modeled_seconds(record, costs)
