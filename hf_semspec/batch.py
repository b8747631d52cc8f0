"""The rows of one `generate()` call, in the two layouts the speculative loop needs.

**Token layout** (what the user gets): `tokens[r, :lengths[r]]` is row r's sequence so far, its left padding
included; the drafts of the current round follow it, so `tokens[r, :lengths[r] + i]` is the prefix a logits processor
or a stopping criterion sees at draft position i, as in batch-1 decoding.

**Slot layout** (what the KV caches hold): slot s of every row is position s of both caches. Each round drafts
into the same γ slots of every row, and the target verifies them in one forward of shape `(batch, γ + 1)`. Rows accept
different numbers of drafts, so a row that accepted fewer than the best row keeps its rejected drafts in the caches as
*holes*: slots whose `mask` is 0, which attention skips and positions do not count. No cache is ever cropped row by row:
after a round both caches are rewound, in one piece, to the slots the best row needs. With one row there are no holes,
and slots are tokens.

    slots   0   1   2   3   4   5   6   7
    row 0   p   a   b   c   d   x   x   t      accepted 3 of 4 drafts (c, d are x̂₂, x̂₃): no hole
    row 1   p   a   e   x   x   x   x   u      accepted 0: three holes (mask 0), then its target token u
            (x: a rejected draft kept as a hole; slot 7 is where every row's next token goes)

Position ids come from the mask (`cumsum − 1`, as transformers derives them for left padding), so holes and padding
shift nothing; a model's causal mask (slot index) and the 2D `mask` together select exactly the row's own tokens.
"""

from __future__ import annotations

import torch


