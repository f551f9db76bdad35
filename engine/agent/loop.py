"""The agent loop: the model calls a tool, the user approves, the tool runs, the result goes back.

Contract: ARCHITECTURE.md, 'engine.agent.loop'.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from engine.errors import EngineError
from engine.inference.context import Message, RankedDocuments, truncate_to_tokens
from engine.inference.events import Event, Finished, ToolCall
from engine.inference.tools import ToolProvider, ToolResult, ToolSpec, check_tools

if TYPE_CHECKING:
    from engine.inference.backends import ChatBackend

Decision = Literal["once", "always", "deny"]
Approval = Literal["allowed", "always", "allow-listed", "denied", "unknown-tool", "invalid-arguments", "cancelled"]

RESULT_SLACK_TOKENS = 32
"""Tokens kept aside per result for the tool message's header, when the room is estimated."""
MEASURED_SLACK_TOKENS = 8
"""Tokens kept aside per result when the room is measured (text joined to a header may tokenize
a little differently from the two apart)."""


@dataclass(frozen=True)
class ToolStep:
    """One call the loop handled.

    Attributes:
        round: which generation asked for it (1 for the first).
        call: the call.
        source: the provider's name for the tool (``builtin`` or an MCP server), "" when unknown.
        approval: how it was decided (``allowed`` once, ``always``, ``allow-listed``; or why it did
            not run: ``denied``, ``unknown-tool``, ``invalid-arguments``, ``cancelled``).
        result: what went back to the model.
        ms: how long the tool ran (0 when it did not).
        tokens: the tokens the result adds to the context (its text).
        truncated: the result was cut to fit the window.
    """

    round: int
    call: ToolCall
    source: str
    approval: Approval
    result: ToolResult
    ms: float
    tokens: int
    truncated: bool = False

    @property
    def ran(self) -> bool:
        """Whether the tool was actually called."""
        return self.approval in ("allowed", "always", "allow-listed")


@dataclass
class AgentResult:
    """What one run did.

    Attributes:
        messages: the new messages, in order (assistant replies and tool results).
        steps: every call handled.
        finished: the last generation's Finished.
        rounds: how many generations asked for calls.
        hit_step_limit: the last generation could call no tool because of ``max_steps``.
        reasoning: each generation's thinking, joined by blank lines.
        reasoning_tokens: the thinking's tokens over all generations.
        reasoning_ms: the thinking's time over all generations.
    """

    messages: list[Message] = field(default_factory=list)
    steps: list[ToolStep] = field(default_factory=list)
    finished: Finished | None = None
    rounds: int = 0
    hit_step_limit: bool = False
    reasoning: str = ""
    reasoning_tokens: int = 0
    reasoning_ms: float = 0.0

    @property
    def text(self) -> str:
        """The final answer."""
        return self.finished.text if self.finished is not None else ""


class AgentRun:
    """One run's events; iterate it, then read :attr:`result`."""

    def __init__(self, events: Iterator[Event | ToolStep], result: AgentResult) -> None:
        self._events = events
        self.result = result

    def __iter__(self) -> Iterator[Event | ToolStep]:
        return self._events


@dataclass
class _Tool:
    spec: ToolSpec
    provider: ToolProvider


