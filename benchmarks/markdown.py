"""Writing the benchmarks' outputs: markdown tables and the .md / .json pair of a results name; reading a results
file of the kind a command expects.

Apart from `report.py` so that the modules `report.py` imports for its sections (`resolution.py`) can use them too.
"""

from __future__ import annotations

import json
from pathlib import Path


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """The lines of a markdown table."""
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


# The results files, by what their JSON holds: what `load_results` tells apart.
RESULTS_KINDS = {
    "run": ("a live run's results (benchmarks/run.py, merge.py)", ("aggregates", "records")),
    "replay": ("a replay's results (benchmarks/replay.py)", ("traces", "records")),
}


def load_results(path: Path, kind: str, flag: str) -> dict:
    """The results JSON at `path`, which `flag` of a command expects to be of `kind` ("run" or "replay"); a file of
    another kind (a replay's given for a run's, a resolution table, ...) gets an error naming the flag, what the file
    is and what is expected, rather than a KeyError later."""
    results = json.loads(Path(path).read_text(encoding="utf-8"))
    held = results if isinstance(results, dict) else {}
    wanted, keys = RESULTS_KINDS[kind]
    if all(key in held for key in keys):
        return results
    found = next((text for text, need in RESULTS_KINDS.values() if all(key in held for key in need)), None)
    missing = [key for key in keys if key not in held]
    raise ValueError(f"{flag} {path}: expected {wanted}, got {found or f'a file without {missing}'}. "
                     f"Fix: pass {wanted.split(' (')[0]} JSON there.")


def check_distinct_file_names(paths: list, what: str) -> None:
    """Refuses two results files of one name among `paths`: the scripts key runs by file name, so the second would
    replace the first and its prompts would silently go uncounted. `what` names the argument in the error."""
    names = [Path(path).name for path in paths]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"{what}: two files named {', '.join(map(repr, repeated))}. Fix: give the runs distinct file "
                         "names (copy one under another name).")


def write_json(path: Path, results: dict) -> None:
    path.write_text(json.dumps(results, indent=1, default=str) + "\n", encoding="utf-8")


def write_summary(directory: Path, name: str, text: str, summary: dict) -> None:
    """`<name>.md` (the text) and `<name>.json` (the figures) in `directory`, for the small analysis scripts; prints
    the text."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.md").write_text(text, encoding="utf-8")
    write_json(directory / f"{name}.json", summary)
    print(text)
