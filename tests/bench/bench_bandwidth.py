"""Memory bandwidth probe and the fit estimator's decode-speed prediction vs llama.cpp's real speed.

Run explicitly: ``pytest tests/bench/bench_bandwidth.py -s``.

1. ``measure_memory_bandwidth`` five times (its spread shows how noisy the machine is).
2. The starter model decoding (best of 3 x 32 single-token evals) in raw llama-cpp-python (in a
   child process), vs
   ``expected_decode_tps`` from the header and the measured bandwidth. Decode is memory-bound, so
   the measured rate should be a sizeable fraction of the prediction (the prediction is a ceiling:
   compute, threads and cache effects take their share).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine.fit import expected_decode_tps
from engine.gguf import read_gguf_info
from engine.hardware import measure_memory_bandwidth

_DECODE = textwrap.dedent(
    """
    import json, sys, time
    from engine.cpu_backend import load_backends
    load_backends()  # the portable build's CPU code, as the worker loads it
    from llama_cpp import Llama
    llm = Llama(model_path=sys.argv[1], n_ctx=512, n_threads=int(sys.argv[2]), verbose=False)
    tokens = llm.tokenize(b"The history of the river town begins")
    llm.eval(tokens)
    # Decode cost does not depend on which token is fed, so feed a fixed one and time only eval
    # (llama-cpp-python's Python-side sampling over a 262k vocabulary would dominate otherwise).
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(32):
            llm.eval([tokens[-1]])
        best = min(best, (time.perf_counter() - start) / 32)
    print(json.dumps({"tps": 1 / best, "n_past": llm.n_tokens}))
    """
)


def test_bandwidth_and_decode_prediction(starter_model: Path) -> None:
    runs = [measure_memory_bandwidth(seconds=0.5) for _ in range(5)]
    gbps = max(runs)
    print(
        f"\nmemory bandwidth GB/s: runs {', '.join(f'{r:.1f}' for r in runs)}; "
        f"median {statistics.median(runs):.1f}, best {gbps:.1f}"
    )
    pytest.importorskip("llama_cpp")
    import os

    info = read_gguf_info(starter_model)
    # One thread and up to four: on a small, busy machine extra threads spin-wait and lose.
    for threads in sorted({1, max(1, min(4, os.cpu_count() or 1))}):
        done = subprocess.run(
            [sys.executable, "-c", _DECODE, str(starter_model), str(threads)],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        measured = json.loads(done.stdout.strip().splitlines()[-1])
        predicted = expected_decode_tps(info, measured["n_past"], gbps)
        print(
            f"starter decode, {threads} thread(s): measured {measured['tps']:.1f} tok/s, bandwidth ceiling "
            f"{predicted:.1f} tok/s ({measured['tps'] / predicted:.0%} of the ceiling)"
        )
        assert measured["tps"] > 0
        from tests.bench.results import record

        record(
            f"decode vs the bandwidth ceiling, {threads} thread(s)",
            measured["tps"] / predicted,
            detail=f"{measured['tps']:.1f} vs {predicted:.1f} tok/s at {gbps:.1f} GB/s (raw llama-cpp-python)",
        )
