"""The Qt binding keeps Python's reference counts: a signal emitted from Python takes no reference
it does not own (PySide6 6.12.0's ``SignalInstance.emit`` returned ``True`` without one, so every
emit took one of ``True``'s, and the app aborted with "bool_dealloc" after a few thousand emits:
a long reply, or indexing beside one; pyproject.toml pins the binding for it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QObject, Signal

pytestmark = [pytest.mark.gui]
ROOT = Path(__file__).resolve().parents[3]


class _Emitter(QObject):
    text = Signal(str, int)
    bare = Signal()


@pytest.mark.parametrize("connected", [False, True])
def test_emitting_a_signal_takes_no_reference_of_true(qtbot: Any, connected: bool) -> None:
    emitter = _Emitter()
    got: list[str] = []
    if connected:
        emitter.text.connect(lambda text, _n: got.append(text))
    before = sys.getrefcount(True), sys.getrefcount(False), sys.getrefcount(None)
    for _ in range(200):
        emitter.text.emit("x", 1)
        emitter.bare.emit()
    after = sys.getrefcount(True), sys.getrefcount(False), sys.getrefcount(None)
    # Other threads may hold or drop a reference meanwhile: a few either way, never one per emit.
    assert all(abs(b - a) < 50 for a, b in zip(before, after, strict=True)), (before, after)
    assert len(got) == (200 if connected else 0)


def test_many_emits_do_not_abort_the_process() -> None:
    """Counted in a fresh interpreter, where True has the fewest references: 20,000 emits."""
    script = """
from PySide6.QtCore import QCoreApplication, QObject, Signal
app = QCoreApplication([])
class E(QObject):
    s = Signal(str)
e = E()
e.s.connect(lambda _t: None)
for _ in range(20000):
    e.s.emit("x")
print("done")
"""
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "done", out.stderr[-2000:]
