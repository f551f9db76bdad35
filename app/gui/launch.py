"""Starting the desktop app: ``run_gui`` (the ``glassbox`` command without a subcommand, handed to the
command line by ``app.__main__``): the QApplication, the single-instance lock, the settings, the
window, and the exit code."""

from __future__ import annotations

import sys

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from app.gui.lifecycle import quit_on_signals, safe_mode_reason
from app.gui.main_window import MainWindow
from app.paths import Paths
from app.settings import load_settings


def run_gui(paths: Paths, safe_mode: bool = False) -> int:
    """Starts the desktop app; returns the exit code.

    Args:
        paths: where data lives (``--home`` already applied).
        safe_mode: do not load a model automatically.
    """
    from app.gui.lifecycle import start_error
    from app.gui.single_instance import SingleInstance

    app = QApplication.instance() or QApplication(sys.argv[:1])
    assert isinstance(app, QApplication)
    app.setApplicationName("Glassbox")
    app.setOrganizationName("Glassbox")
    app.setDesktopFileName("glassbox")
    try:
        paths.ensure()
        instance = SingleInstance(paths.lock_file)
        acquired = instance.acquire()
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
    loaded = load_settings(paths.settings_file)
    window = MainWindow(
        paths,
        loaded.settings,
        safe_mode=safe_mode or reason is not None,
        safe_reason=reason,
        settings_warning=loaded.warning,
    )
    instance.activation_requested.connect(window.activate_from_second_launch)
    quit_on_signals(app)
    window.show()
    window.composer.edit.setFocus()  # a user can type at once
    QTimer.singleShot(0, window.start)
    try:
        return int(app.exec())
    finally:
        window.shutdown()
        instance.release()
