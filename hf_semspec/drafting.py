"""Drafting: the assistant model proposes tokens autoregressively with its own KV cache (`ModelDrafter`); without one,
prompt lookup copies them from the context (`hf_semspec.ngram.NgramDrafter`, the same interface)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch
from torch.profiler import record_function
from transformers.cache_utils import Cache, DynamicCache

from ._transformers_compat import CACHE_ARGUMENT
from .batch import DecodingBatch
from .draft_block import PADDING_DRAFT, DraftBlock
from .draft_length import DraftLengthPolicy
from .model_calls import CachedModel
from .processors import BatchProcessors
from .rules.base import residual_distribution, sample_categorical, sample_uniform

if TYPE_CHECKING:
    from .ngram import RowContexts

class ModelDrafter:
    """Drafts with a causal LM sharing the target's tokenizer.

    The draft distribution goes through the same logits processors as the target (temperature, top-k/p, repetition
    penalty, min_new_tokens, …), each position seeing the prefix it extends, so that q and p are comparable.

    A draft whose vocabulary differs from the target's by padding only (rows past the tokenizer's last id, checked
    before decoding: `generation._check_vocabularies`) drafts over the ids both share: its logits are cut to the
    target's width, or widened with −inf, so q gives the target's padding ids probability 0 and every draft is an id
    both models have. The target can still emit one of its own padding ids (a sample from its tiny mass there, or a
    processor that forces it): the sequence keeps it, and the draft is fed its own last id, `vocab_size − 1`, in its
    place (`CachedModel.max_input_id`): a padding row of the draft too where it is padded, the nearest thing it has
    to a token no text produces. Only the draft's view changes, never the output.

    Pruned-vocabulary drafters (see `hf_semspec.drafters`) are supported through two optional attributes of the
    draft model: `kept_token_ids` (`torch.LongTensor` of shape `(K,)`), the target ids of its K output logits, and,
    for RDK, `rdk_indices` / `rdk_weights` (shapes `(K, m + 1)`), a sparse row-stochastic kernel from each kept token
    to target ids. Drafts and their distribution are returned in target ids, so the loop and every rule see the
    target's vocabulary only.

    **Multi-level drafting** (`contexts`, from `generate(assistant_model=draft, prompt_lookup_num_tokens=k,
    max_matching_ngram_size=n)`; the FLy paper's multi-level acceleration, arXiv 2511.22972, after `draft_with_ngram`
    in AMD-AGI/FLy): each draft step first looks up up to k candidates c₁…c_w for each row's next tokens (prompt
    lookup over the row's context and this round's drafts so far, `hf_semspec.ngram`), and the draft verifies them in
    one forward over its last token and the w candidates, which gives q₀…q_w, the draft's distribution at each
    position given the candidates before it:

    - greedy drafting: row r confirms the longest prefix with cⱼ₊₁ = argmax qⱼ, mᵣ candidates;
    - sampled drafting: speculative sampling with the one-hot proposal cⱼ₊₁ (accept with probability qⱼ(cⱼ₊₁)),
      mᵣ = the candidates accepted before the first rejection.

    With m = min over the decoding rows of mᵣ, the step drafts c₁…c_m and then, at position m, each row's own token:
    argmax q_m (greedy); with sampling, c_{m+1} where row r accepted it, else a draw from q_m without c_{m+1},
    norm(max(q_m − 1[c_{m+1}], 0)), where it rejected it, else (no candidate there) a draw from q_m. So m + 1 drafts
    cost one forward, the drafts are token for token the draft's own greedy ones, or distributed as its autoregressive
    q, and the rule is handed q₀…q_m as for any draft. The draft's cache is rolled back past the first unconfirmed
    candidate. A step where a decoding row's lookup finds nothing (m would be 0) drafts one token the usual way, and
    candidates past the fewest any decoding row found are left out (no row could confirm them). Each step reads the
    drafts on the host, since the next lookup searches them (greedy: one read per draft forward, m and the drafts
    together; sampled: two); on static caches the candidate block is always k wide (padded), so the compiled forward
    keeps fixed shapes (1 + k, and 2 + k for a round's first step), and a step that would run past the caches' end
    drafts one token instead. The drafts are those of the draft alone up to floating point: a forward over 1 + w
    tokens may round differently from w + 1 forwards of one, which can flip a near-tie (bf16 on a GPU).

    **A compiled round** (`compiled_round`, on static caches where the forward is compiled): greedy drafts with no
    logits processors, no per-token policy and no q to keep (greedy `exact`, `fly`, `ears`, `dropmatch` voting; not
    sampling, not multi-level drafting) take all γ draft steps of a round in one call of `greedy_steps` compiled, one
    graph of γ forwards, unrolled (on a GPU with `mode="reduce-overhead"`: one CUDA graph replay a round, where the
    step by step path makes γ compiled calls with host work between them; see the note above `greedy_pick` on why
    not a nested step region). Its γ is the policy's length (`round_width`); a round
    the loop cut shorter near `max_length` runs the same graph, once a full round ran, and keeps the first drafts (a
    few draft forwards wasted, rather than two more graphs compiled in the call's last round), and a round the policy
    chose shorter or longer drafts step by step. The drafts are the step-by-step path's, up to floating point (the
    first round's prompt is fed in two forwards, the prompt and then its last two slots, where the step-by-step path
    feeds it in one, which can round differently and flip a near-tie in bf16).

    Args:
        model (`PreTrainedModel`): the draft (assistant) model; may live on another device or dtype than the target.
        logits_processor (`BatchProcessors`): the processors transformers prepared for this `generate()` call, applied
            row by row where they read the prefix.
        do_sample (`bool`): draw drafts from q (`True`) or take argmax q (`False`).
        return_probs (`bool`): keep q for the verifier (needed when sampling or when the rule asks for it).
        output_device (`torch.device`): where drafts and q are returned (the target's device).
        vocab_size (`int`): the target's vocabulary size (width of the distributions returned).
        redistribute (`bool`): draw from the RDK-redistributed r = q·K instead of q (needs `rdk_indices`).
        stop_token_ids (`frozenset[int]`, *optional*): EOS ids. A round that asks a per-token policy ends once every
            row has drafted one of them: nothing drafted after an EOS is ever used (an accepted EOS ends the row, a
            rejected one discards what follows), and that policy syncs with the host per token anyway. Fixed-budget
            rounds draft on without the check, which would cost them a sync per token.
        cache (`Cache`, *optional*): the draft's KV cache (default: a `DynamicCache`); a static one with `compiled`.
        compiled (`Callable`, *optional*): the draft's compiled forward for its fixed-shape steps.
        contexts (`RowContexts`, *optional*): multi-level drafting: each row's context and the lookup's k and n.
        compiled_round (`Callable`, *optional*): `greedy_steps` compiled, for rounds of `round_width` greedy drafts
            (the class docstring); used only where those apply. Needs `compiled` and a static cache with
            `round_width − 1` slots past the batch's (a round cut short still runs all its steps).
        round_width (`int`, *optional*): the γ of `compiled_round`'s one graph (the policy's length; None: no
            compiled round).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        logits_processor: BatchProcessors,
        do_sample: bool,
        return_probs: bool,
        output_device: torch.device,
        vocab_size: int,
        redistribute: bool = False,
        stop_token_ids: frozenset[int] = frozenset(),
        cache: Cache | None = None,
        compiled=None,
        contexts: RowContexts | None = None,
        compiled_round: Callable | None = None,
        round_width: int | None = None,
    ):
        self.model = model
        self.logits_processor = logits_processor
        self.do_sample = do_sample
        self.return_probs = return_probs
        self.output_device = output_device
        self.vocab_size = vocab_size
        self.stop_token_ids = stop_token_ids
        if cache is None:
            cache = DynamicCache(config=model.config)
            cache.activate_past_recording()
        # The draft's own rows (a pruned drafter's backbone's): ids past them, a target's padding ids, are fed as its
        # last row (the class docstring).
        draft_vocab_size = model.config.get_text_config().vocab_size
        self.runner = CachedModel(
            model, cache, compiled=compiled, static=not isinstance(cache, DynamicCache),
            max_input_id=draft_vocab_size - 1 if draft_vocab_size < vocab_size else None,
        )
        self.contexts = contexts
        # How far a multi-level step's candidate block may reach past the round's budget: on static caches the block
        # is always k wide (fixed shapes; the step checks the caches' room); on dynamic ones it holds at most the
        # drafts left but one, within the budget.
        self.extra_slots = contexts.lookup.num_tokens if contexts is not None else 0
        # A compiled draft catches up on the last two slots of each round (the one a fully accepted round drafted but
        # never fed, and the target's token), so that its first forward always has the same shape.
        self.catch_up = 2 if compiled is not None else 1
        kept = getattr(model, "kept_token_ids", None)
        self.kept_token_ids = None if kept is None else kept.to(output_device)
        # The rule checked before decoding that a redistributing drafter has its kernel (check_assistant_model).
        self.rdk_kernel = (
            (model.rdk_indices.to(output_device), model.rdk_weights.to(output_device).float()) if redistribute else None
        )
        # The compiled round drafts argmax q with nothing between the steps: no processors, no q kept, no lookup (a
        # drafter with one uses it in the rounds it drafts alone: `draft(multi_level=False)`).
        fuses = not (do_sample or return_probs or redistribute or len(logits_processor) > 0)
        self.compiled_round = compiled_round if fuses and compiled is not None and round_width else None
        self.round_width = round_width
        # A round cut short runs the compiled round only once a full one has compiled it (not in a call's last round),
        # and only where its discarded steps stay within the draft's positions (learned absolute ones end there).
        self.ran_full_round = False
        self.max_positions = getattr(model.config.get_text_config(), "max_position_embeddings", None)
        self.round_pick = {"vocab_size": vocab_size,
                           "kept_token_ids": None if kept is None else kept.to(model.device)}

    @property
    def cache(self) -> Cache:
        return self.runner.cache

    def append_tokens(self, row: int, tokens: list[int]) -> None:
        """Row `row` (its index in the caller's input) took `tokens` this round: the draft's cache catches up from the
        batch's slots when it next drafts; multi-level drafting's contexts take them now."""
        if self.contexts is not None:
            self.contexts.append_tokens(row, tokens)

    def keep_rows(self, index: torch.LongTensor) -> None:
        """Keeps the batch rows at `index` in the draft's cache (a dynamic batch whose finished rows leave)."""
        self.runner.keep_rows(index)

    def _next_tokens(
        self, batch: DecodingBatch, index: int, logits: torch.FloatTensor, keep_probs: bool, draw: bool | None = None
    ) -> tuple[torch.LongTensor, torch.FloatTensor | None]:
        """The tokens drafted at draft positions `index, index + 1, …`, `(batch, positions)`, and, if `keep_probs`,
        the distributions they were drawn from, `(batch, positions, vocab)`.

        `logits` are the draft's raw logits `(batch, positions, draft vocab)`, over the kept ids for a pruned drafter;
        position j's processors see the prefix through draft `index + j − 1` (already written in the batch). `draw`:
        sample from q (default: `do_sample`); `False` takes argmax q."""
        draw = self.do_sample if draw is None else draw
        processors = len(self.logits_processor) > 0
        if not (processors or keep_probs or draw or self.rdk_kernel is not None):
            return greedy_pick(logits, self.vocab_size, self.kept_token_ids), None  # no full-vocabulary tensor
        if self.kept_token_ids is None and logits.shape[-1] != self.vocab_size:
            logits = self._on_target_vocabulary(logits)
        if self.kept_token_ids is not None:
            # Tokens the drafter cannot propose get −inf, so processors and q live on the target's vocabulary.
            full = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
            logits = full.index_copy(logits.dim() - 1, self.kept_token_ids, logits)
        if processors:
            logits = self.logits_processor(batch, logits, index)
        if not (keep_probs or draw or self.rdk_kernel is not None):
            return logits.argmax(-1), None
        q = logits.softmax(-1)
        if self.kept_token_ids is not None:
            # Processors may allow no kept token (constrained decoding whose allowed tokens were all pruned): that row
            # is all −inf and its softmax NaN. Draft from the kept tokens uniformly there: any q keeps verification
            # lossless, and the target, which gives these drafts probability 0, replaces the first with its own.
            q = torch.where(q.isnan(), self._uniform_over_kept(q), q)
        if self.rdk_kernel is not None:
            q = redistribute(q.flatten(0, -2), self.kept_token_ids, *self.rdk_kernel).view(q.shape)
        token = sample_categorical(q, None) if draw else q.argmax(-1)
        return token, q

    def _on_target_vocabulary(self, logits: torch.FloatTensor) -> torch.FloatTensor:
        """`(..., draft vocab)` logits → `(..., vocab_size)`: the draft's padding ids past the target's cut off,
        the target's padding ids past the draft's given −inf (probability 0 in q, never drafted)."""
        width = logits.shape[-1]
        if width > self.vocab_size:
            return logits[..., : self.vocab_size]
        return torch.nn.functional.pad(logits, (0, self.vocab_size - width), value=float("-inf"))

    def _uniform_over_kept(self, like: torch.Tensor) -> torch.Tensor:
        """`(vocab,)`: 1/K on each of the K kept ids, 0 elsewhere, in `like`'s dtype and device."""
        uniform = like.new_zeros(like.shape[-1])
        return uniform.index_fill_(0, self.kept_token_ids, 1.0 / len(self.kept_token_ids))

    @record_function("hf_semspec.draft")
    def draft(self, batch: DecodingBatch, max_tokens: int, policy: DraftLengthPolicy | None = None,
              cut_short: bool = False, multi_level: bool = True) -> DraftBlock:
        """Drafts up to `max_tokens` tokens into the slots after `batch.num_slots` (and after each row's tokens).
        `cut_short`: the loop cut the round below the policy's length (near `max_length`), which may then run the
        compiled round (the class docstring). `multi_level=False`: a drafter with `contexts` drafts this round
        alone, one forward per draft (`drafting="auto"`, `hf_semspec.drafting_choice`).

        A per-token `policy` may end the round early (`keep_drafting`), which costs it one host sync per token; it
        reads q of the rows still decoding only (a finished row that stays for a static cache's shape drafts on, but
        its q says nothing of this round). Such a round also ends once every row drafted an EOS (`stop_token_ids`),
        read after the policy's decision, when that sync has already waited for the token. Without one, the draft
        model alone makes no host sync of its own (with a padded prompt, transformers' mask preparation reads the 2D
        mask once per forward, as it does in plain decoding); multi-level drafting reads each step's drafts (the
        class docstring).
        """
        start = batch.num_slots
        asks_policy = policy is not None and policy.decides_per_token
        keep_probs = self.return_probs or (asks_policy and policy.reads_draft_probs)
        self.runner.rewind(start - self.catch_up)
        contexts = self.contexts if multi_level else None
        if contexts is None and self._runs_compiled_round(start, max_tokens, asks_policy, cut_short):
            return self._compiled_round(batch, start, max_tokens)
        tokens, probs = [], []
        # Rows with nothing more to draft for: finished ones (kept for a static cache's shape) and, read per token
        # below, those that drafted an EOS.
        done = [not decoding for decoding in batch.decoding]
        decoding_rows = None if not asks_policy or all(batch.decoding) else torch.tensor(
            [i for i, decoding in enumerate(batch.decoding) if decoding], device=self.output_device
        )
        num_forwards = num_wide_forwards = 0
        from_ngram: list[bool] = []  # per draft: a candidate the draft confirmed (multi-level drafting)
        if contexts is not None:
            contexts.begin_round(batch.rows)  # this round's drafts extend the contexts until the round ends
        try:
            while len(tokens) < max_tokens:
                index = len(tokens)
                step = None
                if contexts is not None:
                    step = self._multi_level_step(batch, start, index, max_tokens - index, keep_probs)
                    num_wide_forwards += step is not None
                if step is None:  # one draft from one forward
                    logits = self.runner.forward(batch, start + index, 1)[:, -1:].to(self.output_device)
                    step = _Step(*self._next_tokens(batch, index, logits, keep_probs))
                num_forwards += 1
                stop = False
                for j, (token, q) in enumerate(zip(step.drafts.unbind(1), [None] * step.drafts.shape[1]
                                                   if step.probs is None else step.probs.unbind(1))):
                    batch.write_draft(len(tokens), token)
                    tokens.append(token)
                    probs.append(q)
                    from_ngram.append(j < step.num_candidates)
                    if asks_policy and len(tokens) < max_tokens:
                        # The policy's read first: it syncs on q, which comes after the token, so the EOS read below
                        # then waits for nothing (the other order would wait twice per token).
                        if not policy.keep_drafting(
                            len(tokens), q if q is None or decoding_rows is None else q[decoding_rows]
                        ):
                            stop = True
                            break
                        if self.stop_token_ids:
                            done = [d or t in self.stop_token_ids for d, t in zip(done, token.tolist())]
                            if all(done):
                                stop = True
                                break
                if stop:
                    break
                if contexts is not None and len(tokens) < max_tokens:
                    # The next step's lookup searches this round's drafts too (read now, unless the step read them).
                    new = step.host_drafts if step.host_drafts is not None else step.drafts.tolist()
                    for row, drafts in zip(batch.rows, new):
                        contexts.append_tokens(row, drafts)
        finally:
            if contexts is not None:
                contexts.end_round(batch.rows)
        empty = batch.ids.new_zeros(batch.size, 0)
        return DraftBlock(
            tokens=torch.stack(tokens, dim=1) if tokens else empty,
            probs=torch.stack(probs, dim=1) if (self.return_probs and probs) else None,
            # one forward per drafted token (the first also feeds the slots it has not seen), fewer with multi-level
            # drafting
            num_forwards=num_forwards,
            from_ngram=tuple(from_ngram) if contexts is not None else None,
            num_wide_forwards=num_wide_forwards,
        )

    def _runs_compiled_round(self, start: int, max_tokens: int, asks_policy: bool, cut_short: bool) -> bool:
        """Whether this round drafts in one call of the compiled round: one of its kind (`compiled_round`), with no
        per-token policy, at least one slot before the catch-up cached or to prefill (the compiled graph never meets
        an empty cache), and either at its γ or cut short of it by the loop after a full one ran."""
        if self.compiled_round is None or asks_policy or start - self.catch_up < 1:
            return False
        if self.runner.cached not in (0, start - self.catch_up):
            return False
        if max_tokens == self.round_width:
            return True
        last_position = start + self.round_width - 2  # of the round's last step, kept or not
        return (cut_short and 0 < max_tokens < self.round_width and self.ran_full_round
                and (self.max_positions is None or last_position < self.max_positions))

    def _compiled_round(self, batch: DecodingBatch, start: int, max_tokens: int) -> DraftBlock:
        """The round's drafts from one call of the compiled round: the prompt first where nothing is cached yet
        (eagerly: a shape seen once), then `round_width` greedy steps over the catch-up slots and each draft, of which
        the round keeps the first `max_tokens`."""
        first = start - self.catch_up
        if self.runner.cached == 0:
            self.runner.forward(batch, first, 1)  # the prompt but its catch-up slots (the first forward is eager)
        batch.open_draft_slots(max_tokens)  # the later steps attend to the drafts before them
        drafts = self.runner.greedy_round(batch, start, self.round_width, self.compiled_round, **self.round_pick)
        # (a copy: the compiled call's output buffer is overwritten by its next replay)
        drafts = drafts[:, :max_tokens].to(self.output_device, copy=True)
        batch.write_drafts(drafts)
        self.ran_full_round = self.ran_full_round or max_tokens == self.round_width
        return DraftBlock(tokens=drafts, probs=None, num_forwards=self.round_width)

    def _multi_level_step(
        self, batch: DecodingBatch, start: int, index: int, remaining: int, keep_probs: bool
    ) -> _Step | None:
        """One multi-level draft step (the class docstring) at draft position `index` of the round that drafts into
        slots from `start`, with at most `remaining` drafts left: the m + 1 drafts `(batch, m + 1)`, their q if
        `keep_probs`, and m. None where it would not pay (fewer than two drafts left, a decoding row without a
        candidate, which would hold m at 0, or no room in static caches): the caller drafts one token the usual way.

        Greedy, its one host read takes m and the drafts together; sampled, the drafts are read after m is."""
        wanted = min(self.extra_slots, remaining - 1)  # the step's own token comes after the candidates
        if wanted < 1:
            return None
        found = [
            self.contexts.found(row, wanted) if decoding else []
            for row, decoding in zip(batch.rows, batch.decoding)
        ]
        # No row confirms more than the decoding row with the fewest candidates has: candidates past them are not
        # worth a forward (on static caches the block keeps its width, one compiled shape).
        fewest = min(len(candidates) for candidates, decoding in zip(found, batch.decoding) if decoding)
        if fewest == 0:
            return None
        width = fewest
        if self.runner.static:
            width = self.extra_slots
            if start + index + width > batch.slot_capacity:
                return None
        found = [c[:width] for c in found]
        candidates = torch.tensor([c + [PADDING_DRAFT] * (width - len(c)) for c in found], dtype=torch.long,
                                  device=self.output_device)
        for j in range(width):
            batch.write_draft(index + j, candidates[:, j])
        logits = self.runner.forward(batch, start + index + width, width + 1).to(self.output_device)
        sampled = self.do_sample
        greedy, q = self._next_tokens(batch, index, logits, keep_probs or sampled, draw=False)
        counts = torch.tensor([len(c) for c in found], device=self.output_device)
        if sampled:  # speculative sampling of the one-hot proposal c: accepted with probability q(c)
            accept_at = q[:, :width].gather(-1, candidates[..., None])[..., 0]
            agrees = sample_uniform(accept_at.shape, accept_at.device, None) < accept_at
        else:
            agrees = greedy[:, :width] == candidates
        agrees &= torch.arange(width, device=self.output_device)[None, :] < counts[:, None]
        matched = agrees.long().cumprod(-1).sum(-1)
        if not sampled:  # the step's host read: m and the drafts (argmax q, the candidates where confirmed)
            read = torch.cat([matched[:, None], greedy], dim=1).tolist()
            m = min(row[0] for row, decoding in zip(read, batch.decoding) if decoding)
            self.runner.rewind(start + index + m)  # the cache keeps the confirmed candidates only
            return _Step(greedy[:, : m + 1], q[:, : m + 1] if keep_probs else None, m,
                         host_drafts=[row[1 : m + 2] for row in read])
        m = min(c for c, decoding in zip(matched.tolist(), batch.decoding) if decoding)  # the step's host read
        if m == width:  # every row confirmed its whole block: its next token is a draw from q_m
            own = sample_categorical(q[:, m], None)
        else:
            proposal = torch.zeros_like(q[:, m]).scatter_(-1, candidates[:, m : m + 1], 1.0)
            rejected = ((matched == m) & (counts > m))[:, None]
            draw = sample_categorical(torch.where(rejected, residual_distribution(q[:, m], proposal), q[:, m]), None)
            own = torch.where(matched > m, candidates[:, m], draw)
        self.runner.rewind(start + index + m)
        return _Step(torch.cat([candidates[:, :m], own[:, None]], dim=1), q[:, : m + 1] if keep_probs else None, m)


