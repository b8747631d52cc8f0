"""Acceptance rules. Importing this package registers every built-in rule (one module each)."""

from .base import (
    RULES,
    AcceptanceRule,
    RuleConfig,
    VerificationInput,
    VerificationResult,
    available_rules,
    register_rule,
)
from .exact import ExactConfig, ExactRule

__all__ = [
    "RULES",
    "AcceptanceRule",
    "ExactConfig",
    "ExactRule",
    "RuleConfig",
    "VerificationInput",
    "VerificationResult",
    "available_rules",
    "register_rule",
]
