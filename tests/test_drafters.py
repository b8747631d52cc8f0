"""Pruned-vocabulary drafters (`hf_semspec.drafters`): keep-set selection, the sliced head, save/load (local folder
and Hub repo id), tied embeddings, the RDK kernel, end-to-end decoding, `push_to_hub`, and bad input.

Everything runs on the tiny Llama models of conftest.py (vocabulary 128) and a tiny word-level tokenizer built here
in memory (no download)."""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest
import torch
from conftest import EOS, VOCAB, batch_of, perturbed_copy, prompt, tiny_llama
from huggingface_hub import ModelCard
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    DynamicCache,
    LogitsProcessorList,
    PreTrainedTokenizerFast,
    TemperatureLogitsWarper,
)

from hf_semspec._transformers_compat import CACHE_ARGUMENT
from hf_semspec.drafters import (
    PrunedVocabDrafter,
    build_rdk_kernel,
    load_corpus_texts,
    prune_vocabulary,
    special_token_ids,
)
from hf_semspec.drafting import ModelDrafter
from hf_semspec.errors import SemSpecConfigError
from hf_semspec.processors import BatchProcessors

WORDS = (
    "the cat sat on a mat dog ran to park and it was sunny today we like code python list sort def return "
    "if else for in range print x y"
).split()
# ids: <pad>=0 <s>=1 <unk>=2 </s>=3, then WORDS from 4 (the=4, cat=5, sat=6, on=7, a=8, mat=9, dog=10, ran=11, ...),
# then the added tokens <|im_start|> (not flagged special, only in the chat template) and <|im_end|> (special).
WORD_ID = {w: i + 4 for i, w in enumerate(WORDS)}
IM_START, IM_END = len(WORDS) + 4, len(WORDS) + 5
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant{% endif %}"
)


def make_tokenizer(words=WORDS) -> PreTrainedTokenizerFast:
    vocab = {"<pad>": 0, "<s>": 1, "<unk>": 2, "</s>": 3}
    for w in words:
        vocab[w] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    tok.add_tokens([AddedToken("<|im_start|>", special=False, normalized=False)])
    tok.add_tokens([AddedToken("<|im_end|>", special=True, normalized=False)], special_tokens=True)
    tok.chat_template = CHAT_TEMPLATE
    return tok


SPECIALS = [0, 1, 2, EOS, IM_START, IM_END]


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="module")
def draft_model(target):
    """The close draft of conftest, with its own copy of the weights (pruning shares the backbone)."""
    return perturbed_copy(target, scale=0.3, seed=2)


def test_tiny_tokenizer_ids(tokenizer):
    assert tokenizer.convert_tokens_to_ids(["the", "dog", "<|im_start|>", "<|im_end|>"]) == [4, 10, IM_START, IM_END]
    assert special_token_ids(tokenizer, None, VOCAB) == SPECIALS  # <|im_start|> only via the chat template


# -- keep-set selection ---------------------------------------------------------------------------------------------


def test_keep_set_by_frequency_on_worked_corpus(draft_model, tokenizer):
    # counts: dog 3, mat 2, then cat / sat / on / ran 1 each; the specials never occur.
    corpus = ["dog dog dog ran", "mat mat cat", "sat on"]
    drafter = prune_vocabulary(draft_model, tokenizer, corpus, keep=len(SPECIALS) + 4)
    # 4 non-special slots: dog, mat, then the tie at count 1 goes to the lower ids cat (5) and sat (6).
    expected = sorted(SPECIALS + [WORD_ID["dog"], WORD_ID["mat"], WORD_ID["cat"], WORD_ID["sat"]])
    assert drafter.kept_token_ids.tolist() == expected
    selection = drafter.pruning_info["selection"]
    assert selection["method"] == "frequency"
    assert selection["corpus"] == {"source": "3 in-memory texts", "num_texts": 3, "num_tokens": 9, "distinct_tokens": 6}
    assert selection["coverage"] == pytest.approx(7 / 9)  # dog 3 + mat 2 + cat 1 + sat 1 of 9
    assert selection["special_token_ids"] == SPECIALS


def test_keep_fraction_fills_unseen_tokens_by_lowest_id(draft_model, tokenizer):
    drafter = prune_vocabulary(draft_model, tokenizer, ["dog dog cat"], keep=0.25)
    assert drafter.num_kept == 32  # round(0.25 * 128)
    kept = drafter.kept_token_ids.tolist()
    assert {WORD_ID["dog"], WORD_ID["cat"]} <= set(kept) and set(SPECIALS) <= set(kept)
    unseen = sorted(set(range(VOCAB)) - set(SPECIALS) - {WORD_ID["dog"], WORD_ID["cat"]})
    assert set(kept) - set(SPECIALS) - {WORD_ID["dog"], WORD_ID["cat"]} == set(unseen[: 32 - len(SPECIALS) - 2])
    assert drafter.pruning_info["selection"]["kept_unseen"] == 32 - 2  # every kept token but dog and cat (specials too)


def test_special_tokens_always_kept(target, tokenizer):
    model = perturbed_copy(target, scale=0.3, seed=5)
    model.generation_config.eos_token_id = [EOS, 120]  # an extra EOS id in the generation config
    specials = special_token_ids(tokenizer, model, VOCAB)
    assert specials == sorted(SPECIALS + [120])
    drafter = prune_vocabulary(model, tokenizer, ["dog cat " * 50], keep=len(specials))
    assert drafter.kept_token_ids.tolist() == specials  # the specials win over frequent words
    assert IM_START in specials  # a chat-template control token the tokenizer does not flag as special


def test_keep_ids_adds_special_tokens(draft_model, tokenizer):
    drafter = prune_vocabulary(draft_model, tokenizer, keep_ids=[50, 10, 50])
    assert drafter.kept_token_ids.tolist() == sorted(SPECIALS + [10, 50])
    assert drafter.pruning_info["selection"]["method"] == "explicit"


