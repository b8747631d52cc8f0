"""Draft-length policies, one module each; importing this package registers every module in this folder."""

from ..registry import import_component_modules
from .base import (
    POLICIES,
    DraftLengthConfig,
    DraftLengthPolicy,
    RoundOutcome,
    available_draft_length_policies,
    register_policy,
)

import_component_modules(__name__, __path__)

__all__ = [
    "POLICIES",
    "DraftLengthConfig",
    "DraftLengthPolicy",
    "RoundOutcome",
    "available_draft_length_policies",
    "register_policy",
]
