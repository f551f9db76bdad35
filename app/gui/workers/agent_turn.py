"""The agent loop in the app: ``engine.agent.loop.Agent`` run on the LLM worker thread, approvals asked
of the GUI, every step recorded for the history (issue 12, "The app").

* :class:`ToolsRequest` is what a turn with tools carries (the sources chosen in the chat's Tools
  switch, the tool choice, the limits). Without one a turn is a plain generation.
* :class:`ApprovalGate` is how a call waits for the user: the worker thread blocks on a
  ``threading.Event`` (polling the turn's Stop event, so Stop cancels a pending approval: the call
  is then refused and the loop ends); the GUI answers ``once``, ``always`` or ``deny``.
* :func:`agent_events` runs the loop and turns its events into what the worker streams: the
  answer's tokens (a :class:`TextBreak` between two generations of one turn), the thinking, one
  record per new message (``{"kind": "message", "message": {...}, "step": {...} | None}``) and
  per generation (``{"kind": "generation", ...}``, the inspector's timeline), and one final
  ``Finished`` for the whole turn.
* The records and how a turn is stored (``AgentRecord``, ``model_history``: the reply's ``stats``
  get ``tool_steps``, ``agent_messages``, ``loop``, ``reasoning``) live in the Qt-free
  :mod:`app.agent_history`, which ``glassbox chat`` uses too.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from app.agent_history import ReplyText, generation_record, message_record

if TYPE_CHECKING:
    from engine.agent.loop import Decision
    from engine.inference.backends import ChatBackend
    from engine.inference.events import ToolCall
    from engine.inference.tools import ToolSpec

APPROVAL_POLL_S = 0.05
"""How often a waiting approval looks at the turn's Stop event."""
DECISIONS = ("once", "always", "deny")


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
    paths: Any
    tool_choice: str | None = None
    max_steps: int = 8
    timeout_s: float = 60.0
    open_tools: Callable[[ToolsRequest, Any], Any] | None = field(default=None, compare=False)
    knowledge_bases: tuple[str, ...] = ()
    searcher: Any = field(default=None, compare=False)


class ApprovalGate:
    """One call waiting for the user's decision (created on the worker thread, answered on the GUI's).

    Args:
        cancel: the turn's Stop event: a wait ends with ``deny`` as soon as it is set.
    """

    def __init__(self, cancel: threading.Event) -> None:
        self._cancel = cancel
        self._answered = threading.Event()
        self._decision: Decision = "deny"
        self._lock = threading.Lock()

    def answer(self, decision: str) -> bool:
        """Gives the decision (the first answer wins). Returns False when it was already answered."""
        if decision not in DECISIONS:
            raise ValueError(f"an approval is one of {', '.join(DECISIONS)}, not {decision!r}")
        with self._lock:
            if self._answered.is_set():
                return False
            self._decision = "once" if decision == "once" else "always" if decision == "always" else "deny"
            self._answered.set()
            return True

    @property
    def answered(self) -> bool:
        return self._answered.is_set()

    def wait(self) -> Decision:
        """Blocks the worker until the GUI answers or Stop is pressed (then ``deny``)."""
        while not self._answered.wait(APPROVAL_POLL_S):
            if self._cancel.is_set():
                self.answer("deny")
        return self._decision


@dataclass(frozen=True)
class ApprovalRequest:
    """What the approval card shows: the exact call, and the gate to answer it."""

    request_id: int
    call_id: str
    name: str
    arguments: dict[str, Any]
    source: str
    description: str
    gate: ApprovalGate = field(compare=False, repr=False)

    def answer(self, decision: str) -> bool:
        """``once``, ``always`` or ``deny``; False when already answered (or stopped)."""
        return self.gate.answer(decision)


@dataclass(frozen=True)
class TextBreak:
    """Text between two generations of one turn (the streamed reply reads as the saved one)."""

    text: str = "\n\n"


# ---------------------------------------------------------------------- the worker side


def stream_accepts(session: ChatBackend, keyword: str) -> bool:
    """Whether ``session.stream`` takes ``keyword`` (both engine backends take every ChatBackend
    keyword, and a remote one refuses a thinking budget itself; a test's fake may take fewer)."""
    import inspect

    try:
        parameters = inspect.signature(session.stream).parameters
    except (TypeError, ValueError):
        return True
    return keyword in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def default_open_tools(request: ToolsRequest, session: ChatBackend) -> Any:
    """The ToolSet for the sources chosen (``app.tool_setup.open_tools``; servers start when listed)."""
    from app.tool_setup import open_tools

    return open_tools(
        list(request.selection),
        request.paths,
        count_text=getattr(session, "count_text", None),
        knowledge_bases=request.knowledge_bases,
        searcher=request.searcher,
    )


