"""The chat history is private: the database, its WAL/SHM files and its migration backups are 0600.

The tests run under an ordinary umask (022), where SQLite alone creates files 0644, so each one
fails if the history is created, or kept, readable by other accounts.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.history import HistoryStore
from engine.history_schema import MIGRATIONS
from tests.disk_support import file_mode

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX permission bits")


@pytest.fixture(params=[0o022, 0o002, 0o000], ids=["umask-022", "umask-002", "umask-000"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    """Runs the test under a usual (or a lax) umask, restoring the old one after."""
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "history.sqlite3"


def test_new_history_with_its_wal_and_shm_files_is_owner_only(db_path: Path, umask: int) -> None:
    with HistoryStore(db_path) as store:
        conversation = store.create_conversation("a private chat")
        store.add_message(conversation.id, "user", "something nobody else may read")
        wal = db_path.with_name("history.sqlite3-wal")
        shm = db_path.with_name("history.sqlite3-shm")
        assert wal.exists() and shm.exists()  # WAL mode, open: both side files are there now
        assert {p.name: file_mode(p) for p in (db_path, wal, shm)} == {
            "history.sqlite3": 0o600,
            "history.sqlite3-wal": 0o600,
            "history.sqlite3-shm": 0o600,
        }
    assert file_mode(db_path.parent) == 0o700  # the folder the store created


def test_the_file_is_owner_only_before_sqlite_opens_it(
    db_path: Path, umask: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []
    real_connect = sqlite3.connect

    def connect(path: Path, *args: Any, **kwargs: Any) -> sqlite3.Connection:
        seen.append(file_mode(Path(path)))  # the file must already exist, owner-only
        conn: sqlite3.Connection = real_connect(path, *args, **kwargs)
        return conn

    monkeypatch.setattr(sqlite3, "connect", connect)  # the module engine.history_db calls
    with HistoryStore(db_path):
        pass
    assert seen == [0o600]


def _old_schema_db(path: Path) -> None:
    """A database as the first released schema wrote it (made 0644 by SQLite under umask 022)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
    conn.execute("BEGIN")
    MIGRATIONS[0].apply(conn)
    conn.execute("INSERT INTO migrations VALUES (?, 0)", (MIGRATIONS[0].name,))
    conn.execute("COMMIT")
    conn.close()


def test_migration_backup_is_owner_only(db_path: Path, umask: int) -> None:
    _old_schema_db(db_path)
    with HistoryStore(db_path) as store:
        assert store.schema_version == len(MIGRATIONS)
    backup = db_path.with_name("history.sqlite3.bak-v1")
    assert backup.exists()
    assert file_mode(backup) == 0o600
    assert file_mode(db_path) == 0o600


def test_loose_files_of_an_older_version_are_made_owner_only_once_and_logged(
    db_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with HistoryStore(db_path):
        pass
    backup = db_path.with_name("history.sqlite3.bak-v1")
    backup.write_bytes(b"")
    for path in (db_path, backup):
        path.chmod(0o644)

    with caplog.at_level(logging.WARNING), HistoryStore(db_path):
        pass
    assert file_mode(db_path) == 0o600
    assert file_mode(backup) == 0o600
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"{db_path}: other users could read it (mode 644); made it owner-only (600)" in said
    assert f"{backup}: other users could read it (mode 644); made it owner-only (600)" in said

    caplog.clear()
    with caplog.at_level(logging.WARNING), HistoryStore(db_path):
        pass
    assert [r.getMessage() for r in caplog.records if "owner-only" in r.getMessage()] == []  # once
