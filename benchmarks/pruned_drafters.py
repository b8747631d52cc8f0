"""Pruned-vocabulary drafters on the reference pair: draft step time, acceptance rate and τ.

    python benchmarks/pruned_drafters.py                      # defaults: 2 prompts x 24 tokens, ~20 min on 2 cores
    python benchmarks/pruned_drafters.py --prompts 1 --max-new-tokens 12 --keeps 0.25   # a quick look
    python benchmarks/pruned_drafters.py --sweep-temperature  # also α(τ) of the RDK kernel on calibration text

Target Qwen2.5-Coder-1.5B-Instruct (float32), draft Qwen2.5-Coder-0.5B-Instruct (bfloat16), both from
`benchmarks/pypi_models.py`. Drafters: the unpruned draft (`exact`), and for each keep fraction a pruned drafter with
`exact` and with `rdk` (the same keep set; the RDK kernel uses the target's LM-head rows, m = 8 and
`--rdk-temperature`, default `hf_semspec.drafters.DEFAULT_TEMPERATURE`).

Data split (`/work/shared/data`, or `--data-dir`): the evaluation prompts are the first turns of `--prompts`
Spec-Bench questions taken round-robin from the categories in `EVAL_CATEGORIES` (lowest question ids first). The
keep set is counted on everything else: every other Spec-Bench turn, and GSM8K test questions and answers
(`--gsm8k-records`, minus any question that is an evaluation prompt), plus the draft's own greedy generations on
`--calibration-prompts` calibration Spec-Bench prompts (never evaluation prompts).

Measured per drafter and decoding mode (greedy; sampling at temperature 0.7 with one seed per prompt):
- draft step: milliseconds per drafted token, the median over rounds of (time in `ModelDrafter.draft`) / (tokens
  drafted that round), which includes the draft forward and turning its logits into drafts (and r for RDK);
- acceptance rate: accepted / drafted tokens; τ: new tokens per target forward (accepted + 1 per round);
- tok/s: new tokens per second of the whole `generate()` call.

`--sweep-temperature` also prints α = E Σ min(p, r) for several τ on held-out GSM8K answers (see
`hf_semspec.drafters.kernel.DEFAULT_TEMPERATURE`). Pruned drafters and calibration generations are cached under
`--cache-dir` (building the kernels takes minutes). Results are printed as a Markdown table, and with `--output`
also written (`<output>.md`, `<output>.json`). Timings on a shared 2-core machine are noisy; compare rows measured
in the same run.
"""

from __future__ import annotations

import os

os.environ.setdefault("MKL_CBWR", "AUTO")  # before torch

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

import hf_semspec  # noqa: E402
from hf_semspec import drafting  # noqa: E402
from hf_semspec.drafters import DEFAULT_TEMPERATURE, PrunedVocabDrafter, prune_vocabulary  # noqa: E402
from benchmarks.pypi_models import REFERENCE_PAIR, default_cache_dir, load_model  # noqa: E402
from hf_semspec.stats import AcceptanceStats  # noqa: E402

