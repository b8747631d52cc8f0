"""setup.cfg lists its packages explicitly (the top-level model_cards/ ships as hf_semspec.model_cards): every
package under hf_semspec/ must be listed, and the package data must be reachable as installed."""

import configparser
from importlib import resources
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_is_listed_in_setup_cfg():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    listed = set(config["options"]["packages"].split())
    on_disk = {
        ".".join(init.parent.relative_to(ROOT).parts) for init in (ROOT / "hf_semspec").rglob("__init__.py")
    } | {"hf_semspec.model_cards"}
    assert listed == on_disk


def test_templates_and_custom_generate_are_package_data():
    cards = {p.name for p in resources.files("hf_semspec.model_cards").iterdir()}
    assert {"pruned_drafter.md", "custom_generate.md"} <= cards
    custom = {p.name for p in (resources.files("hf_semspec") / "custom_generate").iterdir()}
    assert {"generate.py", "requirements.txt"} <= custom


@pytest.mark.slow
def test_the_wheel_holds_the_library_only(tmp_path):
    # What a library user calls: the package and its data. The models' loader of the examples and benchmarks
    # (benchmarks/pypi_models.py) and the benchmarks themselves are not in it.
    import shutil
    import subprocess
    import sys
    import zipfile

    source = tmp_path / "source"  # a copy: an in-tree build would leave build/, whose stale files a later wheel keeps
    source.mkdir()
    for name in ("pyproject.toml", "setup.cfg", "README.md", "hf_semspec", "model_cards", "benchmarks", "examples"):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(ROOT / name, source / name, **({"ignore": shutil.ignore_patterns("results", "__pycache__")}
                                            if (ROOT / name).is_dir() else {}))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path), str(source)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("hf_semspec-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    modules = {n for n in names if n.endswith(".py")}
    on_disk = {str(p.relative_to(ROOT)) for p in (ROOT / "hf_semspec").rglob("*.py")}
    assert "hf_semspec/drafters/same_tokenizer.py" in modules and "hf_semspec/generation.py" in modules
    assert modules - {n for n in modules if n.startswith("hf_semspec/model_cards/")} == on_disk
    assert not any("pypi_models" in n or n.startswith(("benchmarks/", "tests/", "examples/")) for n in names)
