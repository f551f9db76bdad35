"""The chat history's database file: opened safely, kept private, migrated, guarded by one lock.

Owns :class:`HistoryDatabase`, the part of :class:`engine.history.HistoryStore` that is about the
file rather than the chats: refusing a file that is not SQLite or was written by a newer Glassbox
(before anything is written), creating it owner-only, WAL with ``synchronous=FULL``, running the
pending migrations of :data:`engine.history_schema.MIGRATIONS` after a backup, the one lock every
query holds, and turning SQLite's errors into one-line :class:`~engine.errors.HistoryError`.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Final, Self, TypeVar

from engine.atomic import PRIVATE_FOLDER_MODE, create_private_file, make_private
from engine.errors import HistoryError
from engine.history_schema import MIGRATIONS

__all__ = ["SIDE_FILES", "SQLITE_MAGIC", "HistoryDatabase"]

SQLITE_MAGIC: Final = b"SQLite format 3\x00"
SIDE_FILES: Final = ("-wal", "-shm", "-journal")
"""Suffixes of the files SQLite keeps beside a database (they hold its data too)."""

_T = TypeVar("_T")


class HistoryDatabase:
    """The chat history's database file; :class:`engine.history.HistoryStore` adds the chats.

    Args:
        path: the database file (``Paths.history_db``); created with its folder if missing.

    Raises:
        HistoryError: the file is not an SQLite database, is corrupt or cannot be opened.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        self._check_header()
        try:
            self.path.parent.mkdir(mode=PRIVATE_FOLDER_MODE, parents=True, exist_ok=True)
        except OSError as exc:
            raise HistoryError(self.path, f"cannot create the folder: {exc.strerror or exc}") from exc
        self._make_private()
        self._refuse_newer()
        try:
            self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=10)
        except sqlite3.Error as exc:
            raise HistoryError(self.path, f"cannot open the chat history: {exc}") from exc
        try:
            with self._guard():
                self._conn.execute("PRAGMA foreign_keys = ON")
                self._conn.execute("PRAGMA busy_timeout = 10000")
                mode = self._conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                self._conn.execute("PRAGMA synchronous = FULL")
                if str(mode).lower() != "wal":
                    raise HistoryError(self.path, f"cannot use write-ahead logging (journal mode {mode})")
                self._migrate()
        except BaseException:
            self._conn.close()
            raise

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ plumbing
    def _make_private(self) -> None:
        """Creates a new database file owner-only, or makes an existing one (and its side files and
        backups) owner-only; SQLite then creates its side files with the database's mode."""
        try:
            if create_private_file(self.path):
                return
        except OSError as exc:
            raise HistoryError(self.path, f"cannot create the chat history: {exc.strerror or exc}") from exc
        companions = [self.path.with_name(self.path.name + suffix) for suffix in SIDE_FILES]
        companions += sorted(self.path.parent.glob(f"{self.path.name}.bak-v*"))
        for path in (self.path, *companions):
            make_private(path)

    def _check_header(self) -> None:
        try:
            with self.path.open("rb") as handle:
                header = handle.read(len(SQLITE_MAGIC))
        except (FileNotFoundError, NotADirectoryError):
            return  # a new history (a folder in the way is reported when it is created)
        except OSError as exc:
            raise HistoryError(self.path, f"cannot read the chat history: {exc.strerror or exc}") from exc
        if header and header != SQLITE_MAGIC:
            raise HistoryError(
                self.path,
                "not an SQLite database, so it is not a chat history; it was left untouched "
                "(move it away to start a new history)",
            )

    def _refuse_newer(self) -> None:
        """Refuses a history with migrations this version does not know, read without writing a byte
        to it or its ``-wal``. A file this cannot read (new, empty, damaged) is left to the regular open.

        Raises:
            HistoryError: the history was written by a newer Glassbox.
        """
        try:
            if self.path.stat().st_size == 0:
                return
            wal = self.path.with_name(self.path.name + "-wal")
            # Without a -wal to read, immutable: SQLite then creates no -wal or -shm beside the file.
            immutable = "" if wal.exists() and wal.stat().st_size > 0 else "&immutable=1"
            conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro{immutable}", uri=True, timeout=10)
        except (OSError, sqlite3.Error):
            return
        try:
            done = {str(row[0]) for row in conn.execute("SELECT name FROM migrations")}
        except (sqlite3.Error, UnicodeDecodeError):
            return  # no migrations table yet, or damage: the regular open says so
        finally:
            conn.close()
        unknown = sorted(done - {m.name for m in MIGRATIONS})
        if not unknown:
            return
        if len(done) > len(MIGRATIONS):
            who = f"a newer Glassbox (schema {len(done)}; this one reads up to {len(MIGRATIONS)})"
        else:
            names = " ".join(", ".join(unknown).split())[:200]  # one line, whatever the file holds
            who = f"another Glassbox (schema steps this one does not know: {names})"
        raise HistoryError(self.path, f"written by {who}; it was left untouched")

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Hold the lock and turn SQLite errors into one-line HistoryErrors.

        Damage can also show as stored text that is no UTF-8 (``UnicodeDecodeError``, or SQLite's
        "Could not decode to UTF-8 column ... with text ..."): it is reported as corruption without
        quoting the text, which is the user's chats.
        """
        with self._lock:
            try:
                yield
            except (sqlite3.Error, UnicodeDecodeError) as exc:
                text = " ".join(str(exc).split())[:200]  # one line, whatever SQLite says
                if isinstance(exc, UnicodeDecodeError) or "Could not decode to UTF-8" in text:
                    reason = "the chat history is corrupt (stored text is not valid UTF-8); it was left untouched"
                elif "full" in text:
                    reason = "could not save: the disk is full"
                elif "not a database" in text or "malformed" in text:
                    reason = f"the chat history is corrupt ({text}); it was left untouched"
                elif "fts5" in text:  # the search index's own pages, which SQLite's b-tree checks pass
                    reason = f"the chat history is corrupt (its search index is damaged: {text}); it was left untouched"
                elif isinstance(exc, sqlite3.ProgrammingError) and "closed" in text:
                    reason = "the chat history is closed"
                else:
                    reason = f"chat history error: {text}"
                raise HistoryError(self.path, reason) from exc

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._guard():
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                if self._conn.in_transaction:  # SQLite may have rolled back already (disk full, I/O)
                    self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _query(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        with self._guard():
            return fn(self._conn)

    def _migrate(self) -> None:
        conn = self._conn
        conn.execute("CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
        done = {row[0] for row in conn.execute("SELECT name FROM migrations")}
        pending = [m for m in MIGRATIONS if m.name not in done]
        if not pending:
            return
        if done:
            self._backup(len(done))
        for migration in pending:
            conn.execute("BEGIN IMMEDIATE")
            try:
                migration.apply(conn)
                conn.execute("INSERT INTO migrations (name, applied_at) VALUES (?, ?)", (migration.name, time.time()))
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def _backup(self, version: int) -> Path:
        target = self.path.with_name(f"{self.path.name}.bak-v{version}")
        if target.exists():
            return target  # an earlier attempt already saved this version
        partial = target.with_name(target.name + ".tmp")
        partial.unlink(missing_ok=True)
        create_private_file(partial)  # a copy of every chat: owner-only, like the history itself
        destination = sqlite3.connect(partial)
        try:
            self._conn.backup(destination)
        finally:
            destination.close()
        partial.replace(target)
        return target

    def integrity_check(self) -> str:
        """``PRAGMA integrity_check``: ``"ok"`` for a sound database, else the problems found."""
        rows = self._query(lambda c: c.execute("PRAGMA integrity_check").fetchall())
        return "\n".join(str(row[0]) for row in rows)

    @property
    def schema_version(self) -> int:
        """The number of migrations applied."""
        return int(self._query(lambda c: c.execute("SELECT count(*) FROM migrations").fetchone()[0]))
