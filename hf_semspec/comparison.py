"""What a relaxed acceptance rule costs on *your* prompts: every rule measured against `exact` in one run.

    import hf_semspec
    report = hf_semspec.compare(target, draft, ["def fibonacci(n):", ...], rules=["fly", "ears@beta=0.2"],
                                tokenizer=tokenizer, max_new_tokens=256, repeats=3)
    print(report.to_markdown())

or from a shell: `python -m hf_semspec compare --target T --draft D --prompts prompts.jsonl --rules exact,fly`.

`exact` (lossless) always runs and is the reference. Per configuration (a rule and its options) the report gives what
the rule buys, tokens/s and the speed-up over `exact`, τ and the acceptance rate, and what it costs: the share of
prompts whose output is `exact`'s, where the outputs part, how much less likely the target finds the text it got
(per-token negative log-likelihood over `exact`'s output), and optionally a score of your own. docs/compare.md says
how each figure is measured and how to read it.
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib
import inspect
import json
import math
import numbers
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .errors import SemSpecConfigError, invalid_value
from .jsonl import read_lines, read_records
from .generation import _is_attached, attach, detach
from .ngram import parse_prompt_lookup
from .rules import RULES
from .stats import AcceptanceStats

REFERENCE = "exact"
DEFAULT_RULES = ("exact", "fly", "ears")
VARIANT_SYNTAX = "<rule> or <rule>@<option>=<value>[@<option>=<value>...], e.g. 'fly@window=4@entropy_threshold=0.5'"
# generate() arguments that compare() sets itself, for every call.
RESERVED_GENERATE_KWARGS = ("assistant_model", "acceptance", "acceptance_kwargs", "return_dict_in_generate",
                            "inputs", "input_ids", "attention_mask")


# ---------------------------------------------------------------------------------------------------------------------
# Configurations: a rule and its options, written `rule@option=value@...`
# ---------------------------------------------------------------------------------------------------------------------


# The peer configuration: stock transformers' assisted generation, run through its own `generate()` (no rule), with
# its options as `GenerationConfig` fields: `transformers@assistant_ensemble_weight=0.5` is transformers' own lossy
# rule (static ensemble verification), `transformers` alone its lossless assisted generation.
STOCK = "transformers"
STOCK_OPTIONS = ("assistant_ensemble_weight",)


@dataclass(frozen=True)
class Configuration:
    """One compared configuration: the rule `rule` with `options` (its `acceptance_kwargs`), validated; or `STOCK`,
    stock transformers with `options` among `STOCK_OPTIONS`."""

    rule: str
    options: dict = field(default_factory=dict)

    @property
    def is_stock(self) -> bool:
        return self.rule == STOCK

    @property
    def lossless(self) -> bool:
        if self.is_stock:
            return self.options.get("assistant_ensemble_weight") is None
        return bool(RULES.get(self.rule).lossless)

    @property
    def name(self) -> str:
        """`rule@option=value@...` (strings bare, other values as JSON): the form `parse_configuration` reads back."""
        options = (f"@{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in self.options.items())
        return self.rule + "".join(options)

    @property
    def key(self) -> str:
        """The options that differ from the rule's defaults: two entries with one key are one configuration."""
        if self.is_stock:
            return self.rule + json.dumps(self.options, sort_keys=True)
        return self.rule + json.dumps(RULES.build(self.rule, self.options).config.to_dict(), sort_keys=True)


def _option_value(text: str) -> Any:
    """`4` → 4, `0.5` → 0.5, `true` → True, `null` → None; anything else stays a string (`normalized_full`)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_configuration(entry: str | tuple[str, dict] | Configuration) -> Configuration:
    """A `rules` entry as a validated `Configuration`: `"fly"`, `"fly@window=4@entropy_threshold=0.5"`, or
    `("fly", {"window": 4})`. A bad rule name or option raises `SemSpecConfigError` naming the entry, the option,
    what is allowed and the fix (the rule's own validation, `RULES.build`)."""
    if isinstance(entry, Configuration):
        name, options = entry.rule, dict(entry.options)
    elif isinstance(entry, str):
        name, *pairs = (part.strip() for part in entry.strip().split("@"))
        options = {}
        for pair in pairs:
            key, equals, value = (part.strip() for part in pair.partition("="))
            if not equals or not key or key in options:
                raise invalid_value("rules", entry, VARIANT_SYNTAX, "write each option once, as @<option>=<value>")
            options[key] = _option_value(value)
    elif isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], str) and isinstance(entry[1], Mapping):
        name, options = entry[0], dict(entry[1])
    else:
        raise invalid_value("rules", entry, VARIANT_SYNTAX + ", or a (rule, options dict) pair",
                            "pass e.g. rules=['exact', 'fly@window=4'] or rules=[('fly', {'window': 4})]")
    if name == STOCK:
        _check_stock_options(entry, options)
        return Configuration(name, options)
    try:
        RULES.build(name, options)
    except SemSpecConfigError as error:
        raise SemSpecConfigError(f"`rules` entry {entry!r}: {error}") from error
    return Configuration(name, options)


def _check_stock_options(entry: Any, options: dict) -> None:
    """The options of a `STOCK` entry: `assistant_ensemble_weight` in (0, 1), nothing else."""
    for key, value in options.items():
        if key not in STOCK_OPTIONS:
            raise invalid_value(f"rules entry {entry!r}: option {key!r}", value,
                                f"one of {list(STOCK_OPTIONS)} for stock transformers ({STOCK!r})",
                                f"write e.g. '{STOCK}@assistant_ensemble_weight=0.5', or '{STOCK}' for its lossless "
                                "assisted generation")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
            raise invalid_value(f"rules entry {entry!r}: option {key!r}", value, "a float in (0, 1)",
                                f"write e.g. '{STOCK}@assistant_ensemble_weight=0.5'")


def parse_rules(entries: Iterable[str | tuple[str, dict] | Configuration]) -> list[Configuration]:
    """The configurations to run, `exact` first (added where `entries` leave it out); a repeated one is an error."""
    if isinstance(entries, str):  # one entry where a list is meant
        raise invalid_value("rules", entries, "a list of entries, " + VARIANT_SYNTAX, f"pass rules=[{entries!r}]")
    entries = list(entries)
    configurations = [Configuration(REFERENCE)]
    seen = {configurations[0].key: REFERENCE}
    for entry in entries:
        configuration = parse_configuration(entry)
        if configuration.key in seen:
            if configuration.name == REFERENCE:
                continue  # `exact` runs anyway
            raise invalid_value("rules", entries, "each configuration once",
                                f"drop {configuration.name!r}: it is {seen[configuration.key]!r} again")
        seen[configuration.key] = configuration.name
        configurations.append(configuration)
    return configurations