def test_jsonl_corpus_layouts(tmp_path, draft_model, tokenizer):
    records = [
        {"question_id": 1, "category": "writing", "turns": ["dog dog", "ran"]},  # Spec-Bench
        {"text": "mat mat"},
        {"prompt": "cat"},
        {"question": "sat", "answer": "on #### 4"},  # GSM8K
        {"messages": [{"role": "user", "content": "dog"}]},
    ]
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n\n", encoding="utf-8")
    assert load_corpus_texts(path) == ["dog dog", "ran", "mat mat", "cat", "sat", "on #### 4", "dog"]
    from_file = prune_vocabulary(draft_model, tokenizer, str(path), keep=len(SPECIALS) + 3)
    from_list = prune_vocabulary(draft_model, tokenizer, load_corpus_texts(path), keep=len(SPECIALS) + 3)
    assert torch.equal(from_file.kept_token_ids, from_list.kept_token_ids)
    assert from_file.pruning_info["selection"]["corpus"]["source"] == "corpus.jsonl (7 texts)"
    # dog 3, mat 2, then the lowest id among the count-1 tokens: cat (5)
    assert set(from_file.kept_token_ids.tolist()) - set(SPECIALS) == {WORD_ID["dog"], WORD_ID["mat"], WORD_ID["cat"]}


def test_corpus_lines_end_only_at_newlines(tmp_path):
    # json.dumps(ensure_ascii=False) leaves U+2028, U+2029 and U+0085 unescaped inside strings: still one record a line.
    texts = ["a\u2028b", "c\u2029d", "e\u0085f"]
    jsonl = tmp_path / "corpus.jsonl"
    jsonl.write_text("\r\n".join(json.dumps({"text": t}, ensure_ascii=False) for t in texts) + "\n", encoding="utf-8")
    assert load_corpus_texts(jsonl) == texts
    txt = tmp_path / "corpus.txt"
    txt.write_text("\n".join(texts) + "\r\n\n", encoding="utf-8")
    assert load_corpus_texts(txt) == texts