def offers_search(toolset: Any) -> bool:
    """Whether the model searches the knowledge bases itself (``search_knowledge`` is offered): the
    turn then adds no retrieved passages of its own, as ``glassbox chat --tools`` does."""
    from app.tool_config import BUILTIN

    return any(spec.name == "search_knowledge" and spec.source == BUILTIN for spec in toolset.tools())


class ToolsetCache:
    """The worker's open ToolSet, kept between turns (an MCP server is not restarted for each one),
    opened again when the sources, the session, ``mcp.json`` or the permissions change."""

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._toolset: Any = None

    def get(self, request: ToolsRequest, session: ChatBackend) -> Any:
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


def _config_stamp(paths: Any) -> tuple[Any, ...]:
    stamps: list[Any] = []
    for name in ("mcp_config", "tool_permissions"):
        path = getattr(paths, name, None)
        try:
            stat = os.stat(path) if path is not None else None
        except OSError:
            stat = None
        stamps.append((stat.st_mtime_ns, stat.st_size) if stat is not None else None)
    return tuple(stamps)


def agent_events(
    session: ChatBackend,
    toolset: Any,
    request: Any,
    history: Sequence[Any],
    documents: str | None,
    options: dict[str, Any],
    ask: Callable[[ApprovalRequest], None],
    record: Callable[[dict[str, Any]], None],
) -> Iterator[Any]:
    """Runs one turn through the agent loop (on the worker thread).

    Args:
        session: the chat session.
        toolset: the tools (a ToolProvider with ``always_allows`` and ``allow_always``).
        request: the ``GenerateRequest`` (``tools`` set).
        history: the earlier messages (``engine.inference.context.Message``).
        documents: the documents block, if any.
        options: more ``stream`` keywords (the KV cache key, the thinking switch or budget).
        ask: shows an approval to the user (emits a signal); the call then waits on its gate.
        record: takes each record (emits a signal).

    Yields:
        Token, PrefillProgress, Reasoning and TextBreak events, then one Finished for the turn.
    """
    from engine.agent.loop import Agent, ToolStep
    from engine.inference.events import Finished, Token

    tools: ToolsRequest = request.tools
    specs = toolset.tools()
    allow = {spec.name for spec in specs if toolset.always_allows(spec.name)}
    problems = list(getattr(toolset, "problems", None) or ())
    if problems:  # a server that did not start: the chat goes on with the other tools
        record({"kind": "problems", "problems": problems})

    def approve(call: ToolCall, spec: ToolSpec) -> Decision:
        gate = ApprovalGate(request.cancel)
        ask(
            ApprovalRequest(
                request.request_id, call.id, call.name, dict(call.arguments), spec.source, spec.description, gate
            )
        )
        return gate.wait()

    def on_step(message: Any, step: Any) -> None:
        record(message_record(message, step))

    agent = Agent(
        session,
        [toolset],
        approve=approve,
        allow=allow,
        on_allow=toolset.allow_always,
        on_step=on_step,
        max_steps=tools.max_steps,
        timeout_s=tools.timeout_s,
    )
    run = agent.run(
        history,
        request.user,
        request.params,
        system=request.system,
        documents=documents,
        cancel=request.cancel,
        tool_choice=tools.tool_choice,
        **options,
    )
    streamed = ReplyText()  # the answer's text over every generation, as the app saves it
    rounds = 0
    for event in run:
        if isinstance(event, Token):
            brk = streamed.add(event.text)
            if brk:
                yield TextBreak(brk)
            yield event
        elif isinstance(event, Finished):
            rounds += 1
            record(generation_record(rounds, event))
            streamed.end_generation()
        elif not isinstance(event, ToolStep):  # a ToolStep is recorded through on_step, with its message
            yield event  # PrefillProgress, Reasoning, Stats, ToolCall
    result = run.result
    last = result.finished
    if last is None:
        from engine.errors import EngineError

        raise EngineError("the agent loop ended without a reply")
    yield dataclasses.replace(
        last,
        text=streamed.text,
        reasoning=result.reasoning,
        reasoning_tokens=result.reasoning_tokens,
        reasoning_ms=result.reasoning_ms,
        tool_calls=(),
    )
