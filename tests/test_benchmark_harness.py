"""The benchmark harness (`benchmarks/`): its parsing, counting and aggregation, and one tiny end-to-end run.

No real model and no timing assertion: the end-to-end run uses tiny random Llama models from `conftest` and a fake
tokenizer injected through `run.main(load_pair=...)`.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from conftest import perturbed_copy, tiny_llama

import hf_semspec
from benchmarks import data, merge, methods, metrics, models, replay, report, run
from hf_semspec.draft_length.svip import SVIPPolicy
from hf_semspec.errors import SemSpecConfigError
from hf_semspec.rules import RULES
from hf_semspec.rules.exact import ExactRule
from hf_semspec.rules.fly import FLyConfig

REPO_ROOT = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------------------------------------------------------------
# GSM8K final-number parser
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The answer is 18.", "18"),
        ("She makes $1,234.50 per week.", "1234.5"),
        ("So the total is \\boxed{\\$1,000}.", "1000"),
        ("First \\boxed{18}. Hmm, or maybe 20 if we count twice.", "18"),  # boxed wins over the last number
        ("\\boxed{\\text{\\$}18}", "18"),  # nested braces
        ("\\boxed{18 \\text{ dollars}}", "18"),
        ("\\boxed{\\frac{3}{4}}", "0.75"),
        ("The temperature drops to -3.5 degrees.", "-3.5"),
        ("It ends at −7 (unicode minus).", "-7"),
        ("16-3-4=9 eggs are left", "9"),  # hyphens between numbers are not signs
        ("Janet sells 16 - 3 - 4 = 9 duck eggs.\n#### 18", "18"),  # GSM8K reference format
        ("The final answer is: 42. Check: 6 * 7 = 42, in 3 steps.", "42"),  # the marker beats the last number
        ("Answer: 5,000,000", "5000000"),
        ("It costs 0.50 dollars.", "0.5"),
        ("The price rose 60%.", "60"),
        ("Total: 18.00", "18"),
        ("We need .5 cups", "0.5"),
        ("The answer is -$12.", "-12"),
        ("There are no numbers here.", None),
        ("", None),
        ("\\boxed{72", "72"),  # cut by max_new_tokens inside the box
    ],
)
def test_parse_final_number(text, expected):
    assert metrics.parse_final_number(text) == expected


def test_gsm8k_gold_uses_the_same_normalization():
    assert data.gsm8k_gold("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 1,072") == "1072"
    with pytest.raises(ValueError, match="####"):
        data.gsm8k_gold("no marker 5")


# ---------------------------------------------------------------------------------------------------------------------
# Token and forward counting
# ---------------------------------------------------------------------------------------------------------------------


def test_token_counter_counts_after_the_prompt_up_to_and_including_eos():
    prompt = [5, 6, 7]
    assert metrics.count_new_tokens(torch.tensor([prompt + [10, 11, 12]]), 3, eos_token_ids=[2]) == 3
    assert metrics.new_token_ids(torch.tensor([prompt + [10, 2]]), 3, [2]) == [10, 2]  # EOS counted
    assert metrics.new_token_ids(torch.tensor([prompt + [10, 2, 0, 0]]), 3, [2]) == [10, 2]  # padding after EOS not
    assert metrics.new_token_ids(torch.tensor([prompt + [2]]), 3, [9, 2]) == [2]  # any of several EOS ids
    assert metrics.count_new_tokens(torch.tensor(prompt + [10]), 3) == 1  # 1-D sequences
    assert metrics.count_new_tokens(torch.tensor([prompt]), 3) == 0
    with pytest.raises(ValueError, match="shorter than the prompt"):
        metrics.count_new_tokens(torch.tensor([[1, 2]]), 3)


def test_forward_meter_counts_calls_and_removes_its_hooks():
    layer = torch.nn.Linear(2, 2)
    with metrics.ForwardMeter(layer) as meter:
        for _ in range(3):
            layer(torch.zeros(1, 2))
        assert meter.calls == 3 and meter.seconds >= 0
        meter.reset()
        layer(input=torch.zeros(1, 2))  # keyword-only calls are counted too
        assert meter.calls == 1
    layer(torch.zeros(1, 2))
    assert meter.calls == 1  # hooks removed on exit


def test_plain_greedy_makes_one_target_forward_per_new_token():
    model = tiny_llama(seed=0)
    with metrics.ForwardMeter(model) as meter:
        out = model.generate(torch.tensor([[5, 6, 7, 8]]), max_new_tokens=6, min_new_tokens=6, do_sample=False)
    new = metrics.count_new_tokens(out, 4)
    assert new == 6 and meter.calls == new  # τ = 1 by construction


# ---------------------------------------------------------------------------------------------------------------------
# Aggregation
# ---------------------------------------------------------------------------------------------------------------------


def test_ratio_summary_worked_numbers():
    s = metrics.ratio_summary([2.0, 0.5, 1.0])  # a 2x and a 0.5x average to 1x: the geometric mean says so
    assert s["median"] == 1.0 and s["geomean"] == pytest.approx(1.0) and s["n"] == 3
    s = metrics.ratio_summary([1.0, 2.0, 4.0, 8.0])
    assert s["median"] == 3.0 and s["geomean"] == pytest.approx(math.sqrt(8)) and (s["min"], s["max"]) == (1.0, 8.0)
    assert metrics.ratio_summary([]) is None
    with pytest.raises(ValueError):
        metrics.geometric_mean([1.0, 0.0])


def test_ratio_summary_interval_worked_numbers():
    """ln of e and 1/e are ±1: their mean is 0 (geomean 1), their sd sqrt(2), so the standard error of ln(geomean)
    is sqrt(2) / sqrt(2) = 1 and the 95% interval exp(±t) with Student's t₀.₉₇₅ at 1 degree of freedom, 12.7062 (two
    ratios: far wider than the normal ±1.96); one ratio has no spread, hence no interval."""
    s = metrics.ratio_summary([math.e, 1 / math.e])
    assert s["geomean"] == pytest.approx(1.0) and s["log_se"] == pytest.approx(1.0)
    assert s["ci95"] == pytest.approx([math.exp(-12.7062), math.exp(12.7062)], rel=1e-4)
    s = metrics.ratio_summary([1.2, 1.2, 1.2])
    assert s["log_se"] == pytest.approx(0.0) and s["ci95"] == pytest.approx([1.2, 1.2])
    s = metrics.ratio_summary([1.5])
    assert s["log_se"] is None and s["ci95"] is None


def _record(prompt_id, method, new_tokens, wall_s, forwards, category="qa", ids=None, acceptance=None, gsm8k=None):
    return {
        "prompt_id": prompt_id, "category": category, "method": method, "new_tokens": new_tokens, "wall_s": wall_s,
        "tokens_per_s": new_tokens / wall_s, "target_forwards": forwards, "tau": new_tokens / forwards,
        "target_forward_s": 0.0, "draft_forward_s": 0.0, "new_token_ids": ids if ids is not None else [1] * new_tokens,
        "acceptance_stats": acceptance, "gsm8k": gsm8k,
    }


def test_per_prompt_ratios_tau_and_identity():
    stats_a = hf_semspec.AcceptanceStats(4, 20, 8, 12, [4, 4, 4, 4, 4], [3, 2, 1, 1, 1]).to_dict()
    stats_b = hf_semspec.AcceptanceStats(2, 10, 10, 12, [2, 2, 2, 2, 2], [2, 2, 2, 2, 2]).to_dict()
    records = [
        # prompt p1: plain 10 tok in 10 s (1 tok/s); stock 10 tok in 5 s (2 tok/s); exact 12 tok in 3 s (4 tok/s)
        _record("p1", "plain", 10, 10.0, 10, ids=[1, 2]),
        _record("p1", "stock_assisted", 10, 5.0, 4, ids=[1, 2]),
        _record("p1", "semspec:exact", 12, 3.0, 4, ids=[1, 2], acceptance=stats_a),
        # prompt p2: plain 2 tok/s; stock 2 tok/s; exact 2 tok/s, but a different output
        _record("p2", "plain", 20, 10.0, 20, ids=[3]),
        _record("p2", "stock_assisted", 20, 10.0, 10, ids=[3]),
        _record("p2", "semspec:exact", 12, 6.0, 2, ids=[4], acceptance=stats_b),
    ]
    metrics.add_per_prompt_ratios(records)
    exact = [r for r in records if r["method"] == "semspec:exact"]
    assert [r["speedup_vs_plain"] for r in exact] == [4.0, 1.0]
    assert [r["speedup_vs_stock"] for r in exact] == [2.0, 1.0]
    assert [r["identical_to_plain"] for r in exact] == [True, False]

    agg = metrics.aggregate(records, ["plain", "stock_assisted", "semspec:exact"])["overall"]
    assert agg["plain"]["tau"] == 1.0 and agg["plain"]["speedup_vs_plain"]["geomean"] == 1.0
    assert agg["stock_assisted"]["tau"] == pytest.approx(30 / 14)  # Σ new tokens / Σ counted forwards
    assert agg["semspec:exact"]["tau"] == pytest.approx(24 / 6)
    assert agg["semspec:exact"]["speedup_vs_plain"]["median"] == pytest.approx(2.5)
    assert agg["semspec:exact"]["speedup_vs_plain"]["geomean"] == pytest.approx(2.0)
    assert agg["semspec:exact"]["identical_to_plain"] == 0.5
    merged = agg["semspec:exact"]["acceptance"]  # AcceptanceStats merged with `+` over the prompts
    assert merged["num_drafted"] == 30 and merged["num_accepted"] == 18
    assert merged["per_position_acceptance"] == pytest.approx([5 / 6, 4 / 6, 3 / 6, 3 / 6, 3 / 6])
    assert agg["stock_assisted"]["acceptance"] is None  # N/A for stock


def test_gsm8k_accuracy_aggregate():
    records = [
        _record("g1", "plain", 5, 1.0, 5, category="gsm8k", gsm8k={"gold": "3", "predicted": "3", "correct": True}),
        _record("g2", "plain", 5, 1.0, 5, category="gsm8k", gsm8k={"gold": "4", "predicted": None, "correct": False}),
    ]
    metrics.add_per_prompt_ratios(records)
    summary = metrics.aggregate(records, ["plain"])["per_category"]["gsm8k"]["plain"]
    assert summary["gsm8k_accuracy"] == 0.5 and summary["gsm8k_graded"] == 2


# ---------------------------------------------------------------------------------------------------------------------
# Prompt selection
# ---------------------------------------------------------------------------------------------------------------------


def _pool():
    lengths = {"writing": [30, 10, 20, 40], "qa": [5, 15], "rag": [300, 100, 200]}
    return [
        data.Prompt(f"{c}:{i}", c, "x" * n, max_new_tokens=8)
        for c, ns in lengths.items()
        for i, n in enumerate(ns)
    ]


def test_selection_is_balanced_deterministic_and_round_robin():
    chosen = data.select_balanced(_pool(), 2, "shortest")
    assert [p.prompt_id for p in chosen] == ["writing:1", "qa:0", "rag:1", "writing:2", "qa:1", "rag:2"]
    assert chosen == data.select_balanced(_pool(), 2, "shortest")  # deterministic
    assert [p.prompt_id for p in data.select_balanced(_pool(), 1, "first")] == ["writing:0", "qa:0", "rag:0"]
    assert [p.prompt_id for p in data.select_balanced(_pool(), 2, "spread")] == [
        "writing:0", "qa:0", "rag:0", "writing:2", "qa:1", "rag:1"]
    everything = data.select_balanced(_pool(), None, "first")
    assert sorted(p.prompt_id for p in everything) == sorted(p.prompt_id for p in _pool())
    # A category with fewer prompts than asked gives what it has; the others are not cut to match.
    assert [p.category for p in data.select_balanced(_pool(), 3, "first")].count("qa") == 2
    with pytest.raises(ValueError, match="strategy"):
        data.select_balanced(_pool(), 1, "random")


def test_held_out_selection_takes_the_next_prompts_of_each_category():
    # Shortest 2 per category after the 1 a quick-style run took: writing's 2nd and 3rd shortest (20, 30), qa's only
    # other prompt (a category with fewer prompts gives what it has), rag's 2nd and 3rd (200, 300).
    held_out = data.select_balanced(_pool(), 2, "shortest", skip_per_category=1)
    assert [p.prompt_id for p in held_out] == ["writing:0", "rag:0", "qa:1", "writing:2", "rag:2"]
    assert not {p.prompt_id for p in held_out} & {p.prompt_id for p in data.select_balanced(_pool(), 1, "shortest")}
    args = run.build_parser().parse_args(["--prompts-per-category", "2", "--skip-per-category", "1"])
    assert run.resolve_profile(args).skip_per_category == 1
    with pytest.raises(ValueError, match="skip_per_category: got 1 with per_category=None"):
        data.select_balanced(_pool(), None, "first", skip_per_category=1)


@pytest.mark.skipif(not (data.DEFAULT_DATA_DIR / data.SPECBENCH_FILE).exists(), reason="no ../shared/data here")
def test_quick_profile_selection_on_spec_bench():
    args = run.build_parser().parse_args(["--profile", "quick"])
    profile = run.resolve_profile(args)
    prompts, summary = run.select_prompts(args, profile)
    specbench = [p for p in prompts if p.category != data.GSM8K_CATEGORY]
    counts = {c: [p.category for p in specbench].count(c) for c in data.categories_in_order(specbench)}
    # 13 categories less the long-input ones, which have no prompt under the length cap (and say so)
    assert len(counts) == 10 and set(counts.values()) == {profile.per_category}
    assert all(len(p.text) <= profile.max_prompt_chars for p in specbench)
    assert "left out: extraction, summarization, rag" in summary
    assert [p.prompt_id for p in prompts] == [p.prompt_id for p in run.select_prompts(args, profile)[0]]
    gsm8k = [p for p in prompts if p.category == data.GSM8K_CATEGORY]
    assert len(gsm8k) == profile.gsm8k and all(p.gold for p in gsm8k)
    assert all(p.max_new_tokens == profile.gsm8k_max_new_tokens for p in gsm8k)
    # without the cap, every category is there
    args = run.build_parser().parse_args(["--profile", "quick", "--max-prompt-chars", "0"])
    assert "13 categories" in run.select_prompts(args, run.resolve_profile(args))[1]


def test_category_filter_keeps_the_named_categories_and_names_the_known_ones():
    assert [p.prompt_id for p in data.keep_categories(_pool(), ["qa", "rag"])] == ["qa:0", "qa:1", "rag:0", "rag:1",
                                                                                   "rag:2"]
    with pytest.raises(ValueError, match=r"--categories: got \['math'\], not categories of these prompts "
                                         r"\(writing, qa, rag\). Fix"):
        data.keep_categories(_pool(), ["qa", "math"])


def test_run_selects_held_out_prompts_of_one_category(tmp_path):
    write_tiny_data(tmp_path)
    argv = ["--data-dir", str(tmp_path), "--gsm8k", "0", "--categories", "writing"]
    everything, _ = run.select_prompts(*_args_and_profile(argv + ["--prompts-per-category", "2"]))
    assert {p.category for p in everything} == {"writing"} and len(everything) == 2
    held_out, summary = run.select_prompts(*_args_and_profile(argv + ["--prompts-per-category", "1",
                                                                      "--skip-per-category", "1"]))
    first, _ = run.select_prompts(*_args_and_profile(argv + ["--prompts-per-category", "1"]))
    assert [p.prompt_id for p in first] == ["specbench_question:2"]  # the shortest; held out: the other one
    assert sorted(p.prompt_id for p in first + held_out) == sorted(p.prompt_id for p in everything)
    assert "1 categories (--categories writing)" in summary


def _args_and_profile(argv):
    args = run.build_parser().parse_args(argv)
    return args, run.resolve_profile(args)


def test_length_cap_and_gsm8k_selection(tmp_path):
    kept, dropped = data.drop_long(_pool(), 50)
    assert {p.category for p in kept} == {"writing", "qa"} and dropped == ["rag"]
    assert data.drop_long(_pool(), None) == (_pool(), [])
    write_tiny_data(tmp_path)
    path = tmp_path / data.GSM8K_FILE
    assert [p.prompt_id for p in data.load_gsm8k(path, 2, 8)] == ["gsm8k:0", "gsm8k:1"]
    shortest = data.load_gsm8k(path, 1, 8, selection="shortest")
    assert [(p.prompt_id, p.gold) for p in shortest] == [("gsm8k:1", "16")]
    assert data.GSM8K_INSTRUCTION in shortest[0].text
    assert data.load_gsm8k(path, 0, 8) == []
    with pytest.raises(ValueError, match="only 2"):
        data.load_gsm8k(path, 3, 8)


def test_custom_prompt_file_formats(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"prompt": "hello"}\n\n{"prompt": "bye", "category": "greet"}\n'
                    '{"question_id": 7, "category": "qa", "turns": ["first", "second"]}\n')
    prompts = data.load_question_prompts(path, max_new_tokens=5)
    assert [(p.category, p.text) for p in prompts] == [("custom", "hello"), ("greet", "bye"), ("qa", "first")]
    assert prompts[2].prompt_id == "mine:7"
    path.write_text('{"text": "no prompt field"}\n')
    with pytest.raises(ValueError, match="neither"):
        data.load_question_prompts(path, 5)


# ---------------------------------------------------------------------------------------------------------------------
# Methods
# ---------------------------------------------------------------------------------------------------------------------


def test_rule_skip_reasons_come_from_what_the_rule_declares():
    draft = tiny_llama(seed=1)

    class GreedyLess(ExactRule):
        supports_greedy = False

    class NeedsSomething(ExactRule):
        requires_pruned_drafter = True

    class RefusesDraft(ExactRule):
        def check_assistant_model(self, assistant_model):
            raise SemSpecConfigError("needs a kernel")

    assert methods.rule_skip_reason(ExactRule(), draft, do_sample=False) is None
    assert "do_sample=False" in methods.rule_skip_reason(GreedyLess(), draft, do_sample=False)
    assert methods.rule_skip_reason(GreedyLess(), draft, do_sample=True) is None
    assert "requires_pruned_drafter" in methods.rule_skip_reason(NeedsSomething(), draft, do_sample=False)
    assert "needs a kernel" in methods.rule_skip_reason(RefusesDraft(), draft, do_sample=False)


def test_methods_order_gamma_and_rotation():
    draft = tiny_llama(seed=1)
    built, skipped = methods.build_methods(["exact"], {}, None, False, draft)
    assert [m.name for m in built] == ["plain", "stock_assisted", "semspec:exact"] and not skipped
    exact_default = RULES.get("exact").default_num_draft_tokens
    assert built[1].gamma == built[2].gamma == exact_default and built[0].gamma is None
    built, _ = methods.build_methods(["exact"], {}, 3, False, draft)
    assert [m.gamma for m in built] == [None, 3, 3]
    assert [m.name for m in methods.rotated(built, 1)] == ["stock_assisted", "semspec:exact", "plain"]
    assert methods.rotated(built, 3) == built
    with pytest.raises(ValueError, match="unknown"):
        methods.build_methods(["no_such_rule"], {}, None, False, draft)
    with pytest.raises(ValueError, match="unselected"):
        methods.build_methods(["exact"], {"fly": {}}, None, False, draft)


def test_draft_length_specs_expand_each_rule():
    assert methods.parse_draft_lengths(None) is None
    Spec = methods.DraftLengthSpec
    parsed = methods.parse_draft_lengths('constant:3, adaedl,tapout:16,tapout(bandit=ucb_tuned; arms=["svip","heuristic"])')
    assert parsed == [Spec("constant", 3), Spec("adaedl"), Spec("tapout", 16),
                      Spec("tapout", None, (("bandit", "ucb_tuned"), ("arms", ["svip", "heuristic"])))]
    assert [s.label for s in parsed] == ["constant:3", "adaedl", "tapout:16",
                                        'tapout(bandit=ucb_tuned;arms=["svip", "heuristic"])']
    assert methods.parse_draft_lengths(",".join(s.label for s in parsed)) == parsed  # a label parses back to itself
    # An arm with options is a JSON object inside the list; the entry's commas stay inside its brackets.
    with_options = methods.parse_draft_lengths('tapout(arms=[{"name": "cost_aware", "calibration_discount": 0.98}, '
                                               '"svip"]),constant:3')
    assert with_options == [Spec("tapout", None, (("arms", [{"name": "cost_aware", "calibration_discount": 0.98},
                                                            "svip"]),)), Spec("constant", 3)]
    with pytest.raises(ValueError, match=r"unknown policy 'fast'"):
        methods.parse_draft_lengths("fast")
    with pytest.raises(ValueError, match=r"'constant:x' must be <policy>, <policy>:<tokens> or"):
        methods.parse_draft_lengths("constant:x")
    with pytest.raises(ValueError, match=r"option 'ucb1' in 'tapout\(ucb1\)' must be <option>=<value>"):
        methods.parse_draft_lengths("tapout(ucb1)")
    built, _ = methods.build_methods(["exact", "fly"], {}, None, False, tiny_llama(seed=1),
                                     methods.parse_draft_lengths("constant:3,adaedl"))
    assert [m.name for m in built] == ["plain", "stock_assisted", "semspec:exact/constant:3", "semspec:exact/adaedl",
                                       "semspec:fly/constant:3", "semspec:fly/adaedl"]
    assert [(m.gamma, m.draft_length) for m in built[2:4]] == [(3, "constant"), (None, "adaedl")]
    # --num-assistant-tokens is the length of the entries that give none, as generate() fills one; stock runs it too
    # (it was stock's alone: stock and the policies ran at different lengths).
    built, _ = methods.build_methods(["exact"], {}, 2, False, tiny_llama(seed=1),
                                     methods.parse_draft_lengths("constant:3,constant,heuristic"))
    assert [(m.name, m.gamma) for m in built] == [("plain", None), ("stock_assisted", 2),
                                                 ("semspec:exact/constant:3", 3), ("semspec:exact/constant", 2),
                                                 ("semspec:exact/heuristic", 2)]
    assert [m.policy.max_tokens() for m in built[2:]] == [3, 2, 2]


def test_policy_methods_keep_one_instance_for_the_run():
    built, _ = methods.build_methods(["exact"], {}, None, False, tiny_llama(seed=1),
                                     methods.parse_draft_lengths("constant:3,tapout,adaedl:12,tapout(bandit=ucb1)"),
                                     include_stock=False)
    assert [m.name for m in built][0] == "plain" and "stock_assisted" not in [m.name for m in built]
    by_name = {m.name: m for m in built}
    assert by_name["semspec:exact/constant:3"].policy.max_tokens() == 3
    assert by_name["semspec:exact/adaedl:12"].policy.config.max_tokens == 12
    tapout = by_name["semspec:exact/tapout"]
    assert tapout.policy_for("qa") is tapout.policy_for("writing") is tapout.policy  # one instance for every prompt
    ucb1 = by_name["semspec:exact/tapout(bandit=ucb1)"]
    assert ucb1.policy.config.bandit == "ucb1" and by_name["semspec:exact/tapout"].policy.config.bandit == "ucb_tuned"
    assert ucb1.describe()["draft_length_kwargs"] == {"bandit": "ucb1"}
    # The results file records the options in force, defaults included.
    assert by_name["semspec:exact/tapout"].describe()["draft_length_config"]["bandit"] == "ucb_tuned"
    assert by_name["plain"].describe()["draft_length_config"] is None
    with pytest.raises(SemSpecConfigError, match=r"`draft_length_kwargs\['bandit'\]` = 'egreedy'"):
        methods.build_methods(["exact"], {}, None, False, tiny_llama(seed=1),
                              methods.parse_draft_lengths("tapout(bandit=egreedy)"), include_stock=False)
    # A length of 0 is refused as generate(num_assistant_tokens=0) refuses it, not read as "the default".
    with pytest.raises(SemSpecConfigError, match=r"`draft_length_kwargs\['num_tokens'\]` = 0 .*\[1, 128\]"):
        methods.build_methods(["exact"], {}, None, False, tiny_llama(seed=1),
                              methods.parse_draft_lengths("constant:0"), include_stock=False)
    # A cap below the rule's default draft length bounds the initial length, as in generate().
    capped = methods.build_policy("heuristic", None, 5, {"max_tokens": 3})
    assert capped.config.initial_tokens == 3


def test_policy_state_category_gives_each_category_its_own_instance_of_a_policy_that_learns():
    pair = tiny_pair("tiny")
    built, _ = methods.build_methods(["exact"], {}, None, False, pair.draft,
                                     methods.parse_draft_lengths("constant:3,heuristic,tapout(bandit=ucb1)"),
                                     include_stock=False, policy_state="category")
    # constant and heuristic keep nothing across calls (generate() builds them afresh): they run and are named as usual.
    assert [m.name for m in built] == ["plain", "semspec:exact/constant:3", "semspec:exact/heuristic",
                                       "semspec:exact/tapout(bandit=ucb1)/per-category"]
    heuristic, tapout = built[2], built[3]
    assert heuristic.policy_for("qa") is heuristic.policy and heuristic.describe()["policy_state"] == "run"
    assert tapout.describe()["policy_state"] == "category"
    writing, qa = tapout.policy_for("writing"), tapout.policy_for("qa")
    assert tapout.policy_for("writing") is writing and writing is not qa and tapout.policy not in (writing, qa)
    assert writing.config.bandit == qa.config.bandit == "ucb1" and writing.config is not qa.config
    # A timed call on a qa prompt teaches qa's bandit only.
    prompt = data.Prompt("specbench_question:3", "qa", "Who wrote Hamlet?", 12)
    hf_semspec.attach(pair.target)
    try:
        with metrics.ForwardMeter(pair.target) as target_meter, metrics.ForwardMeter(pair.draft) as draft_meter:
            methods.timed_run(tapout, pair, prompt, pair.encode(prompt.text), methods.Meters(target_meter, draft_meter),
                              [], False, None)
    finally:
        hf_semspec.detach(pair.target)
    assert sum(qa.pulls) > 0 and sum(writing.pulls) == 0 and sum(tapout.policy.pulls) == 0
    with pytest.raises(ValueError, match=r"--policy-state: got 'prompt'; expected one of \['run', 'category'\]"):
        methods.build_methods(["exact"], {}, None, False, pair.draft, methods.parse_draft_lengths("tapout"),
                              policy_state="prompt")


def test_run_on_the_same_prompts_as_an_earlier_run(tmp_path):
    write_tiny_data(tmp_path)
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"selection": {"prompt_ids": ["specbench_question:4", "specbench_question:1"]}}))
    argv = ["--data-dir", str(tmp_path), "--gsm8k", "0", "--same-prompts-as", str(earlier)]
    prompts, summary = run.select_prompts(*_args_and_profile(argv))
    # Every one of them (the quick profile alone would take 1 per category), round-robin by category.
    assert [(p.prompt_id, p.category) for p in prompts] == [("specbench_question:1", "writing"),
                                                            ("specbench_question:4", "qa")]
    assert "the prompts of earlier.json" in summary and "--limit" not in summary
    # --limit keeps the first of that order, and the summary says the run measured only part of them.
    limited, summary = run.select_prompts(*_args_and_profile(argv + ["--limit", "1"]))
    assert [p.prompt_id for p in limited] == ["specbench_question:1"]
    assert "1 from" in summary and "the prompts of earlier.json, the first 1 of 2 (--limit)" in summary
    earlier.write_text(json.dumps({"selection": {"prompt_ids": ["specbench_question:4", "gsm8k:7"]}}))
    with pytest.raises(ValueError, match=r"1 of its prompts are not in this run's Spec-Bench pool \(e.g. \['gsm8k:7'\]\)"):
        run.select_prompts(*_args_and_profile(argv))
    with pytest.raises(ValueError, match=r"with --prompts-per-category 2: expected one way to choose prompts"):
        run.select_prompts(*_args_and_profile(argv + ["--prompts-per-category", "2"]))
    # The shape of a selection too: recorded in the results but not applied to the earlier run's prompts.
    with pytest.raises(ValueError, match=r"with --selection spread and --max-prompt-chars 5: expected one way"):
        run.select_prompts(*_args_and_profile(argv + ["--selection", "spread", "--max-prompt-chars", "5"]))


def test_draft_length_section_compares_policies_with_the_best_fixed_length():
    def summary(geomean):
        return {"prompts": 1, "speedup_vs_plain": {"geomean": geomean, "median": geomean}}

    results = {
        "methods": [{"name": "plain", "rule": None, "draft_length": None}]
        + [{"name": f"semspec:exact/{p}", "rule": "exact", "draft_length": p.split(":")[0]}
           for p in ("constant:3", "constant:8", "tapout")],
        "aggregates": {
            "overall": {"plain": summary(1.0), "semspec:exact/constant:3": summary(1.2),
                        "semspec:exact/constant:8": summary(1.5), "semspec:exact/tapout": summary(1.44)},
            "per_category": {"coding": {"plain": summary(1.0), "semspec:exact/constant:3": summary(1.6),
                                        "semspec:exact/constant:8": summary(1.1), "semspec:exact/tapout": summary(1.6)}},
        },
    }
    text = "\n".join(report.draft_length_section(results))
    assert "| overall | `constant:8` 1.50× | 1.44× (0.960) |" in text
    assert "| coding | `constant:3` 1.60× | 1.60× (1.000) |" in text
    results["methods"] = results["methods"][:1]
    assert report.draft_length_section(results) == []


def _generation(prompt_id, category, method, forwards, drafts, wall_s, new_tokens=64):
    return {"prompt_id": prompt_id, "category": category, "method": method, "target_forwards": forwards,
            "draft_forwards": drafts, "new_tokens": new_tokens, "max_new_tokens": 64, "wall_s": wall_s,
            "acceptance_stats": {"num_drafted": drafts}}


def test_cost_model_recovers_the_costs_of_exactly_linear_timings():
    # wall = prefill(prompt) + 0.5 s per target forward + 0.1 s per drafted token, no noise.
    prefill = {"p0": 3.0, "p1": 7.0}
    counts = [(20, 60), (12, 70), (10, 90), (30, 31)]
    records = [_generation(p, "c", f"m{i}", f, d, prefill[p] + 0.5 * f + 0.1 * d)
               for p in prefill for i, (f, d) in enumerate(counts)]
    records.append({**_generation("p0", "c", "plain", 64, 0, 40.0), "acceptance_stats": None})  # not hf_semspec
    costs = metrics.fit_round_costs(records)
    assert costs["seconds_per_target_forward"] == pytest.approx(0.5)
    assert costs["seconds_per_draft_forward"] == pytest.approx(0.1)
    assert costs["r2"] == pytest.approx(1.0) and costs["residual_relative_sd"] == pytest.approx(0.0, abs=1e-9)
    assert (costs["generations"], costs["prompts"]) == (8, 2)
    # 64 tokens in 0.5 · 20 + 0.1 · 60 = 16 modeled seconds (the prefill is left out).
    assert metrics.modeled_tokens_per_s(records[0], costs) == pytest.approx(4.0)


def test_cost_model_is_none_when_not_determined():
    same_counts = [_generation(p, "c", f"m{i}", 10, 20, 5.0 + i) for p in ("p0", "p1") for i in range(3)]
    assert metrics.fit_round_costs(same_counts) is None  # F and D never vary: a and b cannot be told apart
    assert metrics.fit_round_costs(same_counts[:3]) is None  # 3 generations for 3 unknowns
    # Determined but not physical: more target forwards came with less time, so a < 0.
    backwards = [_generation("p0", "c", f"m{i}", f, d, 30.0 - 0.5 * f + 0.1 * d)
                 for i, (f, d) in enumerate([(20, 60), (12, 70), (10, 90), (30, 31)])]
    assert metrics.fit_round_costs(backwards) is None


def test_draft_length_section_adds_the_modeled_comparison():
    costs = {"seconds_per_target_forward": 0.5, "seconds_per_draft_forward": 0.1, "r2": 0.98,
             "residual_relative_sd": 0.06, "generations": 3, "prompts": 1}
    names = ["semspec:exact/constant:3", "semspec:exact/constant:8", "semspec:exact/tapout"]
    # Modeled seconds: 0.5 · 24 + 0.1 · 60 = 18, 0.5 · 12 + 0.1 · 96 = 15.6, 0.5 · 16 + 0.1 · 70 = 15.
    records = [_generation("p0", "coding", n, f, d, 20.0) for n, (f, d) in zip(names, [(24, 60), (12, 96), (16, 70)])]
    summary = {"prompts": 1, "speedup_vs_plain": {"geomean": 1.0, "median": 1.0}}
    results = {
        "methods": [{"name": "plain", "rule": None, "draft_length": None}]
        + [{"name": n, "rule": "exact", "draft_length": n.split("/")[1].split(":")[0]} for n in names],
        "aggregates": {"overall": {n: summary for n in ["plain"] + names},
                       "per_category": {"coding": {n: summary for n in ["plain"] + names}},
                       "cost_model": costs},
        "records": records,
    }
    text = "\n".join(report.draft_length_section(results))
    assert "0.500 s per target forward" in text and "6% (SD)" in text
    assert "| coding | `constant:8` 4.10 tok/s | 4.27 tok/s (1.04" in text  # 64 / 15.6 and 64 / 15
    assert "`tapout` 1 of 1" in text
    assert "priced by length" not in text
    # Priced by length (report.py --verify-cost): the same F and D as rounds of each length. constant:3 made 20
    # rounds of 3 and 4 of none, constant:8 12 rounds of 8, tapout 5 of 2, 10 of 6 and 1 of none. With v(0) = v(3) =
    # 0.5, v(2) = 0.9, v(6) = 0.55, v(8) = 0.6 and 0.1 s per draft: 20·0.5 + 4·0.5 + 6 = 18, 12·0.6 + 9.6 = 16.8,
    # 5·0.9 + 10·0.55 + 0.5 + 7 = 17.5 s, so tapout's rounds of 2 make it 0.96 of constant:8 instead of 1.04.
    for record, rounds in zip(records, [{3: 20, 0: 4}, {8: 12}, {2: 5, 6: 10, 0: 1}]):
        record["rounds_by_length"] = rounds
    results["aggregates"]["per_length_costs"] = {
        "verify_seconds": {"0": 0.5, "2": 0.9, "3": 0.5, "6": 0.55, "8": 0.6}, "seconds_per_draft_forward": 0.1,
        "cached_tokens": 51, "source": "verify.json"}
    text = "\n".join(report.draft_length_section(results))
    by_length = text[text.index("### The same comparison priced by length"):]
    assert ("per-length costs measured in `verify.json` (51 cached tokens): v(k) + 0.100 s per drafted token "
            "(v(0) = 0.500 s, v(2) = 0.900 s, v(3) = 0.500 s, v(8) = 0.600 s)") in by_length
    assert "| coding | `constant:8` 3.81 tok/s | 3.66 tok/s (0.96" in by_length  # 64 / 16.8 and 64 / 17.5
    assert "`tapout` 0 of 1" in by_length


def test_end_to_end_with_draft_length_policies(tmp_path):
    write_tiny_data(tmp_path / "data")
    argv = ["--profile", "quick", "--data-dir", str(tmp_path / "data"), "--output-dir", str(tmp_path / "out"),
            "--max-new-tokens", "8", "--gsm8k", "0", "--threads", "1", "--rules", "exact",
            "--draft-lengths", "constant:2,svip", "--no-profile-breakdown"]
    with thread_count_kept():
        results = run.main(argv, load_pair=tiny_pair)
    overall = results["aggregates"]["overall"]
    for name in ("semspec:exact/constant:2", "semspec:exact/svip"):
        assert overall[name]["identical_to_plain"] == 1.0  # every policy keeps exact lossless
    assert len(overall["semspec:exact/constant:2"]["acceptance"]["drafted_per_position"]) == 2
    assert "γ (drafted/round)" in (tmp_path / "out" / "quick.md").read_text()
    # report.py --verify-cost stores the per-length costs in the results and prices the rounds by length.
    verify = tmp_path / "verify.json"
    verify.write_text(json.dumps({"verify_seconds": {str(k): 0.5 + 0.01 * k for k in range(41)}, "draft_step": 0.1,
                                  "prompt_tokens": 51}))
    report.main([str(tmp_path / "out" / "quick.json"), "--no-plot", "--verify-cost", str(verify)])
    stored = json.loads((tmp_path / "out" / "quick.json").read_text())
    assert stored["aggregates"]["per_length_costs"]["source"] == "verify.json"
    assert stored["records"] == json.loads(json.dumps(results["records"], default=str))  # measurements untouched
    text = (tmp_path / "out" / "quick.md").read_text()
    assert "### The same comparison priced by length" in text and "in `verify.json` (51 cached tokens)" in text


def test_run_refuses_a_verify_cost_file_without_measurements_before_loading_models(tmp_path):
    write_tiny_data(tmp_path / "data")
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"records": []}))

    def must_not_load(*args, **kwargs):
        raise AssertionError("models were loaded before the options were checked")

    argv = ["--profile", "quick", "--data-dir", str(tmp_path / "data"), "--output-dir", str(tmp_path / "out"),
            "--verify-cost", str(wrong)]
    with pytest.raises(ValueError, match=r"wrong.json: no 'verify_seconds' in it. Fix"):
        run.main(argv, load_pair=must_not_load)


def test_run_loads_the_models_in_the_dtypes_asked(tmp_path):
    write_tiny_data(tmp_path / "data")
    asked = []

    def recording_pair(pair, **options):
        asked.append({k: options[k] for k in ("target_dtype", "draft_dtype")})
        raise RuntimeError("stop after loading")

    argv = ["--profile", "quick", "--data-dir", str(tmp_path / "data"), "--output-dir", str(tmp_path / "out")]
    for extra, expected in (([], {"target_dtype": "float32", "draft_dtype": "bfloat16"}),
                            (["--target-dtype", "bfloat16", "--draft-dtype", "float32"],
                             {"target_dtype": "bfloat16", "draft_dtype": "float32"})):
        with pytest.raises(RuntimeError, match="stop after loading"):
            run.main(argv + extra, load_pair=recording_pair)
        assert asked.pop() == expected


def test_rules_that_need_a_pruned_drafter_use_it():
    from conftest import SlicedHeadDrafter, nearest_neighbour_kernel

    draft = tiny_llama(seed=1)
    kept = torch.arange(0, 128, 2)
    pruned = SlicedHeadDrafter(draft, kept, *nearest_neighbour_kernel(draft, kept))
    built, skipped = methods.build_methods(["exact", "rdk"], {}, None, False, draft)
    assert "rdk" in skipped and [m.name for m in built][-1] == "semspec:exact"
    built, skipped = methods.build_methods(["exact", "rdk"], {}, None, False, draft, pruned_draft=pruned)
    assert not skipped
    assert [(m.name, m.uses_pruned_draft) for m in built[2:]] == [("semspec:exact", False), ("semspec:rdk", True)]


def test_prompt_lookup_and_drafting_flags_parse_and_refuse_what_would_not_apply():
    from hf_semspec.ngram import PromptLookup

    assert methods.parse_prompt_lookup(None) is None
    assert methods.parse_prompt_lookup("6") == PromptLookup(6, 2)  # transformers' n by default
    assert methods.parse_prompt_lookup("6:4") == PromptLookup(6, 4)
    assert methods.prompt_lookup_label(PromptLookup(6, 4)) == "6:4"
    for bad in ("0", "6:0", "129", "6:x", "x", "6:4:2", "-1"):
        with pytest.raises(ValueError, match=r"--prompt-lookup: got .* expected K\[:N\].*Fix: pass e.g."):
            methods.parse_prompt_lookup(bad)
    assert methods.parse_draftings(None) == ("model",)
    assert methods.parse_draftings("mla, model,lookup") == ("model", "lookup", "mla")  # in DRAFTINGS order
    for bad in ("model,foo", "lookup,lookup", ""):
        with pytest.raises(ValueError, match=r"--drafting: got .* subset of \['model', 'lookup', 'mla'\].*Fix"):
            methods.parse_draftings(bad)
    with pytest.raises(ValueError, match=r"--drafting model,lookup without --prompt-lookup: lookup draft by .*Fix: "
                                         r"add --prompt-lookup K\[:N\]"):
        methods.check_drafting_options(("model", "lookup"), None, None)
    with pytest.raises(ValueError, match=r"--prompt-lookup 6:2 with --drafting model: no method would draft by"):
        methods.check_drafting_options(("model",), PromptLookup(6), None)
    with pytest.raises(ValueError, match=r"--draft-lengths with --drafting model,mla: .*Fix: run .* as two runs"):
        methods.check_drafting_options(("model", "mla"), PromptLookup(6), methods.parse_draft_lengths("constant:3"))
    methods.check_drafting_options(("model",), None, methods.parse_draft_lengths("constant:3"))  # as before


def test_drafting_multiplies_each_rule_and_sets_the_generate_kwargs():
    from hf_semspec.ngram import PromptLookup

    pair = tiny_pair("tiny")
    lookup = PromptLookup(6, 4)
    built, skipped = methods.build_methods(["exact", "fly", "rdk"], {}, None, False, pair.draft, include_stock=False,
                                           draftings=("model", "lookup", "mla"), prompt_lookup=lookup)
    assert [m.name for m in built] == ["plain", "semspec:exact", "semspec:exact+lookup", "semspec:exact+mla",
                                       "semspec:fly", "semspec:fly+lookup", "semspec:fly+mla"]
    # rdk: skipped for each drafting, each with its own reason (lookup: it needs its drafter's kernel)
    assert set(skipped) == {"rdk", "rdk+lookup", "rdk+mla"}
    assert skipped["rdk+lookup"].startswith("it cannot run by prompt lookup alone: ")
    assert "prompt lookup has neither" in skipped["rdk+lookup"]
    by_name = {m.name: m for m in built}
    exact_gamma = RULES.get("exact").default_num_draft_tokens
    assert [(by_name[n].drafting, by_name[n].gamma) for n in ("semspec:exact", "semspec:exact+lookup",
                                                              "semspec:exact+mla")] == [
        ("model", exact_gamma), ("lookup", None), ("mla", exact_gamma)]  # lookup alone: k is the length
    model_kwargs = methods.semspec_generate_kwargs(by_name["semspec:fly"], pair)
    lookup_kwargs = methods.semspec_generate_kwargs(by_name["semspec:fly+lookup"], pair)
    mla_kwargs = methods.semspec_generate_kwargs(by_name["semspec:fly+mla"], pair)
    assert model_kwargs["assistant_model"] is pair.draft and "prompt_lookup_num_tokens" not in model_kwargs
    assert "assistant_model" not in lookup_kwargs  # no draft model at all
    assert (lookup_kwargs["prompt_lookup_num_tokens"], lookup_kwargs["max_matching_ngram_size"]) == (6, 4)
    assert lookup_kwargs["num_assistant_tokens"] is None and lookup_kwargs["acceptance"] == "fly"
    assert mla_kwargs["assistant_model"] is pair.draft
    assert (mla_kwargs["prompt_lookup_num_tokens"], mla_kwargs["max_matching_ngram_size"]) == (6, 4)
    assert mla_kwargs["num_assistant_tokens"] == RULES.get("fly").default_num_draft_tokens
    described = {m.name: m.describe() for m in built}
    assert (described["semspec:fly+lookup"]["draft"], described["semspec:fly+lookup"]["drafting"]) == ("none", "lookup")
    assert described["semspec:fly+mla"]["prompt_lookup"] == {"prompt_lookup_num_tokens": 6,
                                                             "max_matching_ngram_size": 4}
    assert described["semspec:fly"]["prompt_lookup"] is None and described["plain"]["drafting"] is None
    # --num-assistant-tokens is every method's length, prompt lookup alone's too (k still caps its rounds)
    built, _ = methods.build_methods(["exact"], {}, 3, False, pair.draft, include_stock=False,
                                     draftings=("lookup",), prompt_lookup=lookup)
    assert [(m.name, m.gamma) for m in built] == [("plain", None), ("semspec:exact+lookup", 3)]
    with pytest.raises(ValueError, match=r"--drafting lookup without --prompt-lookup"):
        methods.build_methods(["exact"], {}, None, False, pair.draft, draftings=("lookup",))


def test_acceptance_records_carry_every_drafting_count():
    from hf_semspec.stats import AcceptanceStats

    stats = AcceptanceStats()
    stats.record_round(4, 2, 3, num_draft_forwards=0, ngram_hit=True)
    stats.record_round(0, 0, 1)
    record = methods.acceptance_record(stats)
    assert (record["num_draft_forwards"], record["num_ngram_hits"], record["draft_forwards_per_drafted_token"]) == (
        0, 1, 0.0)
    assert record["num_ngram_drafts"] == 0
    assert methods.acceptance_record(None) is None
    # drafts confirmed from an n-gram (multi-level drafting)
    assert methods.acceptance_record(AcceptanceStats(num_drafted=8, num_ngram_drafts=5))["num_ngram_drafts"] == 5
    # Summed over a method's records, a count missing from a record (an older file) read as 0.
    records = [{"acceptance_stats": {"num_drafted": 8, "num_target_forwards": 4, "num_row_forwards": 4,
                                     "num_draft_forwards": 2, "num_ngram_hits": 3, "num_ngram_drafts": 6},
                "draft_forwards": 3},
               {"acceptance_stats": {"num_drafted": 2, "num_target_forwards": 6, "num_draft_forwards": 2},
                "draft_forwards": 3},
               {"acceptance_stats": None, "draft_forwards": 0}]
    assert metrics.drafting_summary(records) == {
        "num_drafted": 10, "num_row_forwards": 10, "num_draft_forwards": 4, "num_ngram_hits": 3, "num_ngram_drafts": 6,
        "draft_forwards_per_drafted_token": 0.4, "ngram_hit_rate": 0.3, "ngram_draft_share": 0.6,
        "draft_model_forwards": 6}
    assert metrics.drafting_summary(records[2:]) is None


def test_the_cost_model_leaves_out_prompt_lookup_generations():
    timings = []
    for p in range(4):
        for k, (forwards, drafts) in enumerate([(10, 20), (14, 12), (20, 5)]):
            timings.append(_generation(f"p{p}", "qa", f"m{k}", forwards, drafts, 0.5 + 0.1 * p + 0.2 * forwards
                                       + 0.05 * drafts))
    fitted = metrics.fit_round_costs(timings)
    lookup = [{**_generation(f"p{p}", "qa", "m+lookup", 9, 0, 99.0), "drafting": "lookup"} for p in range(4)]
    with_lookup = metrics.fit_round_costs(timings + lookup)  # not on the line a·F + b·D: left out
    assert with_lookup["generations"] == fitted["generations"] == 12
    assert with_lookup["seconds_per_target_forward"] == pytest.approx(0.2)
    assert with_lookup["seconds_per_draft_forward"] == pytest.approx(0.05)


def test_run_refuses_drafting_without_prompt_lookup_before_loading_models(tmp_path, capsys):
    write_tiny_data(tmp_path / "data")
    never = lambda *a, **k: pytest.fail("models loaded before the options were checked")  # noqa: E731
    common = ["--data-dir", str(tmp_path / "data"), "--output-dir", str(tmp_path / "out"), "--gsm8k", "0"]
    with pytest.raises(ValueError, match=r"--drafting model,mla without --prompt-lookup"):
        run.main(common + ["--drafting", "model,mla"], load_pair=never)
    with pytest.raises(ValueError, match=r"--prompt-lookup 6:4 with --drafting model: no method would draft"):
        run.main(common + ["--prompt-lookup", "6:4"], load_pair=never)
    with pytest.raises(SystemExit):
        run.build_parser().parse_args(["--prompt-lookup", "0:2"])
    assert "argument --prompt-lookup: got '0:2'; expected K[:N]" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------------------
# End to end on tiny models
# ---------------------------------------------------------------------------------------------------------------------


def tiny_pair(pair: str, **_options) -> models.ModelPair:
    """Tiny random Llamas and a fake tokenizer (characters → ids; ids → digits, so GSM8K parsing has numbers)."""
    target = tiny_llama(seed=0)
    draft = perturbed_copy(target, scale=0.3, seed=2)

    def encode(text: str) -> dict:
        ids = torch.tensor([[4 + ord(c) % 120 for c in text[:12]]])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    return models.ModelPair(target, draft, encode, lambda ids: " ".join(str(i % 10) for i in ids),
                            "tiny-target", "tiny-draft", {"target_dtype": "float32", "draft_dtype": "float32"})


@contextmanager
def thread_count_kept():
    """`run.main` sets the process's thread count (`--threads`): leave other tests as they were."""
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def write_tiny_data(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    questions = [
        {"question_id": 1, "category": "writing", "turns": ["Write a long poem about the sea.", "Again."]},
        {"question_id": 2, "category": "writing", "turns": ["A haiku."]},
        {"question_id": 3, "category": "qa", "turns": ["Who wrote Hamlet?"]},
        {"question_id": 4, "category": "qa", "turns": ["Why is the sky blue, in detail?"]},
    ]
    (folder / data.SPECBENCH_FILE).write_text("".join(json.dumps(q) + "\n" for q in questions))
    problems = [{"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"},
                {"question": "What is 4 * 4?", "answer": "#### 16"}]
    (folder / data.GSM8K_FILE).write_text("".join(json.dumps(p) + "\n" for p in problems))


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench")
    write_tiny_data(folder / "data")
    argv = ["--profile", "quick", "--data-dir", str(folder / "data"), "--output-dir", str(folder / "out"),
            "--max-new-tokens", "8", "--gsm8k", "1", "--gsm8k-max-new-tokens", "8",
            "--threads", "1"]
    with thread_count_kept():
        yield run.main(argv, load_pair=tiny_pair), folder / "out"


def test_end_to_end_every_registered_rule_appears(tiny_run):
    results, _ = tiny_run
    ran = {m["rule"] for m in results["methods"] if m["kind"] == "semspec"}
    assert ran | set(results["skipped_rules"]) == set(hf_semspec.available_rules())
    assert not ran & set(results["skipped_rules"])
    assert "exact" in ran and all(results["skipped_rules"].values())  # every skip has its reason
    names = [m["name"] for m in results["methods"]]
    assert names[:2] == ["plain", "stock_assisted"]
    # 2 Spec-Bench prompts (one per category, the shortest) + 1 GSM8K, each run by every method once
    assert results["selection"]["prompt_ids"] == ["specbench_question:2", "specbench_question:3", "gsm8k:1"]
    assert len(results["records"]) == 3 * len(names)
    for prompt_id in results["selection"]["prompt_ids"]:
        assert sorted(r["method"] for r in results["records"] if r["prompt_id"] == prompt_id) == sorted(names)


def test_end_to_end_exact_is_identical_to_plain_and_plain_tau_is_one(tiny_run):
    results, _ = tiny_run
    overall = results["aggregates"]["overall"]
    assert overall["plain"]["tau"] == 1.0
    assert all(r["tau"] == 1.0 for r in results["records"] if r["method"] == "plain")
    assert overall["semspec:exact"]["identical_to_plain"] == 1.0
    assert overall["plain"]["identical_to_plain"] == 1.0
    for r in results["records"]:
        if r["acceptance_stats"] is not None:  # the hook counts the same forwards as hf_semspec's own statistics
            assert r["target_forwards"] == r["acceptance_stats"]["num_target_forwards"]
            assert r["new_tokens"] == r["acceptance_stats"]["num_new_tokens"]
    gsm8k = [r for r in results["records"] if r["category"] == "gsm8k"]
    assert all(r["gsm8k"]["gold"] == "16" for r in gsm8k)
    assert overall["plain"]["gsm8k_graded"] == 1


def test_end_to_end_outputs_and_breakdown(tiny_run):
    results, out = tiny_run
    names = [m["name"] for m in results["methods"]]
    saved = json.loads((out / "quick.json").read_text())
    assert saved["machine"]["cpu_model"] and saved["machine"]["torch"] == torch.__version__
    assert saved["config"]["profile_settings"]["max_new_tokens"] == 8
    markdown = (out / "quick.md").read_text()
    for name in names:
        assert f"`{name}`" in markdown
    assert set(results["breakdown"]) == set(names)  # quick profiles every method's warm-up
    for name, b in results["breakdown"].items():
        if name.startswith("semspec:"):
            assert b["seconds"]["target_forward"] > 0 and b["seconds"]["draft"] > 0
            assert sum(b["share"].values()) == pytest.approx(1.0, abs=0.05)


def headings_joined_to_the_line_above(markdown: str) -> list[str]:
    """The headings that follow a non-blank line: after a table row, Markdown reads them as one more row."""
    lines = markdown.splitlines()
    return [line for above, line in zip(lines, lines[1:]) if line.startswith("#") and above.strip()]


def test_report_renders_every_method(tiny_run):
    results, _ = tiny_run
    markdown = report.render_markdown(results)
    assert headings_joined_to_the_line_above(markdown) == []
    overall = markdown.split("## Overall", 1)[1].split("##", 1)[0]
    for method in results["methods"]:
        assert f"| `{method['name']}` |" in overall


def test_report_points_at_the_divergence_script_where_a_lossless_rule_left_plains_text(tiny_run):
    results, _ = tiny_run
    note = "Lossless rules whose greedy text was not always plain's"
    assert results["aggregates"]["overall"]["semspec:exact"]["identical_to_plain"] == 1.0
    assert note not in report.render_markdown(results)
    overall = {name: dict(summary) for name, summary in results["aggregates"]["overall"].items()}
    overall["semspec:exact"]["identical_to_plain"] = 0.8
    overall["semspec:fly"]["identical_to_plain"] = 0.5  # lossy: differing is its design, not worth a note
    differing = {**results, "aggregates": {**results["aggregates"], "overall": overall}}
    text = report.render_markdown(differing)
    assert f"{note} (share identical): `semspec:exact` 0.80. `python -m benchmarks.divergence`" in text
    sampled = {**differing, "config": {**differing["config"], "sample": True}}
    assert note not in report.render_markdown(sampled)


def test_report_names_the_pruned_drafter_the_rdk_rows_used(tiny_run):
    results, _ = tiny_run
    assert "(`rdk`) ran with" not in report.render_markdown(results)
    with_pruned = {**results, "models": {**results["models"], "pruned_drafter": {
        "path": "/cache/pruned_drafters/draft-keep0.25-abc", "keep_size": 37984, "vocab_size": 151936}}}
    assert "ran with `draft-keep0.25-abc`: 37,984 of 151,936 tokens kept" in report.render_markdown(with_pruned)


@pytest.fixture(scope="module")
def lookup_run(tmp_path_factory):
    """A tiny run drafting with the draft model and by prompt lookup alone, interleaved."""
    folder = tmp_path_factory.mktemp("lookup")
    write_tiny_data(folder / "data")
    argv = ["--profile", "quick", "--data-dir", str(folder / "data"), "--output-dir", str(folder / "out"),
            "--max-new-tokens", "16", "--gsm8k", "1", "--gsm8k-max-new-tokens", "16", "--threads", "1",
            "--rules", "exact,fly,rdk", "--drafting", "model,lookup", "--prompt-lookup", "4:2", "--skip-stock",
            "--name", "lookup"]
    with thread_count_kept():
        yield run.main(argv, load_pair=tiny_pair), folder / "out"


def test_end_to_end_prompt_lookup_methods_record_their_drafting(lookup_run):
    results, out = lookup_run
    names = [m["name"] for m in results["methods"]]
    assert names == ["plain", "semspec:exact", "semspec:exact+lookup", "semspec:fly", "semspec:fly+lookup"]
    assert set(results["skipped_rules"]) == {"rdk", "rdk+lookup"}  # rdk+lookup: with its reason, not silently
    assert "prompt lookup alone" in results["skipped_rules"]["rdk+lookup"]
    assert len(results["records"]) == 3 * len(names)
    # Methods interleaved per prompt: the order rotates from prompt to prompt.
    firsts = [next(r["method"] for r in results["records"] if r["prompt_id"] == p and r["order"] == 0)
              for p in results["selection"]["prompt_ids"]]
    assert firsts == names[:3]
    for r in results["records"]:
        if r["method"] == "plain":
            assert r["acceptance_stats"] is None and r["drafting"] is None
            continue
        stats = r["acceptance_stats"]
        for name in ("num_draft_forwards", "num_ngram_hits", "num_ngram_drafts", "draft_forwards_per_drafted_token"):
            assert name in stats
        # the same counters for every method: the hook's forwards and the one token counter
        assert r["target_forwards"] == stats["num_target_forwards"] and r["new_tokens"] == stats["num_new_tokens"]
        if r["drafting"] == "lookup":
            assert r["draft_forwards"] == 0 and stats["num_draft_forwards"] == 0 and stats["num_ngram_drafts"] == 0
            assert stats["draft_forwards_per_drafted_token"] == 0.0
        else:
            assert r["drafting"] == "model" and stats["num_ngram_hits"] == 0
            assert stats["draft_forwards_per_drafted_token"] == 1.0
    overall = results["aggregates"]["overall"]
    assert overall["semspec:exact+lookup"]["identical_to_plain"] == 1.0  # lossless: plain greedy's text
    for name in ("semspec:exact+lookup", "semspec:fly+lookup"):
        drafting = overall[name]["drafting"]
        assert drafting["num_ngram_hits"] > 0 and drafting["draft_forwards_per_drafted_token"] == 0.0
        assert drafting["ngram_hit_rate"] == drafting["num_ngram_hits"] / drafting["num_row_forwards"]
    assert overall["plain"]["drafting"] is None
    described = {m["name"]: m for m in results["methods"]}
    assert described["semspec:exact+lookup"]["prompt_lookup"] == {"prompt_lookup_num_tokens": 4,
                                                                  "max_matching_ngram_size": 2}
    saved = json.loads((out / "lookup.json").read_text())
    assert saved["records"][1]["acceptance_stats"]["num_ngram_drafts"] == 0


def test_report_gives_the_drafting_columns_and_section_where_methods_draft_by_lookup(lookup_run, tiny_run):
    results, out = lookup_run
    text = (out / "lookup.md").read_text()
    assert headings_joined_to_the_line_above(text) == []
    overall = text.split("## Overall", 1)[1].split("\n## ", 1)[0]
    assert "| draft fwd/drafted | n-gram hits |" in overall
    hits = results["aggregates"]["overall"]["semspec:exact+lookup"]["drafting"]
    assert (f"| `semspec:exact+lookup` | 4 (" in overall
            and f"| 0.00 | {hits['ngram_hit_rate']:.2f} ({hits['num_ngram_hits']}/{hits['num_row_forwards']}) |"
            in overall)
    assert "| `semspec:exact` | 5 (" in overall and overall.split("| `semspec:exact` |")[1].split("\n")[0].endswith(
        "| 1.00 | - |")
    assert "- Skipped rule `rdk+lookup`: it cannot run by prompt lookup alone" in text
    section = text.split("## Drafting by prompt lookup", 1)[1].split("\n## ", 1)[0]
    assert "k = 4 tokens per round, n-grams up to 2 tokens" in section
    assert section.count("\n| `semspec:") == 2  # the lookup methods only
    # A multi-level drafting method (as MLA will record it): the same records, drafts confirmed from n-grams.
    mla = [{**r, "method": r["method"].replace("+lookup", "+mla"), "drafting": "mla", "draft_forwards": 2,
            "acceptance_stats": {**r["acceptance_stats"], "num_draft_forwards": 2, "num_ngram_drafts": 3}}
           for r in results["records"] if r["method"] == "semspec:exact+lookup"]
    methods_described = results["methods"] + [{**m, "name": "semspec:exact+mla", "drafting": "mla", "draft": "draft"}
                                              for m in results["methods"] if m["name"] == "semspec:exact+lookup"]
    records = results["records"] + mla
    metrics.add_per_prompt_ratios(records)
    names = [m["name"] for m in methods_described]
    with_mla = {**results, "methods": methods_described, "records": records,
                "aggregates": {**results["aggregates"], **metrics.aggregate(records, names)}}
    drafting = with_mla["aggregates"]["overall"]["semspec:exact+mla"]["drafting"]
    assert drafting["num_ngram_drafts"] == 9 and drafting["num_draft_forwards"] == 6
    section = report.render_markdown(with_mla).split("## Drafting by prompt lookup", 1)[1].split("\n## ", 1)[0]
    row = next(line for line in section.splitlines() if line.startswith("| `semspec:exact+mla` |"))
    assert f"| mla | {6 / drafting['num_drafted']:.2f} |" in row
    assert f"| {9 / drafting['num_drafted']:.2f} | 6 |" in row
    # A run without prompt lookup has neither (the earlier reports unchanged).
    plain_text = report.render_markdown(tiny_run[0])
    assert "draft fwd/drafted" not in plain_text and "## Drafting by prompt lookup" not in plain_text


def test_a_failing_generation_fails_the_run(tmp_path, monkeypatch):
    write_tiny_data(tmp_path / "data")
    real = methods.generate
    calls = []

    def failing(method, *args, **kwargs):
        calls.append(method.name)
        if calls.count("semspec:exact") == 2:  # the first call is its warm-up; the second, a timed prompt
            raise RuntimeError("boom")
        return real(method, *args, **kwargs)

    monkeypatch.setattr(methods, "generate", failing)
    argv = ["--data-dir", str(tmp_path / "data"), "--output-dir", str(tmp_path / "out"), "--rules", "exact",
            "--max-new-tokens", "8", "--gsm8k", "0", "--limit", "1", "--no-profile-breakdown",
            "--threads", "1"]
    with thread_count_kept():
        with pytest.raises(RuntimeError, match="boom"):
            run.main(argv, load_pair=tiny_pair)
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_a_stopped_run_resumes_from_its_saved_prompts_and_gives_the_uninterrupted_records(tmp_path, monkeypatch):
    """Stopped on the second prompt, a run keeps the first in <name>.json.partial; --resume runs only the second, and
    the results hold the same records (greedy: the same tokens) as a run that was never stopped."""
    write_tiny_data(tmp_path / "data")
    common = ["--data-dir", str(tmp_path / "data"), "--rules", "exact,dropmatch", "--skip-stock",
              "--max-new-tokens", "8", "--gsm8k", "0", "--limit", "2", "--no-profile-breakdown", "--threads", "1"]
    with thread_count_kept():
        whole = run.main(common + ["--output-dir", str(tmp_path / "whole")], load_pair=tiny_pair)

    real = methods.generate
    calls = []

    def stopping(method, pair, inputs, *args, **kwargs):  # 1 tiny call + 3 warm-ups + 3 methods on prompt 1
        calls.append(method.name)
        if len(calls) == 8:
            raise KeyboardInterrupt  # what a session's end or Ctrl-C does to a run
        return real(method, pair, inputs, *args, **kwargs)

    out = tmp_path / "out"
    argv = common + ["--output-dir", str(out)]
    monkeypatch.setattr(methods, "generate", stopping)
    with thread_count_kept(), pytest.raises(KeyboardInterrupt):
        run.main(argv, load_pair=tiny_pair)
    first_prompt = whole["selection"]["prompt_ids"][0]
    saved = json.loads((out / "quick.json.partial").read_text())
    assert list(saved["prompts"]) == [first_prompt] and len(saved["prompts"][first_prompt]["records"]) == 3
    assert not (out / "quick.json").exists()

    with thread_count_kept():
        with pytest.raises(ValueError, match=r"quick.json.partial holds the prompts .* Fix: add --resume"):
            run.main(argv, load_pair=tiny_pair)  # no silent start-over
        with pytest.raises(ValueError, match=r"other settings \(max_new_tokens\).* Fix: resume with the command line"):
            run.main(argv + ["--resume", "--max-new-tokens", "6"], load_pair=tiny_pair)
        moved = tmp_path / "moved-data"  # another checkout: the same prompts elsewhere resume
        shutil.copytree(tmp_path / "data", moved)
        argv[argv.index(str(tmp_path / "data"))] = str(moved)
        calls.clear()

        def counting(method, *args, **kwargs):
            calls.append(method.name)
            return real(method, *args, **kwargs)

        monkeypatch.setattr(methods, "generate", counting)
        resumed = run.main(argv + ["--resume"], load_pair=tiny_pair)
    assert len(calls) == 1 + 3 + 3  # tiny call, warm-ups, and the second prompt only
    assert not (out / "quick.json.partial").exists()
    assert resumed["timing"]["resumed"]["prompts"] == 1

    def tokens(results):
        return [(r["prompt_id"], r["method"], r["new_token_ids"]) for r in results["records"]]

    assert tokens(resumed) == tokens(whole)
    assert "- Resumed (`--resume`): 1 of 2 prompts ran in an earlier process" in (out / "quick.md").read_text()
    with thread_count_kept(), pytest.raises(ValueError, match=r"--resume: there is no .*quick.json.partial"):
        run.main(argv + ["--resume"], load_pair=tiny_pair)


def test_a_shorter_warm_up_leaves_the_timed_generations_their_budget(tmp_path):
    write_tiny_data(tmp_path / "data")
    argv = ["--data-dir", str(tmp_path / "data"), "--output-dir", str(tmp_path / "out"), "--rules", "exact",
            "--skip-stock", "--max-new-tokens", "8", "--gsm8k", "0", "--limit", "2", "--threads", "1",
            "--warmup-max-new-tokens", "3"]
    with thread_count_kept():
        with pytest.raises(ValueError, match=r"--warmup-max-new-tokens 3 with the time breakdown on .* Fix: add "
                                             r"--no-profile-breakdown"):
            run.main(argv, load_pair=tiny_pair)
        results = run.main(argv + ["--no-profile-breakdown"], load_pair=tiny_pair)
    assert {w["new_tokens"] for w in results["warmup"].values()} == {3}
    assert {r["max_new_tokens"] for r in results["records"]} == {8}
    assert max(r["new_tokens"] for r in results["records"]) > 3


@pytest.mark.slow
def test_cli_help_runs_as_a_script():
    result = subprocess.run([sys.executable, "benchmarks/run.py", "--help"], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "--pair" in result.stdout and "--profile" in result.stdout and "--gsm8k" in result.stdout


# Merging a run of new methods into an earlier sweep.


def _run(methods_counts: dict[str, tuple[int, int]], plain_speed: float, commit: str = "abc",
         prompts: tuple[str, ...] = ("p0", "p1")) -> dict:
    """A results dict of two prompts: `methods_counts[name] = (F, D)` for both prompts, 64 new tokens each."""
    timers = {"target_forward_s": 1.0, "draft_forward_s": 1.0}
    records = []
    for pid in prompts:
        records.append({**_generation(pid, "c", "plain", 64, 0, 64 / plain_speed), "acceptance_stats": None,
                        "tokens_per_s": plain_speed, "speedup_vs_plain": 1.0, "tau": 1.0, **timers})
        for name, (f, d) in methods_counts.items():
            wall = 2.0 + 0.5 * f + 0.1 * d
            stats = {"num_target_forwards": f, "num_drafted": d, "num_accepted": 64 - f, "num_new_tokens": 64,
                     "drafted_per_position": [f], "accepted_per_position": [f // 2]}
            records.append({**_generation(pid, "c", name, f, d, wall), "tokens_per_s": 64 / wall, "tau": 64 / f,
                            "speedup_vs_plain": (64 / wall) / plain_speed, "acceptance_stats": stats, **timers})
    return {
        "models": {"target": "t", "draft": "d", "draft_dtype": "bfloat16"},
        "config": {"max_new_tokens": 64, "sample": False},
        "selection": {"prompt_ids": list(prompts), "summary": f"prompts {', '.join(prompts)}"},
        "machine": {"git": {"commit": commit}},
        "methods": [{"name": "plain", "kind": "plain"}]
        + [{"name": n, "kind": "semspec", "rule": "exact", "draft_length": n.split("/")[1].split(":")[0].split("@")[0]}
           for n in methods_counts],
        "aggregates": {},
        "records": records,
    }


def test_merge_adds_the_new_methods_and_prices_them_at_the_base_costs():
    base = _run({"semspec:exact/constant:3": (24, 60), "semspec:exact/constant:8": (12, 96),
                 "semspec:exact/heuristic": (20, 70)}, plain_speed=2.0)
    added = _run({"semspec:exact/constant:3": (24, 60), "semspec:exact/best_constant": (16, 70)}, plain_speed=2.2,
                 commit="def")
    merged = merge.merge_runs(base, added, "base.json", "added.json")
    assert [m["name"] for m in merged["methods"]] == ["plain", "semspec:exact/constant:3", "semspec:exact/constant:8",
                                                      "semspec:exact/heuristic", "semspec:exact/best_constant"]
    assert len(merged["records"]) == len(base["records"]) + 2  # the anchor's records are the base run's
    info = merged["merged"]
    assert info["anchors"] == ["semspec:exact/constant:3"] and info["anchor_generations"] == 2
    assert info["added_methods"] == ["semspec:exact/best_constant"]
    assert info["plain_speed_added_over_base"] == pytest.approx(1.1)
    costs = merged["aggregates"]["cost_model"]  # fitted on the base records alone: wall = 2 + 0.5 F + 0.1 D
    assert costs["seconds_per_target_forward"] == pytest.approx(0.5)
    assert costs["seconds_per_draft_forward"] == pytest.approx(0.1)
    assert merged["aggregates"]["overall"]["semspec:exact/best_constant"]["prompts"] == 2
    text = "\n".join(report.draft_length_section(merged))
    assert "| overall | `constant:8` 4.10 tok/s | " in text and "4.27 tok/s (1.04" in text  # 64/15.6 and 64/15
    # The measured speed-ups are of two runs, each against its own plain: shown, not divided by one another.
    measured = text.split("### The same comparison without the timing noise")[0]
    assert "each against the plain decoding of the run that timed it" in measured
    assert "×  (" not in measured and not any(f"× ({d}" in measured for d in "0123456789")
    assert "within 3% of the best fixed length" not in measured


def test_merge_compares_measured_speeds_over_the_anchor_of_each_methods_own_run():
    base = _run({"semspec:exact/constant:3": (24, 60), "semspec:exact/constant:8": (12, 96)}, plain_speed=2.0)
    added = _run({"semspec:exact/constant:3": (24, 60), "semspec:exact/best_constant": (16, 70)}, plain_speed=2.0,
                 commit="def")
    for record in added["records"]:  # a machine 1.5x slower during the added run: every method alike
        record["wall_s"] *= 1.5
        record["tokens_per_s"] /= 1.5
    merged = merge.merge_runs(base, added, "base.json", "added.json")
    over = merged["merged"]["measured_over_anchor"]["semspec:exact/constant:3"]
    # walls 2 + 0.5 F + 0.1 D: the anchor 20 s, constant:8 17.6 s, best_constant 17 s, plain 32 s (64 tokens at 2/s)
    assert over["semspec:exact/best_constant"] == {"run": "added.json", "ratio": pytest.approx(20 / 17), "prompts": 2}
    assert over["semspec:exact/constant:8"] == {"run": "base.json", "ratio": pytest.approx(20 / 17.6), "prompts": 2}
    assert over["plain"]["ratio"] == pytest.approx(20 / 32) and "semspec:exact/constant:3" not in over
    # The overall table mixes the runs: best_constant's tokens/s there carries the slower machine.
    assert merged["aggregates"]["overall"]["semspec:exact/best_constant"]["tokens_per_s"] == pytest.approx(
        64 / 17 / 1.5)
    text = "\n".join(report._over_anchor_tables(merged))
    assert "### Measured over `semspec:exact/constant:3` in the same run" in text
    assert "| `semspec:exact/best_constant` | added.json | 1.176 | 2 |" in text
    assert "| `semspec:exact/constant:8` | base.json | 1.136 | 2 |" in text
    # Merged again, the merge's records of best_constant and constant:3 are of different runs: the merge's own rows
    # are kept, not recomputed from them.
    again = _run({"semspec:exact/constant:3": (24, 60), "semspec:exact/svip": (18, 80)}, plain_speed=2.0, commit="f")
    for record in again["records"]:
        record["wall_s"] *= 2
        record["tokens_per_s"] /= 2
    chained = merge.merge_runs(merged, again, "merged.json", "again.json")["merged"]["measured_over_anchor"]
    assert chained["semspec:exact/constant:3"]["semspec:exact/best_constant"]["ratio"] == pytest.approx(20 / 17)
    assert chained["semspec:exact/constant:3"]["semspec:exact/svip"] == {
        "run": "again.json", "ratio": pytest.approx(20 / 19), "prompts": 2}


def test_merge_takes_the_same_prompts_in_another_order():
    # A pooled base lists its runs' prompts one run after the other; a single run over the same prompts interleaves
    # the categories: the same prompts, so they merge.
    base = _run({"semspec:exact/constant:3": (24, 60)}, plain_speed=2.0, prompts=("p0", "p1"))
    added = _run({"semspec:exact/constant:3": (24, 60), "semspec:exact/svip": (16, 70)}, plain_speed=2.0,
                 prompts=("p1", "p0"))
    merged = merge.merge_runs(base, added, "base.json", "added.json")
    assert merged["selection"]["prompt_ids"] == ["p0", "p1"]
    assert merged["aggregates"]["overall"]["semspec:exact/svip"]["prompts"] == 2


def test_merge_keeps_a_changed_method_of_both_runs_under_the_added_commit():
    base = _run({"semspec:exact/constant:3": (24, 60), "semspec:exact/tapout": (20, 70)}, plain_speed=2.0)
    added = _run({"semspec:exact/constant:3": (24, 60), "semspec:exact/tapout": (18, 66)}, plain_speed=2.0,
                 commit="def4567890")
    with pytest.raises(ValueError, match=r"anchors did not repeat exactly.*tapout on p0"):
        merge.merge_runs(base, added, "base.json", "added.json")  # unnamed, the changed policy is taken for an anchor
    merged = merge.merge_runs(base, added, "base.json", "added.json", changed=["semspec:exact/tapout"])
    assert merged["merged"]["anchors"] == ["semspec:exact/constant:3"]
    assert merged["merged"]["added_methods"] == ["semspec:exact/tapout@def4567"]
    new = [r for r in merged["records"] if r["method"] == "semspec:exact/tapout@def4567"]
    assert [(r["target_forwards"], r["draft_forwards"]) for r in new] == [(18, 66)] * 2
    assert sum(r["method"] == "semspec:exact/tapout" for r in merged["records"]) == 2  # the base run's stay
    with pytest.raises(ValueError, match=r"--changed: \['semspec:exact/svip'\] were not measured in both runs"):
        merge.merge_runs(base, added, "base.json", "added.json", changed=["semspec:exact/svip"])


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: a["records"][1].update(target_forwards=23), r"anchors did not repeat exactly.*constant:3 on p0"),
        # Same counts, another text: the report would say the outputs were identical.
        (lambda a: a["records"][1].update(text="another answer"), r"constant:3 on p0: another output text"),
        (lambda a: a["selection"].update(prompt_ids=["p0", "p9"]), r"differ in prompts: \['p0', 'p1'\] vs \['p0', 'p9'\]"),
        # The budget the records were decoded with, not the flag (None when the profile's default was used).
        (lambda a: [r.update(max_new_tokens=128) for r in a["records"]], r"differ in max_new_tokens \(c\): \[64\] vs \[128\]"),
        (lambda a: a["models"].update(draft_dtype="float32"), r"differ in draft_dtype: 'bfloat16' vs 'float32'"),
        (lambda a: a["config"].update(sample=True), r"--sample"),
        (lambda a: [m.update(name="semspec:exact/other") for m in a["methods"][1:2]], r"no hf_semspec method"),
    ],
)
def test_merge_refuses_runs_that_are_not_comparable(change, message):
    base = _run({"semspec:exact/constant:3": (24, 60)}, plain_speed=2.0)
    added = _run({"semspec:exact/constant:3": (24, 60), "semspec:exact/best_constant": (16, 70)}, plain_speed=2.0)
    change(added)
    with pytest.raises(ValueError, match=message):
        merge.merge_runs(base, added, "base.json", "added.json")


def test_merge_and_pool_refuse_stock_baselines_of_other_thresholds():
    # The stock method is one method only at one confidence threshold: pooled, "speed-up vs stock" mixed two baselines.
    base = _run({"semspec:exact/constant:3": (24, 60)}, plain_speed=2.0)
    added = _run({"semspec:exact/constant:3": (20, 50)}, plain_speed=2.0, prompts=("p2", "p3"))
    for results, threshold in ((base, 0.4), (added, 0.0)):
        results["config"]["stock_confidence_threshold"] = threshold
        results["methods"].append({"name": "stock_assisted", "kind": "stock"})
    with pytest.raises(ValueError, match=r"stock baselines used --stock-confidence-threshold 0.4 vs 0.0.*Fix: run the "
                                         r"added methods with the base run's threshold"):
        merge.pool_runs(base, added, "base.json", "added.json")
    added["methods"].pop()  # a run without the stock method has no baseline to differ
    assert metrics.run_options(added) == {"sample": False}


def test_pool_joins_the_same_methods_on_other_prompts_at_the_base_costs():
    base = _run({"semspec:exact/constant:3": (24, 60), "semspec:exact/constant:8": (12, 96),
                 "semspec:exact/tapout@abc1234": (20, 70)}, plain_speed=2.0)
    added = _run({"semspec:exact/constant:3": (20, 50), "semspec:exact/constant:8": (10, 90),
                  "semspec:exact/tapout": (18, 66)}, plain_speed=2.2, commit="def", prompts=("p2", "p3"))
    pooled = merge.pool_runs(base, added, "base.json", "added.json",
                             {"semspec:exact/tapout": "semspec:exact/tapout@abc1234"})
    assert [m["name"] for m in pooled["methods"]] == [m["name"] for m in added["methods"]]
    assert pooled["selection"]["prompt_ids"] == ["p0", "p1", "p2", "p3"]
    assert len(pooled["records"]) == 16  # 4 prompts × (plain + 3 methods), the base tapout's renamed
    tapout = [r for r in pooled["records"] if r["method"] == "semspec:exact/tapout"]
    assert [(r["prompt_id"], r["target_forwards"]) for r in tapout] == [("p0", 20), ("p1", 20), ("p2", 18), ("p3", 18)]
    assert pooled["aggregates"]["overall"]["semspec:exact/tapout"]["prompts"] == 4
    assert pooled["aggregates"]["cost_model"]["seconds_per_target_forward"] == pytest.approx(0.5)  # the base fit
    assert pooled["pooled"]["base_methods"] == {"semspec:exact/tapout": "semspec:exact/tapout@abc1234"}
    # Modeled at 0.5 s/F + 0.1 s/D, geometric means over the 4 prompts: constant:8 sqrt(64/15.6 · 64/14) = 4.33,
    # tapout sqrt(64/17 · 64/15.6) = 3.93, constant:3 sqrt(64/18 · 64/15) = 3.89.
    text = "\n".join(report.draft_length_section(pooled))
    assert "| overall | `constant:8` 4.33 tok/s | 3.93 tok/s (0.9" in text


def test_pool_of_a_merge_keeps_its_header_but_not_its_measured_over_anchor_table():
    sweep = _run({"semspec:exact/constant:3": (24, 60), "semspec:exact/constant:8": (12, 96)}, plain_speed=2.0)
    new = _run({"semspec:exact/constant:3": (24, 60), "semspec:exact/tapout": (20, 70)}, plain_speed=2.0, commit="d")
    merged = merge.merge_runs(sweep, new, "sweep.json", "new.json")
    assert "measured_over_anchor" in merged["merged"]
    held_out = _run({"semspec:exact/constant:3": (20, 50), "semspec:exact/constant:8": (10, 90),
                     "semspec:exact/tapout": (18, 66)}, plain_speed=2.0, commit="e", prompts=("p2", "p3"))
    pooled = merge.pool_runs(merged, held_out, "merged.json", "held.json")
    # The table covered the merge's 2 prompts; shown in a 4-prompt report it would read as the pool's.
    assert pooled["merged"]["anchors"] == ["semspec:exact/constant:3"]
    assert "measured_over_anchor" not in pooled["merged"] and "measured_over_anchor" in merged["merged"]
    assert report._over_anchor_tables(pooled) == []


@pytest.mark.parametrize(
    "change, base_methods, message",
    [
        (lambda a: a["selection"].update(prompt_ids=["p1", "p2"]), {}, r"both runs measured \['p1'\]"),
        (lambda a: None, {}, r"the base run has no method 'semspec:exact/tapout' \(its methods: "),
        (lambda a: a["methods"][1].update(gamma=4), {"semspec:exact/tapout": "semspec:exact/tapout@abc1234"},
         r"other options in the two runs \(semspec:exact/constant:3: gamma None vs 4\)"),
        (lambda a: None, {"semspec:exact/svip": "semspec:exact/tapout@abc1234"},
         r"--base-method: \['semspec:exact/svip'\]"),
        (lambda a: [r.update(max_new_tokens=128) for r in a["records"]], {}, r"differ in max_new_tokens \(c\): \[64\] vs \[128\]"),
        (lambda a: a["models"].update(draft_dtype="float32"), {}, r"differ in draft_dtype: 'bfloat16' vs 'float32'"),
    ],
)
def test_pool_refuses_runs_that_are_not_the_same_methods_on_other_prompts(change, base_methods, message):
    base = _run({"semspec:exact/constant:3": (24, 60), "semspec:exact/tapout@abc1234": (20, 70)}, plain_speed=2.0)
    added = _run({"semspec:exact/constant:3": (20, 50), "semspec:exact/tapout": (18, 66)}, plain_speed=2.0,
                 prompts=("p2", "p3"))
    change(added)
    with pytest.raises(ValueError, match=message):
        merge.pool_runs(base, added, "base.json", "added.json", base_methods)


def test_pool_command_line_errors_name_the_option():
    with pytest.raises(ValueError, match=r"--base-method: got \['semspec:fly/tapout'\]; expected NEW=OLD"):
        merge._name_pairs(["semspec:fly/tapout"])
    assert merge._name_pairs(["a=b@1", "c=d"]) == {"a": "b@1", "c": "d"}
    with pytest.raises(SystemExit):
        merge.main(["base.json", "added.json", "--name", "x", "--base-method", "a=b"])  # without --pool


def test_merge_end_to_end_on_two_tiny_runs(tmp_path):
    write_tiny_data(tmp_path / "data")
    common = ["--profile", "quick", "--data-dir", str(tmp_path / "data"), "--output-dir", str(tmp_path / "out"),
              "--max-new-tokens", "8", "--gsm8k", "0", "--threads", "1", "--rules", "exact", "--skip-stock",
              "--no-profile-breakdown"]
    verify = tmp_path / "verify.json"  # run.py --verify-cost stores a verify_cost.py measurement with the run
    verify.write_text(json.dumps({"verify_seconds": {str(k): 0.5 + 0.01 * k for k in range(41)}, "draft_step": 0.1,
                                  "prompt_tokens": 51}))
    with thread_count_kept():
        sweep = run.main(common + ["--name", "sweep", "--draft-lengths", "constant:2,constant:4", "--verify-cost",
                                   str(verify)], load_pair=tiny_pair)
        run.main(common + ["--name", "new", "--draft-lengths", "constant:2,best_constant"], load_pair=tiny_pair)
    assert sweep["aggregates"]["per_length_costs"]["source"] == "verify.json"
    out = tmp_path / "out"
    merge.main([str(out / "sweep.json"), str(out / "new.json"), "--name", "merged"])
    merged = json.loads((out / "merged.json").read_text())
    assert [m["name"] for m in merged["methods"]] == ["plain", "semspec:exact/constant:2", "semspec:exact/constant:4",
                                                      "semspec:exact/best_constant"]
    assert merged["merged"]["anchors"] == ["semspec:exact/constant:2"]
    kept = json.loads(json.dumps(sweep["aggregates"]["per_length_costs"]))  # as the sweep's JSON holds it
    assert merged["aggregates"]["per_length_costs"] == kept  # the merge keeps the base run's measurement
    markdown = (out / "merged.md").read_text()
    assert "### The same comparison priced by length" in markdown
    assert "Merged report" in markdown and "| `semspec:exact/best_constant` |" in markdown
    assert "### Measured over `semspec:exact/constant:2` in the same run" in markdown
    assert "| `semspec:exact/best_constant` | new.json |" in markdown and "| `semspec:exact/constant:4` | sweep.json |" in markdown


def test_pool_end_to_end_on_a_tiny_run_and_its_held_out_prompts(tmp_path):
    write_tiny_data(tmp_path / "data")  # two prompts per category: the quick run takes one, the held-out run the other
    common = ["--profile", "quick", "--data-dir", str(tmp_path / "data"), "--output-dir", str(tmp_path / "out"),
              "--max-new-tokens", "8", "--gsm8k", "0", "--threads", "1", "--rules", "exact", "--skip-stock",
              "--no-profile-breakdown", "--draft-lengths", "constant:2,heuristic"]
    with thread_count_kept():
        first = run.main(common + ["--name", "first"], load_pair=tiny_pair)
        held_out = run.main(common + ["--name", "held", "--skip-per-category", "1"], load_pair=tiny_pair)
    assert not set(first["selection"]["prompt_ids"]) & set(held_out["selection"]["prompt_ids"])
    out = tmp_path / "out"
    merge.main([str(out / "first.json"), str(out / "held.json"), "--name", "pooled", "--pool"])
    pooled = json.loads((out / "pooled.json").read_text())
    assert pooled["aggregates"]["overall"]["semspec:exact/heuristic"]["prompts"] == 4
    markdown = (out / "pooled.md").read_text()
    assert "Pooled report" in markdown and "(1 per category held out, after the 1 that a smaller selection" in markdown


# Replaying fixed-budget policies on recorded acceptance traces.

COSTS = {"seconds_per_target_forward": 0.5, "seconds_per_draft_forward": 0.1}


def test_accepted_runs_count_right_predictions_in_a_row():
    assert replay.accepted_runs([1, 2, 9, 4, 5], [1, 2, 3, 4, 5]) == [2, 1, 0, 2, 1]


def test_replay_makes_the_live_loops_rounds_on_worked_runs():
    # Every prediction right, 10 tokens, γ = 3: rounds draft 3, 3, then 1 (the cap max_new_tokens − emitted − 1),
    # accept all and emit 4, 4, 2.
    runs = list(range(10, 0, -1))
    assert replay.replay(methods.build_policy("constant", 3, 5), runs, 10, COSTS) == {
        "target_forwards": 3, "draft_forwards": 7, "new_tokens": 10, "rounds_by_length": {3: 2, 1: 1}}
    # Predictions wrong at positions 2 and 5 (0-based) of 8: runs 2 1 0 2 1 0 2 1; γ = 3 rounds start at 0 (accept
    # 2, emit 3), 3 (accept 2, emit 3), 6 (budget 1, accept 1, emit 2).
    runs = replay.accepted_runs([1, 1, 0, 1, 1, 0, 1, 1], [1] * 8)
    assert runs == [2, 1, 0, 2, 1, 0, 2, 1]
    assert replay.replay(methods.build_policy("constant", 3, 5), runs, 8, COSTS) == {
        "target_forwards": 3, "draft_forwards": 7, "new_tokens": 8, "rounds_by_length": {3: 2, 1: 1}}


def test_replay_prices_rounds_by_length_with_per_length_costs():
    # γ = 3 over 10 right predictions: rounds of 3, 3, 1. Per-length costs v(1) = 0.6, v(3) = 0.7, d = 0.1: the policy
    # sees 0.7 + 0.3 = 1.0 s for a round of 3 and 0.6 + 0.1 = 0.7 s for the last; the line (0.5 + 0.1·k) would give
    # 0.8 and 0.6. The generation is priced 2·0.7 + 0.6 + 7·0.1 = 2.7 s.
    per_length = {"verify_seconds": {0: 0.5, 1: 0.6, 2: 0.9, 3: 0.7}, "seconds_per_draft_forward": 0.1}
    policy = methods.build_policy("constant", 3, 5)
    seen = []
    policy.observe = seen.append
    counts = replay.replay(policy, list(range(10, 0, -1)), 10, per_length)
    assert [(o.num_drafted, o.seconds) for o in seen] == [(3, pytest.approx(1.0)), (3, pytest.approx(1.0)),
                                                          (1, pytest.approx(0.7))]
    assert metrics.modeled_seconds(counts, per_length) == pytest.approx(2.7)
    assert metrics.modeled_seconds(counts, COSTS) == pytest.approx(3 * 0.5 + 7 * 0.1)
    with pytest.raises(ValueError, match=r"k = \[5\].*--max-k"):
        replay.replay(methods.build_policy("constant", 5, 5), list(range(10, 0, -1)), 10, per_length)


@pytest.mark.parametrize("entropy_nats", [0.0, 0.01, 0.6, 1.25, 3.0, 7.5])
def test_probs_with_entropy_has_that_entropy(entropy_nats):
    probs = replay.probs_with_entropy(entropy_nats)
    assert probs.sum().item() == pytest.approx(1.0, abs=1e-9) and bool((probs >= 0).all())
    assert float(torch.special.entr(probs).sum()) == pytest.approx(entropy_nats, abs=1e-6)


def test_replay_asks_a_per_token_policy_with_the_recorded_entropies():
    # svip stops when sqrt(0.15·H) > 0.3, i.e. H > 0.6. Every prediction right, 10 tokens: the first round (budget 9)
    # stops after its 3rd token (H = 0.9 at position 2) and accepts 3, emitting 4; the second (budget 10 − 4 − 1 = 5)
    # meets only H = 0.1 and drafts all 5 (the last is not asked), accepting them and emitting the remaining 6.
    entropies = [0.1, 0.1, 0.9] + [0.1] * 7
    counts = replay.replay(methods.build_policy("svip", None, 5), list(range(10, 0, -1)), 10, COSTS, entropies)
    assert counts == {"target_forwards": 2, "draft_forwards": 8, "new_tokens": 10, "rounds_by_length": {3: 1, 5: 1}}
    # Runs 1 0 4 3 2 1 (wrong prediction at position 1), H = 0.9 at position 3 only. Round at 0 (budget 5) stops after
    # its 4th token, past the wrong one: accepts 1, emits 2. Round at 2 (budget 3) stops after its 2nd (position 3
    # again): accepts 2, emits 3. Round at 5: budget 0, emits the last token. With H = 0.1 everywhere, the rounds at 0
    # and 2 draft 5 and 3 and emit 2 and 4.
    runs = replay.accepted_runs([1, 0, 1, 1, 1, 1], [1] * 6)
    assert runs == [1, 0, 4, 3, 2, 1]
    stops = replay.replay(methods.build_policy("svip", None, 5), runs, 6, COSTS, [0.1, 0.1, 0.1, 0.9, 0.1, 0.1])
    assert stops == {"target_forwards": 3, "draft_forwards": 4 + 2, "new_tokens": 6,
                     "rounds_by_length": {4: 1, 2: 1, 0: 1}}
    never_stops = replay.replay(methods.build_policy("svip", None, 5), runs, 6, COSTS, [0.1] * 6)
    assert never_stops == {"target_forwards": 2, "draft_forwards": 5 + 3, "new_tokens": 6,
                           "rounds_by_length": {5: 1, 3: 1}}
    # An output of 4 tokens that ended with an EOS (max_new_tokens 10), every prediction right: the per-token round
    # (budget 9) ends after drafting the EOS, as live; a fixed budget of 9 drafts on past it.
    at_eos = replay.replay(methods.build_policy("svip", None, 40), [4, 3, 2, 1], 10, COSTS, [0.1] * 4)
    assert at_eos == {"target_forwards": 1, "draft_forwards": 4, "new_tokens": 4, "rounds_by_length": {4: 1}}
    fixed = replay.replay(methods.build_policy("constant", None, 9), [4, 3, 2, 1], 10, COSTS, [0.1] * 4)
    assert fixed == {"target_forwards": 1, "draft_forwards": 9, "new_tokens": 4, "rounds_by_length": {9: 1}}


def test_replay_round_counts_pool_every_prompt_of_a_method():
    described = [{"name": "semspec:exact/constant:3"}, {"name": "semspec:exact/tapout"}]
    records = [
        {"method": "semspec:exact/constant:3", "target_forwards": 10, "draft_forwards": 30, "new_tokens": 32},
        {"method": "semspec:exact/constant:3", "target_forwards": 6, "draft_forwards": 18, "new_tokens": 16},
        {"method": "semspec:exact/tapout", "target_forwards": 8, "draft_forwards": 36, "new_tokens": 48},
    ]
    rows = replay.round_counts_table(described, records)[2:]
    # τ pools the prompts (48 tokens / 16 forwards = 3.00), not the mean of their ratios (3.2 and 2.67 → 2.93).
    assert rows == ["| `constant:3` | 3.00 | 3.0 | 16 | 48 |", "| `tapout` | 6.00 | 4.5 | 8 | 36 |"]


def test_replay_held_out_selection_leaves_out_the_tuning_prompts():
    # Two categories of four prompts, texts of lengths 1-4: shortest 2 per category after the 2 it takes first is
    # the two longest of each, and none of the first selection's.
    pool = [data.Prompt(f"{c}{n}", c, "x" * n, 8) for c in ("a", "b") for n in (3, 1, 4, 2)]
    first, _ = replay.held_out_selection(pool, 2, 0, "shortest", 300, 8)
    held_out, text = replay.held_out_selection(pool, 2, 2, "shortest", 300, 8)
    assert [p.prompt_id for p in first] == ["a1", "b1", "a2", "b2"]
    assert [p.prompt_id for p in held_out] == ["a3", "b3", "a4", "b4"]
    assert text == "4 Spec-Bench prompts (2 per category after the 2 it takes first, `shortest` selection, <= 300 " \
                   "characters), max_new_tokens=8"


def test_replay_refuses_what_a_trace_cannot_replay():
    class ReadsTopToken(SVIPPolicy):  # a per-token policy that is not known to read q only through H(q)
        name = "reads_top_token"

    with pytest.raises(ValueError, match="more than the draft's entropy"):
        replay.replay(ReadsTopToken(), [1, 0], 2, COSTS, [0.1, 0.1])
    with pytest.raises(ValueError, match="needs the trace's draft entropies"):
        replay.replay(methods.build_policy("svip", None, 5), [2, 1, 0], 3, COSTS)
    assert replay.replayable(methods.build_policy("tapout", None, 5))  # its default arms: cost_aware, svip


@pytest.mark.parametrize("entry", ["constant:2", "constant:4", "heuristic", "best_constant(cost_ratio=0.2)",
                                   'tapout(arms=["constant:2","constant:5"];reward=tokens_per_forward)',
                                   "svip(threshold=0.45)", "adaedl(adaptive=false)", "cost_aware(cost_ratio=0.2)",
                                   'tapout(arms=["adaedl","svip"];reward=tokens_per_forward)'])
def test_replay_reproduces_the_live_loop_on_tiny_models(entry):
    # The trace of the target's greedy output and the draft's teacher-forced predictions replays the rounds that
    # generate() makes: same target forwards and drafted tokens (timing-free options, so both see the same inputs:
    # cost_aware's ρ is fixed, and tapout's default arms are left out because cost_aware fits ρ to the wall time).
    pair = tiny_pair("tiny")
    prompt = data.Prompt("p", "c", "Write a long poem about the sea.", 24)
    trace = replay.record_trace(pair, prompt, eos_ids=[])
    (spec,) = methods.parse_draft_lengths(entry)
    replayed = replay.replay(methods.build_policy(spec.policy, spec.tokens, 5, dict(spec.options)), trace["runs"], 24,
                             COSTS, trace["entropies"])
    live_policy = methods.build_policy(spec.policy, spec.tokens, 5, dict(spec.options))
    hf_semspec.attach(pair.target)
    try:
        out = pair.target.generate(**pair.encode(prompt.text), assistant_model=pair.draft, acceptance="exact",
                                   draft_length=live_policy, max_new_tokens=24, min_new_tokens=24,
                                   return_dict_in_generate=True)
    finally:
        hf_semspec.detach(pair.target)
    stats = out.acceptance_stats
    assert out.sequences[0, -24:].tolist() == trace["tokens"]
    assert (replayed["target_forwards"], replayed["draft_forwards"]) == (stats.num_target_forwards, stats.num_drafted)
    assert 0 < stats.num_accepted < stats.num_drafted  # the trace has both right and wrong predictions


def test_replay_and_live_end_a_per_token_round_at_the_outputs_eos():
    # The same tiny output ended by an EOS at position 10, where the draft predicts it: svip that never stops on
    # entropy drafts up to its cap of 40 (cut by max_new_tokens) and both loops end the round after the EOS.
    pair = tiny_pair("tiny")
    prompt = data.Prompt("p", "c", "Write a long poem about the sea.", 24)
    full = replay.record_trace(pair, prompt, eos_ids=[])
    eos = full["tokens"][10]
    assert eos not in full["tokens"][:10] and full["runs"][10] > 0  # first occurrence, and the draft predicts it
    trace = replay.record_trace(pair, prompt, eos_ids=[eos])
    assert len(trace["tokens"]) == 11
    options = {"threshold": 5.0}
    asked = {"replay": [], "live": []}

    def asking(loop):  # the policy of `loop`, recording each decision it is asked for
        policy = methods.build_policy("svip", None, 5, options)
        decide = policy.keep_drafting
        policy.keep_drafting = lambda n, q: asked[loop].append(n) or decide(n, q)
        return policy

    replayed = replay.replay(asking("replay"), trace["runs"], 24, COSTS, trace["entropies"])
    hf_semspec.attach(pair.target)
    try:
        out = pair.target.generate(**pair.encode(prompt.text), assistant_model=pair.draft, acceptance="exact",
                                   draft_length=asking("live"), max_new_tokens=24, eos_token_id=eos,
                                   return_dict_in_generate=True)
    finally:
        hf_semspec.detach(pair.target)
    stats = out.acceptance_stats
    assert out.sequences[0, -11:].tolist() == trace["tokens"]
    assert (replayed["target_forwards"], replayed["draft_forwards"]) == (stats.num_target_forwards, stats.num_drafted)
    # The same decisions too: live asks the policy about the EOS draft before it reads the EOS (a learning policy
    # records that draft's entropy).
    assert asked["replay"] == asked["live"] and asked["live"]


def _replay_argv(tmp_path: Path, draft_lengths: str) -> tuple[list[str], Path]:
    """Arguments of a replay over the tiny data, its rounds priced by COSTS (a live run's cost model in a file), and
    that file."""
    write_tiny_data(tmp_path / "data")
    costs_file = tmp_path / "live.json"
    costs_file.write_text(json.dumps({"aggregates": {"cost_model": {**COSTS, "r2": 1.0}}, "records": []}))
    return ["--data-dir", str(tmp_path / "data"), "--max-new-tokens", "12", "--costs", str(costs_file),
            "--output-dir", str(tmp_path / "out"), "--draft-lengths", draft_lengths], costs_file


def _traced(argv: list[str], traces: Path) -> list[str]:
    """`argv` replaying the saved `traces`: without the options that choose prompts to trace, which --traces refuses."""
    selecting = {"--data-dir", "--max-new-tokens", "--prompts-per-category", "--skip-per-category", "--selection",
                 "--max-prompt-chars"}
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in selecting:
            skip = True
        else:
            kept.append(arg)
    return kept + ["--traces", str(traces)]


def test_replay_report_has_the_resolution_section_below_the_rounds_table(tmp_path):
    argv, _ = _replay_argv(tmp_path, "constant:2,constant:4,tapout")
    replay.main(argv + ["--name", "two", "--prompts-per-category", "2"], load_pair=tiny_pair)
    markdown = (tmp_path / "out" / "two.md").read_text()
    rounds, readable = markdown.split("## Rounds")[1].split("## How far the per-category comparison can be read")
    assert "| `tapout` |" in rounds and "| writing | 2 |" in readable
    assert headings_joined_to_the_line_above(markdown) == []


def test_replay_end_to_end_writes_the_comparison_and_reuses_its_traces(tmp_path):
    argv, costs_file = _replay_argv(tmp_path, "constant:2,constant:4,best_constant,tapout")
    results = replay.main(argv + ["--name", "first"], load_pair=tiny_pair)
    assert [t["prompt_id"] for t in results["traces"]] == ["specbench_question:2", "specbench_question:3"]
    assert len(results["records"]) == 4 * 2
    markdown = (tmp_path / "out" / "first.md").read_text()
    assert "`best_constant`" in markdown and "0.500 s per target forward" in markdown
    assert "| `best_constant` |" in markdown.split("## Rounds")[1]
    again = replay.main(_traced(argv, tmp_path / "out" / "first.json") + ["--name", "again"],
                        load_pair=lambda *a, **k: pytest.fail("reusing traces must not load models"))
    assert again["records"] == results["records"]
    # Per-length costs (a verify_cost.py JSON) instead of the line: fixed lengths make the same rounds; v(2) is priced.
    verify_file = tmp_path / "verify.json"
    verify = {str(k): 0.5 + (0.4 if k == 2 else 0.05 * k) for k in range(13)}
    verify_file.write_text(json.dumps({"verify_seconds": verify, "draft_step": 0.1, "prompt_tokens": 51}))
    at = argv.index("--costs")
    without_costs = _traced(argv[:at] + argv[at + 2:], tmp_path / "out" / "first.json")
    by_length = replay.main(without_costs + ["--name", "by_length", "--verify-cost", str(verify_file)],
                            load_pair=lambda *a, **k: pytest.fail("reusing traces must not load models"))

    def fixed_counts(records):
        return [(r["target_forwards"], r["draft_forwards"]) for r in records if "/constant:" in r["method"]]

    assert fixed_counts(by_length["records"]) == fixed_counts(results["records"])
    text = (tmp_path / "out" / "by_length.md").read_text()
    assert "per-length costs measured in `verify.json` (51 cached tokens)" in text and "v(2) = 0.900 s" in text
    both = without_costs + ["--costs", str(costs_file), "--verify-cost", str(verify_file)]
    for neither_or_both in (without_costs, both):
        with pytest.raises(ValueError, match="expected exactly one"):
            replay.main(neither_or_both, load_pair=tiny_pair)
    live = [{**r, "target_forwards": r["target_forwards"] + (r["prompt_id"].endswith(":3"))}
            for r in results["records"] if r["method"] == "semspec:exact/constant:2"]
    (tmp_path / "live_run.json").write_text(json.dumps({"aggregates": {}, "records": live}))
    checked = replay.check_against(tmp_path / "live_run.json", results["records"], COSTS)
    third = next(r for r in live if r["prompt_id"].endswith(":3"))  # live made one more forward on that prompt
    slower = (COSTS["seconds_per_target_forward"] * third["target_forwards"]
              + COSTS["seconds_per_draft_forward"] * third["draft_forwards"])
    faster = slower - COSTS["seconds_per_target_forward"]
    assert checked == {"semspec:exact/constant:2": {"identical": 1, "prompts": 2,
                                                    "modeled_ratio": pytest.approx(math.sqrt(slower / faster))}}
    # The same name with other recorded options (a default changed between the runs) is another policy: not compared.
    described = next(m for m in results["methods"] if m["name"] == "semspec:exact/constant:2")
    assert described["draft_length_config"]["num_tokens"] == 2
    changed = {**described, "draft_length_config": {**described["draft_length_config"], "num_tokens": 3}}
    (tmp_path / "live_run.json").write_text(json.dumps({"aggregates": {}, "records": live, "methods": [changed]}))
    assert replay.check_against(tmp_path / "live_run.json", results["records"], COSTS, results["methods"]) == {}
    (tmp_path / "live_run.json").write_text(json.dumps({"aggregates": {}, "records": live, "methods": [described]}))
    assert replay.check_against(tmp_path / "live_run.json", results["records"], COSTS, results["methods"]) == checked
    # Traces saved before entropies were recorded replay fixed budgets only.
    saved = json.loads((tmp_path / "out" / "first.json").read_text())
    for trace in saved["traces"]:
        del trace["entropies"]
    (tmp_path / "old.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match="needs the trace's draft entropies"):
        replay.main(_traced(argv[:-1] + ["svip"], tmp_path / "old.json"), load_pair=tiny_pair)


def test_replay_with_several_noise_seeds_replays_each_from_a_fresh_policy(tmp_path):
    argv = _replay_argv(tmp_path, "constant:2,tapout")[0] + ["--round-time-noise", "0.3"]
    results = replay.main(argv + ["--name", "seeds", "--seeds", "3"], load_pair=tiny_pair)
    traced = _traced(argv, tmp_path / "out" / "seeds.json")
    assert len(results["records"]) == 2 * 3 * 2  # methods × seeds × prompts
    for seed in (0, 2):  # seed 2 alone, from an untrained tapout, makes the same rounds as the third of three
        alone = replay.main(traced + ["--name", f"seed{seed}", "--seed", str(seed)], load_pair=tiny_pair)
        assert alone["records"] == [r for r in results["records"] if r["seed"] == seed]
    markdown = (tmp_path / "out" / "seeds.md").read_text()
    assert "seeds 0 to 2, a fresh policy each" in markdown and "| `tapout` |" in markdown
    with pytest.raises(ValueError, match="--seeds: got 3 with --round-time-noise 0.0"):
        replay.main(_traced(argv[:-2], tmp_path / "out" / "seeds.json") + ["--seeds", "3"], load_pair=tiny_pair)
    with pytest.raises(ValueError, match="--skip-per-category: got -1; expected >= 0"):
        replay.main(argv + ["--skip-per-category", "-1"], load_pair=lambda *a, **k: pytest.fail("loaded models"))
    # With --traces, options that choose the prompts to trace would do nothing: refused, not ignored.
    with pytest.raises(ValueError, match=r"--prompts-per-category, --max-new-tokens with --traces: .* Fix: drop"):
        replay.main(traced + ["--max-new-tokens", "256", "--prompts-per-category", "3"], load_pair=tiny_pair)
    # A file of another kind where a replay's or a run's is expected.
    with pytest.raises(ValueError, match=r"--traces .*live.json: expected a replay's results .*, got a live run's "
                                         r"results .*Fix: pass a replay's results JSON there"):
        replay.main(_traced(argv, tmp_path / "live.json"), load_pair=tiny_pair)
    with pytest.raises(ValueError, match=r"--costs .*seeds.json: expected a live run's results .*, got a replay's"):
        replay.main(_traced(argv, tmp_path / "out" / "seeds.json")[:-4] + ["--costs", str(tmp_path / "out" / "seeds.json")]
                    + ["--traces", str(tmp_path / "out" / "seeds.json")], load_pair=tiny_pair)


def test_replay_fresh_per_prompt_starts_every_prompt_from_an_untrained_policy(tmp_path):
    argv = _replay_argv(tmp_path, "heuristic,tapout")[0]
    shared = replay.main(argv + ["--name", "shared"], load_pair=tiny_pair)
    fresh = replay.main(_traced(argv, tmp_path / "out" / "shared.json") + ["--name", "fresh", "--fresh-per-prompt"],
                        load_pair=tiny_pair)
    default_tokens = RULES.get("exact").default_num_draft_tokens
    for name in ("heuristic", "tapout"):
        for trace in shared["traces"]:
            untrained = methods.build_policy(name, None, default_tokens, {})
            alone = replay.replay(untrained, trace["runs"], trace["max_new_tokens"], COSTS, trace["entropies"])
            record = next(r for r in fresh["records"]
                          if r["method"] == f"semspec:exact/{name}" and r["prompt_id"] == trace["prompt_id"])
            assert {k: record[k] for k in alone} == alone
    # Shared, tapout's second prompt starts from what the first taught it: other rounds than from scratch.
    second = shared["traces"][1]["prompt_id"]

    def tapout_counts(results):
        record = next(r for r in results["records"]
                      if r["method"] == "semspec:exact/tapout" and r["prompt_id"] == second)
        return record["target_forwards"], record["draft_forwards"]

    assert tapout_counts(shared) != tapout_counts(fresh)
    assert "a fresh policy for every prompt" in (tmp_path / "out" / "fresh.md").read_text()


def test_replay_policy_state_category_learns_each_category_on_its_own_prompts(tmp_path):
    argv = _replay_argv(tmp_path, "tapout")[0] + ["--prompts-per-category", "2"]
    shared = replay.main(argv + ["--name", "shared"], load_pair=tiny_pair)
    per_category = replay.main(_traced(argv, tmp_path / "out" / "shared.json")
                               + ["--name", "kind", "--policy-state", "category"], load_pair=tiny_pair)
    assert [t["category"] for t in shared["traces"]] == ["writing", "qa", "writing", "qa"]
    default_tokens = RULES.get("exact").default_num_draft_tokens
    for category in ("writing", "qa"):
        policy = methods.build_policy("tapout", None, default_tokens, {})  # one instance over the category's prompts
        for trace in (t for t in shared["traces"] if t["category"] == category):
            alone = replay.replay(policy, trace["runs"], trace["max_new_tokens"], COSTS, trace["entropies"])
            record = next(r for r in per_category["records"] if r["prompt_id"] == trace["prompt_id"])
            assert {k: record[k] for k in alone} == alone
    # Shared, the last qa prompt comes after three prompts of learning, not one: other rounds.
    last = shared["traces"][3]["prompt_id"]
    counts = [next((r["target_forwards"], r["draft_forwards"]) for r in results["records"] if r["prompt_id"] == last)
              for results in (shared, per_category)]
    assert counts[0] != counts[1]
    assert per_category["policy_state"] == "category"
    assert "one instance per category (`--policy-state category`)" in (tmp_path / "out" / "kind.md").read_text()


def _fly_rounds(marks: str, window: int) -> replay.FlyRounds:
    """`FlyRounds` from one mark per output position: `.` the draft predicts the output token, which is the target's;
    `k` it predicts the output token, which the target does not, at an uncertain position (the gate passes); `p` the
    same at a peaked position (the gate blocks); `x` the draft predicts another token than the output's."""
    return replay.FlyRounds([m == "." for m in marks], [m == "k" for m in marks], window)


def test_fly_rounds_follow_the_rules_worked_examples():
    # hf_semspec/rules/fly.py's worked examples (γ = 5, W = 3): a mismatch is kept when the gate passes and the W − 1
    # drafts after it match, with i + W < γ; the round accepts up to its first draft that is not accepted.
    assert _fly_rounds("k..k.", 3).round(0, 5) == (3, 0)  # (a): i = 0 kept; i = 3 has no room for the window
    assert _fly_rounds("k.k..", 3).round(0, 5) == (0, 0)  # (b): the window of i = 0 holds the mismatch at 2
    assert _fly_rounds(".p...", 3).round(0, 5) == (1, 1)  # (c): window complete, the gate blocks
    assert _fly_rounds(".k...", 3).round(0, 5) == (5, 1)  # (d): kept, every draft accepted
    assert _fly_rounds("..k..", 3).round(0, 5) == (2, 2)  # (e): i = 2 + 3 = γ, strict
    # The draft leaving the text is never kept (the trace cannot follow it); the same marks from another start, and
    # a round reaching past the output's end, which accepts through the end only.
    assert _fly_rounds(".x...", 3).round(0, 5) == (1, 1)
    assert _fly_rounds("xk...", 3).round(1, 5) == (4, 0)
    assert _fly_rounds("...", 3).round(1, 4) == (2, 2)
    assert _fly_rounds("...", 3).round(1, 0) == (0, 0)


@pytest.mark.parametrize("entry", ["constant:4", "constant:6", "svip(threshold=0.45)", "cost_aware(cost_ratio=0.2)",
                                   "cost_aware(cost_ratio=0.2;flip_prior=0.9)"])
def test_fly_replay_reproduces_the_live_loop_along_its_output_on_tiny_models(entry):
    # A live fly generation, then the trace along its output: replaying the same policy makes the same target forwards
    # and drafted tokens, the kept mismatches included (fixed lengths keep some with W = 2 and the gate off; per-token
    # policies stop before a window fits on these tiny models). cost_aware pricing the window decides otherwise than
    # without it only if the replay tells it the rule's W, as generate() does.
    pair = tiny_pair("tiny")
    prompt = data.Prompt("p", "c", "Write a long poem about the sea.", 24)
    rule_kwargs = {"window": 2, "entropy_threshold": 0.0}
    (spec,) = methods.parse_draft_lengths(entry)
    hf_semspec.attach(pair.target)
    try:
        out = pair.target.generate(**pair.encode(prompt.text), assistant_model=pair.draft, acceptance="fly",
                                   acceptance_kwargs=rule_kwargs, max_new_tokens=24, min_new_tokens=24,
                                   draft_length=methods.build_policy(spec.policy, spec.tokens, 15, dict(spec.options)),
                                   return_dict_in_generate=True)
    finally:
        hf_semspec.detach(pair.target)
    tokens = out.sequences[0, -24:].tolist()
    options = FLyConfig(**rule_kwargs).all_options()
    trace = replay.record_trace_along(pair, prompt, tokens, options)
    replayed = replay.replay(methods.build_policy(spec.policy, spec.tokens, 15, dict(spec.options)),
                             replay.FlyRounds.of_trace(trace), 24, COSTS, trace["entropies"])
    stats = out.acceptance_stats
    assert (replayed["target_forwards"], replayed["draft_forwards"]) == (stats.num_target_forwards, stats.num_drafted)
    kept = sum(d == x != t for d, x, t in zip(trace["draft_predictions"], tokens, trace["target_predictions"]))
    assert kept > 0 if spec.policy == "constant" else 0 < stats.num_accepted < stats.num_drafted


def test_fly_replay_end_to_end_along_a_live_run(tmp_path):
    # A live run with fly keeps each output's ids; the replay along one method's outputs makes that method's rounds
    # (--check against the same run), and its traces are reused with --traces.
    write_tiny_data(tmp_path / "data")
    argv = ["--profile", "quick", "--data-dir", str(tmp_path / "data"), "--output-dir", str(tmp_path / "out"),
            "--max-new-tokens", "12", "--gsm8k", "0", "--threads", "1", "--rules", "fly",
            "--acceptance-kwargs", '{"fly": {"window": 2, "entropy_threshold": 0.0}}',
            "--draft-lengths", "constant:3,constant:6", "--no-profile-breakdown"]
    with thread_count_kept():
        live = run.main(argv, load_pair=tiny_pair)
    live_file = tmp_path / "out" / "quick.json"
    assert all(len(r["new_token_ids"]) == r["new_tokens"] for r in json.loads(live_file.read_text())["records"])
    assert live["aggregates"]["overall"]["semspec:fly/constant:6"]["identical_to_plain"] < 1  # it kept mismatches
    costs_file = tmp_path / "costs.json"
    costs_file.write_text(json.dumps({"aggregates": {"cost_model": {**COSTS, "r2": 1.0}}, "records": []}))
    along = ["--rule", "fly", "--along", str(live_file), "--along-method", "semspec:fly/constant:6",
             "--data-dir", str(tmp_path / "data"), "--costs", str(costs_file), "--output-dir", str(tmp_path / "out"),
             "--draft-lengths", "constant:3,constant:6,tapout"]
    results = replay.main(along + ["--name", "along", "--check", str(live_file)], load_pair=tiny_pair)
    prompts = live["selection"]["prompt_ids"]
    assert [t["prompt_id"] for t in results["traces"]] == prompts
    assert results["check"]["semspec:fly/constant:6"] == {"identical": len(prompts), "prompts": len(prompts),
                                                          "modeled_ratio": pytest.approx(1.0)}
    assert results["traces"][0]["rule_options"]["window"] == 2 and results["rule"] == "fly"
    text = (tmp_path / "out" / "along.md").read_text()
    assert text.startswith("# Replayed draft-length policies (`fly`, greedy)") and "W = 2, θ = 0.0" in text
    again = replay.main(["--rule", "fly", "--traces", str(tmp_path / "out" / "along.json"), "--costs", str(costs_file),
                         "--output-dir", str(tmp_path / "out"), "--draft-lengths", "constant:3,constant:6,tapout",
                         "--name", "again"],
                        load_pair=lambda *a, **k: pytest.fail("reusing traces must not load models"))
    assert again["records"] == results["records"]


def test_fly_replay_refuses_what_it_cannot_follow(tmp_path):
    argv, costs_file = _replay_argv(tmp_path, "constant:2")
    with pytest.raises(ValueError, match=r"--rule fly needs --along RESULTS.json and --along-method NAME"):
        replay.main(argv + ["--rule", "fly"], load_pair=tiny_pair)
    with pytest.raises(ValueError, match=r"with --rule exact: .* Fix: drop them, or pass --rule fly"):
        replay.main(argv + ["--along", str(costs_file)], load_pair=tiny_pair)
    with pytest.raises(ValueError, match=r"--max-new-tokens with --along: the prompts and budgets are the live run's"):
        replay.main(argv + ["--rule", "fly", "--along", str(costs_file), "--along-method", "m"], load_pair=tiny_pair)
    exact = replay.main(argv + ["--name", "exact"], load_pair=tiny_pair)
    with pytest.raises(ValueError, match=r"its traces are of rule 'exact', not --rule 'fly'"):
        replay.main(_traced(argv, tmp_path / "out" / "exact.json") + ["--rule", "fly"], load_pair=tiny_pair)
    with pytest.raises(ValueError, match=r"with --traces .*exact.json: the saved traces already follow their outputs"):
        replay.main(_traced(argv, tmp_path / "out" / "exact.json") + ["--rule", "fly", "--along", str(costs_file),
                                                                      "--along-method", "m"], load_pair=tiny_pair)
    live = {"config": {}, "machine": {}, "methods": [{"name": "semspec:exact/constant:2", "rule": "exact"},
                                                     {"name": "semspec:fly/constant:8", "rule": "fly"}],
            "selection": {"prompt_ids": [t["prompt_id"] for t in exact["traces"]]}, "aggregates": {}, "records": []}
    live_file = tmp_path / "live-run.json"
    live_file.write_text(json.dumps(live))
    pair = tiny_pair("tiny")
    with pytest.raises(ValueError, match=r"no `fly` method of that name; its `fly` methods are "
                                         r"\['semspec:fly/constant:8'\]"):
        replay.along_outputs(live_file, "semspec:exact/constant:2", pair, tmp_path / "data")
    with pytest.raises(ValueError, match=r"is not in semspec:fly/constant:8's records"):
        replay.along_outputs(live_file, "semspec:fly/constant:8", pair, tmp_path / "data")
    live["records"] = [{"prompt_id": p, "method": "semspec:fly/constant:8", "text": "1 2", "new_tokens": 2,
                        "max_new_tokens": 12} for p in live["selection"]["prompt_ids"]]
    live_file.write_text(json.dumps(live))
    with pytest.raises(ValueError, match=r"no new_token_ids and this pair has no tokenizer"):
        replay.along_outputs(live_file, "semspec:fly/constant:8", pair, tmp_path / "data")
    pair.tokenize = lambda text: [int(c) for c in text.split()] + [7]  # one id too many: no round trip
    with pytest.raises(ValueError, match=r"does not encode back to its 2 new tokens \(got 3\)"):
        replay.along_outputs(live_file, "semspec:fly/constant:8", pair, tmp_path / "data")
    pair.tokenize = lambda text: [int(c) for c in text.split()]
    outputs, options, _ = replay.along_outputs(live_file, "semspec:fly/constant:8", pair, tmp_path / "data")
    assert [ids for _, ids in outputs] == [[1, 2]] * len(live["records"]) and options["window"] == 6
    live["config"]["sample"] = True
    live_file.write_text(json.dumps(live))
    with pytest.raises(ValueError, match=r"that run sampled \(--sample\), and the replay follows greedy `fly` only"):
        replay.along_outputs(live_file, "semspec:fly/constant:8", pair, tmp_path / "data")


def test_stock_method_leaves_the_drafts_generation_config_as_it_was():
    # Stock assisted generation reads γ from the draft's generation config, and hf_semspec reads it last too: the
    # stock method's γ must not become the next method's length.
    pair = tiny_pair("tiny")
    hf_semspec.attach(pair.target)
    inputs = pair.encode("abcdef")
    before = pair.draft.generation_config.to_dict()
    stock = methods.Method("stock_assisted", "stock", gamma=2)
    out = methods.generate(stock, pair, inputs, max_new_tokens=8, do_sample=False, stock_confidence_threshold=0.3)
    assert out.sequences.shape[1] == inputs["input_ids"].shape[1] + 8
    assert pair.draft.generation_config.to_dict() == before
    semspec = methods.Method("semspec:exact", "semspec", rule="exact")
    ours = methods.generate(semspec, pair, inputs, max_new_tokens=8, do_sample=False)
    assert len(ours.acceptance_stats.drafted_per_position) == RULES.get("exact").default_num_draft_tokens


def test_the_timed_loop_starts_the_policies_that_learn_untrained(tmp_path, monkeypatch):
    # The warm-up runs every method on the first prompt: what a policy learned there (unrecorded, profiled) must not
    # carry into the timed loop, which replay.py reproduces from untrained policies.
    write_tiny_data(tmp_path / "data")
    seen = {}
    timed_loop = run.timed_loop

    def checking(method_list, *args, **kwargs):
        for method in method_list:
            if method.policy is not None:
                first = getattr(method.policy.config, "first_length", lambda: None)()
                seen[method.name] = (getattr(method.policy, "num_tokens", None), list(getattr(method.policy, "pulls", [])),
                                     first)
        return timed_loop(method_list, *args, **kwargs)

    monkeypatch.setattr(run, "timed_loop", checking)
    with thread_count_kept():
        run.main(["--profile", "quick", "--data-dir", str(tmp_path / "data"), "--output-dir", str(tmp_path / "out"),
                  "--max-new-tokens", "12", "--gsm8k", "0", "--threads", "1", "--rules", "exact", "--skip-stock",
                  "--no-profile-breakdown", "--draft-lengths",
                  'heuristic,tapout(arms=["constant:2","constant:5"];reward=tokens_per_forward)'],
                 load_pair=tiny_pair)
    heuristic = seen["semspec:exact/heuristic"]
    assert heuristic[0] == heuristic[2] is not None  # at its first length, not where the warm-up left it
    tapout = next(v for k, v in seen.items() if "tapout" in k)
    assert tapout[1] == [0, 0]  # no arm pulled yet


def test_greedy_runs_are_seeded_too(tmp_path, monkeypatch):
    # Greedy dropmatch draws its dropout masks from torch's RNG, which only sampled runs seeded: two runs of the same
    # command could give other outputs and forward counts, under a results file that said "seed": 0.
    write_tiny_data(tmp_path / "data")
    seeds = []
    timed_run = methods.timed_run

    def recording(method, pair, prompt, inputs, meters, eos_ids, do_sample, seed, *args):
        seeds.append((method.name, prompt.prompt_id, do_sample, seed))
        return timed_run(method, pair, prompt, inputs, meters, eos_ids, do_sample, seed, *args)

    monkeypatch.setattr(methods, "timed_run", recording)
    with thread_count_kept():
        run.main(["--profile", "quick", "--data-dir", str(tmp_path / "data"), "--output-dir", str(tmp_path),
                  "--max-new-tokens", "8", "--gsm8k", "0", "--threads", "1", "--rules", "dropmatch", "--skip-stock",
                  "--no-profile-breakdown", "--seed", "7"], load_pair=tiny_pair)
    warm_up, timed = seeds[:2], seeds[2:]
    assert [seed for *_, seed in warm_up] == [7, 7]
    prompts = list(dict.fromkeys(prompt_id for _, prompt_id, _, _ in timed))
    assert len(prompts) == 2 and all(do_sample is False for _, _, do_sample, _ in timed)
    assert {(prompt_id, seed) for _, prompt_id, _, seed in timed} == {(prompts[0], 7), (prompts[1], 8)}


@pytest.mark.parametrize("flag, value", [("--limit", "-1"), ("--prompts-per-category", "0"),
                                         ("--num-assistant-tokens", "0"), ("--max-new-tokens", "-3"),
                                         ("--stock-confidence-threshold", "2"), ("--threads", "0")])
def test_run_refuses_numbers_out_of_range_naming_the_flag(flag, value, capsys):
    # They were taken silently: --limit -1 dropped a prompt, --num-assistant-tokens 0 ran the rule's default.
    with pytest.raises(SystemExit):
        run.build_parser().parse_args([flag, value])
    assert f"argument {flag}: expected " in capsys.readouterr().err


def test_run_checks_rules_and_options_before_loading_models(tmp_path):
    write_tiny_data(tmp_path / "data")
    never = lambda *a, **k: pytest.fail("models loaded before the options were checked")  # noqa: E731
    common = ["--data-dir", str(tmp_path / "data"), "--output-dir", str(tmp_path / "out"), "--gsm8k", "0"]
    with pytest.raises(SemSpecConfigError, match=r"unknown option\(s\) \['bta'\] for 'ears'"):
        run.main(common + ["--rules", "ears", "--acceptance-kwargs", '{"ears": {"bta": 1}}'], load_pair=never)
    with pytest.raises(SemSpecConfigError, match=r"svip"):
        run.main(common + ["--rules", "exact", "--draft-lengths", "svip(threshold=-1)"], load_pair=never)


def test_cpu_costs_reports_each_forward_against_its_own_processes_decode_step():
    # The README's "Running on a CPU" figures are read off this table: each ratio is to the same process's step.
    import argparse

    from benchmarks import cpu_costs

    args = argparse.Namespace(threads=2, repeats=3, cached_tokens=160, prefill_tokens=200, isa="native")
    target = {"role": "target", "dtype": "float32", "mkl_cbwr": None, "prefill_seconds": [], "entropy_seconds": [],
              "forward_seconds": {"1": [0.5, 0.4, 0.6], "6": [0.8, 0.9, 0.7], "16": [1.1, 1.0, 1.2]}}
    draft = {"role": "draft", "dtype": "bfloat16", "mkl_cbwr": "AUTO", "prefill_seconds": [2.0, 3.0, 4.0],
             "entropy_seconds": [0.001, 0.001, 0.002],
             "forward_seconds": {"1": [0.1, 0.2, 0.1], "5": [0.3, 0.3, 0.4], "7": [0.5, 0.4, 0.4]}}
    lines = cpu_costs.report([target, draft], args, ["avx2", "avx512f"])
    assert "CPU flags: avx2, avx512f; kernels limited to: native; torch's CPU capability in the runs: None." in lines
    # a column per width either model was timed at (the draft's 5 and 7: multi-level drafting's forwards)
    assert ("| model | dtype | MKL_CBWR | decode step | forward over 5 tokens (/ step) | forward over 6 tokens (/ step) "
            "| forward over 7 tokens (/ step) | forward over 16 tokens (/ step) |") in lines[-len([target, draft]) - 2]
    assert "| target | float32 | unset | 500 ms | — | 800 ms (1.60×) | — | 1100 ms (2.20×) | — | — |" in lines
    assert ("| draft | bfloat16 | AUTO | 100 ms | 300 ms (3.00×) | — | 400 ms (4.00×) | — | 3000 ms | 1.00 ms (1.0%) |"
            in lines)
    with pytest.raises(SystemExit):
        cpu_costs.main(["--cached-tokens", "8"])  # the 16-token forward re-reads the cache's last 16 tokens
    with pytest.raises(SystemExit):
        cpu_costs.main(["--roles", "draft,verifier"])


def test_quick_profile_ids_joins_the_quick_prompts_and_cuts_them(tmp_path):
    # The cache that verify_cost.py and cpu_costs.py time forwards over: each category's shortest prompt, encoded,
    # one after another, cut to the length asked.
    write_tiny_data(tmp_path)

    def encode(text):  # one id per word, the id naming the prompt (its length in characters)
        return {"input_ids": torch.full((1, len(text.split())), len(text))}

    prompts = data.select_balanced(data.drop_long(data.load_question_prompts(tmp_path / data.SPECBENCH_FILE, 64),
                                                  300)[0], 1, "shortest", 0)
    pieces = [encode(p.text)["input_ids"] for p in prompts]
    assert sorted(p.text for p in prompts) == ["A haiku.", "Who wrote Hamlet?"]
    assert torch.equal(models.quick_profile_ids(encode, tmp_path, None, "--x"), pieces[0])
    assert torch.equal(models.quick_profile_ids(encode, tmp_path, 4, "--x"), torch.cat(pieces, dim=1)[:, :4])
    with pytest.raises(ValueError, match=r"--x 6: the quick profile's prompts give only 5 tokens"):
        models.quick_profile_ids(encode, tmp_path, 6, "--x")
