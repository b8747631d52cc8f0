"""Outputs: machine info, the JSON results file, the Markdown tables and the (optional) PNG plot."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import torch
import transformers

import hf_semspec

from . import markdown, metrics, resolution
from . import methods as methods_lib
from .data import REPO_ROOT

# ---------------------------------------------------------------------------------------------------------------------
# Machine and software
# ---------------------------------------------------------------------------------------------------------------------


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (Linux), else `platform.processor()` (other systems have no such file)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def cpu_isa() -> str:
    """The widest vector extension the CPU offers for these models' matmuls, from /proc/cpuinfo's flags: "AMX",
    "AVX-512 BF16", "AVX-512", "AVX2", or the machine's architecture elsewhere. What pays on a CPU differs with it
    (bf16 wide forwards are cheap with AVX-512 BF16 or AMX, costly on AVX2), so every CPU result is tagged with it
    and ratios measured on different ISAs are not merged."""
    cpuinfo = Path("/proc/cpuinfo")
    flags: set[str] = set()
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(encoding="utf-8").splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    for flag, name in (("amx_bf16", "AMX"), ("avx512_bf16", "AVX-512 BF16"), ("avx512f", "AVX-512"),
                       ("avx2", "AVX2")):
        if flag in flags:
            return name
    return platform.machine() or "unknown"


def git_commit() -> dict:
    """HEAD of the repository and whether the work tree has changes (read-only git commands)."""

    def git(*args: str) -> str | None:
        try:
            return subprocess.run(
                ["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, check=True, timeout=30
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    status = git("status", "--porcelain")
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(status) if status is not None else None}


def machine_info() -> dict:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "cpu_model": cpu_model(),
        "cpu_isa": cpu_isa(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_1_5_15": load,
        "environment": {k: os.environ.get(k) for k in ("MKL_CBWR", "OMP_WAIT_POLICY", "OMP_NUM_THREADS")},
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "hf_semspec": hf_semspec.__version__,
        "git": git_commit(),
    }


# ---------------------------------------------------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------------------------------------------------


def _fmt(value, spec: str = ".2f", missing: str = "N/A") -> str:
    return missing if value is None else format(value, spec)


def _load(load) -> str:
    return "N/A" if load is None else "/".join(f"{x:.1f}" for x in load)


def _speedup(summary: dict | None) -> str:
    if summary is None:
        return "N/A"
    return f"{summary['median']:.2f}× / {summary['geomean']:.2f}×"


def _drafted_per_round(gamma: int | None, acceptance: dict | None) -> str:
    """The γ a method was given, and, from hf_semspec's statistics, how many tokens it drafted per round."""
    given = _fmt(gamma, "d", "-")
    if not acceptance or not acceptance.get("num_target_forwards"):
        return given
    return f"{given} ({acceptance['num_drafted'] / acceptance['num_target_forwards']:.1f})"