def test_calibration_counts_the_models_greedy_generations(draft_model, tokenizer):
    prompts = ["the cat", "we like code"]
    generated = []
    for p in prompts:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
        out = type(draft_model).generate(draft_model, ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
        generated += out[0, ids.shape[1]:].tolist()
    counts = torch.bincount(torch.tensor(generated), minlength=VOCAB)
    drafter = prune_vocabulary(
        draft_model, tokenizer, calibration_prompts=prompts, calibration_max_new_tokens=6, keep=len(SPECIALS) + 2
    )
    counts[SPECIALS] = -1
    order = sorted(range(VOCAB), key=lambda i: (-int(counts[i]), i))[:2]
    assert drafter.kept_token_ids.tolist() == sorted(SPECIALS + order)
    calibration = drafter.pruning_info["selection"]["calibration"]
    assert calibration["num_tokens"] == len(generated) and calibration["num_prompts"] == 2
    assert calibration["is_drafter"] and calibration["chat_template"]
    assert drafter.pruning_info["selection"]["method"] == "calibration"


# -- the sliced head -----------------------------------------------------------------------------------------------


def test_logits_are_the_base_models_kept_logits_with_a_sliced_head(draft_model, tokenizer):
    drafter = prune_vocabulary(draft_model, tokenizer, ["dog cat"], keep=0.5)
    assert drafter.lm_head.weight.shape == (64, draft_model.config.hidden_size)  # (K, hidden), not (N, hidden)
    ids = prompt(8)
    full = draft_model(input_ids=ids).logits[..., drafter.kept_token_ids]
    pruned = drafter(input_ids=ids).logits
    assert pruned.shape == (1, 8, 64)
    torch.testing.assert_close(pruned, full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(drafter(input_ids=ids, logits_to_keep=1).logits, full[:, -1:], rtol=1e-5, atol=1e-5)


def test_the_cache_goes_to_the_backbone_by_keyword_only(draft_model, tokenizer):
    # The forward passes the cache on under the installed transformers' name (`cache` from 5.24); a cache passed
    # second, where the signature took it before, would have landed in `use_cache` and been silently ignored.
    drafter = prune_vocabulary(draft_model, tokenizer, ["dog cat"], keep=0.5)
    ids = prompt(8)
    cache = DynamicCache()
    drafter(input_ids=ids[:, :5], use_cache=True, **{CACHE_ARGUMENT: cache})
    assert cache.get_seq_length() == 5
    step = drafter(input_ids=ids[:, 5:], use_cache=True, **{CACHE_ARGUMENT: cache})
    assert getattr(step, CACHE_ARGUMENT) is cache and cache.get_seq_length() == 8
    torch.testing.assert_close(step.logits, drafter(input_ids=ids).logits[:, 5:], rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match="positional"):
        drafter(ids, DynamicCache())


# -- save / load -----------------------------------------------------------------------------------------------------


def test_save_load_round_trip_gives_identical_logits(tmp_path, draft_model, tokenizer):
    drafter = prune_vocabulary(draft_model, tokenizer, ["dog cat sat"], keep=20, rdk=True, rdk_temperature=0.5)
    files = drafter.save_pretrained(tmp_path)
    assert {"config.json", "model.safetensors", "pruned_head.safetensors", "pruning_config.json", "tokenizer.json"} <= set(files)
    loaded = PrunedVocabDrafter.from_pretrained(tmp_path)
    ids = prompt(10)
    assert torch.equal(loaded(input_ids=ids).logits, drafter(input_ids=ids).logits)
    assert torch.equal(loaded.kept_token_ids, drafter.kept_token_ids)
    assert torch.equal(loaded.rdk_indices, drafter.rdk_indices) and torch.equal(loaded.rdk_weights, drafter.rdk_weights)
    assert loaded.config.vocab_size == VOCAB and loaded.tokenizer.convert_tokens_to_ids("dog") == WORD_ID["dog"]
    info = json.loads((tmp_path / "pruning_config.json").read_text())
    assert info["keep_size"] == 20 and info["vocab_size"] == VOCAB and info["keep_fraction"] == pytest.approx(20 / VOCAB)
    assert info["rdk"]["neighbours"] == 8 and info["rdk"]["temperature"] == 0.5
    assert info["selection"]["corpus"]["num_tokens"] == 3 and not info["tied_head"]
    with safe_open(tmp_path / "model.safetensors", "pt") as f:  # the backbone only, keys as in the causal LM
        assert not [k for k in f.keys() if k.startswith("lm_head")] and "model.embed_tokens.weight" in f.keys()
    bf16 = PrunedVocabDrafter.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert bf16.dtype == torch.bfloat16 and bf16.rdk_weights.dtype == torch.float32


def test_tied_embedding_drafter_stores_the_head_once(tmp_path, tokenizer):
    model = tiny_llama(seed=3, tie_word_embeddings=True)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    drafter = prune_vocabulary(model, tokenizer, ["dog cat sat on a mat"], keep=0.5)
    assert drafter.tied
    drafter.save_pretrained(tmp_path)
    head = load_file(tmp_path / "pruned_head.safetensors")
    assert set(head) == {"kept_token_ids"}  # no head rows: they are the embedding's
    backbone = load_file(tmp_path / "model.safetensors")
    assert [k for k in backbone if "embed_tokens" in k or "lm_head" in k] == ["model.embed_tokens.weight"]
    hidden = model.config.hidden_size
    assert (tmp_path / "pruned_head.safetensors").stat().st_size < 64 * 8 + 1024  # K int64 ids + header
    assert sum(v.numel() for v in backbone.values()) == sum(p.numel() for p in model.model.parameters())

    loaded = PrunedVocabDrafter.from_pretrained(tmp_path)
    ids = prompt(10)
    assert torch.equal(loaded(input_ids=ids).logits, drafter(input_ids=ids).logits)
    # transformers' tie logic ran while loading the backbone; the head is still the K sliced rows, not the embedding
    assert loaded.lm_head.weight.shape == (64, hidden)
    assert loaded.lm_head.weight.data_ptr() != loaded.model.embed_tokens.weight.data_ptr()
    torch.testing.assert_close(loaded.lm_head.weight, loaded.model.embed_tokens.weight[loaded.kept_token_ids])
    # re-tying the base model (as resize_token_embeddings / from_pretrained do) does not reach the drafter's head
    model.tie_weights()
    assert drafter.lm_head.weight.shape == (64, hidden)
    assert torch.equal(drafter(input_ids=ids).logits, loaded(input_ids=ids).logits)


def _populate_hub_cache(cache_dir: pathlib.Path, repo_id: str, folder: pathlib.Path) -> None:
    """The layout `huggingface_hub` gives a downloaded model repo: models--owner--name/{refs/main, snapshots/<sha>}."""
    sha = "0123456789abcdef0123456789abcdef01234567"
    repo = cache_dir / ("models--" + repo_id.replace("/", "--"))
    shutil.copytree(folder, repo / "snapshots" / sha)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(sha)


def test_from_pretrained_with_a_repo_id(tmp_path, draft_model, tokenizer):
    """The repo-id path goes through `huggingface_hub.snapshot_download`. There is no Hub here, so the test points
    `cache_dir` at a temporary Hub cache populated with the saved files and passes `local_files_only=True`:
    `snapshot_download` resolves `refs/main` to the snapshot folder as it would after a real download."""
    drafter = prune_vocabulary(draft_model, tokenizer, ["dog cat"], keep=30)
    drafter.save_pretrained(tmp_path / "saved")
    _populate_hub_cache(tmp_path / "cache", "someone/tiny-pruned", tmp_path / "saved")
    loaded = PrunedVocabDrafter.from_pretrained("someone/tiny-pruned", cache_dir=tmp_path / "cache", local_files_only=True)
    ids = prompt(6)
    assert torch.equal(loaded(input_ids=ids).logits, drafter(input_ids=ids).logits)
    with pytest.raises(SemSpecConfigError, match=r"`pretrained_model_name_or_path` = 'someone/missing'.*Fix: check the id"):
        PrunedVocabDrafter.from_pretrained("someone/missing", cache_dir=tmp_path / "cache", local_files_only=True)


def test_moving_to_bfloat16_keeps_the_kernel_exact(draft_model, tokenizer):
    drafter = prune_vocabulary(perturbed_copy(draft_model, 0.0, 0), tokenizer, ["dog"], keep=20, rdk=True, rdk_temperature=1.0)
    weights = drafter.rdk_weights.clone()
    drafter.to(torch.bfloat16)
    assert drafter.lm_head.weight.dtype == torch.bfloat16
    assert drafter.rdk_weights.dtype == torch.float32 and torch.equal(drafter.rdk_weights, weights)


# -- the RDK kernel --------------------------------------------------------------------------------------------------


def test_kernel_rows_and_neighbours_on_a_constructed_case():
    # kept 0 and 1; pruned 2..6. Token 0 points along x, token 1 along y.
    embeddings = torch.tensor(
        [
            [1.0, 0.0, 0.0],  # 0 kept
            [0.0, 1.0, 0.0],  # 1 kept
            [1.0, 0.2, 0.0],  # 2: close to 0
            [1.0, 1.0, 0.0],  # 3: between 0 and 1 (cos 0.707 with both)
            [0.1, 1.0, 0.0],  # 4: close to 1
            [-1.0, 0.0, 0.0],  # 5: opposite of 0
            [0.0, 0.0, 1.0],  # 6: orthogonal to both
        ]
    )
    kept = torch.tensor([0, 1])
    candidates = torch.arange(2, 7)
    indices, weights = build_rdk_kernel(embeddings, kept, candidates, neighbours=2, temperature=0.5)
    assert indices.tolist() == [[0, 2, 3], [1, 4, 3]]  # self, then the two most similar pruned tokens
    cos = torch.nn.functional.normalize(embeddings, dim=-1) @ torch.nn.functional.normalize(embeddings, dim=-1).T
    expected0 = torch.softmax(torch.tensor([1.0, cos[0, 2], cos[0, 3]]) / 0.5, -1)
    torch.testing.assert_close(weights[0], expected0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2))
    assert (weights[:, 0] > weights[:, 1]).all() and (weights[:, 1] >= weights[:, 2]).all()
    # computing one similarity at a time gives the same kernel
    chunked = build_rdk_kernel(embeddings, kept, candidates, neighbours=2, temperature=0.5, chunk_elements=1)
    assert torch.equal(chunked[0], indices) and torch.equal(chunked[1], weights)
    # fewer candidates than m: rows shrink; none: identity
    few = build_rdk_kernel(embeddings, kept, torch.tensor([6]), neighbours=8, temperature=0.5)
    assert few[0].shape == (2, 2)
    identity = build_rdk_kernel(embeddings, kept, torch.zeros(0, dtype=torch.long))
    assert identity[0].tolist() == [[0], [1]] and identity[1].tolist() == [[1.0], [1.0]]


def test_kernel_uses_the_targets_head_and_only_reachable_pruned_tokens(target, draft_model, tokenizer):
    drafter = prune_vocabulary(draft_model, tokenizer, ["dog cat"], keep=20, rdk=True, rdk_neighbours=3, target_model=target)
    kept = set(drafter.kept_token_ids.tolist())
    neighbours = drafter.rdk_indices[:, 1:]
    assert drafter.rdk_indices.shape == (20, 4)
    assert torch.equal(drafter.rdk_indices[:, 0], drafter.kept_token_ids)
    assert not (set(neighbours.flatten().tolist()) & kept)
    assert int(neighbours.max()) < len(tokenizer)  # ids the tokenizer never produces receive nothing
    unit = torch.nn.functional.normalize(target.lm_head.weight.detach(), dim=-1)
    candidates = torch.tensor(sorted(set(range(len(tokenizer))) - kept))
    best = (unit[drafter.kept_token_ids] @ unit[candidates].T).topk(3).indices
    assert torch.equal(neighbours, candidates[best])
    torch.testing.assert_close(drafter.rdk_weights.sum(-1), torch.ones(20))
    assert "target" in drafter.pruning_info["rdk"]["similarity"]


# -- end to end ------------------------------------------------------------------------------------------------------


def test_exact_with_pruned_drafter_equals_plain_greedy(attached, draft_model, tokenizer):
    drafter = prune_vocabulary(draft_model, tokenizer, ["dog cat sat on a mat"], keep=0.5)
    ids = prompt(8)
    out = attached.generate(ids, assistant_model=drafter, acceptance="exact", do_sample=False, max_new_tokens=24,
                            return_dict_in_generate=True)
    plain = type(attached).generate(attached, ids, do_sample=False, max_new_tokens=24)
    assert torch.equal(out.sequences, plain)
    assert out.acceptance_stats.num_accepted > 0


def test_rdk_samples_and_drafts_pruned_tokens(attached, draft_model, tokenizer):
    # keep only half of the tokenizer's words so that pruned, reachable tokens exist; a high τ moves visible mass
    drafter = prune_vocabulary(draft_model, tokenizer, ["dog cat sat"], keep=len(SPECIALS) + 12, rdk=True,
                               rdk_temperature=2.0, rdk_neighbours=4)
    kept = set(drafter.kept_token_ids.tolist())
    torch.manual_seed(0)
    out = attached.generate(prompt(8), assistant_model=drafter, acceptance="rdk", do_sample=True, max_new_tokens=20,
                            return_dict_in_generate=True)
    assert out.acceptance_stats.num_drafted > 0
    drafted = []
    for seed in range(5):
        model_drafter = ModelDrafter(drafter, BatchProcessors(LogitsProcessorList([TemperatureLogitsWarper(1.0)]), 1),
                                     do_sample=True,
                                     return_probs=True, output_device=torch.device("cpu"), vocab_size=VOCAB,
                                     redistribute=True)
        drafted += model_drafter.draft(batch_of(prompt(8, seed=seed)), 8).tokens[0].tolist()
    assert set(drafted) - kept  # out-of-vocabulary drafts happen


# -- push_to_hub -----------------------------------------------------------------------------------------------------


class RecordingApi:
    """Stands in for `huggingface_hub.HfApi`: records the calls and keeps a copy of the uploaded folder."""

    def __init__(self, keep_dir: pathlib.Path):
        self.calls: list[tuple[str, dict]] = []
        self.keep_dir = keep_dir

    def create_repo(self, **kwargs):
        self.calls.append(("create_repo", kwargs))
        return f"https://huggingface.co/{kwargs['repo_id']}"

    def upload_folder(self, **kwargs):
        self.calls.append(("upload_folder", kwargs))
        shutil.copytree(kwargs["folder_path"], self.keep_dir)
        return "commit-info"


def test_push_to_hub_uploads_weights_tokenizer_custom_generate_and_card(tmp_path, draft_model, tokenizer):
    """There is no Hub here: `push_to_hub` gets a recording stand-in for `HfApi` (`api=`), which checks the calls
    and keeps the uploaded folder; everything before the upload call is the real code path."""
    drafter = prune_vocabulary(draft_model, tokenizer, ["dog dog cat", "sat on a mat"], keep=0.25, rdk=True,
                               corpus_label="two toy sentences", base_model="someone/tiny-llama", license="mit")
    api = RecordingApi(tmp_path / "uploaded")
    result = drafter.push_to_hub("someone/tiny-pruned", token="hf_x", private=True, api=api)
    assert result == "commit-info"
    assert [name for name, _ in api.calls] == ["create_repo", "upload_folder"]
    create, upload = api.calls[0][1], api.calls[1][1]
    assert create["repo_id"] == "someone/tiny-pruned" and create["private"] is True and create["exist_ok"] is True
    assert upload["repo_id"] == "someone/tiny-pruned" and upload["token"] == "hf_x" and upload["repo_type"] == "model"
    uploaded = {str(p.relative_to(api.keep_dir)) for p in api.keep_dir.rglob("*") if p.is_file()}
    assert {
        "README.md", "config.json", "generation_config.json", "model.safetensors", "pruned_head.safetensors",
        "pruning_config.json", "tokenizer.json", "tokenizer_config.json",
        "custom_generate/generate.py", "custom_generate/requirements.txt",
    } <= uploaded
    card = ModelCard.load(api.keep_dir / "README.md")
    metadata = card.data.to_dict()
    assert metadata["library_name"] == "hf_semspec" and metadata["base_model"] == "someone/tiny-llama"
    assert metadata["license"] == "mit" and {"hf_semspec", "pruned-vocabulary", "rdk"} <= set(metadata["tags"])
    text = card.text
    assert "32 of its\n128 output tokens (25.0%)" in text
    assert "two toy sentences: 2 texts, 7 tokens, 6 distinct" in text
    assert "| special tokens (always kept) | 6 |" in text and "RDK temperature τ" in text
    assert 'PrunedVocabDrafter.from_pretrained("someone/tiny-pruned")' in text and 'acceptance="rdk"' in text
    loaded = PrunedVocabDrafter.from_pretrained(api.keep_dir)  # what was uploaded loads back
    assert torch.equal(loaded(input_ids=prompt(5)).logits, drafter(input_ids=prompt(5)).logits)


def test_push_to_hub_compares_the_head_with_the_embedding_once_for_the_card_and_the_files(tmp_path, tokenizer,
                                                                                          monkeypatch):
    drafter = prune_vocabulary(tiny_llama(seed=3, tie_word_embeddings=True), tokenizer, ["dog cat sat on a mat"],
                               keep=0.5)
    compare = drafter._head_is_embedding
    calls = []
    monkeypatch.setattr(drafter, "_head_is_embedding", lambda: calls.append(1) or compare())
    api = RecordingApi(tmp_path / "uploaded")
    drafter.push_to_hub("someone/tiny-tied", api=api)
    assert len(calls) == 1  # it compares every kept embedding row: once, and both outputs use the answer
    assert json.loads((api.keep_dir / "pruning_config.json").read_text())["tied_head"] is True
    assert "tied to the input embedding: only the kept ids are stored" in ModelCard.load(api.keep_dir / "README.md").text


def test_the_cards_file_list_names_tokenizer_files_only_when_they_are_uploaded(tmp_path, draft_model, tokenizer):
    drafter = prune_vocabulary(draft_model, tokenizer, ["dog cat sat on a mat"], keep=0.5)
    drafter.tokenizer = None  # as after from_pretrained(..., load_tokenizer=False)
    for given, folder in ((None, "without"), (tokenizer, "with")):
        api = RecordingApi(tmp_path / folder)
        drafter.push_to_hub("someone/tiny", tokenizer=given, api=api)
        uploaded = {p.name for p in api.keep_dir.iterdir()}
        card = ModelCard.load(api.keep_dir / "README.md").text
        assert ("tokenizer_config.json" in uploaded) is (given is not None)
        assert ("| tokenizer files | the base model's tokenizer |" in card) is (given is not None)
        assert "| `pruned_head.safetensors` | `kept_token_ids`" in card and "RDK kernel (`rdk_indices`" not in card
    assert "| tokenizer files |" not in drafter.model_card().text


def test_push_to_hub_leaves_the_base_models_local_path_out(tmp_path, tokenizer):
    folder = tmp_path / "home" / "someone" / "base"
    tiny_llama(seed=3).save_pretrained(folder)
    drafter = prune_vocabulary(AutoModelForCausalLM.from_pretrained(folder), tokenizer, ["dog cat"], keep=20)
    drafter.save_pretrained(tmp_path / "local")  # kept locally, where it helps to know the source
    assert json.loads((tmp_path / "local" / "pruning_config.json").read_text())["base_model_path"] == str(folder)
    api = RecordingApi(tmp_path / "uploaded")
    drafter.push_to_hub("someone/tiny", api=api)
    uploaded = json.loads((api.keep_dir / "pruning_config.json").read_text())
    assert uploaded["base_model_path"] == "" and str(folder) not in (api.keep_dir / "README.md").read_text()
    drafter.pruning_info["base_model_path"] = "Org/Tiny-Base"  # a Hub id names nobody's folders: kept
    drafter.push_to_hub("someone/tiny", api=RecordingApi(tmp_path / "uploaded2"))
    assert json.loads((tmp_path / "uploaded2" / "pruning_config.json").read_text())["base_model_path"] == "Org/Tiny-Base"


def test_push_to_hub_rejects_a_bad_repo_id(draft_model, tokenizer, tmp_path):
    drafter = prune_vocabulary(draft_model, tokenizer, keep_ids=[10])
    api = RecordingApi(tmp_path / "never")
    with pytest.raises(SemSpecConfigError, match=r"`repo_id` = 'no-owner' is not valid: allowed a Hub repo id"):
        drafter.push_to_hub("no-owner", api=api)
    assert api.calls == []


# -- bad input -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "keep, match",
    [
        (VOCAB + 1, r"`keep` = 129 is not valid: allowed at most the vocabulary size 128\. Fix: pass keep ≤ 128"),
        (3, r"`keep` = 3 is not valid: allowed at least the number of special tokens, which are always kept \(6\)"),
        (0.0, r"`keep` = 0\.0 is not valid: allowed a fraction in \(0, 1\]"),
        (1.5, r"`keep` = 1\.5 is not valid: allowed a fraction in \(0, 1\]"),
        (-0.25, r"`keep` = -0\.25 is not valid: allowed a fraction in \(0, 1\]"),
        (0.01, r"`keep` = 0\.01 is not valid: allowed a fraction keeping at least the 6 special tokens"),
        (True, r"`keep` = True is not valid: allowed an int in \[6, 128\]"),
    ],
)
def test_bad_keep(draft_model, tokenizer, keep, match):
    with pytest.raises(SemSpecConfigError, match=match):
        prune_vocabulary(draft_model, tokenizer, ["dog"], keep=keep)


