"""``glassbox chat``'s conversations in the history (``engine.history``), like the app's.

A new conversation is created on its first turn (its id is printed then, so it can be continued
later with ``--conversation ID``); ``--conversation ID`` continues the current branch of a saved
one. Every turn is saved as the app saves it: the user message first, then the reply as
``pending``, finished with its state and stats. Each turn's key for the KV cache saved with the chat
is the conversation and the reply it writes (``engine.kv_cache.KvKey``).
"""

from __future__ import annotations

from typing import Any

from app.paths import Paths

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
        from engine.history import HistoryStore

        self._store = HistoryStore(paths.history_db)
        self.model = model
        self.conversation: Any = None  # engine.history.Conversation
        self._reply_id: int | None = None
        if conversation_id is not None:
            try:
                self.conversation = self._store.get_conversation(conversation_id)
            except BaseException:
                self._store.close()
                raise

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

    def history(self) -> list[Any]:
        """The saved branch as ``engine.context.Message`` (failed replies and empty ones left out)."""
        from engine.context import Message

        if self.conversation is None:
            return []
        return [
            Message(m.role, m.content)
            for m in self._store.thread(self.conversation.id)
            if m.role in ("user", "assistant") and m.content and m.state != "error"
        ]

    def start_turn(self, user: str, system: str | None) -> tuple[int, bool]:
        """Saves the user message and a pending reply (creating the conversation on the first turn).

        Returns:
            The conversation id, and whether the conversation was created now.
        """
        created = self.conversation is None
        if created:
            title = " ".join(user.split())[:_TITLE_CHARS] or "New chat"
            self.conversation = self._store.create_conversation(title=title, system_prompt=system)
        self._store.add_message(self.conversation.id, "user", user)
        reply = self._store.add_message(self.conversation.id, "assistant", "", state="pending", model=self.model)
        self._reply_id = reply.id
        return self.conversation.id, created

    def cache_key(self) -> Any:
        """This turn's key for the KV cache saved with the chat."""
        from engine.kv_cache import KvKey

        assert self.conversation is not None and self._reply_id is not None
        return KvKey(str(self.conversation.id), str(self._reply_id))

    def finish_turn(self, text: str, finished: Any) -> None:
        """Saves the reply: complete, or partial when stopped, with its stats."""
        assert self._reply_id is not None
        state = "partial" if finished.reason == "cancelled" else "complete"
        stats = finished.stats.to_dict()
        stats["finish_reason"] = finished.reason
        self._store.finish_message(self._reply_id, text, state=state, stats=stats)
        self._reply_id = None

    def fail_turn(self, error: BaseException) -> None:
        """Marks the pending reply failed (the user message stays), if a turn is open."""
        if self._reply_id is None:
            return
        reply_id, self._reply_id = self._reply_id, None
        try:
            self._store.finish_message(reply_id, "", state="error", error=str(error) or type(error).__name__)
        except Exception:  # noqa: BLE001 - the original error is the one to report
            pass
