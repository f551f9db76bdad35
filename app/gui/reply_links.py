"""Links a reply opens: the question asked before a link from the model's text is opened (its
whole address, since a model's link text can say anything), and a cited source opened in the
system viewer."""

from __future__ import annotations

from collections.abc import Mapping

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QMessageBox, QWidget

__all__ = ["confirm_link", "link_dialog", "open_source"]


def link_dialog(parent: QWidget | None, url: QUrl) -> QMessageBox:
    """The question asked before a link in a reply is opened: the whole address, since a model's
    link text can say anything (``[your bank](https://elsewhere.example)``). Open, Copy link or
    Cancel (the default: Enter or Escape open nothing)."""
    box = QMessageBox(parent)
    box.setObjectName("linkDialog")
    box.setIcon(QMessageBox.Icon.Question)
    box.setWindowTitle("Open link")
    host = url.host() or url.scheme()
    box.setText(f"Open this link from the reply in your browser?\n\n{host}")
    box.setInformativeText(url.toString())
    box.setTextFormat(Qt.TextFormat.PlainText)
    box.addButton("Open", QMessageBox.ButtonRole.AcceptRole).setObjectName("linkOpen")
    box.addButton("Copy link", QMessageBox.ButtonRole.ActionRole).setObjectName("linkCopy")
    cancel = box.addButton(QMessageBox.StandardButton.Cancel)
    box.setDefaultButton(cancel)
    box.setEscapeButton(cancel)
    return box


def confirm_link(parent: QWidget | None, url: QUrl) -> str:
    """Asks (:func:`link_dialog`) and returns ``"open"``, ``"copy"`` or ``"cancel"``."""
    box = link_dialog(parent, url)
    box.exec()
    clicked = box.clickedButton()
    name = clicked.objectName() if clicked is not None else ""
    return {"linkOpen": "open", "linkCopy": "copy"}.get(name, "cancel")


def open_source(source: Mapping[str, object]) -> bool:
    """Opens a cited file with the system viewer (a PDF at its page where the viewer takes #page=)."""
    path = source.get("path") or source.get("file")
    if not path:
        return False
    url = QUrl.fromLocalFile(str(path))
    page = source.get("page")
    if page and str(path).lower().endswith(".pdf"):
        url.setFragment(f"page={page}")
    return bool(QDesktopServices.openUrl(url))
