"""Engine vs raw llama-cpp-python on the starter model: prefill and decode, interleaved, median ratio.

Run: ``make bench`` or ``pytest tests/bench/bench_engine.py -s``. Both sides run as the app does:
the worker's own threads and OpenMP settings (``engine.inference.runtime``), the raw side given the
same threads and, in this process, the same settings (``engine.inference.bench.run_bench``); the
order alternates every round. Prints the table and the ratios; the budget (ARCHITECTURE.md) is
>= 0.97 for both.
"""

from __future__ import annotations

import json
from pathlib import Path

from engine.inference.bench import DEFAULT_PROMPT, run_bench
from tests.bench.results import budgets, record

# About 700 prompt tokens: prefill is timed as prompt tokens over the time to the first token, so a
# prompt of a few dozen tokens (~100 ms) let the fixed costs of a turn (the pipe to the worker,
# rendering the template) and the machine's noise swing the ratio by +-15% from run to run here.
PASSAGE = (
    "The keeper of the lighthouse wrote in his log each evening: the wind, the sea, the ships that "
    "passed, the oil the lamp had burned and the hours he had slept. Years later the logs were the "
    "only record of the wrecks on that coast, and historians read them line by line. "
)
PROMPT = PASSAGE * 12 + DEFAULT_PROMPT


def test_engine_vs_raw(starter_model: Path) -> None:
    report = run_bench(starter_model, rounds=7, max_tokens=96, n_ctx=2048, prompt=PROMPT)
    doc = report.to_dict()
    print()
    print(f"{'':8}{'prefill tok/s':>15}{'decode tok/s':>15}{'TTFT ms':>10}")
    for side in ("engine", "raw"):
        d = doc[side]
        print(f"{side:8}{d['prefill_tps']:15.1f}{d['decode_tps']:15.1f}{d['ttft_ms']:10.1f}")
    print(f"ratio   {doc['prefill_ratio']:15.3f}{doc['decode_ratio']:15.3f}")
    keys = ("prefill_ratio", "decode_ratio", "threads", "threads_batch", "environment", "n_ctx", "max_tokens")
    print(json.dumps({k: doc[k] for k in keys}))
    prompt_tokens = report.runs[0].prompt_tokens if report.runs else 0
    threads = f"{doc['threads']}/{doc['threads_batch']} threads"
    with budgets():
        for key in ("prefill", "decode"):
            engine, raw = doc["engine"][f"{key}_tps"], doc["raw"][f"{key}_tps"]
            extra = f", {prompt_tokens} prompt tokens" if key == "prefill" else ""
            record(
                f"engine vs raw: {key}",
                doc[f"{key}_ratio"],
                at_least=0.97,
                detail=f"{engine:.1f} vs {raw:.1f} tok/s{extra}, {threads}",
            )
