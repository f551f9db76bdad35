"""Downloads remembered across restarts: the queue the GUI keeps, and partial files left on disk.

``DownloadQueue`` persists what the user asked to download (queued, paused, failed) in one JSON
file; ``find_partials`` finds unfinished downloads (``*.partial`` plus their resume metadata)
under a folder, so the app can offer to resume or discard them after a restart or an update.
Running the downloads is ``engine.downloads.download_file``'s job.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from engine.downloads import META_SUFFIX, read_meta_file, write_json_atomic
from engine.hub import check_filename, check_repo_id, check_revision


@dataclass(frozen=True)
class PartialDownload:
    """An unfinished download found on disk (``find_partials``): resume it or discard it."""

    path: Path  # the final path it will have
    repo: str
    filename: str
    revision: str
    done: int
    total: int | None
    updated_at: float | None


def find_partials(root: Path) -> list[PartialDownload]:
    """Unfinished downloads under ``root`` (from their resume metadata), oldest first.

    For the GUI after a restart: offer to resume them (``download_file`` with the same repo,
    file and revision) or to discard them (``discard_partial``).
    """
    found: list[PartialDownload] = []
    for meta_path in Path(root).rglob("*" + META_SUFFIX):
        meta = read_meta_file(meta_path)
        if meta is None or not all(isinstance(meta.get(k), str) for k in ("repo", "filename", "revision")):
            continue
        final = meta_path.with_name(meta_path.name[: -len(META_SUFFIX)])
        total = meta.get("total")
        updated = meta.get("updated_at")
        done = meta.get("done")
        found.append(PartialDownload(
            path=final, repo=meta["repo"], filename=meta["filename"], revision=meta["revision"],
            done=done if isinstance(done, int) else 0, total=total if isinstance(total, int) else None,
            updated_at=float(updated) if isinstance(updated, int | float) else None,
        ))
    found.sort(key=lambda p: p.updated_at or 0.0)
    return found



# ------------------------------------------------------------------------------------ the queue

QueueState = Literal["queued", "paused", "failed"]
_QUEUE_FORMAT = 1


@dataclass(frozen=True)
class QueueItem:
    """A download the user asked for that has not finished yet.

    ``key`` identifies it (repo, revision, file and destination); ``error`` is the last failure.
    """

    repo: str
    filename: str
    dest_dir: str
    revision: str = "main"
    expected_sha256: str | None = None
    expected_size: int | None = None
    state: QueueState = "queued"
    error: str | None = None
    added_at: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.repo}@{self.revision}:{self.filename}>{self.dest_dir}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class DownloadQueue:
    """Queued and paused downloads, remembered across restarts in one JSON file.

    The queue only remembers; whoever runs downloads (the GUI's download worker) takes
    ``next_queued()``, calls ``download_file`` and removes or updates the item. The partial
    bytes and their resume metadata live next to the files, so a remembered item resumes where
    it stopped. Thread-safe; the file is rewritten atomically on every change, and a corrupt file
    is set aside (``<name>.corrupt-<time>``) rather than losing the app.

    Args:
        state_file: where the queue lives (its folder is created when first written).
    """

    def __init__(self, state_file: Path) -> None:
        self.state_file = Path(state_file)
        self._lock = threading.Lock()
        self._items: list[QueueItem] = self._load()

    def _load(self) -> list[QueueItem]:
        try:
            document = json.loads(self.state_file.read_text(encoding="utf-8"))
            if not isinstance(document, dict) or document.get("format") != _QUEUE_FORMAT:
                raise ValueError("unknown queue format")
            return [self._item(raw) for raw in document.get("items", [])]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, TypeError, KeyError):
            with contextlib.suppress(OSError):
                os.replace(self.state_file, self.state_file.with_name(
                    f"{self.state_file.name}.corrupt-{int(time.time())}"))
            return []

    @staticmethod
    def _item(raw: Any) -> QueueItem:
        if not isinstance(raw, dict):
            raise TypeError("queue item is not an object")
        item = QueueItem(**{k: raw[k] for k in QueueItem.__dataclass_fields__ if k in raw})
        check_filename(item.filename)
        if item.state not in ("queued", "paused", "failed"):
            raise ValueError(f"unknown state {item.state!r}")
        return item

    def _save(self) -> None:
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        document = {"format": _QUEUE_FORMAT, "items": [i.to_dict() for i in self._items]}
        write_json_atomic(self.state_file, document)

    def items(self) -> list[QueueItem]:
        """All items, oldest first."""
        with self._lock:
            return list(self._items)

    def add(
        self,
        repo: str,
        filename: str,
        dest_dir: Path,
        *,
        revision: str = "main",
        expected_sha256: str | None = None,
        expected_size: int | None = None,
    ) -> QueueItem:
        """Queues a download (or returns the item already queued for the same file).

        Raises:
            DownloadError: a bad repo id, revision or unsafe file name.
        """
        check_repo_id(repo)
        check_revision(revision)
        check_filename(filename)
        item = QueueItem(repo, filename, str(Path(dest_dir)), revision, expected_sha256, expected_size,
                         added_at=time.time())
        with self._lock:
            for existing in self._items:
                if existing.key == item.key:
                    return existing
            self._items.append(item)
            self._save()
        return item

    def remove(self, key: str) -> bool:
        """Forgets an item (its partial file stays; see ``discard_partial``). True if it was there."""
        with self._lock:
            kept = [i for i in self._items if i.key != key]
            if len(kept) == len(self._items):
                return False
            self._items = kept
            self._save()
            return True

    def set_state(self, key: str, state: QueueState, error: str | None = None) -> QueueItem:
        """Marks an item queued, paused or failed (with the error's one-line message).

        Raises:
            KeyError: no such item.
        """
        with self._lock:
            for index, item in enumerate(self._items):
                if item.key == key:
                    self._items[index] = replace(item, state=state, error=error)
                    self._save()
                    return self._items[index]
        raise KeyError(key)

    def next_queued(self) -> QueueItem | None:
        """The oldest item in state ``queued``, if any."""
        with self._lock:
            return next((i for i in self._items if i.state == "queued"), None)
