"""The document registry: SQLite, the source of truth for every knowledge base.

It records knowledge bases (embedding model, chunking parameters, Chroma collection), documents
(path, size, mtime, sha256, state), the distinct contents those documents hold and their chunks,
with an FTS5 index over the chunks for BM25. Chroma only mirrors the ``embedded`` chunks here and
can always be rebuilt from this file.

Contract: ARCHITECTURE.md, 'rag.registry'.
"""

from __future__ import annotations

import enum
import logging
import os
import re
import sqlite3
import stat
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Protocol

from rag.errors import KnowledgeBaseError

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
PRIVATE_FILE_MODE = 0o600
PRIVATE_FOLDER_MODE = 0o700
SIDE_FILES = ("-wal", "-shm", "-journal")
"""Suffixes of the files SQLite keeps beside a database (they hold its data too)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS kbs(
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    embedder_id TEXT NOT NULL,
    embedder_path TEXT NOT NULL,
    dimension INTEGER NOT NULL,
    max_tokens INTEGER NOT NULL,
    overlap_tokens INTEGER NOT NULL,
    collection TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS contents(
    id INTEGER PRIMARY KEY,
    kb_id INTEGER NOT NULL REFERENCES kbs(id) ON DELETE CASCADE,
    sha256 TEXT NOT NULL,
    n_chunks INTEGER NOT NULL DEFAULT 0,
    UNIQUE(kb_id, sha256)
);
CREATE TABLE IF NOT EXISTS documents(
    id INTEGER PRIMARY KEY,
    kb_id INTEGER NOT NULL REFERENCES kbs(id) ON DELETE CASCADE,
    path TEXT NOT NULL,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    sha256 TEXT,
    content_id INTEGER REFERENCES contents(id) ON DELETE SET NULL,
    state TEXT NOT NULL,
    reason TEXT,
    indexed_at REAL,
    UNIQUE(kb_id, path)
);
CREATE INDEX IF NOT EXISTS documents_content ON documents(content_id);
CREATE TABLE IF NOT EXISTS chunks(
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kb_id INTEGER NOT NULL,
    content_id INTEGER NOT NULL REFERENCES contents(id) ON DELETE CASCADE,
    idx INTEGER NOT NULL,
    text TEXT NOT NULL,
    page INTEGER,
    heading TEXT,
    start_char INTEGER NOT NULL,
    end_char INTEGER NOT NULL,
    embedded INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS chunks_content ON chunks(content_id);
CREATE INDEX IF NOT EXISTS chunks_pending ON chunks(kb_id, embedded);
CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5(
    text, heading, content='chunks', content_rowid='id',
    tokenize='porter unicode61 remove_diacritics 2'
);
CREATE TRIGGER IF NOT EXISTS chunks_ai AFTER INSERT ON chunks BEGIN
    INSERT INTO chunks_fts(rowid, text, heading) VALUES (new.id, new.text, coalesce(new.heading, ''));
END;
CREATE TRIGGER IF NOT EXISTS chunks_ad AFTER DELETE ON chunks BEGIN
    INSERT INTO chunks_fts(chunks_fts, rowid, text, heading)
        VALUES ('delete', old.id, old.text, coalesce(old.heading, ''));
END;
"""

# Words too common to help BM25; the dense stage still sees the whole question.
_STOP_WORDS = """a about above after again against all am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further had
    has have having he her here hers herself him himself his how i if in into is it its itself just
    me more most my myself no nor not now of off on once only or other our ours ourselves out over
    own same she should so some such than that the their theirs them themselves then there these
    they this those through to too under until up very was we were what when where which while who
    whom why will with would you your yours yourself yourselves tell say said please"""
STOP_WORDS = frozenset(_STOP_WORDS.split())
_WORD = re.compile(r"\w+", re.UNICODE)


class DocState(enum.StrEnum):
    """Where a document is in the pipeline."""

    QUEUED = "queued"
    INDEXING = "indexing"
    INDEXED = "indexed"
    SKIPPED = "skipped"
    ERROR = "error"


