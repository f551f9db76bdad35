"""ROBUSTNESS P5 in the GUI: a damaged document index found at start-up is rebuilt as a job, and
the knowledge panel says so in one line with the progress in chunks."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from app.knowledge_panel import KnowledgePanel
from app.workers.knowledge_worker import KnowledgeAdapter
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
