"""The decoding methods compared, and one timed `generate()` call of a method on a prompt.

- `plain`: the target alone (stock `generate()`).
- `stock_assisted`: transformers' own assisted generation with the same draft. Stock reads γ from the *draft's*
  generation config (it ignores `num_assistant_tokens` passed to `generate()`), so we set it there, with a constant
  schedule. Its other defaults are kept (notably `assistant_confidence_threshold`, which stops a round's drafting
  early when the draft is unsure) unless `--stock-confidence-threshold` says otherwise.
- `semspec:<rule>`: hf_semspec's loop with that acceptance rule, for every rule registered when the run starts;
  with `--draft-lengths`, one method per rule and draft-length policy: `semspec:<rule>/<policy>[:<n>]`, where `n`
  sets the policy's length (fixed length, initial length or cap). Each such method keeps one policy instance for
  the whole run, so a learning policy (tapout, adaedl, heuristic) learns across prompts. With
  `--policy-state category`, each policy that keeps state across calls (`keeps_state_across_calls`: tapout,
  cost_aware, adaedl, best_constant) keeps one instance per Spec-Bench category instead, and its method is named
  `semspec:<rule>/<policy>/per-category`: what a server that knew each request's kind could do (an oracle key).
- `--drafting model,lookup,mla` with `--prompt-lookup K[:N]`: each `semspec:<rule>` method once per way of drafting
  (`DRAFTINGS`): `semspec:<rule>` drafts with the draft model, `semspec:<rule>+lookup` by prompt lookup alone (k
  tokens copied from the context after its last n-gram, no draft model: `generate(prompt_lookup_num_tokens=k,
  max_matching_ngram_size=n)` without `assistant_model`), `semspec:<rule>+mla` with both, multi-level drafting (the
  draft model verifies the n-gram candidates, so it drafts the same tokens in fewer forwards). A rule that cannot
  verify prompt-lookup drafts (`rdk`: it needs its drafter's kernel) is skipped for `lookup` with the reason.

Both baselines call the *class* method `type(target).generate`, which bypasses the instance override installed by
`hf_semspec.attach()`.
"""

from __future__ import annotations

import copy
import gc
import json
import re
import time
from dataclasses import dataclass, field

import torch

import hf_semspec
from hf_semspec.draft_length import POLICIES, DraftLengthPolicy
from hf_semspec.draft_length.base import default_length
from hf_semspec.errors import SemSpecConfigError
from hf_semspec.ngram import PromptLookup
from hf_semspec.ngram import parse_prompt_lookup as ngram_parse_prompt_lookup
from hf_semspec.rules import RULES, AcceptanceRule

from .data import Prompt
from .metrics import ForwardMeter, new_token_ids
from .models import ModelPair

PLAIN = "plain"
STOCK = "stock_assisted"
SEMSPEC_PREFIX = "semspec:"
# Which prompts share a draft-length policy instance (`policy_key`): all of the run's, or those of one category.
POLICY_STATES = ("run", "category")
PER_CATEGORY_SUFFIX = "/per-category"
# How a `semspec:` method drafts (`--drafting`), and the suffix of its name: the draft model alone, prompt lookup alone
# (no draft model), or both (multi-level drafting, MLA: the draft model verifies the n-gram candidates).
MODEL, LOOKUP, MLA = "model", "lookup", "mla"
DRAFTINGS = (MODEL, LOOKUP, MLA)
DRAFTING_SUFFIX = {MODEL: "", LOOKUP: "+lookup", MLA: "+mla"}
# Requirements the speculative loop itself satisfies for any draft model (it passes q and the target's hidden states).
REQUIREMENTS_THE_LOOP_MEETS = {"requires_draft_probs", "requires_target_hidden_states"}


def policy_key(policy_state: str, prompt_id: str | None, category: str | None) -> str | None:
    """Which policy instance decodes a prompt, by `policy_state`: the run's one (`None`), its category's, or, in a
    replay (`"prompt"`), its own. Live runs (`Method.policy_for`) and replays key their instances here alike."""
    return {"run": None, "category": category, "prompt": prompt_id}[policy_state]