def render_markdown(results: dict) -> str:
    """The report: the overall table (one row per method), per-category τ and speed-up, acceptance per draft
    position, and the time breakdown."""
    config, machine, agg = results["config"], results["machine"], results["aggregates"]
    methods = [m["name"] for m in results["methods"]]
    # γ as given; prompt lookup alone, given none, drafts up to its k a round
    gamma = {m["name"]: m["gamma"] if m["gamma"] is not None or m.get("drafting") != methods_lib.LOOKUP
             else m["prompt_lookup"]["prompt_lookup_num_tokens"] for m in results["methods"]}
    mode = f"sampling, seed {config['seed']}" if config["sample"] else "greedy"
    lines = [
        f"# hf_semspec benchmark: `{config['profile']}` profile, `{config['pair']}` pair",
        "",
        f"- Target `{results['models']['target']}`, draft `{results['models']['draft']}` "
        f"({results['models'].get('target_dtype', '?')} / {results['models'].get('draft_dtype', '?')}); {mode}.",
        f"- Machine: {machine['cpu_model']}, {machine['cpu_cores']} cores, {machine['torch_threads']} torch threads, "
        + ", ".join(f"{k}={v}" for k, v in machine["environment"].items() if v is not None)
        + f"; load average (1/5/15 min) at start {_load(machine['load_average_1_5_15'])}, "
        f"at end {_load(results.get('load_average_end'))}.",
        f"- Versions: python {machine['python']}, torch {machine['torch']}, transformers {machine['transformers']}, "
        f"hf_semspec {machine['hf_semspec']}, commit {str(machine['git']['commit'])[:12]}"
        f"{' (dirty)' if machine['git']['dirty'] else ''}.",
        f"- Prompts: {results['selection']['summary']}. Methods interleaved per prompt in a rotating order; each "
        "warmed up once before timing.",
        f"- Wall time of the run: {results['timing']['total_s']:.0f} s (timed generations "
        f"{results['timing']['timed_generations_s']:.0f} s).",
    ]
    resumed = results["timing"].get("resumed")
    if resumed:
        lines.append(
            f"- Resumed (`--resume`): {resumed['prompts']} of {len(results['selection']['prompt_ids'])} prompts ran in "
            f"an earlier process (commit {', '.join(c[:12] for c in resumed['commits'])}), every method of a prompt "
            "in the same process; the machine, versions and wall time above are the last process's, the timed "
            "generations all of them.")
    merged = results.get("merged")
    if merged:
        drift = merged["plain_speed_added_over_base"]
        lines.append(
            f"- Merged report (`benchmarks/merge.py`): the lines above describe the base run `{merged['base']}`; "
            f"{', '.join(f'`{m}`' for m in merged['added_methods'])} ran in `{merged['added']}` (commit "
            f"{str(merged['added_commit'])[:12]}). Anchors measured in both, with identical target forwards, drafted "
            f"tokens and outputs on all {merged['anchor_generations']} generations: "
            f"{', '.join(f'`{m}`' for m in merged['anchors'])}. Plain decoded {_fmt(drift)}× as fast in the added run; "
            "speed-ups are against each run's own plain, and the modeled tables price every method at the base run's "
            "costs.")
    pooled = results.get("pooled")
    if pooled:
        own = pooled["added_cost_model"]
        own_costs = (f"{own['seconds_per_target_forward']:.3f} s per target forward and "
                     f"{own['seconds_per_draft_forward']:.3f} s per drafted token" if own else "none")
        renamed = "".join(f"; `{new}` is the base run's `{old}`" for new, old in pooled["base_methods"].items())
        lines.append(
            f"- Pooled report (`benchmarks/merge.py --pool`): the machine, versions and wall time above are the base "
            f"run's, `{pooled['base']}` ({pooled['base_prompts']} prompts); its generations are pooled with those of "
            f"`{pooled['added']}` ({pooled['added_prompts']} other prompts, commit {str(pooled['added_commit'])[:12]})"
            f"{renamed}. Speed-ups are against each run's own plain; the modeled tables price every generation at the "
            f"base run's costs (the added run's own fit: {own_costs}).")
    pruned = results["models"].get("pruned_drafter")
    if pruned:
        lines.append(f"- Rules that need a pruned-vocabulary drafter (`rdk`) ran with `{Path(pruned['path']).name}`: "
                     f"{pruned['keep_size']:,} of {pruned['vocab_size']:,} tokens kept in its LM head.")
    if results["skipped_rules"]:
        for rule, reason in results["skipped_rules"].items():
            lines.append(f"- Skipped rule `{rule}`: {reason}.")
    lines += [
        "",
        "Speed-up = per-prompt ratio of tokens/s, shown as median / geometric mean over prompts. τ = new tokens per "
        "target forward (forwards counted by a hook on the target, identically for every method). Acceptance = "
        "accepted / drafted draft tokens (hf_semspec's statistics; N/A for stock). Identical = fraction of outputs "
        "token-identical to plain's on the same prompt.",
        "",
        "## Overall",
        "",
    ]
    lookup = _lookup_methods(results)
    if lookup:
        lines[-3:-3] = [
            "",
            "Draft fwd/drafted = the draft model's forwards per draft token (hf_semspec's statistics: 1 drafting token "
            "by token, 0 by prompt lookup alone, below 1 where multi-level drafting (`+mla`) confirms n-gram "
            "candidates in fewer forwards). N-gram hits = rounds whose prompt lookup found drafts, per round "
            "(`+lookup`, `+mla` only).",
        ]
    rows = []
    for m in methods:
        s = agg["overall"][m]
        acceptance = s["acceptance"]["acceptance_rate"] if s["acceptance"] else None
        gsm8k = f"{s['gsm8k_accuracy']:.2f} ({s['gsm8k_graded']})" if s["gsm8k_accuracy"] is not None else "N/A"
        rows.append([
            f"`{m}`", _drafted_per_round(gamma[m], s["acceptance"]), str(s["prompts"]), str(s["new_tokens"]), _fmt(s["tokens_per_s"]),
            _speedup(s["speedup_vs_plain"]), _speedup(s["speedup_vs_stock"]), _fmt(s["tau"]),
            _fmt(acceptance), _fmt(s["identical_to_plain"]), gsm8k,
        ] + (_drafting_cells(s.get("drafting"), m in lookup) if lookup else []))
    lines += markdown.table(
        ["method", "γ (drafted/round)", "prompts", "new tokens", "tok/s", "speed-up vs plain", "speed-up vs stock", "τ",
         "acceptance", "identical", "GSM8K acc. (n)"] + (["draft fwd/drafted", "n-gram hits"] if lookup else []),
        rows,
    )
    lines += drafting_section(results)
    lines += _lossless_differences(results)
    lines += _over_anchor_tables(results)
    lines += ["", "## Per category: τ / median speed-up vs plain", ""]
    rows = []
    for category, per_method in agg["per_category"].items():
        row = [category]
        for m in methods:
            s = per_method[m]
            median = s["speedup_vs_plain"]["median"] if s["speedup_vs_plain"] else None
            row.append(f"{s['tau']:.2f} / {_fmt(median)}×" if s["prompts"] else "-")
        rows.append(row)
    lines += markdown.table(["category"] + [f"`{m}`" for m in methods], rows)
    positions = max((len(agg["overall"][m]["acceptance"]["per_position_acceptance"])
                     for m in methods if agg["overall"][m]["acceptance"]), default=0)
    if positions:
        lines += ["", "## Acceptance per draft position", "",
                  "P(draft positions 1..i all accepted | position i was drafted), from hf_semspec's statistics "
                  "(N/A for plain and stock assisted: transformers does not report it).", ""]
        rows = []
        for m in methods:
            acc = agg["overall"][m]["acceptance"]
            if acc is None:
                continue
            values = acc["per_position_acceptance"]
            rows.append([f"`{m}`"] + [_fmt(values[i]) if i < len(values) else "" for i in range(positions)])
        lines += markdown.table(["method"] + [str(i + 1) for i in range(positions)], rows)
    lines += draft_length_section(results)
    if results.get("breakdown"):
        lines += ["", "## Where the time goes (first prompt, each method's warm-up run)", "",
                  "Share of the call's wall time. hf_semspec methods: torch.profiler ranges of the decoding loop; "
                  "plain / stock: forward timers on the two models (stock has no hf_semspec ranges).", ""]
        rows = []
        for m, b in results["breakdown"].items():
            share = b["share"]
            rows.append([f"`{m}`", _fmt(b["wall_s"], ".1f")] + [
                _fmt(None if share[k] is None else 100 * share[k], ".0f", "-") + ("%" if share[k] is not None else "")
                for k in ("draft", "target_forward", "verify", "logits_processors", "rest")
            ] + [b["source"]])
        lines += markdown.table(["method", "wall s", "draft", "target forward", "verify", "logits processors", "rest",
                         "source"], rows)
    return "\n".join(lines) + "\n"


