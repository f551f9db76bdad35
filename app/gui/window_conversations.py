"""The main window's conversation actions: new, open, search, rename, delete with undo, export,
per-chat settings. A mixin of :class:`app.gui.main_window.MainWindow` (kept apart for size)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from PySide6.QtCore import Slot
from PySide6.QtWidgets import QFileDialog

from app.gui.tasks import describe_error

if TYPE_CHECKING:
    from PySide6.QtWidgets import QPushButton, QStatusBar, QWidget

    from app.gui.chat_view import ChatView
    from app.gui.composer import Composer
    from app.gui.inspector import InspectorPanel
    from app.gui.sidebar import Sidebar
    from app.gui.toast import Toast
    from app.gui.workers.chat_adapter import ChatAdapter
    from app.gui.workers.history_service import HistoryService
    from app.paths import Paths
    from app.settings import Settings


class ConversationActions:
    """Conversation actions of the main window (needs the attributes annotated below)."""

    chat: ChatAdapter
    history: HistoryService
    sidebar: Sidebar
    chat_view: ChatView
    composer: Composer
    inspector: InspectorPanel
    inspector_button: QPushButton
    toast: Toast
    settings: Settings
    paths: Paths
    _pending_delete: int | None

    if TYPE_CHECKING:  # provided by MainWindow / QMainWindow; declared for the type checker only

        def show_error(self, message: str) -> None: ...
        def show_page(self, index: int) -> None: ...
        def setWindowTitle(self, title: str) -> None: ...
        def statusBar(self) -> QStatusBar: ...

    def _wire_history_safety(self) -> None:
        """What keeps a message or a reply from being lost when the history cannot take it: the
        text goes back to the composer, and an unreadable history file can be replaced."""
        self.chat.message_not_saved.connect(self.composer.restore)
        self.chat.history_unreadable.connect(self._offer_new_history)
        self.chat.notice_posted.connect(lambda text: self.statusBar().showMessage(text, 8000))

    def _on_history_failed(self, exc: BaseException) -> None:
        from app.gui.workers.history_service import is_unreadable

        self.show_error(f"Chat history unavailable: {describe_error(exc)}")
        if is_unreadable(exc):
            self._offer_new_history(describe_error(exc))

    @Slot(str)
    def _offer_new_history(self, _reason: str) -> None:
        """The history file is not a chat history: offer a new one beside it (the old one is kept)."""
        self.toast.show_message(
            "The chat history file cannot be read; it is left as it is.",
            "Start a new history",
            self.start_new_history,
            ms=120_000,
        )

    def start_new_history(self) -> None:
        """Moves the unreadable history file aside, untouched, and starts a new one in its place."""

        def done(result: tuple[Path, Path | None]) -> None:
            path, moved = result
            if moved is None:
                message = f"The chat history {path} can be read; nothing was moved."
            else:
                message = f"Started a new chat history at {path}. The unreadable file was moved, untouched, to {moved}."
                if self.composer.edit.toPlainText().strip():
                    message += " Press Send to save your message."
            self.statusBar().showMessage(message, 60000)
            if moved is not None:
                self.toast.show_message(f"New chat history started; the old file is kept as {moved.name}", ms=15000)
            self.chat.refresh_conversations()

        self.history.start_fresh(done, lambda e: self.show_error(f"Could not start a new history: {describe_error(e)}"))

    def new_chat(self) -> None:
        if self.chat.busy:
            return
        self.chat.new_conversation()
        self.composer.edit.setFocus()

    @Slot(int)
    def _on_sidebar_conversation_selected(self, conversation_id: int) -> None:
        if self.chat.busy:
            self.show_error("Stop the current reply before switching chats.")
            return
        self.chat.open_conversation(conversation_id)

    @Slot(int, int)
    def _on_sidebar_hit_selected(self, conversation_id: int, message_id: int) -> None:
        if self.chat.busy:
            return

        from app.gui.chat_view import search_terms

        def open_branch(store: Any) -> None:
            store.select_branch(message_id)

        # The hit's message is scrolled to and its matched words marked once the thread shows.
        self.chat_view.reveal(message_id, search_terms(self.sidebar.search.text()))
        self.history.call(open_branch, lambda _r: self.chat.open_conversation(conversation_id), self._on_history_failed)

    @Slot(int, str)
    def _on_sidebar_rename_requested(self, conversation_id: int, title: str) -> None:
        def rename(store: Any) -> None:
            store.rename(conversation_id, title)

        def done(_r: None) -> None:
            self.chat.refresh_conversations()
            if self.chat.conversation is not None and self.chat.conversation.id == conversation_id:
                self.chat.reload_thread()

        self.history.call(rename, done, self._on_history_failed)

    def delete_conversation(self, conversation_id: int) -> None:
        """Soft-deletes a chat; the toast offers Undo. Its saved KV caches go at once, on the history
        thread: they hold the chat's tokens (an undone chat only prefills again)."""
        if self.chat.busy and self.chat.conversation is not None and self.chat.conversation.id == conversation_id:
            self.chat.stop()
        kv_folder = self.paths.kv_cache

        def delete(store: Any) -> None:
            from engine.inference.kv_cache import KvCacheStore

            store.delete(conversation_id)
            KvCacheStore(kv_folder).remove_conversation(str(conversation_id))  # logs what it cannot remove

        def done(_r: None) -> None:
            self._pending_delete = conversation_id
            self.chat.refresh_conversations()
            if self.chat.conversation is not None and self.chat.conversation.id == conversation_id:
                self.chat.conversation = None
                self.chat.thread_messages = []
                self.chat_view.set_thread([])
                self.inspector.clear_turn("No chat open")
                self.setWindowTitle("Glassbox")
            self.toast.show_message("Chat deleted.", "Undo", lambda: self.undo_delete(conversation_id))

        self.history.call(delete, done, self._on_history_failed)

    def undo_delete(self, conversation_id: int) -> None:
        def restore(store: Any) -> None:
            store.restore(conversation_id)

        def done(_r: None) -> None:
            self._pending_delete = None
            self.chat.refresh_conversations()
            self.chat.open_conversation(conversation_id)

        self.history.call(restore, done, self._on_history_failed)

    @Slot(str)
    def _on_sidebar_search_requested(self, query: str) -> None:
        if not query:
            self.chat.refresh_conversations()
            return
        self.history.call(
            lambda s: s.search(query),
            lambda hits: self.sidebar.show_hits(query, hits),
            self._on_history_failed,
        )

    def _focus_search(self) -> None:
        self.show_page(0)
        if not self.sidebar.isVisible() and self.inspector_button.isChecked():
            self.inspector_button.setChecked(False)  # a narrow window: the chat list comes back
        self.sidebar.search.setFocus()
        self.sidebar.search.selectAll()

    def export_conversation(self, conversation_id: int | None, fmt: str) -> None:
        """Asks for a file name and exports the chat's current branch."""
        from app.gui.export import FORMATS, export_conversation, export_file_name
        from app.gui.workers.history_service import display_thread

        conv_id = conversation_id if conversation_id is not None else getattr(self.chat.conversation, "id", None)
        if conv_id is None:
            return
        title = self.sidebar.title_of(conv_id) or getattr(self.chat.conversation, "title", "")
        path_text, _filter = QFileDialog.getSaveFileName(
            cast("QWidget", self),
            "Export chat",
            str(Path.home() / export_file_name(title, conv_id, fmt)),
            ";;".join(FORMATS.values()),
            FORMATS.get(fmt, ""),
        )
        if not path_text:
            return
        path = Path(path_text)
        chosen = path.suffix.lstrip(".").lower()
        chosen = {"markdown": "md", "htm": "html"}.get(chosen, chosen)
        if chosen not in FORMATS:
            chosen = fmt
            path = path.with_suffix(f".{fmt}")

        default_prompt = self.settings.default_system_prompt or None

        def write(store: Any) -> Path:
            conv = store.get_conversation(conv_id)
            # A chat without its own prompt was sent the default one: the export says so.
            system = conv.system_prompt if conv.system_prompt is not None else default_prompt
            export_conversation(path, chosen, conv.title, display_thread(store, conv_id), system)
            return path

        self.history.call(
            write,
            lambda p: self.statusBar().showMessage(f"Exported to {p}", 8000),
            lambda e: self.show_error(f"Export failed: {describe_error(e)}"),
        )

    def open_conversation_settings(self) -> None:
        from app.gui.conversation_settings import ConversationSettingsDialog

        conv = self.chat.conversation
        dialog = ConversationSettingsDialog(self.settings, conv, cast("QWidget", self))
        if dialog.exec():
            system, preset = dialog.values()
            own = dialog.sampling()
            if conv is None:
                self.chat.new_conversation(system_prompt=system, settings={"preset": preset, "sampling": own})
            else:
                settings = dict(conv.settings or {})
                settings["preset"] = preset
                settings["sampling"] = own
                self.chat.update_conversation(system_prompt=system, settings=settings)
