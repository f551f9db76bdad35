"""Short background jobs with callbacks on the GUI thread (CONTRIBUTING.md rule 8).

``run_in_background(fn, on_done, on_error)`` runs ``fn`` on a small shared thread pool and calls
``on_done(result)`` or ``on_error(exc)`` back on the GUI thread. ``SerialExecutor`` is the same with
one thread, for jobs that must run in order (history writes).

The marshalling goes through a ``QObject`` living on the GUI thread: a signal emitted from the pool
thread is delivered as a queued call, so callbacks never run on the pool.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from PySide6.QtCore import QCoreApplication, QObject, Qt, Signal, Slot

from engine.errors import EngineError

if TYPE_CHECKING:
    from concurrent.futures import Future

T = TypeVar("T")
log = logging.getLogger(__name__)


class _Dispatcher(QObject):
    """Lives on the GUI thread; runs callables posted from other threads.

    Signals:
        posted(object): a zero-argument callable to run on the GUI thread.
    """

    posted = Signal(object)

    def __init__(self) -> None:
        super().__init__()
        self.posted.connect(self._on_self_posted, Qt.ConnectionType.QueuedConnection)

    @Slot(object)
    def _on_self_posted(self, call: Callable[[], None]) -> None:
        try:
            call()
        except Exception:  # a callback bug must not kill the event loop
            log.exception("background callback failed")


_dispatcher: _Dispatcher | None = None
_dispatcher_lock = threading.Lock()


def _get_dispatcher() -> _Dispatcher:
    global _dispatcher
    with _dispatcher_lock:
        if _dispatcher is None:
            app = QCoreApplication.instance()
            if app is None:
                raise RuntimeError("run_in_background needs a QApplication")
            _dispatcher = _Dispatcher()
            _dispatcher.moveToThread(app.thread())
            app.destroyed.connect(_forget_dispatcher)
        return _dispatcher


def _forget_dispatcher() -> None:
    global _dispatcher
    _dispatcher = None


def call_on_gui_thread(call: Callable[[], None]) -> None:
    """Queues ``call`` to run on the GUI thread (safe from any thread)."""
    _get_dispatcher().posted.emit(call)


class SerialExecutor:
    """Runs jobs one at a time, in submission order, on a named thread.

    Args:
        name: the thread name (shows up in debuggers and logs).
        workers: number of threads (1 keeps jobs ordered).
    """

    def __init__(self, name: str, workers: int = 1) -> None:
        from concurrent.futures import ThreadPoolExecutor  # lazy: start-up (the first frame starts no job)

        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._closed = False

    def submit(
        self,
        fn: Callable[[], T],
        on_done: Callable[[T], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> Future[T]:
        """Runs ``fn`` in the pool; the callbacks run on the GUI thread.

        Args:
            fn: the job; must not touch widgets.
            on_done: called with the result.
            on_error: called with the exception (logged when absent).

        Returns:
            The future (for tests and shutdown; GUI code should use the callbacks).
        """
        dispatcher = _get_dispatcher()
        if self._closed:
            raise RuntimeError("executor is shut down")

        def finished(future: Future[T]) -> None:
            exc = future.exception()
            if exc is not None:
                if on_error is not None:
                    dispatcher.posted.emit(lambda: on_error(exc))
                else:
                    log.error("background job failed: %s", exc, exc_info=exc)
            elif on_done is not None:
                result = future.result()
                dispatcher.posted.emit(lambda: on_done(result))

        future = self._pool.submit(fn)
        future.add_done_callback(finished)
        return future

    @property
    def closed(self) -> bool:
        return self._closed

    def shutdown(self, wait: bool = True) -> None:
        """Stops accepting jobs; waits for the running ones when ``wait``."""
        self._closed = True
        self._pool.shutdown(wait=wait, cancel_futures=not wait)


_shared: SerialExecutor | None = None


def run_in_background(
    fn: Callable[[], T],
    on_done: Callable[[T], None] | None = None,
    on_error: Callable[[BaseException], None] | None = None,
) -> Future[T]:
    """Runs a short independent job (a scan, a search, a hash) off the GUI thread.

    Args:
        fn: the job; must not touch widgets.
        on_done: called on the GUI thread with the result.
        on_error: called on the GUI thread with the exception.

    Returns:
        The job's future.
    """
    global _shared
    if _shared is None or _shared._closed:
        _shared = SerialExecutor("glassbox-bg", workers=2)
    return _shared.submit(fn, on_done, on_error)


def shutdown_background(wait: bool = True) -> None:
    """Shuts the shared pool down (at exit)."""
    global _shared
    if _shared is not None:
        _shared.shutdown(wait=wait)
        _shared = None


def describe_error(exc: BaseException) -> str:
    """One line for an error dialog or status bar: the typed error's message, else type + text."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""

    if isinstance(exc, EngineError):
        return first or type(exc).__name__
    # lazy: start-up (+2 ms)
    from rag.errors import RagError

    if isinstance(exc, RagError):
        return first or type(exc).__name__
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.filename}: {exc.strerror or first}"
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