# ---------------------------------------------------------------------------------------------------------------------
# What is measured
# ---------------------------------------------------------------------------------------------------------------------


def new_token_ids(sequences: torch.Tensor, prompt_length: int, eos_token_ids: Iterable[int] = ()) -> list[int]:
    """The new tokens of an output: ids after the prompt, up to and including the first EOS (it was generated and it
    cost a forward). The one counter for every configuration (the benchmarks' `new_token_ids`)."""
    ids = sequences[0, prompt_length:].tolist()
    eos = set(eos_token_ids)
    for i, token in enumerate(ids):
        if token in eos:
            return ids[: i + 1]
    return ids


def first_divergence(ids: Sequence[int], reference: Sequence[int]) -> int | None:
    """The 0-based index of the first new token where `ids` and `reference` differ (where one is a prefix of the
    other, the shorter one's length); None when they are identical."""
    for i, (a, b) in enumerate(zip(ids, reference)):
        if a != b:
            return i
    return None if len(ids) == len(reference) else min(len(ids), len(reference))


@torch.no_grad()
def target_nll(target: torch.nn.Module, prompt_ids: torch.LongTensor, new_ids: Sequence[int]) -> float | None:
    """Mean over `new_ids` of −ln p(token | prompt, earlier new tokens) under `target`, in nats: one teacher-forced
    forward over prompt + output, the raw distribution (temperature 1, no logits processors). None for no tokens.

    Args:
        target (`PreTrainedModel`): the target model.
        prompt_ids (`torch.LongTensor` of shape `(1, prompt_length)`): the prompt, on the target's device.
        new_ids (`Sequence[int]`): the output's new tokens.
    """
    if not new_ids:
        return None
    new = torch.tensor([list(new_ids)], dtype=torch.long, device=prompt_ids.device)
    ids = torch.cat([prompt_ids, new], dim=1)
    takes_keep = "logits_to_keep" in inspect.signature(target.forward).parameters
    keep = {"logits_to_keep": new.shape[1] + 1} if takes_keep else {}  # the logits of the output's positions only
    logits = target(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, **keep).logits
    predicting = logits[0, -(new.shape[1] + 1) : -1].float()  # position t predicts token t + 1
    return torch.nn.functional.cross_entropy(predicting, new[0]).item()


@functools.lru_cache(maxsize=None)
def t_quantile_975(degrees_of_freedom: int) -> float:
    """t₀.₉₇₅ of Student's t with `degrees_of_freedom` (≥ 1): the half-width, in standard errors, of a two-sided 95%
    interval for a mean of `degrees_of_freedom + 1` values (12.71 for 2 values, 4.30 for 3, 2.26 for 10; 1.96 as
    they grow). The normal 1.96 is too narrow for the few prompts `compare` is made for.

    Solved by bisection on the t distribution's CDF, ∫₀ᵗ f = 0.475, with f the t density and the integral by
    Simpson's rule on 2,000 intervals (good to about 1e-9 here; no SciPy needed)."""
    if not isinstance(degrees_of_freedom, int) or degrees_of_freedom < 1:
        raise ValueError(f"degrees_of_freedom = {degrees_of_freedom!r}: an int ≥ 1")
    nu = float(degrees_of_freedom)
    log_norm = math.lgamma((nu + 1) / 2) - math.lgamma(nu / 2) - 0.5 * math.log(nu * math.pi)

    def density(t: float) -> float:
        return math.exp(log_norm - (nu + 1) / 2 * math.log1p(t * t / nu))

    def mass(upper: float, steps: int = 2000) -> float:  # ∫₀^upper f, Simpson's rule
        h = upper / steps
        inner = sum((4 if i % 2 else 2) * density(i * h) for i in range(1, steps))
        return h / 3 * (density(0.0) + inner + density(upper))

    low, high = 1.9, 13.0  # t₀.₉₇₅ lies between the normal 1.96 and 12.71 (one degree of freedom)
    for _ in range(50):
        middle = (low + high) / 2
        if mass(middle) < 0.475:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def mean_interval(values: Sequence[float]) -> tuple[float | None, list[float] | None]:
    """The mean and its 95% interval from Student's t, mean ± t₀.₉₇₅(n − 1)·sd/√n (`t_quantile_975`: right for the
    few prompts of a comparison, where the normal 1.96 is too narrow): no interval under two values; (None, None)
    for none."""
    if not values:
        return None, None
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    half = t_quantile_975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, [mean - half, mean + half]


def geometric_mean_interval(ratios: Sequence[float]) -> tuple[float | None, list[float] | None]:
    """The geometric mean of positive ratios and its 95% interval, exp(mean ± t₀.₉₇₅(n − 1)·sd/√n) of the log ratios
    (a 2× and a 0.5× average to 1×); no interval under two ratios."""
    mean, interval = mean_interval([math.log(r) for r in ratios])
    if mean is None:
        return None, None
    return math.exp(mean), None if interval is None else [math.exp(interval[0]), math.exp(interval[1])]


# ---------------------------------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class PromptResult:
    """One configuration on one prompt. The output (`new_token_ids`, `text`, τ) is the first repeat's; the timing
    (`seconds`, `tokens_per_s`) the fastest repeat's. `speedup`, `identical`, `first_divergence`, `nll_increase` are
    against `exact`'s on the same prompt."""

    prompt_index: int
    prompt_tokens: int
    new_token_ids: list[int]
    text: str | None
    new_tokens: int
    seconds: float
    tokens_per_s: float
    speedup: float | None
    identical: bool
    first_divergence: int | None
    nll: float | None
    nll_increase: float | None
    score: float | None
    tau: float
    acceptance_rate: float


