"""Benchmark hf_semspec against plain and stock assisted decoding on Spec-Bench and GSM8K.

    python benchmarks/run.py                          # quick profile, Qwen2.5-Coder 1.5B target / 0.5B draft
    python benchmarks/run.py --pair smollm2           # SmolLM2-135M as target and draft (CI-sized)
    python benchmarks/run.py --profile full           # all 480 Spec-Bench prompts, longer outputs (GPU / long run)
    python benchmarks/run.py --rules exact,fly --acceptance-kwargs '{"fly": {"window": 4}}'
    python benchmarks/run.py --sample --seed 0        # sampling, same seed per prompt for every method

Methods (all in one run, on the same prompts, interleaved per prompt in a rotating order): `plain` (the target
alone), `stock_assisted` (transformers' assisted generation with the same draft) and `semspec:<rule>` for every
acceptance rule registered when the run starts (rules that cannot run with this draft are skipped with the reason);
with `--drafting model,lookup,mla --prompt-lookup K[:N]`, each rule's method also drafts by prompt lookup alone
(`semspec:<rule>+lookup`, no draft model) and with the draft model verifying the n-gram candidates (`+mla`).
Writes <output-dir>/<name>.json (everything), .md (tables) and .png (plot, if matplotlib is installed). While it
runs, every finished prompt is saved to <name>.json.partial: a run stopped before its end continues with the same
command line plus --resume.
"""

from __future__ import annotations

import os

# Before torch is imported (read once, at start-up):
os.environ.setdefault("MKL_CBWR", "AUTO")  # measured: cheaper multi-token verify forwards on this CPU
# Idle OpenMP threads sleep instead of spinning. On this shared 2-core machine, other processes' load made 2 spinning
# threads 6-10x slower (SmolLM2, 32 tokens: 14-27 s ACTIVE vs 2.2-2.6 s PASSIVE, load average ~5). Override it in
# the environment for a quiet machine if ACTIVE measures faster there; the value is recorded in the results.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from contextlib import nullcontext  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import asdict, dataclass, replace  # noqa: E402
from pathlib import Path  # noqa: E402

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

import hf_semspec  # noqa: E402
from hf_semspec.draft_length import POLICIES  # noqa: E402
from hf_semspec.drafters import PrunedVocabDrafter  # noqa: E402
from benchmarks import data, markdown, methods as methods_lib, metrics, models, profiling, report  # noqa: E402

DEFAULT_OUTPUT_DIR = data.REPO_ROOT / "benchmarks" / "results"


@dataclass(frozen=True)
class Profile:
    """What a profile runs. `per_category=None`: every prompt of every category; `max_prompt_chars=None`: no cap."""

    per_category: int | None
    selection: str
    max_prompt_chars: int | None
    max_new_tokens: int
    gsm8k: int
    gsm8k_selection: str
    gsm8k_max_new_tokens: int
    profile_breakdown: bool
    skip_per_category: int = 0  # held-out prompts: leave out those a run with this many per category measured


PROFILES = {
    # Sized to finish in < 15 min on the qwen pair with 7 methods on this 2-core CPU. Measured on a quiet machine
    # (2026-11-22): plain decoding ~3.0 tok/s, a speculative method ~4.5-5 tok/s on predictable text; the bf16 draft
    # prefills at only ~28 tok/s (no native bf16 GEMM on this CPU), so prompt length costs every method. Hence:
    # - one prompt per category, the shortest, and only prompts of <= 300 characters: this drops the long-input
    #   categories (extraction, summarization, rag: rag's shortest prompt alone is 741 tokens);
    # - 32 new tokens per prompt: enough for several rounds of γ + 1, so decoding, not prefill, dominates;
    # - no GSM8K problem: one or two problems say nothing about accuracy, and each costs ~5 min across the methods
    #   at the 256 tokens a step-by-step answer needs; accuracy has its own run (`--gsm8k N --limit 0`).
    "quick": Profile(per_category=1, selection="shortest", max_prompt_chars=300, max_new_tokens=32, gsm8k=0,
                     gsm8k_selection="shortest", gsm8k_max_new_tokens=256, profile_breakdown=True),
    # Everything, outputs cut at 256 tokens; meant for a GPU or a long run.
    "full": Profile(per_category=None, selection="first", max_prompt_chars=None, max_new_tokens=256, gsm8k=200,
                    gsm8k_selection="first", gsm8k_max_new_tokens=384, profile_breakdown=False),
}

