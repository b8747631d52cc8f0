"""Prompts: Spec-Bench questions, GSM8K problems, or a custom JSONL file, selected deterministically per profile.

Selection is balanced across categories (the same number of prompts from each) and deterministic (no randomness:
the same files give the same prompts in the same order), so two runs of a profile measure the same work.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
# The data lives beside the repository (never copied into it): `../shared/data/` relative to the repo root.
DEFAULT_DATA_DIR = REPO_ROOT.parent / "shared" / "data"
SPECBENCH_FILE = "specbench_question.jsonl"
GSM8K_FILE = "gsm8k_test.jsonl"
GSM8K_CATEGORY = "gsm8k"
CUSTOM_CATEGORY = "custom"
# Qwen's recommended prompt for math word problems; the `\boxed{}` answer is what the parser looks for first.
GSM8K_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


@dataclass(frozen=True)
class Prompt:
    """One benchmark item.

    Args:
        prompt_id (`str`): unique id, e.g. `"specbench:81"` or `"gsm8k:0"`.
        category (`str`): Spec-Bench category, `"gsm8k"`, or `"custom"`.
        text (`str`): the user message (the chat template is applied when encoding).
        max_new_tokens (`int`): generation budget for this item.
        gold (`str`, *optional*): the reference final number (GSM8K only).
    """

    prompt_id: str
    category: str
    text: str
    max_new_tokens: int
    gold: str | None = None


def read_jsonl(path: str | Path) -> list[dict]:
    """Records of a JSONL file; a malformed line raises with its line number (no line is silently dropped)."""
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not valid JSON ({error})") from error
    return records


def load_question_prompts(path: str | Path, max_new_tokens: int) -> list[Prompt]:
    """Prompts of a Spec-Bench-style file: `{"question_id", "category", "turns": [...]}` (first turn used) or
    `{"prompt": ...}` (category `custom` unless the record has one)."""
    prompts = []
    for index, record in enumerate(read_jsonl(path)):
        if "turns" in record:
            text = record["turns"][0]
        elif "prompt" in record:
            text = record["prompt"]
        else:
            raise ValueError(f"{path}: record {index} has neither `turns` nor `prompt`: keys {sorted(record)}")
        question_id = record.get("question_id", index)
        prompts.append(
            Prompt(
                prompt_id=f"{Path(path).stem}:{question_id}",
                category=str(record.get("category", CUSTOM_CATEGORY)),
                text=text,
                max_new_tokens=max_new_tokens,
            )
        )
    return prompts


def gsm8k_gold(answer: str) -> str:
    """The gold number of a GSM8K `answer` field (after `#### `), normalized like the model's answers."""
    from .metrics import normalize_number  # local import: metrics is the one place that defines number syntax

    if "####" not in answer:
        raise ValueError(f"GSM8K answer without '####': {answer[-80:]!r}")
    gold = normalize_number(answer.rsplit("####", 1)[1].strip())
    if gold is None:
        raise ValueError(f"GSM8K answer with no number after '####': {answer[-80:]!r}")
    return gold


def load_gsm8k(path: str | Path, count: int, max_new_tokens: int, selection: str = "first") -> list[Prompt]:
    """`count` GSM8K test problems with the step-by-step / `\\boxed{}` instruction.

    `selection`: `first` = file order; `shortest` = the problems with the shortest reference solutions (ties by file
    order), so that a small token budget reaches the answer — easier problems, for smoke runs only.
    """
    if count <= 0:
        return []
    records = read_jsonl(path)
    if count > len(records):
        raise ValueError(f"--gsm8k {count} but {path} has only {len(records)} problems")
    if selection == "first":
        indices = list(range(count))
    elif selection == "shortest":
        indices = sorted(sorted(range(len(records)), key=lambda i: (len(records[i]["answer"]), i))[:count])
    else:
        raise ValueError(f"unknown GSM8K selection {selection!r}: use first or shortest")
    return gsm8k_prompts(records, indices, max_new_tokens)


def parse_slice(text: str) -> tuple[int, int]:
    """`"0:20"` → (0, 20): problems 0..19. An argparse type; a malformed or empty slice raises naming the form."""
    start, colon, end = text.partition(":")
    if not colon or not start.strip().isdigit() or not end.strip().isdigit() or int(start) >= int(end):
        raise ValueError(f"expected START:END with 0 <= START < END, e.g. 0:20, got {text!r}")
    return int(start), int(end)


