"""The user-facing entry point: `generate()` with `acceptance=`, and `attach()` to install it on a model instance."""

from __future__ import annotations

import contextlib
import contextvars
import copy
import dataclasses
import difflib
import functools
import inspect
import json
import logging
import os
import threading
import weakref
from typing import Any

import torch
from huggingface_hub import try_to_load_from_cache
from transformers import GenerationConfig, StoppingCriteriaList
from transformers.generation import StopStringCriteria

from ._transformers_compat import is_derived_from_model_config, mark_as_user_config
from .call_fields import CALL, MODEL, PASSED_CONFIG, CallFields
from .component_config import default_of, python_number
from .decoding import speculative_decode
from .draft_length import POLICIES, DraftLengthPolicy
from .draft_length.base import MAX_DRAFT_TOKENS, default_length
from .errors import invalid_value
from .generation_fields import GENERATION_FIELDS, allowed_text
from .drafting_choice import auto_lookup, check_drafting
from .ngram import PromptLookup, check_prompt_lookup
from .rules import RULES, AcceptanceRule

logger = logging.getLogger(__name__)

# Our fields inside `GenerationConfig` (and its JSON), as (component name, its options).
ACCEPTANCE_FIELDS = ("acceptance", "acceptance_kwargs")
DRAFT_LENGTH_FIELDS = ("draft_length", "draft_length_kwargs")
DRAFTING_FIELD = "drafting"
SEMSPEC_GENERATION_FIELDS = ACCEPTANCE_FIELDS + DRAFT_LENGTH_FIELDS + (DRAFTING_FIELD,)
_REGISTRY_OF_FIELD = {"acceptance": RULES, "draft_length": POLICIES}


def _resolve_component(
    call_name: Any,
    call_kwargs: Any,
    fields: tuple[str, str],
    generation_config: GenerationConfig | None,
    model_generation_config: GenerationConfig | None,
    model_orphans_are_errors: bool = False,
) -> tuple[Any, Any, str | None]:
    """`(name, options, source)` of one component given these values: `CallFields.component`, which `generate()`
    reads through the call's one `CallFields`."""
    name_field, kwargs_field = fields
    call = CallFields(model_generation_config, generation_config, {name_field: call_name, kwargs_field: call_kwargs})
    return call.component(name_field, kwargs_field, listing_function=_REGISTRY_OF_FIELD[name_field].listing_function,
                          model_orphans_are_errors=model_orphans_are_errors)


def _speculative_rule(fields: CallFields, assistant_model) -> tuple[str | None, Any, float | None]:
    """`(rule name, its options, transformers' ensemble weight read into it)` of the call; `(None, None, None)` where
    stock transformers decodes: no rule anywhere, an explicit `acceptance=None`, or the model's default rule without
    a draft model (its prompt lookup included). Refuses what only a rule would read, given without one."""
    rule_off = fields.in_call("acceptance") and fields.call("acceptance") is None  # no rule, whatever the configs say
    if rule_off and fields.call("acceptance_kwargs") is not None:
        raise invalid_value("acceptance_kwargs", fields.call("acceptance_kwargs"),
                            "None with acceptance=None (no rule decodes)",
                            "drop acceptance_kwargs, or name the rule they are for with acceptance=...")
    rule_name, rule_kwargs, source = (None, None, None) if rule_off else fields.component(
        "acceptance", "acceptance_kwargs", listing_function=RULES.listing_function
    )
    if rule_name is None:
        given = fields.given("draft_length", "draft_length_kwargs", DRAFTING_FIELD)
        if given is not None:
            field, value = given
            stock = ("stock assisted generation drafts with the draft model alone" if field.endswith(DRAFTING_FIELD)
                     else "stock assisted generation has its own num_assistant_tokens")
            raise invalid_value(field, value, f"only together with an acceptance rule ({stock})",
                                f'also set acceptance="exact" (or another rule), or drop {field}')
        if getattr(assistant_model, "kept_token_ids", None) is not None:
            raise invalid_value(
                "acceptance", None,
                "a rule when assistant_model is a pruned-vocabulary drafter (stock assisted generation cannot map its "
                "kept-token logits back to the target's vocabulary)",
                'pass acceptance="exact" (or "rdk" for a drafter with an RDK kernel)',
            )
        return None, None, None
    if assistant_model is None and source == "model":
        # The model's default rule is off without a draft: options given for this call would silently do nothing.
        given = fields.given("acceptance_kwargs", "draft_length", "draft_length_kwargs", DRAFTING_FIELD)
        if given is not None:
            field, value = given
            raise invalid_value(
                field, value,
                f"None without assistant_model (the model's default acceptance={rule_name!r} decodes only with a "
                "draft model; without one this is stock transformers decoding, its own prompt lookup included)",
                f"pass assistant_model=<draft model>, or acceptance={rule_name!r} with the call (for prompt-lookup "
                f"drafts verified by the rule), or drop {field}",
            )
        return None, None, None
    return _with_ensemble_weight(rule_name, rule_kwargs, fields)


def _check_loop_arguments(fields: CallFields, rule_name: str, assistant_model, prompt_lookup: PromptLookup | None,
                          custom_generate, synced_gpus, kwargs: dict) -> None:
    """Refuses what the speculative loop cannot honour, before anything runs: no drafter, another loop, synced GPUs,
    and transformers' assisted-generation options that a `custom_generate` loop never sees."""
    if assistant_model is None and prompt_lookup is None:
        raise invalid_value(
            "assistant_model",
            None,
            f"a draft model when acceptance={rule_name!r} is set (or prompt-lookup drafts: prompt_lookup_num_tokens)",
            "pass assistant_model=<draft model>, or prompt_lookup_num_tokens=<tokens per round> to draft from the "
            "context without one, or drop `acceptance` for plain decoding (if this model is the draft of stock "
            "assisted generation, which passes it the target's generation config and rule: detach it with "
            "hf_semspec.detach)",
        )
    if custom_generate is not None:
        raise invalid_value(
            "custom_generate",
            custom_generate,
            "None together with `acceptance` (hf_semspec supplies the decoding loop)",
            "drop one of the two",
        )
    if synced_gpus:
        raise invalid_value("synced_gpus", synced_gpus, "False/None with an acceptance rule", "remove synced_gpus")
    confidence_threshold, _ = fields.chosen("assistant_confidence_threshold", (CALL, PASSED_CONFIG))
    if confidence_threshold is not None:
        # transformers reads this stop from the draft model's generation config only and drops a call's value; here
        # the draft length is the `draft_length` policy's alone, so a value given with the call would do nothing.
        _refuse("assistant_confidence_threshold", confidence_threshold)
    if kwargs.get("assistant_tokenizer") is not None:
        # transformers drops it for a `custom_generate` loop (ours), so a draft with another tokenizer would be
        # verified id by id against the wrong tokens.
        raise invalid_value(
            "assistant_tokenizer",
            type(kwargs["assistant_tokenizer"]).__name__,
            "None with an acceptance rule (universal assisted decoding across tokenizers is not supported; the "
            "draft must share the target's tokenizer)",
            "drop assistant_tokenizer (and use a draft with the target's tokenizer), or drop `acceptance` for "
            "stock universal assisted decoding",
        )
    if kwargs.get("inputs_embeds") is not None:
        raise invalid_value(
            "inputs_embeds", "a tensor", "input_ids only with an acceptance rule", "pass input_ids instead"
        )
    if kwargs.get("position_ids") is not None:
        # The loop derives positions from the attention mask and the cache, for the target and the draft alike.
        raise invalid_value(
            "position_ids", "a tensor", "None with an acceptance rule (positions come from attention_mask: left "
            "padding shifts them)", "remove position_ids; for padding pass attention_mask",
        )


