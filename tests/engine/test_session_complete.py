"""``ChatSession.complete``: generation from a raw prompt (the legacy ``/v1/completions``), over a
scripted worker (tests/engine/scripted_worker.py): no chat template, the session's lock held, no
conversation's saved KV cache sent with it, and a prompt that does not fit refused before the worker
sees it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from engine.errors import ContextOverflow, EngineError
from engine.inference.events import Finished, Stats, Token
from engine.inference.kv_cache import KvCacheConfig, KvKey
from engine.inference.runtime import GenerationParams
from tests.engine import family_templates as ft
from tests.engine.scripted_worker import Script, scripted_session


def test_a_raw_prompt_goes_to_the_worker_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = Script(replies=["Paris."])
    session = scripted_session(tmp_path, monkeypatch, ft.QWEN3, script)
    events = list(session.complete("The capital of France is", GenerationParams(max_tokens=8)))
    assert script.prompts == ["The capital of France is"]  # no template around it
    assert "".join(e.text for e in events if isinstance(e, Token)) == "Paris."
    stats = next(e for e in events if isinstance(e, Stats))
    assert stats.template == "raw" and stats.prompt_tokens == len(b"The capital of France is")
    assert stats.budget == {"current": 24, "reserve": 8, "free": 4096 - 24 - 8}
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.text == "Paris." and finished.stats is stats
    ids = session.tokenize_prompt("hi")
    assert ids == list(b"hi") and session.pieces(ids) == ["h", "i"]
    list(session.complete(ids))
    assert script.prompts[-1] == "hi"


def test_a_prompt_that_does_not_fit_or_is_empty_never_reaches_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script()
    session = scripted_session(tmp_path, monkeypatch, ft.QWEN3, script, n_ctx=64)
    with pytest.raises(ContextOverflow, match=r"the prompt \(60 tokens\) and max_tokens \(8\) do not fit"):
        list(session.complete("x" * 60, GenerationParams(max_tokens=8)))
    with pytest.raises(EngineError, match="the prompt is empty"):
        list(session.complete([]))
    assert script.prompts == []


def test_no_chat_turns_saved_kv_cache_goes_with_a_raw_prompt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    session = scripted_session(tmp_path, monkeypatch, ft.QWEN3, Script())
    session.kv_cache = KvCacheConfig(tmp_path / "kv", 1 << 20)
    sent: list[Any] = []
    worker = session.worker
    assert worker is not None
    monkeypatch.setattr(worker, "configure_kv_cache", sent.append)
    list(session.stream([], "hello", cache_key=KvKey("chat-1")))
    list(session.complete("raw text"))
    assert len(sent) == 2 and sent[0].key == KvKey("chat-1") and sent[1] is None


def test_a_raw_prompt_holds_the_session_while_it_generates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chat turn (here: a tokenization) from another thread waits until the completion is done."""
    session = scripted_session(tmp_path, monkeypatch, ft.QWEN3, Script(replies=["a long enough reply"]))
    events = session.complete("prompt")
    next(events)  # generating now
    done = threading.Event()
    other = threading.Thread(target=lambda: (session.tokenize_prompt("other"), done.set()))
    other.start()
    assert not done.wait(0.3)
    rest = list(events)
    other.join(5)
    assert done.is_set() and isinstance(rest[-1], Finished)
