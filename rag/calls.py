"""The knowledge calls, typed: one method per call a client makes of a ``rag.service.Service`` (the
knowledge process, or the same calls in this process), with the arguments and the result of the
``rag.knowledge.KnowledgeBases`` method it runs. ARCHITECTURE.md describes the knowledge process.

The service carries a call as its name and its arguments (``Service.call``); this is the one place
that names them, so a caller's arguments and the results it reads are checked by mypy.
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from rag.ingest import IngestReport
    from rag.knowledge import KnowledgeBaseSummary
    from rag.registry import DocumentRecord, KnowledgeBaseInfo
    from rag.retrieval import Passage
    from rag.service import Service
    from rag.store_health import StoreRecovery

Progress = Callable[[Any], None]
"""Told each ``rag.ingest.IngestProgress`` of a job."""


class KnowledgeCalls:
    """The calls of ``service``, typed (each blocks: call them from a worker thread).

    Args:
        service: the knowledge process (``rag.service.KnowledgeService``) or ``LocalService``.
    """

    def __init__(self, service: Service) -> None:
        self.service = service

    # ---------------------------------------------------------------- reads
    def list(self) -> list[KnowledgeBaseSummary]:
        """Every knowledge base of this home, with its counts."""
        return cast("builtins.list[KnowledgeBaseSummary]", self.service.call("list"))

    def get(self, name: str) -> KnowledgeBaseInfo:
        """The knowledge base called ``name`` (``KnowledgeBaseError`` when there is none)."""
        return cast("KnowledgeBaseInfo", self.service.call("get", name))

    def documents(self, name: str) -> builtins.list[DocumentRecord]:
        """The documents of ``name``."""
        return cast("builtins.list[DocumentRecord]", self.service.call("documents", name))

    def foreign(self) -> builtins.list[str]:
        """Other homes' knowledge bases on the Chroma server."""
        return builtins.list(self.service.call("foreign"))

    def searchable(self, names: Sequence[str]) -> builtins.list[str]:
        """The names that are this home's own (raises for one that cannot be searched)."""
        return builtins.list(self.service.call("searchable", list(names)))

    def pending(self, names: Sequence[str] | None = None) -> int:
        """How many stored chunks of ``names`` (None: all) wait for their embedding."""
        return int(self.service.call("pending", None if names is None else list(names)))

    def status(self) -> tuple[StoreRecovery | None, int]:
        """The damaged store replaced when the knowledge bases opened (None: none was), and the
        chunks waiting for their embedding."""
        recovered, pending = self.service.call("status")
        return cast("StoreRecovery | None", recovered), int(pending)

    def query_many(self, names: Sequence[str], text: str, *, k: int = 5) -> builtins.list[Passage]:
        """The passages of ``names`` nearest ``text``, best first (a ``rag.knowledge.Searcher``)."""
        return builtins.list(self.service.call("query_many", list(names), text, k=k))

    # ---------------------------------------------------------------- writes
    def create(self, name: str) -> KnowledgeBaseInfo:
        """A new empty knowledge base called ``name`` (``KnowledgeBaseError`` when it exists)."""
        return cast("KnowledgeBaseInfo", self.service.call("create", name))

    def create_unique(self, base: str) -> KnowledgeBaseInfo:
        """A new empty knowledge base called ``base``, or ``base 2``, ... whichever is free."""
        return cast("KnowledgeBaseInfo", self.service.call("create_unique", base))

    def ensure(self, name: str) -> KnowledgeBaseInfo:
        """``name``, created unless it exists."""
        return cast("KnowledgeBaseInfo", self.service.call("ensure", name))

    def drop(self, name: str) -> None:
        """Deletes ``name`` with its documents and vectors."""
        self.service.call("drop", name)

    def remove(self, name: str, path: Path) -> int:
        """Takes ``path`` out of ``name``; the chunks removed."""
        return int(self.service.call("remove", name, path))

    # ---------------------------------------------------------------- jobs (progress, cancel, pause)
    def add(
        self,
        name: str,
        paths: Sequence[Path],
        *,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
        pause: threading.Event | None = None,
    ) -> IngestReport:
        """Adds ``paths`` (files or folders) to ``name``."""
        report = self.service.call("add", name, list(paths), progress=progress, cancel=cancel, pause=pause)
        return cast("IngestReport", report)

    def reindex(
        self,
        name: str,
        *,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
        pause: threading.Event | None = None,
    ) -> IngestReport:
        """Embeds every document of ``name`` again."""
        return cast("IngestReport", self.service.call("reindex", name, progress=progress, cancel=cancel, pause=pause))

    def rebuild(
        self,
        names: Sequence[str] | None = None,
        *,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
        pause: threading.Event | None = None,
    ) -> IngestReport:
        """Embeds the chunks of ``names`` (None: all) still waiting."""
        chosen = None if names is None else list(names)
        return cast("IngestReport", self.service.call("rebuild", chosen, progress=progress, cancel=cancel, pause=pause))
