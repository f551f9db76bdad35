"""A chat history written by a newer Glassbox is refused in one line that says so, and left byte for byte
as it was: the file, its ``-wal`` (never checkpointed into it), and no migration backup made.

The newer files are written here as that version would: a schema step this one does not know
(``m003_message_parts``, which renames ``messages.content``), still in the ``-wal`` of a killed app.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from engine.errors import HistoryError
from engine.history import HistoryStore
from engine.history_schema import MIGRATIONS


def _current_history(path: Path) -> None:
    with HistoryStore(path) as store:
        conversation = store.create_conversation("Trip", system_prompt="Be brief.")
        question = store.add_message(conversation.id, "user", "Where should we go?")
        store.add_message(conversation.id, "assistant", "Lisbon.", parent_id=question.id)


_NEWER_STEP = (
    "DROP TRIGGER messages_fts_insert",
    "DROP TRIGGER messages_fts_delete",
    "DROP TRIGGER messages_fts_update",
    "ALTER TABLE messages RENAME COLUMN content TO body",
    "CREATE TABLE message_parts (message_id INTEGER NOT NULL, idx INTEGER NOT NULL, kind TEXT NOT NULL)",
    "INSERT INTO migrations (name, applied_at) VALUES ('m003_message_parts', 0)",
)


def _newer_history(path: Path) -> None:
    """Writes at ``path`` the history a newer Glassbox left when it was killed: its step in the ``-wal``."""
    writer = path.parent / "writer" / path.name
    _current_history(writer)
    db = sqlite3.connect(writer, isolation_level=None)
    try:
        for statement in _NEWER_STEP:
            db.execute(statement)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        for suffix in ("", "-wal"):  # copied while the writer is open, as a kill -9 leaves them
            shutil.copyfile(f"{writer}{suffix}", f"{path}{suffix}")
            os.chmod(f"{path}{suffix}", 0o600)
    finally:
        db.close()
    shutil.rmtree(writer.parent)
    assert Path(f"{path}-wal").stat().st_size > 0


def _snapshot(path: Path) -> dict[str, bytes]:
    """Every file of the history but the ``-shm`` (a rebuildable index, not data)."""
    return {p.name: p.read_bytes() for p in path.parent.iterdir() if p.is_file() and not p.name.endswith("-shm")}


def test_a_newer_history_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "data" / "history.sqlite3"
    _newer_history(path)
    before = _snapshot(path)
    assert set(before) == {"history.sqlite3", "history.sqlite3-wal"}
    with pytest.raises(HistoryError) as caught:
        HistoryStore(path)
    assert str(caught.value) == (
        f"{path}: written by a newer Glassbox (schema {len(MIGRATIONS) + 1}; this one reads up to"
        f" {len(MIGRATIONS)}); it was left untouched"
    )
    assert _snapshot(path) == before  # the file and its -wal unchanged, no .bak-v* made
    # And the newer version still finds its step and its messages.
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT body FROM messages ORDER BY id").fetchall() == [
            ("Where should we go?",),
            ("Lisbon.",),
        ]
        assert ("m003_message_parts",) in db.execute("SELECT name FROM migrations").fetchall()
    finally:
        db.close()


def test_a_history_with_a_step_this_version_does_not_know_says_which(tmp_path: Path) -> None:
    path = tmp_path / "data" / "history.sqlite3"
    _current_history(path)
    db = sqlite3.connect(path)
    db.execute("UPDATE migrations SET name = 'm002_fork\nsecond line' WHERE name = 'm002_fts'")
    db.commit()
    db.close()
    before = _snapshot(path)
    with pytest.raises(HistoryError) as caught:
        HistoryStore(path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: written by another Glassbox")
    assert "m002_fork second line" in message
    assert message.endswith("it was left untouched")
    assert _snapshot(path) == before


def test_the_current_history_still_opens_after_the_version_check(tmp_path: Path) -> None:
    path = tmp_path / "data" / "history.sqlite3"
    _current_history(path)
    with HistoryStore(path) as store:
        assert store.schema_version == len(MIGRATIONS)
        [conversation] = store.list_conversations()
        assert [m.content for m in store.thread(conversation.id)] == ["Where should we go?", "Lisbon."]