# A-priori throughput (tokens/s) for the estimate printed before a run: plain decoding, the target's prefill, the
# draft's prefill by draft dtype. Measured on this 2-core CPU (qwen; scaled from runs under load), rough for smollm2.
# Speculative methods are assumed no faster than plain, so the estimate is an upper bound.
ASSUMED_RATES = {
    "qwen": {"decode": 3.0, "prefill": 36.0, "draft_prefill": {"bfloat16": 28.0, "float32": 135.0, "float16": 28.0}},
    "smollm2": {"decode": 15.0, "prefill": 300.0, "draft_prefill": {"bfloat16": 100.0, "float32": 700.0, "float16": 100.0}},
}


# ---------------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------------


def _at_least(low: int):
    """An argparse type: an int ≥ `low` (argparse names the flag in its error)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value
    parse.__name__ = f"integer >= {low}"
    return parse


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {value}")
    return value


def _parsed(parse: Callable):
    """An argparse type from a parser of the harness that raises `ValueError` with the flag, the value and the fix:
    argparse prints that message (it replaces a plain ValueError's with "invalid value")."""
    def wrapped(text: str):
        try:
            return parse(text)
        except ValueError as error:
            # argparse names the flag itself ("argument --prompt-lookup: ..."): not twice
            message = str(error)
            message = message.split(": ", 1)[1] if message.startswith("--") else message
            raise argparse.ArgumentTypeError(message) from None
    wrapped.__name__ = parse.__name__
    return wrapped


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python benchmarks/run.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--profile", choices=sorted(PROFILES), default="quick", help="what to run (default: quick)")
    p.add_argument("--pair", choices=models.PAIR_NAMES, default="qwen",
                   help="qwen: Qwen2.5-Coder 1.5B target / 0.5B draft (default); smollm2: SmolLM2-135M as both")
    p.add_argument("--rules", default=None,
                   help="comma-separated acceptance rules (default: every registered rule: "
                        f"{','.join(hf_semspec.available_rules())}); an entry may carry options, "
                        "'dropmatch(criterion=js;min_votes=2)': a variant of the rule, its own method")
    p.add_argument("--acceptance-kwargs", type=json.loads, default={},
                   help='JSON object of options per rule, e.g. \'{"ears": {"beta": 0.2}}\'')
    p.add_argument("--num-assistant-tokens", type=_at_least(1), default=None,
                   help="γ for every speculative method: stock's, and the length of each --draft-lengths entry "
                        "that gives none of its own (default: each rule's default; stock: exact's default)")
    p.add_argument("--draft-lengths", default=None,
                   help="comma-separated draft-length policies, each optionally with :<num_assistant_tokens> and "
                        "(<option>=<value>;...) draft_length_kwargs, e.g. "
                        "'constant:3,constant:8,heuristic,adaedl,tapout,tapout(bandit=ucb_tuned)'; one method per rule "
                        "and entry (default: "
                        f"the constant policy at each rule's γ). Registered: {','.join(POLICIES.names())}")
    p.add_argument("--policy-state", choices=methods_lib.POLICY_STATES, default="run",
                   help="which prompts share an instance of a draft-length policy that learns (tapout, cost_aware, "
                        "adaedl, best_constant): 'run' (default) all, as generate() keeps one per models and options; "
                        "'category' those of one Spec-Bench category (the method's name ends in /per-category), as a "
                        "server that knew each request's kind could keep one per kind")
    p.add_argument("--prompt-lookup", type=_parsed(methods_lib.parse_prompt_lookup), default=None, metavar="K[:N]",
                   help="prompt-lookup drafting for the --drafting lookup and mla methods: up to K tokens copied per "
                        "round from the context after its last n-gram, N the longest n-gram searched for (default 2, "
                        "as transformers), e.g. 6:4 (generate(prompt_lookup_num_tokens=K, max_matching_ngram_size=N))")
    # Default None (model): a run saved before the flag existed resumes (`Checkpoint` compares the options).
    p.add_argument("--drafting", type=_parsed(methods_lib.parse_draftings), default=None,
                   metavar="model,lookup,mla",
                   help="how each semspec:<rule> method drafts, comma-separated, one method each: model (the draft "
                        "model, semspec:<rule>; default), lookup (prompt lookup alone, no draft model: "
                        "semspec:<rule>+lookup; rdk is skipped, with the reason), mla (both, multi-level drafting: the "
                        "draft model verifies the n-gram candidates: semspec:<rule>+mla); lookup and mla need "
                        "--prompt-lookup")
    p.add_argument("--pruned-drafter", type=Path, default=None,
                   help="folder of a saved PrunedVocabDrafter of the draft model (e.g. one cached by "
                        "benchmarks/pruned_drafters.py), used by the rules that need one (rdk); without it they are "
                        "skipped with the reason")
    p.add_argument("--skip-stock", action="store_true",
                   help="leave out stock assisted generation (e.g. for an accuracy-only or draft-length run)")
    p.add_argument("--skip-plain", action="store_true",
                   help="leave out plain decoding (greedy runs with `exact`, whose text is plain's: ratios are then "
                        "taken against a rule, e.g. by benchmarks/fidelity.py)")
    p.add_argument("--stock-confidence-threshold", type=_probability, default=None,
                   help="assistant_confidence_threshold for stock assisted generation (default: transformers' own, "
                        "0.4, which ends a drafting round early when the draft is unsure; 0 = always draft γ)")
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding (use with --seed)")
    p.add_argument("--temperature", type=float, default=None,
                   help="with --sample: the target's generation_config.temperature for every method (default: the "
                        "model's generation config)")
    p.add_argument("--top-p", type=_probability, default=None,
                   help="with --sample: the target's generation_config.top_p for every method (default: the model's)")
    p.add_argument("--seed", type=int, default=0,
                   help="RNG seed, greedy or sampled (dropmatch draws dropout masks in greedy decoding too); prompt i "
                   "uses seed + i for every method")
    p.add_argument("--data-dir", type=Path, default=data.DEFAULT_DATA_DIR,
                   help=f"folder with {data.SPECBENCH_FILE} and {data.GSM8K_FILE} (default: ../shared/data/ "
                        "relative to the repository root)")
    p.add_argument("--prompts", type=Path, default=None,
                   help="JSONL of prompts instead of Spec-Bench: Spec-Bench records or {\"prompt\": ...}")
    p.add_argument("--same-prompts-as", type=Path, default=None,
                   help="an earlier run's results JSON (a merge or pool too): run on exactly its Spec-Bench prompts, "
                        "in the round-robin order of the categories, instead of a per-category selection (with "
                        "--limit N, the first N of that order: a quick check before the full run)")
    p.add_argument("--prompts-per-category", type=_at_least(1), default=None, help="override the profile's count")
    p.add_argument("--skip-per-category", type=_at_least(1), default=None,
                   help="held-out prompts: leave out, per category, the ones a run with this many per category took")
    p.add_argument("--selection", choices=("shortest", "spread", "first"), default=None,
                   help="which prompts of a category (default: the profile's)")
    p.add_argument("--max-prompt-chars", type=_at_least(0), default=None,
                   help="leave out prompts longer than this (default: the profile's, 300 in quick; 0 = no cap)")
    p.add_argument("--limit", type=_at_least(0), default=None,
                   help="at most this many Spec-Bench/custom prompts: the first of the selection, after every other "
                        "option that chooses them (--same-prompts-as included)")
    p.add_argument("--categories", default=None,
                   help="comma-separated Spec-Bench categories to keep (default: all), e.g. math_reasoning to add "
                        "prompts of one category to an earlier run's")
    p.add_argument("--max-new-tokens", type=_at_least(1), default=None, help="override the profile's (Spec-Bench/custom)")
    p.add_argument("--gsm8k", type=_at_least(0), default=None, help="number of GSM8K problems (default: the profile's)")
    p.add_argument("--gsm8k-selection", choices=("first", "shortest"), default=None,
                   help="first problems in file order, or those with the shortest reference solutions (default: "
                        "the profile's: shortest in quick, first in full)")
    p.add_argument("--gsm8k-max-new-tokens", type=_at_least(1), default=None, help="override the profile's")
    p.add_argument("--gsm8k-problems", type=data.parse_slice, default=None, metavar="START:END",
                   help="GSM8K problems START..END-1 in file order (0-based), instead of --gsm8k / "
                        "--gsm8k-selection: one slice of a long run, merged afterwards (benchmarks/fidelity.py)")
    p.add_argument("--warmup-max-new-tokens", type=_at_least(1), default=None,
                   help="the warm-up's token budget (default: the first prompt's own). The warm-up runs every method "
                        "once before timing; it needs no full answer when it does not profile, and a few dozen "
                        "tokens save a long run minutes (GSM8K at 512 tokens: about 4 of a slice's 55 min here)")
    p.add_argument("--profile-breakdown", action=argparse.BooleanOptionalAction, default=None,
                   help="profile each method's warm-up run on the first prompt (default: on in quick, off in full)")
    p.add_argument("--output-dir", type=Path, default=DEFAULT_OUTPUT_DIR, help="default: benchmarks/results/")
    p.add_argument("--resume", action="store_true",
                   help="continue a run that was stopped before its end: every prompt it finished (all methods) was "
                        "saved to <output-dir>/<name>.json.partial, and only the others run now, with the same command "
                        "line plus --resume. A draft-length policy that learns starts afresh at the resumed prompt")
    p.add_argument("--name", default=None,
                   help="output file stem (default: the profile, plus -<pair> for a pair other than qwen)")
    p.add_argument("--cache-dir", default=None, help="model cache (default: $HF_SEMSPEC_CACHE or ~/.cache/hf_semspec)")
    p.add_argument("--draft-dtype", choices=sorted(models.DTYPES), default="bfloat16",
                   help="draft weights' dtype (default bfloat16: faster than float32 on this CPU)")
    p.add_argument("--target-dtype", choices=sorted(models.DTYPES), default="float32",
                   help="target weights' dtype (default float32: without native bf16, a bf16 verify forward costs "
                        "about k decode steps; with AVX-512 BF16 or AMX, bfloat16 is faster: README, Running on a CPU)")
    p.add_argument("--threads", type=_at_least(1), default=2, help="torch.set_num_threads (default: 2)")
    p.add_argument("--verify-cost", type=Path, default=None,
                   help="a benchmarks/verify_cost.py JSON: stored in the results (aggregates.per_length_costs), so "
                        "that the report also prices every round by its length (as `python -m benchmarks.report "
                        "FILE --verify-cost` does afterwards)")
    return p


def resolve_profile(args: argparse.Namespace) -> Profile:
    """The profile with the command line's overrides applied."""
    profile = PROFILES[args.profile]
    overrides = {
        "per_category": args.prompts_per_category,
        "skip_per_category": args.skip_per_category,
        "selection": args.selection,
        "max_new_tokens": args.max_new_tokens,
        "gsm8k": args.gsm8k,
        "gsm8k_selection": args.gsm8k_selection,
        "gsm8k_max_new_tokens": args.gsm8k_max_new_tokens,
        "profile_breakdown": args.profile_breakdown,
    }
    profile = replace(profile, **{k: v for k, v in overrides.items() if v is not None})
    if args.max_prompt_chars is not None:
        profile = replace(profile, max_prompt_chars=args.max_prompt_chars or None)
    return profile


# ---------------------------------------------------------------------------------------------------------------------
# Steps
# ---------------------------------------------------------------------------------------------------------------------


def select_prompts(args: argparse.Namespace, profile: Profile) -> tuple[list[data.Prompt], str]:
    """Spec-Bench (or `--prompts`) selected per profile, then GSM8K; and a one-line summary of the selection."""
    source = args.prompts if args.prompts is not None else args.data_dir / data.SPECBENCH_FILE
    pool = data.load_question_prompts(source, profile.max_new_tokens)
    if args.categories is not None:
        pool = data.keep_categories(pool, args.categories.split(","))
    if args.same_prompts_as is not None:
        chosen = same_prompts_as(pool, args)
        dropped = []
    else:
        pool, dropped = data.drop_long(pool, profile.max_prompt_chars)
        chosen = data.select_balanced(pool, profile.per_category, profile.selection, profile.skip_per_category)
    selected = chosen
    if args.limit is not None:
        chosen = chosen[: args.limit]
    if args.gsm8k_problems is not None:
        gsm8k = data.load_gsm8k_slice(args.data_dir / data.GSM8K_FILE, *args.gsm8k_problems, profile.gsm8k_max_new_tokens)
        profile = replace(profile, gsm8k=len(gsm8k), gsm8k_selection=f"problems {args.gsm8k_problems[0]}:"
                          f"{args.gsm8k_problems[1]}")
    else:
        gsm8k = data.load_gsm8k(args.data_dir / data.GSM8K_FILE, profile.gsm8k, profile.gsm8k_max_new_tokens,
                                profile.gsm8k_selection)
    categories = data.categories_in_order(chosen)
    per = "all" if profile.per_category is None else profile.per_category
    if profile.skip_per_category:
        per = f"{per} per category held out, after the {profile.skip_per_category} that a smaller selection takes,"
    else:
        per = f"{per} per category,"
    cap = f", prompts <= {profile.max_prompt_chars} characters" if profile.max_prompt_chars else ""
    how = f"{per} `{profile.selection}` selection{cap}"
    if args.same_prompts_as is not None:
        how = f"the prompts of {args.same_prompts_as.name}"
    if args.limit is not None and args.limit < len(selected):
        how += f", the first {args.limit} of {len(selected)} (--limit)"
    summary = (
        f"{len(chosen)} from {source.name} ({how}; "
        f"{len(categories)} categories{' (--categories ' + args.categories + ')' if args.categories else ''}, "
        f"max_new_tokens={profile.max_new_tokens}) + {len(gsm8k)} GSM8K "
        f"(`{profile.gsm8k_selection}` selection, max_new_tokens={profile.gsm8k_max_new_tokens})"
    )
    if dropped:
        summary += f"; categories with no prompt under the length cap, left out: {', '.join(dropped)}"
    return chosen + gsm8k, summary


def same_prompts_as(pool: list[data.Prompt], args: argparse.Namespace) -> list[data.Prompt]:
    """The prompts of `pool` that the run of `args.same_prompts_as` measured, every one of them, interleaved round-robin
    by category as a per-category selection is (so a policy that learns sees the categories alternate)."""
    conflicting = [f"--{name.replace('_', '-')} {value}" for name, value in
                   (("prompts_per_category", args.prompts_per_category), ("skip_per_category", args.skip_per_category),
                    ("selection", args.selection), ("max_prompt_chars", args.max_prompt_chars))
                   if value is not None]
    if conflicting:
        raise ValueError(f"--same-prompts-as {args.same_prompts_as} with {' and '.join(conflicting)}: expected one "
                         "way to choose prompts (these options would be recorded but not applied). Fix: drop them, or "
                         "--same-prompts-as.")
    saved = json.loads(args.same_prompts_as.read_text(encoding="utf-8"))
    wanted = set(saved["selection"]["prompt_ids"])
    chosen = [p for p in pool if p.prompt_id in wanted]
    missing = sorted(wanted - {p.prompt_id for p in chosen})
    if missing:
        raise ValueError(f"--same-prompts-as {args.same_prompts_as}: {len(missing)} of its prompts are not in this "
                         f"run's Spec-Bench pool (e.g. {missing[:3]}). Fix: pass the --data-dir of that run, "
                         "and no --categories that leave them out.")
    return data.select_balanced(chosen, None, "first")


def estimate_seconds(prompt_tokens: list[int], max_new_tokens: list[int], num_methods: int, rates: dict) -> float:
    """A-priori wall time of running every method once on each prompt: every method decodes the prompt's full
    budget at plain speed (an upper bound for methods that are faster than plain), after a prefill of the prompt by
    the target and, for the num_methods - 1 speculative methods, by the draft."""
    total = 0.0
    for p, n in zip(prompt_tokens, max_new_tokens):
        plain = p / rates["prefill"] + n / rates["decode"]
        total += plain + (num_methods - 1) * (plain + p / rates["draft_prefill"])
    return total


def warm_up_and_profile(method_list, pair, prompt, inputs, meters, eos_ids, args, breakdown: bool) -> tuple[dict, dict]:
    """Step 5: every method runs once on the first prompt before anything is timed. With `breakdown`, that run is
    under torch.profiler and gives the time breakdown (so profiling costs no extra generation)."""
    # One tiny call first, so that process-wide one-time costs (allocator, kernels) land on no method's profile.
    methods_lib.generate(method_list[0], pair, inputs, 2, args.sample)
    warmups, breakdowns = {}, {}
    for method in tqdm(method_list, desc="warm-up" + (" + profile" if breakdown else ""), unit="method"):
        def run(method=method):
            return methods_lib.timed_run(method, pair, prompt, inputs, meters, eos_ids, args.sample, args.seed,
                                         args.stock_confidence_threshold)
        if not breakdown:
            warmups[method.name] = run()
            continue
        record, totals_us, _ = profiling.profiled(run)
        warmups[method.name] = record
        if method.kind == "semspec":
            breakdowns[method.name] = profiling.breakdown_from_ranges(record["wall_s"], totals_us)
        else:
            breakdowns[method.name] = profiling.breakdown_from_meters(
                record["wall_s"], record["target_forward_s"], record["draft_forward_s"])
    return warmups, breakdowns


def timed_loop(method_list, pair, prompts, encoded, meters, eos_ids, args, checkpoint: Checkpoint,
               saved: dict[str, dict], commit: str | None) -> list[dict]:
    """Step 6: for each prompt, every method once, in a rotating order; each finished prompt is saved to `checkpoint`,
    and those in `saved` (finished by an earlier process) are taken from it instead of run. A failure raises (no prompt
    is skipped)."""
    records = []
    bar = tqdm(total=len(prompts) * len(method_list), desc="generations", unit="gen")
    for index, prompt in enumerate(prompts):
        if prompt.prompt_id in saved:
            records += saved[prompt.prompt_id]["records"]
            bar.update(len(method_list))
            continue
        start = time.perf_counter()
        prompt_records = []
        # Greedy runs are seeded too: dropmatch draws its dropout masks in greedy decoding as well.
        seed = args.seed + index
        for order, method in enumerate(methods_lib.rotated(method_list, index)):
            bar.set_postfix_str(f"{prompt.category} / {method.name}")
            record = methods_lib.timed_run(method, pair, prompt, encoded[prompt.prompt_id], meters, eos_ids,
                                           args.sample, seed, args.stock_confidence_threshold)
            record["order"] = order
            if prompt.gold is not None:
                predicted = metrics.parse_final_number(record["text"])
                record["gsm8k"] = {"gold": prompt.gold, "predicted": predicted, "correct": predicted == prompt.gold}
            prompt_records.append(record)
            bar.update(1)
        checkpoint.save(prompt.prompt_id, prompt_records, time.perf_counter() - start, commit)
        records += prompt_records
    bar.close()
    return records


class Checkpoint:
    """The timed loop's records, saved prompt by prompt to `<output-dir>/<name>.json.partial`, so that a run stopped
    before its end (a long run on a shared machine, a session's end) loses at most the prompt it was on. `--resume`
    runs only the prompts the file lacks; the finished run deletes it.

    The file holds what the run measures (its options and prompts, `key`): resuming with others is refused, since the
    saved records would not be comparable with the new ones. Each saved prompt keeps every method's record, the seconds
    its generations took and the commit that ran them. The file is replaced whole on each save (write, then rename):
    a kill mid-save leaves the previous version.
    """

    # They do not change what a timed record measures: where files are (another checkout resumes too; the prompts are
    # compared by id), and the warm-up's options.
    IGNORED_OPTIONS = ("resume", "output_dir", "data_dir", "cache_dir", "warmup_max_new_tokens", "profile_breakdown")

    def __init__(self, path: Path, args: argparse.Namespace, prompt_ids: list[str]):
        self.path = path
        self.key = self._compared({"options": vars(args), "prompt_ids": prompt_ids})
        self.prompts: dict[str, dict] = {}

    @classmethod
    def _compared(cls, key: dict) -> dict:
        """`key` as JSON holds it, without the options that do not count (on both sides: a file saved before an option
        joined IGNORED_OPTIONS still resumes)."""
        options = {k: v for k, v in key["options"].items() if k not in cls.IGNORED_OPTIONS}
        return json.loads(json.dumps({"options": options, "prompt_ids": key["prompt_ids"]}, default=str))

    def open(self, resume: bool) -> dict[str, dict]:
        """The prompts saved by an earlier process ({prompt_id: {"records", "seconds", "commit"}}), with `resume`;
        without it, refuses to start over a saved run (it would be overwritten)."""
        if not resume:
            if self.path.exists():
                raise ValueError(f"{self.path} holds the prompts an earlier run of this name finished before it "
                                 "stopped. Fix: add --resume to continue it, or delete the file (or pass another "
                                 "--name) to start over.")
            return {}
        if not self.path.exists():
            raise ValueError(f"--resume: there is no {self.path} to continue (a finished run deletes it; its results "
                             "are the .json beside it). Fix: drop --resume to start the run.")
        saved = json.loads(self.path.read_text(encoding="utf-8"))
        saved_key = self._compared(saved["key"])
        if saved_key != self.key:
            differ = sorted(k for k in set(saved_key["options"]) | set(self.key["options"])
                            if saved_key["options"].get(k) != self.key["options"].get(k))
            if saved_key["prompt_ids"] != self.key["prompt_ids"]:
                differ.append("the prompts selected")
            raise ValueError(f"--resume: {self.path} was saved by a run with other settings ({', '.join(differ)}); "
                             "its records would not compare with this run's. Fix: resume with the command line that "
                             "started it, or delete the file to start over.")
        self.prompts = saved["prompts"]
        return dict(self.prompts)

    def save(self, prompt_id: str, records: list[dict], seconds: float, commit: str | None) -> None:
        self.prompts[prompt_id] = {"records": records, "seconds": seconds, "commit": commit}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        staging = self.path.with_name(self.path.name + ".tmp")
        markdown.write_json(staging, {"key": self.key, "prompts": self.prompts})
        staging.replace(self.path)


def output_stem(args: argparse.Namespace) -> str:
    if args.name:
        return args.name
    return args.profile if args.pair == "qwen" else f"{args.profile}-{args.pair}"


# ---------------------------------------------------------------------------------------------------------------------
# Main flow
# ---------------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None, load_pair: Callable[..., models.ModelPair] = models.load_pair) -> dict:
    """Runs the benchmark and writes its outputs; returns the results dict. `load_pair(pair, cache_dir=...,
    target_dtype=..., draft_dtype=...)` is injectable (tests pass tiny models)."""
    run_start = time.perf_counter()
    args = build_parser().parse_args(argv)
    profile = resolve_profile(args)
    torch.set_num_threads(args.threads)
    machine = report.machine_info()

    # 1. Prompts and method options first (cheap, and a bad value fails before minutes of model loading).
    draft_lengths = methods_lib.parse_draft_lengths(args.draft_lengths)
    rules = methods_lib.split_entries(args.rules) if args.rules else None
    methods_lib.check_method_options(rules, args.acceptance_kwargs, draft_lengths, args.num_assistant_tokens)
    draftings = args.drafting or (methods_lib.MODEL,)
    methods_lib.check_drafting_options(draftings, args.prompt_lookup, draft_lengths)
    per_length_costs = metrics.per_length_costs(args.verify_cost) if args.verify_cost is not None else None
    for option in ("temperature", "top_p"):
        if getattr(args, option) is not None and not args.sample:
            raise ValueError(f"--{option.replace('_', '-')} {getattr(args, option)} without --sample: greedy decoding "
                             "ignores it. Fix: add --sample, or drop the option.")
    if args.warmup_max_new_tokens is not None and profile.profile_breakdown:
        raise ValueError(f"--warmup-max-new-tokens {args.warmup_max_new_tokens} with the time breakdown on (the "
                         f"{args.profile} profile's default): the breakdown profiles the warm-up, and would describe a "
                         "shorter generation than the timed ones. Fix: add --no-profile-breakdown, or drop the option.")
    prompts, selection_summary = select_prompts(args, profile)
    if not prompts:
        raise ValueError("no prompts selected: check --limit / --gsm8k / the prompts file")
    print(f"Prompts: {selection_summary}", flush=True)
    checkpoint = Checkpoint(args.output_dir / f"{output_stem(args)}.json.partial", args, [p.prompt_id for p in prompts])
    saved = checkpoint.open(args.resume)
    if saved:
        print(f"Resuming: {len(saved)} of {len(prompts)} prompts were finished by an earlier process "
              f"({checkpoint.path.name}); running the other {len(prompts) - len(saved)}.", flush=True)

    # 2. Models.
    load_start = time.perf_counter()
    pair = load_pair(args.pair, cache_dir=args.cache_dir, target_dtype=args.target_dtype, draft_dtype=args.draft_dtype)
    if pair.target is pair.draft:
        raise ValueError("target and draft must be two model instances (forwards are counted per instance)")
    if args.pruned_drafter is not None:
        pair.pruned_draft = PrunedVocabDrafter.from_pretrained(
            args.pruned_drafter, dtype=models.DTYPES[args.draft_dtype], load_tokenizer=False)
        pair.info["pruned_drafter"] = {"path": str(args.pruned_drafter), "keep_size": pair.pruned_draft.num_kept,
                                       "vocab_size": pair.pruned_draft.vocab_size}
    for option in ("temperature", "top_p"):  # every method reads the target's generation config
        if getattr(args, option) is not None:
            setattr(pair.target.generation_config, option, getattr(args, option))
            # every call passes do_sample=True; set here too, or transformers warns that the option "may be ignored"
            pair.target.generation_config.do_sample = True
    load_s = time.perf_counter() - load_start
    print(f"Loaded target {pair.target_name} and draft {pair.draft_name} in {load_s:.0f} s", flush=True)

    # 3. Methods: plain, stock assisted, and every rule registered now that can run with this draft.
    method_list, skipped = methods_lib.build_methods(
        rules, args.acceptance_kwargs, args.num_assistant_tokens, args.sample, pair.draft,
        draft_lengths, pair.pruned_draft, include_stock=not args.skip_stock, policy_state=args.policy_state,
        include_plain=not args.skip_plain, draftings=draftings, prompt_lookup=args.prompt_lookup)
    for rule, reason in skipped.items():
        print(f"Skipping rule {rule!r}: {reason}", flush=True)  # `rdk+lookup`: that rule's prompt-lookup method
    print("Methods: " + ", ".join(f"{m.name}" + (f" (γ={m.gamma})" if m.gamma else "") for m in method_list),
          flush=True)

    hf_semspec.attach(pair.target)
    eos_ids = metrics.eos_ids_of(pair.target)
    # Everything alive now (models, libraries) is moved out of the collector's sight: the `gc.collect()` before each
    # timed call then scans only what generation creates (0.5 s per call here otherwise).
    gc.collect()
    gc.freeze()
    try:
        with (
            metrics.ForwardMeter(pair.target) as target_meter,
            metrics.ForwardMeter(pair.draft) as draft_meter,
            metrics.ForwardMeter(pair.pruned_draft) if pair.pruned_draft is not None else nullcontext() as pruned_meter,
        ):
            meters = methods_lib.Meters(target_meter, draft_meter, pruned_meter)

            # 4. Encode every prompt once, and estimate the time before starting.
            encoded = {p.prompt_id: pair.encode(p.text) for p in prompts}
            prompt_tokens = [encoded[p.prompt_id]["input_ids"].shape[1] for p in prompts]
            budgets = [p.max_new_tokens for p in prompts]
            assumed = ASSUMED_RATES.get(args.pair, ASSUMED_RATES["qwen"])
            rates = {**assumed, "draft_prefill": assumed["draft_prefill"][args.draft_dtype]}
            # the timed loop plus the warm-up, which runs every method on the first prompt
            warmup_budget = min(budgets[0], args.warmup_max_new_tokens or budgets[0])
            warmup_estimate = estimate_seconds(prompt_tokens[:1], [warmup_budget], len(method_list), rates)
            to_run = [i for i, p in enumerate(prompts) if p.prompt_id not in saved]  # all but a resumed run's saved
            run_tokens, run_budgets = [prompt_tokens[i] for i in to_run], [budgets[i] for i in to_run]
            estimate = estimate_seconds(run_tokens, run_budgets, len(method_list), rates) + warmup_estimate
            print(f"Plan: {len(to_run)} prompts x {len(method_list)} methods = {len(to_run) * len(method_list)} "
                  f"timed generations ({sum(run_tokens)} prompt tokens, up to {sum(run_budgets)} new tokens per "
                  f"method). Estimate: <= {estimate / 60:.1f} min (assuming {rates['decode']} tok/s plain decoding, "
                  f"prefill at {rates['prefill']} tok/s (target) and {rates['draft_prefill']} tok/s "
                  f"({args.draft_dtype} draft), no speed-up).", flush=True)

            # 5. Warm-up (and the time breakdown) on the first prompt.
            first = prompts[0]
            if args.warmup_max_new_tokens is not None:
                first = replace(first, max_new_tokens=min(first.max_new_tokens, args.warmup_max_new_tokens))
            warmups, breakdowns = warm_up_and_profile(
                method_list, pair, first, encoded[first.prompt_id], meters, eos_ids, args, profile.profile_breakdown)
            # The policies that learn start the timed loop untrained, as replay.py starts them: the warm-up ran the
            # first prompt once more, unrecorded (with its profiler's slower rounds).
            for method in method_list:
                method.start_afresh()
            hf_semspec.forget_draft_length_state()
            # How fast is the machine right now compared with the assumed rates? Scale the a-priori estimate of the
            # timed loop by the warm-up's measured / estimated wall time (a shared machine varies a lot).
            speed_factor = sum(w["wall_s"] for w in warmups.values()) / warmup_estimate
            refined = (estimate - warmup_estimate) * speed_factor
            print(f"The warm-up took {speed_factor:.2f}x its estimate: the timed loop should take <= "
                  f"{refined / 60:.1f} min.", flush=True)

            # 6. The timed loop.
            loop_start = time.perf_counter()
            records = timed_loop(method_list, pair, prompts, encoded, meters, eos_ids, args, checkpoint, saved,
                                 machine["git"]["commit"])
            # the earlier processes' generations count too
            loop_s = time.perf_counter() - loop_start + sum(p["seconds"] for p in saved.values())
    finally:
        gc.unfreeze()
        hf_semspec.detach(pair.target)

    # 7. Per-prompt ratios and aggregates.
    names = [m.name for m in method_list]
    metrics.add_per_prompt_ratios(records)
    aggregates = metrics.aggregate(records, names)
    aggregates["cost_model"] = metrics.fit_round_costs(records)
    if per_length_costs is not None:
        aggregates["per_length_costs"] = per_length_costs

    # 8. Outputs.
    results = {
        "config": {**vars(args), "profile_settings": asdict(profile), "assumed_rates": rates},
        "machine": machine,
        "load_average_end": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "models": {"target": pair.target_name, "draft": pair.draft_name, **pair.info},
        "methods": [m.describe() for m in method_list],
        "skipped_rules": skipped,
        "selection": {"summary": selection_summary, "prompt_ids": [p.prompt_id for p in prompts],
                      "prompt_tokens": dict(zip([p.prompt_id for p in prompts], prompt_tokens))},
        "timing": {"load_s": load_s, "timed_generations_s": loop_s, "estimate_s": estimate,
                   "estimate_from_warmup_s": refined, "warmup_speed_factor": speed_factor,
                   "total_s": time.perf_counter() - run_start,
                   "resumed": {"prompts": len(saved), "commits": sorted({str(p["commit"]) for p in saved.values()})}
                   if saved else None},
        "breakdown": breakdowns,
        "warmup": {name: {k: w[k] for k in ("new_tokens", "wall_s", "tokens_per_s", "tau")}
                   for name, w in warmups.items()},
        "aggregates": aggregates,
        "records": records,
    }
    args.output_dir.mkdir(parents=True, exist_ok=True)
    stem = output_stem(args)
    markdown.write_json(args.output_dir / f"{stem}.json", results)  # first: the measurements outlive a report bug
    text = report.render_markdown(results)
    (args.output_dir / f"{stem}.md").write_text(text, encoding="utf-8")
    plotted = report.write_plot(args.output_dir / f"{stem}.png", results)
    checkpoint.path.unlink(missing_ok=True)  # the results hold every record now
    print("\n" + text)
    written = [f"{stem}.json", f"{stem}.md"] + ([f"{stem}.png"] if plotted else [])
    print(f"Wrote {', '.join(written)} to {args.output_dir} "
          f"(total {results['timing']['total_s'] / 60:.1f} min)", flush=True)
    return results


if __name__ == "__main__":
    main()
