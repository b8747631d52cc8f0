"""Where and why a lossless rule's greedy text left plain decoding's: the first differing token, traced.

    python -m benchmarks.divergence benchmarks/results/draft-length-exact-bf16-target-avx512.json

Greedy decoding with a lossless rule (`exact`, `rdk`) emits the target's argmax at every position, so its text is plain
decoding's up to the numerics: its logits come from verify forwards over several tokens, on a cache filled several
tokens at a time, plain decoding's from one-token steps. The two round differently (visibly in bf16), and where the
target's two best tokens are that close the argmax can flip. A run's `identical_to_plain` says *that* a text differs;
this says whether rounding explains it or the rule broke its contract.

For each greedy record of a lossless rule whose text differs from plain's in the run, it decodes the prompt again with
plain and with the method (the run's models, dtypes and options), records every target forward through forward hooks
(public `nn.Module` API), and reports:

- `reproduced`: whether both texts came out as in the run (the forwards are deterministic on one machine and build),
  and the method's rounds drafted the lengths the run's did;
- the contract, on every generated token: token m is the argmax (first index on ties) of the target's logits at
  position m − 1 in the last forward that fed the kept tokens up to there, i.e. the verify forward that decided it. A
  token that is not is a bug in the rule: the script says so and exits with 1;
- at the first differing token j, the two paths' logits for plain's token a and the method's token b: the gaps
  g = z(a) − z(b) in each path, the largest difference D between the two paths' logits over the rest of the
  vocabulary (every token but a and b), and the dtype's step at the top logit. `within rounding`: |g| ≤ D in both
  paths, i.e. the two forwards disagree on other tokens by as much as the flip needs, so nothing singles out a or b.

The method decodes again with the round lengths its record kept (`acceptance_stats.drafted_per_round`, played back by
`RecordedLengths`), so a policy that learned (`tapout`, `cost_aware`, `heuristic`, ...) drafts what it drafted in the
run, although what it chose came from the run's earlier prompts and timings. A record without them (a run from before
the stats kept rounds) decodes again only at a fixed length (`constant:k`, or a plain γ); those of other policies are
listed as not traced. Written to `benchmarks/results/<name>.json` and `.md` (default name: `divergence-<run's name>`).
"""

from __future__ import annotations

import os

os.environ.setdefault("MKL_CBWR", "AUTO")  # before torch, as in run.py

import argparse  # noqa: E402
import json  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

import hf_semspec  # noqa: E402
from hf_semspec._transformers_compat import CACHE_ARGUMENT  # noqa: E402
from hf_semspec.draft_length import DraftLengthConfig, DraftLengthPolicy  # noqa: E402
from hf_semspec.rules import RULES  # noqa: E402

from . import data, markdown, methods, metrics, models  # noqa: E402

RESULTS_DIR = data.REPO_ROOT / "benchmarks" / "results"
FIXED_LENGTH_POLICIES = (None, "constant")


@dataclass
class Forward:
    """One recorded forward of the target: its input ids, fed at positions `start`, `start + 1`, ..., and its logits
    `(rows, vocab)` in float32 for the last `rows` of those positions (a prefill may keep only the last)."""

    start: int
    input_ids: list[int]
    logits: torch.Tensor


