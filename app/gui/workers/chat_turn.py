"""A chat turn on the GUI thread, from the saved question to the saved reply.

:func:`save_question` saves the question (its images first) and a pending reply row on the history
thread before anything is generated (a message the history refuses on a full disk goes back to the
composer, ``message_not_saved``; what the save got to crosses back as a frozen :class:`SendProgress`);
:class:`~app.gui.workers.chat_retrieval.PassageRetriever` searches the attached knowledge bases; the
coalesced reply streams back, is checkpointed, and is saved (partial if stopped) with its stats and
the sources of the passages kept.

Contract: ARCHITECTURE.md, 'Walk 1: a chat turn'.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from PySide6.QtCore import QObject, Slot

from app.agent_history import model_history
from app.compose import model_key
from app.gui.tasks import describe_error
from app.gui.workers.chat_conversations import title_from
from app.gui.workers.chat_reply import ReplyTurn, final_reply
from app.gui.workers.chat_retrieval import Retrieved, model_searches
from app.gui.workers.chat_state import ChatState, TurnContext
from app.gui.workers.history_disk import HistoryDiskFull, is_unreadable
from app.gui.workers.history_reads import DisplayMessage, display_thread, media_folder
from app.gui.workers.llm_requests import GenerateRequest, GenerationOutcome
from app.knowledge_glue import kept_sources
from app.turn import TurnRequest
from engine.errors import EngineCrashed

if TYPE_CHECKING:
    from app.gui.workers.chat_conversations import Conversations
    from app.gui.workers.chat_model import ModelSlot
    from app.gui.workers.chat_reply import ReplyKeeper
    from app.gui.workers.chat_retrieval import RetrieverFactory
    from app.gui.workers.chat_state import ChatSignals
    from app.gui.workers.history_service import HistoryService
    from engine.history import HistoryStore
    from engine.history_schema import Conversation
    from engine.inference.events import Stats
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
    model_key: str | None = None  # the model that replies (app.compose.model_key): the chat remembers it


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
    # The media store loads with the first message saved, not with the window (ARCHITECTURE.md).
    # lazy: start-up (+3 ms)
    from engine.media_store import MediaStore

    def save(store: HistoryStore) -> Saved:
        conv = question.conversation
        if conv is None:
            title = title_from(question.text or _media_title(question.media))
            conv = store.create_conversation(title=title, model=question.model_key)
            box.latest = SendProgress(conversation=conv)
        elif not store.thread(conv.id) and conv.title in ("New chat", ""):
            store.rename(conv.id, title_from(question.text))
        remember_model(store, conv.id, question.model_key)
        refs = [MediaStore(media_folder(store.path)).put(item) for item in question.media]
        store.add_message(conv.id, "user", question.text, parent_id=question.parent, media=refs)
        box.latest = SendProgress(box.latest.conversation, user_saved=True)
        reply = store.add_message(conv.id, "assistant", "", state="pending", model=question.model)
        return store.get_conversation(conv.id), reply.id, display_thread(store, conv.id)

    return save


def save_regeneration(
    conv_id: int, parent_id: int, model: str, model_key: str | None = None
) -> Callable[[HistoryStore], Saved]:
    """The history-thread job that adds a new pending sibling of a reply (``model_key``: the model
    that replies, remembered by the chat)."""

    def save(store: HistoryStore) -> Saved:
        remember_model(store, conv_id, model_key)
        new = store.add_message(conv_id, "assistant", "", parent_id=parent_id, state="pending", model=model)
        return store.get_conversation(conv_id), new.id, display_thread(store, conv_id)

    return save


def remember_model(store: HistoryStore, conv_id: int, model_key: str | None) -> None:
    """Records ``model_key`` as the model chat ``conv_id`` uses (on the history thread; nothing when
    no model is named or the chat already has it)."""
    if model_key is not None and store.get_conversation(conv_id).model != model_key:
        store.update_conversation(conv_id, model=model_key)


def _media_title(media: tuple[Media, ...]) -> str:
    """A chat started with images and no text is titled by them."""
    return ", ".join(m.name for m in media if m.name) or "Images"


class TurnRunner(QObject):
    """Runs the chat's turns, one at a time.

    Args:
        signals: the chat's signals and state (``busy`` is this part's).
        history: the history service.
        conversations: the open conversation (the question and the reply are shown in it).
        replies: saves the replies.
        model: the loaded model (its label goes with each reply).
        retriever_factory: the retriever of a turn's knowledge bases (None: none is searched).
    """

    def __init__(
        self,
        signals: ChatSignals,
        history: HistoryService,
        conversations: Conversations,
        replies: ReplyKeeper,
        model: ModelSlot,
        retriever_factory: RetrieverFactory | None,
    ) -> None:
        super().__init__(signals)
        self._chat = signals
        self._history = history
        self._conversations = conversations
        self._replies = replies
        self._model = model
        self._retriever_factory = retriever_factory
        self._turn: ReplyTurn | None = None
        self._ids = itertools.count(1)

    @property
    def turn(self) -> ReplyTurn | None:
        """The running turn (while it is produced or stopped: the chat is ``busy``)."""
        return self._turn

    @turn.setter
    def turn(self, turn: ReplyTurn | None) -> None:
        self._turn = turn
        self._chat.busy = turn is not None

    def current(self, request_id: int) -> ReplyTurn | None:
        """The running turn when ``request_id`` is its request (a late signal gets None)."""
        turn = self.turn
        return turn if turn is not None and turn.request.request_id == request_id else None

    # ------------------------------------------------------------------ starting
    def send(self, text: str, context: TurnContext, edit_of: int | None = None, media: tuple[Media, ...] = ()) -> bool:
        """Saves the user message (with its images) and a pending reply, then generates (False:
        cannot start)."""
        chat = self._chat
        text = text.strip()
        if (not text and not media) or self.turn is not None or chat.loaded is None:
            return False
        parent: int | Literal["leaf"] | None = "leaf"
        if edit_of is not None:
            edited = next((m for m in chat.thread_messages if m.id == edit_of), None)
            parent = edited.parent_id if edited is not None else "leaf"
        key = model_key(chat.loaded.path)
        question = Question(text, edit_of, chat.conversation, chat.loaded.label, parent, media, key)
        box = ProgressBox()

        def failed(exc: BaseException) -> None:
            self._end_placeholder()
            self._report_send_failure(exc, question, box.latest)

        self._begin_placeholder()
        size = len(text.encode("utf-8", "replace")) + sum(len(m.data) for m in media)
        self._history.call(save_question(question, box), lambda r: self._start(r, context), failed, size_hint=size)
        return True

    def regenerate(self, reply_id: int, context: TurnContext) -> bool:
        """Generates a new sibling of an assistant reply (the old one stays reachable)."""
        chat = self._chat
        if self.turn is not None or chat.loaded is None or chat.conversation is None:
            return False
        reply = next((m for m in chat.thread_messages if m.id == reply_id), None)
        if reply is None or reply.role != "assistant" or reply.parent_id is None:
            return False
        save = save_regeneration(chat.conversation.id, reply.parent_id, chat.loaded.label, model_key(chat.loaded.path))
        self._begin_placeholder()
        self._history.call(save, lambda r: self._start(r, context), self._on_regeneration_save_failed)
        return True

    def _begin_placeholder(self) -> None:
        # Busy at once, so a double Enter cannot start two turns while the save is queued.
        self.turn = ReplyTurn(GenerateRequest(0, TurnRequest((), "", None)), -1, -1, time.perf_counter())
        self._chat.set_state(ChatState.PROCESSING_PROMPT)

    def _end_placeholder(self) -> None:
        self.turn = None
        self._chat.set_state(ChatState.IDLE)

    def _on_regeneration_save_failed(self, exc: BaseException) -> None:
        self._end_placeholder()
        self._chat.error_occurred.emit(f"Could not save the message: {describe_error(exc)}")
        if is_unreadable(exc):
            self._chat.history_unreadable.emit(describe_error(exc))

    def _start(self, saved: Saved, context: TurnContext) -> None:
        chat = self._chat
        conversation, reply_id, messages = saved
        placeholder = self.turn
        self._conversations.show(conversation, messages)
        self._conversations.refresh()
        if placeholder is None:  # stopped before the save came back: keep the question, mark the reply
            self._replies.cancel_unstarted(conversation.id, reply_id)
            return
        # messages ends with [..., user, pending reply]; history is everything before the user turn.
        ask = TurnRequest(
            # A reply made with tools: its calls and results too; a user message its images.
            history=model_history(messages[:-2], lambda row: row.media if isinstance(row, DisplayMessage) else ()),
            user=messages[-2].content,
            media=messages[-2].media,
            params=context.params,
            system=context.system,
            cache_key=(str(conversation.id), str(reply_id)),  # the KV cache saved with the chat
            thinking=context.thinking,
            thinking_budget=context.thinking_budget,
            cancel=placeholder.request.cancel,
        )
        request = GenerateRequest(next(self._ids), ask, context.tools, context.adapters)
        turn = ReplyTurn(request, conversation.id, reply_id, time.perf_counter())
        self.turn = turn
        chat.reply_started.emit(reply_id)
        if request.cancel.is_set():
            self.finish("cancelled", "", None)
        elif context.knowledge_bases and self._retriever_factory is not None:
            self._retrieve(turn, context)
        else:
            self._submit(turn)

    # ------------------------------------------------------------------ retrieval (knowledge thread)
    def _retrieve(self, turn: ReplyTurn, context: TurnContext) -> None:
        assert self._retriever_factory is not None
        turn.retrieving = True
        self._chat.set_state(ChatState.RETRIEVING)
        retriever = self._retriever_factory(context.knowledge_bases)
        retriever.retrieve(
            turn.request.turn.user or "",
            lambda found: self._on_retrieved(turn, found),
            lambda exc: self._on_retrieval_failed(turn, exc),
            skip=model_searches(context.tools),
        )

    def _on_retrieved(self, turn: ReplyTurn, found: Retrieved) -> None:
        if self.turn is not turn or not turn.retrieving:
            return  # stopped meanwhile: the turn already ended
        if found.passages is not None:
            turn.sources = list(found.passages.sources)
            turn.request = replace(turn.request, turn=replace(turn.request.turn, passages=found.passages))
            self._chat.sources_found.emit(list(found.passages.sources))
        self._submit(turn)

    def _on_retrieval_failed(self, turn: ReplyTurn, exc: BaseException) -> None:
        if self.turn is not turn or not turn.retrieving:
            return
        self._chat.error_occurred.emit(f"Documents not used: {describe_error(exc)}")
        self._submit(turn)

    def _submit(self, turn: ReplyTurn) -> None:
        turn.retrieving = False
        if turn.request.cancel.is_set():
            self.finish("cancelled", "", None)
            return
        self._chat.set_state(ChatState.PROCESSING_PROMPT)
        self._chat.generate_requested.emit(turn.request)

    def stop(self) -> None:
        """Stops the running turn: sets its cancel event directly (CONTRIBUTING.md rule 9)."""
        chat, turn = self._chat, self.turn
        if turn is None:
            return
        turn.request.cancel.set()
        if turn.reply_id < 0:
            self._end_placeholder()  # the save is still queued; _start sees the stop
        elif turn.retrieving:
            self.finish("cancelled", "", None)  # the LLM worker was never asked: end it here
        elif chat.state is not ChatState.IDLE:
            chat.set_state(ChatState.CANCELLING)

    def live_agent_record(self, reply_id: int | None) -> dict[str, object] | None:
        """The agent loop of the running turn so far (its steps and their calls, as a stored reply's
        stats keep them), when the running turn is ``reply_id``'s; else None."""
        turn = self.turn
        if turn is None or reply_id is None or turn.reply_id != reply_id:
            return None
        return turn.agent.stats()

    def live_tokens(self) -> tuple[int, float, float | None]:
        """Tokens received, seconds since the turn started, and when the first token came."""
        turn = self.turn
        if turn is None:
            return 0, 0.0, None
        return turn.tokens, time.perf_counter() - turn.started, turn.first_token_at

    def _report_send_failure(self, exc: BaseException, question: Question, progress: SendProgress) -> None:
        """The question could not be saved: it goes back to the composer, never lost."""
        chat = self._chat
        reason = describe_error(exc)
        created = progress.conversation
        if created is not None and chat.conversation is None:
            # The chat was made before the disk refused the message: open it, so Send again uses it.
            self._conversations.show(created, [])
            self._conversations.refresh()
        if progress.user_saved:
            # The question is saved; only its reply's row could not be made.
            self._conversations.reload()
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

    # ------------------------------------------------------------------ the worker's signals
    @Slot(int, int, int)
    def on_prefill(self, request_id: int, done: int, total: int) -> None:
        """Prompt evaluation progress."""
        if self.current(request_id) is not None:
            self._chat.prefill_progressed.emit(done, total)

    @Slot(int, str, int)
    def on_tokens(self, request_id: int, text: str, count: int) -> None:
        """Coalesced text of the running reply: shown, and checkpointed every second."""
        turn = self.current(request_id)
        if turn is None:
            return
        if turn.first_token_at is None:
            turn.first_token_at = time.perf_counter()
            if self._chat.state is ChatState.PROCESSING_PROMPT:
                self._chat.set_state(ChatState.GENERATING)
        turn.text.append(text)
        turn.tokens += count
        self._chat.reply_delta.emit(text, count)
        self._replies.tick(turn)

    @Slot(int, int)
    def on_call_progress(self, request_id: int, tokens: int) -> None:
        """The model writes a tool call (``tokens`` so far; 0: it stopped writing one)."""
        turn = self.current(request_id)
        if turn is not None:
            turn.call_tokens = tokens
            self._chat.call_progressed.emit(tokens)

    @Slot(object)
    def on_finished(self, outcome: GenerationOutcome) -> None:
        """The generation ended (stop, length or cancelled): save the reply with its stats."""
        turn = self.current(outcome.request_id)
        if turn is None:
            return
        chat = self._chat
        chat.last_stats = outcome.stats
        # With the reason, as a saved reply keeps it: the inspector says a reply stopped in prefill was.
        chat.stats_updated.emit({**outcome.stats.to_dict(), "finish_reason": outcome.reason})
        turn.agent.reasoning_done = outcome.reasoning
        dropped = outcome.stats.documents_dropped
        if turn.request.turn.passages is not None:
            turn.sources = kept_sources(turn.request.turn.passages, outcome.stats)
        if dropped:
            chat.notice_posted.emit(
                f"{dropped} of the passages found did not fit the context window and were left out."
            )
        self.finish(outcome.reason, outcome.text, outcome.stats)
        chat.reply_finished.emit(outcome)

    @Slot(int, object)
    def on_failed(self, request_id: int, exc: BaseException) -> None:
        """The generation failed: the text so far is saved, the error shown."""
        turn = self.current(request_id)
        if turn is None:
            return
        message = describe_error(exc)
        self.finish("error", turn.reply_text, None, error=message)
        if isinstance(exc, EngineCrashed) and not exc.will_repeat:
            self._chat.error_occurred.emit(f"{message}. Send again to restart the model.")
        else:
            self._chat.error_occurred.emit(message)

    # ------------------------------------------------------------------ the end
    def finish(self, reason: str, text: str, stats: Stats | None, error: str | None = None) -> None:
        """Ends the running turn and saves its reply."""
        turn = self.turn
        assert turn is not None
        self.turn = None
        turn.retrieving = False
        self._replies.finish(turn, final_reply(turn, reason, text, stats, error))
        self._chat.set_state(ChatState.IDLE)

    def finish_at_shutdown(self) -> None:
        """A turn still open once the worker stopped is saved as partial."""
        if self.turn is not None and self.turn.reply_id >= 0:
            self.finish("cancelled", self.turn.reply_text, None)
        self.turn = None
