"""What a chat searches in the knowledge bases: :class:`ChatSearcher` and :class:`ChatRetriever`.

* :class:`ChatSearcher` is the knowledge service as a chat searches it (a turn's documents block
  and the model's ``search_knowledge``): a knowledge base the chat still names but that was
  deleted is skipped and reported, never an error on every turn.
* :class:`ChatRetriever` is a chat turn's retrieval, run on the ``glassbox-kb-query`` thread
  before the request reaches the LLM worker; the cited passages come back on the GUI thread, not
  fitted (the engine's documents band fits them with the chat model's token counter).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from app import knowledge_glue
from app.gui.workers.chat_retrieval import Retrieved
from rag.calls import KnowledgeCalls

if TYPE_CHECKING:
    from app.gui.workers.knowledge_queries import KnowledgeQueries
    from rag.retrieval import Passage
    from rag.service import Service


class ChatSearcher:
    """The knowledge service as a chat searches it (the documents block and ``search_knowledge``):
    a knowledge base the chat still names but that was deleted is skipped, never an error on every
    turn. Runs on the knowledge query thread (a turn's passages) or the LLM thread (the model's
    ``search_knowledge``): the service's calls block.

    Args:
        service: returns the knowledge service (a ``rag.knowledge.Searcher`` with ``call``).
        on_missing: told the names skipped (from the calling thread).
    """

    def __init__(self, service: Callable[[], Service], on_missing: Callable[[list[str]], None]) -> None:
        self._service = service
        self._on_missing = on_missing

    def query_many(self, names: Sequence[str], text: str, *, k: int = 5) -> list[Passage]:
        """``query_many`` over the names that exist (the others are reported to ``on_missing``).

        Raises:
            RagError: what the search raises for another reason than a missing knowledge base.
        """
        # lazy: start-up (+2 ms)
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
    def _missing(service: Service, names: Sequence[str]) -> list[str]:
        """The names that are neither this home's knowledge bases nor another's on the Chroma server."""
        # lazy: start-up (+2 ms)
        from rag.errors import KnowledgeBaseError

        gone = []
        for name in names:
            try:
                KnowledgeCalls(service).get(name)
            except KnowledgeBaseError:
                gone.append(name)
        if gone:
            try:
                foreign = set(KnowledgeCalls(service).foreign())
            except KnowledgeBaseError:
                foreign = set()
            gone = [name for name in gone if name not in foreign]
        return gone


class ChatRetriever:
    """A chat turn's retrieval over some knowledge bases, on the knowledge adapter's query thread.

    Args:
        adapter: the knowledge adapter (its query thread and its ``chat_searcher``).
        names: the knowledge bases the chat has attached.
    """

    def __init__(self, adapter: KnowledgeQueries, names: Sequence[str]) -> None:
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
            if skip is not None and skip():
                return Retrieved(None, skipped=True)
            return Retrieved(knowledge_glue.retrieve(adapter.chat_searcher, names, query))

        if adapter.closed:
            on_error(RuntimeError("the knowledge bases are closed"))
            return
        adapter.submit_query(work, on_done, on_error)
