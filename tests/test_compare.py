"""`hf_semspec.compare` and `python -m hf_semspec compare`: `exact` against itself (identical, an NLL increase of
exactly 0), a rule built to flip tokens (a positive NLL increase), the scorer's mean and paired wins/losses, seeded
sampling that repeats, the `rule@option=value` variants and their errors, the CLI on each prompts format, and every
field of the report. Tiny models, greedy unless said; no timing is asserted."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import fields
from unittest.mock import patch

import pytest
import torch
from conftest import EOS, prompt, tiny_llama, tiny_tokenizer

import hf_semspec
import hf_semspec.generation
from hf_semspec.comparison import (
    ComparisonReport,
    ConfigurationResult,
    PromptResult,
    load_prompts,
    main,
    new_token_ids,
    parse_configuration,
    parse_rules,
)
from hf_semspec.errors import SemSpecConfigError
from hf_semspec.generation import _is_attached

# fly with an empty window (W = 1) and no entropy gate keeps every draft but a block's last: with an unrelated draft
# the output is mostly the draft's text, far from the target's own.
FLIP = "fly@window=1@entropy_threshold=0"
QUICK = dict(repeats=1, progress=False, max_new_tokens=12)


def greedy_new_ids(model, ids: torch.Tensor, max_new_tokens: int = 12) -> list[int]:
    """Plain greedy decoding's new tokens (stock `generate()`): what `exact` must give."""
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False)
    return new_token_ids(out, ids.shape[1], [EOS])


def test_exact_against_itself_is_identical_with_no_nll_increase(target, close_draft):
    prompts = [prompt(8, seed=s) for s in range(3)]
    # `ears` with β = 0 decodes greedily token for token as `exact` (tests/test_ears_rule.py): a second configuration,
    # run on its own, whose outputs are `exact`'s.
    report = hf_semspec.compare(target, close_draft, prompts, rules=["exact", "ears@beta=0"], repeats=2,
                                max_new_tokens=12)
    assert [row.name for row in report.configurations] == ["exact", "ears@beta=0"]
    row = report["exact"]
    assert row.lossless and row.identical_share == 1.0 and row.mean_first_divergence is None
    assert row.nll_increase == 0.0 and row.nll_increase_ci95 == [0.0, 0.0]  # exactly: one forward per distinct output
    assert row.speedup == 1.0 and row.speedup_ci95 == [1.0, 1.0]
    assert row.new_tokens == sum(p.new_tokens for p in row.per_prompt) > 0 and row.tau >= 1
    for result, ids in zip(row.per_prompt, prompts):
        assert result.new_token_ids == greedy_new_ids(target, ids)  # lossless: plain greedy decoding's text
        assert result.identical and result.first_divergence is None and result.nll_increase == 0.0
        new = torch.tensor(result.new_token_ids)
        with torch.no_grad():  # the NLL: the mean of −ln p(token | prefix) over the output, one forward
            logits = target(torch.cat([ids, new[None]], dim=1)).logits[0, ids.shape[1] - 1 : -1]
        assert result.nll == pytest.approx(torch.nn.functional.cross_entropy(logits, new).item(), rel=1e-5)
    same = report["ears@beta=0"]
    assert same.identical_share == 1.0 and same.mean_first_divergence is None and same.nll_increase == 0.0
    assert same.speedup > 0 and len(same.speedup_ci95) == 2  # defined (its value is timing: not asserted)
    assert not _is_attached(target)  # attached for the call only


def test_an_attached_target_stays_attached_and_one_prompt_gives_no_interval(attached, close_draft):
    report = hf_semspec.compare(attached, close_draft, [prompt(8)], rules=["exact"], **QUICK)
    assert _is_attached(attached)
    row = report["exact"]
    assert row.speedup == 1.0 and row.speedup_ci95 is None
    assert row.nll_increase == 0.0 and row.nll_increase_ci95 is None
    assert "| 1.000× | " in report.to_markdown()  # no interval printed


