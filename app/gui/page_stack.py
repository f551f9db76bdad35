"""The window's pages (Chat, Models, Knowledge) and the rail's buttons that switch them.

A page other than the first is built the first time it is shown (start-up cost), and put in a
scroll area: a page that needs more room than the window has scrolls instead of widening the
window past the screen or being cut.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Slot
from PySide6.QtWidgets import QButtonGroup, QFrame, QScrollArea, QStackedWidget, QWidget


class PageStack(QStackedWidget):
    """Pages by index, the same as the rail's button ids.

    Args:
        nav_group: the rail's buttons (``app.gui.window_header.NavRailWidget.nav_group``).
    """

    def __init__(self, nav_group: QButtonGroup, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._nav_group = nav_group
        self._builders: dict[int, Callable[[], QWidget]] = {}
        nav_group.idClicked.connect(self._on_nav_group_id_clicked)

    def add_lazy(self, build: Callable[[], QWidget]) -> int:
        """Adds a page that ``build`` makes the first time it is shown; returns its index."""
        index = self.addWidget(QWidget())
        self._builders[index] = build
        return index

    def ensure(self, index: int) -> None:
        """Builds the page at ``index`` if it was not built yet."""
        build = self._builders.pop(index, None)
        if build is None:
            return
        current = self.currentIndex()
        old = self.widget(index)
        holder = QScrollArea()
        holder.setObjectName(f"pageScroll{index}")
        holder.setFrameShape(QFrame.Shape.NoFrame)
        holder.setWidgetResizable(True)
        holder.setWidget(build())
        self.insertWidget(index, holder)
        if old is not None:
            self.removeWidget(old)
            old.deleteLater()
        self.setCurrentIndex(current)

    def show_page(self, index: int) -> None:
        """Shows the page at ``index`` and checks its rail button."""
        self.ensure(index)
        self.setCurrentIndex(index)
        button = self._nav_group.button(index)
        if button is not None:
            button.setChecked(True)

    @Slot(int)
    def _on_nav_group_id_clicked(self, index: int) -> None:
        self.ensure(index)
        self.setCurrentIndex(index)
