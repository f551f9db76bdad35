"""A chat's LoRA adapter in the window (issue 26): set in the chat's settings, applied to the loaded
starter before the chat's next reply without reloading it (the same worker process), the reply
changed at scale 1 and the base model's at scale 0, the inspector naming the adapter and the
prompt tokens read again; an adapter made for another model is one line naming both files."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from gui_support import make_window
from PySide6.QtCore import Qt

from app.gui.conversation_settings import ConversationSettingsDialog, conversation_adapters
from app.gui.workers.chat_state import ChatState, ModelState
from app.paths import Paths
from app.settings import SamplingPreset, Settings
from tests.engine.lora_fixtures import write_gguf_lora

pytestmark = [pytest.mark.gui, pytest.mark.model, pytest.mark.qt_log_ignore("propagateSizeHints")]

QUESTION = "Say something about rivers."


@pytest.fixture
def window(qtbot: Any, paths: Paths, starter_model: Path) -> Iterator[Any]:
    settings = Settings(
        theme="light",
        models_dir=starter_model.parent,
        n_ctx=1024,
        reply_reserve=128,
        presets=[SamplingPreset(name="Test", temperature=0.0, top_k=1, top_p=1.0, min_p=0.0, max_tokens=12)],
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


def _pid(w: Any) -> int:
    return int(w.chat.model.session().local.worker_pid)


def test_a_chats_adapter_changes_its_reply_without_a_reload(
    qtbot: Any, window: Any, starter_model: Path, tiny_model: Callable[[str], Path], tmp_path: Path
) -> None:
    adapter = write_gguf_lora(tmp_path / "starter-lora.gguf", starter_model, strength=1.0)
    pid = _pid(window)
    base = _chat_with(qtbot, window, [])
    assert base.strip()
    assert window.inspector.adapter_label.isHidden()
    adapted = _chat_with(qtbot, window, [{"path": str(adapter), "scale": 1.0}])
    assert adapted != base
    shown = window.inspector.shown["adapters"]
    assert shown.startswith("LoRA adapters: starter-lora.gguf") and not window.inspector.adapter_label.isHidden()
    assert "cached prompt tokens read again" in shown  # the other chat's shared prefix was cached
    assert _chat_with(qtbot, window, [{"path": str(adapter), "scale": 0.0}]) == base  # scale 0: the base model
    assert _pid(window) == pid  # switched in the worker, never reloaded

    other = write_gguf_lora(tmp_path / "tiny-lora.gguf", tiny_model("qwen3"))
    errors: list[str] = []
    window.chat.error_occurred.connect(errors.append)
    _chat_with(qtbot, window, [{"path": str(other), "scale": 1.0}])
    assert errors, "a mismatched adapter was not refused"
    assert "tiny-lora.gguf" in errors[-1] and starter_model.name in errors[-1] and "\n" not in errors[-1]
    assert window.chat.thread_messages[-1].state != "complete"
    assert _pid(window) == pid


def test_the_chat_settings_dialog_keeps_the_adapter_and_its_scale(qtbot: Any, tmp_path: Path) -> None:
    conv = SimpleNamespace(
        system_prompt=None, settings={"adapters": [{"path": str(tmp_path / "a.gguf"), "scale": 0.5}]}
    )
    dialog = ConversationSettingsDialog(Settings(theme="light"), conv)  # type: ignore[arg-type]
    qtbot.addWidget(dialog)
    assert dialog.adapter_path.text() == str(tmp_path / "a.gguf") and dialog.scale_text.text() == "0.50"
    dialog.adapter_scale.setValue(150)
    assert dialog.adapters() == [{"path": str(tmp_path / "a.gguf"), "scale": 1.5}]
    assert conversation_adapters({"adapters": dialog.adapters()}) == ((tmp_path / "a.gguf", 1.5),)
    dialog.adapter_path.setText("")
    assert dialog.adapters() == []
    # what a settings file may hold that is not an adapter list is left out, never raised
    assert conversation_adapters({"adapters": [{"path": 3}, "x", {"path": "b.gguf", "scale": True}]}) == ()
    assert conversation_adapters({"adapters": "a.gguf"}) == () and conversation_adapters(None) == ()
