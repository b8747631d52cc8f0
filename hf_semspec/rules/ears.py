"""`ears`: Efficient Adaptive Rejection Sampling — speculative sampling with an uncertainty-scaled tolerance.

Sun, Mao, Xu & Chen, "EARS: Efficient Adaptive Rejection Sampling for Accelerating Speculative Decoding in Large
Language Models", arXiv:2512.13194 (https://arxiv.org/abs/2512.13194). The abstract states the idea: the acceptance
threshold is adjusted "by incorporating the target model's own predictive uncertainty, measured as
1 − max(P_target)", through "a tolerance term proportional to this uncertainty", so that drafts are accepted more
easily where the target is unsure and as strictly as before where it is confident. (Only the abstract and the start
of the introduction were reachable when this module was written; the exact rule below follows the first author's
own patch to vLLM-Ascend — `vllm_ascend/sample/rejection_sampler.py` in github.com/sunchendd/vllm-ascend, proposed
as vllm-project/vllm-ascend PRs #5587 and #7845, both closed unmerged — where the coefficient is the environment
variable `VLLM_EARS_TOLERANCE`, called β here.)

Sampling (`do_sample=True`). With the abstract's P_target = p_i (the target's distribution at position i, after
the logits processors, temperature/top-k/top-p included, as in the authors' patch), P_draft = q_i (what x̂_i was
drawn from) and U_i ~ U[0, 1), EARS accepts x̂_i if

    U'_i < P_target(x̂_i) / P_draft(x̂_i),   where   U'_i = max(U_i − β · (1 − max_v P_target(v)), 0),

i.e. U_i < p_i(x̂_i)/q_i(x̂_i) + β·(1 − max p_i): the uniform threshold is lowered by the tolerance
t_i = β·(1 − max p_i). At the first rejection the token is drawn from the unchanged Leviathan residual
norm(max(p_i − q_i, 0)); after γ acceptances the bonus token is drawn from p_{γ+1}. β = 0 is exactly `exact`
(same verdicts and tokens for the same random numbers).

One deliberate detail: the shifted threshold is clamped at 0 and compared strictly, so a draft the target gives
probability 0 (masked by top-k/top-p, `bad_words_ids`, `min_new_tokens`' EOS ban, …) is never accepted, however
large the tolerance (the bare inequality above would accept it with probability t). The authors' code clamps the
shifted threshold too: at float eps in PR #7845 (same effect as ours), at 0.01 in their fork (which in addition
always rejects drafts with p/q < 0.01, even where `exact` would accept them; we do not copy that).

What this costs (the rule is *not* lossless). For one position, let t = β·(1 − max p) and x̂ ~ q. The draft x is
accepted with probability a(x) = min(1, p(x)/q(x) + t) when p(x) > 0 (0 otherwise), instead of min(1, p(x)/q(x)).
The extra accepted mass sits on the tokens the draft over-proposes (q > p):

    E(x) = q(x)·a(x) − min(p(x), q(x)) = min((q(x) − p(x))₊, t·q(x)) · [p(x) > 0],

and the rejection mass, which the residual r = norm((p − q)₊) spreads over the under-proposed tokens, shrinks by
ΣE. The emitted token is therefore distributed as

    π(x) = p(x) + E(x) − (Σ_y E(y)) · r(x).

So EARS moves mass ΣE from tokens the draft under-proposes to tokens it over-proposes, and

    TV(π, p) = Σ_x E(x) ≤ min(β·(1 − max p), TV(p, q)),     P(accept) = Σ_x min(p, q) + TV(π, p):

every point of acceptance rate gained over `exact` is paid by exactly one point of total-variation distance
between the emitted distribution and the target's. `emitted_distribution()` computes π; tests check it against
simulation. The bonus token is still exactly p, and the bound holds per position given the accepted prefix.

Greedy (`do_sample=False`) — our extension; the paper and the authors' patch define EARS for sampling only (their
greedy path is plain argmax matching). We apply the analogous tolerance to the target's probability of the draft:
accept x̂_i if

    x̂_i = argmax p_i   or   p_i(x̂_i) > max(max p_i − β · (1 − max p_i), 0),

and at the first rejection emit argmax p_i. Exact argmax matches are always accepted; β = 0 is exactly `exact` (the
strict `>` keeps a tied but not first argmax rejected at β = 0, as `exact` does); a confident target (max p → 1)
leaves no tolerance, so mismatches are rejected. The clamp at 0 matters only for a very flat target,
max p < β/(1 + β), where the bar would go negative and every draft with p(x̂) > 0 is kept — but never one with
p(x̂) = 0. Here p is the softmax of the processed logits with no temperature (transformers applies
temperature/top-k/top-p only when sampling). The output is no longer the target's greedy decode: a token within the
tolerance of the argmax may be kept. For greedy decoding without it, use `acceptance="exact"` (what the authors'
patch does).

Worked example (sampling, one position, vocab of 3, β = 0.1): p = [0.5, 0.3, 0.2], q = [0.2, 0.6, 0.2], x̂ = 1.
p(x̂)/q(x̂) = 0.3/0.6 = 0.5 and the tolerance is t = 0.1·(1 − 0.5) = 0.05, so EARS accepts iff u < 0.55.
u = 0.52 is rejected by `exact` (0.52 ≥ 0.5) but accepted by `ears` (U' = 0.47 < 0.5); u = 0.58 is rejected by
both, and the rejection emits token 0 (residual norm(max(p − q, 0)) = [1, 0, 0]). The cost:
E = [0, min(0.3, 0.05·0.6), 0] = [0, 0.03, 0], so π = [0.47, 0.33, 0.2] instead of p, TV(π, p) = 0.03, and the
acceptance probability is 0.73 instead of 0.70.
Greedy, β = 0.1: p = [0.40, 0.35, 0.25] gives max p − β(1 − max p) = 0.40 − 0.06 = 0.34, so x̂ = 1 (0.35) is kept
and x̂ = 2 (0.25) is rejected in favour of token 0; with a confident p = [0.98, 0.015, 0.005] the bar is 0.978 and
x̂ = 1 is rejected.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..component_config import Range
from .base import RuleConfig, VerificationInput, register_rule, sample_uniform
from .exact import ExactRule


@dataclass
class EARSConfig(RuleConfig):
    """Options of `ears` (`acceptance_kwargs`).

    Args:
        beta (`float`, *optional*, defaults to 0.5): β, the tolerance coefficient: the acceptance threshold is
            relaxed by β·(1 − max p) at each position. 0 gives `exact`; larger values accept more drafts and move
            the output further from the target's distribution (total variation at most β·(1 − max p) per token).
            The default, 0.5, the largest β of the measured grid, accepts the most of it (reference pair, greedy,
            GSM8K 0–9: τ 5.23 against `exact`'s 5.00 and 5.09 at β = 0.1, for a target NLL increase of +0.0055
            nats per token; `benchmarks/results/fidelity/frontier/frontier-greedy-gsm8k.md`); no β was measurably
            faster than `exact` there. The authors' implementation documents β in [0, 1], was tested at 0.3 and ships 0
            (off).
    """

    component_name = "ears"

    beta: float = field(
        default=0.5,
        metadata={
            "help": "tolerance coefficient β: acceptance is relaxed by β·(1 − max p) (0 = exact)",
            "range": Range(0, 1),
        },
    )


def uncertainty_tolerance(target_probs: torch.Tensor, beta: float) -> torch.Tensor:
    """t = β·(1 − max_v p(v)) over the last axis, clamped at 0 against rounding (max p may exceed 1 by an ulp).

    Args:
        target_probs (`torch.FloatTensor` of shape `(..., vocab)`): the target's distributions p.
        beta (`float`): the tolerance coefficient β.

    Returns:
        `torch.FloatTensor` of shape `(...)`.
    """
    return beta * (1 - target_probs.amax(-1)).clamp_min(0)


def emitted_distribution(p: torch.Tensor, q: torch.Tensor, beta: float) -> torch.Tensor:
    """π, the distribution of the token `ears` emits at a position in sampling mode (see the module docstring):
    π = p + E − (ΣE)·norm((p − q)₊), with E = min((q − p)₊, t·q)·[p > 0] and t = β·(1 − max p).

    Args:
        p (`torch.FloatTensor` of shape `(..., vocab)`): the target's distribution.
        q (`torch.FloatTensor` of shape `(..., vocab)`): the draft's distribution (what x̂ was drawn from).
        beta (`float`): the tolerance coefficient β.

    Returns:
        `torch.FloatTensor` of shape `(..., vocab)`; equals `p` when `beta == 0`.
    """
    p, q = p.float(), q.float()
    t = uncertainty_tolerance(p, beta)[..., None]
    extra = torch.minimum((q - p).clamp_min(0), t * q) * (p > 0)
    residual = (p - q).clamp_min(0)
    mass = residual.sum(-1, keepdim=True)
    r = residual / mass.clamp_min(torch.finfo(residual.dtype).tiny)
    return p + extra - extra.sum(-1, keepdim=True) * r


@register_rule
class EARSRule(ExactRule):
    """Rejection sampling whose uniform threshold is lowered by β·(1 − max p) (the target's uncertainty); greedy
    decoding keeps drafts with p(x̂) > max(max p − β·(1 − max p), 0). Rejections use `exact`'s tokens (Leviathan
    residual when sampling, argmax when greedy)."""

    name = "ears"
    config_class = EARSConfig
    paper = "https://arxiv.org/abs/2512.13194"
    lossless = False
    compiles_verification = True

    def accept(self, inputs: VerificationInput) -> torch.BoolTensor:
        beta = self.config.beta
        probs = inputs.target_probs[:, :-1]  # (batch, γ, vocab): the rows that verify drafts
        tolerance = uncertainty_tolerance(probs, beta)  # (batch, γ)
        p = inputs.target_prob_of_drafts()
        if not inputs.do_sample:
            is_argmax = inputs.draft_token_ids == inputs.target_greedy_ids[:, :-1]
            # The bar is clamped at 0 as in sampling: a draft with p(x̂) = 0 is never kept.
            return is_argmax | (p > (probs.amax(-1) - tolerance).clamp_min(0))
        q = inputs.draft_prob_of_drafts()
        u = sample_uniform(p.shape, p.device, None)
        # u − t < p/q written without the division; the clamp at 0 with `<` never accepts a draft with p(x̂) = 0.
        return (u - tolerance).clamp_min(0) * q < p
