"""``glassbox chat``'s conversations in the history (``engine.history``), like the app's.

A new conversation is created on its first turn (its id is printed then, so it can be continued
later with ``--conversation ID``); ``--conversation ID`` continues the current branch of a saved
one. Every turn is saved as the app saves it: the user message first, then the reply as
``pending``, finished with its state and stats. A turn with tools is stored as the app stores it
(``app.agent_history``): the reply is rewritten as each message of the loop happens (its calls, each
result), so a killed process loses no step, and a continued conversation sends the model the calls
and results back. Each turn's key for the KV cache saved with the chat is the conversation and the
reply it writes (``engine.inference.kv_cache.KvKey``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from app.agent_history import model_history
from app.paths import Paths
from engine.media import MediaError

if TYPE_CHECKING:
    from app.agent_history import AgentRecord
    from app.turn import TurnRecord
    from engine.history_schema import Conversation
    from engine.inference.context import Message
    from engine.media import Media

_TITLE_CHARS = 60


class ChatLog:
    """One conversation of ``glassbox chat`` in the history database.

    Args:
        paths: the data folders (the history database is ``paths.history_db``).
        conversation_id: a saved conversation to continue; None starts a new one on the first turn.
        model: the model's name, saved with each reply.

    Raises:
        HistoryError: the database cannot be opened, or there is no such conversation.
    """

    def __init__(self, paths: Paths, conversation_id: int | None, model: str | None) -> None:
        # lazy: start-up (+22 ms)
        from engine.history import HistoryStore
        from engine.media_store import MediaStore

        self._store = HistoryStore(paths.history_db)
        self._media = MediaStore(paths.media)
        self.model = model
        self.conversation: Conversation | None = None
        self._reply_id: int | None = None
        self._progress: tuple[str, AgentRecord] | None = None  # the open turn's last save_progress
        if conversation_id is not None:
            try:
                self.conversation = self._store.get_conversation(conversation_id)
                self._end_dead_replies()
            except BaseException:
                self._store.close()
                raise

    def _end_dead_replies(self) -> None:
        """A reply of this conversation left ``pending`` by a process that died (killed mid-turn)
        becomes ``partial``, with every step it saved; the continued conversation goes on after it."""
        assert self.conversation is not None
        for m in self._store.thread(self.conversation.id):
            if m.state == "pending":
                self._store.finish_message(
                    m.id, m.content, state="partial", stats=m.stats, sources=m.sources, error=m.error
                )

    def close(self) -> None:
        self._store.close()

    def __enter__(self) -> ChatLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def conversation_id(self) -> int | None:
        return self.conversation.id if self.conversation is not None else None

    @property
    def system_prompt(self) -> str | None:
        return self.conversation.system_prompt if self.conversation is not None else None

    def history(self) -> list[Message]:
        """The saved branch as ``engine.inference.context.Message``, as the app sends it: a reply made with
        tools is its calls, their results and its answer; failed replies and empty ones left out; a
        user message's images read back from the data folder (one that is gone or changed is left
        out, said on stderr)."""

        if self.conversation is None:
            return []
        thread = self._store.thread(self.conversation.id)
        return list(model_history(thread, self._read_media))

    def _read_media(self, row: object) -> tuple[Media, ...]:
        loaded = []
        for ref in getattr(row, "media", ()):
            try:
                loaded.append(self._media.load(ref))
            except MediaError as exc:
                print(f"glassbox: warning: {exc}; the message is sent without it", file=sys.stderr)
        return tuple(loaded)

    def start_turn(self, user: str, system: str | None, media: Sequence[Media] = ()) -> tuple[int, bool]:
        """Saves the user message (its images first, by content: ``engine.media_store``) and a
        pending reply (creating the conversation on the first turn).

        Returns:
            The conversation id, and whether the conversation was created now.
        """
        created = self.conversation is None
        conversation = self.conversation
        if conversation is None:
            title = " ".join(user.split())[:_TITLE_CHARS] or "New chat"
            conversation = self.conversation = self._store.create_conversation(title=title, system_prompt=system)
        refs = [self._media.put(item) for item in media]
        self._store.add_message(conversation.id, "user", user, media=refs)
        reply = self._store.add_message(conversation.id, "assistant", "", state="pending", model=self.model)
        self._reply_id, self._progress = reply.id, None
        return conversation.id, created

    def cache_key(self) -> tuple[str, str]:
        """This turn's key for the KV cache saved with the chat: ``(conversation, reply)``
        (``engine.inference.kv_cache.KvKey``)."""
        assert self.conversation is not None and self._reply_id is not None
        return str(self.conversation.id), str(self._reply_id)

    def save_progress(self, text: str, record: AgentRecord) -> None:
        """Saves the turn so far as the app does after each message of the loop: the text shown so
        far and the ``record`` (an ``app.agent_history.AgentRecord``); the reply stays ``pending``."""
        assert self._reply_id is not None
        self._store.finish_message(self._reply_id, text, state="pending", stats=record.stats())
        self._progress = (text, record)

    def finish_turn(self, record: TurnRecord) -> None:
        """Saves the turn's reply (``app.turn.TurnRecord``): complete, or partial when stopped, with
        its stats (the passages the documents band left out among them, as in the app), the turn's
        tool steps and thinking, and the sources of the passages kept."""
        assert self._reply_id is not None
        finished = record.finished
        assert finished is not None  # a turn that did not finish raised instead (fail_turn saves it)
        state = "partial" if finished.reason == "cancelled" else "complete"
        self._store.finish_message(
            self._reply_id, finished.text, state=state, stats=record.history_stats(), sources=record.sources or None
        )
        self._reply_id = None
        self._progress = None

    def fail_turn(self, error: BaseException) -> None:
        """Marks the pending reply failed (the user message stays), if a turn is open; what the turn
        had already saved (:meth:`save_progress`: its text, its tool steps) is kept, and the reply is
        then ``partial`` when it has text, as in the app."""
        if self._reply_id is None:
            return
        reply_id, self._reply_id = self._reply_id, None
        text, record = self._progress if self._progress is not None else ("", None)
        self._progress = None
        stats = record.stats() if record is not None else None
        try:
            self._store.finish_message(
                reply_id,
                text,
                state="partial" if text else "error",
                stats=stats or None,
                error=str(error) or type(error).__name__,
            )
        except Exception:  # noqa: BLE001 - the original error is the one to report
            pass
