"""Conversation history in SQLite: conversations, a tree of messages, full-text search.

Durability (ARCHITECTURE.md "Data layout", ROBUSTNESS.md P2/P3/P7): WAL journal, ``synchronous=FULL``
and every write committed at once, so a ``kill -9`` or a power cut loses at most the write in
flight. The schema is versioned by named migrations (a ``migrations`` table); before
migrating a database that already has a schema, it is copied with SQLite's backup API to
``<name>.bak-v<N>`` next to it, where N is the number of migrations it had.

Contract: ARCHITECTURE.md, 'engine.history'.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal, cast

from engine.errors import HistoryError
from engine.history_db import HistoryDatabase
from engine.history_schema import ROLES, STATES, Conversation, MessageState, SearchHit, StoredMessage, fts_query
from engine.media import MediaRef

__all__ = ["HistoryStore"]

_UNSET: Any = object()


def _loads(text: object, kind: type[dict[str, Any]] | type[list[Any]]) -> Any:
    """A row's JSON column (``stats``, ``sources``); a damaged one is None (its message's text stays
    readable), as a damaged ``media`` record is left out."""
    if not isinstance(text, str):  # a flipped bit in the record can make the column a number or a blob
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, kind) else None


def _dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, sort_keys=True)


def _media_refs(text: object) -> tuple[MediaRef, ...]:
    """A row's attachments; a damaged record is left out (its message's text stays readable)."""
    if not text or not isinstance(text, str):
        return ()
    try:
        records = json.loads(text)
    except ValueError:
        return ()
    refs = []
    for record in records if isinstance(records, list) else []:
        try:
            refs.append(MediaRef.from_dict(record))
        except (ValueError, TypeError):
            continue
    return tuple(refs)


class HistoryStore(HistoryDatabase):
    """The chat history: conversations and their tree of messages, over :class:`HistoryDatabase`.

    Args:
        path: the database file (``Paths.history_db``); created with its folder if missing.

    Raises:
        HistoryError: the file is not an SQLite database, is corrupt or cannot be opened.
    """

    # ------------------------------------------------------------------ conversations
    _CONVERSATION_COLUMNS = (
        "id, title, created_at, updated_at, system_prompt, settings, knowledge_bases, deleted_at, current_leaf_id,"
        " model"
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
            model=row[9] if isinstance(row[9], str) and row[9] else None,  # a damaged value costs only itself
        )

    def create_conversation(
        self,
        title: str = "New chat",
        system_prompt: str | None = None,
        settings: Mapping[str, Any] | None = None,
        model: str | None = None,
    ) -> Conversation:
        """Create and save a conversation.

        Args:
            title: its title.
            system_prompt: its system prompt.
            settings: per-conversation settings (JSON-serialisable).
            model: the model it uses (:attr:`Conversation.model`; None: none yet).

        Returns:
            The new conversation.
        """
        now = time.time()
        with self._transaction() as conn:
            cursor = conn.execute(
                "INSERT INTO conversations (title, created_at, updated_at, system_prompt, settings, model)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (title, now, now, system_prompt, _dumps(dict(settings or {})), model),
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
        model: str | None = _UNSET,
    ) -> None:
        """Change the given fields of a conversation; the others stay as they are (``model``: the
        model it uses, :attr:`Conversation.model`). Its place in the list does not change."""
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
        if model is not _UNSET:
            columns.append("model = ?")
            values.append(model)
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
    _MESSAGE_COLUMNS = (
        "id, conversation_id, parent_id, role, content, state, created_at, stats, sources, model, error, media"
    )

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
            stats=_loads(row[7], dict),
            sources=_loads(row[8], list),
            model=row[9],
            error=row[10],
            media=_media_refs(row[11]),
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
        media: Sequence[MediaRef] = (),
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
            media: a user message's images and clips (their bytes kept by the caller in an
                :class:`engine.media_store.MediaStore` first, so a row never names a missing file).

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
            refs = _dumps([ref.to_dict() for ref in media]) if media else None
            cursor = conn.execute(
                "INSERT INTO messages (conversation_id, parent_id, role, content, state, created_at, model, media)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (conversation_id, parent, role, content, state, now, model, refs),
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
            media=tuple(media),
        )

    def media_in_use(self) -> set[str]:
        """The digests of every attachment a message refers to (deleted chats' too, until purged)."""
        rows = self._query(lambda c: c.execute("SELECT media FROM messages WHERE media IS NOT NULL").fetchall())
        return {ref.digest for row in rows for ref in _media_refs(row[0])}

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
