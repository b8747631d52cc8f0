"""`exact`: standard, lossless speculative decoding.

Greedy (`do_sample=False`): keep x̂_i while x̂_i = argmax p_i; at the first mismatch emit argmax p_i. The output is
token-identical to plain greedy decoding of the target.

Sampling: Leviathan et al., "Fast Inference from Transformers via Speculative Decoding", ICML 2023
(https://arxiv.org/abs/2211.17192), Algorithm 1; also Chen et al. 2023 (https://arxiv.org/abs/2302.01318).
With u_i ~ U[0, 1), accept x̂_i if

    u_i < min(1, p_i(x̂_i) / q_i(x̂_i)),

at the first rejection emit y ~ norm(max(p_i − q_i, 0)), and after γ acceptances emit the bonus y ~ p_{γ+1}.
Every emitted token is then distributed exactly as p. `q` is whatever distribution the draft token was drawn from,
so the rule stays lossless for drafters that redistribute their mass (see `rdk`).

Worked example (one position, vocab of 3): p = [0.5, 0.3, 0.2], q = [0.2, 0.6, 0.2], x̂ = 1.
p(x̂)/q(x̂) = 0.3/0.6 = 0.5, so u = 0.4 accepts and u = 0.7 rejects; the residual is
norm(max(p − q, 0)) = norm([0.3, 0, 0]) = [1, 0, 0], so the rejection emits token 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import (
    AcceptanceRule,
    RuleConfig,
    VerificationInput,
    register_rule,
)


@dataclass
class ExactConfig(RuleConfig):
    """`exact` has no options."""

    component_name = "exact"


@register_rule
class ExactRule(AcceptanceRule):
    name = "exact"
    config_class = ExactConfig
    paper = "https://arxiv.org/abs/2211.17192"
    lossless = True
    compiles_verification = True

    def accept(self, inputs: VerificationInput) -> torch.BoolTensor:
        return self.standard_accept(inputs)

    def rejection_token(self, inputs: VerificationInput, position: torch.LongTensor) -> torch.LongTensor:
        if not inputs.do_sample:
            return self.target_token(inputs, position)
        return self.residual_token(inputs, position)
