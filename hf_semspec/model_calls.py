"""Forward passes with a KV cache, shared by the drafter and the target.

We call the models' `forward` directly (no nested `generate()`): the speculative loop knows exactly which tokens each
cache has seen, so each call feeds only the new ones.
"""

from __future__ import annotations

import inspect
import threading
from contextlib import contextmanager
from typing import Iterator

import torch
from transformers.cache_utils import Cache

from ._transformers_compat import CACHE_ARGUMENT


def accepts_forward_argument(model: torch.nn.Module, name: str) -> bool:
    return name in inspect.signature(model.forward).parameters


def forward_new_tokens(
    model: torch.nn.Module,
    cache: Cache,
    sequence: torch.LongTensor,
    attention_mask: torch.LongTensor | None,
    num_logits: int,
    supports_logits_to_keep: bool,
    **extra_forward_kwargs,
) -> torch.FloatTensor:
    """Feeds `sequence[:, cache_length:]` to `model` and returns the logits of the last `num_logits` positions.

    Args:
        sequence (`torch.LongTensor` of shape `(batch, length)`): the whole sequence so far; the cache holds a prefix.
        attention_mask (`torch.LongTensor` of shape `(batch, ≤ length)`, *optional*): mask of the committed tokens,
            extended with ones over the rest of `sequence`; `None` when there is no padding (the model then derives
            positions from the cache length).
        num_logits (`int`): how many trailing positions need logits.

    Returns:
        `torch.FloatTensor` of shape `(batch, num_logits, vocab)`, float32, on the model's output device.
    """
    past_length = cache.get_seq_length()
    new_ids = sequence[:, past_length:].to(model.device)
    kwargs = dict(extra_forward_kwargs)
    if attention_mask is not None:
        mask = attention_mask[:, : sequence.shape[1]].to(model.device)
        if mask.shape[1] < sequence.shape[1]:  # draft tokens beyond the committed mask are real tokens
            mask = torch.cat([mask, mask.new_ones(mask.shape[0], sequence.shape[1] - mask.shape[1])], dim=1)
        # Left padding shifts positions: position = number of real tokens before this one.
        position_ids = (mask.long().cumsum(-1) - 1).clamp_min(0)
        kwargs["attention_mask"] = mask
        kwargs["position_ids"] = position_ids[:, past_length:]
    if supports_logits_to_keep:
        kwargs["logits_to_keep"] = num_logits
    kwargs[CACHE_ARGUMENT] = cache
    outputs = model(input_ids=new_ids, use_cache=True, **kwargs)
    return outputs.logits[:, -num_logits:].float()


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
