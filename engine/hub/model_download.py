"""Every file of one model, one after the other: the download loop the Models page and
``glassbox models download`` share.

A model choice is one file, every part of a split GGUF, or either with its vision projector.
``download_files`` fetches them in order with ``engine.hub.downloads.download_file`` (resumable,
sha256-verified, pause and cancel events honoured), adds up the bytes over the files and reports
each step as a frozen :class:`FilesProgress` snapshot, safe to hand to another thread as it is.

``model_folder`` says where a repository's files go: ``<models>/<owner>/<repo>/``, for both.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.hub.download_job import DownloadResult
from engine.hub.downloads import download_file
from engine.hub.partials import partial_paths
from engine.hub.queue import file_on_disk
from engine.hub.transfer import DownloadProgress

__all__ = ["DEFAULT_DISK_MARGIN", "FileJob", "FilesOutcome", "FilesProgress", "download_files", "model_folder"]

DEFAULT_DISK_MARGIN = 512 * 2**20


def model_folder(models_dir: Path, repo: str, filenames: Sequence[str] = ()) -> Path:
    """The folder a download from ``repo`` goes to: ``<models_dir>/<owner>/<repo>/``.

    Before one layout, the Models page saved to ``<models_dir>/<owner>__<repo>/``: when that
    folder already holds one of ``filenames`` (complete, or a partial to resume) and the new
    one holds none, it is the answer, so what is there is found rather than fetched again.
    A few ``stat`` calls; ``repo`` is ``owner/name`` (checked by the caller).
    """
    owner, name = repo.split("/", 1)
    folder = models_dir / owner / name
    old = models_dir / f"{owner}__{name}"

    def holds(where: Path) -> bool:
        return any(path.exists() for filename in filenames for path in partial_paths(where, filename)[:2])

    return old if not holds(folder) and holds(old) else folder


@dataclass(frozen=True)
class FileJob:
    """One file of a download: what ``download_file`` needs to start or resume it."""

    repo: str
    filename: str
    dest_dir: Path
    revision: str = "main"
    endpoint: str | None = None
    expected_sha256: str | None = None
    expected_size: int | None = None

    @property
    def path(self) -> Path:
        """The file's final path."""
        return self.dest_dir / self.filename


@dataclass(frozen=True)
class FilesProgress:
    """One step of a multi-file download.

    Attributes:
        file: the running file's own report (its name, bytes, speed, ETA, state, attempt).
        index: which file runs (0-based) of ``count``.
        count: how many files the download has.
        done: bytes over all files (those finished or found complete, plus this one's).
        total: bytes over all files: the listed sizes (0 where unknown); for one file, its own
            report's total once the server told it.
        files_done: files complete so far (downloaded, verified or found complete on disk).
    """

    file: DownloadProgress
    index: int
    count: int
    done: int
    total: int
    files_done: int

    @property
    def state(self) -> str:
        """The download's state: one file of several ``done`` means the download goes on."""
        if self.file.state == "done" and self.index + 1 < self.count:
            return "downloading"
        return self.file.state


@dataclass(frozen=True)
class FilesOutcome:
    """What ``download_files`` did: the files it downloaded (or verified in place) and those it
    skipped as complete on disk; fewer than ``count`` together when cancel stopped it between files."""

    downloaded: tuple[DownloadResult, ...]
    skipped: tuple[FileJob, ...]
    count: int

    @property
    def complete(self) -> bool:
        """Every file is there."""
        return len(self.downloaded) + len(self.skipped) == self.count


def download_files(
    jobs: Sequence[FileJob],
    *,
    cancel: threading.Event | None = None,
    pause: threading.Event | None = None,
    progress: Callable[[FilesProgress], None] | None = None,
    on_file: Callable[[DownloadResult], None] | None = None,
    skip_complete: bool = False,
    disk_margin_bytes: int = DEFAULT_DISK_MARGIN,
) -> FilesOutcome:
    """Downloads ``jobs`` in order, each resumable and verified. Blocking; run it off the GUI thread.

    Args:
        jobs: the files, in the order to fetch them.
        cancel: set it to stop: the running file keeps its partial (``Cancelled`` is raised); set
            between two files, the next one does not start and the outcome is incomplete.
        pause: while set, the running file stops with its connection closed; cleared, it goes on.
        progress: called with a :class:`FilesProgress` for each report of the running file (from
            the download thread or its watchdog; calls never overlap).
        on_file: called with each file's result as soon as it is complete and verified.
        skip_complete: files already complete on disk (renamed into place, the listed size) are
            not fetched or hashed again (a resume); without it ``download_file`` verifies them.
        disk_margin_bytes: free space to leave on the volume beyond each file.

    Returns:
        The files downloaded and those skipped.

    Raises:
        DownloadError: a file failed (see ``download_file``); the files before it stay complete.
        Cancelled: ``cancel`` was set while a file ran.
    """
    cancel = cancel if cancel is not None else threading.Event()
    count = len(jobs)
    listed_total = sum(job.expected_size or 0 for job in jobs)
    downloaded: list[DownloadResult] = []
    skipped: list[FileJob] = []
    base = 0  # bytes of the files before the running one

    def report(index: int, update: DownloadProgress, files_done: int | None = None) -> None:
        if progress is None:
            return
        if files_done is None:  # the running file: complete once it reports done
            files_done = index + (update.state == "done")
        total = update.total if count == 1 and update.total else listed_total
        progress(FilesProgress(update, index, count, base + update.done, total, files_done))

    for index, job in enumerate(jobs):
        if cancel.is_set():
            break
        if skip_complete:
            on_disk = file_on_disk(job.dest_dir, job.filename, job.expected_size)
            if on_disk.complete:
                skipped.append(job)
                report(
                    index,
                    DownloadProgress(
                        job.filename, on_disk.done, on_disk.done, 0.0, None, "done", 1, "already downloaded"
                    ),
                    index + 1,
                )
                base += on_disk.done
                continue
        result = download_file(
            job.repo, job.filename, job.dest_dir, revision=job.revision, endpoint=job.endpoint,
            expected_sha256=job.expected_sha256, expected_size=job.expected_size, cancel=cancel, pause=pause,
            progress=functools.partial(report, index),
            disk_margin_bytes=disk_margin_bytes,
        )  # fmt: skip
        downloaded.append(result)
        if on_file is not None:
            on_file(result)
        base += job.expected_size or result.size
    return FilesOutcome(tuple(downloaded), tuple(skipped), count)