@dataclass
class ConfigurationResult:
    """One configuration over every prompt: a row of the report (docs/compare.md says more).

    Attributes:
        name (`str`): the configuration as `rules` takes it, e.g. `"fly@window=4"`; `rule`, `options` its parts.
        lossless (`bool`): whether the rule keeps the target's output distribution (`exact`, `rdk`).
        prompts, new_tokens (`int`), seconds (`float`): the prompts, their new tokens (the first repeats', the
            outputs reported) and their fastest repeats' time.
        tokens_per_s (`float`): the fastest repeats' new tokens over `seconds` (`new_tokens / seconds`, unless
            sampling without a seed made repeats of a prompt differ in length).
        speedup, speedup_ci95 (`float`, `[low, high]`): the geometric mean over prompts of tokens/s over `exact`'s on
            the same prompt, and its 95% interval (None with one prompt).
        tau, acceptance_rate (`float`): new tokens per target forward; accepted / drafted draft tokens (pooled).
        draft_forwards_per_drafted_token (`float`): the draft model's forwards per draft token (pooled): 1 drafting
            token by token, 0 by prompt lookup alone (`draft=None`), below 1 where multi-level drafting (a draft and
            `prompt_lookup_num_tokens`) confirms n-gram candidates in fewer forwards.
        ngram_hit_rate (`float`): with `prompt_lookup_num_tokens` (pooled; None without it): by prompt lookup alone,
            the rounds whose lookup found drafts per round; with a draft (multi-level drafting), the drafts that were
            n-gram candidates the draft confirmed per drafted token.
        identical_share (`float`): the share of prompts whose new tokens are `exact`'s.
        mean_first_divergence (`float`): over the prompts that differ, the mean index of the first differing token.
        nll (`float`): the mean over prompts of the target's per-token negative log-likelihood of the output (nats).
        nll_increase, nll_increase_ci95 (`float`, `[low, high]`): the mean over prompts of `nll` minus `exact`'s on
            the same prompt, and its 95% interval.
        score_mean (`float`), score_wins, score_losses, score_ties (`int`): the scorer's mean, and the prompts where
            the output scored above, below or equal to `exact`'s (None without a scorer).
        per_prompt (`list[PromptResult]`): each prompt's figures and output.
    """

    name: str
    rule: str
    options: dict
    lossless: bool
    prompts: int
    new_tokens: int
    seconds: float
    tokens_per_s: float
    speedup: float | None
    speedup_ci95: list[float] | None
    tau: float
    acceptance_rate: float
    draft_forwards_per_drafted_token: float
    ngram_hit_rate: float | None
    identical_share: float
    mean_first_divergence: float | None
    nll: float | None
    nll_increase: float | None
    nll_increase_ci95: list[float] | None
    score_mean: float | None
    score_wins: int | None
    score_losses: int | None
    score_ties: int | None
    per_prompt: list[PromptResult]


@dataclass
class ComparisonReport:
    """What `compare()` returns: a `ConfigurationResult` per configuration, `exact` first (`report["fly"]`: a row)."""

    configurations: list[ConfigurationResult]
    num_prompts: int
    repeats: int
    seed: int | None
    generate_kwargs: dict
    decoding: dict = field(default_factory=dict)
    reference: str = REFERENCE
    timing: str = "fastest of the repeats, per prompt"

    def __getitem__(self, name: str) -> ConfigurationResult:
        for row in self.configurations:
            if row.name == name:
                return row
        raise KeyError(f"no configuration {name!r} in the report: it has {[r.name for r in self.configurations]}")

    def to_dict(self) -> dict:
        """Every field, JSON-ready (`json.dumps(report.to_dict())`)."""
        return asdict(self)

    def to_markdown(self) -> str:
        """A table with one row per configuration, every figure of the report, and a short legend."""
        scored = any(row.score_mean is not None for row in self.configurations)
        lookup = any(row.ngram_hit_rate is not None for row in self.configurations)
        header = ["configuration", "lossless", "tokens/s", "speed-up [95% CI]", "τ", "acceptance", "identical",
                  "first divergence", "NLL increase [95% CI]"] + (["score", "wins / losses / ties"] if scored else [])
        header += ["draft fwd/drafted", "n-gram hits"] if lookup else []
        lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
        for row in self.configurations:
            cells = [f"`{row.name}`", "yes" if row.lossless else "no", _number(row.tokens_per_s, 1),
                     _number(row.speedup, 3, "×") + _interval(row.speedup_ci95, 3), _number(row.tau, 2),
                     _number(row.acceptance_rate, 3), f"{row.identical_share:.0%}",
                     _number(row.mean_first_divergence, 1),
                     _number(row.nll_increase, 4, signed=True) + _interval(row.nll_increase_ci95, 4)]
            if scored:
                cells += [_number(row.score_mean, 3),
                          f"{row.score_wins} / {row.score_losses} / {row.score_ties}"]
            if lookup:
                cells += [_number(row.draft_forwards_per_drafted_token, 2), _number(row.ngram_hit_rate, 2)]
            lines.append("| " + " | ".join(cells) + " |")
        settings = ", ".join(f"{k}={v!r}" for k, v in self.generate_kwargs.items()) or "the models' defaults"
        resolved = ", ".join(f"{k}={v!r}" for k, v in self.decoding.items())
        legend = [
            f"{self.num_prompts} prompts × {self.repeats} repeats, seed {self.seed}; generate(): {settings}"
            + (f" (decoding, with the model's generation config: {resolved})" if resolved else "") + ".",
            "",
            "- tokens/s: new tokens (after the prompt, up to and including the first EOS) per second of `generate()`,"
            " all prompts pooled; each prompt timed by its fastest repeat.",
            "- speed-up: tokens/s over `exact`'s on the same prompt, geometric mean over prompts, 95% interval"
            " exp(mean ± t·sd/√n) of the log ratios, t the 97.5% quantile of Student's t with n − 1 degrees of"
            " freedom (— with one prompt).",
            "- τ: new tokens per target forward; acceptance: accepted / drafted draft tokens (all prompts pooled).",
            "- identical: share of prompts whose new tokens are `exact`'s; first divergence: mean index of the first"
            " new token that differs, over the prompts that differ.",
            "- NLL increase: per-token negative log-likelihood (nats) under the target's raw distribution"
            " (temperature 1, no processors) of the output minus that of `exact`'s output on the same prompt,"
            " mean over prompts ± t·sd/√n (Student's t, as above); above 0: the target finds the text it got less"
            " likely.",
        ]
        if scored:
            legend.append("- score: mean of your scorer; wins / losses / ties: prompts where the output scored above,"
                          " below or equal to `exact`'s.")
        if lookup:
            legend.append("- draft fwd/drafted: the draft model's forwards per draft token (0 by prompt lookup alone,"
                          " below 1 where multi-level drafting confirms n-gram candidates); n-gram hits: by prompt"
                          " lookup alone, rounds whose lookup found drafts, per round; with a draft, drafts that were"
                          " confirmed n-gram candidates, per drafted token (all prompts pooled).")
        return "\n".join(lines + [""] + legend) + "\n"


def _number(value: float | None, digits: int, unit: str = "", signed: bool = False) -> str:
    if value is None:
        return "—"
    return f"{value:{'+' if signed else ''}.{digits}f}{unit}"


def _interval(interval: list[float] | None, digits: int) -> str:
    return "" if interval is None else f" [{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]"


# ---------------------------------------------------------------------------------------------------------------------
# Running it
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class _Run:
    """One `generate()` call: its new tokens, its wall time and its acceptance statistics."""

    ids: list[int]
    seconds: float
    stats: Any

    @property
    def tokens_per_s(self) -> float:
        return len(self.ids) / self.seconds if self.seconds > 0 else 0.0


