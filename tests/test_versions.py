"""The supported torch / transformers ranges: one source (`hf_semspec._versions.SUPPORTED`), repeated in setup.cfg for
pip, and checked at import with an error that names the installed and the supported versions and the fix."""

import configparser
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from hf_semspec._versions import SUPPORTED, check_versions

ROOT = Path(__file__).resolve().parents[1]


def test_setup_cfg_declares_the_same_ranges():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    declared = {Requirement(line).name: str(Requirement(line).specifier)
                for line in config["options"]["install_requires"].split("\n") if line.strip()}
    for name, allowed in SUPPORTED.items():
        assert Requirement(f"{name}{declared[name]}").specifier == Requirement(f"{name}{allowed}").specifier


def installed(**versions):
    return lambda name: versions[name]


@pytest.mark.parametrize("torch, transformers, outside", [
    ("2.10.0", "5.24.0", "torch 2.10.0"),
    ("2.16.0.dev20260101+cu130", "5.24.0", "torch 2.16.0.dev20260101+cu130"),
    ("2.13.0+cpu", "5.17.0", "transformers 5.17.0"),  # the sliding-window rollback fails there,
    ("2.13.0+cpu", "5.25.0", "transformers 5.25.0"),
])
def test_a_version_outside_the_ranges_is_an_import_error_naming_both_and_the_fix(torch, transformers, outside):
    with pytest.raises(ImportError) as info:
        check_versions(installed(torch=torch, transformers=transformers))
    message = str(info.value)
    name = outside.split()[0]
    assert f"installed: {outside} (supported: {SUPPORTED[name]})" in message
    assert f'Fix: pip install "{name}{SUPPORTED[name]}"' in message
    assert f"torch {SUPPORTED['torch']} and transformers {SUPPORTED['transformers']}" in message


@pytest.mark.parametrize("torch, transformers", [("2.11.0", "5.18.0"), ("2.13.0+cpu", "5.24.0"), ("2.15.0+cu130", "5.24.1")])
def test_versions_inside_the_ranges_pass(torch, transformers):
    check_versions(installed(torch=torch, transformers=transformers))


def test_the_installed_versions_pass():
    check_versions()  # the suite runs on supported versions only (.ci/versions)
