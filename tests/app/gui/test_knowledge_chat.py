"""Documents in the chat header (issue 15, Major 1 and its minor items): a knowledge base made on
the Knowledge page is attached from the chat's Documents button and the next answer cites it; two
at once; a drop-made one is named after what was dropped; the drop overlay; the file dialog offers
the supported types; creating a knowledge base says so at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gui_support import FakeSession, make_window
from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDragLeaveEvent, QDropEvent
from PySide6.QtWidgets import QApplication, QFileDialog

from app.gui.documents_bar import documents_name
from app.gui.knowledge_panel import document_file_filter
from app.gui.workers.chat_state import ChatState, ModelState
from app.paths import Paths
from app.settings import Settings

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]

OTTERS = "# Sea otters\n\nSea otters hold hands while they sleep so that they do not drift apart.\n"
TRAINS = "# Night trains\n\nThe night train to Vienna leaves the station at eleven o'clock sharp.\n"


def test_documents_name() -> None:
    assert documents_name([Path("/home/u/Trip plans")]) == "Trip plans"
    assert documents_name([Path("/home/u/otters.md")]) == "otters.md"
    assert documents_name([Path("/home/u/papers/a.pdf"), Path("/home/u/papers/b.pdf")]) == "papers"
    assert documents_name([Path("/a/x.md"), Path("/b/y.md"), Path("/c/z.md")]) == "x.md + 2 more"
    assert documents_name([]) == "Documents"


def test_the_file_filter_offers_the_supported_types() -> None:
    filters = document_file_filter().split(";;")
    first = filters[0]
    assert first.startswith("Supported documents (") and first.endswith(")")
    patterns = first[len("Supported documents (") : -1].split()
    for pattern in ("*.pdf", "*.docx", "*.epub", "*.md", "*.txt", "*.html", "*.csv", "*.json", "*.py"):
        assert pattern in patterns, pattern
    assert "PDF (*.pdf)" in filters
    assert filters[-1] == "All files (*)"


def test_the_documents_button_elides_and_never_widens_the_header(qtbot: Any) -> None:
    from app.gui.documents_bar import MAX_BUTTON_WIDTH, DocumentsBarWidget

    bar = DocumentsBarWidget()
    qtbot.addWidget(bar)
    names = ["Quarterly reports 2019-2024", "Engineering handbook", "Customer interviews"]
    bar.set_available(names)
    chosen: list[Any] = []
    bar.attachments_changed.connect(chosen.append)
    bar.menu.aboutToShow.emit()
    for name in names:
        bar.actions_by_name()[name].trigger()
    assert chosen[-1] == tuple(names)
    assert bar.button.full_text() == "Documents: " + ", ".join(names)
    assert bar.button.sizeHint().width() <= MAX_BUTTON_WIDTH
    assert bar.button.minimumSizeHint().width() < 140
    bar.show()
    bar.button.resize(150, bar.button.height())
    assert bar.button.text().endswith("…") and len(bar.button.text()) < len(bar.button.full_text())
    assert all(name in bar.button.toolTip() for name in names)
    # Unticking detaches; the menu is rebuilt with the right ticks when it opens again.
    bar.menu.aboutToShow.emit()
    bar.actions_by_name()[names[1]].trigger()
    assert chosen[-1] == (names[0], names[2])
    bar.menu.aboutToShow.emit()
    assert [a.isChecked() for a in bar.actions_by_name().values()] == [True, False, True]
    # A knowledge base that no longer exists is shown as missing, still ticked, so it can be unticked.
    bar.set_available(names[1:])
    labels = [a.text() for a in bar.menu.actions()]
    assert f"{names[0]} (missing)" in labels


def test_the_documents_button_shows_its_whole_text_when_it_has_room(qtbot: Any) -> None:
    """Under the app's stylesheet (set after the button was sized), a short text is never cut."""
    from PySide6.QtWidgets import QHBoxLayout, QWidget

    from app.gui.documents_bar import DocumentsBarWidget
    from app.gui.theme import LIGHT, apply_theme

    holder = QWidget()
    qtbot.addWidget(holder)
    row = QHBoxLayout(holder)
    bar = DocumentsBarWidget()
    row.addWidget(bar)
    row.addStretch()
    app = QApplication.instance()
    assert isinstance(app, QApplication)
    apply_theme(app, LIGHT)
    holder.resize(800, 60)
    holder.show()
    qtbot.waitUntil(lambda: bar.button.width() > 0)
    assert bar.button.text() == bar.button.full_text() == "Documents: off"
    bar.set_attached(["otters"])
    qtbot.waitUntil(lambda: bar.button.text() == "Documents: otters")


