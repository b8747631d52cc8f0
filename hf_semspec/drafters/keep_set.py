"""Choosing which output tokens a pruned drafter keeps.

The keep set is the special tokens (always) plus the most frequent other tokens of a corpus and/or of a model's own
greedy generations ("calibration"), ties broken by the lower token id. Everything here works on token ids of the
model's full vocabulary (`config.vocab_size`, which may exceed `len(tokenizer)`: padding rows of the embedding are
never produced by the tokenizer and so are never counted).
"""

from __future__ import annotations

import logging
import math
import numbers
import os
import pathlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import invalid_value
from ..jsonl import read_lines, read_records

logger = logging.getLogger(__name__)

# JSONL record layouts read by `load_corpus_texts`, in the order they are tried.
RECORD_LAYOUTS = (
    '{"turns": [str, ...]} (Spec-Bench / MT-Bench)',
    '{"text": str}',
    '{"prompt": str} (an optional "completion"/"response" is read too)',
    '{"question": str, "answer": str} (GSM8K; answer optional)',
    '{"messages": [{"content": str}, ...]} (chat)',
    "a bare JSON string",
)
_TOKENIZE_BATCH = 256


def _record_texts(record: Any) -> list[str] | None:
    """The texts of one JSONL record, or `None` when its layout is not one of `RECORD_LAYOUTS`."""
    if isinstance(record, str):
        return [record]
    if not isinstance(record, dict):
        return None
    if isinstance(record.get("turns"), list):
        return [t for t in record["turns"] if isinstance(t, str)]
    if isinstance(record.get("text"), str):
        return [record["text"]]
    if isinstance(record.get("prompt"), str):
        extra = [record[k] for k in ("completion", "response") if isinstance(record.get(k), str)]
        return [record["prompt"], *extra]
    if isinstance(record.get("question"), str):
        return [record["question"]] + ([record["answer"]] if isinstance(record.get("answer"), str) else [])
    if isinstance(record.get("messages"), list):
        return [m["content"] for m in record["messages"] if isinstance(m, dict) and isinstance(m.get("content"), str)]
    return None


