"""Where the two halves meet: knowledge-base passages (rag) become the documents part of a chat
turn (engine). This is the only place that knows both; engine and rag never import each other.

Every front end fits a turn's passages the same way: rag retrieves them ranked and cited, not
fitted (``rag.knowledge.retrieve_passages``), and the engine's documents band
(``engine.inference.context.fit_documents``) keeps the best-ranked that fit the session's window,
dropping the lowest-ranked rather than refusing; :func:`fit_passages` is that one call, and
:class:`Retrieval` says what was kept and how many were dropped.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from app.paths import Paths

if TYPE_CHECKING:
    from engine.inference.context import DocumentsFit, RankedDocuments
    from rag.knowledge import Searcher

CHAT_PASSAGES = 6
"""Passages retrieved for a chat turn, best first, before the documents band fits them."""

DEFAULT_N_CTX = 4096
"""The window the documents band assumes for a session that does not say (a remote server may not)."""


class _Counting(Protocol):
    """What the glue needs from a chat session (local or remote): its window and its counter."""

    @property
    def n_ctx(self) -> int: ...

    def count_text(self, text: str) -> int: ...


class Retrieval(NamedTuple):
    """A turn's documents after the documents band fitted them.

    Attributes:
        documents: the documents block to pin after the system prompt (None when nothing was kept).
        sources: one plain dict per passage kept (n, path, page, snippet, score, heading), best
            first, ready for JSON and history.
        dropped: how many of the lowest-ranked passages found did not fit and were left out.
    """

    documents: str | None
    sources: list[dict[str, Any]]
    dropped: int


Retriever = Callable[[str, _Counting], Retrieval]


def session_n_ctx(session: _Counting) -> int:
    """The context window ``session`` reports, else :data:`DEFAULT_N_CTX`."""
    return session.n_ctx or DEFAULT_N_CTX


def fit_passages(passages: RankedDocuments, session: _Counting) -> DocumentsFit:
    """The engine's documents band over ``passages`` (best first), with ``session``'s window and its
    own token counter: the one call every front end makes (it runs where the tokenizer lives).

    Raises:
        Exception: what ``session.count_text`` raises (a remote server's tokenizer may fail).
    """
    from engine.inference.context import fit_documents

    return fit_documents(passages, session_n_ctx(session), session.count_text)


def documents_retriever(searcher: Searcher, names: Sequence[str]) -> Retriever:
    """The retriever of the in-process front ends (``glassbox chat --kb``, ``glassbox serve``):
    ``fn(query, session) -> Retrieval``.

    ``searcher`` is an open ``KnowledgeBases``, or anything with its ``query_many`` (the app's
    knowledge process, ``rag.knowledge.Searcher``). The window retrieves on its knowledge thread
    instead (``app.gui.workers.knowledge_chat.ChatRetriever``) and its LLM worker fits the
    passages with the same band. Up to :data:`CHAT_PASSAGES` are retrieved and fitted by
    :func:`fit_passages`; the sources are those of the passages kept.
    """
    chosen = list(names)

    def retrieve(query: str, session: _Counting) -> Retrieval:
        from rag.knowledge import retrieve_passages

        cited = retrieve_passages(searcher, chosen, query, k=CHAT_PASSAGES)
        if not cited.count:
            return Retrieval(None, [], 0)
        fit = fit_passages(cited, session)
        return Retrieval(fit.text, [asdict(source) for source in cited.sources[: fit.kept]], fit.dropped)

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
