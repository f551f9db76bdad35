"""The knowledge bases' service as the GUI holds it, and the ``glassbox-kb-query`` thread's reads.

The knowledge bases (Chroma, the registry, the embedding model) live in a child process
(``rag.service.KnowledgeService``), started on first use, so the GUI process never imports
chromadb or torch (ARCHITECTURE.md: the idle app stays under 250 MB). Tests that share one loaded
embedder pass ``kb_factory``: the same calls are then answered in this process
(``rag.service.LocalService``).

:class:`KnowledgeQueries` owns the service, the adapter's signals, its two threads and the reads
that go from ``glassbox-kb-query``: listings, a knowledge base's documents, test queries and a
chat turn's retrieval (:mod:`app.gui.workers.knowledge_chat`). The ordered writes and the
indexing jobs on ``glassbox-index`` are its subclass, ``knowledge_worker.KnowledgeAdapter``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from PySide6.QtCore import QObject, Signal

from app.gui.tasks import SerialExecutor, describe_error
from app.gui.workers.knowledge_chat import ChatRetriever, ChatSearcher
from rag.calls import KnowledgeCalls

if TYPE_CHECKING:
    from app.gui.workers.knowledge_worker import IndexJob
    from rag.knowledge import KnowledgeBaseSummary
    from rag.registry import DocumentRecord
    from rag.retrieval import Passage
    from rag.service import Service
    from rag.store_health import StoreRecovery

log = logging.getLogger(__name__)
T = TypeVar("T")


class KnowledgeQueries(QObject):
    """The knowledge service, the signals the GUI listens to, and the reads.

    Args:
        root: ``paths.knowledge``.
        embedder_path: the embedding model folder (None: the bundled one).
        kb_factory: builds the KnowledgeBases in this process (tests share a loaded embedder);
            None runs them in a worker process.
        idle_stop_s: the worker process stops after this many seconds with no call waiting
            (Settings' ``knowledge_idle_minutes``; None or 0: it runs until the app closes).

    Signals:
        kbs_changed(object): list of ``rag.knowledge.KnowledgeBaseSummary``.
        names_listed(object): the list of knowledge-base names (after every listing).
        kb_created(object): the ``KnowledgeBaseInfo`` of a knowledge base just created.
        documents_changed(str, object): a KB name and its ``DocumentRecord`` list.
        job_started(object): the ``IndexJob``.
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
        kb_factory: Callable[[], object] | None = None,
        parent: QObject | None = None,
        *,
        idle_stop_s: float | None = None,
    ) -> None:
        super().__init__(parent)
        self.root = root
        self.embedder_path = embedder_path
        self._kb_factory = kb_factory
        self._idle_stop_s = idle_stop_s
        self._service: Service | None = None  # made on first use (:attr:`service`)
        self._service_lock = threading.Lock()
        self.names: list[str] = []  # the knowledge bases as last listed
        self._index = SerialExecutor("glassbox-index")
        self._query = SerialExecutor("glassbox-kb-query")
        self.jobs: list[IndexJob] = []
        self.recovery: StoreRecovery | None = None  # the StoreRecovery of this session, if the index was damaged
        self._closed = False
        # What chats search (documents and search_knowledge): a deleted knowledge base is skipped.
        # The signal is emitted on the LLM thread and queued to the GUI's.
        self.chat_searcher = ChatSearcher(lambda: self.service, self.missing_found.emit)

    # ------------------------------------------------------------------ the store
    @property
    def closed(self) -> bool:
        """True once :meth:`shutdown` ran (nothing new is submitted)."""
        return self._closed

    @property
    def service(self) -> Service:
        """The knowledge service, made on first use (from any thread): the window's start does not
        wait for ``rag.service`` and ``multiprocessing`` to import (a measured start-up cost). Its
        process starts later still, on its first call."""
        with self._service_lock:
            if self._service is None:
                self._service = self._make_service()
            return self._service

    @service.setter
    def service(self, service: Service) -> None:
        with self._service_lock:
            self._service = service

    def _make_service(self) -> Service:
        # lazy: start-up (+24 ms: rag.service, multiprocessing)
        from rag.service import KnowledgeService, LocalService

        if self._kb_factory is not None:
            return LocalService(self._kb_factory)
        return KnowledgeService(self.root, self.embedder_path, idle_stop_s=self._idle_stop_s)

    def set_idle_stop(self, seconds: float | None) -> None:
        """How long the knowledge process may stay idle before it stops (None or 0: never)."""
        with self._service_lock:
            self._idle_stop_s = seconds
            service = self._service
        if service is None:
            return  # the service is made with it
        # lazy: start-up (+24 ms); imported already once the service exists
        from rag.service import KnowledgeService

        if isinstance(service, KnowledgeService):
            service.idle_stop_s = seconds

    @property
    def calls(self) -> KnowledgeCalls:
        """The knowledge process's calls, typed (each blocks: call them from a worker thread only)."""
        return KnowledgeCalls(self.service)

    def _submit(
        self,
        executor: SerialExecutor,
        fn: Callable[[], T],
        on_done: Callable[[T], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        if self._closed:
            return  # a late request during shutdown
        executor.submit(fn, on_done, on_error)

    def submit_query(
        self, fn: Callable[[], T], on_done: Callable[[T], None], on_error: Callable[[BaseException], None]
    ) -> None:
        """Runs ``fn`` on the ``glassbox-kb-query`` thread; the callbacks run on the GUI thread."""
        self._query.submit(fn, on_done, on_error)

    def _fail(self, prefix: str) -> Callable[[BaseException], None]:
        return lambda exc: self.error_occurred.emit(f"{prefix}: {describe_error(exc)}")

    # ------------------------------------------------------------------ reads
    def refresh(self) -> None:
        """Reloads the KB list."""
        self._submit(self._query, lambda: self.calls.list(), self._on_listed, self._fail("Knowledge"))

    def list_names(self) -> None:
        """Lists the knowledge bases' names (``names_listed``): read from the registry file without
        starting the knowledge process, else by a full :meth:`refresh`."""

        def names() -> list[str] | None:
            # lazy: start-up (+21 ms)
            from rag.layout import REGISTRY_FILE
            from rag.registry import Registry

            return Registry.kb_names(self.root / REGISTRY_FILE)

        def done(found: list[str] | None) -> None:
            if found is None:
                self.refresh()
                return
            self.names = list(found)
            self.names_listed.emit(list(found))

        self._submit(self._query, names, done, self._fail("Knowledge"))

    def _on_listed(self, summaries: list[KnowledgeBaseSummary]) -> None:
        self.names = [summary.info.name for summary in summaries]
        self.kbs_changed.emit(summaries)
        self.names_listed.emit(list(self.names))

    def load_documents(self, name: str) -> None:
        """Reloads one KB's documents."""

        def loaded(docs: list[DocumentRecord]) -> None:
            self.documents_changed.emit(name, docs)

        self._submit(self._query, lambda: self.calls.documents(name), loaded, self._fail(name))

    def test_query(self, names: Sequence[str], text: str, k: int = 8) -> None:
        """Runs a retrieval and reports passages with their scores (query_finished)."""
        chosen = list(names)

        def found(passages: list[Passage]) -> None:
            self.query_finished.emit(text, passages)

        self._submit(self._query, lambda: self.calls.query_many(chosen, text, k=k), found, self._fail("Test retrieval"))

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
        with self._service_lock:
            service = self._service
        if service is None:
            return  # never used: nothing to close
        try:
            service.close()
        except Exception as exc:  # noqa: BLE001 - closing must not raise at exit
            log.warning("closing the knowledge bases failed: %s", exc)