EVAL_CATEGORIES = ("coding", "writing", "math_reasoning", "qa", "reasoning", "extraction", "stem", "humanities")
DEFAULT_DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def split_data(data_dir: Path, num_eval: int, num_calibration: int, gsm8k_records: int, num_tuning: int = 4):
    """(evaluation prompts, keep-set corpus texts, calibration prompts, corpus label, tuning records): the tuning
    records are GSM8K test records after the first `gsm8k_records` (in neither the corpus nor the evaluation)."""
    spec = sorted(read_jsonl(data_dir / "specbench_question.jsonl"), key=lambda r: r["question_id"])
    by_category: dict[str, list[dict]] = {}
    for record in spec:
        by_category.setdefault(record["category"], []).append(record)
    eval_records: list[dict] = []
    depth = 0
    while len(eval_records) < num_eval:
        for category in EVAL_CATEGORIES:
            if len(eval_records) < num_eval and depth < len(by_category.get(category, [])):
                eval_records.append(by_category[category][depth])
        depth += 1
    eval_ids = {r["question_id"] for r in eval_records}
    eval_prompts = [r["turns"][0] for r in eval_records]
    rest = [r for r in spec if r["question_id"] not in eval_ids]
    # calibration prompts: short first turns of non-evaluation questions, one per category in turn
    calibration = []
    pool = [r for r in rest if r["category"] not in ("summarization", "rag") and len(r["turns"][0]) < 600]
    seen_categories: dict[str, int] = {}
    for record in pool:
        if len(calibration) >= num_calibration:
            break
        if seen_categories.get(record["category"], 0) < max(1, num_calibration // 8):
            calibration.append(record["turns"][0])
            seen_categories[record["category"]] = seen_categories.get(record["category"], 0) + 1
    texts = [t for r in rest for t in r["turns"]]
    eval_set = set(eval_prompts)
    all_gsm8k = read_jsonl(data_dir / "gsm8k_test.jsonl")
    gsm8k = [r for r in all_gsm8k[:gsm8k_records] if r["question"] not in eval_set]
    tuning = [r for r in all_gsm8k[gsm8k_records:] if r["question"] not in eval_set][:num_tuning]
    texts += [t for r in gsm8k for t in (r["question"], r["answer"])]
    label = (
        f"Spec-Bench questions without the {len(eval_records)} evaluation prompts ({len(rest)} records) + "
        f"GSM8K test questions and answers ({len(gsm8k)} records)"
    )
    return eval_prompts, texts, calibration, label, tuning


class DraftTimer:
    """Times `ModelDrafter.draft` (the class method, patched for the duration of the benchmark)."""

    def __init__(self):
        self.per_token_s: list[float] = []
        self._original = drafting.ModelDrafter.draft

    def __enter__(self):
        timer = self
        original = self._original

        def timed(drafter_self, batch, *args, **kwargs):
            start = time.perf_counter()
            block = original(drafter_self, batch, *args, **kwargs)
            drafted = block.num_tokens
            if drafted:
                timer.per_token_s.append((time.perf_counter() - start) / drafted)
            return block

        drafting.ModelDrafter.draft = timed
        return self

    def __exit__(self, *exc):
        drafting.ModelDrafter.draft = self._original


def encode(tokenizer, text: str) -> dict:
    encoded = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}


def run_config(target, drafter, rule, prompts_inputs, max_new_tokens, do_sample, num_draft_tokens):
    stats = AcceptanceStats()
    seconds = 0.0
    new_tokens = 0
    with DraftTimer() as timer:
        for index, inputs in enumerate(prompts_inputs):
            torch.manual_seed(1000 + index)
            kwargs = dict(do_sample=True, temperature=0.7, top_k=0, top_p=1.0) if do_sample else dict(do_sample=False)
            start = time.perf_counter()
            out = target.generate(
                **inputs, assistant_model=drafter, acceptance=rule, max_new_tokens=max_new_tokens,
                num_assistant_tokens=num_draft_tokens, return_dict_in_generate=True, **kwargs,
            )
            seconds += time.perf_counter() - start
            stats = stats + out.acceptance_stats
            new_tokens += out.sequences.shape[1] - inputs["input_ids"].shape[1]
    return {
        "draft_ms": 1000 * statistics.median(timer.per_token_s) if timer.per_token_s else float("nan"),
        "rounds": len(timer.per_token_s),
        "acceptance": stats.acceptance_rate,
        "tau": stats.mean_accepted_length,
        "tok_s": new_tokens / seconds,
        "drafted": stats.num_drafted,
    }


