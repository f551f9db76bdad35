"""The mouse wheel over Settings scrolls the form; spin boxes and combo boxes take the wheel only
when focused (issue 28, minor: the API port went 8080 → 8067 while the user scrolled)."""

from __future__ import annotations

from typing import Any

import pytest
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import QAbstractSpinBox, QApplication, QComboBox, QWidget

from app.gui.settings_dialog import SettingsDialog
from app.settings import Settings

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]


def wheel(widget: QWidget, notches: int = -3) -> bool:
    """Turns the wheel over the middle of ``widget`` (negative: scrolling down); returns whether
    the widget took the event (an event it ignores, Qt offers to its parents: the scroll area)."""
    at = QPointF(widget.rect().center())
    event = QWheelEvent(
        at, QPointF(widget.mapToGlobal(at.toPoint())), QPoint(0, 0), QPoint(0, 120 * notches),
        Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase, False,
    )  # fmt: skip
    QApplication.sendEvent(widget, event)
    return event.isAccepted()


def test_the_wheel_scrolls_the_settings_not_the_values_under_it(qtbot: Any) -> None:
    dialog = SettingsDialog(Settings(api_server_port=8080, theme="light"))
    qtbot.addWidget(dialog)
    dialog.resize(600, 300)  # short: the form scrolls
    dialog.show()
    port, theme = dialog.server_port, dialog.theme
    assert not port.hasFocus() and not theme.hasFocus()
    assert not wheel(port, notches=3)  # over the port, which has no focus: passed on to the form
    assert port.value() == 8080
    assert not wheel(theme, notches=-2)
    assert theme.currentData() == "light"
    # Every spin box and combo box of the dialog is guarded, and takes the focus from a click or Tab only.
    for box in [*dialog.findChildren(QAbstractSpinBox), *dialog.findChildren(QComboBox)]:
        assert box.focusPolicy() == Qt.FocusPolicy.StrongFocus, box.accessibleName()
        assert not wheel(box), box.accessibleName()
    # Focused (clicked into, or tabbed to), a spin box takes the wheel as usual.
    port.setFocus()
    qtbot.waitUntil(port.hasFocus, timeout=2000)
    assert wheel(port, notches=1)
    assert port.value() == 8081
