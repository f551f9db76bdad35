"""The chat's conversations: listing, opening, creating, branches and per-chat settings.

Every read and write runs on the history thread (``HistoryService``); the results come back on the
GUI thread and become the open conversation and its thread (``ChatSignals.conversation`` and
``thread_messages``, which this part owns).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from app.compose import model_key
from app.gui.tasks import describe_error
from app.gui.workers.history_disk import is_unreadable
from app.gui.workers.history_reads import DisplayMessage, display_thread

if TYPE_CHECKING:
    from app.gui.workers.chat_state import ChatSignals
    from app.gui.workers.history_service import HistoryService
    from engine.history import HistoryStore
    from engine.history_schema import Conversation

Opened = tuple["Conversation", list[DisplayMessage]]
"""A conversation and its current branch."""


class ConversationChanges(TypedDict, total=False):
    """The per-conversation settings :meth:`Conversations.update` saves (those given change)."""

    system_prompt: str | None
    settings: Mapping[str, object]
    knowledge_bases: Sequence[str]
    model: str | None


class Conversations:
    """The chat's conversations and the open one.

    Args:
        signals: the chat's signals and state (the open conversation and its thread are this part's).
        history: the history service.
    """

    def __init__(self, signals: ChatSignals, history: HistoryService) -> None:
        self._chat = signals
        self._history = history

    def show(self, conversation: Conversation, messages: list[DisplayMessage]) -> None:
        """Makes ``conversation`` the open one, showing ``messages`` (``conversation_opened``)."""
        chat = self._chat
        chat.conversation = conversation
        chat.thread_messages = messages
        chat.last_stats = last_stats(messages)
        chat.conversation_opened.emit(conversation, messages)

    def show_of(self, conversation_id: int, messages: list[DisplayMessage]) -> None:
        """Shows ``messages`` when ``conversation_id`` is still the open conversation."""
        chat = self._chat
        if chat.conversation is not None and chat.conversation.id == conversation_id:
            chat.thread_messages = messages
            chat.conversation_opened.emit(chat.conversation, messages)

    def refresh(self) -> None:
        """Reloads the conversation list (``conversations_changed``)."""
        chat = self._chat
        self._history.call(lambda s: s.list_conversations(), chat.conversations_changed.emit, self.on_error)

    def open(self, conversation_id: int) -> None:
        """Shows a conversation (its current branch)."""

        def load(store: HistoryStore) -> Opened:
            return store.get_conversation(conversation_id), display_thread(store, conversation_id)

        self._history.call(load, self.opened, self.on_error)

    def new(self, system_prompt: str | None = None, settings: Mapping[str, object] | None = None) -> None:
        """Creates and opens an empty conversation; it starts with the loaded model."""
        loaded = self._chat.loaded
        model = model_key(loaded.path) if loaded is not None else None

        def create(store: HistoryStore) -> Opened:
            return store.create_conversation(system_prompt=system_prompt, settings=settings or {}, model=model), []

        self._history.call(create, self.created, self.on_error)

    def created(self, result: Opened) -> None:
        """A conversation was made: open it and list it."""
        self.opened(result)
        self.refresh()

    def opened(self, result: Opened) -> None:
        """Makes ``result`` the open conversation (``conversation_opened``)."""
        conversation, messages = result
        self.show(conversation, messages)

    def reload(self) -> None:
        """Re-reads the open conversation's current branch."""
        if self._chat.conversation is not None:
            self.open(self._chat.conversation.id)

    def select_branch(self, message_id: int) -> None:
        """Switches the open conversation to the branch through ``message_id``."""
        chat = self._chat
        if chat.busy or chat.conversation is None:
            return
        conv_id = chat.conversation.id

        def switch(store: HistoryStore) -> Opened:
            store.select_branch(message_id)
            return store.get_conversation(conv_id), display_thread(store, conv_id)

        self._history.call(switch, self.opened, self.on_error)

    def remember_model(self, key: str) -> None:
        """Records ``key`` (``app.compose.model_key``) as the open chat's model: the user picked it
        while the chat was open. Known at once on this thread, then saved."""
        chat = self._chat
        if chat.conversation is None or chat.conversation.model == key:
            return
        chat.conversation = replace(chat.conversation, model=key)
        self.update(model=key)

    def update(self, **changes: Unpack[ConversationChanges]) -> None:
        """Saves per-conversation settings (system_prompt, settings, knowledge_bases, model)."""
        chat = self._chat
        if chat.conversation is None:
            return
        conv_id = chat.conversation.id

        def update(store: HistoryStore) -> Conversation:
            store.update_conversation(conv_id, **changes)
            return store.get_conversation(conv_id)

        def done(conv: Conversation) -> None:
            if chat.conversation is not None and chat.conversation.id == conv.id:
                chat.conversation = conv
                chat.conversation_updated.emit(conv)

        self._history.call(update, done, self.on_error)

    def on_error(self, exc: BaseException) -> None:
        """A history call failed: one line for the user (and the unreadable-file offer)."""
        self._chat.error_occurred.emit(f"History: {describe_error(exc)}")
        if is_unreadable(exc):
            self._chat.history_unreadable.emit(describe_error(exc))


def title_from(text: str) -> str:
    """A new chat's title: the first message on one line, cut at 48 characters."""
    line = " ".join(text.split())
    return (line[:48] + "…") if len(line) > 48 else line or "New chat"


def last_stats(messages: list[DisplayMessage]) -> dict[str, Any] | None:
    """The stats of the last reply that has some."""
    for message in reversed(messages):
        if message.role == "assistant" and message.stats:
            return message.stats
    return None
