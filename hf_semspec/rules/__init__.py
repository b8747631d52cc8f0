"""Acceptance rules, one module each.

Importing this package imports every module in this folder, and each module registers its rule once with
`@register_rule`; a new rule is a new file here (plus nothing else), and tests/test_rule_matrix.py picks it up.
"""

import importlib
import pkgutil

from .base import (
    RULES,
    AcceptanceRule,
    RuleConfig,
    VerificationInput,
    VerificationResult,
    available_rules,
    register_rule,
)

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "RULES",
    "AcceptanceRule",
    "RuleConfig",
    "VerificationInput",
    "VerificationResult",
    "available_rules",
    "register_rule",
]
