"""A background job's answer that arrives after the main window closed (a queued call on the GUI
thread) is dropped, never run against deleted widgets (the flaky ``set_models`` on a deleted
combo box, seen in a combined run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import shiboken6
from gui_support import FakeSession, make_window

from app.paths import Paths

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]


def test_a_scan_answered_after_the_window_is_deleted_is_dropped(
    qtbot: Any, paths: Paths, fake_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.gui.model_bar as model_bar

    answers: list[Any] = []

    def capture(fn: Any, on_done: Any = None, on_error: Any = None) -> None:
        answers.append((fn, on_done, on_error))

    w = make_window(paths, lambda request, bandwidth: FakeSession(request, bandwidth), probe_bandwidth=False)
    monkeypatch.setattr(model_bar, "run_in_background", capture)
    w.model_control.refresh_models()
    ((scan, on_done, on_error),) = answers
    found = scan()
    assert found == [fake_model]
    picker = w.header.model_bar.picker
    # While the window is open, the answer fills the picker.
    on_done(found)
    assert picker.count() == 1
    w.shutdown()
    shiboken6.delete(w)  # what the window's deleteLater does once the loop runs: its children go too
    assert not shiboken6.isValid(picker)
    # The same answers, queued before the window went, now arrive: nothing runs, nothing raises.
    on_done(found)
    on_error(OSError("the folder went away"))
    w.model_control.set_models(found)  # a library_changed signal queued before the close
