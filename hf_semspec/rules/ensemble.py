"""`ensemble`: static ensemble verification — drafts are verified against the mixture w·p + (1 − w)·q, not p.

Verification from DIVERSE (arXiv:2604.07622, https://arxiv.org/abs/2604.07622), as transformers ships it as
`generate(..., assistant_model=draft, assistant_ensemble_weight=w)` (transformers 5.24, PR #45979). It is the lossy
rule a transformers user meets first; hf_semspec runs it as one rule among the others, on every path of its loop
(batches, static caches and the compiled round, multi-level drafting, padded vocabularies). With
`acceptance="exact"`, `assistant_ensemble_weight=w` means this rule at weight w, as in transformers.

With p_i the target's distribution at draft position i and q_i the draft's (both after the logits processors), the
rule verifies against

    ν_i = w · p_i + (1 − w) · q_i,        0 < w < 1   (w → 1 is `exact`).

Greedy (`do_sample=False`): keep x̂_i while x̂_i = argmax ν_i; at the first mismatch emit argmax ν_i (what
transformers emits there), and after γ acceptances the bonus argmax p_{γ+1}. The argmax runs over the tokens the
logits processors allow the target (a −inf target logit): where the draft went through the same processors, as in
the loop and in transformers, q is 0 there too and this changes nothing. The output is no longer the target's
greedy decode: a draft the draft model is sure of may outvote a target that prefers another token.

Sampling: speculative sampling with ν as the target (Leviathan et al. 2023, Algorithm 1). With u_i ~ U[0, 1), accept
x̂_i if

    u_i < ν_i(x̂_i) / q_i(x̂_i) = 1 − w + w · p_i(x̂_i) / q_i(x̂_i),

and at the first rejection draw from norm(max(ν_i − q_i, 0)) = norm(max(p_i − q_i, 0)) (ν − q = w·(p − q)): the
residual `exact` uses, falling back to p_i where it has no mass, as transformers does. The bonus token is drawn from
p_{γ+1}. This is speculative sampling, lossless for ν: each emitted draft-position token is distributed as the
mixture ν itself (accepted mass Σ min(q, ν), the rest spread by norm((ν − q)₊)), and the bonus as p. A draft is kept
with probability at least 1 − w, whatever the target thinks of it. With the exception below,

    π(x) = q(x) · a(x) + (1 − Σ_y q(y) · a(y)) · r(x),   a(x) = min(1, 1 − w + w · p(x)/q(x)) · [p(x) > 0],

r the residual, which is ν wherever p > 0 (`emitted_distribution` computes π; the tests check the rule against it).

One departure from transformers, shared by every rule here: a draft the logits processors forbid (p(x̂) = 0: top-k,
top-p, bad words, min_new_tokens' EOS ban) is never accepted (the [p(x) > 0] above), where transformers' sampled test
would still keep it with probability 1 − w. Greedy decoding has no such case when the draft goes through the same
processors (its q is 0 there as well).

Prompt lookup alone (`prompt_lookup_num_tokens` without a draft model) is refused, as transformers refuses it: its q
is one-hot, so ν = w·p + (1 − w)·1[x̂] would keep almost any copied token (greedy: whenever 1 − w + w·p(x̂) exceeds
w·max p, i.e. always for w ≤ 1/2). With a draft model and prompt lookup (multi-level drafting) q is the draft's and
the rule is defined.

Worked example (one position, vocab of 3, w = 0.5): p = [0.5, 0.3, 0.2], q = [0.2, 0.6, 0.2], x̂ = 1.
ν = [0.35, 0.45, 0.2]: greedy keeps x̂ = 1 (argmax ν), where `exact` would emit token 0. Sampling accepts with
probability 1 − 0.5 + 0.5 · 0.3/0.6 = 0.75 (`exact`: 0.5); a rejection emits token 0 (residual [1, 0, 0]).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..component_config import Range
from ..errors import invalid_value
from .base import (
    RuleConfig,
    VerificationInput,
    gather_rows,
    register_rule,
    residual_distribution,
    sample_uniform,
)
from .exact import ExactRule


@dataclass
class EnsembleConfig(RuleConfig):
    """Options of `ensemble` (`acceptance_kwargs`).

    Args:
        weight (`float`, *optional*, defaults to 0.7): w, the target's share of the mixture w·p + (1 − w)·q the drafts
            are verified against, in (0, 1) as transformers' `assistant_ensemble_weight`. Lower values trust the
            draft more: more drafts accepted, an output further from the target's. The default is the grid point
            (w ∈ {0.3, 0.5, 0.7}) that accepts the most while the target finds its text at most 0.025 nats per token
            less likely than `exact`'s, as for the other rules (reference pair, greedy, GSM8K 0–4, AVX-512 BF16 CPU:
            w 0.7 +0.0065 at τ 4.96 against `exact`'s 4.94; w 0.5 +0.027, τ 5.28; w 0.3 +0.064, τ 5.60;
            `benchmarks/results/fidelity/frontier/frontier-greedy-ensemble-avx512bf16.md`). No w was measurably
            faster than `exact` there.
    """

    component_name = "ensemble"

    weight: float = field(
        default=0.7,
        metadata={
            "help": "w: drafts are verified against w·p + (1 − w)·q (transformers' assistant_ensemble_weight)",
            "range": Range(0, 1, low_inclusive=False, high_inclusive=False),
        },
    )


def mixture(p: torch.Tensor, q: torch.Tensor, weight: float) -> torch.Tensor:
    """ν = w·p + (1 − w)·q over the last axis, in float32 (transformers' order of operations, so that greedy argmax
    ties break as its do).

    Args:
        p (`torch.FloatTensor` of shape `(..., vocab)`): the target's distributions.
        q (`torch.FloatTensor` of shape `(..., vocab)`): the draft's.
        weight (`float`): w.

    Returns:
        `torch.FloatTensor` of shape `(..., vocab)`.
    """
    return weight * p.float() + (1.0 - weight) * q.float()


def emitted_distribution(p: torch.Tensor, q: torch.Tensor, weight: float) -> torch.Tensor:
    """π, the distribution of the token `ensemble` emits at one position when sampling (the module docstring):
    π(x) = q(x)·a(x) + (1 − Σ q·a)·r(x), a(x) = min(1, 1 − w + w·p(x)/q(x))·[p(x) > 0], r = norm((p − q)₊) (p where
    that has no mass).

    Args:
        p (`torch.FloatTensor` of shape `(..., vocab)`): the target's distribution.
        q (`torch.FloatTensor` of shape `(..., vocab)`): the draft's (what x̂ was drawn from).
        weight (`float`): w.

    Returns:
        `torch.FloatTensor` of shape `(..., vocab)`.
    """
    p, q = p.float(), q.float()
    ratio = torch.where(q > 0, p / q.clamp_min(torch.finfo(q.dtype).tiny), torch.ones_like(q))
    accept = (1.0 - weight + weight * ratio).clamp_max(1.0) * (p > 0)
    kept = q * accept
    return kept + (1.0 - kept.sum(-1, keepdim=True)) * residual_distribution(p, q)


@register_rule
class EnsembleRule(ExactRule):
    """Verification against ν = w·p + (1 − w)·q: greedy keeps x̂ = argmax ν and emits argmax ν at a rejection;
    sampling accepts with min(1, 1 − w + w·p/q) and draws rejections from `exact`'s residual."""

    name = "ensemble"
    config_class = EnsembleConfig
    paper = "https://arxiv.org/abs/2604.07622"
    lossless = False
    requires_draft_probs = True  # greedy too: the mixture needs q
    compiles_verification = True

    def check_assistant_model(self, assistant_model: torch.nn.Module | None) -> None:
        if assistant_model is None:
            raise invalid_value(
                "acceptance",
                self.name,
                "a rule that verifies drafts made without a draft model (prompt_lookup_num_tokens): 'ensemble' mixes "
                "the draft model's distribution q into the target's, and prompt lookup's q is one-hot (the mixture "
                "would keep almost any copied token; transformers refuses assistant_ensemble_weight with prompt "
                "lookup too)",
                "pass assistant_model=<draft model> (with prompt_lookup_num_tokens it drafts several tokens per "
                "forward), or use acceptance='exact' (lossless) for prompt lookup alone",
            )
        super().check_assistant_model(assistant_model)

    def _greedy_choice(self, inputs: VerificationInput) -> torch.LongTensor:
        """argmax ν at the γ draft positions, `(batch, γ)`, over the tokens the target's processors allow (a draft
        model whose q was not processed as p was could otherwise outvote a −inf logit); computed once per round."""

        def choice():
            nu = mixture(inputs.target_probs[:, :-1], inputs.checked_draft_probs(), self.config.weight)
            logits = inputs.target_logits[:, :-1]
            return nu.masked_fill(logits <= torch.finfo(logits.dtype).min, -1.0).argmax(-1)

        return inputs.once("ensemble_greedy_choice", choice)

    def accept(self, inputs: VerificationInput) -> torch.BoolTensor:
        weight = self.config.weight
        if not inputs.do_sample:
            return inputs.draft_token_ids == self._greedy_choice(inputs)
        p = inputs.target_prob_of_drafts()
        q = inputs.draft_prob_of_drafts()
        # u < 1 − w + w·p/q, written without the division (q(x̂) > 0 for a token drawn from q).
        return sample_uniform(p.shape, p.device, None) * q < (1.0 - weight) * q + weight * p

    def rejection_token(self, inputs: VerificationInput, position: torch.LongTensor) -> torch.LongTensor:
        if not inputs.do_sample:
            return gather_rows(self._greedy_choice(inputs), position)
        return self.residual_token(inputs, position)


__all__ = ["EnsembleConfig", "EnsembleRule", "emitted_distribution", "mixture"]