def test_a_rule_that_keeps_the_drafts_raises_the_targets_nll(target, unrelated_draft):
    prompts = [prompt(8, seed=s) for s in range(3)]
    report = hf_semspec.compare(target, unrelated_draft, prompts, rules=[FLIP], **QUICK)
    exact, flipped = report["exact"], report[FLIP]
    assert [row.name for row in report.configurations] == ["exact", FLIP]
    assert flipped.rule == "fly" and flipped.options == {"window": 1, "entropy_threshold": 0} and not flipped.lossless
    assert flipped.identical_share == 0.0  # the rule does change the tokens, on every prompt
    divergences = []
    for own, reference in zip(flipped.per_prompt, exact.per_prompt):
        first = next(i for i, (a, b) in enumerate(zip(own.new_token_ids, reference.new_token_ids)) if a != b)
        assert own.first_divergence == first and not own.identical
        assert own.nll_increase == pytest.approx(own.nll - reference.nll) and own.nll_increase > 0
        divergences.append(first)
    assert flipped.mean_first_divergence == statistics.fmean(divergences)
    low, high = flipped.nll_increase_ci95
    assert 0 < flipped.nll_increase and low < flipped.nll_increase < high
    assert flipped.tau > exact.tau and flipped.acceptance_rate > exact.acceptance_rate
    assert exact.nll_increase == 0.0 and exact.identical_share == 1.0


def test_a_scorer_is_averaged_and_paired_against_exact(target, unrelated_draft):
    tokenizer = tiny_tokenizer()
    prompts = [prompt(8, seed=s)[0].tolist() for s in range(3)]
    exact_text = [tokenizer.decode(greedy_new_ids(target, torch.tensor([p])), skip_special_tokens=True)
                  for p in prompts]
    # Per prompt: (score of exact's text, score of any other text): the rule loses prompt 0, wins 1, ties 2.
    rewards = [(1.0, 0.0), (0.0, 3.0), (2.0, 2.0)]
    calls = []

    def scorer(prompt_ids, text):
        index = prompts.index(prompt_ids)  # called with the prompt as given
        calls.append(index)
        return rewards[index][text != exact_text[index]]

    report = hf_semspec.compare(target, unrelated_draft, prompts, rules=[FLIP], tokenizer=tokenizer, score=scorer,
                                **QUICK)
    exact, flipped = report["exact"], report[FLIP]
    assert [p.text for p in exact.per_prompt] == exact_text and flipped.identical_share == 0.0
    assert (exact.score_mean, exact.score_wins, exact.score_losses, exact.score_ties) == (1.0, 0, 0, 3)
    assert [p.score for p in flipped.per_prompt] == [0.0, 3.0, 2.0]
    assert flipped.score_mean == pytest.approx(5 / 3)
    assert (flipped.score_wins, flipped.score_losses, flipped.score_ties) == (1, 1, 1)
    assert sorted(calls) == [0, 0, 1, 1, 2, 2]  # once per distinct output of a prompt
    decoded = []
    real_generate = hf_semspec.generation.generate

    def counting_generate(*args, **kwargs):
        decoded.append(kwargs.get("acceptance"))
        return real_generate(*args, **kwargs)

    with patch.object(hf_semspec.generation, "generate", counting_generate):
        with pytest.raises(SemSpecConfigError, match=r"`score` = 'yes' is not valid: allowed a number.*Fix"):
            hf_semspec.compare(target, unrelated_draft, prompts, rules=[FLIP], score=lambda p, t: "yes", **QUICK)
    # a scorer that returns no number fails on the warm-up's first output (exact's), before any timed call
    assert decoded == ["exact"]


def test_seeded_sampling_repeats_and_each_prompt_gets_seed_plus_its_index(target, close_draft):
    prompts = [prompt(8, seed=s) for s in range(2)]
    options = dict(rules=["ears@beta=0.5"], do_sample=True, temperature=2.0, **QUICK)
    state = torch.get_rng_state()
    first = hf_semspec.compare(target, close_draft, prompts, seed=3, **options)
    assert torch.equal(torch.get_rng_state(), state)  # the caller's RNG is left as it was
    second = hf_semspec.compare(target, close_draft, prompts, seed=3, **options)
    other = hf_semspec.compare(target, close_draft, prompts, seed=100, **options)

    def outputs(report):
        return [[p.new_token_ids for p in row.per_prompt] for row in report.configurations]

    assert outputs(first) == outputs(second) and outputs(first) != outputs(other)
    for a, b in zip(first.configurations, second.configurations):
        assert (a.identical_share, a.nll_increase, a.tau, a.mean_first_divergence) == (
            b.identical_share, b.nll_increase, b.tau, b.mean_first_divergence)
    hf_semspec.attach(target)
    try:  # exact on prompt 1, seeded as compare() documents it: torch.manual_seed(seed + prompt index)
        torch.manual_seed(3 + 1)
        out = target.generate(prompts[1], attention_mask=torch.ones_like(prompts[1]), assistant_model=close_draft,
                              acceptance="exact", do_sample=True, temperature=2.0, max_new_tokens=12)
    finally:
        hf_semspec.detach(target)
    assert new_token_ids(out, 8, [EOS]) == first["exact"].per_prompt[1].new_token_ids


