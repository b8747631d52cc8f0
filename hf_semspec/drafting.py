"""Drafting: the assistant model proposes tokens autoregressively with its own KV cache."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.profiler import record_function
from transformers import LogitsProcessorList
from transformers.cache_utils import DynamicCache

from .draft_length import DraftLengthPolicy
from .model_calls import accepts_forward_argument, forward_new_tokens
from .rules.base import sample_categorical


@dataclass
class DraftBlock:
    """One round's drafts.

    Args:
        sequence (`torch.LongTensor` of shape `(batch, length + γ)`): the committed tokens followed by the drafts.
        probs (`torch.FloatTensor` of shape `(batch, γ, vocab)`, *optional*): the distribution each draft was drawn
            from, after the logits processors (what the verifier calls q).
    """

    sequence: torch.LongTensor
    probs: torch.FloatTensor | None


class ModelDrafter:
    """Drafts with a causal LM sharing the target's tokenizer.

    The draft distribution goes through the same logits processors as the target (temperature, top-k/p, repetition
    penalty, min_new_tokens, …), each position seeing the prefix it extends, so that q and p are comparable.

    Args:
        model (`PreTrainedModel`): the draft (assistant) model; may live on another device or dtype than the target.
        logits_processor (`LogitsProcessorList`): the processors transformers prepared for this `generate()` call.
        do_sample (`bool`): draw drafts from q (`True`) or take argmax q (`False`).
        return_probs (`bool`): keep q for the verifier (needed when sampling or when the rule asks for it).
        output_device (`torch.device`): where drafts and q are returned (the target's device).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        logits_processor: LogitsProcessorList,
        do_sample: bool,
        return_probs: bool,
        output_device: torch.device,
        generator: torch.Generator | None = None,
    ):
        self.model = model
        self.logits_processor = logits_processor
        self.do_sample = do_sample
        self.return_probs = return_probs
        self.output_device = output_device
        self.generator = generator
        self.cache = DynamicCache(config=model.config)
        self.cache.activate_past_recording()
        self._supports_logits_to_keep = accepts_forward_argument(model, "logits_to_keep")

    @record_function("hf_semspec.draft")
    def draft(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.LongTensor | None,
        max_tokens: int,
        policy: DraftLengthPolicy | None = None,
    ) -> DraftBlock:
        """Drafts up to `max_tokens` tokens after `input_ids` (shape `(batch, length)`).

        A per-token `policy` may end the round early (`keep_drafting`), which costs it one host sync per token;
        without one, drafting runs without host syncs.
        """
        length = input_ids.shape[1]
        sequence = torch.cat([input_ids, input_ids.new_zeros(input_ids.shape[0], max_tokens)], dim=1)
        asks_policy = policy is not None and policy.decides_per_token
        keep_probs = self.do_sample or self.return_probs or (asks_policy and policy.reads_draft_probs)
        probs = []
        num_drafted = 0
        while num_drafted < max_tokens:
            prefix = sequence[:, : length + num_drafted]
            logits = forward_new_tokens(
                self.model, self.cache, prefix, attention_mask, 1, self._supports_logits_to_keep
            )[:, -1].to(self.output_device)
            if len(self.logits_processor) > 0:
                logits = self.logits_processor(prefix, logits)
            q = logits.softmax(-1) if keep_probs else None
            token = sample_categorical(q, self.generator) if self.do_sample else logits.argmax(-1)
            sequence[:, length + num_drafted] = token
            probs.append(q)
            num_drafted += 1
            if asks_policy and num_drafted < max_tokens and not policy.keep_drafting(num_drafted, q):
                break
        return DraftBlock(
            sequence=sequence[:, : length + num_drafted],
            probs=torch.stack(probs, dim=1) if (self.return_probs and probs) else None,
        )

    def rollback(self, num_valid_tokens: int) -> None:
        """Forgets cached positions past the first `num_valid_tokens` tokens (the rejected drafts)."""
        excess = self.cache.get_seq_length() - num_valid_tokens
        if excess > 0:
            self.cache.crop(-excess)
