"""A draft whose vocabulary differs from the target's by padding only (rows past the tokenizer's last id, as
Qwen2.5-7B's 152064 against Qwen2.5-0.5B's 151936) is accepted when the call passes the tokenizer, for every rule,
greedy and sampled, in batches and on static caches; drafts stay among the shared ids, q gives the target's padding
ids probability 0, and a padding id the target emits reaches the draft as the draft's last id."""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB, batch_of, perturbed_copy, prompt, tiny_llama, tiny_tokenizer
from test_batched import PAD, left_padded
from test_exact_rule import chi_square_p_value
from transformers import LlamaForCausalLM, LogitsProcessor, LogitsProcessorList

import hf_semspec
from hf_semspec import SemSpecConfigError
from hf_semspec.drafting import ModelDrafter
from hf_semspec.processors import BatchProcessors
from hf_semspec.rules import RULES

PADDING = 8  # rows past the tokenizer's last id


def padded(model: LlamaForCausalLM, extra: int, head_scale: float = 0.0, seed: int = 0) -> LlamaForCausalLM:
    """`model` with `extra` padding rows in its embedding and head: zero embeddings, and head rows `head_scale` times
    a random row (0: logit 0, a small mass next to the tiny models' spread logits)."""
    config = model.config.__class__(**{**model.config.to_dict(), "vocab_size": model.config.vocab_size + extra})
    bigger = LlamaForCausalLM(config).eval()
    state = model.state_dict()
    g = torch.Generator().manual_seed(seed)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        rows = torch.randn(extra, state[name].shape[1], generator=g) * head_scale * state[name].std()
        if name.startswith("model."):
            rows = torch.zeros_like(rows)
        state[name] = torch.cat([state[name], rows])
    bigger.load_state_dict(state)
    return bigger


@pytest.fixture(scope="module")
def padded_target(target):
    model = padded(target, PADDING)
    hf_semspec.attach(model)
    yield model
    hf_semspec.detach(model)


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()  # VOCAB ids


def test_without_a_tokenizer_the_error_says_to_pass_one(padded_target, close_draft):
    with pytest.raises(SemSpecConfigError, match=r"vocab_size\)` = 128.*136.*padding only.*pass tokenizer="):
        padded_target.generate(prompt(6), assistant_model=close_draft, acceptance="exact", max_new_tokens=4)


def test_ids_of_the_tokenizer_past_a_vocabulary_are_named(padded_target, close_draft, tokenizer):
    """A tokenizer with two more real tokens than the draft has rows: not padding."""
    bigger = tiny_tokenizer()
    bigger.add_tokens(["<extra_a>", "<extra_b>"])
    assert len(bigger) == VOCAB + 2
    with pytest.raises(SemSpecConfigError, match=r"`assistant_model \(vocab_size\)` = 128.*130 ids.*ids 128\.\.129 "
                                                 r"\(128 '<extra_a>', 129 '<extra_b>'\) are real tokens that the draft"):
        padded_target.generate(prompt(6), assistant_model=close_draft, acceptance="exact", max_new_tokens=4,
                               tokenizer=bigger)
    # Equal sizes need no tokenizer; a tokenizer that fits passes.
    padded_target.generate(prompt(6), assistant_model=close_draft, acceptance="exact", max_new_tokens=2,
                           tokenizer=tokenizer)


@pytest.mark.parametrize("cache_implementation", [None, "static"])
@pytest.mark.parametrize("padded_side", ["target", "draft"])
def test_greedy_exact_equals_plain_greedy_in_a_batch(target, close_draft, tokenizer, padded_side,
                                                      cache_implementation):
    big_target = padded(target, PADDING) if padded_side == "target" else target
    draft = padded(close_draft, PADDING, seed=1) if padded_side == "draft" else close_draft
    hf_semspec.attach(big_target)
    rows, ids, mask = left_padded()
    out = big_target.generate(ids, attention_mask=mask, assistant_model=draft, acceptance="exact", tokenizer=tokenizer,
                              max_new_tokens=20, eos_token_id=None, pad_token_id=PAD,
                              cache_implementation=cache_implementation, return_dict_in_generate=True)
    for i, row in enumerate(rows):
        plain = type(big_target).generate(big_target, row[None], max_new_tokens=20, eos_token_id=None,
                                          do_sample=False)
        assert out.sequences[i, ids.shape[1]:].tolist() == plain[0, len(row):].tolist()
    assert out.acceptance_stats.num_accepted > 0  # the pair really agrees: drafts were kept
    hf_semspec.detach(big_target)


