"""Whether this machine can show the window: the one line ``glassbox`` prints when it cannot,
instead of Qt's abort ("could not connect to display", "Could not load the Qt platform plugin
"xcb"", then a core dump) on a machine without a display or without the X libraries Qt's xcb
plugin links (the PySide6 wheels do not bundle them).

Only the X11 case is checked, before the application object exists: another platform asked for
(``QT_QPA_PLATFORM``: offscreen, wayland, vnc…) or a Wayland session is Qt's own business.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from PySide6.QtCore import QLibraryInfo

__all__ = ["X_PACKAGES", "display_problem"]

X_PACKAGES = (
    "libxcb-cursor0 libxcb-icccm4 libxcb-image0 libxcb-keysyms1 libxcb-randr0 libxcb-render0 libxcb-render-util0 "
    "libxcb-shape0 libxcb-shm0 libxcb-sync1 libxcb-util1 libxcb-xfixes0 libxcb-xinerama0 libxcb-xkb1 "
    "libxkbcommon-x11-0 libegl1"
)
"""The Debian/Ubuntu packages of those libraries (the README's set-up line, the .deb's Depends)."""


def xcb_plugin() -> Path | None:
    """Qt's xcb platform plugin in this installation (None: not found)."""

    plugin = Path(QLibraryInfo.path(QLibraryInfo.LibraryPath.PluginsPath)) / "platforms" / "libqxcb.so"
    return plugin if plugin.is_file() else None


def display_problem(
    env: Mapping[str, str] | None = None,
    platform: str = sys.platform,
    load: Callable[[str], object] = ctypes.CDLL,
    plugin: Path | None = None,
) -> str | None:
    """Why the window cannot be shown here, in one line (None: it can, or it is not X11's case).

    Args:
        env: the environment (default: this process's).
        platform: ``sys.platform``.
        load: loads a shared library (``ctypes.CDLL``; raises OSError naming what is missing).
        plugin: Qt's xcb plugin (default: this installation's).
    """
    env = os.environ if env is None else env
    if not platform.startswith("linux"):
        return None
    qpa = env.get("QT_QPA_PLATFORM", "")
    if (qpa and not qpa.startswith("xcb")) or (not qpa and env.get("WAYLAND_DISPLAY")):
        return None
    display = env.get("DISPLAY", "")
    if not display:
        return (
            "no display to show the window on (DISPLAY is not set): start Glassbox in a desktop session, "
            "or use its commands (glassbox --help)"
        )
    plugin = plugin or xcb_plugin()
    if plugin is not None:
        try:
            load(str(plugin))
        except OSError as exc:
            missing = str(exc).split(":", 1)[0].strip() or "a library"
            return (
                f"{plugin.name}: {missing} is missing, and Qt needs it to open a window on X11 "
                f"(Debian/Ubuntu: sudo apt install {X_PACKAGES})"
            )
    if not _x_server_answers(display, load):
        return f"cannot open the display {display}: no X server answers there (is DISPLAY right, and may you use it?)"
    return None


def _x_server_answers(display: str, load: Callable[[str], object]) -> bool:
    """Whether an X server accepts a connection on ``display`` (libxcb's own connect)."""
    try:
        xcb = load("libxcb.so.1")
    except OSError:
        return True  # no libxcb to ask with: Qt says what is wrong
    connect = getattr(xcb, "xcb_connect", None)
    if connect is None:
        return True
    connect.restype = ctypes.c_void_p
    connection = connect(display.encode(), None)
    if not connection:
        return False
    failed = xcb.xcb_connection_has_error(ctypes.c_void_p(connection))  # type: ignore[attr-defined]
    xcb.xcb_disconnect(ctypes.c_void_p(connection))  # type: ignore[attr-defined]
    return not failed
