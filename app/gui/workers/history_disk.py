"""What a failed history write means: a full disk, a write worth trying again, an unreadable file.

A full disk (ROBUSTNESS.md P8): a write that fails because the disk is full becomes a
:class:`HistoryDiskFull` (:func:`explain`), which says how much more space is needed and where;
:func:`can_succeed_later` tells a write the disk refused (full, failing, busy) from one that is
wrong. A history file that is not SQLite (or is corrupt) is :func:`is_unreadable`; it is left
untouched until the user asks to start afresh, and :func:`set_aside` then moves it, with its
side files, out of the way. Everything here is plain Python: the history thread calls it.
"""

from __future__ import annotations

import errno
import os
from datetime import UTC, datetime
from pathlib import Path

from engine.errors import HistoryError
from engine.units import format_bytes

SAVE_MARGIN = 2**20
"""Space a history write needs beyond its own text: write-ahead-log frames, index and search pages."""
SIDE_FILES = ("-wal", "-shm", "-journal")
_NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)})


class HistoryDiskFull(HistoryError):
    """A history write failed because the disk is full.

    Args:
        path: the history file.
        missing: about how many more bytes the write needs.
        free: the bytes free on its disk now (None: unknown).
    """

    def __init__(self, path: Path, missing: int, free: int | None) -> None:
        self.folder = Path(path).parent
        self.missing = missing
        self.free = free
        there = f" ({format_bytes(free)} free)" if free is not None else ""
        super().__init__(path, f"the disk is full: {format_bytes(missing)} more are needed on {self.folder}{there}")


def is_unreadable(exc: BaseException) -> bool:
    """True when ``exc`` says the history file is not SQLite or is corrupt (it was left untouched)."""
    reason = exc.reason if isinstance(exc, HistoryError) else ""
    return "not an SQLite database" in reason or "is corrupt" in reason


def _chain(exc: BaseException) -> list[BaseException]:
    found: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in found:
        found.append(current)
        current = current.__cause__ or current.__context__
    return found


def says_full(exc: BaseException) -> bool | None:
    """True: the disk is full; None: an I/O error (full only if the free space says so); False: neither."""
    io_error = False
    for error in _chain(exc):
        code = str(getattr(error, "sqlite_errorname", ""))
        if isinstance(error, OSError) and error.errno in _NO_SPACE_ERRNOS:
            return True
        if code == "SQLITE_FULL" or "disk is full" in str(error):
            return True
        io_error = io_error or code.startswith("SQLITE_IOERR") or "disk I/O error" in str(error)
    return None if io_error else False


def can_succeed_later(exc: BaseException) -> bool:
    """Whether a failed write may succeed when tried again: the disk was full, busy or failing,
    not the write itself wrong (a message that is gone, a bad state)."""
    if says_full(exc) is not False:
        return True
    text = " ".join(str(error) for error in _chain(exc)).lower()
    return "locked" in text or "busy" in text


def explain(exc: BaseException, path: Path, size_hint: int = 0) -> BaseException:
    """``exc``, or a :class:`HistoryDiskFull` that says how much space a write to ``path`` needs
    when the disk is full (runs on the history thread: asking the disk may block)."""
    if isinstance(exc, HistoryDiskFull):
        return exc
    says = says_full(exc)
    if says is False:
        return exc
    # lazy: start-up (+2 ms)
    from engine.disk import missing_space

    need = SAVE_MARGIN + 4 * size_hint  # the text, its search index and the log frames, roomily
    try:
        missing, free = missing_space(path.parent, need)
    except OSError:
        missing, free = need, None
    if says is None and (free is None or free >= SAVE_MARGIN):
        return exc  # an I/O error on a disk with room: not a full disk
    error = HistoryDiskFull(path, missing or need, free)
    error.__cause__ = exc
    return error


def set_aside(path: Path) -> Path:
    """Renames an unreadable history (and its side files) to ``<name>.unreadable-<UTC time>``.

    Returns:
        The new name of the file.

    Raises:
        HistoryError: it cannot be renamed.
    """
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    target = path.with_name(f"{path.name}.unreadable-{stamp}")
    n = 1
    while any(Path(f"{target}{suffix}").exists() for suffix in ("", *SIDE_FILES)):
        target = path.with_name(f"{path.name}.unreadable-{stamp}-{n}")
        n += 1
    try:
        os.rename(path, target)
        for suffix in SIDE_FILES:
            side = Path(f"{path}{suffix}")
            if side.exists():
                os.rename(side, Path(f"{target}{suffix}"))
    except OSError as exc:
        raise HistoryError(path, f"cannot move it aside: {exc.strerror or exc}") from exc
    return target