@torch.no_grad()
def temperature_sweep(target_probs, drafter, sequences, temperatures, sampling_temperature=0.7):
    """α = E[Σ_x min(p(x), r(x))] over the answer positions of `sequences` (`(ids (1, n), prompt_length)`; teacher
    forcing; `target_probs` = p at those positions), for the drafter's keep set and neighbours, with the kernel
    weights recomputed for each τ (scores recovered from the saved kernel), and without redistribution."""
    base_indices, base_weights = drafter.rdk_indices.cpu(), drafter.rdk_weights.cpu()
    tau0 = drafter.pruning_info["rdk"]["temperature"]
    log_ratio = (base_weights.clamp_min(1e-30).log() - base_weights[:, :1].clamp_min(1e-30).log())
    scores = 1.0 + tau0 * log_ratio  # s_j = 1 + τ0·log(w_j / w_0); column 0 is the self score 1
    kept = drafter.kept_token_ids.cpu()
    qs = []
    dtype = drafter.dtype
    drafter.float()  # bf16 prefill of long sequences is very slow on CPUs without native bf16; q in float32 here
    for ids, prompt_length in sequences:
        window = slice(prompt_length - 1, ids.shape[1] - 1)
        qs.append(torch.softmax(drafter(input_ids=ids).logits[0, window].float() / sampling_temperature, -1))
    drafter.to(dtype)
    p = target_probs
    q_kept = torch.cat(qs)
    q_full = torch.zeros_like(p)
    q_full[:, kept] = q_kept
    pruned = torch.ones(p.shape[1], dtype=torch.bool)
    pruned[kept] = False
    results = {
        "target mass on pruned tokens": float(p[:, pruned].sum(-1).mean()),
        "no kernel (q')": float(torch.minimum(p, q_full).sum(-1).mean()),
    }
    for tau in temperatures:
        weights = torch.softmax(scores / tau, -1)
        overlap = [  # in chunks of positions: r for all positions at once would hold positions × K·(m+1) floats
            torch.minimum(p[i : i + 32], drafting.redistribute(q_full[i : i + 32], kept, base_indices, weights)).sum(-1)
            for i in range(0, p.shape[0], 32)
        ]
        results[f"τ={tau}"] = float(torch.cat(overlap).mean())
        results[f"τ={tau} self weight"] = float(weights[:, 0].mean())
    return results, p.shape[0]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--prompts", type=int, default=2, help="evaluation prompts")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--num-draft-tokens", type=int, default=5, help="γ per round (constant policy)")
    parser.add_argument("--keeps", default="0.5,0.25,0.1", help="keep fractions")
    parser.add_argument("--calibration-prompts", type=int, default=4)
    parser.add_argument("--calibration-max-new-tokens", type=int, default=24)
    parser.add_argument("--gsm8k-records", type=int, default=600)
    parser.add_argument("--modes", default="greedy,sample")
    parser.add_argument("--sweep-temperature", action="store_true")
    parser.add_argument("--rdk-temperature", type=float, default=DEFAULT_TEMPERATURE, help="τ of the RDK kernels")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", type=Path, default=None,
                        help="also write the table to <output>.md and the raw numbers to <output>.json")
    parser.add_argument(
        "--cache-dir", type=Path, default=default_cache_dir() / "pruned_drafters",
        help="pruned drafters are saved here and reused by later runs with the same data split ('' to disable)",
    )
    args = parser.parse_args(argv)
    if args.cache_dir is not None and str(args.cache_dir) in ("", "."):
        args.cache_dir = None
    torch.set_num_threads(args.threads)
    started = time.perf_counter()

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f}s] {message}", file=sys.stderr, flush=True)

    target_name, draft_name = REFERENCE_PAIR
    target, tokenizer = load_model(target_name, dtype=torch.float32)
    draft, draft_tokenizer = load_model(draft_name, dtype=torch.bfloat16)
    hf_semspec.attach(target)
    log("models loaded")
    eval_prompts, corpus, calibration, label, tuning = split_data(
        args.data_dir, args.prompts, args.calibration_prompts, args.gsm8k_records
    )
    inputs = [encode(tokenizer, p) for p in eval_prompts]
    log(f"{len(eval_prompts)} evaluation prompts ({[i['input_ids'].shape[1] for i in inputs]} tokens), "
        f"{len(corpus)} corpus texts, {len(calibration)} calibration prompts")

    keeps = [float(k) for k in args.keeps.split(",") if k]
    drafters = {"unpruned": draft}
    infos = {}
    calibration_texts = []
    calibration_key = hashlib.sha256(json.dumps([calibration, draft_name, args.calibration_max_new_tokens]).encode())
    calibration_cache = args.cache_dir / f"calibration-{calibration_key.hexdigest()[:12]}.json" if args.cache_dir else None
    if calibration and calibration_cache is not None and calibration_cache.is_file():
        calibration_texts = json.loads(calibration_cache.read_text(encoding="utf-8"))
        log(f"calibration generations read from {calibration_cache}")
    elif calibration:
        from hf_semspec.drafters.keep_set import encode_prompt

        # Generated once and counted as corpus texts for every fraction (prune_vocabulary(calibration_prompts=...)
        # would generate again for each fraction).
        for prompt in calibration:
            ids = encode_prompt(draft_tokenizer, prompt, True)
            out = type(draft).generate(draft, ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                       max_new_tokens=args.calibration_max_new_tokens,
                                       pad_token_id=draft_tokenizer.pad_token_id)
            calibration_texts.append(draft_tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
        log(f"calibration generations done ({len(calibration_texts)})")
        if calibration_cache is not None:
            calibration_cache.parent.mkdir(parents=True, exist_ok=True)
            calibration_cache.write_text(json.dumps(calibration_texts), encoding="utf-8")
    corpus_texts = corpus + calibration_texts
    corpus_label = label + (f" + the draft's greedy generations on {len(calibration)} calibration prompts "
                            f"(≤ {args.calibration_max_new_tokens} tokens each)" if calibration_texts else "")
    digest = hashlib.sha256(
        json.dumps([corpus_texts, target_name, draft_name, args.rdk_temperature]).encode()
    ).hexdigest()[:12]
    for keep in keeps:
        cached = args.cache_dir / f"{draft_name}-keep{keep}-{digest}" if args.cache_dir else None
        if cached is not None and (cached / "pruning_config.json").is_file():
            drafter = PrunedVocabDrafter.from_pretrained(cached, dtype=torch.bfloat16, load_tokenizer=False)
            log(f"loaded the cached drafter {cached}")
        else:
            drafter = prune_vocabulary(
                draft, draft_tokenizer, corpus_texts, keep=keep, corpus_label=corpus_label, rdk=True,
                rdk_temperature=args.rdk_temperature, target_model=target, target_tokenizer=tokenizer,
            )
            if cached is not None:
                drafter.save_pretrained(cached)
        drafters[f"pruned {keep:.0%}"] = drafter
        infos[keep] = drafter.pruning_info
        log(f"pruned to {drafter.num_kept} tokens ({keep:.0%}); coverage {drafter.pruning_info['selection']['coverage']:.4f}, "
            f"mean RDK self weight {drafter.pruning_info['rdk']['mean_self_weight']:.4f}")

    if args.sweep_temperature and keeps:
        temperatures = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
        # held-out text: GSM8K questions (chat prompt) followed by their reference answers, teacher-forced
        sequences = []
        for record in tuning:
            prompt_ids = encode(tokenizer, record["question"])["input_ids"]
            answer_ids = tokenizer(record["answer"], add_special_tokens=False, return_tensors="pt")["input_ids"]
            sequences.append((torch.cat([prompt_ids, answer_ids], dim=1), prompt_ids.shape[1]))
        with torch.no_grad():  # logits at position t predict token t + 1: keep the positions predicting the answer
            target_probs = torch.cat([
                torch.softmax(target(input_ids=ids).logits[0, prompt_length - 1 : ids.shape[1] - 1].float() / 0.7, -1)
                for ids, prompt_length in sequences
            ])
        sweeps = {}
        for keep in keeps:
            sweeps[keep], positions = temperature_sweep(target_probs, drafters[f"pruned {keep:.0%}"], sequences, temperatures)
        print(f"\nα = E Σ min(p, r), p and q at temperature 0.7, over the {positions} answer positions of {len(tuning)} "
              "held-out GSM8K records (teacher forcing; in neither the keep-set corpus nor the evaluation):\n")
        print("| kernel | " + " | ".join(f"α, keep {k:.0%}" for k in keeps) + " | mean self weight (keep "
              f"{keeps[-1]:.0%}) |")
        print("| --- | " + " | ".join("---" for _ in keeps) + " | --- |")
        for name in sweeps[keeps[0]]:
            if not name.endswith("self weight"):
                self_weight = sweeps[keeps[-1]].get(name + " self weight", 1.0 if name.startswith("no kernel") else None)
                print(f"| {name} | " + " | ".join(f"{sweeps[k][name]:.4f}" for k in keeps)
                      + (f" | {self_weight:.4f} |" if self_weight is not None else " | — |"))
        log("temperature sweep done")

    configs = [("unpruned", "exact")] + [(f"pruned {k:.0%}", rule) for k in keeps for rule in ("exact", "rdk")]
    modes = [m for m in args.modes.split(",") if m]
    rows = []
    if modes:  # warm-up (untimed), every drafter and rule in every mode: first calls pay for allocations and kernels
        for mode in modes:
            for name, rule in configs:
                target.generate(**inputs[0], assistant_model=drafters[name], acceptance=rule, max_new_tokens=8,
                                do_sample=mode == "sample", num_assistant_tokens=args.num_draft_tokens)
        log("warm-up done")
    for mode in modes:
        for name, rule in configs:
            result = run_config(target, drafters[name], rule, inputs, args.max_new_tokens, mode == "sample",
                                args.num_draft_tokens)
            rows.append((mode, name, rule, result))
            log(f"{mode} {name} {rule}: {result}")

    lines = [
        f"Reference pair: {target_name} (float32) target, {draft_name} (bfloat16) draft; "
        f"{len(inputs)} Spec-Bench prompts ({', '.join(EVAL_CATEGORIES[:len(inputs)])}), "
        f"{args.max_new_tokens} new tokens, γ = {args.num_draft_tokens}, {args.threads} threads.",
        "",
    ]
    taus = {round(d.pruning_info["rdk"]["temperature"], 4) for d in drafters.values() if hasattr(d, "pruning_info")}
    lines += [f"RDK kernels: m = 8, τ = {sorted(taus)}. Column τ below is the mean accepted length.", ""]
    lines += ["| mode | drafter | K | rule | draft step (ms/token, median) | acceptance rate | τ | tok/s |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for mode, name, rule, r in rows:
        k = getattr(drafters[name], "num_kept", draft.config.vocab_size)
        label_mode = "greedy" if mode == "greedy" else "sample T=0.7"
        lines.append(f"| {label_mode} | {name} | {k:,} | {rule} | {r['draft_ms']:.1f} | {r['acceptance']:.3f} | "
                     f"{r['tau']:.2f} | {r['tok_s']:.2f} |")
    print("\n" + "\n".join(lines))
    if args.output is not None:  # the table as printed, and the raw numbers
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.with_suffix(".md").write_text("# Pruned-vocabulary drafters\n\n" + "\n".join(lines) + "\n")
        args.output.with_suffix(".json").write_text(json.dumps(
            {"config": {k: str(v) for k, v in vars(args).items()},
             "rows": [{"mode": m, "drafter": n, "rule": rule, **r} for m, n, rule, r in rows]}, indent=2))
    log("done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
