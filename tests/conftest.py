"""Tiny seeded models built from configs (no Hub here) and small helpers shared by the tests."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hf_semspec

VOCAB = 128
EOS = 3

# Tiny models: thread start-up costs more than the matmuls, and CI shares two cores.
torch.set_num_threads(1)


def tiny_llama_config(**overrides) -> LlamaConfig:
    values = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=EOS,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    values.update(overrides)
    return LlamaConfig(**values)


def tiny_llama(seed: int, **overrides) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config(**overrides)).eval()
    # Random init gives near-uniform logits; a larger head spreads them so greedy choices are not knife-edge ties.
    with torch.no_grad():
        model.lm_head.weight.mul_(20)
    return model


def tiny_gpt2(seed: int, n_positions: int = 40, **overrides):
    """A tiny GPT-2: learned absolute positions (a table of `n_positions` rows, `wpe`), where a position past the
    table raises IndexError, unlike the Llama models' rotary positions."""
    from transformers import GPT2Config, GPT2LMHeadModel

    values = dict(vocab_size=VOCAB, n_positions=n_positions, n_embd=64, n_layer=2, n_head=4, bos_token_id=1,
                  eos_token_id=EOS, pad_token_id=0, tie_word_embeddings=False)
    values.update(overrides)
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config(**values)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20)
    return model


def perturbed_copy(model: torch.nn.Module, scale: float, seed: int) -> torch.nn.Module:
    """The target with noise on every weight: a draft that agrees often but not always."""
    draft = type(model)(model.config).eval()
    draft.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale * p.std().clamp_min(1e-3))
    return draft


@pytest.fixture(scope="session")
def target() -> LlamaForCausalLM:
    return tiny_llama(seed=0)


@pytest.fixture(scope="session")
def unrelated_draft() -> LlamaForCausalLM:
    return tiny_llama(seed=1)


@pytest.fixture(scope="session")
def close_draft(target) -> LlamaForCausalLM:
    return perturbed_copy(target, scale=0.3, seed=2)


@pytest.fixture(autouse=True)
def fresh_draft_length_state():
    """The models are session-wide, and policies built from a name keep what they learn per models and options
    across calls, as `drafting="auto"` keeps its measured costs: every test starts from none, as a fresh process
    would."""
    yield
    hf_semspec.forget_draft_length_state()
    hf_semspec.forget_drafting_costs()


@pytest.fixture
def attached(target):
    """The session target with hf_semspec attached for one test, detached afterwards."""
    hf_semspec.attach(target)
    yield target
    hf_semspec.detach(target)


def tiny_tokenizer():
    """A tokenizer over the tiny models' ids, for what needs one (stop strings): id i > 3 is a distinct two-letter
    word ("aa", "ab", ...), so a stop string of one token's word ends the text only where that token does.
    (transformers' StopStringCriteria reads each token's text by decoding it after "abcdef": that must round-trip.)"""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<s>", "<unk>", "</s>"] + [chr(97 + i // 26) + chr(97 + i % 26) for i in range(VOCAB - 4)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(".."), behavior="isolated")  # "abcdef" → ab, cd, ef
    backend.decoder = decoders.Fuse()  # and back, without spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )


def batch_of(input_ids: torch.LongTensor, attention_mask: torch.LongTensor | None = None):
    """The loop's `DecodingBatch` for `input_ids`, for tests that drive a `ModelDrafter` by hand."""
    from hf_semspec.batch import DecodingBatch

    return DecodingBatch(input_ids, attention_mask, slot_capacity=input_ids.shape[1] + 64,
                         token_capacity=input_ids.shape[1] + 64, grow=True)


def prompt(length: int = 8, seed: int = 0) -> torch.LongTensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, VOCAB, (1, length), generator=g)


