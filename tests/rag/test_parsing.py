"""The parser child: results cross the pipe intact; hangs, crashes, memory hogs and bugs skip one file."""

from __future__ import annotations

import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from doc_fixtures import (
    buggy_loader,
    crashing_loader,
    greedy_loader,
    hanging_loader,
    write_encrypted_pdf,
    write_pdf,
    write_pdf_bomb,
)

from rag.errors import DocumentError
from rag.parsing import ParseCancelled, ParserPool, parse_document


@pytest.fixture(scope="module")
def pool() -> Iterator[ParserPool]:
    """One child for the tests that use the real loader (spawning costs about a second here)."""
    with ParserPool() as shared:
        yield shared


def note(path: Path, text: str = "A short note.") -> Path:
    path.write_text(text)
    return path


def test_parse_document_in_a_child(tmp_path: Path) -> None:
    path = write_pdf(tmp_path / "two.pdf", ["Page one.", "Page two."])
    doc = parse_document(path, timeout_s=30)
    assert doc.path == path
    assert doc.kind == "pdf"
    assert doc.n_pages == 2
    assert [(s.page, s.text) for s in doc.sections] == [(1, "Page one."), (2, "Page two.")]


def test_pool_reuses_one_child(pool: ParserPool, tmp_path: Path) -> None:
    first = pool.parse(note(tmp_path / "a.txt", "alpha"))
    pid = pool.pid
    second = pool.parse(note(tmp_path / "b.md", "# beta\n\ntext"))
    assert first.full_text() == "alpha"
    assert second.sections[0].heading == "beta"
    assert pid is not None
    assert pool.pid == pid


def test_document_errors_come_back_typed(pool: ParserPool, tmp_path: Path) -> None:
    locked = write_encrypted_pdf(tmp_path / "locked.pdf")
    with pytest.raises(DocumentError) as info:
        pool.parse(locked)
    assert str(info.value) == f"{locked}: skipped: password-protected"
    assert pool.parse(note(tmp_path / "after.txt")).full_text() == "A short note."


def test_pdf_bomb_with_default_limits(pool: ParserPool, tmp_path: Path) -> None:
    bomb = write_pdf_bomb(tmp_path / "bomb.pdf")  # 80 MB inflated, above the 64 MB stream limit
    with pytest.raises(DocumentError, match="skipped: could not be parsed safely"):
        pool.parse(bomb)


def test_too_large_is_refused_before_parsing(tmp_path: Path) -> None:
    path = note(tmp_path / "big.txt", "x" * (2 * 2**20 + 10))
    with ParserPool(max_file_bytes=2**20) as small:
        with pytest.raises(DocumentError) as info:
            small.parse(path)
        assert small.pid is None  # no child was started for it
    assert info.value.reason == "skipped: too large: 2.0 MB, limit 1 MB"


def test_missing_file(pool: ParserPool, tmp_path: Path) -> None:
    with pytest.raises(DocumentError, match="file not found"):
        pool.parse(tmp_path / "vanished.txt")


def test_hang_is_killed_and_the_batch_goes_on(tmp_path: Path) -> None:
    files = [
        note(tmp_path / "one.txt", "one"),
        note(tmp_path / "hang.txt"),
        note(tmp_path / "two.txt", "two"),
    ]
    results: list[str] = []
    started = time.monotonic()
    with ParserPool(loader=hanging_loader) as pool:
        for path in files:
            try:
                results.append(pool.parse(path, timeout_s=1.5).full_text())
            except DocumentError as exc:
                results.append(exc.reason)
    assert results == ["one", "skipped: took longer than 1.5 s to parse", "two"]
    # A hang guard, not a speed target: the hang is 600 s; the batch takes ~1.7 s here.
    assert time.monotonic() - started < 60


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_crash_is_reported_with_its_signal(tmp_path: Path) -> None:
    with ParserPool(loader=crashing_loader) as pool:
        with pytest.raises(DocumentError) as info:
            pool.parse(note(tmp_path / "crash.txt"))
        assert info.value.reason == "skipped: the parser crashed (signal 11)"
        assert pool.parse(note(tmp_path / "fine.txt")).full_text() == "A short note."


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS is only enforced on Linux")
def test_memory_limit(tmp_path: Path) -> None:
    with ParserPool(loader=greedy_loader, max_memory_bytes=1 * 2**30) as pool:
        with pytest.raises(DocumentError) as info:
            pool.parse(note(tmp_path / "greedy.txt"))
        assert info.value.reason == "skipped: too large to parse (memory limit reached)"
        assert pool.parse(note(tmp_path / "fine.txt")).full_text() == "A short note."


def test_unexpected_parser_error_is_one_line(tmp_path: Path) -> None:
    path = note(tmp_path / "buggy.txt")
    with pytest.raises(DocumentError) as info:
        parse_document(path, loader=buggy_loader)
    assert str(info.value) == f"{path}: skipped: could not be parsed (ZeroDivisionError: parser bug"


def test_a_child_that_cannot_start_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loader's module exists only in this process, so the spawned child fails while starting."""
    ghost = types.ModuleType("ghost_loader_module")

    def ghost_loader(path: Path, *, max_chars: int) -> None:
        raise AssertionError("never runs")

    ghost_loader.__module__, ghost_loader.__qualname__ = ghost.__name__, "ghost_loader"
    ghost.ghost_loader = ghost_loader  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, ghost.__name__, ghost)
    path = note(tmp_path / "a.txt")
    with pytest.raises(DocumentError) as info:
        parse_document(path, loader=ghost_loader)  # type: ignore[arg-type]
    assert info.value.reason == "skipped: the parser process could not start (exit code 1)"


def test_cancel_kills_the_child_quickly(tmp_path: Path) -> None:
    cancel = threading.Event()
    with ParserPool(loader=hanging_loader) as pool:
        pool.parse(note(tmp_path / "warm.txt"))  # the child is up; now time only the cancel
        timer = threading.Timer(0.3, cancel.set)
        timer.start()
        started = time.monotonic()
        with pytest.raises(ParseCancelled):
            pool.parse(note(tmp_path / "hang.txt"), timeout_s=60, cancel=cancel)
        # A hang guard: a third of the 60 s parse timeout, 50x the ~0.4 s the cancel takes here.
        assert time.monotonic() - started < 20
        assert pool.pid is None


def test_close_from_another_thread_interrupts_a_parse(tmp_path: Path) -> None:
    pool = ParserPool(loader=hanging_loader)
    pool.parse(note(tmp_path / "warm.txt"))
    outcome: list[BaseException] = []

    def work() -> None:
        try:
            pool.parse(note(tmp_path / "hang.txt"), timeout_s=60)
        except DocumentError as exc:
            outcome.append(exc)

    worker = threading.Thread(target=work)
    worker.start()
    time.sleep(0.5)
    started = time.monotonic()
    pool.close()
    worker.join(10)
    assert not worker.is_alive()
    assert time.monotonic() - started < 5
    assert len(outcome) == 1
    assert isinstance(outcome[0], ParseCancelled)
    assert pool.pid is None


def test_close_stops_the_child(tmp_path: Path) -> None:
    pool = ParserPool()
    pool.parse(note(tmp_path / "a.txt"))
    process = pool._process
    assert process is not None
    assert process.is_alive()
    pool.close()
    assert pool.pid is None
    assert pool.parse(note(tmp_path / "b.txt"), timeout_s=30).full_text() == "A short note."  # restarts
    pool.close()
