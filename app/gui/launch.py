"""Starting the desktop app: ``run_gui`` (the ``glassbox`` command without a subcommand, handed to the
command line by ``app.__main__``): the QApplication, the single-instance lock, the settings, the
window, and the exit code."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, NoReturn

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from app.gui.lifecycle import quit_on_signals, safe_mode_reason, start_error
from app.gui.main_window import MainWindow
from app.gui.single_instance import SingleInstance
from app.gui.theme import new_application
from app.paths import Paths

if TYPE_CHECKING:
    from app.settings import SettingsLoad


def leave_process(code: int) -> NoReturn:
    """Ends the process after the window has shut everything down, without the interpreter's
    teardown of every module it imported.

    By then the window has closed the history, written the settings and the window's geometry,
    stopped the workers, the knowledge process and the model (its KV cache written), and released
    the single-instance lock. What Python would still do is clear thousands of module objects one
    by one: 0.4 to 1.5 s of the app's exit, measured. The threads still running are joined, the
    ``atexit`` hooks run (logging, multiprocessing's children, the MCP servers, temporary files),
    the output is flushed, then the process leaves with ``code``.
    """
    deadline = time.monotonic() + 2.0  # the window stopped its threads: any left is idle or late
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join(max(deadline - time.monotonic(), 0.0))
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken pipe: nothing more to say
    os._exit(code)


def _exit_when_complete(app: QApplication, window: MainWindow, instance: SingleInstance) -> int:
    """Lets tests/bench/bench_startup.py time the real launch: prints "shown" once the window's
    first frame is on screen and "complete" once what it left out is built and painted, then
    leaves (no worker is started)."""

    def complete() -> None:
        app.processEvents()  # paints what was just built
        print("complete", flush=True)  # noqa: T201
        app.quit()

    window.first_frame_shown.connect(lambda: print("shown", flush=True))  # noqa: T201
    window.completed.connect(complete)
    window.show()
    window.composer.edit.setFocus()
    app.exec()
    window.shutdown()
    instance.release()
    return 0


def run_gui(paths: Paths, safe_mode: bool = False) -> int:
    """Starts the desktop app; returns the exit code.

    Args:
        paths: where data lives (``--home`` already applied).
        safe_mode: do not load a model automatically.
    """
    if QApplication.instance() is None:
        from app.gui.display_check import display_problem  # lazy: start-up (+4 ms: ctypes); only without a QApplication

        problem = display_problem()  # no display, no X libraries: one line, not Qt's abort
        if problem is not None:
            print(f"glassbox: error: {problem}", file=sys.stderr)  # noqa: T201
            return 1
    app = QApplication.instance() or new_application(sys.argv[:1])
    assert isinstance(app, QApplication)
    app.setApplicationName("Glassbox")
    app.setOrganizationName("Glassbox")
    app.setDesktopFileName("glassbox")
    try:
        paths.ensure()
        instance = SingleInstance(paths.lock_file)
        acquired = instance.acquire(listen=False)  # it listens once the first frame is shown
    except OSError as exc:  # ReadOnlyFolder among them: one line, exit code 1, no traceback
        print(f"glassbox: error: {start_error(exc)}", file=sys.stderr)  # noqa: T201
        return 1
    if not acquired:
        if instance.notify_running():
            print("glassbox: already running; brought its window forward", file=sys.stderr)  # noqa: T201
            return 0
        print(f"glassbox: error: {paths.lock_file}: another Glassbox holds this data folder", file=sys.stderr)  # noqa: T201
        return 1
    reason = safe_mode_reason(paths)

    def read_settings() -> SettingsLoad:
        from app.settings import load_settings  # lazy: start-up (pydantic, ~0.1 s: after the first frame)

        return load_settings(paths.settings_file)

    # Two steps: the first frame shows the window, then the settings are read and the rest is built.
    window = MainWindow(paths, read_settings, safe_mode=safe_mode or reason is not None, safe_reason=reason)
    instance.activation_requested.connect(window.activate_from_second_launch)
    window.completed.connect(instance.listen)  # after the first frame, with the rest of the window
    quit_on_signals(app)
    if os.environ.get("GLASSBOX_TEST_EXIT_WHEN_SHOWN"):
        return _exit_when_complete(app, window, instance)
    # The history, the models and the model load start once the window is complete.
    window.completed.connect(lambda: QTimer.singleShot(0, window.start))
    window.show()
    window.composer.edit.setFocus()  # a user can type at once
    try:
        return int(app.exec())
    finally:
        window.shutdown()
        instance.release()
