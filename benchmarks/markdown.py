"""Writing the benchmarks' outputs: markdown tables and the .md / .json pair of a results name.

Apart from `report.py` so that the modules `report.py` imports for its sections (`resolution.py`) can use them too.
"""

from __future__ import annotations

import json
from pathlib import Path


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """The lines of a markdown table."""
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def write_json(path: Path, results: dict) -> None:
    path.write_text(json.dumps(results, indent=1, default=str) + "\n", encoding="utf-8")


def write_summary(directory: Path, name: str, text: str, summary: dict) -> None:
    """`<name>.md` (the text) and `<name>.json` (the figures) in `directory`, for the small analysis scripts; prints
    the text."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.md").write_text(text, encoding="utf-8")
    write_json(directory / f"{name}.json", summary)
    print(text)
