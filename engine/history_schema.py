"""What the chat history database holds: its records, its schema migrations and its search syntax.

Owns the row types :class:`Conversation`, :class:`StoredMessage` and :class:`SearchHit`, the
message roles and states, the named schema steps (:data:`MIGRATIONS`, append only) and
:func:`fts_query` (free text as a safe FTS5 query). The store itself is
:class:`engine.history.HistoryStore`; opening the file safely is :mod:`engine.history_db`.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any, Final, Literal

from engine.media import MediaRef

__all__ = [
    "MIGRATIONS",
    "MIN_PREFIX",
    "ROLES",
    "STATES",
    "Conversation",
    "MessageState",
    "Migration",
    "SearchHit",
    "StoredMessage",
    "fts_query",
]

MessageState = Literal["complete", "partial", "pending", "error"]
STATES: Final = ("complete", "partial", "pending", "error")
ROLES: Final = ("system", "user", "assistant")
MIN_PREFIX: Final = 3


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
    model: str | None = None
    """The model the chat uses, as the window names a choice (``app.compose.model_key``: a library
    file's path, or a saved endpoint's model); None: none recorded yet (a chat an older version wrote)."""


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
    media: tuple[MediaRef, ...] = ()
    """A user message's images and clips (their bytes: engine/media_store.py), in order."""


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
    Migration(
        "m003_media",
        # A user message's attachments: a JSON list of MediaRef records (the bytes are files
        # named by their SHA-256 under the data folder's media/).
        ("ALTER TABLE messages ADD COLUMN media TEXT",),
    ),
    Migration(
        "m004_conversation_model",
        # The model a chat uses (its model_key text), written on each reply and when the user picks
        # one while the chat is open; older chats have none.
        ("ALTER TABLE conversations ADD COLUMN model TEXT",),
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
