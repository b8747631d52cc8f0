"""The logits a compiled forward returns stay the caller's after the next forward (`CachedModel.forward`).

A CUDA graph writes its outputs into memory it owns and overwrites them on its next replay, so the logits of one
round would change under the rules while the next forward runs. Without a GPU, a compiled forward that returns its
logits in one float32 buffer it overwrites on every call keeps the same contract.
"""

from __future__ import annotations

import pytest
import torch
from conftest import batch_of, prompt, tiny_llama
from transformers import DynamicCache, StaticCache

from hf_semspec.batch import DecodingBatch
from hf_semspec.model_calls import CachedModel


class ReusesItsOutput:
    """A model's forward that, like a CUDA graph's replay, returns its logits in a float32 buffer it owns and
    overwrites on its next call."""

    def __init__(self, model):
        self.model = model
        self.buffer = None
        self.calls = 0

    def __call__(self, **kwargs):
        outputs = self.model(**kwargs)
        if self.buffer is None:
            self.buffer = torch.empty_like(outputs.logits)
        self.buffer.copy_(outputs.logits)
        outputs.logits = self.buffer
        self.calls += 1
        return outputs


def step_logits(cached: CachedModel, batch: DecodingBatch, prefill: int, steps: int) -> list[torch.Tensor]:
    """Prefills `prefill` slots (eager, as the loop does), then feeds one slot at a time (the compiled forward),
    returning the logits of every step."""
    cached.forward(batch, prefill, num_logits=1)
    return [cached.forward(batch, prefill + i, num_logits=1) for i in range(1, steps + 1)]


def assert_unchanged_by_later_steps(model, returned: list[torch.Tensor], ids: torch.LongTensor, prefill: int):
    with torch.no_grad():
        expected = model(ids).logits.float()
    for i, logits in enumerate(returned):
        position = prefill + i  # step i fed slot `position`
        # Still what that step computed, not what a later step wrote over it.
        torch.testing.assert_close(logits, expected[:, position : position + 1], rtol=1e-4, atol=1e-4)
    assert not torch.equal(returned[0], returned[-1])  # the steps differ: an overwrite would show


def test_logits_of_a_forward_survive_the_next_forward_that_reuses_the_output_buffer():
    model = tiny_llama(seed=0)
    ids = prompt(12)
    compiled = ReusesItsOutput(model)
    cached = CachedModel(model, DynamicCache(config=model.config), compiled=compiled)
    with torch.no_grad():
        returned = step_logits(cached, batch_of(ids), prefill=8, steps=4)
    assert compiled.calls == 4 and all(logits.dtype == torch.float32 for logits in returned)
    assert_unchanged_by_later_steps(model, returned, ids, prefill=8)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_logits_of_a_cuda_graph_replay_survive_the_next_replay():
    torch._dynamo.reset()
    try:
        model = tiny_llama(seed=0).cuda()
        ids = prompt(16).cuda()
        cache = StaticCache(config=model.config, max_cache_len=32)
        # cudagraph trees warm up on the first call, record on the second and replay from the third on.
        compiled = torch.compile(model.__call__, backend="cudagraphs")
        cached = CachedModel(model, cache, compiled=compiled, static=True)
        batch = DecodingBatch(ids, None, slot_capacity=32, token_capacity=32, grow=False)
        with torch.no_grad():
            returned = step_logits(cached, batch, prefill=8, steps=6)
            torch.cuda.synchronize()
            assert_unchanged_by_later_steps(model, returned, ids, prefill=8)
    finally:
        torch._dynamo.reset()
