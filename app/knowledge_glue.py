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


def make_retriever(
    paths: Paths,
    names: Sequence[str],
    chroma_url: str | None = None,
    embedder_path: Path | None = None,
    *,
    kbs: Any = None,
) -> Retriever:
    """Returns ``fn(query, session) -> (documents_block_or_None, sources)`` over ``names``.

    Sources are plain dicts (n, path, page, snippet, score, heading), ready for JSON and history.
    Pass ``kbs`` (a ``rag.knowledge.KnowledgeBases``) to share one already open: it holds the
    knowledge folder's lock, so a process opens it once.

    Chunks of ``names`` still waiting for their embedding (a damaged index that was moved aside,
    an interrupted run) are embedded first, so that answers use the whole index. A name may be
    another Glassbox home's knowledge base on the Chroma server (searched by meaning only).
    """
    from rag.knowledge import KnowledgeBases, retrieve_context

    if kbs is None:
        kbs = KnowledgeBases(paths.knowledge, embedder_path=embedder_path, chroma_url=chroma_url)
        if kbs.recovered is not None:
            sys.stderr.write(
                f"glassbox: the document index was damaged ({kbs.recovered.reason}); "
                f"it was moved to {kbs.recovered.moved_to} and is being rebuilt\n"
            )
    # Fail early, with the KB's own message, for an unknown name. Another Glassbox home's knowledge
    # base on the Chroma server is searched there; only this home's own can have chunks waiting.
    own = kbs.searchable(list(names))
    if own and kbs.pending(own):
        kbs.rebuild(own)

    def retrieve(query: str, session: _Counting) -> tuple[str | None, list[dict[str, Any]]]:
        n_ctx = getattr(session.info, "n_ctx", None) or 4096  # a remote server may not say
        block = retrieve_context(kbs, list(names), query, documents_budget(n_ctx), session.count_text)
        if not block.sources:
            return None, []
        return block.text, [asdict(source) for source in block.sources]

    return retrieve
