"""The torch and transformers versions hf_semspec supports, checked when it is imported.

`SUPPORTED` is the one place the ranges are written; setup.cfg's `install_requires` repeats them for pip, and
tests/test_versions.py checks that the two agree. They are the ranges `.ci/versions` runs the test suite on.
"""

from __future__ import annotations

from importlib import metadata

from packaging.specifiers import SpecifierSet
from packaging.version import Version

SUPPORTED = {"torch": ">=2.11,<2.16", "transformers": ">=5.18,<5.25"}


def check_versions(version=metadata.version) -> None:
    """Raises an ImportError naming the installed and the supported versions, and the pip command that fixes them,
    when torch or transformers is outside `SUPPORTED`. Pre-releases count as their release (2.16.0.dev is 2.16)."""
    outside = []
    for name, allowed in SUPPORTED.items():
        installed = version(name)
        if not SpecifierSet(allowed).contains(Version(installed), prereleases=True):
            outside.append((name, installed, allowed))
    if outside:
        found = ", ".join(f"{name} {installed} (supported: {allowed})" for name, installed, allowed in outside)
        fix = " ".join(f'"{name}{allowed}"' for name, _, allowed in outside)
        raise ImportError(
            f"hf_semspec supports torch {SUPPORTED['torch']} and transformers {SUPPORTED['transformers']}; "
            f"installed: {found}. Fix: pip install {fix}"
        )
