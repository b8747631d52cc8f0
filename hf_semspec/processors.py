"""Logits processors over several positions and rows at once.

Plain decoding calls the processors once per step on `(batch, vocab)` scores, with the sequence so far. The
speculative loop has scores for several positions of several rows (a verify forward: `(batch, γ + 1, vocab)`), each
extending its own prefix. A processor that reads neither the prefix nor the step (temperature, top-k, top-p, min-p,
typical, ε and η sampling, top-h, suppressed tokens, NaN removal, log-softmax normalization) transforms each row of
scores alone, so it runs once over all positions; the others (repetition penalty, n-gram bans, minimum length, bad
words, sequence bias, watermarks, a user's own) run position by position, and row by row where there are several rows,
on the prefix each one extends (its left padding included, as in plain batched decoding), each row with its own copy
of a processor that holds per-row state (the repetition penalty's count of each row's padding). The list keeps its
order: it is split into runs of consecutive processors of each kind.
"""

from __future__ import annotations

import copy

import torch
from transformers import LogitsProcessorList
from transformers.generation.logits_process import (
    EncoderRepetitionPenaltyLogitsProcessor,
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    InfNanRemoveLogitsProcessor,
    LogitNormalization,
    MinPLogitsWarper,
    PrefixConstrainedLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
    SynthIDTextWatermarkLogitsProcessor,
    TemperatureLogitsWarper,
    TopHLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from .batch import DecodingBatch
from .errors import invalid_value

# Processors whose output row depends on that row of scores alone (checked by exact type: a subclass may read more).
ROW_WISE_PROCESSORS = (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TopHLogitsWarper,
    MinPLogitsWarper,
    TypicalLogitsWarper,
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    InfNanRemoveLogitsProcessor,
    LogitNormalization,
    SuppressTokensLogitsProcessor,
)

# Processors that hold one entry per row of the batch they were built for: called row by row, they would read row 0.
_BATCH_SHAPED_PROCESSORS = {
    PrefixConstrainedLogitsProcessor: "prefix_allowed_tokens_fn (it is called with the row's index in the batch)",
    EncoderRepetitionPenaltyLogitsProcessor: "encoder_repetition_penalty (it holds the prompts of the whole batch)",
}


def is_row_wise(processor) -> bool:
    return type(processor) in ROW_WISE_PROCESSORS


def check_processors(processors: LogitsProcessorList, batch_size: int) -> None:
    """Refuses the processors the loop cannot call as plain decoding does.

    - Processors that keep state from call to call: the loop calls the processors once per drafted and once per
      verified position, rejected drafts included, so a processor that counts its calls or remembers the contexts it
      saw (SynthID's watermark) would see other calls than plain decoding makes: its output, and the text's
      distribution, would differ from plain sampling even with `exact`.
    - With several rows, processors that keep per-row state of their own (`_BATCH_SHAPED_PROCESSORS`).
    """
    for processor in processors:
        if isinstance(processor, SynthIDTextWatermarkLogitsProcessor):
            raise invalid_value(
                "watermarking_config",
                "a SynthIDTextWatermarkingConfig (or its logits processor)",
                "None or a WatermarkingConfig with an acceptance rule (SynthID's processor keeps state per call, "
                "which the speculative loop's extra calls would corrupt)",
                "drop the SynthID watermark, or generate without assistant_model and acceptance",
            )
        what = _BATCH_SHAPED_PROCESSORS.get(type(processor))
        if what is not None and batch_size > 1:
            raise invalid_value(
                "input_ids.shape[0] (batch size)", batch_size,
                f"1 with {what}, which a speculative batch cannot call per row",
                "call generate() once per prompt, or drop that option",
            )


def _runs(processors: LogitsProcessorList) -> list[tuple[bool, LogitsProcessorList]]:
    """Consecutive processors grouped by `is_row_wise`, in order."""
    runs: list[tuple[bool, LogitsProcessorList]] = []
    for processor in processors:
        row_wise = is_row_wise(processor)
        if not runs or runs[-1][0] != row_wise:
            runs.append((row_wise, LogitsProcessorList()))
        runs[-1][1].append(processor)
    return runs


def _for_one_row(processor, row: int):
    """`processor` as it applies to row `row` alone. transformers' repetition penalty holds each row's count of left
    padding (`prompt_ignore_length`, a tensor over the batch), which it does not penalize: a row's own copy takes its
    count. Every other processor is shared (those that hold batch-shaped state are refused before decoding)."""
    ignore = getattr(processor, "prompt_ignore_length", None)
    if type(processor) is RepetitionPenaltyLogitsProcessor and isinstance(ignore, torch.Tensor):
        own = copy.copy(processor)
        own.prompt_ignore_length = int(ignore[row])
        return own
    return processor


class BatchProcessors:
    """A `LogitsProcessorList` applied to scores of several positions and rows (see the module docstring).

    Args:
        processors (`LogitsProcessorList`): as transformers prepared them for the call.
        batch_size (`int`): the rows of the call (`DecodingBatch.rows` indexes them).
    """

    def __init__(self, processors: LogitsProcessorList, batch_size: int):
        check_processors(processors, batch_size)
        self.processors = processors
        self.runs = _runs(processors)
        # Per original row, its own copy of each run that reads prefixes (several rows only).
        self.row_runs = [
            [LogitsProcessorList(_for_one_row(p, row) for p in run) for _, run in self.runs] for row in range(batch_size)
        ] if batch_size > 1 else None

    def __len__(self) -> int:
        return len(self.processors)

    def __call__(self, batch: DecodingBatch, logits: torch.FloatTensor, offset: int) -> torch.FloatTensor:
        """The processed scores of `logits` (`(batch, positions, vocab)`; returned as a new tensor, `logits`
        untouched). Position p of row r extends `batch.prefix(r, offset + p)`: the row's tokens and its first
        `offset + p` drafts."""
        if not self.runs:
            return logits
        size, positions, vocab = logits.shape
        processed = logits.clone()
        for k, (row_wise, run) in enumerate(self.runs):
            if row_wise:  # they read no prefix: any ids of the right batch size do
                flat = processed.view(size * positions, vocab)
                processed = run(batch.tokens[:1, :1].expand(size * positions, 1), flat).view(size, positions, vocab)
                continue
            for p in range(positions):
                if self.row_runs is None:
                    processed[:, p] = run(batch.prefix(0, offset + p), processed[:, p])
                    continue
                for r in range(size):
                    if not batch.decoding[r]:  # a finished row kept for a static cache's shape: its scores are not read
                        continue
                    own = self.row_runs[batch.rows[r]][k]
                    processed[r : r + 1, p] = own(batch.prefix(r, offset + p), processed[r : r + 1, p])
        return processed
