"""The chat page: the chat list, the conversation column (the header with its model bar and
documents control, the error banner, the transcript, the composer) and the inspector, in a
:class:`app.gui.window_layout.ChatSplitter` that gives way on a narrow window.

It builds and lays out its widgets and decides which side panel shows (the inspector toggle, a
narrow window); the controllers that drive the widgets are built by the main window.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QByteArray, Signal, Slot
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from app.gui.chat_view import ChatView
from app.gui.composer import Composer
from app.gui.documents_bar import DocumentsBarWidget
from app.gui.inspector import InspectorPanel
from app.gui.sidebar import Sidebar
from app.gui.window_header import ChatHeaderWidget
from app.gui.window_layout import ChatSplitter, make_wrapping

if TYPE_CHECKING:
    from app.paths import Paths

CHAT_COLUMN_MIN_WIDTH = 460


class ChatPage(ChatSplitter):
    """Chats | conversation | inspector.

    Args:
        paths: the data folders (the header's Tools switch lists ``mcp.json``'s servers).
        show_inspector: the inspector's state at start (the ``show_inspector`` setting).

    Signals:
        inspector_choice_changed(bool): the user showed or hid the inspector while the window had
            room for it: the choice to keep for the next start (``show_inspector``).
    """

    inspector_choice_changed = Signal(bool)

    def __init__(self, paths: Paths, show_inspector: bool) -> None:
        super().__init__(lambda narrow: self._collapse_when_narrow(narrow))
        self.inspector_choice = show_inspector  # the user's choice, kept when the window has room
        self._auto_toggle = False  # the inspector toggle is being set by the layout, not the user
        self._inspector_collapsed = False  # collapsed because the window is narrow
        self.setHandleWidth(1)
        self.sidebar = Sidebar()
        self.sidebar.setMinimumWidth(200)
        self.addWidget(self.sidebar)
        self.addWidget(self._build_column(paths, show_inspector))
        self.inspector = InspectorPanel()
        self.addWidget(self.inspector)
        self.inspector.setVisible(show_inspector)
        self.setStretchFactor(0, 0)
        self.setStretchFactor(1, 1)
        self.setStretchFactor(2, 0)
        self.setCollapsible(1, False)
        self.setSizes([250, 720, 340])
        self.inspector_button = self.header.inspector_button
        self.inspector_button.toggled.connect(self._on_inspector_button_toggled)

    def _build_column(self, paths: Paths, show_inspector: bool) -> QWidget:
        center = QWidget()
        center.setObjectName("chatColumn")
        # Room for a readable conversation: below it, the side panels give way (ChatSplitter).
        center.setMinimumWidth(CHAT_COLUMN_MIN_WIDTH)
        column = QVBoxLayout(center)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(0)
        self.header = ChatHeaderWidget(paths, show_inspector)  # app/gui/window_header.py
        self.documents_bar = DocumentsBarWidget()  # app/gui/documents_bar.py, in the header's slot
        self.header.documents_slot.addWidget(self.documents_bar)
        column.addWidget(self.header)
        self.banner = QLabel()
        self.banner.setObjectName("errorBanner")
        make_wrapping(self.banner)
        self.banner.setVisible(False)
        self.banner.setContentsMargins(0, 0, 0, 0)
        self.banner.setAccessibleName("Error")
        column.addWidget(self.banner)
        self.chat_view = ChatView()
        column.addWidget(self.chat_view, 1)
        self.composer = Composer()
        self.composer.set_ready(False, "Preparing…")
        column.addWidget(self.composer)
        return center

    def restore(self, state: QByteArray) -> None:
        """Restores the panels' saved sizes; the chat list shows, the inspector as its toggle says."""
        self.restoreState(state)
        self.sidebar.setVisible(True)
        self.inspector.setVisible(self.inspector_button.isChecked())

    def set_inspector_choice(self, show: bool) -> None:
        """Takes ``show`` as the user's choice (the settings, once read in full, said so)."""
        self.inspector_choice = show
        if self.narrow:  # collapsed for now: it comes back when the window widens
            self._inspector_collapsed = show
        elif self.inspector_button.isChecked() != show:
            self.inspector_button.setChecked(show)

    def focus_search(self) -> None:
        """Puts the cursor in the chat search (on a narrow window the chat list comes back)."""
        if not self.sidebar.isVisible() and self.inspector_button.isChecked():
            self.inspector_button.setChecked(False)
        self.sidebar.search.setFocus()
        self.sidebar.search.selectAll()

    @Slot(bool)
    def _on_inspector_button_toggled(self, checked: bool) -> None:
        if not self._auto_toggle:
            # The user's choice: kept for the next start only when the window has room for it.
            if not self.narrow and checked != self.inspector_choice:
                self.inspector_choice = checked
                self.inspector_choice_changed.emit(checked)
            self._inspector_collapsed = False
        self._apply_side_panels()

    def _apply_side_panels(self) -> None:
        """Shows the inspector as its toggle says; on a narrow window the chat list gives way to it."""
        show = self.inspector_button.isChecked()
        self.inspector.setVisible(show)
        self.sidebar.setVisible(not (show and self.narrow))
        tip = "Show or hide the inspector (Ctrl+I)"
        if self.narrow:
            tip += ". The window is narrow: the chat list hides while the inspector shows"
        self.inspector_button.setToolTip(tip)

    def _collapse_when_narrow(self, narrow: bool) -> None:
        """Too narrow for three panels: the inspector collapses to its toggle; wide again: it comes back."""
        self._auto_toggle = True
        try:
            if narrow and self.inspector_button.isChecked():
                self._inspector_collapsed = True
                self.inspector_button.setChecked(False)
            elif not narrow and self._inspector_collapsed:
                self._inspector_collapsed = False
                self.inspector_button.setChecked(self.inspector_choice)
        finally:
            self._auto_toggle = False
        self._apply_side_panels()