def _lookup_methods(results: dict) -> list[str]:
    """The methods that draft by prompt lookup (`--drafting lookup` or `mla`), in the run's order."""
    return [m["name"] for m in results["methods"] if m.get("drafting") in (methods_lib.LOOKUP, methods_lib.MLA)]


def _drafting_cells(drafting: dict | None, uses_lookup: bool) -> list[str]:
    """The overall table's "draft fwd/drafted" and "n-gram hits" cells of a method: the ratio for every method with
    hf_semspec's statistics, the hit rate (hits / rounds) for those that draft by prompt lookup; "-" otherwise."""
    if drafting is None:
        return ["-", "-"]
    forwards = _fmt(drafting["draft_forwards_per_drafted_token"], ".2f", "-")
    if not uses_lookup:
        return [forwards, "-"]
    rate = _fmt(drafting["ngram_hit_rate"], ".2f", "-")
    hits = f"{rate} ({drafting['num_ngram_hits']}/{drafting['num_row_forwards']})"
    return [forwards, hits]


def drafting_section(results: dict) -> list[str]:
    """With `--drafting lookup` or `mla`: per method that drafts by prompt lookup, its drafting counts and its speed
    against the same rule drafted by the draft model alone and against `semspec:exact`, per prompt in this run
    (geometric mean of the tokens/s ratios, 95% interval). Empty without such methods."""
    lookup = _lookup_methods(results)
    if not lookup:
        return []
    described = {m["name"]: m for m in results["methods"]}
    overall, records = results["aggregates"]["overall"], results.get("records") or []
    names = set(described)

    def model_method(name: str) -> str | None:
        """The same rule's (and policy's) method drafted by the draft model alone: the name without the suffix."""
        drafting = described[name]["drafting"]
        base = name.replace(methods_lib.DRAFTING_SUFFIX[drafting], "", 1)
        return base if base in names and described[base].get("drafting") == methods_lib.MODEL else None

    def versus(name: str, baseline: str | None) -> str:
        if baseline is None or baseline == name:
            return "-"
        summary = metrics.speedup_over(records, name, baseline)
        if summary is None:
            return "N/A"
        interval = summary.get("ci95")
        return f"{summary['geomean']:.2f}×" + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "")

    exact = methods_lib.SEMSPEC_PREFIX + "exact"
    lookup_setting = next(described[n]["prompt_lookup"] for n in lookup)
    lines = ["", "## Drafting by prompt lookup", "",
             f"Prompt lookup: k = {lookup_setting['prompt_lookup_num_tokens']} tokens per round, n-grams up to "
             f"{lookup_setting['max_matching_ngram_size']} tokens. `+lookup`: drafts copied from the context, no "
             "draft model; `+mla`: multi-level drafting, the draft model verifying the n-gram candidates. Speed-ups: "
             "geometric mean over prompts of the per-prompt tokens/s ratio, in this run (methods interleaved per "
             "prompt), with its 95% interval. N-gram drafts = drafts the draft model confirmed from an n-gram "
             "candidate, per draft. Draft-model forwards: counted by the hook on the draft (its prefills included).",
             ""]
    rows = []
    for name in lookup:
        d = overall[name].get("drafting") or {}
        rows.append([f"`{name}`", described[name]["drafting"], _fmt(d.get("draft_forwards_per_drafted_token")),
                     f"{_fmt(d.get('ngram_hit_rate'))} ({d.get('num_ngram_hits', 0)}/{d.get('num_row_forwards', 0)})",
                     _fmt(d.get("ngram_draft_share")), str(d.get("draft_model_forwards", 0)),
                     _fmt(overall[name]["tau"]), versus(name, model_method(name)),
                     versus(name, exact if exact in names else None), _fmt(overall[name]["identical_to_plain"])])
    lines += markdown.table(["method", "drafting", "draft fwd/drafted", "n-gram hits (per round)", "n-gram drafts",
                             "draft-model forwards", "τ", "speed-up vs the rule's draft model",
                             "speed-up vs `semspec:exact`", "identical"], rows)
    return lines