@dataclass
class Method:
    """One decoding method. `gamma` is the `num_assistant_tokens` passed (None: plain, or the policy's default);
    `draft_length` the draft-length policy (None: hf_semspec's default, `constant`)."""

    name: str
    kind: str  # "plain" | "stock" | "semspec"
    gamma: int | None = None
    rule: str | None = None
    rule_kwargs: dict = field(default_factory=dict)
    draft_length: str | None = None
    draft_length_kwargs: dict = field(default_factory=dict)
    uses_pruned_draft: bool = False  # the pair's pruned-vocabulary drafter instead of its draft (rdk)
    drafting: str = MODEL  # `DRAFTINGS`: the draft model, prompt lookup alone, or both (MLA)
    prompt_lookup: PromptLookup | None = None  # k and n, for `lookup` and `mla`
    # One draft-length policy instance for the whole run, so policies that learn (tapout's bandit, adaedl's λ,
    # heuristic's length) keep learning across prompts, as they would serving a stream of requests.
    policy: DraftLengthPolicy | None = field(default=None, repr=False, compare=False)
    policy_state: str = "run"  # "category": one instance per category, copies of `policy` as built
    _keyed_policies: dict[str, DraftLengthPolicy] = field(default_factory=dict, repr=False, compare=False)

    def policy_for(self, category: str | None) -> DraftLengthPolicy | None:
        """The instance that decodes a prompt of `category` (`policy_key`): `policy` itself, or with
        `policy_state="category"` the category's own, built from `policy`'s config the first time the category comes;
        `category=None` (the warm-up's first tiny call) gets `policy`."""
        key = policy_key(self.policy_state, None, category)
        if key is None:
            return self.policy
        if key not in self._keyed_policies:
            self._keyed_policies[key] = self._untrained_policy()
        return self._keyed_policies[key]

    def start_afresh(self) -> None:
        """Forgets what this method's policy learned (after the warm-up): a fresh instance from the same config, and
        no per-category instances yet."""
        if self.policy is not None:
            self.policy = self._untrained_policy()
        self._keyed_policies.clear()

    def _untrained_policy(self) -> DraftLengthPolicy:
        """A new instance of `policy`'s class from a copy of its config: the same options, nothing learned."""
        return type(self.policy)(copy.deepcopy(self.policy.config))

    def describe(self) -> dict:
        return {"name": self.name, "kind": self.kind, "gamma": self.gamma, "rule": self.rule,
                "rule_kwargs": self.rule_kwargs, "draft_length": self.draft_length,
                "draft_length_kwargs": self.draft_length_kwargs,
                # Every option with its value in this run, defaults included: a later default change cannot
                # make an old results file mean something else.
                "draft_length_config": self.policy.config.all_options() if self.policy is not None else None,
                "policy_state": self.policy_state,
                "draft": "none" if not self.uses_draft_model else "pruned_draft" if self.uses_pruned_draft else "draft",
                "drafting": self.drafting if self.kind == "semspec" else None,
                "prompt_lookup": None if self.prompt_lookup is None else {
                    "prompt_lookup_num_tokens": self.prompt_lookup.num_tokens,
                    "max_matching_ngram_size": self.prompt_lookup.max_ngram_size}}

    @property
    def uses_draft_model(self) -> bool:
        """Whether a draft model drafts (all but prompt lookup alone)."""
        return self.drafting != LOOKUP


@dataclass(frozen=True)
class DraftLengthSpec:
    """One `--draft-lengths` entry: `<policy>[:<tokens>][(<option>=<value>;...)]`, e.g. `tapout(bandit=ucb_tuned)`."""

    policy: str
    tokens: int | None = None
    options: tuple[tuple[str, object], ...] = ()

    @property
    def label(self) -> str:
        """The entry as `--draft-lengths` takes it (strings bare, other values as JSON), so it parses back to itself."""
        options = ";".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in self.options)
        length = f":{self.tokens}" if self.tokens is not None else ""
        return self.policy + length + (f"({options})" if options else "")


