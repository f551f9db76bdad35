"""Atomic file writes: a temporary sibling, flush and fsync, then ``os.replace``; and private files.

A reader (or the next start after a crash or a full disk) sees the old file or the new one, never
half of either.

Private files (chats, keys) are owner-only: :func:`create_private_file` makes a new one 0600 before
anything is written to it (SQLite then gives its ``-wal``/``-shm``/journal files the same mode), and
:func:`make_private` takes group and other permissions off one left by an older version, saying so
in the log. Neither touches the process umask, which other threads share.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any, Final

log = logging.getLogger(__name__)

PRIVATE_FILE_MODE: Final = 0o600
PRIVATE_FOLDER_MODE: Final = 0o700
_OTHERS: Final = 0o077  # group and other permission bits


def create_private_file(path: Path) -> bool:
    """Creates ``path`` empty and owner-only (0600) unless it exists.

    Returns:
        True when it was created, False when a file was already there.

    Raises:
        OSError: the folder is missing or not writable.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
    except FileExistsError:
        return False
    try:
        if hasattr(os, "fchmod"):  # exactly 0600, whatever the umask
            os.fchmod(fd, PRIVATE_FILE_MODE)
    finally:
        os.close(fd)
    return True


def make_private(path: Path) -> bool:
    """Takes group and other permissions off an existing file or folder (0644 -> 0600, 0755 -> 0700).

    A change, or a failure to change, is logged as a warning naming the path. Missing paths and
    Windows (no POSIX modes) are left alone.

    Returns:
        True when the mode was changed.
    """
    if os.name != "posix":
        return False
    try:
        old = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return False
    if not old & _OTHERS:
        return False
    new = old & ~_OTHERS
    try:
        os.chmod(path, new)
    except OSError as exc:
        log.warning(
            "%s: other users can read it (mode %03o) and it could not be made owner-only (%s)",
            path,
            old,
            exc.strerror or exc,
        )
        return False
    log.warning("%s: other users could read it (mode %03o); made it owner-only (%03o)", path, old, new)
    return True


def write_text_atomic(path: Path, text: str, *, durable: bool = True, mode: int | None = None) -> None:
    """Replaces ``path`` with ``text`` atomically; ``durable`` fsyncs before the rename.

    Args:
        path: the file to write; its folder is created if missing.
        text: the new contents (UTF-8).
        durable: fsync the data before renaming (skip only for files that are cheap to lose).
        mode: permission bits for the new file; default: the temporary file's own, owner-only
            (0600), so secrets are never readable by others, not even for a moment.
    """
    _replace(path, text, durable=durable, mode=mode)


_Bytes = bytes | bytearray


def write_bytes_atomic(
    path: Path, data: _Bytes | Iterable[_Bytes], *, durable: bool = True, mode: int | None = None
) -> None:
    """Replaces ``path`` with ``data`` atomically, like :func:`write_text_atomic` (owner-only by default).

    ``data`` may be the bytes or their chunks in order: chunks are written one after the other,
    never joined, so a large file (a KV cache state) is not held in memory twice.
    """
    _replace(path, data, durable=durable, mode=mode)


def _replace(path: Path, data: str | _Bytes | Iterable[_Bytes], *, durable: bool, mode: int | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        if mode is not None:
            os.fchmod(fd, mode) if hasattr(os, "fchmod") else os.chmod(tmp, mode)
        handle: IO[Any] = os.fdopen(fd, "w", encoding="utf-8") if isinstance(data, str) else os.fdopen(fd, "wb")
        with handle as fh:
            for part in (data,) if isinstance(data, (str, bytes, bytearray)) else data:
                fh.write(part)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def fsync_dir(folder: Path) -> None:
    """Makes a rename in ``folder`` durable (POSIX); a no-op where folders cannot be opened (Windows)."""
    if sys.platform == "win32":
        return
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json_atomic(path: Path, document: Any, *, durable: bool = True, sort_keys: bool = False) -> None:
    """Replaces ``path`` with ``document`` as JSON, atomically (see :func:`write_text_atomic`)."""
    write_text_atomic(path, json.dumps(document, indent=1, sort_keys=sort_keys) + "\n", durable=durable)