def test_many_attached_knowledge_bases_never_widen_the_window(qtbot: Any, paths: Paths) -> None:
    w = make_window(paths, None, probe_bandwidth=False)
    qtbot.addWidget(w)
    names = [f"A knowledge base with a very long name number {i}" for i in range(8)]
    w.documents_bar.set_available(names)
    w.documents_bar.set_attached(names)
    w.show()
    QApplication.processEvents()
    assert w.minimumSizeHint().width() <= 1024
    assert w.documents_bar.button.width() <= 240
    assert all(name in w.documents_bar.button.toolTip() for name in names)
    w.shutdown()


def _window(qtbot: Any, paths: Paths, embedder_path: Path, sessions: list[FakeSession], reply: str) -> Any:
    def factory(request: Any, bandwidth: float | None) -> FakeSession:
        sessions.append(FakeSession(request, bandwidth, reply=reply))
        return sessions[-1]

    settings = Settings(theme="light", embedding_model=str(embedder_path))
    w = make_window(paths, factory, settings, probe_bandwidth=False)
    qtbot.addWidget(w)
    w.show()
    w.start()
    qtbot.waitUntil(lambda: w.chat.model_state is ModelState.LOADED, timeout=10000)
    return w


def _attach_from_menu(qtbot: Any, w: Any, name: str) -> None:
    """Opens the Documents menu as a user would and ticks ``name``."""
    bar = w.documents_bar
    bar.menu.aboutToShow.emit()  # what opening the menu does: the list is refreshed
    qtbot.waitUntil(lambda: name in bar.actions_by_name(), timeout=10000)
    action = bar.actions_by_name()[name]
    assert not action.isChecked()
    action.trigger()
    qtbot.waitUntil(
        lambda: w.chat.conversation is not None and name in (w.chat.conversation.knowledge_bases or []),
        timeout=10000,
    )


def _ask(qtbot: Any, w: Any, text: str) -> Any:
    w.composer.edit.setPlainText(text)
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: w.chat.state is ChatState.IDLE and not w.chat.busy, timeout=60000)
    qtbot.waitUntil(
        lambda: bool(w.chat.thread_messages) and w.chat.thread_messages[-1].state == "complete", timeout=10000
    )
    return w.chat.thread_messages[-1]


