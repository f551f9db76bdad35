"""Chat history off the GUI thread: one ordered worker thread in front of ``engine.history``.

Every write (a sent message, a streaming checkpoint, a finished reply) and every read (a thread,
a search) runs on the ``glassbox-history`` thread in submission order; results come back to the GUI
thread through callbacks (:mod:`app.tasks`). Writes of a user message happen before generation
starts, so nothing the user typed is lost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from app.tasks import SerialExecutor

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class DisplayMessage:
    """A stored message plus its place among its siblings (for ‹ 1/2 › navigation)."""

    id: int
    parent_id: int | None
    role: str
    content: str
    state: str
    stats: dict[str, Any] | None
    sources: list[dict[str, Any]] | None
    model: str | None
    error: str | None
    sibling_ids: tuple[int, ...]

    @property
    def sibling_index(self) -> int:
        """0-based position of this message among its siblings."""
        return self.sibling_ids.index(self.id) if self.id in self.sibling_ids else 0

    @property
    def sibling_count(self) -> int:
        return max(len(self.sibling_ids), 1)


def display_thread(store: Any, conversation_id: int) -> list[DisplayMessage]:
    """The current branch of a conversation with sibling information (runs on the history thread)."""
    out: list[DisplayMessage] = []
    for message in store.thread(conversation_id):
        siblings = tuple(s.id for s in store.siblings(message.id))
        out.append(
            DisplayMessage(
                id=message.id,
                parent_id=message.parent_id,
                role=message.role,
                content=message.content,
                state=message.state,
                stats=message.stats,
                sources=message.sources,
                model=message.model,
                error=message.error,
                sibling_ids=siblings or (message.id,),
            )
        )
    return out


class HistoryService:
    """Owns the ``HistoryStore`` and runs every call on one ordered thread.

    Args:
        path: the SQLite file (``paths.history_db``).
        store_factory: builds the store (tests may inject a fake); default ``engine.history.HistoryStore``.
    """

    def __init__(self, path: Path, store_factory: Callable[[Path], Any] | None = None) -> None:
        self.path = path
        self._factory = store_factory
        self._store: Any = None
        self._executor = SerialExecutor("glassbox-history")
        self.open_error: BaseException | None = None

    def _get_store(self) -> Any:
        if self._store is None:
            if self._factory is not None:
                self._store = self._factory(self.path)
            else:
                from engine.history import HistoryStore

                self._store = HistoryStore(self.path)
        return self._store

    def call(
        self,
        fn: Callable[[Any], T],
        on_done: Callable[[T], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> Future[T] | None:
        """Runs ``fn(store)`` on the history thread; callbacks run on the GUI thread.

        After :meth:`close` the call is dropped (a late signal during shutdown) and None returned.
        """
        if self._executor.closed:
            log.warning("history call after close ignored")
            return None
        return self._executor.submit(lambda: fn(self._get_store()), on_done, on_error)

    def close(self, wait: bool = True) -> None:
        """Finishes queued writes (when ``wait``) and closes the store."""

        def close_store() -> None:
            if self._store is not None:
                self._store.close()
                self._store = None

        try:
            self._executor.submit(close_store)
        except RuntimeError:
            return
        self._executor.shutdown(wait=wait)