def test_keep_takes_numpy_numbers_as_pythons(draft_model, tokenizer):
    import numpy as np

    for keep, size in ((np.int64(20), 20), (np.float32(0.25), 32)):
        assert prune_vocabulary(draft_model, tokenizer, ["dog cat"], keep=keep).num_kept == size


def test_a_missing_tokenizer_is_named(draft_model):
    with pytest.raises(SemSpecConfigError, match=r"`tokenizer` = None is not valid: allowed the model's tokenizer"):
        prune_vocabulary(draft_model, None, ["dog"], keep=20)


def test_a_model_whose_base_model_is_itself_is_refused(draft_model, tokenizer, monkeypatch):
    # As Llama4ForCausalLM: base_model_prefix "language_model", backbone stored as .model, so base_model is the LM.
    monkeypatch.setattr(type(draft_model), "base_model_prefix", "language_model")
    with pytest.raises(SemSpecConfigError, match=r"`model` = 'LlamaForCausalLM' is not valid: allowed a causal LM "
                                                 r"whose backbone is the attribute its base_model_prefix names"):
        prune_vocabulary(draft_model, tokenizer, ["dog"], keep=20)


@pytest.mark.parametrize("corpus", [[], [""], ["   "]])
def test_empty_corpus(draft_model, tokenizer, corpus):
    with pytest.raises(SemSpecConfigError, match=r"`corpus` = .* is not valid: allowed a corpus with at least one token"):
        prune_vocabulary(draft_model, tokenizer, corpus, keep=20)