def test_variants_parse_to_a_rule_and_its_options():
    variant = parse_configuration("fly@window=4")
    assert (variant.rule, variant.options, variant.name) == ("fly", {"window": 4}, "fly@window=4")
    variant = parse_configuration("fly@entropy_threshold=0.5@window=4@entropy=normalized_full")
    assert variant.options == {"entropy_threshold": 0.5, "window": 4, "entropy": "normalized_full"}
    assert parse_configuration(variant.name) == variant  # the name reads back as the same configuration
    assert parse_configuration("dropmatch@seed=null@accept_target_matches=false").options == {
        "seed": None, "accept_target_matches": False}
    assert parse_configuration(("fly", {"window": 4})).name == "fly@window=4"
    assert [c.name for c in parse_rules(["ears", "exact", "fly@window=4"])] == ["exact", "ears", "fly@window=4"]
    assert [c.name for c in parse_rules([])] == ["exact"]  # exact always runs


@pytest.mark.parametrize("entry, message", [
    ("fly@windw=4", r"`rules` entry 'fly@windw=4': `acceptance_kwargs` has unknown option\(s\) \['windw'\] for 'fly'"
                    r".*window.*Fix: remove or rename them"),
    ("fly@window=0", r"`rules` entry 'fly@window=0': `acceptance_kwargs\['window'\]` = 0 is not valid: allowed values "
                     r"in \[1, inf.*Fix"),
    ("flyy", r"`rules` entry 'flyy': `acceptance` = 'flyy' is not valid: allowed one of \[.*'fly'.*\].*Fix"),
    ("fly@window", r"`rules` = 'fly@window' is not valid: allowed <rule> or <rule>@<option>=<value>.*Fix"),
])
def test_a_bad_variant_names_the_entry_the_option_and_the_fix(entry, message):
    with pytest.raises(SemSpecConfigError, match=message):
        parse_configuration(entry)


def test_bad_arguments_fail_before_any_decoding(target, close_draft):
    with pytest.raises(SemSpecConfigError, match=r"drop 'fly@window=6': it is 'fly' again"):
        parse_rules(["fly", "fly@window=6"])  # the default options: the same configuration twice
    with pytest.raises(SemSpecConfigError, match=r"`rules` entry 'fly@windw=4'"):
        hf_semspec.compare(target, close_draft, [prompt(8)], rules=["fly@windw=4"])
    with pytest.raises(SemSpecConfigError, match=r"`acceptance` = 'fly' is not valid.*Fix: .*rules="):
        hf_semspec.compare(target, close_draft, [prompt(8)], acceptance="fly")
    with pytest.raises(SemSpecConfigError, match=r"`prompts\[0\]` = 'abcd' is not valid.*Fix: pass tokenizer="):
        hf_semspec.compare(target, close_draft, ["abcd"], rules=["exact"])
    assert not _is_attached(target)


ROW_TYPES = {
    "name": str, "rule": str, "options": dict, "lossless": bool, "prompts": int, "new_tokens": int, "seconds": float,
    "tokens_per_s": float, "speedup": float, "speedup_ci95": list, "tau": float, "acceptance_rate": float,
    "draft_forwards_per_drafted_token": float, "ngram_hit_rate": (float, type(None)),
    "identical_share": float, "mean_first_divergence": (float, type(None)), "nll": float, "nll_increase": float,
    "nll_increase_ci95": list, "score_mean": float, "score_wins": int, "score_losses": int, "score_ties": int,
    "per_prompt": list,
}
PROMPT_TYPES = {
    "prompt_index": int, "prompt_tokens": int, "new_token_ids": list, "text": str, "new_tokens": int,
    "seconds": float, "tokens_per_s": float, "speedup": float, "identical": bool, "first_divergence": (int, type(None)),
    "nll": float, "nll_increase": float, "score": float, "tau": float, "acceptance_rate": float,
}
REPORT_TYPES = {"configurations": list, "num_prompts": int, "repeats": int, "seed": int, "generate_kwargs": dict,
                "decoding": dict, "reference": str, "timing": str}


