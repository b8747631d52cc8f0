"""Batched speculative decoding against plain batched decoding and batch-1 speculative decoding, per batch size.

    python benchmarks/batch.py                              # reference pair, GSM8K, B = 1, 2, 4, 8, γ = 3 and 5
    python benchmarks/batch.py --batch-sizes 1,4 --new-tokens 64 --gammas 3

On the first max(B) GSM8K problems (chat template; a batch is left-padded), greedy, in one run:
- `plain`: the target alone, B prompts in one `generate()` call (transformers' batched decoding);
- `row by row`: `exact` at batch 1 on each prompt, one after another (timed per prompt and γ; B's figure is the first
  B prompts' tokens over their summed time);
- `batched`: `exact` on the B prompts in one call, for each γ.
Each call is timed `--repeats` times, interleaved with the others, and its fastest time counts (on a shared machine
another process only ever slows a call down).
Each method counts the tokens it returns up to each row's EOS; greedy `exact` writes plain decoding's text, so the
counts agree (`identical` says in how many rows the texts did). Writes `<output-dir>/<name>.{json,md}`.
"""

from __future__ import annotations

import os

os.environ.setdefault("MKL_CBWR", "AUTO")  # as benchmarks/run.py: cheaper multi-token verify forwards on a CPU
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import hf_semspec  # noqa: E402
from benchmarks import data, markdown, metrics, models, report  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default="qwen", choices=models.PAIR_NAMES)
    parser.add_argument("--batch-sizes", default="1,2,4,8")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--gammas", default="3,5", help="draft tokens per round (constant), comma-separated")
    parser.add_argument("--repeats", type=int, default=2,
                        help="times each call is timed, interleaved; its fastest time counts")
    parser.add_argument("--data-dir", type=Path, default=data.DEFAULT_DATA_DIR)
    parser.add_argument("--output-dir", type=Path, default=data.REPO_ROOT / "benchmarks" / "results")
    parser.add_argument("--name", default="batch-cpu")
    return parser