class DecodingBatch:
    """Token and slot layouts of the rows being decoded (see the module docstring).

    Args:
        input_ids (`torch.LongTensor` of shape `(batch, length)`): the prompts, left-padded.
        attention_mask (`torch.LongTensor` of shape `(batch, length)`, *optional*): 0 on padding; `None` when there
            is none (transformers drops an all-ones mask).
        slot_capacity (`int`): slots to allocate; `grow=True` lets them grow (dynamic caches), else it is the static
            caches' length and a fixed shape of the mask handed to compiled forwards.
        token_capacity (`int`): room in the token layout: the longest sequence plus one round's drafts.
        max_position (`int`, *optional*): the largest position id a forward is given (`max_length − 1`): a row can
            keep no token past it, and slots past it (drafts a row near its end may never accept, but that a batch
            drafts for its other rows, or a multi-level step's fixed-width candidate block) get this position
            instead. A model with learned absolute positions (GPT-2, OPT) has no row for them; causal attention
            leaves the logits of the slots before them unchanged, and their own logits are never used.
    """

    def __init__(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.LongTensor | None,
        slot_capacity: int,
        token_capacity: int,
        grow: bool,
        max_position: int | None = None,
    ):
        batch_size, length = input_ids.shape
        self.max_position = max_position
        device = input_ids.device
        self.grow = grow
        # One slot more than the caches hold: the next token of a round that ends at the last one goes there (it is
        # fed to the caches only if its row goes on, which then has room).
        self.ids = input_ids.new_zeros(batch_size, max(slot_capacity, length) + 1)
        self.ids[:, :length] = input_ids
        self.mask = input_ids.new_zeros(batch_size, self.ids.shape[1])
        self.mask[:, :length] = 1 if attention_mask is None else attention_mask.to(device=device, dtype=torch.long)
        # Whether any slot is masked: then the models get the 2D mask and positions come from it. One prompt with a
        # mask of ones (what generate() passes without padding) never needs one: its forwards go without it (an eager
        # forward would read a passed mask back every time). A batch keeps it: its first hole would need the mask,
        # and a compiled forward would compile again mid-call for it.
        self.masked = attention_mask is not None and (batch_size > 1 or not bool(attention_mask.all()))
        self.num_slots = length
        self.tokens = input_ids.new_zeros(batch_size, max(token_capacity, length))
        self.tokens[:, :length] = input_ids
        # Each row's length in the token layout, as the host knows it (the tokens its output has kept).
        self.lengths = [length] * batch_size
        # On the device, where each row's drafts of the next round go in `tokens`: its length, counted without a
        # host read (a row cut short by a stop gets its host length back when it finishes).
        self.draft_starts = torch.full((batch_size,), length, dtype=torch.long, device=device)
        self.rows = list(range(batch_size))  # the caller's index of each row still here
        # Whether each row is still decoding (a finished row stays for a static cache's fixed shape), on the host;
        # and, on the device, the mask value its new slots get: 1 while it decodes, 0 once it finished.
        self.decoding = [True] * batch_size
        self.new_slot_mask = torch.ones(batch_size, dtype=torch.long, device=device)

    @property
    def size(self) -> int:
        return self.ids.shape[0]

    @property
    def device(self) -> torch.device:
        return self.ids.device

    @property
    def slot_capacity(self) -> int:
        """The slots the caches may hold."""
        return self.ids.shape[1] - 1

    def reserve(self, num_slots: int) -> None:
        """Makes room for `num_slots` slots in the caches (growing the buffers where allowed)."""
        if num_slots <= self.slot_capacity:
            return
        if not self.grow:
            raise RuntimeError(f"the static caches hold {self.slot_capacity} slots; {num_slots} were needed")
        extra = max(num_slots, 2 * self.slot_capacity) - self.slot_capacity
        self.ids = torch.cat([self.ids, self.ids.new_zeros(self.size, extra)], dim=1)
        self.mask = torch.cat([self.mask, self.mask.new_zeros(self.size, extra)], dim=1)

    def reserve_tokens(self, num_tokens: int) -> None:
        if num_tokens > self.tokens.shape[1]:
            extra = max(num_tokens, 2 * self.tokens.shape[1]) - self.tokens.shape[1]
            self.tokens = torch.cat([self.tokens, self.tokens.new_zeros(self.size, extra)], dim=1)

    # -- what a forward over slots [start, end) is given -----------------------------------------------------------

    def positions(self, start: int, end: int) -> torch.LongTensor:
        """Position ids `(batch, end − start)` of slots `[start, end)`: the row's real tokens before each slot, at most
        `max_position`."""
        if not self.masked:
            positions = torch.arange(start, end, device=self.device)
            if self.max_position is not None and end - 1 > self.max_position:
                positions = positions.clamp_max(self.max_position)
            return positions.expand(self.size, -1)
        # Contiguous: a slice of the cumsum would have a stride that grows with `end`, which a compiled forward guards
        # on (one more graph, mid-call, the first time it changes).
        positions = (self.mask[:, :end].cumsum(-1) - 1).clamp_min(0)[:, start:end]
        if self.max_position is not None:
            positions = positions.clamp_max(self.max_position)
        return positions.contiguous()

    def model_mask(self, end: int, full: bool) -> torch.LongTensor | None:
        """The 2D attention mask for a forward whose last slot is `end − 1`: `None` while no slot is masked, else the
        mask through `end` (`full`: through the capacity, the fixed shape a compiled forward with a static cache
        takes; the causal mask hides the slots after `end`)."""
        if not self.masked:
            return None
        return self.mask[:, : self.slot_capacity if full else end]

    # -- a round ---------------------------------------------------------------------------------------------------

    def write_draft(self, index: int, token: torch.LongTensor) -> None:
        """Draft `index` of this round, `(batch,)`: slot `num_slots + index` of every row, and after each row's
        tokens (where processors and stopping criteria read it)."""
        slot = self.num_slots + index
        self.ids[:, slot] = token
        self.mask[:, slot] = self.new_slot_mask
        self.tokens.scatter_(1, (self.draft_starts + index)[:, None], token[:, None])

    def open_draft_slots(self, num_drafts: int) -> None:
        """Gives this round's first `num_drafts` draft slots their mask before the drafts are known, for a compiled
        round whose later steps attend to the drafts before them (`write_drafts` then writes the same values)."""
        self.mask[:, self.num_slots : self.num_slots + num_drafts] = self.new_slot_mask[:, None]

    def write_drafts(self, tokens: torch.LongTensor) -> None:
        """This round's drafts at once, `(batch, n)`: what `write_draft` writes for each, in a few launches for all."""
        slot, count = self.num_slots, tokens.shape[1]
        self.ids[:, slot : slot + count] = tokens
        self.mask[:, slot : slot + count] = self.new_slot_mask[:, None]
        offsets = torch.arange(count, device=self.device)
        self.tokens.scatter_(1, self.draft_starts[:, None] + offsets, tokens)

    def prefix(self, row: int, extra: int) -> torch.LongTensor:
        """Row `row`'s tokens and its first `extra` drafts, `(1, lengths[row] + extra)`."""
        return self.tokens[row : row + 1, : self.lengths[row] + extra]

    def commit(self, num_accepted: torch.LongTensor, next_token: torch.LongTensor, accepted: list[int],
               kept: list[int]) -> None:
        """Ends a round that drafted into slots `[num_slots, num_slots + γ)`.

        Args:
            num_accepted (`torch.LongTensor` of shape `(batch,)`) and `accepted` (`list[int]`): the drafts each row
                accepted, on the device and as read on the host.
            next_token (`torch.LongTensor` of shape `(batch,)`): each row's token after its accepted drafts.
            kept (`list[int]`): the tokens each row adds to its sequence (accepted + 1, less what a stop cut).

        Each row's next token goes to slot `num_slots + max(accepted)`: right after the best row's accepted drafts,
        and after the holes of the others.
        """
        best = max(accepted)
        start = self.num_slots
        self.tokens.scatter_(1, (self.draft_starts + num_accepted)[:, None], next_token[:, None])
        self.lengths = [length + k for length, k in zip(self.lengths, kept)]
        # On the device without a copy from the host (which would wait for the GPU): a row that goes on kept all its
        # accepted drafts and the next token; a row cut short finishes this round, and a finished row stops growing.
        self.draft_starts += (num_accepted + 1) * self.new_slot_mask
        if best:
            valid = torch.arange(best, device=self.device)[None, :] < num_accepted[:, None]
            self.mask[:, start : start + best] = valid.long() * self.new_slot_mask[:, None]
        self.ids[:, start + best] = next_token
        self.mask[:, start + best] = self.new_slot_mask
        self.mask[:, start + best + 1 :] = 0  # the drafts no row accepted, past the new last slot
        self.masked = self.masked or min(accepted) < best
        self.num_slots = start + best + 1

    def finish(self, row_index: int) -> None:
        """Row `row_index` (an index into the current rows) is done and stays for the shape (static caches): its new
        slots are masked out."""
        self.decoding[row_index] = False
        self.new_slot_mask[row_index] = 0
        # Its device length counted every accepted draft; a stop cut it to `lengths` on the host. Later rounds still
        # write this row's drafts after it, which must stay within the buffer `reserve_tokens` sized from `lengths`.
        self.draft_starts[row_index] = self.lengths[row_index]
        self.masked = True

    def room(self, max_length: int) -> int:
        """The most tokens a row still decoding may add before `max_length`."""
        return max(max_length - length for length, decoding in zip(self.lengths, self.decoding) if decoding)

    def keep_rows(self, indices: list[int]) -> torch.LongTensor:
        """Keeps only the rows at `indices` (dynamic caches: finished rows leave); returns them as a device tensor for
        the caches' `batch_select_indices`."""
        index = torch.tensor(indices, dtype=torch.long, device=self.device)
        self.ids, self.mask, self.tokens = self.ids[index], self.mask[index], self.tokens[index]
        self.new_slot_mask, self.draft_starts = self.new_slot_mask[index], self.draft_starts[index]
        self.lengths = [self.lengths[i] for i in indices]
        self.decoding = [self.decoding[i] for i in indices]
        self.rows = [self.rows[i] for i in indices]
        return index