def test_every_field_of_the_report_is_present_and_typed(target, close_draft):
    report = hf_semspec.compare(target, close_draft, [prompt(8, seed=s) for s in range(2)], rules=["ears@beta=1.0"],
                                tokenizer=tiny_tokenizer(), score=lambda p, text: len(text), **QUICK)
    assert set(REPORT_TYPES) == {f.name for f in fields(ComparisonReport)}
    assert set(ROW_TYPES) == {f.name for f in fields(ConfigurationResult)}
    assert set(PROMPT_TYPES) == {f.name for f in fields(PromptResult)}
    data = json.loads(json.dumps(report.to_dict()))  # JSON-ready, and the types survive the round trip

    def check(record, types):
        assert set(record) == set(types)
        for name, kinds in types.items():
            kinds = kinds if isinstance(kinds, tuple) else (kinds,)
            assert type(record[name]) in kinds, (name, record[name])

    check(data, REPORT_TYPES)
    assert data["generate_kwargs"] == {"max_new_tokens": 12} and data["num_prompts"] == 2
    # what the calls ran with: the call's keywords, else the model's generation config (the tiny model sets none)
    assert data["decoding"] == {"do_sample": False, "temperature": None, "top_p": None, "top_k": None,
                                "max_new_tokens": 12}
    for row in data["configurations"]:
        check(row, ROW_TYPES)
        assert len(row["per_prompt"]) == 2
        assert all(type(x) is float for x in row["speedup_ci95"] + row["nll_increase_ci95"])
        for result in row["per_prompt"]:
            check(result, PROMPT_TYPES)
    markdown = report.to_markdown()
    header = markdown.splitlines()[0]
    for column in ("configuration", "lossless", "tokens/s", "speed-up [95% CI]", "τ", "acceptance", "identical",
                   "first divergence", "NLL increase [95% CI]", "score", "wins / losses / ties"):
        assert f"| {column} |" in header
    assert markdown.count("\n| `") == 2 and "| `ears@beta=1.0` | no |" in markdown
    assert "- NLL increase:" in markdown and "- score:" in markdown  # the legend
    # Drafted by the draft model token by token: one forward per draft; no prompt lookup, so no n-gram columns.
    assert all(row["draft_forwards_per_drafted_token"] == 1.0 and row["ngram_hit_rate"] is None
               for row in data["configurations"])
    assert "n-gram hits" not in markdown


# --- prompt lookup: alone (no draft) and with a draft (multi-level drafting) ---------------------------------------


def repetitive_prompt(seed: int) -> torch.Tensor:
    """A prompt that repeats itself: prompt lookup finds n-grams in it from the first round."""
    return torch.cat([prompt(6, seed=seed)] * 3, dim=1)


def test_prompt_lookup_alone_needs_no_draft_and_exact_stays_plain_greedy(target):
    prompts = [repetitive_prompt(s) for s in range(2)]
    report = hf_semspec.compare(target, None, prompts, rules=["fly"], prompt_lookup_num_tokens=4,
                                max_matching_ngram_size=2, **QUICK)
    assert report.generate_kwargs == {"prompt_lookup_num_tokens": 4, "max_matching_ngram_size": 2,
                                      "max_new_tokens": 12}
    exact = report["exact"]
    for result, ids in zip(exact.per_prompt, prompts):
        assert result.new_token_ids == greedy_new_ids(target, ids)  # lossless with prompt-lookup drafts too
    for row in report.configurations:
        assert row.draft_forwards_per_drafted_token == 0.0  # no draft model ran
        assert 0.0 < row.ngram_hit_rate <= 1.0
    markdown = report.to_markdown()
    assert "| draft fwd/drafted | n-gram hits |" in markdown.splitlines()[0]
    assert "- draft fwd/drafted:" in markdown
    with pytest.raises(SemSpecConfigError, match=r"`draft` = None is not valid: allowed a draft model, or None "
                                                 r"together with prompt_lookup_num_tokens.*Fix"):
        hf_semspec.compare(target, None, prompts, rules=["fly"], **QUICK)


