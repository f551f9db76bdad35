"""Parse untrusted documents in a killable child process with time, size and memory limits.

A hostile PDF can hang a parser, exhaust memory or crash native code. :class:`ParserPool` keeps
one spawned child (``multiprocessing`` spawn context) that runs :func:`rag.loaders.load_document`
for each file; the parent waits with a timeout and kills the child when it is exceeded. Every way
a parse can fail ends as a one-line :class:`~rag.errors.DocumentError` for that file, and the
next file gets a fresh child, so a batch always goes on.

Contract: ARCHITECTURE.md, 'Walk 2: a dropped file'.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from rag.errors import DocumentError
from rag.loaders import check_size, load_document
from rag.sections import ParsedDocument

log = logging.getLogger(__name__)

MB = 2**20
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MAX_FILE_BYTES = 512 * MB
DEFAULT_MAX_MEMORY_BYTES = 2 * 2**30
DEFAULT_MAX_CHARS = 20_000_000
_POLL_S = 0.1
_STARTUP_TIMEOUT_S = 60.0


class Loader(Protocol):
    """The parse function run in the child: :func:`rag.loaders.load_document` or a test double.

    It must be a module-level function, because the spawned child imports it by name.
    """

    def __call__(self, path: Path, *, max_chars: int) -> ParsedDocument: ...


class _StartError(Exception):
    """The child process did not come up."""


class ParseCancelled(DocumentError):
    """The caller's cancel event was set while the file was being parsed; the child was killed."""


def _limit_memory(max_memory_bytes: int) -> None:
    """Cap the child's address space where the OS supports it (Linux; not Windows, not enforced on macOS)."""
    try:
        # lazy: POSIX only
        import resource
    except ImportError:
        return
    try:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        soft = max_memory_bytes if hard == resource.RLIM_INFINITY else min(max_memory_bytes, hard)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    except (ValueError, OSError) as exc:
        log.warning("could not limit the parser's memory: %s", exc)


def _child_main(conn: Connection, loader: Loader, max_memory_bytes: int) -> None:
    """Serve parse requests until the pipe closes. Replies are ``("ok", doc)`` or ``("error", reason)``."""
    _limit_memory(max_memory_bytes)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C is the parent's to handle; it stops us
    logging.getLogger("pypdf").setLevel(logging.ERROR)  # malformed-PDF chatter; failures come back as reasons
    conn.send(("ready", None))
    while True:
        try:
            path, max_chars = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            return
        reply: tuple[str, Any]
        try:
            reply = ("ok", loader(Path(path), max_chars=max_chars))
        except DocumentError as exc:
            reply = ("error", exc.reason)
        except MemoryError:
            reply = ("memory", "skipped: too large to parse (memory limit reached)")
        except RecursionError:
            reply = ("error", "skipped: could not be parsed (structure nested too deeply)")
        except Exception as exc:  # noqa: BLE001 - a parser bug on one file must not end the batch
            reply = ("error", f"skipped: could not be parsed ({type(exc).__name__}: {exc})".split("\n")[0])
        try:
            conn.send(reply)
        except MemoryError:
            conn.send(("memory", "skipped: too large to parse (memory limit reached)"))
        if reply[0] == "memory":
            return  # the heap may be fragmented or half-built objects linger: start clean next time