@pytest.mark.parametrize(
    "keep_ids, message",
    [
        ([5.7, 9.2], r"`keep_ids` = 'a torch.float32 tensor of shape \(2,\)' .*allowed integer token ids"),  # not truncated
        ([True, 9], r"`keep_ids` = \[True, 9\] .*\(True / False are not\)"),
        ([[5, 6], [7]], r"`keep_ids` = \[\[5, 6\], \[7\]\] .*allowed integer token ids \(expected sequence"),
        (torch.tensor([5.0, 9.0]), r"'a torch.float32 tensor of shape \(2,\)'"),
        ("59", r"`keep_ids` = '59' .*allowed integer token ids"),
    ],
)
def test_keep_ids_must_be_integer_ids(draft_model, tokenizer, keep_ids, message):
    with pytest.raises(SemSpecConfigError, match=message):
        prune_vocabulary(draft_model, tokenizer, keep_ids=keep_ids)


def test_keep_ids_take_any_iterable_or_shape_of_ints(draft_model, tokenizer):
    expected = sorted(SPECIALS + [9, 12])
    for keep_ids in ({12, 9}, (i for i in (9, 12)), torch.tensor([12, 9], dtype=torch.int32), range(9, 13, 3),
                     torch.tensor([[9, 12]]), [[9], [12]]):  # e.g. a tokenizer's (1, n) input_ids
        assert prune_vocabulary(draft_model, tokenizer, keep_ids=keep_ids).kept_token_ids.tolist() == expected


