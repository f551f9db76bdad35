"""The first step of a turn: the user's message (or a regeneration's new reply row) saved before
anything is generated, so nothing is lost.

On a full disk a message the history refuses goes back to the composer (``message_not_saved``)
with how much space is needed and where. What the save got to before it failed (a chat it made,
the question saved) crosses from the history thread as a frozen :class:`SendProgress`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from app.gui.tasks import describe_error
from app.gui.workers.chat_conversations import title_from
from app.gui.workers.history_disk import HistoryDiskFull, is_unreadable
from app.gui.workers.history_reads import DisplayMessage, display_thread, media_folder

if TYPE_CHECKING:
    from app.gui.workers.chat_adapter import ChatAdapter
    from engine.history import HistoryStore
    from engine.history_schema import Conversation
    from engine.media import Media

Saved = tuple["Conversation", int, list[DisplayMessage]]
"""The conversation, the id of the pending reply, and the thread ending with it."""


@dataclass(frozen=True)
class Question:
    """A message to save (made on the GUI thread, read on the history thread)."""

    text: str
    edit_of: int | None  # the user message it replaces as a new branch (None: appended)
    conversation: Conversation | None  # None: the save creates the chat
    model: str
    parent: int | Literal["leaf"] | None  # "leaf": after the current branch's last message
    media: tuple[Media, ...] = ()  # images and clips attached (kept by content before the row)


@dataclass(frozen=True)
class SendProgress:
    """How far a question's save got: a chat it created, whether the question itself is saved."""

    conversation: Conversation | None = None
    user_saved: bool = False


class ProgressBox:
    """The latest :class:`SendProgress`, replaced whole by the history thread (never mutated)."""

    def __init__(self) -> None:
        self.latest = SendProgress()


def save_question(question: Question, box: ProgressBox) -> Callable[[HistoryStore], Saved]:
    """The history-thread job that saves the question and a pending reply after it."""

    from engine.media_store import MediaStore

    def save(store: HistoryStore) -> Saved:
        conv = question.conversation
        if conv is None:
            conv = store.create_conversation(title=title_from(question.text or _media_title(question.media)))
            box.latest = SendProgress(conversation=conv)
        elif not store.thread(conv.id) and conv.title in ("New chat", ""):
            store.rename(conv.id, title_from(question.text))
        refs = [MediaStore(media_folder(store.path)).put(item) for item in question.media]
        store.add_message(conv.id, "user", question.text, parent_id=question.parent, media=refs)
        box.latest = SendProgress(box.latest.conversation, user_saved=True)
        reply = store.add_message(conv.id, "assistant", "", state="pending", model=question.model)
        return store.get_conversation(conv.id), reply.id, display_thread(store, conv.id)

    return save


def save_regeneration(conv_id: int, parent_id: int, model: str) -> Callable[[HistoryStore], Saved]:
    """The history-thread job that adds a new pending sibling of a reply."""

    def save(store: HistoryStore) -> Saved:
        new = store.add_message(conv_id, "assistant", "", parent_id=parent_id, state="pending", model=model)
        return store.get_conversation(conv_id), new.id, display_thread(store, conv_id)

    return save


def report_send_failure(chat: ChatAdapter, exc: BaseException, question: Question, progress: SendProgress) -> None:
    """The question could not be saved: it goes back to the composer, never lost."""
    reason = describe_error(exc)
    created = progress.conversation
    if created is not None and chat.conversation is None:
        # The chat was made before the disk refused the message: open it, so Send again uses it.
        chat.show_thread(created, [])
        chat.refresh_conversations()
    if progress.user_saved:
        # The question is saved; only its reply's row could not be made.
        chat.reload_thread()
        chat.error_occurred.emit(f"Your message is saved, but the reply could not start: {reason}")
        return
    if is_unreadable(exc):
        then = "start a new history, then press Send again"
    elif isinstance(exc, HistoryDiskFull):
        then = "free some space, then press Send again"
    else:
        then = "press Send again"
    chat.message_not_saved.emit(question.text, question.edit_of)
    if question.media:
        chat.media_not_saved.emit(question.media)  # the images go back to the composer too
    chat.error_occurred.emit(f"Your message was not saved: {reason}. It is back in the box: {then}.")
    if is_unreadable(exc):
        chat.history_unreadable.emit(reason)


def _media_title(media: tuple[Media, ...]) -> str:
    """A chat started with images and no text is titled by them."""
    return ", ".join(m.name for m in media if m.name) or "Images"
