"""Forward passes with a KV cache, shared by the drafter and the target.

We call the models' `forward` directly (no nested `generate()`): the speculative loop knows exactly which slots each
cache has seen, so each call feeds only the new ones.
"""

from __future__ import annotations

import inspect
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

import torch
from transformers.cache_utils import Cache

from ._transformers_compat import CACHE_ARGUMENT, rewind_cache
from .batch import DecodingBatch


def accepts_forward_argument(model: torch.nn.Module, name: str) -> bool:
    return name in inspect.signature(model.forward).parameters


class CachedModel:
    """A model and its KV cache, fed slots of a `DecodingBatch` (its token ids in cache order).

    The host keeps the count of cached slots (`cached`), so that no call reads a length back from the device (a
    static cache keeps its length in a tensor). A forward feeds the slots `[cached, end)`; `rewind` forgets slots.

    Args:
        model (`torch.nn.Module`): a causal LM (or a pruned drafter) whose forward takes the cache by
            `CACHE_ARGUMENT`.
        cache (`Cache`): its cache, dynamic or static.
        compiled (`Callable`, *optional*): the compiled forward (`torch.compile`), used for every forward but the
            first, which prefills the prompt at a shape seen once.
        static (`bool`): the cache is static: compiled forwards take the 2D mask at its full, fixed length.
        max_input_id (`int`, *optional*): the largest id the model has an embedding row for, where the batch may hold
            larger ones (a draft paired with a target whose vocabulary is padded further): those are fed as this id.
        min_width (`int`, *optional*): a compiled forward that has fewer new slots feeds this many, re-feeding the
            cached slots before them (their keys and values are written again, the same): one shape, one compiled
            graph, for every forward of up to `min_width` slots (the verify forward of a round shorter than the
            policy's length, near `max_length`, or with a policy that varies γ).
    """

    def __init__(self, model: torch.nn.Module, cache: Cache, compiled=None, static: bool = False,
                 max_input_id: int | None = None, min_width: int | None = None):
        self.model = model
        self.cache = cache
        self.compiled = compiled
        self.static = static
        self.max_input_id = max_input_id
        self.min_width = min_width
        self.cached = 0
        self.supports_logits_to_keep = accepts_forward_argument(model, "logits_to_keep")
        self.takes_position_ids = accepts_forward_argument(model, "position_ids")

    def forward(self, batch: DecodingBatch, end: int, num_logits: int, **extra_forward_kwargs) -> torch.FloatTensor:
        """Feeds slots `[cached, end)` (from `end − min_width` where a compiled forward has fewer) and returns the
        logits of the last `num_logits` of them.

        Returns:
            `torch.FloatTensor` of shape `(batch, num_logits, vocab)`, float32, on the model's output device.
        """
        start = self.cached
        compiled = self.compiled is not None and start > 0
        fed = end - start
        if compiled and self.min_width is not None and fed < self.min_width <= end:
            self.rewind(end - self.min_width)  # the same shape as a forward of `min_width` new slots
            start, fed = self.cached, self.min_width
        kwargs = {**extra_forward_kwargs, **self.inputs(batch, start, end)}
        if self.supports_logits_to_keep:  # (as many as fed when re-feeding: one value, one compiled graph)
            kwargs["logits_to_keep"] = fed if fed == self.min_width and compiled else num_logits
        kwargs[CACHE_ARGUMENT] = self.cache
        outputs = (self.compiled if compiled else self.model)(use_cache=True, **kwargs)
        self.cached = end
        logits = outputs.logits[:, -num_logits:]
        if compiled and logits.dtype == torch.float32:
            # A CUDA graph's output is overwritten by its next replay (`float()` copies only other dtypes).
            return logits.clone()
        return logits.float()

    def inputs(self, batch: DecodingBatch, start: int, end: int) -> dict[str, torch.Tensor]:
        """The forward's `input_ids` of slots `[start, end)` and, where the batch needs them, its `attention_mask` (at
        the caches' full length on static ones) and `position_ids`, on the model's device."""
        device = self.model.device
        input_ids = batch.ids[:, start:end].to(device)
        kwargs = {"input_ids": input_ids if self.max_input_id is None else input_ids.clamp_max(self.max_input_id)}
        mask = batch.model_mask(end, full=self.static)
        if mask is not None:
            kwargs["attention_mask"] = mask.to(device)
        if self.takes_position_ids:
            kwargs["position_ids"] = batch.positions(start, end).to(device)
        return kwargs

    def greedy_round(self, batch: DecodingBatch, end: int, num_steps: int, round_function: Callable,
                     **pick) -> torch.LongTensor:
        """Feeds slots `[cached, end)` and then, `num_steps − 1` times, the token it just picked, all in one call of
        `round_function` (`drafting.greedy_steps`, compiled: one graph for the round); `pick` tells it how a step's
        logits become a token (`vocab_size`, `kept_token_ids`). The batch's mask must already hold the slots the
        picked tokens go to (`DecodingBatch.open_draft_slots`). The cache then holds `end + num_steps − 1` slots.

        Returns:
            `torch.LongTensor` of shape `(batch, num_steps)`: the picked tokens, in the call's own buffer (a CUDA
            graph's output, which its next replay overwrites).
        """
        kwargs = self.inputs(batch, self.cached, end)
        kwargs.setdefault("attention_mask", None)
        kwargs.setdefault("position_ids", None)
        tokens = round_function(
            self.model, self.cache, **kwargs, increment=batch.new_slot_mask[:, None].to(self.model.device),
            num_steps=num_steps, max_input_id=self.max_input_id, keep_one_logit=self.supports_logits_to_keep, **pick,
        )
        self.cached = end + num_steps - 1
        return tokens

    def rewind(self, num_slots: int) -> None:
        """Forgets cached slots past the first `num_slots` (also when none are: with past recording on, that cuts a
        sliding-window layer back to its window)."""
        if self.cached == 0:  # nothing fed yet (a first round with no budget): no layer is initialized
            return
        rewind_cache(self.cache, max(self.cached - num_slots, 0))
        self.cached = min(self.cached, num_slots)

    def keep_rows(self, index: torch.LongTensor) -> None:
        """Keeps the batch rows at `index` (a dynamic cache; finished rows leave it)."""
        if self.cached:
            self.cache.batch_select_indices(index.to(self.model.device))


@contextmanager
def capture_lm_head_input(model: torch.nn.Module) -> Iterator[list[torch.Tensor]]:
    """Records the input of `model`'s LM head (the final hidden states, after the model's own final norm).

    A forward pre-hook on `model.get_output_embeddings()` sees exactly what the head multiplies, whatever the
    architecture puts before it; the list holds the latest call's tensor of shape `(batch, positions, hidden)`. The
    hook records only this thread's forwards: the head is shared, so another thread's `generate()` on the same model
    would otherwise overwrite the tensor between this forward and its read.
    """
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError(
            f"{type(model).__name__} has no output embeddings (`get_output_embeddings()` is None), so its LM-head "
            "input cannot be captured. Fix: use an acceptance rule that does not need target hidden states."
        )
    captured: list[torch.Tensor] = []
    this_thread = threading.get_ident()

    def hook(_module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        # (torch.compile cannot trace get_ident, and `fullgraph=True` would fail on it: a compiled forward records
        # without the thread check, as before it.)
        if torch.compiler.is_compiling() or threading.get_ident() == this_thread:
            # nn.Linear's input, passed by position or (rarely) by name.
            captured[:] = [args[0] if args else kwargs.get("input", next(iter(kwargs.values()), None))]

    handle = head.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield captured
    finally:
        handle.remove()
