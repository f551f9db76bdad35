"""What the main window lends its controllers: where notices go (:class:`Notices`), the settings as
they are now (:class:`SettingsStore`), and a guard for answers that arrive after the window closed
(:func:`while_alive`).

The controllers (``conversation_controller``, ``documents_controller``, ``model_bar``,
``transcript_controller``, ``api_server_control``) get these in their constructors, with the
widgets and adapters they use, and never reach back into the window's attributes by name.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from app.gui.tasks import describe_error

if TYPE_CHECKING:
    from app.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")


class Notices(Protocol):
    """Where a controller tells the user something: the error banner and the status bar."""

    def show_error(self, message: str) -> None:
        """Shows an error above the transcript (and in the status bar)."""

    def show_status(self, message: str, ms: int = 0) -> None:
        """Shows a line in the status bar for ``ms`` milliseconds (0: until the next one)."""

    def clear_error(self) -> None:
        """Hides the error banner."""


class SettingsStore:
    """The window's settings: the current ones (Settings… replaces them) and saving them.

    Args:
        settings: the settings loaded at start.
        file: where they are saved (``paths.settings_file``).
        notices: where a failed save is said.
    """

    def __init__(self, settings: Settings, file: Path, notices: Notices) -> None:
        self.current = settings
        self._file = file
        self._notices = notices

    def save(self) -> None:
        """Writes the current settings (a failure is shown, never raised)."""
        # lazy: start-up (the first frame imports this module; pydantic comes after it)
        from app.settings import save_settings

        try:
            save_settings(self.current, self._file)
        except OSError as exc:
            self._notices.show_error(f"Could not save settings: {describe_error(exc)}")


def while_alive(alive: Callable[[], bool], callback: Callable[[T], None]) -> Callable[[T], None]:
    """``callback`` for a background job's answer, dropped once ``alive()`` is false: the answer is
    queued on the GUI thread and may arrive after the window's widgets are deleted."""

    def guarded(value: T) -> None:
        if alive():
            callback(value)
        else:
            log.debug("a background answer came after the window closed; dropped")

    return guarded
