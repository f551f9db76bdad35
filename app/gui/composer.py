"""The composer: where the user types. Enter sends, Shift+Enter adds a line, Stop while generating.

It also carries the "editing a message" state: sending then creates a new branch instead of a new
turn, and the banner says so. A message the history could not save (a full disk) comes back into
the box with :meth:`Composer.restore`.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QFrame, QHBoxLayout, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

from app.gui.display_text import plain_label
from app.gui.window_layout import ElidedLabel, make_wrapping


class ComposerEdit(QPlainTextEdit):
    """A text box where Enter submits and Shift+Enter inserts a newline.

    Signals:
        submitted(): Enter was pressed.
    """

    submitted = Signal()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (
            event.modifiers() & Qt.KeyboardModifier.ShiftModifier
        ):
            self.submitted.emit()
            event.accept()
            return
        super().keyPressEvent(event)


class Composer(QWidget):
    """Text box, Send/Stop button, editing banner and a state line.

    Signals:
        send_requested(str, object): the text and the id of the message being edited (or None).
        stop_requested(): the user pressed Stop.
    """

    send_requested = Signal(str, object)
    stop_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._busy = False
        self._ready = False
        self._editing: int | None = None

        layout = QVBoxLayout(self)
        layout.setContentsMargins(16, 4, 16, 12)
        layout.setSpacing(4)

        banner_row = QHBoxLayout()
        self.edit_banner = plain_label("Editing a message: sending creates a new branch; the old one stays.")
        self.edit_banner.setObjectName("editBanner")
        make_wrapping(self.edit_banner)
        self.cancel_edit_button = QPushButton("Cancel edit")
        self.cancel_edit_button.clicked.connect(self.cancel_edit)
        banner_row.addWidget(self.edit_banner, 1)
        banner_row.addWidget(self.cancel_edit_button)
        layout.addLayout(banner_row)
        self.edit_banner.setVisible(False)
        self.cancel_edit_button.setVisible(False)

        frame = QFrame()
        frame.setObjectName("composerFrame")
        row = QHBoxLayout(frame)
        row.setContentsMargins(10, 6, 6, 6)
        self.edit = ComposerEdit()
        self.edit.setObjectName("composerEdit")
        self.edit.setAccessibleName("Message")
        self.edit.setAccessibleDescription("Your message to the model. Enter sends, Shift+Enter adds a line")
        self.edit.setPlaceholderText("Message the model…  (Enter to send, Shift+Enter for a new line)")
        self.edit.setTabChangesFocus(True)
        self.edit.setFixedHeight(72)
        self.edit.submitted.connect(self._on_edit_submitted)
        self.edit.textChanged.connect(self._update_buttons)
        row.addWidget(self.edit, 1)
        self.send_button = QPushButton("Send")
        self.send_button.setObjectName("primary")
        self.send_button.setToolTip("Send (Enter)")
        self.send_button.setAccessibleDescription("Sends the message to the model")
        self.send_button.clicked.connect(self._on_edit_submitted)
        self.stop_button = QPushButton("■ Stop")
        self.stop_button.setObjectName("danger")
        self.stop_button.setToolTip("Stop generating (Esc)")
        self.stop_button.setAccessibleName("Stop")
        self.stop_button.setAccessibleDescription("Stops the reply; what was written so far is kept")
        self.stop_button.clicked.connect(self.stop_requested)
        self.stop_button.setVisible(False)
        row.addWidget(self.send_button, 0, Qt.AlignmentFlag.AlignBottom)
        row.addWidget(self.stop_button, 0, Qt.AlignmentFlag.AlignBottom)
        layout.addWidget(frame)

        # A long reason (a failed load) elides, with the whole text as its tooltip: it never
        # widens the window.
        self.state_label = ElidedLabel("")
        self.state_label.setObjectName("stateLabel")
        self.state_label.setAccessibleName("Chat state")
        layout.addWidget(self.state_label)
        self._update_buttons()

    # ------------------------------------------------------------------ state
    def set_ready(self, ready: bool, reason: str = "") -> None:
        """Whether a model is loaded; ``reason`` explains why not."""
        self._ready = ready
        if not ready and reason:
            self.state_label.setText(reason)
        self._update_buttons()

    def set_busy(self, busy: bool) -> None:
        """While generating, Send turns into Stop."""
        self._busy = busy
        self.send_button.setVisible(not busy)
        self.stop_button.setVisible(busy)
        self._update_buttons()

    def set_state_text(self, text: str) -> None:
        self.state_label.setText(text)

    def begin_edit(self, message_id: int, text: str) -> None:
        """Puts a past user message in the box; sending makes a new branch."""
        self._editing = message_id
        self.edit.setPlainText(text)
        self.edit.setFocus()
        cursor = self.edit.textCursor()
        cursor.movePosition(cursor.MoveOperation.End)
        self.edit.setTextCursor(cursor)
        self.edit_banner.setVisible(True)
        self.cancel_edit_button.setVisible(True)

    def restore(self, text: str, editing: int | None = None) -> None:
        """Puts back a message that could not be sent or saved, so what the user typed is never lost.

        Text typed since goes after it; the edit it belonged to comes back unless another one began.
        """
        typed = self.edit.toPlainText()
        if typed.strip() and typed.strip() != text.strip():
            text = f"{text}\n\n{typed}"
        self.edit.setPlainText(text)
        cursor = self.edit.textCursor()
        cursor.movePosition(cursor.MoveOperation.End)
        self.edit.setTextCursor(cursor)
        if editing is not None and self._editing is None:
            self._editing = editing
            self.edit_banner.setVisible(True)
            self.cancel_edit_button.setVisible(True)
        self.edit.setFocus()

    @Slot()
    def cancel_edit(self) -> None:
        if self._editing is not None:
            self._editing = None
            self.edit.clear()
        self.edit_banner.setVisible(False)
        self.cancel_edit_button.setVisible(False)

    @property
    def editing(self) -> int | None:
        return self._editing

    def _update_buttons(self) -> None:
        has_text = bool(self.edit.toPlainText().strip())
        self.send_button.setEnabled(self._ready and not self._busy and has_text)

    @Slot()
    def _on_edit_submitted(self) -> None:
        text = self.edit.toPlainText().strip()
        if not text or self._busy or not self._ready:
            return
        editing = self._editing
        self.edit.clear()
        self._editing = None
        self.edit_banner.setVisible(False)
        self.cancel_edit_button.setVisible(False)
        self.send_requested.emit(text, editing)
