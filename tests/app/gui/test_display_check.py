"""``glassbox`` on a machine that cannot show the window (issue 28, minor): one line saying why,
exit code 1, never Qt's abort; the X libraries the xcb plugin needs are named with the command
that installs them."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.gui.display_check import X_PACKAGES, display_problem, xcb_plugin

ROOT = Path(__file__).resolve().parents[3]


def run_app(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    return subprocess.run(
        [sys.executable, "-m", "app", "--home", str(tmp_path / "home")],
        env={**base, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the X11 case")
def test_no_display_is_one_line_not_an_abort(tmp_path: Path) -> None:
    done = run_app(tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("glassbox: error: no display to show the window on")
    assert "DISPLAY is not set" in done.stderr


def xcb_plugin_loads() -> bool:
    """Whether Qt's xcb plugin loads here (its X libraries are installed): the app checks them first."""
    plugin = xcb_plugin()
    if plugin is None:
        return False
    try:
        ctypes.CDLL(str(plugin))
    except OSError:
        return False
    return True


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or not xcb_plugin_loads(),
    reason="Qt's xcb plugin does not load here: the app names the missing X library first (the next test)",
)
def test_a_display_nobody_serves_is_one_line(tmp_path: Path) -> None:
    done = run_app(tmp_path, DISPLAY=":987")
    assert done.returncode == 1, done.stderr
    assert done.stderr == "glassbox: error: cannot open the display :987: no X server answers there " \
        "(is DISPLAY right, and may you use it?)\n"  # fmt: skip


def test_a_missing_x_library_is_named_with_the_packages_to_install() -> None:
    def load(path: str) -> object:
        if path.endswith("libqxcb.so"):
            raise OSError("libxcb-icccm.so.4: cannot open shared object file: No such file or directory")
        raise AssertionError(path)

    problem = display_problem({"DISPLAY": ":0"}, "linux", load, Path("/opt/qt/plugins/platforms/libqxcb.so"))
    assert problem is not None and "\n" not in problem
    assert problem.startswith("libqxcb.so: libxcb-icccm.so.4 is missing")
    assert f"sudo apt install {X_PACKAGES}" in problem


def test_other_platforms_and_wayland_are_left_to_qt() -> None:
    def never(path: str) -> object:
        raise AssertionError(path)

    assert display_problem({"QT_QPA_PLATFORM": "offscreen"}, "linux", never) is None
    assert display_problem({"WAYLAND_DISPLAY": "wayland-0"}, "linux", never) is None
    assert display_problem({}, "darwin", never) is None
    assert display_problem({}, "win32", never) is None


@pytest.mark.skipif(shutil.which("Xvfb") is None or xcb_plugin() is None, reason="needs Xvfb and Qt's xcb plugin")
def test_a_working_display_passes(tmp_path: Path) -> None:
    number = next(n for n in range(140, 200) if not Path(f"/tmp/.X{n}-lock").exists())
    server = subprocess.Popen(["Xvfb", f":{number}", "-nolisten", "tcp"], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not Path(f"/tmp/.X11-unix/X{number}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert display_problem({"DISPLAY": f":{number}"}, "linux") is None
    finally:
        server.terminate()
        server.wait(10)
