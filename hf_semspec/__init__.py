"""hf_semspec: speculative decoding for transformers' `generate()` with semantic acceptance rules.

    import hf_semspec
    hf_semspec.attach(target)  # or hf_semspec.enable() for every model of the process
    out = target.generate(**inputs, assistant_model=draft, acceptance="exact")

Importing it puts a guard in front of transformers' `generate()` (hf_semspec/enabling.py): a call that names a rule
on a model neither attached nor covered by `enable()` raises an error naming the fixes instead of decoding without
the rule; a call without hf_semspec's fields is untouched.
"""

from ._versions import check_versions

check_versions()  # before anything imports torch or transformers: outside the supported ranges, say so first

from .comparison import ComparisonReport, compare  # noqa: E402
from .decoding import SpeculativeDecoderOnlyOutput, cpu_compile_config, speculative_decode  # noqa: E402
from .draft_length import DraftLengthPolicy, available_draft_length_policies, register_policy  # noqa: E402
from .drafting_choice import forget_drafting_costs  # noqa: E402
from .enabling import disable, enable, install_guard, is_enabled  # noqa: E402
from .errors import SemSpecConfigError  # noqa: E402
from .generation import (  # noqa: E402
    attach,
    detach,
    forget_draft_length_state,
    generate,
    restore_saved_generation_fields,
    set_default_acceptance,
)
from .rules import AcceptanceRule, RuleConfig, VerificationInput, VerificationResult, available_rules, register_rule  # noqa: E402
from .stats import AcceptanceStats  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "AcceptanceRule",
    "AcceptanceStats",
    "ComparisonReport",
    "DraftLengthPolicy",
    "RuleConfig",
    "SemSpecConfigError",
    "SpeculativeDecoderOnlyOutput",
    "VerificationInput",
    "VerificationResult",
    "attach",
    "available_draft_length_policies",
    "available_rules",
    "compare",
    "cpu_compile_config",
    "detach",
    "disable",
    "enable",
    "forget_draft_length_state",
    "forget_drafting_costs",
    "generate",
    "is_enabled",
    "register_policy",
    "register_rule",
    "restore_saved_generation_fields",
    "set_default_acceptance",
    "speculative_decode",
]

install_guard()
