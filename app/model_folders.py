"""Model folders of other apps on this machine: the Hugging Face cache and LM Studio's models.

Both are hidden folders (``~/.cache/huggingface/hub``, ``~/.lmstudio/models``), which a library
scan of ``~`` skips, so they are offered by name: at first start, and on the Models page, each one
that exists, holds a GGUF, is not in the library yet and was not declined. Qt-free.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

MAX_LOOK = 2000  # entries walked per folder looking for one .gguf


@dataclass(frozen=True)
class OtherAppFolder:
    """A folder another app keeps models in."""

    app: str
    path: Path


def candidate_folders(env: Mapping[str, str] | None = None, home: Path | None = None) -> list[OtherAppFolder]:
    """Where the Hugging Face cache and LM Studio keep models here (whether or not they exist).

    The Hugging Face cache honours ``HF_HUB_CACHE`` and ``HF_HOME`` as ``huggingface_hub`` does;
    LM Studio 0.3 keeps models in ``~/.lmstudio/models``, older versions in
    ``~/.cache/lm-studio/models``.
    """
    env = os.environ if env is None else env
    home = Path.home() if home is None else home
    if env.get("HF_HUB_CACHE"):
        hf = Path(env["HF_HUB_CACHE"]).expanduser()
    elif env.get("HF_HOME"):
        hf = Path(env["HF_HOME"]).expanduser() / "hub"
    else:
        xdg = env.get("XDG_CACHE_HOME")
        hf = (Path(xdg).expanduser() if xdg else home / ".cache") / "huggingface" / "hub"
    return [
        OtherAppFolder("Hugging Face cache", hf),
        OtherAppFolder("LM Studio", home / ".lmstudio" / "models"),
        OtherAppFolder("LM Studio", home / ".cache" / "lm-studio" / "models"),
    ]


def has_gguf(folder: Path) -> bool:
    """Whether ``folder`` holds a ``.gguf`` somewhere (bounded walk, hidden folders skipped)."""
    seen = 0
    for _dirpath, dirnames, filenames in os.walk(folder, onerror=lambda _e: None):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        if any(name.lower().endswith(".gguf") and not name.startswith(".") for name in filenames):
            return True
        seen += len(filenames) + len(dirnames)
        if seen > MAX_LOOK:
            return False
    return False


def offered_folders(
    library_folders: Iterable[Path], declined_file: Path, candidates: list[OtherAppFolder] | None = None
) -> list[OtherAppFolder]:
    """The candidates that exist, hold a GGUF, are not library folders and were not declined."""
    known = {_key(p) for p in library_folders} | {_key(p) for p in declined(declined_file)}
    out = []
    for candidate in candidate_folders() if candidates is None else candidates:
        if _key(candidate.path) in known or not candidate.path.is_dir():
            continue
        if has_gguf(candidate.path):
            out.append(candidate)
    return out


def declined(declined_file: Path) -> list[Path]:
    """Folders the user said not to offer again (an unreadable file is an empty list)."""
    try:
        data = json.loads(declined_file.read_text(encoding="utf-8"))
        return [Path(p) for p in data.get("declined", []) if isinstance(p, str)]
    except (OSError, ValueError, AttributeError):
        return []


def decline(declined_file: Path, folders: Iterable[Path]) -> None:
    """Adds ``folders`` to the declined list (written atomically)."""
    # lazy: start-up (+22 ms)
    from engine.atomic import write_json_atomic

    merged = [str(p) for p in declined(declined_file)]
    for folder in folders:
        if str(folder) not in merged:
            merged.append(str(folder))
    write_json_atomic(declined_file, {"version": 1, "declined": merged})


def _key(path: Path) -> str:
    with contextlib.suppress(OSError):
        return str(Path(path).expanduser().resolve())
    return str(path)
