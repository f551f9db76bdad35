"""Runs the main window offscreen, uses the Knowledge page (create, add a folder, a test search,
a chat's retrieval) and prints ``RESULT {json}``: the process's RSS before and after, the knowledge
process's RSS, and which heavy modules the GUI process imported.

Usage: ``python knowledge_memory_probe.py HOME DOCS EMBEDDER [in-process]`` (``in-process`` runs the
knowledge bases in the GUI process, as the app did before; for the benchmark's comparison).
Used by ``test_knowledge_memory.py`` and ``tests/bench/bench_knowledge_process.py``.
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
GUI_BUDGET_MB = 250  # ARCHITECTURE.md, "Budgets": the idle app without a model


def rss_mb(pid: int | str = "self") -> float | None:
    """Resident memory of a process in MiB (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


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
    app = QApplication([])
    paths = Paths.resolve(home).ensure()
    factory = None
    if in_process:  # how the app ran before the knowledge process: everything in the GUI process
        from rag.knowledge import KnowledgeBases

        def factory() -> KnowledgeBases:
            return KnowledgeBases(paths.knowledge, embedder)

    settings = Settings(theme="light", embedding_model=str(embedder))
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
    sources = getattr(found[0], "sources", None) or ()
    for _ in range(50):
        app.processEvents()
    after = rss_mb()
    child = getattr(w.knowledge.service, "pid", None)
    result = {
        "before_mb": before,
        "after_mb": after,
        "child_mb": rss_mb(child) if child else None,
        "indexed": finished[0].indexed if finished[0] else None,
        "passages": len(answers[0]),
        "cited": [s["path"] for s in sources],
        "heavy": sorted(m for m in HEAVY if m in sys.modules),
    }
    w.shutdown()
    return result


def run_probe(home: Path, docs: Path, embedder: Path, *, in_process: bool = False) -> dict[str, Any]:
    """Runs this probe in a fresh interpreter (so that no other test's imports count); its result."""
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    here = Path(__file__).resolve()
    command = [sys.executable, str(here), str(home), str(docs), str(embedder)] + (["in-process"] if in_process else [])
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=here.parents[3])
    if done.returncode != 0:
        raise AssertionError(f"the probe failed: {done.stderr[-3000:]}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return dict(json.loads(line[len("RESULT ") :]))


if __name__ == "__main__":
    sys.stdout.write("RESULT " + json.dumps(main(sys.argv[1:])) + "\n")
