"""The knowledge process stops when idle: the setting reaches the service, from the start and from
Settings…, and the dialog edits it (the stop itself: tests/rag/test_service.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gui_support import make_window

from app.paths import Paths
from app.settings import Settings
from rag.service import KnowledgeService


@pytest.mark.gui
@pytest.mark.qt_log_ignore("propagateSizeHints")
def test_the_window_gives_the_knowledge_service_its_idle_time(qtbot: Any, tmp_path: Path) -> None:
    paths = Paths.resolve(tmp_path / "home").ensure()
    w = make_window(paths, settings=Settings(theme="light", knowledge_idle_minutes=2.5), probe_bandwidth=False)
    qtbot.addWidget(w)
    try:
        service = w.knowledge.service
        assert isinstance(service, KnowledgeService)
        assert service.idle_stop_s == 150
        w.knowledge.set_idle_stop(0)  # what Settings… applies when the user picks "never"
        assert service.idle_stop_s == 0
        assert service.pid is None  # nothing asked yet: no process
    finally:
        w.shutdown()


@pytest.mark.gui
def test_the_settings_dialog_edits_the_idle_time(qtbot: Any) -> None:
    from app.gui.settings_dialog import SettingsDialog

    assert Settings().knowledge_idle_minutes == 3.0  # the default: a few minutes
    dialog = SettingsDialog(Settings(knowledge_idle_minutes=10))
    qtbot.addWidget(dialog)
    assert dialog.knowledge_idle.value() == 10
    dialog.knowledge_idle.setValue(0)
    assert dialog.knowledge_idle.text() == "never"
    assert dialog.result_settings().knowledge_idle_minutes == 0.0
    dialog.knowledge_idle.setValue(5)
    assert dialog.result_settings().knowledge_idle_minutes == 5.0
