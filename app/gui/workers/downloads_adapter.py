"""The downloads adapter: Hugging Face search, and downloads that survive a restart.

Contract: ARCHITECTURE.md, 'app.gui.workers.downloads_adapter'.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Signal

from app.gui.tasks import SerialExecutor, describe_error, run_in_background
from app.gui.workers.download_snapshots import after_failure, after_outcome, after_progress, new_download, provenance
from app.gui.workers.download_work import DownloadRun, QueueIO, look_for_unfinished
from app.gui.workers.transfers import Transfer, from_partial, from_queue

if TYPE_CHECKING:
    from app.gui.workers.library_adapter import LibraryAdapter
    from engine.hub.adapters import AdapterHit, AdapterRepo
    from engine.hub.model_download import FilesOutcome, FilesProgress
    from engine.hub.queue import DownloadQueue, PartialDownload, QueuedOnDisk
    from engine.hub.search import ModelChoice, RepoFiles, RepoSummary

CHECKPOINT_WAIT_S = 3.0


class DownloadsAdapter(QObject):
    """Fronts the Hub and the downloads.

    Args:
        library: the library adapter (where files go, provenance, rescans).
        queue_file: the download queue (``Paths.download_queue``).
        endpoint: the Hub endpoint (None: ``$HF_ENDPOINT`` or huggingface.co).

    Signals:
        search_finished(str, object): the query and its ``RepoSummary`` list.
        search_failed(str, str): the query and why it failed (offline, an HTTP error), one line.
        files_listed(str, object): a repo and its ``RepoFiles``.
        files_failed(str, str): a repo and why its files could not be listed, one line.
        adapters_found(str, object): the query and its ``AdapterHit`` list (a LoRA adapter search).
        adapter_files_listed(str, object): an adapter repo and its ``AdapterRepo`` (each GGUF
            file's header read by range request, matched against the library's chat models).
        transfer_changed(object): the new :class:`Transfer` snapshot of a download.
        transfer_removed(object): a stopped :class:`Transfer` whose partial files were discarded.
        unfinished_found(int): how many unfinished downloads from an earlier session were found.
        error_occurred(str): a one-line message.
    """

    search_finished = Signal(str, object)
    search_failed = Signal(str, str)
    files_listed = Signal(str, object)
    files_failed = Signal(str, str)
    adapters_found = Signal(str, object)
    adapter_files_listed = Signal(str, object)
    transfer_changed = Signal(object)
    transfer_removed = Signal(object)
    unfinished_found = Signal(int)
    error_occurred = Signal(str)

    def __init__(
        self, library: LibraryAdapter, queue_file: Path, endpoint: str | None = None, parent: QObject | None = None
    ) -> None:
        super().__init__(parent)
        self.library = library
        self.endpoint = endpoint
        self.transfers: dict[str, Transfer] = {}  # the latest snapshot of each, GUI thread only
        self._downloads = SerialExecutor("glassbox-download")
        self._queue_io = QueueIO(queue_file, self._fail("Download queue"))
        self.queue_file = queue_file
        self._running: list[Future[FilesOutcome]] = []
        self._adapter_bases: dict[str, str] = {}  # a download's key -> the base its adapter repo's tags name
        self._closed = False

    def _fail(self, prefix: str) -> Callable[[BaseException], None]:
        return lambda exc: self.error_occurred.emit(f"{prefix}: {describe_error(exc)}")

    def _put(self, transfer: Transfer) -> Transfer:
        """Stores ``transfer`` as the latest snapshot of its key and emits it."""
        self.transfers[transfer.key] = transfer
        self.transfer_changed.emit(transfer)
        return transfer

    # ------------------------------------------------------------------ Hub
    def search(self, query: str) -> None:
        def work() -> list[RepoSummary]:
            # lazy: start-up (+36 ms)
            from engine.hub.search import search_models

            return search_models(query, limit=30, endpoint=self.endpoint)

        run_in_background(
            work,
            lambda hits: self.search_finished.emit(query, hits),
            lambda exc: self.search_failed.emit(query, describe_error(exc)),
        )

    def list_files(self, repo: str) -> None:
        def work() -> RepoFiles:
            # lazy: start-up (+28 ms)
            from engine.hub.search import list_repo_files

            return list_repo_files(repo, endpoint=self.endpoint)

        run_in_background(
            work,
            lambda files: self.files_listed.emit(repo, files),
            lambda exc: self.files_failed.emit(repo, describe_error(exc)),
        )

    def search_adapters(self, query: str) -> None:
        """Searches GGUF LoRA adapters (``adapters_found``, or ``search_failed``)."""

        def work() -> list[AdapterHit]:
            # lazy: start-up (+36 ms, as the model search)
            from engine.hub.adapters import search_adapters

            return search_adapters(query, limit=30, endpoint=self.endpoint)

        run_in_background(
            work,
            lambda hits: self.adapters_found.emit(query, hits),
            lambda exc: self.search_failed.emit(query, describe_error(exc)),
        )

    def list_adapter_files(self, repo: str) -> None:
        """Lists an adapter repo's files with their headers, matched against the library's chat
        models (``adapter_files_listed``, or ``files_failed``)."""
        models = [e.path for e in self.library.entries if e.kind == "chat" and e.available and not e.error]

        def work() -> AdapterRepo:
            # lazy: start-up (+36 ms, as the model search)
            from engine.hub.adapters import inspect_adapter_repo

            return inspect_adapter_repo(repo, models, endpoint=self.endpoint)

        run_in_background(
            work,
            lambda found: self.adapter_files_listed.emit(repo, found),
            lambda exc: self.files_failed.emit(repo, describe_error(exc)),
        )

    # ------------------------------------------------------------------ downloads
    def download(
        self, repo: str, choice: ModelChoice, commit: str | None = None, *, base_model: str | None = None
    ) -> Transfer:
        """Queues every file of a model choice (split parts and mmproj included) into
        ``<models>/<owner>/<repo>/`` (``engine.hub.model_download.model_folder``). ``base_model``:
        for a LoRA adapter whose header names no base, the base its repository's tags name,
        recorded in the library once it is downloaded (in this session)."""
        existing = self.transfers.get(f"{repo}/{choice.name}")
        if existing is not None and existing.running:
            return existing
        if base_model:
            self._adapter_bases[f"{repo}/{choice.name}"] = base_model
        transfer, item = new_download(repo, choice, commit, self.library.models_dir, self.endpoint)
        self._take_over(transfer)
        self.transfers[transfer.key] = transfer
        self._queue_call(lambda q: q.put(item))  # before the download starts: the queue file comes first
        return self._submit(transfer)

    def _take_over(self, transfer: Transfer) -> None:
        """A stopped row for the same files (say, one found at startup): ``transfer`` takes over
        its partials, so its queue item goes, and so does the row (or it is reused)."""
        for other in list(self.transfers.values()):
            if other.kind != "download" or other.running:
                continue
            if other.key == transfer.key or set(other.paths) & set(transfer.paths):
                if other.queue_key is not None and other.queue_key != transfer.queue_key:
                    self._queue_call(functools.partial(_forget, key=other.queue_key))
                if other.key != transfer.key:
                    del self.transfers[other.key]
                    self.transfer_removed.emit(other)

    def resume(self, transfer: Transfer) -> None:
        """Starts a stopped download again: files already complete are skipped, the others resume
        from their partials (or start), in order."""
        current = self.transfers.get(transfer.key, transfer)
        if not current.resumable or self._closed:
            return
        # Fresh events: the previous run's are set, and a late callback must not stop this one.
        self._submit(
            dataclasses.replace(current, cancel=threading.Event(), pause=threading.Event(), message=""),
            skip_complete=True,
        )

    def _submit(self, transfer: Transfer, skip_complete: bool = False) -> Transfer:
        """Queues ``transfer``'s files on the download thread; returns its first running snapshot."""
        transfer = self._put(dataclasses.replace(transfer, running=True, state="queued"))
        run = DownloadRun(transfer, skip_complete, self._queue_call, self._on_run_progress)
        self._running = [f for f in self._running if not f.done()]
        self._running.append(
            self._downloads.submit(
                run.work,
                functools.partial(self._on_run_done, transfer),
                functools.partial(self._on_run_failed, transfer),
            )
        )
        return transfer

    def _current(self, run: Transfer) -> Transfer | None:
        """The latest snapshot of ``run``, or None once another run (or nothing) holds its key."""
        current = self.transfers.get(run.key)
        return current if current is not None and current.same_run(run) else None

    def _on_run_progress(self, run: Transfer, update: FilesProgress) -> None:
        """GUI thread: one throttled ``FilesProgress`` of ``run``."""
        current = self._current(run)
        if current is None or not current.running:
            return
        self._put(after_progress(current, update))

    def _on_run_done(self, run: Transfer, outcome: FilesOutcome) -> None:
        current = self._current(run) or run
        self._put(after_outcome(current, outcome))
        records = provenance(outcome)
        base_model = self._adapter_bases.pop(current.key, None) if outcome.complete else None
        if records:
            self.library.record(current.repo, records, base_model=base_model)

    def _on_run_failed(self, run: Transfer, exc: BaseException) -> None:
        self._put(after_failure(self._current(run) or run, exc))

    def discard(self, transfer: Transfer) -> None:
        """Deletes a stopped download's partial files and metadata, and forgets its queue item
        (the caller asked to confirm). Files already complete stay.

        Signals ``transfer_removed`` once the files are gone (on the queue thread, after any
        queue write of its last run).
        """
        current = self.transfers.get(transfer.key, transfer)
        if current.running or self._queue_io.closed:
            return
        busy = {path for t in self.transfers.values() if t.running for path in t.paths}
        paths = [path for path in current.paths if path not in busy]
        queue_key = current.queue_key

        def work() -> None:
            # lazy: start-up (+4 ms)
            from engine.hub.partials import discard_partial

            for path in paths:
                discard_partial(path.parent, path.name)
            if queue_key is not None:
                self._queue_io.queue().remove(queue_key)

        def done(_result: None) -> None:
            self.transfers.pop(current.key, None)
            self.transfer_removed.emit(dataclasses.replace(current, state="discarded"))

        self._queue_io.submit(work, done, self._fail(f"Discard {current.label}"))

    def _queue_call(self, change: Callable[[DownloadQueue], object]) -> None:
        self._queue_io.call(change)

    def find_unfinished(self) -> None:
        """Looks for downloads a previous session left unfinished (off the GUI thread).

        First the download queue: each item becomes one stopped transfer for all its files (a
        split model is one row, its parts not yet started included), ``paused`` or, when its
        last run failed, ``error``; an item whose files are all complete (the app was killed
        right after the last one) is dropped. Then the partials no item claims, in the models
        folder and the folders the library indexes (``glassbox models download --to`` may have
        put partials there): each becomes a transfer in state ``paused``, or ``unreadable`` when
        its metadata is gone (then it can only be discarded). Emits ``transfer_changed`` for
        each new one, then ``unfinished_found``.
        """
        run_in_background(self._look_for_unfinished, self._on_unfinished_found, self._fail("Unfinished downloads"))

    def _look_for_unfinished(self) -> tuple[list[QueuedOnDisk], list[PartialDownload], int]:
        return look_for_unfinished(self.library.models_dir, self.library.model_library(), self._queue_io.queue())

    def _on_unfinished_found(self, found: tuple[list[QueuedOnDisk], list[PartialDownload], int]) -> None:
        if self._closed:
            return
        queued, partials, dropped = found
        if dropped:
            self.library.scan()  # their provenance is recorded now
        known = {path for t in self.transfers.values() for path in t.paths}
        added = 0
        restored = [from_queue(status, self.endpoint) for status in queued]
        restored += [from_partial(partial, self.endpoint) for partial in partials]
        for transfer in restored:
            if known & set(transfer.paths):
                continue  # a download of this session (or a queue item) owns it
            known.update(transfer.paths)
            self._put(transfer)
            added += 1
        if added:
            self.unfinished_found.emit(added)

    def shutdown(self, wait: bool = True) -> None:
        """Cancels downloads; they keep their resumable partial files.

        The engine answers a cancel by writing its resume checkpoint and keeping the partial
        (never deleting it). Even with ``wait=False`` this waits up to ``CHECKPOINT_WAIT_S`` for
        a running download to do so: the app releases its single-instance lock right after, and
        the next session should find the partial complete and unlocked.
        """
        if self._closed:
            return
        self._closed = True
        for transfer in self.transfers.values():
            transfer.pause.clear()
            transfer.cancel.set()
        self._downloads.shutdown(wait=wait)
        if not wait:
            futures.wait([f for f in self._running if not f.done()], timeout=CHECKPOINT_WAIT_S)
        self._running.clear()
        # The queue's last writes (a download answering its cancel marks its item paused) are
        # small: let them land, so the next session finds the queue as this one left it.
        self._queue_io.shutdown()


def _forget(queue: DownloadQueue, key: str) -> bool:
    return queue.remove(key)
