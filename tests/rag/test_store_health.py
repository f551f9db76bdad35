"""ROBUSTNESS P5: a damaged Chroma folder is found in a child process, moved aside and rebuilt
from the registry; a healthy one is checked once and then skipped while its files are unchanged."""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from multiprocessing.connection import Connection
from pathlib import Path

import pytest
from standins import MakeKbs, TextParser, paragraph_chunks, write

from rag import store_health
from rag.knowledge import KnowledgeBases
from rag.store_health import check_store, probe

DOCS = {
    "bees.txt": "Honey bees dance to tell their hive where the flowers with nectar are.",
    "trains.txt": "The night train leaves the station at eleven and reaches the coast by dawn.",
    "bread.txt": "Knead the dough for ten minutes, let it rise, then bake the loaf until golden.",
}


def _build(make_kbs: MakeKbs, tmp_path: Path) -> tuple[Path, int]:
    """A closed knowledge base 'notes' with three one-chunk documents; returns its root and chunk count."""
    docs = tmp_path / "docs"
    for name, text in DOCS.items():
        write(docs, name, text)
    kbs = make_kbs(parser=TextParser(), chunker=paragraph_chunks)
    kbs.create("notes")
    report = kbs.add("notes", [docs])
    assert report.indexed == len(DOCS)
    chunks = report.chunks_added
    kbs.close()
    return kbs.root, chunks


def _segment(root: Path) -> Path:
    segments = sorted(p.parent for p in (root / "chroma").glob("*/header.bin"))
    assert segments, "the test store has no HNSW segment to damage"
    return segments[0]


def _truncate_data(root: Path) -> None:
    with (_segment(root) / "data_level0.bin").open("r+b") as fh:
        fh.truncate(5)


def _garbage_header(root: Path) -> None:
    (_segment(root) / "header.bin").write_bytes(os.urandom(100))


def _delete_sqlite(root: Path) -> None:
    (root / "chroma" / "chroma.sqlite3").unlink()


def _garbage_sqlite(root: Path) -> None:
    # Passes the file checks; only opening it in the child can tell.
    with (root / "chroma" / "chroma.sqlite3").open("r+b") as fh:
        fh.write(b"this is not a database at all!!!" * 4)


@pytest.mark.model
@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (_truncate_data, "data_level0.bin is truncated"),
        (_garbage_header, "header.bin is not a valid HNSW header"),
        (_delete_sqlite, "chroma.sqlite3 is missing"),
        (_garbage_sqlite, "chroma index unreadable"),
    ],
    ids=["truncated-data", "garbage-header", "no-sqlite", "garbage-sqlite"],
)
def test_damage_is_detected_moved_aside_and_rebuilt(
    make_kbs: MakeKbs, tmp_path: Path, damage: object, expected: str
) -> None:
    root, chunks = _build(make_kbs, tmp_path)
    chats = tmp_path / "history.sqlite3"  # stands for the app's other data beside the knowledge folder
    sqlite3.connect(chats).execute("CREATE TABLE t(x)").connection.close()
    before = chats.read_bytes()
    assert callable(damage)
    damage(root)

    kbs = make_kbs(parser=TextParser(), chunker=paragraph_chunks)
    assert kbs.recovered is not None
    assert expected in kbs.recovered.reason
    assert kbs.recovered.reason.startswith("chroma index unreadable: ")
    moved = kbs.recovered.moved_to
    assert moved.parent == root and moved.name.startswith("chroma.damaged-") and moved.is_dir()
    assert (root / "chroma").is_dir()
    # Every chunk is pending; the fresh store has no vectors, so search is keyword-only meanwhile.
    assert kbs.pending() == chunks
    assert all(p.dense_score is None for p in kbs.query("notes", "when does the train leave"))

    progress: list[tuple[str, int, int | None]] = []
    report = kbs.rebuild(progress=lambda p: progress.append((p.state, p.chunks_done, p.chunks_total)))
    assert report.chunks_added == chunks and not report.cancelled
    assert progress[0] == ("rebuilding", 0, chunks)
    assert progress[-1] == ("done", chunks, chunks)
    assert kbs.pending() == 0
    best = kbs.query("notes", "when does the train leave", k=1)[0]
    assert Path(best.path).name == "trains.txt"
    assert best.dense_score is not None and best.dense_score > 0.3
    assert chats.read_bytes() == before
    kbs.close()

    # The rebuilt store is recorded as good: reopening neither moves nor checks it again.
    again = make_kbs(parser=TextParser(), chunker=paragraph_chunks)
    assert again.recovered is None
    assert Path(again.query("notes", "baking bread", k=1)[0].path).name == "bread.txt"


