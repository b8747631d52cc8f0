"""The README's two set-up commands are the ones the project runs: CI runs the test command verbatim."""

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


def test_readme_states_the_per_token_policies_caps():
    from hf_semspec.draft_length.adaedl import AdaEDLConfig
    from hf_semspec.draft_length.cost_aware import CostAwareConfig
    from hf_semspec.draft_length.svip import SVIPConfig

    readme = " ".join((ROOT / "README.md").read_text().split())  # one line: the sentence may wrap
    assert SVIPConfig().max_tokens == AdaEDLConfig().max_tokens
    assert f"(`svip`, `adaedl` {SVIPConfig().max_tokens}, `cost_aware` {CostAwareConfig().max_tokens})" in readme
