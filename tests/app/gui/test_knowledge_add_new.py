"""Knowledge → Add files… / Add folder… with no knowledge base selected (issue 28, minor: they did
nothing), and the "New knowledge base" dialog's whole title (it read "New k…e base")."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QInputDialog

from app.gui.knowledge_panel import KnowledgePanel
from app.gui.workers.knowledge_worker import KnowledgeAdapter
from app.paths import Paths

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]


@pytest.fixture
def panel(qtbot: Any, paths: Paths, monkeypatch: pytest.MonkeyPatch) -> tuple[KnowledgePanel, list[Any]]:
    """The Knowledge page over an adapter whose writes are recorded (no knowledge process)."""
    adapter = KnowledgeAdapter(paths.knowledge, check_at_start=False)
    calls: list[Any] = []

    def create(name: str, on_done: Any = None, on_error: Any = None, **_: Any) -> None:
        calls.append(("create", name))
        on_done(SimpleNamespace(name=name))

    monkeypatch.setattr(adapter, "create", create)
    monkeypatch.setattr(adapter, "add", lambda name, paths: calls.append(("add", name, list(paths))))
    monkeypatch.setattr(adapter, "load_documents", lambda name: None)
    page = KnowledgePanel(adapter)
    qtbot.addWidget(page)
    return page, calls


def answer_name(seen: list[QInputDialog], name: str | None, widths: list[int] | None = None) -> None:
    """When the name dialog opens: keeps it (and its width), types ``name`` and OK (None: Cancel)."""

    def look() -> None:
        dialog = QApplication.activeModalWidget()
        if not isinstance(dialog, QInputDialog):
            QTimer.singleShot(20, look)
            return
        seen.append(dialog)
        if widths is not None:
            widths.append(dialog.width())
        if name is None:
            dialog.reject()
        else:
            dialog.setTextValue(name)
            dialog.accept()

    QTimer.singleShot(0, look)


def test_add_files_with_no_knowledge_base_adds_them_to_a_new_one(
    qtbot: Any, panel: tuple[KnowledgePanel, list[Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page, calls = panel
    docs = tmp_path / "trip notes"
    docs.mkdir()
    files = [docs / "a.txt", docs / "b.md"]
    assert page.current is None
    assert page.add_files_button.isEnabled() and page.add_folder_button.isEnabled()
    monkeypatch.setattr(
        "app.gui.knowledge_panel.QFileDialog.getOpenFileNames", lambda *_a, **_k: ([str(f) for f in files], "")
    )
    seen: list[QInputDialog] = []
    answer_name(seen, "Trip")
    page.add_files_button.click()
    assert seen and seen[0].textValue() == "Trip"
    assert calls == [("create", "Trip"), ("add", "Trip", files)]
    assert page.current == "Trip"
    # With one selected, the files go to it, nothing asked.
    calls.clear()
    monkeypatch.setattr("app.gui.knowledge_panel.QFileDialog.getExistingDirectory", lambda *_a, **_k: str(docs))
    page.add_folder_button.click()
    assert calls == [("add", "Trip", [docs])]


def test_add_folder_suggests_the_folders_name_and_cancel_adds_nothing(
    qtbot: Any, panel: tuple[KnowledgePanel, list[Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page, calls = panel
    folder = tmp_path / "manuals"
    folder.mkdir()
    monkeypatch.setattr("app.gui.knowledge_panel.QFileDialog.getExistingDirectory", lambda *_a, **_k: str(folder))
    seen: list[QInputDialog] = []
    suggested: list[str] = []

    def look_then_cancel() -> None:
        dialog = QApplication.activeModalWidget()
        if not isinstance(dialog, QInputDialog):
            QTimer.singleShot(20, look_then_cancel)
            return
        seen.append(dialog)
        suggested.append(dialog.textValue())
        dialog.reject()

    QTimer.singleShot(0, look_then_cancel)
    page.add_folder_button.click()
    assert suggested == ["manuals"] and calls == []


def test_the_new_knowledge_base_dialog_is_wide_enough_for_its_title(
    qtbot: Any, panel: tuple[KnowledgePanel, list[Any]]
) -> None:
    page, calls = panel
    seen: list[QInputDialog] = []
    widths: list[int] = []
    answer_name(seen, "notes", widths)
    page.new_button.click()
    (dialog,) = seen
    assert dialog.windowTitle() == "New knowledge base"
    title = dialog.fontMetrics().horizontalAdvance(dialog.windowTitle())
    assert widths[0] >= title + 200  # the window manager's buttons and margins beside it
    assert calls == [("create", "notes")]
