"""RDK kernels on the reference pair: how much sampling acceptance a kernel can give back to a pruned drafter.

    python benchmarks/rdk_kernels.py --output benchmarks/results/rdk-kernels     # ~15 min on 2 cores

For a draft drawn from r and verified by the standard test, the probability that it is accepted at a position is
α = Σ_v min(p(v), r(v)) (Leviathan et al. 2023), so kernels can be compared without decoding: this script teacher-
forces the target and the unpruned draft over held-out text and computes, at every position, p (target, temperature
0.7), q (unpruned draft, same temperature), the pruned drafter's q' = q restricted to the keep set and renormalised
(exactly what a pruned drafter's sliced head gives), and r = q'·M for each kernel M:

- `unpruned`: q itself, the ceiling a kernel could reach; `no kernel`: q' (what `exact` gets with the pruned drafter);
- `cosine τ=…`: the package's kernel (`hf_semspec.drafters.kernel`: each kept token keeps the largest share and sends
  exp((cos − 1)/τ) of it to its m = 8 pruned neighbours by cosine of the target's LM-head rows), for several τ
  (the neighbours of the drafter's saved kernel, re-weighted);
- `calibrated`: each kept token i sends to its m most likely pruned tokens what the *unpruned* draft puts there when
  it puts its mass on i, M_ij = E[q'(i)·q(j)] / E[q'(i)] (j pruned), M_ii = 1 − Σ_j M_ij, the expectations over
  calibration text (the keep-set corpus, never the evaluation text): a first-order (linear in q') estimate of the
  mass the pruned head lost, which needs no target.

The held-out text is the target's own sampled answer (temperature 0.7, `--max-new-tokens`) to the evaluation
prompts of `benchmarks/pruned_drafters.py` (Spec-Bench first turns that the keep sets were not counted on). Keep sets
are those of `benchmarks/pruned_drafters.py` (its cached drafters, `--drafters`); the kernels are built here.
"""

from __future__ import annotations

import os

os.environ.setdefault("MKL_CBWR", "AUTO")  # before torch

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks.pruned_drafters import DEFAULT_DATA_DIR, encode, split_data  # noqa: E402
from hf_semspec import drafting  # noqa: E402
from hf_semspec.drafters import PrunedVocabDrafter  # noqa: E402
from benchmarks.pypi_models import REFERENCE_PAIR, default_cache_dir, load_model  # noqa: E402

TEMPERATURE = 0.7


@torch.no_grad()
def teacher_forced_probs(model, sequences, temperature=TEMPERATURE):
    """softmax(logits / T) at the positions predicting each sequence's answer tokens, `(positions, vocab)` float32."""
    rows = []
    for ids, start in sequences:
        logits = model(input_ids=ids).logits[0, start - 1 : ids.shape[1] - 1].float()
        rows.append(torch.softmax(logits / temperature, -1))
    return torch.cat(rows)


def alpha(p, r, chunk=64):
    """Mean over positions of Σ_v min(p, r)."""
    return float(torch.cat([torch.minimum(p[i : i + chunk], r[i : i + chunk]).sum(-1)
                            for i in range(0, p.shape[0], chunk)]).mean())


def restricted(q, kept):
    """q' = q on the kept ids, renormalised; 0 elsewhere."""
    out = torch.zeros_like(q)
    out[:, kept] = q[:, kept] / q[:, kept].sum(-1, keepdim=True)
    return out


def redistributed(q_kept, kept, indices, weights, chunk=64):
    return torch.cat([drafting.redistribute(q_kept[i : i + chunk], kept, indices, weights)
                      for i in range(0, q_kept.shape[0], chunk)])