@pytest.mark.parametrize("counted", [{"corpus": ["dog"]}, {"calibration_prompts": ["dog"]}])
def test_keep_ids_refuse_what_only_keep_counts(draft_model, tokenizer, counted):
    # They were ignored: the card said "explicit" and nothing told the user the corpus went unread.
    name = next(iter(counted))
    with pytest.raises(SemSpecConfigError, match=rf"`keep_ids` = 'given with {name}' .*Fix: drop {name}"):
        prune_vocabulary(draft_model, tokenizer, keep_ids=[5], **counted)


def test_a_corpus_text_that_names_an_existing_file_is_refused(tmp_path, draft_model, tokenizer):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "dog cat"}\n')
    with pytest.raises(SemSpecConfigError, match=r"`corpus item` = '.*corpus.jsonl' is not valid: .*names an existing "
                                                 r"file\. Fix: pass pathlib.Path\("):
        prune_vocabulary(draft_model, tokenizer, [str(corpus)], keep=20)
    for corpus_given in ([corpus], str(corpus), ["notes.txt"]):  # a Path, a path alone, a name of no file: as before
        assert prune_vocabulary(draft_model, tokenizer, corpus_given, keep=20).num_kept == 20


def test_missing_corpus_and_bad_files(tmp_path, draft_model, tokenizer):
    with pytest.raises(SemSpecConfigError, match=r"`corpus` = None .*and/or calibration_prompts when keep is given"):
        prune_vocabulary(draft_model, tokenizer, keep=20)
    with pytest.raises(SemSpecConfigError, match=r"`keep/keep_ids` .* allowed exactly one of the two"):
        prune_vocabulary(draft_model, tokenizer, ["dog"], keep=20, keep_ids=[5])
    with pytest.raises(SemSpecConfigError, match=r"`corpus` = '.*nowhere.jsonl' is not valid: allowed an existing"):
        prune_vocabulary(draft_model, tokenizer, str(tmp_path / "nowhere.jsonl"), keep=20)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "dog"}\n{"title": "x"}\n')
    with pytest.raises(SemSpecConfigError, match=r"`corpus \(bad.jsonl, line 2\)` = \['title'\] is not valid: allowed records of the layouts"):
        prune_vocabulary(draft_model, tokenizer, str(bad), keep=20)


def test_tokenizer_and_vocabulary_mismatch_with_the_target(target, draft_model, tokenizer):
    other = make_tokenizer(list(reversed(WORDS)))  # same size, other ids
    with pytest.raises(SemSpecConfigError, match=r"`target_tokenizer` = .* allowed a tokenizer mapping text to the same ids.*vocabulary differs"):
        prune_vocabulary(draft_model, tokenizer, ["dog"], keep=20, target_tokenizer=other)
    prune_vocabulary(draft_model, tokenizer, ["dog"], keep=20, target_tokenizer=make_tokenizer())  # same: fine
    with pytest.raises(SemSpecConfigError, match=r"`target_model \(vocab_size\)` = 96 .* the drafter's vocab_size 128"):
        prune_vocabulary(draft_model, tokenizer, ["dog"], keep=20, target_model=tiny_llama(0, vocab_size=96))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"rdk_neighbours": 0}, r"`rdk_neighbours` = 0 is not valid: allowed an int ≥ 1"),
        ({"rdk_temperature": 0.0}, r"`rdk_temperature` = 0\.0 is not valid: allowed a float > 0"),
    ],
)
def test_bad_rdk_options(draft_model, tokenizer, kwargs, match):
    with pytest.raises(SemSpecConfigError, match=match):
        prune_vocabulary(draft_model, tokenizer, ["dog"], keep=20, rdk=True, **kwargs)


def test_loading_a_folder_that_is_not_a_pruned_drafter(tmp_path, draft_model, tokenizer):
    draft_model.save_pretrained(tmp_path / "plain")
    with pytest.raises(
        SemSpecConfigError,
        match=r"allowed a pruned-drafter folder .*\(missing: \['pruning_config.json', 'pruned_head.safetensors'\]\)\. "
        r"Fix: .*prune_vocabulary",
    ):
        PrunedVocabDrafter.from_pretrained(tmp_path / "plain")
    with pytest.raises(SemSpecConfigError, match=r"the folder does not exist"):
        PrunedVocabDrafter.from_pretrained(tmp_path / "absent")
    drafter = prune_vocabulary(draft_model, tokenizer, ["dog"], keep=20)
    drafter.save_pretrained(tmp_path / "pruned")
    head = load_file(tmp_path / "pruned" / "pruned_head.safetensors")
    del head["kept_token_ids"]
    save_file(head, tmp_path / "pruned" / "pruned_head.safetensors")
    with pytest.raises(SemSpecConfigError, match=r"allowed a file with the keys \['kept_token_ids', 'lm_head.weight'\] \(missing: \['kept_token_ids'\]\)"):
        PrunedVocabDrafter.from_pretrained(tmp_path / "pruned")