class _StockCall:
    """Runs the `STOCK` configuration: stock transformers' assisted generation (`acceptance=None`), its options as
    `generate()` keywords, drafting what hf_semspec's rounds draft: γ = the call's `num_assistant_tokens` (else
    `exact`'s default, 5), fixed (`num_assistant_tokens_schedule="constant"`), and without transformers' confidence
    stop (`assistant_confidence_threshold` 0: its default 0.4 ends rounds early, which would change what is compared).
    Stock reads these from the draft's generation config: they are set there for each call and put back after it.
    Stock returns no statistics: τ is counted from the target's forwards (a hook: one per round, the prefill's
    included, as hf_semspec counts them), accepted drafts as new tokens less forwards, drafted as the draft's forwards.
    """

    SEMSPEC_ONLY = ("draft_length", "draft_length_kwargs", "prompt_lookup_num_tokens", "max_matching_ngram_size")

    def __init__(self, target, draft, call_kwargs: dict):
        if draft is None:
            raise invalid_value("draft", None, f"a draft model with a '{STOCK}' configuration (stock assisted "
                                "generation drafts with one)", f"pass the draft model, or drop '{STOCK}' from rules")
        for name in self.SEMSPEC_ONLY:
            if call_kwargs.get(name) is not None:
                raise invalid_value(name, call_kwargs[name], f"unset with a '{STOCK}' configuration (what stock "
                                    "assisted generation drafts must match hf_semspec's plain drafting)",
                                    f"drop {name}, or drop '{STOCK}' from rules")
        self.target, self.draft = target, draft
        self.kwargs = {k: v for k, v in call_kwargs.items() if k != "num_assistant_tokens"}
        gamma = call_kwargs.get("num_assistant_tokens")
        self.draft_settings = {
            "num_assistant_tokens": gamma if gamma is not None else RULES.get(REFERENCE).default_num_draft_tokens,
            "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": 0.0,
        }

    def run(self, input_ids: torch.LongTensor, options: dict, eos_ids: list[int]) -> _Run:
        config = self.draft.generation_config
        saved = {name: getattr(config, name, None) for name in self.draft_settings}
        counts = {"target": 0, "draft": 0}
        hooks = [model.register_forward_pre_hook(lambda *_, role=role: counts.__setitem__(role, counts[role] + 1))
                 for role, model in (("target", self.target), ("draft", self.draft))]
        try:
            for name, value in self.draft_settings.items():
                setattr(config, name, value)
            _synchronize(self.target.device)
            start = time.perf_counter()
            out = self.target.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                       assistant_model=self.draft, acceptance=None, **options, **self.kwargs)
            _synchronize(self.target.device)
            seconds = time.perf_counter() - start
        finally:
            for hook in hooks:
                hook.remove()
            for name, value in saved.items():
                setattr(config, name, value)
        sequences = out if isinstance(out, torch.Tensor) else out.sequences
        ids = new_token_ids(sequences, input_ids.shape[1], eos_ids)
        forwards = counts["target"]
        stats = AcceptanceStats(
            num_target_forwards=forwards, num_new_tokens=len(ids), num_accepted=max(0, len(ids) - forwards),
            num_drafted=counts["draft"], num_draft_forwards=counts["draft"], acceptance=STOCK,
            acceptance_kwargs=dict(options),
        )
        return _Run(ids, seconds, stats)


class _Progress:
    """tqdm's bar where tqdm imports (transformers depends on it), else a line per prompt on stderr; nothing when
    `enabled` is False."""

    def __init__(self, total_calls: int, num_prompts: int, enabled: bool):
        self.bar, self.lines, self.num_prompts = None, False, num_prompts
        if not enabled:
            return
        try:
            from tqdm.auto import tqdm
        except ImportError:
            self.lines = True
        else:
            self.bar = tqdm(total=total_calls, desc="hf_semspec.compare", unit="call")

    def call_done(self, name: str, prompt_index: int) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(f"prompt {prompt_index + 1}/{self.num_prompts}, {name}", refresh=False)
            self.bar.update()

    def prompt_done(self, prompt_index: int) -> None:
        if self.lines:
            print(f"hf_semspec.compare: prompt {prompt_index + 1}/{self.num_prompts} done", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _short(value: Any) -> Any:
    """`value` for an error message: itself, or its repr cut to 80 characters where that is longer (a model)."""
    text = repr(value)
    return value if len(text) <= 80 else text[:77] + "..."


def _encode_prompt(prompt: Any, index: int, tokenizer: Any, device: torch.device) -> torch.LongTensor:
    """A `prompts` item as `(1, length)` ids: text (with `tokenizer`), token ids (a list or a tensor), or a mapping
    with `input_ids` or `prompt` (its other keys are for the scorer)."""
    field_name, value = f"prompts[{index}]", prompt
    allowed = "text, token ids (a list or a (length,) / (1, length) tensor), or a dict with 'input_ids' or 'prompt'"
    if isinstance(prompt, Mapping):
        if "input_ids" not in prompt and "prompt" not in prompt:
            raise invalid_value(field_name, _short(prompt), allowed, "give the dict an 'input_ids' or a 'prompt' key")
        value = prompt["input_ids"] if "input_ids" in prompt else prompt["prompt"]
    if isinstance(value, str):
        if tokenizer is None:
            raise invalid_value(field_name, _short(value), "token ids when no tokenizer is given",
                                "pass tokenizer=... (the target's), or token ids")
        ids = tokenizer(value, return_tensors="pt")["input_ids"]
    elif isinstance(value, torch.Tensor):
        ids = value.long()
    else:
        try:
            ids = torch.tensor(list(value), dtype=torch.long)
        except (TypeError, ValueError):
            raise invalid_value(field_name, _short(prompt), allowed, "pass one prompt per item") from None
    ids = ids[None] if ids.dim() == 1 else ids
    if ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] == 0:
        raise invalid_value(field_name, _short(prompt), "one non-empty prompt: " + allowed,
                            "pass one prompt per item (compare() decodes them one at a time)")
    return ids.to(device)


def _eos_ids(target: torch.nn.Module, generate_kwargs: dict) -> list[int]:
    eos = generate_kwargs.get("eos_token_id")
    config = generate_kwargs.get("generation_config")
    if eos is None and config is not None:
        eos = config.eos_token_id
    if eos is None:
        eos = target.generation_config.eos_token_id
    if eos is None:
        return []
    if isinstance(eos, torch.Tensor):
        eos = eos.tolist()
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


