"""The main window with a fake engine session: send, stream, stop, edit/branch, search, delete/undo."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from gui_support import FakeSession, make_window, send, start_window
from PySide6.QtCore import Qt

from app.gui.workers.chat_state import ChatState, ModelState
from app.paths import Paths
from engine.history import HistoryStore
from tests.fake_backend import StreamCall

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]


@pytest.fixture
def window(qtbot: Any, paths: Paths, fake_model: Path) -> Any:
    def factory(request: Any, bandwidth: float | None) -> FakeSession:
        return FakeSession(request, bandwidth, reply=window_reply["text"], delay_s=window_reply["delay"])

    window_reply = {"text": "Hello from the fake model. It streams a few words.", "delay": 0.0}
    w = start_window(qtbot, paths, factory)
    w.reply = window_reply
    yield w
    w.shutdown()


def stored_thread(paths: Paths) -> list[Any]:
    with HistoryStore(paths.history_db) as store:
        conv = store.list_conversations()[0]
        return store.thread(conv.id)


def test_send_streams_reply_and_saves_it(qtbot: Any, window: Any, paths: Paths) -> None:
    send(qtbot, window, "Hi there")
    cards = window.chat_view.cards
    assert [c.message.role for c in cards] == ["user", "assistant"]
    assert cards[1].text == "Hello from the fake model. It streams a few words."
    saved = stored_thread(paths)
    assert [(m.role, m.state) for m in saved] == [("user", "complete"), ("assistant", "complete")]
    assert saved[1].content == cards[1].text
    assert saved[1].stats is not None
    assert saved[1].stats["completion_tokens"] == 10
    # The session saw the default system prompt and the user text.
    call = window.sessions[-1].calls[-1]
    assert call.user == "Hi there"
    assert call.system == window.settings.default_system_prompt


def test_shift_enter_adds_a_line_instead_of_sending(qtbot: Any, window: Any) -> None:
    window.composer.edit.setPlainText("line one")
    window.composer.edit.moveCursor(window.composer.edit.textCursor().MoveOperation.End)
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    assert window.composer.edit.toPlainText() == "line one\n"
    assert not window.chat.busy


def test_second_turn_sends_history(qtbot: Any, window: Any) -> None:
    send(qtbot, window, "first")
    send(qtbot, window, "second")
    call = window.sessions[-1].calls[-1]
    assert [(m.role, m.content) for m in call.history] == [
        ("user", "first"),
        ("assistant", "Hello from the fake model. It streams a few words."),
    ]


def test_stop_saves_partial_reply(qtbot: Any, window: Any, paths: Paths) -> None:
    window.reply["text"] = " ".join(f"word{i}" for i in range(400))
    window.reply["delay"] = 0.01
    window.model_control.load_model(Path(window.model_control.models[0]))
    qtbot.waitUntil(lambda: window.chat.model_state is ModelState.LOADED, timeout=5000)
    window.composer.edit.setPlainText("go on forever")
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: window.chat_view.streamed_text.count("word") >= 5, timeout=5000)
    assert window.composer.stop_button.isVisible()
    qtbot.mouseClick(window.composer.stop_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.chat.state is ChatState.IDLE, timeout=5000)
    qtbot.waitUntil(lambda: window.chat.thread_messages[-1].state == "partial", timeout=5000)
    saved = stored_thread(paths)[-1]
    assert saved.state == "partial"
    assert 0 < saved.content.count("word") < 400
    assert "stopped" in window.chat_view.cards[-1].stats_label.text()


def test_edit_creates_branch_and_navigation_switches(qtbot: Any, window: Any) -> None:
    send(qtbot, window, "original question")
    user_id = window.chat.thread_messages[0].id
    window.chat_view.cards[0].edit_button.click()
    assert window.composer.editing == user_id
    assert window.composer.edit.toPlainText() == "original question"
    window.composer.edit.setPlainText("edited question")
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not window.chat.busy, timeout=5000)
    qtbot.waitUntil(lambda: window.chat.thread_messages[-1].state == "complete", timeout=5000)
    first = window.chat_view.cards[0]
    assert first.text == "edited question"
    assert first.branch_label.text() == "2/2"
    assert first.prev_button.isEnabled()
    first.prev_button.click()
    qtbot.waitUntil(lambda: window.chat_view.cards[0].text == "original question", timeout=5000)
    assert window.chat_view.cards[0].branch_label.text() == "1/2"
    assert len(window.chat_view.cards) == 2


def test_regenerate_keeps_old_reply_as_sibling(qtbot: Any, window: Any) -> None:
    send(qtbot, window, "tell me")
    reply_id = window.chat.thread_messages[-1].id
    window.reply["text"] = "A different answer."
    window.chat_view.cards[-1].regen_button.click()
    qtbot.waitUntil(lambda: window.chat.thread_messages[-1].id != reply_id, timeout=5000)
    qtbot.waitUntil(lambda: window.chat.thread_messages[-1].state == "complete", timeout=5000)
    last = window.chat.thread_messages[-1]
    assert last.sibling_count == 2
    assert reply_id in last.sibling_ids


def test_search_finds_words_across_chats(qtbot: Any, window: Any) -> None:
    send(qtbot, window, "the zebra question")
    window.conversations.new_chat()
    qtbot.waitUntil(lambda: window.chat.conversation is not None and not window.chat.thread_messages, timeout=5000)
    send(qtbot, window, "a giraffe question")
    window.sidebar.search.setText("zebra")
    qtbot.waitUntil(lambda: "RESULT" in window.sidebar.title.text(), timeout=5000)
    assert window.sidebar.list.count() == 1
    assert "zebra" in window.sidebar.list.item(0).text()
    window.sidebar.search.clear()
    qtbot.waitUntil(lambda: window.sidebar.title.text() == "CHATS", timeout=5000)
    assert window.sidebar.list.count() == 2


def test_delete_and_undo(qtbot: Any, window: Any) -> None:
    send(qtbot, window, "keep me")
    conv_id = window.chat.conversation.id
    qtbot.waitUntil(lambda: window.sidebar.list.count() == 1, timeout=5000)  # the list is filled off-thread
    window.conversations.delete_conversation(conv_id)
    qtbot.waitUntil(lambda: window.sidebar.list.count() == 0, timeout=5000)
    qtbot.waitUntil(window.toast.isVisible, timeout=5000)
    window.toast.action.click()
    qtbot.waitUntil(lambda: window.sidebar.list.count() == 1, timeout=5000)
    qtbot.waitUntil(lambda: len(window.chat_view.cards) == 2, timeout=5000)


def test_inspector_shows_the_engine_stats(qtbot: Any, window: Any) -> None:
    send(qtbot, window, "numbers please")
    stats = window.chat.last_stats
    shown = window.inspector.shown
    assert shown["decode_tps"] == f"{stats.decode_tps:.1f} tok/s"
    assert shown["prefill_tps"] == f"{stats.prefill_tps:.1f} tok/s"
    assert shown["ttft_ms"] == f"{stats.ttft_ms:.0f} ms"
    assert shown["cached_tokens"] == f"{stats.cached_tokens} / {stats.prompt_tokens}"
    assert shown["context_used"] == f"{stats.context_used} of {stats.n_ctx} tokens used"
    for key, value in stats.budget.items():
        assert shown[f"budget.{key}"] == str(value)
    assert shown["bandwidth_gbps"] == f"{stats.bandwidth_gbps:.1f} GB/s"
    assert shown["wall_ratio"] == f"{stats.bandwidth_gbps / stats.machine_bandwidth_gbps * 100:.0f}%"
    qtbot.waitUntil(lambda: window.inspector.tokens_view.token_ids == [1, 2, 3], timeout=5000)


def test_eviction_marker_shows_where_history_was_dropped(qtbot: Any, window: Any) -> None:
    from app.gui.workers.history_reads import DisplayMessage

    def msg(i: int, role: str, stats: dict[str, Any] | None = None) -> DisplayMessage:
        return DisplayMessage(i, i - 1 or None, role, f"m{i}", "complete", stats, None, None, None, (i,))

    messages = [
        msg(1, "user"),
        msg(2, "assistant"),
        msg(3, "user"),
        msg(4, "assistant", {"evicted_messages": 2}),
    ]
    window.turns.show_conversation(type("C", (), {"id": 1, "title": "t"})(), messages)
    marker = window.chat_view.marker
    assert marker is not None
    assert "2 earlier messages" in marker.text()
    layout = window.chat_view._layout
    assert layout.indexOf(marker) == layout.indexOf(window.chat_view.cards[2]) - 1


def test_export_writes_markdown_html_json(qtbot: Any, window: Any, tmp_path: Path, monkeypatch: Any) -> None:
    from PySide6.QtWidgets import QFileDialog

    send(qtbot, window, "export me")
    for fmt in ("md", "html", "json"):
        target = tmp_path / f"out.{fmt}"
        monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, t=target, **k: (str(t), ""))
        window.conversations.export_conversation(None, fmt)
        qtbot.waitUntil(target.exists, timeout=5000)
    assert "## You" in (tmp_path / "out.md").read_text()
    assert "<script" not in (tmp_path / "out.html").read_text()
    data = json.loads((tmp_path / "out.json").read_text())
    assert [m["role"] for m in data["messages"]] == ["user", "assistant"]


def test_close_while_generating_stops_the_reply_and_keeps_it(qtbot: Any, window: Any, paths: Paths) -> None:
    window.reply["text"] = " ".join(f"w{i}" for i in range(2000))
    window.reply["delay"] = 0.01
    window.model_control.load_model(Path(window.model_control.models[0]))
    qtbot.waitUntil(lambda: window.chat.model_state is ModelState.LOADED, timeout=5000)
    window.composer.edit.setPlainText("long")
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: window.chat_view.streamed_text.count("w") >= 3, timeout=5000)
    # The outcome, not a duration: True means the reply stopped within the shutdown's own deadline,
    # and the reply was cut far short of its 2,000 words (20 s of them; a few past the close here).
    assert window.shutdown() is True
    saved = stored_thread(paths)
    assert saved[0].content == "long"  # the user message was saved before generating
    assert saved[1].state == "partial"
    assert saved[1].content.startswith("w0 w1 w2")
    assert len(saved[1].content.split()) <= 500, f"{len(saved[1].content.split())} words: the reply went on"


def test_per_conversation_system_prompt_and_preset(qtbot: Any, window: Any, monkeypatch: Any) -> None:
    from app.gui.conversation_settings import ConversationSettingsDialog

    send(qtbot, window, "first")

    def accept(dialog: ConversationSettingsDialog) -> int:
        dialog.use_default.setChecked(False)
        dialog.prompt.setPlainText("Answer like a pirate.")
        dialog.preset.setCurrentIndex(dialog.preset.findData("Precise (greedy)"))
        return 1

    monkeypatch.setattr(ConversationSettingsDialog, "exec", accept)
    window.conversations.open_conversation_settings()
    qtbot.waitUntil(lambda: window.chat.conversation.system_prompt == "Answer like a pirate.", timeout=5000)
    send(qtbot, window, "second")
    call = window.sessions[-1].calls[-1]
    assert call.system == "Answer like a pirate."
    context = window.turns.turn_context()
    assert context.params.temperature == 0.0
    assert window.chat.conversation.settings["preset"] == "Precise (greedy)"


def test_keyboard_shortcuts_new_chat_and_stop(qtbot: Any, window: Any) -> None:
    send(qtbot, window, "hello")
    first = window.chat.conversation.id
    qtbot.keyClick(window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: window.chat.conversation.id != first, timeout=5000)
    assert window.chat_view.cards == []
    window.reply["text"] = " ".join(f"t{i}" for i in range(500))
    window.reply["delay"] = 0.01
    window.model_control.load_model(Path(window.model_control.models[0]))
    qtbot.waitUntil(lambda: window.chat.model_state is ModelState.LOADED, timeout=5000)
    window.composer.edit.setPlainText("go")
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: "t3 " in window.chat_view.streamed_text, timeout=5000)
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: window.chat.state is ChatState.IDLE, timeout=5000)
    qtbot.waitUntil(
        lambda: bool(window.chat.thread_messages) and window.chat.thread_messages[-1].state == "partial",
        timeout=5000,
    )
    assert "t499" not in window.chat.thread_messages[-1].content


def test_window_fits_a_1280_pixel_screen_with_the_inspector_open(qtbot: Any, window: Any) -> None:
    """A 1280x800 laptop screen shows the whole window: chats, conversation and inspector."""
    assert window.minimumSizeHint().width() <= 1280, window.minimumSizeHint()
    window.resize(1280, 740)
    qtbot.waitUntil(lambda: window.width() == 1280, timeout=2000)
    assert window.inspector_button.isChecked()
    assert window.inspector.isVisible() and window.inspector.width() >= 300
    assert window.sidebar.isVisible()


def test_download_queue_lives_in_the_data_folder(window: Any, paths: Paths) -> None:
    assert window.models_adapter.queue_file == paths.download_queue
    assert paths.download_queue.parent == paths.data


class CrashingSession(FakeSession):
    """Dies like a worker whose CPU code this machine cannot run: before the first token."""

    will_repeat = True

    def script(self, call: StreamCall) -> Any:
        from engine.cpu_backend import BackendInfo, describe_crash
        from engine.errors import EngineCrashed
        from engine.inference.events import PrefillProgress

        yield PrefillProgress(1, 2)
        backend = BackendInfo("variants", "haswell", "libggml-cpu-haswell.so", ("AVX2",))
        raise EngineCrashed(
            -4, "generation", describe_crash(-4, backend), backend=backend, cpu_fault=True, will_repeat=self.will_repeat
        )


@pytest.mark.parametrize("repeats", [True, False])
def test_a_crash_that_will_repeat_does_not_offer_send_again(
    qtbot: Any, paths: Paths, fake_model: Path, repeats: bool
) -> None:
    def factory(request: Any, bandwidth: float | None) -> FakeSession:
        session = CrashingSession(request, bandwidth)
        session.will_repeat = repeats
        return session

    w = make_window(paths, factory, probe_bandwidth=False)
    qtbot.addWidget(w)
    w.show()
    w.start()
    qtbot.waitUntil(lambda: w.chat.model_state is ModelState.LOADED, timeout=30000)
    errors: list[str] = []
    w.chat.error_occurred.connect(errors.append)
    send(qtbot, w, "Hello")
    assert len(errors) == 1
    said = "llama.cpp was built for CPU instructions this machine cannot run (AVX2, in libggml-cpu-haswell.so)"
    assert said in errors[0]
    assert ("Send again" in errors[0]) is not repeats
    # The conversation is intact: the user's message is saved, the failed reply is marked so.
    saved = stored_thread(paths)
    assert (saved[0].role, saved[0].content, saved[0].state) == ("user", "Hello", "complete")
    assert saved[1].state == "error"
    w.shutdown()


def test_inspector_names_the_cpu_code(qtbot: Any, paths: Paths, fake_model: Path) -> None:
    from dataclasses import replace

    from engine.cpu_backend import BackendInfo, CpuVariant

    backend = BackendInfo(
        "variants",
        "icelake",
        "libggml-cpu-icelake.so",
        ("AVX2", "AVX512", "AVX512_VNNI"),
        (CpuVariant("sapphirerapids", "libggml-cpu-sapphirerapids.so", 2400),),
        (("sapphirerapids", "AMX not yet proven on this machine (llama.cpp bug)"),),
    )

    class Session(FakeSession):
        def load(self, cancel: Any = None) -> Any:
            return replace(super().load(cancel), cpu_backend=backend)

    w = make_window(paths, lambda r, b: Session(r, b), probe_bandwidth=False)
    qtbot.addWidget(w)
    w.show()
    w.start()
    qtbot.waitUntil(lambda: w.chat.model_state is ModelState.LOADED, timeout=30000)
    qtbot.waitUntil(lambda: bool(w.inspector.cpu_label.text()), timeout=5000)
    text = w.inspector.cpu_label.text()
    assert text.startswith("CPU code: AVX-512 (icelake) — AVX2 AVX512 AVX512_VNNI")
    assert "Not used: sapphirerapids (AMX not yet proven on this machine (llama.cpp bug))" in text
    w.shutdown()