def _stop_strings_as_criteria(
    kwargs: dict, fields: CallFields, generation_config: GenerationConfig | None, stopping_criteria
) -> tuple[StoppingCriteriaList | None, GenerationConfig | None]:
    """The stopping criteria with a `StopStringCriteria` for `stop_strings` (from the call, else the passed or the
    model's generation config), and the generation config to hand transformers (`generation_config`, or a copy);
    pops `tokenizer` from `kwargs`, what the call hands transformers.

    transformers builds that criterion from `generate(tokenizer=...)`, but for a `custom_generate` callable (our
    loop) it drops the tokenizer first, then fails with "could not locate a tokenizer". So the criterion is built
    here, and transformers is handed `stop_strings=None`. As in transformers, a value in the call (None included)
    wins, and a `StopStringCriteria` the user passed replaces the one `stop_strings` would build. `token_healing`
    needs the tokenizer the same way: it is refused.
    """
    tokenizer = kwargs.pop("tokenizer", None)
    token_healing, _ = fields.chosen("token_healing")
    if token_healing:
        _refuse("token_healing", token_healing)
    stop_strings, _ = fields.merged("stop_strings")
    if stop_strings is None:
        return stopping_criteria, generation_config
    criteria = StoppingCriteriaList(stopping_criteria or [])
    if not any(isinstance(c, StopStringCriteria) for c in criteria):
        if tokenizer is None:
            raise invalid_value(
                "tokenizer", None, f"the target's tokenizer with stop_strings={stop_strings!r} (they are matched on "
                "its token strings)", "pass tokenizer=<the target's tokenizer> to generate()",
            )
        criteria.append(StopStringCriteria(tokenizer, stop_strings))
    return criteria, fields.for_transformers("stop_strings", kwargs, generation_config)


def _refuse(name: str, value: Any) -> None:
    """Raises the error `generation_fields.GENERATION_FIELDS` writes for a refused field checked in `generate()`."""
    use = GENERATION_FIELDS[name]
    raise invalid_value(name, value, allowed_text(use), use.fix)


def _checked_prompt_lookup(fields: CallFields) -> PromptLookup | None:
    """Prompt-lookup drafting's settings, `prompt_lookup_num_tokens` (k) and `max_matching_ngram_size` (n, default
    2), read as transformers reads them (`CallFields.merged`) and validated; None when k is unset (with an
    `assistant_model`, they turn on multi-level drafting). An n given with the call or a passed config without k,
    which nothing would read, is refused."""
    num_tokens, num_tokens_field = fields.merged("prompt_lookup_num_tokens")
    ngram_size, ngram_field = fields.merged("max_matching_ngram_size")
    if num_tokens is None:
        given = fields.given("max_matching_ngram_size")
        if given is not None:
            field, value = given
            raise invalid_value(
                field, value, "only together with prompt_lookup_num_tokens (the n-gram size of prompt-lookup drafts)",
                "also pass prompt_lookup_num_tokens=<tokens per round>, or drop "
                "max_matching_ngram_size",
            )
        return None
    return check_prompt_lookup(num_tokens, ngram_size, num_tokens_field, ngram_field)


def _with_ensemble_weight(rule_name: str, rule_kwargs: Any, fields: CallFields) -> tuple[str, Any, float | None]:
    """`(rule name, its options, the weight)` once transformers' `assistant_ensemble_weight` (read as transformers
    merges it: the call, a passed config, the model's) is taken into account. With `acceptance="exact"` it means
    `ensemble` at that weight, as it does in stock assisted generation; with `"ensemble"` it is the rule's weight
    where `acceptance_kwargs` gives none (the same one where both do). With any other rule it is refused: the two
    relaxations do not compose. The weight is None where unset."""
    weight, field = fields.merged("assistant_ensemble_weight")
    if weight is None:
        return rule_name, rule_kwargs, None
    number = python_number(weight)
    if isinstance(number, bool) or not isinstance(number, (int, float)) or not 0 < number < 1:
        raise invalid_value(
            field, weight, "a float in (0, 1): the target's share w of the mixture w·p + (1 − w)·q the drafts are "
            "verified against", "pass e.g. assistant_ensemble_weight=0.5, or None for lossless verification",
        )
    number = float(number)
    if rule_name == "exact":
        RULES.build(rule_name, rule_kwargs)  # `exact` has no options: any given are refused, not dropped
        return "ensemble", {"weight": number}, number
    if rule_name == "ensemble":
        given = (rule_kwargs.get("weight") if isinstance(rule_kwargs, dict)
                 else getattr(rule_kwargs, "weight", None))
        if given is None:
            return rule_name, {**(rule_kwargs or {}), "weight": number}, number
        if python_number(given) == number:
            return rule_name, rule_kwargs, number
        raise invalid_value(
            field, weight, f"the same weight as acceptance_kwargs['weight']={given!r} when both are given",
            "give the weight once: acceptance_kwargs={'weight': w}, or assistant_ensemble_weight=w",
        )
    raise invalid_value(
        field, weight,
        f"None with acceptance={rule_name!r} (transformers' static ensemble verification is a rule of its own, "
        "acceptance='ensemble'; the two relaxations do not compose)",
        f"drop assistant_ensemble_weight to run {rule_name!r}, or pass acceptance='ensemble' (or 'exact', which "
        f"assistant_ensemble_weight turns into 'ensemble', as in transformers) with acceptance_kwargs={{'weight': "
        f"{number}}}",
    )


