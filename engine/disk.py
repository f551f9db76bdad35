"""Free disk space: the one check of the engine (downloads, quantization, conversion, the app's
history all ask it)."""

from __future__ import annotations

import shutil
from pathlib import Path


def missing_space(folder: Path, need: int) -> tuple[int, int]:
    """How many of ``need`` bytes ``folder``'s volume lacks (0 when it has them all), and how many
    bytes it has free for this user: ``(missing, free)``.

    The one free-space check of the engine: downloads, quantization and conversion (up front and
    again after a write failed), and the app's history all ask it.

    Raises:
        OSError: the folder's volume cannot be asked (it does not exist, a dead network mount).
    """
    free = shutil.disk_usage(folder).free
    return max(0, need - free), free
