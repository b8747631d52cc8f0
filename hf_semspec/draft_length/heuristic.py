"""`heuristic`: transformers' `num_assistant_tokens_schedule="heuristic"` (and `"heuristic_transient"`).

No paper: the rule is the one in transformers' `AssistedCandidateGenerator.update_candidate_strategy`
(`transformers/generation/candidate_generator.py`), applied after every verified round t:

    γ_1     = num_assistant_tokens                          (`initial_tokens`)
    γ_{t+1} = γ_t + 2              if n_t = γ̂_t            (every drafted token was accepted)
    γ_{t+1} = max(1, γ_t − 1)      otherwise

where γ_t is the round's budget, γ̂_t the tokens actually drafted (fewer than γ_t near `max_length`) and n_t the
drafts accepted. As in transformers, the test compares the accepted count with the tokens *drafted*, the floor is 1,
and the increment applies to the budget. Three differences:
- transformers lets γ grow without bound (its loop caps each round near `max_length`); here γ never exceeds
  `max_tokens` (default 128, the package's largest draft).
- The last round of an output that ends inside it (an accepted EOS draft, a stopping criterion: `RoundOutcome.cut`)
  counts as fully accepted here: +2. Every draft it output was accepted, and the drafts after the end were never
  judged. transformers 5.x counts the matches again after cutting at the EOS, one fewer than drafted, so such a
  round gives −1 there (it does not cut at other stopping criteria). Only the length a "heuristic" schedule carries
  into the next call can differ.
- A round that drafted nothing (one token left before `max_length`, or a static cache's last free slots) leaves γ
  as it is: 0 of 0 tested no draft. transformers reads it as every draft accepted, +2.

Where the state lives. transformers keeps γ on the *assistant model*: with "heuristic" it writes γ back to
`assistant_model.generation_config.num_assistant_tokens` at the end of `generate()`, so the next call starts where the
last one stopped; "heuristic_transient" starts every call from the initial value. Here the policy instance holds γ:
`draft_length="heuristic"` and the "heuristic_transient" schedule build a new instance per `generate()` call; the
"heuristic" schedule's instance is kept for the next call with the same target, draft, rule and options (transformers
keys γ on the draft model alone), as the policies that learn are; an instance passed as
`draft_length=HeuristicPolicy(...)` keeps γ across the calls it is passed to. The first length also differs when the
user sets none: transformers starts from 20 (its global default for `num_assistant_tokens`), here an unset
`initial_tokens` is, as in transformers, the draft's `generation_config.num_assistant_tokens` where that is set, else
the acceptance rule's default draft length (5 when the policy is built outside `generate()`).
transformers' separate `assistant_confidence_threshold` stopping criterion is not part of this policy.

Worked example: `initial_tokens=5`. Rounds (drafted, accepted) = (5, 5), (7, 3), (6, 6), (8, 0) give budgets
5 → 7 → 6 → 8 → 7; from γ = 1 a round (1, 0) stays at 1 (the floor), and a round (1, 1) gives 3.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..component_config import Range
from .base import DraftLengthConfig, DraftLengthPolicy, InitialLengthMixin, RoundOutcome, register_policy


@dataclass
class HeuristicConfig(InitialLengthMixin, DraftLengthConfig):
    component_name = "heuristic"
    initial_tokens: int | None = field(
        default=None,
        metadata={
            "help": "draft length of the first round (transformers' num_assistant_tokens); None = "
            "num_assistant_tokens, else the draft's generation_config.num_assistant_tokens, else the acceptance rule's "
            "default",
            "range": Range(1, 128),
        },
    )
    max_tokens: int = field(
        default=128,
        metadata={
            "help": "largest draft length the schedule may reach (transformers has no cap)",
            "range": Range(1, 128),
        },
    )


@register_policy
class HeuristicPolicy(DraftLengthPolicy):
    """+2 after a round whose drafts were all accepted, −1 (floor 1) otherwise; see the module docstring."""

    name = "heuristic"
    config_class = HeuristicConfig
    length_field = "initial_tokens"

    def __init__(self, config: HeuristicConfig | None = None):
        super().__init__(config)
        # A config built without a length (outside generate()) starts from 5, transformers' first-call value being 20
        # and every rule's default being 5.
        self.num_tokens = self.config.first_length()

    def max_tokens(self) -> int:
        return self.num_tokens

    def observe(self, outcome: RoundOutcome) -> None:
        if outcome.num_drafted == 0:
            return  # a round with no drafts (one token left before max_length) tested nothing: no step either way
        # A round cut at the output's end (a drafted EOS, a stop) accepted every draft it output, and the drafts after
        # the end are censored, not rejected (transformers 5.x gives −1 at an EOS: module docstring).
        if outcome.num_accepted == outcome.num_drafted or outcome.cut:
            self.num_tokens = min(self.num_tokens + 2, self.config.max_tokens)
        else:
            self.num_tokens = max(1, self.num_tokens - 1)
