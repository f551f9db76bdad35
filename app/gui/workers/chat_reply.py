"""The reply of a running turn and how it reaches the history: checkpoints while it streams, the
final save with its stats and sources, and the retries while the disk is full.

A reply the history refuses stays whole in memory and on screen, is tried again every
:data:`RETRY_S` s, before the next history write and at quit, and its row is marked complete (or
partial) only once that save succeeded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, QTimer, Slot

from app.agent_history import AgentRecord
from app.gui.tasks import describe_error
from app.gui.workers.history_reads import DisplayMessage, display_thread

if TYPE_CHECKING:
    from app.gui.workers.chat_conversations import Conversations
    from app.gui.workers.chat_state import ChatSignals
    from app.gui.workers.history_service import HistoryService
    from app.gui.workers.llm_requests import GenerateRequest
    from engine.history import HistoryStore
    from engine.inference.events import Stats

CHECKPOINT_S = 1.0
"""How often the growing reply is saved."""
RETRY_S = 5.0
"""How often replies the disk refused are tried again while it stays full."""


@dataclass
class StoredText:
    """How many characters of a streaming reply its row holds (read and written on the history
    thread only: every write of one reply runs there, in order)."""

    chars: int = 0


@dataclass
class ReplyTurn:
    """The running turn, as the GUI thread keeps it (never touched by another thread).

    ``request`` is replaced once, when the turn's passages came back; ``retrieving`` is true while
    the knowledge worker searches (the LLM worker has not been asked yet).
    """

    request: GenerateRequest
    conversation_id: int
    reply_id: int
    started: float
    text: list[str] = field(default_factory=list)
    tokens: int = 0
    sources: list[dict[str, Any]] = field(default_factory=list)
    retrieving: bool = False
    last_checkpoint: float = 0.0
    first_token_at: float | None = None
    call_tokens: int = 0  # the tokens of the tool call being written now (0: none)
    stored: StoredText = field(default_factory=StoredText)
    save_failed: bool = False
    agent: AgentRecord = field(default_factory=AgentRecord)  # tool steps, thinking (agent_turn)

    @property
    def reply_text(self) -> str:
        """The text streamed so far."""
        return "".join(self.text)


@dataclass(frozen=True)
class FinalReply:
    """What the final save of a reply writes (a snapshot handed to the history thread)."""

    text: str
    state: str
    stats: dict[str, Any] | None
    sources: list[dict[str, Any]] | None
    error: str | None


def final_reply(turn: ReplyTurn, reason: str, text: str, stats: Stats | None, error: str | None) -> FinalReply:
    """The reply's row as the turn ended: ``complete``, ``partial`` (stopped, or failed after some
    text) or ``error``; its stats (the passages the documents band dropped among them) with the
    finish reason and the agent's records."""
    if reason == "error":
        state = "error" if not text else "partial"
    elif reason == "cancelled":
        state = "partial"
    else:
        state = "complete"
    stats_dict = stats.to_dict() if stats is not None and hasattr(stats, "to_dict") else None
    if stats_dict is not None:
        stats_dict["finish_reason"] = reason
    extra = turn.agent.stats()  # tool calls and results, the loop's timeline, the thinking
    if extra:
        stats_dict = {**(stats_dict or {}), **extra}
    return FinalReply(text, state, stats_dict, list(turn.sources) or None, error)