@pytest.mark.model
@pytest.mark.slow
def test_a_kb_from_the_knowledge_page_is_attached_in_the_header_and_cited(
    qtbot: Any, paths: Paths, fake_model: Path, embedder_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    otters = tmp_path / "otters.md"
    otters.write_text(OTTERS, encoding="utf-8")
    trains = tmp_path / "trains.md"
    trains.write_text(TRAINS, encoding="utf-8")
    sessions: list[FakeSession] = []
    w = _window(qtbot, paths, embedder_path, sessions, "They hold hands [1].")
    try:
        assert w.documents_bar.button.full_text() == "Documents: off"
        # Knowledge -> New knowledge base: the heading says which one at once, and that it is being made.
        w.show_page(2)
        page = w.knowledge_page
        page.create_kb("Animals")
        assert "Animals" in page.heading.text()
        assert page.summary.text().startswith("Creating the knowledge base “Animals”")
        assert page.progress.isVisible() and page.progress.maximum() == 0
        qtbot.waitUntil(lambda: page.creating is None and page.current == "Animals", timeout=60000)
        assert "Animals" in page.heading.text()

        # Add files…: the dialog offers the supported types; the file is indexed.
        asked: list[str] = []

        def pick(_parent: Any, _caption: str, _folder: str, filters: str = "") -> tuple[list[str], str]:
            asked.append(filters)
            return [str(otters)], ""

        monkeypatch.setattr(QFileDialog, "getOpenFileNames", staticmethod(pick))
        finished: list[Any] = []
        w.knowledge.job_finished.connect(lambda _job, report: finished.append(report))
        page.add_files_button.click()
        assert asked and "*.pdf" in asked[0] and "*.md" in asked[0]
        qtbot.waitUntil(lambda: bool(finished), timeout=120_000)
        assert finished[0] is not None and finished[0].indexed == 1

        # A second knowledge base, made the same way.
        page.create_kb("Travel")
        qtbot.waitUntil(lambda: page.creating is None and page.current == "Travel", timeout=60000)
        w.knowledge.add("Travel", [trains])
        qtbot.waitUntil(lambda: len(finished) == 2, timeout=120_000)

        # Chat: the Documents button attaches it; the header says so; the answer cites it.
        w.show_page(0)
        _attach_from_menu(qtbot, w, "Animals")
        assert w.documents_bar.button.full_text() == "Documents: Animals"
        assert "Animals" in w.documents_bar.button.toolTip()
        reply = _ask(qtbot, w, "Why do sea otters hold hands?")
        assert "hold hands while they sleep" in (sessions[-1].calls[-1].documents or "")
        assert reply.sources and reply.sources[0]["path"] == str(otters)
        assert "otters.md" in w.chat_view.cards[-1].sources_box.text()

        # Two at once: both are searched, both can be cited.
        _attach_from_menu(qtbot, w, "Travel")
        assert w.chat.conversation.knowledge_bases == ["Animals", "Travel"]
        assert w.documents_bar.button.full_text() == "Documents: Animals, Travel"
        reply = _ask(qtbot, w, "When does the night train leave, and why do otters hold hands?")
        documents = sessions[-1].calls[-1].documents or ""
        assert "eleven o'clock" in documents and "hold hands" in documents
        assert {s["path"] for s in reply.sources} == {str(otters), str(trains)}

        # Detach one: the next question gets only the other.
        w.documents_bar.menu.aboutToShow.emit()
        w.documents_bar.actions_by_name()["Animals"].trigger()
        qtbot.waitUntil(lambda: w.chat.conversation.knowledge_bases == ["Travel"], timeout=10000)
        reply = _ask(qtbot, w, "When does the night train leave?")
        assert {s["path"] for s in reply.sources} == {str(trains)}
        assert "hold hands" not in (sessions[-1].calls[-1].documents or "")
    finally:
        w.shutdown()


def _drag(w: Any, paths: list[Path], kind: str) -> None:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    if kind == "enter":
        event: Any = QDragEnterEvent(
            QPoint(400, 300), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier
        )
    elif kind == "leave":
        event = QDragLeaveEvent()
    else:
        event = QDropEvent(
            QPointF(400, 300), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier
        )
    QApplication.sendEvent(w, event)


@pytest.mark.model
@pytest.mark.slow
def test_a_drop_shows_an_overlay_and_makes_a_kb_named_after_the_folder(
    qtbot: Any, paths: Paths, fake_model: Path, embedder_path: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "Trip plans"
    folder.mkdir()
    (folder / "trains.md").write_text(TRAINS, encoding="utf-8")
    sessions: list[FakeSession] = []
    w = _window(qtbot, paths, embedder_path, sessions, "At eleven [1].")
    try:
        _drag(w, [folder], "enter")
        assert w.documents.drop_overlay.isVisible()
        assert w.documents.drop_overlay.message == "Drop files or folders to use them in this chat"
        assert w.documents.drop_overlay.geometry() == w.rect()
        _drag(w, [folder], "leave")
        assert not w.documents.drop_overlay.isVisible()

        finished: list[Any] = []
        w.knowledge.job_finished.connect(lambda _job, report: finished.append(report))
        _drag(w, [folder], "enter")
        _drag(w, [folder], "drop")
        assert not w.documents.drop_overlay.isVisible()
        qtbot.waitUntil(lambda: bool(w.chat.conversation and w.chat.conversation.knowledge_bases), timeout=60000)
        assert w.chat.conversation.knowledge_bases == ["Trip plans"]
        assert w.documents_bar.button.full_text() == "Documents: Trip plans"
        qtbot.waitUntil(lambda: bool(finished), timeout=120_000)
        assert finished[0] is not None and finished[0].indexed == 1
        # The overlay now names where a drop goes.
        _drag(w, [folder], "enter")
        assert w.documents.drop_overlay.message == "Drop to add to this chat's documents (“Trip plans”)"
        _drag(w, [folder], "leave")
        reply = _ask(qtbot, w, "When does the night train leave?")
        assert reply.sources and reply.sources[0]["path"] == str(folder / "trains.md")

        # On the Knowledge page a drop goes into the knowledge base shown there, and the overlay says so.
        w.show_page(2)
        qtbot.waitUntil(lambda: w.knowledge_page.current == "Trip plans", timeout=30000)
        _drag(w, [folder], "enter")
        assert w.documents.drop_overlay.message == "Drop to add to the knowledge base “Trip plans”"
        _drag(w, [folder], "leave")
        w.show_page(0)

        # Another chat, the same folder dropped: a second knowledge base, not a clash.
        w.chat.conversations.new()
        qtbot.waitUntil(lambda: w.chat.conversation is not None and not w.chat.thread_messages, timeout=10000)
        first = w.chat.conversation.id
        qtbot.waitUntil(lambda: w.documents_bar.button.full_text() == "Documents: off", timeout=10000)
        _drag(w, [folder], "enter")
        _drag(w, [folder], "drop")
        qtbot.waitUntil(lambda: bool(w.chat.conversation.knowledge_bases), timeout=60000)
        assert w.chat.conversation.id == first
        assert w.chat.conversation.knowledge_bases == ["Trip plans 2"]
        qtbot.waitUntil(lambda: len(finished) == 2, timeout=120_000)
    finally:
        w.shutdown()
