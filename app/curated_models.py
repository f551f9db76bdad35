"""The suggested chat models shown on Discover before any search (``resources/curated_models.json``).

A short, shipped list of well-known instruction-tuned GGUF models (repo, file, approximate size,
licence), so a new user sees something to download even before searching, and offline too. The
sizes give a fit verdict without the network; a download lists the repository first, so the
Hub's own sizes and hashes are what the download checks. Qt-free.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
FILE_NAME = "curated_models.json"


@dataclass(frozen=True)
class CuratedModel:
    """One suggestion: a file in a Hub repository."""

    label: str
    repo: str
    file: str
    size: int
    license: str
    params: str = ""
    about: str = ""


def curated_path() -> Path:
    """``resources/curated_models.json``, in the source tree or the frozen bundle."""
    # lazy: start-up (+22 ms)
    from app.paths import resource_path

    return resource_path(FILE_NAME)


def load_curated(path: Path | None = None) -> list[CuratedModel]:
    """The suggestions, smallest first. A missing or broken file, or a bad entry, is logged and
    left out (the list is a convenience; search still works)."""
    # lazy: start-up (+69 ms)
    from engine.errors import EngineError
    from engine.hub.search import check_filename, check_repo_id

    path = curated_path() if path is None else path
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        entries = document["models"]
        if not isinstance(entries, list):
            raise TypeError("models is not a list")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("%s: no suggested models (%s)", path, exc)
        return []
    out: list[CuratedModel] = []
    for index, raw in enumerate(entries):
        try:
            model = CuratedModel(
                label=str(raw["label"]),
                repo=check_repo_id(str(raw["repo"])),
                file=check_filename(str(raw["file"])),
                size=int(raw["size"]),
                license=str(raw["license"]),
                params=str(raw.get("params", "")),
                about=str(raw.get("about", "")),
            )
        except (KeyError, TypeError, ValueError, AttributeError, EngineError) as exc:
            log.warning("%s: suggested model %d left out (%s)", path, index + 1, exc)
            continue
        if model.size <= 0:
            log.warning("%s: suggested model %d left out (size %d)", path, index + 1, model.size)
            continue
        out.append(model)
    return sorted(out, key=lambda m: m.size)