class ForwardRecorder:
    """Records every top-level forward of `model` (a context manager; the hooks are removed on exit).

    The start position is the cache's length before the call (`cache.get_seq_length()`), 0 without a cache.
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.forwards: list[Forward] = []
        self._start: int | None = None
        self._handles: list = []

    def _pre_hook(self, module, args, kwargs) -> None:
        cache = kwargs.get(CACHE_ARGUMENT)
        self._start = 0 if cache is None else int(cache.get_seq_length())

    def _post_hook(self, module, args, kwargs, output) -> None:
        input_ids = kwargs["input_ids"] if kwargs.get("input_ids") is not None else args[0]
        if input_ids.shape[0] != 1:
            raise ValueError(f"a forward of batch size {input_ids.shape[0]}: the trace follows one sequence. Fix: "
                             "decode one prompt at a time.")
        self.forwards.append(Forward(self._start, input_ids[0].tolist(), output.logits[0].detach().float().clone()))

    def __enter__(self) -> "ForwardRecorder":
        self._handles = [self.model.register_forward_pre_hook(self._pre_hook, with_kwargs=True),
                         self.model.register_forward_hook(self._post_hook, with_kwargs=True)]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def rows_by_position(forwards: list[Forward], sequence: list[int]) -> dict[int, torch.Tensor]:
    """Position p → the logits row computed at p by the last forward that fed `sequence`'s own tokens up to p
    (`(vocab,)`).

    A forward that fed a rejected draft token computed the rows from there on over a prefix that is not `sequence`'s:
    those positions are dropped, and the later forward that feeds the kept tokens there gives their rows. A position
    no forward fed correctly has no row (`contract_breaches` then says so)."""
    rows: dict[int, torch.Tensor] = {}
    for forward in forwards:
        first_row = forward.start + len(forward.input_ids) - forward.logits.shape[0]
        on_sequence = True
        for offset, token in enumerate(forward.input_ids):
            position = forward.start + offset
            on_sequence = on_sequence and position < len(sequence) and token == sequence[position]
            if not on_sequence:
                rows.pop(position, None)
            elif position >= first_row:
                rows[position] = forward.logits[position - first_row]
    return rows


def contract_breaches(sequence: list[int], prompt_length: int, rows: dict[int, torch.Tensor]) -> list[int]:
    """The positions m ≥ `prompt_length` whose token is not the argmax (first index on ties) of the row at m − 1.
    Raises when a row is missing: the recording did not see the forward that decided that token."""
    missing = [m for m in range(prompt_length, len(sequence)) if m - 1 not in rows]
    if missing:
        raise ValueError(f"no recorded forward computed logits at position {missing[0] - 1}, which decided the token "
                         f"at {missing[0]} ({len(missing)} such). Fix: record the forwards of the call that produced "
                         "this sequence (ForwardRecorder on its target).")
    return [m for m in range(prompt_length, len(sequence)) if int(rows[m - 1].argmax()) != sequence[m]]


def dtype_step(value: float, dtype: torch.dtype) -> float:
    """The spacing of `dtype` at |`value`|: the smallest logit difference it can show there (bf16 at 18.6: 0.125)."""
    x = torch.tensor(abs(value), dtype=dtype)
    return float(torch.nextafter(x, torch.tensor(float("inf"), dtype=dtype)) - x)


def explain_flip(plain_row: torch.Tensor, method_row: torch.Tensor, plain_token: int, method_token: int,
                 dtype: torch.dtype) -> dict:
    """The figures at the first differing token: gaps g = z(a) − z(b) for plain's token a and the method's b in each
    path, D = max |plain_row − method_row| over the other tokens, the dtype's step at the top logit, and
    `within_rounding` (|g| ≤ D in both paths)."""
    gap_plain = float(plain_row[plain_token] - plain_row[method_token])
    gap_method = float(method_row[plain_token] - method_row[method_token])
    others = torch.ones_like(plain_row, dtype=torch.bool)
    others[[plain_token, method_token]] = False
    difference = float((plain_row - method_row).abs()[others].max())
    top = float(plain_row.max())
    return {"plain_logits": [float(plain_row[plain_token]), float(plain_row[method_token])],
            "method_logits": [float(method_row[plain_token]), float(method_row[method_token])],
            "gap_plain": gap_plain, "gap_method": gap_method, "max_difference": difference,
            "dtype_step": dtype_step(top, dtype),
            "within_rounding": abs(gap_plain) <= difference and abs(gap_method) <= difference}


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where `a` and `b` hold different tokens, None where they agree over the shorter one's length
    (greedy decoding with the same budget and EOS cannot then differ in length)."""
    return next((index for index, (x, y) in enumerate(zip(a, b)) if x != y), None)


@dataclass
class RecordedLengthsConfig(DraftLengthConfig):
    component_name = "recorded_lengths"


