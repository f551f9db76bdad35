"""The tools a chat may use: :func:`open_tools` turns a ``--tools NAME[,NAME...]|builtin|all``
selection into one :class:`ToolSet` provider (the built-ins, the knowledge-base search, the MCP
servers of ``mcp.json``), with the user's permissions applied.

The configuration (``mcp.json``, ``tool_permissions.json``) is ``app.tool_config``; its public
names are re-exported here, so callers need one import.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from app.knowledge_glue import SEARCH_KNOWLEDGE
from app.paths import Paths
from app.tool_config import (
    BUILTIN,
    Permissions,
    ToolSetupError,
    load_servers,
    unknown_server_message,
)
from engine.agent.builtin_tools import BUILTIN_NAMES, BuiltinTools
from engine.agent.mcp_client import McpServer, McpServerError
from engine.errors import EngineError
from engine.inference.tool_schema import schema_problem
from engine.inference.tools import ToolResult, ToolSpec

if TYPE_CHECKING:
    from engine.inference.tools import ToolProvider
    from rag.knowledge import KnowledgeBases, Searcher

__all__ = [
    "ALL_BUILTINS",
    "SEARCH_KNOWLEDGE",
    "KnowledgeSearchTool",
    "ToolSet",
    "open_tools",
    "parse_selection",
]

#: Every built-in tool, including the knowledge search (offered when knowledge bases are attached).
ALL_BUILTINS = (*BUILTIN_NAMES, SEARCH_KNOWLEDGE)
#: Tokens one knowledge search may return to the model.
SEARCH_BUDGET_TOKENS = 1500


# ---------------------------------------------------------------------- knowledge search


class KnowledgeSearchTool:
    """``search_knowledge``: the model searches the attached knowledge bases when it decides to.

    Uses rag's public retrieval (``rag.knowledge.retrieve_context``), fitted to the tool result's own
    budget: a tool result is its own band of the window, not the documents band that passages
    attached to a turn go through (``ChatBackend.stream(documents=...)``). The knowledge bases
    are opened on the first search (Chroma and the embedder are heavy), unless a ``searcher`` is
    given.

    Args:
        paths: where the knowledge folder is.
        names: the knowledge bases to search.
        searcher: an open ``KnowledgeBases`` (or anything with its ``query_many``) to share.
        count_text: the chat model's token counter (default: about four characters a token).
        budget_tokens: the most tokens one result may take.
        embedder_path: the embedding model for knowledge bases opened here.
        chroma_url: a Chroma server, when the vectors live there.
    """

    def __init__(
        self,
        paths: Paths,
        names: Sequence[str],
        *,
        searcher: Searcher | None = None,
        count_text: Callable[[str], int] | None = None,
        budget_tokens: int = SEARCH_BUDGET_TOKENS,
        embedder_path: Path | None = None,
        chroma_url: str | None = None,
    ) -> None:
        self._paths = paths
        self._names = list(names)
        self._searcher = searcher
        self._owned: KnowledgeBases | None = None  # opened here, on the first search: closed here
        self._count = count_text or (lambda text: max(1, len(text) // 4))
        self._budget = budget_tokens
        self._embedder_path = embedder_path
        self._chroma_url = chroma_url
        self._lock = threading.Lock()
        # The sources of every search, in order: the chat shows and saves them like retrieved ones.
        self.sources: list[dict[str, object]] = []

    def tools(self) -> list[ToolSpec]:
        names = ", ".join(self._names)
        return [
            ToolSpec(
                SEARCH_KNOWLEDGE,
                f"Searches the user's documents (knowledge bases: {names}) and returns the most relevant "
                "passages, numbered for citation as [n].",
                {
                    "type": "object",
                    "properties": {"query": {"type": "string", "description": "what to look for, in plain words"}},
                    "required": ["query"],
                },
                source=BUILTIN,
            )
        ]

    def call(
        self, name: str, arguments: Mapping[str, object], *, timeout_s: float, cancel: threading.Event | None = None
    ) -> ToolResult:
        """Searches; every failure is an error result with one line."""
        del timeout_s  # the search runs in this thread and is bounded by its own k
        if name != SEARCH_KNOWLEDGE:
            return ToolResult(f"there is no built-in tool {name!r}", is_error=True)
        query = arguments.get("query") if isinstance(arguments, dict) else None
        if not isinstance(query, str) or not query.strip():
            return ToolResult("search_knowledge: query must be a non-empty string", is_error=True)
        if cancel is not None and cancel.is_set():
            return ToolResult("the call to search_knowledge was cancelled", is_error=True)
        # lazy: start-up (+231 ms: numpy)
        from rag.errors import RagError
        from rag.knowledge import retrieve_context

        try:
            with self._lock:
                searcher = self._open()
                block = retrieve_context(searcher, self._names, query, self._budget, self._count)
        except (RagError, EngineError, OSError) as exc:
            return ToolResult(f"search_knowledge: {exc}", is_error=True)
        if not block.sources:
            return ToolResult(f"search_knowledge: nothing in {', '.join(self._names)} matches {query!r}")

        self.sources.extend(asdict(source) for source in block.sources)
        return ToolResult(block.text)

    def _open(self) -> Searcher:
        if self._searcher is None:
            # lazy: start-up (+194 ms: numpy)
            from rag.knowledge import KnowledgeBases

            kbs = KnowledgeBases(self._paths.knowledge, embedder_path=self._embedder_path, chroma_url=self._chroma_url)
            try:
                for name in self._names:
                    kbs.get(name)
                if kbs.pending(self._names):
                    kbs.rebuild(self._names)
            except BaseException:
                kbs.close()
                raise
            self._searcher = self._owned = kbs
        return self._searcher

    def close(self) -> None:
        with self._lock:
            owned, self._owned, self._searcher = self._owned, None, None
        if owned is not None:
            owned.close()


# ---------------------------------------------------------------------- the selection


class ToolSet:
    """The providers of one chat as one provider: tools merged, calls routed by name, one close.

    Tools turned off in the permissions are not offered. A server that cannot list its tools is
    left out of :meth:`tools` with its one-line reason in :attr:`problems` (the chat goes on);
    :meth:`start` is the strict form, for a selection the user typed.

    Args:
        providers: the providers, in order (a later tool of a name already taken is left out,
            with a problem recorded).
        permissions: what is turned off and what is always allowed.
    """

    def __init__(self, providers: Sequence[ToolProvider], permissions: Permissions) -> None:
        self.providers = list(providers)
        self.permissions = permissions
        self.problems: list[str] = []
        self._routes: dict[str, ToolProvider] = {}
        self._specs: list[ToolSpec] | None = None
        self._lock = threading.Lock()

    @property
    def servers(self) -> list[McpServer]:
        """The MCP servers among the providers (for status)."""
        return [provider for provider in self.providers if isinstance(provider, McpServer)]

    def start(self) -> None:
        """Starts every MCP server now and lists its tools.

        Raises:
            McpServerError: the first server that does not start (one line).
        """
        for server in self.servers:
            server.start()

    def tools(self) -> list[ToolSpec]:
        """Every tool offered, built-ins first (listed once; :meth:`refresh` lists again)."""
        with self._lock:
            if self._specs is None:
                self._specs = self._collect()
            return list(self._specs)

    def refresh(self) -> None:
        """Forgets the listing (a server was restarted, or a tool turned on or off)."""
        with self._lock:
            self._specs = None

    def _collect(self) -> list[ToolSpec]:
        specs: list[ToolSpec] = []
        self._routes = {}
        self.problems = []
        for provider in self.providers:
            try:
                offered = provider.tools()
            except McpServerError as exc:
                self.problems.append(str(exc))
                continue
            for spec in offered:
                if self.permissions.is_off(spec.source, spec.name):
                    continue
                if not spec.name or any(c.isspace() or not c.isprintable() for c in spec.name):
                    self.problems.append(f"tool {spec.name!r} of {spec.source!r} is left out: its name has spaces")
                    continue
                unusable = schema_problem(spec.parameters)
                if unusable is not None:
                    self.problems.append(f"tool {spec.name!r} of {spec.source!r} is left out: {unusable}")
                    continue
                if spec.name in self._routes:
                    self.problems.append(
                        f"tool {spec.name!r} of {spec.source!r} is left out: another source offers a tool of that name"
                    )
                    continue
                self._routes[spec.name] = provider
                specs.append(spec)
        return specs

    def source_of(self, name: str) -> str | None:
        """The source of the tool called ``name`` (``builtin`` or a server), or ``None``."""
        for spec in self.tools():
            if spec.name == name:
                return spec.source
        return None

    def always_allows(self, name: str) -> bool:
        """Whether a call to ``name`` runs without asking (it is on the allow list)."""
        source = self.source_of(name)
        return source is not None and self.permissions.always_allows(source, name)

    def allow_always(self, name: str) -> None:
        """Puts the tool called ``name`` on the allow list (the approval's "Always allow this tool").

        Raises:
            ToolSetupError: no tool of that name is offered.
        """
        source = self.source_of(name)
        if source is None:
            raise ToolSetupError("tools", f"there is no tool {name!r} to allow")
        self.permissions.set_always_allow(source, name)

    def call(
        self, name: str, arguments: dict[str, object], *, timeout_s: float, cancel: threading.Event | None = None
    ) -> ToolResult:
        """Runs the call on the provider that offers ``name``; an unknown name is an error result."""
        self.tools()
        provider = self._routes.get(name)
        if provider is None:
            offered = ", ".join(self._routes) or "none"
            return ToolResult(f"there is no tool {name!r} (offered: {offered})", is_error=True)
        return provider.call(name, arguments, timeout_s=timeout_s, cancel=cancel)

    def close(self) -> None:
        """Closes every provider (stops the servers, all at once); safe twice."""
        providers, self.providers = self.providers, []
        # Servers in parallel (each may take seconds to stop; McpServer.close never raises).
        closers = [threading.Thread(target=p.close, daemon=True) for p in providers if isinstance(p, McpServer)]
        for closer in closers:
            closer.start()
        for provider in providers:
            if not isinstance(provider, McpServer):
                provider.close()
        for closer in closers:
            closer.join()

    def __enter__(self) -> ToolSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def parse_selection(
    selection: str | Sequence[str] | None, servers: Mapping[str, object], where: str = "--tools"
) -> tuple[list[str], list[str]]:
    """``--tools`` words as ``(builtins, servers)``.

    The words: ``builtin`` (every built-in), ``all`` (every built-in and every server not turned
    off), a server's name, or a built-in's name (``calculator``); ``none`` or an empty selection is
    no tools. Comma-separated, or several values.

    Raises:
        ToolSetupError: a word is neither (the line lists the servers configured).
    """
    tokens = _words(selection)
    builtins: list[str] = []
    chosen: list[str] = []
    for token in tokens:
        lowered = token.lower()
        if lowered == "none":
            continue
        if lowered in (BUILTIN, "all"):
            builtins.extend(name for name in ALL_BUILTINS if name not in builtins)
            if lowered == "all":
                chosen.extend(name for name in servers if name not in chosen)
        elif token in servers:
            if token not in chosen:
                chosen.append(token)
        elif token in ALL_BUILTINS:
            if token not in builtins:
                builtins.append(token)
        else:
            raise ToolSetupError(
                where, unknown_server_message(token, servers) + "; or builtin, all, or a built-in's name"
            )
    return builtins, chosen


def open_tools(
    selection: str | Sequence[str] | None,
    paths: Paths,
    *,
    attached_files: Sequence[Path | str] = (),
    knowledge_bases: Sequence[str] = (),
    searcher: Searcher | None = None,
    count_text: Callable[[str], int] | None = None,
    embedder_path: Path | None = None,
    chroma_url: str | None = None,
    connect_timeout_s: float | None = None,
) -> ToolSet:
    """The providers for a ``--tools NAME[,NAME...]|builtin|all`` selection (nothing starts yet:
    each server starts when its tools are first listed or called).

    Args:
        selection: the ``--tools`` value(s); ``None`` is no tools.
        paths: where ``mcp.json`` and the permissions are.
        attached_files: the files ``read_file`` may read (without any, it is not offered).
        knowledge_bases: the knowledge bases ``search_knowledge`` searches (without any, it is
            not offered).
        searcher: an open ``KnowledgeBases`` (or service) to share with the chat.
        count_text: the chat model's token counter, for the search result's budget.
        embedder_path: the embedding model, for knowledge bases opened by the search.
        chroma_url: a Chroma server, when the vectors live there.
        connect_timeout_s: the longest a server may take to start (default: the client's).

    Returns:
        A :class:`ToolSet`; close it (or use it as a context manager) to stop the servers.

    Raises:
        ToolSetupError: a word names no server, or a configuration file is damaged.
    """
    servers = load_servers(paths)
    permissions = Permissions.load(paths)
    builtins, chosen = parse_selection(selection, servers)
    explicit = set(_words(selection))
    providers: list[ToolProvider] = []
    plain = [name for name in builtins if name in BUILTIN_NAMES and not permissions.is_off(BUILTIN, name)]
    if plain:
        providers.append(BuiltinTools(plain, attached_files=attached_files))
    if SEARCH_KNOWLEDGE in builtins and knowledge_bases and not permissions.is_off(BUILTIN, SEARCH_KNOWLEDGE):
        providers.append(
            KnowledgeSearchTool(
                paths,
                knowledge_bases,
                searcher=searcher,
                count_text=count_text,
                embedder_path=embedder_path,
                chroma_url=chroma_url,
            )
        )
    kwargs = {} if connect_timeout_s is None else {"connect_timeout_s": connect_timeout_s}
    for name in chosen:
        # "all" leaves out servers turned off; a server named on its own is used even so.
        if permissions.is_off(name) and name not in explicit:
            continue
        providers.append(McpServer(servers[name].config, **kwargs))
    return ToolSet(providers, permissions)


def _words(selection: str | Sequence[str] | None) -> list[str]:
    if selection is None:
        return []
    words = [selection] if isinstance(selection, str) else list(selection)
    return [token.strip() for word in words for token in word.split(",") if token.strip()]
