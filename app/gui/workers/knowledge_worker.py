"""The knowledge adapter: the app's knowledge bases, in a worker process, and the threads that wait on it.

The knowledge bases (Chroma, the registry, the embedding model) live in a child process
(``rag.service.KnowledgeService``), started on first use, so the GUI process never imports
chromadb or torch (ARCHITECTURE.md: the idle app stays under 250 MB). Indexing jobs (add, remove,
re-index) are sent in order from the ``glassbox-index`` thread with a per-job cancel and pause
event, which the service forwards to the child; listings, test queries and a chat turn's
retrieval (before its request reaches the LLM worker) go from ``glassbox-kb-query``. Progress is
throttled to ~10 updates a second before it reaches the GUI. Tests that share one loaded embedder
pass ``kb_factory``: the same calls are then answered in this process (``rag.service.LocalService``).

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

from app.gui.tasks import SerialExecutor, call_on_gui_thread, describe_error
from app.gui.workers.chat_retrieval import Retrieved

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


class ChatSearcher:
    """The knowledge service as a chat searches it (the documents block and ``search_knowledge``):
    a knowledge base the chat still names but that was deleted is skipped, never an error on every
    turn. Runs on the knowledge query thread (a turn's passages) or the LLM thread (the model's
    ``search_knowledge``): the service's calls block.

    Args:
        service: returns the knowledge service (a ``rag.knowledge.Searcher`` with ``call``).
        on_missing: told the names skipped (from the calling thread).
    """

    def __init__(self, service: Callable[[], Any], on_missing: Callable[[list[str]], None]) -> None:
        self._service = service
        self._on_missing = on_missing

    def query_many(self, names: Sequence[str], text: str, *, k: int = 5) -> list[Any]:
        """``query_many`` over the names that exist (the others are reported to ``on_missing``).

        Raises:
            RagError: what the search raises for another reason than a missing knowledge base.
        """
        from rag.errors import KnowledgeBaseError

        chosen = list(dict.fromkeys(names))
        service = self._service()
        try:
            return list(service.query_many(chosen, text, k=k)) if chosen else []
        except KnowledgeBaseError:
            gone = self._missing(service, chosen)
            if not gone:
                raise
        self._on_missing(gone)
        rest = [name for name in chosen if name not in gone]
        return list(service.query_many(rest, text, k=k)) if rest else []

    @staticmethod
    def _missing(service: Any, names: Sequence[str]) -> list[str]:
        """The names that are neither this home's knowledge bases nor another's on the Chroma server."""
        from rag.errors import KnowledgeBaseError

        gone = []
        for name in names:
            try:
                service.call("get", name)
            except KnowledgeBaseError:
                gone.append(name)
        if gone:
            try:
                foreign = set(service.call("foreign"))
            except KnowledgeBaseError:
                foreign = set()
            gone = [name for name in gone if name not in foreign]
        return gone


CHAT_PASSAGES = 6
"""How many passages a chat turn retrieves (the engine's documents band keeps those that fit)."""


class ChatRetriever:
    """A chat turn's retrieval over some knowledge bases, on the knowledge adapter's query thread.

    Args:
        adapter: the knowledge adapter (its query thread and :attr:`KnowledgeAdapter.chat_searcher`).
        names: the knowledge bases the chat has attached.
    """

    def __init__(self, adapter: KnowledgeAdapter, names: Sequence[str]) -> None:
        self._adapter = adapter
        self.names = tuple(dict.fromkeys(names))

    def retrieve(
        self,
        query: str,
        on_done: Callable[[Retrieved], None],
        on_error: Callable[[BaseException], None],
        *,
        skip: Callable[[], bool] | None = None,
    ) -> None:
        """Searches for ``query``; ``on_done`` or ``on_error`` is called on the GUI thread.

        Args:
            query: the user's message.
            on_done: takes the :class:`Retrieved` passages.
            on_error: takes what the search raised (the turn then goes on without documents).
            skip: asked first, on the query thread (it may read a file): True returns nothing
                retrieved (the model searches the knowledge bases itself).
        """
        adapter, names = self._adapter, self.names

        def work() -> Retrieved:
            from rag.knowledge import retrieve_passages

            if skip is not None and skip():
                return Retrieved(None, (), skipped=True)
            cited = retrieve_passages(adapter.chat_searcher, names, query, k=CHAT_PASSAGES)
            if not cited.count:
                return Retrieved(None, ())
            return Retrieved(cited, tuple(asdict(source) for source in cited.sources))

        if adapter.closed:
            on_error(RuntimeError("the knowledge bases are closed"))
            return
        adapter._query.submit(work, on_done, on_error)


class KnowledgeAdapter(QObject):
    """Fronts the knowledge bases for the GUI.

    Args:
        root: ``paths.knowledge``.
        embedder_path: the embedding model folder (None: the bundled one).
        kb_factory: builds the KnowledgeBases in this process (tests share a loaded embedder);
            None runs them in a worker process.
        check_at_start: run :meth:`check_store` once the event loop runs (the app's start-up).

    Signals:
        kbs_changed(object): list of ``rag.knowledge.KnowledgeBaseSummary``.
        names_listed(object): the list of knowledge-base names (after every listing).
        kb_created(object): the ``KnowledgeBaseInfo`` of a knowledge base just created.
        documents_changed(str, object): a KB name and its ``DocumentRecord`` list.
        job_started(object): the :class:`IndexJob`.
        progress_changed(object, object): the job and an ``rag.ingest.IngestProgress``.
        job_finished(object, object): the job and its ``IngestReport`` (or None on error).
        query_finished(str, object): the query text and its ``Passage`` list.
        store_recovered(object): the ``rag.store_health.StoreRecovery`` of a damaged index that
            was moved aside (a rebuild job follows).
        missing_found(object): knowledge bases a chat searched that no longer exist (skipped).
        error_occurred(str): a one-line message.
    """

    kbs_changed = Signal(object)
    kb_created = Signal(object)
    names_listed = Signal(object)
    documents_changed = Signal(str, object)
    job_started = Signal(object)
    progress_changed = Signal(object, object)
    job_finished = Signal(object, object)
    query_finished = Signal(str, object)
    store_recovered = Signal(object)
    missing_found = Signal(object)
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
        self.service: Any = self._make_service(kb_factory)
        self.names: list[str] = []  # the knowledge bases as last listed
        self._index = SerialExecutor("glassbox-index")
        self._query = SerialExecutor("glassbox-kb-query")
        self.jobs: list[IndexJob] = []
        self.recovery: Any = None  # the StoreRecovery of this session, if the index was damaged
        self._closed = False
        # What chats search (documents and search_knowledge): a deleted knowledge base is skipped.
        # The signal is emitted on the LLM thread and queued to the GUI's.
        self.chat_searcher = ChatSearcher(lambda: self.service, self.missing_found.emit)
        if check_at_start:
            QTimer.singleShot(0, self.check_store)

    # ------------------------------------------------------------------ the store
    @property
    def closed(self) -> bool:
        """True once :meth:`shutdown` ran (nothing new is submitted)."""
        return self._closed

    def _make_service(self, kb_factory: Callable[[], Any] | None) -> Any:
        from rag.service import KnowledgeService, LocalService

        if kb_factory is not None:
            return LocalService(kb_factory)
        return KnowledgeService(self.root, self.embedder_path)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Runs one ``rag.service`` call (blocks: call from a worker thread only)."""
        return self.service.call(method, *args, **kwargs)

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
        self._submit(self._query, lambda: self.call("list"), self._on_listed, self._fail("Knowledge"))

    def list_names(self) -> None:
        """Lists the knowledge bases' names (``names_listed``): read from the registry file without
        starting the knowledge process, else by a full :meth:`refresh`."""

        def names() -> list[str] | None:
            from rag.registry import Registry

            return Registry.kb_names(self.root / "registry.sqlite3")

        def done(found: list[str] | None) -> None:
            if found is None:
                self.refresh()
                return
            self.names = list(found)
            self.names_listed.emit(list(found))

        self._submit(self._query, names, done, self._fail("Knowledge"))

    def _on_listed(self, summaries: list[Any]) -> None:
        self.names = [summary.info.name for summary in summaries]
        self.kbs_changed.emit(summaries)
        self.names_listed.emit(list(self.names))

    def load_documents(self, name: str) -> None:
        """Reloads one KB's documents."""
        self._submit(
            self._query,
            lambda: self.call("documents", name),
            lambda docs: self.documents_changed.emit(name, docs),
            self._fail(name),
        )

    def test_query(self, names: Sequence[str], text: str, k: int = 8) -> None:
        """Runs a retrieval and reports passages with their scores (query_finished)."""
        chosen = list(names)
        self._submit(
            self._query,
            lambda: self.call("query_many", chosen, text, k=k),
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
            recovered, pending = self.call("status")
            return recovered, int(pending)

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
            job, lambda progress: self.call("rebuild", progress=progress, cancel=job.cancel, pause=job.pause), None
        )

    # ------------------------------------------------------------------ writes (ordered)
    def create(
        self,
        name: str,
        on_done: Callable[[Any], None] | None = None,
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

        def done(kb: Any) -> None:
            self.kb_created.emit(kb)
            self.refresh()
            if on_done is not None:
                on_done(kb)

        def failed(exc: BaseException) -> None:
            message = f"Create {name}: {describe_error(exc)}"
            self.error_occurred.emit(message)
            if on_error is not None:
                on_error(message)

        method = "create_unique" if unique else "create"
        self._submit(self._index, lambda: self.call(method, name), done, failed)

    def ensure(self, name: str) -> None:
        """Creates ``name`` if it does not exist (queued before the jobs that need it)."""
        self._submit(self._index, lambda: self.call("ensure", name), None, self._fail(f"Create {name}"))

    def drop(self, name: str) -> None:
        """Deletes a knowledge base's index (never the user's files)."""
        self._submit(
            self._index, lambda: self.call("drop", name), lambda _r: self.refresh(), self._fail(f"Drop {name}")
        )

    def add(self, name: str, paths: Sequence[Path], on_done: Callable[[Any], None] | None = None) -> IndexJob:
        """Indexes files or folders into ``name``; returns the job (pause/cancel it through its events)."""
        files = [Path(p) for p in paths]
        label = files[0].name if len(files) == 1 else f"{len(files)} items"
        job = IndexJob(name, f"Adding {label} to {name}")
        return self._run_job(
            job,
            lambda progress: self.call("add", name, files, progress=progress, cancel=job.cancel, pause=job.pause),
            on_done,
        )

    def reindex(self, name: str) -> IndexJob:
        """Rebuilds a knowledge base from its files."""
        job = IndexJob(name, f"Re-indexing {name}")
        return self._run_job(
            job,
            lambda progress: self.call("reindex", name, progress=progress, cancel=job.cancel, pause=job.pause),
            None,
        )

    def remove(self, name: str, path: Path) -> None:
        """Forgets a file (or everything under a folder) in ``name``."""

        def done(_count: int) -> None:
            self.load_documents(name)
            self.refresh()

        self._submit(self._index, lambda: self.call("remove", name, path), done, self._fail(f"Remove {path.name}"))

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
    def chat_retriever(self, names: Sequence[str]) -> ChatRetriever:
        """What a chat turn asks for its passages over ``names`` (``ChatAdapter``'s retriever factory).

        The search runs on the ``glassbox-kb-query`` thread, before the request reaches the LLM
        worker; the passages come back, cited but not fitted, on the GUI thread: the engine's
        documents band fits them with the chat model's token counter.
        """
        return ChatRetriever(self, names)

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
        try:
            self.service.close()
        except Exception as exc:  # noqa: BLE001 - closing must not raise at exit
            log.warning("closing the knowledge bases failed: %s", exc)
