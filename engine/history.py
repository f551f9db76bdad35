"""Conversation history in SQLite: conversations, a tree of messages, full-text search.

Durability (DESIGN.md "Data layout", ROBUSTNESS.md P2/P3/P7): WAL journal, ``synchronous=FULL``
and every write committed at once, so a ``kill -9`` or a power cut loses at most the write in
flight. The schema is versioned by named migrations (a ``migrations`` table, as in simonw/llm); before
migrating a database that already has a schema, it is copied with SQLite's backup API to
``<name>.bak-v<N>`` next to it, where N is the number of migrations it had.

Messages form a tree so that editing and regenerating never destroy anything: each message has a
``parent_id`` (``None`` for a first message); editing a user message or regenerating a reply adds a
sibling; a conversation's ``current_leaf_id`` names the branch on screen, and :meth:`thread` walks
from it back to the root. Full-text search uses an FTS5 table kept in sync by triggers.

One connection serves all threads (``check_same_thread=False``), guarded by a lock. A file that is
not an SQLite database, or is corrupt, raises :class:`~engine.errors.HistoryError` naming the file;
it is never overwritten.

A history written by a newer Glassbox (migrations this version does not know) is refused with a
:class:`~engine.errors.HistoryError` that says so, before anything is written: it is read through a
read-only connection first, which never checkpoints the ``-wal`` into the file nor deletes it.

The history is private: a new database (and a migration backup) is created owner-only (0600) before
SQLite opens it, so its ``-wal``, ``-shm`` and journal files get the same mode; a new folder is 0700.
Files an older version left readable by others are made owner-only when the store opens (logged).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, TypeVar, cast

from engine.atomic import PRIVATE_FOLDER_MODE, create_private_file, make_private
from engine.errors import HistoryError

MessageState = Literal["complete", "partial", "pending", "error"]
STATES: Final = ("complete", "partial", "pending", "error")
ROLES: Final = ("system", "user", "assistant")
SQLITE_MAGIC: Final = b"SQLite format 3\x00"
SIDE_FILES: Final = ("-wal", "-shm", "-journal")
"""Suffixes of the files SQLite keeps beside a database (they hold its data too)."""
MIN_PREFIX: Final = 3

_UNSET: Any = object()
_T = TypeVar("_T")


# ---------------------------------------------------------------------------- records
@dataclass(frozen=True)
class Conversation:
    """A conversation's row."""

    id: int
    title: str
    created_at: float
    updated_at: float
    system_prompt: str | None
    settings: dict[str, Any]
    knowledge_bases: list[str]
    deleted_at: float | None
    current_leaf_id: int | None


@dataclass(frozen=True)
class StoredMessage:
    """A message's row. ``state`` is ``pending`` while a reply streams, ``partial`` when stopped."""

    id: int
    conversation_id: int
    parent_id: int | None
    role: str
    content: str
    state: MessageState
    created_at: float
    stats: dict[str, Any] | None
    sources: list[dict[str, Any]] | None
    model: str | None
    error: str | None


@dataclass(frozen=True)
class SearchHit:
    """One search result; ``snippet`` marks the matched words with ``**``."""

    conversation_id: int
    conversation_title: str
    message_id: int
    snippet: str
    role: str


# ---------------------------------------------------------------------------- migrations
@dataclass(frozen=True)
class Migration:
    """A named schema step, applied once, in order, inside a transaction."""

    name: str
    statements: tuple[str, ...]

    def apply(self, conn: sqlite3.Connection) -> None:
        """Run the statements (the caller owns the transaction)."""
        for statement in self.statements:
            conn.execute(statement)