def _synchronize(device: torch.device) -> None:
    """Waits for the device's queued work, so that a call's wall time includes it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type != "cpu" and hasattr(torch, "accelerator"):
        torch.accelerator.synchronize(device)


def _json_ready(kwargs: dict) -> dict:
    """The `generate()` arguments for the report: JSON values as they are, anything else (a policy instance, a
    `GenerationConfig`) as its repr."""

    def ready(value: Any) -> Any:
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            return repr(value)
        return value

    return {k: ready(v) for k, v in kwargs.items()}


def compare(
    target: torch.nn.Module,
    draft: torch.nn.Module | None,
    prompts: Iterable[Any],
    rules: Iterable[str | tuple[str, dict]] = DEFAULT_RULES,
    tokenizer: Any = None,
    score: Callable[[Any, Any], float] | None = None,
    repeats: int = 3,
    seed: int | None = 0,
    warmup: bool = True,
    progress: bool = True,
    **generate_kwargs,
) -> ComparisonReport:
    r"""Runs every configuration on every prompt against `exact` and reports what each buys and costs.

    Each prompt is decoded alone (batch 1). After one untimed warm-up call of each configuration on the first prompt
    (`warmup`; it also fails fast on a configuration that cannot run), for each prompt, `repeats` times, every
    configuration runs once, in an order that rotates from call to call (prompt index + repeat), so that a drifting
    machine hits every configuration alike and a ratio within the run is meaningful. Before every call the global
    RNG is seeded with `seed + prompt_index`: with sampling, `exact` and every rule see the same seed on a prompt,
    and two runs with one seed give one report (bar the timings). torch's RNG state is restored afterwards.
    Each distinct output of a prompt gets one call of `score` as it comes (the warm-up's first output too: a scorer
    that fails, fails before the timed calls), and after the calls one teacher-forced target forward for its NLL.
    The decoding settings left out of `generate_kwargs` come from the model's generation config, as in `generate()`
    (an Instruct model's may sample); the report's `decoding` shows them, and a warning says when sampling comes
    from there.

    Args:
        target (`PreTrainedModel`): the target model; attached for the call if it is not already, detached after.
        draft (`PreTrainedModel` or `None`): the draft model (`assistant_model`). With `prompt_lookup_num_tokens=k`
            (and optionally `max_matching_ngram_size=n`) in `generate_kwargs`, every configuration drafts by prompt
            lookup too: with a draft, multi-level drafting (the draft model verifies the n-gram candidates); with
            `None`, prompt lookup alone (no draft model; not `rdk`, which needs a drafter's kernel).
        prompts (`Iterable`): each a text (needs `tokenizer`; encoded as is, so apply a chat template first), token
            ids (a list, or a tensor of shape `(length,)` or `(1, length)`), or a dict with `"input_ids"` or
            `"prompt"`, whose other keys the scorer may read (e.g. a reference answer).
        rules (`Iterable`): the configurations, `"fly"`, `"fly@window=4@entropy_threshold=0.5"` (a variant: the
            rule with those `acceptance_kwargs`) or `("fly", {"window": 4})`; `"exact"` runs whether listed or not.
        tokenizer (`PreTrainedTokenizerBase`, *optional*): the target's; encodes text prompts, decodes outputs to
            text, and is passed to `generate()` (stop strings, vocabularies padded apart).
        score (`Callable[[prompt, text], float]`, *optional*): your measure of an output's quality, called with the
            prompt as given and the output's decoded new tokens (without special tokens; the list of new ids when no
            tokenizer is given), once per distinct output of a prompt.
        repeats (`int`, defaults to 3): timed calls of every configuration per prompt; tokens/s is the fastest's.
        seed (`int`, *optional*, defaults to 0): `torch.manual_seed(seed + prompt_index)` before each call; None
            leaves the RNG alone (sampled runs then do not repeat).
        warmup (`bool`, defaults to `True`): the untimed warm-up calls.
        progress (`bool`, defaults to `True`): a progress bar (tqdm) on stderr.
        generate_kwargs: passed to every `generate()` call: `max_new_tokens`, `do_sample`, `temperature`, `top_p`,
            `num_assistant_tokens`, `draft_length`, `prompt_lookup_num_tokens`, `max_matching_ngram_size`, ... (not
            those compare() sets: `assistant_model`, `acceptance`,
            `acceptance_kwargs`, `return_dict_in_generate`, `input_ids`, `attention_mask`).

    Returns:
        `ComparisonReport`: `to_dict()` for JSON, `to_markdown()` for a table, `report["fly"]` for one row.
    """
    plan = _plan(target, draft, prompts, rules, tokenizer, score, repeats, seed, generate_kwargs)
    measured = _measure(plan, target, draft, warmup=warmup, progress=progress)
    return _report(plan, measured)


@dataclass
class _Plan:
    """What a comparison runs, checked before any model call: the configurations, the encoded prompts, the decoding
    settings, and the keyword arguments of every `generate()` call."""

    configurations: list[Configuration]
    prompts: list[Any]
    encoded: list[torch.LongTensor]
    repeats: int
    seed: int | None
    tokenizer: Any
    score: Callable[[Any, Any], float] | None
    generate_kwargs: dict  # as the caller gave them (for the report)
    call_kwargs: dict  # what every call passes (the tokenizer added)
    decoding: dict
    eos_ids: list[int]

    def text_of(self, ids: list[int]) -> str | None:
        return self.tokenizer.decode(ids, skip_special_tokens=True) if self.tokenizer is not None else None


@dataclass
class _Measured:
    """What the calls gave: every timed call's run, per (prompt, configuration); the NLL of each distinct output and
    its score, per (prompt, output ids)."""

    runs: dict[tuple[int, str], list[_Run]] = field(default_factory=dict)
    nll: dict[tuple[int, tuple[int, ...]], float | None] = field(default_factory=dict)
    scores: dict[tuple[int, tuple[int, ...]], float] = field(default_factory=dict)


def _plan(target, draft, prompts, rules, tokenizer, score, repeats, seed, generate_kwargs: dict) -> _Plan:
    """compare()'s arguments checked (each error names the argument and the fix), the prompts encoded, and the
    decoding settings resolved (with a warning when sampling comes from the model's config)."""
    configurations = parse_rules(rules)
    for name in RESERVED_GENERATE_KWARGS:
        if name in generate_kwargs:
            raise invalid_value(name, _short(generate_kwargs[name]), "not given: compare() sets it for every call",
                                "pass the draft as `draft`, the rules as `rules=[...]`, the prompts as `prompts`")
    if draft is None and generate_kwargs.get("prompt_lookup_num_tokens") is None:
        raise invalid_value("draft", None, "a draft model, or None together with prompt_lookup_num_tokens "
                            "(prompt-lookup drafts, no draft model)",
                            "pass the draft model, or prompt_lookup_num_tokens=<k> (e.g. 6)")
    if generate_kwargs.get("assistant_ensemble_weight") is not None:
        # With the reference it would make `exact` the `ensemble` rule (as in transformers), and refuse every other.
        raise invalid_value("assistant_ensemble_weight", generate_kwargs["assistant_ensemble_weight"],
                            "None in generate_kwargs (it would turn the `exact` reference into `ensemble`)",
                            f"compare it as a configuration: rules=['ensemble@weight=w'] (hf_semspec's loop) or "
                            f"['{STOCK}@assistant_ensemble_weight=w'] (stock transformers)")
    if generate_kwargs.get("num_return_sequences", 1) != 1:
        raise invalid_value("num_return_sequences", generate_kwargs["num_return_sequences"], "1",
                            "drop it: compare() decodes one output per prompt")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise invalid_value("repeats", repeats, "an int ≥ 1", "pass e.g. repeats=3")
    if score is not None and not callable(score):
        raise invalid_value("score", score, "a callable score(prompt, text) -> float", "pass a function")
    if isinstance(prompts, (str, Mapping)):
        raise invalid_value("prompts", _short(prompts), "a list of prompts", "pass [prompt]")
    prompts = list(prompts)
    if not prompts:
        raise invalid_value("prompts", prompts, "at least one prompt", "pass a list of prompts")
    encoded = [_encode_prompt(p, i, tokenizer, target.device) for i, p in enumerate(prompts)]
    decoding = resolved_decoding(target, generate_kwargs)
    if decoding["do_sample"] and "do_sample" not in generate_kwargs:
        warnings.warn(
            "compare() samples: do_sample=True comes from the model's generation config (or the generation_config "
            f"passed), with {', '.join(f'{k}={v}' for k, v in decoding.items() if k != 'do_sample')}; outputs then "
            "differ from exact's by the draws as well as by the rule. Pass do_sample=False for greedy decoding, or "
            "do_sample=True to say so.", stacklevel=3)
    call_kwargs = dict(generate_kwargs)
    if tokenizer is not None:
        call_kwargs.setdefault("tokenizer", tokenizer)
    return _Plan(configurations, prompts, encoded, repeats, seed, tokenizer, score, dict(generate_kwargs),
                 call_kwargs, decoding, _eos_ids(target, generate_kwargs))


def _measure(plan: _Plan, target, draft, *, warmup: bool, progress: bool) -> _Measured:
    """Runs the plan: the warm-up calls, then per prompt and repeat every configuration in a rotated order, scoring
    each distinct output as it comes; then one teacher-forced target forward per distinct output for its NLL. The
    target is attached for the calls where it was not, and torch's RNG state is restored afterwards."""
    measured = _Measured()
    stock = _StockCall(target, draft, plan.call_kwargs) if any(c.is_stock for c in plan.configurations) else None

    def decode(configuration: Configuration, prompt_index: int) -> _Run:
        input_ids = plan.encoded[prompt_index]
        if plan.seed is not None:
            torch.manual_seed(plan.seed + prompt_index)
        # No garbage collection while timed (as `timeit`): it would be charged to whichever configuration was unlucky.
        collecting = gc.isenabled()
        gc.disable()
        try:
            if configuration.is_stock:
                return stock.run(input_ids, configuration.options, plan.eos_ids)
            _synchronize(target.device)
            start = time.perf_counter()
            out = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), assistant_model=draft,
                                  acceptance=configuration.rule, acceptance_kwargs=dict(configuration.options),
                                  return_dict_in_generate=True, **plan.call_kwargs)
            _synchronize(target.device)
            seconds = time.perf_counter() - start
        finally:
            if collecting:
                gc.enable()
        return _Run(new_token_ids(out.sequences, input_ids.shape[1], plan.eos_ids), seconds, out.acceptance_stats)

    def score_of(i: int, ids: list[int]) -> None:
        """Scores prompt i's output `ids` once (a scorer that fails, fails on the first output, not after the run)."""
        key = (i, tuple(ids))
        if plan.score is None or key in measured.scores:
            return
        text = plan.text_of(ids)
        value = plan.score(plan.prompts[i], text if text is not None else list(ids))
        if not isinstance(value, numbers.Real) or math.isnan(value):
            raise invalid_value("score", _short(value), "a number (int or float) from score(prompt, text)",
                                "return e.g. float(answer == reference)")
        measured.scores[key] = float(value)

    configurations, num_prompts = plan.configurations, len(plan.encoded)
    was_attached = _is_attached(target)
    cuda = sorted({p.device.index or 0 for m in (target, draft) if m is not None for p in m.parameters()
                   if p.device.type == "cuda"})
    if not was_attached:
        attach(target)
    try:
        with torch.random.fork_rng(devices=cuda):
            if warmup:
                for configuration in configurations:
                    warm = decode(configuration, 0)
                    if configuration.name == REFERENCE:  # the scorer's first call, before any timed one
                        score_of(0, warm.ids)
            bar = _Progress(num_prompts * plan.repeats * len(configurations), num_prompts, progress)
            try:
                for i in range(num_prompts):
                    for repeat in range(plan.repeats):
                        k = (i + repeat) % len(configurations)
                        for configuration in configurations[k:] + configurations[:k]:
                            run = decode(configuration, i)
                            if repeat == 0:
                                score_of(i, run.ids)
                            measured.runs.setdefault((i, configuration.name), []).append(run)
                            bar.call_done(configuration.name, i)
                    bar.prompt_done(i)
            finally:
                bar.close()
        for (i, _), prompt_runs in measured.runs.items():
            key = (i, tuple(prompt_runs[0].ids))
            if key not in measured.nll:  # one forward per distinct output: identical outputs get the very same number
                measured.nll[key] = target_nll(target, plan.encoded[i], prompt_runs[0].ids)
    finally:
        if not was_attached:
            detach(target)
    return measured


