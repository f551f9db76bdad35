"""Each chat remembers its model (issue 26): recorded with each reply and when the user picks a model
while the chat is open, kept in the history across a restart; a new chat starts with the loaded
model; opening a chat whose model is kept loaded switches to it without a load, one that is in the
library is offered in one line (Load it; nothing loads by itself), one no longer in the library is
said in one line and the loaded model goes on; a history of the previous version opens as it was.
The picker lists what is in memory first, marked."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from gui_support import make_window, send, start_window
from PySide6.QtCore import Qt

from app.compose import model_key
from app.gui.workers.llm_loading import default_session_factory
from app.gui.workers.llm_requests import LoadedModel
from app.gui.workers.model_routing import model_label
from app.paths import Paths
from app.settings import Settings
from engine.history import HistoryStore
from tests.engine.gguf_fixtures import build
from tests.engine.history_fixtures import previous_version_history

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]


def _model(paths: Paths, name: str) -> Path:
    model = paths.models / f"{name}.gguf"
    model.write_bytes(build().data)
    return model


def _pick(w: Any, model: Path) -> None:
    """Chooses ``model`` in the picker, as a click does."""
    picker = w.header.model_bar.picker
    index = picker.findData(model_key(model))
    assert index >= 0, model
    picker.setCurrentIndex(index)
    picker.activated.emit(index)


def _open(qtbot: Any, w: Any, conversation_id: int) -> None:
    """Opens a chat from the chat list."""
    w.sidebar.conversation_selected.emit(conversation_id)
    qtbot.waitUntil(lambda: w.chat.conversation is not None and w.chat.conversation.id == conversation_id)


def _new_chat(qtbot: Any, w: Any) -> int:
    before = w.chat.conversation
    w.conversations.new_chat()
    qtbot.waitUntil(lambda: w.chat.conversation is not None and w.chat.conversation is not before)
    return int(w.chat.conversation.id)


def test_each_chat_remembers_its_model_across_a_restart(qtbot: Any, paths: Paths, fake_model: Path) -> None:
    other = _model(paths, "other-model")
    w = start_window(qtbot, paths)
    try:
        assert w.chat.loaded.path == fake_model  # the first in the library
        send(qtbot, w, "first chat")
        first = w.chat.conversation.id
        assert w.chat.conversation.model == model_key(fake_model)  # recorded with the reply
        second = _new_chat(qtbot, w)
        assert w.chat.conversation.model == model_key(fake_model)  # a new chat starts with the loaded model
        _pick(w, other)
        qtbot.waitUntil(lambda: w.chat.loaded is not None and w.chat.loaded.path == other)
        assert w.chat.conversation.model == model_key(other)  # picked while the chat was open
        send(qtbot, w, "second chat")
        assert w.chat.conversation.model == model_key(other)
    finally:
        w.shutdown()
    with HistoryStore(paths.history_db) as store:
        assert store.get_conversation(first).model == model_key(fake_model)
        assert store.get_conversation(second).model == model_key(other)

    w = start_window(qtbot, paths)  # a restart
    try:
        qtbot.waitUntil(lambda: w.chat.conversation is not None and w.chat.conversation.id == second)
        assert w.chat.loaded.path == other
        offer = w.header.model_bar.chat_model
        assert not offer.isVisible()
        made = len(w.sessions)
        _open(qtbot, w, first)
        qtbot.waitUntil(offer.isVisible)
        assert offer.text.text() == "This chat used fake-model."
        assert offer.load_button.isVisible() and offer.load_button.text() == "Load it"
        assert len(w.sessions) == made and w.chat.loaded.path == other  # opening it loaded nothing
        offer.load_button.click()
        qtbot.waitUntil(lambda: w.chat.loaded is not None and w.chat.loaded.path == fake_model)
        assert not offer.isVisible() and len(w.sessions) == made + 1
        _open(qtbot, w, second)
        qtbot.waitUntil(offer.isVisible)
        assert offer.text.text() == "This chat used other-model."
    finally:
        w.shutdown()


def test_a_chat_whose_model_is_gone_says_so_and_the_loaded_one_goes_on(
    qtbot: Any, paths: Paths, fake_model: Path
) -> None:
    gone = paths.models / "removed-model.gguf"  # deleted from the library since
    with HistoryStore(paths.history_db) as store:
        chat = store.create_conversation("Old chat", model=model_key(gone))
    w = start_window(qtbot, paths)
    try:
        qtbot.waitUntil(lambda: w.chat.conversation is not None and w.chat.conversation.id == chat.id)
        offer = w.header.model_bar.chat_model
        qtbot.waitUntil(offer.isVisible)
        assert offer.text.text() == "This chat used removed-model, no longer in the library."
        assert "The loaded model, fake-model, answers here." in offer.toolTip()
        assert not offer.load_button.isVisible()
        assert w.chat.loaded.path == fake_model and len(w.sessions) == 1
        send(qtbot, w, "go on")
        assert w.chat.conversation.model == model_key(fake_model)
        assert not offer.isVisible()
        with HistoryStore(paths.history_db) as store:
            other = store.create_conversation("Another old chat", model=model_key(gone))
        w.chat.conversations.refresh()
        _open(qtbot, w, other.id)
        qtbot.waitUntil(offer.isVisible)
        w.conversations.delete_conversation(other.id)  # the open chat goes, and its line with it
        qtbot.waitUntil(lambda: w.chat.conversation is None and not offer.isVisible())
    finally:
        w.shutdown()


def test_a_history_of_the_previous_version_opens_and_its_chat_takes_the_loaded_model(
    qtbot: Any, paths: Paths, fake_model: Path
) -> None:
    previous_version_history(paths.history_db)
    w = start_window(qtbot, paths)
    try:
        qtbot.waitUntil(lambda: w.chat.conversation is not None)
        assert w.chat.conversation.title == "Old chat" and w.chat.conversation.model is None
        assert [m.content for m in w.chat.thread_messages] == ["an answer"]
        assert not w.header.model_bar.chat_model.isVisible()  # nothing to say about a model never named
        send(qtbot, w, "and now?")
        assert w.chat.conversation.model == model_key(fake_model)
    finally:
        w.shutdown()


def test_the_picker_lists_the_loaded_model_first_and_marks_it(qtbot: Any, paths: Paths, fake_model: Path) -> None:
    other = _model(paths, "another-model")  # first in the library's order
    w = start_window(qtbot, paths, model=fake_model)
    try:
        picker = w.header.model_bar.picker
        role = Qt.ItemDataRole.AccessibleTextRole
        qtbot.waitUntil(lambda: picker.count() == 3)
        assert [picker.itemData(i) for i in range(3)] == [model_key(fake_model), None, model_key(other)]
        assert picker.itemData(0, role) == "fake-model, loaded" and picker.itemData(2, role) == "another-model"
        assert picker.itemData(0, Qt.ItemDataRole.ToolTipRole).startswith("Loaded: the chat's model")
        assert not picker.itemIcon(0).isNull()
        _pick(w, other)
        qtbot.waitUntil(lambda: picker.itemData(0) == model_key(other))
        assert [picker.itemData(i) for i in range(3)] == [model_key(other), None, model_key(fake_model)]
        assert picker.currentData() == model_key(other) and picker.itemData(2, role) == "fake-model"
    finally:
        w.shutdown()


@pytest.mark.model
def test_opening_a_chat_whose_model_is_kept_loaded_switches_without_a_load(
    qtbot: Any, paths: Paths, starter_model: Path, tiny_model: Callable[[str], Path], tmp_path: Path
) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    for path in (starter_model, tiny_model("qwen3")):
        (folder / path.name).symlink_to(path)
    starter, tiny = folder / starter_model.name, folder / tiny_model("qwen3").name
    settings = Settings(
        theme="light", models_dir=folder, n_ctx=512, reply_reserve=64, models_kept_loaded=2, auto_load_model=False
    )
    built: list[Any] = []

    def factory(request: Any, bandwidth: float | None) -> Any:
        session = default_session_factory(request, bandwidth)
        built.append(session)
        return session

    w = make_window(paths, factory, settings, probe_bandwidth=False)
    qtbot.addWidget(w)
    w.show()
    w.start()
    try:
        bar = w.header.model_bar
        picker = bar.picker
        qtbot.waitUntil(lambda: picker.count() == 2, timeout=30_000)
        loads: list[LoadedModel] = []
        w.chat.model_loaded.connect(loads.append)
        w.model_control.load_model(starter)
        qtbot.waitUntil(lambda: len(loads) == 1, timeout=120_000)
        first = _new_chat(qtbot, w)
        assert w.chat.conversation.model == model_key(starter)
        _new_chat(qtbot, w)
        _pick(w, tiny)
        qtbot.waitUntil(lambda: len(loads) == 2, timeout=120_000)
        assert w.chat.conversation.model == model_key(tiny)
        # What is in memory first: the chat's model, then the one kept loaded, each marked.
        qtbot.waitUntil(lambda: picker.itemData(1) == model_key(starter), timeout=10_000)
        assert [picker.itemData(i) for i in range(picker.count())] == [model_key(tiny), model_key(starter)]
        role = Qt.ItemDataRole.AccessibleTextRole
        assert picker.itemData(0, role) == f"{model_label(tiny)}, loaded"
        assert picker.itemData(1, role) == f"{model_label(starter)}, kept loaded"
        assert len(built) == 2

        _open(qtbot, w, first)
        qtbot.waitUntil(lambda: len(loads) == 3, timeout=30_000)
        switched = loads[-1]
        assert switched.kept and switched.path == starter
        assert len(built) == 2  # no load: the kept session is the chat's again
        assert not bar.chat_model.isVisible()
        assert picker.currentData() == model_key(starter) and picker.itemData(0) == model_key(starter)
        assert picker.itemData(0, role) == f"{model_label(starter)}, loaded"
        assert w.statusBar().currentMessage().startswith(f"Switched to {model_label(starter)} in ")
        print(f"\nloaded the starter in {loads[0].load_ms:.0f} ms; switched back to it in {switched.load_ms:.1f} ms")
    finally:
        w.shutdown()