class RecordedLengths(DraftLengthPolicy):
    """Plays back a generation's round lengths (`AcceptanceStats.drafted_per_round`): round r's budget is the
    number of tokens round r drafted in the run, then 0 (one-token steps) if the decoding runs past them. Not
    registered: built here, passed to `generate()` as an instance."""

    name = "recorded_lengths"
    config_class = RecordedLengthsConfig

    def __init__(self, lengths: list[int]):
        super().__init__()
        self.lengths = list(lengths)
        self.rounds = 0

    def max_tokens(self) -> int:
        return self.lengths[self.rounds] if self.rounds < len(self.lengths) else 0

    def observe(self, outcome) -> None:
        self.rounds += 1


def recorded_lengths(record: dict) -> list[int] | None:
    """The round lengths a record's generation drafted, or None where its run did not keep them."""
    stats = record.get("acceptance_stats") or {}
    return stats.get("drafted_per_round")


def traceable(method: dict, record: dict) -> str | None:
    """Why a run's record cannot be traced, or None: it must be of hf_semspec's loop, with a lossless rule and the
    run's draft, and either keep its round lengths or have drafted at a fixed length."""
    if method["kind"] != "semspec":
        return "not hf_semspec's loop"
    if not methods.has_lossless_rule(method):
        return f"rule {method['rule']!r} is not lossless: its text may differ from plain's by design"
    if method.get("draft") == "pruned_draft":
        return "runs with a pruned drafter, which this script does not load"
    if method.get("drafting") in (methods.LOOKUP, methods.MLA):
        return f"drafts by prompt lookup (--drafting {method['drafting']}), which this script does not rebuild"
    if recorded_lengths(record) is None and method["draft_length"] not in FIXED_LENGTH_POLICIES:
        return (f"draft length {method['draft_length']!r} depends on what the policy learned earlier in the run, and "
                "the run did not keep its round lengths")
    return None


def run_method(described: dict, lengths: list[int] | None) -> methods.Method:
    """A record's method, rebuilt as `run.py` built it, drafting `lengths` (its record's `recorded_lengths`) where the
    record kept them."""
    rule = RULES.get(described["rule"])
    if lengths is not None:
        policy = RecordedLengths(lengths)
    else:
        policy = methods.build_policy("constant", described["gamma"], rule.default_num_draft_tokens,
                                      described["draft_length_kwargs"])
    return methods.Method(described["name"], "semspec", gamma=described["gamma"], rule=described["rule"],
                          rule_kwargs=described["rule_kwargs"], draft_length=policy.name, policy=policy)


def decode_and_record(method: methods.Method, pair: models.ModelPair, inputs: dict, max_new_tokens: int,
                      eos_ids: list[int]) -> tuple[list[int], dict[int, torch.Tensor], list[int], list[int] | None]:
    """Greedy decoding of `method` on `inputs`: (the whole sequence, the logits row deciding each position, the
    contract's breaches, the tokens each round drafted; None for plain decoding)."""
    with ForwardRecorder(pair.target) as recorder, torch.no_grad():
        out = methods.generate(method, pair, inputs, max_new_tokens, do_sample=False)
    prompt_length = inputs["input_ids"].shape[1]
    sequence = out.sequences[0, : prompt_length + len(metrics.new_token_ids(out.sequences, prompt_length, eos_ids))]
    sequence = sequence.tolist()
    rows = rows_by_position(recorder.forwards, sequence)
    stats = getattr(out, "acceptance_stats", None)
    rounds = None if stats is None else stats.drafted_per_round
    return sequence, rows, contract_breaches(sequence, prompt_length, rows), rounds


def prompts_of(config: dict, data_dir: Path) -> dict[str, data.Prompt]:
    """The run's prompt pool by id: its Spec-Bench file (or `--prompts`) and GSM8K."""
    source = Path(config["prompts"]) if config.get("prompts") else data_dir / data.SPECBENCH_FILE
    pool = {p.prompt_id: p for p in data.load_question_prompts(source, 0)}
    gsm8k_path = data_dir / data.GSM8K_FILE
    if gsm8k_path.exists():
        records = data.read_jsonl(gsm8k_path)
        pool.update({p.prompt_id: p for p in data.gsm8k_prompts(records, list(range(len(records))), 0)})
    return pool


