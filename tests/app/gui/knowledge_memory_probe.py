"""Runs the main window offscreen, uses the Knowledge page (create, add a folder, a test search,
a chat's retrieval) and prints ``RESULT {json}``: the process's RSS before and after, the knowledge
process's RSS, the whole app's (the GUI and every process under it) in use and, once the knowledge
process stopped for being idle, idle; and which heavy modules the GUI process imported.

Usage: ``python knowledge_memory_probe.py HOME DOCS EMBEDDER [in-process | IDLE_SECONDS]``
(``in-process`` runs the knowledge bases in the GUI process, as the app did before, for the
benchmark's comparison; IDLE_SECONDS is the knowledge process's idle time, the setting, default
the app's). Used by ``test_knowledge_memory.py`` and ``tests/bench/bench_knowledge_process.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtWidgets import QApplication

from app.gui.main_window import MainWindow
from app.paths import Paths
from app.settings import Settings

HEAVY = ("torch", "chromadb", "sentence_transformers", "transformers")
GUI_BUDGET_MB = 250  # ARCHITECTURE.md, "Budgets": the GUI process of the idle app without a model
APP_BUDGET_MB = 300  # ... and the whole app, every process, idle after the Knowledge page


def rss_mb(pid: int | str = "self") -> float | None:
    """Resident memory of a process in MiB (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


def family(pid: int | None = None) -> dict[int, tuple[str, float]]:
    """A process and every process under it: pid -> (name, resident MiB)."""
    import psutil

    root = psutil.Process(pid)
    found: dict[int, tuple[str, float]] = {}
    for proc in (root, *root.children(recursive=True)):
        try:
            found[proc.pid] = (proc.name(), proc.memory_info().rss / 2**20)
        except psutil.Error:
            pass  # it ended meanwhile
    return found


def wait(app: QApplication, done: Callable[[], bool], timeout: float = 180) -> None:
    end = time.monotonic() + timeout
    while not done():
        if time.monotonic() > end:
            raise SystemExit("timed out")
        app.processEvents()
        time.sleep(0.01)


def main(argv: list[str]) -> dict[str, Any]:
    home, docs, embedder = (Path(p) for p in argv[:3])
    in_process = len(argv) > 3 and argv[3] == "in-process"
    idle_s = float(argv[3]) if len(argv) > 3 and not in_process else None
    app = QApplication([])
    paths = Paths.resolve(home).ensure()
    factory = None
    if in_process:  # how the app ran before the knowledge process: everything in the GUI process
        from rag.knowledge import KnowledgeBases

        def factory() -> KnowledgeBases:
            return KnowledgeBases(paths.knowledge, embedder)

    settings = Settings(theme="light", embedding_model=str(embedder))
    if idle_s is not None:
        settings = settings.model_copy(update={"knowledge_idle_minutes": idle_s / 60})
    w = MainWindow(paths, settings, safe_mode=True, probe_bandwidth=False, kb_factory=factory)
    w.show()
    for _ in range(50):
        app.processEvents()
    before = rss_mb()

    w.show_page(2)
    page = w.knowledge_page
    page.create_kb("Notes")
    wait(app, lambda: page.creating is None and page.current == "Notes")
    finished: list[Any] = []
    w.knowledge.job_finished.connect(lambda _job, report: finished.append(report))
    w.knowledge.add("Notes", [docs])
    wait(app, lambda: bool(finished))
    answers: list[Any] = []
    w.knowledge.query_finished.connect(lambda _text, passages: answers.append(passages))
    page.query.setText("Why do otters hold hands?")
    page.query_button.click()
    wait(app, lambda: bool(answers))
    found: list[Any] = []
    w.knowledge.chat_retriever(["Notes"]).retrieve("otters", found.append, found.append)
    wait(app, lambda: bool(found))
    assert not isinstance(found[0], BaseException), found[0]
    passages = found[0].passages
    sources = passages.sources if passages is not None else ()
    child = getattr(w.knowledge.service, "pid", None)
    in_use = family()  # at once: with a short idle time the knowledge process goes soon
    child_mb = in_use[child][1] if child in in_use else None
    for _ in range(50):
        app.processEvents()
    after = rss_mb()
    idle: dict[int, tuple[str, float]] | None = None
    idle_wait_s = None
    if idle_s is not None:  # the knowledge process stops when idle: the app's whole footprint then
        import psutil

        knowledge = set(in_use) - {os.getpid()} - {p.pid for p in psutil.Process().children() if p.pid != child}
        started = time.monotonic()
        wait(app, lambda: not knowledge & set(family()), timeout=idle_s + 60)
        idle_wait_s = time.monotonic() - started
        for _ in range(50):
            app.processEvents()
        idle = family()
    result = {
        "before_mb": before,
        "after_mb": after,
        "child_mb": child_mb,
        "in_use_mb": sum(mb for _name, mb in in_use.values()),
        "in_use_processes": len(in_use),
        "idle_mb": sum(mb for _name, mb in idle.values()) if idle is not None else None,
        "idle_processes": sorted(name for name, _mb in idle.values()) if idle is not None else None,
        "idle_wait_s": idle_wait_s,
        "indexed": finished[0].indexed if finished[0] else None,
        "passages": len(answers[0]),
        "cited": [s["path"] for s in sources],
        "heavy": sorted(m for m in HEAVY if m in sys.modules),
    }
    w.shutdown()
    return result


def run_probe(
    home: Path, docs: Path, embedder: Path, *, in_process: bool = False, idle_s: float | None = None
) -> dict[str, Any]:
    """Runs this probe in a fresh interpreter (so that no other test's imports count); its result."""
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    here = Path(__file__).resolve()
    command = [sys.executable, str(here), str(home), str(docs), str(embedder)]
    command += ["in-process"] if in_process else [] if idle_s is None else [str(idle_s)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=here.parents[3])
    if done.returncode != 0:
        raise AssertionError(f"the probe failed: {done.stderr[-3000:]}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return dict(json.loads(line[len("RESULT ") :]))


if __name__ == "__main__":
    sys.stdout.write("RESULT " + json.dumps(main(sys.argv[1:])) + "\n")
