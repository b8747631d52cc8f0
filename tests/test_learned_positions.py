"""Models with learned absolute positions (GPT-2: a table of `n_positions` rows) near the end of that table, on every
path of the loop: a slot a row can never accept must not be fed a position past the table (the batch's positions stop
at `max_length − 1`), and the compiled round, whose steps count positions inside the graph, falls back to eager
steps where its discarded steps would pass it. Each case equals stock greedy decoding of the same rows."""

from __future__ import annotations

import pytest
import torch
from conftest import perturbed_copy, tiny_gpt2
from test_static_cache import cpu_compile_config, fresh_compiler  # noqa: F401 (a fixture)

import hf_semspec
from hf_semspec import decoding

POSITIONS = 40


@pytest.fixture(scope="module")
def gpt2():
    target = hf_semspec.attach(tiny_gpt2(seed=0, n_positions=POSITIONS))
    return target, perturbed_copy(target, scale=0.3, seed=2)


def plain_greedy(model, ids, **kwargs):
    return type(model).generate(model, ids, do_sample=False, **kwargs)



def row_split_draft(target, row: int = 1, token: int = 7):
    """A draft that is the target on every row but `row`, where it always proposes `token`: in a batch, the other rows
    accept every draft and race ahead while `row` takes one token a round (its drafts rejected)."""

    class RowSplit(type(target)):
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, **kwargs):
            out = super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                  **kwargs)
            if out.logits.shape[0] > row:
                out.logits[row] = -100.0
                out.logits[row, :, token] = 100.0
            return out

    draft = RowSplit(target.config).eval()
    draft.load_state_dict(target.state_dict())
    return draft


def assert_rows_equal_plain(target, out, ids, mask, max_new_tokens):
    """Each row's new tokens are those of stock greedy decoding of the row alone (its padding removed)."""
    for i in range(ids.shape[0]):
        row = ids[i][mask[i].bool()][None]
        plain = plain_greedy(target, row, max_new_tokens=max_new_tokens)
        new = out[i, ids.shape[1]:]
        assert new[: plain.shape[1] - row.shape[1]].tolist() == plain[0, row.shape[1]:].tolist(), i


