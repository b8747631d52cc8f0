"""hf_semspec's command line: `python -m hf_semspec <command> [options]`.

    python -m hf_semspec compare --target T --draft D --prompts prompts.jsonl --rules exact,fly

Commands: `compare` (`hf_semspec.compare` from a shell: every rule against `exact` on your prompts; docs/compare.md).
`python -m hf_semspec <command> --help` lists a command's options.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence


def _compare(argv: Sequence[str]) -> int:
    from .comparison import main

    return main(argv)


COMMANDS: dict[str, tuple[Callable[[Sequence[str]], int], str]] = {
    "compare": (_compare, "every rule against `exact` on your own prompts: speed-up, identical share, NLL increase"),
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    listing = "\n".join(f"  {name:<10} {summary}" for name, (_, summary) in COMMANDS.items())
    usage = f"usage: python -m hf_semspec <command> [options]\n\ncommands:\n{listing}\n"
    if not argv or argv[0] in ("-h", "--help"):
        print(usage, end="", file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"{usage}\npython -m hf_semspec: unknown command {command!r}; allowed: {', '.join(COMMANDS)}. Fix: "
              f"python -m hf_semspec {next(iter(COMMANDS))} --help", file=sys.stderr)
        return 2
    return COMMANDS[command][0](rest)


if __name__ == "__main__":
    sys.exit(main())