def _lossless_differences(results: dict) -> list[str]:
    """A note under the overall table when greedy decoding with a lossless rule did not always give plain's text:
    which methods, and the script that traces why (near-ties rounded differently, or a broken rule)."""
    if results["config"]["sample"]:
        return []
    lossless = [m["name"] for m in results["methods"] if methods_lib.has_lossless_rule(m)]
    identical = {m: results["aggregates"]["overall"][m]["identical_to_plain"] for m in lossless}
    differing = [f"`{m}` {value:.2f}" for m, value in identical.items() if value is not None and value < 1]
    if not differing:
        return []
    return ["", "Lossless rules whose greedy text was not always plain's (share identical): "
            f"{', '.join(differing)}. `python -m benchmarks.divergence` on this results JSON traces each "
            "fixed-length one: whether the target's two best tokens were near-tied and the verify forward rounded them "
            "otherwise (bf16), or the rule broke."]


def _over_anchor_tables(results: dict) -> list[str]:
    """A merged report's measured speeds across its two runs: each method's tokens/s over an anchor's in the run
    that timed both (`merge.py`'s `measured_over_anchor`; absent from merges made before it)."""
    lines = []
    for anchor, per_method in results.get("merged", {}).get("measured_over_anchor", {}).items():
        lines += ["", f"### Measured over `{anchor}` in the same run", "",
                  f"Geometric mean over prompts of the method's measured tokens/s over `{anchor}`'s on the same prompt, "
                  "in the run that timed the method: the methods of a run are interleaved per prompt, and the anchor "
                  "made the same forwards in both runs, so these compare across the runs where the speed-ups above "
                  "do not. A base that is itself a merge contributes the rows its own merge recorded.", ""]
        rows = [[f"`{m}`", v["run"], _fmt(v["ratio"], ".3f"), str(v["prompts"])] for m, v in per_method.items()]
        lines += markdown.table(["method", "run", f"tokens/s over `{anchor}`", "prompts"], rows)
    return lines


