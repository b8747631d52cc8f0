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

    Pruned-vocabulary drafters (see `hf_semspec.drafters`) are supported through two optional attributes of the
    draft model: `kept_token_ids` (`torch.LongTensor` of shape `(K,)`), the target ids of its K output logits, and,
    for RDK, `rdk_indices` / `rdk_weights` (shapes `(K, m + 1)`), a sparse row-stochastic kernel from each kept token
    to target ids. Drafts and their distribution are returned in target ids, so the loop and every rule see the
    target's vocabulary only.

    Args:
        model (`PreTrainedModel`): the draft (assistant) model; may live on another device or dtype than the target.
        logits_processor (`LogitsProcessorList`): the processors transformers prepared for this `generate()` call.
        do_sample (`bool`): draw drafts from q (`True`) or take argmax q (`False`).
        return_probs (`bool`): keep q for the verifier (needed when sampling or when the rule asks for it).
        output_device (`torch.device`): where drafts and q are returned (the target's device).
        vocab_size (`int`): the target's vocabulary size (width of the distributions returned).
        redistribute (`bool`): draw from the RDK-redistributed r = q·K instead of q (needs `rdk_indices`).
        generator (`torch.Generator`, *optional*): the source of the draws when sampling (torch's global RNG if None).
        stop_token_ids (`frozenset[int]`, *optional*): EOS ids. A round that asks a per-token policy ends after
            drafting one of them: nothing drafted after an EOS is ever used (an accepted EOS ends the generation, a
            rejected one discards what follows), and that policy syncs with the host per token anyway. Fixed-budget
            rounds draft on without the check, which would cost them a sync per token.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        logits_processor: LogitsProcessorList,
        do_sample: bool,
        return_probs: bool,
        output_device: torch.device,
        vocab_size: int,
        redistribute: bool = False,
        generator: torch.Generator | None = None,
        stop_token_ids: frozenset[int] = frozenset(),
    ):
        self.model = model
        self.logits_processor = logits_processor
        self.do_sample = do_sample
        self.return_probs = return_probs
        self.output_device = output_device
        self.vocab_size = vocab_size
        self.generator = generator
        self.stop_token_ids = stop_token_ids
        self.cache = DynamicCache(config=model.config)
        self.cache.activate_past_recording()
        self._supports_logits_to_keep = accepts_forward_argument(model, "logits_to_keep")
        kept = getattr(model, "kept_token_ids", None)
        self.kept_token_ids = None if kept is None else kept.to(output_device)
        # The rule checked before decoding that a redistributing drafter has its kernel (check_assistant_model).
        self.rdk_kernel = (
            (model.rdk_indices.to(output_device), model.rdk_weights.to(output_device).float()) if redistribute else None
        )

    def _next_token(
        self, prefix: torch.LongTensor, logits: torch.FloatTensor, keep_probs: bool
    ) -> tuple[torch.LongTensor, torch.FloatTensor | None]:
        """The drafted token `(batch,)` and, if `keep_probs`, the distribution it was drawn from `(batch, vocab)`.

        `logits` are the draft's raw logits, over the kept ids for a pruned drafter."""
        processors = len(self.logits_processor) > 0
        if self.kept_token_ids is not None:
            if not (processors or keep_probs or self.do_sample or self.rdk_kernel is not None):
                return self.kept_token_ids[logits.argmax(-1)], None  # greedy fast path: no full-vocabulary tensor
            # Tokens the drafter cannot propose get −inf, so processors and q live on the target's vocabulary.
            full = logits.new_full((logits.shape[0], self.vocab_size), float("-inf"))
            logits = full.index_copy(1, self.kept_token_ids, logits)
        if processors:
            logits = self.logits_processor(prefix, logits)
        if not (keep_probs or self.do_sample or self.rdk_kernel is not None):
            return logits.argmax(-1), None
        q = logits.softmax(-1)
        if self.kept_token_ids is not None:
            # Processors may allow no kept token (constrained decoding whose allowed tokens were all pruned): that row
            # is all −inf and its softmax NaN. Draft from the kept tokens uniformly there: any q keeps verification
            # lossless, and the target, which gives these drafts probability 0, replaces the first with its own.
            q = torch.where(q.isnan(), self._uniform_over_kept(q), q)
        if self.rdk_kernel is not None:
            q = redistribute(q, self.kept_token_ids, *self.rdk_kernel)
        token = sample_categorical(q, self.generator) if self.do_sample else q.argmax(-1)
        return token, q

    def _uniform_over_kept(self, like: torch.Tensor) -> torch.Tensor:
        """`(vocab,)`: 1/K on each of the K kept ids, 0 elsewhere, in `like`'s dtype and device."""
        uniform = like.new_zeros(like.shape[-1])
        return uniform.index_fill_(0, self.kept_token_ids, 1.0 / len(self.kept_token_ids))

    @record_function("hf_semspec.draft")
    def draft(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.LongTensor | None,
        max_tokens: int,
        policy: DraftLengthPolicy | None = None,
    ) -> DraftBlock:
        """Drafts up to `max_tokens` tokens after `input_ids` (shape `(batch, length)`).

        A per-token `policy` may end the round early (`keep_drafting`), which costs it one host sync per token; such
        a round also ends after an EOS (`stop_token_ids`), read after the policy's decision, when that sync has
        already waited for the token. Without one, drafting makes no host sync of its own (with a padded prompt,
        transformers' mask preparation reads the 2D mask once per forward, as it does in plain decoding).
        """
        length = input_ids.shape[1]
        sequence = torch.cat([input_ids, input_ids.new_zeros(input_ids.shape[0], max_tokens)], dim=1)
        asks_policy = policy is not None and policy.decides_per_token
        keep_probs = self.return_probs or (asks_policy and policy.reads_draft_probs)
        probs = []
        num_drafted = 0
        while num_drafted < max_tokens:
            prefix = sequence[:, : length + num_drafted]
            logits = forward_new_tokens(
                self.model, self.cache, prefix, attention_mask, 1, self._supports_logits_to_keep
            )[:, -1].to(self.output_device)
            token, q = self._next_token(prefix, logits, keep_probs)
            sequence[:, length + num_drafted] = token
            probs.append(q)
            num_drafted += 1
            if asks_policy and num_drafted < max_tokens:
                # The policy's read first: it syncs on q, which comes after the token, so the EOS read below then
                # waits for nothing (the other order would wait twice per token).
                if not policy.keep_drafting(num_drafted, q):
                    break
                if self.stop_token_ids and int(token[0]) in self.stop_token_ids:
                    break
        return DraftBlock(
            sequence=sequence[:, : length + num_drafted],
            probs=torch.stack(probs, dim=1) if (self.return_probs and probs) else None,
        )

    def rollback(self, num_valid_tokens: int) -> None:
        """Forgets cached positions past the first `num_valid_tokens` tokens (the rejected drafts)."""
        cached = self.cache.get_seq_length()
        if cached == 0:  # nothing drafted yet (a first round with no budget): no layer to crop is initialized
            return
        # Also when nothing is rejected: with past recording on, crop(0) is what cuts a sliding-window layer back to
        # its window (a fully accepted round would keep every state; full-attention layers are left as they are).
        self.cache.crop(-max(cached - num_valid_tokens, 0))


def redistribute(
    q: torch.FloatTensor, kept_token_ids: torch.LongTensor, indices: torch.LongTensor, weights: torch.FloatTensor
) -> torch.FloatTensor:
    """RDK's redistribution r = q·M with a sparse row-stochastic kernel (Timor et al. 2025, arXiv 2506.03206).

    Args:
        q (`torch.FloatTensor` of shape `(batch, vocab)`): the draft distribution; mass a logits processor put on a
            pruned id (a forced BOS or EOS) stays where it is.
        kept_token_ids (`torch.LongTensor` of shape `(K,)`): the kept ids, the kernel's rows.
        indices (`torch.LongTensor` of shape `(K, m + 1)`), weights (`torch.FloatTensor` of shape `(K, m + 1)`): row k
            sends the mass of `kept_token_ids[k]` to `indices[k]` in proportions `weights[k]` (each row sums to 1).

    Returns:
        `torch.FloatTensor` of shape `(batch, vocab)`: r, a distribution that may put mass on pruned tokens.
    """
    mass = q[:, kept_token_ids]  # (batch, K)
    contributions = (mass[:, :, None] * weights[None]).reshape(q.shape[0], -1)
    # The kept ids' mass moves through the kernel; the rest of q (a processor can force a pruned id) stays, so r sums
    # to 1 (it summed to 0 when a forced BOS put all of q on a pruned id).
    outside_kept = q.index_fill(1, kept_token_ids, 0.0)
    return outside_kept.scatter_add_(1, indices.reshape(1, -1).expand(q.shape[0], -1), contributions)

