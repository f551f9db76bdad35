"""Which stop string ended a reply: ``StopMatcher.matched``, carried by the decode loop into
``WorkerResult.stop_sequence`` and by the session into ``Finished.stop_sequence`` (what
``glassbox serve`` answers Anthropic's ``stop_reason: "stop_sequence"`` with)."""

from __future__ import annotations

import dataclasses
import random
import threading
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path

import pytest

from engine.inference.decoding import StopMatcher
from engine.inference.events import Finished, Token
from engine.inference.runtime import GenerationParams, InferenceWorker, LoadParams, WorkerResult
from tests.engine import family_templates as ft
from tests.engine.scripted_worker import Script, scripted_session


def first_stop_by_scan(text: str, stops: Sequence[str]) -> str | None:
    """The stop string a reply fed one character at a time ends on: the first one completed."""
    for end in range(1, len(text) + 1):
        done = [s for s in stops if s and text[:end].endswith(s)]
        if done:
            return max(done, key=len)  # two ending at once: the longer began first
    return None


def test_matched_is_the_stop_string_that_was_found() -> None:
    assert StopMatcher(["bc"]).matched is None
    matcher = StopMatcher(["bc", "abcd", ""])
    assert matcher.feed("xx") is None
    assert matcher.feed("abcdef") == 2
    assert matcher.matched == "abcd"  # begins first, though "bc" ends first
    matcher = StopMatcher(["\n\nUser:", "</s>"])
    assert matcher.feed("Hello.\n\nUs") is None
    assert matcher.feed("er: more") == 6 and matcher.matched == "\n\nUser:"


def test_matched_agrees_with_scanning_character_by_character() -> None:
    rng = random.Random(11)
    for _ in range(3000):
        stops = ["".join(rng.choices("ab", k=rng.randint(1, 4))) for _ in range(rng.randint(1, 4))]
        text = "".join(rng.choices("ab", k=20))
        matcher = StopMatcher(stops)
        hit = None
        for char in text:
            hit = matcher.feed(char)
            if hit is not None:
                break
        expected = first_stop_by_scan(text, stops)
        assert (matcher.matched if hit is not None else None) == expected, (stops, text)
        if expected is not None:
            assert hit is not None and text[hit:].startswith(expected)


def test_the_session_carries_the_stop_string_into_finished(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = Script(replies=["one two", "three"])
    session = scripted_session(tmp_path, monkeypatch, ft.QWEN3, script)
    worker = session.worker
    assert worker is not None
    original = worker.generate

    def generate(
        tokens: Sequence[int], params: GenerationParams, cancel: threading.Event | None = None
    ) -> Generator[object, None, WorkerResult]:
        result = yield from original(tokens, params, cancel)
        return dataclasses.replace(result, stop_sequence="END")

    monkeypatch.setattr(worker, "generate", generate)
    chat = list(session.stream([], "hi", GenerationParams(max_tokens=8, stop=("END",))))
    assert isinstance(chat[-1], Finished) and chat[-1].stop_sequence == "END"
    raw = list(session.complete("a prompt", GenerationParams(max_tokens=8)))
    assert isinstance(raw[-1], Finished) and raw[-1].stop_sequence == "END"


@pytest.fixture(scope="module")
def worker(starter_model: Path) -> Iterator[InferenceWorker]:
    with InferenceWorker(LoadParams(model_path=starter_model, n_ctx=512, n_threads=2, n_batch=256)) as w:
        w.start()
        yield w


def _generate(worker: InferenceWorker, params: GenerationParams) -> tuple[str, WorkerResult]:
    worker.reset_cache()
    gen = worker.generate(worker.tokenize("The three primary colours are", add_bos=True), params)
    shown = ""
    while True:
        try:
            event = next(gen)
        except StopIteration as done:
            return shown, done.value
        if isinstance(event, Token):
            shown += event.text


@pytest.mark.model
def test_the_worker_reports_the_stop_string_that_ended_the_reply(worker: InferenceWorker) -> None:
    greedy = GenerationParams(max_tokens=24, temperature=0.0)
    _, free = _generate(worker, greedy)
    assert free.reason == "length" and free.stop_sequence is None
    words = free.text.split()
    assert len(words) >= 4, free.text
    stop = words[2]  # a stop string the greedy reply reaches, after one it never matches
    shown, stopped = _generate(worker, greedy.model_copy(update={"stop": ["never-in-this-reply", stop]}))
    assert stopped.reason == "stop" and stopped.stop_sequence == stop
    assert stopped.text == shown == free.text[: free.text.index(stop)]