def draft_length_section(results: dict) -> list[str]:
    """With `--draft-lengths`: per rule, overall and per category, the best fixed length (`constant:<n>`) against
    every other policy, as the policy's value and its ratio to the best fixed length's; once with the measured
    speed-up vs plain (geometric mean) and once with the modeled decode throughput of `metrics.fit_round_costs`
    (timing noise removed). Empty without draft-length methods or without `plain`."""
    described = [m for m in results["methods"] if m.get("draft_length")]
    agg = results["aggregates"]
    if not described or "plain" not in agg["overall"]:
        return []

    def speedup(summary: dict) -> float | None:
        return summary["speedup_vs_plain"]["geomean"] if summary["prompts"] and summary["speedup_vs_plain"] else None

    measured = {label: {m["name"]: speedup(per_method[m["name"]]) for m in described}
                for label, per_method in [("overall", agg["overall"])] + list(agg["per_category"].items())}
    # A merged or pooled report holds speed-ups of other runs, each against its own run's plain: dividing one by
    # another would be a speed ratio across runs. There, the measured table gives the values alone.
    across_runs = bool(results.get("merged"))
    caption = (
        "Geometric-mean speed-up vs plain, each against the plain decoding of the run that timed it. The runs merged "
        "here ran at other speeds, so these are not divided by one another: the modeled table below compares every "
        "method at one set of costs, and the measured speeds over an anchor in the same run are in the table of that "
        "name above." if across_runs else
        "Geometric-mean speed-up vs plain; in brackets, the policy's speed-up over the best `constant` length's in "
        "that row (1.00 = as fast as the best fixed length found by the sweep)."
    )
    lines = ["", "## Draft length: best fixed length vs the policies", "", caption, ""]
    lines += _policy_tables(described, measured, "×", ratios=not across_runs)
    records = results.get("records") or []
    # Results written before the cost model existed lack it: fit it from their records.
    costs = agg["cost_model"] if "cost_model" in agg else metrics.fit_round_costs(records)
    per_length = agg.get("per_length_costs")
    if costs is None:
        return lines + (_per_length_tables(described, records, list(measured), per_length) if per_length else [])
    modeled = _modeled_values(described, records, list(measured), costs)
    lines += [
        "### The same comparison without the timing noise (modeled decode time)", "",
        f"A least-squares fit over the run's {costs['generations']} hf_semspec generations gives "
        f"{costs['seconds_per_target_forward']:.3f} s per target forward (F) and "
        f"{costs['seconds_per_draft_forward']:.3f} s per drafted token (D), plus one intercept per prompt for its "
        f"prefills (R² = {costs['r2']:.3f}). A generation's measured time differs from the fit by "
        f"{100 * costs['residual_relative_sd']:.0f}% (SD): that is the noise in the table above. With greedy decoding "
        "F and D are deterministic, so modeled tokens/s = new tokens / (a·F + b·D) compares what the policies did, at "
        "this machine's costs, without it (prefill left out). Geometric mean over the prompts; in brackets, the ratio "
        "to the best `constant` length in the row.", "",
    ]
    lines += _policy_tables(described, modeled, " tok/s")
    if per_length is not None:
        lines += _per_length_tables(described, records, list(measured), per_length)
    lines += resolution.section(described, records, costs)
    return lines


