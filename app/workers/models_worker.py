"""The models adapter: library scans, fit verdicts, downloads, quantization and quality checks.

Every call into the engine runs off the GUI thread: scans and Hub queries on the shared
background pool, downloads one at a time on ``glassbox-download`` (each with its own cancel and
pause events), quantization on ``glassbox-quantize`` (the engine runs the native part in a child
process, so Cancel really stops it; the jobs themselves are in :mod:`app.workers.model_jobs`).
Progress is throttled before it reaches the GUI. Hub failures come back as ``search_failed`` and
``files_failed``, so Discover shows them where the search was made.

Every requested download is remembered in an ``engine.download_queue.DownloadQueue`` (one item
per model choice, all its files) until all its files are complete or the user discards it, so a
restart brings back a split model whole, parts not yet started included. The queue file is read
and written in order on ``glassbox-download-queue``.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal

from app.tasks import SerialExecutor, call_on_gui_thread, describe_error, run_in_background
from app.workers.model_jobs import ModelJobs

if TYPE_CHECKING:
    from engine.download_queue import DownloadQueue
    from engine.model_download import FileJob

PROGRESS_INTERVAL_S = 0.2
CHECKPOINT_WAIT_S = 3.0
QUEUE_FILE_NAME = "download_queue.json"


@dataclass
class Transfer:
    """One download (or quantization): its events, its files and last progress.

    A download is ``running`` from the moment it is queued until its job ends. A stopped one
    (cancelled, failed, or found on disk after a restart, state ``paused``) keeps its partial
    files: ``files`` resume it, ``paths`` are the final paths whose partials Discard deletes.
    ``files`` is empty for a partial that cannot be resumed (``message`` says why).
    """

    key: str
    label: str
    kind: str  # "download" | "quantize" | "quality"
    cancel: threading.Event = field(default_factory=threading.Event)
    pause: threading.Event = field(default_factory=threading.Event)
    state: str = "queued"
    done: int = 0
    total: int = 0
    speed_bps: float = 0.0
    eta_s: float | None = None
    message: str = ""
    result: Any = None
    repo: str = ""
    files: list[FileJob] = field(default_factory=list)
    paths: list[Path] = field(default_factory=list)
    running: bool = False
    restored: bool = False  # found on disk at startup rather than started in this session
    queue_key: str | None = None  # its item in the download queue, if it has one
    files_done: int = 0  # files complete (of ``paths``)

    @property
    def resumable(self) -> bool:
        return bool(self.files) and not self.running and self.state != "done"


class ModelsAdapter(QObject, ModelJobs):
    """Fronts the model library, the Hub, downloads and quantization.

    Args:
        models_dir: the owned models folder.
        manifest: the library manifest file.
        folders_file: where added folders are kept.
        endpoint: the Hub endpoint (None: ``$HF_ENDPOINT`` or huggingface.co).
        queue_file: the download queue (``Paths.download_queue``); default: ``download_queue.json``
            beside ``folders_file``.

    Signals:
        library_changed(object): list of ``engine.library.LibraryEntry``.
        hardware_ready(object): ``engine.hardware.HardwareInfo``.
        search_finished(str, object): the query and its ``RepoSummary`` list.
        search_failed(str, str): the query and why it failed (offline, an HTTP error), one line.
        files_listed(str, object): a repo and its ``RepoFiles``.
        files_failed(str, str): a repo and why its files could not be listed, one line.
        other_folders_found(object): :class:`~app.model_folders.OtherAppFolder` list, the model
            folders of other apps that exist here and are neither in the library nor declined.
        transfer_changed(object): a :class:`Transfer` (progress, state).
        transfer_removed(object): a stopped :class:`Transfer` whose partial files were discarded.
        unfinished_found(int): how many unfinished downloads from an earlier session were found.
        error_occurred(str): a one-line message.
    """

    library_changed = Signal(object)
    hardware_ready = Signal(object)
    search_finished = Signal(str, object)
    search_failed = Signal(str, str)
    files_listed = Signal(str, object)
    files_failed = Signal(str, str)
    other_folders_found = Signal(object)
    transfer_changed = Signal(object)
    transfer_removed = Signal(object)
    unfinished_found = Signal(int)
    error_occurred = Signal(str)

    def __init__(
        self,
        models_dir: Path,
        manifest: Path,
        folders_file: Path,
        endpoint: str | None = None,
        parent: QObject | None = None,
        *,
        queue_file: Path | None = None,
    ) -> None:
        super().__init__(parent)
        self.models_dir = models_dir
        self.manifest = manifest
        self.folders_file = folders_file
        self.endpoint = endpoint
        self.queue_file = queue_file if queue_file is not None else folders_file.with_name(QUEUE_FILE_NAME)
        self.hardware: Any = None
        self.bandwidth_gbps: float | None = None
        self.entries: list[Any] = []
        self.transfers: dict[str, Transfer] = {}
        self._downloads = SerialExecutor("glassbox-download")
        self._quantize = SerialExecutor("glassbox-quantize")
        self._queue_io = SerialExecutor("glassbox-download-queue")
        self._queue_lock = threading.Lock()
        self._download_queue: DownloadQueue | None = None
        self._running_downloads: list[Future[Any]] = []
        self._library_lock = threading.Lock()
        self._library: Any = None
        self._library_where: tuple[Path, Path, Path] | None = None
        self._closed = False

    def library(self) -> Any:
        """The library (pure to build; call it off the GUI thread to use it).

        One instance while the folders stay the same: its lock keeps a scan from writing back a
        manifest read before a concurrent ``record_provenance`` (both run on the background pool).
        """
        from engine.library import ModelLibrary

        where = (self.models_dir, self.manifest, self.folders_file)
        with self._library_lock:
            if self._library is None or self._library_where != where:
                self._library = ModelLibrary(self.models_dir, manifest_path=self.manifest,
                                             folders_file=self.folders_file)
                self._library_where = where
            return self._library

    def _fail(self, prefix: str) -> Callable[[BaseException], None]:
        return lambda exc: self.error_occurred.emit(f"{prefix}: {describe_error(exc)}")

    # ------------------------------------------------------------------ library
    def scan(self) -> None:
        """Rescans the library (library_changed)."""

        def done(entries: list[Any]) -> None:
            self.entries = entries
            self.library_changed.emit(entries)

        run_in_background(lambda: self.library().scan(), done, self._fail("Model library"))

    def probe(self) -> None:
        """Probes the hardware once (for fit badges)."""

        def work() -> Any:
            from engine.hardware import probe_hardware

            return probe_hardware()

        def done(hw: Any) -> None:
            self.hardware = hw
            self.hardware_ready.emit(hw)

        run_in_background(work, done, self._fail("Hardware probe"))

    def fit(self, entry: Any, n_ctx: int) -> Any:
        """The fit estimate for a library entry (None when unknown). Cheap: pure arithmetic."""
        if self.hardware is None or entry.info is None:
            return None
        from engine.fit import estimate_fit

        try:
            return estimate_fit(
                entry.info,
                self.hardware,
                min(n_ctx, entry.context_length or n_ctx),
                bandwidth_gbps=self.bandwidth_gbps,
            )
        except (ValueError, ArithmeticError):
            return None

    def fit_for_size(self, size: int) -> Any:
        """A rough fit verdict for a file not downloaded yet."""
        if self.hardware is None or size <= 0:
            return None
        from engine.fit import estimate_fit_from_size

        return estimate_fit_from_size(size, self.hardware, self.bandwidth_gbps)

    def fit_for_info(self, info: Any, n_ctx: int) -> Any:
        """The fit estimate for a header (say, of a file a quantization will write); None when unknown."""
        if self.hardware is None or info is None:
            return None
        from engine.fit import estimate_fit

        try:
            return estimate_fit(info, self.hardware, min(n_ctx, info.context_length or n_ctx),
                                bandwidth_gbps=self.bandwidth_gbps)
        except (ValueError, ArithmeticError):
            return None

    def find_other_apps(self) -> None:
        """Looks for the Hugging Face cache and LM Studio's models folder (other_folders_found)."""

        def work() -> list[Any]:
            from app.model_folders import offered_folders

            return offered_folders(self.library().extra_dirs, self.declined_file)

        run_in_background(work, self.other_folders_found.emit, self._fail("Model folders of other apps"))

    def decline_folders(self, folders: list[Path]) -> None:
        """Remembers that the user does not want these folders offered again."""

        def work() -> None:
            from app.model_folders import decline

            decline(self.declined_file, folders)

        run_in_background(work, None, self._fail("Model folders"))

    @property
    def declined_file(self) -> Path:
        """Other apps' model folders the user said no to (beside the folder list)."""
        return self.folders_file.with_name("model_folders_declined.json")

    def add_folder(self, folder: Path) -> None:
        self.add_folders([folder])

    def add_folders(self, folders: list[Path]) -> None:
        """Indexes ``folders`` in place, one after the other in one job (each write of the folder
        list reads the previous one), then rescans."""

        def work() -> None:
            library = self.library()
            for folder in folders:
                library.add_folder(folder)

        run_in_background(work, lambda _r: self.scan(), self._fail("Add folder"))

    def delete(self, path: Path) -> None:
        """Deletes a model file the library owns (the caller asked for confirmation)."""
        run_in_background(lambda: self.library().remove(path), lambda _r: self.scan(), self._fail("Delete"))

    # ------------------------------------------------------------------ Hub
    def search(self, query: str) -> None:
        def work() -> Any:
            from engine.hub import search_models

            return search_models(query, limit=30, endpoint=self.endpoint)

        run_in_background(work, lambda hits: self.search_finished.emit(query, hits),
                          lambda exc: self.search_failed.emit(query, describe_error(exc)))

    def list_files(self, repo: str) -> None:
        def work() -> Any:
            from engine.hub import list_repo_files

            return list_repo_files(repo, endpoint=self.endpoint)

        run_in_background(work, lambda files: self.files_listed.emit(repo, files),
                          lambda exc: self.files_failed.emit(repo, describe_error(exc)))

    # ------------------------------------------------------------------ downloads
    def download(self, repo: str, choice: Any, commit: str | None = None) -> Transfer:
        """Queues every file of a model choice (split parts and mmproj included)."""
        key = f"{repo}/{choice.name}"
        existing = self.transfers.get(key)
        if existing is not None and existing.running:
            return existing
        from engine.model_download import FileJob, model_folder

        dest = model_folder(self.models_dir, repo, [f.filename for f in (*choice.files, *choice.mmproj)])
        files = [
            FileJob(repo, f.filename, dest, commit or "main", self.endpoint, f.sha256, f.size or None)
            for f in (*choice.files, *choice.mmproj)
        ]
        from engine.download_queue import QueueFile, make_item

        item = make_item(repo, choice.name, dest, [QueueFile(f.filename, f.expected_sha256, f.expected_size)
                                                   for f in files], revision=commit or "main", endpoint=self.endpoint)
        transfer = Transfer(key=key, label=download_label(choice.name, repo, [f.filename for f in files]),
                            kind="download", repo=repo, files=files, paths=[f.path for f in files],
                            queue_key=item.key)
        transfer.total = sum(f.size for f in (*choice.files, *choice.mmproj))
        for other in list(self.transfers.values()):
            # A stopped row for the same files (say, one found at startup): this download takes
            # over its partials, so its queue item goes, and so does the row (or it is reused).
            if other.kind != "download" or other.running:
                continue
            if other.key == key or set(other.paths) & set(transfer.paths):
                if other.queue_key is not None and other.queue_key != item.key:
                    self._queue_call(functools.partial(_forget, key=other.queue_key))
                if other.key != key:
                    del self.transfers[other.key]
                    self.transfer_removed.emit(other)
        self.transfers[key] = transfer
        self._queue_call(lambda q: q.put(item))  # before the download starts: the queue file comes first
        self._submit(transfer)
        return transfer

    def resume(self, transfer: Transfer) -> None:
        """Starts a stopped download again: files already complete are skipped, the others resume
        from their partials (or start), in order."""
        if not transfer.resumable or self._closed:
            return
        # Fresh events: the previous job's are set, and a late callback must not stop this one.
        transfer.cancel = threading.Event()
        transfer.pause = threading.Event()
        transfer.message = ""
        self._submit(transfer, skip_complete=True)

    def discard(self, transfer: Transfer) -> None:
        """Deletes a stopped download's partial files and metadata, and forgets its queue item
        (the caller asked to confirm). Files already complete stay.

        Signals ``transfer_removed`` once the files are gone (on the queue thread, after any
        queue write of its last run).
        """
        if transfer.running:
            return
        busy = {path for t in self.transfers.values() if t.running for path in t.paths}
        paths = [path for path in transfer.paths if path not in busy]
        queue_key = transfer.queue_key

        def work() -> None:
            from engine.downloads import discard_partial

            for path in paths:
                discard_partial(path.parent, path.name)
            if queue_key is not None:
                self._queue().remove(queue_key)

        def done(_result: None) -> None:
            self.transfers.pop(transfer.key, None)
            transfer.state = "discarded"
            self.transfer_removed.emit(transfer)

        if self._queue_io.closed:
            return
        self._queue_io.submit(work, done, self._fail(f"Discard {transfer.label}"))

    # ------------------------------------------------------------------ the download queue
    def _queue(self) -> DownloadQueue:
        """The download queue, read from its file on first use (never on the GUI thread)."""
        from engine.download_queue import DownloadQueue

        with self._queue_lock:
            if self._download_queue is None:
                self._download_queue = DownloadQueue(self.queue_file)
            return self._download_queue

    def _queue_call(self, change: Callable[[DownloadQueue], object]) -> None:
        """Runs ``change`` on the queue, in order with every other change, off the GUI thread.

        A change for an item that is gone (discarded, or dropped as complete) is ignored. Once
        the adapter has shut down (a download thread answering its cancel late), it runs here.
        """

        def work() -> None:
            try:
                change(self._queue())
            except KeyError:
                pass  # set_state on an item removed meanwhile

        if self._queue_io.closed:
            try:
                work()
            except OSError:
                pass  # quitting: the next start finds the item as it was last written
            return
        self._queue_io.submit(work, None, self._fail("Download queue"))

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

        def work() -> tuple[list[Any], list[Any], int]:
            from engine.download_queue import check_on_disk, find_partials
            from engine.quantize import sweep_work_files

            sweep_work_files(self.models_dir)  # what a killed quantize or convert left behind
            found = {p.path: p for p in find_partials(self.models_dir, orphans=True)}
            for folder in self.library().extra_dirs:
                for partial in find_partials(folder):
                    found.setdefault(partial.path, partial)
            queue = self._queue()
            queued = []
            dropped = 0
            for item in queue.items():
                status = check_on_disk(item)
                for path in item.paths:
                    found.pop(path, None)
                if status.complete:  # killed after its last file was renamed into place: done
                    try:
                        removed = queue.remove(item.key)
                    except OSError:
                        continue  # the queue cannot be written now; the next start drops it
                    if removed:
                        dropped += 1
                        with contextlib.suppress(OSError):  # provenance is a nicety; the files are fine
                            _record(self.library(), item.repo, [
                                (path, item.revision, spec.expected_sha256)
                                for path, spec in zip(item.paths, item.files, strict=True)])
                else:
                    queued.append(status)
            return queued, sorted(found.values(), key=lambda p: p.updated_at or 0.0), dropped

        run_in_background(work, self._on_unfinished_found, self._fail("Unfinished downloads"))

    def _on_unfinished_found(self, found: tuple[list[Any], list[Any], int]) -> None:
        from engine.model_download import FileJob

        if self._closed:
            return
        queued, partials, dropped = found
        if dropped:
            self.scan()  # their provenance is recorded now
        known = {path for t in self.transfers.values() for path in t.paths}
        added = 0
        for status in queued:
            item = status.item
            if known & set(item.paths):
                continue  # a download of this session owns it
            dest = Path(item.dest_dir)
            transfer = Transfer(
                key=f"{item.repo}/{item.name}",
                label=download_label(item.name, item.repo, [f.filename for f in item.files]),
                kind="download",
                state="error" if item.state == "failed" else "paused",
                done=status.done,
                total=status.total or sum(f.total or 0 for f in status.files),
                message=item.error or "",
                repo=item.repo,
                files=[FileJob(item.repo, f.filename, dest, item.revision, item.endpoint or self.endpoint,
                               f.expected_sha256, f.expected_size) for f in item.files],
                paths=item.paths,
                restored=True,
                queue_key=item.key,
                files_done=status.files_done,
            )
            self.transfers[transfer.key] = transfer
            known.update(transfer.paths)
            self.transfer_changed.emit(transfer)
            added += 1
        for partial in partials:
            if partial.path in known:
                continue  # a download of this session owns it
            transfer = Transfer(
                key=f"partial:{partial.path}",
                label=f"{partial.path.name} ({partial.repo})" if partial.resumable else partial.path.name,
                kind="download",
                state="paused" if partial.resumable else "unreadable",
                done=partial.done,
                total=partial.total or partial.expected_size or 0,
                message=partial.error or "",
                repo=partial.repo,
                paths=[partial.path],
                restored=True,
            )
            if partial.resumable:
                transfer.files = [FileJob(
                    partial.repo, partial.filename, partial.dest_dir, partial.revision,
                    partial.endpoint or self.endpoint, partial.expected_sha256, partial.expected_size,
                )]
            self.transfers[transfer.key] = transfer
            self.transfer_changed.emit(transfer)
            added += 1
        if added:
            self.unfinished_found.emit(added)

    def _submit(self, transfer: Transfer, skip_complete: bool = False) -> None:
        """Queues ``transfer``'s files on the download thread, one after the other.

        Args:
            transfer: the download.
            skip_complete: a resume: files already complete on disk are not fetched again (a
                fresh download lets the engine verify them instead).
        """
        transfer.running = True
        transfer.state = "queued"
        self.transfer_changed.emit(transfer)
        files = list(transfer.files)
        cancel, pause = transfer.cancel, transfer.pause
        queue_key = transfer.queue_key
        last = [0.0]
        queue_state = [""]

        def set_queue_state(state: Any, error: str | None = None) -> None:
            if queue_key is not None and queue_state[0] != state:
                queue_state[0] = state
                self._queue_call(lambda q: q.set_state(queue_key, state, error))

        def progress(update: Any) -> None:
            if update.file.state in ("downloading", "paused"):
                set_queue_state(update.file.state)
            now = time.perf_counter()
            if now - last[0] < PROGRESS_INTERVAL_S and update.file.state not in ("done", "paused"):
                return
            last[0] = now
            transfer.done = update.done
            if update.count == 1 and update.total:
                transfer.total = update.total
            transfer.speed_bps = update.file.speed_bps
            transfer.eta_s = update.file.eta_s
            transfer.state = update.state
            transfer.files_done = update.files_done
            transfer.message = update.file.message
            call_on_gui_thread(lambda: self.transfer_changed.emit(transfer))

        def work() -> tuple[list[Any], list[FileJob]]:
            from engine.errors import Cancelled
            from engine.model_download import download_files

            transfer.files_done = 0
            set_queue_state("downloading")
            try:
                outcome = download_files(files, cancel=cancel, pause=pause, progress=progress,
                                         skip_complete=skip_complete)
            except Cancelled:
                set_queue_state("paused")
                raise
            except Exception as exc:
                set_queue_state("failed", describe_error(exc))
                raise
            if outcome.complete:
                if queue_key is not None:  # every file complete and verified: nothing left to remember
                    self._queue_call(lambda q: q.remove(queue_key))
            else:
                set_queue_state("paused")
            return list(outcome.downloaded), list(outcome.skipped)

        def done(outcome: tuple[list[Any], list[FileJob]]) -> None:
            results, skipped = outcome
            transfer.running = False
            transfer.state = "cancelled" if len(results) + len(skipped) < len(files) else "done"
            transfer.done = transfer.total if transfer.state == "done" else transfer.done
            transfer.speed_bps, transfer.eta_s = 0.0, None
            transfer.message = "" if transfer.state == "done" else "the partial download is kept"
            transfer.result = results
            self.transfer_changed.emit(transfer)
            records = [(r.path, r.revision, r.sha256) for r in results]
            records += [(job.path, job.revision, job.expected_sha256) for job in skipped]
            if records:
                run_in_background(lambda: _record(self.library(), transfer.repo, records), lambda _r: self.scan())

        def failed(exc: BaseException) -> None:
            from engine.errors import Cancelled

            transfer.running = False
            cancelled = isinstance(exc, Cancelled)
            transfer.state = "cancelled" if cancelled else "error"
            transfer.speed_bps, transfer.eta_s = 0.0, None
            transfer.message = "the partial download is kept" if cancelled else describe_error(exc)
            self.transfer_changed.emit(transfer)

        self._running_downloads = [f for f in self._running_downloads if not f.done()]
        self._running_downloads.append(self._downloads.submit(work, done, failed))

    def shutdown(self, wait: bool = True) -> None:
        """Cancels downloads and quantizations; downloads keep their resumable partial files.

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
            futures.wait([f for f in self._running_downloads if not f.done()], timeout=CHECKPOINT_WAIT_S)
        self._running_downloads.clear()
        # The queue's last writes (a download answering its cancel marks its item paused) are
        # small: let them land, so the next session finds the queue as this one left it.
        self._queue_io.shutdown(wait=True)
        self._quantize.shutdown(wait=wait)


def download_label(name: str, repo: str, filenames: list[str]) -> str:
    """A download row's name: ``model-Q4_K_M.gguf (3 parts + mmproj, owner/repo)``."""
    mmproj = [f for f in filenames if "mmproj" in f.rsplit("/", 1)[-1].lower()]
    parts = len(filenames) - len(mmproj)
    extras = []
    if parts > 1:
        extras.append(f"{parts} parts")
    if mmproj:
        extras.append("+ mmproj" if extras else "with mmproj")
    detail = " ".join(extras)
    return f"{name} ({detail}, {repo})" if detail else f"{name} ({repo})"


def _forget(queue: DownloadQueue, key: str) -> bool:
    return queue.remove(key)


def _record(library: Any, repo: str, records: list[tuple[Path, str, str | None]]) -> None:
    """Records where downloaded files came from: ``(path, revision, sha256)`` each."""
    for path, revision, sha256 in records:
        fields = {"repo": repo, "revision": revision}
        if sha256:  # unknown for a skipped file without a listed hash: keep what was recorded
            fields["sha256"] = sha256
        library.record_provenance(path, **fields)
