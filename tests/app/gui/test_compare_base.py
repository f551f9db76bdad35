"""Compare with base in the window (issue 26, "Made visible"): the inspector's button is enabled only
for a chat whose LoRA adapter is applied; it decodes the last reply's prompt greedily with the
adapter and without it on the LLM worker and shows, in the Tokens tab, the two replies with the
first diverging token marked and the line saying where the adapter changed the reply; Stop ends it;
the chat's history is not touched and its next reply goes on from its KV cache."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gui_support import make_window
from PySide6.QtCore import Qt

from app.gui.workers.chat_state import ChatState, ModelState
from app.paths import Paths
from app.settings import SamplingPreset, Settings
from tests.engine.lora_fixtures import write_gguf_lora

pytestmark = [pytest.mark.gui, pytest.mark.model, pytest.mark.qt_log_ignore("propagateSizeHints")]

QUESTION = "Write one sentence about the sea."


@pytest.fixture
def window(qtbot: Any, paths: Paths, starter_model: Path) -> Iterator[Any]:
    settings = Settings(
        theme="light",
        models_dir=starter_model.parent,
        n_ctx=1024,
        reply_reserve=128,
        presets=[SamplingPreset(name="Test", temperature=0.0, top_k=1, top_p=1.0, min_p=0.0, max_tokens=24)],
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


def _chat_with(qtbot: Any, w: Any, adapters: list[dict[str, object]]) -> str:
    """A new chat with these adapters in its settings; its reply to QUESTION."""
    before = w.chat.conversation
    w.chat.conversations.new(settings={"adapters": adapters})
    qtbot.waitUntil(lambda: w.chat.conversation is not None and w.chat.conversation is not before, timeout=10_000)
    w.composer.edit.setPlainText(QUESTION)
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: w.chat.busy, timeout=5000)
    qtbot.waitUntil(lambda: not w.chat.busy and w.chat.state is ChatState.IDLE, timeout=120_000)
    qtbot.waitUntil(
        lambda: bool(w.chat.thread_messages) and w.chat.thread_messages[-1].state != "pending", timeout=10_000
    )
    return str(w.chat.thread_messages[-1].content)


def _rows(paths: Paths) -> list[tuple[object, ...]]:
    with sqlite3.connect(paths.history_db) as db:
        return db.execute("SELECT id, conversation_id, role, content, state FROM messages ORDER BY id").fetchall()


def test_compare_with_base_marks_where_the_adapter_changed_the_reply(
    qtbot: Any, window: Any, paths: Paths, starter_model: Path, tmp_path: Path
) -> None:
    inspector = window.inspector
    adapter = write_gguf_lora(tmp_path / "starter-lora.gguf", starter_model, strength=1.0)
    base_reply = _chat_with(qtbot, window, [])
    assert not inspector.compare_button.isEnabled()  # no adapter: nothing to compare with
    assert "no LoRA adapter" in inspector.compare_button.toolTip()

    reply = _chat_with(qtbot, window, [{"path": str(adapter), "scale": 1.0}])
    assert reply != base_reply
    qtbot.waitUntil(inspector.compare_button.isEnabled, timeout=5000)
    rows = _rows(paths)
    messages = [(m.id, m.content) for m in window.chat.thread_messages]

    with qtbot.waitSignal(window.chat.comparison_finished, timeout=120_000) as finished:
        qtbot.mouseClick(inspector.compare_button, Qt.MouseButton.LeftButton)
        assert not inspector.compare_stop.isHidden() and not inspector.compare_button.isEnabled()
    comparison = finished.args[0].comparison
    assert comparison is not None
    # The window's reply was greedy with the adapter: the comparison's adapted reply is that reply,
    # and its base reply is the other chat's (the same question to the base model).
    assert "".join(t.text for t in comparison.adapted).strip() == reply.strip()
    assert "".join(t.text for t in comparison.base).strip() == base_reply.strip()
    d = comparison.divergence
    assert d is not None and comparison.adapted[d].token_id != comparison.base[d].token_id
    shared = len(comparison.adapted[:d])
    assert [t.token_id for t in comparison.adapted[:d]] == [t.token_id for t in comparison.base[:d]]

    # The Tokens tab shows it: the line, the two replies with the first diverging token marked.
    assert inspector.tabs.currentIndex() == 1
    assert inspector.tokens_stack.currentWidget() is inspector.compare_view
    line = inspector.shown["compare"]
    assert line.startswith(comparison.summary())
    assert (f"Same as base for {shared} token" if shared else "Different from the first token") in line
    assert f"the adapter chose {comparison.adapted[d].text!r}" in line and "base p=" in line
    marked = inspector.compare_view.tooltip_from_anchor(f"a:{d}")
    assert "the first token where the two replies differ" in marked and "base p=" in marked
    assert "the first token where the two replies differ" in inspector.compare_view.tooltip_from_anchor(f"b:{d}")
    assert inspector.compare_button.isEnabled() and inspector.compare_stop.isHidden()

    # Nothing written to the history, the transcript as it was.
    assert _rows(paths) == rows
    assert [(m.id, m.content) for m in window.chat.thread_messages] == messages

    # Stop: the comparison ends without a result and says so.
    with qtbot.waitSignal(window.chat.comparison_finished, timeout=120_000) as stopped:
        qtbot.mouseClick(inspector.compare_button, Qt.MouseButton.LeftButton)
        qtbot.mouseClick(inspector.compare_stop, Qt.MouseButton.LeftButton)
    assert stopped.args[0].comparison is None
    assert inspector.shown["compare"] == "Comparison stopped."
    assert _rows(paths) == rows

    # The chat goes on: its next reply reuses the prompt from the KV cache the comparison put back.
    window.composer.edit.setPlainText("And one about the sky.")
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: window.chat.busy, timeout=5000)
    qtbot.waitUntil(lambda: not window.chat.busy and window.chat.state is ChatState.IDLE, timeout=120_000)
    stats = window.chat.last_stats
    assert stats is not None and stats.cached_tokens > 0 and stats.recomputed_tokens == 0
    # the new prompt's tokens are shown again
    qtbot.waitUntil(lambda: inspector.tokens_stack.currentWidget() is inspector.tokens_view, timeout=10_000)

    # Compared again, then another chat opened: its Tokens tab no longer shows that reply's comparison.
    qtbot.waitUntil(inspector.compare_button.isEnabled, timeout=10_000)
    with qtbot.waitSignal(window.chat.comparison_finished, timeout=120_000) as again:
        qtbot.mouseClick(inspector.compare_button, Qt.MouseButton.LeftButton)
    assert again.args[0].comparison is not None
    assert inspector.tokens_stack.currentWidget() is inspector.compare_view
    opened = window.chat.conversation
    window.chat.conversations.new()
    qtbot.waitUntil(lambda: window.chat.conversation is not opened, timeout=10_000)
    assert inspector.tokens_stack.currentWidget() is inspector.tokens_view
    assert inspector.compare_back.isHidden() and not inspector.compare_button.isEnabled()