def _report(plan: _Plan, measured: _Measured) -> ComparisonReport:
    """The report: one row per configuration (`_summarize`), with the run's settings."""
    lookup = plan.generate_kwargs.get("prompt_lookup_num_tokens") is not None
    rows = [_summarize(c, measured.runs, plan.encoded, measured.nll, measured.scores, plan.text_of,
                       plan.score is not None, lookup) for c in plan.configurations]
    return ComparisonReport(rows, len(plan.encoded), plan.repeats, plan.seed, _json_ready(plan.generate_kwargs),
                            _json_ready(plan.decoding))

DECODING_FIELDS = ("do_sample", "temperature", "top_p", "top_k", "max_new_tokens")


def resolved_decoding(target, generate_kwargs: Mapping) -> dict:
    """The decoding settings `generate()` runs with, as it resolves them: each of `DECODING_FIELDS` from the call's
    keywords, else from a passed `generation_config`, else from the model's (Qwen2.5-Instruct's samples, with
    temperature 0.7 and top-p 0.8); `do_sample` False where none sets it."""
    config = generate_kwargs.get("generation_config") or target.generation_config
    decoding = {name: generate_kwargs[name] if name in generate_kwargs else getattr(config, name, None)
                for name in DECODING_FIELDS}
    decoding["do_sample"] = bool(decoding["do_sample"])
    return decoding


