"""Every field of transformers' `GenerationConfig`, and what hf_semspec's loop does with it: one table.

A `generate()` call with an acceptance rule runs hf_semspec's loop instead of transformers' decoding methods, so a
field of `GenerationConfig` is either

- `LOOP`: read by hf_semspec (the loop, or `generate()` before it) and honoured;
- `PROCESSORS`: turned into logits processors or stopping criteria by transformers, which the loop applies at every
  verified position and to the drafts;
- `TRANSFORMERS`: read by transformers' `generate()` while it prepares the inputs, the cache and the lengths, before
  the loop starts;
- `REFUSED`: something the loop does not do (another decoding method, outputs it does not make): a value other than
  the neutral ones is refused with the reason and a fix;
- `IRRELEVANT`: nothing to decode with (metadata, settings of a method that a refused field selects, or of models the
  loop refuses).

`decoding.check_generation_config` reads this table, and tests/test_generation_fields.py fails on any field of the
installed transformers' `GenerationConfig` that it does not name: a field that transformers adds is classified here
before it can be dropped without a word. Some fields have values the loop refuses while others are honoured
(`use_cache`, `cache_implementation`): their entry's `allowed` lists the values it takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._transformers_compat import generation_defaults

LOOP = "loop"
PROCESSORS = "processors"
TRANSFORMERS = "transformers"
REFUSED = "refused"
IRRELEVANT = "irrelevant"
KINDS = (LOOP, PROCESSORS, TRANSFORMERS, REFUSED, IRRELEVANT)

# Where a field's refusal is checked: in the loop's set-up on the config transformers prepared (the default), or in
# `generate()` before transformers merges it, for a field whose prepared value cannot tell a user's setting from
# transformers' default, or that transformers would read before the loop runs.
IN_LOOP = "loop"
IN_GENERATE = "generate"


@dataclass(frozen=True)
class FieldUse:
    """What hf_semspec does with one `GenerationConfig` field.

    Args:
        kind (`str`): one of `KINDS`.
        why (`str`): what reads it (`LOOP`, `PROCESSORS`, `TRANSFORMERS`), why it is refused (`REFUSED`) or why it
            does not matter (`IRRELEVANT`).
        allowed (`tuple`, *optional*): the values taken with an acceptance rule, besides None and transformers'
            default for the field; any other is refused. Every `REFUSED` field has one (often empty).
        fix (`str`): what to do instead, for the error (fields with `allowed`).
        example (`Any`): a value the loop refuses, for the tests (fields with `allowed`).
        checked (`str`): `IN_LOOP` or `IN_GENERATE`.
    """

    kind: str
    why: str
    allowed: tuple | None = None
    fix: str = ""
    example: Any = None
    checked: str = IN_LOOP

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"FieldUse.kind = {self.kind!r}: use one of {KINDS}")
        if self.kind == REFUSED and self.allowed is None:
            raise ValueError("a REFUSED field needs `allowed` (the values it takes; () for none)")
        if self.allowed is not None and (not self.fix or self.example is None):
            raise ValueError("a field with `allowed` needs a `fix` and an `example` of a refused value")


def _processor(what: str) -> FieldUse:
    return FieldUse(PROCESSORS, f"{what}: a logits processor transformers builds, applied at every verified "
                                "position and to the drafts")


def _refused(why: str, fix: str, example: Any, allowed: tuple = (), checked: str = IN_LOOP) -> FieldUse:
    return FieldUse(REFUSED, why, allowed=allowed, fix=fix, example=example, checked=checked)


_OTHER_DRAFTS = "the drafts here are assistant_model's or prompt lookup's"

GENERATION_FIELDS: dict[str, FieldUse] = {
    # Lengths and stopping.
    "max_length": FieldUse(LOOP, "every row stops at it (transformers sets it from max_new_tokens)"),
    "max_new_tokens": FieldUse(LOOP, "sets max_length, where every row stops"),
    "max_time": FieldUse(LOOP, "MaxTimeCriteria, called after each token as plain decoding calls it"),
    "stop_strings": FieldUse(LOOP, "a StopStringCriteria built by generate() (with tokenizer=), called after each "
                                   "token"),
    "eos_token_id": FieldUse(LOOP, "a row ends at its first EOS, drafted or not"),
    "pad_token_id": FieldUse(LOOP, "pads rows that end early, and the prompt's padding"),
    "min_length": _processor("MinLengthLogitsProcessor"),
    "min_new_tokens": _processor("MinNewTokensLengthLogitsProcessor"),
    # Decoding mode, outputs, caches.
    "do_sample": FieldUse(LOOP, "greedy or sampled verification (and drafting)"),
    "num_return_sequences": FieldUse(LOOP, "transformers repeats the prompts; the loop decodes them as a batch"),
    "return_dict_in_generate": FieldUse(LOOP, "returns a SpeculativeDecoderOnlyOutput with acceptance_stats"),
    "output_scores": FieldUse(LOOP, "the processed scores of every kept token"),
    "output_logits": FieldUse(LOOP, "the raw logits of every kept token"),
    "use_cache": FieldUse(LOOP, "speculative decoding rolls both KV caches back after rejections", allowed=(True,),
                          fix="use_cache=True (or leave it unset)", example=False),
    "cache_implementation": FieldUse(
        LOOP, "a dynamic cache, or static caches for both models (compiled forwards)",
        allowed=("dynamic", "static"), example="offloaded",
        fix="pass cache_implementation='static' or 'dynamic' with the call where a generation config sets another",
    ),
    "compile_config": FieldUse(LOOP, "compiles the draft's steps, the verify forward and the verification on static "
                                     "caches"),
    "disable_compile": FieldUse(LOOP, "keeps every forward eager on static caches"),
    "cache_config": FieldUse(TRANSFORMERS, "options of the cache transformers builds (read for quantized and "
                                           "offloaded caches, which cache_implementation refuses)"),
    "max_cache_len": FieldUse(TRANSFORMERS, "sizes the static cache transformers builds for one prompt (a batch's "
                                            "static caches are sized by the loop, larger)"),
    "bos_token_id": FieldUse(TRANSFORMERS, "starts a generation without a prompt (the loop refuses an empty one)"),
    # Speculation.
    "num_assistant_tokens": FieldUse(LOOP, "γ, the draft-length policy's length (the call's, then a passed config's, "
                                           "then the model's, then the draft's)"),
    "num_assistant_tokens_schedule": FieldUse(LOOP, "'constant' / 'heuristic' pick the draft-length policy of the "
                                                    "same name"),
    "prompt_lookup_num_tokens": FieldUse(LOOP, "prompt-lookup drafts (multi-level drafting with a draft model)"),
    "max_matching_ngram_size": FieldUse(LOOP, "the n-gram size of prompt lookup"),
    "assistant_ensemble_weight": FieldUse(LOOP, "with acceptance='exact' it selects the 'ensemble' rule at that "
                                                "weight; refused with other rules (checked in generate())"),
    "assistant_confidence_threshold": _refused(
        "None with an acceptance rule (how many tokens to draft is the `draft_length` policy's decision)",
        "remove it; draft_length='svip' or 'adaedl' ends a round when the draft is unsure", 0.2,
        checked=IN_GENERATE,  # transformers' default 0.4 is in every prepared config: only a user's value counts
    ),
    "assistant_lookbehind": FieldUse(IRRELEVANT, "universal assisted decoding only (assistant_tokenizer, refused)"),
    "target_lookbehind": FieldUse(IRRELEVANT, "universal assisted decoding only (assistant_tokenizer, refused)"),
    "assistant_early_exit": _refused(
        f"None with an acceptance rule (early-exit self-drafting is another drafter: {_OTHER_DRAFTS})",
        "remove assistant_early_exit, or drop assistant_model and acceptance for early-exit self-drafting", 4,
    ),
    "use_mtp": _refused(
        f"False or None with an acceptance rule (multi-token-prediction drafting is another drafter: {_OTHER_DRAFTS})",
        "remove use_mtp, or drop assistant_model and acceptance for multi-token-prediction drafting", True,
        allowed=(False,),
    ),
    "speculation_type": _refused(
        "None with an acceptance rule (speculation_type='dflash' drafts a block with a DFlash drafter: "
        f"{_OTHER_DRAFTS})",
        "remove speculation_type, or drop acceptance for transformers' DFlash speculation", "dflash",
    ),
    "is_assistant": FieldUse(IRRELEVANT, "set by transformers on the copy of the config its own drafting uses"),
    # Other decoding methods.
    "num_beams": _refused("1 with an acceptance rule (beam search is not speculative)", "remove num_beams", 4,
                          allowed=(1,)),
    "num_beam_groups": _refused("1 with an acceptance rule (group beam search is not speculative)",
                                "remove num_beam_groups", 2, allowed=(1,)),
    "diversity_penalty": _refused("0 with an acceptance rule (group beam search only)", "remove diversity_penalty",
                                  0.5, allowed=(0, 0.0)),
    "length_penalty": FieldUse(IRRELEVANT, "beam search only, as in transformers' greedy and sampled decoding"),
    "early_stopping": FieldUse(IRRELEVANT, "beam search only, as in transformers' greedy and sampled decoding"),
    "low_memory": FieldUse(IRRELEVANT, "contrastive and beam search only, as in transformers' greedy decoding"),
    "constraints": _refused("None with an acceptance rule (constrained beam search)",
                            "remove constraints; a logits processor or bad_words_ids constrains the output", ["x"]),
    "force_words_ids": _refused("None with an acceptance rule (constrained beam search)",
                                "remove force_words_ids; a logits processor constrains the output", [[5]]),
    "penalty_alpha": _refused("None with an acceptance rule (contrastive search is another decoding method)",
                              "remove penalty_alpha, or drop assistant_model and acceptance for contrastive search",
                              0.6),
    "dola_layers": _refused("None with an acceptance rule (DoLa decoding is another decoding method)",
                            "remove dola_layers, or drop assistant_model and acceptance for DoLa decoding", "high"),
    "guidance_scale": _refused(
        "None or 1 with an acceptance rule (classifier-free guidance re-runs the model one token at a time)",
        "remove guidance_scale, or drop assistant_model", 1.5, allowed=(1, 1.0),
    ),
    "prefill_chunk_size": _refused(
        "None with an acceptance rule (the loop prefills the prompt in one forward of each model)",
        "remove prefill_chunk_size, or drop assistant_model and acceptance for chunked prefill", 16,
    ),
    "token_healing": _refused(
        "False with an acceptance rule (transformers heals the prompt with the tokenizer, which it drops for "
        "hf_semspec's loop)",
        "heal the prompt first (input_ids = model.heal_tokens(input_ids, tokenizer)), then generate without it", True,
        allowed=(False,), checked=IN_GENERATE,
    ),
    "continuous_batching_config": FieldUse(IRRELEVANT, "read by generate_batch() (continuous batching), not by "
                                                       "generate()"),
    # Outputs the loop does not make.
    "output_attentions": _refused("False with an acceptance rule (the loop keeps no attention maps)",
                                  "remove output_attentions=True", True, allowed=(False,)),
    "output_hidden_states": _refused("False with an acceptance rule (the loop keeps no hidden states)",
                                     "remove output_hidden_states=True", True, allowed=(False,)),
    # Logits processors (transformers builds them from these; the loop applies them).
    "temperature": _processor("TemperatureLogitsWarper"),
    "top_k": _processor("TopKLogitsWarper"),
    "top_p": _processor("TopPLogitsWarper"),
    "min_p": _processor("MinPLogitsWarper"),
    "typical_p": _processor("TypicalLogitsWarper"),
    "epsilon_cutoff": _processor("EpsilonLogitsWarper"),
    "eta_cutoff": _processor("EtaLogitsWarper"),
    "top_h": _processor("TopHLogitsWarper"),
    "repetition_penalty": _processor("RepetitionPenaltyLogitsProcessor"),
    "no_repeat_ngram_size": _processor("NoRepeatNGramLogitsProcessor"),
    "bad_words_ids": _processor("NoBadWordsLogitsProcessor"),
    "sequence_bias": _processor("SequenceBiasLogitsProcessor"),
    "forced_bos_token_id": _processor("ForcedBOSTokenLogitsProcessor"),
    "forced_eos_token_id": _processor("ForcedEOSTokenLogitsProcessor"),
    "remove_invalid_values": _processor("InfNanRemoveLogitsProcessor"),
    "exponential_decay_length_penalty": _processor("ExponentialDecayLengthPenalty"),
    "suppress_tokens": _processor("SuppressTokensLogitsProcessor"),
    "begin_suppress_tokens": _processor("SuppressTokensAtBeginLogitsProcessor"),
    "renormalize_logits": _processor("LogitNormalization"),
    "watermarking_config": _processor("the watermarking processor"),
    # Encoder-decoder models (refused as target and draft) and metadata.
    "encoder_repetition_penalty": FieldUse(IRRELEVANT, "encoder-decoder models only (refused)"),
    "encoder_no_repeat_ngram_size": FieldUse(IRRELEVANT, "encoder-decoder models only (refused)"),
    "decoder_start_token_id": FieldUse(IRRELEVANT, "encoder-decoder models only (refused)"),
    "transformers_version": FieldUse(IRRELEVANT, "metadata"),
}


def unclassified_fields(field_names) -> list[str]:
    """The public fields among `field_names` (a `GenerationConfig`'s attributes) that the table does not name."""
    return sorted(name for name in field_names if not name.startswith("_") and name not in GENERATION_FIELDS)


def is_neutral(name: str, value: Any, use: FieldUse) -> bool:
    """Whether `value` of field `name` is one the loop takes: None, transformers' default for the field, or one of the
    entry's `allowed` values (any value for a field without `allowed`)."""
    if use.allowed is None or value is None:
        return True
    if value in use.allowed:
        return True
    default = generation_defaults().get(name)
    return default is not None and value == default


def allowed_text(use: FieldUse) -> str:
    """The "allowed" part of a refused field's error: a refused field's reason, or a field's values and what it does."""
    if use.kind == REFUSED:
        return use.why
    return f"one of {(None, *use.allowed)!r} with an acceptance rule ({use.why})"


def refused_value(generation_config, checked: str = IN_LOOP) -> tuple[str, Any, FieldUse] | None:
    """The first field of `generation_config` whose value the loop refuses (`(name, value, use)`), among the fields
    checked at `checked`; None where there is none."""
    for name, use in GENERATION_FIELDS.items():
        if use.allowed is None or use.checked != checked:
            continue
        value = getattr(generation_config, name, None)
        if not is_neutral(name, value, use):
            return name, value, use
    return None


__all__ = ["GENERATION_FIELDS", "FieldUse", "KINDS", "allowed_text", "is_neutral", "refused_value",
           "unclassified_fields"]