_SPEC_FORM = "<policy>, <policy>:<tokens> or <policy>(<option>=<value>;...), e.g. constant:8 or tapout(bandit=ucb1)"
_SPEC = re.compile(r"^(?P<policy>[A-Za-z_][\w]*)(?::(?P<tokens>[^()]*))?(?:\((?P<options>[^()]*)\))?$")


def _option_value(text: str) -> object:
    """`8` → 8, `0.5` → 0.5, `true` → True, `["svip"]` → list; anything else stays a string (`ucb_tuned`)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_draft_lengths(text: str | None) -> list[DraftLengthSpec] | None:
    """`"constant:5,adaedl,tapout(bandit=ucb_tuned)"` → one `DraftLengthSpec` per entry; None stays None. Options
    are `draft_length_kwargs` of that method, validated by the policy's config when the method is built."""
    if not text:
        return None
    specs = []
    for item in (part.strip() for part in re.split(r",(?![^()]*\))", text) if part.strip()):
        match = _SPEC.match(item)
        if match is None:
            raise ValueError(f"--draft-lengths: {item!r} must be {_SPEC_FORM}")
        name, number, options = match["policy"], match["tokens"], match["options"]
        if name not in POLICIES:
            raise ValueError(
                f"--draft-lengths: unknown policy {name!r} in {item!r}: registered policies are {POLICIES.names()}")
        if number is not None and not (number.isascii() and number.isdigit()):
            raise ValueError(f"--draft-lengths: {item!r} must be {_SPEC_FORM}")
        pairs = []
        for option in (o.strip() for o in (options or "").split(";") if o.strip()):
            key, equals, value = option.partition("=")
            if not equals or not key.strip():
                raise ValueError(f"--draft-lengths: option {option!r} in {item!r} must be <option>=<value>")
            pairs.append((key.strip(), _option_value(value.strip())))
        specs.append(DraftLengthSpec(name, int(number) if number else None, tuple(pairs)))
    return specs


def parse_prompt_lookup(text: str | None) -> PromptLookup | None:
    """`--prompt-lookup`: `"6"` → k = 6 and transformers' n = 2; `"6:4"` → k = 6, n = 4 (`ngram.parse_prompt_lookup`);
    None stays None. A value out of range raises `ValueError` naming the flag, the value, what is allowed and the fix."""
    if text is None:
        return None
    try:
        return ngram_parse_prompt_lookup(text)
    except ValueError as error:
        raise ValueError(f"--prompt-lookup: {error}") from None


def prompt_lookup_label(lookup: PromptLookup) -> str:
    """`k:n`, as `--prompt-lookup` takes it."""
    return f"{lookup.num_tokens}:{lookup.max_ngram_size}"


def parse_draftings(text: str | None) -> tuple[str, ...]:
    """`--drafting`: `"model,lookup,mla"` → the ways each `semspec:` method drafts, in `DRAFTINGS` order, each once;
    None → `("model",)`. An unknown or repeated entry raises `ValueError` naming the flag and the fix."""
    if text is None:
        return (MODEL,)
    entries = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [e for e in entries if e not in DRAFTINGS]
    if unknown or not entries or len(set(entries)) != len(entries):
        raise ValueError(f"--drafting: got {text!r}; expected a comma-separated subset of {list(DRAFTINGS)}, each "
                         "once (model: the draft model; lookup: prompt lookup alone, no draft model; mla: both, the "
                         "draft model verifying the n-gram candidates). Fix: pass e.g. --drafting model,lookup,mla")
    return tuple(d for d in DRAFTINGS if d in entries)


def check_drafting_options(draftings: tuple[str, ...], prompt_lookup: PromptLookup | None,
                           draft_lengths: list[DraftLengthSpec] | None) -> None:
    """`--drafting` and `--prompt-lookup` go together: lookup and MLA need k (and n), and k without them drafts
    nothing by lookup. Raises `ValueError` naming the flags and the fix (before any model loads)."""
    needs_lookup = [d for d in draftings if d != MODEL]
    if needs_lookup and prompt_lookup is None:
        raise ValueError(f"--drafting {','.join(draftings)} without --prompt-lookup: {' and '.join(needs_lookup)} "
                         "draft by prompt lookup and need its k tokens per round. Fix: add --prompt-lookup K[:N], "
                         "e.g. --prompt-lookup 6:4")
    if prompt_lookup is not None and not needs_lookup:
        raise ValueError(f"--prompt-lookup {prompt_lookup_label(prompt_lookup)} with --drafting "
                         f"{','.join(draftings)}: no method would draft by prompt lookup (it would be recorded but "
                         "not applied). Fix: add --drafting model,lookup,mla (or lookup, mla), or drop --prompt-lookup")
    if needs_lookup and draft_lengths is not None:
        raise ValueError(f"--draft-lengths with --drafting {','.join(draftings)}: the draft-length tables compare "
                         "each rule's policies with one way of drafting, and would mix prompt lookup's rounds with the "
                         "draft model's. Fix: run the draft-length sweep and the drafting comparison as two runs")


