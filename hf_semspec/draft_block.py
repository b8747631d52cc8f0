"""A round's drafts (`DraftBlock`), the type every drafter returns: the draft model (`hf_semspec.drafting`) and
prompt lookup (`hf_semspec.ngram`) alike."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# The id written in the slots of a row that found fewer drafts or candidates than the block's width: any valid id
# does, since neither the verifier (`VerificationInput.draft_limits`) nor multi-level drafting ever takes a row's
# drafts past its own count.
PADDING_DRAFT = 0


@dataclass
class DraftBlock:
    """One round's drafts.

    Args:
        tokens (`torch.LongTensor` of shape `(batch, γ)`): the drafts, in target vocabulary ids; also written into the
            batch (`DecodingBatch.write_draft`).
        probs (`torch.FloatTensor` of shape `(batch, γ, vocab)`, *optional*): the distribution each draft was drawn
            from, after the logits processors (what the verifier calls q); one-hot for prompt-lookup drafts.
        num_per_row (`tuple[int, ...]`, *optional*): prompt-lookup drafts (`hf_semspec.ngram.NgramDrafter`): the
            drafts each row found, at most γ; the rest of its row is padding, which the loop never lets the rule accept
            (`VerificationInput.draft_limits`). `None`: a draft model's block, γ real drafts in every row.
        num_forwards (`int`): forwards of the draft model this round (0 for prompt lookup).
        num_wide_forwards (`int`): of those, multi-level drafting's forwards over a block of n-gram candidates.
        from_ngram (`tuple[bool, ...]`, *optional*): multi-level drafting: for each draft position, whether its
            drafts were n-gram candidates the draft model confirmed (drafted without a forward of their own, in every
            row); None otherwise.
    """

    tokens: torch.LongTensor
    probs: torch.FloatTensor | None
    num_per_row: tuple[int, ...] | None = None
    num_forwards: int = 0
    from_ngram: tuple[bool, ...] | None = None
    num_wide_forwards: int = 0

    @property
    def num_tokens(self) -> int:
        return self.tokens.shape[1]

    @property
    def num_ngram_drafts(self) -> int:
        """Draft positions whose drafts were confirmed n-gram candidates (multi-level drafting)."""
        return sum(self.from_ngram or ())