def _summarize(configuration, runs, encoded, nll, scores, text_of, scored, lookup=False) -> ConfigurationResult:
    """One configuration's row from its runs and `exact`'s; `lookup`: the calls drafted by prompt lookup."""
    per_prompt, timed = [], []
    for i, input_ids in enumerate(encoded):
        own, reference = runs[i, configuration.name], runs[i, REFERENCE]
        fastest = max(own, key=lambda run: run.tokens_per_s)
        timed.append(fastest)
        reference_fastest = max(reference, key=lambda run: run.tokens_per_s)
        ids, reference_ids = own[0].ids, reference[0].ids
        own_nll, reference_nll = nll[i, tuple(ids)], nll[i, tuple(reference_ids)]
        stats = own[0].stats
        per_prompt.append(PromptResult(
            prompt_index=i, prompt_tokens=input_ids.shape[1], new_token_ids=list(ids), text=text_of(ids),
            new_tokens=len(ids), seconds=fastest.seconds, tokens_per_s=fastest.tokens_per_s,
            speedup=fastest.tokens_per_s / reference_fastest.tokens_per_s
            if fastest.tokens_per_s > 0 and reference_fastest.tokens_per_s > 0 else None,
            identical=ids == reference_ids, first_divergence=first_divergence(ids, reference_ids), nll=own_nll,
            nll_increase=None if own_nll is None or reference_nll is None else own_nll - reference_nll,
            score=scores.get((i, tuple(ids))), tau=float(stats.mean_accepted_length),
            acceptance_rate=float(stats.acceptance_rate),
        ))
    first_stats = [runs[i, configuration.name][0].stats for i in range(len(encoded))]
    forwards, drafted = sum(s.num_target_forwards for s in first_stats), sum(s.num_drafted for s in first_stats)
    draft_forwards = sum(s.num_draft_forwards for s in first_stats)
    rounds = sum(s.num_row_forwards for s in first_stats)  # (each prompt's own rounds: one row a call)
    if draft_forwards:  # multi-level drafting: the drafts taken from confirmed candidates
        hits, per = sum(s.num_ngram_drafts for s in first_stats), drafted
    else:  # prompt lookup alone: the rounds whose lookup found drafts
        hits, per = sum(s.num_ngram_hits for s in first_stats), rounds
    speedup, speedup_ci95 = geometric_mean_interval([p.speedup for p in per_prompt if p.speedup is not None])
    nll_increase, nll_increase_ci95 = mean_interval([p.nll_increase for p in per_prompt if p.nll_increase is not None])
    divergences = [p.first_divergence for p in per_prompt if p.first_divergence is not None]
    new_tokens, seconds = sum(p.new_tokens for p in per_prompt), sum(p.seconds for p in per_prompt)
    timed_tokens = sum(len(run.ids) for run in timed)  # (the fastest repeats' own tokens: sampled without a seed,
    # repeats may differ in length from the first, whose output the row reports)
    reference_scores = [scores.get((i, tuple(runs[i, REFERENCE][0].ids))) for i in range(len(encoded))]
    pairs = list(zip([p.score for p in per_prompt], reference_scores)) if scored else []
    return ConfigurationResult(
        name=configuration.name, rule=configuration.rule, options=dict(configuration.options),
        lossless=configuration.lossless, prompts=len(per_prompt), new_tokens=new_tokens,
        seconds=seconds, tokens_per_s=timed_tokens / seconds if seconds > 0 else 0.0,
        speedup=speedup, speedup_ci95=speedup_ci95,
        tau=sum(s.num_new_tokens for s in first_stats) / forwards if forwards else 0.0,
        acceptance_rate=sum(s.num_accepted for s in first_stats) / drafted if drafted else 0.0,
        draft_forwards_per_drafted_token=draft_forwards / drafted if drafted else 0.0,
        ngram_hit_rate=(hits / per if per else 0.0) if lookup else None,
        identical_share=sum(p.identical for p in per_prompt) / len(per_prompt),
        mean_first_divergence=statistics.fmean(divergences) if divergences else None,
        nll=mean_interval([p.nll for p in per_prompt if p.nll is not None])[0],
        nll_increase=nll_increase, nll_increase_ci95=nll_increase_ci95,
        score_mean=statistics.fmean(a for a, _ in pairs) if scored else None,
        score_wins=sum(a > b for a, b in pairs) if scored else None,
        score_losses=sum(a < b for a, b in pairs) if scored else None,
        score_ties=sum(a == b for a, b in pairs) if scored else None,
        per_prompt=per_prompt,
    )


# ---------------------------------------------------------------------------------------------------------------------
# The command line: python -m hf_semspec compare
# ---------------------------------------------------------------------------------------------------------------------


def load_prompts(path: str | Path, form: str = "auto") -> list[Any]:
    """The prompts of a file: `text`, one prompt a line (blank lines skipped), or `jsonl`, one JSON object a line
    with `"prompt"` (text) or `"input_ids"` (token ids), its other keys kept for the scorer. `auto`: `jsonl` for a
    `.jsonl` or `.ndjson` file (any case), else `text`, which refuses a file whose every line is such a JSON object
    (one text prompt a line would be the records' JSON)."""
    path = Path(path)
    lines = read_lines(path)
    if form == "auto":
        form = "jsonl" if path.suffix.lower() in (".jsonl", ".ndjson") else "text"
        if form == "text" and lines and all(_is_prompt_record(line) for line in lines if line.strip()):
            raise ValueError(f"{path}: every line is a JSON object with 'prompt' or 'input_ids', read as text lines "
                             "by its suffix. Fix: name it .jsonl, or pass --prompts-format jsonl (or text to keep "
                             "the lines as they are)")
    if form == "text":
        return [line for line in lines if line.strip()]
    return read_records(
        path, "prompts", "a JSON object with 'prompt' (text) or 'input_ids' (token ids)",
        'give each line one, e.g. {"prompt": "..."} or {"input_ids": [1, 2, 3]}, or pass --prompts-format text',
        parse=lambda record: record if _is_prompt(record) else None, shown=_short,
        not_json_fix=", or pass --prompts-format text (prompts_format='text') to read each line as a prompt",
    )


def _is_prompt(record: Any) -> bool:
    return isinstance(record, dict) and bool({"prompt", "input_ids"} & set(record))


def _is_prompt_record(line: str) -> bool:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return False
    return _is_prompt(record)


def _load_scorer(spec: str) -> Callable:
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"--score {spec!r} must be <module>:<function>, e.g. my_scorers:gsm8k_answer")
    return getattr(importlib.import_module(module_name), attribute)