@pytest.fixture
def patch_rng(monkeypatch):
    """Replaces the rules' random draws (`sample_uniform`, `sample_categorical`) everywhere they are imported.

    `patch_rng(uniform=0.4)` makes every u equal 0.4; `patch_rng(categorical="argmax")` makes every categorical
    draw return the most likely token. Returns the list of distributions passed to categorical draws.
    """
    import sys

    from hf_semspec.rules import RULES
    from hf_semspec.rules import base as rules_base

    def apply(uniform: float | None = None, categorical: str | None = None) -> list[torch.Tensor]:
        drawn: list[torch.Tensor] = []
        # every module in every registered rule's class hierarchy (a rule may inherit its draws from another)
        modules = {rules_base} | {
            sys.modules[cls.__module__] for n in RULES.names() for cls in RULES.get(n).__mro__ if cls.__module__ in sys.modules
        }
        for module in modules:
            if uniform is not None and hasattr(module, "sample_uniform"):
                monkeypatch.setattr(module, "sample_uniform", lambda shape, device, generator: torch.full(shape, uniform, device=device))
            if categorical == "argmax" and hasattr(module, "sample_categorical"):

                def argmax_draw(probs, generator):
                    drawn.append(probs.clone())
                    return probs.argmax(-1)

                monkeypatch.setattr(module, "sample_categorical", argmax_draw)
        return drawn

    return apply


class SlicedHeadDrafter(torch.nn.Module):
    """The pruned-drafter protocol in its simplest form, for tests: a causal LM whose logits are restricted to
    `kept_token_ids`, with an optional RDK kernel (`rdk_indices`, `rdk_weights`)."""

    def __init__(self, model, kept_token_ids, rdk_indices=None, rdk_weights=None):
        super().__init__()
        self.inner = model
        self.config = model.config
        self.register_buffer("kept_token_ids", kept_token_ids)
        self.rdk_indices, self.rdk_weights = rdk_indices, rdk_weights

    @property
    def device(self):
        return self.inner.device

    def forward(self, **kwargs):
        out = self.inner(**kwargs)
        out.logits = out.logits[..., self.kept_token_ids]
        return out


def nearest_neighbour_kernel(model, kept_token_ids, neighbours=3, temperature=1.0):
    """Each kept token keeps mass for itself and sends some to its most similar pruned tokens (by head rows)."""
    head = torch.nn.functional.normalize(model.lm_head.weight.detach(), dim=-1)
    pruned = torch.tensor(sorted(set(range(head.shape[0])) - set(kept_token_ids.tolist())))
    similarity = head[kept_token_ids] @ head[pruned].T
    top = similarity.topk(neighbours, dim=-1)
    indices = torch.cat([kept_token_ids[:, None], pruned[top.indices]], dim=1)
    scores = torch.cat([torch.ones(len(kept_token_ids), 1), top.values], dim=1)
    return indices, torch.softmax(scores / temperature, dim=-1)


@pytest.fixture(scope="session")
def kept_ids():
    """Half of the vocabulary, special tokens included."""
    return torch.tensor(sorted({0, 1, EOS} | set(range(4, VOCAB, 2))))


@pytest.fixture(scope="session")
def pruned_draft(close_draft, kept_ids):
    return SlicedHeadDrafter(close_draft, kept_ids)


@pytest.fixture(scope="session")
def rdk_draft(close_draft, kept_ids):
    return SlicedHeadDrafter(close_draft, kept_ids, *nearest_neighbour_kernel(close_draft, kept_ids))


def with_entropy(target: float, vocab: int = 64) -> torch.Tensor:
    """A (1, vocab) float32 row q = softmax(−β·v) whose entropy is `target` nats (β found by bisection)."""
    ranks = torch.arange(vocab, dtype=torch.float64)

    def h(beta: float) -> float:
        q = torch.softmax(-beta * ranks, -1)
        return float(torch.special.entr(q).sum())

    assert 0 < target < math.log(vocab)
    low, high = 0.0, 100.0  # h decreases from ln(vocab) at β = 0
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if h(mid) > target else (low, mid)
    return torch.softmax(-low * ranks, -1).float()[None]
