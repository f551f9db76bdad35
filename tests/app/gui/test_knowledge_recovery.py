"""ROBUSTNESS P5 in the GUI: a damaged document index found at start-up is rebuilt as a job, and
the knowledge panel says so in one line with the progress in chunks."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from app.gui.knowledge_panel import KnowledgePanel
from app.gui.workers.knowledge_worker import KnowledgeAdapter
from rag.embeddings import SentenceTransformerEmbedder
from rag.knowledge import KnowledgeBases

pytestmark = [pytest.mark.gui, pytest.mark.model]


def test_damaged_index_is_rebuilt_at_start_with_a_notice(qtbot: Any, tmp_path: Path, embedder_path: Path) -> None:
    embedder = SentenceTransformerEmbedder(embedder_path, device="cpu")
    root = tmp_path / "knowledge"
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "bees.txt").write_text("Honey bees dance to tell their hive where the flowers are.", encoding="utf-8")
    (docs / "trains.txt").write_text("The night train leaves the station at eleven o'clock.", encoding="utf-8")

    def open_kbs() -> KnowledgeBases:
        return KnowledgeBases(root, embedder_path, embedder_factory=lambda _folder: embedder)

    with open_kbs() as kbs:
        kbs.create("notes")
        chunks = kbs.add("notes", [docs]).chunks_added
    assert chunks >= 2
    segment = next((root / "chroma").glob("*/data_level0.bin"))
    with segment.open("r+b") as fh:
        fh.truncate(5)

    adapter = KnowledgeAdapter(root, embedder_path, kb_factory=open_kbs)
    panel = KnowledgePanel(adapter)
    qtbot.addWidget(panel)
    notices: list[str] = []
    adapter.progress_changed.connect(lambda _job, _progress: notices.append(panel.notice.text()))
    try:
        with qtbot.waitSignal(adapter.store_recovered, timeout=60_000) as recovered:
            pass
        assert panel.notice.isVisibleTo(panel)
        assert "data_level0.bin is truncated" in recovered.args[0].reason
        with qtbot.waitSignal(adapter.job_finished, timeout=120_000) as finished:
            pass
        job, report = finished.args
        assert job.label == "Rebuilding the document index"
        assert report is not None and report.chunks_added == chunks
        pattern = r"^The document index was damaged \(chroma index unreadable: .*data_level0\.bin is truncated .*\); "
        assert any(
            re.match(pattern + r"rebuilding it from your documents: \d+ of " + str(chunks) + " chunks$", n)
            for n in notices
        ), notices
        assert re.match(pattern + rf"it was rebuilt from your documents \({chunks} chunks\)\.$", panel.notice.text())
        assert recovered.args[0].moved_to.name.startswith("chroma.damaged-")

        with qtbot.waitSignal(adapter.query_finished, timeout=30_000) as answered:
            adapter.test_query(["notes"], "when does the train leave", k=1)
        passages = answered.args[1]
        assert Path(passages[0].path).name == "trains.txt"
        assert passages[0].dense_score is not None
    finally:
        adapter.shutdown()


def test_a_healthy_index_is_not_opened_at_start(qtbot: Any, tmp_path: Path, embedder_path: Path) -> None:
    """Start-up leaves chromadb unloaded while the index is as last found good and nothing waits
    to be embedded; a chunk left waiting makes start-up open the knowledge bases to finish it."""
    from rag.registry import Registry
    from rag.store_health import known_healthy

    embedder = SentenceTransformerEmbedder(embedder_path, device="cpu")
    root = tmp_path / "knowledge"
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "bees.txt").write_text("Honey bees dance to tell their hive where the flowers are.", encoding="utf-8")
    opened: list[KnowledgeBases] = []

    def open_kbs() -> KnowledgeBases:
        kbs = KnowledgeBases(root, embedder_path, embedder_factory=lambda _folder: embedder)
        opened.append(kbs)
        return kbs

    with open_kbs() as kbs:
        kbs.create("notes")
        kbs.add("notes", [docs])
    opened.clear()
    assert known_healthy(root / "chroma")
    assert not Registry.has_pending(root / "registry.sqlite3")

    finished: list[Any] = []

    def start_and_settle() -> KnowledgeAdapter:
        adapter = KnowledgeAdapter(root, embedder_path, kb_factory=open_kbs)
        adapter.job_finished.connect(lambda job, _report: finished.append(job))
        settled: list[bool] = []
        qtbot.waitUntil(lambda: adapter._index is not None, timeout=1000)
        qtbot.wait(50)  # the start-up check is queued on the first turn of the event loop
        adapter._submit(adapter._index, lambda: True, settled.append)  # runs after the check
        qtbot.waitUntil(lambda: bool(settled), timeout=30_000)
        return adapter

    adapter = start_and_settle()
    try:
        assert opened == []
        assert finished == []
    finally:
        adapter.shutdown()

    with open_kbs() as kbs:
        kbs.registry.mark_unembedded(sorted(kbs.registry.embedded_ids(kbs.get("notes").id)))
    opened.clear()
    assert Registry.has_pending(root / "registry.sqlite3")
    adapter = start_and_settle()
    try:
        assert len(opened) == 1
        qtbot.waitUntil(lambda: bool(finished), timeout=120_000)
        assert [job.label for job in finished] == ["Finishing the document index"]
        assert not Registry.has_pending(root / "registry.sqlite3")
    finally:
        adapter.shutdown()
