"""The header's second row at 1366×768 with the inspector open (issue 28, minor): a long Tools
switch ("Tools: builtin · required") or a drop's status ("drop: 2 indexed, 0 unchanged; 2 c…")
elides; it no longer pushes the Inspector button, or the row, onto a line of its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gui_support import start_window
from PySide6.QtCore import QPoint
from PySide6.QtWidgets import QApplication, QWidget

from app.paths import Paths

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]

LONG_TOOLS = {"tools": {"on": True, "sources": ["builtin", "testtools", "notes-server"], "choice": "required"},
              "thinking": "on"}  # fmt: skip
DROP = "drop: 2 indexed, 0 unchanged; 2 chunks added to “Documents 2026-12-01” in 1.2 s"


def one_row(header: QWidget, widgets: list[QWidget]) -> bool:
    """All on one line of the header's row: their vertical extents (in the header) overlap."""
    spans = [(w.mapTo(header, QPoint(0, 0)).y(), w.mapTo(header, QPoint(0, w.height() - 1)).y()) for w in widgets]
    return max(top for top, _ in spans) <= min(bottom for _, bottom in spans)


def test_long_texts_elide_before_they_wrap_the_header(qtbot: Any, paths: Paths, fake_model: Path) -> None:
    w = start_window(qtbot, paths)
    try:
        w.resize(1366, 768)
        if not w.inspector_button.isChecked():
            w.inspector_button.setChecked(True)
        QApplication.processEvents()
        header = w.header
        row = [header.model_status, header.chat_settings_button, w.tools_button, w.inspector_button]
        assert one_row(header, row)
        height = header.height()
        w.tools_button.set_conversation_settings(LONG_TOOLS)
        w.documents.index_label.setText(DROP)
        QApplication.processEvents()
        assert w.inspector.isVisible()  # the inspector is open: the column is narrow
        assert one_row(header, [*row, w.documents_bar.button, header.index_label])
        assert header.height() == height  # nothing jumped
        # The whole texts are kept: the button's and the label's tooltips.
        assert w.tools_button.text().startswith("Tools: builtin, testtools, notes-server · required")
        assert w.tools_button.text() in w.tools_button.toolTip()
        if header.index_label.shown_text() != DROP:
            assert header.index_label.toolTip() == DROP
        # Every button of the row is whole and inside the header.
        for button in (header.chat_settings_button, w.inspector_button):
            assert button.width() >= button.sizeHint().width()
            assert button.geometry().right() <= header.width()
    finally:
        w.shutdown()