def split_entries(text: str) -> list[str]:
    """A comma-separated list whose entries may hold `(...)` options with commas of their own (JSON lists)."""
    return [part.strip() for part in re.split(r",(?![^()]*\))", text) if part.strip()]


def parse_rule_entry(entry: str) -> tuple[str, dict]:
    """`--rules` entry → (rule name, options): `dropmatch` → ("dropmatch", {}); `dropmatch(criterion=js;min_votes=2)`
    → ("dropmatch", {"criterion": "js", "min_votes": 2}): a variant of the rule, its own method
    (`semspec:dropmatch(criterion=js;min_votes=2)`), with these options over the rule's `--acceptance-kwargs`."""
    match = _SPEC.match(entry)
    if match is None or match["tokens"] is not None:
        raise ValueError(f"--rules: {entry!r} must be <rule> or <rule>(<option>=<value>;...), e.g. "
                         "dropmatch(criterion=js)")
    options = {}
    for option in (o.strip() for o in (match["options"] or "").split(";") if o.strip()):
        key, equals, value = option.partition("=")
        if not equals or not key.strip():
            raise ValueError(f"--rules: option {option!r} in {entry!r} must be <option>=<value>")
        options[key.strip()] = _option_value(value.strip())
    return match["policy"], options


def has_lossless_rule(described: dict) -> bool:
    """Whether a method as a results file describes it (`Method.describe`) decodes with a registered lossless rule, so
    that its greedy text should be plain's."""
    return described["rule"] in RULES and RULES.get(described["rule"]).lossless


def rule_skip_reason(rule: AcceptanceRule, draft: torch.nn.Module | None, do_sample: bool) -> str | None:
    """Why a registered rule cannot run with this draft and decoding mode, from what the rule declares; None if it can.
    `draft=None`: drafts by prompt lookup alone (no draft model).

    - `supports_greedy` / `supports_sampling` false for the requested mode;
    - the rule's `check_assistant_model(draft)` (if the rule has one) raising `SemSpecConfigError`, e.g. `rdk`, which
      needs a pruned-vocabulary drafter with a kernel (and so cannot verify prompt-lookup drafts);
    - a truthy `requires_*` class attribute that the loop does not satisfy by itself for a plain draft model.
    Anything else (a bad option, a crash while decoding) is an error and fails the run.
    """
    mode = "do_sample=True" if do_sample else "do_sample=False"
    if not (rule.supports_sampling if do_sample else rule.supports_greedy):
        return f"the rule does not define {mode}"
    drafter = ("prompt-lookup drafts (no draft model)" if draft is None
               else f"a plain draft model ({type(draft).__name__})")
    check = getattr(rule, "check_assistant_model", None)
    if callable(check):
        try:
            check(draft)
        except SemSpecConfigError as error:
            what = "by prompt lookup alone" if draft is None else "with this draft model"
            return f"it cannot run {what}: {error}"
    for attribute in sorted(a for a in dir(type(rule)) if a.startswith("requires_")):
        if attribute not in REQUIREMENTS_THE_LOOP_MEETS and getattr(type(rule), attribute) is True:
            return f"the rule declares {attribute} = True, which {drafter} does not meet"
    return None


