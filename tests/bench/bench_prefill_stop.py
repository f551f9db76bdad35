"""What Stop-anywhere costs the prompt's evaluation, and how fast Stop lands (issue 15, item 8).

Run: ``pytest tests/bench/bench_prefill_stop.py -s``.

* Prefill speed: the engine's prefill (``engine.inference.decoding.prefill``: whole ``n_batch``
  chunks with llama.cpp's abort callback armed, and a progress report after each) against
  evaluating the same prompt in the same chunks with no callback, on one model, interleaved.
  Budget >= 0.95x.
* Stop latency: Stop at random moments of a ~1,300-token prompt through the worker process; the
  time from Stop to the generation's end. Budget: median <= 100 ms, worst <= 250 ms (the parent
  polls the pipe every 20 ms; the machine is shared).
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from pathlib import Path

import pytest

from engine.inference.events import Token
from engine.inference.runtime import GenerationParams, InferenceWorker, LoadParams
from tests.bench.results import budgets, record

pytestmark = [pytest.mark.model, pytest.mark.slow]

_TEXT = Path(__file__).resolve().parents[2] / "resources" / "perplexity.txt"
N_BATCH = 512


def test_prefill_speed_with_stop_anywhere(starter_model: Path) -> None:
    import llama_cpp

    from engine.cpu_backend import load_backends
    from engine.inference.decoding import prefill

    load_backends()
    llm = llama_cpp.Llama(
        model_path=str(starter_model),
        n_ctx=2048,
        n_batch=N_BATCH,
        n_ubatch=N_BATCH,
        n_threads=2,
        n_threads_batch=2,
        verbose=False,
    )
    try:
        tokens = llm.tokenize(_TEXT.read_text(encoding="utf-8").encode())
        tokens = (tokens * 2)[:1500]
        never = threading.Event()
        progress: list[object] = []

        def engine_side() -> float:
            llm._ctx.kv_cache_clear()
            llm.n_tokens = 0
            start = time.perf_counter()
            assert prefill(llm, llama_cpp, tokens, N_BATCH, never, progress.append)
            return len(tokens) / (time.perf_counter() - start)

        def whole_chunks() -> float:
            llm._ctx.kv_cache_clear()
            llm.n_tokens = 0
            start = time.perf_counter()
            for i in range(0, len(tokens), N_BATCH):
                llm.eval(tokens[i : i + N_BATCH])
            return len(tokens) / (time.perf_counter() - start)

        engine_side()  # warm up
        ratios, ours, theirs = [], [], []
        for i in range(5):
            if i % 2 == 0:  # alternate which side goes first
                a = engine_side()
                b = whole_chunks()
            else:
                b = whole_chunks()
                a = engine_side()
            ours.append(a)
            theirs.append(b)
            ratios.append(a / b)
    finally:
        llm.close()
    ratio = statistics.median(ratios)
    updates = sum(1 for _ in progress) / (len(ratios) + 1)
    print(
        f"\nprefill of {len(tokens)} tokens: whole {N_BATCH}-token chunks {statistics.median(theirs):.0f} tok/s, "
        f"engine (whole chunks, abort callback) {statistics.median(ours):.0f} tok/s, ratio {ratio:.3f}; "
        f"{updates:.0f} progress updates per prompt"
    )
    record(
        "prefill with Stop armed vs whole chunks",
        ratio,
        at_least=0.95,
        detail=f"{statistics.median(ours):.0f} vs {statistics.median(theirs):.0f} tok/s, {len(tokens)} tokens",
    )


def test_stop_latency_during_prefill(starter_model: Path) -> None:
    rng = random.Random(5)
    latencies: list[float] = []
    with InferenceWorker(LoadParams(model_path=starter_model, n_ctx=2048, n_threads=2, n_batch=N_BATCH)) as worker:
        worker.start()
        text = _TEXT.read_text(encoding="utf-8")
        tokens = (worker.tokenize(text, add_bos=True) * 2)[:1500]
        for _ in range(6):
            worker.reset_cache()
            cancel = threading.Event()
            stopped: list[float] = []

            def stop(c: threading.Event = cancel, s: list[float] = stopped) -> None:
                s.append(time.perf_counter())
                c.set()

            timer = threading.Timer(rng.uniform(0.1, 1.5), stop)
            gen = worker.generate(tokens, GenerationParams(max_tokens=4, temperature=0.0), cancel)
            timer.start()
            got_token = False
            while True:
                try:
                    got_token |= isinstance(next(gen), Token)
                except StopIteration as done:
                    reason = done.value.reason
                    break
            end = time.perf_counter()
            timer.cancel()
            if not stopped:
                continue  # the prompt was read before the timer fired
            assert reason == "cancelled" and not got_token
            latencies.append(end - stopped[0])
    assert len(latencies) >= 3
    median, worst = statistics.median(latencies), max(latencies)
    print(f"\nStop during prefill: {len(latencies)} stops, median {median * 1000:.0f} ms, worst {worst * 1000:.0f} ms")
    with budgets():
        record("Stop during prefill: median", median * 1000, unit="ms", at_most=100, detail=f"{len(latencies)} stops")
        record("Stop during prefill: worst", worst * 1000, unit="ms", at_most=250, detail=f"{len(latencies)} stops")