@pytest.mark.parametrize("cache_implementation", ["dynamic", "static"])
def test_a_fast_row_s_slots_past_max_length_stay_in_the_table(gpt2, cache_implementation):
    """Row 0 accepts all 8 drafts a round, row 1 none: the batch still drafts 8 for row 1, so row 0's slots pass its
    own max_length − 1 (and the table) near the end. Fed there: IndexError in GPT-2's position table."""
    target, _ = gpt2
    draft = row_split_draft(target)
    ids = torch.randint(4, 128, (2, 8), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    out = target.generate(ids, attention_mask=mask, assistant_model=draft, acceptance="exact", num_assistant_tokens=8,
                          max_new_tokens=POSITIONS - 8, cache_implementation=cache_implementation,
                          return_dict_in_generate=True)
    assert out.sequences.shape[1] == POSITIONS
    assert_rows_equal_plain(target, out.sequences, ids, mask, POSITIONS - 8)
    rows = out.acceptance_stats_per_row
    # the case the test is about: row 0 ran ahead (row 1, alone once row 0 left a dynamic batch, gets the target's
    # drafts from then on)
    assert rows[0].num_accepted > 20 and rows[0].num_target_forwards < rows[1].num_target_forwards


def test_multi_level_drafting_on_static_caches_in_a_batch_stays_in_the_table(gpt2):
    """The k-wide candidate block of a multi-level step on static caches is fed past the budget (fixed shape)."""
    target, draft = gpt2
    row = [5, 9, 14, 22] * 2
    ids = torch.tensor([row, [0, 0] + row[:6]])
    mask = torch.tensor([[1] * 8, [0, 0] + [1] * 6])
    out = target.generate(ids, attention_mask=mask, assistant_model=draft, acceptance="exact", num_assistant_tokens=6,
                          max_new_tokens=POSITIONS - 8, prompt_lookup_num_tokens=8, cache_implementation="static",
                          return_dict_in_generate=True)
    assert out.sequences.shape[1] == POSITIONS
    assert_rows_equal_plain(target, out.sequences, ids, mask, POSITIONS - 8)


PATHS = {
    "dynamic": {},
    "static": {"cache_implementation": "static"},
    "multi-level": {"prompt_lookup_num_tokens": 4},
    "multi-level, static": {"prompt_lookup_num_tokens": 4, "cache_implementation": "static"},
    "prompt lookup alone": {"prompt_lookup_num_tokens": 4, "draft": None},
    "prompt lookup alone, static": {"prompt_lookup_num_tokens": 4, "draft": None, "cache_implementation": "static"},
}


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", ["exact", "fly", "ensemble"])
def test_every_path_runs_to_the_end_of_the_table(gpt2, path, batch, name):
    """max_length = n_positions: every rule and path reaches the table's last row; greedy `exact` (lossless) gives
    each row stock greedy decoding's text."""
    target, draft = gpt2
    options = dict(PATHS[path])
    if "draft" in options:
        draft = options.pop("draft")
        if name == "ensemble":
            pytest.skip("ensemble refuses prompt lookup alone (tests/test_ensemble_rule.py)")
    base = [5, 9, 14, 22, 31, 5, 9, 14]  # a repeat, so that the lookup finds candidates
    ids = torch.tensor([base, [0] + base[1:], [0, 0, 0] + base[3:]][:batch])
    mask = (ids != 0).long()
    if name != "exact":  # a relaxed rule's text may meet an EOS early: every row runs to the table's end
        options["min_new_tokens"] = POSITIONS - 8
    out = target.generate(ids, attention_mask=mask, assistant_model=draft, acceptance=name, num_assistant_tokens=7,
                          max_new_tokens=POSITIONS - 8, return_dict_in_generate=True, **options)
    assert out.sequences.shape[1] == POSITIONS
    if name == "exact":
        assert_rows_equal_plain(target, out.sequences, ids, mask, POSITIONS - 8)


@pytest.mark.slow
def test_the_compiled_round_is_not_run_where_its_last_step_passes_the_table(monkeypatch, fresh_compiler):  # noqa: F811
    """The compiled round's steps count positions inside the graph: a round the loop cut short near max_length still
    runs all γ of them, so where its last step's position is the table's length it drafts step by step instead.
    Built to hit that slot exactly: a target that drafts for itself (every draft accepted, rounds of γ + 1 = 5), an
    8-token prompt, max_length = n_positions = 30: four full rounds to 28 tokens, then a round cut to one draft whose
    compiled γ = 4 steps would feed positions up to 28 + 4 − 2 = 30."""
    positions = 30
    target = hf_semspec.attach(tiny_gpt2(seed=0, n_positions=positions))
    generator = torch.Generator().manual_seed(0)
    for _ in range(100):  # a prompt whose greedy text has no EOS before max_length
        ids = torch.randint(4, 128, (1, 8), generator=generator)
        plain = plain_greedy(target, ids, max_new_tokens=positions - 8)
        if plain.shape[1] == positions:
            break
    made = []
    real = decoding.compiled_round

    def counting(config):
        made.append(real(config))
        return made[-1]

    monkeypatch.setattr(decoding, "compiled_round", counting)
    out = target.generate(ids, assistant_model=target, acceptance="exact", num_assistant_tokens=4,
                          max_new_tokens=positions - 8, cache_implementation="static",
                          compile_config=cpu_compile_config(), return_dict_in_generate=True)
    assert made, "the compiled round was built"
    assert torch.equal(out.sequences, plain)
    assert out.acceptance_stats.drafted_per_round == [4, 4, 4, 4, 1]  # the cut-short round the guard is about
