"""Chat history off the GUI thread: one ordered worker thread in front of ``engine.history``.

Every write (a sent message, a streaming checkpoint, a finished reply) and every read (a thread,
a search) runs on the ``glassbox-history`` thread in submission order; results come back to the GUI
thread through callbacks (:mod:`app.gui.tasks`). Writes of a user message happen before generation
starts, so nothing the user typed is lost.

Contract: ARCHITECTURE.md, 'app.gui.workers.history_service'.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from app.gui.tasks import SerialExecutor, call_on_gui_thread
from app.gui.workers.history_disk import can_succeed_later, explain, is_unreadable, set_aside
from engine.errors import HistoryError

if TYPE_CHECKING:
    from engine.history import HistoryStore

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class _Unsaved:
    """A write kept until it is saved (see :meth:`HistoryService.keep`)."""

    fn: Callable[[HistoryStore], object]
    on_done: Callable[[Any], None] | None  # takes what ``fn`` returned
    on_error: Callable[[BaseException], None] | None
    size_hint: int


class HistoryService:
    """Owns the ``HistoryStore`` and runs every call on one ordered thread.

    Args:
        path: the SQLite file (``paths.history_db``).
        store_factory: builds the store (tests may inject a fake); default ``engine.history.HistoryStore``.
    """

    def __init__(self, path: Path, store_factory: Callable[[Path], object] | None = None) -> None:
        self.path = path
        self._factory = store_factory
        self._store: HistoryStore | None = None
        self._executor = SerialExecutor("glassbox-history")
        self.open_error: BaseException | None = None
        self._unsaved: dict[Hashable, _Unsaved] = {}  # touched on the history thread only
        self._unsaved_count = 0

    def _get_store(self) -> HistoryStore:
        if self._store is None:
            if self._factory is not None:
                # A test's stand-in: it answers the calls its test makes, as a HistoryStore would.
                self._store = cast("HistoryStore", self._factory(self.path))
            else:
                # lazy: start-up (+17 ms)
                from engine.history import HistoryStore

                self._store = HistoryStore(self.path)
        return self._store

    @property
    def unsaved(self) -> int:
        """How many kept writes (:meth:`keep`) are not saved yet."""
        return self._unsaved_count

    def call(
        self,
        fn: Callable[[HistoryStore], T],
        on_done: Callable[[T], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
        *,
        size_hint: int = 0,
    ) -> Future[T] | None:
        """Runs ``fn(store)`` on the history thread; callbacks run on the GUI thread.

        Kept writes not saved yet are tried first, so the history stays in order. A failure of a
        full disk reaches ``on_error`` as :class:`~app.gui.workers.history_disk.HistoryDiskFull`;
        ``size_hint`` (the bytes of text the call writes) goes into how much space it says is needed.

        After :meth:`close` the call is dropped (a late signal during shutdown) and None returned.
        """
        if self._executor.closed:
            log.warning("history call after close ignored")
            return None

        def job() -> T:
            try:
                store = self._get_store()
                if self._unsaved:
                    self._retry(store)
                return fn(store)
            except Exception as exc:
                error = explain(exc, self.path, size_hint)
                if error is exc:
                    raise
                raise error from exc

        return self._executor.submit(job, on_done, on_error)

    def keep(
        self,
        key: Hashable,
        fn: Callable[[HistoryStore], T],
        on_done: Callable[[T], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
        *,
        size_hint: int = 0,
    ) -> Future[None] | None:
        """Runs a write that must not be lost, such as a reply.

        Until ``fn`` succeeds it stays in memory and is tried again, in order, before every later
        call, by :meth:`retry_unsaved` and at :meth:`close`. A newer write under the same ``key``
        replaces one not saved yet (the final save of a reply replaces its last checkpoint), so
        ``fn`` must write the whole state it stands for.

        Args:
            key: what the write is about, e.g. ``("reply", message_id)``.
            fn: the write, ``fn(store)``; may run several times until it succeeds.
            on_done: called on the GUI thread once it is saved, maybe much later.
            on_error: called on the GUI thread when this attempt failed (it is kept), or when the
                write can never succeed (then it is dropped).
            size_hint: the bytes of text it writes (for how much space is needed).
        """
        if self._executor.closed:
            log.warning("history write after close ignored")
            return None
        entry = _Unsaved(fn, on_done, on_error, size_hint)

        def job() -> None:
            self._unsaved[key] = entry
            self._unsaved_count = len(self._unsaved)
            try:
                store = self._get_store()
            except Exception as exc:
                error = explain(exc, self.path, size_hint)
                if error is exc:
                    raise
                raise error from exc
            failure = self._retry(store, report=entry)
            if failure is not None:
                raise failure

        return self._executor.submit(job, None, on_error)

    def retry_unsaved(self, on_done: Callable[[int], None] | None = None) -> None:
        """Tries the kept writes again; ``on_done`` gets how many are still not saved."""
        if self._executor.closed or not self._unsaved_count:
            if on_done is not None:
                on_done(self._unsaved_count)
            return

        def job() -> int:
            try:
                self._retry(self._get_store())
            except Exception as exc:  # noqa: BLE001 - no store yet: the writes stay kept
                log.info("history: still cannot save (%s)", exc)
            return len(self._unsaved)

        def failed(_exc: BaseException) -> None:
            if on_done is not None:
                on_done(self._unsaved_count)

        self._executor.submit(job, on_done, failed)

    def _retry(self, store: HistoryStore, report: _Unsaved | None = None) -> BaseException | None:
        """Tries every kept write, oldest first (history thread).

        One the disk refuses (full, an I/O error, busy) stays kept; one that can never succeed (its
        message is gone) is dropped and its ``on_error`` told.

        Returns:
            The error for ``report`` when it is not saved (None when it is, or none was asked for).
        """
        failure: BaseException | None = None
        for key, entry in list(self._unsaved.items()):
            try:
                result = entry.fn(store)
            except Exception as exc:  # noqa: BLE001 - every failure is kept or reported, never lost
                error = explain(exc, self.path, entry.size_hint)
                if entry is report:
                    failure = error
                if can_succeed_later(exc):
                    continue
                del self._unsaved[key]
                log.error("history: a kept write failed for good: %s", error)
                if entry is not report and entry.on_error is not None:
                    call_on_gui_thread(functools.partial(entry.on_error, error))
                continue
            del self._unsaved[key]
            if entry.on_done is not None:
                call_on_gui_thread(functools.partial(entry.on_done, result))
        self._unsaved_count = len(self._unsaved)
        return failure

    def start_fresh(
        self,
        on_done: Callable[[tuple[Path, Path | None]], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        """Moves an unreadable history file aside, untouched, and starts a new one in its place.

        ``on_done`` gets ``(new history, where the old file went)``; the second is None when the
        file turned out readable after all (then nothing was moved).
        """

        def job() -> tuple[Path, Path | None]:
            if self._store is not None:
                return self.path, None
            try:
                self._get_store()
                return self.path, None  # readable after all: keep it
            except HistoryError as exc:
                if not is_unreadable(exc):
                    raise
            moved = set_aside(self.path)
            self._get_store()
            return self.path, moved

        self._executor.submit(job, on_done, on_error)

    def close(self, wait: bool = True) -> None:
        """Finishes queued writes (when ``wait``), tries the kept ones a last time and closes the store."""

        def close_store() -> None:
            if self._unsaved:
                try:
                    self._retry(self._get_store())
                except Exception as exc:  # noqa: BLE001 - closing goes on; what is lost is logged
                    log.error("history: cannot save at close: %s", exc)
                if self._unsaved:
                    log.error("history: %d write(s) could not be saved before closing", len(self._unsaved))
            if self._store is not None:
                self._store.close()
                self._store = None

        try:
            self._executor.submit(close_store)
        except RuntimeError:
            return
        self._executor.shutdown(wait=wait)
