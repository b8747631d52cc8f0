"""Benchmark harness for hf_semspec (not part of the installed package).

Run it as `python benchmarks/run.py --help`. The modules are small on purpose:

- `data.py`      — Spec-Bench / GSM8K / custom prompts, and the deterministic per-profile selection;
- `models.py`    — the target/draft pairs (an injectable loading step) and prompt encoding;
- `methods.py`   — the decoding methods compared (plain, stock assisted, one per acceptance rule) and one timed call;
- `metrics.py`   — the shared token counter, the target-forward counter, GSM8K answer parsing, aggregation;
- `profiling.py` — where the time goes (torch.profiler ranges of the decoding loop);
- `report.py`    — machine info, the JSON results, the Markdown table and the optional PNG plot;
- `run.py`       — the command line and the main flow;
- `merge.py`     — one report for new methods and an earlier run's sweep, checked on shared *anchor* methods;
- `replay.py`    — fixed-budget draft-length policies replayed on recorded `exact` greedy acceptance traces.
"""
