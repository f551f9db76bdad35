"""The conversation sidebar: new chat, the list, rename, delete (undoable), full-text search."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import TYPE_CHECKING

from PySide6.QtCore import QPoint, Qt, QTimer, Signal, Slot
from PySide6.QtWidgets import QLineEdit, QListWidget, QListWidgetItem, QMenu, QPushButton, QVBoxLayout, QWidget

from app.gui.display_text import plain_label, plain_tooltip, shown

if TYPE_CHECKING:
    from engine.history_schema import Conversation, SearchHit

CONV_ROLE = Qt.ItemDataRole.UserRole
MSG_ROLE = Qt.ItemDataRole.UserRole + 1
HIT_HTML_ROLE = Qt.ItemDataRole.UserRole + 2


class Sidebar(QWidget):
    """Lists conversations; searching switches the list to search hits.

    Signals:
        new_requested(): "New chat".
        conversation_selected(int): a conversation id.
        hit_selected(int, int): conversation id and message id of a search hit.
        rename_requested(int, str), delete_requested(int): list actions.
        search_requested(str): debounced search text (empty: back to the list).
        export_requested(int, str): conversation id and format ("md", "html", "pdf", "json").
        hits_shown(str): search hits for this query are showing.
    """

    new_requested = Signal()
    conversation_selected = Signal(int)
    hit_selected = Signal(int, int)
    rename_requested = Signal(int, str)
    delete_requested = Signal(int)
    search_requested = Signal(str)
    export_requested = Signal(int, str)
    hits_shown = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("sidebar")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 12, 10, 10)
        layout.setSpacing(8)
        self.new_button = QPushButton("+  New chat")
        self.new_button.setObjectName("primary")
        self.new_button.setToolTip("New chat (Ctrl+N)")
        self.new_button.setAccessibleName("New chat")
        self.new_button.clicked.connect(self.new_requested)
        layout.addWidget(self.new_button)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search all chats (Ctrl+K)")
        self.search.setClearButtonEnabled(True)
        self.search.setAccessibleName("Search all chats")
        self.search.textChanged.connect(self._on_search_text_changed)
        layout.addWidget(self.search)
        self.title = plain_label("CHATS")
        self.title.setObjectName("sectionTitle")
        layout.addWidget(self.title)
        self.list = QListWidget()
        self.list.setObjectName("conversationList")
        self.list.setAccessibleName("Chats")
        self.list.setAccessibleDescription("Your chats, newest first; right-click for rename, export and delete")
        self.list.setWordWrap(False)
        self.list.setUniformItemSizes(False)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self._hits_painted = False  # the delegate that paints hits comes with the first search
        self.list.customContextMenuRequested.connect(self._on_list_context_menu_requested)
        self.list.itemClicked.connect(self._on_list_item_activated)
        self.list.itemActivated.connect(self._on_list_item_activated)
        layout.addWidget(self.list, 1)
        self._debounce = QTimer(self)
        self._debounce.setSingleShot(True)
        self._debounce.setInterval(200)
        self._debounce.timeout.connect(lambda: self.search_requested.emit(self.search.text().strip()))
        self._conversations: list[Conversation] = []
        self._current: int | None = None
        self._searching = False

    # ------------------------------------------------------------------ data
    def set_conversations(self, conversations: Sequence[Conversation]) -> None:
        """Shows the conversation list (unless a search is showing)."""
        self._conversations = list(conversations)
        if not self._searching:
            self._fill_conversations()

    def _fill_conversations(self) -> None:
        self.title.setText("CHATS")
        self.list.clear()
        for conv in self._conversations:
            item = QListWidgetItem(shown(conv.title or "New chat"))
            item.setData(CONV_ROLE, conv.id)
            item.setToolTip(plain_tooltip(conv.title or ""))
            self.list.addItem(item)
            if conv.id == self._current:
                item.setSelected(True)
                self.list.setCurrentItem(item)

    def title_of(self, conversation_id: int) -> str:
        """The listed title of a conversation ("" when it is not listed)."""
        return next((str(c.title or "") for c in self._conversations if c.id == conversation_id), "")

    def set_current(self, conversation_id: int | None) -> None:
        self._current = conversation_id
        for i in range(self.list.count()):
            item = self.list.item(i)
            if item.data(CONV_ROLE) == conversation_id and item.data(MSG_ROLE) is None:
                self.list.setCurrentItem(item)

    def show_hits(self, query: str, hits: Sequence[SearchHit]) -> None:
        """Shows search hits (conversation title + snippet)."""
        if query != self.search.text().strip():
            return  # an older search came back late
        self._searching = bool(query)
        if not query:
            self._fill_conversations()
            return
        if not self._hits_painted:
            # lazy: start-up (QStyle and the item-view classes, ~10 ms: the first frame shows no hit)
            from app.gui.hit_delegate import HitDelegate

            self.list.setItemDelegate(HitDelegate(HIT_HTML_ROLE, self.list))
            self._hits_painted = True
        self.title.setText(f"{len(hits)} RESULT{'S' if len(hits) != 1 else ''} FOR “{shown(query.upper())}”")
        self.list.clear()
        for hit in hits:
            snippet = " ".join(str(hit.snippet).split())
            item = QListWidgetItem(f"{shown(hit.conversation_title)}\n{_strip_marks(snippet)}")
            item.setData(CONV_ROLE, hit.conversation_id)
            item.setData(MSG_ROLE, hit.message_id)
            item.setToolTip(plain_tooltip(_strip_marks(snippet)))
            self.list.addItem(item)
            item.setData(HIT_HTML_ROLE, hit_html(str(hit.conversation_title), snippet))
        self.hits_shown.emit(query)

    # ------------------------------------------------------------------ slots
    @Slot(str)
    def _on_search_text_changed(self, text: str) -> None:
        if not text.strip():
            self._searching = False
            self._debounce.stop()
            self._fill_conversations()
            self.search_requested.emit("")
            return
        self._debounce.start()

    @Slot(QListWidgetItem)
    def _on_list_item_activated(self, item: QListWidgetItem) -> None:
        conv_id = item.data(CONV_ROLE)
        if conv_id is None:
            return
        message_id = item.data(MSG_ROLE)
        if message_id is not None:
            self.hit_selected.emit(int(conv_id), int(message_id))
        else:
            self._current = int(conv_id)
            self.conversation_selected.emit(int(conv_id))

    @Slot(QPoint)
    def _on_list_context_menu_requested(self, pos: QPoint) -> None:
        item = self.list.itemAt(pos)
        if item is None or item.data(MSG_ROLE) is not None:
            return
        conv_id = int(item.data(CONV_ROLE))
        menu = QMenu(self)
        rename = menu.addAction("Rename…")
        export_menu = menu.addMenu("Export")
        exports = {
            export_menu.addAction(label): fmt
            for label, fmt in (
                ("Markdown (.md)", "md"),
                ("HTML (.html)", "html"),
                ("PDF (.pdf)", "pdf"),
                ("JSON (.json)", "json"),
            )
        }
        menu.addSeparator()
        delete = menu.addAction("Delete")
        chosen = menu.exec(self.list.mapToGlobal(pos))
        if chosen is rename:
            self.ask_rename(conv_id, item.text())
        elif chosen is delete:
            self.delete_requested.emit(conv_id)
        elif chosen in exports:
            self.export_requested.emit(conv_id, exports[chosen])

    def ask_rename(self, conv_id: int, current: str) -> None:
        from PySide6.QtWidgets import QInputDialog  # lazy: start-up (a rename only)

        title, ok = QInputDialog.getText(self, "Rename chat", "Title:", QLineEdit.EchoMode.Normal, current)
        if ok and title.strip():
            self.rename_requested.emit(conv_id, title.strip())


def _strip_marks(snippet: str) -> str:
    return snippet.replace("**", "")


HIT_MARK = "background-color:#fde68a; color:#111318; font-weight:600;"


def hit_html(title: str, snippet: str) -> str:
    """A search hit as rich text: the chat's title, then the snippet with the words the history
    matched (between ``**`` marks) highlighted; everything else escaped."""
    parts = snippet.split("**")
    body = "".join(
        f'<span style="{HIT_MARK}">{html.escape(part)}</span>' if i % 2 else html.escape(part)
        for i, part in enumerate(parts)
    )
    return f"<b>{html.escape(title or 'New chat')}</b><br>{body}"