class ChunkLike(Protocol):
    """What the registry needs from a chunk (``rag.chunking.Chunk`` satisfies it)."""

    @property
    def text(self) -> str: ...
    @property
    def page(self) -> int | None: ...
    @property
    def heading(self) -> str | None: ...
    @property
    def start(self) -> int: ...
    @property
    def end(self) -> int: ...


@dataclass(frozen=True)
class KnowledgeBaseInfo:
    """One knowledge base row."""

    id: int
    name: str
    embedder_id: str
    embedder_path: str
    dimension: int
    max_tokens: int
    overlap_tokens: int
    collection: str
    created_at: float


@dataclass(frozen=True)
class DocumentRecord:
    """One document row; ``n_chunks`` comes from its content."""

    id: int
    kb_id: int
    path: str
    size: int
    mtime_ns: int
    sha256: str | None
    content_id: int | None
    state: DocState
    reason: str | None
    n_chunks: int
    indexed_at: float | None


@dataclass(frozen=True)
class ChunkRecord:
    """A stored chunk, with one of the paths whose content holds it."""

    id: int
    content_id: int
    index: int
    text: str
    page: int | None
    heading: str | None
    start: int
    end: int
    path: str


@dataclass(frozen=True)
class KnowledgeBaseStats:
    """Counts for ``kb list``."""

    documents: dict[str, int]
    chunks: int
    embedded: int


def make_private(path: Path) -> bool:
    """Takes group and other permissions off an existing file or folder (0644 -> 0600, 0755 -> 0700).

    A change, or a failure to change, is logged as a warning naming the path. Missing paths and
    Windows (no POSIX modes) are left alone. (``engine.atomic`` has the same rule; rag does not
    import the engine.)

    Returns:
        True when the mode was changed.
    """
    if os.name != "posix":
        return False
    try:
        old = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return False
    if not old & 0o077:
        return False
    new = old & ~0o077
    try:
        os.chmod(path, new)
    except OSError as exc:
        log.warning(
            "%s: other users can read it (mode %03o) and it could not be made owner-only (%s)",
            path,
            old,
            exc.strerror or exc,
        )
        return False
    log.warning("%s: other users could read it (mode %03o); made it owner-only (%03o)", path, old, new)
    return True


def private_folder(folder: Path) -> None:
    """Creates ``folder`` (and missing parents) with the folder itself owner-only, or makes an existing
    one owner-only.

    Raises:
        OSError: it cannot be created.
    """
    if folder.is_dir():
        make_private(folder)
    else:
        folder.mkdir(mode=PRIVATE_FOLDER_MODE, parents=True, exist_ok=True)