def load_corpus_texts(path: str | os.PathLike) -> list[str]:
    """Reads the texts of a corpus file.

    A `.txt` file gives one text per non-empty line; any other file is read as JSONL, one record per line, in one
    of the layouts of `RECORD_LAYOUTS` (Spec-Bench `{"turns": [...]}`, `{"text": ...}`, `{"prompt": ...}`,
    GSM8K `{"question": ..., "answer": ...}`, chat `{"messages": [...]}`); blank lines are skipped.

    Raises:
        `SemSpecConfigError`: the file does not exist, a line is not JSON, or a record has none of the layouts.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise invalid_value(
            "corpus", str(path), "an existing JSONL/.txt file, or a list of texts", "check the path, or pass the texts"
        )
    if path.suffix == ".txt":
        return [line for line in read_lines(path) if line.strip()]
    per_record = read_records(
        path, "corpus", "records of the layouts " + "; ".join(RECORD_LAYOUTS),
        "convert the file to one of these layouts, or pass a list of texts", parse=_record_texts,
        shown=lambda record: sorted(record) if isinstance(record, dict) else type(record).__name__,
    )
    return [text for texts in per_record for text in texts]


@dataclass
class CorpusTexts:
    """Texts gathered from the `corpus` argument of `prune_vocabulary`, with a description for the saved config."""

    texts: list[str]
    label: str
    sources: list[str] = field(default_factory=list)


def _names_a_corpus_file(text: str) -> bool:
    """Whether `text` is a one-line path to an existing .jsonl/.json/.txt file."""
    if "\n" in text or pathlib.Path(text).suffix not in (".jsonl", ".json", ".txt"):
        return False
    try:
        return pathlib.Path(text).is_file()
    except OSError:  # a name too long or invalid for the file system is a text
        return False


def gather_corpus(corpus: Any, label: str | None = None) -> CorpusTexts:
    """Normalises `corpus`: a path (`str` or `os.PathLike`) to a JSONL/.txt file, or a list whose items are texts
    (`str`) or file paths (`pathlib.Path`). `label` overrides the description recorded in the saved config."""
    if isinstance(corpus, (str, os.PathLike)):
        items: list[Any] = [pathlib.Path(corpus)]
    elif isinstance(corpus, Sequence) and not isinstance(corpus, (bytes, bytearray)):
        items = list(corpus)
    else:
        raise invalid_value(
            "corpus",
            type(corpus).__name__,
            "a JSONL/.txt path, or a list of texts (str) and/or paths (pathlib.Path)",
            'pass e.g. corpus="data.jsonl" or corpus=["some text", ...]',
        )
    texts: list[str] = []
    sources: list[str] = []
    in_memory = 0
    for item in items:
        if isinstance(item, os.PathLike):
            file_texts = load_corpus_texts(item)
            texts.extend(file_texts)
            sources.append(f"{pathlib.Path(item).name} ({len(file_texts)} texts)")
        elif isinstance(item, str):
            if _names_a_corpus_file(item):
                # A text that is the name of an existing corpus file was meant as the file: counting the name's
                # tokens instead would silently choose the wrong keep set.
                raise invalid_value(
                    "corpus item", item, "str (a text) or pathlib.Path (a file); this text names an existing file",
                    f"pass pathlib.Path({item!r}) to read the file (or corpus={item!r} for that file alone)",
                )
            texts.append(item)
            in_memory += 1
        else:
            raise invalid_value(
                "corpus item", type(item).__name__, "str (a text) or pathlib.Path (a file)", "pass texts or paths"
            )
    if in_memory:
        sources.append(f"{in_memory} in-memory texts")
    return CorpusTexts(texts=texts, label=label or " + ".join(sources) or "empty", sources=sources)


def count_tokens(tokenizer: Any, texts: Sequence[str], vocab_size: int) -> torch.LongTensor:
    """Token frequencies `(vocab_size,)` of `texts`, tokenized without special tokens (BOS/EOS are kept anyway)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for start in range(0, len(texts), _TOKENIZE_BATCH):
        batch = list(texts[start : start + _TOKENIZE_BATCH])
        ids = [i for row in tokenizer(batch, add_special_tokens=False)["input_ids"] for i in row]
        if not ids:
            continue
        ids_tensor = torch.tensor(ids, dtype=torch.long)
        if int(ids_tensor.max()) >= vocab_size:
            raise invalid_value(
                "tokenizer",
                f"token id {int(ids_tensor.max())}",
                f"ids below the model's vocab_size {vocab_size}",
                "use the tokenizer that belongs to the draft model",
            )
        counts += torch.bincount(ids_tensor, minlength=vocab_size)
    return counts


def encode_prompt(tokenizer: Any, prompt: str, chat_template: bool) -> torch.LongTensor:
    """`(1, length)` ids of `prompt`, as a user turn of the chat template when there is one and `chat_template`."""
    if chat_template and getattr(tokenizer, "chat_template", None):
        encoded = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        return encoded["input_ids"]
    return tokenizer(prompt, return_tensors="pt")["input_ids"]


