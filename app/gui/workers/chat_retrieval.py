"""A chat turn's passages: asked of the knowledge worker before the request reaches the LLM worker.

The knowledge adapter searches on its query thread (``KnowledgeAdapter.chat_retriever``) and hands
back a :class:`Retrieved` snapshot on the GUI thread; the turn then submits its request with the
passages as data, and the engine's documents band fits them (``engine.inference.context``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from app.knowledge_glue import SEARCH_KNOWLEDGE

if TYPE_CHECKING:
    from app.gui.workers.agent_tools import ToolsRequest
    from app.knowledge_glue import Passages


@dataclass(frozen=True)
class Retrieved:
    """What a turn's retrieval found (made on the knowledge thread, read on the GUI thread).

    Attributes:
        passages: the passages, cited, best first, not fitted, and their sources (None when
            nothing matched).
        skipped: nothing was searched: the model searches the knowledge bases itself.
    """

    passages: Passages | None
    skipped: bool = False


class PassageRetriever(Protocol):
    """A chat's retrieval over its knowledge bases (``knowledge_chat.ChatRetriever``)."""

    def retrieve(
        self,
        query: str,
        on_done: Callable[[Retrieved], None],
        on_error: Callable[[BaseException], None],
        *,
        skip: Callable[[], bool] | None = None,
    ) -> None:
        """Searches off the GUI thread; one of the callbacks runs on the GUI thread."""
        ...


RetrieverFactory = Callable[[tuple[str, ...]], PassageRetriever]
"""``kb_names -> retriever``: what the adapter asks for a turn's passages."""


def model_searches(tools: ToolsRequest | None) -> Callable[[], bool] | None:
    """For a turn with tools, whether the model gets ``search_knowledge`` (it then retrieves when it
    decides to, and the turn adds no passages up front). The check reads the tool permissions, so
    it is returned as a function for the knowledge thread; None when it cannot be offered."""
    if tools is None or not tools.knowledge_bases:
        return None

    def searches() -> bool:
        # app.tool_config imports the MCP client: it loads with a turn with tools, not with the window.
        # lazy: start-up (+49 ms)
        from app.tool_config import BUILTIN, Permissions, ToolSetupError

        try:
            return not Permissions.load(tools.paths).is_off(BUILTIN, SEARCH_KNOWLEDGE)
        except (ToolSetupError, OSError):  # a damaged permissions file fails the turn's tools, not this
            return True

    return searches
