"""The main window's fixed chrome, as widgets: the navigation rail (:class:`NavRailWidget`) and
the chat header with its model bar (:class:`ChatHeaderWidget`). They only build and lay out their
controls; the window hands them to the controllers that drive them (``app.gui.main_window``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import (
    QButtonGroup,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.gui.display_text import plain_label
from app.gui.model_bar_widget import ModelBarWidget
from app.gui.theme import RESOURCES
from app.gui.window_layout import ElidedLabel, FlowLayout, make_wrapping

if TYPE_CHECKING:
    from app.paths import Paths

PAGES = (
    ("chat", "Chat", "Chat (Ctrl+1)"),
    ("models", "Models", "Models (Ctrl+2)"),
    ("knowledge", "Knowledge", "Knowledge (Ctrl+3)"),
)
"""The pages of the rail, in the order of the window's page stack: key, label, tooltip."""


class NavRailWidget(QFrame):
    """The rail on the left: the logo, one button per page (``nav_group`` ids are page indexes),
    and Settings at the bottom."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("navRail")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self.setFixedWidth(104)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 12, 0, 12)
        layout.setSpacing(4)
        brand = QLabel()
        brand.setAlignment(Qt.AlignmentFlag.AlignCenter)
        brand.setToolTip("Glassbox")
        logo = RESOURCES / "icons" / "glassbox.svg"
        if logo.exists():
            brand.setPixmap(QIcon(str(logo)).pixmap(36, 36, QIcon.Mode.Normal))
        else:
            brand.setText("Glassbox")
        layout.addWidget(brand)
        layout.addSpacing(8)
        self.nav_group = QButtonGroup(self)
        self.nav_buttons: dict[str, QToolButton] = {}
        for index, (key, text, tip) in enumerate(PAGES):
            button = QToolButton()
            button.setText(text)
            button.setToolTip(tip)
            button.setCheckable(True)
            button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextUnderIcon)
            icon = RESOURCES / "icons" / f"{key}.svg"
            if icon.exists():
                button.setIcon(QIcon(str(icon)))
            button.setObjectName(f"nav_{key}")
            button.setAccessibleName(text)
            button.setAccessibleDescription(f"Show the {text} page ({tip.split('(')[-1].rstrip(')')})")
            button.setIconSize(QSize(22, 22))
            button.setMinimumWidth(94)
            self.nav_group.addButton(button, index)
            self.nav_buttons[key] = button
            layout.addWidget(button, 0, Qt.AlignmentFlag.AlignHCenter)
        self.nav_buttons["chat"].setChecked(True)
        layout.addStretch(1)
        self.settings_button = QToolButton()
        self.settings_button.setText("Settings")
        self.settings_button.setToolTip("Settings (Ctrl+,)")
        self.settings_button.setAccessibleName("Settings")
        self.settings_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextUnderIcon)
        icon = RESOURCES / "icons" / "settings.svg"
        if icon.exists():
            self.settings_button.setIcon(QIcon(str(icon)))
        self.settings_button.setIconSize(QSize(22, 22))
        layout.addWidget(self.settings_button, 0, Qt.AlignmentFlag.AlignHCenter)


class ChatHeaderWidget(QFrame):
    """The chat header: two rows, so that it never sets the window's width.

    The first row is the model bar (:class:`app.gui.model_bar_widget.ModelBarWidget`: the picker, Load,
    Add endpoint); the second wraps (``FlowLayout``): the model's state, the chat's documents
    (``documents_slot``, filled by the window with ``app.gui.documents_bar``'s control), indexing,
    this chat's settings, its Tools switch and the inspector toggle. Every text in it elides (the
    whole text is its tooltip).

    Args:
        paths: the data folders (the Tools switch lists ``mcp.json``'s servers).
        show_inspector: whether the inspector toggle starts checked.
    """

    def __init__(self, paths: Paths, show_inspector: bool, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("chatHeader")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        hl = QVBoxLayout(self)
        hl.setContentsMargins(12, 6, 12, 6)
        hl.setSpacing(4)
        self.model_bar = ModelBarWidget()
        hl.addWidget(self.model_bar)
        # The second row wraps (FlowLayout) rather than set the window's width: every control that
        # joins the header keeps its whole size and moves to a new line when the column is narrow.
        hl.addLayout(self._build_state_row(paths, show_inspector))
        self.starter_note = plain_label(
            "Starter model: a tiny base model for trying the app. It continues text rather than following "
            "instructions; load a chat model from Models for real answers."
        )
        self.starter_note.setObjectName("starterNote")
        make_wrapping(self.starter_note)
        self.starter_note.setVisible(False)
        hl.addWidget(self.starter_note)

    def _build_state_row(self, paths: Paths, show_inspector: bool) -> FlowLayout:
        state_row = FlowLayout(spacing=6)
        self.model_status = ElidedLabel("No model loaded", min_chars=12, max_chars=40)
        self.model_status.setObjectName("modelStatus")
        self.model_status.setAccessibleName("Model state")
        state_row.addWidget(self.model_status)
        self.docs_label = ElidedLabel("", max_chars=32)
        self.docs_label.setObjectName("stateLabel")
        self.docs_label.setAccessibleName("Documents in this chat")
        state_row.addWidget(self.docs_label)
        # The chat's documents control (a widget in its own file) goes in this slot.
        documents_holder = QWidget()
        self.documents_slot = QHBoxLayout(documents_holder)
        self.documents_slot.setContentsMargins(0, 0, 0, 0)
        self.documents_slot.setSpacing(4)
        state_row.addWidget(documents_holder)
        self.index_label = ElidedLabel("", max_chars=36)
        self.index_label.setObjectName("stateLabel")
        self.index_label.setAccessibleName("Indexing")
        state_row.addWidget(self.index_label)
        self.chat_settings_button = QPushButton("Chat settings…")
        self.chat_settings_button.setToolTip("This chat's system prompt and sampling (temperature, top-p, seed, …)")
        self.chat_settings_button.setAccessibleDescription(self.chat_settings_button.toolTip())
        state_row.addWidget(self.chat_settings_button)
        # lazy: start-up (+10 ms)
        from app.gui.chat_tools_menu import ChatToolsButton

        self.tools_button = ChatToolsButton(paths)  # this chat's Tools switch (app/gui/chat_tools_menu.py)
        state_row.addWidget(self.tools_button)
        self.inspector_button = QPushButton("Inspector")
        self.inspector_button.setObjectName("inspectorToggle")
        self.inspector_button.setCheckable(True)
        self.inspector_button.setChecked(show_inspector)
        self.inspector_button.setToolTip("Show or hide the inspector (Ctrl+I)")
        self.inspector_button.setAccessibleDescription("Shows or hides the inspector panel")
        state_row.addWidget(self.inspector_button)
        return state_row
