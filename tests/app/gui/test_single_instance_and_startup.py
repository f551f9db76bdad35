"""Single instance, safe mode after a crash during load, and a light start (no heavy imports)."""

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

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]
ROOT = Path(__file__).resolve().parents[3]
HEAVY = ("llama_cpp", "torch", "sentence_transformers", "chromadb", "huggingface_hub", "transformers")


def test_second_instance_is_refused_and_raises_the_first(qtbot: Any, tmp_path: Path) -> None:
    first = SingleInstance(tmp_path / "data" / "glassbox.lock")
    assert first.acquire()
    second = SingleInstance(tmp_path / "data" / "glassbox.lock")
    assert not second.acquire()
    with qtbot.waitSignal(first.activation_requested, timeout=3000):
        assert second.notify_running()
    first.release()
    third = SingleInstance(tmp_path / "data" / "glassbox.lock")
    assert third.acquire()
    third.release()


def test_stale_lock_from_a_dead_process_is_taken_over(tmp_path: Path) -> None:
    lock = tmp_path / "glassbox.lock"
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    dead_pid = proc.stdout.strip()
    # QLockFile's format: pid, app name, host name.
    lock.write_text(f"{dead_pid}\nglassbox\n{os.uname().nodename}\n")
    instance = SingleInstance(lock)
    assert instance.acquire()
    instance.release()


def test_breadcrumb_from_a_crashed_load_starts_safe_mode(qtbot: Any, paths: Paths, fake_model: Path) -> None:
    from gui_support import FakeSession, make_window

    from app.gui.lifecycle import safe_mode_reason

    paths.breadcrumb.write_text(json.dumps({"attempting": "load model", "path": str(fake_model)}))
    reason = safe_mode_reason(paths)
    assert reason is not None
    assert "fake-model.gguf" in reason
    assert "safe mode" in reason
    assert not paths.breadcrumb.exists()
    loaded: list[Any] = []
    w = make_window(
        paths,
        lambda r, b: loaded.append(r) or FakeSession(r, b),
        safe_mode=True,
        safe_reason=reason,
        probe_bandwidth=False,
    )
    qtbot.addWidget(w)
    requested: list[object] = []
    w.chat.load_requested.connect(requested.append)
    w.show()
    w.start()
    qtbot.waitUntil(lambda: w.header.model_bar.picker.count() == 1, timeout=5000)
    # The picker is filled and the start-up load decided in one slot: by now a load would be asked.
    qtbot.waitUntil(lambda: "Safe mode" in w.composer.state_label.text(), timeout=5000)
    assert requested == [] and loaded == []  # nothing was auto-loaded
    assert w.banner.isVisible()
    assert "fake-model.gguf" in w.banner.text()
    assert "Safe mode" in w.composer.state_label.text()
    w.shutdown()


def test_showing_the_window_imports_nothing_heavy(tmp_path: Path) -> None:
    """Counted, not timed (the 1 s startup budget is bench_startup's): no heavy library, and at most
    600 modules in all when the window shows (351 here; numpy alone brings ~150, torch over 1,000)."""
    script = f"""
import sys
from PySide6.QtWidgets import QApplication
app = QApplication([])
from app.gui.main_window import MainWindow
from app.paths import Paths
from app.settings import Settings
w = MainWindow(Paths.resolve({str(tmp_path / "home")!r}).ensure(), Settings(), probe_bandwidth=False)
w.show()
app.processEvents()
heavy = [m for m in {HEAVY!r} if m in sys.modules]
print(heavy, len(sys.modules))
w.shutdown()
"""
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    heavy, modules = out.stdout.strip().splitlines()[-1].rsplit(" ", 1)
    assert heavy == "[]"
    assert int(modules) <= 600, f"{modules} modules imported to show the window"
