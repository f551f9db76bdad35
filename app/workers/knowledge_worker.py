"""The knowledge adapter: the app's one ``rag.knowledge.KnowledgeBases`` and its workers.

``KnowledgeBases`` (Chroma, the registry, the embedding model) is opened lazily on first use, off
the GUI thread, so starting the app never imports chromadb or torch. Indexing jobs (add, remove,
re-index) run in order on the ``glassbox-index`` thread with a per-job cancel and pause event;
listings and test queries run on ``glassbox-kb-query``. Progress from the indexer is throttled to
~10 updates a second before it reaches the GUI.

At start-up (the first turn of the event loop) :meth:`KnowledgeAdapter.check_store` looks at the
local Chroma folder on the index thread: unless it is exactly as last found good and nothing waits
to be embedded, it opens the knowledge bases, which check the folder in a child process
(ROBUSTNESS P5); a damaged folder is moved aside and its chunks are re-embedded from the
registry as an ordinary job with progress.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from app.tasks import SerialExecutor, call_on_gui_thread, describe_error

log = logging.getLogger(__name__)
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


class KnowledgeAdapter(QObject):
    """Fronts the knowledge bases for the GUI.

    Args:
        root: ``paths.knowledge``.
        embedder_path: the embedding model folder (None: the bundled one).
        kb_factory: builds the KnowledgeBases (tests may share a loaded embedder).
        check_at_start: run :meth:`check_store` once the event loop runs (the app's start-up).

    Signals:
        kbs_changed(object): list of ``rag.knowledge.KnowledgeBaseSummary``.
        documents_changed(str, object): a KB name and its ``DocumentRecord`` list.
        job_started(object): the :class:`IndexJob`.
        progress_changed(object, object): the job and an ``rag.ingest.IngestProgress``.
        job_finished(object, object): the job and its ``IngestReport`` (or None on error).
        query_finished(str, object): the query text and its ``Passage`` list.
        store_recovered(object): the ``rag.store_health.StoreRecovery`` of a damaged index that
            was moved aside (a rebuild job follows).
        error_occurred(str): a one-line message.
    """

    kbs_changed = Signal(object)
    documents_changed = Signal(str, object)
    job_started = Signal(object)
    progress_changed = Signal(object, object)
    job_finished = Signal(object, object)
    query_finished = Signal(str, object)
    store_recovered = Signal(object)
    error_occurred = Signal(str)

    def __init__(
        self,
        root: Path,
        embedder_path: Path | None = None,
        kb_factory: Callable[[], Any] | None = None,
        parent: QObject | None = None,
        *,
        check_at_start: bool = True,
    ) -> None:
        super().__init__(parent)
        self.root = root
        self.embedder_path = embedder_path
        self._factory = kb_factory
        self._kbs: Any = None
        self._open_lock = threading.Lock()
        self._index = SerialExecutor("glassbox-index")
        self._query = SerialExecutor("glassbox-kb-query")
        self.jobs: list[IndexJob] = []
        self.recovery: Any = None  # the StoreRecovery of this session, if the index was damaged
        self._closed = False
        if check_at_start:
            QTimer.singleShot(0, self.check_store)

    # ------------------------------------------------------------------ the store
    def kbs(self) -> Any:
        """The KnowledgeBases, opened on first use (call from a worker thread only)."""
        with self._open_lock:
            if self._kbs is None:
                if self._factory is not None:
                    self._kbs = self._factory()
                else:
                    from rag.knowledge import KnowledgeBases

                    self._kbs = KnowledgeBases(self.root, embedder_path=self.embedder_path)
            return self._kbs

    def _submit(
        self,
        executor: SerialExecutor,
        fn: Callable[[], Any],
        on_done: Callable[[Any], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        if self._closed:
            return  # a late request during shutdown
        executor.submit(fn, on_done, on_error)

    def _fail(self, prefix: str) -> Callable[[BaseException], None]:
        return lambda exc: self.error_occurred.emit(f"{prefix}: {describe_error(exc)}")

    # ------------------------------------------------------------------ reads
    def refresh(self) -> None:
        """Reloads the KB list."""
        self._submit(self._query, lambda: self.kbs().list(), self.kbs_changed.emit, self._fail("Knowledge"))

    def load_documents(self, name: str) -> None:
        """Reloads one KB's documents."""
        self._submit(
            self._query,
            lambda: self.kbs().documents(name),
            lambda docs: self.documents_changed.emit(name, docs),
            self._fail(name),
        )

    def test_query(self, names: Sequence[str], text: str, k: int = 8) -> None:
        """Runs a retrieval and reports passages with their scores (query_finished)."""
        chosen = list(names)
        self._submit(
            self._query,
            lambda: self.kbs().query_many(chosen, text, k=k),
            lambda passages: self.query_finished.emit(text, passages),
            self._fail("Test retrieval"),
        )

    def check_store(self) -> None:
        """Checks the local store on the index thread now rather than on first use: unless it is as
        last found good with nothing waiting, the knowledge bases are opened (which checks the
        store in a child); a damaged store emits ``store_recovered`` and is rebuilt as a job, and
        chunks an interrupted run left unembedded are embedded. Does nothing before the first
        knowledge base exists."""
        if not (self.root / "registry.sqlite3").exists():
            return

        def opened() -> tuple[Any, int]:
            from rag.registry import Registry
            from rag.store_health import known_healthy

            # The usual start: the store is as it was last found good and nothing waits to be
            # embedded. Then opening the knowledge bases (chromadb, about 2 s of CPU beside the
            # model loading) waits for their first use.
            if known_healthy(self.root / "chroma") and not Registry.has_pending(self.root / "registry.sqlite3"):
                return None, 0
            kbs = self.kbs()
            return kbs.recovered, kbs.pending()

        def done(result: tuple[Any, int]) -> None:
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
            job, lambda progress: self.kbs().rebuild(progress=progress, cancel=job.cancel, pause=job.pause), None
        )

    # ------------------------------------------------------------------ writes (ordered)
    def create(self, name: str, on_done: Callable[[Any], None] | None = None) -> None:
        """Creates a knowledge base."""

        def done(kb: Any) -> None:
            self.refresh()
            if on_done is not None:
                on_done(kb)

        self._submit(self._index, lambda: self.kbs().create(name), done, self._fail(f"Create {name}"))

    def ensure(self, name: str) -> None:
        """Creates ``name`` if it does not exist (queued before the jobs that need it)."""

        def ensure() -> None:
            from rag.errors import KnowledgeBaseError

            kbs = self.kbs()
            try:
                kbs.get(name)
            except KnowledgeBaseError:
                kbs.create(name)

        self._submit(self._index, ensure, None, self._fail(f"Create {name}"))

    def drop(self, name: str) -> None:
        """Deletes a knowledge base's index (never the user's files)."""
        self._submit(self._index, lambda: self.kbs().drop(name), lambda _r: self.refresh(), self._fail(f"Drop {name}"))

    def add(self, name: str, paths: Sequence[Path], on_done: Callable[[Any], None] | None = None) -> IndexJob:
        """Indexes files or folders into ``name``; returns the job (pause/cancel it through its events)."""
        files = [Path(p) for p in paths]
        label = files[0].name if len(files) == 1 else f"{len(files)} items"
        job = IndexJob(name, f"Adding {label} to {name}")
        return self._run_job(
            job,
            lambda progress: self.kbs().add(name, files, progress=progress, cancel=job.cancel, pause=job.pause),
            on_done,
        )

    def reindex(self, name: str) -> IndexJob:
        """Rebuilds a knowledge base from its files."""
        job = IndexJob(name, f"Re-indexing {name}")
        return self._run_job(
            job,
            lambda progress: self.kbs().reindex(name, progress=progress, cancel=job.cancel, pause=job.pause),
            None,
        )

    def remove(self, name: str, path: Path) -> None:
        """Forgets a file (or everything under a folder) in ``name``."""

        def done(_count: int) -> None:
            self.load_documents(name)
            self.refresh()

        self._submit(self._index, lambda: self.kbs().remove(name, path), done, self._fail(f"Remove {path.name}"))

    def _run_job(
        self,
        job: IndexJob,
        work: Callable[[Callable[[Any], None]], Any],
        on_done: Callable[[Any], None] | None,
    ) -> IndexJob:
        self.jobs.append(job)
        self.job_started.emit(job)
        last = [0.0]

        def progress(update: Any) -> None:
            now = time.perf_counter()
            if now - last[0] >= PROGRESS_INTERVAL_S or update.state in ("done", "cancelled", "paused"):
                last[0] = now
                call_on_gui_thread(lambda: self.progress_changed.emit(job, update))

        def finished(report: Any) -> None:
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

    # ------------------------------------------------------------------ chat
    def chat_retriever(self, names: Sequence[str]) -> Callable[[str, Any], tuple[str | None, list[dict[str, Any]]]]:
        """A function for the LLM worker: ``(query, session) -> (documents block, sources)``.

        It runs on the LLM thread (which owns the session's tokenizer), using this adapter's
        KnowledgeBases (thread-safe: rag serialises access with its own lock).
        """
        chosen = list(names)

        def retrieve(query: str, session: Any) -> tuple[str | None, list[dict[str, Any]]]:
            from app.knowledge_glue import documents_budget
            from rag.knowledge import retrieve_context

            info = getattr(session, "info", None)
            n_ctx = getattr(info, "n_ctx", 4096) or 4096
            block = retrieve_context(self.kbs(), chosen, query, documents_budget(n_ctx), session.count_text)
            if not block.sources:
                return None, []
            return block.text, [asdict(source) for source in block.sources]

        return retrieve

    # ------------------------------------------------------------------ shutdown
    def shutdown(self, wait: bool = True) -> None:
        """Cancels running jobs, waits for them, closes the store."""
        if self._closed:
            return
        self._closed = True
        for job in list(self.jobs):
            job.pause.clear()
            job.cancel.set()
        self._query.shutdown(wait=wait)
        self._index.shutdown(wait=wait)
        if self._kbs is not None:
            try:
                self._kbs.close()
            except Exception as exc:  # noqa: BLE001 - closing must not raise at exit
                log.warning("closing the knowledge bases failed: %s", exc)
            self._kbs = None
