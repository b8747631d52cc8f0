"""Shared by the entropy-based draft-length policies (`adaedl`, `svip`): the Shannon entropy of q, in nats.

Not a policy: importing this module registers nothing.
"""

from __future__ import annotations

import torch


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """H(q) = -Σ_v q(v) ln q(v) per row of `probs` (shape `(..., vocab)`), in nats, computed in float32 on the
    tensor's device (no host sync); 0·ln 0 = 0, so tokens masked by top-k/top-p count for nothing. A q with NaN (an
    overflowing draft) gives +inf, the most uncertain value: `svip` and `adaedl` stop there, and `cost_aware` prices
    the draft at its least confident bin. (A NaN compares False against any threshold: it kept them drafting to the
    cap.)"""
    return torch.nan_to_num(torch.special.entr(probs.float()).sum(-1), nan=float("inf"))