class ParserPool:
    """One reusable parser child process (spawning costs about 0.5 s), restarted after a crash or timeout.

    Calls from several threads are serialised by a lock (one child parses one file at a time);
    :meth:`close` may be called from any thread. Use it as a context manager, or call :meth:`close`::

        with ParserPool() as pool:
            for path in paths:
                try:
                    doc = pool.parse(path)
                except DocumentError as exc:
                    record_skipped(path, exc.reason)

    Args:
        max_file_bytes: Files larger than this are skipped before any parsing.
        max_memory_bytes: Address-space limit of the child (RLIMIT_AS, where available).
        max_chars: The most characters of text per document.
        loader: The function the child runs; a module-level function (tests inject slow ones).
    """

    def __init__(
        self,
        *,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        max_memory_bytes: int = DEFAULT_MAX_MEMORY_BYTES,
        max_chars: int = DEFAULT_MAX_CHARS,
        loader: Loader = load_document,
    ) -> None:
        self.max_file_bytes = max_file_bytes
        self.max_memory_bytes = max_memory_bytes
        self.max_chars = max_chars
        self._loader = loader
        self._ctx = multiprocessing.get_context("spawn")
        self._process: multiprocessing.process.BaseProcess | None = None
        self._conn: Connection | None = None
        self._lock = threading.Lock()
        self._closing = threading.Event()

    def __enter__(self) -> ParserPool:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        """The child's process id, or None when no child is running."""
        return self._process.pid if self._process is not None and self._process.is_alive() else None

    def _ensure_child(self) -> Connection:
        if self._process is not None and self._process.is_alive() and self._conn is not None:
            return self._conn
        self._stop_child()
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(
            target=_child_main,
            args=(child_conn, self._loader, self.max_memory_bytes),
            name="glassbox-parser",
            daemon=True,
        )
        process.start()
        child_conn.close()
        self._process, self._conn = process, parent_conn
        # Handshake, so that a child that cannot even start (e.g. the parent's __main__ cannot be
        # re-imported under spawn) is told apart from a parser crash, and start-up time is not
        # charged to the first file's timeout.
        try:
            if not parent_conn.poll(_STARTUP_TIMEOUT_S):
                raise _StartError(f"no answer within {_STARTUP_TIMEOUT_S:g} s")
            parent_conn.recv()
        except (EOFError, OSError) as exc:
            code = self._stop_child(grace_s=2.0)
            raise _StartError(_exit_text(code)) from exc
        except _StartError:
            self._stop_child()
            raise
        return parent_conn

    def _stop_child(self, grace_s: float = 0.0) -> int | None:
        """Kill the child (if any), after ``grace_s`` for it to exit by itself; return its exit code."""
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if conn is not None:
            conn.close()
        if process is None:
            return None
        if grace_s:
            process.join(grace_s)
        if process.is_alive():
            process.kill()
        process.join(5)
        code = process.exitcode
        if code is not None:
            process.close()
        return code

    def parse(
        self, path: Path, timeout_s: float = DEFAULT_TIMEOUT_S, *, cancel: threading.Event | None = None
    ) -> ParsedDocument:
        """Parse one file in the child.

        Args:
            path: The document.
            timeout_s: Wall-clock limit; past it the child is killed.
            cancel: If set while parsing, the child is killed and :class:`ParseCancelled` raised
                (checked every 0.1 s).

        Returns:
            The parsed document.

        Raises:
            DocumentError: The file was skipped (reason starts with ``"skipped: "``).
            ParseCancelled: ``cancel`` was set, or :meth:`close` was called meanwhile.
        """
        path = Path(path)
        check_size(path, self.max_file_bytes)
        with self._lock:
            try:
                conn = self._ensure_child()
                try:
                    conn.send((str(path), self.max_chars))
                except (OSError, EOFError) as exc:  # the child died between files: one retry with a new one
                    log.info("parser child gone (%s); restarting", exc)
                    self._stop_child()
                    conn = self._ensure_child()
                    conn.send((str(path), self.max_chars))
            except _StartError as exc:
                if self._closing.is_set():
                    raise ParseCancelled(path, "cancelled: the parser was closed") from exc
                raise DocumentError(path, f"skipped: the parser process could not start ({exc})") from exc
            deadline = time.monotonic() + timeout_s
            while not conn.poll(min(_POLL_S, max(0.0, deadline - time.monotonic()))):
                if (cancel is not None and cancel.is_set()) or self._closing.is_set():
                    self._stop_child()
                    raise ParseCancelled(path, "cancelled")
                if time.monotonic() >= deadline:
                    self._stop_child()
                    raise DocumentError(path, f"skipped: took longer than {timeout_s:g} s to parse")
            try:
                status, payload = conn.recv()
            except (EOFError, OSError) as exc:
                if self._closing.is_set():
                    self._stop_child()
                    raise ParseCancelled(path, "cancelled: the parser was closed") from exc
                code = self._stop_child(grace_s=2.0)
                raise DocumentError(path, f"skipped: the parser crashed ({_exit_text(code)})") from exc
            if status == "memory":
                self._stop_child()
            if status == "ok":
                doc: ParsedDocument = payload
                return doc
            raise DocumentError(path, str(payload))

    def close(self) -> None:
        """Stop the child process, at once even if another thread is parsing (it gets :class:`ParseCancelled`).

        The pool can still be used afterwards; the next parse starts a new child.
        """
        self._closing.set()
        process = self._process
        if process is not None and process.is_alive():
            process.kill()  # wakes a parse in flight on another thread without waiting for its lock
        with self._lock:
            self._stop_child()
            self._closing.clear()


def _exit_text(exit_code: int | None) -> str:
    """``"signal 11"`` for a process killed by a signal, else ``"exit code N"``."""
    if exit_code is not None and exit_code < 0:
        return f"signal {-exit_code}"
    return f"exit code {exit_code}"


def parse_document(
    path: Path,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    max_memory_bytes: int = DEFAULT_MAX_MEMORY_BYTES,
    max_chars: int = DEFAULT_MAX_CHARS,
    loader: Loader = load_document,
) -> ParsedDocument:
    """Parse one untrusted document in a fresh child process (use :class:`ParserPool` for many files).

    Args:
        path: The document.
        timeout_s: Wall-clock limit; past it the child is killed.
        max_file_bytes: Files larger than this are skipped before parsing.
        max_memory_bytes: The child's address-space limit (where the OS supports it).
        max_chars: The most characters of text accepted.
        loader: The function the child runs (tests inject slow or crashing ones).

    Returns:
        The parsed document.

    Raises:
        DocumentError: The file was skipped; ``str()`` is ``"<path>: skipped: <reason>"``, e.g.
            ``"skipped: took longer than 60 s to parse"``, ``"skipped: the parser crashed (signal 11)"``,
            ``"skipped: too large to parse (memory limit reached)"``.
    """
    with ParserPool(
        max_file_bytes=max_file_bytes, max_memory_bytes=max_memory_bytes, max_chars=max_chars, loader=loader
    ) as pool:
        return pool.parse(path, timeout_s)
