"""Start-up and shutdown helpers of the desktop app: safe mode after a crash, clean exit on signals,
and the one-line reason a start failed."""

from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from app.paths import Paths, ReadOnlyFolder


def start_error(exc: OSError) -> str:
    """The one line to print after ``glassbox: error:`` when the data folders cannot be set up.

    A read-only folder says so (``the data folder <path> is read-only``); any other error names
    the file and the reason.
    """
    if isinstance(exc, ReadOnlyFolder):
        return str(exc)
    where = f"{exc.filename}: " if exc.filename else ""
    return f"{where}{exc.strerror or exc}"


def safe_mode_reason(paths: Paths) -> str | None:
    """If the last run crashed during risky work, says what crashed (and clears the breadcrumb)."""
    crumb = paths.breadcrumb
    if not crumb.exists():
        return None
    try:
        data = json.loads(crumb.read_text(encoding="utf-8"))
        what = f"{data.get('attempting', 'work')} {Path(str(data.get('path', '?'))).name}"
    except (OSError, ValueError, AttributeError):
        what = "risky work"
    crumb.unlink(missing_ok=True)
    return f"Glassbox stopped unexpectedly last time during: {what}. Started in safe mode (no model auto-load)."


def quit_on_signals(app: QApplication) -> None:
    """Ctrl+C or SIGTERM closes the app the normal way (work cancelled, everything saved).

    Python handles signals only when it runs, so a cheap timer lets it run while Qt waits.
    """
    # lazy: start-up (+3 ms)
    import signal

    def quit_app(_signum: int, _frame: object) -> None:
        app.quit()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, quit_app)
    ticker = QTimer(app)
    ticker.setInterval(250)
    ticker.timeout.connect(lambda: None)
    ticker.start()