@torch.no_grad()
def calibration_counts(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: Sequence[str],
    max_new_tokens: int,
    vocab_size: int,
    chat_template: bool = True,
) -> torch.LongTensor:
    """Frequencies `(vocab_size,)` of the tokens `model` generates greedily after each prompt (generated tokens
    only; the prompts themselves are not counted)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    device = next(model.parameters()).device
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    for prompt in prompts:
        input_ids = encode_prompt(tokenizer, prompt, chat_template).to(device)
        output = type(model).generate(  # the class's generate: an hf_semspec-attached model decodes plainly here
            model,
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad_id,
        )
        new = output[0, input_ids.shape[1] :].cpu()
        counts += torch.bincount(new, minlength=vocab_size)[:vocab_size]
    return counts


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, torch.Tensor):
        return [int(v) for v in value.flatten().tolist()]
    if isinstance(value, Iterable):
        return [int(v) for v in value if v is not None]
    return []


_SAMPLE_CONVERSATIONS = (
    [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Sort a list."},
    ],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Sort."}],
)


def chat_template_token_ids(tokenizer: Any) -> set[int]:
    """Added tokens (e.g. Qwen's `<|im_start|>`, `<|im_end|>`) that the tokenizer's chat template emits around a
    sample conversation, whether or not the tokenizer flags them as special. Empty without a chat template."""
    if not getattr(tokenizer, "chat_template", None):
        return set()
    added = set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    for conversation in _SAMPLE_CONVERSATIONS:  # some templates reject a system turn
        try:
            text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
        except Exception as err:  # noqa: BLE001 - a template may raise anything (jinja2 missing, role checks, ...)
            logger.debug("chat template could not render a sample conversation: %s", err)
            continue
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return {i for i in ids if i in added}
    return set()


def special_token_ids(tokenizer: Any, model: torch.nn.Module | None, vocab_size: int) -> list[int]:
    """Ids that every pruned drafter keeps, sorted: the tokenizer's special tokens (`all_special_ids` and added
    tokens flagged special), the BOS/EOS/PAD ids of the model's generation config and config, and the control tokens
    of the chat template (`chat_template_token_ids`)."""
    ids: set[int] = set(_as_id_list(getattr(tokenizer, "all_special_ids", None)))
    for token_id, added in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items():
        if getattr(added, "special", False):
            ids.add(int(token_id))
    if model is not None:
        configs = [getattr(model, "generation_config", None), model.config.get_text_config()]
        for config in configs:
            for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
                ids.update(_as_id_list(getattr(config, name, None)))
    ids |= chat_template_token_ids(tokenizer)
    return sorted(i for i in ids if 0 <= i < vocab_size)


def resolve_keep_size(keep: Any, vocab_size: int, num_special: int) -> int:
    """K from `keep`: an `int` is the number of kept tokens (special tokens included), a `float` in (0, 1] the
    fraction of `vocab_size` (rounded to the nearest int); numpy numbers count as Python's."""
    if isinstance(keep, numbers.Integral) and not isinstance(keep, bool):
        keep = int(keep)
    elif isinstance(keep, numbers.Real) and not isinstance(keep, bool):
        keep = float(keep)
    if isinstance(keep, bool) or not isinstance(keep, (int, float)):
        raise invalid_value(
            "keep",
            keep,
            f"an int in [{max(1, num_special)}, {vocab_size}] (number of kept tokens) or a float in (0, 1] (fraction)",
            "pass e.g. keep=32768 or keep=0.25",
        )
    if isinstance(keep, float):
        if not (0.0 < keep <= 1.0) or math.isnan(keep):
            raise invalid_value(
                "keep",
                keep,
                "a fraction in (0, 1] of the vocabulary (or an int number of tokens)",
                "pass e.g. keep=0.25 for a quarter of the vocabulary",
            )
        size = max(1, round(keep * vocab_size))
        if size < num_special:
            raise invalid_value(
                "keep",
                keep,
                f"a fraction keeping at least the {num_special} special tokens (≥ {num_special / vocab_size:.2e})",
                f"raise keep, or pass keep={num_special} or more as an int",
            )
        return size
    if keep > vocab_size:
        raise invalid_value(
            "keep",
            keep,
            f"at most the vocabulary size {vocab_size}",
            f"pass keep ≤ {vocab_size}, or a fraction such as keep=0.25",
        )
    if keep < max(1, num_special):
        raise invalid_value(
            "keep",
            keep,
            f"at least the number of special tokens, which are always kept ({num_special}), and at least 1",
            f"pass keep ≥ {max(1, num_special)}",
        )
    return int(keep)


def select_kept_ids(counts: torch.LongTensor, special_ids: Sequence[int], keep_size: int) -> torch.LongTensor:
    """The `keep_size` ids to keep, sorted: every special id, then the most frequent others by `counts`, ties (and
    never-seen tokens) ordered by the lower id first."""
    special = torch.tensor(sorted(set(special_ids)), dtype=torch.long)
    is_special = torch.zeros(counts.shape[0], dtype=torch.bool)
    is_special[special] = True
    # A stable descending sort keeps equal counts in id order: the lower id wins a tie.
    order = torch.sort(counts, descending=True, stable=True).indices
    others = order[~is_special[order]][: keep_size - len(special)]
    return torch.sort(torch.cat([special, others])).values
