"""A registry written by a newer Glassbox is refused in one line naming the file, and left byte for byte
as it was (its ``-wal`` too); a column this version does not know never shifts the ones it does.

The newer files are written here as that version would: the schema with more columns, a higher
``schema_version``, and its last transaction still in the ``-wal`` (the newer app was killed).
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from app.paths import Paths
from rag.errors import KnowledgeBaseError
from rag.registry import SCHEMA_VERSION, KnowledgeBaseInfo, Registry

FUTURE = 7


def _make_kb(registry: Registry, name: str = "notes") -> KnowledgeBaseInfo:
    return registry.create_kb(
        name, embedder_id="m", embedder_path="/m", dimension=4, max_tokens=64, overlap_tokens=8, collection=name
    )


def _future_registry(path: Path, version: int = FUTURE) -> None:
    """Writes at ``path`` the registry a newer Glassbox left: new columns, ``version``, a live ``-wal``."""
    writer = path.parent / "writer" / path.name
    with Registry(writer) as registry:
        _make_kb(registry)
    db = sqlite3.connect(writer, isolation_level=None)
    try:
        db.execute("ALTER TABLE kbs ADD COLUMN chunker TEXT NOT NULL DEFAULT 'sentences'")
        db.execute("ALTER TABLE documents ADD COLUMN language TEXT")
        db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(version),))
        db.execute(
            "INSERT INTO kbs(name, embedder_id, embedder_path, dimension, max_tokens, overlap_tokens,"
            " collection, created_at, chunker) VALUES ('papers', 'm', '/m', 4, 64, 8, 'papers', 0, 'pages')"
        )
        # Copied while the writer is still open, as a kill -9 leaves them: the newest rows are only in the -wal.
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        for suffix in ("", "-wal"):
            shutil.copyfile(f"{writer}{suffix}", f"{path}{suffix}")
            os.chmod(f"{path}{suffix}", 0o600)  # private, as Glassbox keeps them
    finally:
        db.close()
    shutil.rmtree(writer.parent)
    assert Path(f"{path}-wal").stat().st_size > 0


def _snapshot(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (path, Path(f"{path}-wal")) if p.exists()}


def test_a_newer_registry_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "knowledge" / "registry.sqlite3"
    _future_registry(path)
    before = _snapshot(path)
    assert set(before) == {"registry.sqlite3", "registry.sqlite3-wal"}
    with pytest.raises(KnowledgeBaseError) as caught:
        Registry(path)
    message = str(caught.value)
    assert message == (
        f"{path}: written by a newer Glassbox (schema {FUTURE}; this one reads up to {SCHEMA_VERSION});"
        " it was left untouched"
    )
    assert _snapshot(path) == before  # neither the file nor its -wal changed


def test_a_newer_registry_without_a_wal_gets_no_side_files_either(tmp_path: Path) -> None:
    path = tmp_path / "registry.sqlite3"
    with Registry(path) as registry:
        _make_kb(registry)
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value = '12' WHERE key = 'schema_version'")
    db.commit()
    db.close()  # checkpointed: the newer version closed cleanly
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert set(before) == {"registry.sqlite3"}
    expected = f"written by a newer Glassbox (schema 12; this one reads up to {SCHEMA_VERSION})"
    with pytest.raises(KnowledgeBaseError, match=re.escape(expected)):
        Registry(path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no -wal, no -shm


def test_a_column_this_version_does_not_know_is_read_by_name(tmp_path: Path) -> None:
    path = tmp_path / "registry.sqlite3"
    with Registry(path) as registry:
        kb = _make_kb(registry)
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE kbs ADD COLUMN colour TEXT DEFAULT 'blue'")  # a version that did not bump the schema
    db.commit()
    db.close()
    with Registry(path) as registry:
        assert registry.list_kbs() == [kb]
        assert registry.get_kb("notes") == kb
        made = _make_kb(registry, "more")
        assert made.name == "more" and made.collection == "more" and made.dimension == 4


def _glassbox(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", "kb", *args, "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


@pytest.mark.parametrize("action", ["list", "add"])
def test_kb_commands_refuse_a_newer_registry_in_one_line(tmp_path: Path, action: str) -> None:
    home = tmp_path / "home"
    path = Paths.resolve(home).ensure().knowledge / "registry.sqlite3"  # folders as Glassbox makes them
    _future_registry(path)
    before = _snapshot(path)
    document = tmp_path / "doc.txt"
    document.write_text("Some words worth indexing.\n")
    args = ["list"] if action == "list" else ["add", "notes", str(document)]
    result = _glassbox(home, *args)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        f"glassbox: error: {path}: written by a newer Glassbox (schema {FUTURE}; this one reads up to"
        f" {SCHEMA_VERSION}); it was left untouched"
    ]
    assert result.stdout == ""
    assert _snapshot(path) == before