class Agent:
    """Runs the loop over one backend and a set of tool providers.

    Args:
        backend: the chat backend (a ChatSession or a RemoteSession).
        providers: who runs the tools; their tools are offered together (names must not repeat).
        approve: asked before each call not on the allow list; None refuses every such call.
        allow: names of the tools that run without asking (updated by ``"always"``).
        on_allow: told the name of a tool the user chose to always allow (to save the list).
        on_step: told each new message as it happens (and the ToolStep of a ``tool`` message).
        max_steps: rounds of calls before the model must answer without calling a tool.
        timeout_s: the most a call may run.
        max_result_tokens: the most tokens one result may take (also limited by the room left).

    Raises:
        EngineError: two providers offer a tool of the same name, or a tool's schema is unusable.
    """

    def __init__(
        self,
        backend: ChatBackend,
        providers: Sequence[ToolProvider],
        *,
        approve: Callable[[ToolCall, ToolSpec], Decision] | None = None,
        allow: set[str] | None = None,
        on_allow: Callable[[str], None] | None = None,
        on_step: Callable[[Message, ToolStep | None], None] | None = None,
        max_steps: int = 8,
        timeout_s: float = 60.0,
        max_result_tokens: int | None = None,
    ) -> None:
        if max_steps < 1:
            raise EngineError(f"max_steps must be at least 1, got {max_steps}")
        if timeout_s <= 0:
            raise EngineError(f"the tool timeout must be positive, got {timeout_s}")
        self.backend = backend
        self._tools: dict[str, _Tool] = {}
        specs: list[ToolSpec] = []
        for provider in providers:
            for spec in provider.tools():
                specs.append(spec)
                self._tools.setdefault(spec.name, _Tool(spec, provider))
        check_tools(specs)
        self.specs = tuple(specs)
        self.approve = approve
        self.allow = allow if allow is not None else set()
        self.on_allow = on_allow
        self.on_step = on_step
        self.max_steps = max_steps
        self.timeout_s = timeout_s
        self.max_result_tokens = max_result_tokens

    def run(
        self,
        history: Sequence[Message],
        user: str | None,
        params: Any = None,
        *,
        system: str | None = None,
        documents: RankedDocuments | None = None,
        cancel: threading.Event | None = None,
        tool_choice: str | None = None,
        thinking: bool | None = None,
        reasoning_effort: str | None = None,
        **options: Any,
    ) -> AgentRun:
        """Starts one user turn (``user=None`` continues the last turn of ``history``).

        ``options`` go to every ``backend.stream`` call of the turn as they are (a ChatSession's
        ``cache_key``, for one), but ``media`` (the images attached to ``user``): the first call
        sends them with ``user``, the later ones find them on the user message in the history.

        Returns:
            The run: iterate it for the events; its ``result`` is complete when the iteration ends.
        """
        result = AgentResult()
        events = self._loop(
            list(history),
            user,
            params,
            system,
            documents,
            cancel or threading.Event(),
            tool_choice,
            thinking,
            reasoning_effort,
            result,
            options,
        )
        return AgentRun(events, result)

    # ---------------------------------------------------------------- the loop
    def _loop(
        self,
        messages: list[Message],
        user: str | None,
        params: Any,
        system: str | None,
        documents: RankedDocuments | None,
        cancel: threading.Event,
        tool_choice: str | None,
        thinking: bool | None,
        reasoning_effort: str | None,
        result: AgentResult,
        options: dict[str, Any],
    ) -> Iterator[Event | ToolStep]:
        choice = tool_choice
        offered: Sequence[ToolSpec] = self.specs
        media = tuple(options.pop("media", ()))
        while True:
            finished: Finished | None = None
            attached: dict[str, Any] = {"media": media} if user is not None and media else {}
            for event in self.backend.stream(
                messages,
                user,
                params,
                system=system,
                documents=documents,
                cancel=cancel,
                tools=offered,
                tool_choice=choice if offered else "none",
                thinking=thinking,
                reasoning_effort=reasoning_effort,
                **attached,
                **options,
            ):
                if isinstance(event, Finished):
                    finished = event
                yield event
            if finished is None:
                raise EngineError("the backend ended a generation without a Finished event")
            if user is not None:
                messages.append(Message("user", user, media=media))
                user = None
            result.finished = finished
            result.reasoning = "\n\n".join(part for part in (result.reasoning, finished.reasoning) if part)
            result.reasoning_tokens += finished.reasoning_tokens
            result.reasoning_ms += finished.reasoning_ms
            calls = finished.tool_calls if offered and choice != "none" else ()
            reply = Message("assistant", finished.text, tool_calls=calls)
            self._append(messages, result, reply, None)
            if not calls:
                return
            if finished.reason in ("cancelled", "error") or cancel.is_set():
                for call in calls:  # a reply cut short still needs its calls answered
                    step = self._not_run(call, result.rounds + 1, "cancelled", "not run: the reply was stopped")
                    result.steps.append(step)
                    yield step
                    self._append(messages, result, _tool_message(step), step)
                return
            result.rounds += 1
            next_choice = choice
            if result.rounds >= self.max_steps:  # the tools stay rendered: the prefix is kept
                next_choice, result.hit_step_limit = "none", True
            elif choice not in (None, "auto", "none"):
                next_choice = "auto"
            room = self._result_room(
                finished,
                messages,
                calls,
                params,
                system=system,
                documents=documents,
                tools=offered,
                tool_choice=next_choice if offered else "none",
                thinking=thinking,
                reasoning_effort=reasoning_effort,
            )
            for call in calls:
                step = (
                    self._not_run(call, result.rounds, "cancelled", "not run: stopped by the user")
                    if cancel.is_set()
                    else self._handle(call, result.rounds, cancel, room)
                )
                result.steps.append(step)
                yield step
                self._append(messages, result, _tool_message(step), step)
            if cancel.is_set():
                return
            choice = next_choice

    def _append(self, messages: list[Message], result: AgentResult, message: Message, step: ToolStep | None) -> None:
        messages.append(message)
        result.messages.append(message)
        if self.on_step is not None:
            self.on_step(message, step)

    def _result_room(
        self, finished: Finished, messages: list[Message], calls: Sequence[ToolCall], params: Any, **turn: Any
    ) -> int:
        """Tokens each of this round's results may take: the window left for them, shared.

        Measured exactly when the backend can (``result_room``: the next prompt rendered with the
        results empty; a server's is None); otherwise estimated from the last generation's stats.
        """
        pending = [*messages, *(Message("tool", "", tool_call_id=c.id, name=c.name) for c in calls)]
        measured = self.backend.result_room(pending, params, **turn)
        if measured is not None:
            room = max(measured // len(calls) - MEASURED_SLACK_TOKENS, 0)
        elif finished.stats.n_ctx:
            stats = finished.stats
            left = stats.n_ctx - stats.context_used - stats.budget.get("reserve", 0)
            room = max(left // len(calls) - RESULT_SLACK_TOKENS, 0)
        else:
            room = 1 << 30  # a backend that reports no window: no cut
        return min(room, self.max_result_tokens) if self.max_result_tokens is not None else room

    # ---------------------------------------------------------------- one call
    def _handle(self, call: ToolCall, round_: int, cancel: threading.Event, room: int) -> ToolStep:
        tool = self._tools.get(call.name)
        if tool is None:
            names = ", ".join(self._tools) or "none"
            return self._not_run(
                call, round_, "unknown-tool", f"error: there is no tool named {call.name!r} (the tools are: {names})"
            )
        problem = _schema_problem(call.arguments, tool.spec.parameters)
        if problem is not None:
            return self._not_run(
                call,
                round_,
                "invalid-arguments",
                f"error: the arguments do not match {call.name}'s schema: {problem}",
                source=tool.spec.source,
            )
        approval: Approval
        if call.name in self.allow:
            approval = "allow-listed"
        else:
            decision = self.approve(call, tool.spec) if self.approve is not None else "deny"
            if cancel.is_set():
                return self._not_run(call, round_, "cancelled", "not run: stopped by the user", source=tool.spec.source)
            if decision == "always":
                approval = "always"
                self.allow.add(call.name)
                if self.on_allow is not None:
                    self.on_allow(call.name)
            elif decision == "once":
                approval = "allowed"
            else:
                return self._not_run(
                    call,
                    round_,
                    "denied",
                    f"The user denied this call to {call.name}; it did not run. Do not call it again for "
                    "this request: answer with what you have, or ask the user.",
                    source=tool.spec.source,
                )
        started = time.perf_counter()
        outcome = _run_call(tool, call, self.timeout_s, cancel)
        ms = round((time.perf_counter() - started) * 1000, 2)
        content, tokens, truncated = truncate_to_tokens(outcome.content, room, self.backend.count_text)
        return ToolStep(
            round_, call, tool.spec.source, approval, ToolResult(content, outcome.is_error), ms, tokens, truncated
        )

    def _not_run(self, call: ToolCall, round_: int, approval: Approval, text: str, *, source: str = "") -> ToolStep:
        if not source and call.name in self._tools:
            source = self._tools[call.name].spec.source
        return ToolStep(
            round_, call, source, approval, ToolResult(text, is_error=True), 0.0, self.backend.count_text(text)
        )


def _tool_message(step: ToolStep) -> Message:
    return Message("tool", step.result.content, tool_call_id=step.call.id, name=step.call.name)


def _schema_problem(arguments: dict[str, Any], schema: dict[str, Any]) -> str | None:
    """Why ``arguments`` break ``schema`` (one line), or None when they match (bounded: no reference
    is fetched, patterns run under a time budget; ``engine.inference.tool_schema``)."""
    # lazy: start-up (+6 ms)
    from engine.inference.tool_schema import argument_problem

    return argument_problem(arguments, schema)


def _run_call(tool: _Tool, call: ToolCall, timeout_s: float, cancel: threading.Event) -> ToolResult:
    """Runs one call on a thread, so a provider that ignores its timeout or the cancel cannot hang
    the loop: it is abandoned (its thread is a daemon) and the result says so."""
    box: list[ToolResult] = []
    stop = threading.Event()

    def work() -> None:
        try:
            box.append(tool.provider.call(call.name, dict(call.arguments), timeout_s=timeout_s, cancel=stop))
        except Exception as exc:  # noqa: BLE001 - a provider's failure is the model's information
            text = " ".join(str(exc).split()) or type(exc).__name__
            box.append(ToolResult(f"error: {call.name} failed: {text}"[:2000], is_error=True))

    worker = threading.Thread(target=work, name=f"tool-{call.name}", daemon=True)
    worker.start()
    deadline = time.monotonic() + timeout_s + 1.0  # the provider's own timeout gets the first chance
    while worker.is_alive():
        if cancel.is_set():
            stop.set()
            worker.join(0.5)
            return box[0] if box else ToolResult(f"error: {call.name} was stopped by the user", is_error=True)
        if time.monotonic() > deadline:
            stop.set()
            return ToolResult(f"error: {call.name} did not answer within {timeout_s:g} s", is_error=True)
        worker.join(0.05)
    return box[0] if box else ToolResult(f"error: {call.name} returned nothing", is_error=True)
