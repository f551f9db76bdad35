"""Where the two halves meet: knowledge-base passages (rag) become the documents of a chat turn
(engine). This is the only place that knows both; engine and rag never import each other.

rag retrieves the passages ranked and cited, not fitted (``rag.knowledge.retrieve_passages``); the
backend's documents band fits them (``ChatBackend.stream(documents=...)``: the best-ranked that fit
its window, the Stats say how many it kept and dropped). :class:`Passages` is what a turn is given:
the passages and the source of each, best first; :func:`kept_sources` are the sources of those the
band kept.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.paths import Paths

if TYPE_CHECKING:
    from engine.inference.context import RankedDocuments
    from engine.inference.events import Stats
    from rag.knowledge import Searcher

CHAT_PASSAGES = 6
"""Passages retrieved for a chat turn, best first, before the documents band fits them."""

SEARCH_KNOWLEDGE = "search_knowledge"
"""The built-in tool through which the model searches the knowledge bases itself when it decides
to (``app.tool_setup.KnowledgeSearchTool``), instead of passages retrieved for every message."""


@dataclass(frozen=True)
class Passages:
    """A turn's retrieved passages, not fitted.

    Attributes:
        documents: the passages, best first (``rag.citations.CitedPassages``): the backend fits them.
        sources: one plain dict per passage (n, path, page, snippet, score, heading), best first,
            ready for JSON and history.
    """

    documents: RankedDocuments
    sources: tuple[dict[str, Any], ...]


def kept_sources(passages: Passages | None, stats: Stats) -> list[dict[str, Any]]:
    """The sources of the passages the documents band kept (the best ``stats.documents_kept``)."""
    return list(passages.sources[: stats.documents_kept]) if passages is not None else []


Retriever = Callable[[str], "Passages | None"]
"""``query -> Passages`` (None when nothing matched)."""


def retrieve(searcher: Searcher, names: Sequence[str], query: str) -> Passages | None:
    """Up to :data:`CHAT_PASSAGES` passages for ``query`` from ``names``, cited, best first (None
    when nothing matched). ``searcher`` is an open ``KnowledgeBases``, or anything with its
    ``query_many`` (the app's knowledge process)."""
    # lazy: start-up (+209 ms: numpy)
    from rag.knowledge import retrieve_passages

    cited = retrieve_passages(searcher, names, query, k=CHAT_PASSAGES)
    if not cited.count:
        return None
    return Passages(cited, tuple(asdict(source) for source in cited.sources))


def documents_retriever(searcher: Searcher, names: Sequence[str]) -> Retriever:
    """The retriever of the in-process front ends (``glassbox chat --kb``, ``glassbox serve``):
    ``fn(query) -> Passages | None`` over ``names`` (:func:`retrieve`). The window retrieves on its
    knowledge thread instead (``app.gui.workers.knowledge_chat.ChatRetriever``)."""
    chosen = list(names)
    return lambda query: retrieve(searcher, chosen, query)


def open_knowledge_bases(
    paths: Paths,
    embedder_path: Path | None = None,
    chroma_url: str | None = None,
    *,
    report: Callable[[str], None] | None = None,
) -> Any:
    """Opens this profile's ``rag.knowledge.KnowledgeBases`` (it holds the knowledge folder's lock:
    one per process). A damaged index found on opening was moved aside and is being rebuilt;
    ``report`` is told so in one line (default: stderr, for the command line)."""
    # lazy: start-up (+187 ms: numpy)
    from rag.knowledge import KnowledgeBases

    kbs = KnowledgeBases(paths.knowledge, embedder_path=embedder_path, chroma_url=chroma_url)
    if kbs.recovered is not None:
        line = (
            f"the document index was damaged ({kbs.recovered.reason}); "
            f"it was moved to {kbs.recovered.moved_to} and is being rebuilt"
        )
        if report is None:
            sys.stderr.write(f"glassbox: {line}\n")
        else:
            report(line)
    return kbs


def make_retriever(
    paths: Paths,
    names: Sequence[str],
    chroma_url: str | None = None,
    embedder_path: Path | None = None,
    *,
    kbs: Any = None,
) -> Retriever:
    """:func:`documents_retriever` over ``names`` in this profile's knowledge bases.

    Pass ``kbs`` (a ``rag.knowledge.KnowledgeBases``) to share one already open: it holds the
    knowledge folder's lock, so a process opens it once; else one is opened here
    (:func:`open_knowledge_bases`).

    Chunks of ``names`` still waiting for their embedding (a damaged index that was moved aside,
    an interrupted run) are embedded first, so that answers use the whole index. A name may be
    another Glassbox home's knowledge base on the Chroma server (searched by meaning only).
    """
    if kbs is None:
        kbs = open_knowledge_bases(paths, embedder_path, chroma_url)
    # Fail early, with the KB's own message, for an unknown name. Another Glassbox home's knowledge
    # base on the Chroma server is searched there; only this home's own can have chunks waiting.
    own = kbs.searchable(list(names))
    if own and kbs.pending(own):
        kbs.rebuild(own)
    return documents_retriever(kbs, names)