def _create_private_file(path: Path) -> bool:
    """Creates ``path`` empty and owner-only unless it exists; True when it was created."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
    except FileExistsError:
        return False
    try:
        if hasattr(os, "fchmod"):  # exactly 0600, whatever the umask
            os.fchmod(fd, PRIVATE_FILE_MODE)
    finally:
        os.close(fd)
    return True


_KB_COLUMNS = ", ".join(field.name for field in fields(KnowledgeBaseInfo))
"""The ``kbs`` columns ``KnowledgeBaseInfo`` holds, in its order (a newer file may have more)."""


def _refuse_newer(path: Path) -> None:
    """Refuses a registry from a newer schema, read without writing a byte to it or its ``-wal``.

    A read-only connection never checkpoints the write-ahead log into the file, nor deletes it,
    when it closes. A file this cannot read (new, empty, damaged) is left to the regular open.

    Raises:
        KnowledgeBaseError: the file says it was written by a newer schema, or names no version
            this one can read.
    """
    try:
        if path.stat().st_size == 0:
            return
        wal = path.with_name(path.name + "-wal")
        # Without a -wal to read, immutable: SQLite then creates no -wal or -shm beside the file.
        immutable = "" if wal.exists() and wal.stat().st_size > 0 else "&immutable=1"
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro{immutable}", uri=True, timeout=30.0)
    except (OSError, sqlite3.Error):
        return
    try:
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except sqlite3.Error:
        return  # no meta table yet, or not a registry: the regular open says so
    finally:
        db.close()
    if row is None:
        return
    try:
        version = int(str(row[0]))
    except ValueError:
        raise KnowledgeBaseError(
            f"{path}: the registry's schema version {str(row[0])[:40]!r} is not a number; it was left untouched"
        ) from None
    if version > SCHEMA_VERSION:
        raise KnowledgeBaseError(
            f"{path}: written by a newer Glassbox (schema {version}; this one reads up to {SCHEMA_VERSION});"
            " it was left untouched"
        )


def fts_query(text: str) -> str:
    """Builds an FTS5 query from the user's words: stop-words dropped, every term quoted.

    Args:
        text: the user's question, any characters.

    Returns:
        ``"term1" OR "term2" ...``, or ``""`` when no useful word is left.
    """
    seen: dict[str, None] = {}
    for word in _WORD.findall(text.lower()):
        if len(word) < 2 or word in STOP_WORDS or word.replace("_", "") == "":
            continue
        seen.setdefault(word, None)
    return " OR ".join('"' + word.replace('"', '""') + '"' for word in seen)


class Registry:
    """The SQLite registry of one data folder. Thread-safe: one connection behind a lock.

    Args:
        path: the database file (created owner-only, with its folder).

    Raises:
        KnowledgeBaseError: the file is not a usable registry or cannot be created.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(mode=PRIVATE_FOLDER_MODE, parents=True, exist_ok=True)
        try:
            if not _create_private_file(path):
                for private in (path, *(path.with_name(path.name + suffix) for suffix in SIDE_FILES)):
                    make_private(private)
        except OSError as exc:
            raise KnowledgeBaseError(f"{path}: cannot create the registry ({exc.strerror or exc})") from exc
        _refuse_newer(path)
        try:
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30.0)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.executescript(_SCHEMA)
            self._db.execute(
                "INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
            )
        except sqlite3.DatabaseError as exc:
            if hasattr(self, "_db"):
                self._db.close()  # now, not when collected: the caller may tidy the side files up
            raise KnowledgeBaseError(f"{path}: not a usable registry ({exc})") from exc
        self._lock = threading.RLock()

    def close(self) -> None:
        """Closes the connection."""
        with self._lock:
            self._db.close()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _rows(self, sql: str, args: Sequence[object] = ()) -> list[tuple[object, ...]]:
        with self._lock:
            return list(self._db.execute(sql, args).fetchall())

    # ------------------------------------------------------------------ knowledge bases

    def create_kb(
        self,
        name: str,
        *,
        embedder_id: str,
        embedder_path: str,
        dimension: int,
        max_tokens: int,
        overlap_tokens: int,
        collection: str,
    ) -> KnowledgeBaseInfo:
        """Creates a knowledge base.

        Raises:
            KnowledgeBaseError: the name is empty, too long or already taken.
        """
        if not name.strip() or len(name) > 200 or any(ch in name for ch in "\n\r\0"):
            raise KnowledgeBaseError(f"{name!r}: a knowledge base name must be one line of 1-200 characters")
        try:
            with self._tx() as db:
                db.execute(
                    "INSERT INTO kbs(name, embedder_id, embedder_path, dimension, max_tokens, overlap_tokens,"
                    " collection, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        name,
                        embedder_id,
                        embedder_path,
                        dimension,
                        max_tokens,
                        overlap_tokens,
                        collection,
                        time.time(),
                    ),
                )
        except sqlite3.IntegrityError:
            raise KnowledgeBaseError(f"{name}: a knowledge base with this name already exists") from None
        return self.get_kb(name)

    def get_kb(self, name: str) -> KnowledgeBaseInfo:
        """The knowledge base called ``name``.

        Raises:
            KnowledgeBaseError: there is none.
        """
        rows = self._rows(f"SELECT {_KB_COLUMNS} FROM kbs WHERE name = ?", (name,))
        if not rows:
            raise KnowledgeBaseError(f"{name}: no such knowledge base")
        return KnowledgeBaseInfo(*rows[0])  # type: ignore[arg-type]

    def list_kbs(self) -> list[KnowledgeBaseInfo]:
        """All knowledge bases, by name."""
        rows = self._rows(f"SELECT {_KB_COLUMNS} FROM kbs ORDER BY name")
        return [KnowledgeBaseInfo(*row) for row in rows]  # type: ignore[arg-type]

    def drop_kb(self, kb_id: int) -> None:
        """Deletes a knowledge base with its documents and chunks."""
        with self._tx() as db:
            db.execute("DELETE FROM chunks WHERE kb_id = ?", (kb_id,))
            db.execute("DELETE FROM kbs WHERE id = ?", (kb_id,))

    def set_embedder(
        self,
        kb_id: int,
        *,
        embedder_id: str,
        embedder_path: str,
        dimension: int,
        collection: str,
        max_tokens: int,
    ) -> None:
        """Switches a knowledge base to another embedding model (its chunks must be rebuilt)."""
        with self._tx() as db:
            db.execute(
                "UPDATE kbs SET embedder_id = ?, embedder_path = ?, dimension = ?, collection = ?,"
                " max_tokens = ? WHERE id = ?",
                (embedder_id, embedder_path, dimension, collection, max_tokens, kb_id),
            )

    def stats(self, kb_id: int) -> KnowledgeBaseStats:
        """Documents per state and chunk counts of one knowledge base."""
        states = {
            str(s): int(str(n))
            for s, n in self._rows("SELECT state, count(*) FROM documents WHERE kb_id = ? GROUP BY state", (kb_id,))
        }
        total, embedded = self._rows(
            "SELECT count(*), coalesce(sum(embedded), 0) FROM chunks WHERE kb_id = ?", (kb_id,)
        )[0]
        return KnowledgeBaseStats(documents=states, chunks=int(str(total)), embedded=int(str(embedded)))

    # ------------------------------------------------------------------ documents

    _DOC_SELECT = (
        "SELECT d.id, d.kb_id, d.path, d.size, d.mtime_ns, d.sha256, d.content_id, d.state, d.reason,"
        " coalesce(c.n_chunks, 0), d.indexed_at FROM documents d LEFT JOIN contents c ON c.id = d.content_id"
    )

    @staticmethod
    def _doc(row: tuple[object, ...]) -> DocumentRecord:
        values = list(row)
        values[7] = DocState(str(values[7]))
        return DocumentRecord(*values)  # type: ignore[arg-type]

    def document(self, kb_id: int, path: str) -> DocumentRecord | None:
        """The document at ``path`` (an absolute path string), if registered."""
        rows = self._rows(self._DOC_SELECT + " WHERE d.kb_id = ? AND d.path = ?", (kb_id, path))
        return self._doc(rows[0]) if rows else None

    def documents(self, kb_id: int, *, under: str | None = None) -> list[DocumentRecord]:
        """Documents of a knowledge base, optionally only ``under`` a folder (or that exact path)."""
        if under is None:
            rows = self._rows(self._DOC_SELECT + " WHERE d.kb_id = ? ORDER BY d.path", (kb_id,))
        else:
            prefix = under.rstrip("/\\")
            rows = self._rows(
                self._DOC_SELECT + " WHERE d.kb_id = ? AND (d.path = ? OR substr(d.path, 1, ?) IN (?, ?))"
                " ORDER BY d.path",
                (kb_id, prefix, len(prefix) + 1, prefix + "/", prefix + "\\"),
            )
        return [self._doc(row) for row in rows]

    def queue(self, kb_id: int, entries: Iterable[tuple[str, int, int]]) -> None:
        """Marks new or changed files as queued, in one transaction.

        Args:
            kb_id: the knowledge base.
            entries: ``(path, size, mtime_ns)`` per file.
        """
        with self._tx() as db:
            db.executemany(
                "INSERT INTO documents(kb_id, path, size, mtime_ns, state) VALUES (?, ?, ?, ?, 'queued')"
                " ON CONFLICT(kb_id, path) DO UPDATE SET size = excluded.size,"
                " mtime_ns = excluded.mtime_ns, state = 'queued', reason = NULL",
                [(kb_id, path, size, mtime) for path, size, mtime in entries],
            )

    def requeue_all(self, kb_id: int) -> list[int]:
        """Queues every document of a knowledge base again and forgets all its chunks.

        Returns:
            The ids of the chunks that were embedded (to delete from the store).
        """
        with self._tx() as db:
            ids = [int(r[0]) for r in db.execute("SELECT id FROM chunks WHERE kb_id = ? AND embedded = 1", (kb_id,))]
            db.execute(
                "UPDATE documents SET state = 'queued', reason = NULL, content_id = NULL,"
                " sha256 = NULL WHERE kb_id = ?",
                (kb_id,),
            )
            db.execute("DELETE FROM chunks WHERE kb_id = ?", (kb_id,))
            db.execute("DELETE FROM contents WHERE kb_id = ?", (kb_id,))
        return ids

    def touch(self, doc_id: int, size: int, mtime_ns: int) -> None:
        """Records a new size and mtime for a document whose content did not change."""
        with self._tx() as db:
            db.execute("UPDATE documents SET size = ?, mtime_ns = ? WHERE id = ?", (size, mtime_ns, doc_id))

    def set_state(self, doc_id: int, state: DocState, reason: str | None = None) -> list[int]:
        """Sets a document's state; a skipped or failed document lets go of its old content.

        Returns:
            Ids of embedded chunks no document needs any more (to delete from the store).
        """
        with self._tx() as db:
            orphans: list[int] = []
            if state in (DocState.SKIPPED, DocState.ERROR):
                orphans = self._detach(db, doc_id)
            db.execute("UPDATE documents SET state = ?, reason = ? WHERE id = ?", (str(state), reason, doc_id))
        return orphans

    def find_content(self, kb_id: int, sha256: str) -> int | None:
        """The content id already holding this hash in the knowledge base, if any."""
        rows = self._rows("SELECT id FROM contents WHERE kb_id = ? AND sha256 = ?", (kb_id, sha256))
        return int(str(rows[0][0])) if rows else None

    @staticmethod
    def _detach(db: sqlite3.Connection, doc_id: int) -> list[int]:
        """Unlinks a document from its content; deletes the content if nothing else uses it."""
        row = db.execute("SELECT content_id FROM documents WHERE id = ?", (doc_id,)).fetchone()
        if row is None or row[0] is None:
            return []
        content_id = int(row[0])
        db.execute("UPDATE documents SET content_id = NULL WHERE id = ?", (doc_id,))
        users = db.execute("SELECT count(*) FROM documents WHERE content_id = ?", (content_id,)).fetchone()[0]
        if users:
            return []
        ids = [
            int(r[0]) for r in db.execute("SELECT id FROM chunks WHERE content_id = ? AND embedded = 1", (content_id,))
        ]
        db.execute("DELETE FROM chunks WHERE content_id = ?", (content_id,))
        db.execute("DELETE FROM contents WHERE id = ?", (content_id,))
        return ids

    def link_content(self, doc_id: int, content_id: int, *, sha256: str, size: int, mtime_ns: int) -> list[int]:
        """Points a document at content already stored (a duplicate file).

        Returns:
            Ids of embedded chunks of its previous content that nothing needs any more.
        """
        with self._tx() as db:
            orphans = [] if self._current_content(db, doc_id) == content_id else self._detach(db, doc_id)
            pending = db.execute(
                "SELECT count(*) FROM chunks WHERE content_id = ? AND embedded = 0", (content_id,)
            ).fetchone()[0]
            state = DocState.INDEXING if pending else DocState.INDEXED
            db.execute(
                "UPDATE documents SET content_id = ?, sha256 = ?, size = ?, mtime_ns = ?, state = ?,"
                " reason = NULL, indexed_at = ? WHERE id = ?",
                (content_id, sha256, size, mtime_ns, str(state), time.time(), doc_id),
            )
        return orphans

    @staticmethod
    def _current_content(db: sqlite3.Connection, doc_id: int) -> int | None:
        row = db.execute("SELECT content_id FROM documents WHERE id = ?", (doc_id,)).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def store_content(
        self,
        kb_id: int,
        doc_id: int,
        *,
        sha256: str,
        size: int,
        mtime_ns: int,
        chunks: Sequence[ChunkLike],
    ) -> list[int]:
        """Stores a document's new content and its chunks (not yet embedded), in one transaction.

        Returns:
            Ids of embedded chunks of its previous content that nothing needs any more.
        """
        with self._tx() as db:
            orphans = self._detach(db, doc_id)
            cur = db.execute(
                "INSERT INTO contents(kb_id, sha256, n_chunks) VALUES (?, ?, ?)", (kb_id, sha256, len(chunks))
            )
            content_id = cur.lastrowid
            db.executemany(
                "INSERT INTO chunks(kb_id, content_id, idx, text, page, heading, start_char, end_char)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(kb_id, content_id, i, c.text, c.page, c.heading, c.start, c.end) for i, c in enumerate(chunks)],
            )
            db.execute(
                "UPDATE documents SET content_id = ?, sha256 = ?, size = ?, mtime_ns = ?, state = 'indexing',"
                " reason = NULL WHERE id = ?",
                (content_id, sha256, size, mtime_ns, doc_id),
            )
        return orphans

    def remove_documents(self, doc_ids: Sequence[int]) -> list[int]:
        """Forgets documents; their content goes when no other document holds it.

        Returns:
            Ids of embedded chunks to delete from the store.
        """
        orphans: list[int] = []
        with self._tx() as db:
            for doc_id in doc_ids:
                orphans += self._detach(db, doc_id)
                db.execute("DELETE FROM documents WHERE id = ?", (doc_id,))
        return orphans

    # ------------------------------------------------------------------ chunks

    def pending_chunks(self, kb_id: int, limit: int) -> list[tuple[int, str]]:
        """Up to ``limit`` ``(chunk_id, text)`` not yet in the store, oldest first."""
        return [
            (int(str(i)), str(t))
            for i, t in self._rows(
                "SELECT id, text FROM chunks WHERE kb_id = ? AND embedded = 0 ORDER BY id LIMIT ?",
                (kb_id, limit),
            )
        ]

    @staticmethod
    def has_pending(path: Path) -> bool:
        """Whether the registry at ``path`` holds chunks waiting for their embedding, read without
        opening it for writing (no migration, no lock). True when it cannot tell (an unreadable or
        older file): the caller then opens the knowledge bases properly."""
        try:
            db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5.0)
        except sqlite3.Error:
            return True
        try:
            return db.execute("SELECT 1 FROM chunks WHERE embedded = 0 LIMIT 1").fetchone() is not None
        except sqlite3.Error:
            return True
        finally:
            db.close()

    def identity(self) -> str:
        """This registry's id (made on first use): it labels the collections it owns on a shared
        Chroma server, so that another Glassbox home can tell they are not its own."""
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('registry_id', ?)", (uuid.uuid4().hex,))
            row = db.execute("SELECT value FROM meta WHERE key = 'registry_id'").fetchone()
        return str(row[0])

    @staticmethod
    def kb_names(path: Path) -> list[str] | None:
        """The knowledge bases' names in the registry at ``path``, read without opening it for
        writing (a menu lists them without starting the knowledge process). ``[]`` when there is
        no registry yet; None when it cannot be read (the caller asks the knowledge bases)."""
        if not path.exists():
            return []
        try:
            db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5.0)
        except sqlite3.Error:
            return None
        try:
            return [str(row[0]) for row in db.execute("SELECT name FROM kbs ORDER BY name")]
        except sqlite3.Error:
            return None
        finally:
            db.close()

    def count_pending(self, kb_id: int) -> int:
        """How many chunks still wait for their embedding."""
        return int(str(self._rows("SELECT count(*) FROM chunks WHERE kb_id = ? AND embedded = 0", (kb_id,))[0][0]))

    def mark_embedded(self, chunk_ids: Sequence[int]) -> None:
        """Records that these chunks are in the store; finished documents become ``indexed``."""
        if not chunk_ids:
            return
        with self._tx() as db:
            db.executemany("UPDATE chunks SET embedded = 1 WHERE id = ?", [(i,) for i in chunk_ids])
            marks = ",".join("?" * len(chunk_ids))
            contents = [
                r[0]
                for r in db.execute(f"SELECT DISTINCT content_id FROM chunks WHERE id IN ({marks})", list(chunk_ids))
            ]
            for content_id in contents:
                db.execute(
                    "UPDATE documents SET state = 'indexed', indexed_at = ? WHERE content_id = ?"
                    " AND state = 'indexing' AND NOT EXISTS"
                    " (SELECT 1 FROM chunks WHERE content_id = ? AND embedded = 0)",
                    (time.time(), content_id, content_id),
                )

    def embedded_ids(self, kb_id: int) -> set[int]:
        """Ids of all chunks the registry believes are in the store."""
        return {int(str(r[0])) for r in self._rows("SELECT id FROM chunks WHERE kb_id = ? AND embedded = 1", (kb_id,))}

    def mark_unembedded(self, chunk_ids: Iterable[int]) -> None:
        """Records that these chunks are missing from the store (they will be embedded again)."""
        with self._tx() as db:
            db.executemany("UPDATE chunks SET embedded = 0 WHERE id = ?", [(i,) for i in chunk_ids])

    def chunks(self, chunk_ids: Sequence[int]) -> dict[int, ChunkRecord]:
        """The chunks with these ids (missing ones are left out), each with a path holding it."""
        if not chunk_ids:
            return {}
        marks = ",".join("?" * len(chunk_ids))
        rows = self._rows(
            "SELECT c.id, c.content_id, c.idx, c.text, c.page, c.heading, c.start_char, c.end_char,"
            " (SELECT d.path FROM documents d WHERE d.content_id = c.content_id ORDER BY d.id LIMIT 1)"
            f" FROM chunks c WHERE c.id IN ({marks})",
            list(chunk_ids),
        )
        return {int(str(r[0])): ChunkRecord(*r) for r in rows if r[8] is not None}  # type: ignore[arg-type]

    def bm25(self, kb_id: int, query: str, k: int) -> list[tuple[int, float]]:
        """Lexical search over one knowledge base's embedded chunks.

        Args:
            kb_id: the knowledge base.
            query: the user's words (turned into a safe FTS5 query here).
            k: how many hits.

        Returns:
            ``(chunk_id, score)``, best first; higher scores are better.
        """
        match = fts_query(query)
        if not match:
            return []
        # Ranking the FTS index alone is several times faster than ranking its join with chunks,
        # so rank a few more hits than needed, then keep this knowledge base's embedded ones; only
        # when other knowledge bases crowd them out is the slower joined query used.
        over = max(4 * k, 50)
        ranked = self._rows(
            "SELECT rowid, -bm25(chunks_fts, 1.0, 0.5) FROM chunks_fts WHERE chunks_fts MATCH ?"
            " ORDER BY bm25(chunks_fts, 1.0, 0.5) LIMIT ?",
            (match, over),
        )
        if not ranked:
            return []
        marks = ",".join("?" * len(ranked))
        mine = {
            int(str(r[0]))
            for r in self._rows(
                f"SELECT id FROM chunks WHERE id IN ({marks}) AND kb_id = ? AND embedded = 1",
                [r[0] for r in ranked] + [kb_id],
            )
        }
        hits = [(int(str(i)), float(str(s))) for i, s in ranked if int(str(i)) in mine][:k]
        if len(hits) >= k or len(ranked) < over:
            return hits
        rows = self._rows(
            "SELECT c.id, -bm25(chunks_fts, 1.0, 0.5) AS score FROM chunks_fts"
            " JOIN chunks c ON c.id = chunks_fts.rowid"
            " WHERE chunks_fts MATCH ? AND c.kb_id = ? AND c.embedded = 1 ORDER BY bm25(chunks_fts, 1.0, 0.5)"
            " LIMIT ?",
            (match, kb_id, k),
        )
        return [(int(str(i)), float(str(s))) for i, s in rows]
