"""Reading a streamed ``/v1/chat/completions`` reply (for :mod:`engine.inference.remote`).

The SSE events (``data:`` lines, ``[DONE]`` at the end; comments, ``event:`` and ``id:`` fields
skipped) become the engine's typed events: each content delta a :class:`~engine.inference.events.Token`
(``token_id=-1``: the server does not say; with ``logprobs`` its log-probabilities), each
``reasoning_content`` (or ``reasoning``) delta a :class:`~engine.inference.events.Reasoning`, and the
``tool_calls`` deltas, gathered by index, one :class:`~engine.inference.events.ToolCall` each when the reply
ends. :func:`reply_stats` turns what the server reported (``usage``, and llama.cpp's ``timings``
when present) and what the client measured into :class:`~engine.inference.events.Stats`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from engine.errors import ContextOverflow, EngineError
from engine.inference.events import (
    CallProgress,
    Event,
    FinishReason,
    PrefillProgress,
    Reasoning,
    Stats,
    Token,
    ToolCall,
)
from engine.inference.remote_errors import looks_like_context_overflow, message_from_document


@dataclass
class StreamedReply:
    """What one streamed reply accumulated."""

    text: str = ""
    deltas: int = 0
    finish: str | None = None
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    t_first: float = 0.0
    t_last: float = 0.0
    done: bool = False
    reasoning: str = ""
    calls: dict[int, dict[str, str]] = field(default_factory=dict)
    call_deltas: int = 0  # the tool-call deltas so far
    t_thinking: float = 0.0  # the first reasoning delta
    t_thought: float = 0.0  # the first delta of the answer or of a call after it

    @property
    def reasoning_ms(self) -> float:
        """From the first reasoning delta to the first answer or call delta after it (or the last
        delta): how long the server's model thought (``reasoning_content``)."""
        if not self.t_thinking:
            return 0.0
        return round(((self.t_thought or self.t_last) - self.t_thinking) * 1000, 2)

    def arrived(self) -> None:
        """Notes that a delta arrived now (the first one's time is the time to first token)."""
        now = time.perf_counter()
        if not self.deltas:
            self.t_first = now
        self.t_last = now
        self.deltas += 1


def sse_events(
    lines: Iterable[str], reply: StreamedReply, prompt_tokens: int, cancel: threading.Event | None, base_url: str
) -> Iterator[Event]:
    """The events of a reply's SSE ``lines``, gathered into ``reply`` as they come.

    Stops at ``[DONE]`` (``reply.done``), or when ``cancel`` is set (the caller then closes the
    response, and the server sees the disconnect). A stream that ends without ``[DONE]`` after a
    ``finish_reason`` is done too (some servers end so).

    Raises:
        EngineError: a malformed chunk, or an error event from the server.
        ContextOverflow: an error event that says the prompt exceeds the context.
    """
    data: list[str] = []
    for line in lines:
        if cancel is not None and cancel.is_set():
            return
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
            continue
        if line or not data:
            continue  # comments (": ping"), "event:"/"id:" fields, stray blank lines
        event, data = "\n".join(data), []
        if event.strip() == "[DONE]":
            reply.done = True
            return
        for token in apply_chunk(event, reply, base_url):
            if reply.deltas == 1:
                yield PrefillProgress(prompt_tokens, prompt_tokens)
            yield token
    if data and "\n".join(data).strip() == "[DONE]":
        reply.done = True
    elif reply.finish is not None:
        reply.done = True  # some servers end the stream without [DONE]


def apply_chunk(event: str, reply: StreamedReply, base_url: str) -> list[Event]:
    """One SSE event's chunk: its deltas added to ``reply``, and the events they make.

    Raises:
        EngineError: a malformed chunk, or an error event from the server.
        ContextOverflow: an error event that says the prompt exceeds the context.
    """
    try:
        chunk = json.loads(event)
    except json.JSONDecodeError:
        raise EngineError(f"{base_url}: the server sent a malformed stream chunk") from None
    if not isinstance(chunk, dict):
        return []
    if "error" in chunk:
        message, code = message_from_document(chunk, event)
        if looks_like_context_overflow(message, code):
            raise ContextOverflow(f"{base_url}: the conversation does not fit the server's context: {message}")
        raise EngineError(f"{base_url}: the server failed mid-reply: {message}")
    if isinstance(chunk.get("usage"), dict):
        reply.usage = chunk["usage"]
    if isinstance(chunk.get("timings"), dict):
        reply.timings = chunk["timings"]
    events: list[Event] = []
    choices = chunk.get("choices")
    for choice in choices if isinstance(choices, list) else []:
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            continue  # one reply: a server answering n > 1 anyway has its other choices skipped
        delta = choice.get("delta")
        delta = delta if isinstance(delta, dict) else {}
        thought = delta.get("reasoning_content", delta.get("reasoning"))
        if isinstance(thought, str) and thought:
            reply.arrived()
            reply.t_thinking = reply.t_thinking or reply.t_last
            reply.reasoning += thought
            events.append(Reasoning(thought))
        content = delta.get("content")
        if isinstance(content, str) and content:
            reply.arrived()
            if reply.t_thinking and not reply.t_thought:
                reply.t_thought = reply.t_last
            reply.text += content
            events.append(_token(content, choice.get("logprobs")))
        if _gather_calls(delta.get("tool_calls"), reply):
            reply.call_deltas += 1  # a call streams: the model is writing (CallProgress)
            if reply.t_thinking and not reply.t_thought:
                reply.t_thought = time.perf_counter()
            events.append(CallProgress(reply.call_deltas))
        if isinstance(choice.get("finish_reason"), str):
            reply.finish = choice["finish_reason"]
    return events


