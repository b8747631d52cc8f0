"""The acceptance-rule interface.

A round of speculative decoding drafts γ tokens x̂_1..x̂_γ, runs the target once over them, and asks the rule which
drafts to keep. Following vLLM's v0 rejection sampler, the work is split so that a rule only decides:

- `accept()`: a per-position verdict, `(batch, γ)` booleans (a rule may look ahead, e.g. FLy's deferred window);
- `rejection_token()`: what to emit at the first rejected position (default: the target's own token there);
- `deferred_window` and `own_test()`, only for a rule that keeps a draft on the evidence of the drafts after it
  (FLy): W, and each draft's own test, which the round reports (`num_matched`) so that a draft-length policy can
  price rounds long enough for the window.

`AcceptanceRule.verify()` owns everything else: the cut at the first rejection, the bonus token from the target when
all γ drafts are accepted. Verification is a pure function of tensors — no model call — so every
rule can be unit-tested on hand-written logits.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import torch

from ..component_config import ComponentConfig
from ..errors import invalid_value
from ..registry import Registry


@dataclass
class RuleConfig(ComponentConfig):
    """Base config of acceptance rules: the options passed as `acceptance_kwargs`."""

    argument_name = "acceptance_kwargs"


# Randomness goes through these two functions so tests can patch them with worked numbers.
def sample_uniform(shape: tuple[int, ...], device: torch.device, generator: torch.Generator | None) -> torch.Tensor:
    """u ~ U[0, 1) of `shape`, float32."""
    return torch.rand(shape, device=device, generator=generator, dtype=torch.float32)


def sample_categorical(probs: torch.Tensor, generator: torch.Generator | None) -> torch.LongTensor:
    """One draw per row from `probs` of shape `(..., vocab)` (each row ≥ 0 with positive mass); returns shape `(...)`.

    By the exponential race: argmax_v q(v) / E_v with E_v ~ Exp(1) independent is v with probability q(v) / Σ q
    (q(v)/E_v is the largest exactly when E_v/q(v), an exponential of rate q(v), comes first). Unlike
    `torch.multinomial`, which checks its input on the host, it needs no host sync, so sampled drafting and
    verification sync no more than greedy ones. E is kept above the smallest normal float: a float32 draw can be 0,
    which would pick a token of probability 0 (0/0) or skew the race."""
    race = torch.empty(probs.shape, device=probs.device, dtype=torch.float32).exponential_(generator=generator)
    return (probs.float() / race.clamp_min_(torch.finfo(torch.float32).tiny)).argmax(-1)


def gather_rows(values: torch.Tensor, position: torch.LongTensor) -> torch.Tensor:
    """`values[b, position[b]]` for `values` of shape `(batch, length, ...)` → `(batch, ...)`."""
    return values[torch.arange(values.shape[0], device=values.device), position]


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(p − q, 0)) over the last axis (Leviathan et al. 2023, Algorithm 1); falls back to `p` where the
    residual has no mass (p == q there, so a rejection cannot have happened, but the value must stay a distribution)."""
    residual = (p - q).clamp_min(0)
    mass = residual.sum(-1, keepdim=True)
    return torch.where(mass > 0, residual / mass.clamp_min(torch.finfo(residual.dtype).tiny), p)


