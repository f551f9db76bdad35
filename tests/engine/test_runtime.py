"""The inference worker process, on the real starter model: streaming, determinism, Stop, crashes."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.errors import EngineCrashed, ModelLoadError
from engine.inference.events import PrefillProgress, Token
from engine.inference.runtime import GenerationParams, InferenceWorker, LoadParams, WorkerResult

pytestmark = pytest.mark.model

GREEDY = GenerationParams(max_tokens=24, temperature=0.0)
PROMPT = "The three primary colours are red, yellow and"


@pytest.fixture(scope="module")
def worker(starter_model: Path) -> Iterator[InferenceWorker]:
    with InferenceWorker(LoadParams(model_path=starter_model, n_ctx=512, n_threads=2, n_batch=64)) as w:
        w.start()
        yield w


def _run(
    worker: InferenceWorker,
    tokens: list[int],
    params: GenerationParams,
    cancel: threading.Event | None = None,
    on_event=None,
) -> tuple[list[object], WorkerResult]:
    events: list[object] = []
    gen = worker.generate(tokens, params, cancel)
    while True:
        try:
            event = next(gen)
        except StopIteration as stop:
            return events, stop.value
        events.append(event)
        if on_event is not None:
            on_event(event, events)


def test_load_reports_model_facts(worker: InferenceWorker) -> None:
    info = worker.info
    assert info is not None
    assert info.architecture == "gemma3"
    assert info.n_ctx == 512
    assert 200e6 < info.n_params < 300e6
    assert info.model_bytes > 100 * 2**20


def test_greedy_generation_is_nonempty_and_deterministic(worker: InferenceWorker) -> None:
    tokens = worker.tokenize(PROMPT, add_bos=True)
    worker.reset_cache()
    events_a, result_a = _run(worker, tokens, GREEDY)
    worker.reset_cache()
    _, result_b = _run(worker, tokens, GREEDY)
    streamed = "".join(e.text for e in events_a if isinstance(e, Token))
    assert result_a.text.strip(), "the reply must not be empty"
    assert streamed == result_a.text
    assert result_a.text == result_b.text
    assert result_a.completion_tokens > 0
    assert result_a.prompt_tokens == len(tokens)
    assert isinstance(events_a[0], PrefillProgress)


def test_prefix_of_previous_sequence_is_reused(worker: InferenceWorker) -> None:
    first = worker.tokenize(PROMPT, add_bos=True)
    worker.reset_cache()
    _, result = _run(worker, first, GREEDY)
    follow_up = first + worker.tokenize(result.text + " And the secondary colours are", special=False)
    _, second = _run(worker, follow_up, GREEDY)
    # Everything up to the previous prompt is reused; the reply's tokens too when they re-tokenize alike.
    assert second.cached_tokens >= len(first)
    assert second.prompt_tokens == len(follow_up)


def test_stop_lands_within_one_token_while_decoding(worker: InferenceWorker) -> None:
    tokens = worker.tokenize("Once upon a time", add_bos=True)
    worker.reset_cache()
    cancel = threading.Event()
    seen_at_cancel: list[int] = []

    def stop_after_three(event: object, events: list[object]) -> None:
        n = sum(isinstance(e, Token) for e in events)
        if n == 3 and not cancel.is_set():
            cancel.set()
            seen_at_cancel.append(n)

    params = GenerationParams(max_tokens=200, temperature=0.0, stop=())
    events, result = _run(worker, tokens, params, cancel, stop_after_three)
    n_tokens = sum(isinstance(e, Token) for e in events)
    assert result.reason == "cancelled"
    assert seen_at_cancel == [3]
    assert n_tokens - 3 <= 1, f"{n_tokens - 3} tokens arrived after Stop"
    assert result.completion_tokens <= 4


def test_stop_lands_within_one_batch_while_prefilling(worker: InferenceWorker) -> None:
    long_prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 40)
    tokens = worker.tokenize(long_prompt, add_bos=True)
    assert len(tokens) > 300
    worker.reset_cache()
    cancel = threading.Event()

    def stop_after_first_batch(event: object, events: list[object]) -> None:
        if isinstance(event, PrefillProgress) and event.done > 0:
            cancel.set()

    events, result = _run(worker, tokens, GREEDY, cancel, stop_after_first_batch)
    progress = [e for e in events if isinstance(e, PrefillProgress)]
    assert result.reason == "cancelled"
    assert not any(isinstance(e, Token) for e in events)
    # n_batch is 64: at most one more batch after the one that triggered Stop.
    assert progress[-1].done <= 2 * 64 < len(tokens)


def test_prompt_longer_than_window_is_an_error_not_a_crash(worker: InferenceWorker) -> None:
    from engine.errors import EngineError

    tokens = worker.tokenize(" ".join(["word"] * 600), add_bos=True)
    with pytest.raises(EngineError, match="does not fit"):
        _run(worker, tokens, GREEDY)
    # The worker is still alive and answers.
    assert worker.alive
    assert worker.tokenize("hi")


def test_killed_worker_raises_engine_crashed_and_a_new_one_works(starter_model: Path) -> None:
    params = LoadParams(model_path=starter_model, n_ctx=256, n_threads=2)
    victim = InferenceWorker(params)
    victim.start()
    tokens = victim.tokenize("Once upon a time", add_bos=True)

    def kill_after_first_token(event: object, events: list[object]) -> None:
        if isinstance(event, Token) and victim.pid is not None:
            os.kill(victim.pid, signal.SIGKILL)

    with pytest.raises(EngineCrashed) as caught:
        _run(victim, tokens, GenerationParams(max_tokens=100, temperature=0.0), None, kill_after_first_token)
    assert caught.value.exitcode == -signal.SIGKILL
    assert "SIGKILL" in str(caught.value)
    assert not victim.alive

    with InferenceWorker(params) as fresh:
        fresh.start()
        _, result = _run(fresh, fresh.tokenize("Hello", add_bos=True), GenerationParams(max_tokens=4, temperature=0))
        assert result.completion_tokens > 0


def test_native_abort_during_load_is_survived(starter_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLASSBOX_TEST_CRASH_ON_LOAD", "1")
    worker = InferenceWorker(LoadParams(model_path=starter_model, n_ctx=256))
    with pytest.raises(EngineCrashed) as caught:
        worker.start()
    assert caught.value.exitcode == -signal.SIGABRT


def test_llama_cpp_refusal_is_a_model_load_error(tmp_path: Path) -> None:
    # A structurally valid GGUF with no tensors: llama.cpp refuses it, the worker reports it.
    import gguf

    path = tmp_path / "empty-model.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    worker = InferenceWorker(LoadParams(model_path=path, n_ctx=64))
    with pytest.raises(ModelLoadError) as caught:
        worker.start()
    assert str(caught.value).startswith(f"{path}: llama.cpp could not load it")
    assert not worker.alive


def test_stop_strings_end_the_reply_and_cost_nothing_per_token(worker: InferenceWorker) -> None:
    """16 stop strings of 256 characters (the API's limits) beside one that matches: the reply ends
    before it, and the worker spends at most 0.5 CPU-s more than without stops (40 tokens)."""
    import random

    import psutil

    assert worker.pid is not None
    child = psutil.Process(worker.pid)

    def cpu() -> float:
        times = child.cpu_times()
        return float(times.user + times.system)

    tokens = worker.tokenize(PROMPT, add_bos=True)
    params = GenerationParams(max_tokens=40, temperature=0.0)
    worker.reset_cache()
    before = cpu()
    events, plain = _run(worker, tokens, params)
    without = cpu() - before
    assert len(plain.text) > 12
    stop = plain.text[6:12]
    rng = random.Random(3)
    noise = tuple("".join(rng.choices("abcdefgh ", k=256)) for _ in range(15))
    worker.reset_cache()
    before = cpu()
    events, stopped = _run(worker, tokens, params.model_copy(update={"stop": (*noise, stop)}))
    with_stops = cpu() - before
    assert stopped.reason == "stop"
    assert stopped.text == plain.text[: plain.text.index(stop)]
    assert "".join(e.text for e in events if isinstance(e, Token)) == stopped.text
    # Long stops with no match: the whole reply, streamed in full.
    worker.reset_cache()
    before = cpu()
    events, unmatched = _run(worker, tokens, params.model_copy(update={"stop": noise}))
    with_stops = max(with_stops, cpu() - before)
    assert unmatched.text == plain.text
    assert "".join(e.text for e in events if isinstance(e, Token)) == plain.text
    assert with_stops < without + 0.5, f"{with_stops:.2f} CPU-s with stops, {without:.2f} without"