@pytest.mark.model
def test_only_the_newest_damaged_copy_is_kept(make_kbs: MakeKbs, tmp_path: Path) -> None:
    root, _ = _build(make_kbs, tmp_path)
    older = root / "chroma.damaged-20000101T000000Z"
    older.mkdir()
    (older / "old.bin").write_bytes(b"x")
    _truncate_data(root)
    kbs = make_kbs(parser=TextParser(), chunker=paragraph_chunks)
    assert kbs.recovered is not None
    assert not older.exists()
    assert sorted(p.name for p in root.glob("chroma.damaged-*")) == [kbs.recovered.moved_to.name]


@pytest.mark.model
def test_a_healthy_store_is_checked_once_then_skipped(
    make_kbs: MakeKbs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, _ = _build(make_kbs, tmp_path)
    folder = root / "chroma"
    calls: list[Path] = []

    def counting_probe(path: Path, **kwargs: object) -> str | None:
        calls.append(path)
        return probe(path, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(store_health, "probe", counting_probe)
    # The close after indexing vouched for the files this process wrote: no child.
    assert check_store(folder) is None
    assert calls == []
    store_health.forget_healthy(folder)
    assert check_store(folder) is None
    assert calls == [folder]
    assert check_store(folder) is None
    assert calls == [folder]
    # Any change to the files (here only an mtime) makes the next open check again.
    sqlite_file = folder / "chroma.sqlite3"
    st = sqlite_file.stat()
    os.utime(sqlite_file, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert check_store(folder) is None
    assert calls == [folder, folder]


def test_missing_or_empty_folder_is_healthy_without_a_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_probe(path: Path, **kwargs: object) -> str | None:
        raise AssertionError("no child for an empty store")

    monkeypatch.setattr(store_health, "probe", no_probe)
    assert check_store(tmp_path / "absent") is None
    (tmp_path / "empty").mkdir()
    assert check_store(tmp_path / "empty") is None


def test_a_server_store_is_not_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_check(folder: Path, **kwargs: object) -> None:
        raise AssertionError("a Chroma server is not a local folder to check")

    monkeypatch.setattr("rag.knowledge.recover_if_damaged", no_check)
    with KnowledgeBases(tmp_path / "kb", chroma_url="http://127.0.0.1:9") as kbs:
        assert kbs.recovered is None


# Child targets for the spawned check: module-level so the child can import them by name.
def hanging_target(conn: Connection, folder: str) -> None:
    conn.send(("ready", None))
    time.sleep(600)


def crashing_target(conn: Connection, folder: str) -> None:
    conn.send(("ready", None))
    os.kill(os.getpid(), signal.SIGSEGV)


def _some_store(tmp_path: Path) -> Path:
    folder = tmp_path / "chroma"
    folder.mkdir()
    (folder / "chroma.sqlite3").write_bytes(b"")
    return folder


def test_a_hanging_check_is_killed_at_the_timeout(tmp_path: Path) -> None:
    folder = _some_store(tmp_path)
    started = time.monotonic()
    reason = check_store(folder, timeout_s=1.0, target=hanging_target)
    assert reason == "the check timed out (after 1 s)"
    assert time.monotonic() - started < 30  # a hang guard: the check hangs 600 s; this takes ~1.3 s here
    assert not store_health.fingerprint_path(folder).exists()


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="POSIX signals")
def test_a_crashing_check_names_the_signal(tmp_path: Path) -> None:
    folder = _some_store(tmp_path)
    assert check_store(folder, timeout_s=30.0, target=crashing_target) == "the check crashed (killed by SIGSEGV)"


def test_a_failed_move_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _some_store(tmp_path)

    def refuse(self: Path, target: Path) -> Path:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "rename", refuse)
    with pytest.raises(store_health.KnowledgeBaseError, match=r"chroma: the damaged index cannot be moved aside"):
        store_health.set_aside(folder)
    assert folder.is_dir()