@pytest.mark.parametrize("do_sample", [False, True])
@pytest.mark.parametrize("name", RULES.names())
def test_every_rule_decodes_with_a_padded_target(padded_target, close_draft, rdk_draft, tokenizer, name, do_sample):
    rule = RULES.get(name)
    if not (rule.supports_sampling if do_sample else rule.supports_greedy):
        pytest.skip(f"{name} does not define do_sample={do_sample}")
    draft = rdk_draft if rule.redistributes_draft else close_draft
    rows, ids, mask = left_padded()
    torch.manual_seed(0)
    out = padded_target.generate(ids, attention_mask=mask, assistant_model=draft, acceptance=name, tokenizer=tokenizer,
                                 do_sample=do_sample, max_new_tokens=12, min_new_tokens=12, pad_token_id=PAD,
                                 return_dict_in_generate=True)
    assert out.sequences.shape == (3, ids.shape[1] + 12)
    assert [s.num_new_tokens for s in out.acceptance_stats_per_row] == [12] * 3


@pytest.mark.parametrize("do_sample", [False, True])
def test_drafts_stay_among_the_shared_ids_and_q_is_zero_on_the_target_s_padding(close_draft, do_sample):
    ids = prompt(6)
    # The draft's rows beyond the target's: cut off. (A draft padded with rows of large logits would draft them.)
    wide_draft = padded(close_draft, PADDING, head_scale=50.0)
    for model, target_vocab in ((close_draft, VOCAB + PADDING), (wide_draft, VOCAB)):
        drafter = ModelDrafter(model, BatchProcessors(LogitsProcessorList(), 1), do_sample=do_sample,
                               return_probs=True, output_device=ids.device, vocab_size=target_vocab)
        torch.manual_seed(0)
        block = drafter.draft(batch_of(ids), 6)
        assert block.probs.shape == (1, 6, target_vocab)
        assert int(block.tokens.max()) < VOCAB
        torch.testing.assert_close(block.probs.sum(-1), torch.ones(1, 6))
        if target_vocab > VOCAB:
            assert bool((block.probs[..., VOCAB:] == 0).all())


class ForceAt(LogitsProcessor):
    """Forces `token` as the new token at `index` (the target's choice, greedy), like a processor that allows a
    padding id."""

    def __init__(self, prompt_length: int, index: int, token: int):
        self.at, self.token = prompt_length + index, token

    def __call__(self, input_ids, scores):
        if input_ids.shape[1] == self.at:
            scores = torch.full_like(scores, float("-inf"))
            scores[:, self.token] = 0.0
        return scores


@pytest.mark.parametrize("cache_implementation", [None, "static"])
def test_a_padding_id_the_target_emits_reaches_the_draft_as_its_last_id(padded_target, close_draft, tokenizer,
                                                                          cache_implementation):
    ids = prompt(6)
    padding_id = VOCAB + 2
    processors = LogitsProcessorList([ForceAt(ids.shape[1], 3, padding_id)])
    seen = []
    handle = close_draft.model.embed_tokens.register_forward_pre_hook(lambda m, args: seen.append(args[0].clone()))
    try:
        out = padded_target.generate(ids, assistant_model=close_draft, acceptance="exact", tokenizer=tokenizer,
                                     logits_processor=processors, max_new_tokens=12, eos_token_id=None,
                                     cache_implementation=cache_implementation)
    finally:
        handle.remove()
    plain = type(padded_target).generate(padded_target, ids, logits_processor=processors, max_new_tokens=12,
                                         eos_token_id=None, do_sample=False)
    assert out.tolist() == plain.tolist() and out[0, ids.shape[1] + 3] == padding_id  # the output keeps it
    fed = torch.cat([s.flatten() for s in seen])
    assert int(fed.max()) == VOCAB - 1  # the draft saw its last id in its place, and nothing past its rows


