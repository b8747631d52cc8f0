"""The RDK affinity kernel of a pruned drafter: where each kept token sends its draft mass.

Paper (Timor et al., "Out-of-Vocabulary Sampling Boosts Speculative Decoding", arXiv 2506.03206): the drafter's
distribution q' over the kept tokens (TLI-normalised: restricted to the tokens both vocabularies share and
renormalised) is redistributed over the whole target vocabulary as r = Mᵀq', with M a row-stochastic token-affinity
matrix, e.g. M_ij = softmax_j(Ω_ij / τ) over an affinity/similarity Ω; the exact redistribution is O(N²) per draft
token, and the paper gives a first-order approximation that is O(N). For a pruned drafter q' is simply the softmax
of its K logits (the kept tokens are a subset of the target's vocabulary).

Ours (the paper's exact formulas for Ω, τ and the approximation were not available to us while writing this; what
follows is our construction, in the paper's notation):

- Ω_ij = cos(e_i, e_j), the cosine of output embeddings: the target's LM-head rows when a target is given, else the
  drafter's own LM-head rows before slicing. Tokens that the model predicts in similar contexts have similar head
  rows, which is the overlap RDK wants to exploit.
- Sparse rows: row i (a kept token) has non-zeros only on i itself and on its m most similar *pruned* tokens
  (candidates exclude ids the tokenizer never produces, e.g. embedding padding rows). Mass never moves between two
  kept tokens: the drafter already models those.
- The self score is fixed to Ω_ii = 1 (the largest cosine), and the row is softmax over [1, Ω_i,n1, …, Ω_i,nm] / τ.
  So each kept token keeps the largest share of its own mass, and a pruned neighbour receives
  exp((Ω_ij − 1)/τ) of what the kept token keeps.
- Storage and compute are O(K·(m+1)): `indices` and `weights` of shape `(K, m + 1)`;
  `hf_semspec.drafting.redistribute` applies r = q'·M as one scatter-add per draft token. This sparse form is our
  reading of a "first-order" approximation: it keeps, per kept token, only the largest entries of its affinity row.
- The similarities are computed in chunks of kept rows, so the `(K, pruned)` similarity matrix is never held
  whole (about `chunk_elements` floats at a time).

Default m = 8, τ = 0.02: see `DEFAULT_NEIGHBOURS` / `DEFAULT_TEMPERATURE` (with the measurements behind τ).

What the kernel can recover on the reference pair, measured (`benchmarks/rdk_kernels.py`,
`benchmarks/results/rdk-kernels.md`): α = E Σ min(p, r) (the sampling acceptance rate of the standard test) at
temperature 0.7 over 395 positions of the target's sampled answers to 8 held-out Spec-Bench prompts, keep sets of
`benchmarks/pruned_drafters.py`:

| r | keep 10% (15,194) | keep 25% (37,984) |
| --- | --- | --- |
| unpruned draft q (the ceiling) | 0.8023 | 0.8023 |
| q', no kernel (`exact` with the pruned drafter) | 0.7399 | 0.7881 |
| cosine, τ = 0.02 (default) / 0.05 / 0.1 / 0.2 | 0.7371 / 0.7258 / 0.6587 / 0.4780 | 0.7853 / 0.7789 / 0.7314 / 0.5731 |
| calibrated: M_ij = E[q'(i)·q(j)] / E[q'(i)], the unpruned draft's own mass on pruned j where q' is on i | 0.7285 | 0.7848 |

No kernel raised α: the best is none, and the default costs 0.003. Why: the target puts 9.9% (keep 10%) and 2.8%
(keep 25%) of its mass on pruned tokens there, so even a perfect r could add at most 0.062 / 0.014 (the unpruned
draft's α); and that mass is spread over many pruned tokens that change with the context, while a kernel is one
linear map for every context: the mass it moves off a kept token is lost wherever the target wanted that token, and
this outweighed what landed on pruned tokens the target wanted, for the embedding kernel at every τ and for a kernel
calibrated on the drafter's own pruned mass (10,634 positions of keep-set corpus text). Issue 46's target, +0.05
over `exact` at 10% kept, would need four fifths of the ceiling from one static map; we found no map that gives any.
"""

from __future__ import annotations

import torch

from ..errors import SemSpecConfigError, invalid_value

DEFAULT_NEIGHBOURS = 8
"""m: pruned neighbours per kept token. With the default τ only near-duplicates of a kept token (case, leading-space
and spelling variants, of which a token has a few) receive noticeable mass, so a larger m adds storage and
redistribution work (K·(m+1) ids and weights, one scatter-add per draft token) without changing r much; 8 leaves
room for every such variant."""