def _drafts_own_length(assistant_model) -> int | None:
    """The draft's `generation_config.num_assistant_tokens`, where stock assisted generation reads γ: the length a
    policy whose length is unset starts from, before the rule's default. Not a value the caller gave this call, so it
    never conflicts with the policy's own options.

    Checked as the call's is, with an error that says where the value came from: transformers' "heuristic" schedule
    writes it back to the draft, +2 after each fully accepted round of stock assisted generation and without a cap
    (449 after four long calls with an agreeing draft), so it can pass the cap without the user having set it.
    Capping it instead would draft 128 tokens a round without saying so; the call's `num_assistant_tokens` (which
    wins) or a reset of the draft's value is the user's choice to make."""
    value = python_number(_drafts_setting(assistant_model, "num_assistant_tokens"))
    field = "assistant_model.generation_config.num_assistant_tokens"
    grown = (
        " (transformers' num_assistant_tokens_schedule='heuristic' of the draft raises it by 2 after each fully "
        "accepted round of stock assisted generation)"
        if _drafts_setting(assistant_model, "num_assistant_tokens_schedule") == "heuristic" else ""
    )
    return _checked_length(
        field, value, f"pass num_assistant_tokens=<draft tokens per round> with the call (it wins over the draft's "
        f"own), or reset the draft's: {field} = 20 (transformers' default){grown}",
    )


def _drafts_setting(assistant_model, name: str) -> Any:
    """`assistant_model.generation_config.<name>`, or None for a drafter without a generation config (the pruned
    drafters' and duck-typed drafters' may be absent)."""
    return getattr(getattr(assistant_model, "generation_config", None), name, None)


def _checked_length(field: str, value: Any, fix: str = "pass e.g. num_assistant_tokens=5, or leave it unset for "
                                                          "the defaults") -> int | None:
    value = python_number(value)  # numpy's ints too: "4 is not valid: allowed an int" would puzzle
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_DRAFT_TOKENS):
        raise invalid_value(field, value, f"an int in [1, {MAX_DRAFT_TOKENS}] (draft tokens per round)", fix)
    return value


def _length_set_in(options: Any, config_class: type, length_field: str) -> Any:
    """The length `options` set explicitly: a dict's key, or a config instance's field where it differs from the
    field's default (an instance cannot say which fields were given); None where they leave it to the defaults."""
    if isinstance(options, dict):
        return options.get(length_field)
    if isinstance(options, config_class):
        default = next(default_of(f) for f in dataclasses.fields(config_class) if f.name == length_field)
        value = getattr(options, length_field)
        return value if value != default else None
    return None


# transformers' `num_assistant_tokens_schedule` values and the policy each one means.
_SCHEDULE_POLICIES = {"constant": "constant", "heuristic": "heuristic", "heuristic_transient": "heuristic"}


# Policies built from a name that learn across calls (`DraftLengthPolicy.keeps_state_across_calls`): one per target,
# draft, rule with its options and policy with its options, so that a call goes on from what the previous ones
# learned. Why: one call rarely makes enough rounds to learn from. Replayed on the reference pair's `exact` traces
# (128 tokens a prompt, replay-exact-3x128*-per-call.md against *-by-length.md, in git history at ba51d65), `tapout` made
# 1.04 / 1.03 of the best fixed length when every call started afresh and 1.08 / 1.10 going on across prompts;
# `cost_aware` 1.06 / 1.06 against 1.09 / 1.11. transformers' "heuristic" schedule carries its length over to the
# next call too ("heuristic_transient" starts afresh), so its policy is kept the same way (transformers keeps it on
# the draft model alone, whatever the target). A call that finds its policy in use by another call (another thread)
# gets a fresh one, not kept.
# At most _KEPT_PER_MODEL_PAIR per pair of models, the least recently used dropped first: a server that varies the
# options per request (a seed, a threshold) would otherwise keep one policy per value for the models' lifetime.
_KEPT_POLICIES: "weakref.WeakKeyDictionary[torch.nn.Module, weakref.WeakKeyDictionary]" = weakref.WeakKeyDictionary()
_KEPT_PER_MODEL_PAIR = 16
_POLICIES_IN_USE: set[int] = set()  # id() of the policies (kept, or instances passed) that a call is decoding with
_KEPT_POLICIES_LOCK = threading.Lock()


def _options_key(config: Any) -> str:
    return json.dumps(config.all_options(), sort_keys=True, default=str)


def _placement_key(model: torch.nn.Module) -> tuple[str, str]:
    """The dtype and device `model` computes in: a learned round time or draft calibration holds for these only."""
    return str(getattr(model, "dtype", "")), str(getattr(model, "device", ""))


def _kept_policy(model: torch.nn.Module, assistant_model: torch.nn.Module, key: tuple, build) -> DraftLengthPolicy:
    """The policy kept for (`model`, `assistant_model`, `key`), built by `build()` the first time, marked in use
    until `_release`; a fresh, unkept `build()` while another call uses it."""
    with _KEPT_POLICIES_LOCK:
        of_target = _KEPT_POLICIES.setdefault(assistant_model, weakref.WeakKeyDictionary())
        policies = of_target.setdefault(model, {})  # in order of last use
        policy = policies.pop(key, None)
        if policy is None:
            policy = build()
        elif id(policy) in _POLICIES_IN_USE:
            policies[key] = policy
            return build()
        policies[key] = policy
        unused = [k for k, p in policies.items() if id(p) not in _POLICIES_IN_USE and k != key]
        for old_key in unused[: max(0, len(policies) - _KEPT_PER_MODEL_PAIR)]:
            del policies[old_key]
        _POLICIES_IN_USE.add(id(policy))
        return policy


def _release(policy: DraftLengthPolicy) -> None:
    with _KEPT_POLICIES_LOCK:
        _POLICIES_IN_USE.discard(id(policy))


def forget_draft_length_state(assistant_model: torch.nn.Module | None = None) -> None:
    """Drops what draft-length policies built from a name learned across calls (see `DraftLengthPolicy`): for every
    assistant model, or for `assistant_model` only (the target, for its calls with prompt-lookup drafts). The next
    call builds its policy afresh. Policy instances passed as `draft_length=` are the caller's and are not touched."""
    with _KEPT_POLICIES_LOCK:
        if assistant_model is None:
            _KEPT_POLICIES.clear()
        else:
            _KEPT_POLICIES.pop(assistant_model, None)


