"""Drop a file on the window; the next answer is given the file's passages and cites it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gui_support import FakeSession, make_window
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent

from app.gui.workers.chat_state import ChatState, ModelState
from app.paths import Paths
from engine.history import HistoryStore

pytestmark = [
    pytest.mark.gui,
    pytest.mark.model,
    pytest.mark.slow,
    pytest.mark.qt_log_ignore("propagateSizeHints"),
]


def test_dropped_file_is_indexed_and_cited(
    qtbot: Any, paths: Paths, fake_model: Path, embedder_path: Path, tmp_path: Path
) -> None:
    doc = tmp_path / "otters.md"
    doc.write_text(
        "# Sea otters\n\nSea otters hold hands while they sleep so that they do not drift apart. "
        "They use rocks as tools to open shellfish.\n"
    )
    sessions: list[FakeSession] = []

    def factory(request: Any, bandwidth: float | None) -> FakeSession:
        sessions.append(FakeSession(request, bandwidth, reply="They hold hands [1]."))
        return sessions[-1]

    from app.settings import Settings

    w = make_window(paths, factory, Settings(theme="light", embedding_model=str(embedder_path)), probe_bandwidth=False)
    qtbot.addWidget(w)
    w.show()
    w.start()
    qtbot.waitUntil(lambda: w.chat.model_state is ModelState.LOADED, timeout=10000)

    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(doc))])
    event = QDropEvent(
        QPointF(400, 300),
        Qt.DropAction.CopyAction,
        mime,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    w.dropEvent(event)
    qtbot.waitUntil(lambda: bool(w.chat.conversation and w.chat.conversation.knowledge_bases), timeout=10000)
    name = w.chat.conversation.knowledge_bases[0]
    finished: list[Any] = []
    w.knowledge.job_finished.connect(lambda job, report: finished.append(report))
    qtbot.waitUntil(lambda: bool(finished), timeout=180_000)
    assert finished[0] is not None
    assert finished[0].indexed == 1

    w.composer.edit.setPlainText("Why do sea otters hold hands?")
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: w.chat.state is ChatState.IDLE and not w.chat.busy, timeout=60000)
    qtbot.waitUntil(
        lambda: bool(w.chat.thread_messages) and w.chat.thread_messages[-1].state == "complete", timeout=10000
    )

    documents = sessions[-1].calls[-1].documents
    assert documents is not None
    assert "hold hands while they sleep" in documents
    reply = w.chat.thread_messages[-1]
    assert reply.sources
    assert reply.sources[0]["path"] == str(doc)
    assert "otters.md" in w.chat_view.cards[-1].sources_box.text()
    with HistoryStore(paths.history_db) as store:
        saved = store.thread(w.chat.conversation.id)[-1]
        assert saved.sources[0]["path"] == str(doc)
        assert store.get_conversation(w.chat.conversation.id).knowledge_bases == [name]
    w.shutdown()