def load_gsm8k_slice(path: str | Path, start: int, end: int, max_new_tokens: int) -> list[Prompt]:
    """GSM8K test problems `start`..`end − 1` in file order (ids `gsm8k:<index>`), for runs in slices."""
    records = read_jsonl(path)
    if end > len(records):
        raise ValueError(f"--gsm8k-problems {start}:{end} but {path} has only {len(records)} problems")
    return gsm8k_prompts(records, list(range(start, end)), max_new_tokens)


def gsm8k_prompts(records: list[dict], indices: list[int], max_new_tokens: int) -> list[Prompt]:
    """The prompts of the GSM8K test `records` (as read from the file) at `indices`, ids `gsm8k:<index>`."""
    return [
        Prompt(
            prompt_id=f"gsm8k:{index}",
            category=GSM8K_CATEGORY,
            text=f"{records[index]['question']}\n{GSM8K_INSTRUCTION}",
            max_new_tokens=max_new_tokens,
            gold=gsm8k_gold(records[index]["answer"]),
        )
        for index in indices
    ]


def categories_in_order(prompts: list[Prompt]) -> list[str]:
    """Categories in order of first appearance in the file."""
    return list(dict.fromkeys(p.category for p in prompts))


def keep_categories(prompts: list[Prompt], categories: list[str]) -> list[Prompt]:
    """The prompts of the given categories; a category the prompts do not have is an error naming the ones they do."""
    known = categories_in_order(prompts)
    unknown = [c for c in categories if c not in known]
    if unknown:
        raise ValueError(f"--categories: got {unknown}, not categories of these prompts ({', '.join(known)}). Fix: "
                         "name categories as the prompts file spells them, comma-separated.")
    return [p for p in prompts if p.category in categories]


def drop_long(prompts: list[Prompt], max_chars: int | None) -> tuple[list[Prompt], list[str]]:
    """The prompts of at most `max_chars` characters (all if None), and the categories left with none."""
    if max_chars is None:
        return prompts, []
    kept = [p for p in prompts if len(p.text) <= max_chars]
    remaining = set(p.category for p in kept)
    return kept, [c for c in categories_in_order(prompts) if c not in remaining]


def select_balanced(prompts: list[Prompt], per_category: int | None, strategy: str,
                    skip_per_category: int = 0) -> list[Prompt]:
    """`per_category` prompts from every category (all of them if `None`), interleaved round-robin.

    Strategies (all deterministic):
        `shortest`: the shortest texts of each category (ties by file order) — bounds prefill cost in quick runs,
            at the price of under-representing long contexts (summarization, rag);
        `spread`: evenly spaced positions within each category's file order;
        `first`: the first ones in file order.

    The round-robin order (one prompt of each category, then the next, ...) means `--limit` keeps the balance.

    `skip_per_category` > 0 selects held-out prompts: those of a selection of `per_category + skip_per_category` that
    a selection of `skip_per_category` does not take (for `shortest` and `first`: the next `per_category` of each
    category after the ones an earlier run with `per_category=skip_per_category` measured).
    """
    if skip_per_category:
        if per_category is None or skip_per_category < 0:
            raise ValueError(f"skip_per_category: got {skip_per_category} with per_category={per_category}; "
                             "expected >= 0 and a number of prompts per category. Fix: pass --prompts-per-category N, "
                             "or skip 0.")
        skipped = {p.prompt_id for p in select_balanced(prompts, skip_per_category, strategy)}
        return [p for p in select_balanced(prompts, per_category + skip_per_category, strategy)
                if p.prompt_id not in skipped]
    by_category: dict[str, list[Prompt]] = {c: [] for c in categories_in_order(prompts)}
    for p in prompts:
        by_category[p.category].append(p)
    chosen: dict[str, list[Prompt]] = {}
    for category, items in by_category.items():
        k = len(items) if per_category is None else min(per_category, len(items))
        if strategy == "shortest":
            ranked = sorted(range(len(items)), key=lambda i: (len(items[i].text), i))[:k]
            chosen[category] = [items[i] for i in sorted(ranked)]
        elif strategy == "spread":
            chosen[category] = [items[(i * len(items)) // k] for i in range(k)] if k else []
        elif strategy == "first":
            chosen[category] = items[:k]
        else:
            raise ValueError(f"unknown selection strategy {strategy!r}: use shortest, spread or first")
    rounds = max((len(v) for v in chosen.values()), default=0)
    return [chosen[c][r] for r in range(rounds) for c in chosen if r < len(chosen[c])]