def check_method_options(
    rules: list[str] | None, acceptance_kwargs: dict[str, dict], draft_lengths: list[DraftLengthSpec] | None,
    num_assistant_tokens: int | None = None,
) -> list[str]:
    """The rules to run (`None`: every registered one), after building each with its options and each draft-length
    entry for each of them, as `build_methods` will: a bad name or option raises here, before any model loads."""
    registered = hf_semspec.available_rules()
    entries = registered if rules is None else rules
    names = [parse_rule_entry(entry)[0] for entry in entries]
    unknown = [n for n in names if n not in registered] + [n for n in acceptance_kwargs if n not in names]
    if unknown:
        raise ValueError(f"unknown or unselected rule(s) {unknown}: registered rules are {registered}")
    for entry in entries:
        name, options = parse_rule_entry(entry)
        RULES.build(name, {**acceptance_kwargs.get(name, {}), **options})
        for spec in draft_lengths or []:
            build_policy(spec.policy, entry_tokens(spec, num_assistant_tokens),
                         RULES.get(name).default_num_draft_tokens, dict(spec.options))
    return entries


def entry_tokens(spec: DraftLengthSpec, num_assistant_tokens: int | None) -> int | None:
    """The length a `--draft-lengths` entry runs with: its own (`constant:3`), else `--num-assistant-tokens`, as
    `generate(num_assistant_tokens=...)` fills a policy's length; None leaves it to the policy and the rule."""
    return spec.tokens if spec.tokens is not None else num_assistant_tokens


def build_methods(
    rules: list[str] | None,
    acceptance_kwargs: dict[str, dict],
    num_assistant_tokens: int | None,
    do_sample: bool,
    draft: torch.nn.Module,
    draft_lengths: list[DraftLengthSpec] | None = None,
    pruned_draft: torch.nn.Module | None = None,
    include_stock: bool = True,
    policy_state: str = "run",
    include_plain: bool = True,
    draftings: tuple[str, ...] = (MODEL,),
    prompt_lookup: PromptLookup | None = None,
) -> tuple[list[Method], dict[str, str]]:
    """The methods to run, in a fixed order, and `{rule: reason}` for the registered rules that are skipped.

    `rules=None` means every rule registered now. γ: `num_assistant_tokens` if given, else each rule's
    `default_num_draft_tokens`; stock assisted uses the `exact` rule's default (standard speculative decoding).
    `draft_lengths` entries give one method per rule and entry instead of the default policy. A rule
    that cannot run with `draft` runs with `pruned_draft` when that one suits it (`rdk`), else it is skipped.
    `policy_state="category"` gives each policy that keeps state across calls one instance per category (its name
    ends in `/per-category`); the others, which learn nothing worth keeping, run and are named as with "run".
    A `rules` entry may carry options, `dropmatch(criterion=js)` (`parse_rule_entry`): a variant of the rule with its
    own method. `include_plain=False` leaves out `plain` (e.g. greedy runs whose `exact` already gives plain's text).
    `draftings` (`--drafting`): each rule's methods once per way of drafting, the draft model's first, then prompt
    lookup alone (`+lookup`, with `prompt_lookup`'s k and n, no draft model), then both (`+mla`); a rule that cannot
    verify prompt-lookup drafts is skipped for `lookup`, keyed `<entry>+lookup` in the skipped rules.
    """
    if policy_state not in POLICY_STATES:
        raise ValueError(f"--policy-state: got {policy_state!r}; expected one of {list(POLICY_STATES)}. Fix: pass "
                         "'run' (one instance per method) or 'category' (one per category).")
    registered = hf_semspec.available_rules()
    entries = check_method_options(rules, acceptance_kwargs, draft_lengths, num_assistant_tokens)
    exact_gamma = RULES.get("exact").default_num_draft_tokens if "exact" in registered else AcceptanceRule.default_num_draft_tokens
    methods = [Method(PLAIN, "plain")] if include_plain else []
    if include_stock:
        methods.append(Method(STOCK, "stock", gamma=exact_gamma if num_assistant_tokens is None else num_assistant_tokens))
    check_drafting_options(tuple(draftings), prompt_lookup, draft_lengths)
    skipped = {}
    for entry in entries:
        name, options = parse_rule_entry(entry)
        rule_cls = RULES.get(name)
        kwargs = {**acceptance_kwargs.get(name, {}), **options}
        rule = RULES.build(name, kwargs)  # a bad option is the user's error: it raises now, before any model runs
        for drafting in draftings:
            label = entry + DRAFTING_SUFFIX[drafting]
            lookup = prompt_lookup if drafting != MODEL else None
            if drafting == LOOKUP:
                reason, uses_pruned = rule_skip_reason(rule, None, do_sample), False
            else:
                reason = rule_skip_reason(rule, draft, do_sample)
                uses_pruned = (reason is not None and pruned_draft is not None
                               and rule_skip_reason(rule, pruned_draft, do_sample) is None)
            if reason is not None and not uses_pruned:
                skipped[label] = reason
                continue
            if draft_lengths is None:
                # Prompt lookup alone: None lets generate() take k as the length, unless --num-assistant-tokens says.
                default = None if drafting == LOOKUP else rule_cls.default_num_draft_tokens
                gamma = default if num_assistant_tokens is None else num_assistant_tokens
                methods.append(Method(SEMSPEC_PREFIX + label, "semspec", gamma=gamma, rule=name, rule_kwargs=kwargs,
                                      uses_pruned_draft=uses_pruned, drafting=drafting, prompt_lookup=lookup))
                continue
            for spec in draft_lengths:
                tokens = entry_tokens(spec, num_assistant_tokens)
                policy = build_policy(spec.policy, tokens, rule_cls.default_num_draft_tokens, dict(spec.options))
                state = policy_state if type(policy).keeps_state_across_calls else "run"
                suffix = PER_CATEGORY_SUFFIX if state == "category" else ""
                methods.append(Method(f"{SEMSPEC_PREFIX}{label}/{spec.label}{suffix}", "semspec", gamma=tokens,
                                      rule=name, rule_kwargs=kwargs, draft_length=spec.policy,
                                      draft_length_kwargs=dict(spec.options), uses_pruned_draft=uses_pruned,
                                      policy=policy, policy_state=state, drafting=drafting, prompt_lookup=lookup))
    return methods, skipped