def _prompt_lookup(text: str) -> tuple[int, int | None]:
    """`--prompt-lookup K[:N]` → (k, n, or None without `:N`, which leaves `max_matching_ngram_size` to
    `--generate-kwargs` or the model's generation config); `ngram.parse_prompt_lookup` checks it, argparse names the
    flag in the error."""
    try:
        lookup = parse_prompt_lookup(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error
    return lookup.num_tokens, lookup.max_ngram_size if ":" in text else None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hf_semspec compare",
        description="Compare acceptance rules against `exact` on your prompts: speed-up, τ, acceptance, identical "
        "outputs, the target's NLL increase, and an optional score. Prints a Markdown report.")
    parser.add_argument("--target", required=True, help="target model (path or Hub id)")
    parser.add_argument("--draft", help="draft model (path or Hub id); without it, --prompt-lookup drafts alone")
    parser.add_argument("--tokenizer", help="tokenizer (default: the target's, where it has one)")
    parser.add_argument("--prompts", required=True,
                        help="prompts file: text lines, or JSONL with 'prompt' or 'input_ids' (token ids)")
    parser.add_argument("--prompts-format", choices=("auto", "text", "jsonl"), default="auto",
                        help="auto: jsonl for a .jsonl file, else text lines")
    parser.add_argument("--rules", default=",".join(DEFAULT_RULES),
                        help="comma-separated; a variant sets options: fly@window=4@entropy_threshold=0.5 "
                        "(exact always runs)")
    parser.add_argument("--draft-length", help="draft-length policy (constant, cost_aware, tapout, ...)")
    parser.add_argument("--num-assistant-tokens", type=int, help="draft tokens per round (the policy's length)")
    parser.add_argument("--prompt-lookup", type=_prompt_lookup, metavar="K[:N]",
                        help="every configuration also drafts by prompt lookup: up to K tokens copied per round after "
                        "the context's last n-gram, N the longest n-gram searched for (default 2, as transformers), "
                        "e.g. 6:4 (prompt_lookup_num_tokens=K, max_matching_ngram_size=N). With --draft, multi-level "
                        "drafting (the draft verifies the n-gram candidates); without it, prompt lookup alone")
    parser.add_argument("--max-new-tokens", type=int, help=f"new tokens per call (default {DEFAULT_MAX_NEW_TOKENS})")
    parser.add_argument("--sample", action="store_true", help="sample (default: greedy)")
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--seed", type=int, default=0, help="torch.manual_seed(seed + prompt index) before each call")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per prompt and configuration")
    parser.add_argument("--score", help="<module>:<function> called as function(prompt, text) -> float")
    parser.add_argument("--generate-kwargs", type=json.loads, default={}, help="more generate() arguments, as JSON")
    parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), help="both models' dtype")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (on a CPU: the free cores)")
    parser.add_argument("--output", help="write the report as JSON here")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


DEFAULT_MAX_NEW_TOKENS = 128


def _cli_generate_kwargs(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict:
    """The `generate()` keywords of a command line: `--generate-kwargs`, and the flags that set one keyword each; a
    flag and `--generate-kwargs` that set one keyword differently, or a keyword `compare()` sets itself, are an
    error. Greedy and `DEFAULT_MAX_NEW_TOKENS` where neither says."""
    kwargs = dict(args.generate_kwargs)
    reserved = sorted(set(kwargs) & set(RESERVED_GENERATE_KWARGS))
    if reserved:
        parser.error(f"--generate-kwargs sets {reserved}, which compare() sets for every call. Fix: give the draft as "
                     "--draft and the rules as --rules, and drop them from --generate-kwargs")
    k, n = args.prompt_lookup if args.prompt_lookup is not None else (None, None)
    flags = {
        "max_new_tokens": ("--max-new-tokens", args.max_new_tokens),
        "do_sample": ("--sample", True if args.sample else None),
        "temperature": ("--temperature", args.temperature),
        "top_p": ("--top-p", args.top_p),
        "draft_length": ("--draft-length", args.draft_length),
        "num_assistant_tokens": ("--num-assistant-tokens", args.num_assistant_tokens),
        "prompt_lookup_num_tokens": ("--prompt-lookup", k),
        "max_matching_ngram_size": ("--prompt-lookup", n),
    }
    for name, (flag, value) in flags.items():
        if value is None:
            continue
        if name in kwargs and kwargs[name] != value:
            parser.error(f"{flag} sets {name}={value!r} and --generate-kwargs sets {name}={kwargs[name]!r}. Fix: "
                         "give it once")
        kwargs[name] = value
    kwargs.setdefault("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    kwargs.setdefault("do_sample", False)
    return kwargs


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    rules = [entry.strip() for entry in args.rules.split(",") if entry.strip()]
    try:  # everything the user wrote is checked before any model loads
        parse_rules(rules)
        prompts = load_prompts(args.prompts, args.prompts_format)
        scorer = _load_scorer(args.score) if args.score else None
    except (ValueError, OSError, ImportError, AttributeError) as error:
        parser.error(str(error))
    if not isinstance(args.generate_kwargs, dict):
        parser.error(f"--generate-kwargs must be a JSON object, got {args.generate_kwargs!r}")
    kwargs = _cli_generate_kwargs(args, parser)
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: at least 1 timed call per prompt and configuration. Fix: pass e.g. "
                     "--repeats 3")
    if args.draft is None and kwargs.get("prompt_lookup_num_tokens") is None:
        parser.error("--draft is missing: a draft model drafts, or prompt lookup without one. Fix: pass --draft "
                     "<model>, or --prompt-lookup K[:N] (e.g. 6:4) to draft by prompt lookup alone")
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    load = {} if args.dtype is None else {"dtype": "auto" if args.dtype == "auto" else getattr(torch, args.dtype)}
    target = AutoModelForCausalLM.from_pretrained(args.target, **load).to(args.device).eval()
    draft = None
    if args.draft is not None:
        draft = AutoModelForCausalLM.from_pretrained(args.draft, **load).to(args.device).eval()
    try:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.target)
    except (OSError, ValueError) as error:
        if args.tokenizer or any(isinstance(p, str) or "input_ids" not in p for p in prompts):
            parser.error(f"cannot load a tokenizer from {args.tokenizer or args.target} ({error}); text prompts need "
                         "one. Fix: pass --tokenizer, or give token ids (JSONL with 'input_ids')")
        tokenizer = None  # token ids only: the report has no text
    report = compare(target, draft, prompts, rules=rules, tokenizer=tokenizer, score=scorer, repeats=args.repeats,
                     seed=args.seed, progress=not args.no_progress, **kwargs)
    print(report.to_markdown())
    if args.output:
        Path(args.output).write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.output}", file=sys.stderr)
    return 0

