"""Prompt-lookup drafts: tokens copied from the context, no draft model (and the n-gram index that multi-level
drafting searches for a draft model's candidates: `RowContexts`, `hf_semspec.drafting.ModelDrafter`).

`generate(..., acceptance=rule, prompt_lookup_num_tokens=k, max_matching_ngram_size=n)` without an
`assistant_model` drafts, each round and for each row, the k tokens that followed an earlier occurrence of the last
n tokens of the row's context (its prompt and output so far), and verifies them with `rule` as it verifies a draft
model's. The search is transformers' prompt lookup decoding (`PromptLookupCandidateGenerator`, after Saxena's
https://github.com/apoorvumang/prompt-lookup-decoding):

- the n-gram is the context's last `m` tokens, for `m` from `min(n, length − 1)` down to 1: the longest that occurred
  before wins;
- of its occurrences, the *first* (leftmost) one that has a token after it, as transformers takes it (its loop goes
  through the matches left to right and keeps the first with a continuation);
- the drafts are up to k tokens after it, fewer where the context ends sooner (they may run into the n-gram itself);
- no occurrence for any `m`: no drafts, and the round verifies none (it emits the target's own token, as plain
  decoding does).

Where this departs from transformers' generator: drafts are kept through the first EOS (transformers drops the EOS and
what follows: a drafted EOS the target accepts here ends the row in that round), and drafts are not first screened
with the logits processors (transformers tries the next occurrence when a processor forbids its first draft): the
rules reject any draft the processors forbid (`AcceptanceRule.verify`), so the output is the same and only the drafts
proposed differ. The loop cuts each round at `max_length` itself.

Worked example (k = 3, n = 2), context `5 6 7 5 6 9 5 6`: the last 2 tokens `5 6` occurred at positions 0 and 3
before the end, the first of them wins, and the drafts are the 3 tokens after it: `7 5 6`. With context `5 6 7 8 6`
the bigram `8 6` never occurred before, the unigram `6` did at position 1: the drafts are `7 8 6`. With context
`5 6 7 8` nothing recurs: no drafts. With context `5 6 5` the unigram `5` occurred at position 0 with only `6 5`
after it: 2 drafts of the 3 asked.

Drafts are proposals that do not depend on any randomness, so the draft distribution q is one-hot on each draft:
`exact`'s sampling test accepts a draft x with probability min(1, p(x) / 1) = p(x) and, on a rejection, draws from
norm(max(p − q, 0)), p without x: every emitted token is still distributed as p (lossless), as for any draft. The
loop hands a rule that reads q this one-hot q (`draft_probs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import torch
from torch.profiler import record_function

from .batch import DecodingBatch
from .component_config import python_number
from .draft_length import DraftLengthPolicy
from .draft_length.base import MAX_DRAFT_TOKENS
from .draft_block import PADDING_DRAFT, DraftBlock
from .errors import invalid_value

# transformers' default `max_matching_ngram_size` (`generation_config.max_matching_ngram_size or 2`).
DEFAULT_MAX_NGRAM_SIZE = 2


@dataclass(frozen=True)
class PromptLookup:
    """The settings of prompt-lookup drafting (validated: `check_prompt_lookup`).

    Args:
        num_tokens (`int`): k, the most tokens copied per round (`prompt_lookup_num_tokens`).
        max_ngram_size (`int`): n, the longest n-gram of the context's end that is searched for
            (`max_matching_ngram_size`, default 2 as in transformers).
    """

    num_tokens: int
    max_ngram_size: int = DEFAULT_MAX_NGRAM_SIZE


def check_prompt_lookup(
    num_tokens: Any,
    max_ngram_size: Any,
    num_tokens_field: str = "prompt_lookup_num_tokens",
    ngram_field: str = "max_matching_ngram_size",
) -> PromptLookup:
    """Validates prompt-lookup settings for the speculative loop and returns them.

    Args:
        num_tokens: `prompt_lookup_num_tokens` (not None), an int in `[1, MAX_DRAFT_TOKENS]`.
        max_ngram_size: `max_matching_ngram_size`, an int ≥ 1, or None for the default 2.
        num_tokens_field / ngram_field (`str`): the fields as the user set them, for the errors
            (`"generation_config.prompt_lookup_num_tokens"`, ...).

    Raises:
        `SemSpecConfigError`: naming the field, the value, what is allowed and the fix.
    """
    num_tokens, max_ngram_size = python_number(num_tokens), python_number(max_ngram_size)
    if not _is_int(num_tokens) or not 1 <= num_tokens <= MAX_DRAFT_TOKENS:
        raise invalid_value(
            num_tokens_field, num_tokens,
            f"an int in [1, {MAX_DRAFT_TOKENS}] (the most tokens copied from the context per round)",
            "pass e.g. prompt_lookup_num_tokens=10",
        )
    if max_ngram_size is None:
        return PromptLookup(num_tokens)
    if not _is_int(max_ngram_size) or max_ngram_size < 1:
        raise invalid_value(
            ngram_field, max_ngram_size,
            "an int ≥ 1 (the longest n-gram of the context's end that prompt lookup searches for)",
            f"pass e.g. max_matching_ngram_size=2, or leave it unset for {DEFAULT_MAX_NGRAM_SIZE} (transformers' "
            "default)",
        )
    return PromptLookup(num_tokens, max_ngram_size)


PROMPT_LOOKUP_FORM = (f"K[:N]: K in [1, {MAX_DRAFT_TOKENS}], the most tokens copied from the context per round "
                      f"(prompt_lookup_num_tokens), and N >= 1, the longest n-gram of the context's end searched for "
                      f"(max_matching_ngram_size, default {DEFAULT_MAX_NGRAM_SIZE} as in transformers)")


def parse_prompt_lookup(text: str) -> PromptLookup:
    """A command line's `K[:N]` → `PromptLookup(K, N)`: `"6"` → k = 6 and transformers' n = 2, `"6:4"` → k = 6, n = 4
    (what `python -m hf_semspec compare --prompt-lookup` and the benchmarks take).

    Raises:
        `ValueError`: naming the value, the form allowed and the fix (the caller adds its flag's name).
    """
    k, colon, n = text.strip().partition(":")
    numbers = [k] + ([n] if colon else [])
    if all(x.strip().isascii() and x.strip().isdigit() for x in numbers):
        lookup = PromptLookup(int(k), int(n) if colon else DEFAULT_MAX_NGRAM_SIZE)
        if 1 <= lookup.num_tokens <= MAX_DRAFT_TOKENS and lookup.max_ngram_size >= 1:
            return lookup
    raise ValueError(f"got {text!r}; expected {PROMPT_LOOKUP_FORM}. Fix: pass e.g. 6:4")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class NgramIndex:
    """One row's context and, for each size m ≤ n, where each m-gram of it first occurred: a prompt-lookup search
    is then a dictionary look-up per size, not a scan of the context.

    Tokens appended after `mark()` are tentative (a round's drafts, which multi-level drafting searches through
    before the target has verified them): `rollback()` forgets them and the n-grams they added.

    Args:
        max_ngram_size (`int`): n.
        tokens (`Iterable[int]`): the context so far (a prompt without its left padding).
    """

    def __init__(self, max_ngram_size: int, tokens: Iterable[int] = ()):
        self.max_ngram_size = max_ngram_size
        self.tokens: list[int] = []
        # first[m - 1][gram] = the first position of the m-gram `gram` in `tokens`
        self.first: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_ngram_size)]
        # While tentative: the context's length at `mark()` and the n-grams added since, (size − 1, gram).
        self._marked: int | None = None
        self._added: list[tuple[int, tuple[int, ...]]] = []
        self.extend(tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        """Appends `tokens` to the context (O(n²) per token, n = `max_ngram_size`)."""
        for token in tokens:
            self.tokens.append(int(token))
            end = len(self.tokens)
            for m in range(1, min(self.max_ngram_size, end) + 1):
                gram = tuple(self.tokens[end - m :])
                if gram not in self.first[m - 1]:
                    self.first[m - 1][gram] = end - m
                    if self._marked is not None:
                        self._added.append((m - 1, gram))

    def mark(self) -> None:
        """Tokens appended from now on are tentative, until `rollback()`."""
        self._marked, self._added = len(self.tokens), []

    def rollback(self) -> None:
        """Forgets the tokens appended since `mark()`, and the n-grams that first occurred among them."""
        if self._marked is None:
            return
        for size, gram in self._added:
            del self.first[size][gram]
        del self.tokens[self._marked :]
        self._marked, self._added = None, []

    def lookup(self, num_tokens: int) -> list[int]:
        """Up to `num_tokens` drafts for the context's next tokens (the module docstring's search); `[]` when none
        of its last m-grams occurred earlier."""
        length = len(self.tokens)
        for m in range(min(self.max_ngram_size, length - 1), 0, -1):
            start = self.first[m - 1][tuple(self.tokens[length - m :])]
            if start < length - m:  # an earlier occurrence than the context's own end: it has a continuation
                return self.tokens[start + m : start + m + num_tokens]
        return []


class RowContexts:
    """Each row's context, prompt (without its left padding) then the tokens its output kept, with its n-gram index:
    what prompt lookup searches, for `NgramDrafter` and for multi-level drafting (`ModelDrafter` with a lookup).

    The loop appends each round's kept tokens from its one host sync (`append_tokens`), so no search reads the
    device. The indexes are kept by the caller's row index (`DecodingBatch.rows`), so rows that leave need nothing.

    Args:
        input_ids (`torch.LongTensor` of shape `(batch, length)`) and attention_mask (`torch.LongTensor` of the same
            shape, *optional*): the prompts, left-padded.
        lookup (`PromptLookup`): k and n.
        stop_token_ids (`frozenset[int]`): EOS ids: found drafts end with the first of them.
    """

    def __init__(self, input_ids: torch.LongTensor, attention_mask: torch.LongTensor | None, lookup: PromptLookup,
                 stop_token_ids: frozenset[int] = frozenset()):
        self.lookup = lookup
        self.stop_token_ids = stop_token_ids
        rows = input_ids.tolist()
        masks = attention_mask.tolist() if attention_mask is not None else [[1] * len(row) for row in rows]
        self.indexes = [
            NgramIndex(lookup.max_ngram_size, (t for t, m in zip(row, mask) if m)) for row, mask in zip(rows, masks)
        ]

    def append_tokens(self, row: int, tokens: list[int]) -> None:
        """Row `row` (its index in the caller's input) took `tokens` this round (or, between `begin_round` and
        `end_round`, drafted them: multi-level drafting's later steps search them too)."""
        self.indexes[row].extend(tokens)

    def begin_round(self, rows: Iterable[int]) -> None:
        """Marks each of `rows`' contexts: what is appended until `end_round` is forgotten then (a round's drafts)."""
        for row in rows:
            self.indexes[row].mark()

    def end_round(self, rows: Iterable[int]) -> None:
        """Forgets what `rows` appended since `begin_round`."""
        for row in rows:
            self.indexes[row].rollback()

    def found(self, row: int, wanted: int) -> list[int]:
        """Up to `wanted` drafts for row `row`'s next tokens, through the first EOS among them."""
        drafts = self.indexes[row].lookup(wanted)
        if self.stop_token_ids:
            end = next((i for i, token in enumerate(drafts) if token in self.stop_token_ids), None)
            if end is not None:
                drafts = drafts[: end + 1]
        return drafts


def ngram_drafts(tokens: Iterable[int], num_tokens: int, max_ngram_size: int = DEFAULT_MAX_NGRAM_SIZE) -> list[int]:
    """The prompt-lookup drafts for the context `tokens` (the module docstring), e.g.
    `ngram_drafts([5, 6, 7, 5, 6, 9, 5, 6], 3) == [7, 5, 6]`."""
    return NgramIndex(max_ngram_size, tokens).lookup(num_tokens)


class NgramDrafter:
    """Drafts by prompt lookup (the module docstring): the drafter of the speculative loop when there is no draft
    model. The same interface as `ModelDrafter`: `draft()` each round, `append_tokens()` with each row's new tokens,
    `keep_rows()` when rows leave.

    The search runs on the host, from a copy of each row's context that the loop keeps up to date with the tokens it
    read in its one host sync per round (`append_tokens`): no read from the device per round. The prompts are read
    once, when the drafter is built. Per round the host does, per row, one dictionary look-up per n-gram size (the
    index holds n entries per context token), and copies the `(batch, γ)` drafts to the device, where the one-hot q is
    built when it is needed; nothing is read back (a per-token policy reads its decision from the device once per
    draft, as it does with a draft model).

    γ of a round: the most drafts any row found, within `max_tokens` (the policy's budget, capped by the loop near
    `max_length`) and k; on static caches (`fixed_length`) γ = min(k, `max_tokens`) whenever a row found one, so that
    the verify forward, compiled for a fixed shape, keeps two shapes (γ + 1 and 1) instead of one per length. Rows that
    found fewer are padded (`PADDING_DRAFT`) and their count goes to the loop (`DraftBlock.num_per_row`), which
    verifies each row as if it had drafted only its own (`VerificationInput.draft_limits`).

    A per-token policy (`decides_per_token`) is asked after each draft, as with a draft model, with the one-hot q:
    entropy 0, so the entropy-based ones (`svip`, `adaedl`) always go on; `cost_aware` weighs its measured cost and
    acceptance of these drafts and may stop.

    Args:
        input_ids (`torch.LongTensor` of shape `(batch, length)`) and attention_mask (`torch.LongTensor` of the same
            shape, *optional*): the prompts, left-padded; the padding is not part of a row's context.
        lookup (`PromptLookup`): k and n.
        return_probs (`bool`): return q, one-hot, for the verifier (sampling, or a rule that `requires_draft_probs`).
        vocab_size (`int`): the target's vocabulary size (the width of q).
        output_device (`torch.device`): where the drafts and q go (the batch's device).
        stop_token_ids (`frozenset[int]`): EOS ids: a row's drafts end with the first of them.
        fixed_length (`bool`): static caches (see above).
    """

    def __init__(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.LongTensor | None,
        lookup: PromptLookup,
        return_probs: bool,
        vocab_size: int,
        output_device: torch.device,
        stop_token_ids: frozenset[int] = frozenset(),
        fixed_length: bool = False,
    ):
        self.num_tokens = lookup.num_tokens
        self.return_probs = return_probs
        self.vocab_size = vocab_size
        self.output_device = output_device
        self.fixed_length = fixed_length
        self.extra_slots = 0  # (it writes no slot past its drafts)
        self.contexts = RowContexts(input_ids, attention_mask, lookup, stop_token_ids)

    def append_tokens(self, row: int, tokens: list[int]) -> None:
        """Row `row` (its index in the caller's input) took `tokens` this round."""
        self.contexts.append_tokens(row, tokens)

    def keep_rows(self, index: torch.LongTensor) -> None:
        """Rows leave the batch: nothing to do (the contexts are kept by the caller's row index)."""

    @record_function("hf_semspec.draft")
    def draft(self, batch: DecodingBatch, max_tokens: int, policy: DraftLengthPolicy | None = None,
              cut_short: bool = False) -> DraftBlock:
        """Looks up each row's drafts, at most min(k, `max_tokens`), and writes them into the slots after
        `batch.num_slots` (and after each row's tokens). A finished row kept for a static cache's shape drafts
        nothing (its slots get `PADDING_DRAFT`). (`cut_short`: `ModelDrafter.draft`'s interface; a lookup has no
        compiled round.)

        Returns:
            `DraftBlock` with `tokens` of shape `(batch, γ)`, `probs` one-hot of shape `(batch, γ, vocab)` when
            `return_probs`, `num_per_row` each row's own drafts (≤ γ) and `num_forwards` 0.
        """
        wanted = min(self.num_tokens, max_tokens)
        found = [
            self.contexts.found(row, wanted) if decoding and wanted > 0 else []
            for row, decoding in zip(batch.rows, batch.decoding)
        ]
        longest = max(len(drafts) for drafts in found)
        gamma = (wanted if self.fixed_length else longest) if longest else 0
        if gamma == 0:
            return DraftBlock(tokens=batch.ids.new_zeros(batch.size, 0), probs=None,
                              num_per_row=(0,) * batch.size, num_forwards=0)
        tokens = torch.tensor([drafts + [PADDING_DRAFT] * (gamma - len(drafts)) for drafts in found],
                              dtype=torch.long, device=self.output_device)
        asks_policy = policy is not None and policy.decides_per_token and gamma > 1
        reads_probs = asks_policy and policy.reads_draft_probs
        probs = None
        if self.return_probs or reads_probs:
            probs = torch.zeros(batch.size, gamma, self.vocab_size, device=self.output_device)
            probs.scatter_(-1, tokens[..., None], 1.0)
        if asks_policy:
            # As `ModelDrafter` asks it: after each draft but the last, with q of the rows still decoding.
            decoding_rows = None if all(batch.decoding) else torch.tensor(
                [i for i, decoding in enumerate(batch.decoding) if decoding], device=self.output_device
            )
            for index in range(1, gamma):
                q = None
                if reads_probs:
                    q = probs[:, index - 1] if decoding_rows is None else probs[decoding_rows, index - 1]
                if not policy.keep_drafting(index, q):
                    gamma = index
                    tokens = tokens[:, :gamma]
                    probs = probs[:, :gamma] if probs is not None else None
                    break
        for index in range(gamma):
            batch.write_draft(index, tokens[:, index])
        return DraftBlock(
            tokens=tokens,
            probs=probs if self.return_probs else None,
            num_per_row=tuple(min(len(drafts), gamma) for drafts in found),
            num_forwards=0,
        )