def build_policy(name: str, tokens: int | None, default_tokens: int, options: dict | None = None) -> DraftLengthPolicy:
    """The policy `name` with `options` and `tokens` in its length field (else its own default, else the rule's γ), as
    `generate(draft_length=name, draft_length_kwargs=options, num_assistant_tokens=tokens)` would build it."""
    policy_class = POLICIES.get(name)
    options = dict(options or {})
    field_name = policy_class.length_field
    if field_name is not None and tokens is not None:
        options[field_name] = tokens  # 0 too: the policy's config refuses it, as generate() would
    elif field_name is not None and field_name not in options:
        config = policy_class.config_class.from_kwargs(options)
        if getattr(config, field_name) is None:  # as generate() fills it: the rule's default γ
            options[field_name] = default_length(config, field_name, default_tokens)
    return POLICIES.build(name, options)


def rotated(methods: list[Method], index: int) -> list[Method]:
    """The methods in a rotating order for prompt `index`, so slow drift of the machine hits every method alike."""
    k = index % len(methods)
    return methods[k:] + methods[:k]


def generate(method: Method, pair: ModelPair, inputs: dict, max_new_tokens: int, do_sample: bool,
             stock_confidence_threshold: float | None = None, category: str | None = None):
    """One `generate()` call of `method` on a prompt of `category`; returns the `return_dict_in_generate` output."""
    target, draft = pair.target, pair.draft
    common = dict(max_new_tokens=max_new_tokens, do_sample=do_sample, return_dict_in_generate=True)
    if method.kind == "plain":
        return type(target).generate(target, **inputs, **common)
    if method.kind == "stock":
        # Stock assisted generation reads γ from the draft's generation config. It is set for this call only:
        # hf_semspec reads the draft's length too (last, where nothing else sets one), and the other methods must
        # not inherit it.
        saved = copy.deepcopy(draft.generation_config)
        draft.generation_config.num_assistant_tokens = method.gamma
        draft.generation_config.num_assistant_tokens_schedule = "constant"
        if stock_confidence_threshold is not None:
            draft.generation_config.assistant_confidence_threshold = stock_confidence_threshold
        try:
            return type(target).generate(target, **inputs, assistant_model=draft, **common)
        finally:
            draft.generation_config = saved
    return target.generate(**inputs, **semspec_generate_kwargs(method, pair, category), **common)


