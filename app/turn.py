"""One chat turn, written once for every front end: the window's LLM worker, ``glassbox chat`` and
each dialect of ``glassbox serve`` (ARCHITECTURE.md, "Walk 1: a chat turn"). Qt-free.

:func:`run_turn` takes a :class:`TurnRequest` and streams the backend's typed events; the
:class:`TurnRecord` of its :class:`TurnRun` is complete when the stream ends. The recipe: the
passages (given, or retrieved for the message unless the model searches the knowledge bases
itself), handed to the backend ranked (its documents band fits them), every stream option, then a
plain generation or the agent loop (``engine.agent.loop``), and the record history saves.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from app.agent_history import (
    AgentRecord,
    Record,
    ReplyText,
    TextBreak,
    generation_record,
    message_record,
    reasoning_dict,
)
from app.knowledge_glue import SEARCH_KNOWLEDGE, Passages, Retriever, kept_sources
from engine.errors import EngineError
from engine.inference.events import Event, Finished, Reasoning, Token
from engine.inference.tools import BUILTIN_SOURCE, ToolProvider, ToolSpec

if TYPE_CHECKING:
    from engine.agent.loop import AgentResult, Decision, ToolStep
    from engine.inference.backends import ChatBackend
    from engine.inference.context import Message, RankedDocuments
    from engine.inference.events import ToolCall
    from engine.inference.runtime import GenerationParams
    from engine.media import Media

TurnEvent: TypeAlias = "Event | ToolStep | TextBreak"
"""What a turn streams: the backend's events, a ToolStep after each call the loop handled, a
TextBreak between two generations' text; one ``Finished`` last, for the whole turn."""


class TurnToolset(ToolProvider, Protocol):
    """The open tools of a chat (``app.tool_setup.ToolSet``): the calls, the allow list, what failed."""

    @property
    def problems(self) -> list[str]:
        """One line per server that did not start (the chat goes on with the other tools)."""
        ...

    def always_allows(self, name: str) -> bool: ...

    def allow_always(self, name: str) -> None: ...


Approve: TypeAlias = "Callable[[ToolCall, ToolSpec], Decision]"
"""Asks whether a call not on the allow list may run: ``once``, ``always`` or ``deny``."""


def offers_search(toolset: ToolProvider) -> bool:
    """Whether the model searches the knowledge bases itself (the built-in ``search_knowledge`` is
    offered): the turn then retrieves no passages up front."""
    return any(spec.name == SEARCH_KNOWLEDGE and spec.source == BUILTIN_SOURCE for spec in toolset.tools())


@dataclass(frozen=True)
class TurnTools:
    """A turn that runs the agent loop: the open tools, how a call is approved, the limits.

    Attributes:
        toolset: the chat's tools (opened by the front end, which keeps them between turns).
        approve: asked for each call not allowed always; None refuses every such call.
        max_steps: rounds of calls before the model must answer without calling one.
        timeout_s: the longest one call may run.
        problems: lines said with the toolset's own (a chat's saved tool choice gone stale).
    """

    toolset: TurnToolset
    approve: Approve | None = field(default=None, compare=False)
    max_steps: int = 8
    timeout_s: float = 60.0
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class TurnRequest:
    """One turn, as every front end asks for it.

    Attributes:
        history: the earlier messages, oldest first.
        user: the new message; None continues the last turn of ``history`` (after a tool's result).
        params: the sampling and decoding parameters.
        system: the system prompt.
        media: the images and clips attached to ``user``.
        passages: the passages retrieved for this turn (the window retrieves on its knowledge
            thread, ``glassbox serve`` once per request), best first, not fitted.
        retrieve: else the retriever asked for ``user``'s passages (``glassbox chat --kb``).
        tools: the agent loop's tools (None: a plain generation).
        offered: tools offered whose calls come back unrun (``glassbox serve``'s client runs them).
        tool_choice: ``auto`` (None), ``none``, ``required`` or a function name.
        cache_key: ``(conversation, branch)`` of the KV cache saved with the chat
            (``engine.inference.kv_cache.KvKey``; a backend that keeps none ignores it).
        thinking, reasoning_effort, thinking_budget: the template's thinking options.
        cancel: Stop, set by the front end.
    """

    history: tuple[Message, ...]
    user: str | None
    params: GenerationParams | None
    system: str | None = None
    media: tuple[Media, ...] = ()
    passages: Passages | None = field(default=None, compare=False)
    retrieve: Retriever | None = field(default=None, compare=False)
    tools: TurnTools | None = None
    offered: tuple[ToolSpec, ...] = ()
    tool_choice: str | None = None
    cache_key: tuple[str, str] | None = None
    thinking: bool | None = None
    reasoning_effort: str | None = None
    thinking_budget: int | None = None
    cancel: threading.Event = field(default_factory=threading.Event, compare=False)


