"""The models adapter: library scans, fit verdicts, downloads, quantization and quality checks.

Every call into the engine runs off the GUI thread: scans and Hub queries on the shared
background pool, downloads one at a time on ``glassbox-download`` (each with its own cancel and
pause events), quantization on ``glassbox-quantize`` (the engine runs the native part in a child
process, so Cancel really stops it). Progress is throttled before it reaches the GUI.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.tasks import SerialExecutor, call_on_gui_thread, describe_error, run_in_background

PROGRESS_INTERVAL_S = 0.2
CHECKPOINT_WAIT_S = 3.0


@dataclass(frozen=True)
class FileJob:
    """One file of a download: what ``engine.downloads.download_file`` needs to start or resume it."""

    repo: str
    filename: str
    dest_dir: Path
    revision: str
    endpoint: str | None = None
    expected_sha256: str | None = None
    expected_size: int | None = None

    @property
    def path(self) -> Path:
        return self.dest_dir / self.filename


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

    @property
    def resumable(self) -> bool:
        return bool(self.files) and not self.running and self.state != "done"


class ModelsAdapter(QObject):
    """Fronts the model library, the Hub, downloads and quantization.

    Args:
        models_dir: the owned models folder.
        manifest: the library manifest file.
        folders_file: where added folders are kept.
        endpoint: the Hub endpoint (None: ``$HF_ENDPOINT`` or huggingface.co).

    Signals:
        library_changed(object): list of ``engine.library.LibraryEntry``.
        hardware_ready(object): ``engine.hardware.HardwareInfo``.
        search_finished(str, object): the query and its ``RepoSummary`` list.
        files_listed(str, object): a repo and its ``RepoFiles``.
        transfer_changed(object): a :class:`Transfer` (progress, state).
        transfer_removed(object): a stopped :class:`Transfer` whose partial files were discarded.
        unfinished_found(int): how many unfinished downloads from an earlier session were found.
        error_occurred(str): a one-line message.
    """

    library_changed = Signal(object)
    hardware_ready = Signal(object)
    search_finished = Signal(str, object)
    files_listed = Signal(str, object)
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
    ) -> None:
        super().__init__(parent)
        self.models_dir = models_dir
        self.manifest = manifest
        self.folders_file = folders_file
        self.endpoint = endpoint
        self.hardware: Any = None
        self.bandwidth_gbps: float | None = None
        self.entries: list[Any] = []
        self.transfers: dict[str, Transfer] = {}
        self._downloads = SerialExecutor("glassbox-download")
        self._quantize = SerialExecutor("glassbox-quantize")
        self._running_downloads: list[Future[Any]] = []
        self._closed = False

    def library(self) -> Any:
        from engine.library import ModelLibrary

        return ModelLibrary(self.models_dir, manifest_path=self.manifest, folders_file=self.folders_file)

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

    def add_folder(self, folder: Path) -> None:
        run_in_background(lambda: self.library().add_folder(folder), lambda _r: self.scan(), self._fail("Add folder"))

    def delete(self, path: Path) -> None:
        """Deletes a model file the library owns (the caller asked for confirmation)."""
        run_in_background(lambda: self.library().remove(path), lambda _r: self.scan(), self._fail("Delete"))

    # ------------------------------------------------------------------ Hub
    def search(self, query: str) -> None:
        def work() -> Any:
            from engine.hub import search_models

            return search_models(query, limit=30, endpoint=self.endpoint)

        run_in_background(work, lambda hits: self.search_finished.emit(query, hits), self._fail("Search"))

    def list_files(self, repo: str) -> None:
        def work() -> Any:
            from engine.hub import list_repo_files

            return list_repo_files(repo, endpoint=self.endpoint)

        run_in_background(work, lambda files: self.files_listed.emit(repo, files), self._fail(repo))

    # ------------------------------------------------------------------ downloads
    def download(self, repo: str, choice: Any, commit: str | None = None) -> Transfer:
        """Queues every file of a model choice (split parts and mmproj included)."""
        key = f"{repo}/{choice.name}"
        existing = self.transfers.get(key)
        if existing is not None and existing.running:
            return existing
        dest = self.models_dir / repo.replace("/", "__")
        files = [
            FileJob(repo, f.filename, dest, commit or "main", self.endpoint, f.sha256, f.size or None)
            for f in (*choice.files, *choice.mmproj)
        ]
        transfer = Transfer(key=key, label=f"{choice.name} ({repo})", kind="download", repo=repo, files=files,
                            paths=[f.path for f in files])
        transfer.total = sum(f.size for f in (*choice.files, *choice.mmproj))
        for other in list(self.transfers.values()):
            # A stopped row for the same files (say, one found at startup): this download takes
            # over its partials, so the row goes.
            if other.key != key and other.kind == "download" and not other.running \
                    and set(other.paths) & set(transfer.paths):
                del self.transfers[other.key]
                self.transfer_removed.emit(other)
        self.transfers[key] = transfer
        self._submit(transfer)
        return transfer

    def resume(self, transfer: Transfer) -> None:
        """Starts a stopped download again; the engine resumes each file from its partial."""
        if not transfer.resumable or self._closed:
            return
        # Fresh events: the previous job's are set, and a late callback must not stop this one.
        transfer.cancel = threading.Event()
        transfer.pause = threading.Event()
        transfer.message = ""
        self._submit(transfer)

    def discard(self, transfer: Transfer) -> None:
        """Deletes a stopped download's partial files and metadata (the caller asked to confirm).

        Signals ``transfer_removed`` once the files are gone (on the background pool).
        """
        if transfer.running:
            return
        busy = {path for t in self.transfers.values() if t.running for path in t.paths}
        paths = [path for path in transfer.paths if path not in busy]

        def work() -> None:
            from engine.downloads import discard_partial

            for path in paths:
                discard_partial(path.parent, path.name)

        def done(_result: None) -> None:
            self.transfers.pop(transfer.key, None)
            transfer.state = "discarded"
            self.transfer_removed.emit(transfer)

        run_in_background(work, done, self._fail(f"Discard {transfer.label}"))

    def find_unfinished(self) -> None:
        """Looks for downloads a previous session left unfinished (off the GUI thread).

        Searches the models folder and the folders the library indexes (``glassbox models
        download --to`` may have put partials there); each one becomes a stopped transfer in
        state ``paused``, or ``unreadable`` when its metadata is gone (then it can only be
        discarded). Emits ``transfer_changed`` for each new one, then ``unfinished_found``.
        """

        def work() -> list[Any]:
            from engine.download_queue import find_partials
            from engine.quantize import sweep_work_files

            sweep_work_files(self.models_dir)  # what a killed quantize or convert left behind
            found = {p.path: p for p in find_partials(self.models_dir, orphans=True)}
            for folder in self.library().extra_dirs:
                for partial in find_partials(folder):
                    found.setdefault(partial.path, partial)
            return sorted(found.values(), key=lambda p: p.updated_at or 0.0)

        run_in_background(work, self._on_partials_found, self._fail("Unfinished downloads"))

    def _on_partials_found(self, partials: list[Any]) -> None:
        if self._closed:
            return
        known = {path for t in self.transfers.values() for path in t.paths}
        added = 0
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

    def _submit(self, transfer: Transfer) -> None:
        """Queues ``transfer``'s files on the download thread, one after the other."""
        transfer.running = True
        transfer.state = "queued"
        self.transfer_changed.emit(transfer)
        files = list(transfer.files)
        cancel, pause = transfer.cancel, transfer.pause
        last = [0.0]

        def work() -> list[Any]:
            from engine.downloads import download_file

            results = []
            base = 0
            for job in files:
                if cancel.is_set():
                    break

                def progress(update: Any, base: int = base) -> None:
                    now = time.perf_counter()
                    if now - last[0] < PROGRESS_INTERVAL_S and update.state not in ("done", "paused"):
                        return
                    last[0] = now
                    transfer.done = base + update.done
                    if update.total and len(files) == 1:
                        transfer.total = update.total
                    transfer.speed_bps = update.speed_bps
                    transfer.eta_s = update.eta_s
                    transfer.state = str(update.state)
                    transfer.message = update.message
                    call_on_gui_thread(lambda: self.transfer_changed.emit(transfer))

                job.dest_dir.mkdir(parents=True, exist_ok=True)
                results.append(download_file(
                    job.repo, job.filename, job.dest_dir, revision=job.revision, endpoint=job.endpoint,
                    expected_sha256=job.expected_sha256, expected_size=job.expected_size,
                    cancel=cancel, pause=pause, progress=progress,
                ))
                base += job.expected_size or results[-1].size
            return results

        def done(results: list[Any]) -> None:
            transfer.running = False
            transfer.state = "cancelled" if len(results) < len(files) else "done"
            transfer.done = transfer.total if transfer.state == "done" else transfer.done
            transfer.speed_bps, transfer.eta_s = 0.0, None
            transfer.message = "" if transfer.state == "done" else "the partial download is kept"
            transfer.result = results
            self.transfer_changed.emit(transfer)
            if results:
                run_in_background(lambda: _record(self.library(), transfer.repo, results), lambda _r: self.scan())

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

    # ------------------------------------------------------------------ quantization
    def quantize(self, src: Path, qtype: str, dst: Path) -> Transfer:
        """Quantizes ``src`` to ``qtype`` at ``dst`` (atomic; Cancel kills the child process)."""
        transfer = Transfer(key=f"quantize:{dst}", label=f"{src.name} → {qtype}", kind="quantize")
        self.transfers[transfer.key] = transfer
        self.transfer_changed.emit(transfer)
        last = [0.0]

        def progress(update: Any) -> None:
            now = time.perf_counter()
            transfer.done, transfer.total = update.done_tensors, update.total_tensors
            transfer.state = "quantizing"
            transfer.message = update.tensor_name
            if now - last[0] >= PROGRESS_INTERVAL_S:
                last[0] = now
                call_on_gui_thread(lambda: self.transfer_changed.emit(transfer))

        def work() -> Any:
            from engine.quantize import quantize_model

            return quantize_model(src, dst, qtype, cancel=transfer.cancel, progress=progress)

        def done(result: Any) -> None:
            transfer.state = "done"
            transfer.result = result
            transfer.message = (
                f"{result.dst_bytes / 2**20:.0f} MiB, {result.ratio:.1f}x smaller, {result.seconds:.0f} s"
            )
            self.transfer_changed.emit(transfer)
            run_in_background(
                lambda: self.library().record_provenance(dst, quantized_from=str(src)), lambda _r: self.scan()
            )

        def failed(exc: BaseException) -> None:
            from engine.errors import Cancelled

            transfer.state = "cancelled" if isinstance(exc, Cancelled) else "error"
            transfer.message = describe_error(exc)
            self.transfer_changed.emit(transfer)

        self._quantize.submit(work, done, failed)
        return transfer

    def convert(self, folder: Path, qtype: str, keep_intermediate: bool = False) -> Transfer:
        """Converts a Hugging Face checkpoint folder to GGUF in the models folder, quantized to
        ``qtype`` (``engine.convert.convert_and_quantize``; Cancel kills the running stage's child)."""
        transfer = Transfer(key=f"convert:{folder}:{qtype}", label=f"{folder.name} → {qtype}", kind="convert")
        self.transfers[transfer.key] = transfer
        self.transfer_changed.emit(transfer)
        last = [0.0]

        def progress(update: Any) -> None:
            now = time.perf_counter()
            new_stage = update.stage != transfer.state
            transfer.done, transfer.total = update.done, update.total
            transfer.state = update.stage
            transfer.message = f"Step {update.step} of {update.steps}: {update.text}"
            if new_stage or now - last[0] >= PROGRESS_INTERVAL_S:
                last[0] = now
                call_on_gui_thread(lambda: self.transfer_changed.emit(transfer))

        def work() -> Any:
            from engine.convert import convert_and_quantize

            self.models_dir.mkdir(parents=True, exist_ok=True)
            return convert_and_quantize(
                folder, qtype, out_folder=self.models_dir, keep_intermediate=keep_intermediate,
                library=self.library(), cancel=transfer.cancel, progress=progress,
            )  # fmt: skip

        def done(result: Any) -> None:
            transfer.state = "done"
            transfer.result = result
            seconds = f"{result.seconds:.0f} s"
            transfer.message = f"wrote {result.path.name} ({result.dst_bytes / 2**20:.1f} MiB) in {seconds}"
            self.transfer_changed.emit(transfer)
            self.scan()

        def failed(exc: BaseException) -> None:
            from engine.errors import Cancelled

            transfer.state = "cancelled" if isinstance(exc, Cancelled) else "error"
            transfer.message = describe_error(exc)
            self.transfer_changed.emit(transfer)

        self._quantize.submit(work, done, failed)
        return transfer

    def check_quality(self, source: Path, result: Path, qtype: str, on_done: Callable[[Any], None]) -> Transfer:
        """Compares perplexity of a model and its quantization on a built-in text."""
        transfer = Transfer(key=f"quality:{result}", label=f"Quality check {result.name}", kind="quality")
        transfer.state = "running"
        self.transfers[transfer.key] = transfer
        self.transfer_changed.emit(transfer)

        def work() -> Any:
            from engine.perplexity import quality_check

            return quality_check(source, result, _QUALITY_TEXT, qtype=qtype, cancel=transfer.cancel)

        def done(report: Any) -> None:
            transfer.state = "done"
            transfer.message = report.summary()
            self.transfer_changed.emit(transfer)
            on_done(report)

        def failed(exc: BaseException) -> None:
            transfer.state = "error"
            transfer.message = describe_error(exc)
            self.transfer_changed.emit(transfer)

        self._quantize.submit(work, done, failed)
        return transfer

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
        self._quantize.shutdown(wait=wait)


def _record(library: Any, repo: str, results: list[Any]) -> None:
    for result in results:
        library.record_provenance(result.path, repo=repo, revision=result.revision, sha256=result.sha256)


_QUALITY_TEXT = (
    "The history of the printing press begins in the fifteenth century, when movable metal type made "
    "it possible to reproduce books quickly and cheaply. Within a few decades presses were running in "
    "hundreds of towns across Europe, and the price of books fell sharply. Literacy spread, scholars "
    "shared their work more widely, and new ideas travelled faster than ever before. Newspapers, "
    "pamphlets and scientific journals followed, changing how people learned about the world."
)