MIGRATIONS: Final = (
    Migration(
        "m001_initial",
        (
            """CREATE TABLE conversations (
                id INTEGER PRIMARY KEY,
                title TEXT NOT NULL,
                created_at REAL NOT NULL,
                updated_at REAL NOT NULL,
                system_prompt TEXT,
                settings TEXT NOT NULL DEFAULT '{}',
                knowledge_bases TEXT NOT NULL DEFAULT '[]',
                deleted_at REAL,
                current_leaf_id INTEGER REFERENCES messages(id) ON DELETE SET NULL
            )""",
            """CREATE TABLE messages (
                id INTEGER PRIMARY KEY,
                conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
                parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE,
                role TEXT NOT NULL,
                content TEXT NOT NULL,
                state TEXT NOT NULL CHECK (state IN ('complete', 'partial', 'pending', 'error')),
                created_at REAL NOT NULL,
                stats TEXT,
                sources TEXT,
                model TEXT,
                error TEXT
            )""",
            "CREATE INDEX messages_conversation ON messages(conversation_id)",
            "CREATE INDEX messages_parent ON messages(parent_id)",
            "CREATE INDEX conversations_updated ON conversations(updated_at)",
        ),
    ),
    Migration(
        "m002_fts",
        (
            """CREATE VIRTUAL TABLE messages_fts USING fts5(
                content, content='messages', content_rowid='id',
                tokenize='porter unicode61 remove_diacritics 2'
            )""",
            """CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
                INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
            END""",
            """CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
                INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
            END""",
            """CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages BEGIN
                INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
                INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
            END""",
            "INSERT INTO messages_fts(messages_fts) VALUES ('rebuild')",
        ),
    ),
)
"""Every schema step ever shipped, oldest first. Append only; never edit a shipped one."""


def fts_query(text: str) -> str:
    """Turn free text into a safe FTS5 query: every word quoted, all required, the last a prefix.

    The last word is a prefix (search as you type) once it has :data:`MIN_PREFIX` characters;
    shorter prefixes match most of the history and are slow to rank.

    Quoting makes operators (``AND``, ``(``, ``*``, ``:``, ``"``) plain text, so no input can be a
    syntax error.

    Args:
        text: what the user typed.

    Returns:
        The FTS5 query, or ``""`` when there is nothing to search for.
    """
    words = [w for w in text.split() if any(ch.isalnum() for ch in w)]
    if not words:
        return ""
    quoted = ['"' + w.replace('"', '""') + '"' for w in words]
    if len(words[-1]) >= MIN_PREFIX:
        quoted[-1] += "*"
    return " ".join(quoted)


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, sort_keys=True)


