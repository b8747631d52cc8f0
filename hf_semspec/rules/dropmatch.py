"""`dropmatch`: semantic acceptance by Monte Carlo dropout on the target's LM head.

Lee et al., "Training-free Dropout Sampling for Semantic Token Acceptance in Speculative Decoding", 2026
(https://arxiv.org/abs/2603.03333), DropMatch, Algorithm 1. The target's distribution at a verified position is
widened into K "decoding paths" by dropout applied to the input of the LM head only (no training, no calibration);
a draft token is accepted when it is consistent with these paths rather than only when it equals the target's token.

The formulation below follows the issue's reading of the paper's Algorithm 1 (K = 5, p = 0.3, JS by default).

Notation (one verified position i; the rule works on all γ positions at once). h ∈ ℝᴴ is the input of the target's
LM head (after the model's final norm, exactly what the head multiplies), W ∈ ℝⱽˣᴴ (and bias b) the head, ŷ the draft
token, q the draft's distribution, p the dropout rate, K the number of heads:

    m⁽ᵏ⁾ ~ Bernoulli(1 − p)ᴴ,      h⁽ᵏ⁾ = h ⊙ m⁽ᵏ⁾ / (1 − p)              (inverted dropout, k = 1..K)
    l⁽ᵏ⁾ = W h⁽ᵏ⁾ + b,             p⁽ᵏ⁾ = softmax(l⁽ᵏ⁾),     y⁽ᵏ⁾ = argmax l⁽ᵏ⁾
    p̄ = softmax((1/K) Σₖ l⁽ᵏ⁾)                                             (centroid of the K paths)

    naive:  accept ŷ  iff  ŷ ∈ {y⁽¹⁾, …, y⁽ᴷ⁾}
    js:     accept ŷ  iff  JS(q ‖ p̄) ≤ maxₖ JS(p⁽ᵏ⁾ ‖ p̄)   or   ŷ is the majority head token

with JS(a ‖ b) = ½ KL(a ‖ M) + ½ KL(b ‖ M), M = ½(a + b), natural log (so 0 ≤ JS ≤ ln 2). The threshold is
data-dependent: where dropout barely moves the target (a confident position) the paths agree, maxₖ JS is ≈ 0 and
only the target's own token passes; where the target is uncertain the paths spread and so does the tolerance.
"Majority" is a plurality with ties counted as agreement: ŷ passes when no head token has more votes than ŷ.
A rejected position emits the target's own token, as in standard speculative decoding.

Choices made here where the rule needs more than the formula (each is documented with its option):

- `accept_target_matches=True` (default): the relaxed rule never rejects what standard verification accepts; in
  greedy decoding every exact match ŷ = argmax p is accepted, whatever the heads say. The criterion above looks only
  at the dropout heads, not at the undropped target (the issue's description of Algorithm 1 does not count the target
  as a head), so on its own it can reject the target's own token: e.g. heads that all keep the same coordinates and
  vote 0 for a target whose argmax is 1, with a confident q on ŷ = 1 (threshold 0, JS(q ‖ p̄) > 0, majority 0).
  In greedy mode that rejection then emits the very same token and only throws away the rest of the round.
  `False` applies the criterion alone, as written above.
- `q` is the draft's softmax distribution after the logits processors, in greedy decoding too (the drafter keeps it
  because the rule sets `requires_draft_probs`; `naive` does not read it).
- Logits processors: the heads are computed as l̃⁽ᵏ⁾ = target_logits + W(h⁽ᵏ⁾ − h), i.e. the processed logits plus the
  dropout perturbation of the raw logits (the bias cancels). Without processors this is exactly l⁽ᵏ⁾; with them,
  additive processors and masks (top-k/top-p filtering, min_new_tokens, bad words, no-repeat n-grams: −inf stays −inf)
  carry over exactly, so a head can never pick a token the processors forbid; multiplicative ones (temperature,
  repetition penalty) are applied to the target part only, to first order (the perturbation is not divided by the
  temperature). As p → 0 the heads become the processed target logits exactly.
- Sampling (`do_sample=True`), an extension (the criterion is defined on distributions and argmax heads): the head
  tokens stay argmax l̃⁽ᵏ⁾, and with `accept_target_matches` a draft is kept when the standard test
  u < p(ŷ)/q(ŷ) (Leviathan et al. 2023) *or* the criterion accepts it; a rejection emits y ~ norm(max(p − q, 0)), the
  standard correction. So every emitted token would be distributed exactly as p if the criterion never fired, and the
  total-variation distance to p at a position is at most P(accepted by the criterion alone). With
  `accept_target_matches=False` a rejection emits y ~ p.
- Randomness: masks come from `sample_uniform((K, batch, γ, H)) >= p` (one draw per round), from a generator seeded
  with `seed` when set (created once per rule, i.e. once per `generate()` call, so rounds get fresh masks and the
  call is reproducible), else from the round's generator / torch's global RNG.

Cost. The K heads are one batched matmul of the (K·batch·γ, H) perturbations with Wᵀ in W's dtype, i.e. K·γ extra
LM-head rows per round (the bonus row needs no heads; like the target's own head pass, it streams W once), and
K·batch·γ·V float32 logits: for V = 151,936, K = 5, γ = 8 that is 24.3 MB per temporary. Measured on CPU (float32,
batch 1): about 115 MiB of extra peak memory with `js` and 35 MiB with `naive`. Rows are processed in chunks of at
most 2²⁴ logits per temporary (64 MiB), so a long γ or a large batch does not grow the peak further.

Worked example (one position, H = 3, V = 4, K = 3, p = 0.5, so kept coordinates are doubled). h = [1, 1, 1],
W = [[2.5, 0, 0], [1, 1, 1], [0, 0, 0.5], [0, 0, 0]] (no bias), so the target logits are [2.5, 3, 0.5, 0] and the
target's token is 1. Uniforms u = 0.9 (keep) / 0.1 (drop) give the masks m⁽¹⁾ = [1, 1, 0], m⁽²⁾ = [0, 1, 1],
m⁽³⁾ = [0, 0, 1]:

    l⁽¹⁾ = W [2, 2, 0] = [5, 4, 0, 0]  → y⁽¹⁾ = 0,   JS(p⁽¹⁾ ‖ p̄) = 0.1854
    l⁽²⁾ = W [0, 2, 2] = [0, 4, 1, 0]  → y⁽²⁾ = 1,   JS(p⁽²⁾ ‖ p̄) = 0.0334
    l⁽³⁾ = W [0, 0, 2] = [0, 2, 1, 0]  → y⁽³⁾ = 1,   JS(p⁽³⁾ ‖ p̄) = 0.0446
    mean = [5/3, 10/3, 2/3, 0],  p̄ = [0.1460, 0.7728, 0.0537, 0.0276],  threshold maxₖ JS = 0.1854

| ŷ | q                        | JS(q ‖ p̄) | exact  | naive            | js (default)                     |
|---|--------------------------|------------|--------|------------------|----------------------------------|
| 1 | [0.2, 0.7, 0.05, 0.05]   | 0.0047     | accept | accept           | accept (JS ≤ 0.1854; majority 1) |
| 0 | [0.6, 0.3, 0.05, 0.05]   | 0.1298     | reject | accept (y⁽¹⁾ = 0) | accept (JS ≤ 0.1854)             |
| 0 | [0.8, 0.1, 0.05, 0.05]   | 0.2732     | reject | accept (y⁽¹⁾ = 0) | reject (JS > 0.1854, majority 1) |
| 3 | [0.1, 0.1, 0.1, 0.7]     | 0.3464     | reject | reject           | reject                           |

Every rejection emits the target's token 1. The same draft token 0 passes or fails the JS criterion depending on how
far the draft's whole distribution is from the paths' centroid. With all coordinates kept (every u ≥ p) the three
heads are the target scaled by 1/(1 − p): all vote 1, the threshold is 0, and both criteria reduce to exact matching.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch.special import xlogy

from ..component_config import Range
from ..errors import invalid_value
from .base import (
    AcceptanceRule,
    RuleConfig,
    VerificationInput,
    gather_rows,
    register_rule,
    residual_distribution,
    sample_categorical,
    sample_uniform,
)

_LN2 = math.log(2.0)
# At most this many float32 logits per (K, rows, vocab) temporary (64 MiB); rows beyond it are processed in chunks.
_CHUNK_ELEMENTS = 2**24


@dataclass
class DropMatchConfig(RuleConfig):
    """Options of `dropmatch` (`acceptance_kwargs`)."""

    component_name = "dropmatch"

    num_heads: int = field(
        default=5,
        metadata={
            "help": "K: dropout heads (masked copies of the LM-head input) per verified position",
            "range": Range(low=1),
        },
    )
    dropout: float = field(
        default=0.3,
        metadata={
            "help": "p: probability of zeroing each coordinate of the LM-head input (kept ones are scaled by 1/(1-p))",
            "range": Range(0, 1, low_inclusive=False, high_inclusive=False),
        },
    )
    criterion: str = field(
        default="js",
        metadata={
            "help": "'js': accept if JS(q||centroid) <= max_k JS(p_k||centroid) or the draft is the majority head "
            "token (the paper's Algorithm 1); 'naive': accept if any head's argmax is the draft token",
            "choices": ("js", "naive"),
        },
    )
    accept_target_matches: bool = field(
        default=True,
        metadata={
            "help": "also accept every draft that standard verification accepts (the target's argmax when greedy, "
            "u < p/q when sampling); False applies the dropout criterion alone"
        },
    )
    seed: int | None = field(
        default=None,
        metadata={
            "help": "seed of the dropout masks (one generator per rule, i.e. per generate() call); None uses the "
            "decoding RNG",
            "range": Range(0, 2**63 - 1),
        },
    )


def dropout_head_logits(
    hidden: torch.Tensor,
    keep: torch.BoolTensor,
    dropout: float,
    lm_head_weight: torch.Tensor,
    target_logits: torch.Tensor,
) -> torch.FloatTensor:
    """Logits of the K dropout heads, l̃⁽ᵏ⁾ = target_logits + W (h ⊙ m⁽ᵏ⁾ / (1 − p) − h), in one matmul.

    Args:
        hidden (`torch.Tensor` of shape `(..., hidden)`): h, the input of the LM head.
        keep (`torch.BoolTensor` of shape `(K, ..., hidden)`): the masks m⁽ᵏ⁾ (`True` = kept).
        dropout (`float`): p, in (0, 1).
        lm_head_weight (`torch.Tensor` of shape `(vocab, hidden)`): W; the bias cancels and is not needed.
        target_logits (`torch.Tensor` of shape `(..., vocab)`): the (processed) target logits at h; without logits
            processors they equal `h @ W.T + b`, and the result is then exactly `h⁽ᵏ⁾ @ W.T + b`.

    Returns:
        `torch.FloatTensor` of shape `(K, ..., vocab)`, float32, on `target_logits`' device.
    """
    h = hidden.float()
    # h ⊙ m / (1 − p) − h: kept coordinates move by h·p/(1 − p), dropped ones by −h.
    perturbation = torch.where(keep, h * (dropout / (1.0 - dropout)), -h)
    weight = lm_head_weight
    delta = torch.matmul(perturbation.to(device=weight.device, dtype=weight.dtype), weight.T)  # all K heads at once
    delta = delta.to(device=target_logits.device, dtype=torch.float32)
    return delta.add_(target_logits.float())  # `delta` is a fresh tensor: adding in place copies nothing


def js_divergence(a: torch.Tensor, b: torch.Tensor) -> torch.FloatTensor:
    """Jensen–Shannon divergence JS(a ‖ b) over the last axis, natural log, of probability vectors (broadcasting).

    JS = ½ Σ a log a + ½ Σ b log b − Σ m log m with m = ½(a + b), combined element by element before the sum (so the
    sum does not subtract two entropies); 0 log 0 = 0, so distributions with different supports are fine. The result
    is clamped to [0, ln 2] against rounding.
    """
    m = torch.add(a, b).mul_(0.5)
    terms = xlogy(m, m).mul_(-2.0)
    terms.add_(xlogy(a, a)).add_(xlogy(b, b))
    return terms.sum(-1).mul_(0.5).clamp_(0.0, _LN2)


@register_rule
class DropMatchRule(AcceptanceRule):
    """DropMatch: accept a draft token that agrees with K dropout-perturbed copies of the target's LM head."""

    name = "dropmatch"
    config_class = DropMatchConfig
    paper = "https://arxiv.org/abs/2603.03333"
    lossless = False
    supports_greedy = True
    supports_sampling = True
    requires_draft_probs = True
    requires_target_hidden_states = True
    default_num_draft_tokens = 5

    def __init__(self, config: DropMatchConfig | None = None):
        super().__init__(config)
        self._mask_generators: dict[torch.device, torch.Generator] = {}
        # Only the JS criterion compares q with the heads; `naive` spares the drafter a full softmax per greedy step.
        self.requires_draft_probs = self.config.criterion == "js"

    def check_target_model(self, model: torch.nn.Module) -> None:
        """The K heads are `target_logits + W·(h⁽ᵏ⁾ − h)`, which is `W·h⁽ᵏ⁾ + b` only when the logits are the head's
        output as it is. A model that scales or caps them after the head (Granite's `logits_scaling`, Cohere's
        `logit_scale`, Gemma 2's `final_logit_softcapping`) would get its perturbation at the wrong scale: refused."""
        text_config = model.config.get_text_config()
        # Each option's value that leaves the logits as the head made them (None: the model has no such option).
        identity = {"logits_scaling": 1.0, "logit_scale": 1.0, "final_logit_softcapping": 0.0}
        for option, neutral in identity.items():
            value = getattr(text_config, option, None)
            if value is not None and value != neutral:
                raise invalid_value(
                    f"model.config.{option}",
                    value,
                    f"None or {neutral} for acceptance='dropmatch' (its dropout heads perturb the LM head's raw "
                    "output, which this model transforms before its logits)",
                    "use acceptance='fly' or 'ears' with this model",
                )

    def _mask_generator(self, inputs: VerificationInput, device: torch.device) -> torch.Generator | None:
        if self.config.seed is None:
            return inputs.generator
        if device not in self._mask_generators:
            self._mask_generators[device] = torch.Generator(device=device).manual_seed(self.config.seed)
        return self._mask_generators[device]

    def _check_inputs(self, inputs: VerificationInput) -> None:
        if inputs.target_hidden_states is None or inputs.lm_head_weight is None:
            raise invalid_value(
                "target_hidden_states / lm_head_weight",
                None,
                "the target's LM-head input at the γ + 1 verified positions and the head's weight, for "
                "acceptance='dropmatch' (it runs the head again under dropout)",
                "build the VerificationInput with both (the speculative loop passes them because the rule sets "
                "`requires_target_hidden_states`)",
            )
        if self.config.criterion == "js":
            inputs.checked_draft_probs("acceptance='dropmatch' with criterion='js' compares it with the heads'",
                                       "pass draft_probs, or use acceptance_kwargs={'criterion': 'naive'}")

    def head_logits(self, inputs: VerificationInput, keep: torch.BoolTensor) -> torch.FloatTensor:
        """The K heads at the γ draft positions for masks `keep` of shape `(K, batch, γ, hidden)`:
        `(K, batch, γ, vocab)` float32 (not chunked; for inspection and tests)."""
        gamma = inputs.num_draft_tokens
        return dropout_head_logits(
            inputs.target_hidden_states[:, :gamma],
            keep,
            self.config.dropout,
            inputs.lm_head_weight,
            inputs.target_logits[:, :gamma],
        )

    def draw_masks(self, inputs: VerificationInput) -> torch.BoolTensor:
        """m⁽ᵏ⁾ for every draft position, shape `(K, batch, γ, hidden)`: `sample_uniform(...) >= p`."""
        hidden = inputs.target_hidden_states
        shape = (self.config.num_heads, hidden.shape[0], inputs.num_draft_tokens, hidden.shape[-1])
        return sample_uniform(shape, hidden.device, self._mask_generator(inputs, hidden.device)) >= self.config.dropout

    def accept(self, inputs: VerificationInput) -> torch.BoolTensor:
        self._check_inputs(inputs)
        config = self.config
        batch, gamma = inputs.draft_token_ids.shape
        keep = self.draw_masks(inputs)
        device = inputs.target_logits.device

        # Flatten (batch, γ) into rows and process them in chunks bounded by _CHUNK_ELEMENTS.
        rows = batch * gamma
        vocab = inputs.target_logits.shape[-1]
        hidden = inputs.target_hidden_states[:, :gamma].reshape(rows, -1)
        keep = keep.reshape(config.num_heads, rows, -1)
        target_logits = inputs.target_logits[:, :gamma].reshape(rows, vocab)
        drafts = inputs.draft_token_ids.reshape(rows).to(device)
        draft_probs = None if config.criterion == "naive" else inputs.draft_probs.reshape(rows, -1)
        chunk = max(1, _CHUNK_ELEMENTS // (config.num_heads * vocab))
        verdicts = []
        for start in range(0, rows, chunk):
            part = slice(start, min(rows, start + chunk))
            logits = dropout_head_logits(
                hidden[part], keep[:, part], config.dropout, inputs.lm_head_weight, target_logits[part]
            )
            q = None if draft_probs is None else draft_probs[part]
            verdicts.append(self._criterion(logits, drafts[part], q))
        accepted = torch.cat(verdicts).reshape(batch, gamma)

        if config.accept_target_matches:
            accepted = accepted | self._standard_accept(inputs)
        return accepted

    def _criterion(
        self, logits: torch.FloatTensor, drafts: torch.LongTensor, q: torch.Tensor | None
    ) -> torch.BoolTensor:
        """The paper's test on one chunk: `logits` (K, rows, V) of the heads, `drafts` (rows,), q (rows, V)."""
        head_tokens = logits.argmax(-1)  # y⁽ᵏ⁾, (K, rows)
        votes = (head_tokens == drafts).sum(0)  # heads voting for ŷ
        if self.config.criterion == "naive":
            return votes > 0
        # Plurality: the most votes any head token gets (each head's token is counted among all K heads).
        most_votes = (head_tokens[:, None] == head_tokens[None]).sum(1).amax(0)
        centroid = logits.mean(0).softmax(-1)  # p̄, (rows, V)
        heads = logits.sub_(logits.logsumexp(-1, keepdim=True)).exp_()  # p⁽ᵏ⁾, in place: the logits are ours
        threshold = js_divergence(heads, centroid).amax(0)
        del heads, logits
        js_draft = js_divergence(q.float(), centroid)
        return (js_draft <= threshold) | (votes == most_votes)

    @staticmethod
    def _standard_accept(inputs: VerificationInput) -> torch.BoolTensor:
        """What `exact` accepts: ŷ = argmax p when greedy; u·q(ŷ) < p(ŷ) when sampling."""
        if not inputs.do_sample:
            return inputs.draft_token_ids == inputs.target_greedy_ids[:, :-1]
        p = inputs.target_prob_of_drafts()
        q = inputs.draft_prob_of_drafts()
        u = sample_uniform(p.shape, p.device, inputs.generator)
        return u * q < p

    def rejection_token(self, inputs: VerificationInput, position: torch.LongTensor) -> torch.LongTensor:
        if inputs.do_sample and self.config.accept_target_matches:
            p = gather_rows(inputs.target_probs, position)
            q = gather_rows(inputs.draft_probs, position).float()
            return sample_categorical(residual_distribution(p, q), inputs.generator)
        return self.target_token(inputs, position)