@dataclass
class TurnRecord:
    """What a turn did, as history saves it (filled while the turn streams).

    Attributes:
        passages: the passages the turn was given or found (None: none, or the model searched).
        finished: the turn's one ``Finished``; with tools, the whole answer as streamed (every
            generation's text, a blank line between two), the thinking of all of them, no calls.
        answer: the last generation's answer alone (``glassbox chat --json``'s ``text``).
        agent: the loop's records (messages, steps, timeline) and the thinking.
        steps: every call the loop handled.
        messages: what the turn added to the conversation after the user's message (the
            assistant's replies with their calls, each tool result).
        hit_step_limit: the last generation could call no tool (``max_steps``).
        shown: the answer's text over every generation of the loop, as it streams.
    """

    passages: Passages | None = None
    finished: Finished | None = None
    answer: str = ""
    agent: AgentRecord = field(default_factory=AgentRecord)
    steps: list[ToolStep] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    hit_step_limit: bool = False
    shown: ReplyText = field(default_factory=ReplyText)

    @property
    def sources(self) -> list[dict[str, Any]]:
        """The sources of the passages the documents band kept."""
        return kept_sources(self.passages, self.finished.stats) if self.finished is not None else []

    def history_stats(self) -> dict[str, object]:
        """The reply's ``stats`` in history: the engine's Stats (the passages dropped among them),
        the finish reason, the loop's records and the thinking (``app.agent_history``)."""
        if self.finished is None:
            return self.agent.stats()
        stats: dict[str, object] = self.finished.stats.to_dict()
        stats["finish_reason"] = self.finished.reason
        stats.update(self.agent.stats())
        return stats


class TurnRun:
    """One turn's events; iterate it, then read :attr:`record`."""

    def __init__(self, events: Iterator[TurnEvent], record: TurnRecord) -> None:
        self._events = events
        self.record = record

    def __iter__(self) -> Iterator[TurnEvent]:
        return self._events


def run_turn(backend: ChatBackend, request: TurnRequest, on_record: Callable[[Record], None] | None = None) -> TurnRun:
    """One turn on ``backend``; nothing runs until it is iterated.

    Args:
        backend: the chat backend.
        request: the turn.
        on_record: told each record of the loop as it happens (tools that did not start, each new
            message with its step, each generation: ``app.agent_history``), once the turn's record
            holds it, so a front end can show it or save the turn so far.

    Returns:
        The run: its events (:data:`TurnEvent`), then its record.

    Raises:
        EngineError, ContextOverflow, EngineCrashed: from the backend, as the iteration reaches them.
    """
    record = TurnRecord()
    return TurnRun(_turn(backend, request, record, on_record or _ignore), record)


def _ignore(_record: Record) -> None:
    return None


def _turn(
    backend: ChatBackend, request: TurnRequest, record: TurnRecord, on_record: Callable[[Record], None]
) -> Iterator[TurnEvent]:
    tools = request.tools
    # With search_knowledge offered the model retrieves when it decides to: no passages up front.
    searches = tools is not None and offers_search(tools.toolset)
    passages = None if searches else request.passages
    if passages is None and request.retrieve is not None and request.user is not None and not searches:
        passages = request.retrieve(request.user)
    record.passages = passages
    documents = passages.documents if passages is not None else None
    if tools is None:
        yield from _plain(backend, request, documents, record)
    else:
        yield from _loop(backend, request, tools, documents, record, on_record)


