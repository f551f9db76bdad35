"""Atomic file writes: a temporary sibling, flush and fsync, then ``os.replace``.

A reader (or the next start after a crash or a full disk) sees the old file or the new one, never
half of either.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any


def write_text_atomic(path: Path, text: str, *, durable: bool = True, mode: int | None = None) -> None:
    """Replaces ``path`` with ``text`` atomically; ``durable`` fsyncs before the rename.

    Args:
        path: the file to write; its folder is created if missing.
        text: the new contents (UTF-8).
        durable: fsync the data before renaming (skip only for files that are cheap to lose).
        mode: permission bits for the new file; default: the temporary file's own, owner-only
            (0600), so secrets are never readable by others, not even for a moment.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        if mode is not None:
            os.fchmod(fd, mode) if hasattr(os, "fchmod") else os.chmod(tmp, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
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
