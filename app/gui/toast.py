"""A transient message at the bottom of the window, with an optional action ("Chat deleted · Undo")."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt, QTimer, Slot
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QWidget

from app.gui.display_text import shown_lines
from app.gui.window_layout import wrap_anywhere


class Toast(QFrame):
    """A transient message with an optional action (e.g. "Chat deleted · Undo")."""

    def __init__(self, parent: QWidget) -> None:
        super().__init__(parent)
        self.setObjectName("toast")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(12, 6, 6, 6)
        self.label = QLabel()
        self.label.setObjectName("toastLabel")
        self.label.setTextFormat(Qt.TextFormat.PlainText)
        self.label.setWordWrap(True)
        self.label.setAccessibleName("Notice")
        self.action = QPushButton()
        layout.addWidget(self.label)
        layout.addWidget(self.action)
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(self.hide)
        self._callback: Callable[[], object] | None = None
        self.action.clicked.connect(self._on_action_clicked)
        self.hide()

    def show_message(
        self, text: str, action: str | None = None, callback: Callable[[], object] | None = None, ms: int = 8000
    ) -> None:
        """Shows ``text`` (wrapped to the window's width) and an optional action for ``ms``."""
        parent = self.parentWidget()
        if parent is not None:
            self.setMaximumWidth(max(parent.width() - 48, 200))
        self.label.setText(wrap_anywhere(shown_lines(text)))  # a name's ESC or U+202E shown escaped
        self.setAccessibleDescription(text)
        self._callback = callback
        self.action.setVisible(action is not None)
        self.action.setText(action or "")
        self.adjustSize()
        self.reposition()
        self.show()
        self.raise_()
        self._timer.start(ms)

    def reposition(self) -> None:
        parent = self.parentWidget()
        if parent is not None:
            self.move((parent.width() - self.width()) // 2, parent.height() - self.height() - 90)

    @Slot()
    def _on_action_clicked(self) -> None:
        callback, self._callback = self._callback, None
        self.hide()
        if callback is not None:
            callback()