def _plain(
    backend: ChatBackend, request: TurnRequest, documents: RankedDocuments | None, record: TurnRecord
) -> Iterator[TurnEvent]:
    """One generation; the calls of the tools ``offered`` come back in its events, unrun."""
    # The engine's context and KV-cache modules load with the first turn, not with the window that
    # imports this module for its request types (ARCHITECTURE.md, "Heavy imports are lazy").
    # lazy: start-up (+55 ms)
    from engine.inference.context import Message
    from engine.inference.kv_cache import KvKey

    for event in backend.stream(
        list(request.history),
        request.user,
        request.params,
        system=request.system,
        documents=documents,
        cancel=request.cancel,
        cache_key=KvKey(*request.cache_key) if request.cache_key is not None else None,
        tools=request.offered,
        tool_choice=request.tool_choice,
        thinking=request.thinking,
        reasoning_effort=request.reasoning_effort,
        thinking_budget=request.thinking_budget,
        media=request.media,
    ):
        if isinstance(event, Finished):
            record.finished, record.answer = event, event.text
            record.messages = [Message("assistant", event.text, tool_calls=event.tool_calls)]
            if event.reasoning:
                record.agent.reasoning_done = reasoning_dict(
                    event.reasoning, event.reasoning_tokens, event.reasoning_ms
                )
        yield event


def _loop(
    backend: ChatBackend,
    request: TurnRequest,
    tools: TurnTools,
    documents: RankedDocuments | None,
    record: TurnRecord,
    on_record: Callable[[Record], None],
) -> Iterator[TurnEvent]:
    """The agent loop: every generation's events, a TextBreak between their texts, a ToolStep per
    call, one record per message and per generation; one ``Finished`` for the whole turn."""
    # Lazy for the reason _plain's are.
    # lazy: start-up (+96 ms)
    from engine.agent.loop import Agent
    from engine.inference.context import Message
    from engine.inference.kv_cache import KvKey

    toolset = tools.toolset
    offered = toolset.tools()  # listing the tools first is what finds the servers that did not start
    problems = [*toolset.problems, *tools.problems]
    if problems:  # a server that did not start: the chat goes on with the other tools
        on_record({"kind": "problems", "problems": problems})

    def on_step(message: Message, step: ToolStep | None) -> None:
        _keep(record, on_record, message_record(message, step))

    agent = Agent(
        backend,
        [toolset],
        approve=tools.approve,
        allow={spec.name for spec in offered if toolset.always_allows(spec.name)},
        on_allow=toolset.allow_always,
        on_step=on_step,
        max_steps=tools.max_steps,
        timeout_s=tools.timeout_s,
    )
    history, user = list(request.history), request.user
    if request.media and user is not None:  # every step of the loop sees the images with the message
        history, user = [*history, Message("user", user, media=request.media)], None
    run = agent.run(
        history,
        user,
        request.params,
        system=request.system,
        documents=documents,
        cancel=request.cancel,
        tool_choice=request.tool_choice,
        thinking=request.thinking,
        reasoning_effort=request.reasoning_effort,
        cache_key=KvKey(*request.cache_key) if request.cache_key is not None else None,
        thinking_budget=request.thinking_budget,
    )
    rounds = 0
    for event in run:
        if isinstance(event, Token):
            brk = record.shown.add(event.text)
            if brk:
                yield TextBreak(brk)
            yield event
        elif isinstance(event, Finished):  # one generation's: recorded, not passed on
            rounds += 1
            _keep(record, on_record, generation_record(rounds, event))
            record.shown.end_generation()
        else:
            if isinstance(event, Reasoning):
                record.agent.reasoning.append(event.text)  # saved with each step, before the turn ends
            yield event  # PrefillProgress, Reasoning, CallProgress, ToolCall, Stats, ToolStep
    yield _finish(run.result, record)


def _keep(record: TurnRecord, on_record: Callable[[Record], None], entry: Record) -> None:
    record.agent.add(entry)
    on_record(entry)


def _finish(result: AgentResult, record: TurnRecord) -> Finished:
    """The turn's one ``Finished``: the last generation's, with the whole answer and thinking."""
    last = result.finished
    if last is None:
        raise EngineError("the agent loop ended without a reply")
    record.answer = result.text
    record.steps = list(result.steps)
    record.messages = list(result.messages)
    record.hit_step_limit = result.hit_step_limit
    if result.reasoning:
        record.agent.reasoning_done = reasoning_dict(result.reasoning, result.reasoning_tokens, result.reasoning_ms)
    record.finished = dataclasses.replace(
        last,
        text=record.shown.text,
        reasoning=result.reasoning,
        reasoning_tokens=result.reasoning_tokens,
        reasoning_ms=result.reasoning_ms,
        tool_calls=(),
    )
    return record.finished
