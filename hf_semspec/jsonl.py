"""Reading prompt and corpus files: one reader of text lines and JSON Lines (one JSON value a line) for every caller
(`hf_semspec.compare()`'s prompt files, the pruned drafters' corpora), with an error per bad line that names the file and
the line."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import invalid_value


def read_lines(path: str | os.PathLike) -> list[str]:
    """The file's lines, blank ones included: universal newlines ("\\r\\n" and "\\r" arrive as "\\n"), a byte-order
    mark dropped ("utf-8-sig": Windows editors write one), and split at newlines only, not with `str.splitlines`,
    which also splits at U+2028, U+2029 and U+0085: JSON strings may hold those unescaped (`json.dumps(...,
    ensure_ascii=False)` writes them so), and a record would be cut in two."""
    with open(path, encoding="utf-8-sig") as f:
        text = f.read()
    return text.split("\n") if text else []


def read_records(path: str | os.PathLike, field: str, allowed: str, fix: str,
                 parse: Callable[[Any], Any] = lambda record: record,
                 shown: Callable[[Any], Any] = lambda record: record, not_json_fix: str = "") -> list[Any]:
    """`parse(record)` of each non-blank line's JSON value, in file order.

    Args:
        field (`str`): the argument the file was given as, e.g. `"prompts"`; errors name it with the file and the
            line: ``corpus (data.jsonl, line 2)``.
        allowed / fix (`str`): the records allowed, and what to do instead, for a record `parse` refuses.
        parse (`Callable`): a record's value for the caller, or None to refuse the record.
        shown (`Callable`): what an error shows of a refused record (e.g. its keys).
        not_json_fix (`str`): what else to do about a line that is not JSON, after "fix the line".

    Raises:
        `SemSpecConfigError` (a `ValueError`): a line that is not JSON, or a record `parse` refuses.
    """
    path = Path(path)
    values = []
    for number, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        where = f"{field} ({path.name}, line {number})"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise invalid_value(where, line[:80], "one JSON value a line",
                                f"fix the line ({error}){not_json_fix}") from None
        value = parse(record)
        if value is None:
            raise invalid_value(where, shown(record), allowed, fix)
        values.append(value)
    return values