def _build_draft_length_policy(
    fields: CallFields,
    model: torch.nn.Module,
    assistant_model: torch.nn.Module | None,
    rule: AcceptanceRule,
    prompt_lookup: PromptLookup | None = None,
    drafting: str | None = None,
) -> DraftLengthPolicy:
    """The draft-length policy of this call: `draft_length` (a name, or a policy instance that keeps its state
    across calls), else transformers' `num_assistant_tokens_schedule`, else `constant`. `num_assistant_tokens`
    sets the policy's length field (its fixed, initial or maximum length); unset, with prompt-lookup drafts
    (`prompt_lookup`, no `assistant_model`), a fixed or initial length is k, `prompt_lookup_num_tokens`, which also
    caps every round. A policy that `keeps_state_across_calls`, or the one of transformers' "heuristic" schedule, is
    kept per models (the target alone, and k and n, for prompt lookup), `drafting`, rule and options
    (`_kept_policy`). An instance, or a kept policy, is marked in use: release it after the call."""
    call_name, call_kwargs = fields.call("draft_length"), fields.call("draft_length_kwargs")
    if isinstance(call_name, DraftLengthPolicy):
        if call_kwargs is not None:
            raise invalid_value(
                "draft_length_kwargs", call_kwargs, "None when draft_length is a policy instance", "configure the instance"
            )
        # The instance's own config sets its length; a length passed with it would be ignored. (The model's
        # generation config is not the caller's choice for this call, so it does not count.)
        passed_length, _ = fields.chosen("num_assistant_tokens", (CALL, PASSED_CONFIG))
        if passed_length is not None:
            raise invalid_value(
                "num_assistant_tokens", passed_length, "None when draft_length is a policy instance",
                f"set the length in the instance's config ({type(call_name.config).__name__}"
                + (f"({call_name.length_field}=...)" if call_name.length_field else "") + ")",
            )
        with _KEPT_POLICIES_LOCK:  # a policy keeps the round it is deciding on the instance: one call at a time
            if id(call_name) in _POLICIES_IN_USE:
                raise invalid_value(
                    "draft_length", f"a {type(call_name).__name__} instance that another generate() call is using",
                    "an instance used by one call at a time (two calls would mix their rounds in its state)",
                    "give each thread its own instance, or pass the policy's name (a policy kept by name is never "
                    "shared by two calls at once)",
                )
            _POLICIES_IN_USE.add(id(call_name))
        return call_name
    name, options, source = fields.component(*DRAFT_LENGTH_FIELDS, listing_function=POLICIES.listing_function,
                                             model_orphans_are_errors=True)
    if isinstance(name, DraftLengthPolicy):  # from a config (the call's own instance returned above)
        # A config is saved as JSON, and a policy instance is state, not a setting: it goes with the call.
        where = {"generation_config": "a passed GenerationConfig", "model": "the model's generation_config"}[source]
        raise invalid_value(
            f"draft_length in {where}", f"a {type(name).__name__} instance",
            "a policy name in a GenerationConfig (an instance only as generate(draft_length=...))",
            "pass the instance with the call, generate(..., draft_length=policy), or put its name and options in "
            "the config (draft_length='<name>', draft_length_kwargs={...})",
        )
    schedule, _ = fields.chosen("num_assistant_tokens_schedule", (CALL, PASSED_CONFIG))
    if schedule is None and name is None:  # the model's (else the draft's) schedule, where no policy is named
        schedule, _ = fields.chosen("num_assistant_tokens_schedule", (MODEL,))
        if schedule is None:
            schedule = _drafts_setting(assistant_model, "num_assistant_tokens_schedule")
    if schedule is not None and (schedule not in _SCHEDULE_POLICIES or (name is not None and _SCHEDULE_POLICIES[schedule] != name)):
        raise invalid_value(
            "num_assistant_tokens_schedule",
            schedule,
            f"one of {sorted(_SCHEDULE_POLICIES)}, consistent with draft_length={name!r}",
            "use draft_length=<policy> (hf_semspec.available_draft_length_policies()) instead of the schedule",
        )
    # With draft_length="heuristic" too: the schedule is what says whether the length carries over.
    carried_over_schedule = schedule == "heuristic"
    if name is None:
        name = _SCHEDULE_POLICIES[schedule] if schedule is not None else "constant"
    policy_class = POLICIES.get(name)
    config = policy_class.config_class.from_kwargs(options)
    length_field = policy_class.length_field
    # (Stock transformers reads γ from the *draft's* generation config and ignores the call's; the call wins here,
    # and the draft's is a default only: `_drafts_own_length`.)
    num_assistant_tokens, length_source = fields.chosen("num_assistant_tokens")
    num_assistant_tokens = _checked_length("num_assistant_tokens", num_assistant_tokens)
    if length_field is not None:
        set_by_user = _length_set_in(options, policy_class.config_class, length_field)
        options_source = fields.place_of("draft_length_kwargs", options)
        if num_assistant_tokens is not None and set_by_user is not None and set_by_user != num_assistant_tokens:
            # Two lengths: the more specific source wins (the call, then a passed config, then the model's), as for
            # every other setting; two from the same place contradict each other.
            if options_source == length_source:
                raise invalid_value(
                    f"draft_length_kwargs['{length_field}']",
                    set_by_user,
                    f"the same value as num_assistant_tokens={num_assistant_tokens} when both are given",
                    "give only one of the two",
                )
            if options_source < length_source:
                num_assistant_tokens = None  # the options' own length stands
        if num_assistant_tokens is not None:
            if length_field == "initial_tokens" and num_assistant_tokens > config.max_tokens:
                if options_source >= length_source:
                    raise invalid_value(
                        "num_assistant_tokens",
                        num_assistant_tokens,
                        f"at most draft_length_kwargs['max_tokens']={config.max_tokens} ({name!r} starts at this "
                        "length and never drafts more than max_tokens)",
                        "lower num_assistant_tokens or raise max_tokens",
                    )
                num_assistant_tokens = config.max_tokens  # a cap given more specifically than the length: start at it
            setattr(config, length_field, num_assistant_tokens)
        elif getattr(config, length_field) is None:
            # Unset: the draft's own length (set up for stock assisted generation), or without one prompt lookup's
            # k, else the rule's default.
            own = _drafts_own_length(assistant_model) if assistant_model is not None else (
                prompt_lookup.num_tokens if prompt_lookup is not None else None
            )
            start = own if own is not None else rule.default_num_draft_tokens
            setattr(config, length_field, default_length(config, length_field, start))
        config.validate()
    if policy_class.keeps_state_across_calls or carried_over_schedule:
        key = (name, _options_key(config), rule.name, _options_key(rule.config))
        # Prompt lookup alone has no draft model: its policies are kept on the target, apart from a draft model's;
        # multi-level drafting's apart from the draft model's alone.
        drafter = assistant_model if assistant_model is not None else model
        if prompt_lookup is not None:
            key += ("prompt_lookup", prompt_lookup.num_tokens, prompt_lookup.max_ngram_size)
        if drafting is not None:  # ("auto": rounds of every way, apart from a fixed way's)
            key += ("drafting", drafting)
        if policy_class.keeps_state_across_calls:
            # What they learn (round times, the draft's calibration) changes with the models' dtype or device and with
            # greedy or sampled acceptance; the heuristic schedule's length carries over as transformers carries it.
            key += _placement_key(model) + _placement_key(drafter)
            key += (bool(fields.merged("do_sample")[0]),)  # (as transformers resolves it: None is greedy)
        return _kept_policy(model, drafter, key, lambda: policy_class(config))
    return policy_class(config)


