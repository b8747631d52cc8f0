"""`constant`: draft the same number of tokens every round (transformers' `num_assistant_tokens_schedule="constant"`).

    γ_t = γ for every round t.

Worked example: `draft_length_kwargs={"num_tokens": 4}` drafts 4 tokens in every round, whatever was accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..component_config import Range
from .base import UNSET_LENGTH_FALLBACK, DraftLengthConfig, DraftLengthPolicy, register_policy


@dataclass
class ConstantConfig(DraftLengthConfig):
    component_name = "constant"
    num_tokens: int | None = field(
        default=None,
        metadata={
            "help": "tokens drafted per round; None = num_assistant_tokens, else the draft's "
                    "generation_config.num_assistant_tokens, else the acceptance rule's default (5 for a policy built "
                    "outside generate())",
            "range": Range(1, 128),
        },
    )


@register_policy
class ConstantPolicy(DraftLengthPolicy):
    name = "constant"
    config_class = ConstantConfig
    length_field = "num_tokens"

    def max_tokens(self) -> int:
        """`num_tokens`, or `UNSET_LENGTH_FALLBACK` (5) for a config built outside `generate()` without one."""
        return self.config.num_tokens if self.config.num_tokens is not None else UNSET_LENGTH_FALLBACK
