"""Proving a CPU variant of llama.cpp on this machine, in children, before the worker may run it.

Contract: ARCHITECTURE.md, 'engine.inference.cpu_probe'.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from engine.cpu_backend import AMX_TAGS, BackendPolicy, amx_kernel_problem, load_backends
from engine.errors import Cancelled

__all__ = ["PROBE_MIN_S", "PROBE_RUNS", "probe_variant"]

#: Runs of a probe, each in a fresh child; all must pass.
PROBE_RUNS = 3
#: Seconds each run decodes at least (at least two rounds of a batch and single tokens).
PROBE_MIN_S = 1.0
_PROBE_TIMEOUT_S = 300.0
_POLL_S = 0.1
_PROBE_TEXT = b"The memory wall: every decoded token reads all the weights once. " * 2
_CANNOT_RUN = 3
_KERNEL_REFUSED = 4


def _probe_main(model_path: str, tag: str, threads: int, run: int, said: multiprocessing.connection.Connection) -> None:
    """Child side of one run: exit 0 when ``tag`` decoded throughout; 3 when this CPU cannot run it;
    4 when the kernel would not keep the tile state (the reason sent on ``said``); a signal when its
    code crashed."""
    fd = os.open(os.devnull, os.O_WRONLY)
    os.dup2(fd, 2)
    os.close(fd)
    backend = load_backends(BackendPolicy(variant=tag, allow_amx=True))
    if backend.variant != tag:
        raise SystemExit(_CANNOT_RUN)
    if tag in AMX_TAGS:  # before any tile is touched
        problem = amx_kernel_problem()
        if problem is not None:
            said.send(problem)
            raise SystemExit(_KERNEL_REFUSED)
    fault = os.environ.get("GLASSBOX_TEST_SIGILL", "")
    if fault == "probe" or fault == f"probe:{run}":  # tests: a crash in every run, or in run N only
        os.kill(os.getpid(), signal.SIGILL)
    # lazy: heavy (llama_cpp)
    import llama_cpp

    llm: Any = llama_cpp.Llama(
        model_path=model_path,
        n_ctx=256,
        n_batch=64,
        n_ubatch=64,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )
    tokens = llm.tokenize(_PROBE_TEXT)[:64]
    started = time.monotonic()
    rounds = 0
    while rounds < 2 or time.monotonic() - started < PROBE_MIN_S:
        llm._ctx.kv_cache_clear()  # from the start again, as the worker's "reset"
        llm.n_tokens = 0
        llm.eval(tokens)  # a batch: the matrix-matrix kernels, on every thread
        for _ in range(4):  # and single tokens: the matrix-vector ones
            llm.eval([llm.sample(temp=0.0)])
        rounds += 1
    llm.close()


def probe_variant(
    model_path: Path,
    tag: str,
    n_threads: int | None = None,
    cancel: threading.Event | None = None,
    runs: int = PROBE_RUNS,
) -> str:
    """Proves CPU variant ``tag`` on this machine: ``runs`` fresh children each load ``model_path``
    on it with every core oversubscribed and decode for a while (see the module's docstring).

    Args:
        model_path: the model the worker will run.
        tag: the variant.
        n_threads: the worker's threads; each run uses twice as many as there are cores, at least this.
        cancel: set it to give up (the child is killed; nothing is concluded).
        runs: how many runs must pass.

    Returns:
        ``"ok"``, or one line saying how it failed (``"crashed (SIGILL) in run 2 of 3"``, ...).

    Raises:
        Cancelled: ``cancel`` was set.
    """
    threads = max(2 * (os.cpu_count() or 1), n_threads or 0, 2)
    for run in range(1, runs + 1):
        verdict = _probe_once(model_path, tag, threads, run, cancel)
        if verdict != "ok":
            return f"{verdict} in run {run} of {runs}" if runs > 1 and verdict.startswith("crashed") else verdict
    return "ok"


def _probe_once(model_path: Path, tag: str, threads: int, run: int, cancel: threading.Event | None) -> str:
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_probe_main, args=(str(model_path), tag, threads, run, send), name="glassbox-cpu-probe")
    proc.start()
    send.close()
    deadline = time.monotonic() + _PROBE_TIMEOUT_S
    try:
        while proc.is_alive() and time.monotonic() < deadline:
            if cancel is not None and cancel.is_set():
                proc.kill()
                proc.join(5)
                raise Cancelled("model load cancelled")
            proc.join(_POLL_S)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
            return f"timed out after {_PROBE_TIMEOUT_S:.0f} s"
        code = proc.exitcode
        if code == 0:
            return "ok"
        if code == _CANNOT_RUN:
            return "this CPU cannot run it"
        if code == _KERNEL_REFUSED:
            return str(receive.recv()) if receive.poll() else "the kernel would not keep the AMX tile state"
        if code is not None and code < 0:
            try:
                return f"crashed ({signal.Signals(-code).name})"
            except ValueError:
                return f"crashed (signal {-code})"
        return f"failed (exit code {code})"
    finally:
        receive.close()
