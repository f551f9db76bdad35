"""Chat histories as earlier versions of Glassbox wrote them, built by the tests from the shipped
schema steps (``engine.history_schema.MIGRATIONS``, append only)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from engine.history_schema import MIGRATIONS


def previous_version_history(path: Path) -> None:
    """Writes at ``path`` the history the version before ``m004_conversation_model`` left: a chat
    (id 1, "Old chat") with its own settings and a reply, and no model column."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
        conn.execute("BEGIN")
        for migration in MIGRATIONS[:3]:
            migration.apply(conn)
            conn.execute("INSERT INTO migrations VALUES (?, 0)", (migration.name,))
        conn.execute(
            "INSERT INTO conversations (id, title, created_at, updated_at, settings)"
            """ VALUES (1, 'Old chat', 1, 1, '{"adapters": [], "preset": "precise"}')"""
        )
        conn.execute(
            "INSERT INTO messages (id, conversation_id, parent_id, role, content, state, created_at, model)"
            " VALUES (1, 1, NULL, 'assistant', 'an answer', 'complete', 1, 'Qwen3 0.6B')"
        )
        conn.execute("UPDATE conversations SET current_leaf_id = 1 WHERE id = 1")
        conn.execute("COMMIT")
    finally:
        conn.close()