def records_to_trace(results: dict) -> tuple[list[dict], list[dict]]:
    """(the run's greedy records that differ from plain's and can be traced, those that cannot, each with the
    reason)."""
    described = {m["name"]: m for m in results["methods"]}
    to_trace, skipped = [], []
    for record in results["records"]:
        if record.get("identical_to_plain") is not False:
            continue
        reason = traceable(described[record["method"]], record)
        if reason is None:
            to_trace.append(record)
        else:
            skipped.append({"prompt_id": record["prompt_id"], "method": record["method"], "reason": reason})
    return to_trace, skipped


def trace(results: dict, records: list[dict], pair: models.ModelPair, prompts: dict[str, data.Prompt]) -> list[dict]:
    """Decodes each of `records` (from `records_to_trace`) and plain on its prompt again, recording the target's
    forwards: one row of figures per record."""
    described = {m["name"]: m for m in results["methods"]}
    plain_text = {r["prompt_id"]: r["text"] for r in results["records"] if r["method"] == methods.PLAIN}
    dtype = pair.target.dtype
    eos_ids = metrics.eos_ids_of(pair.target)
    plain_method = methods.Method(methods.PLAIN, "plain")
    plain_runs: dict[str, tuple[list[int], dict, list[int], None]] = {}
    traced = []
    for record in records:
        prompt = prompts[record["prompt_id"]]
        inputs = pair.encode(prompt.text)
        length = inputs["input_ids"].shape[1]
        if prompt.prompt_id not in plain_runs:
            plain_runs[prompt.prompt_id] = decode_and_record(plain_method, pair, inputs, record["max_new_tokens"],
                                                             eos_ids)
        plain_sequence, plain_rows, plain_breaches, _ = plain_runs[prompt.prompt_id]
        expected_rounds = recorded_lengths(record)
        method = run_method(described[record["method"]], expected_rounds)
        sequence, rows, breaches, rounds = decode_and_record(method, pair, inputs, record["max_new_tokens"], eos_ids)
        j = first_difference(plain_sequence, sequence)
        row = {"prompt_id": record["prompt_id"], "category": record["category"], "method": record["method"],
               "rounds": len(rounds), "rounds_replayed": expected_rounds is not None,
               "reproduced": (pair.decode(plain_sequence[length:]) == plain_text[record["prompt_id"]]
                              and pair.decode(sequence[length:]) == record["text"]
                              and (expected_rounds is None or rounds == expected_rounds)),
               "tokens_checked": len(sequence) - length, "breaches": [m - length for m in breaches],
               "plain_breaches": [m - length for m in plain_breaches], "first_difference": None}
        if j is not None:
            row["first_difference"] = j - length
            row["tokens"] = [plain_sequence[j], sequence[j]]
            row["texts"] = [pair.decode([plain_sequence[j]]), pair.decode([sequence[j]])]
            row.update(explain_flip(plain_rows[j - 1], rows[j - 1], plain_sequence[j], sequence[j], dtype))
        traced.append(row)
        print(json.dumps(row), flush=True)
    return traced


def broke_contract(traced_row: dict) -> bool:
    """Whether a `trace` row found a token, in the method's decoding or plain's, that its forward did not rank first."""
    return bool(traced_row["breaches"] or traced_row["plain_breaches"])


