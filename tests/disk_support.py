"""Helpers the tests share about what is on disk: a real small tmpfs for the full-disk tests (where
``mount -t tmpfs`` works, root on Linux) and a way to fill it, file modes, and registry counts read
beside a writer. Tests elsewhere inject ``OSError(ENOSPC)`` instead."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


def mounted_tmpfs(folder: Path, size: str, mode: str = "0700") -> Iterator[Path]:
    """Mounts a tmpfs of ``size`` (``"4m"``, ``"512k"``) on ``folder/disk`` for a fixture to yield
    from; skips the test where mounting is not possible; unmounts afterwards."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root on Linux")
    mount = folder / "disk"
    mount.mkdir()
    command = ["mount", "-t", "tmpfs", "-o", f"size={size},mode={mode}", "tmpfs", str(mount)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not allowed here: {done.stderr.strip() or done.returncode}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)


def fill(mount: Path) -> Path:
    """Writes a file until the disk under ``mount`` is full; returns it (delete it for space)."""
    filler = mount / f"filler-{len(list(mount.glob('filler-*')))}"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    stopped: OSError | None = None
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        stopped = exc
    finally:
        os.close(fd)
    assert stopped is not None and stopped.errno == errno.ENOSPC
    return filler


def file_mode(path: Path) -> int:
    """The permission bits of ``path`` (``0o600``)."""
    import stat

    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def usual_umask() -> Iterator[None]:
    """Runs the test under the usual umask 022 (a module imports it and lists it in
    ``pytestmark = pytest.mark.usefixtures("usual_umask")``)."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def registry_counts(db: Path) -> tuple[int, int]:
    """(documents with stored chunks, embedded chunks) of a knowledge registry, read through a
    read-only connection so a writer in another process is not disturbed; (0, 0) while unreadable."""
    import sqlite3

    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            docs = con.execute("SELECT count(*) FROM documents WHERE content_id IS NOT NULL").fetchone()[0]
            embedded = con.execute("SELECT count(*) FROM chunks WHERE embedded = 1").fetchone()[0]
            return int(docs), int(embedded)
        finally:
            con.close()
    except sqlite3.Error:
        return 0, 0
