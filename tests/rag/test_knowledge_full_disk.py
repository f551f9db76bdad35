"""Knowledge bases on a full disk: said so in one line naming the folder, and nothing changed.

SQLite opening a write-ahead-log database on a full disk fails with "disk I/O error" (it cannot
grow the ``-shm`` file) and leaves an empty ``-wal`` and a ``-shm`` behind; writes fail with
"database or disk is full". Both are injected where SQLite raises them; one test fills a real small
tmpfs, where ``mount -t tmpfs`` works (root on Linux), and is skipped with the reason elsewhere.
"""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from standins import FakeEmbedder, TextParser, paragraph_chunks, write

from app.cli.main import main
from app.paths import Paths
from rag.errors import KnowledgeBaseError
from rag.knowledge import KnowledgeBases
from rag.registry import Registry
from tests.disk_support import fill, mounted_tmpfs


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with the sha256 of its bytes."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def home_with_a_kb(home: Path) -> Paths:
    """A Glassbox home whose registry holds a knowledge base "notes", as an earlier run left it."""
    paths = Paths.resolve(home).ensure()
    with Registry(paths.knowledge / "registry.sqlite3") as registry:
        registry.create_kb(
            "notes", embedder_id="fake", embedder_path=str(home / "model"), dimension=4,
            max_tokens=64, overlap_tokens=0, collection="glassbox-notes",
        )  # fmt: skip
    (paths.knowledge / "knowledge.lock").touch()
    return paths


