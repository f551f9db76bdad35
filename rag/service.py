"""Knowledge bases in a worker process, so that a long-lived client keeps torch, the embedding model
and Chroma out of its own memory (the desktop app idles under 250 MB: ARCHITECTURE.md, "Budgets").

Contract: ARCHITECTURE.md, 'rag.service'.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Protocol

from rag.errors import KnowledgeBaseError, RagError

log = logging.getLogger(__name__)

#: ``KnowledgeBases`` methods a client may call (plus the helpers in :func:`dispatch`).
CALLS = frozenset(
    {
        "create", "get", "list", "documents", "drop", "add", "remove", "refresh", "reindex",
        "pending", "rebuild", "query", "query_many", "foreign", "status", "ensure", "create_unique",
        "searchable",
    }
)  # fmt: skip
#: Calls that take ``progress``, ``cancel`` and ``pause``.
JOB_CALLS = frozenset({"add", "refresh", "reindex", "rebuild"})
PROGRESS_INTERVAL_S = 0.05  # the child sends at most ~20 progress updates a second per job
_FINAL_STATES = ("done", "cancelled", "paused")
_POLL_S = 0.05  # how often a waiting caller looks at its cancel and pause events
_CLOSE_TIMEOUT_S = 10.0

ProgressFn = Callable[[Any], None]


class Service(Protocol):
    """What :class:`KnowledgeService` and :class:`LocalService` both answer."""

    def call(
        self,
        method: str,
        *args: Any,
        progress: ProgressFn | None = None,
        cancel: threading.Event | None = None,
        pause: threading.Event | None = None,
        **kwargs: Any,
    ) -> Any: ...

    def query_many(self, names: Sequence[str], text: str, *, k: int = 5) -> list[Any]: ...

    def close(self) -> None: ...


def unique_name(base: str, taken: set[str]) -> str:
    """``base``, or ``base 2``, ``base 3``, ... whichever is not in ``taken``.

    Args:
        base: the wanted name (stripped; an empty one becomes ``Documents``).
        taken: names already used.
    """
    base = " ".join(base.split())[:80] or "Documents"
    if base not in taken:
        return base
    for n in itertools.count(2):
        candidate = f"{base} {n}"
        if candidate not in taken:
            return candidate
    raise AssertionError("unreachable")  # pragma: no cover


def dispatch(
    kbs: Any,
    method: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """Runs one call on a ``KnowledgeBases``.

    Besides its methods: ``status`` returns ``(recovered, pending)``; ``ensure(name)`` creates
    ``name`` unless it exists and returns it; ``create_unique(base)`` creates a knowledge base
    named ``base`` or ``base 2``, ... and returns it.

    Raises:
        KnowledgeBaseError: an unknown method, or what the method raises.
    """
    if method not in CALLS:
        raise KnowledgeBaseError(f"knowledge service: no call named {method!r}")
    if method == "status":
        return kbs.recovered, kbs.pending()
    if method == "ensure":
        (name,) = args
        try:
            return kbs.get(name)
        except KnowledgeBaseError:
            return kbs.create(name, **kwargs)
    if method == "create_unique":
        (base,) = args
        taken = {summary.info.name for summary in kbs.list()}
        return kbs.create(unique_name(base, taken), **kwargs)
    return getattr(kbs, method)(*args, **kwargs)


class LocalService:
    """The calls of :class:`KnowledgeService`, answered in this process.

    Args:
        factory: opens the ``KnowledgeBases`` (on the first call).
    """

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self._kbs: Any = None
        self._lock = threading.Lock()

    def kbs(self) -> Any:
        """The knowledge bases, opened on first use."""
        with self._lock:
            if self._kbs is None:
                self._kbs = self._factory()
            return self._kbs

    def call(
        self,
        method: str,
        *args: Any,
        progress: ProgressFn | None = None,
        cancel: threading.Event | None = None,
        pause: threading.Event | None = None,
        **kwargs: Any,
    ) -> Any:
        """Runs ``method`` on the knowledge bases (see :func:`dispatch`)."""
        if method in JOB_CALLS:
            kwargs.update(progress=progress, cancel=cancel, pause=pause)
        return dispatch(self.kbs(), method, args, kwargs)

    def query_many(self, names: Sequence[str], text: str, *, k: int = 5) -> list[Any]:
        """``KnowledgeBases.query_many`` (a ``rag.knowledge.Searcher``)."""
        return list(self.call("query_many", list(names), text, k=k))

    def close(self) -> None:
        """Closes the knowledge bases if they were opened."""
        with self._lock:
            kbs, self._kbs = self._kbs, None
        if kbs is not None:
            kbs.close()


@dataclass
class _Pending:
    conn: Connection
    progress: ProgressFn | None
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


class KnowledgeService:
    """Knowledge bases in a child process (see the module docstring).

    Args:
        root: the knowledge folder.
        embedder_path: the embedding model folder of new knowledge bases (None: the bundled one).
        chroma_url: a Chroma server to keep the vectors on.
        idle_stop_s: stop the child after this many seconds with no call waiting (None or 0:
            keep it until :meth:`close`). It may be changed while the service runs.

    The child is started on the first call and stopped by :meth:`close` (or when idle); it also
    exits when this process goes away (its end of the pipe closes).
    """

    def __init__(
        self,
        root: Path,
        embedder_path: Path | None = None,
        chroma_url: str | None = None,
        *,
        idle_stop_s: float | None = None,
    ) -> None:
        self.root = root
        self.embedder_path = embedder_path
        self.chroma_url = chroma_url
        self._ctx = multiprocessing.get_context("spawn")
        # The child's lifetime: held while one starts or an idle one stops, so that a call never
        # starts a second child while the first still holds the knowledge folder's lock.
        self._life = threading.Lock()
        self._lock = threading.Lock()  # guards the child, the pending table and the idle timer
        self._send_lock = threading.Lock()
        self._conn: Connection | None = None
        self._proc: Any = None
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count(1)
        self._closed = False
        self.starts = 0  # how many children were started (a test sees a restart)
        self.idle_stops = 0  # how many were stopped for being idle
        self.idle_stop_s = idle_stop_s
        self._last_done = time.monotonic()
        self._idle_timer: threading.Timer | None = None
        self._retiring: Any = None  # the child an idle stop is ending

    @property
    def pid(self) -> int | None:
        """The running child's process id, or None."""
        proc = self._proc
        return int(proc.pid) if proc is not None and proc.is_alive() else None

    def _child(self) -> Connection:
        with self._life, self._lock:
            if self._closed:
                raise KnowledgeBaseError(f"{self.root}: the knowledge service is closed")
            if self._conn is not None and self._proc is not None and self._proc.is_alive():
                return self._conn
            parent, child = self._ctx.Pipe(duplex=True)
            proc = self._ctx.Process(
                target=serve,
                args=(child, str(self.root), _str(self.embedder_path), self.chroma_url),
                name="glassbox-knowledge",
                daemon=False,  # it starts parsing children; it exits when our end of the pipe closes
            )
            try:
                proc.start()
            except OSError as exc:
                raise KnowledgeBaseError(f"{self.root}: cannot start the knowledge process ({exc})") from exc
            finally:
                child.close()
            self._conn, self._proc = parent, proc
            self.starts += 1
            threading.Thread(
                target=self._read, args=(parent, proc), name="glassbox-knowledge-reader", daemon=True
            ).start()
            return parent

    def _send(self, conn: Connection, message: tuple[Any, ...]) -> None:
        try:
            with self._send_lock:
                conn.send(message)
        except (OSError, EOFError, ValueError) as exc:
            raise KnowledgeBaseError(f"{self.root}: the knowledge process is gone ({exc})") from exc

    def _read(self, conn: Connection, proc: Any) -> None:
        """The reader thread: hands replies and progress to the waiting callers."""
        while True:
            try:
                kind, call_id, payload = conn.recv()
            except (EOFError, OSError):
                break
            # A reply that cannot be unpickled here is the child's bug; fail that call, not the reader.
            except (pickle.UnpicklingError, AttributeError, ImportError, TypeError) as exc:
                log.warning("knowledge process: unreadable reply (%s)", exc)
                continue
            with self._lock:
                pending = self._pending.get(call_id)
            if pending is None:
                continue
            if kind == "progress":
                if pending.progress is not None:
                    try:
                        pending.progress(payload)
                    # A caller's progress function failing must not stop the replies of others.
                    except Exception as exc:  # noqa: BLE001
                        log.warning("knowledge progress callback failed: %s", exc)
                continue
            if kind == "result":
                pending.result = payload
            else:
                pending.error = payload
            pending.done.set()
        # close() or an idle stop joins a child it ends: two threads waiting on one child race for
        # its status, and the loser would take the reaped child for a live one.
        if not self._closed and proc is not self._retiring:
            proc.join(timeout=2)
        code = proc.exitcode
        with self._lock:
            if self._conn is conn:
                self._conn, self._proc = None, None
            orphans = [p for p in self._pending.values() if p.conn is conn and not p.done.is_set()]
        how = "was closed" if self._closed else f"stopped ({_exit_text(code)})"
        for pending in orphans:
            pending.error = KnowledgeBaseError(f"{self.root}: the knowledge process {how}; try again")
            pending.done.set()
        conn.close()

    def call(
        self,
        method: str,
        *args: Any,
        progress: ProgressFn | None = None,
        cancel: threading.Event | None = None,
        pause: threading.Event | None = None,
        **kwargs: Any,
    ) -> Any:
        """Runs ``method`` in the child and returns its result (blocks the calling thread).

        Args:
            method: one of :data:`CALLS`.
            *args: its positional arguments (picklable).
            progress: for job calls, called with each ``IngestProgress`` (on the reader thread).
            cancel: set it to cancel a job call.
            pause: set to pause a job call, cleared to resume.
            **kwargs: its keyword arguments (picklable).

        Raises:
            KnowledgeBaseError: what the call raised, or the child stopped.
        """
        if method not in CALLS:
            raise KnowledgeBaseError(f"knowledge service: no call named {method!r}")
        conn = self._child()
        call_id = next(self._ids)
        pending = _Pending(conn, progress)
        with self._lock:
            self._pending[call_id] = pending
        try:
            self._send(conn, ("call", call_id, method, args, kwargs))
            cancelled = paused = False
            while not pending.done.wait(_POLL_S if (cancel or pause) else None):
                if cancel is not None and cancel.is_set() and not cancelled:
                    cancelled = True
                    self._send(conn, ("cancel", call_id, None))
                now_paused = pause is not None and pause.is_set()
                if now_paused != paused:
                    paused = now_paused
                    self._send(conn, ("pause", call_id, paused))
        finally:
            with self._lock:
                self._pending.pop(call_id, None)
                idle = not self._pending
                self._last_done = time.monotonic()
            if idle:
                self._arm_idle_stop()
        if pending.error is not None:
            raise pending.error
        return pending.result

    # ------------------------------------------------------------------ stopping when idle
    def _arm_idle_stop(self) -> None:
        """(Re)starts the timer that stops an idle child (the last waiting call just returned)."""
        delay = self.idle_stop_s
        if not delay or delay <= 0 or self._closed:
            return
        timer = threading.Timer(delay, self._stop_if_idle)
        timer.daemon = True
        timer.name = "glassbox-knowledge-idle"
        with self._lock:
            old, self._idle_timer = self._idle_timer, timer
        if old is not None:
            old.cancel()
        timer.start()

    def _stop_if_idle(self) -> None:
        """Stops the child if no call is waiting and none returned for ``idle_stop_s``."""
        delay = self.idle_stop_s
        if not delay or delay <= 0:
            return
        with self._life:
            with self._lock:
                quiet = time.monotonic() - self._last_done
                if self._closed or self._pending or self._proc is None or quiet < delay * 0.99:
                    return
                conn, proc = self._conn, self._proc
                self._retiring = proc
            log.info("the knowledge process was idle for %.0f s; stopping it", quiet)
            self._stop_child(conn, proc)
            with self._lock:
                if self._proc is proc:
                    self._conn, self._proc = None, None
                self._retiring = None
                self.idle_stops += 1

    def _stop_child(self, conn: Connection | None, proc: Any) -> None:
        """Asks the child to finish and waits for it; kills it if it does not exit in time."""
        if conn is None or proc is None:
            return
        try:
            with self._send_lock:
                conn.send(("close", 0, None))
        except (OSError, EOFError, ValueError):
            pass
        proc.join(_CLOSE_TIMEOUT_S)
        if proc.is_alive():
            log.warning("the knowledge process did not stop in %.0f s; killing it", _CLOSE_TIMEOUT_S)
            proc.kill()
            proc.join(2)

    def query_many(self, names: Sequence[str], text: str, *, k: int = 5) -> list[Any]:
        """``KnowledgeBases.query_many`` in the child (a ``rag.knowledge.Searcher``)."""
        return list(self.call("query_many", list(names), text, k=k))

    def close(self) -> None:
        """Asks the child to finish (running jobs are cancelled) and waits for it; kills it if it
        does not exit in time."""
        with self._lock:
            self._closed = True
            conn, proc = self._conn, self._proc
            timer, self._idle_timer = self._idle_timer, None
        if timer is not None:
            timer.cancel()
        with self._life:  # an idle stop under way finishes first
            self._stop_child(conn, proc)

    def __enter__(self) -> KnowledgeService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _str(path: Path | None) -> str | None:
    return None if path is None else str(path)


