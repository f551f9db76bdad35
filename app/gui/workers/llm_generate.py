"""The LLM worker's generate step: one turn's events from the session, coalesced for the GUI.

* :func:`turn_events` streams a turn: a plain generation (``ChatBackend.stream``) or, with tools,
  the agent loop (:func:`app.gui.workers.agent_turn.agent_events`), with the turn's stream options
  (:func:`stream_options`: the KV cache key, the thinking switch and budget).
* :class:`Coalescer` gathers the text and the thinking on the worker thread and sends them at
  most every :data:`COALESCE_S` (~30 updates a second), so a fast model never floods the GUI's
  event queue; it also keeps the reply's tokens for the inspector's token view, and counts the
  tokens held back as a tool call's markup (``CallProgress``): they are sent as tokens without
  text, with how many the call has so far, so the GUI shows the call being written, and how fast.
* :func:`outcome_of` is the frozen :class:`~app.gui.workers.llm_requests.GenerationOutcome` sent
  for the turn's ``Finished``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, TypedDict

from app.gui.workers.llm_requests import GenerationOutcome, ReasoningSummary

if TYPE_CHECKING:
    from app.agent_history import Record
    from app.gui.workers.agent_turn import ApprovalRequest, TextBreak
    from app.gui.workers.llm_requests import GenerateRequest
    from app.tool_setup import ToolSet
    from engine.inference.backends import ChatBackend
    from engine.inference.context import Message, RankedDocuments
    from engine.inference.events import Event, Finished
    from engine.inference.kv_cache import KvKey
    from engine.media import Media

COALESCE_S = 1 / 30
"""Minimum time between two text updates sent to the GUI."""


class StreamOptions(TypedDict, total=False):
    """The ``stream`` keywords a turn adds when it has them."""

    cache_key: KvKey
    thinking: bool
    thinking_budget: int
    media: tuple[Media, ...]


def stream_options(request: GenerateRequest) -> StreamOptions:
    """The KV cache saved with the chat (a backend that keeps none ignores it), the thinking switch
    and budget (a backend that cannot honour a budget refuses it)."""
    options: StreamOptions = {}
    if request.cache_key is not None:
        from engine.inference.kv_cache import KvKey

        options["cache_key"] = KvKey(*request.cache_key)
    if request.thinking is not None:
        options["thinking"] = request.thinking
    if request.thinking_budget is not None:
        options["thinking_budget"] = request.thinking_budget
    if request.media:
        options["media"] = request.media  # the new message's images (the history's are on its messages)
    return options


def turn_events(
    session: ChatBackend,
    request: GenerateRequest,
    history: Sequence[Message],
    toolset: ToolSet | None,
    documents: RankedDocuments | None,
    ask: Callable[[ApprovalRequest], None],
    record: Callable[[Record], None],
) -> Iterator[Event | TextBreak]:
    """The events of one turn: the agent loop when the request has tools, else a plain generation."""
    options = stream_options(request)
    if request.tools is not None and toolset is not None:
        from app.gui.workers.agent_turn import agent_events

        return agent_events(session, toolset, request, history, documents, options, ask, record)
    return session.stream(
        history,
        request.user,
        request.params,
        system=request.system,
        documents=documents,
        cancel=request.cancel,
        **options,
    )


class Coalescer:
    """One turn's text, thinking and prefill progress, sent to the GUI at most every COALESCE_S.

    Args:
        request_id: the turn's request.
        send_text: ``(request id, text, tokens in it)``: the worker's ``tokens_received``.
        send_thinking: ``(request id, text)``: the worker's ``reasoning_received``.
        send_prefill: ``(request id, done, total)``: the worker's ``prefill_progressed``.
        send_call: ``(request id, tokens)``: the worker's ``call_progressed``: the tokens of the tool
            call being written (0 once it is written, or turned out to be text).
    """

    def __init__(
        self,
        request_id: int,
        send_text: Callable[[int, str, int], None],
        send_thinking: Callable[[int, str], None],
        send_prefill: Callable[[int, int, int], None],
        send_call: Callable[[int, int], None] | None = None,
    ) -> None:
        from app.gui.workers.speculative import ReplyTokens

        self._id = request_id
        self._send_text = send_text
        self._send_thinking = send_thinking
        self._send_prefill = send_prefill
        self._send_call = send_call
        self._call_tokens = 0  # the tokens of the call being written (CallProgress)
        self._call_sent = 0
        self._pending: list[str] = []
        self._pending_tokens = 0
        self._thinking: list[str] = []
        self._last_emit = 0.0
        self._last_prefill = 0.0
        self.reply = ReplyTokens()
        """The reply's tokens, for the inspector's token view (accepted drafts tinted)."""

    def take(self, event: Event | TextBreak) -> None:
        """Gathers a Token, Reasoning, TextBreak or CallProgress, reports a PrefillProgress; a
        ToolCall ends the call being written; ignores the rest."""
        from app.gui.workers.agent_turn import TextBreak
        from app.gui.workers.speculative import ReplyTokens
        from engine.inference.events import CallProgress, PrefillProgress, Reasoning, Token, ToolCall

        now = time.perf_counter()
        if isinstance(event, (Reasoning, TextBreak)):
            (self._thinking if isinstance(event, Reasoning) else self._pending).append(event.text)
            if isinstance(event, TextBreak):
                self.reply = ReplyTokens()  # the last prompt holds the generations before it
            self._flush_due(now)
        elif isinstance(event, Token):
            self._pending.append(event.text)
            self._pending_tokens += 1
            self._call_tokens = 0
            self.reply.add(event)
            self._flush_due(now)
        elif isinstance(event, CallProgress):
            self._pending_tokens += 1  # generated, held back: counted for the speed, shown later
            self._call_tokens = event.tokens
            self._flush_due(now)
        elif isinstance(event, ToolCall):
            self._call_tokens = 0
        elif isinstance(event, PrefillProgress) and (
            now - self._last_prefill >= COALESCE_S or event.done >= event.total
        ):
            self._send_prefill(self._id, event.done, event.total)
            self._last_prefill = now

    def _flush_due(self, now: float) -> None:
        if now - self._last_emit >= COALESCE_S:
            self.flush()
            self._last_emit = now

    def flush(self) -> None:
        """Sends the thinking and the text gathered since the last update."""
        if self._thinking:
            self._send_thinking(self._id, "".join(self._thinking))
            self._thinking.clear()
        if self._pending or self._pending_tokens:
            self._send_text(self._id, "".join(self._pending), self._pending_tokens)
            self._pending.clear()
        self._pending_tokens = 0
        if self._send_call is not None and self._call_tokens != self._call_sent:
            self._send_call(self._id, self._call_tokens)
            self._call_sent = self._call_tokens


def outcome_of(request: GenerateRequest, event: Finished, started: float) -> GenerationOutcome:
    """The turn's outcome for its ``Finished`` (``started``: its ``time.perf_counter()``)."""
    elapsed = (time.perf_counter() - started) * 1000
    reasoning: ReasoningSummary | None = (
        {"text": event.reasoning, "tokens": event.reasoning_tokens, "ms": round(event.reasoning_ms, 2)}
        if event.reasoning
        else None
    )
    return GenerationOutcome(request.request_id, event.reason, event.text, event.stats, elapsed, reasoning)
