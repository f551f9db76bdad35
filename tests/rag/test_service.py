"""Knowledge bases in a worker process (rag.service): the same answers as in-process, progress,
cancel, errors as one line, a dead child said so and replaced; the caller never imports torch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from rag.errors import KnowledgeBaseError
from rag.service import KnowledgeService, LocalService, dispatch, unique_name

pytestmark = [pytest.mark.model]


def _docs(folder: Path, n: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    topics = ["otters hold hands", "the night train leaves at eleven", "bees dance for flowers", "tea is steeped"]
    for i in range(n):
        (folder / f"note-{i:03d}.txt").write_text(f"Note {i}. {topics[i % len(topics)]}. " * 20, encoding="utf-8")
    return folder


def test_unique_name() -> None:
    assert unique_name("notes", set()) == "notes"
    assert unique_name("notes", {"notes", "notes 2"}) == "notes 3"
    assert unique_name("  ", set()) == "Documents"


def test_dispatch_refuses_unknown_calls() -> None:
    with pytest.raises(KnowledgeBaseError, match="no call named 'close'"):
        dispatch(object(), "close", (), {})
    with pytest.raises(KnowledgeBaseError, match="no call named"):
        LocalService(lambda: None).call("__init__")


def test_the_service_indexes_and_answers_in_a_child(tmp_path: Path, embedder_path: Path) -> None:
    docs = _docs(tmp_path / "docs", 6)
    updates: list[object] = []
    with KnowledgeService(tmp_path / "knowledge", embedder_path) as service:
        kb = service.call("create_unique", "docs")
        assert kb.name == "docs"
        assert service.call("create_unique", "docs").name == "docs 2"
        assert service.call("ensure", "docs").collection == kb.collection
        report = service.call("add", "docs", [docs], progress=updates.append)
        assert report.indexed == 6 and report.chunks_added >= 6
        assert updates and getattr(updates[-1], "state", None) == "done"
        passages = service.query_many(["docs"], "When does the train leave?", k=2)
        assert passages and "train" in passages[0].text
        assert [s.info.name for s in service.call("list")] == ["docs", "docs 2"]
        recovered, pending = service.call("status")
        assert recovered is None and pending == 0
        with pytest.raises(KnowledgeBaseError, match="nope"):
            service.call("get", "nope")
        assert service.pid is not None and service.pid != os.getpid()
        proc = service._proc
        started = time.monotonic()
    assert service.pid is None
    assert proc.exitcode == 0  # it finished by itself, it was not killed
    print(f"closed in {time.monotonic() - started:.2f} s")


def test_cancel_reaches_the_child(tmp_path: Path, embedder_path: Path) -> None:
    """Cancel set at the first progress report (the scan, before any embedding) reaches the child,
    which stops at its next check: fewer than all 80 files are indexed. Cancelling later raced the
    adaptive batches: by the time "2 files done" came back, the last batch could already be
    embedding all the rest."""
    docs = _docs(tmp_path / "docs", 80)
    cancel = threading.Event()
    seen: list[object] = []

    def progress(update: object) -> None:
        seen.append(update)
        cancel.set()

    with KnowledgeService(tmp_path / "knowledge", embedder_path) as service:
        service.call("create", "docs")
        report = service.call("add", "docs", [docs], progress=progress, cancel=cancel)
        assert report.cancelled
        assert report.indexed < 80


def test_a_killed_child_is_said_and_replaced(tmp_path: Path, embedder_path: Path) -> None:
    with KnowledgeService(tmp_path / "knowledge", embedder_path) as service:
        service.call("create", "docs")
        pid = service.pid
        assert pid is not None
        docs = _docs(tmp_path / "docs", 200)
        errors: list[BaseException] = []

        def add() -> None:
            try:
                service.call("add", "docs", [docs])
            except KnowledgeBaseError as exc:
                errors.append(exc)

        worker = threading.Thread(target=add)
        worker.start()
        time.sleep(1.0)
        os.kill(pid, signal.SIGKILL)
        worker.join(30)
        assert not worker.is_alive()
        assert len(errors) == 1
        assert "the knowledge process stopped (killed by SIGKILL)" in str(errors[0])
        assert "\n" not in str(errors[0])
        # The next call starts a new child on the same folder (the dead one's lock went with it).
        assert [s.info.name for s in service.call("list")] == ["docs"]
        assert service.starts == 2


def test_the_caller_never_imports_torch_or_chromadb(tmp_path: Path, embedder_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from rag.service import KnowledgeService
        from rag.knowledge import retrieve_context
        docs = Path({str(tmp_path / "docs")!r})
        docs.mkdir()
        (docs / "a.txt").write_text("Sea otters hold hands while they sleep.")
        with KnowledgeService(Path({str(tmp_path / "knowledge")!r}), Path({str(embedder_path)!r})) as service:
            service.call("create", "a")
            service.call("add", "a", [docs])
            block = retrieve_context(service, ["a"], "otters", 200, lambda t: len(t.split()))
        assert "hold hands" in block.text, block.text
        heavy = sorted(m for m in ("torch", "chromadb", "sentence_transformers") if m in sys.modules)
        print("heavy:", heavy)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "heavy: []" in done.stdout


def _wait_for(condition: object, seconds: float = 60.0) -> None:
    """Waits for ``condition()`` (a deadline against a hang, not a timing assertion)."""
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_an_idle_child_is_stopped_with_its_parser_and_the_next_call_starts_another(
    tmp_path: Path, embedder_path: Path
) -> None:
    import psutil

    docs = _docs(tmp_path / "docs", 4)
    with KnowledgeService(tmp_path / "knowledge", embedder_path, idle_stop_s=0.5) as service:
        service.call("create", "docs")
        service.call("add", "docs", [docs])  # starts the parser child too
        before = service.query_many(["docs"], "When does the train leave?", k=2)
        pid = service.pid
        assert pid is not None
        family = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        assert len(family) >= 2, "the parser child was not started"
        proc = service._proc
        _wait_for(lambda: service.idle_stops == 1)
        assert service.pid is None
        assert proc.exitcode == 0  # it finished by itself, it was not killed
        _wait_for(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in family))
        # The next call starts a new child, which answers as the first did.
        after = service.query_many(["docs"], "When does the train leave?", k=2)
        assert [p.text for p in after] == [p.text for p in before]
        assert service.starts == 2 and service.pid not in (None, pid)


def test_a_waiting_call_keeps_the_child_even_when_it_takes_longer_than_the_idle_time(
    tmp_path: Path, embedder_path: Path
) -> None:
    docs = _docs(tmp_path / "docs", 3)
    pause = threading.Event()
    seen: list[object] = []

    def progress(update: object) -> None:
        if not seen:
            pause.set()  # the job waits, paused, far longer than the idle time
        seen.append(update)

    with KnowledgeService(tmp_path / "knowledge", embedder_path, idle_stop_s=0.2) as service:
        service.call("create", "docs")
        results: list[object] = []
        job = threading.Thread(target=lambda: results.append(service.call("add", "docs", [docs], progress=progress,
                                                                           pause=pause)))  # fmt: skip
        job.start()
        _wait_for(lambda: bool(seen))
        pid = service.pid
        time.sleep(1.5)  # seven idle times: nothing may stop a child a call waits on
        assert service.pid == pid and service.idle_stops == 0
        pause.clear()
        job.join(120)
        assert results and getattr(results[0], "indexed", None) == 3
        _wait_for(lambda: service.idle_stops == 1)  # and once the call returned, it goes
        assert service.starts == 1
