"""setup.cfg lists its packages explicitly (the top-level model_cards/ ships as hf_semspec.model_cards): every
package under hf_semspec/ must be listed, and the package data must be reachable as installed."""

import configparser
from importlib import resources
from pathlib import Path

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
