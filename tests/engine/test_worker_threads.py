"""The worker's CPU settings: the threads it picks, the OpenMP settings it sets before llama.cpp
loads, and that the worker reports both (the choice itself is measured: tests/bench/bench_threads.py)."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path

import pytest

from engine.inference import runtime
from engine.inference.runtime import (
    InferenceWorker,
    LoadParams,
    apply_worker_environment,
    default_threads,
    others_running,
    prompt_threads,
    usable_cores,
)


def test_every_core_is_the_most_a_reply_uses() -> None:
    assert default_threads(1) == (1, 1)
    assert default_threads(2) == (2, 2)
    assert default_threads(16) == (16, 16)
    assert 1 <= usable_cores() <= (__import__("os").cpu_count() or 1)


def test_load_params_threads_given_or_chosen() -> None:
    model = Path("m.gguf")
    assert LoadParams(model_path=model).threads(8) == (8, 8)
    assert LoadParams(model_path=model, n_threads=3).threads(8) == (3, 3)  # the setting sets both
    assert LoadParams(model_path=model, n_threads=3, n_threads_batch=6).threads(8) == (3, 6)
    assert LoadParams(model_path=model, n_threads_batch=4).threads(8) == (8, 4)


def test_the_environment_is_set_where_the_user_did_not_set_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "WORKER_ENVIRONMENT", {"OMP_WAIT_POLICY": "", "GOMP_SPINCOUNT": "1234"})
    env: dict[str, str] = {}
    assert apply_worker_environment(env) == {"GOMP_SPINCOUNT": "1234"}  # an empty value is not set
    assert env == {"GOMP_SPINCOUNT": "1234"}
    mine = {"GOMP_SPINCOUNT": "7", "OMP_WAIT_POLICY": "PASSIVE"}
    assert apply_worker_environment(mine) == {"GOMP_SPINCOUNT": "7", "OMP_WAIT_POLICY": "PASSIVE"}


@pytest.mark.model
def test_the_worker_reports_its_threads_and_environment(starter_model: Path) -> None:
    with InferenceWorker(LoadParams(model_path=starter_model, n_ctx=256, n_threads_batch=1)) as worker:
        info = worker.start()
    decode, _ = default_threads()
    assert (info.n_threads, info.n_threads_batch) == (decode, 1)
    expected = apply_worker_environment(dict(__import__("os").environ))
    assert info.environment == expected


def test_prompt_batches_take_the_cores_nobody_else_uses() -> None:
    assert prompt_threads(2, 0) == 2
    assert prompt_threads(2, 1) == 1
    assert prompt_threads(2, 5) == 1
    assert prompt_threads(16, 3) == 13
    assert prompt_threads(4, None) == 4  # cannot tell: every core
    busy = others_running()
    assert busy is None or busy >= 0


def _spin(stop: threading.Event) -> None:
    data = bytes(8 << 20)
    while not stop.is_set():
        hashlib.sha256(data).digest()  # hashing releases the GIL: the thread runs beside the others


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="Linux's /proc tells which threads run")
def test_the_workers_own_threads_are_not_counted_as_other_programs() -> None:
    # Two threads of this process spinning (as the KV cache's writer or an OpenMP thread still
    # spinning after a batch would): procs_running counts them, others_running must not.
    stop = threading.Event()
    spinners = [threading.Thread(target=_spin, args=(stop,), daemon=True) for _ in range(2)]
    for thread in spinners:
        thread.start()
    try:
        time.sleep(0.05)
        seen = []
        for _ in range(20):
            own = runtime._own_running()
            with open("/proc/stat", "rb") as stat:
                total = next(int(line.split()[1]) for line in stat if line.startswith(b"procs_running "))
            seen.append((own, total, others_running()))
    finally:
        stop.set()
        for thread in spinners:
            thread.join()
    # Both hash without the GIL, so they run as the reader does: all three counted as its own.
    assert max(own for own, _total, _others in seen) >= 3
    for _own, total, others in seen:
        assert others is not None and others <= max(0, total - 1)


@pytest.mark.model
def test_the_reply_does_not_depend_on_how_many_threads_read_the_prompt(starter_model: Path) -> None:
    from engine.inference.runtime import GenerationParams

    replies = []
    for batch in (1, 2):
        with InferenceWorker(LoadParams(model_path=starter_model, n_ctx=512, n_threads=1, n_threads_batch=batch)) as w:
            w.start()
            tokens = w.tokenize("The lighthouse keeper wrote in his log each evening: " * 8, add_bos=True)
            gen = w.generate(tokens, GenerationParams(max_tokens=24, temperature=0.0))
            while True:
                try:
                    next(gen)
                except StopIteration as done:
                    replies.append(done.value.text)
                    break
    assert replies[0] == replies[1] and replies[0]


@pytest.mark.parametrize(
    ("readings", "busy"),
    [
        ([1, 0, 0, 3, 0], 0),  # a thread that ran for a moment (the app sending the prompt)
        ([1, 1, 0, 1, 1], 1),  # a program busy all along, off its core for one reading
        ([2, 2, 2, 2, 2], 2),
        ([0, None, 0, 0, 0], None),  # cannot be told
    ],
)
def test_other_programs_are_the_median_of_a_few_readings(
    monkeypatch: pytest.MonkeyPatch, readings: list[int | None], busy: int | None
) -> None:
    feed = iter(readings)
    monkeypatch.setattr(runtime, "_others_now", lambda: next(feed))
    assert others_running(samples=5, gap_s=0.0) == busy
