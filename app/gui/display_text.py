"""Text someone else chose, shown as text: model files, repositories, tools, servers, documents.

Contract: ARCHITECTURE.md, 'app.gui.display_text'.
"""

from __future__ import annotations

import html

from PySide6.QtCore import Qt
from PySide6.QtGui import Qt as QtGuiText  # Qt's text functions (mightBeRichText) live in QtGui
from PySide6.QtWidgets import QLabel, QMessageBox, QWidget

from engine.display import printable

__all__ = ["confirm", "inform", "message_box", "plain_label", "plain_tooltip", "rich", "shown", "shown_lines"]


def shown(text: object) -> str:
    """``text`` with every character that does not print as itself escaped, as the command line
    prints it (``engine.display.printable``: control characters, bidi controls, zero-width and
    other format characters); letters of every script stay as they are."""
    return printable(str(text))


def rich(text: object) -> str:
    """A name inside rich text on purpose: :func:`shown`, then HTML-escaped."""
    return html.escape(shown(text))


class _PlainLabel(QLabel):
    """A label that shows its text as plain text, with :func:`shown_lines` applied on each change."""

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setText(text)

    def setText(self, text: str) -> None:
        super().setText(shown_lines(text))


def plain_label(text: str = "", parent: QWidget | None = None) -> QLabel:
    """A label whose text is always plain (Qt's guess would read a leading tag as markup) and shown
    as it is: a character that does not print as itself is escaped (:func:`shown_lines`)."""
    return _PlainLabel(text, parent)


def shown_lines(text: object) -> str:
    """:func:`shown` line by line: the line breaks of a text of several lines stay breaks."""
    return "\n".join(shown(line) for line in str(text).split("\n"))


def plain_tooltip(text: str) -> str:
    """``text`` as a tooltip that shows it as it is (:func:`shown_lines`): unchanged when Qt would
    read it as plain text, else escaped into the rich text that displays those characters."""
    text = shown_lines(text)
    if not text or not QtGuiText.mightBeRichText(text):
        return text
    return QtGuiText.convertFromPlainText(text, Qt.WhiteSpaceMode.WhiteSpacePre)  # lines kept, as a plain one


def message_box(
    parent: QWidget | None,
    icon: QMessageBox.Icon,
    title: str,
    text: str,
    buttons: QMessageBox.StandardButton = QMessageBox.StandardButton.Ok,
    default: QMessageBox.StandardButton = QMessageBox.StandardButton.NoButton,
) -> QMessageBox:
    """A message box whose title and text are plain (names in it are shown as they are)."""
    box = QMessageBox(icon, shown(title), text, buttons, parent)
    box.setTextFormat(Qt.TextFormat.PlainText)
    if default != QMessageBox.StandardButton.NoButton:
        box.setDefaultButton(default)
    return box


def confirm(parent: QWidget | None, title: str, text: str) -> bool:
    """Asks Yes/No (No is the default) with plain text; True for Yes."""
    yes, no = QMessageBox.StandardButton.Yes, QMessageBox.StandardButton.No
    box = message_box(parent, QMessageBox.Icon.Question, title, text, yes | no, no)
    box.exec()
    clicked = box.clickedButton()
    return clicked is not None and box.standardButton(clicked) == yes


def inform(parent: QWidget | None, title: str, text: str) -> None:
    """Says something in a message box with plain text."""
    message_box(parent, QMessageBox.Icon.Information, title, text).exec()