def tool_calls(reply: StreamedReply, base_url: str) -> tuple[ToolCall, ...]:
    """The calls the server streamed, gathered by index.

    Raises:
        EngineError: a call without a name, or arguments that are not a JSON object.
    """
    calls: list[ToolCall] = []
    for index in sorted(reply.calls):
        part = reply.calls[index]
        name = part.get("name", "")
        if not name:
            raise EngineError(f"{base_url}: the server sent a tool call without a function name")
        try:
            arguments = json.loads(part.get("arguments") or "{}")
        except json.JSONDecodeError:
            arguments = None
        if not isinstance(arguments, dict):
            raise EngineError(f"{base_url}: the server sent a call to {name!r} whose arguments are not JSON")
        call_id = part.get("id") or f"call_{index}"
        calls.append(ToolCall(call_id, name, arguments, json.dumps({"name": name, "arguments": arguments})))
    return tuple(calls)


def finish_reason(reply: StreamedReply) -> FinishReason:
    """The engine's finish reason for the server's ``finish_reason``."""
    return "length" if reply.finish == "length" else "stop"


def reasoning_tokens(reply: StreamedReply) -> int:
    """The thinking's tokens, where the server's usage counts them (else 0)."""
    usage = reply.usage
    details = usage.get("completion_tokens_details") if isinstance(usage, dict) else None
    count = details.get("reasoning_tokens") if isinstance(details, dict) else None
    return count if isinstance(count, int) and count >= 0 else 0


def reply_stats(
    reply: StreamedReply,
    planned_prompt: int,
    evicted: int,
    n_ctx: int,
    budget: dict[str, int],
    t0: float,
    template: str,
) -> Stats:
    """The reply's Stats: the server's token counts (``usage``, else llama.cpp's ``timings``, else
    the plan's prompt and the deltas counted, with ``budget["estimated"]`` set) and timings (the
    server's where it reports them, else the client's); the decode rate is always the client's,
    the rate the user sees. ``t0`` is when the request was sent (``time.perf_counter``)."""
    usage = reply.usage or {}
    timings = reply.timings or {}
    prompt = _int(usage.get("prompt_tokens"))
    if prompt is None and _int(timings.get("prompt_n")) is not None:
        prompt = (_int(timings.get("prompt_n")) or 0) + (_int(timings.get("cache_n")) or 0)
    details = usage.get("prompt_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else None
    if cached is None:
        cached = _int(timings.get("cache_n"))
    completion = _int(usage.get("completion_tokens"))
    if completion is None:
        completion = _int(timings.get("predicted_n"))
    if prompt is None or completion is None:
        budget["estimated"] = 1
    prompt = planned_prompt if prompt is None else prompt
    completion = reply.deltas if completion is None else completion
    cached = cached or 0

    end = reply.t_last or time.perf_counter()
    ttft_ms = ((reply.t_first or end) - t0) * 1000
    prefill_ms = _float(timings.get("prompt_ms")) or ttft_ms
    client_decode_ms = (end - reply.t_first) * 1000 if reply.t_first else 0.0
    decode_ms = _float(timings.get("predicted_ms")) or client_decode_ms
    new_prompt = max(prompt - cached, 0)
    prefill_tps = new_prompt / (prefill_ms / 1000) if prefill_ms > 0 else 0.0
    # Client-measured: the rate the user sees (the first token's wait is TTFT, not decode).
    decoded = max(completion - 1, 0)
    decode_tps = decoded / (client_decode_ms / 1000) if client_decode_ms > 0 and decoded else 0.0
    return Stats(
        n_ctx=n_ctx,
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=completion,
        context_used=prompt + completion,
        evicted_messages=evicted,
        ttft_ms=round(ttft_ms, 2),
        prefill_ms=round(prefill_ms, 2),
        decode_ms=round(decode_ms, 2),
        prefill_tps=round(prefill_tps, 2),
        decode_tps=round(decode_tps, 2),
        template=template,
        budget=budget,
    )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _float(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


def _gather_calls(deltas: Any, reply: StreamedReply) -> bool:
    """Adds streamed ``tool_calls`` deltas to the calls being gathered (by ``index``; the name and the
    id come once, the arguments in pieces). Returns whether there was one."""
    if not isinstance(deltas, list):
        return False
    gathered = False
    for number, delta in enumerate(deltas):
        if not isinstance(delta, dict):
            continue
        gathered = True
        index = delta.get("index", number)
        part = reply.calls.setdefault(index if isinstance(index, int) else number, {})
        if isinstance(delta.get("id"), str) and delta["id"]:
            part["id"] = delta["id"]
        function = delta.get("function")
        if isinstance(function, dict):
            if isinstance(function.get("name"), str) and function["name"]:
                part["name"] = part.get("name", "") + function["name"]
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                part["arguments"] = part.get("arguments", "") + arguments
            elif isinstance(arguments, dict):  # some servers send the object itself
                part["arguments"] = json.dumps(arguments)
    return gathered


def _token(text: str, logprobs: Any) -> Token:
    """A content delta as a Token, with the server's log-probability when it sent one."""
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list) or not content or not isinstance(content[-1], dict):
        return Token(text, -1)
    last = content[-1]
    value = last.get("logprob")
    top = last.get("top_logprobs")
    alternatives = tuple(
        (str(alt["token"]), float(alt["logprob"]))
        for alt in (top if isinstance(top, list) else [])
        if isinstance(alt, dict) and isinstance(alt.get("logprob"), int | float) and "token" in alt
    )
    return Token(text, -1, logprob=float(value) if isinstance(value, int | float) else None, top_logprobs=alternatives)
