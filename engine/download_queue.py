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
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from engine.downloads import (
    _META_FORMAT,  # the sidecar's format; this module reads it back
    META_SUFFIX,
    PARTIAL_SUFFIX,
    write_json_atomic,
)
from engine.errors import DownloadError
from engine.hub import check_filename, check_repo_id, check_revision


@dataclass(frozen=True)
class PartialDownload:
    """An unfinished download found on disk (``find_partials``): resume it or discard it.

    ``error`` says why it cannot be resumed (its metadata is missing or unreadable); such a
    partial can only be discarded. ``done`` is what a resume keeps: the bytes both recorded in
    the metadata and present in the ``.partial`` file.
    """

    path: Path  # the final path it will have
    repo: str
    filename: str
    revision: str
    done: int
    total: int | None
    updated_at: float | None
    commit: str | None = None
    endpoint: str | None = None
    expected_sha256: str | None = None
    expected_size: int | None = None
    error: str | None = None

    @property
    def resumable(self) -> bool:
        return self.error is None

    @property
    def dest_dir(self) -> Path:
        """The folder to pass to ``download_file`` / ``discard_partial`` with ``filename``."""
        folder = self.path
        for _ in PurePosixPath(self.filename).parts:
            folder = folder.parent
        return folder


def find_partials(root: Path, *, orphans: bool = False) -> list[PartialDownload]:
    """Unfinished downloads under ``root`` (from their resume metadata), oldest first.

    For the GUI after a restart: offer to resume them (``download_file`` with the same repo,
    file and revision) or to discard them (``discard_partial``). A ``*.partial.json`` that cannot
    be read is listed too, with ``error`` set, so its bytes can be freed.

    Args:
        root: the folder to search (recursively); a missing folder has none.
        orphans: also list ``*.partial`` files without metadata (with ``error`` set). Only for
            folders Glassbox owns: elsewhere ``.partial`` may be another program's file.
    """
    found: dict[Path, PartialDownload] = {}
    for meta_path in _glob(Path(root), "*" + META_SUFFIX):
        final = meta_path.with_name(meta_path.name[: -len(META_SUFFIX)])
        found[final] = _describe(final, meta_path)
    if orphans:
        for partial in _glob(Path(root), "*" + PARTIAL_SUFFIX):
            final = partial.with_name(partial.name[: -len(PARTIAL_SUFFIX)])
            if final not in found and partial.is_file():
                found[final] = _unreadable(final, "its resume metadata is missing")
    return sorted(found.values(), key=lambda p: p.updated_at or 0.0)


def _glob(root: Path, pattern: str) -> list[Path]:
    try:
        return [p for p in root.rglob(pattern) if p.is_file()]
    except OSError:  # the folder vanished or cannot be listed: nothing to offer there
        return []


def _partial_size(final: Path) -> tuple[int, float | None]:
    try:
        stat = final.with_name(final.name + PARTIAL_SUFFIX).stat()
    except OSError:
        return 0, None
    return stat.st_size, stat.st_mtime


def _unreadable(final: Path, reason: str) -> PartialDownload:
    size, mtime = _partial_size(final)
    return PartialDownload(path=final, repo="", filename=final.name, revision="", done=size, total=None,
                           updated_at=mtime, error=reason)


def _describe(final: Path, meta_path: Path) -> PartialDownload:
    """The partial download at ``final`` as its metadata describes it (or why it cannot)."""
    try:
        document = json.loads(meta_path.read_text(encoding="utf-8"))
    except OSError as exc:
        return _unreadable(final, f"its resume metadata cannot be read: {exc.strerror or exc}")
    except ValueError:
        return _unreadable(final, "its resume metadata is corrupt (not JSON)")
    if not isinstance(document, dict) or document.get("format") != _META_FORMAT:
        return _unreadable(final, "its resume metadata has an unknown format")
    fields = {k: document.get(k) for k in ("repo", "filename", "revision")}
    if not all(isinstance(v, str) and v for v in fields.values()):
        return _unreadable(final, "its resume metadata does not name the repository and file")
    repo, filename, revision = (str(fields[k]) for k in ("repo", "filename", "revision"))
    try:
        check_repo_id(repo)
        check_revision(revision)
        check_filename(filename)
    except DownloadError as exc:
        return _unreadable(final, f"its resume metadata is not valid: {exc}")
    parts = PurePosixPath(filename).parts
    if final.parts[-len(parts):] != parts:
        return _unreadable(final, f"its resume metadata names another file ({filename})")
    size, mtime = _partial_size(final)
    done = document.get("done")
    total = _int_or_none(document.get("total"))
    updated = document.get("updated_at")
    return PartialDownload(
        path=final, repo=repo, filename=filename, revision=revision,
        done=min(done, size) if isinstance(done, int) and done > 0 else 0, total=total,
        updated_at=float(updated) if isinstance(updated, int | float) else mtime,
        commit=_str_or_none(document.get("commit")), endpoint=_str_or_none(document.get("endpoint")),
        expected_sha256=_str_or_none(document.get("expected_sha256")),
        expected_size=_int_or_none(document.get("expected_size")),
    )


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


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