@dataclass
class VerificationInput:
    """What a rule sees for one round. `γ` = number of draft tokens (may be 0).

    Args:
        draft_token_ids (`torch.LongTensor` of shape `(batch, γ)`): the drafted tokens x̂, in target vocabulary ids.
        target_logits (`torch.FloatTensor` of shape `(batch, γ + 1, vocab)`): target logits after the logits
            processors; row `i` predicts the token after `i` drafts (row γ gives the bonus token).
        draft_probs (`torch.FloatTensor` of shape `(batch, γ, vocab)`, *optional*): the distribution each draft
            token was drawn from (q, or the redistributed r of a pruned-vocabulary drafter). Given when sampling or
            when the rule sets `requires_draft_probs`.
        target_hidden_states (`torch.FloatTensor` of shape `(batch, γ + 1, hidden)`, *optional*): the input of the
            target's LM head at the same positions as `target_logits`; given when the rule sets
            `requires_target_hidden_states`.
        lm_head_weight (`torch.Tensor` of shape `(vocab, hidden)`, *optional*) and `lm_head_bias` (`(vocab,)`,
            *optional*): the target's LM head, given with the hidden states.
        do_sample (`bool`): sampling (`True`) or greedy (`False`) decoding. A rule's draws come from torch's global
            RNG, as transformers' sampling does (`torch.manual_seed` makes a round reproducible).
        draft_limits (`tuple[int, ...]`, *optional*): the drafts each row may use, at most γ (host ints, one per
            row): a row of a batch that is nearer its `max_length` than the batch's longest is verified as if it had
            drafted only these, as it would be alone (its drafts from position `draft_limits[r]` on are not accepted,
            and that position gives its bonus token). `None`: γ for every row.
        row_ids (`tuple[int, ...]`, *optional*): each row's index in the caller's input (the rows of a dynamic batch
            leave as they finish), for a rule that keeps state per row across rounds (`dropmatch`'s mask
            generators); `None`: `0 .. batch − 1`.
    """

    draft_token_ids: torch.LongTensor
    target_logits: torch.FloatTensor
    draft_probs: torch.FloatTensor | None = None
    target_hidden_states: torch.FloatTensor | None = None
    lm_head_weight: torch.Tensor | None = None
    lm_head_bias: torch.Tensor | None = None
    do_sample: bool = False
    draft_limits: tuple[int, ...] | None = None
    row_ids: tuple[int, ...] | None = None
    _memo: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def once(self, key: str, compute: Callable[[], Any]) -> Any:
        """Per-round memo: `compute()` the first time `key` is asked for on these inputs, the same value after.

        Lets a rule draw its random samples once in `accept()` and emit one of them in `rejection_token()`.
        """
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    @property
    def num_draft_tokens(self) -> int:
        return self.draft_token_ids.shape[1]

    # (Computed once per round through `once`, not `functools.cached_property`, whose lock on Python 3.11 torch.compile
    # cannot trace: the loop compiles `verify`.)
    @property
    def draft_limit(self) -> torch.LongTensor | None:
        """`draft_limits` as a `(batch,)` tensor on the target logits' device, or `None` (the loop passes limits only
        in the rounds where a row is nearer its end than the batch's longest: a copy to the device in those)."""
        if self.draft_limits is None:
            return None
        return self.once("draft_limit", lambda: torch.tensor(self.draft_limits, dtype=torch.long,
                                                             device=self.target_logits.device))

    @property
    def target_probs(self) -> torch.FloatTensor:
        """softmax of `target_logits` in float32, shape `(batch, γ + 1, vocab)` (computed once per round)."""
        return self.once("target_probs", lambda: self.target_logits.float().softmax(-1))

    @property
    def target_greedy_ids(self) -> torch.LongTensor:
        """argmax of `target_logits`, shape `(batch, γ + 1)` (first index on ties, as `torch.argmax`)."""
        return self.once("target_greedy_ids", lambda: self.target_logits.argmax(-1))

    def target_prob_of_drafts(self) -> torch.FloatTensor:
        """p_i(x̂_i), shape `(batch, γ)`."""
        return self.target_probs[:, :-1].gather(-1, self.draft_token_ids[..., None]).squeeze(-1)

    def drafts_allowed(self) -> torch.BoolTensor:
        """Whether the logits processors left each draft possible, shape `(batch, γ)`. Sampling: p_i(x̂_i) > 0, the
        support plain sampling draws from (a forbidden logit, −inf or the lowest finite float that transformers'
        `remove_invalid_values=True` writes for it, divided by a temperature, has p = 0). Greedy: the target logit
        above that lowest finite float (no softmax needed; greedy decoding applies no temperature)."""
        if self.do_sample:
            return self.target_prob_of_drafts() > 0
        logits = self.target_logits[:, :-1].gather(-1, self.draft_token_ids[..., None]).squeeze(-1)
        return logits > torch.finfo(logits.dtype).min

    def checked_draft_probs(self, why: str = "this rule reads q(x̂) (when sampling, or always if it sets "
                            "requires_draft_probs)", fix: str = "pass draft_probs=q, the draft's probabilities after "
                            "the logits processors") -> torch.FloatTensor:
        """`draft_probs`, after checking that it is there with shape `(batch, γ, vocab)`; a clear error otherwise."""
        expected = (*self.draft_token_ids.shape, self.target_logits.shape[-1])
        if self.draft_probs is None or tuple(self.draft_probs.shape) != expected:
            raise invalid_value(
                "draft_probs",
                None if self.draft_probs is None else f"a tensor of shape {tuple(self.draft_probs.shape)}",
                f"the distribution each draft was drawn from, shape (batch, γ, vocab) = {expected}: {why}",
                fix,
            )
        return self.draft_probs

    def draft_prob_of_drafts(self) -> torch.FloatTensor:
        """q_i(x̂_i), shape `(batch, γ)`; needs `draft_probs` (`checked_draft_probs`)."""
        return self.checked_draft_probs().float().gather(-1, self.draft_token_ids[..., None]).squeeze(-1)