def _modeled_values(described: list[dict], records: list[dict], labels: list[str],
                    costs: dict) -> dict[str, dict[str, float | None]]:
    """label ("overall" or a category) → method → geometric mean over its prompts of modeled tokens/s under `costs`
    (None for a method with no record there)."""
    values: dict[str, dict[str, float | None]] = {}
    for label in labels:
        for m in described:
            mine = [r for r in records if r["method"] == m["name"] and label in ("overall", r["category"])]
            values.setdefault(label, {})[m["name"]] = (
                metrics.geometric_mean([metrics.modeled_tokens_per_s(r, costs) for r in mine]) if mine else None)
    return values


def _per_length_tables(described: list[dict], records: list[dict], labels: list[str], costs: dict) -> list[str]:
    """The modeled comparison again with each round priced by its length (`metrics.modeled_seconds` under the
    per-length `costs` that `--verify-cost` stored): a line in F and D misses that a CPU's verify forward is not
    linear in the tokens it verifies."""
    values = _modeled_values(described, records, labels, costs)
    return [
        "### The same comparison priced by length", "",
        "Each round priced by the verify forward's time measured at its length, v(k): "
        f"{metrics.describe_costs(costs)}. Modeled tokens/s = new tokens / (Σ_k n_k·v(k) + d·D), n_k the "
        "generation's rounds that drafted k. Measured apart from the run; the line above is the run's own.", "",
    ] + _policy_tables(described, values, " tok/s")


