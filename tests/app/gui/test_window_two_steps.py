"""The window built in two steps, as the app's launch builds it: the first frame from a glance at the
settings, then the settings read in full and the rest (``app.gui.main_window.MainWindow``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from app.gui.single_instance import SingleInstance
from app.paths import Paths
from app.settings import SettingsLoad, load_settings

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]
ROOT = Path(__file__).resolve().parents[3]


def two_step_window(paths: Paths, reads: list[SettingsLoad], **kwargs: Any) -> Any:
    from gui_support import FakeSession

    from app.gui.main_window import MainWindow

    def read() -> SettingsLoad:
        loaded = load_settings(paths.settings_file)
        reads.append(loaded)
        return loaded

    return MainWindow(paths, read, session_factory=lambda r, b: FakeSession(r, b), probe_bandwidth=False, **kwargs)


def test_the_rest_is_built_after_the_first_frame_and_the_window_works(qtbot: Any, paths: Paths) -> None:
    paths.settings_file.write_text(json.dumps({"theme": "dark", "n_ctx": 8192}), encoding="utf-8")
    reads: list[SettingsLoad] = []
    w = two_step_window(paths, reads, safe_mode=True)
    qtbot.addWidget(w)
    assert reads == [] and not hasattr(w, "turns")  # the first step alone
    assert w.colors.name == "dark"  # the glance's theme
    shown: list[bool] = []
    w.first_frame_shown.connect(lambda: shown.append(hasattr(w, "turns")))
    with qtbot.waitSignal(w.completed, timeout=5000):
        w.show()
    assert shown == [False]  # the frame was on screen before the rest was built
    assert len(reads) == 1 and w.settings.n_ctx == 8192  # then the settings, read once, in full
    w.start()
    qtbot.waitUntil(lambda: "Safe mode" in w.composer.state_label.text(), timeout=5000)
    with qtbot.waitSignal(w.conversations.sidebar.list.model().rowsInserted, timeout=5000):
        w.shortcuts["new"].trigger()  # the controllers answer
    assert w.shutdown()


def test_the_full_read_corrects_what_the_glance_could_not_tell(qtbot: Any, paths: Paths) -> None:
    """pydantic reads "false" as False; the glance takes the default (shown) for the first frame."""
    paths.settings_file.write_text(json.dumps({"show_inspector": "false"}), encoding="utf-8")
    reads: list[SettingsLoad] = []
    w = two_step_window(paths, reads, safe_mode=True)
    qtbot.addWidget(w)
    w.resize(1366, 768)  # room for the inspector: it shows as the settings say
    assert w.inspector_button.isChecked()
    with qtbot.waitSignal(w.completed, timeout=5000):
        w.show()
    assert not w.inspector_button.isChecked() and not w.inspector.isVisible()
    assert w.settings.show_inspector is False
    w.inspector_button.setChecked(True)  # the user's choice goes to the settings from now on
    assert w.settings.show_inspector is True
    assert w.shutdown()


def test_a_window_that_paints_no_frame_is_built_anyway(qtbot: Any, paths: Paths) -> None:
    from app.gui.main_window import FIRST_FRAME_WAIT_MS

    reads: list[SettingsLoad] = []
    w = two_step_window(paths, reads, safe_mode=True)
    qtbot.addWidget(w)
    with qtbot.waitSignal(w.completed, timeout=FIRST_FRAME_WAIT_MS + 4000):
        pass  # never shown: no paint
    assert len(reads) == 1 and hasattr(w, "conversations")
    assert w.shutdown()


def test_closing_before_the_rest_is_built_reads_nothing_and_saves_no_settings(qtbot: Any, paths: Paths) -> None:
    from app.gui.main_window import FIRST_FRAME_WAIT_MS

    reads: list[SettingsLoad] = []
    w = two_step_window(paths, reads, safe_mode=True)
    qtbot.addWidget(w)
    assert w.shutdown()
    assert reads == [] and not paths.settings_file.exists()
    qtbot.wait(FIRST_FRAME_WAIT_MS + 300)  # the fallback timer finds nothing left to build
    assert reads == []


def test_the_first_frame_imports_neither_pydantic_nor_the_controllers(tmp_path: Path) -> None:
    """Counted, not timed (bench_startup times it): what the first frame needs, and nothing more."""
    script = f"""
import sys
from PySide6.QtWidgets import QApplication
app = QApplication([])
from app.gui.launch import MainWindow
from app.paths import Paths
paths = Paths.resolve({str(tmp_path / "home")!r}).ensure()
def read():
    from app.settings import load_settings
    return load_settings(paths.settings_file)
w = MainWindow(paths, read, safe_mode=True, probe_bandwidth=False)
late = ("pydantic", "app.settings", "app.gui.turn_controller", "app.gui.conversation_controller",
        "app.gui.workers.chat_adapter", "PySide6.QtNetwork", "app.gui.message_card", "app.gui.tool_card",
        "app.gui.hit_delegate", "app.gui.inspector_widgets")
w.first_frame_shown.connect(lambda: print("first", [m for m in late if m in sys.modules], flush=True))
w.completed.connect(lambda: (print("complete", [m for m in late if m in sys.modules], flush=True), app.quit()))
w.show()
app.exec()
w.shutdown()
"""
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith(("first", "complete"))]
    assert lines[0] == "first []"
    assert lines[1].startswith("complete [") and "'pydantic'" in lines[1] and "'app.gui.turn_controller'" in lines[1]


def test_a_second_launch_reaches_a_first_that_listens_only_after_its_first_frame(
    qtbot: Any, paths: Paths, glassbox_home: Path
) -> None:
    """The launch takes the lock before its first frame and listens after it: a second launch in
    between keeps trying, then raises the first window instead of saying the folder is held."""
    first = SingleInstance(paths.lock_file)
    assert first.acquire(listen=False)
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(ROOT)}
    second = subprocess.Popen(
        [sys.executable, "-m", "app", "--home", str(glassbox_home)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        qtbot.wait(1000)  # the second launch has found the lock held by now, and is trying
        assert second.poll() is None
        with qtbot.waitSignal(first.activation_requested, timeout=5000):
            first.listen()
        _, err = second.communicate(timeout=30)
    finally:
        if second.poll() is None:
            second.kill()
        first.release()
    assert second.returncode == 0, err
    assert "already running; brought its window forward" in err