def left_padded(encoded: list[dict], pad_token_id: int) -> dict:
    """One batch of chat-encoded prompts, left-padded."""
    width = max(e["input_ids"].shape[1] for e in encoded)
    ids = torch.full((len(encoded), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(encoded), width, dtype=torch.long)
    for row, e in enumerate(encoded):
        length = e["input_ids"].shape[1]
        ids[row, width - length:] = e["input_ids"][0]
        mask[row, width - length:] = 1
    return {"input_ids": ids, "attention_mask": mask}


def rows_new_ids(sequences: torch.Tensor, prompt_width: int, eos_ids: list[int], pad_token_id: int) -> list[list[int]]:
    """Each row's new tokens through its first EOS (the padding after a finished row is not output)."""
    rows = []
    for row in sequences[:, prompt_width:].tolist():
        ids = metrics.new_token_ids(torch.tensor([row]), 0, eos_ids)
        while ids and ids[-1] == pad_token_id and pad_token_id not in eos_ids:
            ids.pop()
        rows.append(ids)
    return rows


def timed(call) -> tuple[object, float]:
    start = time.perf_counter()
    out = call()
    return out, time.perf_counter() - start


def main(argv: list[str] | None = None, load_pair=models.load_pair) -> dict:
    args = build_parser().parse_args(argv)
    sizes = sorted({int(b) for b in args.batch_sizes.split(",")})
    pair = load_pair(args.pair)
    target, draft = hf_semspec.attach(pair.target), pair.draft
    eos_ids = metrics.eos_ids_of(target)
    pad = target.generation_config.pad_token_id
    pad = pad if pad is not None else eos_ids[0]
    problems = data.load_gsm8k(Path(args.data_dir) / data.GSM8K_FILE, max(sizes), args.new_tokens)
    encoded = [pair.encode(p.text) for p in problems]
    greedy = dict(max_new_tokens=args.new_tokens, do_sample=False, pad_token_id=pad)
    gammas = sorted({int(g) for g in args.gammas.split(",")})

    def exact(gamma: int) -> dict:
        return dict(assistant_model=draft, acceptance="exact", num_assistant_tokens=gamma)

    with torch.no_grad():
        # Warm-up: both models' weights paged in and their kernels chosen before anything is timed.
        type(target).generate(target, **encoded[0], max_new_tokens=2, do_sample=False)
        target.generate(**encoded[0], **{**greedy, "max_new_tokens": 8}, **exact(gammas[0]))
        # Row by row: each prompt alone, per γ; each call's time is its fastest of the repeats (a busy machine only
        # slows a call down), the repeats interleaved.
        alone = {gamma: [{"seconds": []} for _ in encoded] for gamma in gammas}
        for _ in range(args.repeats):
            for gamma in gammas:
                for e, record in zip(encoded, alone[gamma]):
                    out, seconds = timed(lambda e=e: target.generate(**e, **greedy, **exact(gamma)))
                    record["ids"] = rows_new_ids(out, e["input_ids"].shape[1], eos_ids, pad)[0]
                    record["seconds"].append(seconds)
        results = {"setup": {**{k: str(v) for k, v in vars(args).items()}, "pair": [pair.target_name, pair.draft_name],
                             **pair.info},
                   "machine": report.machine_info(), "sizes": []}
        for size in sizes:
            batch = left_padded(encoded[:size], pad)
            width = batch["input_ids"].shape[1]
            calls = {"plain": lambda: type(target).generate(target, **batch, **greedy)}
            for gamma in gammas:
                calls[gamma] = lambda gamma=gamma: target.generate(**batch, **greedy, **exact(gamma),
                                                                   return_dict_in_generate=True)
            outs, times = {}, {key: [] for key in calls}
            for _ in range(args.repeats):
                for key, call in calls.items():
                    outs[key], seconds = timed(call)
                    times[key].append(seconds)

            def measured(key, sequences):
                ids = rows_new_ids(sequences, width, eos_ids, pad)
                alone_ids = alone[gammas[0] if key == "plain" else key]
                return {"tokens": sum(map(len, ids)), "seconds": min(times[key]), "repeats_seconds": times[key],
                        "tokens_per_s": sum(map(len, ids)) / min(times[key]),
                        "identical_to_alone": sum(row == a["ids"] for row, a in zip(ids, alone_ids))}

            plain = measured("plain", outs["plain"])
            entry = {"batch_size": size, "plain": plain, "exact": {}}
            for gamma in gammas:
                batched = {**measured(gamma, outs[gamma].sequences),
                           "tau_per_row": [s.mean_accepted_length for s in outs[gamma].acceptance_stats_per_row]}
                row_tokens = sum(len(a["ids"]) for a in alone[gamma][:size])
                row_seconds = sum(min(a["seconds"]) for a in alone[gamma][:size])
                row_by_row = {"tokens": row_tokens, "seconds": row_seconds, "tokens_per_s": row_tokens / row_seconds}
                entry["exact"][str(gamma)] = {
                    "batched": batched, "row_by_row": row_by_row,
                    "batched_over_plain": batched["tokens_per_s"] / plain["tokens_per_s"],
                    "batched_over_row_by_row": batched["tokens_per_s"] / row_by_row["tokens_per_s"]}
                print(f"B={size} γ={gamma}: plain {plain['tokens_per_s']:.2f} tok/s, row by row "
                      f"{row_by_row['tokens_per_s']:.2f}, batched {batched['tokens_per_s']:.2f} "
                      f"({batched['tokens_per_s'] / plain['tokens_per_s']:.2f}x plain, "
                      f"{batched['tokens_per_s'] / row_by_row['tokens_per_s']:.2f}x row by row)", flush=True)
            results["sizes"].append(entry)
    results["machine"]["load_average_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    args.output_dir.mkdir(parents=True, exist_ok=True)
    markdown.write_json(args.output_dir / f"{args.name}.json", results)
    (args.output_dir / f"{args.name}.md").write_text(render(results), encoding="utf-8")
    return results


def render(results: dict) -> str:
    setup = results["setup"]
    lines = [f"# Batched speculative decoding: {' / '.join(setup['pair'])}", "",
             f"GSM8K, greedy, {setup['new_tokens']} new tokens at most, `exact` at constant γ; "
             f"{results['machine']['cpu_model']}, {results['machine']['cpu_cores']} cores, torch "
             f"{results['machine']['torch']}. Each call's fastest of {setup['repeats']} timings; each γ is compared "
             "with the same plain run.", ""]
    rows = []
    for e in results["sizes"]:
        for gamma, run in e["exact"].items():
            rows.append([str(e["batch_size"]), gamma, f"{e['plain']['tokens_per_s']:.2f}",
                         f"{run['row_by_row']['tokens_per_s']:.2f}", f"{run['batched']['tokens_per_s']:.2f}",
                         f"{run['batched_over_plain']:.2f}×", f"{run['batched_over_row_by_row']:.2f}×",
                         f"{run['batched']['identical_to_alone']}/{e['batch_size']}",
                         " ".join(f"{t:.2f}" for t in run["batched"]["tau_per_row"])])
    lines += markdown.table(["B", "γ", "plain batched tok/s", "`exact` row by row tok/s", "`exact` batched tok/s",
                             "batched / plain", "batched / row by row", "rows = alone", "τ per row"], rows)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
