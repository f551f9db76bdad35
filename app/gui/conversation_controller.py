"""The conversation controller: new, open, search, rename, delete with undo, export, this chat's
settings, and what keeps a message from being lost when the history cannot take it.

It is given every collaborator in its constructor (the chat adapter, the history, the widgets it
updates, the settings and where notices go) and connects their signals itself; the main window
only builds it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Slot
from PySide6.QtWidgets import QFileDialog, QWidget

from app.gui.conversation_settings import ConversationSettingsDialog
from app.gui.message_card import search_terms
from app.gui.tasks import describe_error
from app.gui.workers.history_disk import is_unreadable
from app.gui.workers.history_reads import display_thread, media_folder

if TYPE_CHECKING:
    from app.gui.chat_view import ChatView
    from app.gui.composer import Composer
    from app.gui.inspector import InspectorPanel
    from app.gui.sidebar import Sidebar
    from app.gui.toast import Toast
    from app.gui.window_services import Notices, SettingsStore
    from app.gui.workers.chat_adapter import ChatAdapter
    from app.gui.workers.history_service import HistoryService
    from engine.history import HistoryStore
    from engine.history_schema import Conversation


log = logging.getLogger(__name__)


class ConversationController(QObject):
    """The chat list's actions and the open chat's own settings.

    Args:
        chat: the chat adapter (the open conversation, its thread).
        history: the history thread.
        sidebar: the chat list (its requests are connected here).
        chat_view: the transcript (cleared when the open chat is deleted).
        composer: the composer (a message the history refused goes back to it).
        inspector: the inspector (cleared with a deleted chat).
        toast: where Undo and the new-history offer appear.
        settings: the window's settings (the default system prompt).
        kv_cache: the folder of the chats' saved KV caches (a deleted chat's go with it).
        notices: the error banner and the status bar.
        window: the parent of the dialogs; its title names the open chat.
    """

    def __init__(
        self,
        *,
        chat: ChatAdapter,
        history: HistoryService,
        sidebar: Sidebar,
        chat_view: ChatView,
        composer: Composer,
        inspector: InspectorPanel,
        toast: Toast,
        settings: SettingsStore,
        kv_cache: Path,
        notices: Notices,
        window: QWidget,
    ) -> None:
        super().__init__(window)
        self.chat = chat
        self.history = history
        self.sidebar = sidebar
        self.chat_view = chat_view
        self.composer = composer
        self.inspector = inspector
        self.toast = toast
        self.settings = settings
        self.kv_cache = kv_cache
        self.notices = notices
        self.window = window
        self.pending_delete: int | None = None  # the chat whose deletion Undo would take back
        sidebar.new_requested.connect(self.new_chat)
        sidebar.conversation_selected.connect(self._on_sidebar_conversation_selected)
        sidebar.hit_selected.connect(self._on_sidebar_hit_selected)
        sidebar.rename_requested.connect(self._on_sidebar_rename_requested)
        sidebar.delete_requested.connect(self.delete_conversation)
        sidebar.search_requested.connect(self._on_sidebar_search_requested)
        sidebar.export_requested.connect(self.export_conversation)
        chat.conversations_changed.connect(sidebar.set_conversations)
        self._wire_history_safety()

    def start(self) -> None:
        """Finishes replies a crash left pending, purges the chats deleted in an earlier session (an
        Undo lives only in the session that deleted) with the images only they used, and opens the
        newest chat (on the history thread)."""
        self.history.call(lambda s: s.recover_pending(), None, lambda e: self.notices.show_error(describe_error(e)))
        self.history.call(purge_deleted_chats, None, lambda e: log.warning("purging deleted chats: %s", e))
        self.history.call(lambda s: s.list_conversations(), self._on_first_conversations, self.history_failed)

    def _on_first_conversations(self, conversations: list[Conversation]) -> None:
        self.chat.conversations_changed.emit(conversations)  # the chat list; the model bar's first load
        if conversations:
            self.sidebar.set_current(conversations[0].id)
            self.chat.conversations.open(conversations[0].id)

    def _wire_history_safety(self) -> None:
        """What keeps a message or a reply from being lost when the history cannot take it: the
        text goes back to the composer, and an unreadable history file can be replaced."""
        self.chat.message_not_saved.connect(self.composer.restore)
        self.chat.history_unreadable.connect(self._offer_new_history)
        self.chat.notice_posted.connect(lambda text: self.notices.show_status(text, 8000))

    def history_failed(self, exc: BaseException) -> None:
        """Says the history failed; an unreadable file can be replaced (the toast offers it)."""
        self.notices.show_error(f"Chat history unavailable: {describe_error(exc)}")
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
            self.notices.show_status(message, 60000)
            if moved is not None:
                self.toast.show_message(f"New chat history started; the old file is kept as {moved.name}", ms=15000)
            self.chat.conversations.refresh()

        self.history.start_fresh(
            done, lambda e: self.notices.show_error(f"Could not start a new history: {describe_error(e)}")
        )

    def new_chat(self) -> None:
        if self.chat.busy:
            return
        self.chat.conversations.new()
        self.composer.edit.setFocus()

    @Slot(int)
    def _on_sidebar_conversation_selected(self, conversation_id: int) -> None:
        if self.chat.busy:
            self.notices.show_error("Stop the current reply before switching chats.")
            return
        self.chat.conversations.open(conversation_id)

    @Slot(int, int)
    def _on_sidebar_hit_selected(self, conversation_id: int, message_id: int) -> None:
        if self.chat.busy:
            return

        def open_branch(store: HistoryStore) -> None:
            store.select_branch(message_id)

        # The hit's message is scrolled to and its matched words marked once the thread shows.
        self.chat_view.reveal(message_id, search_terms(self.sidebar.search.text()))
        self.history.call(open_branch, lambda _r: self.chat.conversations.open(conversation_id), self.history_failed)

    @Slot(int, str)
    def _on_sidebar_rename_requested(self, conversation_id: int, title: str) -> None:
        def rename(store: HistoryStore) -> None:
            store.rename(conversation_id, title)

        def done(_r: None) -> None:
            self.chat.conversations.refresh()
            if self.chat.conversation is not None and self.chat.conversation.id == conversation_id:
                self.chat.conversations.reload()

        self.history.call(rename, done, self.history_failed)

    def delete_conversation(self, conversation_id: int) -> None:
        """Soft-deletes a chat; the toast offers Undo. Its saved KV caches go at once, on the history
        thread: they hold the chat's tokens (an undone chat only prefills again)."""
        if self.chat.busy and self.chat.conversation is not None and self.chat.conversation.id == conversation_id:
            self.chat.turns.stop()
        kv_folder = self.kv_cache

        def delete(store: HistoryStore) -> None:
            from engine.inference.kv_cache import KvCacheStore  # lazy: start-up (+8 ms)

            store.delete(conversation_id)
            KvCacheStore(kv_folder).remove_conversation(str(conversation_id))  # logs what it cannot remove

        def done(_r: None) -> None:
            self.pending_delete = conversation_id
            self.chat.conversations.refresh()
            if self.chat.conversation is not None and self.chat.conversation.id == conversation_id:
                self.chat.conversation = None
                self.chat.thread_messages = []
                self.chat_view.set_thread([])
                self.inspector.clear_turn("No chat open")
                self.window.setWindowTitle("Glassbox")
            self.toast.show_message("Chat deleted.", "Undo", lambda: self.undo_delete(conversation_id))

        self.history.call(delete, done, self.history_failed)

    def undo_delete(self, conversation_id: int) -> None:
        def restore(store: HistoryStore) -> None:
            store.restore(conversation_id)

        def done(_r: None) -> None:
            self.pending_delete = None
            self.chat.conversations.refresh()
            self.chat.conversations.open(conversation_id)

        self.history.call(restore, done, self.history_failed)

    @Slot(str)
    def _on_sidebar_search_requested(self, query: str) -> None:
        if not query:
            self.chat.conversations.refresh()
            return
        self.history.call(
            lambda s: s.search(query),
            lambda hits: self.sidebar.show_hits(query, hits),
            self.history_failed,
        )

    def export_conversation(self, conversation_id: int | None, fmt: str) -> None:
        """Asks for a file name and exports the chat's current branch."""
        from app.gui.export import FORMATS, export_conversation, export_file_name  # lazy: start-up (+3 ms)

        conv_id = conversation_id if conversation_id is not None else getattr(self.chat.conversation, "id", None)
        if conv_id is None:
            self.notices.show_status("Open a chat to export it (Ctrl+E exports the open chat).", 5000)
            return
        title = self.sidebar.title_of(conv_id) or getattr(self.chat.conversation, "title", "")
        path_text, _filter = QFileDialog.getSaveFileName(
            self.window,
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

        default_prompt = self.settings.current.default_system_prompt or None

        def write(store: HistoryStore) -> Path:
            conv = store.get_conversation(conv_id)
            # A chat without its own prompt was sent the default one: the export says so.
            system = conv.system_prompt if conv.system_prompt is not None else default_prompt
            export_conversation(path, chosen, conv.title, display_thread(store, conv_id), system)
            return path

        self.history.call(
            write,
            lambda p: self.notices.show_status(f"Exported to {p}", 8000),
            lambda e: self.notices.show_error(f"Export failed: {describe_error(e)}"),
        )

    def open_conversation_settings(self) -> None:
        conv = self.chat.conversation
        dialog = ConversationSettingsDialog(self.settings.current, conv, self.window)
        if dialog.exec():
            system, preset = dialog.values()
            own = dialog.sampling()
            adapters = dialog.adapters()
            if conv is None:
                self.chat.conversations.new(
                    system_prompt=system, settings={"preset": preset, "sampling": own, "adapters": adapters}
                )
            else:
                settings = dict(conv.settings or {})
                settings["preset"] = preset
                settings["sampling"] = own
                settings["adapters"] = adapters
                self.chat.conversations.update(system_prompt=system, settings=settings)


def purge_deleted_chats(store: HistoryStore) -> int:
    """Removes the chats deleted before now for good, then the attachments no message uses any more
    (``engine.media_store``); returns how many files went."""
    from engine.media_store import MediaStore  # lazy: start-up (+1 ms)

    store.purge_deleted()
    return MediaStore(media_folder(store.path)).sweep(store.media_in_use())
