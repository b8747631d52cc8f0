"""Batched speculative decoding against plain batched decoding and batch-1 speculative decoding, per batch size.

    python benchmarks/batch.py                              # reference pair, GSM8K, B = 1, 2, 4, 8, 128 new tokens
    python benchmarks/batch.py --batch-sizes 1,4 --new-tokens 64 --gamma 3

On the first max(B) GSM8K problems (chat template; a batch is left-padded), greedy, in one run:
- `plain`: the target alone, B prompts in one `generate()` call (transformers' batched decoding);
- `row by row`: `exact` at batch 1 on each prompt, one after another (measured once per prompt; B's figure is the
  first B prompts' tokens over their summed time);
- `batched`: `exact` on the B prompts in one call.
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
    parser.add_argument("--gamma", type=int, default=5, help="draft tokens per round (constant)")
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
    exact = dict(assistant_model=draft, acceptance="exact", num_assistant_tokens=args.gamma)

    with torch.no_grad():
        type(target).generate(target, **encoded[0], max_new_tokens=2, do_sample=False)  # warm-up
        # Row by row: each prompt alone, once.
        alone = []
        for e in encoded:
            out, seconds = timed(lambda e=e: target.generate(**e, **greedy, **exact))
            alone.append({"ids": rows_new_ids(out, e["input_ids"].shape[1], eos_ids, pad)[0], "seconds": seconds})
        results = {"setup": {**{k: str(v) for k, v in vars(args).items()}, "pair": [pair.target_name, pair.draft_name],
                             **pair.info},
                   "machine": report.machine_info(), "sizes": []}
        for size in sizes:
            batch = left_padded(encoded[:size], pad)
            width = batch["input_ids"].shape[1]
            entry = {"batch_size": size}
            for method in ("plain", "batched"):
                kwargs = {} if method == "plain" else exact
                call = (lambda: type(target).generate(target, **batch, **greedy)) if method == "plain" else \
                    (lambda: target.generate(**batch, **greedy, **kwargs, return_dict_in_generate=True))
                out, seconds = timed(call)
                sequences = out if method == "plain" else out.sequences
                ids = rows_new_ids(sequences, width, eos_ids, pad)
                entry[method] = {"tokens": sum(map(len, ids)), "seconds": seconds,
                                 "tokens_per_s": sum(map(len, ids)) / seconds,
                                 "identical_to_alone": sum(row == a["ids"] for row, a in zip(ids, alone))}
                if method == "batched":
                    entry[method]["tau_per_row"] = [s.mean_accepted_length for s in out.acceptance_stats_per_row]
            row_tokens = sum(len(a["ids"]) for a in alone[:size])
            row_seconds = sum(a["seconds"] for a in alone[:size])
            entry["row_by_row"] = {"tokens": row_tokens, "seconds": row_seconds, "tokens_per_s": row_tokens / row_seconds}
            entry["batched_over_plain"] = entry["batched"]["tokens_per_s"] / entry["plain"]["tokens_per_s"]
            entry["batched_over_row_by_row"] = entry["batched"]["tokens_per_s"] / entry["row_by_row"]["tokens_per_s"]
            results["sizes"].append(entry)
            print(f"B={size}: plain {entry['plain']['tokens_per_s']:.2f} tok/s, row by row "
                  f"{entry['row_by_row']['tokens_per_s']:.2f}, batched {entry['batched']['tokens_per_s']:.2f} "
                  f"({entry['batched_over_plain']:.2f}x plain, {entry['batched_over_row_by_row']:.2f}x row by row)",
                  flush=True)
    results["machine"]["load_average_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    args.output_dir.mkdir(parents=True, exist_ok=True)
    markdown.write_json(args.output_dir / f"{args.name}.json", results)
    (args.output_dir / f"{args.name}.md").write_text(render(results), encoding="utf-8")
    return results


def render(results: dict) -> str:
    setup = results["setup"]
    lines = [f"# Batched speculative decoding: {' / '.join(setup['pair'])}", "",
             f"GSM8K, greedy, {setup['new_tokens']} new tokens at most, `exact` with γ = {setup['gamma']}; "
             f"{results['machine']['cpu_model']}, {results['machine']['cpu_cores']} cores, torch "
             f"{results['machine']['torch']}.", ""]
    rows = [[str(e["batch_size"]), f"{e['plain']['tokens_per_s']:.2f}", f"{e['row_by_row']['tokens_per_s']:.2f}",
             f"{e['batched']['tokens_per_s']:.2f}", f"{e['batched_over_plain']:.2f}×",
             f"{e['batched_over_row_by_row']:.2f}×",
             f"{e['batched']['identical_to_alone']}/{e['batch_size']}",
             " ".join(f"{t:.2f}" for t in e["batched"]["tau_per_row"])] for e in results["sizes"]]
    lines += markdown.table(["B", "plain batched tok/s", "`exact` row by row tok/s", "`exact` batched tok/s",
                             "batched / plain", "batched / row by row", "rows = alone", "τ per row"], rows)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
