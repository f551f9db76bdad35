"""The knowledge adapter: the ordered writes and the indexing jobs, on the ``glassbox-index`` thread.

:class:`KnowledgeAdapter` is what the GUI holds; its service, signals and reads are
:class:`~app.gui.workers.knowledge_queries.KnowledgeQueries`. Indexing jobs (add, remove,
re-index) are sent in order from the ``glassbox-index`` thread with a per-job cancel and pause
event (an :class:`IndexJob`), which the service forwards to the child. Progress is throttled to
~10 updates a second before it reaches the GUI.

Contract: ARCHITECTURE.md, 'app.gui.workers.knowledge_worker'.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, QTimer

from app.gui.tasks import call_on_gui_thread, describe_error
from app.gui.workers.knowledge_queries import KnowledgeQueries

if TYPE_CHECKING:
    from rag.ingest import IngestProgress, IngestReport
    from rag.registry import KnowledgeBaseInfo
    from rag.store_health import StoreRecovery

PROGRESS_INTERVAL_S = 0.1


@dataclass
class IndexJob:
    """One running indexing job: what, and the events the GUI sets to pause or cancel it.

    ``kb`` is empty for a rebuild of the whole index.
    """

    kb: str
    label: str
    cancel: threading.Event = field(default_factory=threading.Event)
    pause: threading.Event = field(default_factory=threading.Event)
    started: float = field(default_factory=time.perf_counter)


class KnowledgeAdapter(KnowledgeQueries):
    """Fronts the knowledge bases for the GUI: the reads of :class:`KnowledgeQueries`, and the writes.

    Args:
        root: ``paths.knowledge``.
        embedder_path: the embedding model folder (None: the bundled one).
        kb_factory: builds the KnowledgeBases in this process (tests share a loaded embedder);
            None runs them in a worker process.
        check_at_start: run :meth:`check_store` once the event loop runs (the app's start-up).
        idle_stop_s: stop the worker process after this many seconds idle (None or 0: never).
    """

    def __init__(
        self,
        root: Path,
        embedder_path: Path | None = None,
        kb_factory: Callable[[], object] | None = None,
        parent: QObject | None = None,
        *,
        check_at_start: bool = True,
        idle_stop_s: float | None = None,
    ) -> None:
        super().__init__(root, embedder_path, kb_factory, parent, idle_stop_s=idle_stop_s)
        if check_at_start:
            QTimer.singleShot(0, self.check_store)

    # ------------------------------------------------------------------ the store
    def check_store(self) -> None:
        """Checks the local store on the index thread now rather than on first use: unless it is as
        last found good with nothing waiting, the knowledge bases are opened (which checks the
        store in a child); a damaged store emits ``store_recovered`` and is rebuilt as a job, and
        chunks an interrupted run left unembedded are embedded. Does nothing before the first
        knowledge base exists."""
        # lazy: start-up (+1 ms)
        from rag.layout import CHROMA_FOLDER, REGISTRY_FILE

        if not (self.root / REGISTRY_FILE).exists():
            return

        def opened() -> tuple[StoreRecovery | None, int]:
            # lazy: start-up (+46 ms)
            from rag.registry import Registry
            from rag.store_health import known_healthy

            # The usual start: the store is as it was last found good and nothing waits to be
            # embedded. Then opening the knowledge bases (chromadb, about 2 s of CPU beside the
            # model loading) waits for their first use.
            if known_healthy(self.root / CHROMA_FOLDER) and not Registry.has_pending(self.root / REGISTRY_FILE):
                return None, 0
            return self.calls.status()

        def done(result: tuple[StoreRecovery | None, int]) -> None:
            recovery, pending = result
            if recovery is not None:
                self.recovery = recovery
                self.store_recovered.emit(recovery)
            if pending:
                self.rebuild()

        self._submit(self._index, opened, done, self._fail("Document index"))

    def rebuild(self) -> IndexJob:
        """Embeds every chunk still waiting for it (after a damaged store was replaced)."""
        label = "Rebuilding the document index" if self.recovery is not None else "Finishing the document index"
        job = IndexJob("", label)
        return self._run_job(
            job, lambda progress: self.calls.rebuild(progress=progress, cancel=job.cancel, pause=job.pause), None
        )

    # ------------------------------------------------------------------ writes (ordered)
    def create(
        self,
        name: str,
        on_done: Callable[[KnowledgeBaseInfo], None] | None = None,
        on_error: Callable[[str], None] | None = None,
        *,
        unique: bool = False,
    ) -> None:
        """Creates a knowledge base (``kb_created`` follows, then a fresh list).

        Args:
            name: its name.
            on_done: called on the GUI thread with its ``KnowledgeBaseInfo``.
            on_error: called on the GUI thread with the one-line error (also emitted).
            unique: take ``name 2``, ``name 3``, ... when ``name`` is taken instead of failing.
        """

        def done(kb: KnowledgeBaseInfo) -> None:
            self.kb_created.emit(kb)
            self.refresh()
            if on_done is not None:
                on_done(kb)

        def failed(exc: BaseException) -> None:
            message = f"Create {name}: {describe_error(exc)}"
            self.error_occurred.emit(message)
            if on_error is not None:
                on_error(message)

        create = self.calls.create_unique if unique else self.calls.create
        self._submit(self._index, lambda: create(name), done, failed)

    def ensure(self, name: str) -> None:
        """Creates ``name`` if it does not exist (queued before the jobs that need it)."""
        self._submit(self._index, lambda: self.calls.ensure(name), None, self._fail(f"Create {name}"))

    def drop(self, name: str) -> None:
        """Deletes a knowledge base's index (never the user's files)."""
        self._submit(self._index, lambda: self.calls.drop(name), lambda _r: self.refresh(), self._fail(f"Drop {name}"))

    def add(self, name: str, paths: Sequence[Path], on_done: Callable[[IngestReport], None] | None = None) -> IndexJob:
        """Indexes files or folders into ``name``; returns the job (pause/cancel it through its events)."""
        files = [Path(p) for p in paths]
        label = files[0].name if len(files) == 1 else f"{len(files)} items"
        job = IndexJob(name, f"Adding {label} to {name}")
        return self._run_job(
            job,
            lambda progress: self.calls.add(name, files, progress=progress, cancel=job.cancel, pause=job.pause),
            on_done,
        )

    def reindex(self, name: str) -> IndexJob:
        """Rebuilds a knowledge base from its files."""
        job = IndexJob(name, f"Re-indexing {name}")
        return self._run_job(
            job,
            lambda progress: self.calls.reindex(name, progress=progress, cancel=job.cancel, pause=job.pause),
            None,
        )

    def remove(self, name: str, path: Path) -> None:
        """Forgets a file (or everything under a folder) in ``name``."""

        def done(_count: int) -> None:
            self.load_documents(name)
            self.refresh()

        self._submit(self._index, lambda: self.calls.remove(name, path), done, self._fail(f"Remove {path.name}"))

    def _run_job(
        self,
        job: IndexJob,
        work: Callable[[Callable[[IngestProgress], None]], IngestReport],
        on_done: Callable[[IngestReport], None] | None,
    ) -> IndexJob:
        self.jobs.append(job)
        self.job_started.emit(job)
        last = [0.0]

        def progress(update: IngestProgress) -> None:
            now = time.perf_counter()
            if now - last[0] >= PROGRESS_INTERVAL_S or update.state in ("done", "cancelled", "paused"):
                last[0] = now
                call_on_gui_thread(lambda: self.progress_changed.emit(job, update))

        def finished(report: IngestReport) -> None:
            if job in self.jobs:
                self.jobs.remove(job)
            self.job_finished.emit(job, report)
            if job.kb:  # a rebuild belongs to no single knowledge base
                self.load_documents(job.kb)
            self.refresh()
            if on_done is not None:
                on_done(report)

        def failed(exc: BaseException) -> None:
            if job in self.jobs:
                self.jobs.remove(job)
            self.job_finished.emit(job, None)
            self.error_occurred.emit(f"{job.label}: {describe_error(exc)}")

        self._submit(self._index, lambda: work(progress), finished, failed)
        return job
