"""The tools of a chat turn on the LLM worker: what a turn with tools asks for, and its open ToolSet.

* :class:`ToolsRequest` is what a turn with tools carries (the sources chosen in the chat's Tools
  switch, the tool choice, the limits). Without one a turn is a plain generation.
* :class:`ToolsetCache` keeps the worker's open ToolSet between turns (an MCP server is not
  restarted for each one) and opens it again when the sources, the session, ``mcp.json`` or the
  permissions change; :func:`default_open_tools` opens one (``app.tool_setup.open_tools``).

The loop itself is the app's one turn (``app.turn``); the approvals are :mod:`app.gui.workers.agent_turn`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.paths import Paths
    from app.tool_setup import ToolSet
    from engine.inference.backends import ChatBackend
    from rag.knowledge import Searcher

ToolsetKey = tuple[object, ...]
"""What a ToolSet was opened for: the sources, the session, the opener and the config files' stamps."""


@dataclass(frozen=True)
class ToolsRequest:
    """A turn that may call tools.

    Args:
        selection: the sources: ``builtin`` and MCP server names (``app.tool_setup.open_tools``).
        paths: the data folders (``mcp.json``, the permissions).
        tool_choice: ``auto`` (None), ``required``, ``none`` or a function name.
        max_steps: rounds of calls before the model must answer without tools.
        timeout_s: the longest one call may run.
        open_tools: builds the ToolSet for ``(request, session)``; tests inject fakes.
        knowledge_bases: the chat's attached knowledge bases: with the built-in tools, the model
            gets ``search_knowledge`` over them (and decides when to retrieve).
        searcher: what ``search_knowledge`` asks (the knowledge process's service; it blocks, so
            it is called on the LLM thread, where the loop runs).
    """

    selection: tuple[str, ...]
    paths: Paths
    tool_choice: str | None = None
    max_steps: int = 8
    timeout_s: float = 60.0
    open_tools: Callable[[ToolsRequest, ChatBackend], ToolSet] | None = field(default=None, compare=False)
    knowledge_bases: tuple[str, ...] = ()
    searcher: Searcher | None = field(default=None, compare=False)


def default_open_tools(request: ToolsRequest, session: ChatBackend) -> ToolSet:
    """The ToolSet for the sources chosen (``app.tool_setup.open_tools``; servers start when listed)."""
    # lazy: start-up (+58 ms)
    from app.tool_setup import open_tools

    return open_tools(
        list(request.selection),
        request.paths,
        count_text=session.count_text,
        knowledge_bases=request.knowledge_bases,
        searcher=request.searcher,
    )


class ToolsetCache:
    """The worker's open ToolSet, kept between turns (an MCP server is not restarted for each one),
    opened again when the sources, the session, ``mcp.json`` or the permissions change."""

    def __init__(self) -> None:
        self._key: ToolsetKey | None = None
        self._toolset: ToolSet | None = None

    def get(self, request: ToolsRequest, session: ChatBackend) -> ToolSet:
        key = (
            request.selection,
            request.knowledge_bases,
            id(request.searcher),
            id(session),
            request.open_tools,
            *_config_stamp(request.paths),
        )
        if key != self._key or self._toolset is None:
            self.close()
            opener = request.open_tools or default_open_tools
            self._toolset = opener(request, session)
            self._key = key
        return self._toolset

    def close(self) -> None:
        toolset, self._toolset, self._key = self._toolset, None, None
        if toolset is not None:
            toolset.close()


def _config_stamp(paths: Paths) -> tuple[tuple[int, int] | None, ...]:
    stamps: list[tuple[int, int] | None] = []
    for name in ("mcp_config", "tool_permissions"):
        path = getattr(paths, name, None)
        try:
            stat = os.stat(path) if path is not None else None
        except OSError:
            stat = None
        stamps.append((stat.st_mtime_ns, stat.st_size) if stat is not None else None)
    return tuple(stamps)