def report_lines(results_name: str, dtype: str, traced: list[dict], skipped: list[dict]) -> list[str]:
    lines = [f"# Greedy texts of lossless rules that left plain's, traced: `{results_name}`", "",
             f"Target dtype {dtype}. *reproduced*: both texts came out as in the run, and the method's rounds drafted "
             "the lengths its record kept (where it kept them: then any policy is traced, its lengths played back). "
             "*contract*: generated tokens that are the argmax of the logits of the forward "
             "that decided them; *a / b*: plain's token and the method's at the first difference; *z*: their logits "
             "in plain's one-token step and in the method's verify forward; *D*: the largest difference between "
             "the two forwards' logits of the other tokens there, with the dtype's step at the top logit; *within "
             "rounding*: both gaps |z(a) − z(b)| ≤ D.", ""]
    table = []
    for r in traced:
        contract = f"{r['tokens_checked'] - len(r['breaches'])} of {r['tokens_checked']}"
        if r["first_difference"] is None:
            table.append([r["category"], f"`{r['method']}`", "yes" if r["reproduced"] else "no", contract,
                          "none (same text now)", "", "", "", ""])
            continue
        table.append([r["category"], f"`{r['method']}`", "yes" if r["reproduced"] else "no", contract,
                      f"{r['first_difference']}: {r['texts'][0]!r} / {r['texts'][1]!r}",
                      " / ".join(f"{z:g}" for z in r["plain_logits"]),
                      " / ".join(f"{z:g}" for z in r["method_logits"]),
                      f"{r['max_difference']:g} (step {r['dtype_step']:g})",
                      "yes" if r["within_rounding"] else "**no**"])
    if table:
        lines += markdown.table(["category", "method", "reproduced", "contract", "first difference: a / b",
                                 "z plain (a / b)", "z method (a / b)", "D", "within rounding"], table)
    else:
        lines += ["No greedy record of a lossless rule that can be traced differs from plain's."]
    if skipped:
        lines += ["", "Not traced:", ""]
        lines += [f"- `{s['method']}` on {s['prompt_id']}: {s['reason']}" for s in skipped]
    if not traced:
        return lines
    breached = [r for r in traced if broke_contract(r)]
    lines += ["", (f"**The contract broke** in {len(breached)} generation(s): a rule emitted a token that is not its "
                   "forward's argmax." if breached else
                   "Every generated token traced is the argmax of the forward that decided it.")]
    return lines


def main(argv: list[str] | None = None, load_pair: Callable[..., models.ModelPair] = models.load_pair) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a results JSON of benchmarks/run.py with greedy decoding")
    parser.add_argument("--data-dir", type=Path, default=None, help="the run's data folder (default: the run's own)")
    parser.add_argument("--cache-dir", default=None, help="where the converted models are cached")
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--name", default=None, help="output name (default: divergence-<run's name>)")
    args = parser.parse_args(argv)

    try:
        results = markdown.load_results(args.run, "run", "run")
    except ValueError as error:
        parser.error(str(error))
    config = results["config"]
    if config.get("sample"):
        parser.error(f"run {args.run}: it sampled (--sample), so its texts differ from plain's by chance. Fix: pass a "
                     "greedy run.")
    prompts = prompts_of(config, args.data_dir or Path(config["data_dir"]))
    records, skipped = records_to_trace(results)
    missing = sorted({r["prompt_id"] for r in records} - set(prompts))
    if missing:
        parser.error(f"run {args.run}: {len(missing)} prompt(s) to trace are not in its data (e.g. {missing[:3]}). "
                     "Fix: pass the run's data folder with --data-dir.")
    traced = []
    if records:  # nothing to decode again: no models to load (a minute for the reference pair)
        pair = load_pair(config["pair"], cache_dir=args.cache_dir, target_dtype=results["models"]["target_dtype"],
                         draft_dtype=results["models"]["draft_dtype"])
        hf_semspec.attach(pair.target)
        traced = trace(results, records, pair, prompts)
    lines = report_lines(args.run.name, results["models"]["target_dtype"], traced, skipped)
    markdown.write_summary(args.output_dir, args.name or f"divergence-{args.run.stem}", "\n".join(lines) + "\n",
                           {"run": str(args.run), "torch": torch.__version__, "traced": traced, "not_traced": skipped})
    return 1 if any(broke_contract(r) for r in traced) else 0


if __name__ == "__main__":
    raise SystemExit(main())
