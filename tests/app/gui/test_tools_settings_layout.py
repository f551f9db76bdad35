"""Settings → Tools at its default size (issue 28, major 4): the list of servers and their state
is the dialog's main area; after Add server the new server, its status or its crash line, is in
view without scrolling or maximizing."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from PySide6.QtWidgets import QApplication

from app.gui.tools_settings import COL_NAME, ROLE_KEY, ToolsSettingsDialog
from app.paths import Paths

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]


def dead_url() -> str:
    """An MCP URL nobody listens on: the server's check fails at once, with a reason."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/mcp"


def in_view(dialog: ToolsSettingsDialog, source: str) -> bool:
    item = dialog.item_for(source)
    assert item is not None
    rect = dialog.tree.visualItemRect(item)
    return dialog.tree.viewport().rect().contains(rect)


def test_the_server_list_is_the_main_area_and_a_new_server_is_in_view(qtbot: Any, paths: Paths) -> None:
    dialog = ToolsSettingsDialog(paths, check_on_open=False)
    qtbot.addWidget(dialog)
    dialog.resize(620, 520)
    dialog.show()
    QApplication.processEvents()
    assert dialog.width() == 620 and dialog.height() == 520
    # The list takes most of the dialog, not one row of it.
    assert dialog.tree.viewport().height() >= 0.4 * dialog.height(), dialog.tree.viewport().height()
    for number in range(4):
        name = f"server{number}"
        dialog.name_edit.setText(name)
        dialog.target_edit.setText(dead_url())
        dialog.add_button.click()
        assert dialog.tree.currentItem() is dialog.item_for(name)  # the new server is selected
        qtbot.waitUntil(lambda n=name: n in dialog.status_of, timeout=20000)  # its check ended
        QApplication.processEvents()
        status = dialog.status_of[name]
        assert "did not start" in status
        assert in_view(dialog, name)
        # Its whole status is under the list, wrapped, whatever the width of the Status column.
        details = dialog.details
        assert details.isVisible() and status in details.text().replace("\u200b", "")
        assert details.height() >= details.heightForWidth(details.width())
    assert all(in_view(dialog, f"server{n}") for n in range(4))  # four servers and the built-ins fit
    assert dialog.tree.currentItem() is dialog.item_for("server3")
    assert dialog.tree.currentItem().data(COL_NAME, ROLE_KEY) == ("server3", "*")


def test_the_allow_list_and_the_limits_are_one_tab_away(qtbot: Any, paths: Paths) -> None:
    dialog = ToolsSettingsDialog(paths, check_on_open=False)
    qtbot.addWidget(dialog)
    dialog.resize(620, 520)
    dialog.show()
    assert not dialog.allow_list.isVisible() and not dialog.paste.isVisible()
    dialog.tabs.setCurrentIndex(1)
    assert dialog.allow_list.isVisible() and dialog.steps_spin.isVisible() and dialog.timeout_spin.isVisible()
    dialog.tabs.setCurrentIndex(0)
    dialog.paste_toggle.click()  # the paste box opens on demand
    assert dialog.paste.isVisible() and dialog.import_button.isVisible()
    assert dialog.tree.viewport().height() >= 100