def _vocab_size(model: torch.nn.Module) -> int:
    return model.config.get_text_config().vocab_size


def _check_target(model: Any) -> None:
    if not callable(getattr(type(model), "generate", None)) or not hasattr(model, "generation_config"):
        raise invalid_value(
            "model",
            type(model).__name__,
            "a transformers model with `generate()` (GenerationMixin), e.g. a ...ForCausalLM",
            "pass e.g. AutoModelForCausalLM.from_pretrained(...)",
        )


def _check_models(model: torch.nn.Module, assistant_model: Any, tokenizer: Any = None) -> None:
    """The target and the draft model (None: prompt-lookup drafts, the target alone is checked)."""
    head = getattr(assistant_model, "get_output_embeddings", None)
    is_causal_lm = (
        isinstance(assistant_model, torch.nn.Module)
        and hasattr(assistant_model, "config")
        # A base model (LlamaModel) has no head and returns no logits. (A drafter without the method is taken at
        # its word: the pruned-drafter protocol asks only for a forward that returns logits.)
        and not (callable(head) and head() is None)
    )
    if assistant_model is not None and not is_causal_lm:
        raise invalid_value(
            "assistant_model",
            type(assistant_model).__name__,
            "a transformers causal LM with an LM head (e.g. LlamaForCausalLM, not LlamaModel)",
            "pass e.g. AutoModelForCausalLM.from_pretrained(<draft>)",
        )
    models = (("model", model), ("assistant_model", assistant_model)) if assistant_model is not None else (
        ("model", model),)
    for field, m in models:
        if m.config.is_encoder_decoder:
            raise invalid_value(
                f"{field} (is_encoder_decoder)",
                True,
                "decoder-only models with acceptance rules",
                "use decoder-only causal LMs for target and draft",
            )
        if getattr(m, "_is_stateful", False) or getattr(getattr(m, "model", None), "_is_stateful", False):
            # A recurrent state (Mamba, linear attention: Qwen3-Next, Jamba, ...) cannot be rolled back past rejected
            # drafts: it keeps them. A stateful target would verify from that state, and its output would differ from
            # plain decoding (transformers refuses a stateful target for assisted generation); a stateful draft
            # would propose from it. (`model`: a pruned drafter's backbone.)
            raise invalid_value(
                f"{field} ({type(m).__name__})",
                "a stateful model (recurrent or linear-attention layers)",
                "models whose cache can be rolled back after rejected drafts (attention layers), as for stock "
                "assisted generation",
                "use an attention-only target and draft, or decode without assistant_model (and without "
                "prompt_lookup_num_tokens)",
            )
    if assistant_model is not None:
        _check_vocabularies(model, assistant_model, tokenizer)


def _check_vocabularies(model: torch.nn.Module, assistant_model: Any, tokenizer: Any) -> None:
    """Drafts are verified id by id, so both models must give every id the tokenizer can produce a row. Equal
    `vocab_size`s pass as they are. Sizes that differ pass when they differ by padding only: rows past the tokenizer's
    last id, which no text produces (Qwen2.5-7B's 152064 rows against Qwen2.5-0.5B's 151936, one tokenizer of 151665
    ids). That is read from the `tokenizer` the call passes (`generate(tokenizer=...)`, as transformers takes it for
    stop strings): every id below `len(tokenizer)` must be below both sizes. The loop then compares over the shared
    ids (`ModelDrafter`, `CachedModel.max_input_id`)."""
    target_vocab, draft_vocab = _vocab_size(model), _vocab_size(assistant_model)
    kept = getattr(assistant_model, "kept_token_ids", None)
    if kept is not None and kept.numel() and int(kept.max()) >= target_vocab:
        raise invalid_value(
            "assistant_model.kept_token_ids", f"ids up to {int(kept.max())}",
            f"ids below the target's vocab_size {target_vocab} (the pruned drafter proposes target ids)",
            "prune the drafter from a model whose tokenizer is the target's",
        )
    if target_vocab == draft_vocab or kept is not None:  # (a pruned drafter proposes only its kept ids, checked above)
        return
    if tokenizer is None:
        raise invalid_value(
            "assistant_model (vocab_size)", draft_vocab,
            f"the target's vocab_size {target_vocab}, or a size that differs from it by padding only (rows past the "
            "tokenizer's last id, as Qwen2.5-7B's 152064 against Qwen2.5-0.5B's 151936), which hf_semspec checks "
            "against the tokenizer",
            "pass tokenizer=<the target's tokenizer> to generate() (if it is the draft's too, the sizes differ by "
            "padding only and the pair is accepted), or use a draft that shares the target's tokenizer",
        )
    num_ids = len(tokenizer)
    shared = min(target_vocab, draft_vocab)
    if num_ids > shared:
        smaller, field = (("model", "the target"), ("assistant_model", "the draft"))[draft_vocab < target_vocab]
        missing = list(range(shared, num_ids))
        shown = ", ".join(f"{i} {_token_text(tokenizer, i)}" for i in missing[:5])
        shown += " ..." if len(missing) > 5 else ""
        raise invalid_value(
            f"{smaller} (vocab_size)", shared,
            f"a row for every id of the tokenizer ({num_ids} ids): the ids {shared}..{num_ids - 1} ({shown}) are "
            f"real tokens that {field} has no row for, so the two models do not share a vocabulary (the sizes "
            f"{target_vocab} and {draft_vocab} differ by more than padding)",
            "use a draft that shares the target's tokenizer, or pass the tokenizer both models were trained with",
        )


def _token_text(tokenizer: Any, token_id: int) -> str:
    """`'<the token>'` for an error message, or `''` where the tokenizer cannot say."""
    convert = getattr(tokenizer, "convert_ids_to_tokens", None)
    return repr(convert(token_id)) if callable(convert) else ""


def _check_no_misspelled_field(config: GenerationConfig | None, where: str) -> None:
    """A `GenerationConfig` keeps any unknown key (`acceptence="fly"` in its JSON) as an attribute, which nothing
    reads: decoding would silently go on without the rule. A key that is none of transformers' fields and close to
    one of ours is refused, naming the field it was meant to be."""
    if config is None:
        return
    known = _generation_config_fields()
    for key in vars(config):
        if key in known or key in SEMSPEC_GENERATION_FIELDS or key.startswith("_"):
            continue
        meant = difflib.get_close_matches(key, SEMSPEC_GENERATION_FIELDS, n=1, cutoff=0.8)
        if meant:
            raise invalid_value(
                f"{where}.{key}", getattr(config, key),
                f"one of the fields hf_semspec reads ({', '.join(SEMSPEC_GENERATION_FIELDS)}); {key!r} is none",
                f"rename it to {meant[0]!r}",
            )


