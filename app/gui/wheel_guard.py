"""The mouse wheel scrolls a form, never the value under the pointer: spin boxes and combo boxes
take the wheel only once they have the focus (clicked or tabbed to). Without it, scrolling the
Settings dialog changed whatever passed under the pointer (the API port went 8080 → 8067)."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtWidgets import QAbstractSpinBox, QComboBox, QWidget

__all__ = ["guard_wheel"]


class _WheelGuard(QObject):
    """Passes a wheel event over an unfocused spin box or combo box on to its parents."""

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if (
            event.type() == QEvent.Type.Wheel
            and isinstance(watched, (QAbstractSpinBox, QComboBox))
            and not watched.hasFocus()
        ):
            # Ignored and filtered: Qt offers the event to the parents, so the scroll area scrolls.
            event.ignore()
            return True
        return super().eventFilter(watched, event)


def guard_wheel(root: QWidget) -> None:
    """Makes every spin box and combo box under ``root`` take the wheel only when focused (and
    take the focus from a click or Tab, never from the wheel)."""
    guard = root.findChild(_WheelGuard) or _WheelGuard(root)
    widgets: list[QWidget] = [*root.findChildren(QAbstractSpinBox), *root.findChildren(QComboBox)]
    for widget in widgets:
        widget.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        widget.installEventFilter(guard)
