"""An unfinished download on disk: the ``.partial`` file, its JSON sidecar, its lock, the space it needs.

Owns the names (:data:`PARTIAL_SUFFIX`, :data:`META_SUFFIX`, :func:`partial_paths`), reading the
sidecar back (:func:`read_partial_meta`, :func:`read_meta_file`, :data:`META_FORMAT`), discarding
both (:func:`discard_partial`), the free-space check (:func:`check_disk_space`) and the exclusive
lock one process holds on a partial while it downloads into it (:func:`locked_partial`). The
download itself is :mod:`engine.hub.downloads`; the remembered queue :mod:`engine.hub.queue`.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from engine.disk import missing_space
from engine.errors import DownloadError
from engine.units import format_bytes

__all__ = [
    "META_FORMAT",
    "META_SUFFIX",
    "PARTIAL_SUFFIX",
    "check_disk_space",
    "discard_partial",
    "locked_partial",
    "partial_paths",
    "read_meta_file",
    "read_partial_meta",
]

PARTIAL_SUFFIX = ".partial"
META_SUFFIX = ".partial.json"
META_FORMAT = 1
"""The sidecar's format number; a sidecar with another is not read."""


def partial_paths(dest_dir: Path, filename: str) -> tuple[Path, Path, Path]:
    """``(final, partial, metadata)`` paths for ``filename`` under ``dest_dir``."""
    final = Path(dest_dir) / filename
    return final, final.with_name(final.name + PARTIAL_SUFFIX), final.with_name(final.name + META_SUFFIX)


def check_disk_space(folder: Path, need: int, filename: str) -> None:
    """Raises ``DownloadError`` unless ``folder``'s volume has ``need`` bytes free."""
    missing, free = missing_space(folder, need)
    if missing:
        raise DownloadError(
            f"not enough disk space for {filename}: need {format_bytes(need)}, {format_bytes(free)} free on {folder}"
        )


def read_partial_meta(dest_dir: Path, filename: str) -> dict[str, Any] | None:
    """The resume metadata of an unfinished download, or None (absent or unreadable)."""
    return read_meta_file(partial_paths(dest_dir, filename)[2])


def read_meta_file(meta: Path) -> dict[str, Any] | None:
    """The resume metadata in ``meta`` (a ``*.partial.json``), or None if absent or unreadable."""
    try:
        document = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) and document.get("format") == META_FORMAT else None


def discard_partial(dest_dir: Path, filename: str) -> bool:
    """Deletes an unfinished download's partial file and metadata; True if anything was removed."""
    _, partial, meta = partial_paths(dest_dir, filename)
    removed = False
    for path in (partial, meta):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed = True
    return removed


@contextlib.contextmanager
def locked_partial(partial: Path, filename: str) -> Iterator[int]:
    """Opens (creating) ``partial`` for raw read/write and holds an exclusive, non-blocking lock.

    The lock dies with the process (SIGKILL included). After locking, the path must still name
    the locked file: another process may have just finished and renamed it into place.
    """
    for _ in range(5):
        try:
            fd = os.open(partial, os.O_RDWR | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o644)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise DownloadError(f"{partial}: cannot create the download file: {reason}") from None
        try:
            _try_lock(fd)
        except OSError:
            os.close(fd)
            raise DownloadError(f"{filename}: already being downloaded by another Glassbox window or process") from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(partial))
        except FileNotFoundError:
            same = False
        if same:
            try:
                yield fd
            finally:
                with contextlib.suppress(OSError):
                    os.close(fd)
            return
        os.close(fd)
    raise DownloadError(f"{filename}: the partial download keeps changing under us; try again")


def _try_lock(fd: int) -> None:
    if sys.platform == "win32":
        # lazy: Windows only
        import msvcrt

        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    else:
        # lazy: start-up (+1 ms)
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