@functools.cache
def _generation_config_fields() -> frozenset[str]:
    """The attributes of a default `GenerationConfig`: transformers' own fields."""
    return frozenset(vars(GenerationConfig()))


# True while a call runs in transformers' own `generate()` on hf_semspec's behalf, or on the import-time guard's
# (stock assisted generation): `generate()` calls made inside it (transformers' calls of the draft's `generate()`,
# which carry the target's generation config, rule included, and no assistant_model) are stock transformers, not
# calls a user made. A context variable: each thread (and asyncio task) has its own.
_STOCK_CALL: contextvars.ContextVar[bool] = contextvars.ContextVar("hf_semspec_stock_call", default=False)


@contextlib.contextmanager
def _handing_to_transformers():
    token = _STOCK_CALL.set(True)
    try:
        yield
    finally:
        _STOCK_CALL.reset(token)


def field_that_needs_hf_semspec(
    model: torch.nn.Module, generation_config: GenerationConfig | None, assistant_model: Any, kwargs: dict
) -> str | None:
    """What in a call of transformers' own `generate()` only hf_semspec reads, as `"field=value"`; None where there is
    nothing. `kwargs`: the call's other keyword arguments.

    That is one of our fields given with the call (not None: transformers would refuse it as an unused model kwarg),
    or a rule named by a passed or the model's generation config that `generate()` above would decode with: the
    model's own default decodes only with an `assistant_model` (without one it stays plain decoding, as documented),
    and an explicit `acceptance=None` in the call turns any default off."""
    for field in SEMSPEC_GENERATION_FIELDS:
        if kwargs.get(field) is not None:
            return f"{field}={kwargs[field]!r}"
    if "acceptance" in kwargs:  # acceptance=None: no rule for this call
        return None
    passed = getattr(generation_config, "acceptance", None)
    own = getattr(model.generation_config, "acceptance", None)
    if passed is not None and (passed, getattr(generation_config, "acceptance_kwargs", None)) != (
        own, getattr(model.generation_config, "acceptance_kwargs", None)
    ):
        return f"generation_config.acceptance={passed!r}"
    name = passed if passed is not None else own
    if name is not None and assistant_model is not None:
        return f"model.generation_config.acceptance={name!r} (with assistant_model)"
    return None


# `generate(acceptance=...)`'s default: an explicit `acceptance=None` turns the model's default rule off for the call,
# as an explicit None in a transformers call overrides the model's generation config.
_NOT_GIVEN: Any = type("NotGiven", (), {"__repr__": lambda self: "<not given>"})()


