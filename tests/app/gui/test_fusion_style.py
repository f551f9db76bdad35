"""The window is drawn in Fusion wherever Qt's default style is another: started in it from the
command line (``app.gui.theme.new_application``, the launch's way: no Python ``QStyle`` before the
first frame), or set by ``apply_theme`` on an application started without it (tests, the self-test).

Each case runs in a fresh interpreter with ``QT_STYLE_OVERRIDE=windows``, the other style Qt ships
on every platform, so that Fusion cannot be there by default."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

STARTED = """
from app.gui.theme import LIGHT, apply_theme, new_application
app = new_application(["glassbox"])
print(app.style().name())
apply_theme(app, LIGHT)
app.setStyleSheet("")  # the stylesheet's style wraps the base one: look at that one
print(app.style().name())
"""

SET_LATER = """
from PySide6.QtWidgets import QApplication
from app.gui.theme import LIGHT, apply_theme
app = QApplication(["glassbox"])
print(app.style().name())
apply_theme(app, LIGHT)
app.setStyleSheet("")
print(app.style().name())
"""


@pytest.mark.parametrize(("script", "first"), [(STARTED, "fusion"), (SET_LATER, "windows")])
def test_the_style_is_fusion_however_the_application_started(script: str, first: str) -> None:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(ROOT), "QT_STYLE_OVERRIDE": "windows"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [first, "fusion"]
