"""Where the two halves meet: knowledge-base passages (rag) become the documents part of a chat
turn (engine). This is the only place that knows both; engine and rag never import each other.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from app.paths import Paths

#: The share of the context window that retrieved passages may take.
DOCUMENTS_SHARE = 0.35


class _Counting(Protocol):
    """What the glue needs from a chat session (local or remote)."""

    def count_text(self, text: str) -> int: ...

    @property
    def info(self) -> Any: ...


Retriever = Callable[[str, _Counting], tuple[str | None, list[dict[str, Any]]]]


def documents_budget(n_ctx: int) -> int:
    """Tokens the documents block may take in a window of ``n_ctx`` tokens."""
    return max(64, int(n_ctx * DOCUMENTS_SHARE))


def documents_retriever(searcher: Any, names: Sequence[str]) -> Retriever:
    """The retriever of the in-process front ends (``glassbox chat --kb``, ``glassbox serve``):
    ``fn(query, session) -> (documents block or None, sources)``.

    ``searcher`` is what ``rag.knowledge.retrieve_context`` searches: an open ``KnowledgeBases``, or
    anything with its ``query_many`` (the app's knowledge process, ``rag.knowledge.Searcher``). The
    window retrieves on its knowledge thread instead (``app.gui.workers.knowledge_worker.ChatRetriever``:
    passages that the engine's documents band fits). The block is fitted to :func:`documents_budget`
    of the session's window (4096 when it does not say: a remote server may not) with the
    session's own token counter, so it runs where the session's tokenizer lives. Sources are plain
    dicts (n, path, page, snippet, score, heading), ready for JSON and history.
    """
    chosen = list(names)

    def retrieve(query: str, session: _Counting) -> tuple[str | None, list[dict[str, Any]]]:
        from rag.knowledge import retrieve_context

        n_ctx = getattr(getattr(session, "info", None), "n_ctx", None) or 4096
        block = retrieve_context(searcher, chosen, query, documents_budget(n_ctx), session.count_text)
        if not block.sources:
            return None, []
        return block.text, [asdict(source) for source in block.sources]

    return retrieve


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
