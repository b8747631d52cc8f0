"""Acceptance rules, one module each.

Importing this package imports every module in this folder, and each module registers its rule once with
`@register_rule`; a new rule is a new file here (plus nothing else), and tests/test_rule_matrix.py picks it up.
"""

from ..registry import import_component_modules
from .base import (
    RULES,
    AcceptanceRule,
    RuleConfig,
    VerificationInput,
    VerificationResult,
    available_rules,
    register_rule,
)

import_component_modules(__name__, __path__)

__all__ = [
    "RULES",
    "AcceptanceRule",
    "RuleConfig",
    "VerificationInput",
    "VerificationResult",
    "available_rules",
    "register_rule",
]
