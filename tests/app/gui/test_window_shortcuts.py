"""The window's shortcuts work from its text fields (issue 28, minor: Ctrl+E did nothing while the
search box had the focus: X11's editing keys give Ctrl+E to the line edit)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gui_support import send, start_window
from PySide6.QtCore import QEvent, QKeyCombination, Qt
from PySide6.QtGui import QAction, QKeyEvent, QKeySequence
from PySide6.QtWidgets import QLineEdit, QMainWindow

from app.paths import Paths

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]


class X11LineEdit(QLineEdit):
    """A line edit that claims Ctrl+E as X11's key bindings make Qt's do (the end of the line); the
    offscreen platform of the tests has no such binding."""

    def event(self, event: QEvent) -> bool:
        ctrl_e = QKeyCombination(Qt.KeyboardModifier.ControlModifier, Qt.Key.Key_E)
        if (
            isinstance(event, QKeyEvent)
            and event.type() == QEvent.Type.ShortcutOverride
            and (event.keyCombination() == ctrl_e)
        ):
            event.accept()
            return True
        return super().event(event)


def test_a_field_that_claims_a_window_shortcut_leaves_it_to_the_window(qtbot: Any) -> None:
    from app.gui.window_shortcuts import let_shortcuts_through

    window = QMainWindow()
    qtbot.addWidget(window)
    field = X11LineEdit()
    window.setCentralWidget(field)
    fired: list[bool] = []
    action = QAction("Export chat", window)
    action.setShortcut(QKeySequence("Ctrl+E"))
    action.triggered.connect(lambda: fired.append(True))
    window.addAction(action)
    window.show()
    field.setFocus()
    qtbot.waitUntil(field.hasFocus, timeout=2000)
    qtbot.keyClick(field, Qt.Key.Key_E, Qt.KeyboardModifier.ControlModifier)
    assert fired == []  # as in the trial: the field took Ctrl+E
    let_shortcuts_through([field], [action])
    qtbot.keyClick(field, Qt.Key.Key_E, Qt.KeyboardModifier.ControlModifier)
    assert fired == [True]
    qtbot.keyClicks(field, "abc")  # its other keys are its own
    assert field.text() == "abc"


def test_ctrl_e_exports_from_the_search_box_and_the_composer(
    qtbot: Any, paths: Paths, fake_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PySide6.QtWidgets import QFileDialog

    asked: list[str] = []

    def save_name(*args: Any, **_kwargs: Any) -> tuple[str, str]:
        asked.append(args[1])
        return "", ""

    monkeypatch.setattr(QFileDialog, "getSaveFileName", save_name)
    w = start_window(qtbot, paths)
    try:
        send(qtbot, w, "hello")
        for field in (w.sidebar.search, w.composer.edit):
            field.setFocus()
            qtbot.waitUntil(field.hasFocus, timeout=2000)
            qtbot.keyClick(field, Qt.Key.Key_E, Qt.KeyboardModifier.ControlModifier)
            assert asked and asked[-1] == "Export chat", type(field).__name__
            asked.clear()
    finally:
        w.shutdown()


def test_ctrl_e_with_no_chat_open_says_how(qtbot: Any, paths: Paths, fake_model: Path) -> None:
    w = start_window(qtbot, paths)
    try:
        messages: list[str] = []
        w.statusBar().messageChanged.connect(messages.append)
        w.conversations.export_conversation(None, "md")
        assert any("Open a chat to export it" in m for m in messages)
    finally:
        w.shutdown()