def _exit_text(code: int | None) -> str:
    if code is None:
        return "no exit code"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _portable(exc: BaseException) -> BaseException:
    """``exc`` itself when it is one of ours and survives pickling, else one line saying what it was."""
    if isinstance(exc, RagError):
        try:
            pickle.loads(pickle.dumps(exc))
            return exc
        except Exception:  # noqa: BLE001 - e.g. an __init__ with other arguments than args
            pass
    text = " ".join(str(exc).split()) or type(exc).__name__
    return KnowledgeBaseError(text[:500] if isinstance(exc, RagError) else f"{type(exc).__name__}: {text[:480]}")


@dataclass
class _Job:
    cancel: threading.Event = field(default_factory=threading.Event)
    pause: threading.Event = field(default_factory=threading.Event)


class _Child:
    """The child's side: one ``KnowledgeBases``, one thread per call."""

    def __init__(self, conn: Connection, root: str, embedder_path: str | None, chroma_url: str | None) -> None:
        self.conn = conn
        self.root = Path(root)
        self.embedder_path = Path(embedder_path) if embedder_path else None
        self.chroma_url = chroma_url
        self._kbs: Any = None
        self._open_lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._jobs: dict[int, _Job] = {}
        self._threads: list[threading.Thread] = []
        # Short calls (queries, listings) share a few threads; each job gets its own, so a long
        # ingest never holds up a query.
        self._short = ThreadPoolExecutor(max_workers=4, thread_name_prefix="glassbox-kb-call")

    def kbs(self) -> Any:
        with self._open_lock:
            if self._kbs is None:
                # lazy: start-up (+156 ms: numpy)
                from rag.knowledge import KnowledgeBases

                self._kbs = KnowledgeBases(self.root, self.embedder_path, self.chroma_url)
            return self._kbs

    def send(self, message: tuple[Any, ...]) -> None:
        try:
            with self._send_lock:
                self.conn.send(message)
        except (OSError, EOFError, ValueError):
            pass  # the parent is gone; the main loop sees it and stops

    def run(self) -> None:
        while True:
            try:
                kind, call_id, *rest = self.conn.recv()
            except (EOFError, OSError):
                break
            if kind == "close":
                break
            if kind == "cancel":
                job = self._jobs.get(call_id)
                if job is not None:
                    job.pause.clear()
                    job.cancel.set()
            elif kind == "pause":
                job = self._jobs.get(call_id)
                if job is not None:
                    (job.pause.set if rest[0] else job.pause.clear)()
            elif kind == "call":
                method, args, kwargs = rest
                if method not in JOB_CALLS:
                    self._short.submit(self._answer, call_id, method, args, kwargs)
                    continue
                self._jobs[call_id] = _Job()  # before its thread starts, so that an early cancel finds it
                thread = threading.Thread(
                    target=self._answer, args=(call_id, method, args, kwargs), name=f"glassbox-kb-{method}"
                )
                self._threads = [t for t in self._threads if t.is_alive()]
                self._threads.append(thread)
                thread.start()
        self.stop()

    def _answer(self, call_id: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            job = self._jobs.get(call_id)
            if job is not None:
                kwargs = {**kwargs, "progress": self._progress(call_id), "cancel": job.cancel, "pause": job.pause}
            result = dispatch(self.kbs(), method, tuple(args), dict(kwargs))
            # A result that cannot be pickled raises here, before anything is written to the pipe.
            self.send(("result", call_id, result))
        # The boundary of the process: whatever a call raised goes back to its caller as one line.
        except BaseException as exc:  # noqa: BLE001
            self.send(("error", call_id, _portable(exc)))
        finally:
            self._jobs.pop(call_id, None)

    def _progress(self, call_id: int) -> ProgressFn:
        last = [0.0]

        def progress(update: Any) -> None:
            now = time.monotonic()
            if now - last[0] >= PROGRESS_INTERVAL_S or getattr(update, "state", None) in _FINAL_STATES:
                last[0] = now
                self.send(("progress", call_id, update))

        return progress

    def stop(self) -> None:
        for job in list(self._jobs.values()):
            job.pause.clear()
            job.cancel.set()
        for thread in self._threads:
            thread.join(_CLOSE_TIMEOUT_S / 2)
        self._short.shutdown(wait=True)
        if self._kbs is not None:
            try:
                self._kbs.close()
            except Exception as exc:  # noqa: BLE001 - closing must not raise at exit
                log.warning("closing the knowledge bases failed: %s", exc)


def serve(conn: Connection, root: str, embedder_path: str | None, chroma_url: str | None) -> None:
    """The child process: answers calls until told to close or the parent goes away.

    Args:
        conn: its end of the pipe.
        root: the knowledge folder.
        embedder_path: the default embedding model folder, or None.
        chroma_url: the Chroma server, or None.
    """
    # Ctrl+C in a terminal reaches the whole process group; the parent decides when we stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    child = _Child(conn, root, embedder_path, chroma_url)
    started = time.monotonic()
    try:
        child.run()
    finally:
        conn.close()
    log.debug("knowledge process done after %.1f s", time.monotonic() - started)
    # Everything is committed and closed (the registry, Chroma, the parser children): skip the
    # interpreter's teardown of torch and chromadb, which took seconds the app waited for.
    logging.shutdown()
    os._exit(0)


__all__ = ["CALLS", "JOB_CALLS", "KnowledgeService", "LocalService", "Service", "dispatch", "serve", "unique_name"]
