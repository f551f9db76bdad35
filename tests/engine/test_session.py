"""The chat session on the real starter model: templates, budget, KV reuse, eviction, stats."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.errors import ContextOverflow, EngineCrashed
from engine.inference.context import Message
from engine.inference.events import Finished, PrefillProgress, Stats, Token
from engine.inference.runtime import GenerationParams, LoadParams
from engine.inference.session import ChatSession

pytestmark = pytest.mark.model

GREEDY = GenerationParams(max_tokens=16, temperature=0.0)


@pytest.fixture(scope="module")
def session(starter_model: Path) -> Iterator[ChatSession]:
    with ChatSession(
        LoadParams(model_path=starter_model, n_ctx=1024, n_threads=2),
        machine_bandwidth_gbps=10.0,
        reply_reserve=64,
    ) as s:
        s.load()
        yield s


def _turn(session: ChatSession, history: list[Message], user: str, **kw: object) -> tuple[str, Finished, list]:
    events = list(session.stream(history, user, kw.pop("params", GREEDY), **kw))  # type: ignore[arg-type]
    finished = events[-1]
    assert isinstance(finished, Finished)
    return finished.text, finished, events


def test_reply_streams_and_finishes_with_stats(session: ChatSession) -> None:
    text, finished, events = _turn(session, [], "Write one sentence about the sea.")
    assert isinstance(events[0], PrefillProgress)
    tokens = "".join(e.text for e in events if isinstance(e, Token))
    assert tokens == text
    assert text.strip()
    assert finished.reason in ("stop", "length")
    stats = finished.stats
    assert any(isinstance(e, Stats) for e in events)
    assert stats.n_ctx == 1024
    assert stats.prompt_tokens > 5
    assert stats.completion_tokens > 0
    assert stats.context_used == stats.prompt_tokens + stats.completion_tokens - (finished.reason == "length")
    assert stats.ttft_ms > 0 and stats.prefill_tps > 0
    assert stats.kv_cache_bytes > stats.kv_used_bytes > 0
    assert stats.model_bytes > 100 * 2**20
    assert stats.machine_bandwidth_gbps == 10.0
    if stats.completion_tokens > 1:
        assert stats.decode_tps > 0
        expected = (stats.model_bytes + stats.kv_used_bytes) * stats.decode_tps / 1e9
        assert stats.bandwidth_gbps == pytest.approx(expected, rel=0.01)
    budget = stats.budget
    assert set(budget) == {
        "system", "documents", "tools", "history", "tool_results", "media", "current", "reserve", "free"
    }  # fmt: skip
    assert sum(budget.values()) == 1024
    assert stats.template


def test_greedy_reply_is_deterministic(session: ChatSession) -> None:
    session.worker.reset_cache()  # type: ignore[union-attr]
    first, _, _ = _turn(session, [], "List three fruits:")
    session.worker.reset_cache()  # type: ignore[union-attr]
    second, _, _ = _turn(session, [], "List three fruits:")
    assert first == second
    assert first.strip()


def test_follow_up_turn_reuses_the_previous_turn(session: ChatSession) -> None:
    session.worker.reset_cache()  # type: ignore[union-attr]
    reply, first, _ = _turn(session, [], "Name a colour.")
    history = [Message("user", "Name a colour."), Message("assistant", reply)]
    _, second, _ = _turn(session, history, "Name another one.")
    # The whole first prompt is reused from the KV cache; only the new turn is evaluated.
    assert second.stats.cached_tokens >= first.stats.prompt_tokens
    assert second.stats.prompt_tokens - second.stats.cached_tokens < second.stats.prompt_tokens // 2


class OneBlock:
    """One retrieved passage, already a documents block (``engine.inference.context.RankedDocuments``)."""

    def __init__(self, block: str) -> None:
        self.block = block

    @property
    def count(self) -> int:
        return 1

    def text(self, kept: int) -> str:
        return self.block if kept else ""


def test_system_prompt_and_documents_are_counted(session: ChatSession) -> None:
    _, finished, _ = _turn(
        session,
        [],
        "Summarise.",
        system="You are terse.",
        documents=OneBlock("[1] notes.txt\nThe meeting is on Tuesday."),
    )
    assert finished.stats.budget["system"] > 0
    assert finished.stats.budget["documents"] > 0
    assert (finished.stats.documents_kept, finished.stats.documents_dropped) == (1, 0)


def test_long_conversation_evicts_and_keeps_answering(starter_model: Path) -> None:
    with ChatSession(LoadParams(model_path=starter_model, n_ctx=256, n_threads=2), reply_reserve=32) as small:
        history: list[Message] = []
        evicted = []
        for i in range(8):
            user = f"Turn {i}: tell me something about the number {i} and the colour blue, please."
            text, finished, _ = _turn(small, history, user, params=GenerationParams(max_tokens=24, temperature=0))
            assert finished.reason in ("stop", "length")
            assert finished.stats.prompt_tokens + 24 <= 256 or finished.reason == "length"
            evicted.append(finished.stats.evicted_messages)
            history += [Message("user", user), Message("assistant", text)]
        assert max(evicted) > 0, "a conversation longer than the window must evict old turns"
        assert evicted[0] == 0


def test_refuse_policy_raises_context_overflow(starter_model: Path) -> None:
    with ChatSession(
        LoadParams(model_path=starter_model, n_ctx=128, n_threads=2),
        overflow_policy="refuse",
        reply_reserve=16,
    ) as small:
        history = [Message("user", "word " * 80), Message("assistant", "reply " * 80)]
        with pytest.raises(ContextOverflow, match="context window"):
            list(small.stream(history, "and now?", GREEDY))
        # The session still works for a conversation that fits.
        _, finished, _ = _turn(small, [], "Hi")
        assert finished.stats.completion_tokens >= 0


def test_crash_mid_generation_then_next_turn_works(session: ChatSession) -> None:
    cancel = threading.Event()
    stream = session.stream([], "Tell me a long story about a dragon.", GenerationParams(max_tokens=64), cancel=cancel)

    def run_until_killed() -> None:
        for event in stream:
            if isinstance(event, Token):
                os.kill(session.worker.pid, signal.SIGKILL)  # type: ignore[union-attr,arg-type]

    with pytest.raises(EngineCrashed):
        run_until_killed()
    # The next turn starts a fresh worker; the conversation (kept by the caller) goes on.
    _, finished, _ = _turn(session, [], "Hello")
    assert finished.reason in ("stop", "length")
    assert session.worker is not None and session.worker.alive


def test_prompt_view_shows_the_last_prompt_tokens(session: ChatSession) -> None:
    _turn(session, [], "Hello there")
    view = session.prompt_view()
    assert len(view.token_ids) == len(view.pieces) > 3
    assert "Hello" in "".join(view.pieces)


def test_gpu_out_of_memory_at_load_retries_with_fewer_layers(
    starter_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import engine.inference.session as session_module
    from engine.errors import ModelLoadError
    from engine.inference.runtime import ModelInfo

    tried: list[int] = []

    class FakeWorker:
        def __init__(self, params: LoadParams) -> None:
            self.params = params
            self.alive = True
            self.backend = None

        def start(self, cancel: object = None) -> ModelInfo:
            tried.append(self.params.n_gpu_layers)
            if self.params.n_gpu_layers > 4:
                raise ModelLoadError(f"{self.params.model_path}: cudaMalloc failed: out of memory")
            return ModelInfo(
                str(self.params.model_path),
                "gemma3",
                256,
                32768,
                262144,
                1,
                1,
                18,
                self.params.n_gpu_layers,
                True,
                "<bos>",
                "<eos>",
                True,
                None,
            )

        def close(self, kill: bool = False) -> None:
            self.alive = False

    monkeypatch.setattr(session_module, "InferenceWorker", FakeWorker)
    chat = ChatSession(LoadParams(model_path=starter_model, n_gpu_layers=19))
    info = chat.load()
    assert tried == [19, 9, 4]
    assert info.n_gpu_layers == 4
    assert chat.load_params.n_gpu_layers == 4
    assert chat.offload_note is not None and "retrying with 4" in chat.offload_note


def test_cpu_load_failure_is_not_retried(starter_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.inference.session as session_module
    from engine.errors import ModelLoadError

    class Refusing:
        def __init__(self, params: LoadParams) -> None:
            self.params = params

        def start(self, cancel: object = None) -> None:
            raise ModelLoadError(f"{self.params.model_path}: llama.cpp could not load it")

    monkeypatch.setattr(session_module, "InferenceWorker", Refusing)
    with pytest.raises(ModelLoadError, match="could not load"):
        ChatSession(LoadParams(model_path=starter_model)).load()