def word_tokenizer(size: int):
    """A tokenizer of `size` ids (the first four special), for models of that many real tokens."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<s>", "<unk>", "</s>"] + [f"w{i}" for i in range(size - 4)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")


def test_sampled_exact_with_a_padded_target_is_distributed_as_the_target():
    """A 16-token draft, a target padded to 20 whose padding rows carry real mass (so it emits them, and the draft is
    fed its last id there): each row's first token is distributed as the target's p over all 20 ids, and a row
    goes on after a padding id."""
    base = tiny_llama(seed=0, vocab_size=16)
    draft = perturbed_copy(base, scale=0.8, seed=4)
    target = padded(base, 4, head_scale=1.0, seed=3)
    hf_semspec.attach(target)
    ids = prompt(5, seed=0) % 16
    torch.manual_seed(5)
    out = target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=draft, acceptance="exact",
                          tokenizer=word_tokenizer(16), do_sample=True, temperature=1.5, num_return_sequences=600,
                          max_new_tokens=3, min_new_tokens=3, num_assistant_tokens=3, pad_token_id=PAD)
    hf_semspec.detach(target)
    with torch.no_grad():
        p = torch.softmax(target(ids).logits[0, -1] / 1.5, -1)
    assert float(p[16:].sum()) > 0.05  # the test has power over the padding ids
    counts = torch.bincount(out[:, 5], minlength=20)
    assert chi_square_p_value(counts[p > 0.02], p[p > 0.02] / p[p > 0.02].sum()) > 1e-3
    assert bool((out[:, 5:] >= 16).any())


def test_a_pruned_drafter_is_checked_by_its_kept_ids(attached, close_draft, kept_ids):
    """A pruned drafter proposes only its kept ids: over a padded backbone it needs no tokenizer, but a kept id the
    target has no row for is refused, naming it."""
    from conftest import SlicedHeadDrafter

    backbone = padded(close_draft, PADDING)
    fine = SlicedHeadDrafter(backbone, kept_ids)
    out = attached.generate(prompt(6), assistant_model=fine, acceptance="exact", max_new_tokens=6, eos_token_id=None)
    plain = type(attached).generate(attached, prompt(6), max_new_tokens=6, eos_token_id=None, do_sample=False)
    assert out.tolist() == plain.tolist()
    beyond = SlicedHeadDrafter(backbone, torch.cat([kept_ids, torch.tensor([VOCAB + 1])]))
    with pytest.raises(SemSpecConfigError, match=r"`assistant_model.kept_token_ids` = 'ids up to 129'.*below the "
                                                 r"target's vocab_size 128"):
        attached.generate(prompt(6), assistant_model=beyond, acceptance="exact", max_new_tokens=4)


@pytest.mark.parametrize("cache_implementation", [None, "static"])
def test_greedy_exact_with_a_wider_draft_whose_padding_scores_high(target, close_draft, tokenizer,
                                                                   cache_implementation):
    """Greedy `exact` with no processors drafts by `drafting.greedy_pick` (no full-vocabulary tensor): its argmax must
    run over the target's ids only. Here the draft's padding rows outscore every real token, so an argmax over the
    draft's own width would draft ids the target has no row for."""
    wide_draft = padded(close_draft, PADDING, head_scale=50.0)
    with torch.no_grad():
        logits = wide_draft(prompt(6)).logits[0]
    assert (logits.argmax(-1) >= VOCAB).any(), "the padding must win somewhere for the test to mean anything"
    hf_semspec.attach(target)
    try:
        ids = prompt(6)
        out = target.generate(ids, assistant_model=wide_draft, acceptance="exact", tokenizer=tokenizer,
                              num_assistant_tokens=4, max_new_tokens=16, cache_implementation=cache_implementation)
        assert torch.equal(out, type(target).generate(target, ids, max_new_tokens=16, do_sample=False))
    finally:
        hf_semspec.detach(target)
