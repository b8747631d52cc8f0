"""GPU benchmark: speculative decoding with random-weight models built from real configs (no weights to download).

    python benchmarks/gpu.py                          # Qwen2.5-Coder-1.5B target / 0.5B draft shapes, bf16, cuda
    python benchmarks/gpu.py --target qwen2.5-7b      # a 7B-class target (vocabulary of the 0.5B draft)
    python benchmarks/gpu.py --batch-sizes 1,8,32     # batched rows (eager, dynamic caches)
    python benchmarks/gpu.py --target tiny --draft tiny --device cpu --dtype float32 --compile-backend aot_eager \
        --new-tokens 8 --prompt-length 8               # a smoke run (what tests/test_benchmark_gpu.py runs)

Random weights decide nothing about acceptance, so the benchmark measures costs and prices them at the acceptance the
reference pair really has. Steps, each written to `<output-dir>/gpu-<name>.{json,md}` as soon as it is done:

1. Costs, in ms (synchronized timers, median of `--repeats`): the draft's one-token step and the target's verify
   forward at each γ of `--gammas`, eager and compiled (static caches, `compile_config`), and each rule's
   verification at γ (`rule.verify` on random logits).
2. Live tokens/s, batch 1: plain eager (transformers, dynamic cache), plain compiled (transformers' own static-cache
   path), stock assisted (eager), and each rule eager and compiled, with the target's own weights as the draft (every
   draft accepted: the best case) and with an independent draft of the draft's shape (`exact` only: nothing
   accepted, the worst case); τ and the host's share of each round (round time less the measured costs).
3. Modeled tokens/s at the reference pair's acceptance (`--acceptance`: the per-position acceptance of the
   committed CPU runs on Spec-Bench and on GSM8K): per γ, E[tokens per round] / (γ·draft step + verify(γ) +
   verification + the live runs' host overhead per round).
4. Batched (`--batch-sizes`): plain batched decoding and batched `exact` (draft = the target's weights), live, and
   batched `exact` modeled at the first reference acceptance (Spec-Bench) from the eager costs at that batch size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from transformers import CompileConfig, Qwen2Config, Qwen2ForCausalLM, StaticCache  # noqa: E402

import hf_semspec  # noqa: E402
from benchmarks import markdown, report  # noqa: E402
from hf_semspec._transformers_compat import CACHE_ARGUMENT, rewind_cache  # noqa: E402
from hf_semspec.rules import RULES, VerificationInput  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
# The shapes of the models' config.json (checked against the reference pair's converted configs); `tiny` for smoke runs.
SHAPES = {
    "qwen2.5-coder-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                               num_key_value_heads=2, vocab_size=151936),
    "qwen2.5-coder-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                               num_key_value_heads=2, vocab_size=151936),
    # Qwen2.5-7B's shape; its real vocabulary is padded to 152064, here the 0.5B draft's 151936 so that they pair.
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=151936),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512),
}
DEFAULT_ACCEPTANCE = REPO_ROOT / "benchmarks" / "results" / "reference-acceptance.json"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b", choices=sorted(SHAPES))
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--prompt-length", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--gamma", type=int, default=5, help="draft tokens per round of the live runs")
    parser.add_argument("--gammas", default="1,2,3,4,5,6,8,12,16", help="γ at which verify forwards are timed (eager)")
    parser.add_argument("--compiled-gammas", default="1,5,8",
                        help="γ at which compiled verify forwards are timed (each is a compilation); others are "
                             "interpolated linearly")
    parser.add_argument("--rules", default=",".join(hf_semspec.available_rules()))
    parser.add_argument("--batch-sizes", default="1,8,32")
    parser.add_argument("--batch-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=20, help="timed repeats of each cost")
    parser.add_argument("--compile-backend", default="inductor")
    parser.add_argument("--compile-mode", default="reduce-overhead", help="'none' for the backend's default")
    parser.add_argument("--acceptance", type=Path, default=DEFAULT_ACCEPTANCE)
    parser.add_argument("--output-dir", type=Path, default=REPO_ROOT / "benchmarks" / "results")
    parser.add_argument("--name", default=None, help="results name (default gpu-<target>-<dtype>)")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def random_model(shape: str, dtype: torch.dtype, device: str, seed: int) -> Qwen2ForCausalLM:
    """A Qwen2 causal LM of `shape` with random weights (normal, std 0.02, as transformers initializes them)."""
    torch.manual_seed(seed)
    config = Qwen2Config(**SHAPES[shape], tie_word_embeddings=False, max_position_embeddings=32768,
                         eos_token_id=None, bos_token_id=None, pad_token_id=0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype).eval()
    model.generation_config.eos_token_id = None  # random weights: every run makes exactly its new tokens
    return hf_semspec.attach(model)


class Timer:
    """Wall time of a block, synchronized with the device before and after."""

    def __init__(self, device: str):
        self.device = torch.device(device)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def median_ms(self, call, repeats: int) -> float:
        call()  # warm-up (and compilation)
        times = []
        for _ in range(repeats):
            self.sync()
            start = time.perf_counter()
            call()
            self.sync()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    def run(self, call) -> tuple[object, float]:
        self.sync()
        start = time.perf_counter()
        out = call()
        self.sync()
        return out, time.perf_counter() - start


def compile_config(args) -> CompileConfig:
    mode = None if args.compile_mode == "none" else args.compile_mode
    config = CompileConfig(backend=args.compile_backend, mode=mode, fullgraph=True)
    if torch.device(args.device).type != "cuda":
        config._compile_all_devices = True  # transformers' switch for compiling off a GPU (smoke runs)
    return config


def forward_costs(model, args, timer: Timer, batch_size: int, gammas: list[int], compiled) -> dict:
    """ms of a forward over γ + 1 new tokens after a prompt of `--prompt-length`, for each γ in `gammas` (γ = 0: a
    one-token step); with a static cache, and `compiled` forward if given (else the eager forward, dynamic cache)."""
    prompt = torch.randint(1, SHAPES[args.target]["vocab_size"], (batch_size, args.prompt_length), device=args.device)
    costs = {}
    with torch.no_grad():
        for gamma in gammas:
            if compiled is not None:
                cache = StaticCache(config=model.config, max_cache_len=args.prompt_length + gamma + 2)
            else:
                from transformers import DynamicCache
                cache = DynamicCache(config=model.config)
            model(prompt, use_cache=True, **{CACHE_ARGUMENT: cache})
            new = prompt[:, : gamma + 1]
            positions = torch.arange(args.prompt_length, args.prompt_length + gamma + 1, device=args.device)
            call = compiled if compiled is not None else model

            def step():
                out = call(input_ids=new, position_ids=positions.expand(batch_size, -1), use_cache=True,
                           logits_to_keep=gamma + 1, **{CACHE_ARGUMENT: cache})
                out.logits.float()
                rewind_cache(cache, gamma + 1)

            costs[gamma] = timer.median_ms(step, args.repeats)
    return costs


def interpolated(costs: dict[int, float], gamma: int) -> float:
    """costs at `gamma`, linear between the measured γ (constant past the ends)."""
    known = sorted(costs)
    if gamma in costs:
        return costs[gamma]
    lower = max((g for g in known if g < gamma), default=known[0])
    upper = min((g for g in known if g > gamma), default=known[-1])
    if lower == upper:
        return costs[lower]
    return costs[lower] + (costs[upper] - costs[lower]) * (gamma - lower) / (upper - lower)


def verification_costs(args, timer: Timer, rules: list[str], gamma: int, target) -> dict:
    """ms of each rule's `verify` at γ on random logits (greedy; dropmatch with the target's head)."""
    vocab = SHAPES[args.target]["vocab_size"]
    hidden_size = target.config.hidden_size
    logits = torch.randn(1, gamma + 1, vocab, device=args.device)
    drafts = logits[:, :-1].argmax(-1)
    hidden = torch.randn(1, gamma + 1, hidden_size, device=args.device, dtype=target.dtype)
    head = target.get_output_embeddings()
    costs = {}
    for name in rules:
        rule = RULES.build(name, {})
        inputs = dict(draft_token_ids=drafts, target_logits=logits, do_sample=False)
        if rule.requires_target_hidden_states:
            inputs.update(target_hidden_states=hidden, lm_head_weight=head.weight)
        if rule.requires_draft_probs or rule.redistributes_draft:
            inputs.update(draft_probs=torch.softmax(logits[:, :-1], -1))

        def verify(rule=rule, inputs=inputs):
            result = rule.verify(VerificationInput(**inputs))
            result.num_accepted.tolist()  # the round's host sync

        costs[name] = timer.median_ms(verify, args.repeats)
    return costs


def live(target, draft, args, timer: Timer, method: str, rule: str | None = None, compiled: bool = False,
         batch_size: int = 1, new_tokens: int | None = None) -> dict:
    """One timed generation (after an untimed one that compiles what it needs)."""
    new_tokens = new_tokens or args.new_tokens
    vocab = SHAPES[args.target]["vocab_size"]
    prompt = torch.randint(1, vocab, (batch_size, args.prompt_length), device=args.device)
    common = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    if compiled:
        common.update(cache_implementation="static", compile_config=compile_config(args))
    if method == "plain":
        def call():
            return type(target).generate(target, prompt, **common)
    elif method == "stock":
        draft.generation_config.num_assistant_tokens = args.gamma
        draft.generation_config.num_assistant_tokens_schedule = "constant"
        draft.generation_config.assistant_confidence_threshold = 0.0

        def call():
            return type(target).generate(target, prompt, assistant_model=draft, **common)
    else:
        def call():
            return target.generate(prompt, assistant_model=draft, acceptance=rule, num_assistant_tokens=args.gamma,
                                   return_dict_in_generate=True, **common)
    with torch.no_grad():
        call()  # compiles, captures, allocates
        out, seconds = timer.run(call)
    record = {"method": method, "rule": rule, "compiled": compiled, "batch_size": batch_size,
              "new_tokens": new_tokens * batch_size, "seconds": seconds,
              "tokens_per_s": new_tokens * batch_size / seconds}
    stats = getattr(out, "acceptance_stats", None)
    if stats is not None:
        record.update(tau=stats.mean_accepted_length, rounds=stats.num_target_forwards,
                      round_ms=seconds * 1e3 / stats.num_target_forwards)
    return record


def expected_tokens(acceptance: list[float], gamma: int) -> float:
    """E[tokens per round] at γ: the target's token plus each draft i accepted with its prefix, Σ_{i<γ} A_i
    (A_i = P(drafts 0..i accepted), the per-position acceptance of a run with γ ≥ i + 1)."""
    return 1.0 + sum(acceptance[:gamma])


def modeled(acceptance: list[float], draft_ms: float, verify: dict[int, float], verification_ms: float,
            overhead_ms: float, gammas: list[int], batch_size: int = 1) -> dict:
    """tokens/s per γ at `acceptance`: each row of a batch keeps its own accepted drafts (holes), so a round yields
    `batch_size` times a row's expected tokens."""
    out = {}
    for gamma in gammas:
        if gamma > len(acceptance):
            continue
        round_ms = gamma * draft_ms + interpolated(verify, gamma) + verification_ms + overhead_ms
        out[gamma] = batch_size * expected_tokens(acceptance, gamma) * 1e3 / round_ms
    return out