@dataclass
class _Step:
    """The drafts of one draft forward: `drafts` `(batch, n)`, their q `(batch, n, vocab)` (or None), the first
    `num_candidates` of them confirmed n-gram candidates (multi-level drafting), and the drafts as the host read them
    where the step already read them (`list[list[int]]`, else None)."""

    drafts: torch.LongTensor
    probs: torch.FloatTensor | None
    num_candidates: int = 0
    host_drafts: list[list[int]] | None = None


def greedy_steps(
    model: torch.nn.Module,
    cache: Cache,
    input_ids: torch.LongTensor,
    attention_mask: torch.LongTensor | None,
    position_ids: torch.LongTensor | None,
    increment: torch.LongTensor,
    num_steps: int,
    max_input_id: int | None,
    keep_one_logit: bool,
    vocab_size: int,
    kept_token_ids: torch.LongTensor | None,
) -> torch.LongTensor:
    """`num_steps` greedy draft steps in one function, for `torch.compile` to make one graph of a round's γ forwards
    (`ModelDrafter`'s compiled round): no host work, no host value between them.

    Step 1 feeds `input_ids`, the slots the draft has not seen; step i + 1 feeds step i's token, at the position after
    the last one fed (plus `increment`). Each step's token is `greedy_pick` of its last logit, as `ModelDrafter`'s
    greedy drafts without processors.

    Args:
        model, cache: the draft and its static cache (its write position moves on one slot per token fed).
        input_ids (`torch.LongTensor` of shape `(batch, n)`): the first step's slots (n = the catch-up, 2).
        attention_mask (`torch.LongTensor` of shape `(batch, slots)`, *optional*): the batch's 2D mask at its full
            length, the drafts' slots already open (`DecodingBatch.open_draft_slots`); None with no masked slot.
        position_ids (`torch.LongTensor` of shape `(batch, n)`, *optional*): the first step's positions (None for a
            model that takes none).
        increment (`torch.LongTensor` of shape `(batch, 1)`): the batch's `new_slot_mask`: a drafted slot counts
            1 for a decoding row, 0 for a finished one kept for the shape (masked, so it shifts no position).
        num_steps (`int`): γ; `max_input_id` (`int`, *optional*): the largest id the draft has an embedding row for
            (`CachedModel.max_input_id`); `keep_one_logit` (`bool`): the model takes `logits_to_keep`.
        vocab_size (`int`): the target's vocabulary size; `kept_token_ids` (`torch.LongTensor` of shape `(K,)`,
            *optional*): a pruned drafter's kept ids, on the draft's device.

    Returns:
        `torch.LongTensor` of shape `(batch, num_steps)`: the drafts, in target ids.
    """
    drafts = []
    for _ in range(num_steps):
        token = _greedy_step(model, cache, input_ids, attention_mask, position_ids, keep_one_logit, vocab_size,
                             kept_token_ids)
        drafts.append(token)
        input_ids = token[:, None] if max_input_id is None else token[:, None].clamp_max(max_input_id)
        if position_ids is not None:
            position_ids = position_ids[:, -1:] + increment
    return torch.stack(drafts, dim=1)