# ---------------------------------------------------------------------------- store
class HistoryStore:
    """The chat history database.

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

    def __enter__(self) -> HistoryStore:
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

    # ------------------------------------------------------------------ conversations
    _CONVERSATION_COLUMNS = (
        "id, title, created_at, updated_at, system_prompt, settings, knowledge_bases, deleted_at, current_leaf_id"
    )

    @staticmethod
    def _conversation(row: Sequence[Any]) -> Conversation:
        return Conversation(
            id=row[0],
            title=row[1],
            created_at=row[2],
            updated_at=row[3],
            system_prompt=row[4],
            settings=json.loads(row[5]),
            knowledge_bases=json.loads(row[6]),
            deleted_at=row[7],
            current_leaf_id=row[8],
        )

    def create_conversation(
        self,
        title: str = "New chat",
        system_prompt: str | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> Conversation:
        """Create and save a conversation.

        Args:
            title: its title.
            system_prompt: its system prompt.
            settings: per-conversation settings (JSON-serialisable).

        Returns:
            The new conversation.
        """
        now = time.time()
        with self._transaction() as conn:
            cursor = conn.execute(
                "INSERT INTO conversations (title, created_at, updated_at, system_prompt, settings)"
                " VALUES (?, ?, ?, ?, ?)",
                (title, now, now, system_prompt, _dumps(dict(settings or {}))),
            )
            new_id = cast(int, cursor.lastrowid)
        return self.get_conversation(new_id)

    def get_conversation(self, conversation_id: int) -> Conversation:
        """The conversation with this id (deleted ones included).

        Raises:
            HistoryError: there is no such conversation.
        """
        row = self._query(
            lambda c: c.execute(
                f"SELECT {self._CONVERSATION_COLUMNS} FROM conversations WHERE id = ?", (conversation_id,)
            ).fetchone()
        )
        if row is None:
            raise HistoryError(self.path, f"no conversation with id {conversation_id}")
        return self._conversation(row)

    def list_conversations(self, include_deleted: bool = False) -> list[Conversation]:
        """All conversations, most recently updated first."""
        where = "" if include_deleted else "WHERE deleted_at IS NULL"
        rows = self._query(
            lambda c: c.execute(
                f"SELECT {self._CONVERSATION_COLUMNS} FROM conversations {where} ORDER BY updated_at DESC, id DESC"
            ).fetchall()
        )
        return [self._conversation(row) for row in rows]

    def _update(self, conversation_id: int, assignments: str, values: Sequence[Any]) -> None:
        with self._transaction() as conn:
            cursor = conn.execute(f"UPDATE conversations SET {assignments} WHERE id = ?", (*values, conversation_id))
            if cursor.rowcount == 0:
                raise HistoryError(self.path, f"no conversation with id {conversation_id}")

    def rename(self, conversation_id: int, title: str) -> None:
        """Change a conversation's title (its place in the list does not change)."""
        self._update(conversation_id, "title = ?", (title,))

    def update_conversation(
        self,
        conversation_id: int,
        *,
        system_prompt: str | None = _UNSET,
        settings: Mapping[str, Any] = _UNSET,
        knowledge_bases: Sequence[str] = _UNSET,
    ) -> None:
        """Change the given fields of a conversation; the others stay as they are."""
        columns: list[str] = []
        values: list[Any] = []
        if system_prompt is not _UNSET:
            columns.append("system_prompt = ?")
            values.append(system_prompt)
        if settings is not _UNSET:
            columns.append("settings = ?")
            values.append(_dumps(dict(settings)))
        if knowledge_bases is not _UNSET:
            columns.append("knowledge_bases = ?")
            values.append(_dumps(list(knowledge_bases)))
        if columns:
            self._update(conversation_id, ", ".join(columns), values)

    def delete(self, conversation_id: int) -> None:
        """Soft-delete: hidden from the list until :meth:`restore` or :meth:`purge_deleted`."""
        self._update(conversation_id, "deleted_at = ?", (time.time(),))

    def restore(self, conversation_id: int) -> None:
        """Undo :meth:`delete`."""
        self._update(conversation_id, "deleted_at = NULL", ())

    def purge_deleted(self, older_than_s: float = 0) -> int:
        """Remove for good the conversations deleted at least ``older_than_s`` seconds ago.

        Returns:
            How many conversations were removed (their messages go with them).
        """
        cutoff = time.time() - older_than_s
        with self._transaction() as conn:
            cursor = conn.execute(
                "DELETE FROM conversations WHERE deleted_at IS NOT NULL AND deleted_at <= ?", (cutoff,)
            )
            return cursor.rowcount

    # ------------------------------------------------------------------ messages
    _MESSAGE_COLUMNS = "id, conversation_id, parent_id, role, content, state, created_at, stats, sources, model, error"

    @staticmethod
    def _message(row: Sequence[Any]) -> StoredMessage:
        return StoredMessage(
            id=row[0],
            conversation_id=row[1],
            parent_id=row[2],
            role=row[3],
            content=row[4],
            state=row[5],
            created_at=row[6],
            stats=_loads(row[7]),
            sources=_loads(row[8]),
            model=row[9],
            error=row[10],
        )

    def get_message(self, message_id: int) -> StoredMessage:
        """The message with this id.

        Raises:
            HistoryError: there is no such message.
        """
        row = self._query(
            lambda c: c.execute(f"SELECT {self._MESSAGE_COLUMNS} FROM messages WHERE id = ?", (message_id,)).fetchone()
        )
        if row is None:
            raise HistoryError(self.path, f"no message with id {message_id}")
        return self._message(row)

    def add_message(
        self,
        conversation_id: int,
        role: str,
        content: str,
        *,
        parent_id: int | Literal["leaf"] | None = "leaf",
        state: str = "complete",
        model: str | None = None,
    ) -> StoredMessage:
        """Save a message and make it the conversation's current leaf (committed before returning).

        To edit a user message, add the new text with the old message's ``parent_id``; to
        regenerate a reply, add a ``pending`` assistant message under the same user message. Both
        become siblings of the old message, which stays reachable.

        Args:
            conversation_id: the conversation.
            role: ``system``, ``user`` or ``assistant``.
            content: the text (the first part of it, for a ``pending`` reply).
            parent_id: ``"leaf"`` to append under the current leaf, ``None`` for a first message,
                or the id of a message of the same conversation.
            state: ``complete``, ``partial``, ``pending`` or ``error``.
            model: the model that wrote it (for replies).

        Returns:
            The saved message.

        Raises:
            HistoryError: unknown conversation or parent, a parent from another conversation, a bad
                role or state, or the write failed.
        """
        if role not in ROLES:
            raise HistoryError(self.path, f"unknown message role {role!r} (use one of {', '.join(ROLES)})")
        if state not in STATES:
            raise HistoryError(self.path, f"unknown message state {state!r} (use one of {', '.join(STATES)})")
        now = time.time()
        with self._transaction() as conn:
            found = conn.execute(
                "SELECT current_leaf_id FROM conversations WHERE id = ?", (conversation_id,)
            ).fetchone()
            if found is None:
                raise HistoryError(self.path, f"no conversation with id {conversation_id}")
            parent = found[0] if parent_id == "leaf" else parent_id
            if parent is not None:
                owner = conn.execute("SELECT conversation_id FROM messages WHERE id = ?", (parent,)).fetchone()
                if owner is None or owner[0] != conversation_id:
                    raise HistoryError(
                        self.path, f"message {parent} is not a message of conversation {conversation_id}"
                    )
            cursor = conn.execute(
                "INSERT INTO messages (conversation_id, parent_id, role, content, state, created_at, model)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (conversation_id, parent, role, content, state, now, model),
            )
            new_id = cast(int, cursor.lastrowid)
            conn.execute(
                "UPDATE conversations SET current_leaf_id = ?, updated_at = ? WHERE id = ?",
                (new_id, now, conversation_id),
            )
        return StoredMessage(
            id=new_id,
            conversation_id=conversation_id,
            parent_id=parent,
            role=role,
            content=content,
            state=cast(MessageState, state),
            created_at=now,
            stats=None,
            sources=None,
            model=model,
            error=None,
        )

    def finish_message(
        self,
        message_id: int,
        content: str,
        *,
        state: str,
        stats: Mapping[str, Any] | None = None,
        sources: Sequence[Mapping[str, Any]] | None = None,
        error: str | None = None,
    ) -> None:
        """Save a reply's final text, state, stats and sources (committed before returning).

        Args:
            message_id: the message (usually ``pending``).
            content: the whole text.
            state: ``complete``, ``partial`` (stopped) or ``error``.
            stats: generation stats (JSON-serialisable).
            sources: the cited passages (JSON-serialisable).
            error: what went wrong, for ``error``.

        Raises:
            HistoryError: unknown message or state, or the write failed.
        """
        if state not in STATES:
            raise HistoryError(self.path, f"unknown message state {state!r} (use one of {', '.join(STATES)})")
        with self._transaction() as conn:
            cursor = conn.execute(
                "UPDATE messages SET content = ?, state = ?, stats = ?, sources = ?, error = ? WHERE id = ?",
                (
                    content,
                    state,
                    _dumps(dict(stats) if stats is not None else None),
                    _dumps([dict(s) for s in sources] if sources is not None else None),
                    error,
                    message_id,
                ),
            )
            if cursor.rowcount == 0:
                raise HistoryError(self.path, f"no message with id {message_id}")
            conn.execute(
                "UPDATE conversations SET updated_at = ?"
                " WHERE id = (SELECT conversation_id FROM messages WHERE id = ?)",
                (time.time(), message_id),
            )

    def append_text(self, message_id: int, content: str) -> None:
        """Append ``content`` (the text streamed since the last call) to a reply and commit.

        A cheap periodic checkpoint while a reply streams; the state stays as it is (``pending``),
        so after a crash :meth:`recover_pending` marks the saved part ``partial``.

        Raises:
            HistoryError: unknown message, or the write failed.
        """
        with self._transaction() as conn:
            cursor = conn.execute("UPDATE messages SET content = content || ? WHERE id = ?", (content, message_id))
            if cursor.rowcount == 0:
                raise HistoryError(self.path, f"no message with id {message_id}")

    def thread(self, conversation_id: int) -> list[StoredMessage]:
        """The current branch: messages from the root to the conversation's current leaf."""
        rows = self._query(
            lambda c: c.execute(
                f"""WITH RECURSIVE chain(id, depth) AS (
                        SELECT current_leaf_id, 0 FROM conversations WHERE id = ?
                        UNION ALL
                        SELECT m.parent_id, chain.depth + 1 FROM messages m JOIN chain ON m.id = chain.id
                    )
                    SELECT {", ".join("m." + col for col in self._MESSAGE_COLUMNS.split(", "))}
                    FROM chain JOIN messages m ON m.id = chain.id ORDER BY chain.depth DESC""",
                (conversation_id,),
            ).fetchall()
        )
        return [self._message(row) for row in rows]

    def siblings(self, message_id: int) -> list[StoredMessage]:
        """The alternatives at this point of the tree (the message included), oldest first."""
        message = self.get_message(message_id)
        rows = self._query(
            lambda c: c.execute(
                f"SELECT {self._MESSAGE_COLUMNS} FROM messages WHERE conversation_id = ? AND parent_id IS ?"
                " ORDER BY created_at, id",
                (message.conversation_id, message.parent_id),
            ).fetchall()
        )
        return [self._message(row) for row in rows]

    def children(self, message_id: int) -> list[StoredMessage]:
        """The messages directly under this one, oldest first."""
        rows = self._query(
            lambda c: c.execute(
                f"SELECT {self._MESSAGE_COLUMNS} FROM messages WHERE parent_id = ? ORDER BY created_at, id",
                (message_id,),
            ).fetchall()
        )
        return [self._message(row) for row in rows]

    def select_branch(self, message_id: int) -> None:
        """Show the branch through this message: the current leaf becomes the newest leaf under it.

        Raises:
            HistoryError: there is no such message.
        """
        with self._transaction() as conn:
            row = conn.execute(
                """WITH RECURSIVE subtree(id) AS (
                        SELECT id FROM messages WHERE id = ?
                        UNION ALL
                        SELECT m.id FROM messages m JOIN subtree ON m.parent_id = subtree.id
                    )
                    SELECT m.id, m.conversation_id FROM subtree JOIN messages m ON m.id = subtree.id
                    WHERE NOT EXISTS (SELECT 1 FROM messages c WHERE c.parent_id = m.id)
                    ORDER BY m.created_at DESC, m.id DESC LIMIT 1""",
                (message_id,),
            ).fetchone()
            if row is None:
                raise HistoryError(self.path, f"no message with id {message_id}")
            conn.execute("UPDATE conversations SET current_leaf_id = ? WHERE id = ?", (row[0], row[1]))

    def search(self, query: str, limit: int = 50) -> list[SearchHit]:
        """Full-text search over all messages of conversations not deleted, best matches first.

        Any text is accepted: words are quoted (see :func:`fts_query`), so quotes, parentheses,
        ``*``, ``AND`` or unicode never raise.

        Args:
            query: what the user typed; every word must match (the last one as a prefix).
            limit: the most hits to return.

        Returns:
            The hits.
        """
        match = fts_query(query)
        if not match or limit <= 0:
            return []

        def run(conn: sqlite3.Connection) -> list[SearchHit]:
            # Rank first, then build snippets for the hits kept only: snippet() is the costly part.
            ranked = conn.execute(
                """SELECT m.id, m.conversation_id, c.title, m.role
                   FROM messages_fts f
                   JOIN messages m ON m.id = f.rowid
                   JOIN conversations c ON c.id = m.conversation_id
                   WHERE messages_fts MATCH ? AND c.deleted_at IS NULL
                   ORDER BY f.rank LIMIT ?""",
                (match, limit),
            ).fetchall()
            if not ranked:
                return []
            marks = ", ".join("?" * len(ranked))
            snippets = dict(
                conn.execute(
                    f"""SELECT rowid, snippet(messages_fts, 0, '**', '**', '…', 16) FROM messages_fts
                        WHERE messages_fts MATCH ? AND rowid IN ({marks})""",
                    (match, *(row[0] for row in ranked)),
                ).fetchall()
            )
            return [SearchHit(row[1], row[2], row[0], snippets.get(row[0], ""), row[3]) for row in ranked]

        return self._query(run)

    def recover_pending(self) -> int:
        """At startup: replies left ``pending`` by a crash become ``partial``.

        Returns:
            How many messages were recovered.
        """
        with self._transaction() as conn:
            return conn.execute("UPDATE messages SET state = 'partial' WHERE state = 'pending'").rowcount