def semspec_generate_kwargs(method: Method, pair: ModelPair, category: str | None = None) -> dict:
    """The hf_semspec arguments of a `semspec:` method's `generate()` call on a prompt of `category`: its drafter
    (`assistant_model`: the draft, the pruned drafter, or none for prompt lookup alone), its rule and options, its
    length or policy, and with prompt lookup (`+lookup`, `+mla`) `prompt_lookup_num_tokens` and
    `max_matching_ngram_size`."""
    policy = method.policy_for(category)
    kwargs = dict(
        acceptance=method.rule,
        acceptance_kwargs=method.rule_kwargs,
        num_assistant_tokens=None if policy is not None else method.gamma,
        draft_length=policy if policy is not None else method.draft_length,
    )
    if method.uses_draft_model:
        kwargs["assistant_model"] = pair.pruned_draft if method.uses_pruned_draft else pair.draft
    if method.prompt_lookup is not None:
        kwargs["prompt_lookup_num_tokens"] = method.prompt_lookup.num_tokens
        kwargs["max_matching_ngram_size"] = method.prompt_lookup.max_ngram_size
    return kwargs


@dataclass
class Meters:
    """Forward counters/timers on the target, the draft and the pruned drafter (if any), installed for the run."""

    target: ForwardMeter
    draft: ForwardMeter
    pruned_draft: ForwardMeter | None = None

    def reset(self) -> None:
        for meter in (self.target, self.draft, self.pruned_draft):
            if meter is not None:
                meter.reset()

    def draft_of(self, method: Method) -> ForwardMeter:
        return self.pruned_draft if method.uses_pruned_draft else self.draft


def timed_run(method: Method, pair: ModelPair, prompt: Prompt, inputs: dict, meters: Meters, eos_ids: list[int],
              do_sample: bool, seed: int | None, stock_confidence_threshold: float | None = None) -> dict:
    """Runs `method` on `prompt` once and returns its per-prompt record (timing, tokens, forwards, text).

    The RNG is seeded with `seed` right before the call (unless it is None), the same seed for every method on a
    prompt: sampling draws from it, and so does greedy `dropmatch` (its dropout masks).
    """
    gc.collect()  # a collection inside the timed region would be charged to whichever method was unlucky
    meters.reset()
    if seed is not None:
        torch.manual_seed(seed)
    start = time.perf_counter()
    out = generate(method, pair, inputs, prompt.max_new_tokens, do_sample, stock_confidence_threshold, prompt.category)
    wall = time.perf_counter() - start
    prompt_length = inputs["input_ids"].shape[1]
    ids = new_token_ids(out.sequences, prompt_length, eos_ids)
    stats = getattr(out, "acceptance_stats", None)
    forwards = meters.target.calls
    return {
        "prompt_id": prompt.prompt_id,
        "category": prompt.category,
        "method": method.name,
        "drafting": method.drafting if method.kind == "semspec" else None,
        "gamma": method.gamma,
        "seed": seed,
        "prompt_tokens": prompt_length,
        "max_new_tokens": prompt.max_new_tokens,
        "new_tokens": len(ids),
        "new_token_ids": ids,
        "wall_s": wall,
        "tokens_per_s": len(ids) / wall,
        "target_forwards": forwards,
        "tau": len(ids) / forwards if forwards else 0.0,
        "draft_forwards": meters.draft_of(method).calls,
        "target_forward_s": meters.target.seconds,
        "draft_forward_s": meters.draft_of(method).seconds,
        "acceptance_stats": acceptance_record(stats),
        "text": pair.decode(ids),
    }


def acceptance_record(stats) -> dict | None:
    """A call's `AcceptanceStats` as a record keeps them (`to_dict()`: the drafting counts `num_draft_forwards`,
    `num_ngram_hits`, `num_ngram_drafts` and `draft_forwards_per_drafted_token` included). None for plain and stock,
    which report none."""
    return None if stats is None else stats.to_dict()