def generate(
    model: torch.nn.Module,
    inputs: torch.Tensor | None = None,
    generation_config: GenerationConfig | None = None,
    logits_processor=None,
    stopping_criteria=None,
    prefix_allowed_tokens_fn=None,
    synced_gpus: bool | None = None,
    assistant_model: torch.nn.Module | None = None,
    streamer=None,
    negative_prompt_ids: torch.Tensor | None = None,
    negative_prompt_attention_mask: torch.Tensor | None = None,
    custom_generate=None,
    acceptance: str | None = _NOT_GIVEN,
    acceptance_kwargs: dict | None = None,
    draft_length: str | DraftLengthPolicy | None = None,
    draft_length_kwargs: dict | None = None,
    drafting: str | None = _NOT_GIVEN,
    **kwargs,
):
    r"""transformers' `generate()`, plus speculative decoding with a choice of acceptance rule.

    With `acceptance` (here, or as a field of `generation_config` or of `model.generation_config`) and an
    `assistant_model`, or `prompt_lookup_num_tokens` instead of one, decoding runs hf_semspec's speculative loop;
    otherwise this is stock transformers `generate()`, unchanged. A default `acceptance` saved in the model's
    generation config is ignored (with stock decoding, its prompt lookup included) when no `assistant_model` is given.

    Args:
        model (`PreTrainedModel`): the target model.
        assistant_model (`PreTrainedModel`, *optional*): the draft model, with the target's tokenizer; its vocabulary
            size may differ from the target's by padding only (rows past the tokenizer's last id), checked with
            `tokenizer`. None for prompt-lookup drafts alone (`prompt_lookup_num_tokens`).
        prompt_lookup_num_tokens (`int`, *optional*, in kwargs): without `assistant_model`, draft by prompt lookup: up
            to this many tokens per round (k, in [1, 128]) copied from after an earlier occurrence of the context's
            last n-gram, as transformers' prompt lookup decoding finds them (`hf_semspec.ngram`), verified by the
            rule; every rule but `"rdk"`. With an `assistant_model`, multi-level drafting: the draft model confirms
            up to k looked-up candidates per forward, drafting what it drafts alone in fewer forwards
            (`hf_semspec.drafting.ModelDrafter`). Read as transformers reads it: the call, else a passed, else the
            model's generation config.
        max_matching_ngram_size (`int`, *optional*, in kwargs): n, the longest n-gram searched for (≥ 1; default 2, as
            transformers'); only with `prompt_lookup_num_tokens`.
        tokenizer (`PreTrainedTokenizerBase`, *optional*, in kwargs): the target's tokenizer, as transformers takes
            it: needed for `stop_strings`, and to pair models whose vocabulary sizes differ by padding.
        acceptance (`str`, *optional*): the verification rule, one of `hf_semspec.available_rules()`, e.g.
            `"exact"` (lossless), `"fly"`, `"ears"`, `"dropmatch"`, `"ensemble"` (transformers'
            `assistant_ensemble_weight`, which with `"exact"` selects it), `"rdk"` (pruned-vocabulary drafters). An
            explicit `None` turns a default rule (of a passed or the model's generation config) off for this call:
            stock `generate()`, as an explicit `None` overrides a generation config in transformers.
        acceptance_kwargs (`dict`, *optional*): options of the rule (its config dataclass), validated before
            decoding starts.
        draft_length (`str` or `DraftLengthPolicy`, *optional*): how many tokens to draft per round, one of
            `hf_semspec.available_draft_length_policies()` (default `"constant"`), or a policy instance, which
            keeps what it learned across the calls it is passed to. A policy that learns, given by name, is kept for
            the next call with the same models (dtypes and devices), rule, options and decoding mode
            (`forget_draft_length_state()` drops it). With a rule other than `"exact"`, or with sampling, where
            rounds end changes the text; docs/draft-length.md lists the policies whose text repeats.
        draft_length_kwargs (`dict`, *optional*): options of the policy, validated before decoding starts.
        drafting (`str`, *optional*): `"auto"`: with `assistant_model`, draft the cheapest way on this machine, chosen
            in the call's first rounds from measured costs (the draft's one-token and (1 + k)-wide forwards, the
            target's verify forward, kept per process for the pair) and the lookup hits seen so far: the draft alone,
            multi-level drafting, or (with `"exact"`) prompt lookup alone (`hf_semspec.drafting_choice`). Greedy,
            each gives the draft alone's text. With `prompt_lookup_num_tokens` (and `max_matching_ngram_size`) it
            uses that lookup, else k = 6, n = 4. The statistics say what it chose and why
            (`acceptance_stats.drafting`, `drafting_reason`). None: the drafting `assistant_model` and
            `prompt_lookup_num_tokens` select. Read from the call (an explicit None included, which turns a
            config's "auto" off), else a passed, else the model's generation config; None where none sets it.
        num_assistant_tokens (`int`, *optional*, in kwargs): the policy's length (the fixed γ for `"constant"`),
            else from the passed or the target's generation config; default: the draft's generation config's (as
            stock transformers reads it), or with prompt lookup `prompt_lookup_num_tokens` (which caps every round
            anyway), else the rule's `default_num_draft_tokens`, for a fixed or initial length;
            the policy's own cap for one that stops per token (`svip`, `adaedl`, `cost_aware`). Not with a policy
            instance, whose config sets it.
        All other arguments: as `transformers.GenerationMixin.generate`.

    Returns:
        `torch.LongTensor` of shape `(1, length)`, or, with `return_dict_in_generate=True`, a
        `SpeculativeDecoderOnlyOutput` whose `acceptance_stats` holds the round statistics.
    """
    stock_arguments = dict(
        inputs=inputs,
        generation_config=generation_config,
        logits_processor=logits_processor,
        stopping_criteria=stopping_criteria,
        prefix_allowed_tokens_fn=prefix_allowed_tokens_fn,
        synced_gpus=synced_gpus,
        streamer=streamer,
        negative_prompt_ids=negative_prompt_ids,
        negative_prompt_attention_mask=negative_prompt_attention_mask,
    )
    _check_target(model)
    for where, config in (("generation_config", generation_config), ("model.generation_config", model.generation_config)):
        _check_no_misspelled_field(config, where)
    # The class's method, bypassing the instance override made by attach(); called inside `_handing_to_transformers`,
    # which the import-time guard and `enable()` read as "stock transformers from here on" (hf_semspec.enabling).
    stock_generate = type(model).generate

    # 1. Resolve: every field of the call, from the call, a passed config and the model's, read from here on.
    # (`acceptance` and `drafting` may be given as None, which turns a config's value off; the others' None is unset)
    given = {"acceptance": acceptance, "acceptance_kwargs": acceptance_kwargs, "draft_length": draft_length,
             "draft_length_kwargs": draft_length_kwargs, DRAFTING_FIELD: drafting}
    fields = CallFields(model.generation_config, generation_config, {
        **kwargs, **{name: value for name, value in given.items()
                     if value is not _NOT_GIVEN and (value is not None or name in ("acceptance", DRAFTING_FIELD))},
    })

    # 2. Which rule: none (or the model's default without a draft model) is stock transformers, unchanged.
    rule_name, rule_kwargs, ensemble_weight = _speculative_rule(fields, assistant_model)
    if rule_name is None:
        with _handing_to_transformers():
            return stock_generate(
                model, assistant_model=assistant_model, custom_generate=custom_generate, **stock_arguments, **kwargs
            )

    # 3. Check and build everything before transformers prepares the inputs; hand it None for what the loop reads.
    prompt_lookup = _checked_prompt_lookup(fields)
    _check_loop_arguments(fields, rule_name, assistant_model, prompt_lookup, custom_generate, synced_gpus, kwargs)
    tokenizer = kwargs.get("tokenizer")  # (popped here: transformers drops it for our loop)
    handed_config = generation_config
    stock_arguments["stopping_criteria"], handed_config = _stop_strings_as_criteria(
        kwargs, fields, handed_config, stopping_criteria
    )
    if ensemble_weight is not None:  # read into the rule: transformers' own use of it is not what runs
        handed_config = fields.for_transformers("assistant_ensemble_weight", kwargs, handed_config)
    rule = RULES.build(rule_name, rule_kwargs)
    _check_models(model, assistant_model, tokenizer)
    rule.check_target_model(model)
    rule.check_assistant_model(assistant_model)  # (None: prompt-lookup drafts)
    if prompt_lookup is not None:
        # Set, the field makes transformers choose its own assisted generation (`get_generation_mode`), whose checks
        # refuse `num_return_sequences > 1`, though the loop it runs is ours (which has read k and n already).
        handed_config = fields.for_transformers("prompt_lookup_num_tokens", kwargs, handed_config)
    stock_arguments["generation_config"] = handed_config
    drafting, drafting_field = fields.merged(DRAFTING_FIELD)
    drafting = check_drafting(drafting, drafting_field)
    prompt_lookup = auto_lookup(drafting, assistant_model, prompt_lookup, drafting_field)
    policy = _build_draft_length_policy(fields, model, assistant_model, rule, prompt_lookup, drafting)

    # 4. transformers prepares config, processors, criteria, lengths and the target's cache, then runs our loop.
    try:  # from the first statement after the policy was marked in use: an interrupt anywhere later releases it
        decoding_loop = functools.partial(
            speculative_decode,
            assistant_model=assistant_model,
            rule=rule,
            draft_length=policy,
            streamer=streamer,
            prompt_lookup=prompt_lookup,
            drafting=drafting,
        )
        with _handing_to_transformers():
            return stock_generate(model, custom_generate=decoding_loop, **stock_arguments, **kwargs)
    except BaseException:
        # transformers streamed the prompt before the loop's own checks ran: a consumer waiting in another thread
        # (`TextIteratorStreamer` without a timeout) would wait forever for an end. The error goes on to the caller.
        if streamer is not None:
            streamer.end()
        raise
    finally:
        _release(policy)  # a kept policy is free for the next call (a no-op for any other)