def _greedy_step(model, cache, input_ids, attention_mask, position_ids, keep_one_logit, vocab_size, kept_token_ids):
    """One step of `greedy_steps`: the draft's forward over `input_ids` and its argmax in target ids, `(batch,)`."""
    kwargs = {CACHE_ARGUMENT: cache}
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask
    if position_ids is not None:
        kwargs["position_ids"] = position_ids
    if keep_one_logit:
        kwargs["logits_to_keep"] = 1
    return greedy_pick(model(input_ids=input_ids, use_cache=True, **kwargs).logits[:, -1], vocab_size, kept_token_ids)


# The γ steps are unrolled into one graph. torch's hierarchical compilation (`torch.compiler.nested_compile_region`
# around the step, compiled once per shape and stamped out) compiled a 24-layer draft's round about twice as fast on a
# CPU (114 s against 234 s, γ = 5), but under inductor (torch 2.13, CPU) its drafts were not the step-by-step path's:
# the reference pair's round accepted 2.1 tokens where eager accepted 4.9, and a tiny model's rounds differed from the
# second (the output stayed right: the target verifies every draft; aot_eager's drafts were right).
# tests/test_static_cache.py checks the rounds under inductor.


def greedy_pick(logits: torch.FloatTensor, vocab_size: int,
                kept_token_ids: torch.LongTensor | None) -> torch.LongTensor:
    """The draft's greedy tokens in the target's ids, `(...)`, from its raw logits `(..., draft vocab)` with no
    processors: argmax over the target's ids (the draft's padding rows past `vocab_size` cut off; a narrower draft's
    missing ids could never win), or, for a pruned drafter whose K logits are over `kept_token_ids`, the kept id of
    the best (`.to` is a no-op unless the draft's head is on another device than the ids)."""
    if kept_token_ids is not None:
        return kept_token_ids.to(logits.device)[logits.argmax(-1)]
    return logits[..., :vocab_size].argmax(-1)