@torch.no_grad()
def calibrated_kernel(draft, tokenizer, texts, kept, vocab_size, neighbours, top_kept=8, top_pruned=32,
                      max_tokens=512, temperature=TEMPERATURE):
    """M of the module docstring from teacher-forced calibration `texts`: rows over `kept`, columns self + the m pruned
    tokens with the largest E[q'(i)·q(j)]; the expectations use each position's `top_kept` kept and `top_pruned`
    pruned tokens (the rest carries too little mass to change the top m)."""
    is_kept = torch.zeros(vocab_size, dtype=torch.bool)
    is_kept[kept] = True
    row_of = torch.full((vocab_size,), -1, dtype=torch.long)
    row_of[kept] = torch.arange(kept.numel())
    mass = torch.zeros(kept.numel(), dtype=torch.float64)
    keys, values = [], []
    positions = 0
    for text in texts:
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"][:, :max_tokens]
        if ids.shape[1] < 2:
            continue
        q = torch.softmax(draft(input_ids=ids).logits[0].float() / temperature, -1)
        positions += q.shape[0]
        q_kept = q.masked_fill(~is_kept, 0)
        q_kept = q_kept / q_kept.sum(-1, keepdim=True)
        mass.index_add_(0, row_of[kept], q_kept[:, kept].sum(0).double())
        top_i = q_kept.topk(top_kept, dim=-1)
        top_j = q.masked_fill(is_kept, 0).topk(top_pruned, dim=-1)
        weight = top_i.values[:, :, None] * top_j.values[:, None, :]  # (positions, top_kept, top_pruned)
        pair = row_of[top_i.indices][:, :, None] * vocab_size + top_j.indices[:, None, :]
        keys.append(pair.flatten())
        values.append(weight.flatten().double())
    keys, inverse = torch.unique(torch.cat(keys), return_inverse=True)
    joint = torch.zeros(keys.numel(), dtype=torch.float64).index_add_(0, inverse, torch.cat(values))
    rows, columns = keys // vocab_size, keys % vocab_size
    conditional = joint / mass[rows].clamp_min(1e-30)  # E[q'(i) q(j)] / E[q'(i)]
    # the m largest per row: sort by (row, −value) and take each row's first m
    order = torch.argsort(rows * 4.0 - conditional / (conditional.max() + 1), stable=True)
    rows, columns, conditional = rows[order], columns[order], conditional[order]
    rank = torch.arange(rows.numel()) - torch.searchsorted(rows, rows)
    take = rank < neighbours
    indices = kept[:, None].repeat(1, neighbours + 1)
    weights = torch.zeros(kept.numel(), neighbours + 1, dtype=torch.float64)
    indices[rows[take], 1 + rank[take]] = columns[take]
    weights[rows[take], 1 + rank[take]] = conditional[take]
    weights[:, 0] = (1 - weights[:, 1:].sum(-1)).clamp_min(0)
    weights = weights / weights.sum(-1, keepdim=True)
    return indices, weights.float(), positions


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--drafters", type=Path, nargs="+", default=None,
                        help="saved pruned drafters (default: those benchmarks/pruned_drafters.py cached)")
    parser.add_argument("--prompts", type=int, default=8, help="evaluation prompts (pruned_drafters.py's split)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="target tokens sampled per prompt")
    parser.add_argument("--calibration-texts", type=int, default=200, help="keep-set corpus texts for `calibrated`")
    parser.add_argument("--neighbours", type=int, default=8)
    parser.add_argument("--temperatures", default="0.02,0.05,0.1,0.2,0.5", help="τ of the cosine kernels")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", type=Path, default=None, help="write <output>.md and <output>.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f}s] {message}", file=sys.stderr, flush=True)

    drafter_dirs = args.drafters or sorted((default_cache_dir() / "pruned_drafters").glob("*-keep*"))
    if not drafter_dirs:
        raise SystemExit("no pruned drafters: run benchmarks/pruned_drafters.py first, or pass --drafters")
    target_name, draft_name = REFERENCE_PAIR
    target, tokenizer = load_model(target_name, dtype=torch.float32)
    draft, _ = load_model(draft_name, dtype=torch.float32)  # float32: teacher forcing is prefill, fast in float32
    eval_prompts, corpus, _, _, _ = split_data(args.data_dir, args.prompts, 0, 600)
    log(f"models loaded; {len(eval_prompts)} evaluation prompts")

    # The target's sampled answers, cached: sampling them is most of the run's time on 2 cores.
    key = hashlib.sha256(json.dumps([eval_prompts, target_name, args.max_new_tokens, args.seed]).encode()).hexdigest()
    cached = default_cache_dir() / "rdk_kernels" / f"answers-{key[:12]}.pt"
    if cached.is_file():
        sequences = torch.load(cached)
    else:
        sequences = []
        for index, prompt in enumerate(eval_prompts):
            inputs = encode(tokenizer, prompt)
            torch.manual_seed(args.seed + index)
            out = type(target).generate(target, **inputs, do_sample=True, temperature=TEMPERATURE, top_k=0,
                                        top_p=1.0, max_new_tokens=args.max_new_tokens)
            sequences.append((out, inputs["input_ids"].shape[1]))
        cached.parent.mkdir(parents=True, exist_ok=True)
        torch.save(sequences, cached)
    log(f"{sum(s.shape[1] - n for s, n in sequences)} target tokens sampled")
    p = teacher_forced_probs(target, sequences)
    q = teacher_forced_probs(draft, sequences)
    vocab = p.shape[1]
    log(f"teacher-forced {p.shape[0]} positions")

    # calibration texts: the keep-set corpus (no evaluation prompt), spread over it
    step = max(1, len(corpus) // args.calibration_texts)
    calibration = corpus[::step][: args.calibration_texts]
    temperatures = [float(t) for t in args.temperatures.split(",") if t]
    results = {"positions": p.shape[0], "alpha_unpruned": alpha(p, q), "keeps": {}}
    for folder in drafter_dirs:
        drafter = PrunedVocabDrafter.from_pretrained(folder, load_tokenizer=False)
        kept = drafter.kept_token_ids.cpu()
        pruned = torch.ones(vocab, dtype=torch.bool)
        pruned[kept] = False
        q_kept = restricted(q, kept)
        row = {"kept": kept.numel(), "target_mass_on_pruned": float(p[:, pruned].sum(-1).mean()),
               "draft_mass_on_pruned": float(q[:, pruned].sum(-1).mean()), "no kernel": alpha(p, q_kept)}
        # The drafter's own kernel (build_rdk_kernel at its τ0, m = 8, target LM-head rows): the same neighbours
        # for every τ, each cosine recovered from its weight, s_j = 1 + τ0·ln(w_j / w_0), and re-weighted.
        indices, saved = drafter.rdk_indices.cpu(), drafter.rdk_weights.cpu().double()
        tau0 = drafter.pruning_info["rdk"]["temperature"]
        scores = 1.0 + tau0 * (saved.clamp_min(1e-300).log() - saved[:, :1].clamp_min(1e-300).log())
        for tau in temperatures:
            weights = torch.softmax(scores / tau, -1).float()
            row[f"cosine τ={tau}"] = alpha(p, redistributed(q_kept, kept, indices, weights))
        indices, weights, positions = calibrated_kernel(draft, tokenizer, calibration, kept, vocab, args.neighbours)
        row["calibrated"] = alpha(p, redistributed(q_kept, kept, indices, weights))
        row["calibrated self weight"] = float(weights[:, 0].mean())
        row["calibration positions"] = positions
        results["keeps"][folder.name] = row
        log(f"{folder.name}: {row}")

    keeps = list(results["keeps"])
    names = [k for k in results["keeps"][keeps[0]] if k not in ("kept", "calibrated self weight",
                                                                  "calibration positions")]
    lines = [f"α = E Σ min(p, r) at temperature {TEMPERATURE} over {results['positions']} positions of the target's "
             f"sampled answers to {len(eval_prompts)} held-out Spec-Bench prompts (teacher forcing); unpruned draft: "
             f"α = {results['alpha_unpruned']:.4f}.", "",
             "| | " + " | ".join(f"{results['keeps'][k]['kept']:,} kept" for k in keeps) + " |",
             "| --- | " + " | ".join("---" for _ in keeps) + " |"]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(f"{results['keeps'][k][name]:.4f}" for k in keeps) + " |")
    text = "\n".join(lines)
    print(text)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.with_suffix(".md").write_text("# RDK kernels: sampling acceptance α\n\n" + text + "\n")
        args.output.with_suffix(".json").write_text(json.dumps({"config": {k: str(v) for k, v in vars(args).items()},
                                                                **results}, indent=1))
    log("done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
