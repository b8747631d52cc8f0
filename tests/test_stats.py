"""AcceptanceStats arithmetic: derived rates and merging across calls."""

import pytest
import torch

from hf_semspec.stats import AcceptanceStats


def test_derived_rates_on_worked_counts():
    stats = AcceptanceStats(
        num_target_forwards=4, num_drafted=12, num_accepted=6, num_new_tokens=10,
        drafted_per_position=[4, 4, 4], accepted_per_position=[3, 2, 1],
    )
    assert stats.mean_accepted_length == 2.5  # 10 tokens / 4 forwards
    assert stats.mean_accepted_drafts == 1.5
    assert stats.acceptance_rate == 0.5
    assert stats.per_position_acceptance == [0.75, 0.5, 0.25]
    assert stats.to_dict()["mean_accepted_length"] == 2.5


def test_merge_pads_positions():
    a = AcceptanceStats(2, 6, 3, 5, [2, 2, 2], [2, 1, 0])
    b = AcceptanceStats(1, 5, 5, 6, [1, 1, 1, 1, 1], [1, 1, 1, 1, 1])
    merged = a + b
    assert merged.num_target_forwards == 3 and merged.num_new_tokens == 11
    assert merged.drafted_per_position == [3, 3, 3, 1, 1]
    assert merged.accepted_per_position == [3, 2, 1, 1, 1]


def test_empty_stats_have_zero_rates():
    assert AcceptanceStats().mean_accepted_length == 0.0 and AcceptanceStats().acceptance_rate == 0.0


def test_rounds_recorded_with_varying_draft_length():
    stats = AcceptanceStats()
    stats.record_round(2, 1, 2)
    stats.record_round(4, 4, 5)
    stats.record_round(0, 0, 1)
    assert stats.drafted_per_position == [2, 2, 1, 1]
    assert stats.accepted_per_position == [2, 1, 1, 1]
    assert (stats.num_target_forwards, stats.num_drafted, stats.num_accepted, stats.num_new_tokens) == (3, 6, 5, 8)
    assert stats.per_position_acceptance == pytest.approx([1.0, 0.5, 1.0, 1.0])
    # The rounds in order: what a draft-length policy chose, and what the rule kept of each.
    assert stats.drafted_per_round == [2, 4, 0]
    assert stats.accepted_per_round == [1, 4, 0]


def test_a_round_cut_by_the_output_s_end_keeps_the_rule_s_verdicts():
    stats = AcceptanceStats()
    stats.record_round(5, 4, 2)  # an EOS at the second draft: 2 tokens output, 4 drafts accepted by the rule
    assert (stats.num_accepted, stats.num_new_tokens, stats.accepted_per_position) == (4, 2, [1, 1, 1, 1, 0])


def test_stats_of_several_calls_sum():
    # sum() starts from 0: without __radd__ it needed start=AcceptanceStats().
    a = AcceptanceStats(4, 20, 8, 12, [4, 4, 4, 4, 4], [3, 2, 1, 1, 1])
    b = AcceptanceStats(2, 10, 10, 12, [2, 2, 2, 2, 2], [2, 2, 2, 2, 2])
    assert sum([a, b]) == a + b and sum([a]) == a


def test_a_batch_s_statistics_sum_its_rows_with_one_forward_per_round():
    # Row 0 took part in 3 rounds, row 1 left after 2 (its EOS): 3 batched forwards, not 5.
    first, second = AcceptanceStats(), AcceptanceStats()
    for row, rounds in ((first, [(3, 1, 2), (3, 3, 4), (3, 0, 1)]), (second, [(3, 2, 3), (3, 3, 2)])):
        for drafted, accepted, kept in rounds:
            row.record_round(drafted, accepted, kept)
    total = AcceptanceStats.of_batch([first, second])
    assert total.num_target_forwards == 3
    assert (total.num_drafted, total.num_accepted, total.num_new_tokens) == (15, 9, 12)
    assert total.drafted_per_position == [5, 5, 5] and total.accepted_per_position == [4, 3, 2]
    assert total.drafted_per_round == [6, 6, 3] and total.accepted_per_round == [3, 6, 0]
    # Two figures apart: the batch's tokens per forward (12 / 3), and τ per row's forward, pooled over the rows
    # (12 tokens over the 3 + 2 forwards the rows took part in): what the two prompts give one by one, merged.
    assert total.tokens_per_forward == 4.0
    assert total.num_row_forwards == 5 and total.mean_accepted_length == 12 / 5
    assert (first + second).mean_accepted_length == total.mean_accepted_length
    assert first.mean_accepted_length == first.tokens_per_forward == 7 / 3  # one row: the same figure
    # Merged with a one-row call, and through a file written before `num_row_forwards` (filled from the forwards).
    merged = total + second
    assert merged.num_row_forwards == 7 and merged.to_dict()["mean_accepted_length"] == 17 / 7
    old_file = {k: v for k, v in second.to_dict().items() if k in AcceptanceStats.__dataclass_fields__}
    del old_file["num_row_forwards"]
    assert AcceptanceStats(**old_file).mean_accepted_length == second.mean_accepted_length


def test_merged_stats_keep_each_calls_rounds_in_order():
    a = AcceptanceStats(2, 6, 3, 5, [2, 2, 2], [2, 1, 0], drafted_per_round=[3, 3], accepted_per_round=[2, 1])
    b = AcceptanceStats(1, 5, 5, 6, [1] * 5, [1] * 5, drafted_per_round=[5], accepted_per_round=[5])
    merged = a + b
    assert merged.drafted_per_round == [3, 3, 5] and merged.accepted_per_round == [2, 1, 5]
    assert (b + a).drafted_per_round == [5, 3, 3]
    assert merged.to_dict()["accepted_per_round"] == [2, 1, 5]