def redistribute(
    q: torch.FloatTensor, kept_token_ids: torch.LongTensor, indices: torch.LongTensor, weights: torch.FloatTensor
) -> torch.FloatTensor:
    """RDK's redistribution r = q·M with a sparse row-stochastic kernel (Timor et al. 2025, arXiv 2506.03206).

    Args:
        q (`torch.FloatTensor` of shape `(batch, vocab)`): the draft distribution; mass a logits processor put on a
            pruned id (a forced BOS or EOS) stays where it is.
        kept_token_ids (`torch.LongTensor` of shape `(K,)`): the kept ids, the kernel's rows.
        indices (`torch.LongTensor` of shape `(K, m + 1)`), weights (`torch.FloatTensor` of shape `(K, m + 1)`): row k
            sends the mass of `kept_token_ids[k]` to `indices[k]` in proportions `weights[k]` (each row sums to 1).

    Returns:
        `torch.FloatTensor` of shape `(batch, vocab)`: r, a distribution that may put mass on pruned tokens.
    """
    mass = q[:, kept_token_ids]  # (batch, K)
    contributions = (mass[:, :, None] * weights[None]).reshape(q.shape[0], -1)
    # The kept ids' mass moves through the kernel; the rest of q (a processor can force a pruned id) stays, so r sums
    # to 1 (it summed to 0 when a forced BOS put all of q on a pruned id).
    outside_kept = q.index_fill(1, kept_token_ids, 0.0)
    return outside_kept.scatter_add_(1, indices.reshape(1, -1).expand(q.shape[0], -1), contributions)

