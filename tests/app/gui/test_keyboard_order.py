"""Keyboard order (issue 28, minor): Tab reaches the header before the transcript's buttons (it came
after some 22 of them, Documents last), and after an approval card is answered with the mouse the
focus is back in the composer (it went to the rail)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from gui_support import send, start_window
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QWidget

from app.gui.workers.agent_turn import ApprovalGate, ApprovalRequest
from app.paths import Paths

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]


def tab_stops(start: QWidget) -> list[QWidget]:
    """The widgets Tab visits from ``start``, once round."""
    stops: list[QWidget] = []
    widget = start.nextInFocusChain()
    tab = Qt.FocusPolicy.TabFocus
    while widget is not start and len(stops) < 2000:
        if widget.focusPolicy() & tab == tab and widget.isVisible() and widget.isEnabled():
            stops.append(widget)
        widget = widget.nextInFocusChain()
    return stops


def test_tab_reaches_the_header_before_the_transcripts_buttons(qtbot: Any, paths: Paths, fake_model: Path) -> None:
    w = start_window(qtbot, paths)
    try:
        for text in ("one", "two", "three"):
            send(qtbot, w, text)
        QApplication.processEvents()
        stops = tab_stops(w.sidebar.search)
        bar = w.header.model_bar
        header = [bar.picker, bar.load_button, bar.add_endpoint_button, w.documents_bar.button,
                  w.header.chat_settings_button, w.tools_button, w.inspector_button]  # fmt: skip
        at = [stops.index(widget) for widget in header]
        assert at == sorted(at) and at == list(range(at[0], at[0] + len(header)))  # in a row, Documents in its place
        card_buttons = [s for s in stops if any(s in card.findChildren(QWidget) for card in w.chat_view.cards)]
        assert len(card_buttons) >= 6
        assert max(at) < stops.index(card_buttons[0])  # the header first
        # The cards' buttons in reading order, then the composer.
        order = [stops.index(b) for b in card_buttons]
        assert order == list(range(order[0], order[0] + len(order)))
        assert stops[order[-1] + 1] is w.composer.edit
        tops = [b.mapTo(w.chat_view.widget(), b.rect().topLeft()).y() for b in card_buttons]
        assert tops == sorted(tops)
    finally:
        w.shutdown()


def test_an_approval_answered_with_the_mouse_gives_the_focus_back_to_the_composer(
    qtbot: Any, paths: Paths, fake_model: Path
) -> None:
    w = start_window(qtbot, paths)
    try:
        send(qtbot, w, "add two numbers")
        reply = w.chat.thread_messages[-1]
        w.chat_view.begin_stream(reply.id)  # a reply that waits for a call's approval
        request = ApprovalRequest(1, "call_1", "add", {"a": 2}, "builtin", "Adds", ApprovalGate(threading.Event()))
        w.chat.approval_requested.emit(request)
        card = w.chat_view.cards[-1].agent_parts.approvals[0]
        QApplication.processEvents()
        qtbot.mouseClick(card.once_button, Qt.MouseButton.LeftButton)
        assert request.gate.answered
        qtbot.waitUntil(w.composer.edit.hasFocus, timeout=2000)
        w.chat_view.end_stream()
    finally:
        w.shutdown()
