"""Quantization time: ``engine.convert.quantize.quantize_model`` vs the raw ``llama_model_quantize`` call.

Run explicitly: ``pytest tests/bench/bench_quantize.py -s`` (``BENCH_QUANT_LAYERS`` sets the model
depth, default 4, about 100 MB of F16; ``BENCH_QUANT_RUNS`` the runs per side, default 7;
``BENCH_QUANT_TYPE`` the type, default Q4_K_M; ``BENCH_QUANT_THREADS`` default 2).

Glassbox's side pays for everything a user gets: header validation, the free-space check, a child
process (forked from multiprocessing's fork server on POSIX; the server itself starts on the first
call, which is one of the timed runs) that loads the llama.cpp bindings, stderr piped back and
parsed per tensor, the result re-validated, fsync and rename. The raw side is one in-process call with
llama-cpp-python already imported. Runs alternate (ours then raw, raw then ours, ...); the printed ratio is
median raw time / median Glassbox time (throughput ratio). Budget (issue 3): >= 0.95.
"""

from __future__ import annotations

import ctypes
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from tiny_models import write_tiny_llama_gguf

from engine.convert.quantize import find_quant_type, quantize_model

LAYERS = int(os.environ.get("BENCH_QUANT_LAYERS", "4"))
RUNS = int(os.environ.get("BENCH_QUANT_RUNS", "7"))
QTYPE = os.environ.get("BENCH_QUANT_TYPE", "Q4_K_M")
THREADS = int(os.environ.get("BENCH_QUANT_THREADS", "2"))


def _raw_quantize(src: Path, dst: Path, ftype: int) -> float:
    import llama_cpp.llama_cpp as native

    params = native.llama_model_quantize_default_params()
    params.nthread = THREADS
    params.ftype = ftype
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)  # the same log lines go somewhere, as on our side
    try:
        started = time.perf_counter()
        rc = native.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
        seconds = time.perf_counter() - started
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
    assert rc == 0
    return seconds


def test_quantize_vs_raw(tmp_path: Path) -> None:
    src = tmp_path / "bench-F16.gguf"
    write_tiny_llama_gguf(src, dtype="F16", n_embd=1024, n_ff=2816, n_layer=LAYERS)
    qt = find_quant_type(QTYPE)
    import llama_cpp.llama_cpp as native

    native.llama_backend_init()
    ours: list[float] = []
    raw: list[float] = []
    tensors = 0
    sizes: dict[str, int] = {}

    def glassbox(i: int) -> None:
        dst = tmp_path / f"ours-{i}.gguf"
        os.sync()  # each run starts with no dirty pages left by the other side's output
        started = time.perf_counter()
        sizes["ours"] = quantize_model(src, dst, qt.name, threads=THREADS).dst_bytes
        ours.append(time.perf_counter() - started)
        dst.unlink()

    def raw_call(i: int) -> None:
        raw_dst = tmp_path / f"raw-{i}.gguf"
        os.sync()
        raw.append(_raw_quantize(src, raw_dst, qt.ftype))
        sizes["raw"] = raw_dst.stat().st_size
        raw_dst.unlink()

    for i in range(RUNS):  # alternate which side goes first
        for run in (glassbox, raw_call) if i % 2 == 0 else (raw_call, glassbox):
            run(i)
        assert abs(sizes["raw"] - sizes["ours"]) < 4096
        tensors = 9 * LAYERS + 3
    ratio = statistics.median(raw) / statistics.median(ours)
    size_mb = src.stat().st_size / 1e6
    print()
    print(f"model {size_mb:.0f} MB F16, {tensors} tensors -> {qt.name}, {THREADS} threads, {RUNS} runs each")
    for label, times in (("glassbox (child process)", ours), ("raw llama_model_quantize", raw)):
        print(f"{label}  median {statistics.median(times):.3f} s  runs {[round(t, 3) for t in times]}")
    print(f"ratio (raw / glassbox)    {ratio:.3f}   budget >= 0.95")
    medians = {"ours_s": statistics.median(ours), "raw_s": statistics.median(raw)}
    print(json.dumps({"ratio": round(ratio, 4), **medians}))
    from tests.bench.results import record

    record(
        "quantize vs raw llama_model_quantize",
        ratio,
        at_least=0.95,
        detail=f"{medians['ours_s']:.2f} vs {medians['raw_s']:.2f} s",
    )
