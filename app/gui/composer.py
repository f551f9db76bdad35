"""The composer: where the user types. Enter sends, Shift+Enter adds a line, Stop while generating.

It also carries the "editing a message" state: sending then creates a new branch instead of a new
turn, and the banner says so. A message the history could not save (a full disk) comes back into
the box with :meth:`Composer.restore`. Images (and clips) are attached by dropping them on it,
pasting them or the Attach button (:mod:`app.gui.attachments`); each shows its cost before the
send, and Send waits while one is still being read or when one does not fit.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QMimeData, Qt, Signal, Slot
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QKeyEvent
from PySide6.QtWidgets import (
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QPlainTextEdit,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.gui.attachments import AttachmentStrip, file_filter, media_from_mime
from app.gui.display_text import plain_label
from app.gui.window_layout import ElidedLabel, make_wrapping
from engine.media import AUDIO_SUFFIXES, IMAGE_SUFFIXES


class ComposerEdit(QPlainTextEdit):
    """A text box where Enter submits and Shift+Enter inserts a newline.

    Signals:
        submitted(): Enter was pressed.
    """

    submitted = Signal()
    media_pasted = Signal(list)

    def canInsertFromMimeData(self, source: QMimeData) -> bool:
        return source.hasImage() or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:
        """A pasted picture (or image files copied in a file manager) is attached, not typed."""
        found = media_from_mime(source) if source.hasImage() or _has_media_files(source) else []
        if found:
            self.media_pasted.emit(found)
            return
        super().insertFromMimeData(source)

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
        send_requested(str, object): the text and the id of the message being edited (or None);
            the attachments are :attr:`attachments` ``.media`` (cleared by :meth:`sent`).
        stop_requested(): the user pressed Stop.
        attachments_changed(): an attachment was added or removed (its cost is to be measured).
        attachment_failed(str): one was refused (the file and the reason, one line).
    """

    send_requested = Signal(str, object)
    stop_requested = Signal()
    attachments_changed = Signal()
    attachment_failed = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._busy = False
        self._ready = False
        self._editing: int | None = None
        self._blocked = ""  # why the attachments keep Send off ("" when they do not)
        self.setAcceptDrops(True)

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

        self.attachments = AttachmentStrip()
        self.attachments.changed.connect(self._on_attachments_changed)
        self.attachments.failed.connect(self.attachment_failed)
        layout.addWidget(self.attachments)

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
        self.edit.media_pasted.connect(self.attachments.add_sources)
        row.addWidget(self.edit, 1)
        self.attach_button = QToolButton()
        self.attach_button.setText("+")
        self.attach_button.setObjectName("attachButton")
        self.attach_button.setToolTip("Attach images (or drop them here, or paste one)")
        self.attach_button.setAccessibleName("Attach images")
        self.attach_button.clicked.connect(self.pick_files)
        row.addWidget(self.attach_button, 0, Qt.AlignmentFlag.AlignBottom)
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
        has_text = bool(self.edit.toPlainText().strip()) or bool(self.attachments.media)
        sendable = self._ready and not self._busy and has_text and not self._blocked
        self.send_button.setEnabled(sendable and not self.attachments.reading)
        self.send_button.setToolTip(self._blocked or "Send (Enter)")

    # ------------------------------------------------------------------ attachments
    def set_attachment_block(self, reason: str) -> None:
        """Why the attachments keep Send off ("this image does not fit", "this model cannot see
        images"), or "" to allow it; said on the state line."""
        self._blocked = reason
        if reason:
            self.state_label.setText(reason)
        self._update_buttons()

    @Slot()
    def pick_files(self) -> None:
        names, _ = QFileDialog.getOpenFileNames(self, "Attach images", "", file_filter())
        if names:
            self.attachments.add_sources([Path(name) for name in names])

    def sent(self) -> None:
        """The message went out: its attachments go with it."""
        self.attachments.clear()

    @Slot()
    def _on_attachments_changed(self) -> None:
        self._update_buttons()
        self.attachments_changed.emit()

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        mime = event.mimeData()
        if mime.hasImage() or _has_media_files(mime):
            event.acceptProposedAction()
            return
        super().dragEnterEvent(event)

    def dropEvent(self, event: QDropEvent) -> None:
        found = media_from_mime(event.mimeData())
        if found:
            event.acceptProposedAction()
            self.attachments.add_sources(found)
            return
        super().dropEvent(event)

    @Slot()
    def _on_edit_submitted(self) -> None:
        text = self.edit.toPlainText().strip()
        media = self.attachments.media
        if (not text and not media) or self._busy or not self._ready or self._blocked or self.attachments.reading:
            return
        editing = self._editing
        self.edit.clear()
        self._editing = None
        self.edit_banner.setVisible(False)
        self.cancel_edit_button.setVisible(False)
        self.send_requested.emit(text, editing)


_MEDIA_SUFFIXES = (*IMAGE_SUFFIXES, *AUDIO_SUFFIXES)


def _has_media_files(mime: QMimeData) -> bool:
    """Local files named like images or clips (the content is still what decides, when read)."""
    return mime.hasUrls() and any(
        url.isLocalFile() and url.toLocalFile().lower().endswith(_MEDIA_SUFFIXES) for url in mime.urls()
    )


def is_media_drop(mime: QMimeData) -> bool:
    """Whether a drop on the window is images or clips only: they go to the composer, other files
    to the chat's documents."""
    if mime.hasImage() and not mime.hasUrls():
        return True
    files = [url.toLocalFile().lower() for url in mime.urls() if url.isLocalFile()] if mime.hasUrls() else []
    return bool(files) and all(name.endswith(_MEDIA_SUFFIXES) for name in files)