@dataclass
class VerificationResult:
    """Outcome of one round.

    Args:
        num_accepted (`torch.LongTensor` of shape `(batch,)`): accepted drafts, `0 ≤ n ≤ γ` (a prefix).
        next_token (`torch.LongTensor` of shape `(batch,)`): the token emitted after them: the rule's rejection
            token at position n, or the target's bonus token when n == γ.
        accepted (`torch.BoolTensor` of shape `(batch, γ)`): the rule's per-position verdicts before the cut.
        num_matched (`torch.LongTensor` of shape `(batch,)`, *optional*): for a rule with a `deferred_window`, the
            drafts before the first one that failed the rule's own test (FLy's Δ), so `num_matched < num_accepted`
            when the window kept that mismatch; `None` for rules that judge each draft alone (`== num_accepted`).
    """

    num_accepted: torch.LongTensor
    next_token: torch.LongTensor
    accepted: torch.BoolTensor
    num_matched: torch.LongTensor | None = None


class AcceptanceRule(ABC):
    """Base of every acceptance rule; subclasses implement `accept` and, optionally, `rejection_token`. `verify` owns
    the rest: the first-rejection cut, the bonus token, and the one rule every rule obeys: a draft the
    logits processors forbid (target logit −inf) is never accepted.

    Class attributes a rule sets:
        name (`str`): the value of `acceptance=` that selects it.
        config_class (`type[RuleConfig]`): its options (`acceptance_kwargs`).
        paper (`str`): link to the method's paper.
        lossless (`bool`): whether the output distribution provably equals the target's.
        supports_greedy / supports_sampling (`bool`): which decoding modes the rule defines.
        requires_draft_probs (`bool`): needs q even when decoding greedily.
        requires_target_hidden_states (`bool`): needs the LM-head input at the verified positions.
        redistributes_draft (`bool`): the drafter draws from RDK's redistributed r instead of q (needs a
            pruned-vocabulary drafter with a kernel, see `hf_semspec.drafters`).
        greedy_drafts (`bool`): the drafter proposes argmax q even when sampling (the target's tokens are still
            sampled); a rule may set it per instance from its options (FLy's `sampling="greedy_drafts"`).
        compiles_verification (`bool`): the loop may compile its greedy `verify` (static caches, a compiled target):
            it reads only the drafts and the target's logits, and nothing of it reads a value back to the host or
            keeps Python state (default False: a rule registered elsewhere verifies eagerly unless it says so).
        default_num_draft_tokens (`int`): γ used when the user sets no `num_assistant_tokens`.
    """

    name: ClassVar[str]
    config_class: ClassVar[type[RuleConfig]]
    paper: ClassVar[str] = ""
    lossless: ClassVar[bool] = False
    supports_greedy: ClassVar[bool] = True
    supports_sampling: ClassVar[bool] = True
    requires_draft_probs: ClassVar[bool] = False
    requires_target_hidden_states: ClassVar[bool] = False
    redistributes_draft: ClassVar[bool] = False
    greedy_drafts: bool = False
    compiles_verification: ClassVar[bool] = False
    default_num_draft_tokens: ClassVar[int] = 5

    def __init__(self, config: RuleConfig | None = None):
        self.config = config if config is not None else self.config_class()
        self.config.validate()

    def check_decoding_mode(self, do_sample: bool) -> None:
        """Raises before decoding when the rule does not define the requested mode."""
        supported = self.supports_sampling if do_sample else self.supports_greedy
        if not supported:
            other = "do_sample=False" if do_sample else "do_sample=True"
            raise invalid_value(
                "do_sample",
                do_sample,
                f"{other} only, for acceptance='{self.name}'",
                f"pass {other}, or choose another rule with `acceptance=`",
            )

    def check_target_model(self, model: torch.nn.Module) -> None:
        """Raises before decoding when the target model lacks what the rule needs (nothing, unless a rule says)."""

    def check_assistant_model(self, assistant_model: torch.nn.Module | None) -> None:
        """Raises before decoding when the draft model lacks what the rule needs; `None`: no draft model, the drafts
        are prompt lookup's (`hf_semspec.ngram`), one-hot proposals copied from the context."""
        if self.redistributes_draft and assistant_model is None:
            raise invalid_value(
                "acceptance",
                self.name,
                f"a rule that verifies drafts made without a draft model (prompt_lookup_num_tokens): {self.name!r} "
                "redistributes a pruned-vocabulary drafter's distribution through its RDK kernel, and prompt lookup "
                "has neither",
                "use acceptance='exact' (lossless) with prompt_lookup_num_tokens, or drop prompt_lookup_num_tokens "
                "and pass assistant_model=<a pruned drafter with an RDK kernel>",
            )
        if self.redistributes_draft and getattr(assistant_model, "rdk_indices", None) is None:
            raise invalid_value(
                "assistant_model",
                type(assistant_model).__name__,
                f"a pruned-vocabulary drafter with an RDK kernel when acceptance='{self.name}'",
                "build one with hf_semspec.drafters.prune_vocabulary(..., rdk=True), or use acceptance='exact'",
            )

    @abstractmethod
    def accept(self, inputs: VerificationInput) -> torch.BoolTensor:
        """Per-position verdicts, shape `(batch, γ)`. Must not modify `inputs` in place."""

    @property
    def deferred_window(self) -> int | None:
        """W when the rule may accept a draft that fails its own test on the evidence of the W drafts after it in
        the same round (FLy's deferred window), so that a draft-length policy can price rounds long enough for it;
        `None` (the default) for rules that judge each draft alone."""
        return None

    def own_test(self, inputs: VerificationInput) -> torch.BoolTensor | None:
        """For a rule with a `deferred_window`: each draft's own test before the window loosens it (FLy's Δ),
        shape `(batch, γ)`, from the same draws as `accept()`; `None` otherwise."""
        return None

    def rejection_token(self, inputs: VerificationInput, position: torch.LongTensor) -> torch.LongTensor:
        """Token emitted at the first rejected `position` (shape `(batch,)`); default: the target's own token."""
        return self.target_token(inputs, position)

    @staticmethod
    def target_token(inputs: VerificationInput, position: torch.LongTensor) -> torch.LongTensor:
        """The target's token at `position`: argmax when greedy, a draw from p when sampling."""
        if inputs.do_sample:
            return sample_categorical(gather_rows(inputs.target_probs, position), None)
        return gather_rows(inputs.target_greedy_ids, position)

    @staticmethod
    def standard_accept(inputs: VerificationInput) -> torch.BoolTensor:
        """What `exact` accepts (Leviathan et al. 2023), shape `(batch, γ)`: x̂ = argmax p when greedy; u·q(x̂) < p(x̂)
        when sampling, written without the division (q(x̂) > 0 for a token drawn from q), one uniform per draft."""
        if not inputs.do_sample:
            return inputs.draft_token_ids == inputs.target_greedy_ids[:, :-1]
        p = inputs.target_prob_of_drafts()
        q = inputs.draft_prob_of_drafts()
        return sample_uniform(p.shape, p.device, None) * q < p

    @staticmethod
    def residual_token(inputs: VerificationInput, position: torch.LongTensor) -> torch.LongTensor:
        """`exact`'s token after a sampled rejection at `position`, shape `(batch,)`: a draw from norm(max(p − q, 0))."""
        p = gather_rows(inputs.target_probs, position)
        q = gather_rows(inputs.checked_draft_probs(), position).float()
        return sample_categorical(residual_distribution(p, q), None)

    def verify(self, inputs: VerificationInput) -> VerificationResult:
        """Runs the rule on one round: first-rejection cut, rejection/bonus token. No host sync (the loop reads the
        result once per round and keeps the statistics on the host)."""
        gamma = inputs.num_draft_tokens
        batch_size = inputs.draft_token_ids.shape[0]
        device = inputs.target_logits.device
        if inputs.target_logits.dim() != 3 or tuple(inputs.target_logits.shape[:2]) != (batch_size, gamma + 1):
            raise invalid_value(
                "target_logits",
                f"a tensor of shape {tuple(inputs.target_logits.shape)}",
                f"shape (batch, γ + 1, vocab) = ({batch_size}, {gamma + 1}, vocab) for draft_token_ids of shape "
                f"{tuple(inputs.draft_token_ids.shape)}",
                "pass the logits of the γ + 1 verified positions: row i predicts the token after i drafts, row γ the "
                "bonus token",
            )
        if gamma == 0:
            accepted = torch.zeros(batch_size, 0, dtype=torch.bool, device=device)
            num_accepted = torch.zeros(batch_size, dtype=torch.long, device=device)
            next_token = self.target_token(inputs, num_accepted)
            num_matched = num_accepted if self.deferred_window is not None else None
        else:
            # Whatever the rule, a draft the logits processors forbid (logit −inf: outside top-k / top-p, a bad word,
            # a suppressed token) is rejected, so the output stays where the user's processors put it. A relaxed
            # rule's own test need not look at p(x̂) (fly's window, dropmatch's JS spread); exact and ears reject
            # these drafts anyway.
            accepted = self.accept(inputs) & inputs.drafts_allowed()
            limit, own = gamma, None
            if inputs.draft_limit is not None:  # each row's own γ: the drafts past it are not the row's
                limit = inputs.draft_limit
                own = torch.arange(gamma, device=device) < limit[:, None]
                accepted = accepted & own
            # The sequence keeps the longest all-accepted prefix: n = Σ_i Π_{j≤i} accepted_j.
            num_accepted = accepted.long().cumprod(-1).sum(-1)
            bonus = self.target_token(inputs, num_accepted)  # valid where n == the row's γ (its bonus row)
            correction = self.rejection_token(inputs, num_accepted.clamp(max=gamma - 1))
            next_token = torch.where(num_accepted == limit, bonus, correction)
            matched = self.own_test(inputs)
            if matched is not None and own is not None:
                matched = matched & own
            num_matched = None if matched is None else matched.long().cumprod(-1).sum(-1)
        return VerificationResult(
            num_accepted=num_accepted, next_token=next_token, accepted=accepted, num_matched=num_matched
        )


RULES: Registry[AcceptanceRule] = Registry(
    kind="acceptance rule", argument="acceptance", base=AcceptanceRule, listing_function="hf_semspec.available_rules"
)
register_rule = RULES.register


def available_rules() -> list[str]:
    """Names accepted by `generate(..., acceptance=...)`."""
    return RULES.names()
