"""The downloads adapter's work off the GUI thread.

* :class:`DownloadRun`: one run of a download on the download thread. Built on the GUI thread
  from a frozen :class:`~app.gui.workers.transfers.Transfer`, then used only by the download thread
  (and the engine's watchdog, whose calls never overlap with it). It keeps the queue item's state
  in step (``downloading``, ``paused``, ``failed``; removed once every file is there) and hands the
  GUI thread the engine's frozen ``FilesProgress`` reports, throttled; it never touches a transfer.
* :class:`QueueIO`: the download queue file, read and written in order on its own thread.
* :func:`look_for_unfinished`: what an earlier session left unfinished (on the background pool).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING

from app.gui.tasks import SerialExecutor, call_on_gui_thread, describe_error
from app.gui.workers.library_adapter import record_provenance
from engine.errors import Cancelled

if TYPE_CHECKING:
    from app.gui.workers.transfers import Transfer
    from engine.hub.model_download import FilesOutcome, FilesProgress
    from engine.hub.queue import DownloadQueue, PartialDownload, QueuedOnDisk, QueueState
    from engine.library import ModelLibrary

PROGRESS_INTERVAL_S = 0.2


class DownloadRun:
    """The download thread's side of one run of ``transfer``.

    Args:
        transfer: the run's first snapshot (its files, events and queue item).
        skip_complete: a resume: files already complete on disk are not fetched again (a fresh
            download lets the engine verify them instead).
        queue_call: runs a change on the download queue, in order, off the GUI thread.
        on_progress: called on the GUI thread with ``(transfer, FilesProgress)``.
    """

    def __init__(
        self,
        transfer: Transfer,
        skip_complete: bool,
        queue_call: Callable[[Callable[[DownloadQueue], object]], None],
        on_progress: Callable[[Transfer, FilesProgress], None],
    ) -> None:
        self.transfer = transfer
        self.skip_complete = skip_complete
        self.queue_call = queue_call
        self.on_progress = on_progress
        self.last_emit = 0.0
        self.queue_state = ""

    def set_queue_state(self, state: QueueState, error: str | None = None) -> None:
        """Records the run's state in its queue item (once per change)."""
        key = self.transfer.queue_key
        if key is not None and self.queue_state != state:
            self.queue_state = state
            self.queue_call(lambda q: q.set_state(key, state, error))

    def progress(self, update: FilesProgress) -> None:
        """The engine's report: the queue learns pauses and restarts; the GUI gets a throttled copy."""
        if update.file.state in ("downloading", "paused"):
            self.set_queue_state(update.file.state)
        now = time.perf_counter()
        # Never dropped: a file done (the count of files done moves) or a pause.
        if now - self.last_emit < PROGRESS_INTERVAL_S and update.file.state not in ("done", "paused"):
            return
        self.last_emit = now
        call_on_gui_thread(functools.partial(self.on_progress, self.transfer, update))

    def work(self) -> FilesOutcome:
        """Downloads every file of the run (the download thread's job)."""
        # lazy: start-up (+59 ms)
        from engine.hub.model_download import download_files

        transfer = self.transfer
        self.set_queue_state("downloading")
        try:
            outcome = download_files(
                transfer.files,
                cancel=transfer.cancel,
                pause=transfer.pause,
                progress=self.progress,
                skip_complete=self.skip_complete,
            )
        except Cancelled:
            self.set_queue_state("paused")
            raise
        except Exception as exc:
            self.set_queue_state("failed", describe_error(exc))
            raise
        key = transfer.queue_key
        if outcome.complete:
            if key is not None:  # every file complete and verified: nothing left to remember
                self.queue_call(lambda q: q.remove(key))
        else:
            self.set_queue_state("paused")
        return outcome


class QueueIO:
    """The download queue, read from its file on first use and changed in order on
    ``glassbox-download-queue`` (never on the GUI thread).

    Args:
        queue_file: the queue's JSON file.
        on_error: called on the GUI thread with an error of a queue change.
    """

    def __init__(self, queue_file: Path, on_error: Callable[[BaseException], None]) -> None:
        self.queue_file = queue_file
        self.on_error = on_error
        self._executor = SerialExecutor("glassbox-download-queue")
        self._lock = threading.Lock()
        self._queue: DownloadQueue | None = None

    @property
    def closed(self) -> bool:
        return self._executor.closed

    def queue(self) -> DownloadQueue:
        """The queue (its file is read on first use: call it off the GUI thread)."""
        # lazy: start-up (+38 ms)
        from engine.hub.queue import DownloadQueue

        with self._lock:
            if self._queue is None:
                self._queue = DownloadQueue(self.queue_file)
            return self._queue

    def call(self, change: Callable[[DownloadQueue], object]) -> None:
        """Runs ``change`` on the queue, in order with every other change, off the GUI thread.

        A change for an item that is gone (discarded, or dropped as complete) is ignored. Once
        shut down (a download thread answering its cancel late), it runs in the caller's thread.
        """

        def work() -> None:
            try:
                change(self.queue())
            except KeyError:
                pass  # set_state on an item removed meanwhile

        if self.closed:
            try:
                work()
            except OSError:
                pass  # quitting: the next start finds the item as it was last written
            return
        self._executor.submit(work, None, self.on_error)

    def submit(
        self, work: Callable[[], None], done: Callable[[None], None], failed: Callable[[BaseException], None]
    ) -> Future[None]:
        """Runs ``work`` in order with the queue's changes; ``done`` or ``failed`` on the GUI thread."""
        return self._executor.submit(work, done, failed)

    def shutdown(self) -> None:
        """Lets the last writes land (they are small), then stops the thread."""
        self._executor.shutdown(wait=True)


def look_for_unfinished(
    models_dir: Path, library: ModelLibrary, queue: DownloadQueue
) -> tuple[list[QueuedOnDisk], list[PartialDownload], int]:
    """What an earlier session left unfinished (background pool).

    Returns:
        The queue items not complete on disk; the partials no item claims, in ``models_dir``
        (orphans too) and the folders ``library`` indexes, oldest first; and how many items
        were complete (killed right after their last file) and so dropped, their provenance
        recorded.
    """
    # lazy: start-up (+96 ms)
    from engine.convert.quantize import sweep_work_files
    from engine.hub.queue import check_on_disk, find_partials

    sweep_work_files(models_dir)  # what a killed quantize or convert left behind
    found = {p.path: p for p in find_partials(models_dir, orphans=True)}
    for folder in library.extra_dirs:
        for partial in find_partials(folder):
            found.setdefault(partial.path, partial)
    queued, dropped = [], 0
    for item in queue.items():
        status = check_on_disk(item)
        for path in item.paths:
            found.pop(path, None)
        if not status.complete:
            queued.append(status)
            continue
        try:
            removed = queue.remove(item.key)
        except OSError:
            continue  # the queue cannot be written now; the next start drops it
        if removed:
            dropped += 1
            records = [
                (path, item.revision, spec.expected_sha256) for path, spec in zip(item.paths, item.files, strict=True)
            ]
            try:
                record_provenance(library, item.repo, records)
            except OSError:
                pass  # provenance is a nicety; the files are fine
    return queued, sorted(found.values(), key=lambda p: p.updated_at or 0.0), dropped
