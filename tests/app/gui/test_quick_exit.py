"""Closing is quick (issue 28, minor: it took 2.1–2.9 s): the window shuts everything down, then
the process leaves without the interpreter's teardown of every module it imported
(``app.gui.launch.leave_process``); the inference worker leaves as soon as its KV-cache write is
done (``engine.inference.runtime``). Nothing is lost on the way: the exit hooks run, the output
is flushed, and the history, the settings and the window's geometry are on disk."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gui]

ROOT = Path(__file__).resolve().parents[3]


def test_leave_process_runs_the_exit_hooks_and_skips_the_teardown(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    script = textwrap.dedent(
        f"""
        import atexit, logging, sys
        from app.gui.launch import leave_process

        log = logging.getLogger("quick-exit")
        handler = logging.FileHandler({str(tmp_path / "app.log")!r})
        log.addHandler(handler)
        log.warning("written by a buffered handler")

        class Teardown:
            def __del__(self):
                with open({str(out)!r}, "a") as fh:
                    fh.write("module teardown ran\\n")

        KEPT = Teardown()  # cleared only by the interpreter's teardown of this module
        atexit.register(lambda: open({str(out)!r}, "a").write("exit hook ran\\n"))
        sys.stdout.write("no newline, not flushed")
        leave_process(3)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "no newline, not flushed"
    assert out.read_text() == "exit hook ran\n"  # the hooks ran; the teardown did not
    assert "written by a buffered handler" in (tmp_path / "app.log").read_text()
    assert done.stderr == ""


def test_the_app_closed_by_a_signal_saves_everything_and_leaves(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "QT_QPA_PLATFORM": "offscreen"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "--home", str(home), "--safe-mode"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    settings = home / "config" / "settings.json"
    deadline = time.monotonic() + 60
    while not (home / "data" / "history.sqlite3").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # the window is up and idle
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)  # closes the app the normal way (app.gui.lifecycle)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert (home / "config" / "window.ini").is_file()  # the geometry was saved as the window closed
    assert settings.is_file()
    from app.paths import Paths

    assert not Paths.resolve(home).lock_file.exists()  # the single-instance lock was released