def test_loading_a_kernel_that_is_not_row_stochastic(tmp_path, draft_model, tokenizer):
    drafter = prune_vocabulary(draft_model, tokenizer, ["dog"], keep=20, rdk=True, rdk_temperature=1.0)
    drafter.save_pretrained(tmp_path)
    PrunedVocabDrafter.from_pretrained(tmp_path)  # as saved: fine
    head = load_file(tmp_path / "pruned_head.safetensors")
    head["rdk_weights"][3] *= 1.5
    save_file(head, tmp_path / "pruned_head.safetensors")
    with pytest.raises(SemSpecConfigError, match=r"is not row-stochastic: row 3 \(kept token \d+\) sums to 1\.5000.*Fix: "):
        PrunedVocabDrafter.from_pretrained(tmp_path)
    head["rdk_weights"][3] /= 1.5
    head["rdk_weights"][5, 0] = -0.1
    head["rdk_weights"][5, 1] += 0.1
    save_file(head, tmp_path / "pruned_head.safetensors")
    with pytest.raises(SemSpecConfigError, match=r"some weights are negative"):
        PrunedVocabDrafter.from_pretrained(tmp_path)


def test_a_drafter_loads_in_the_dtype_it_was_saved_in(tmp_path, draft_model, tokenizer):
    base = perturbed_copy(draft_model, scale=0.1, seed=4)  # its own backbone: the drafter's .to() moves it
    config_dtype = base.config.dtype
    drafter = prune_vocabulary(base, tokenizer, ["dog cat"], keep=20).to(torch.bfloat16)
    drafter.save_pretrained(tmp_path)
    assert base.config.dtype == config_dtype  # the config is saved with the weights' dtype, not changed in place
    loaded = PrunedVocabDrafter.from_pretrained(tmp_path)  # it loaded float32, from the base's config
    assert loaded.dtype == torch.bfloat16 and loaded.model.embed_tokens.weight.dtype == torch.bfloat16
    torch.testing.assert_close(loaded(input_ids=prompt(6)).logits, drafter(input_ids=prompt(6)).logits,
                               rtol=2e-2, atol=5e-2)


def test_pruning_a_model_in_training_mode(draft_model, tokenizer):
    # The self-check compares two forwards: with dropout on they differed, and pruning refused the architecture.
    base = tiny_llama(seed=6, attention_dropout=0.5).train()
    drafter = prune_vocabulary(base, tokenizer, ["dog cat"], keep=20)
    assert drafter.num_kept == 20 and not drafter.training
    assert base.lm_head.training  # the caller's modules keep their mode (the shared backbone is the drafter's)


def test_a_trained_head_of_a_tied_drafter_survives_save_and_load(tmp_path, tokenizer):
    drafter = prune_vocabulary(tiny_llama(seed=3, tie_word_embeddings=True), tokenizer, ["dog cat sat"], keep=20)
    with torch.no_grad():
        drafter.lm_head.weight.add_(0.5)  # e.g. a distillation step on the drafter's head
    drafter.save_pretrained(tmp_path)
    assert "lm_head.weight" in load_file(tmp_path / "pruned_head.safetensors")
    assert json.loads((tmp_path / "pruning_config.json").read_text())["tied_head"] is False
    loaded = PrunedVocabDrafter.from_pretrained(tmp_path)
    assert torch.equal(loaded(input_ids=prompt(6)).logits, drafter(input_ids=prompt(6)).logits)


def test_a_backbone_that_shares_weights_across_layers_saves_and_loads(tmp_path, tokenizer):
    from transformers import Zamba2Config, Zamba2ForCausalLM

    config = Zamba2Config(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
        attention_head_dim=16, mamba_d_state=8, mamba_headdim=8, n_mamba_heads=8, intermediate_size=64,
        layers_block_type=["mamba", "hybrid", "mamba", "hybrid"], hybrid_layer_ids=[1, 3], num_mem_blocks=1,
        use_mem_rope=False, pad_token_id=0, bos_token_id=1, eos_token_id=3,
    )
    torch.manual_seed(0)
    drafter = prune_vocabulary(Zamba2ForCausalLM(config).eval(), tokenizer, ["dog cat sat"], keep=20)
    drafter.save_pretrained(tmp_path)  # safetensors refused the shared block's tensors
    loaded = PrunedVocabDrafter.from_pretrained(tmp_path)
    torch.testing.assert_close(loaded(input_ids=prompt(6)).logits, drafter(input_ids=prompt(6)).logits)


@pytest.mark.parametrize("damage", ["truncated", "a list", "bias shape"])
def test_loading_damaged_drafter_files(tmp_path, draft_model, tokenizer, damage):
    drafter = prune_vocabulary(draft_model, tokenizer, ["dog cat"], keep=20)
    drafter.save_pretrained(tmp_path)
    info = tmp_path / "pruning_config.json"
    if damage == "truncated":
        info.write_text(info.read_text()[:20])
        match = r"`pruning_config.json` = 'unreadable .*Fix: save the drafter again"
    elif damage == "a list":
        info.write_text("[1, 2]")
        match = r"`pruning_config.json` = 'a JSON list' .*a JSON object"
    else:
        head = load_file(tmp_path / "pruned_head.safetensors")
        save_file({**head, "lm_head.bias": torch.zeros(3)}, tmp_path / "pruned_head.safetensors")
        match = r"`pruned_head.safetensors\['lm_head.bias'\]` = \(3,\) .*shape \(20,\)"
    with pytest.raises(SemSpecConfigError, match=match):
        PrunedVocabDrafter.from_pretrained(tmp_path)


def test_a_pruned_drafter_without_a_rule(attached, draft_model, tokenizer):
    drafter = prune_vocabulary(draft_model, tokenizer, ["dog cat"], keep=20)
    with pytest.raises(SemSpecConfigError, match=r"`acceptance` = None .*pruned-vocabulary drafter.*Fix: pass "
                                                 r"acceptance=\"exact\""):
        attached.generate(prompt(6), assistant_model=drafter, max_new_tokens=4)


