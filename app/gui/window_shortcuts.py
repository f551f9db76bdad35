"""The window's shortcuts win in its text fields.

A line edit or a plain text edit takes some Ctrl keys for editing (on X11 Ctrl+E moves to the end
of the line, Ctrl+K deletes to it), so Ctrl+E did not export the chat while the search box had the
focus. :func:`let_shortcuts_through` makes such a field leave the window's own shortcuts to the window.
"""

from __future__ import annotations

from collections.abc import Iterable

from PySide6.QtCore import QEvent, QObject
from PySide6.QtGui import QAction, QKeyEvent, QKeySequence
from PySide6.QtWidgets import QWidget

__all__ = ["let_shortcuts_through"]


class _ShortcutsFirst(QObject):
    """Refuses a field's claim (ShortcutOverride) on a key one of the window's actions uses."""

    def __init__(self, actions: Iterable[QAction], parent: QObject) -> None:
        super().__init__(parent)
        # One chord with Ctrl ("Ctrl+E", "Ctrl+Shift+R"): plain keys (Esc) stay the field's.
        self._keys = {
            text
            for action in actions
            for text in (sequence.toString() for sequence in action.shortcuts())
            if text.startswith("Ctrl+") and ", " not in text
        }

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ShortcutOverride and isinstance(event, QKeyEvent):
            pressed = QKeySequence(event.keyCombination()).toString()
            if pressed in self._keys:
                event.ignore()  # not the field's: the window's shortcut runs
                return True
        return super().eventFilter(watched, event)


def let_shortcuts_through(fields: Iterable[QWidget], actions: Iterable[QAction]) -> None:
    """Makes each of ``fields`` leave the Ctrl shortcuts of ``actions`` to them."""
    fields = list(fields)
    if not fields:
        return
    guard = _ShortcutsFirst(actions, fields[0])
    for field in fields:
        field.installEventFilter(guard)
