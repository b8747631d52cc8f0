"""The speculative decoding loop.

`speculative_decode` is handed to transformers' `generate(custom_generate=...)`, so transformers has already done
what every decoding method shares — merged the generation config, built the logits processors and stopping
criteria, set `max_length`, created the target's cache and streamed the prompt — and this module only runs rounds:

    1. draft γ tokens with the draft model and its own KV cache, or, without one, by prompt lookup (copied from the
       context: `hf_semspec.ngram`); γ from the draft-length policy;
    2. run the target once over the tokens it has not seen plus the γ drafts (γ + 1 logits);
    3. apply the logits processors position by position;
    4. verify with the acceptance rule (a pure function of logits and ids);
    5. one host sync: the accepted count and the emitted tokens, cut at EOS, at `max_length` and where another
       stopping criterion fires (each checked after each token, as plain decoding does); the draft-length policy
       learns from the round;
    6. append, stream, roll the caches back to the output (the last token is not cached yet);
    7. record outputs and decide whether to stop.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch.profiler import record_function
from transformers import (
    CompileConfig,
    DynamicCache,
    GenerationConfig,
    LogitsProcessorList,
    StaticCache,
    StoppingCriteriaList,
)
from transformers.generation import (
    EosTokenCriteria,
    GenerateDecoderOnlyOutput,
    MaxLengthCriteria,
)

from ._transformers_compat import (
    CACHE_ARGUMENT,
    compiles_forward,
    compiling_off_gpus,
    pad_token_id,
    passed_mask_length,
    stop_past_recording,
)
from .batch import DecodingBatch
from .draft_length import DraftLengthPolicy, RoundOutcome
from .draft_length.base import UNSET_LENGTH_FALLBACK
from .draft_block import DraftBlock
from .drafting import ModelDrafter, greedy_steps
from .errors import invalid_value
from .generation_fields import allowed_text, refused_value
from .model_calls import CachedModel, capture_lm_head_input
from .drafting_choice import AUTO, DRAFT, LOOKUP, MULTI_LEVEL, AutoDrafter, auto_lookup, check_drafting, costs_for
from .ngram import NgramDrafter, PromptLookup, RowContexts, check_prompt_lookup
from .processors import BatchProcessors
from .rules.base import AcceptanceRule, VerificationInput, VerificationResult
from .stats import AcceptanceStats


# Keys of `model_kwargs` that the loop manages itself (transformers prepared them for one-token-per-step decoding).
_MANAGED_MODEL_KWARGS = (CACHE_ARGUMENT, "attention_mask", "position_ids", "use_cache", "logits_to_keep")


@dataclass
class SpeculativeDecoderOnlyOutput(GenerateDecoderOnlyOutput):
    """`GenerateDecoderOnlyOutput` plus the round statistics.

    Args:
        acceptance_stats (`AcceptanceStats`): drafted/accepted counts, target forwards, mean accepted length and
            per-position acceptance of this call (all rows: one target forward per round verifies every row).
        acceptance_stats_per_row (`list[AcceptanceStats]`): the same for each row (input order), its target
            forwards the rounds it took part in.
    """

    acceptance_stats: AcceptanceStats | None = None
    acceptance_stats_per_row: list[AcceptanceStats] | None = None


def check_generation_config(generation_config: GenerationConfig, input_ids: torch.LongTensor, rule: AcceptanceRule):
    """Rejects what the speculative loop does not support, before any forward pass: every field that
    `generation_fields.GENERATION_FIELDS` limits (other decoding methods, outputs the loop does not make, caches it
    cannot roll back), the prompt's length and the rule's decoding mode."""
    refused = refused_value(generation_config)
    if refused is not None:
        name, value, use = refused
        raise invalid_value(name, value, allowed_text(use), use.fix)
    if input_ids.shape[1] == 0:
        raise invalid_value("input_ids.shape[1] (prompt length)", 0, "at least 1 token", "pass a non-empty prompt")
    rule.check_decoding_mode(bool(generation_config.do_sample))


def _is_stock(criterion: Any, kind: type) -> bool:
    """`criterion` is a `kind` that decides as `kind` does: a subclass with its own `__call__` is called like any
    other criterion, not reduced to its EOS ids or length."""
    return isinstance(criterion, kind) and type(criterion).__call__ is kind.__call__


def _split_stopping_criteria(
    stopping_criteria: StoppingCriteriaList, max_length: int
) -> tuple[set[int], int, StoppingCriteriaList]:
    """EOS ids (handled on the host from the emitted tokens), the length to stop at, and the criteria that must be
    called on the sequence.

    `MaxLengthCriteria` is enforced by capping γ and cutting the emitted tokens, so it needs no call: the length is
    that of the `MaxLengthCriteria` in the list (the smallest, if several), else `max_length`. transformers adds one
    for `max_length`, or keeps a user's instead, which then wins whether it is shorter or longer.
    """
    eos_ids: set[int] = set()
    lengths: list[int] = []
    others = StoppingCriteriaList()
    for criterion in stopping_criteria:
        if _is_stock(criterion, EosTokenCriteria):
            eos_ids.update(criterion.eos_token_id.flatten().tolist())
        elif _is_stock(criterion, MaxLengthCriteria):
            lengths.append(criterion.max_length)
        else:
            others.append(criterion)
    return eos_ids, min(lengths) if lengths else max_length, others


def _first_stop(
    criteria: StoppingCriteriaList, prefix: torch.LongTensor, new_tokens: torch.LongTensor, scores: tuple | None,
    processed: torch.FloatTensor | None,
) -> int | None:
    """The first `i` such that `criteria` fire on `prefix` followed by `new_tokens[:, : i + 1]`, or None.

    Plain decoding calls the criteria after every token, so a criterion that reads the end of the sequence (a stop
    string, "the last token is X") must see each prefix, not only the round's last one. `scores` is what plain
    decoding passes: the processed scores so far when they are recorded (`processed`: this round's), else None.
    """
    if len(criteria) == 0:
        return None
    for i in range(new_tokens.shape[1]):
        so_far = None if scores is None else scores + tuple(processed[:, j] for j in range(i + 1))
        if bool(criteria(torch.cat([prefix, new_tokens[:, : i + 1]], dim=1), so_far).all()):
            return i
    return None


def _unmanaged_forward_kwargs(model_kwargs: dict) -> dict:
    extra = {k: v for k, v in model_kwargs.items() if k not in _MANAGED_MODEL_KWARGS and v is not None}
    tensors = sorted(k for k, v in extra.items() if isinstance(v, torch.Tensor))
    if tensors:
        raise invalid_value(
            f"model kwargs {tensors}",
            "tensors",
            "no per-token model inputs besides input_ids and attention_mask with an acceptance rule",
            f"remove {tensors} from the generate() call",
        )
    return extra


@record_function("hf_semspec.target_forward")
def _target_forward(
    target: CachedModel, batch: DecodingBatch, end: int, num_logits: int, capture_hidden: bool, **forward_kwargs
) -> tuple[torch.FloatTensor, torch.FloatTensor | None]:
    """Target logits `(batch, num_logits, vocab)` on the batch's device, and the LM-head input at the same positions
    when `capture_hidden`."""
    model = target.model
    with capture_lm_head_input(model) if capture_hidden else nullcontext([]) as captured:
        logits = target.forward(batch, end, num_logits, **forward_kwargs).to(batch.device)
    if capture_hidden and (not captured or captured[0] is None):
        # A forward that never called get_output_embeddings() (it computes its logits another way).
        raise invalid_value(
            "model", type(model).__name__,
            "a target whose forward computes its logits with get_output_embeddings() (the rule reads that module's "
            "input)",
            "use an acceptance rule that does not read the target's hidden states (e.g. 'exact' or 'fly')",
        )
    hidden = captured[0][:, -num_logits:].to(batch.device) if capture_hidden else None
    return logits, hidden


@dataclass
class _RowRecord:
    """What the host keeps of one row across rounds: its statistics, its scores when recorded, its output."""

    stats: AcceptanceStats
    scores: list
    logits: list
    sequence: torch.LongTensor | None = None  # set when the row finishes


def _step_outputs(per_row: list[list[torch.Tensor]]) -> tuple[torch.FloatTensor, ...]:
    """Per generated token, `(batch, vocab)`: row r's scores of its i-th new token; zeros for a row that had already
    finished (plain batched decoding records the scores of the padding it appends there)."""
    steps = max(len(row) for row in per_row)
    template = next(row[0] for row in per_row if row)
    return tuple(
        torch.stack([row[i] if i < len(row) else torch.zeros_like(template) for row in per_row]) for i in range(steps)
    )


def cpu_compile_config(**options) -> CompileConfig:
    """A `CompileConfig` under which `generate()` compiles on a CPU: transformers compiles the forward on static
    caches on GPU-like devices only, unless told otherwise (`_transformers_compat.compiling_off_gpus`). Pass it as
    `generate(..., cache_implementation="static", compile_config=hf_semspec.cpu_compile_config())`: it compiles plain
    decoding (transformers' own loop) and every speculative path as on a GPU (docs/gpu.md).

    Args:
        options: `CompileConfig` fields; defaults: inductor (`backend="inductor"`) with no `mode` (a CPU has no
            CUDA graphs, which transformers' default mode, `"reduce-overhead"`, asks for), `fullgraph=True` (a graph
            break would hand the step back to Python per layer) and `dynamic=False` (one graph per shape: a static
            cache keeps its shape; pass `max_cache_len` to `generate()` to keep one cache, and its graphs, across
            prompts of different lengths).

    Inductor's freezing (`torch._inductor.config.freezing = True`, or `options={"freezing": True}`) is refused
    (`check_no_freezing`): it folds the static caches into the graph (docs/cpu.md).
    """
    config = compiling_off_gpus(CompileConfig(**{"backend": "inductor", "mode": None, "fullgraph": True,
                                                 "dynamic": False, **options}))
    check_no_freezing(config)
    return config


def check_no_freezing(compile_config: CompileConfig | None) -> None:
    """Refuses inductor's freezing where `generate()` compiles a static cache's forward. Freezing treats the tensors
    a graph was compiled with as constants, and a static cache's tensors are among them: on a tiny Llama the second
    call, with another prompt length, decoded other tokens than eager decoding and the third failed (an index out of
    bounds in the cache's write); the reference pair's second call failed the same way (docs/cpu.md). Checked where
    the loop compiles and in `cpu_compile_config()`; transformers' own compiled plain decoding is not checked."""
    config = compile_config if compile_config is not None else CompileConfig()
    if config.backend != "inductor":
        return
    options = config.options or {}
    import torch._inductor.config as inductor_config

    field = "compile_config.options['freezing']" if "freezing" in options else "torch._inductor.config.freezing"
    if options.get("freezing", inductor_config.freezing):
        raise invalid_value(
            field, True,
            "False when generate() compiles a static cache's forward (freezing folds the cache's tensors into the "
            "graph: a later call decodes wrong tokens or fails)",
            "set torch._inductor.config.freezing = False and drop options={'freezing': True}, or drop compile_config",
        )


def compiled_forward(model: torch.nn.Module, compile_config) -> Callable:
    """`model`'s forward compiled as transformers compiles it for `generate()` (`get_compiled_call`, kept on the model
    across calls); a model without that method (a pruned drafter) gets the same `torch.compile` of its `__call__`,
    kept here per model and config."""
    if hasattr(model, "get_compiled_call"):
        return model.get_compiled_call(compile_config)
    config = compile_config if compile_config is not None else CompileConfig()
    key = repr(config.to_dict())
    kept = _COMPILED_FORWARDS.setdefault(model, {})
    if key not in kept:
        kept[key] = torch.compile(model.__call__, **config.to_dict())
    return kept[key]


_COMPILED_FORWARDS: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()


def compiled_round(compile_config) -> Callable:
    """`drafting.greedy_steps` (a round's γ greedy draft steps) compiled with `compile_config`: one compiled function,
    whose graphs are one per draft model and γ."""
    return _compiled_function(greedy_steps, compile_config)


def verification_tensors(rule: AcceptanceRule, draft_token_ids: torch.LongTensor,
                         target_logits: torch.FloatTensor, draft_probs: torch.FloatTensor | None = None) -> tuple:
    """`rule.verify` of a greedy round with no per-row limit, from tensors to tensors (`num_accepted`, `next_token`,
    `accepted`, `num_matched`), for `torch.compile` to make one graph of the rule's verification: every rule's
    `verify` is tensor work with no host read. `draft_probs`: q, for a rule that reads it when greedy (`ensemble`)."""
    result = rule.verify(VerificationInput(draft_token_ids=draft_token_ids, target_logits=target_logits,
                                           draft_probs=draft_probs))
    return result.num_accepted, result.next_token, result.accepted, result.num_matched


def compiled_verification(compile_config) -> Callable:
    """`verification_tensors` compiled with `compile_config`: one compiled function, whose graphs are one per rule,
    its options and the round's shapes."""
    return _compiled_function(verification_tensors, compile_config)


def _compiled_function(function: Callable, compile_config) -> Callable:
    """`function` compiled with `compile_config` (transformers' default where None), kept per function and config."""
    config = compile_config if compile_config is not None else CompileConfig()
    key = (function.__name__, repr(config.to_dict()))
    if key not in _COMPILED_FUNCTIONS:
        _COMPILED_FUNCTIONS[key] = torch.compile(function, **config.to_dict())
    return _COMPILED_FUNCTIONS[key]


_COMPILED_FUNCTIONS: dict[tuple[str, str], Callable] = {}


def round_budget(wanted: int, room: int, free_slots: int | None, holes: bool) -> int:
    """The drafts a round may make: what the policy `wanted`, less than the `room` (tokens) the row with the most
    left may still add (a round adds up to γ + 1), and, on static caches, within their `free_slots` (`None`: dynamic
    caches, which grow to fit the round, so only the policy and the room cap it). A batch on static caches (`holes`)
    also keeps a slot for each further round the slowest row may need: a round takes up to γ + 1 slots but may give
    a row a single token, so after this round's γ + 1 slots the slowest row's `room − 1` further tokens may take
    `room − 1` rounds of one slot each (the verify forward of a round writes the slot before its first draft: the
    last of them writes the caches' last slot when γ = free_slots − room + 1)."""
    budget = min(wanted, room - 1)
    if free_slots is not None:
        budget = min(budget, free_slots)
        if holes:
            budget = min(budget, free_slots - room + 1)
    return max(0, budget)


def _prompt_lookup(generation_config: GenerationConfig, assistant_model, given: PromptLookup | None
                   ) -> PromptLookup | None:
    """The prompt-lookup settings the loop drafts with (alone without `assistant_model`, through it with one:
    multi-level drafting), or None: `given` (what `generate()` resolved; it wins), else the generation config's
    `prompt_lookup_num_tokens` and `max_matching_ngram_size` (a direct call of `speculative_decode`), validated
    (`check_prompt_lookup`). Neither a draft model nor prompt lookup is an error."""
    if given is not None:
        return check_prompt_lookup(given.num_tokens, given.max_ngram_size)
    if generation_config.prompt_lookup_num_tokens is not None:
        return check_prompt_lookup(generation_config.prompt_lookup_num_tokens,
                                   generation_config.max_matching_ngram_size)
    if assistant_model is None:
        raise invalid_value(
            "assistant_model", None, "a draft model, or prompt-lookup drafts (prompt_lookup_num_tokens)",
            "pass assistant_model=<draft model>, or prompt_lookup_num_tokens=<tokens per round>",
        )
    return None


def _has_sliding_layers(cache) -> bool:
    return any(getattr(layer, "is_sliding", False) for layer in cache.layers)


def _stated_length(policy: DraftLengthPolicy) -> int:
    """The length a policy's config names: its fixed, initial or largest γ (`UNSET_LENGTH_FALLBACK` where it names
    none)."""
    value = getattr(policy.config, policy.length_field, None) if policy.length_field else None
    return value if isinstance(value, int) else UNSET_LENGTH_FALLBACK


def _typical_length(policy: DraftLengthPolicy) -> int:
    """The policy's stated length at most 16: what a batch's static caches are sized for (longer rounds still fit
    while room is left, the loop's budget keeps them within it), and the γ of the compiled verify forward's one
    shape."""
    return min(_stated_length(policy), 16)


def _compiled_gamma(policy: DraftLengthPolicy) -> int | None:
    """The γ of the compiled draft round and the compiled verification: the policy's stated length where it is at
    most 16 and the policy decides once per round; None otherwise: a per-token policy's rounds end at any length, and
    a longer policy's rounds never have this one but in the call's last rounds, which would compile the graphs
    there."""
    value = _stated_length(policy)
    return None if policy.decides_per_token or value > 16 else value


def _static_caches(model, assistant_model, target_cache, generation_config, input_ids: torch.LongTensor,
                   max_length: int, typical_length: int, capture_hidden: bool):
    """The target's and the draft's static caches and the two compiled forwards (or None), for
    `cache_implementation="static"`; without `assistant_model` (prompt-lookup drafts) the draft's are None.

    One prompt keeps the cache transformers made (the output's length). A batch needs more slots than tokens: a row
    that accepted fewer drafts than the best row of a round keeps holes (`DecodingBatch`). Each round takes at most
    γ + 1 slots and gives every row at least one token, so `width + new_tokens · (γ + 1)` slots, with γ the
    policy's typical length (`_typical_length`), are room for rounds of that length; the loop's budget keeps longer
    ones within them, leaving a slot for each token the slowest row may still need.

    The forwards are compiled where transformers' `generate()` would compile the target's (`compile_config`,
    `disable_compile`, a GPU or `compile_config._compile_all_devices`; `compiles_forward`), each model judged on its
    own device. A rule that reads the target's hidden states (a forward hook) keeps the target's forward eager.

    A target split over several devices (tensor parallelism: `DTensor` parameters) has its forward compiled with
    `dynamic=False`, one graph per verify shape: torch (2.13) fails to trace a `DTensor` forward once it turns a
    shape symbolic ("unhashable type: non-nested SymInt" in the sharded embedding), which it does when the verify
    forward's γ + 1 changes between rounds."""
    if _has_sliding_layers(target_cache):
        raise invalid_value(
            "cache_implementation", "static",
            "'static' for models without sliding-window layers (a static sliding layer cannot be rolled back)",
            "pass cache_implementation='dynamic'",
        )
    batch_size, width = input_ids.shape
    if batch_size == 1:
        capacity = target_cache.get_max_length()
        if max_length - 1 > capacity:  # the last token is never fed to the caches
            raise invalid_value(
                "stopping_criteria", f"MaxLengthCriteria(max_length={max_length})",
                f"a max_length within the static cache's {capacity} slots, which transformers sizes from "
                "generation_config.max_length",
                f"pass max_length={max_length} (or max_new_tokens) instead of the criterion, or "
                "cache_implementation='dynamic'",
            )
    else:
        capacity = width + (max_length - width) * (typical_length + 1)
        target_cache = StaticCache(config=model.config, max_cache_len=capacity)
    draft_cache = None
    if assistant_model is not None:
        # `typical_length` slots more than the batch's: a compiled round cut short near the end still runs its γ steps
        draft_cache = StaticCache(config=assistant_model.config, max_cache_len=capacity + typical_length)
        if _has_sliding_layers(draft_cache):
            raise invalid_value(
                "assistant_model", type(assistant_model).__name__,
                "a draft without sliding-window layers with cache_implementation='static'",
                "pass cache_implementation='dynamic'",
            )
    compile_config = generation_config.compile_config
    target_compiles = not capture_hidden and compiles_forward(model, target_cache, generation_config)
    draft_compiles = assistant_model is not None and compiles_forward(assistant_model, draft_cache, generation_config)
    if target_compiles or draft_compiles:
        check_no_freezing(compile_config)  # (before anything compiles)
    compiled_target = None
    if target_compiles:
        target_compile_config = compile_config
        if torch.distributed.is_available():
            import copy

            from torch.distributed.tensor import DTensor

            if any(isinstance(parameter, DTensor) for parameter in model.parameters()):
                target_compile_config = copy.copy(compile_config or CompileConfig())  # keeps `_compile_all_devices`
                target_compile_config.dynamic = False
        compiled_target = compiled_forward(model, target_compile_config)
    compiled_draft = compiled_forward(assistant_model, compile_config) if draft_compiles else None
    return capacity, target_cache, draft_cache, compiled_target, compiled_draft


def speculative_decode(
    model: torch.nn.Module,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    *,
    assistant_model: torch.nn.Module | None,
    rule: AcceptanceRule,
    draft_length: DraftLengthPolicy,
    streamer=None,
    prompt_lookup: PromptLookup | None = None,
    drafting: str | None = None,
    **model_kwargs,
) -> SpeculativeDecoderOnlyOutput | torch.LongTensor:
    """Speculative decoding of `model` (the target) with `assistant_model` (the draft), or with prompt-lookup drafts
    (`hf_semspec.ngram`), and an acceptance `rule`.

    Args:
        input_ids (`torch.LongTensor` of shape `(batch, prompt_length)`): the prompts, left-padded (`attention_mask`
            in `model_kwargs`); with `num_return_sequences`, already repeated by transformers.
        logits_processor / stopping_criteria / generation_config: as prepared by `GenerationMixin.generate`.
        assistant_model (`PreTrainedModel`, *optional*): the draft model; None for prompt-lookup drafts.
        rule (`AcceptanceRule`): decides which drafts are kept (`acceptance=`).
        draft_length (`DraftLengthPolicy`): decides how many tokens to draft per round (`draft_length=`), one length
            for all rows; it learns from each round once (`_round_outcome`).
        streamer (`BaseStreamer`, *optional*): receives each round's new tokens.
        prompt_lookup (`PromptLookup`, *optional*): prompt-lookup drafting's k and n, as `generate()` resolved them
            (it hands transformers `prompt_lookup_num_tokens=None`, which would otherwise select transformers' own
            assisted generation); without it, and without `assistant_model`, they are read from `generation_config`
            (`prompt_lookup_num_tokens`, `max_matching_ngram_size`).
        drafting (`str`, *optional*): `"auto"`: with `assistant_model`, the cheapest of the draft alone, multi-level
            drafting and (with a lossless rule) prompt lookup alone, chosen from measured costs in the first rounds
            (`hf_semspec.drafting_choice`), with `prompt_lookup`'s k and n, else `drafting_choice.DEFAULT_LOOKUP`'s.
            None: the drafting `assistant_model` and `prompt_lookup` select.
        model_kwargs: the target's cache (`cache`, or `past_key_values` before transformers 5.24), `attention_mask`,
            and non-tensor forward options.

    Returns:
        `SpeculativeDecoderOnlyOutput` if `generation_config.return_dict_in_generate`, else the sequences
        `torch.LongTensor` of shape `(batch, total_length)`, rows that ended early padded with the pad token.
    """
    # 0. Set-up: transformers prepared the target's cache and the mask; the loop owns the draft's cache.
    loop = _set_up(model, input_ids, logits_processor, stopping_criteria, generation_config, assistant_model, rule,
                   draft_length, streamer, model_kwargs, prompt_lookup, drafting)
    first_round = True  # its forwards also prefill the prompt
    while loop.batch.rows and _decode_round(loop, draft_length, streamer, first_round):
        first_round = False
    if streamer is not None:
        streamer.end()
    loop.records.note_drafting(loop.models.drafter)
    return loop.records.outputs(generation_config, loop.models, loop.stops)


def _decode_round(loop: "_Loop", draft_length: DraftLengthPolicy, streamer, first_round: bool) -> bool:
    """One round, steps 1–7 of the module docstring. False where a static cache's rows have all finished (they stay
    in the batch, masked); on dynamic caches finished rows leave, and the loop ends with `batch.rows` empty."""
    batch, models, stops = loop.batch, loop.models, loop.stops
    target, drafter, static = models.target, models.drafter, models.static
    round_start = time.perf_counter()

    # 1. Draft γ tokens: up to the policy's budget, capped because a round emits at most γ + 1 tokens and the row
    #    with the most room left must stay within max_length (and, on static caches, within their slots); dynamic
    #    buffers grow first. A per-token policy may stop earlier.
    wanted = draft_length.max_tokens()
    budget = round_budget(wanted, batch.room(stops.max_length),
                          batch.slot_capacity - batch.num_slots if static else None, holes=static and batch.size > 1)
    # (A multi-level step writes its candidates within the budget on dynamic caches; on static ones its block is
    # always k wide and may pass the budget: within the caches' slots, which the step checks, and in the token
    # layout, which keeps k more.)
    batch.reserve(batch.num_slots + budget)
    batch.reserve_tokens(max(batch.lengths) + budget + 1 + (drafter.extra_slots if static else 0))
    draft = drafter.draft(batch, budget, draft_length, cut_short=budget < wanted)
    gamma = draft.num_tokens

    # 2. One target forward over the unseen slots and the drafts: logits for the γ + 1 verified positions.
    target_logits, hidden = _target_forward(
        target, batch, batch.num_slots + gamma, gamma + 1, models.capture_hidden, **models.forward_kwargs
    )

    # 3. Logits processors, each position seeing the prefix it extends (as in plain decoding).
    with record_function("hf_semspec.logits_processors"):
        processed = loop.verifier.processors(batch, target_logits, 0)

    # 4. Verify, each row as it would be alone (its own γ where max_length is nearer for it than for the batch).
    inputs = loop.verifier.inputs(draft, processed, hidden, batch, stops.max_length)
    with record_function("hf_semspec.verify"):
        result = loop.verifier.verify(inputs)

    # 5. The round's one host sync: accepted counts, next tokens and drafts of every row (and the drafts that passed
    #    the rule's own test, when the rule has a deferred window); each row is cut at EOS, max_length and other
    #    stopping criteria (`_settle_row`), then the policy learns from the round.
    matched = [] if result.num_matched is None else [result.num_matched]
    with record_function("hf_semspec.sync"):  # (on a GPU: where the host waits for the round's device work)
        synced = torch.cat([result.num_accepted, result.next_token, *matched, draft.tokens.flatten()]).tolist()
    size = batch.size
    accepted, next_tokens = synced[:size], synced[size : 2 * size]
    num_matched = synced[2 * size : 3 * size] if matched else [None] * size
    drafted = synced[(2 + len(matched)) * size :]
    seconds = time.perf_counter() - round_start
    kept, finished, outcomes = [0] * size, [], []
    for i in (i for i in range(size) if batch.decoding[i]):
        emitted = drafted[i * gamma : i * gamma + accepted[i]] + [next_tokens[i]]
        kept[i], ends, outcome = _settle_row(
            loop, i, emitted, accepted[i], num_matched[i], inputs.draft_limits, draft, result.next_token, processed,
            target_logits,
        )
        drafter.append_tokens(batch.rows[i], emitted[: kept[i]])  # (prompt lookup's copy of the row's context)
        outcomes.append(outcome)
        if ends:
            finished.append(i)
    draft_length.observe(_round_outcome(outcomes, seconds, first_round))

    # 6. Append, stream, and roll both caches back to the slots the rows still need: through each row's accepted
    #    drafts (the others' rejected ones become holes), but the last token, which is not cached yet (a finished
    #    single row: its output but the last token, what a continuation from the returned cache expects).
    batch.commit(result.num_accepted, result.next_token, accepted, kept)
    if streamer is not None:
        streamer.put(batch.prefix(0, 0)[:, -kept[0]:].cpu())
    target.rewind(batch.lengths[0] - 1 if size == 1 and finished else batch.num_slots - 1)

    # 7. Finished rows leave (with a static cache they stay, masked, for its fixed shape).
    for i in finished:
        loop.records.rows[batch.rows[i]].sequence = batch.prefix(i, 0)[0].clone()
        if static:
            batch.finish(i)
    if static:
        return any(batch.decoding)
    if finished:
        index = batch.keep_rows([i for i in range(size) if i not in finished])
        if batch.rows:
            target.keep_rows(index)
            drafter.keep_rows(index)
    return True


def _settle_row(loop: "_Loop", i: int, emitted: list[int], accepted: int, num_matched: int | None,
                draft_limits: tuple[int, ...] | None, draft: DraftBlock, next_token: torch.LongTensor,
                processed: torch.FloatTensor, target_logits: torch.FloatTensor) -> tuple[int, bool, RoundOutcome]:
    """Step 5 for row `i` (an index into the current rows), which accepted `accepted` of the round's γ drafts
    (`draft`; of its `draft_limits[i]`, where given) and would add `emitted` (those drafts and its next token): the
    tokens it keeps, cut at its first EOS, at `max_length` and where another stopping criterion fires (checked after
    each token, as plain decoding does); whether it finishes; and its round for the draft-length policy. Records its
    statistics (the drafts it could use, as alone, the draft model's forwards of the round, and whether its prompt
    lookup found drafts it could use) and, when returned, its scores.
    """
    batch, stops, records = loop.batch, loop.stops, loop.records
    gamma = draft.num_tokens
    usable = gamma if draft_limits is None else draft_limits[i]
    length = batch.lengths[i]
    # At least one token, as plain decoding appends one before it checks a user's MaxLengthCriteria (which
    # transformers lets set a max_length at or below the prompt's length).
    keep = max(1, min(len(emitted), stops.max_length - length))
    eos_at = next((j for j, token in enumerate(emitted[:keep]) if token in stops.eos_ids), None)
    if eos_at is not None:
        keep = eos_at + 1
    record = records.rows[batch.rows[i]]
    stop_at = None
    if stops.called:  # (calling them is the user's cost, only when given)
        new_tokens = torch.cat([draft.tokens[i : i + 1, :accepted], next_token[i : i + 1, None]], dim=1)
        stop_at = _first_stop(
            stops.called, batch.prefix(i, 0), new_tokens[:, :keep],
            _scores_so_far(record) if records.keep_scores else None, processed[i : i + 1],
        )
    if stop_at is not None:
        keep = stop_at + 1
    ends = eos_at is not None or stop_at is not None or length + keep >= stops.max_length
    record.stats.record_round(usable, accepted, keep, num_draft_forwards=draft.num_forwards,
                              ngram_hit=draft.num_per_row is not None and usable > 0,
                              num_ngram_drafts=sum(draft.from_ngram[:usable]) if draft.from_ngram else 0)
    if records.keep_scores:
        record.scores.extend(processed[i, :keep])
    if records.keep_logits:
        record.logits.extend(target_logits[i, :keep])
    # The policy learns from what the round delivered: drafts after an EOS or a stop are not output, so they do not
    # count as accepted, even where the target agrees with them, and a round cut among its accepted drafts saw no
    # rejection (`cut`: its tokens are `keep`, not accepted + 1).
    outcome = RoundOutcome(
        usable, min(accepted, keep), 0.0,
        num_matched=None if num_matched is None else min(num_matched, keep), cut=keep <= accepted,
    )
    return keep, ends, outcome


def _round_outcome(rows: list[RoundOutcome], seconds: float, first_round: bool) -> RoundOutcome:
    """The one outcome a round reports to the draft-length policy: that of its median row.

    A round is one step for the policy, however many rows it verified, so that B identical rows take the rounds one
    row takes. Its outcome is the row with the lower median accepted drafts among the rows still decoding (with that
    row's drafts, `num_matched` and `cut`: near `max_length` a row may use fewer than `gamma`, its `draft_limits`):
    a real row's round, which one row that met its EOS or a far-off prompt does not swing as a mean would. `seconds`
    is the round's, for all its rows.
    """
    median = sorted(rows, key=lambda outcome: outcome.num_accepted)[(len(rows) - 1) // 2]
    return RoundOutcome(median.num_drafted, median.num_accepted, seconds, includes_prefill=first_round,
                        num_matched=median.num_matched, cut=median.cut)


# The state the set-up prepares and the rounds share, one small dataclass per concern.


@dataclass
class _Models:
    """The models as the rounds call them: the target's cached (maybe compiled) forward and its cache, the drafter
    (the draft model's, prompt lookup's, or "auto"'s choice between them), and the forward's other inputs."""

    target: CachedModel
    drafter: ModelDrafter | NgramDrafter | AutoDrafter
    target_cache: Any
    static: bool
    capture_hidden: bool  # the rule reads the target's hidden states (the LM head's input)
    forward_kwargs: dict


@dataclass
class _Verifier:
    """Steps 3 and 4: the logits processors, and the rule's verification, compiled (`compiled_verification`) where
    the loop compiles the target's forward, for greedy rounds of `verification_gamma` drafts; None: the rule's own
    `verify`, eager."""

    rule: AcceptanceRule
    processors: BatchProcessors
    do_sample: bool
    lm_head: torch.nn.Module | None
    verification: Callable | None = None
    verification_gamma: int | None = None

    def inputs(self, draft: DraftBlock, processed: torch.FloatTensor, hidden: torch.FloatTensor | None,
               batch: DecodingBatch, max_length: int) -> VerificationInput:
        """The rule's inputs for this round. A row whose `max_length` is nearer than the batch's longest row's (whose
        room set γ) may use only the drafts it would have made alone (`draft_limit`), so that its text, and the
        draws of a rule that keeps state per row (`row_ids`), are the ones it gets alone. A row whose prompt lookup
        found fewer drafts than γ (`draft.num_per_row`) is likewise verified on its own drafts only: the padding
        after them is never accepted, and the position after its last draft gives its bonus token."""
        gamma = draft.num_tokens
        found = draft.num_per_row if draft.num_per_row is not None else (gamma,) * batch.size
        limits = [min(gamma, own, max(0, max_length - length - 1)) for length, own in zip(batch.lengths, found)]
        short = any(limit < gamma for limit, decoding in zip(limits, batch.decoding) if decoding)
        return VerificationInput(
            draft_token_ids=draft.tokens,
            target_logits=processed,
            draft_probs=draft.probs,
            target_hidden_states=hidden,
            lm_head_weight=None if self.lm_head is None else self.lm_head.weight,
            lm_head_bias=None if self.lm_head is None else getattr(self.lm_head, "bias", None),
            do_sample=self.do_sample,
            draft_limits=tuple(limits) if short else None,
            row_ids=tuple(batch.rows),
        )

    def verify(self, inputs: VerificationInput) -> VerificationResult:
        """Step 4: `rule.verify(inputs)`, in one call of the compiled verification where the loop has one (greedy,
        the target's forward compiled, a rule that `compiles_verification`: not one that reads hidden states, whose
        target stays eager) and the round has its γ with no per-row limit (a row near its `max_length`, a lookup
        that found fewer drafts); other rounds, near the end of a call or at a policy's other lengths, verify
        eagerly (no graph compiled mid-call)."""
        rule = self.rule
        if (self.verification is None or inputs.draft_limits is not None
                or inputs.num_draft_tokens != self.verification_gamma):
            return rule.verify(inputs)
        probs = inputs.draft_probs if rule.requires_draft_probs else None  # (greedy: only a rule that reads q)
        return VerificationResult(*self.verification(rule, inputs.draft_token_ids, inputs.target_logits, probs))


@dataclass
class _Stops:
    """When a row ends: at one of `eos_ids`, at `max_length`, or where one of the `called` criteria (neither EOS nor
    a length: a stop string, a user's criterion) fires on a prefix."""

    max_length: int
    eos_ids: set[int]
    called: StoppingCriteriaList


@dataclass
class _Records:
    """The host's records of each row, in the caller's order: statistics, the scores and logits `generate()`
    returns (`keep_scores`, `keep_logits`), and the output once the row finishes."""

    rows: list[_RowRecord]
    keep_scores: bool
    keep_logits: bool

    def note_drafting(self, drafter) -> None:
        """With `drafting="auto"`, what each row drafted with and why, in its statistics."""
        if isinstance(drafter, AutoDrafter):
            reason = drafter.explained()
            for row, record in enumerate(self.rows):
                record.stats.drafting, record.stats.drafting_reason = drafter.drafting_of(row), reason

    def outputs(self, generation_config: GenerationConfig, models: _Models, stops: _Stops
                ) -> SpeculativeDecoderOnlyOutput | torch.LongTensor:
        """What `generate()` returns: the sequences, right-padded as transformers pads rows that ended early, and
        with `return_dict_in_generate` the scores, logits, cache and statistics."""
        if not models.static:
            stop_past_recording(models.target_cache)
        records = self.rows
        sequences = _padded(
            [record.sequence for record in records],
            pad_token_id(generation_config, fallback=min(stops.eos_ids, default=0)),
        )
        if not generation_config.return_dict_in_generate:
            return sequences
        return SpeculativeDecoderOnlyOutput(
            sequences=sequences,
            scores=_step_outputs([r.scores for r in records]) if self.keep_scores else None,
            logits=_step_outputs([r.logits for r in records]) if self.keep_logits else None,
            # With several rows the caches hold holes and rows that left: nothing a continuation could use.
            **{CACHE_ARGUMENT: models.target_cache if len(records) == 1 else None},
            acceptance_stats=AcceptanceStats.of_batch([record.stats for record in records]),
            acceptance_stats_per_row=[record.stats for record in records],
        )


@dataclass
class _Loop:
    """What the set-up (step 0) prepares for the rounds: the batch, and one part per concern."""

    batch: DecodingBatch
    models: _Models
    verifier: _Verifier
    stops: _Stops
    records: _Records


def _set_up(model, input_ids, logits_processor, stopping_criteria, generation_config, assistant_model,
            rule: AcceptanceRule, draft_length: DraftLengthPolicy, streamer, model_kwargs: dict,
            prompt_lookup: PromptLookup | None = None, drafting: str | None = None) -> _Loop:
    """Step 0: checks what the loop cannot run, then builds the caches (static ones for
    `cache_implementation="static"`), the batch, the models' cached forwards and the drafter (`_drafter`)."""
    check_generation_config(generation_config, input_ids, rule)
    auto = check_drafting(drafting) == AUTO
    # ("auto" without a draft model is refused by `auto_lookup`, before `_prompt_lookup` could ask for one)
    given = None if auto and assistant_model is None else _prompt_lookup(generation_config, assistant_model,
                                                                         prompt_lookup)
    prompt_lookup = auto_lookup(drafting, assistant_model, given)
    if prompt_lookup is not None and assistant_model is None:
        rule.check_assistant_model(None)  # a rule that needs a draft model's distribution (rdk) says so
    batch_size = input_ids.shape[0]
    target_cache = model_kwargs[CACHE_ARGUMENT]
    static = generation_config.cache_implementation == "static"
    if not static and not isinstance(target_cache, DynamicCache):  # a static or quantized cache passed by the user
        raise invalid_value(
            CACHE_ARGUMENT, type(target_cache).__name__,
            "a DynamicCache, which can be rolled back after rejections (or none: generate() creates one; "
            "cache_implementation='static' for a static one)",
            f"pass {CACHE_ARGUMENT}=DynamicCache(...) or leave it out",
        )
    attention_mask = model_kwargs.get("attention_mask")
    cached = 0 if static else target_cache.get_seq_length()
    _check_continuation(generation_config, input_ids, attention_mask, cached)
    if streamer is not None and batch_size != 1:
        raise invalid_value(
            "streamer", type(streamer).__name__, "None with several prompts (a streamer follows one sequence)",
            "drop the streamer, or call generate() once per prompt",
        )
    forward_kwargs = _unmanaged_forward_kwargs(model_kwargs)
    do_sample = bool(generation_config.do_sample)
    eos_ids, max_length, called_stopping_criteria = _split_stopping_criteria(
        stopping_criteria, generation_config.max_length
    )
    capture_hidden = rule.requires_target_hidden_states
    typical_length, compiled_gamma = _typical_length(draft_length), _compiled_gamma(draft_length)
    if static:
        capacity, target_cache, draft_cache, compiled_target, compiled_draft = _static_caches(
            model, assistant_model, target_cache, generation_config, input_ids, max_length,
            typical_length, capture_hidden,
        )
    else:
        target_cache.activate_past_recording()  # sliding-window / linear-attention layers must roll back
        capacity, draft_cache, compiled_target, compiled_draft = input_ids.shape[1] + 64, None, None, None
    processors = BatchProcessors(logits_processor, batch_size)
    # A compiled verify forward has one shape: γ + 1 slots at the policy's length (shorter rounds, near max_length or
    # with a policy that varies γ, re-feed cached slots to keep it; longer ones compile their own).
    verify_width = typical_length + 1 if compiled_target is not None else None
    target = CachedModel(model, target_cache, compiled=compiled_target, static=static, min_width=verify_width)
    target.cached = cached
    drafter, drafting = _drafter(
        model, assistant_model, rule, input_ids, attention_mask, prompt_lookup, processors, frozenset(eos_ids),
        do_sample=do_sample, static=static, auto=auto, draft_cache=draft_cache, compiled_draft=compiled_draft,
        compile_config=generation_config.compile_config, compiled_gamma=compiled_gamma, typical_length=typical_length,
    )
    if batch_size != 1 and not static:  # (static caches with sliding layers were refused above)
        caches = [("model", target_cache)]
        if assistant_model is not None:
            caches.append(("assistant_model", drafter.cache))
        for field, cache in caches:
            if _has_sliding_layers(cache):
                raise invalid_value(
                    "input_ids.shape[0] (batch size)", batch_size,
                    f"1 when {field} has sliding-window layers (a batch keeps rejected drafts in the caches as "
                    "masked slots, which a sliding window would count against its width)",
                    "call generate() once per prompt",
                )
    draft_length.set_deferred_window(rule.deferred_window)
    return_dict = generation_config.return_dict_in_generate
    return _Loop(
        batch=DecodingBatch(input_ids, attention_mask, capacity, max_length + 1, grow=not static,
                            max_position=max_length - 1),
        models=_Models(target=target, drafter=drafter, target_cache=target_cache, static=static,
                       capture_hidden=capture_hidden, forward_kwargs=forward_kwargs),
        verifier=_Verifier(
            rule=rule, processors=processors, do_sample=do_sample,
            lm_head=model.get_output_embeddings() if capture_hidden else None,
            # (greedy only: sampled, inductor would draw other numbers than the eager path with the same seed)
            verification=compiled_verification(generation_config.compile_config) if (
                compiled_target is not None and not do_sample and rule.compiles_verification
                and compiled_gamma is not None
            ) else None,
            verification_gamma=compiled_gamma,
        ),
        stops=_Stops(max_length=max_length, eos_ids=eos_ids, called=called_stopping_criteria),
        records=_Records(
            rows=[_RowRecord(AcceptanceStats(acceptance=rule.name, acceptance_kwargs=rule.config.all_options(),
                                             drafting=drafting), [], []) for _ in range(batch_size)],
            keep_scores=bool(return_dict and generation_config.output_scores),
            keep_logits=bool(return_dict and generation_config.output_logits),
        ),
    )


def _drafter(model, assistant_model, rule: AcceptanceRule, input_ids: torch.LongTensor, attention_mask,
             prompt_lookup: PromptLookup | None, processors: BatchProcessors, stop_token_ids: frozenset[int], *,
             do_sample: bool, static: bool, auto: bool, draft_cache, compiled_draft, compile_config,
             compiled_gamma: int | None, typical_length: int) -> tuple[Any, str | None]:
    """The drafter and the drafting it reports (`drafting_choice`'s names; None with "auto" until it chooses): the
    draft model's (`ModelDrafter`, with prompt lookup's candidates for multi-level drafting), prompt lookup's alone
    without one (`NgramDrafter`), or with `auto` the two and the choice between them (`AutoDrafter`)."""
    vocab_size = model.config.get_text_config().vocab_size
    return_probs = do_sample or rule.requires_draft_probs
    # Prompt lookup alone: without a draft model, or as one of "auto"'s ways where the rule verifies lookup's drafts
    # as it verifies the draft model's (lossless: the same text; a lossy rule accepts other drafts).
    lookup_drafter = None
    if prompt_lookup is not None and (assistant_model is None or (
            auto and rule.lossless and not rule.redistributes_draft)):
        lookup_drafter = NgramDrafter(
            input_ids, attention_mask, prompt_lookup, return_probs=return_probs, vocab_size=vocab_size,
            output_device=input_ids.device, stop_token_ids=stop_token_ids, fixed_length=static,
        )
    if assistant_model is None:
        return lookup_drafter, LOOKUP
    drafter = ModelDrafter(
        assistant_model,
        processors,
        do_sample=do_sample and not rule.greedy_drafts,
        return_probs=return_probs,
        output_device=input_ids.device,
        vocab_size=vocab_size,
        redistribute=rule.redistributes_draft,
        stop_token_ids=stop_token_ids,
        cache=draft_cache,
        compiled=compiled_draft,
        contexts=None if prompt_lookup is None else RowContexts(
            input_ids, attention_mask, prompt_lookup, stop_token_ids=stop_token_ids
        ),
        # (the drafter uses it where its rounds allow: greedy drafts, no processors, no q kept, no lookup)
        compiled_round=None if compiled_draft is None else compiled_round(compile_config),
        round_width=compiled_gamma,
    )
    if not auto:
        return drafter, MULTI_LEVEL if prompt_lookup is not None else DRAFT
    costs = costs_for(model, assistant_model, prompt_lookup, static, compiled=compiled_draft is not None,
                      batch_size=input_ids.shape[0], gamma=typical_length)
    return AutoDrafter(drafter, lookup_drafter, costs, input_ids.device, leaves_lookup=not static), None


def _check_continuation(generation_config: GenerationConfig, input_ids: torch.LongTensor,
                        attention_mask: torch.LongTensor | None, cached: int) -> None:
    """A call that continues from a returned cache (`cached` tokens) must pass the whole sequence, one prompt."""
    mask_length = passed_mask_length(generation_config, attention_mask, input_ids.shape[1])
    if not cached and mask_length == input_ids.shape[1]:
        return
    # transformers can restart from a cache with only the new ids and a full mask; the loop (and the draft, which
    # fills its own cache from the ids) needs the whole sequence, as a continuation from a returned cache has.
    if cached >= input_ids.shape[1] or mask_length != input_ids.shape[1]:
        raise invalid_value(
            "input_ids",
            f"{input_ids.shape[1]} tokens with a {CACHE_ARGUMENT} of {cached} and an attention_mask of {mask_length}",
            "the whole sequence with an acceptance rule: the tokens the cache holds, then at least one more, and a "
            "mask of the same length",
            f"pass input_ids=torch.cat([out.sequences, new_ids], dim=1) with its full mask (a {CACHE_ARGUMENT} "
            "returned by generate() holds all of out.sequences but the last token)",
        )
    if input_ids.shape[0] != 1:
        raise invalid_value(
            CACHE_ARGUMENT, f"a cache of {cached} tokens", "none with several prompts",
            "continue one prompt at a time from a returned cache",
        )


def _scores_so_far(record: _RowRecord) -> tuple:
    return tuple(score[None] for score in record.scores)


def _padded(sequences: list[torch.LongTensor], pad_token_id: int) -> torch.LongTensor:
    """The rows, right-padded to the longest with `pad_token_id`, as transformers pads rows that finished early."""
    length = max(s.shape[0] for s in sequences)
    out = sequences[0].new_full((len(sequences), length), pad_token_id)
    for row, sequence in enumerate(sequences):
        out[row, : sequence.shape[0]] = sequence
    return out