class ReplyKeeper(QObject):
    """Saves the chat's replies: checkpoints, the final save, the retries.

    Args:
        signals: the chat's signals and state.
        history: the history service.
        conversations: the open conversation (a reply saved is shown in it).
    """

    def __init__(self, signals: ChatSignals, history: HistoryService, conversations: Conversations) -> None:
        super().__init__(signals)
        self._chat = signals
        self._history = history
        self._conversations = conversations
        # Replies the disk refused are tried again on this timer until the history holds them all.
        self.retry_timer = QTimer(self)
        self.retry_timer.setInterval(int(RETRY_S * 1000))
        self.retry_timer.timeout.connect(self._on_retry_timer_timeout)

    def tick(self, turn: ReplyTurn) -> None:
        """Checkpoints the reply when :data:`CHECKPOINT_S` passed since the last one."""
        now = time.perf_counter()
        if now - turn.last_checkpoint >= CHECKPOINT_S:
            turn.last_checkpoint = now
            self.checkpoint(turn)

    def checkpoint(self, turn: ReplyTurn) -> None:
        """Saves the reply so far. The row gets what it lacks of the text streamed until now; a
        checkpoint the disk refused is replaced by the next one (or the final save), which then
        writes what the failed one did not."""
        text, stored, reply_id = turn.reply_text, turn.stored, turn.reply_id

        def save(store: HistoryStore) -> None:
            if len(text) > stored.chars:
                store.append_text(reply_id, text[stored.chars :])
                stored.chars = len(text)

        self._history.keep(
            ("reply", reply_id), save, None, lambda exc: self.save_failed(turn, exc), size_hint=len(text)
        )

    def save_progress(self, turn: ReplyTurn) -> None:
        """Saves the turn so far, its tool steps included, as each step happens (state stays
        ``pending``: a crash leaves it ``partial`` with every step before it)."""
        text, stored, reply_id, extra = turn.reply_text, turn.stored, turn.reply_id, turn.agent.stats()

        def save(store: HistoryStore) -> None:
            store.finish_message(reply_id, text, state="pending", stats=extra)
            stored.chars = len(text)

        self._history.keep(
            ("reply", reply_id), save, None, lambda exc: self.save_failed(turn, exc), size_hint=len(text)
        )

    def finish(self, turn: ReplyTurn, final: FinalReply) -> None:
        """The final save; until it succeeds the reply is shown from memory, in its final state."""
        chat, reply_id, conv_id = self._chat, turn.reply_id, turn.conversation_id

        def save(store: HistoryStore) -> list[DisplayMessage]:
            store.finish_message(
                reply_id, final.text, state=final.state, stats=final.stats, sources=final.sources, error=final.error
            )
            return display_thread(store, conv_id)

        def saved(messages: list[DisplayMessage]) -> None:
            self._conversations.show_of(conv_id, messages)
            if turn.save_failed:
                chat.notice_posted.emit("The reply was saved.")

        def failed(exc: BaseException) -> None:
            shown = [
                replace(
                    m,
                    content=final.text,
                    state=final.state,
                    stats=final.stats,
                    sources=final.sources,
                    error=final.error,
                )
                if m.id == reply_id
                else m
                for m in chat.thread_messages
            ]
            self._conversations.show_of(conv_id, shown)
            self.save_failed(turn, exc)

        self._history.keep(("reply", reply_id), save, saved, failed, size_hint=len(final.text))

    def cancel_unstarted(self, conversation_id: int, reply_id: int) -> None:
        """Marks a reply whose turn was stopped before its row came back (the question stays)."""

        def cancel(store: HistoryStore) -> list[DisplayMessage]:
            store.finish_message(reply_id, "", state="partial", stats={"finish_reason": "cancelled"})
            return display_thread(store, conversation_id)

        self._history.keep(
            ("reply", reply_id),
            cancel,
            lambda shown: self._conversations.show_of(conversation_id, shown),
            self._conversations.on_error,
        )

    def save_failed(self, turn: ReplyTurn, exc: BaseException) -> None:
        """A write of the reply was refused: it is kept and retried; the user is told once."""
        self.retry_timer.start()
        if turn.save_failed:
            return  # said once per reply
        turn.save_failed = True
        self._chat.error_occurred.emit(
            f"The reply is not saved yet: {describe_error(exc)}. Glassbox keeps all of it and saves it "
            "as soon as there is space (it tries again every few seconds and when it quits)."
        )

    @Slot()
    def _on_retry_timer_timeout(self) -> None:
        self._history.retry_unsaved(self._after_retry)

    def _after_retry(self, unsaved: int) -> None:
        if not unsaved:
            self.retry_timer.stop()
