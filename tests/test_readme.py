"""The README's two set-up commands are the ones the project runs (CI runs the test command verbatim); the README
and docs stay short, and every relative link in them resolves."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def setup_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Set-up on a fresh machine", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section, flags=re.S)


def test_readme_has_exactly_two_setup_commands():
    commands = setup_commands()
    assert len(commands) == 2
    assert "examples/quickstart.py" in commands[0] and "pytest" in commands[1]
    assert (ROOT / "examples" / "quickstart.py").is_file()
    assert all("\n" not in c for c in commands)


def test_ci_runs_the_readme_test_command_verbatim():
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert setup_commands()[1] in ci_lines


def test_usage_states_the_per_token_policies_caps():
    from hf_semspec.draft_length.adaedl import AdaEDLConfig
    from hf_semspec.draft_length.cost_aware import CostAwareConfig
    from hf_semspec.draft_length.svip import SVIPConfig

    readme = " ".join((ROOT / "docs" / "usage.md").read_text().split())  # one line: the sentence may wrap
    assert SVIPConfig().max_tokens == AdaEDLConfig().max_tokens
    assert f"(`svip`, `adaedl` {SVIPConfig().max_tokens}, `cost_aware` {CostAwareConfig().max_tokens})" in readme


def test_readme_and_benchmark_readme_stay_short():
    assert len((ROOT / "README.md").read_text()) <= 12_000
    assert len((ROOT / "benchmarks" / "README.md").read_text()) <= 8_000
    assert len(list((ROOT / "benchmarks" / "results").iterdir())) <= 40


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_in_the_readmes_and_docs_resolves():
    pages = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", ROOT / "benchmarks" / "results" / "README.md",
             *sorted((ROOT / "docs").glob("*.md"))]
    assert len(pages) >= 9
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks hold no links
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and resolved.suffix == ".md":
                anchors = {_anchor(h) for h in re.findall(r"^#+ (.+)$", resolved.read_text(), flags=re.M)}
                if anchor not in anchors:
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, broken