DEFAULT_TEMPERATURE = 0.02
"""τ: a pruned neighbour at cosine s gets exp((s − 1)/τ) of the kept token's own weight, so with τ = 0.02 only
near-duplicates of a kept token (cos ≳ 0.95: weight ≥ 8% of the kept token's) receive mass, and loosely related
tokens (cos 0.3–0.8, most neighbours in Qwen2.5's head) receive next to nothing.

Why so small: moving mass off a kept token costs acceptance wherever the target agrees with the drafter, and gains
at most the target's mass on pruned tokens, which is small for a frequency-chosen keep set. Measured on the
reference pair (Qwen2.5-Coder 1.5B target / 0.5B draft, keep sets counted on Spec-Bench + GSM8K, α = E Σ min(p, r)
at temperature 0.7 over 573 positions of held-out GSM8K answers; `benchmarks/pruned_drafters.py
--sweep-temperature`): the target put 0.2% / 0.6% / 1.2% of its mass on pruned tokens at keep 50% / 25% / 10%;
α without redistribution was 0.850 / 0.849 / 0.847; τ ≤ 0.02 left α unchanged (to 1e-4), τ = 0.05 lowered it by
0.0002 / 0.0016 / 0.0044, τ = 0.1 by 0.010 / 0.025 / 0.044, τ = 0.5 by more than half. No τ raised α there, so the
default is the largest τ of that sweep that costs nothing measurable; pass a larger `rdk_temperature` for more
aggressive pruning or text far from the keep-set corpus, where the target's mass on pruned tokens is larger."""

SELF_SCORE = 1.0
DEFAULT_CHUNK_ELEMENTS = 1 << 24
ROW_SUM_TOLERANCE = 1e-4


@torch.no_grad()
def build_rdk_kernel(
    embeddings: torch.Tensor,
    kept_token_ids: torch.LongTensor,
    candidate_ids: torch.LongTensor,
    neighbours: int = DEFAULT_NEIGHBOURS,
    temperature: float = DEFAULT_TEMPERATURE,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> tuple[torch.LongTensor, torch.FloatTensor]:
    """The sparse row-stochastic kernel of the module docstring.

    Args:
        embeddings (`torch.Tensor` of shape `(vocab, hidden)`): output embeddings (LM-head rows) in target ids.
        kept_token_ids (`torch.LongTensor` of shape `(K,)`): the kept ids, one kernel row each.
        candidate_ids (`torch.LongTensor` of shape `(P,)`): pruned ids that may receive mass.
        neighbours (`int`): m; fewer when there are fewer than m candidates (0 candidates: identity rows).
        temperature (`float`): τ > 0.
        chunk_elements (`int`): about how many similarities are held at once.

    Returns:
        `(indices, weights)`, `torch.LongTensor` and `torch.FloatTensor` of shape `(K, 1 + min(m, P))`: column 0 is
        the kept token itself; rows sum to 1.
    """
    kept = kept_token_ids.to(torch.long).cpu()
    candidates = candidate_ids.to(torch.long).cpu()
    m = min(int(neighbours), candidates.numel())
    if m == 0:
        return kept[:, None].clone(), torch.ones(kept.numel(), 1)
    unit = torch.nn.functional.normalize(embeddings.detach().float().cpu(), dim=-1)
    candidate_unit_t = unit[candidates].T.contiguous()  # (hidden, P)
    rows = max(1, chunk_elements // max(1, candidates.numel()))
    indices = torch.empty(kept.numel(), m + 1, dtype=torch.long)
    scores = torch.empty(kept.numel(), m + 1)
    indices[:, 0] = kept
    scores[:, 0] = SELF_SCORE
    for start in range(0, kept.numel(), rows):
        block = unit[kept[start : start + rows]] @ candidate_unit_t  # (rows, P): the only large temporary
        top = block.topk(m, dim=-1)
        indices[start : start + rows, 1:] = candidates[top.indices]
        scores[start : start + rows, 1:] = top.values
    return indices, torch.softmax(scores / temperature, dim=-1)


def check_rdk_kernel(
    indices: torch.Tensor, weights: torch.Tensor, kept_token_ids: torch.Tensor, vocab_size: int, source: str
) -> None:
    """Raises `SemSpecConfigError` unless the kernel has one row per kept id, ids in range, non-negative weights and
    rows summing to 1 (within `ROW_SUM_TOLERANCE`). `source` names where the kernel came from, for the message."""
    k = kept_token_ids.numel()
    if indices.dim() != 2 or indices.shape != weights.shape or indices.shape[0] != k:
        raise invalid_value(
            f"rdk kernel ({source})",
            f"indices {tuple(indices.shape)}, weights {tuple(weights.shape)}",
            f"two (K, m) tensors with K = {k} kept tokens",
            "rebuild the drafter with prune_vocabulary(..., rdk=True)",
        )
    if indices.dtype.is_floating_point or int(indices.min()) < 0 or int(indices.max()) >= vocab_size:
        raise invalid_value(
            f"rdk kernel ({source}) indices",
            f"dtype {indices.dtype}, range [{int(indices.min())}, {int(indices.max())}]",
            f"integer target ids in [0, {vocab_size})",
            "rebuild the drafter with prune_vocabulary(..., rdk=True)",
        )
    sums = weights.double().sum(-1)
    worst = int((sums - 1).abs().argmax())
    if bool((weights < 0).any()) or not torch.isfinite(weights).all() or abs(float(sums[worst]) - 1) > ROW_SUM_TOLERANCE:
        raise SemSpecConfigError(
            f"`rdk kernel ({source})` is not row-stochastic: row {worst} (kept token "
            f"{int(kept_token_ids[worst])}) sums to {float(sums[worst]):.6f}"
            + (", and some weights are negative or not finite" if (weights < 0).any() or not torch.isfinite(weights).all() else "")
            + f": allowed non-negative weights whose rows sum to 1 (±{ROW_SUM_TOLERANCE}). Fix: the file was altered "
            "or written by another tool; rebuild the kernel with prune_vocabulary(..., rdk=True) and save it again."
        )