def _saved_generation_config(model: torch.nn.Module) -> dict | None:
    """The generation_config.json the model was loaded from (local folder or the local Hub cache; no download)."""
    source = getattr(model, "name_or_path", "") or ""
    if not source:
        return None
    if os.path.isdir(source):
        path = os.path.join(source, "generation_config.json")
        path = path if os.path.isfile(path) else None
    else:
        cached = try_to_load_from_cache(source, "generation_config.json")
        path = cached if isinstance(cached, str) else None
    if path is None:
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def restore_saved_generation_fields(model: torch.nn.Module) -> list[str]:
    """Puts back our fields that transformers dropped on load; returns the names restored.

    `save_pretrained` writes `"_from_model_config": true` for a generation config derived from the model config,
    and loading such a file drops every custom key, `acceptance` included.
    """
    saved = _saved_generation_config(model)
    if not saved:
        return []
    restored = [
        field
        for field in SEMSPEC_GENERATION_FIELDS
        if field in saved and getattr(model.generation_config, field, None) is None
    ]
    for field in restored:
        setattr(model.generation_config, field, saved[field])
    if restored:
        mark_as_user_config(model.generation_config)
    return restored


def set_default_acceptance(model: torch.nn.Module, acceptance: str, acceptance_kwargs: Any = None) -> None:
    """Stores `acceptance` (validated) in `model.generation_config`, so that `save_pretrained` keeps it.
    `acceptance_kwargs`: a dict of the rule's options, or its config instance (stored as a dict, for the JSON)."""
    _store_default_acceptance(model, acceptance, _validated_acceptance_kwargs(acceptance, acceptance_kwargs))


def _validated_acceptance_kwargs(acceptance: str, acceptance_kwargs: Any) -> dict:
    """Builds the rule once, which validates both fields, and returns the options as the JSON stores them."""
    rule = RULES.build(acceptance, acceptance_kwargs)
    if isinstance(acceptance_kwargs, type(rule.config)):
        return acceptance_kwargs.to_dict()
    # The given keys, with the validated config's values: numpy numbers become Python's, which the JSON can hold.
    return {key: copy.deepcopy(getattr(rule.config, key)) for key in (acceptance_kwargs or {})}


def _store_default_acceptance(model: torch.nn.Module, acceptance: str, stored_kwargs: dict) -> None:
    model.generation_config.acceptance = acceptance
    model.generation_config.acceptance_kwargs = stored_kwargs
    mark_as_user_config(model.generation_config)


def attach(model: torch.nn.Module, *, acceptance: str | None = None, acceptance_kwargs: Any = None):
    """Installs hf_semspec's `generate` on this one model instance and returns the model.

    No transformers class is patched: other instances keep stock `generate`, and `detach(model)` undoes this.
    Fields that transformers dropped from the model's saved generation config are restored, and `acceptance` /
    `acceptance_kwargs` (a dict, or the rule's config), if given, become the model's defaults (saved by
    `save_pretrained`). They are validated first: a model given bad ones is left as it was.
    """
    _check_target(model)
    if acceptance is not None:
        stored_kwargs = _validated_acceptance_kwargs(acceptance, acceptance_kwargs)
    elif acceptance_kwargs is not None:
        raise invalid_value(
            "acceptance_kwargs", acceptance_kwargs, "only together with `acceptance`", "also pass acceptance=..."
        )
    model.generate = _AttachedGenerate(model)
    restored = restore_saved_generation_fields(model)
    if restored:
        logger.info("Restored %s from the saved generation config of %s", restored, model.name_or_path)
    if acceptance is not None:
        _store_default_acceptance(model, acceptance, stored_kwargs)
    elif is_derived_from_model_config(model.generation_config) and any(
        getattr(model.generation_config, f, None) is not None for f in SEMSPEC_GENERATION_FIELDS
    ):
        mark_as_user_config(model.generation_config)  # fields set by hand before attach() must survive a save
    return model


class _AttachedGenerate:
    """`generate` bound to one model, as `attach` installs it on the instance.

    Not a bound method: pickle (torch.save, multiprocessing) stores a bound method as a lookup of `model.generate`,
    which on load runs before the instance's attributes are back and finds the class's stock `generate`; this pickles
    (and deep-copies) as "bind to the copied model" instead. Not a `functools.partial` holding the model either: the
    model holds it in its `__dict__`, a reference cycle, so `del model` would free nothing (GPU memory included)
    until the garbage collector's next full pass. So `attach` installs one that holds its model by a weak reference.

    A copy holds its model strongly where nothing else may: a pickle of this method alone (sent to another process)
    brings back a model that only the method refers to. A deep copy of the whole model is told apart (`memo`) and
    stays weak; a pickled whole model cannot be told apart from the method alone when it is loaded, so it comes back
    with the strong form: a cycle, freed by the garbage collector rather than at `del`.
    """

    __signature__ = inspect.Signature(list(inspect.signature(generate).parameters.values())[1:])  # without `model`

    def __init__(self, model: torch.nn.Module, *, hold_strongly: bool = False):
        self._model = weakref.ref(model)
        self._strong = model if hold_strongly else None
        for name in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(self, name, getattr(generate, name))

    @property
    def model(self) -> torch.nn.Module:
        model = self._model()
        if model is None:
            raise ReferenceError(
                "this `generate` was attached to a model that has since been deleted (a shallow copy, copy.copy(model), "
                "shares the original's `generate`). Fix: call `generate` on a model you hold; for a copy use "
                "copy.deepcopy(model), or hf_semspec.attach(the copy)."
            )
        return model

    def __call__(self, *args, **kwargs):
        return generate(self.model, *args, **kwargs)

    def __reduce__(self):
        return (_AttachedGenerate._held_strongly, (self.model,))

    @staticmethod
    def _held_strongly(model: torch.nn.Module) -> "_AttachedGenerate":
        return _AttachedGenerate(model, hold_strongly=True)

    def __deepcopy__(self, memo: dict) -> "_AttachedGenerate":
        model = self.model
        if id(model) in memo:  # copied with its model (copy.deepcopy(model)): the copy owns it
            return _AttachedGenerate(memo[id(model)])
        copied_model = copy.deepcopy(model, memo)
        # The model's own `generate` was this method: copying its `__dict__` made the copy of this one already (one
        # object, as pickle keeps it), bound weakly; it is what holds the copied model here, so strongly.
        copied = memo.get(id(self)) or _AttachedGenerate(copied_model)
        copied._strong = copied_model
        return copied

    def __repr__(self) -> str:
        model = self._model()
        return f"<hf_semspec generate of {type(model).__name__ if model is not None else 'a deleted model'}>"


def _is_attached(model: torch.nn.Module) -> bool:
    # (not bound to this model in a shallow copy, which shares the original's: detach removes it there too)
    return isinstance(vars(model).get("generate"), _AttachedGenerate)


def detach(model: torch.nn.Module):
    """Removes what `attach` installed; the model's `generate` is stock transformers again."""
    if _is_attached(model):
        del model.generate
    return model
