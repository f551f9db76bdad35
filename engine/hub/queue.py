"""Downloads remembered across restarts: the queue the GUI keeps, and partial files left on disk.

``DownloadQueue`` persists what the user asked to download in one JSON file: one item per model
choice, listing all its files (every part of a split GGUF, the mmproj), so a restart knows about
the parts that had not started yet. ``find_partials`` finds unfinished downloads (``*.partial``
plus their resume metadata) under a folder; ``check_on_disk`` tells how far a queued item got.
The app offers to resume or discard them after a restart or an update. Running the downloads is
``engine.hub.downloads.download_file``'s job.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from engine.atomic import write_json_atomic
from engine.errors import DownloadError
from engine.hub.partials import (
    META_FORMAT,  # the sidecar's format; this module reads it back
    META_SUFFIX,
    PARTIAL_SUFFIX,
    partial_paths,
)
from engine.hub.search import check_filename, check_repo_id, check_revision


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
    return PartialDownload(
        path=final, repo="", filename=final.name, revision="", done=size, total=None, updated_at=mtime, error=reason
    )


def _describe(final: Path, meta_path: Path) -> PartialDownload:
    """The partial download at ``final`` as its metadata describes it (or why it cannot)."""
    try:
        document = json.loads(meta_path.read_text(encoding="utf-8"))
    except OSError as exc:
        return _unreadable(final, f"its resume metadata cannot be read: {exc.strerror or exc}")
    except ValueError:
        return _unreadable(final, "its resume metadata is corrupt (not JSON)")
    if not isinstance(document, dict) or document.get("format") != META_FORMAT:
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
    if final.parts[-len(parts) :] != parts:
        return _unreadable(final, f"its resume metadata names another file ({filename})")
    size, mtime = _partial_size(final)
    done = document.get("done")
    total = _int_or_none(document.get("total"))
    updated = document.get("updated_at")
    return PartialDownload(
        path=final,
        repo=repo,
        filename=filename,
        revision=revision,
        done=min(done, size) if isinstance(done, int) and done > 0 else 0,
        total=total,
        updated_at=float(updated) if isinstance(updated, int | float) else mtime,
        commit=_str_or_none(document.get("commit")),
        endpoint=_str_or_none(document.get("endpoint")),
        expected_sha256=_str_or_none(document.get("expected_sha256")),
        expected_size=_int_or_none(document.get("expected_size")),
    )


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


# ------------------------------------------------------------------------------------ the queue

QueueState = Literal["queued", "downloading", "paused", "failed"]
_QUEUE_STATES: tuple[str, ...] = ("queued", "downloading", "paused", "failed")
_QUEUE_FORMAT = 2  # format 1 had one file per item; it is still read


@dataclass(frozen=True)
class QueueFile:
    """One file of a queued download, with what the listing promised about it."""

    filename: str
    expected_sha256: str | None = None
    expected_size: int | None = None


@dataclass(frozen=True)
class QueueItem:
    """A download the user asked for that has not finished yet: one model choice, all its files.

    ``name`` is what the user chose (the file name, or the split set's name); ``files`` are in
    download order (parts first, then the mmproj). ``revision`` is the commit when the listing
    told it. ``state`` is ``downloading`` while a session runs it (a restart finds it so when the
    app was killed); ``error`` is the last failure. ``key`` identifies the item (repo, revision,
    name and destination).
    """

    repo: str
    name: str
    dest_dir: str
    files: tuple[QueueFile, ...]
    revision: str = "main"
    endpoint: str | None = None
    state: QueueState = "queued"
    error: str | None = None
    added_at: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.repo}@{self.revision}:{self.name}>{self.dest_dir}"

    @property
    def filename(self) -> str:
        """The first file (the only one of a single-file download)."""
        return self.files[0].filename

    @property
    def expected_sha256(self) -> str | None:
        return self.files[0].expected_sha256

    @property
    def expected_size(self) -> int | None:
        return self.files[0].expected_size

    @property
    def paths(self) -> list[Path]:
        """The final paths of its files, in order."""
        return [Path(self.dest_dir) / f.filename for f in self.files]

    def to_dict(self) -> dict[str, Any]:
        document = asdict(self)
        document["files"] = [asdict(f) for f in self.files]
        return document


@dataclass(frozen=True)
class FileOnDisk:
    """How far one file of a queued download got: ``complete`` (renamed into place, so verified),
    else ``done`` bytes a resume keeps out of ``total`` (None when unknown)."""

    path: Path
    complete: bool
    done: int
    total: int | None


@dataclass(frozen=True)
class QueuedOnDisk:
    """A queue item and the state of each of its files on disk (``check_on_disk``)."""

    item: QueueItem
    files: tuple[FileOnDisk, ...]

    @property
    def complete(self) -> bool:
        return all(f.complete for f in self.files)

    @property
    def files_done(self) -> int:
        return sum(f.complete for f in self.files)

    @property
    def done(self) -> int:
        return sum(f.done for f in self.files)

    @property
    def total(self) -> int | None:
        """All files' sizes, or None when one is unknown."""
        sizes = [f.total for f in self.files]
        return None if any(s is None for s in sizes) else sum(s or 0 for s in sizes)


def file_on_disk(dest_dir: Path, filename: str, expected_size: int | None = None) -> FileOnDisk:
    """Where the download of ``filename`` into ``dest_dir`` stands, from the files there.

    A file is complete when its final path exists without a ``.partial`` beside it (the engine
    renames only a verified file into place) and has the expected size, when one is given.
    """
    final, partial, meta = partial_paths(Path(dest_dir), filename)
    has_partial = partial.is_file()
    if not has_partial and final.is_file():
        try:
            size = final.stat().st_size
        except OSError:
            size = -1
        if size >= 0 and (expected_size is None or size == expected_size):
            return FileOnDisk(final, True, size, size)
    if not has_partial:
        return FileOnDisk(final, False, 0, expected_size)
    if meta.is_file():
        found = _describe(final, meta)
        if found.resumable:
            return FileOnDisk(final, False, found.done, expected_size or found.expected_size or found.total)
    return FileOnDisk(final, False, 0, expected_size)  # no usable checkpoint: a resume starts over


def check_on_disk(item: QueueItem) -> QueuedOnDisk:
    """How far each of ``item``'s files got (complete, or the bytes a resume keeps)."""
    return QueuedOnDisk(item, tuple(file_on_disk(Path(item.dest_dir), f.filename, f.expected_size) for f in item.files))


class DownloadQueue:
    """What the user asked to download and has not got yet, remembered across restarts in one JSON file.

    The queue only remembers; whoever runs downloads (the GUI's models adapter) adds an item
    when the user asks, updates its state as it runs and removes it once every file is complete
    (or the user discards it). The partial bytes and their resume metadata live next to the
    files, so a remembered item resumes where it stopped. Thread-safe; the file is rewritten
    atomically on every change (``write_json_atomic``), and a corrupt file is set aside
    (``<name>.corrupt-<time>``) rather than losing the app. Reading the file is IO: build and use
    it off the GUI thread.

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
            if not isinstance(document, dict) or document.get("format") not in (1, _QUEUE_FORMAT):
                raise ValueError("unknown queue format")
            raw_items = document.get("items", [])
            if not isinstance(raw_items, list):
                raise TypeError("queue items are not a list")
            return [self._item(raw) for raw in raw_items]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, TypeError, KeyError, DownloadError):
            with contextlib.suppress(OSError):
                os.replace(
                    self.state_file, self.state_file.with_name(f"{self.state_file.name}.corrupt-{int(time.time())}")
                )
            return []

    @staticmethod
    def _item(raw: Any) -> QueueItem:
        if not isinstance(raw, dict):
            raise TypeError("queue item is not an object")
        if "files" in raw:
            files = tuple(_queue_file(f) for f in raw["files"])
            name = raw["name"]
        else:  # format 1: one file per item
            files = (_queue_file(raw),)
            name = raw["filename"]
        if not files or not isinstance(name, str):
            raise ValueError("queue item without files")
        state = raw.get("state", "queued")
        item = QueueItem(
            repo=raw["repo"],
            name=name,
            dest_dir=str(raw["dest_dir"]),
            files=files,
            revision=raw.get("revision", "main"),
            endpoint=_str_or_none(raw.get("endpoint")),
            # A state this version does not know (a newer app wrote it): the user decides again.
            state=state if state in _QUEUE_STATES else "paused",
            error=_str_or_none(raw.get("error")),
            added_at=float(raw.get("added_at") or 0.0),
        )
        check_repo_id(item.repo)
        check_revision(item.revision)
        return item

    def _save(self) -> None:
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        document = {"format": _QUEUE_FORMAT, "items": [i.to_dict() for i in self._items]}
        write_json_atomic(self.state_file, document)

    def items(self) -> list[QueueItem]:
        """All items, oldest first."""
        with self._lock:
            return list(self._items)

    def get(self, key: str) -> QueueItem | None:
        with self._lock:
            return next((i for i in self._items if i.key == key), None)

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
        """Queues a one-file download (or returns the item already queued for the same file).

        Raises:
            DownloadError: a bad repo id, revision or unsafe file name.
        """
        item = make_item(
            repo, filename, dest_dir, [QueueFile(filename, expected_sha256, expected_size)], revision=revision
        )
        with self._lock:
            for existing in self._items:
                if existing.key == item.key:
                    return existing
            self._items.append(item)
            self._save()
        return item

    def put(self, item: QueueItem) -> QueueItem:
        """Queues ``item`` (from ``make_item``); one with the same key is replaced in place, keeping
        when it was first added. Returns what is stored."""
        with self._lock:
            for index, existing in enumerate(self._items):
                if existing.key == item.key:
                    item = replace(item, added_at=existing.added_at or item.added_at)
                    self._items[index] = item
                    break
            else:
                self._items.append(item)
            self._save()
        return item

    def remove(self, key: str) -> bool:
        """Forgets an item (its partial files stay; see ``discard_partial``). True if it was there."""
        with self._lock:
            kept = [i for i in self._items if i.key != key]
            if len(kept) == len(self._items):
                return False
            self._items = kept
            self._save()
            return True

    def set_state(self, key: str, state: QueueState, error: str | None = None) -> QueueItem:
        """Marks an item queued, downloading, paused or failed (with the error's one-line message).
        Writes nothing when it is so already.

        Raises:
            KeyError: no such item.
        """
        with self._lock:
            for index, item in enumerate(self._items):
                if item.key == key:
                    if (item.state, item.error) != (state, error):
                        self._items[index] = replace(item, state=state, error=error)
                        self._save()
                    return self._items[index]
        raise KeyError(key)

    def next_queued(self) -> QueueItem | None:
        """The oldest item in state ``queued``, if any."""
        with self._lock:
            return next((i for i in self._items if i.state == "queued"), None)


def make_item(
    repo: str,
    name: str,
    dest_dir: Path,
    files: Sequence[QueueFile],
    *,
    revision: str = "main",
    endpoint: str | None = None,
) -> QueueItem:
    """A validated queue item for a model choice (pure: no IO, fine on any thread).

    Raises:
        DownloadError: a bad repo id, revision or unsafe file name, or no files.
    """
    check_repo_id(repo)
    check_revision(revision)
    if not files:
        raise DownloadError(f"{name}: nothing to download")
    for f in files:
        check_filename(f.filename)
    return QueueItem(repo, name, str(Path(dest_dir)), tuple(files), revision, endpoint, added_at=time.time())


def _queue_file(raw: Any) -> QueueFile:
    if not isinstance(raw, dict) or not isinstance(raw.get("filename"), str):
        raise TypeError("queued file without a name")
    check_filename(raw["filename"])
    return QueueFile(raw["filename"], _str_or_none(raw.get("expected_sha256")), _int_or_none(raw.get("expected_size")))