def test_prompt_lookup_with_a_draft_drafts_multi_level(target):
    """Multi-level drafting: the draft (the target's copy, which confirms candidates on repetitive text) drafts in
    fewer forwards than drafted tokens, and `exact` stays plain greedy."""
    draft = type(target)(target.config).eval()
    draft.load_state_dict(target.state_dict())
    prompts = [repetitive_prompt(s) for s in range(2)]
    report = hf_semspec.compare(target, draft, prompts, rules=["fly"], prompt_lookup_num_tokens=4,
                                max_matching_ngram_size=2, **QUICK)
    for result, ids in zip(report["exact"].per_prompt, prompts):
        assert result.new_token_ids == greedy_new_ids(target, ids)
    for row in report.configurations:
        assert 0.0 < row.draft_forwards_per_drafted_token < 1.0
        assert 0.0 < row.ngram_hit_rate < 1.0  # the drafts that were confirmed candidates, per drafted token


# --- the command line ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved_pair(tmp_path_factory, target, close_draft):
    """The tiny target with the tiny tokenizer beside it, and the draft, as `save_pretrained` writes them."""
    root = tmp_path_factory.mktemp("pair")
    target.save_pretrained(root / "target")
    tiny_tokenizer().save_pretrained(root / "target")
    close_draft.save_pretrained(root / "draft")
    return root


PROMPT_FILES = {  # format: (file name, content, prompt lengths in tokens)
    "text": ("prompts.txt", "abcdefgh\n\nijklmnop\n", [4, 4]),  # the tiny tokenizer: one token per two letters
    "jsonl-text": ("prompts.jsonl", '{"prompt": "abcdefgh", "answer": "ab"}\n{"prompt": "ijklmn", "answer": "zz"}\n',
                   [4, 3]),
    "jsonl-ids": ("prompts.jsonl", '{"input_ids": [5, 9, 20, 31, 44, 70]}\n\n{"input_ids": [100, 7, 8]}\n', [6, 3]),
}


