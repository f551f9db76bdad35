"""The main window on the real starter model: a streamed reply saved, Stop, the inspector showing
the engine's numbers, and the event loop never stalling while the model generates."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from gui_support import make_window
from PySide6.QtCore import Qt, QTimer

from app.gui.workers.chat_state import ChatState, ModelState
from app.paths import Paths
from app.settings import SamplingPreset, Settings
from engine.history import HistoryStore

pytestmark = [pytest.mark.gui, pytest.mark.model, pytest.mark.qt_log_ignore("propagateSizeHints")]


@pytest.fixture
def window(qtbot: Any, paths: Paths, starter_model: Path) -> Any:
    settings = Settings(
        theme="light",
        models_dir=starter_model.parent,
        n_ctx=1024,
        reply_reserve=128,
        presets=[SamplingPreset(name="Test", temperature=0.0, top_k=1, top_p=1.0, min_p=0.0, max_tokens=40)],
        default_preset="Test",
    )
    w = make_window(paths, None, settings, probe_bandwidth=False)
    qtbot.addWidget(w)
    w.show()
    w.start()
    qtbot.waitUntil(lambda: w.chat.model_state in (ModelState.LOADED, ModelState.FAILED), timeout=120_000)
    assert w.chat.model_state is ModelState.LOADED, w.composer.state_label.text()
    yield w
    w.shutdown()


def send_and_wait(qtbot: Any, w: Any, text: str) -> None:
    w.composer.edit.setPlainText(text)
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: w.chat.busy, timeout=5000)
    qtbot.waitUntil(lambda: not w.chat.busy and w.chat.state is ChatState.IDLE, timeout=120_000)
    qtbot.waitUntil(
        lambda: bool(w.chat.thread_messages) and w.chat.thread_messages[-1].state != "pending", timeout=10_000
    )


def test_reply_streams_is_saved_and_inspector_matches_stats(qtbot: Any, window: Any, paths: Paths) -> None:
    deltas: list[str] = []
    window.chat.reply_delta.connect(lambda text, _n: deltas.append(text))
    send_and_wait(qtbot, window, "The capital of France is")
    assert len(deltas) >= 2  # it streamed, in several updates
    reply = window.chat.thread_messages[-1]
    assert reply.state == "complete"
    assert reply.content.strip()
    assert window.chat_view.cards[-1].text == reply.content
    with HistoryStore(paths.history_db) as store:
        saved = store.thread(window.chat.conversation.id)
    assert [m.role for m in saved] == ["user", "assistant"]
    assert saved[1].content == reply.content
    stats = window.chat.last_stats
    assert saved[1].stats["completion_tokens"] == stats.completion_tokens
    shown = window.inspector.shown
    assert shown["decode_tps"] == f"{stats.decode_tps:.1f} tok/s"
    assert shown["prefill_tps"] == f"{stats.prefill_tps:.1f} tok/s"
    assert shown["ttft_ms"] == f"{stats.ttft_ms:.0f} ms"
    # The window holds the prompt and every token of the reply (the engine's context_used leaves
    # out the last token, which is fed back only with the next turn): the summary matches the legend.
    assert stats.context_used == stats.prompt_tokens + stats.completion_tokens - 1
    assert shown["context_used"] == f"{stats.prompt_tokens + stats.completion_tokens} of {stats.n_ctx} tokens used"
    assert sum(int(shown[f"budget.{k}"]) for k in stats.budget) == stats.n_ctx
    qtbot.waitUntil(lambda: len(window.inspector.tokens_view.token_ids) == stats.prompt_tokens, timeout=10_000)

    # A follow-up turn reuses the first turn's tokens from the KV cache.
    send_and_wait(qtbot, window, "And the capital of Italy is")
    assert window.chat.last_stats.cached_tokens > 0
    assert window.inspector.shown["cached_tokens"].startswith(f"{window.chat.last_stats.cached_tokens} /")


def test_stop_ends_the_reply_and_keeps_the_partial_reply(qtbot: Any, window: Any, paths: Paths) -> None:
    """Stop after the first words of a 400-token reply: the reply ends within 200 tokens (a few
    past the click here; without the cancel it runs to 400). Counted in tokens, not timed: CI
    machines are noisy; the 20 s wait is only a hang guard (stop lands in well under 1 s here)."""
    window.settings.presets[0] = window.settings.presets[0].model_copy(update={"max_tokens": 400})
    window.composer.edit.setPlainText("Once upon a time, in a land far away,")
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: len(window.chat_view.streamed_text) > 10, timeout=60_000)
    qtbot.mouseClick(window.composer.stop_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.chat.state is ChatState.IDLE, timeout=20_000)
    qtbot.waitUntil(lambda: window.chat.thread_messages[-1].state == "partial", timeout=20_000)
    with HistoryStore(paths.history_db) as store:
        saved = store.thread(window.chat.conversation.id)[-1]
    assert saved.state == "partial"
    assert saved.content
    assert saved.stats["finish_reason"] == "cancelled"
    assert saved.stats["completion_tokens"] <= 200, f"{saved.stats['completion_tokens']} tokens after a Stop"


def test_generation_runs_off_the_gui_thread(qtbot: Any, window: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every engine call and event of a 160-token reply happens off the GUI thread (checked
    deterministically), and a 10 ms heartbeat on the GUI thread keeps beating while the model
    generates. The heartbeat's bound is a hang guard, not the 50 ms budget (a speed target, for a
    benchmark on a quiet machine): a gap of at most 5 s, over 10x the worst seen here on a loaded
    machine (444 ms), where a GUI thread that ran the generation itself would stall for the whole
    reply (~20 s here). All numbers are printed."""
    from engine.inference.session import ChatSession

    on_gui_thread: list[str] = []  # what the engine did on the GUI thread (nothing, or a bug)
    events_seen = [0]
    real_stream = ChatSession.stream

    def watched_stream(self: ChatSession, *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is threading.main_thread():
            on_gui_thread.append("stream() called")
        inner = real_stream(self, *args, **kwargs)
        try:
            for event in inner:
                events_seen[0] += 1
                if threading.current_thread() is threading.main_thread():
                    on_gui_thread.append(type(event).__name__)
                yield event
        finally:
            inner.close()

    monkeypatch.setattr(ChatSession, "stream", watched_stream)
    window.settings.presets[0] = window.settings.presets[0].model_copy(update={"max_tokens": 160})
    gaps: list[float] = []
    last = [time.perf_counter()]

    def beat() -> None:
        now = time.perf_counter()
        gaps.append(now - last[0])
        last[0] = now

    timer = QTimer()
    timer.setInterval(10)
    timer.timeout.connect(beat)
    window.composer.edit.setPlainText("Write a long story about a lighthouse keeper and the sea.")
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)
    last[0] = time.perf_counter()
    timer.start()
    qtbot.waitUntil(lambda: window.chat.busy, timeout=5000)
    qtbot.waitUntil(lambda: not window.chat.busy, timeout=120_000)
    timer.stop()
    tokens = window.chat.last_stats.completion_tokens if window.chat.last_stats else 0
    ordered = sorted(gaps)
    worst_ms = ordered[-1] * 1000
    p99_ms = ordered[int(len(ordered) * 0.99)] * 1000
    print(
        f"\nevent-loop gaps during generation: worst {worst_ms:.1f} ms, p99 {p99_ms:.1f} ms over "
        f"{len(gaps)} beats, {tokens} tokens, {events_seen[0]} engine events"
    )
    assert tokens > 20
    assert events_seen[0] > tokens  # the reply went through the watched stream
    assert on_gui_thread == []
    assert len(gaps) > 10  # the heartbeat kept beating
    assert worst_ms <= 5000.0, f"the event loop stalled for {worst_ms:.0f} ms"
