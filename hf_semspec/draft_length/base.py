"""The draft-length policy interface: how many tokens to draft each round.

A policy is a second switch next to the acceptance rule (`draft_length="<name>"`, `draft_length_kwargs={...}`):

- `max_tokens()`: the round's budget, asked before drafting;
- `keep_drafting(num_drafted, probs)`: asked after each drafted token when the policy `decides_per_token`;
  returning `False` ends the round early. Reading a value to decide costs one host sync per drafted token, so
  only per-token policies are asked, and fixed-budget policies cost nothing;
- `observe(outcome)`: the verification result of the round, to adapt (schedules, bandits);
- `set_deferred_window(window)`: told once per `generate()` call, before the first round, whether the acceptance
  rule can keep a mismatch on the evidence of the drafts after it (FLy: W drafts), which only a round long enough
  for the window allows.

State across calls. A policy instance passed as `draft_length=` keeps what it learned across the calls it is passed
to. A name builds an instance; a policy that learns something worth keeping (`keeps_state_across_calls`: the
machine's round times, the draft's calibration, a bandit's arm values) is then kept for the next call with the same
target, draft, rule (with its options) and policy options, as transformers keeps its "heuristic" schedule's length on
the assistant model, and with the same dtype and device of both models and decoding mode (greedy or sampling): what
it learned is theirs, so a call after the models move starts afresh, and one after they move back goes on.
`hf_semspec.forget_draft_length_state()` starts them afresh.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..component_config import ComponentConfig
from ..errors import invalid_value
from ..registry import Registry


# The length a policy built outside `generate()` takes where its length field is None (`generate()` fills it with
# `num_assistant_tokens` or the rule's default draft length): the default of most rules.
UNSET_LENGTH_FALLBACK = 5

# The most tokens one round may draft: the cap on `num_assistant_tokens` (and a draft's own), and on
# `prompt_lookup_num_tokens`. (Also importable as `hf_semspec.generation.MAX_DRAFT_TOKENS`.)
MAX_DRAFT_TOKENS = 128


def default_length(config: DraftLengthConfig, length_field: str, length: int) -> int:
    """The value a `None` length field of `config` takes from a default `length` (the rule's γ, or tapout's length for
    its arms): an initial length starts no higher than the cap the user may have set below that default."""
    if length_field == "initial_tokens":
        return min(length, config.max_tokens)
    return length


@dataclass
class DraftLengthConfig(ComponentConfig):
    """Base config of draft-length policies: the options passed as `draft_length_kwargs`."""

    argument_name = "draft_length_kwargs"


class InitialLengthMixin:
    """For configs with an `initial_tokens` (None until `generate()` fills it) and a cap `max_tokens`."""

    initial_tokens: int | None
    max_tokens: int

    def _validate_extra(self) -> None:
        if self.initial_tokens is not None and self.initial_tokens > self.max_tokens:
            raise invalid_value(
                f"{self.argument_name}['initial_tokens']",
                self.initial_tokens,
                f"at most max_tokens={self.max_tokens} for '{self.component_name}'",
                "lower initial_tokens or raise max_tokens",
            )

    def first_length(self) -> int:
        """`initial_tokens`, or `UNSET_LENGTH_FALLBACK` (5) for a config built outside `generate()`."""
        return self.initial_tokens if self.initial_tokens is not None else default_length(
            self, "initial_tokens", UNSET_LENGTH_FALLBACK)


@dataclass(frozen=True)
class RoundOutcome:
    """What one round produced, reported to `DraftLengthPolicy.observe`.

    Args:
        num_drafted (`int`): tokens drafted this round (γ).
        num_accepted (`int`): drafts the acceptance rule accepted (the round emitted `num_accepted + 1` tokens), up
            to the end of the output: in a round cut at a drafted EOS or where a stopping criterion fired, the drafts
            through the cut, which are then all the round's tokens (`cut`).
        seconds (`float`): wall time of the round, drafting through verification.
        includes_prefill (`bool`): the round's forwards also processed the prompt (the first round of a call), so
            `seconds` says little about the cost of drafting.
        num_matched (`int`, *optional*): with a rule that has a deferred window, the drafts before the first one
            that failed the rule's own test (`num_matched < num_accepted` when the window kept that mismatch);
            `None` when the rule judges each draft alone.
        cut (`bool`): the output ended inside the round's accepted drafts (a drafted EOS, or a stopping criterion),
            so the round emitted `num_accepted` tokens, all drafts, and saw no rejection: the drafts after the cut
            are not evidence of acceptance either way (censored), and a policy that learns must not count a
            rejection at draft `num_accepted + 1`.
    """

    num_drafted: int
    num_accepted: int
    seconds: float
    includes_prefill: bool = False
    num_matched: int | None = None
    cut: bool = False

    @property
    def num_emitted(self) -> int:
        """Tokens the round added to the output: the accepted drafts and the target's token after them, or the
        accepted drafts alone in a `cut` round."""
        return self.num_accepted if self.cut else self.num_accepted + 1

    @property
    def matched(self) -> int:
        """Drafts that passed the rule's own test before the first that failed it: `num_matched`, or `num_accepted`
        for a rule that judges each draft alone."""
        return self.num_accepted if self.num_matched is None else self.num_matched

    def tested_window(self, window: int) -> bool:
        """Whether the first draft that failed the rule's own test had `window` drafts after it in the round, so a
        deferred window of that size could keep it; it did if `num_accepted > matched`."""
        return self.matched + 1 + window <= self.num_drafted


class DraftLengthPolicy(ABC):
    """Base of every draft-length policy.

    Class attributes a policy sets:
        name (`str`): the value of `draft_length=` that selects it.
        config_class (`type[DraftLengthConfig]`): its options (`draft_length_kwargs`).
        paper (`str`): link to the method's paper, if any.
        length_field (`str` or `None`): the config field that `num_assistant_tokens` sets when the user gives it
            (the fixed length, the initial length or the cap, depending on the policy); a `None` value of that
            field is filled with `num_assistant_tokens`, else the draft's `generation_config.num_assistant_tokens`,
            else the acceptance rule's default draft length.
        decides_per_token (`bool`): `keep_drafting` is called after each drafted token.
        reads_draft_probs (`bool`): `keep_drafting` receives the draft distribution q (else `None`).
        keeps_state_across_calls (`bool`): what it learns outlives one call, so an instance built from its name is
            kept for the next call with the same models (dtypes and devices), rule, options and decoding mode
            (module docstring).
    """

    name: ClassVar[str]
    config_class: ClassVar[type[DraftLengthConfig]]
    paper: ClassVar[str] = ""
    length_field: ClassVar[str | None] = None
    decides_per_token: ClassVar[bool] = False
    reads_draft_probs: ClassVar[bool] = False
    keeps_state_across_calls: ClassVar[bool] = False

    def __init__(self, config: DraftLengthConfig | None = None):
        if config is not None and not isinstance(config, self.config_class):
            raise invalid_value(
                "config", type(config).__name__, f"a {self.config_class.__name__} for {self.name!r}",
                f"pass {self.config_class.__name__}(...), or build the policy whose config this is",
            )
        self.config = config if config is not None else self.config_class()
        self.config.validate()

    @abstractmethod
    def max_tokens(self) -> int:
        """Upper bound on the tokens drafted in the next round (the loop also caps it near `max_length`)."""

    def keep_drafting(self, num_drafted: int, probs: torch.FloatTensor | None) -> bool:
        """After `num_drafted` tokens of this round: continue? `probs` is q of the last drafted token, shape
        `(batch, vocab)`, when `reads_draft_probs`."""
        return True

    def observe(self, outcome: RoundOutcome) -> None:
        """Learns from one verified round."""

    def set_deferred_window(self, window: int | None) -> None:
        """The acceptance rule's `deferred_window`: W if it may keep a mismatch that has W drafts after it in the
        round (FLy), else `None`. Called before the first round of each `generate()` call; ignored by default."""


POLICIES: Registry[DraftLengthPolicy] = Registry(
    kind="draft-length policy",
    argument="draft_length",
    base=DraftLengthPolicy,
    listing_function="hf_semspec.available_draft_length_policies",
)
register_policy = POLICIES.register


def available_draft_length_policies() -> list[str]:
    """Names accepted by `generate(..., draft_length=...)`."""
    return POLICIES.names()
