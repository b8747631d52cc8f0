"""hf_semspec: speculative decoding for transformers' `generate()` with semantic acceptance rules.

    import hf_semspec
    hf_semspec.attach(target)
    out = target.generate(**inputs, assistant_model=draft, acceptance="exact")
"""

from .decoding import SpeculativeDecoderOnlyOutput, speculative_decode
from .draft_length import DraftLengthPolicy, available_draft_length_policies, register_policy
from .errors import SemSpecConfigError
from .generation import (
    attach,
    detach,
    forget_draft_length_state,
    generate,
    restore_saved_generation_fields,
    set_default_acceptance,
)
from .rules import AcceptanceRule, RuleConfig, VerificationInput, VerificationResult, available_rules, register_rule
from .stats import AcceptanceStats

__version__ = "0.1.0"

__all__ = [
    "AcceptanceRule",
    "AcceptanceStats",
    "DraftLengthPolicy",
    "RuleConfig",
    "SemSpecConfigError",
    "SpeculativeDecoderOnlyOutput",
    "VerificationInput",
    "VerificationResult",
    "attach",
    "available_draft_length_policies",
    "available_rules",
    "detach",
    "forget_draft_length_state",
    "generate",
    "register_policy",
    "register_rule",
    "restore_saved_generation_fields",
    "set_default_acceptance",
    "speculative_decode",
]
