"""Shared by the vLLM engine tests (imported by them, not a conftest: tests/conftest.py is the suite's). Tiny saved
models (no downloads): a Qwen2 target with head_dim 64 (vLLM's CPU attention
needs at least 64), a draft that is the target with noise on its weights, and the suite's word-level tokenizer. Each
engine runs as vLLM runs it for a user: its core in a spawned process, where vLLM loads the plugin (one engine per
process: vLLM's in-process mode cannot start a second engine after the first)."""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: plenty for tiny models
os.environ.setdefault("VLLM_PLUGINS", "hf_semspec")  # this plugin only (others installed beside it stay out)

import pytest  # noqa: E402
import torch  # noqa: E402
from conftest import EOS, VOCAB, perturbed_copy, tiny_tokenizer  # noqa: E402 (tests/conftest.py: the suite's models)
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402


def tiny_qwen2(seed: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         bos_token_id=1, eos_token_id=EOS, pad_token_id=0, tie_word_embeddings=False,
                         torch_dtype="float32")
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20)  # spread logits: greedy choices are not knife-edge ties
    return model


@pytest.fixture(scope="session")
def saved_pair(tmp_path_factory):
    """(target folder, draft folder), each with the tokenizer; and the two models in memory."""
    root = tmp_path_factory.mktemp("vllm-models")
    target = tiny_qwen2(seed=0)
    draft = perturbed_copy(target, scale=0.3, seed=2)
    tokenizer = tiny_tokenizer()
    folders = []
    for name, model in (("target", target), ("draft", draft)):
        folder = root / name
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        folders.append(str(folder))
    return folders[0], folders[1], target, draft


def prompts(count: int = 3, length: int = 8) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(4, VOCAB, (length,), generator=g).tolist() for _ in range(count)]