@pytest.mark.parametrize("form", sorted(PROMPT_FILES))
def test_the_cli_end_to_end(form, saved_pair, tmp_path, capsys, monkeypatch):
    name, content, lengths = PROMPT_FILES[form]
    (tmp_path / name).write_text(content)
    argv = ["--target", str(saved_pair / "target"), "--draft", str(saved_pair / "draft"),
            "--prompts", str(tmp_path / name), "--rules", f"exact,{FLIP}", "--max-new-tokens", "8",
            "--repeats", "1", "--output", str(tmp_path / "report.json"), "--no-progress", "--device", "cpu"]
    if form == "jsonl-text":  # a scorer reads the record's other fields
        scorer = "def score(prompt, text):\n    return text.startswith(prompt['answer'])\n"
        (tmp_path / "cli_scorer.py").write_text(scorer)
        monkeypatch.syspath_prepend(str(tmp_path))
        argv += ["--score", "cli_scorer:score"]
    if form == "jsonl-ids":
        argv += ["--sample", "--temperature", "0.9", "--top-p", "0.95", "--seed", "1"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    data = json.loads((tmp_path / "report.json").read_text())
    assert [row["name"] for row in data["configurations"]] == ["exact", FLIP]
    assert (data["num_prompts"], data["repeats"]) == (2, 1)
    assert data["generate_kwargs"] == {"max_new_tokens": 8, "do_sample": form == "jsonl-ids",
                                       **({"temperature": 0.9, "top_p": 0.95} if form == "jsonl-ids" else {})}
    assert data["seed"] == (1 if form == "jsonl-ids" else 0)
    for row in data["configurations"]:
        assert [p["prompt_tokens"] for p in row["per_prompt"]] == lengths
        assert all(isinstance(p["text"], str) and 0 < p["new_tokens"] <= 8 for p in row["per_prompt"])
        assert (row["score_mean"] is not None) == (form == "jsonl-text")
    assert "| `exact` | yes |" in printed and f"| `{FLIP}` | no |" in printed
    assert ("wins / losses / ties" in printed) == (form == "jsonl-text")


def test_the_cli_refuses_a_bad_variant_before_loading_a_model(tmp_path, capsys):
    (tmp_path / "prompts.txt").write_text("abcd\n")
    with pytest.raises(SystemExit) as stopped:
        main(["--target", str(tmp_path / "no-model"), "--draft", str(tmp_path / "no-model"),
              "--prompts", str(tmp_path / "prompts.txt"), "--rules", "exact,fly@windw=4"])
    assert stopped.value.code == 2
    assert "`rules` entry 'fly@windw=4'" in capsys.readouterr().err


def test_the_package_command_dispatches_to_compare(tmp_path, capsys):
    from hf_semspec.__main__ import main as package_main

    (tmp_path / "prompts.txt").write_text("abcd\n")
    with pytest.raises(SystemExit) as stopped:  # reached compare's own parser, which checks the rules first
        package_main(["compare", "--target", str(tmp_path / "no-model"), "--prompts", str(tmp_path / "prompts.txt"),
                      "--rules", "exact,fly@windw=4"])
    assert stopped.value.code == 2
    assert "`rules` entry 'fly@windw=4'" in capsys.readouterr().err
    assert package_main(["comapre"]) == 2
    assert "unknown command 'comapre'; allowed: compare" in capsys.readouterr().err
    assert package_main([]) == 2 and "commands:" in capsys.readouterr().err
    assert package_main(["--help"]) == 0 and "compare" in capsys.readouterr().out


@pytest.mark.slow
def test_python_dash_m_runs_compare_without_a_runpy_warning():
    """The module (`hf_semspec.comparison`) and the function (`hf_semspec.compare`) have their own names, so
    `python -m hf_semspec compare` runs no module the package has imported already (runpy's RuntimeWarning)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", "hf_semspec", "compare", "--help"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "usage: python -m hf_semspec compare" in done.stdout
    assert "Warning" not in done.stderr


def test_the_cli_drafts_by_prompt_lookup_without_a_draft(saved_pair, tmp_path, capsys):
    (tmp_path / "prompts.jsonl").write_text('{"input_ids": [5, 9, 20, 5, 9, 20, 5, 9]}\n{"input_ids": [7, 8, 7, 8]}\n')
    common = ["--target", str(saved_pair / "target"), "--prompts", str(tmp_path / "prompts.jsonl"),
              "--max-new-tokens", "8", "--repeats", "1", "--no-progress", "--device", "cpu"]
    assert main(common + ["--rules", "exact,fly", "--prompt-lookup", "3:2", "--output", str(tmp_path / "r.json")]) == 0
    printed = capsys.readouterr().out
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["generate_kwargs"] == {"max_new_tokens": 8, "do_sample": False, "prompt_lookup_num_tokens": 3,
                                       "max_matching_ngram_size": 2}
    assert all(row["draft_forwards_per_drafted_token"] == 0.0 and row["ngram_hit_rate"] is not None
               for row in data["configurations"])
    assert "draft fwd/drafted" in printed
    for argv, message in ((common, "--draft is missing"),
                          (common + ["--prompt-lookup", "0"], "argument --prompt-lookup: got '0'; expected K[:N]"),
                          (common + ["--prompt-lookup", "6:x"], "argument --prompt-lookup: got '6:x'")):
        with pytest.raises(SystemExit) as stopped:
            main(argv)
        assert stopped.value.code == 2 and message in capsys.readouterr().err


def test_the_cli_keeps_generate_kwargs_and_refuses_a_flag_that_disagrees(saved_pair, tmp_path, capsys):
    (tmp_path / "prompts.jsonl").write_text('{"input_ids": [5, 9, 20, 31]}\n')
    common = ["--target", str(saved_pair / "target"), "--draft", str(saved_pair / "draft"), "--prompts",
              str(tmp_path / "prompts.jsonl"), "--rules", "exact", "--repeats", "1", "--no-progress", "--device", "cpu"]
    output = tmp_path / "r.json"
    given = '{"max_new_tokens": 5, "do_sample": true, "top_k": 3, "max_matching_ngram_size": 3}'
    assert main(common + ["--generate-kwargs", given, "--prompt-lookup", "2", "--output", str(output)]) == 0
    data = json.loads(output.read_text())
    # no flag overrode them (`--prompt-lookup K` without `:N` leaves N to --generate-kwargs)
    assert data["generate_kwargs"] == {"max_new_tokens": 5, "do_sample": True, "top_k": 3,
                                       "max_matching_ngram_size": 3, "prompt_lookup_num_tokens": 2}
    assert data["decoding"]["do_sample"] is True and data["decoding"]["top_k"] == 3
    assert all(0 < p["new_tokens"] <= 5 for p in data["configurations"][0]["per_prompt"])
    capsys.readouterr()
    for extra, message in (
        (["--max-new-tokens", "8", "--generate-kwargs", '{"max_new_tokens": 5}'],
         "--max-new-tokens sets max_new_tokens=8 and --generate-kwargs sets max_new_tokens=5. Fix: give it once"),
        (["--sample", "--generate-kwargs", '{"do_sample": false}'], "--sample sets do_sample=True"),
        (["--generate-kwargs", '{"acceptance": "fly"}'], "--generate-kwargs sets ['acceptance'], which compare()"),
        (["--repeats", "0"], "--repeats 0: at least 1"),
    ):
        with pytest.raises(SystemExit) as stopped:
            main(common + extra)
        assert stopped.value.code == 2 and message in capsys.readouterr().err


def test_a_prompts_file_of_json_records_is_not_read_as_text(tmp_path):
    records = '{"prompt": "abcd", "answer": "1"}\n{"prompt": "efgh"}\n'
    (tmp_path / "prompts.txt").write_text(records)
    with pytest.raises(ValueError, match=r"every line is a JSON object .* Fix: name it .jsonl, or pass "
                                         r"--prompts-format jsonl"):
        load_prompts(tmp_path / "prompts.txt")
    assert load_prompts(tmp_path / "prompts.txt", "text") == ["{\"prompt\": \"abcd\", \"answer\": \"1\"}",
                                                             "{\"prompt\": \"efgh\"}"]
    (tmp_path / "prompts.NDJSON").write_text(records)
    assert load_prompts(tmp_path / "prompts.NDJSON") == [{"prompt": "abcd", "answer": "1"}, {"prompt": "efgh"}]
    (tmp_path / "mixed.txt").write_text('{"prompt": "abcd"}\nplain text\n')
    assert load_prompts(tmp_path / "mixed.txt") == ['{"prompt": "abcd"}', "plain text"]


def test_a_bad_prompts_line_names_the_file_and_the_line(tmp_path):
    """One JSONL reader (`hf_semspec.jsonl`) serves prompts and corpora: a bad line is named as a corpus's is, a
    byte-order mark is dropped, and a prompt holding U+2028 stays one record."""
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "abcd"}\n{"prompt": "ef\n', encoding="utf-8")
    with pytest.raises(SemSpecConfigError, match=r"`prompts \(prompts.jsonl, line 2\)` = '\{\"prompt\": \"ef' is not "
                                                 r"valid: allowed one JSON value a line.*or pass --prompts-format text"):
        load_prompts(path)
    path.write_text('{"prompt": "abcd"}\n\n{"text": "efgh"}\n', encoding="utf-8")
    with pytest.raises(SemSpecConfigError, match=r"`prompts \(prompts.jsonl, line 3\)` = \{'text': 'efgh'\} is not "
                                                 r"valid: allowed a JSON object with 'prompt'.*--prompts-format text"):
        load_prompts(path)
    path.write_text('{"prompt": "ab\u2028cd"}\r\n{"input_ids": [5, 6]}\n', encoding="utf-8-sig")
    assert load_prompts(path) == [{"prompt": "ab\u2028cd"}, {"input_ids": [5, 6]}]


def test_sampling_from_the_models_config_is_reported_and_warned(target, close_draft):
    config = target.generation_config
    saved = (config.do_sample, config.temperature, config.top_p)
    config.do_sample, config.temperature, config.top_p = True, 0.7, 0.8  # as Qwen2.5-Instruct ships
    try:
        with pytest.warns(UserWarning, match=r"compare\(\) samples: do_sample=True comes from the model's generation "
                                             r"config.*temperature=0.7.*Pass do_sample=False for greedy"):
            report = hf_semspec.compare(target, close_draft, [prompt(8)], rules=[], **QUICK)
        assert report.decoding == {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": None,
                                   "max_new_tokens": 12}
        assert "(decoding, with the model's generation config: do_sample=True, temperature=0.7" in report.to_markdown()
        # said in the call: no warning, and the call's value wins
        greedy = hf_semspec.compare(target, close_draft, [prompt(8)], rules=[], do_sample=False, **QUICK)
        assert greedy.decoding["do_sample"] is False
    finally:
        config.do_sample, config.temperature, config.top_p = saved


def test_intervals_use_student_t_not_the_normal_quantile():
    """Published t₀.₉₇₅ values; the normal 1.96 only as n grows. A mean of 3 values: ± 4.303·sd/√3."""
    from hf_semspec.comparison import geometric_mean_interval, mean_interval, t_quantile_975

    for df, table in ((1, 12.7062), (2, 4.3027), (4, 2.7764), (9, 2.2622), (29, 2.0452), (1000, 1.9623)):
        assert t_quantile_975(df) == pytest.approx(table, abs=1e-4), df
    mean, (low, high) = mean_interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and high - mean == pytest.approx(4.3027 * 1.0 / 3 ** 0.5, abs=1e-4)
    geo, (low, high) = geometric_mean_interval([2.0, 0.5])  # ln ratios ±ln 2: sd √2·ln 2, n 2
    assert geo == pytest.approx(1.0) and high == pytest.approx(math.exp(12.7062 * math.log(2)), rel=1e-4)
    with pytest.raises(ValueError, match="an int ≥ 1"):
        t_quantile_975(0)


def test_stock_transformers_is_a_peer_configuration(attached, close_draft):
    """`transformers@assistant_ensemble_weight=w` runs stock transformers' own lossy rule through its own `generate()`
    at hf_semspec's γ: greedy, its outputs are `ensemble`'s at the same weight, token for token; its τ is counted
    from the target's forwards; the draft's generation config is left as it was."""
    before = dict(vars(close_draft.generation_config))
    report = hf_semspec.compare(attached, close_draft, [prompt(8, seed=s)[0].tolist() for s in range(3)],
                                rules=["ensemble@weight=0.3", "transformers@assistant_ensemble_weight=0.3",
                                       "transformers"], repeats=1, progress=False, max_new_tokens=24,
                                num_assistant_tokens=4, do_sample=False)
    ours, stock, lossless = (report["ensemble@weight=0.3"], report["transformers@assistant_ensemble_weight=0.3"],
                             report["transformers"])
    assert [p.new_token_ids for p in stock.per_prompt] == [p.new_token_ids for p in ours.per_prompt]
    assert stock.tau == pytest.approx(ours.tau) and stock.nll_increase == pytest.approx(ours.nll_increase)
    assert not stock.lossless and lossless.lossless and lossless.identical_share == 1.0
    assert stock.identical_share < 1.0  # the weight changed the text: the comparison tells the rules apart
    assert dict(vars(close_draft.generation_config)) == before
    assert "| `transformers@assistant_ensemble_weight=0.3` | no |" in report.to_markdown()


def test_stock_configuration_is_checked(attached, close_draft):
    with pytest.raises(SemSpecConfigError, match=r"option 'top_k'.*\['assistant_ensemble_weight'\]"):
        hf_semspec.compare(attached, close_draft, [[5, 6, 7]], rules=["transformers@top_k=4"], progress=False)
    with pytest.raises(SemSpecConfigError, match=r"option 'assistant_ensemble_weight'` = 1.*a float in \(0, 1\)"):
        hf_semspec.compare(attached, close_draft, [[5, 6, 7]], rules=["transformers@assistant_ensemble_weight=1"],
                           progress=False)
    with pytest.raises(SemSpecConfigError, match=r"`draft_length` = 'heuristic'.*unset with a 'transformers'"):
        hf_semspec.compare(attached, close_draft, [[5, 6, 7]], rules=["transformers"], progress=False,
                           draft_length="heuristic", max_new_tokens=4)
    with pytest.raises(SemSpecConfigError, match=r"`assistant_ensemble_weight` = 0.3 .*turn the `exact` reference "
                                                 r"into `ensemble`.*Fix: compare it as a configuration"):
        hf_semspec.compare(attached, close_draft, [[5, 6, 7]], rules=["fly"], progress=False,
                           assistant_ensemble_weight=0.3)