def write(args, results: dict) -> None:
    name = args.name or f"gpu-{args.target}-{args.dtype}"
    args.output_dir.mkdir(parents=True, exist_ok=True)
    markdown.write_json(args.output_dir / f"{name}.json", results)
    (args.output_dir / f"{name}.md").write_text(render(results), encoding="utf-8")


def render(results: dict) -> str:
    lines = [f"# GPU benchmark: {results['setup']['target']} / {results['setup']['draft']}, "
             f"{results['setup']['dtype']}, {results['machine'].get('device_name')}", ""]
    lines += [f"torch {results['machine']['torch']}, transformers {results['machine']['transformers']}; prompt "
              f"{results['setup']['prompt_length']} tokens, {results['setup']['new_tokens']} new, γ = "
              f"{results['setup']['gamma']}, greedy, random weights.", ""]
    costs = results.get("costs")
    if costs:
        lines += ["## Costs (ms)", ""]
        gammas = sorted(int(g) for g in costs["verify_eager"])
        rows = [[f"draft step ({results['setup']['draft']})", f"{costs['draft_step_eager']:.2f}",
                 f"{costs['draft_step_compiled']:.2f}"],
                [f"target step ({results['setup']['target']})", f"{costs['target_step_eager']:.2f}",
                 f"{costs['target_step_compiled']:.2f}"]]
        rows += [[f"verify γ = {g}", f"{costs['verify_eager'][g]:.2f}",
                  f"{interpolated(costs['verify_compiled'], g):.2f}"]
                 for g in gammas]
        rows += [[f"verification `{name}` (γ = {results['setup']['gamma']})", f"{ms:.3f}", ""]
                 for name, ms in costs["verification"].items()]
        lines += markdown.table(["", "eager", "compiled"], rows) + [""]
    records = results.get("live")
    if records:
        plain_eager = next((r["tokens_per_s"] for r in records if r["method"] == "plain" and not r["compiled"]), None)
        plain_compiled = next((r["tokens_per_s"] for r in records if r["method"] == "plain" and r["compiled"]), None)
        lines += ["## Live, batch 1", ""]
        rows = []
        for r in records:
            label = r["method"] if r["rule"] is None else f"`{r['rule']}`"
            rows.append([label, r.get("draft", ""), "compiled" if r["compiled"] else "eager",
                         f"{r['tokens_per_s']:.1f}", f"{r['tau']:.2f}" if "tau" in r else "–",
                         f"{r['tokens_per_s'] / plain_eager:.2f}×" if plain_eager else "–",
                         f"{r['tokens_per_s'] / plain_compiled:.2f}×" if plain_compiled else "–",
                         f"{r['overhead_ms']:.2f}" if "overhead_ms" in r else "–"])
        lines += markdown.table(["method", "draft", "", "tok/s", "τ", "of plain eager", "of plain compiled",
                                 "host ms / round"], rows) + [""]
    for set_name, entry in results.get("modeled", {}).items():
        lines += [f"## Modeled at the reference pair's acceptance: {set_name}", "", entry["source"] + ".", ""]
        gammas = sorted(entry["eager"])
        rows = [[str(g), f"{entry['eager'][g]:.1f}", f"{entry['compiled'][g]:.1f}"] for g in gammas]
        lines += markdown.table(["γ", "eager tok/s", "compiled tok/s"], rows) + [""]
        for mode in ("eager", "compiled"):
            best = entry[f"best_{mode}"]
            lines.append(f"- {mode}: best γ = {best['gamma']}, {best['tokens_per_s']:.1f} tok/s, "
                         f"{best['of_plain_eager']:.2f}× plain eager, {best['of_plain_compiled']:.2f}× plain "
                         "compiled.")
        lines.append("")
    batched = results.get("batched")
    if batched:
        lines += ["## Batched (eager, dynamic caches)", ""]
        rows = [[str(b["batch_size"]), f"{b['plain_tokens_per_s']:.1f}", f"{b['exact_tokens_per_s']:.1f}",
                 f"{b['exact_tokens_per_s'] / b['plain_tokens_per_s']:.2f}×",
                 f"{b['modeled_exact_tokens_per_s']:.1f}", f"{b['modeled_exact_tokens_per_s'] / b['plain_tokens_per_s']:.2f}×"]
                for b in batched]
        lines += markdown.table(["B", "plain tok/s", "`exact` tok/s (all accepted)", "of plain",
                                 "`exact` modeled at the reference acceptance", "of plain"], rows) + [""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    # Every model's compiled forward shares transformers' forward wrapper, whose compiled variants torch caps at 8
    # (`recompile_limit`); this run compiles two models at several shapes (docs/gpu.md, Limits).
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    dtype = getattr(torch, args.dtype)
    timer = Timer(args.device)
    rules = [r for r in args.rules.split(",") if r]
    unknown = sorted(set(rules) - set(hf_semspec.available_rules()))
    if unknown:
        raise SystemExit(f"--rules: unknown {unknown}; allowed {hf_semspec.available_rules()}")
    acceptance_sets = json.loads(args.acceptance.read_text(encoding="utf-8"))["sets"]
    machine = report.machine_info()
    if torch.device(args.device).type == "cuda":
        machine["device_name"] = torch.cuda.get_device_name(args.device)
    results = {"setup": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
               "machine": machine}
    started = time.perf_counter()

    target = random_model(args.target, dtype, args.device, args.seed)
    independent = random_model(args.draft, dtype, args.device, args.seed + 1)
    config = compile_config(args)

    # 1. Costs.
    gammas, compiled_gammas = ints(args.gammas), ints(args.compiled_gammas)
    draft_compiled = independent.get_compiled_call(config)
    target_compiled = target.get_compiled_call(config)
    results["costs"] = costs = {
        "draft_step_eager": forward_costs(independent, args, timer, 1, [0], None)[0],
        "draft_step_compiled": forward_costs(independent, args, timer, 1, [0], draft_compiled)[0],
        "target_step_eager": forward_costs(target, args, timer, 1, [0], None)[0],
        "target_step_compiled": forward_costs(target, args, timer, 1, [0], target_compiled)[0],
        "verify_eager": forward_costs(target, args, timer, 1, gammas, None),
        "verify_compiled": forward_costs(target, args, timer, 1, compiled_gammas, target_compiled),
        "verification": verification_costs(args, timer, rules, args.gamma, target),
    }
    write(args, results)

    # 2. Live, batch 1.
    records = results["live"] = []
    for compiled in (False, True):
        records.append(live(target, None, args, timer, "plain", compiled=compiled))
    records.append({**live(target, target, args, timer, "stock"), "draft": "target's weights"})
    for compiled in (False, True):
        for rule in rules:
            if RULES.get(rule).redistributes_draft:
                continue  # needs a pruned drafter with a kernel (benchmarks/pruned_drafters.py)
            records.append({**live(target, target, args, timer, "semspec", rule, compiled), "draft": "target's weights"})
        records.append({**live(target, independent, args, timer, "semspec", "exact", compiled,
                               new_tokens=max(8, args.new_tokens // 4)), "draft": "independent"})
        write(args, results)
    for r in records:
        if "round_ms" in r:  # the host's share of a round: its time less the draft steps, verify and verification
            mode = "compiled" if r["compiled"] else "eager"
            step = costs[f"target_step_{mode}" if r["draft"] == "target's weights" else f"draft_step_{mode}"]
            r["overhead_ms"] = r["round_ms"] - (args.gamma * step + interpolated(costs[f"verify_{mode}"], args.gamma)
                                                + costs["verification"][r["rule"]])

    # 3. Modeled at the reference acceptance (overhead: the live `exact` runs' host share per round).
    plain = {r["compiled"]: r["tokens_per_s"] for r in records if r["method"] == "plain"}
    results["modeled"] = model = {}
    for set_name, reference in acceptance_sets.items():
        acceptance = reference["per_position_acceptance"]
        model[set_name] = entry = {"source": reference["source"]}
        for compiled, mode in ((False, "eager"), (True, "compiled")):
            overhead = next((r["overhead_ms"] for r in records if r.get("rule") == "exact"
                             and r["compiled"] == compiled and r.get("draft") == "target's weights"), 0.0)
            per_gamma = modeled(acceptance, costs[f"draft_step_{mode}"], costs[f"verify_{mode}"],
                                costs["verification"]["exact"], max(overhead, 0.0),
                                list(range(1, len(acceptance) + 1)))
            entry[mode] = per_gamma
            best = max(per_gamma, key=per_gamma.get)
            entry[f"best_{mode}"] = {"gamma": best, "tokens_per_s": per_gamma[best],
                                     "of_plain_eager": per_gamma[best] / plain[False],
                                     "of_plain_compiled": per_gamma[best] / plain[True]}
    write(args, results)

    # 4. Batched.
    results["batched"] = batched = []
    for batch_size in ints(args.batch_sizes):
        plain_b = live(target, None, args, timer, "plain", batch_size=batch_size, new_tokens=args.batch_new_tokens)
        exact_b = live(target, target, args, timer, "semspec", "exact", batch_size=batch_size,
                       new_tokens=args.batch_new_tokens)
        step = forward_costs(independent, args, timer, batch_size, [0], None)[0]
        target_step = forward_costs(target, args, timer, batch_size, [0], None)[0]
        verify = forward_costs(target, args, timer, batch_size, [args.gamma], None)
        overhead = max(exact_b["round_ms"] - args.gamma * target_step - verify[args.gamma]
                       - costs["verification"]["exact"], 0.0)
        reference = next(iter(acceptance_sets.values()))["per_position_acceptance"]
        model_b = modeled(reference, step, verify, costs["verification"]["exact"], overhead, [args.gamma],
                          batch_size)
        batched.append({"batch_size": batch_size, "plain_tokens_per_s": plain_b["tokens_per_s"],
                        "exact_tokens_per_s": exact_b["tokens_per_s"], "exact_tau": exact_b["tau"],
                        "draft_step_ms": step, "target_step_ms": target_step, "verify_ms": verify[args.gamma],
                        "overhead_ms": overhead,
                        "modeled_exact_tokens_per_s": model_b.get(args.gamma, float("nan"))})
        write(args, results)
    results["seconds"] = time.perf_counter() - started
    write(args, results)
    print(render(results))
    return results


if __name__ == "__main__":
    main()