def test_push_to_a_new_branch_creates_it_first(tmp_path, draft_model, tokenizer):
    # upload_folder does not create a missing branch (the Hub answers 404); transformers' push_to_hub creates it.
    drafter = prune_vocabulary(draft_model, tokenizer, keep_ids=[5, 9])
    api = BranchRecordingApi(tmp_path / "uploaded")
    drafter.push_to_hub("someone/tiny-pruned", revision="experiment", api=api)
    assert [name for name, _ in api.calls] == ["create_repo", "create_branch", "upload_folder"]
    create, branch, upload = (kwargs for _, kwargs in api.calls)
    assert create["private"] is None  # the account's default visibility, as HfApi.create_repo
    assert branch["branch"] == "experiment" and branch["exist_ok"] is True
    assert upload["revision"] == "experiment"
    api = BranchRecordingApi(tmp_path / "uploaded-pr")
    drafter.push_to_hub("someone/tiny-pruned", revision="refs/pr/3", api=api)  # a PR ref must exist: no branch made
    assert [name for name, _ in api.calls] == ["create_repo", "upload_folder"]


class BranchRecordingApi(RecordingApi):
    def create_branch(self, **kwargs):
        self.calls.append(("create_branch", kwargs))


def test_corpus_files_with_a_byte_order_mark(tmp_path):
    (tmp_path / "c.jsonl").write_text('{"text": "dog cat"}\n', encoding="utf-8-sig")
    (tmp_path / "c.txt").write_text("dog cat\nsat\n", encoding="utf-8-sig")
    assert load_corpus_texts(tmp_path / "c.jsonl") == ["dog cat"]
    assert load_corpus_texts(tmp_path / "c.txt") == ["dog cat", "sat"]  # not "\ufeffdog cat"
    # a record of a known layout with no text in it adds nothing, and is not refused
    (tmp_path / "d.jsonl").write_text('{"turns": []}\n{"text": "sat"}\n')
    assert load_corpus_texts(tmp_path / "d.jsonl") == ["sat"]


def test_nothing_to_keep_is_refused_without_special_tokens():
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="the"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    no_specials = PreTrainedTokenizerFast(tokenizer_object=backend)
    model = tiny_llama(0, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    assert special_token_ids(no_specials, model, VOCAB) == []
    with pytest.raises(SemSpecConfigError, match=r"`keep` = 0 is not valid: .*and at least 1\. Fix: pass keep ≥ 1"):
        prune_vocabulary(model, no_specials, ["dog cat"], keep=0)
    with pytest.raises(SemSpecConfigError, match=r"`keep_ids` = \[\] is not valid: allowed at least one id"):
        prune_vocabulary(model, no_specials, keep_ids=[])
    assert prune_vocabulary(model, no_specials, keep_ids=[5]).kept_token_ids.tolist() == [5]


def test_a_kernel_set_by_hand_is_in_the_saved_config_and_the_card(tmp_path, draft_model, tokenizer):
    drafter = prune_vocabulary(draft_model, tokenizer, ["dog dog cat", "sat on a mat"], keep=20)
    assert "RDK kernel | none" in drafter.model_card().text
    kept = drafter.kept_token_ids
    indices = torch.stack([kept, torch.full_like(kept, 100)], dim=1)  # each kept id → itself (0.75) and id 100
    drafter.set_rdk_kernel(indices, torch.tensor([[0.75, 0.25]]).expand(kept.numel(), 2))
    drafter.save_pretrained(tmp_path)
    recorded = json.loads((tmp_path / "pruning_config.json").read_text())["rdk"]
    assert recorded == {"form": "set with set_rdk_kernel", "entries_per_row": 2, "mean_self_weight": 0.75}
    card = PrunedVocabDrafter.from_pretrained(tmp_path).model_card()
    assert "rdk" in card.data.tags and 'acceptance="rdk"' in card.text
    assert "| RDK kernel | set with `set_rdk_kernel`: each kept token → 2 target ids |" in card.text
    assert "| RDK mean self weight | 0.750 |" in card.text


def test_a_drafter_of_a_custom_code_model_is_not_saved(tmp_path, tokenizer):
    # from_pretrained could never load it: the base model's code is not saved with the drafter. A class transformers
    # loaded with trust_remote_code lives under transformers_modules; a subclass defined there stands in for it.
    import types

    module = types.ModuleType("transformers_modules.someone.modeling_custom")
    exec("from transformers import LlamaConfig\nclass CustomConfig(LlamaConfig):\n    pass", module.__dict__)
    model = tiny_llama(0)
    model.config = module.CustomConfig(**model.config.to_dict())
    drafter = prune_vocabulary(model, tokenizer, keep_ids=[5, 9])
    assert drafter(input_ids=prompt(4)).logits.shape == (1, 4, drafter.num_kept)  # usable in memory
    with pytest.raises(SemSpecConfigError, match=r"`the base model's classes` = \['transformers_modules.someone."
                                                 r"modeling_custom'\] is not valid: .*Fix: use this drafter in memory"):
        drafter.save_pretrained(tmp_path)
    assert not any(tmp_path.iterdir())
    # A tokenizer loaded with trust_remote_code too: from_pretrained would load it without (it saved, then failed).
    custom_tokenizer = type("CustomTokenizer", (type(tokenizer),), {"__module__": module.__name__})
    plain = prune_vocabulary(tiny_llama(0), tokenizer, keep_ids=[5, 9])
    with pytest.raises(SemSpecConfigError, match=r"`the base model's classes` = \['transformers_modules"):
        plain.save_pretrained(tmp_path, tokenizer=custom_tokenizer.__new__(custom_tokenizer))  # checked before use
    assert not any(tmp_path.iterdir())


def test_a_native_model_with_an_auto_map_saves_and_loads(tmp_path, tokenizer):
    # Phi-3's repos ship code and a native port: loaded without trust_remote_code the model keeps the auto_map of its
    # config.json. The drafter saves without it (it would ask from_pretrained for code the folder does not hold).
    model = tiny_llama(0)
    model.config.auto_map = {"AutoModelForCausalLM": "modeling_custom.CustomForCausalLM"}
    drafter = prune_vocabulary(model, tokenizer, keep_ids=[5, 9])
    drafter.save_pretrained(tmp_path)
    assert "auto_map" not in json.loads((tmp_path / "config.json").read_text())
    assert model.config.auto_map  # the base model's config is left as it was
    loaded = PrunedVocabDrafter.from_pretrained(tmp_path)
    assert torch.equal(loaded(input_ids=prompt(4)).logits, drafter(input_ids=prompt(4)).logits)