def _policy_tables(described: list[dict], values: dict[str, dict[str, float | None]], unit: str,
                   ratios: bool = True) -> list[str]:
    """One table per rule: rows = `values`' groups, the best `constant` method of the row, then every other policy
    as `value (value / best)`; a last line per policy counts the categories where it is within 3% of the best.
    Without `ratios`, the values alone and no count."""
    lines = []
    for rule in dict.fromkeys(m["rule"] for m in described):
        mine = [m for m in described if m["rule"] == rule]
        fixed = resolution.fixed_lengths(mine, rule)
        policies = resolution.adaptive_policies(mine, rule)
        if not fixed:
            continue
        rows, within = [], {name: [] for name in policies}
        for label, per_method in values.items():
            candidates = [(per_method[n], n) for n in fixed if per_method.get(n) is not None]
            if not candidates:
                continue
            best_value, best_name = max(candidates)
            row = [label, f"`{best_name.split('/', 1)[1]}` {best_value:.2f}{unit}"]
            for name in policies:
                value = per_method.get(name)
                row.append("-" if value is None else f"{value:.2f}{unit}"
                           + (f" ({value / best_value:.3f})" if ratios else ""))
                if ratios and value is not None and label != "overall":
                    within[name].append(value >= 0.97 * best_value)
            rows.append(row)
        lines += [f"`{rule}`:", ""]
        lines += markdown.table(["category", "best fixed"] + [f"`{n.split('/', 1)[1]}`" for n in policies], rows) + [""]
        counts = ", ".join(f"`{n.split('/', 1)[1]}` {sum(w)} of {len(w)}" for n, w in within.items() if w)
        if counts:
            lines += [f"Categories where the policy is within 3% of the best fixed length: {counts}.", ""]
    return lines


# ---------------------------------------------------------------------------------------------------------------------
# Plot (matplotlib is optional)
# ---------------------------------------------------------------------------------------------------------------------


def write_plot(path: Path, results: dict) -> bool:
    """Bar charts of the geometric-mean speed-up vs plain and of τ per method. Returns False (after saying how to
    install it) when matplotlib is missing; the JSON and Markdown outputs do not depend on it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: no plot written ({path.name}). Install it with "
              "`python -m pip install matplotlib` to get one; the JSON and Markdown results are complete.")
        return False
    agg = results["aggregates"]["overall"]
    methods = [m["name"] for m in results["methods"]]
    speedups = [agg[m]["speedup_vs_plain"]["geomean"] if agg[m]["speedup_vs_plain"] else 0.0 for m in methods]
    taus = [agg[m]["tau"] for m in methods]
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 1.6 * len(methods)), 4.5))
    for ax, values, title in ((axes[0], speedups, "speed-up vs plain (geomean of per-prompt ratios)"),
                              (axes[1], taus, "τ: new tokens per target forward")):
        bars = ax.bar(range(len(methods)), values, color="tab:blue")
        ax.set_xticks(range(len(methods)), [m.replace("semspec:", "semspec:\n").replace("_", "\n") for m in methods], fontsize=8)
        ax.axhline(1.0, color="gray", linewidth=0.8, linestyle="--")
        ax.set_title(title, fontsize=10)
        ax.bar_label(bars, fmt="%.2f", fontsize=8)
    config = results["config"]
    fig.suptitle(f"hf_semspec {config['profile']} benchmark, {config['pair']} pair "
                 f"({results['machine']['cpu_model']}, {results['machine']['torch_threads']} threads)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> None:
    """`python -m benchmarks.report RESULTS.json`: writes RESULTS.md (and the plot) again from a results file, e.g.
    after the report gained a table; the measurements are not touched (`--verify-cost` adds the per-length costs to
    the file's aggregates)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("results", type=Path, help="a JSON file written by benchmarks/run.py")
    parser.add_argument("--no-plot", action="store_true", help="leave the PNG as it is")
    parser.add_argument("--verify-cost", type=Path, default=None, help="a benchmarks/verify_cost.py JSON: stored in "
                        "the results (aggregates.per_length_costs), so that the report also prices every round by "
                        "its length")
    args = parser.parse_args(argv)
    results = markdown.load_results(args.results, "run", "results")
    if args.verify_cost is not None:
        results["aggregates"]["per_length_costs"] = metrics.per_length_costs(args.verify_cost)
        markdown.write_json(args.results, results)
    args.results.with_suffix(".md").write_text(render_markdown(results), encoding="utf-8")
    if not args.no_plot:
        write_plot(args.results.with_suffix(".png"), results)
    print(f"Wrote {args.results.with_suffix('.md')}")


if __name__ == "__main__":
    main()
