"""Discover's right pane follows the user's choice (issue 28, minor: after a search it listed the
files of a suggested repository the user never picked, the row the list made current by itself
when it got the focus)."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]


def dead_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_the_files_shown_are_of_the_row_the_user_picked(
    qtbot: Any, open_panel: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", dead_endpoint())
    adapter, panel = open_panel()
    d = panel.discover
    assert d.showing_suggestions() and panel.results.count() >= 3
    listed: list[str] = []
    monkeypatch.setattr(adapter.downloads, "list_files", listed.append)
    # A search that fails (offline), then back to the suggestions: the list gets the focus back with
    # no row current, and makes one current by itself. That is no choice of the user's.
    panel.search.setText("tiny")
    panel.search_button.click()
    qtbot.waitUntil(lambda: d.search_error.isVisible(), timeout=15000)
    d.back_to_suggestions.click()
    panel.results.setFocus(Qt.FocusReason.TabFocusReason)
    QApplication.processEvents()
    assert listed == []
    assert d.repo_label.text().startswith("Pick a suggested model")
    # The user's picks: a click on the third row, then the arrow key to the fourth.
    third = panel.results.item(2)
    rect = panel.results.visualItemRect(third)
    qtbot.mouseClick(panel.results.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert listed == [third.data(Qt.ItemDataRole.UserRole)]
    qtbot.keyClick(panel.results, Qt.Key.Key_Down)
    assert listed[-1] == panel.results.item(3).data(Qt.ItemDataRole.UserRole) and len(listed) == 2
