"""`dropmatch`: semantic acceptance by Monte Carlo dropout on the target's LM head.

Lee et al., "Training-free Dropout Sampling for Semantic Token Acceptance in Speculative Decoding", 2026
(https://arxiv.org/abs/2603.03333), DropMatch, Algorithm 1. The target's distribution at a verified position is
widened into K "decoding paths" by dropout applied to the input of the LM head only (no training, no calibration);
in the paper's words the paths form "an empirical token distribution against which draft tokens are evaluated for
consistency": a draft token is accepted when the paths choose it, not only when it equals the target's token.

Notation (one verified position i; the rule works on all γ positions at once). h ∈ ℝᴴ is the input of the target's
LM head (after the model's final norm, exactly what the head multiplies), W ∈ ℝⱽˣᴴ (and bias b) the head, ŷ the draft
token, q the draft's distribution, p the dropout rate, K the number of heads (the paper's K = 5, p = 0.3):

    m⁽ᵏ⁾ ~ Bernoulli(1 − p)ᴴ,      h⁽ᵏ⁾ = h ⊙ m⁽ᵏ⁾ / (1 − p)              (inverted dropout, k = 1..K)
    l⁽ᵏ⁾ = W h⁽ᵏ⁾ + b,             p⁽ᵏ⁾ = softmax(l⁽ᵏ⁾),     y⁽ᵏ⁾ = argmax l⁽ᵏ⁾
    c(v) = #{k : y⁽ᵏ⁾ = v}                                                  (the heads' empirical token counts)

    vote (default):  accept ŷ  iff  c(ŷ) ≥ min_votes                       (min_votes = 1: ŷ ∈ {y⁽¹⁾, …, y⁽ᴷ⁾})
    js (option):     accept ŷ  iff  JS(q ‖ p̄) ≤ maxₖ JS(p⁽ᵏ⁾ ‖ p̄)   or   c(ŷ) = maxᵥ c(v)

with p̄ = softmax((1/K) Σₖ l⁽ᵏ⁾) the centroid of the paths and JS(a ‖ b) = ½ KL(a ‖ M) + ½ KL(b ‖ M), M = ½(a + b),
natural log. `vote` tests the draft *token* against the heads' token distribution. `js` compares the draft's whole
distribution q with the paths' and never looks at ŷ unless it is the plurality head token: it can accept a token that
no head chose (in a toy run it kept 96% of the mismatches, about half with no head vote; along `exact`'s GSM8K text
below, 47%). A rejected position emits the target's own token, as in standard speculative decoding.

Which criterion, measured (reference pair: Qwen2.5-Coder 1.5B fp32 target / 0.5B bf16 draft, CPU, GSM8K problems
0-9 of the test set, 256 new tokens, chat template, greedy, γ = 5, methods interleaved per problem in one run,
`benchmarks/results/dropmatch/dropmatch-criteria-gsm8k-10.md`; `exact`'s text is plain greedy decoding's):

| criterion | τ | tok/s | speed-up vs exact (geomean / median) | correct (flips) | mismatches kept | a digit changed |
| --- | --- | --- | --- | --- | --- | --- |
| `exact` | 4.86 | 1.42 | 1 | 2 of 10 | — | — |
| vote, min_votes = 1 | 5.50 | 1.50 | 1.04× / 1.13× | 2 (+1 / −1) | 0.536 (104 of 194) | 1 |
| vote, min_votes = 2 (default) | 5.20 | 1.47 | 1.02× / 1.06× | 3 (+1 / −0) | 0.289 (56) | 0 |
| vote, min_votes = 3 | | | | | 0.124 (24) | 0 |
| js | | | | | 0.469 (91) | 0 |

The default needs two of the five paths: it keeps half as many of the draft's mismatches as any-vote (0.29 against
0.54 along `exact`'s text, `benchmarks/dropmatch_criteria.py`,
`benchmarks/results/dropmatch/dropmatch-criteria-along-exact.md`),
none of them changing a number, and lost no answer `exact` got; min_votes = 1 is faster (τ 5.50) but changed a
digit once in 2,516 tokens. Read the accuracy column with care: at 256 tokens 9 of `exact`'s 10 answers were cut
before their final number (a fidelity run needs a longer budget, see `benchmarks/fidelity.py`), and the machine was
loaded (load average 5-12: tok/s are low, ratios are interleaved per problem). `js` (the previous default), measured
live on the 5 shortest GSM8K problems (`benchmarks/results/gsm8k.md`, n = 5, 256 tokens): 2 of 5 correct against
plain's and `exact`'s 4, at 1.48× plain against `exact`'s 1.69× — less accurate and slower than the rule it relaxes.
Neither criterion reaches 1.15× `exact` here: `exact` already keeps 78% of the drafts on GSM8K, and the heads cost
about half a verify forward per round (below).

Choices made here where the rule needs more than the formula (each is documented with its option):

- `accept_target_matches=True` (default): the relaxed rule never rejects what standard verification accepts; in
  greedy decoding every exact match ŷ = argmax p is accepted, whatever the heads say. The heads are dropout paths of
  the target, not the undropped target itself, so on their own they can vote against the target's own token; in
  greedy mode rejecting it would emit the very same token and only throw away the rest of the round. `False` applies
  the criterion alone.
- `q` (for `js` only) is the draft's softmax distribution after the logits processors, in greedy decoding too (the
  drafter keeps it because the rule then sets `requires_draft_probs`; `vote` does not read it).
- Logits processors: the heads are computed as l̃⁽ᵏ⁾ = target_logits + W(h⁽ᵏ⁾ − h), i.e. the processed logits plus the
  dropout perturbation of the raw logits (the bias cancels). Without processors this is exactly l⁽ᵏ⁾; with them,
  additive processors and masks (top-k/top-p filtering, min_new_tokens, bad words, no-repeat n-grams: −inf stays −inf)
  carry over exactly, so a head can never pick a token the processors forbid; multiplicative ones (temperature,
  repetition penalty) are applied to the target part only, to first order (the perturbation is not divided by the
  temperature). As p → 0 the heads become the processed target logits exactly.
- Sampling (`do_sample=True`), an extension (the paper's heads are argmax paths): the head tokens stay argmax l̃⁽ᵏ⁾,
  and with `accept_target_matches` a draft is kept when the standard test u < p(ŷ)/q(ŷ) (Leviathan et al. 2023)
  *or* the criterion accepts it; a rejection emits y ~ norm(max(p − q, 0)), the standard correction. So every emitted
  token would be distributed exactly as p if the criterion never fired, and the total-variation distance to p at a
  position is at most P(accepted by the criterion alone). With `accept_target_matches=False` a rejection emits y ~ p.
- Randomness: each row of a batch draws its masks from its own `torch.Generator`, `sample_uniform((γ, K, H)) >= p`
  once per round, every row's seeded with `seed` (default 0) when the rule is built, i.e. once per `generate()`
  call. Rounds get fresh masks; a row's masks depend on nothing but its own rounds, so a row of a batch gets the
  text it gets alone (the same call with that prompt only), on dynamic and static caches alike, whatever the other
  prompts and whatever torch's global RNG holds, and that RNG is never moved. (Every row starts from the same seed
  rather than from seed + its index: with the index, row r would equal a call of its prompt alone only with another
  seed.) A row draws for the drafts it may use (`VerificationInput.draft_limits`: near `max_length`, fewer than
  the batch's γ, as many as alone), so its stream of draws is the one it has alone. `seed=None` draws one
  `(K, batch, γ, H)` block per round from torch's global RNG instead, as sampling does (then a row's text depends on
  the batch).

Cost. The K heads are a matrix product of the (K·rows, H) perturbations with Wᵀ in W's dtype plus K·rows·V float32
logits (for V = 151,936, K = 5, γ = 5: 15 MB per temporary); rows are processed in chunks of at most 2²⁴ logits per
temporary (64 MiB). Only rows that can change a verdict need heads: with `accept_target_matches`, a draft the
standard test keeps is kept whatever the heads say, so on CPU (where selecting rows costs no device sync) the heads
run only on the drafts `exact` rejects — measured on the reference head's shape with one
mismatch in a round of γ = 5 (a one-off timing on a loaded 2-core machine, in git history:
`git show e979976:benchmarks/results/dropmatch-cost.md`): 665 ms per round for every row, 418 ms for the rejected one (0.63×; a matrix product of K = 5 rows
is not 5 times cheaper than one of 25), against about 720 ms for the target's verify forward of 6 tokens. On an accelerator every row is computed (selecting them would be
a host sync); the verdicts are identical either way, because every row's masks are drawn before the selection. No
cheaper exact form over the vocabulary exists: whether ŷ is a head's argmax depends on every logit of that head.

Worked example (one position, H = 3, V = 4, K = 3, p = 0.5, so kept coordinates are doubled). h = [1, 1, 1],
W = [[2.5, 0, 0], [1, 1, 1], [0, 0, 0.5], [0, 0, 0]] (no bias), so the target logits are [2.5, 3, 0.5, 0] and the
target's token is 1. Uniforms u = 0.9 (keep) / 0.1 (drop) give the masks m⁽¹⁾ = [1, 1, 0], m⁽²⁾ = [0, 1, 1],
m⁽³⁾ = [0, 0, 1]:

    l⁽¹⁾ = W [2, 2, 0] = [5, 4, 0, 0]  → y⁽¹⁾ = 0,   JS(p⁽¹⁾ ‖ p̄) = 0.1854
    l⁽²⁾ = W [0, 2, 2] = [0, 4, 1, 0]  → y⁽²⁾ = 1,   JS(p⁽²⁾ ‖ p̄) = 0.0334
    l⁽³⁾ = W [0, 0, 2] = [0, 2, 1, 0]  → y⁽³⁾ = 1,   JS(p⁽³⁾ ‖ p̄) = 0.0446
    c = [1, 2, 0, 0],  p̄ = [0.1460, 0.7728, 0.0537, 0.0276],  threshold maxₖ JS = 0.1854

| ŷ | q                        | JS(q ‖ p̄) | exact  | vote (min_votes 1 / 2) | js                               |
|---|--------------------------|------------|--------|-------------------------|----------------------------------|
| 1 | [0.2, 0.7, 0.05, 0.05]   | 0.0047     | accept | accept / accept         | accept (JS ≤ 0.1854; plurality)  |
| 0 | [0.6, 0.3, 0.05, 0.05]   | 0.1298     | reject | accept / reject         | accept (JS ≤ 0.1854)             |
| 0 | [0.8, 0.1, 0.05, 0.05]   | 0.2732     | reject | accept / reject         | reject (JS > 0.1854, c(0) < 2)   |
| 3 | [0.1, 0.1, 0.1, 0.7]     | 0.3464     | reject | reject / reject         | reject                           |

Every rejection emits the target's token 1. The same draft token 0 passes or fails the JS criterion depending on how
far the draft's whole distribution is from the paths' centroid; a draft token 2 with q close to p̄ would pass `js`
with no head voting for it. With all coordinates kept (every u ≥ p) the three heads are the target scaled by
1/(1 − p): all vote 1, the threshold is 0, and both criteria reduce to exact matching.
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
    register_rule,
    sample_uniform,
)

_LN2 = math.log(2.0)
# At most this many float32 logits per (K, rows, vocab) temporary (64 MiB); rows beyond it are processed in chunks.
_CHUNK_ELEMENTS = 2**24
CRITERIA = ("vote", "js")


@dataclass
class DropMatchConfig(RuleConfig):
    """Options of `dropmatch` (`acceptance_kwargs`).

    Args:
        num_heads (`int`, defaults to 5): K, the dropout heads (masked copies of the LM-head input) per verified
            position; the paper's K = 5.
        dropout (`float`, defaults to 0.3): p, the probability of zeroing each coordinate of the LM-head input (the
            kept ones are scaled by 1/(1 − p)); the paper's p = 0.3.
        criterion (`str`, defaults to `"vote"`): how a draft token is tested against the heads. `"vote"`: accept ŷ
            when at least `min_votes` of the K heads choose it (argmax), a test of the *draft token* against the
            heads' empirical token distribution. `"js"`: the distribution-level test, JS(q ‖ p̄) ≤ maxₖ JS(p⁽ᵏ⁾ ‖ p̄)
            or ŷ the plurality head token; it compares the draft's whole distribution q and can accept a token
            that no head chose (see the module docstring for what it cost on GSM8K).
        min_votes (`int`, defaults to 2): for `criterion="vote"`, the votes ŷ needs (1 ≤ min_votes ≤ num_heads):
            with the default K = 5, two paths must choose it; 1 accepts any head's token (about twice as many
            mismatches on GSM8K, see the module docstring). On the measured frontier (reference pair, greedy, GSM8K
            0–9 × 512 tokens, docs/rules.md) no vote count was faster than `exact` (0.98–0.99×); 2 accepts the most
            within a target NLL increase of 0.025 nats per token (τ 5.24, +0.008; 1 vote: τ 5.51, +0.041).
        accept_target_matches (`bool`, defaults to `True`): also accept every draft that standard verification
            accepts (the target's argmax when greedy, u < p/q when sampling), so the rule never rejects what `exact`
            keeps; `False` applies the dropout criterion alone.
        seed (`int` or `None`, defaults to 0): seed of the dropout masks. Each `generate()` call builds its rule
            and so starts a fresh `torch.Generator` from this seed for each row: the same greedy call gives the same
            text, each row the text it gets alone, whatever torch's global RNG holds, and that RNG is left untouched.
            `None` draws the masks from the decoding RNG (torch's global RNG), as sampling does.
    """

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
        default="vote",
        metadata={
            "help": "'vote': accept the draft token if at least min_votes of the K heads choose it (default); 'js': "
            "accept if JS(q||centroid) <= max_k JS(p_k||centroid) or the draft is the plurality head token (a "
            "distribution-level test that can keep a token no head chose)",
            "choices": CRITERIA,
        },
    )
    min_votes: int = field(
        default=2,
        metadata={
            "help": "criterion='vote': how many of the K heads must choose the draft token (1..num_heads)",
            "range": Range(low=1),
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
        default=0,
        metadata={
            "help": "seed of the dropout masks: a fresh generator per generate() call, so greedy output does not "
            "depend on (or move) torch's global RNG; None draws them from the decoding RNG",
            "range": Range(0, 2**63 - 1),
        },
    )

    def _validate_extra(self) -> None:
        if self.min_votes > self.num_heads:
            raise invalid_value(
                f"{self.argument_name}['min_votes']",
                self.min_votes,
                f"at most num_heads = {self.num_heads} for 'dropmatch' (no more heads can vote)",
                f"pass min_votes in [1, {self.num_heads}], or raise num_heads",
            )


def dropout_head_logits(
    hidden: torch.Tensor,
    keep: torch.BoolTensor,
    dropout: float,
    lm_head_weight: torch.Tensor,
    target_logits: torch.Tensor,
) -> torch.FloatTensor:
    """Logits of the K dropout heads, l̃⁽ᵏ⁾ = target_logits + W (h ⊙ m⁽ᵏ⁾ / (1 − p) − h), in one matmul.

    A sharded head: a target split over several devices (transformers' tensor parallelism, `tp_plan="auto"`) holds W
    as a `torch.distributed.tensor.DTensor`, split over the vocabulary by the head's `"colwise_gather_output"` plan
    (each rank holds about `vocab / world_size` rows). The perturbation, the same on every rank (same hidden states,
    masks drawn from generators seeded alike), is then taken as replicated on W's device mesh, each rank multiplies
    it by its own rows of W, and the `(K, ..., vocab)` product is all-gathered over the vocabulary, as the head's own
    output is: every rank gets the same heads, computed with the whole of W. Cost: one all-gather of the heads'
    logits (K·rows·vocab values in W's dtype) per call, i.e. per chunk of rows each round the heads run; the head
    itself is never gathered (vocab·hidden values, a whole copy of it on every rank, which tensor parallelism is
    there to avoid). No host sync: the collective is queued on the device's stream, like the model's own. Every rank
    must make the same calls (the same rows), which it does when the ranks agree on the round, as they must to
    decode the same tokens.

    Args:
        hidden (`torch.Tensor` of shape `(..., hidden)`): h, the input of the LM head.
        keep (`torch.BoolTensor` of shape `(K, ..., hidden)`): the masks m⁽ᵏ⁾ (`True` = kept).
        dropout (`float`): p, in (0, 1).
        lm_head_weight (`torch.Tensor` or `DTensor` of shape `(vocab, hidden)`): W; the bias cancels and is not
            needed.
        target_logits (`torch.Tensor` of shape `(..., vocab)`): the (processed) target logits at h; without logits
            processors they equal `h @ W.T + b`, and the result is then exactly `h⁽ᵏ⁾ @ W.T + b`.

    Returns:
        `torch.FloatTensor` of shape `(K, ..., vocab)`, float32, on `target_logits`' device (a plain tensor, also
        for a sharded W).
    """
    h = hidden.float()
    # h ⊙ m / (1 − p) − h: kept coordinates move by h·p/(1 − p), dropped ones by −h.
    perturbation = torch.where(keep, h * (dropout / (1.0 - dropout)), -h)
    weight = lm_head_weight
    perturbation = perturbation.to(device=weight.device, dtype=weight.dtype)
    sharded = False
    if torch.distributed.is_available():
        from torch.distributed.tensor import DTensor, Replicate

        if isinstance(weight, DTensor):  # a tensor-parallel head: replicated input, output gathered over the vocab
            sharded = True
            mesh = weight.device_mesh
            perturbation = DTensor.from_local(perturbation, mesh, [Replicate()] * mesh.ndim, run_check=False)
    delta = torch.matmul(perturbation, weight.T)  # all K heads at once
    if sharded:
        delta = delta.full_tensor()
    delta = delta.to(device=target_logits.device, dtype=torch.float32)
    if delta.requires_grad:  # outside no_grad a gathered DTensor product is a view autograd forbids changing in place
        return delta + target_logits.float()
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
        # One generator per (device, row of the caller's input), created at the row's first round.
        self._mask_generators: dict[tuple[torch.device, int], torch.Generator] = {}
        # Only the JS criterion compares q with the heads; `vote` spares the drafter a full softmax per greedy step.
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

    def _mask_generator(self, device: torch.device, row: int) -> torch.Generator:
        """Row `row`'s generator (its index in the caller's input), seeded with `seed` at its first round."""
        key = (device, row)
        if key not in self._mask_generators:
            self._mask_generators[key] = torch.Generator(device=device).manual_seed(self.config.seed)
        return self._mask_generators[key]

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
                                       "pass draft_probs, or use acceptance_kwargs={'criterion': 'vote'}")

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
        """m⁽ᵏ⁾ for every draft position, shape `(K, batch, γ, hidden)`: `sample_uniform(...) >= p`, each row's
        `(γ, K, hidden)` from its own generator (`inputs.row_ids`), or one block from torch's global RNG when
        `seed=None` (module docstring, Randomness)."""
        hidden = inputs.target_hidden_states
        batch, gamma, heads, size = hidden.shape[0], inputs.num_draft_tokens, self.config.num_heads, hidden.shape[-1]
        device = hidden.device
        if self.config.seed is None:
            return sample_uniform((heads, batch, gamma, size), device, None) >= self.config.dropout
        rows = inputs.row_ids if inputs.row_ids is not None else range(batch)
        limits = inputs.draft_limits if inputs.draft_limits is not None else (gamma,) * batch
        # A row draws for the drafts it may use only (`draft_limits`: as many as alone); the rest are never accepted.
        draws = [
            torch.nn.functional.pad(sample_uniform((limit, heads, size), device, self._mask_generator(device, row)),
                                    (0, 0, 0, 0, 0, gamma - limit))
            for row, limit in zip(rows, limits)
        ]
        return torch.stack(draws).permute(2, 0, 1, 3) >= self.config.dropout

    def accept(self, inputs: VerificationInput) -> torch.BoolTensor:
        self._check_inputs(inputs)
        config = self.config
        batch, gamma = inputs.draft_token_ids.shape
        device = inputs.target_logits.device
        standard = self.standard_accept(inputs) if config.accept_target_matches else None
        # Masks for every position, drawn before any row is left out, so a row's masks (and verdict) do not depend
        # on which other rows are computed.
        keep = self.draw_masks(inputs).reshape(config.num_heads, batch * gamma, -1)
        rows = self.rows_to_test(standard, batch * gamma, device)
        verdicts = self.criterion_verdicts(inputs, keep, rows)
        if rows is not None:
            verdicts = torch.zeros(batch * gamma, dtype=torch.bool, device=device).index_copy_(0, rows, verdicts)
        accepted = verdicts.reshape(batch, gamma)
        return accepted if standard is None else accepted | standard

    @staticmethod
    def rows_to_test(
        standard: torch.BoolTensor | None, num_rows: int, device: torch.device
    ) -> torch.LongTensor | None:
        """The flattened `(batch·γ)` rows whose heads can change a verdict, or `None` for all of them.

        With `accept_target_matches` a draft that the standard test keeps is kept whatever its heads say, so only
        the other rows need heads: on GSM8K `exact` keeps about 84% of the drafts, so this leaves about a sixth of
        the heads' matrix products. Selecting those rows gives a data-dependent shape, which on an accelerator
        would cost a host sync: there (and without `accept_target_matches`) every row is computed. The verdicts are
        the same either way (each row's masks are drawn before the selection)."""
        if standard is None or device.type != "cpu":
            return None
        return torch.nonzero(~standard.reshape(num_rows)).squeeze(1)

    def criterion_verdicts(
        self, inputs: VerificationInput, keep: torch.BoolTensor, rows: torch.LongTensor | None = None
    ) -> torch.BoolTensor:
        """The criterion alone on the flattened `(batch·γ)` positions `rows` (all if `None`), with masks `keep` of
        shape `(K, batch·γ, hidden)`; returns `(len(rows),)` booleans. Rows are processed in chunks so that no
        `(K, rows, vocab)` temporary exceeds `_CHUNK_ELEMENTS` floats."""
        config = self.config
        batch, gamma = inputs.draft_token_ids.shape
        vocab = inputs.target_logits.shape[-1]
        device = inputs.target_logits.device
        hidden = inputs.target_hidden_states[:, :gamma].reshape(batch * gamma, -1)
        target_logits = inputs.target_logits[:, :gamma].reshape(batch * gamma, vocab)
        drafts = inputs.draft_token_ids.reshape(batch * gamma).to(device)
        draft_probs = inputs.draft_probs.reshape(batch * gamma, -1) if config.criterion == "js" else None
        if rows is not None:
            hidden, target_logits, drafts = hidden[rows], target_logits[rows], drafts[rows]
            keep = keep[:, rows.to(keep.device)]
            draft_probs = None if draft_probs is None else draft_probs[rows]
        chunk = max(1, _CHUNK_ELEMENTS // (config.num_heads * vocab))
        verdicts = [torch.zeros(0, dtype=torch.bool, device=device)]
        for start in range(0, drafts.shape[0], chunk):
            part = slice(start, start + chunk)
            logits = dropout_head_logits(
                hidden[part], keep[:, part], config.dropout, inputs.lm_head_weight, target_logits[part]
            )
            q = None if draft_probs is None else draft_probs[part]
            verdicts.append(self._criterion(logits, drafts[part], q))
        return torch.cat(verdicts)

    def _criterion(
        self, logits: torch.FloatTensor, drafts: torch.LongTensor, q: torch.Tensor | None
    ) -> torch.BoolTensor:
        """The test on one chunk: `logits` (K, rows, V) of the heads, `drafts` (rows,), q (rows, V) for `js`."""
        head_tokens = logits.argmax(-1)  # y⁽ᵏ⁾, (K, rows)
        votes = (head_tokens == drafts).sum(0)  # heads voting for ŷ
        if self.config.criterion == "vote":
            return votes >= self.config.min_votes
        # Plurality: the most votes any head token gets (each head's token is counted among all K heads).
        most_votes = (head_tokens[:, None] == head_tokens[None]).sum(1).amax(0)
        centroid = logits.mean(0).softmax(-1)  # p̄, (rows, V)
        heads = logits.sub_(logits.logsumexp(-1, keepdim=True)).exp_()  # p⁽ᵏ⁾, in place: the logits are ours
        threshold = js_divergence(heads, centroid).amax(0)
        del heads, logits
        js_draft = js_divergence(q.float(), centroid)
        return (js_draft <= threshold) | (votes == most_votes)

    def rejection_token(self, inputs: VerificationInput, position: torch.LongTensor) -> torch.LongTensor:
        if inputs.do_sample and self.config.accept_target_matches:
            return self.residual_token(inputs, position)
        return self.target_token(inputs, position)
