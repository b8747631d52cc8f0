"""benchmarks/cpu_engine.py: the prompt sets, each way's generate() options, and the report's arithmetic (no models)."""

from __future__ import annotations

import json

import pytest

from benchmarks import cpu_engine, data

HAS_DATA = (data.DEFAULT_DATA_DIR / data.SPECBENCH_FILE).exists()


@pytest.mark.skipif(not HAS_DATA, reason="no ../shared/data here")
def test_the_prompt_sets_and_their_slices():
    code = cpu_engine.prompt_set("code", 256)
    assert [p.prompt_id for p in code] == [f"specbench_question:{i}" for i in range(121, 131)]
    assert {p.category for p in code} == {"coding"} and {p.max_new_tokens for p in code} == {256}
    assert [p.prompt_id for p in cpu_engine.prompt_set("code:2:4", 256)] == [p.prompt_id for p in code[2:4]]
    quick = cpu_engine.prompt_set("specbench-quick", 64)
    assert len({p.category for p in quick}) == len(quick) and all(len(p.text) <= 300 for p in quick)
    assert [p.prompt_id for p in cpu_engine.prompt_set("gsm8k:3:5", 64)] == ["gsm8k:3", "gsm8k:4"]
    with pytest.raises(ValueError, match="use gsm8k:START:END, specbench-quick"):
        cpu_engine.prompt_set("humaneval", 64)


def test_each_way_asks_generate_for_what_its_name_says():
    options = {m: cpu_engine._call_options(m, "draft", 512) for m in cpu_engine.GENERATE_METHODS}
    assert options["plain"] == {}
    assert options["plain-compiled"]["max_cache_len"] == 512
    assert options["plain-compiled"]["compile_config"]._compile_all_devices  # compiles on a CPU
    assert "assistant_model" not in options["lookup"] and options["lookup"]["prompt_lookup_num_tokens"] == 6
    assert options["exact+mla"]["assistant_model"] == "draft" and options["exact+mla"]["max_matching_ngram_size"] == 4
    assert options["auto"]["drafting"] == "auto" and "drafting" not in options["exact+mla"]
    assert options["exact-compiled"]["cache_implementation"] == "static"
    assert {o.get("num_assistant_tokens") for m, o in options.items() if "assistant_model" in o} == {cpu_engine.GAMMA}


def row(prompt_id, tokens, seconds, **extra):
    return {"prompt_id": prompt_id, "new_token_ids": tokens, "seconds": seconds, **extra}


def test_the_report_rates_ratios_identical_share_and_choices(tmp_path):
    machine = {"cpu_model": "EPYC", "cpu_isa": "AVX-512 BF16", "torch_threads": 1}
    common = {"prompts": "code:0:2", "prompt_ids": ["a", "b"], "max_new_tokens": 4, "dtype": "bfloat16",
              "machine": machine}
    vllm = {**common, "methods": {
        "vllm plain": {"rows": [row("a", [1, 2], 1.0), row("b", [3, 4], 1.0)]},  # 2 tok/s
        "vllm draft": {"rows": [row("a", [1, 2], 0.5), row("b", [3, 4], 0.5)]},  # 4 tok/s
        "vllm ngram": {"rows": [row("a", [1, 2], 0.25), row("b", [3, 4], 0.75)]},  # 4 tok/s, not above draft's
    }}
    reason = {"ms_per_token": {}}
    generate = {**common, "methods": {
        "generate plain": {"rows": [row("a", [1, 2], 2.0), row("b", [3, 4], 2.0)], "warmup_seconds": 3.2},
        "generate auto": {"rows": [row("a", [1, 2], 0.25, tau=2.0, drafting="lookup", drafting_reason=reason),
                                   row("b", [3, 5], 0.75, tau=3.0, drafting="draft", drafting_reason=reason)]},
    }}
    paths = []
    for name, run in (("v", vllm), ("g", generate)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(run))
    table = cpu_engine.report(paths)
    lines = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines() if line.startswith("| ")}
    assert "`vllm draft`" in table  # the best speculative vLLM method: ties keep the first
    assert lines["generate plain"].startswith("| generate plain | 1.00 | 0.50× | 0.25× | 1.00 | 2/2 | — | 3 |")
    assert lines["generate auto"].startswith("| generate auto | 4.00 | 2.00× | 1.00× | 2.50 | 1/2 | draft 1, lookup 1 |")
    assert "fastest fixed way" not in table  # no fixed way in these runs
    generate["methods"]["generate exact"] = {"rows": [row("a", [1, 2], 0.5), row("b", [3, 4], 0.25)]}  # 4 and 8 tok/s
    generate["methods"]["generate lookup"] = {"rows": [row("a", [1, 2], 1.0), row("b", [3, 4], 1.0)]}
    paths[1].write_text(json.dumps(generate))
    table = cpu_engine.report(paths)
    # auto: 8 and 2.67 tok/s against exact's 4 and 8: ratios 2 and 1/3, geometric mean sqrt(2/3)
    assert f"`generate exact`, prompt by prompt: {(2 / 3) ** 0.5:.2f}× (95% interval" in table
    assert "0.33–2.00× over 2 prompts." in table
    mixed = {**generate, "prompts": "gsm8k:0:2"}
    (tmp_path / "m.json").write_text(json.dumps(mixed))
    with pytest.raises(ValueError, match="several prompt sets"):
        cpu_engine.report([paths[0], tmp_path / "m.json"])
