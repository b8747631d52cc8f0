"""The speculative decoding loop.

`speculative_decode` is handed to transformers' `generate(custom_generate=...)`, so transformers has already done
what every decoding method shares — merged the generation config, built the logits processors and stopping
criteria, set `max_length`, created the target's cache and streamed the prompt — and this module only runs rounds:

    1. draft γ tokens with the draft model and its own KV cache (γ from the draft-length policy);
    2. run the target once over the tokens it has not seen plus the γ drafts (γ + 1 logits);
    3. apply the logits processors position by position;
    4. verify with the acceptance rule (a pure function of logits and ids);
    5. one host sync: the accepted count and the emitted tokens, cut at EOS, at `max_length` and where another
       stopping criterion fires (each checked after each token, as plain decoding does); the draft-length policy
       learns from the round;
    6. append, stream, roll both caches back to the output (the last token is not cached yet);
    7. record outputs and decide whether to stop.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch.profiler import record_function
from transformers import DynamicCache, GenerationConfig, LogitsProcessorList, StoppingCriteriaList
from transformers.generation import (
    EosTokenCriteria,
    GenerateDecoderOnlyOutput,
    MaxLengthCriteria,
    SynthIDTextWatermarkLogitsProcessor,
)

from ._transformers_compat import CACHE_ARGUMENT, passed_mask_length, stop_past_recording
from .draft_length import DraftLengthPolicy, RoundOutcome
from .drafting import ModelDrafter
from .errors import invalid_value
from .model_calls import accepts_forward_argument, capture_lm_head_input, forward_new_tokens
from .rules.base import AcceptanceRule, VerificationInput
from .stats import AcceptanceStats

# Keys of `model_kwargs` that the loop manages itself (transformers prepared them for one-token-per-step decoding).
_MANAGED_MODEL_KWARGS = (CACHE_ARGUMENT, "attention_mask", "position_ids", "use_cache", "logits_to_keep")


@dataclass
class SpeculativeDecoderOnlyOutput(GenerateDecoderOnlyOutput):
    """`GenerateDecoderOnlyOutput` plus the round statistics.

    Args:
        acceptance_stats (`AcceptanceStats`): drafted/accepted counts, target forwards, mean accepted length and
            per-position acceptance of this call.
    """

    acceptance_stats: AcceptanceStats | None = None


def check_generation_config(generation_config: GenerationConfig, input_ids: torch.LongTensor, rule: AcceptanceRule):
    """Rejects what the speculative loop does not support, before any forward pass."""
    unsupported = {
        "num_beams": (generation_config.num_beams, 1, "beam search is not speculative; remove num_beams"),
        "num_return_sequences": (
            generation_config.num_return_sequences,
            1,
            "call generate() once per sequence, or drop assistant_model for plain sampling",
        ),
        "output_attentions": (generation_config.output_attentions, False, "remove output_attentions=True"),
        "output_hidden_states": (generation_config.output_hidden_states, False, "remove output_hidden_states=True"),
        "use_cache": (generation_config.use_cache, True, "speculative decoding needs the KV cache: use_cache=True"),
    }
    for field, (value, supported, fix) in unsupported.items():
        if value not in (None, supported):
            raise invalid_value(field, value, f"{supported!r} with an acceptance rule", fix)
    if generation_config.guidance_scale not in (None, 1, 1.0):
        raise invalid_value(
            "guidance_scale",
            generation_config.guidance_scale,
            "None or 1 with an acceptance rule (classifier-free guidance re-runs the model one token at a time)",
            "remove guidance_scale, or drop assistant_model",
        )
    # Other decoding methods, which transformers would run, and ignores once a decoding loop is passed to it.
    other_methods = {
        "penalty_alpha": "contrastive search",
        "dola_layers": "DoLa decoding",
        "prompt_lookup_num_tokens": "prompt-lookup drafting (the drafts here are assistant_model's)",
        "assistant_early_exit": "early-exit self-drafting (the drafts here are assistant_model's)",
        "use_mtp": "multi-token-prediction drafting (the drafts here are assistant_model's)",
    }
    for field, method in other_methods.items():
        value = getattr(generation_config, field, None)
        if value is not None and value is not False:  # use_mtp=False asks for nothing
            raise invalid_value(field, value, f"None with an acceptance rule ({method} is another decoding method)",
                                f"remove {field}, or drop assistant_model and acceptance for {method.split(' (')[0]}")
    if getattr(generation_config, "prefill_chunk_size", None) is not None:
        raise invalid_value(
            "prefill_chunk_size",
            generation_config.prefill_chunk_size,
            "None with an acceptance rule (the loop prefills the prompt in one forward of each model)",
            "remove prefill_chunk_size, or drop assistant_model and acceptance for chunked prefill",
        )
    if generation_config.cache_implementation not in (None, "dynamic"):
        raise invalid_value(
            "cache_implementation",
            generation_config.cache_implementation,
            "None or 'dynamic' (a DynamicCache, which can be rolled back after rejections)",
            "remove cache_implementation, or pass cache_implementation='dynamic' with the call where a generation "
            "config sets it",
        )
    if input_ids.shape[0] != 1:
        raise invalid_value(
            "input_ids.shape[0] (batch size)",
            input_ids.shape[0],
            "1 (batched speculative decoding is not supported yet)",
            "call generate() once per prompt",
        )
    if input_ids.shape[1] == 0:
        raise invalid_value("input_ids.shape[1] (prompt length)", 0, "at least 1 token", "pass a non-empty prompt")
    rule.check_decoding_mode(bool(generation_config.do_sample))


def check_logits_processors(logits_processor: LogitsProcessorList) -> None:
    """Rejects processors that keep state from call to call. The loop calls the processors once per drafted and once
    per verified position, rejected drafts included, so a processor that counts its calls or remembers the contexts
    it saw (SynthID's watermark) would see other calls than plain decoding makes: its output, and the text's
    distribution, would differ from plain sampling even with `exact`."""
    for processor in logits_processor:
        if isinstance(processor, SynthIDTextWatermarkLogitsProcessor):
            raise invalid_value(
                "watermarking_config",
                "a SynthIDTextWatermarkingConfig (or its logits processor)",
                "None or a WatermarkingConfig with an acceptance rule (SynthID's processor keeps state per call, "
                "which the speculative loop's extra calls would corrupt)",
                "drop the SynthID watermark, or generate without assistant_model and acceptance",
            )


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
    criteria: StoppingCriteriaList, input_ids: torch.LongTensor, new_tokens: torch.LongTensor, scores: tuple | None,
    processed: torch.FloatTensor,
) -> int | None:
    """The first `i` such that `criteria` fire on the sequence through `new_tokens[:, i]`, or None.

    Plain decoding calls the criteria after every token, so a criterion that reads the end of the sequence (a stop
    string, "the last token is X") must see each prefix, not only the round's last one. `scores` is what plain
    decoding passes: the processed scores so far when they are recorded, else None.
    """
    if len(criteria) == 0:
        return None
    for i in range(new_tokens.shape[1]):
        so_far = None if scores is None else scores + tuple(processed[:, j] for j in range(i + 1))
        if bool(criteria(torch.cat([input_ids, new_tokens[:, : i + 1]], dim=1), so_far).all()):
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
    model, cache, candidates, attention_mask, num_logits, supports_logits_to_keep, capture_hidden, **forward_kwargs
) -> tuple[torch.FloatTensor, torch.FloatTensor | None]:
    """Target logits `(batch, num_logits, vocab)` on the candidates' device, and the LM-head input at the same
    positions when `capture_hidden`."""
    with capture_lm_head_input(model) if capture_hidden else nullcontext([]) as captured:
        logits = forward_new_tokens(
            model, cache, candidates, attention_mask, num_logits, supports_logits_to_keep, **forward_kwargs
        ).to(candidates.device)
    if capture_hidden and (not captured or captured[0] is None):
        # A forward that never called get_output_embeddings() (it computes its logits another way).
        raise invalid_value(
            "model", type(model).__name__,
            "a target whose forward computes its logits with get_output_embeddings() (the rule reads that module's "
            "input)",
            "use an acceptance rule that does not read the target's hidden states (e.g. 'exact' or 'fly')",
        )
    hidden = captured[0][:, -num_logits:].to(candidates.device) if capture_hidden else None
    return logits, hidden


@record_function("hf_semspec.logits_processors")
def _process_positions(
    logits_processor: LogitsProcessorList, candidates: torch.LongTensor, logits: torch.FloatTensor, length: int
) -> torch.FloatTensor:
    """Applies the processors to each verified position `i` with the prefix `candidates[:, :length + i]`."""
    if len(logits_processor) == 0:
        return logits
    processed = logits.clone()  # the raw logits stay available for `output_logits`
    for i in range(logits.shape[1]):
        processed[:, i] = logits_processor(candidates[:, : length + i], processed[:, i])
    return processed


def speculative_decode(
    model: torch.nn.Module,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    *,
    assistant_model: torch.nn.Module,
    rule: AcceptanceRule,
    draft_length: DraftLengthPolicy,
    streamer=None,
    **model_kwargs,
) -> SpeculativeDecoderOnlyOutput | torch.LongTensor:
    """Speculative decoding of `model` (the target) with `assistant_model` (the draft) and an acceptance `rule`.

    Args:
        input_ids (`torch.LongTensor` of shape `(1, prompt_length)`): the prompt.
        logits_processor / stopping_criteria / generation_config: as prepared by `GenerationMixin.generate`.
        assistant_model (`PreTrainedModel`): the draft model.
        rule (`AcceptanceRule`): decides which drafts are kept (`acceptance=`).
        draft_length (`DraftLengthPolicy`): decides how many tokens to draft each round (`draft_length=`).
        streamer (`BaseStreamer`, *optional*): receives each round's new tokens.
        model_kwargs: the target's cache (`cache`, or `past_key_values` before transformers 5.24), `attention_mask`,
            and non-tensor forward options.

    Returns:
        `SpeculativeDecoderOnlyOutput` if `generation_config.return_dict_in_generate`, else the sequences
        `torch.LongTensor` of shape `(1, total_length)`.
    """
    # 0. Set-up: transformers prepared the target's cache and the mask; the loop owns the draft's cache.
    check_generation_config(generation_config, input_ids, rule)
    check_logits_processors(logits_processor)
    target_cache = model_kwargs[CACHE_ARGUMENT]
    if not isinstance(target_cache, DynamicCache):  # a static or quantized cache passed by the user
        raise invalid_value(
            CACHE_ARGUMENT, type(target_cache).__name__,
            "a DynamicCache, which can be rolled back after rejections (or none: generate() creates one)",
            f"pass {CACHE_ARGUMENT}=DynamicCache(...) or leave it out",
        )
    attention_mask = model_kwargs.get("attention_mask")
    cached = target_cache.get_seq_length()
    mask_length = passed_mask_length(generation_config, attention_mask, input_ids.shape[1])
    if cached >= input_ids.shape[1] or mask_length != input_ids.shape[1]:
        # transformers can restart from a cache with only the new ids and a full mask; the loop (and the draft, which
        # fills its own cache from the ids) needs the whole sequence, as a continuation from a returned cache has.
        raise invalid_value(
            "input_ids",
            f"{input_ids.shape[1]} tokens with a {CACHE_ARGUMENT} of {cached} and an attention_mask of {mask_length}",
            "the whole sequence with an acceptance rule: the tokens the cache holds, then at least one more, and a "
            "mask of the same length",
            f"pass input_ids=torch.cat([out.sequences, new_ids], dim=1) with its full mask (a {CACHE_ARGUMENT} "
            "returned by generate() holds all of out.sequences but the last token)",
        )
    target_cache.activate_past_recording()  # sliding-window / linear-attention layers must be able to roll back
    forward_kwargs = _unmanaged_forward_kwargs(model_kwargs)
    target_supports_logits_to_keep = accepts_forward_argument(model, "logits_to_keep")
    do_sample = bool(generation_config.do_sample)
    eos_ids, max_length, called_stopping_criteria = _split_stopping_criteria(
        stopping_criteria, generation_config.max_length
    )
    drafter = ModelDrafter(
        assistant_model,
        logits_processor,
        do_sample=do_sample and not rule.greedy_drafts,
        return_probs=do_sample or rule.requires_draft_probs,
        output_device=input_ids.device,
        vocab_size=model.config.get_text_config().vocab_size,
        redistribute=rule.redistributes_draft,
        stop_token_ids=frozenset(eos_ids),
    )
    lm_head = model.get_output_embeddings() if rule.requires_target_hidden_states else None
    return_dict = generation_config.return_dict_in_generate
    scores = () if return_dict and generation_config.output_scores else None
    raw_logits = () if return_dict and generation_config.output_logits else None
    prompt_length = input_ids.shape[1]
    num_target_forwards = 0
    draft_length.set_deferred_window(rule.deferred_window)

    finished = False
    while not finished:
        length = input_ids.shape[1]
        round_start = time.perf_counter()

        # 1. Draft γ tokens: up to the policy's budget, capped because a round emits at most γ + 1 tokens and must
        #    stay within max_length; a per-token policy may stop earlier.
        budget = max(0, min(draft_length.max_tokens(), max_length - length - 1))
        draft = drafter.draft(input_ids, attention_mask, budget, draft_length)
        candidates = draft.sequence
        gamma = candidates.shape[1] - length

        # 2. One target forward over the unseen tokens and the drafts: logits for the γ + 1 positions.
        target_logits, hidden = _target_forward(
            model, target_cache, candidates, attention_mask, gamma + 1, target_supports_logits_to_keep,
            capture_hidden=lm_head is not None, **forward_kwargs,
        )
        num_target_forwards += 1

        # 3. Logits processors, each position seeing the prefix it extends (as in plain decoding).
        processed = _process_positions(logits_processor, candidates, target_logits, length)

        # 4. Verify.
        result = rule.verify(
            VerificationInput(
                draft_token_ids=candidates[:, length:],
                target_logits=processed,
                draft_probs=draft.probs,
                target_hidden_states=hidden,
                lm_head_weight=None if lm_head is None else lm_head.weight,
                lm_head_bias=None if lm_head is None else getattr(lm_head, "bias", None),
                do_sample=do_sample,
            )
        )

        # 5. The round's one host sync: accepted count, next token and drafts, to cut at EOS / max_length (and the
        #    drafts that passed the rule's own test, for a draft-length policy, when the rule has a deferred window);
        #    then other stopping criteria, on each prefix (calling them is the user's cost, only when given).
        matched = [] if result.num_matched is None else [result.num_matched]
        synced = torch.cat([result.num_accepted, result.next_token, *matched, candidates[0, length:]]).tolist()
        num_accepted, next_token = synced[0], synced[1]
        num_matched = synced[2] if matched else None
        drafted = synced[2 + len(matched) :]
        emitted = drafted[:num_accepted] + [next_token]
        # At least one token, as plain decoding appends one before it checks a user's MaxLengthCriteria (which
        # transformers lets set a max_length at or below the prompt's length).
        keep = max(1, min(len(emitted), max_length - length))
        eos_at = next((i for i, token in enumerate(emitted[:keep]) if token in eos_ids), None)
        if eos_at is not None:
            keep = eos_at + 1
        new_tokens = torch.cat([candidates[:, length : length + num_accepted], result.next_token[:, None]], dim=1)
        new_tokens = new_tokens[:, :keep]
        stop_at = _first_stop(called_stopping_criteria, input_ids, new_tokens, scores, processed)
        if stop_at is not None:
            keep = stop_at + 1
            new_tokens = new_tokens[:, :keep]
        # The policy learns from what the round delivered: drafts after an EOS or a stop are not output, so they do
        # not count as accepted, even where the target agrees with them, and a round cut among its accepted drafts
        # saw no rejection (`cut`: its tokens are `keep`, not accepted + 1).
        draft_length.observe(
            RoundOutcome(
                gamma, min(num_accepted, keep), time.perf_counter() - round_start,
                includes_prefill=num_target_forwards == 1,
                num_matched=None if num_matched is None else min(num_matched, keep),
                cut=keep <= num_accepted,
            )
        )

        # 6. Append, stream, and roll both caches back to the output but its last token, which is not cached yet: the
        #    accepted prefix, or less where the round was cut (what a continuation from the returned cache expects).
        input_ids = torch.cat([input_ids, new_tokens], dim=1)
        if attention_mask is not None:
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(1, keep)], dim=1)
        if streamer is not None:
            streamer.put(new_tokens.cpu())
        num_cached = length + keep - 1  # = length + num_accepted unless the round was cut
        target_cache.crop(-(target_cache.get_seq_length() - num_cached))
        drafter.rollback(num_cached)

        # 7. Outputs and stopping.
        if scores is not None:
            scores += tuple(processed[:, i] for i in range(keep))
        if raw_logits is not None:
            raw_logits += tuple(target_logits[:, i] for i in range(keep))
        finished = eos_at is not None or stop_at is not None or input_ids.shape[1] >= max_length

    if streamer is not None:
        streamer.end()
    stop_past_recording(target_cache)
    if not return_dict:
        return input_ids
    return SpeculativeDecoderOnlyOutput(
        sequences=input_ids,
        scores=scores,
        logits=raw_logits,
        **{CACHE_ARGUMENT: target_cache},
        acceptance_stats=rule.counters.to_stats(num_target_forwards, input_ids.shape[1] - prompt_length),
    )
