"""Sizes, speeds and times left in words: the one way the GUI and the command line print them.

``format_bytes(253_113_024) == "241.4 MiB"``, ``format_speed(2048) == "2.0 KiB/s"``,
``format_eta(25) == "25 s left"``, ``format_duration(130) == "2 min 10 s"``. Pure functions of
numbers; nothing here reads a clock. Sizes are binary (KiB, MiB, GiB) everywhere, a size cap the
user sets included.
"""

from __future__ import annotations

__all__ = ["format_bytes", "format_duration", "format_eta", "format_speed"]

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_bytes(n_bytes: int | float | None) -> str:
    """A size in binary units: ``"512 B"``, ``"241.4 MiB"``, ``"1.5 TiB"``; ``"—"`` when unknown (None)."""
    if n_bytes is None:
        return "—"
    value = float(n_bytes)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable: the last unit always returns")  # pragma: no cover


def format_speed(bytes_per_s: float) -> str:
    """A transfer speed: ``"12.3 MiB/s"``; ``"—"`` while there is none (0)."""
    return f"{format_bytes(bytes_per_s)}/s" if bytes_per_s > 0 else "—"


def format_eta(seconds: float | None) -> str:
    """The time left: ``"40 s left"``, ``"5 min left"``, ``"1.5 h left"``; ``""`` while unknown (None or < 0)."""
    if seconds is None or seconds < 0:
        return ""
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h left"
    if seconds >= 90:
        return f"{seconds / 60:.0f} min left"
    return f"{seconds:.0f} s left"


def format_duration(seconds: float) -> str:
    """How long something took: ``"90 ms"``, ``"4.2 s"``, ``"41 s"``, ``"2 min 10 s"``."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    return f"{int(seconds // 60)} min {int(seconds % 60)} s"
