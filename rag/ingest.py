"""Indexing: scan -> parse -> chunk -> embed -> store, incremental, batched and interruptible.

Every step is committed to the registry before the next begins, so a killed indexer resumes
where it stopped: queued documents are parsed again, stored chunks that were never embedded are
embedded, and Chroma is reconciled against the registry (vectors it misses are re-embedded,
vectors nobody owns are deleted). Upserts are idempotent, so nothing is ever stored twice.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import stat
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from rag.detect import file_type, not_regular
from rag.embeddings import Embedder
from rag.errors import DocumentError, KnowledgeBaseError
from rag.loaders import check_size
from rag.registry import ChunkLike, ChunkRecord, DocState, DocumentRecord, KnowledgeBaseInfo, Registry
from rag.store import VectorStore

# Smallest embedding batch: below one full encoder batch (32) the CPU matmuls lose efficiency, so
# on a slow machine a batch takes longer than ``batch_seconds`` rather than fewer chunks.
MIN_BATCH = 32
MAX_FILES = 200_000  # a folder walk stops here instead of eating the machine (ROBUSTNESS I8)
_HASH_BLOCK = 1 << 20
_CHANGED_TRIES = 2  # a file that changes while it is indexed is read this many times at most
_CHANGING = "the file changed while it was being indexed (it is indexed on the next add once it stops changing)"


class Parser(Protocol):
    """What ingest needs from ``rag.parsing.ParserPool``."""

    def parse(self, path: Path, timeout_s: float = 60.0, *, cancel: threading.Event | None = None) -> Any: ...


class Chunker(Protocol):
    """What ingest needs from ``rag.chunking.chunk_document``."""

    def __call__(
        self,
        doc: Any,
        *,
        count_tokens: Callable[[str], int],
        max_tokens: int,
        overlap_tokens: int,
    ) -> Sequence[ChunkLike]: ...


@dataclass(frozen=True)
class IngestProgress:
    """A progress report; ``state`` is scanning, indexing, embedding, rebuilding, paused, done or
    cancelled. ``chunks_total`` is known only when re-embedding stored chunks (a rebuild).

    A report sent right after a file was read names it in ``finished_file`` with ``finished_as``:
    ``indexed``, ``unchanged``, ``duplicate``, or the skip or error line (``skipped: binary file``).
    """

    files_done: int
    files_total: int
    chunks_done: int
    current_file: str | None
    eta_s: float | None
    state: str
    chunks_total: int | None = None
    finished_file: str | None = None
    finished_as: str | None = None


@dataclass
class IngestReport:
    """What one run did; ``failures`` lists ``(path, reason)`` of skipped and failed files."""

    indexed: int = 0
    unchanged: int = 0
    duplicates: int = 0
    skipped: int = 0
    errors: int = 0
    removed: int = 0
    chunks_added: int = 0
    repaired: int = 0
    cancelled: bool = False
    seconds: float = 0.0
    failures: list[tuple[str, str]] = field(default_factory=list)

    def summary(self) -> str:
        """One line for people."""
        parts = [f"{self.indexed} indexed", f"{self.unchanged} unchanged"]
        for count, label in (
            (self.duplicates, "duplicates"),
            (self.skipped, "skipped"),
            (self.errors, "failed"),
            (self.removed, "removed"),
        ):
            if count:
                parts.append(f"{count} {label}")
        line = ", ".join(parts) + f"; {self.chunks_added} chunks in {self.seconds:.1f} s"
        return line + (" (cancelled)" if self.cancelled else "")


def display_path(path: Path | str) -> str:
    """A path as one printable line: undecodable bytes as ``\\xff``, line breaks and other control
    or invisible characters as ``\\n``, ``\\t``, ``\\u200b``; everything else as it is."""
    text = os.fsencode(path).decode("utf-8", "backslashreplace")
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def storable(path: Path | str) -> bool:
    """Whether the registry can hold this path: its name is valid Unicode (UTF-8 on Linux), not bytes
    Python keeps as surrogate escapes."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shown_path(path: Path | str) -> str:
    """How a path appears in an :class:`IngestReport`: as it is when the registry can hold it, else
    escaped by :func:`display_path` (the only form that is valid text)."""
    return str(path) if storable(path) else display_path(path)


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file, read in blocks.

    The file is opened without blocking, and refused unless it is a regular file, so a path that
    was swapped for a named pipe never hangs the indexer.

    Raises:
        OSError: the file cannot be opened or read.
        DocumentError: it is not a regular file (reason starts with ``"skipped: "``).
    """
    digest = hashlib.sha256()
    nonblock = getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, os.O_RDONLY | nonblock | getattr(os, "O_BINARY", 0) | getattr(os, "O_NOCTTY", 0))
    with os.fdopen(fd, "rb") as fh:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise not_regular(path, mode)
        if nonblock:
            os.set_blocking(fd, True)
        while block := fh.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _not_regular(mode: int) -> str:
    return f"not a regular file: {file_type(mode)}"


class WalkResult(NamedTuple):
    """What :func:`walk_files` found."""

    files: list[Path]
    """Regular files to index (absolute, deduplicated)."""
    folders: list[Path]
    """The folders walked."""
    skipped: list[tuple[str, str]]
    """``(path, reason)`` of entries left out with a reason (FIFOs, sockets, devices, names that are
    not valid UTF-8); the path as :func:`shown_path` gives it."""


def walk_files(paths: Sequence[Path]) -> WalkResult:
    """Expands files and folders into files, without following symlinks or entering dot-folders.

    Only regular files are kept. Nothing is opened: a named pipe, socket or device file (found in a
    folder or given directly) is left out with a reason, like a file or folder whose name the
    registry cannot store (bytes that are not valid UTF-8); dot-files and symlinks inside folders
    are left out silently, as before.

    Returns:
        ``(files, folders, skipped)``, see :class:`WalkResult`.

    Raises:
        KnowledgeBaseError: a given path does not exist, or a folder holds more than ``MAX_FILES`` files.
    """
    files: dict[Path, None] = {}
    folders: list[Path] = []
    skipped: list[tuple[str, str]] = []

    def check_limit(given: Path) -> None:
        if len(files) + len(skipped) >= MAX_FILES:
            raise KnowledgeBaseError(f"{display_path(given)}: more than {MAX_FILES} files; add smaller folders")

    def skip(path: Path, reason: str, given: Path) -> None:
        skipped.append((shown_path(path), f"{DocState.SKIPPED}: {reason}"))
        check_limit(given)

    for given in paths:
        path = Path(os.path.abspath(given.expanduser()))
        try:
            mode = path.stat().st_mode
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                reason = "a symbolic link loop (too many levels of symbolic links)"
            elif isinstance(exc, (FileNotFoundError, NotADirectoryError)):
                reason = "no such file or folder"
            else:
                reason = f"cannot read it ({exc.strerror or exc})"
            raise KnowledgeBaseError(f"{display_path(given)}: {reason}") from None
        if not storable(path):
            skip(path, "the path is not valid UTF-8 (rename it to index it)", path)
        elif stat.S_ISDIR(mode):
            folders.append(path)
            for top, dirs, names in os.walk(path, followlinks=False):
                kept: list[str] = []
                for name in sorted(d for d in dirs if not d.startswith(".")):
                    if storable(name):
                        kept.append(name)
                    else:
                        skip(Path(top, name), "the folder name is not valid UTF-8 (rename it to index its files)", path)
                dirs[:] = kept
                for name in sorted(names):
                    file = Path(top, name)
                    if name.startswith("."):
                        continue
                    try:
                        mode = os.lstat(file).st_mode
                    except OSError:
                        continue  # vanished during the walk
                    if stat.S_ISLNK(mode):
                        continue
                    if not stat.S_ISREG(mode):
                        skip(file, _not_regular(mode), path)
                    elif not storable(name):
                        skip(file, "the file name is not valid UTF-8 (rename it to index it)", path)
                    else:
                        files.setdefault(file, None)
                        check_limit(path)
        elif stat.S_ISREG(mode):
            files.setdefault(path, None)
        else:
            skip(path, _not_regular(mode), path)
    return WalkResult(list(files), folders, skipped)


class Ingestor:
    """Indexes files into one knowledge base at a time.

    Args:
        registry: the document registry (source of truth).
        store: the vector store.
        embedder: the knowledge base's embedding model.
        parser: parses untrusted files in a killable child process.
        chunker: splits a parsed document into chunks.
        batch_seconds: target embedding time per committed batch.
        parse_timeout_s: time limit per document.
    """

    def __init__(
        self,
        registry: Registry,
        store: VectorStore,
        embedder: Embedder,
        parser: Parser,
        chunker: Chunker,
        *,
        batch_seconds: float = 1.5,
        parse_timeout_s: float = 60.0,
    ) -> None:
        self.registry = registry
        self.store = store
        self.embedder = embedder
        self.parser = parser
        self.chunker = chunker
        self.batch_seconds = batch_seconds
        self.parse_timeout_s = parse_timeout_s
        self._batch = MIN_BATCH
        self._per_chunk_s: float | None = None

    # ------------------------------------------------------------------ public

    def add(
        self,
        kb: KnowledgeBaseInfo,
        paths: Sequence[Path],
        *,
        progress: Callable[[IngestProgress], None] | None = None,
        cancel: threading.Event | None = None,
        pause: threading.Event | None = None,
    ) -> IngestReport:
        """Adds files and folders; re-adding a folder also drops its files that are gone (or are no
        longer regular files). Entries the walk leaves out with a reason (named pipes, sockets, device
        files, names that are not valid UTF-8) are counted as skipped and listed in the report's
        ``failures``; they are not registered.

        Raises:
            KnowledgeBaseError: a path does not exist, or the store fails.
        """
        files, folders, left_out = walk_files(paths)
        report = IngestReport()
        started = time.monotonic()
        report.skipped += len(left_out)
        report.failures.extend(left_out)
        self.reconcile(kb, report)
        gone = [
            d.id
            for folder in folders
            for d in self.registry.documents(kb.id, under=str(folder))
            if not Path(d.path).is_file()
        ]
        if gone:
            self._forget(kb, gone, report)
        self._run(kb, files, report, progress, cancel, pause, started)
        return report

    def refresh(
        self,
        kb: KnowledgeBaseInfo,
        *,
        progress: Callable[[IngestProgress], None] | None = None,
        cancel: threading.Event | None = None,
        pause: threading.Event | None = None,
    ) -> IngestReport:
        """Rescans every registered document: changed ones re-indexed, vanished ones removed,
        interrupted work finished."""
        report = IngestReport()
        started = time.monotonic()
        self.reconcile(kb, report)
        docs = self.registry.documents(kb.id)
        gone = [d.id for d in docs if not Path(d.path).is_file()]
        if gone:
            self._forget(kb, gone, report)
        gone_ids = set(gone)
        files = [Path(d.path) for d in docs if d.id not in gone_ids]
        self._run(kb, files, report, progress, cancel, pause, started)
        return report

    def remove(self, kb: KnowledgeBaseInfo, path: Path) -> int:
        """Forgets a file, or every file under a folder (the files themselves are untouched).

        Returns:
            How many documents were removed.

        Raises:
            KnowledgeBaseError: nothing registered matches ``path``.
        """
        target = os.path.abspath(path.expanduser())
        docs = self.registry.documents(kb.id, under=target) if storable(target) else []
        if not docs:
            raise KnowledgeBaseError(f"{display_path(path)}: not in knowledge base {kb.name}")
        self._forget(kb, [d.id for d in docs], IngestReport())
        return len(docs)

    def reconcile(self, kb: KnowledgeBaseInfo, report: IngestReport | None = None) -> int:
        """Makes Chroma agree with the registry (after a crash, a lost or rebuilt store).

        Vectors the registry does not know are deleted; chunks the registry marks as embedded
        but Chroma lacks are marked for embedding again (the next drain embeds them).

        Returns:
            How many chunks were marked for re-embedding.
        """
        self.store.ensure(kb.collection, dimension=kb.dimension, model_id=kb.embedder_id)
        expected = self.registry.embedded_ids(kb.id)
        if self.store.count(kb.collection) == len(expected):
            return 0
        present = self.store.ids(kb.collection)
        extra = sorted(present - expected)
        if extra:
            self.store.delete(kb.collection, extra)
        missing = expected - present
        if missing:
            self.registry.mark_unembedded(sorted(missing))
        if report is not None:
            report.repaired += len(missing)
        return len(missing)

    def drain(
        self,
        kb: KnowledgeBaseInfo,
        *,
        cancel: threading.Event | None = None,
        on_batch: Callable[[int], None] | None = None,
    ) -> int:
        """Embeds every stored chunk still missing from the store, batch by batch.

        Returns:
            How many chunks were embedded.
        """
        total = 0
        while not (cancel is not None and cancel.is_set()):
            done = self._embed_batch(kb)
            if not done:
                break
            total += done
            if on_batch is not None:
                on_batch(total)
        return total

    # ------------------------------------------------------------------ the pipeline

    def _forget(self, kb: KnowledgeBaseInfo, doc_ids: list[int], report: IngestReport) -> None:
        orphans = self.registry.remove_documents(doc_ids)
        if orphans:
            self.store.delete(kb.collection, orphans)
        report.removed += len(doc_ids)

    def _plan(self, kb: KnowledgeBaseInfo, files: list[Path], report: IngestReport) -> list[tuple[Path, int]]:
        """Splits files into unchanged ones (counted) and ones to process (queued in the registry).

        Unchanged means same size and mtime as recorded in a final state: no read, no hash.
        """
        known = {d.path: d for d in self.registry.documents(kb.id)}
        todo: list[tuple[Path, int]] = []
        queue: list[tuple[str, int, int]] = []
        for file in files:
            try:
                st = file.stat()
            except OSError:
                continue  # vanished between the walk and now; the next rescan removes it
            if not stat.S_ISREG(st.st_mode):  # replaced by a pipe or device since the walk: never open it
                report.skipped += 1
                report.failures.append((str(file), f"{DocState.SKIPPED}: {_not_regular(st.st_mode)}"))
                continue
            doc = known.get(str(file))
            if (
                doc is not None
                and doc.size == st.st_size
                and doc.mtime_ns == st.st_mtime_ns
                and (
                    doc.state in (DocState.INDEXED, DocState.SKIPPED, DocState.ERROR)
                    or (doc.state is DocState.INDEXING and doc.content_id is not None)
                )
            ):
                report.unchanged += 1
                continue
            todo.append((file, st.st_size))
            if (
                doc is None
                or doc.state is not DocState.QUEUED
                or doc.size != st.st_size
                or doc.mtime_ns != st.st_mtime_ns
            ):
                queue.append((str(file), st.st_size, st.st_mtime_ns))
        if queue:
            self.registry.queue(kb.id, queue)
        return todo

    def _run(
        self,
        kb: KnowledgeBaseInfo,
        files: list[Path],
        report: IngestReport,
        progress: Callable[[IngestProgress], None] | None,
        cancel: threading.Event | None,
        pause: threading.Event | None,
        started: float,
    ) -> None:
        def emit(done: int, current: str | None, state: str, eta: float | None = None) -> None:
            if progress is not None:
                progress(IngestProgress(done, len(files), report.chunks_added, current, eta, state))

        emit(0, None, "scanning")
        todo = self._plan(kb, files, report)
        total_bytes = sum(size for _, size in todo) or 1
        done_bytes = 0
        files_done = report.unchanged
        work_started = time.monotonic()
        for file, size in todo:
            if self._hold(cancel, pause, functools.partial(emit, files_done, None, "paused")):
                report.cancelled = True
                break
            emit(files_done, str(file), "indexing", _eta(work_started, done_bytes, total_bytes))
            counts = (report.indexed, report.unchanged, report.duplicates, len(report.failures))
            if not self._index_file(kb, file, report, cancel):
                report.cancelled = True
                break
            done_bytes += size
            files_done += 1
            if progress is not None:
                progress(IngestProgress(files_done, len(files), report.chunks_added, str(file),
                                        _eta(work_started, done_bytes, total_bytes), "indexing",
                                        finished_file=str(file), finished_as=_outcome(report, counts)))  # fmt: skip
            while self.registry.count_pending(kb.id) >= self._batch:
                if self._hold(cancel, pause, functools.partial(emit, files_done, None, "paused")):
                    break
                emit(files_done, str(file), "embedding", _eta(work_started, done_bytes, total_bytes))
                report.chunks_added += self._embed_batch(kb)
        if not report.cancelled:
            while True:
                if self._hold(cancel, pause, functools.partial(emit, files_done, None, "paused")):
                    report.cancelled = True
                    break
                emit(files_done, None, "embedding", None)
                added = self._embed_batch(kb)
                if not added:
                    break
                report.chunks_added += added
        report.seconds = time.monotonic() - started
        emit(files_done, None, "cancelled" if report.cancelled else "done", 0.0)

    @staticmethod
    def _hold(cancel: threading.Event | None, pause: threading.Event | None, on_pause: Callable[[], None]) -> bool:
        """Waits while paused; returns True when cancelled."""
        if pause is not None and pause.is_set():
            on_pause()
            while pause.is_set() and not (cancel is not None and cancel.is_set()):
                time.sleep(0.05)
        return cancel is not None and cancel.is_set()

    def _index_file(
        self, kb: KnowledgeBaseInfo, file: Path, report: IngestReport, cancel: threading.Event | None
    ) -> bool:
        """Indexes one queued file (chunks stored, embedding left to the drain).

        A file over the parser's size limit (``max_file_bytes``, where the parser has one) is
        skipped before it is hashed, so a huge file costs a ``stat``, not a read of every byte. A
        file whose size or mtime changed while it was hashed and parsed is done once more; if it
        changes again it is skipped (the next add sees the new mtime and indexes it), so its chunks
        never sit under the hash of other bytes.

        Returns:
            False when cancelled while parsing (the file stays queued), else True.
        """
        doc = self.registry.document(kb.id, str(file))
        if doc is None:  # removed concurrently
            return True
        limit = getattr(self.parser, "max_file_bytes", None)
        for _attempt in range(_CHANGED_TRIES):
            try:
                st = file.stat()
                if isinstance(limit, int) and st.st_size > limit:
                    check_size(file, limit)  # raises the parser's own "too large" reason
                sha = sha256_file(file)
            except OSError as exc:
                self._fail(kb, doc, DocState.ERROR, f"unreadable ({exc.strerror or exc})", report)
                return True
            except DocumentError as exc:  # too large, or swapped for a pipe or device since it was planned
                self._fail(kb, doc, DocState.SKIPPED, exc.reason.removeprefix("skipped:").strip(), report)
                return True
            if doc.sha256 == sha and doc.content_id is not None:
                self.registry.link_content(doc.id, doc.content_id, sha256=sha, size=st.st_size, mtime_ns=st.st_mtime_ns)
                report.unchanged += 1
                return True
            existing = self.registry.find_content(kb.id, sha)
            if existing is not None:
                self._delete_vectors(
                    kb,
                    self.registry.link_content(doc.id, existing, sha256=sha, size=st.st_size, mtime_ns=st.st_mtime_ns),
                )
                report.duplicates += 1
                return True
            try:
                parsed = self.parser.parse(file, timeout_s=self.parse_timeout_s, cancel=cancel)
                chunks = self.chunker(
                    parsed,
                    count_tokens=self.embedder.count_tokens,
                    max_tokens=kb.max_tokens,
                    overlap_tokens=kb.overlap_tokens,
                )
            except DocumentError as exc:
                if cancel is not None and cancel.is_set():
                    return False
                skipped = exc.reason.startswith("skipped")
                reason = exc.reason.removeprefix("skipped:").strip() if skipped else exc.reason
                self._fail(kb, doc, DocState.SKIPPED if skipped else DocState.ERROR, reason, report)
                return True
            if not _changed_since(file, st):
                break
        else:
            self._fail(kb, doc, DocState.SKIPPED, _CHANGING, report)
            return True
        chunks = [c for c in chunks if c.text.strip()]
        if not chunks:
            self._fail(kb, doc, DocState.SKIPPED, "no extractable text", report)
            return True
        self._delete_vectors(
            kb,
            self.registry.store_content(
                kb.id, doc.id, sha256=sha, size=st.st_size, mtime_ns=st.st_mtime_ns, chunks=chunks
            ),
        )
        report.indexed += 1
        return True

    def _fail(
        self, kb: KnowledgeBaseInfo, doc: DocumentRecord, state: DocState, reason: str, report: IngestReport
    ) -> None:
        self._delete_vectors(kb, self.registry.set_state(doc.id, state, reason))
        report.failures.append((doc.path, f"{state}: {reason}"))
        if state is DocState.SKIPPED:
            report.skipped += 1
        else:
            report.errors += 1

    def _delete_vectors(self, kb: KnowledgeBaseInfo, ids: list[int]) -> None:
        if ids:
            self.store.delete(kb.collection, ids)

    def _embed_batch(self, kb: KnowledgeBaseInfo) -> int:
        """Embeds and stores one time-boxed batch of pending chunks, then commits it."""
        pending = self.registry.pending_chunks(kb.id, self._batch)
        if not pending:
            return 0
        t0 = time.monotonic()
        vectors = self.embedder.encode([text for _, text in pending])
        ids = [chunk_id for chunk_id, _ in pending]
        if self.store.local:
            self.store.upsert(kb.collection, ids, vectors)
        else:  # on a server the texts and their places go with the vectors: other homes search them
            records = self.registry.chunks(ids)
            self.store.upsert(
                kb.collection,
                ids,
                vectors,
                documents=[text for _, text in pending],
                metadatas=[_shared_metadata(records.get(chunk_id)) for chunk_id in ids],
            )
        self.registry.mark_embedded(ids)
        self._tune(time.monotonic() - t0, len(pending))
        return len(pending)

    def _tune(self, seconds: float, n: int) -> None:
        """Sizes the next batch so that it takes about ``batch_seconds``."""
        per_chunk = seconds / max(n, 1)
        self._per_chunk_s = per_chunk if self._per_chunk_s is None else 0.5 * (self._per_chunk_s + per_chunk)
        self._batch = int(min(512, max(MIN_BATCH, self.batch_seconds / max(self._per_chunk_s, 1e-4))))


def _shared_metadata(record: ChunkRecord | None) -> dict[str, str | int]:
    """What a chunk on a server records about where it comes from (Chroma takes no None values)."""
    if record is None:
        return {"index": 0}
    meta: dict[str, str | int] = {"path": record.path, "index": record.index, "start": record.start, "end": record.end}
    if record.page is not None:
        meta["page"] = record.page
    if record.heading:
        meta["heading"] = record.heading
    return meta


def _changed_since(file: Path, before: os.stat_result) -> bool:
    """Whether ``file`` is no longer the file ``before`` described (other size or mtime, or gone)."""
    try:
        now = file.stat()
    except OSError:
        return True
    return (now.st_size, now.st_mtime_ns) != (before.st_size, before.st_mtime_ns)


def _outcome(report: IngestReport, before: tuple[int, int, int, int]) -> str:
    """What became of the one file read since ``before`` (the report's counts then)."""
    indexed, unchanged, duplicates, failures = before
    if len(report.failures) > failures:
        return report.failures[-1][1]
    if report.indexed > indexed:
        return "indexed"
    if report.duplicates > duplicates:
        return "duplicate"
    if report.unchanged > unchanged:
        return "unchanged"
    return "indexed"


def _eta(started: float, done: int, total: int) -> float | None:
    if done <= 0:
        return None
    elapsed = time.monotonic() - started
    return max(0.0, elapsed * (total - done) / done)
