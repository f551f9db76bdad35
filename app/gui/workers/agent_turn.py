"""The agent loop in the app: ``engine.agent.loop.Agent`` run on the LLM worker thread, approvals asked
of the GUI, every step recorded for the history (issue 12, "The app").

* What a turn with tools asks for (:class:`~app.gui.workers.agent_tools.ToolsRequest`) and its
  open ToolSet are :mod:`app.gui.workers.agent_tools`.
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
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.agent_history import ReplyText, generation_record, message_record

if TYPE_CHECKING:
    from app.agent_history import Record
    from app.gui.workers.agent_tools import ToolsRequest
    from app.gui.workers.llm_generate import StreamOptions
    from app.gui.workers.llm_requests import GenerateRequest
    from app.tool_setup import ToolSet
    from engine.agent.loop import Agent, AgentResult, AgentRun, Decision, ToolStep
    from engine.inference.backends import ChatBackend
    from engine.inference.context import Message, RankedDocuments
    from engine.inference.events import Event, Finished, ToolCall
    from engine.inference.tools import ToolSpec

APPROVAL_POLL_S = 0.05
"""How often a waiting approval looks at the turn's Stop event."""
DECISIONS = ("once", "always", "deny")


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
    arguments: dict[str, object]
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


def agent_events(
    session: ChatBackend,
    toolset: ToolSet,
    request: GenerateRequest,
    history: Sequence[Message],
    documents: RankedDocuments | None,
    options: StreamOptions,
    ask: Callable[[ApprovalRequest], None],
    record: Callable[[Record], None],
) -> Iterator[Event | TextBreak]:
    """Runs one turn through the agent loop (on the worker thread).

    Args:
        session: the chat session.
        toolset: the tools (a ToolProvider with ``always_allows`` and ``allow_always``).
        request: the ``GenerateRequest`` (``tools`` set).
        history: the earlier messages (``engine.inference.context.Message``).
        documents: the retrieved passages, if any (the backend fits them).
        options: more ``stream`` keywords (the KV cache key, the thinking switch or budget).
        ask: shows an approval to the user (emits a signal); the call then waits on its gate.
        record: takes each record (emits a signal).

    Yields:
        Token, PrefillProgress, Reasoning and TextBreak events, then one Finished for the turn.
    """
    tools = request.tools
    if tools is None:
        raise ValueError("agent_events needs a request with tools")
    # Listing the tools first: it is what finds the servers that did not start.
    offered = [spec.name for spec in toolset.tools()]
    allow = {name for name in offered if toolset.always_allows(name)}
    problems = list(getattr(toolset, "problems", None) or ())
    choice = tools.tool_choice
    if choice not in (None, "auto", "required", "none") and choice not in offered:  # turned off since
        problems.append(f"{choice} is not on any more: the model decides this turn (Auto)")
        choice = None
    if problems:  # a server that did not start: the chat goes on with the other tools
        record({"kind": "problems", "problems": problems})
    agent = _agent(session, toolset, request, tools, allow, ask, record)
    run = agent.run(
        history,
        request.user,
        request.params,
        system=request.system,
        documents=documents,
        cancel=request.cancel,
        tool_choice=choice,
        **options,
    )
    streamed = ReplyText()  # the answer's text over every generation, as the app saves it
    yield from _stream(run, streamed, record)
    yield _final(run.result, streamed)


def _agent(
    session: ChatBackend,
    toolset: ToolSet,
    request: GenerateRequest,
    tools: ToolsRequest,
    allow: set[str],
    ask: Callable[[ApprovalRequest], None],
    record: Callable[[Record], None],
) -> Agent:
    """The loop over ``toolset``: each call not in ``allow`` waits on an :class:`ApprovalGate`."""
    from engine.agent.loop import Agent

    def approve(call: ToolCall, spec: ToolSpec) -> Decision:
        gate = ApprovalGate(request.cancel)
        ask(
            ApprovalRequest(
                request.request_id, call.id, call.name, dict(call.arguments), spec.source, spec.description, gate
            )
        )
        return gate.wait()

    def on_step(message: Message, step: ToolStep | None) -> None:
        record(message_record(message, step))

    return Agent(
        session,
        [toolset],
        approve=approve,
        allow=allow,
        on_allow=toolset.allow_always,
        on_step=on_step,
        max_steps=tools.max_steps,
        timeout_s=tools.timeout_s,
    )


def _stream(run: AgentRun, streamed: ReplyText, record: Callable[[Record], None]) -> Iterator[Event | TextBreak]:
    """The loop's events as the worker streams them: a TextBreak between two generations' text, a
    record per generation (its ``Finished`` is not passed on), no ToolStep (``on_step`` records it)."""
    from engine.agent.loop import ToolStep
    from engine.inference.events import Finished, Token

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


def _final(result: AgentResult, streamed: ReplyText) -> Finished:
    """The turn's one ``Finished``: the last generation's, with the whole answer and thinking."""
    last = result.finished
    if last is None:
        from engine.errors import EngineError

        raise EngineError("the agent loop ended without a reply")
    return dataclasses.replace(
        last,
        text=streamed.text,
        reasoning=result.reasoning,
        reasoning_tokens=result.reasoning_tokens,
        reasoning_ms=result.reasoning_ms,
        tool_calls=(),
    )