class Volume:
    """``shutil.disk_usage`` answers ``free`` for ``folder`` (other folders answer for real)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, folder: Path, free: int) -> None:
        self.free = free
        real = shutil.disk_usage

        def usage(path: Any) -> Any:
            if Path(path) == folder:
                return shutil._ntuple_diskusage(10 * 2**30, 10 * 2**30 - self.free, self.free)  # type: ignore[attr-defined]
            return real(path)

        monkeypatch.setattr(shutil, "disk_usage", usage)


def kb_add(capsys: pytest.CaptureFixture[str], paths: Paths, docs: Path) -> tuple[int, str, str]:
    code = main(["kb", "add", "notes", str(docs), "--home", str(paths.data.parent)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    folder = tmp_path / "docs"
    write(folder, "kiwi.txt", "The kiwi is a flightless bird that lives in New Zealand.\n")
    return folder


def test_kb_add_on_a_full_home_says_the_disk_is_full_and_changes_nothing(
    tmp_path: Path, docs: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = home_with_a_kb(tmp_path / "home")
    before = snapshot(paths.knowledge)
    Volume(monkeypatch, paths.knowledge, 0)
    code, out, err = kb_add(capsys, paths, docs)
    assert code == 1
    assert out == ""
    assert err == (
        f"glassbox: error: {paths.knowledge}: the disk is full (0 bytes free there); "
        "nothing was changed; free some space, then try again\n"
    )
    assert snapshot(paths.knowledge) == before


class FullOnOpen:
    """A connection on a disk that fills as it opens: switching to WAL fails as SQLite fails there."""

    def __init__(self, conn: sqlite3.Connection, path: Path, volume: Volume, error: str) -> None:
        self._conn, self._path, self._volume, self._error = conn, path, volume, error

    def execute(self, sql: str, *args: Any) -> Any:
        if sql.replace(" ", "").upper().startswith("PRAGMAJOURNAL_MODE"):
            self._volume.free = 0
            Path(f"{self._path}-wal").touch()  # what SQLite leaves when it cannot grow the -shm
            Path(f"{self._path}-shm").write_bytes(b"\0\0\0")
            raise sqlite3.OperationalError(self._error)
        return self._conn.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


@pytest.mark.parametrize(
    ("existing", "error"),
    [(True, "disk I/O error"), (False, "database or disk is full")],
    ids=["registry-io-error", "new-registry-full"],
)
def test_a_disk_that_fills_while_the_registry_opens_is_said_so_and_no_file_is_left_behind(
    tmp_path: Path,
    docs: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    existing: bool,
    error: str,
) -> None:
    if existing:
        paths = home_with_a_kb(tmp_path / "home")
    else:
        paths = Paths.resolve(tmp_path / "home").ensure()
    registry = paths.knowledge / "registry.sqlite3"
    before = snapshot(paths.knowledge)
    volume = Volume(monkeypatch, paths.knowledge, 10 * 2**30)  # room when the command starts
    real_connect = sqlite3.connect

    def connect(database: Any, *args: Any, **kwargs: Any) -> Any:
        conn = real_connect(database, *args, **kwargs)
        return FullOnOpen(conn, registry, volume, error) if str(database) == str(registry) else conn

    monkeypatch.setattr(sqlite3, "connect", connect)
    code, _out, err = kb_add(capsys, paths, docs)
    assert code == 1
    assert err.startswith(f"glassbox: error: {paths.knowledge}: the disk is full (0 bytes free there); ")
    assert "nothing was changed" in err
    assert "not a usable registry" not in err
    assert err.count("\n") == 1
    after = snapshot(paths.knowledge)
    after.pop("knowledge.lock", None)  # the folder lock (an empty file) stays, as after any run
    before.pop("knowledge.lock", None)
    assert after == before  # the registry as it was; no -wal, -shm or new empty registry left


def test_an_io_error_with_room_on_the_disk_is_not_called_a_full_disk(
    tmp_path: Path, docs: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = home_with_a_kb(tmp_path / "home")
    registry = paths.knowledge / "registry.sqlite3"
    real_connect = sqlite3.connect

    class IoError:
        def __init__(self, conn: sqlite3.Connection) -> None:
            self._conn = conn

        def execute(self, sql: str, *args: Any) -> Any:
            if sql.replace(" ", "").upper().startswith("PRAGMAJOURNAL_MODE"):
                raise sqlite3.OperationalError("disk I/O error")
            return self._conn.execute(sql, *args)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._conn, name)

    def connect(database: Any, *args: Any, **kwargs: Any) -> Any:
        conn = real_connect(database, *args, **kwargs)
        return IoError(conn) if str(database) == str(registry) else conn

    monkeypatch.setattr(sqlite3, "connect", connect)
    code, _out, err = kb_add(capsys, paths, docs)
    assert code == 1
    assert err == f"glassbox: error: {registry}: not a usable registry (disk I/O error)\n"


class FullOnCommit:
    """A registry connection whose commits fail as on a full disk (SQLite rolls back first)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self.full = True

    def execute(self, sql: str, *args: Any) -> Any:
        if self.full and sql.strip().upper() == "COMMIT":
            self._conn.execute("ROLLBACK")
            raise sqlite3.OperationalError("database or disk is full")
        return self._conn.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def test_indexing_the_disk_stops_is_said_so_and_what_was_indexed_stays(
    tmp_path: Path, docs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    root = tmp_path / "kb"
    with KnowledgeBases(
        root, model, embedder_factory=lambda _folder: FakeEmbedder(), parser=TextParser(), chunker=paragraph_chunks
    ) as kbs:
        kbs.create("notes", embedder_path=model)
        first = kbs.add("notes", [docs])
        assert first.indexed == 1
        indexed = kbs.documents("notes")
        write(docs, "lighthouse.md", "# Lighthouses\n\nThe Pharos of Alexandria was a wonder.\n")
        full = FullOnCommit(kbs.registry._db)
        kbs.registry._db = full  # type: ignore[assignment]
        with pytest.raises(KnowledgeBaseError) as caught:
            kbs.add("notes", [docs])
        message = str(caught.value)
        assert message.startswith(f"{root}: the disk is full (")
        assert message.endswith("what was indexed before it filled up is kept; free some space, then run it again")
        assert kbs.documents("notes") == indexed  # the refused transaction left the registry as it was

        full.full = False  # space again: the same command finishes the job
        again = kbs.add("notes", [docs])
        assert (again.indexed, again.unchanged) == (1, 1)


# ---------------------------------------------------------------------------- a real full tmpfs
@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs, where ``mount -t tmpfs`` works (root on Linux)."""
    yield from mounted_tmpfs(tmp_path, "4m")


def test_kb_add_on_a_real_full_tmpfs_home(tmpfs: Path, docs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = home_with_a_kb(tmpfs / "home")
    fill(tmpfs)
    before = snapshot(paths.knowledge)
    code, _out, err = kb_add(capsys, paths, docs)
    assert code == 1
    assert err == (
        f"glassbox: error: {paths.knowledge}: the disk is full (0 bytes free there); "
        "nothing was changed; free some space, then try again\n"
    )
    assert snapshot(paths.knowledge) == before
