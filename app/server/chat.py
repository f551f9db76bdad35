"""``POST /v1/chat/completions``: OpenAI's chat completions over the engine, whole or streamed.

One request may ask for ``n`` choices (generated one after another, a given seed advancing by one
per choice), ``logprobs``, tools (the calls come back as ``tool_calls``, in whole messages and in
streamed deltas, with ``finish_reason: "tool_calls"``), and constrained output. The streamed form:
a first chunk with the role, one chunk per token (``content``), thinking (``reasoning_content``) or
call (``tool_calls``), a chunk with the ``finish_reason`` and llama.cpp's ``timings``, then, only
with ``stream_options.include_usage``, the ``usage`` chunk (``choices: []``), then ``[DONE]``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

from app.knowledge_glue import kept_sources
from app.server.errors import map_errors
from app.server.sse import openai_error_events
from app.server.turn import check_fits, hold_model, open_stream, read_turn, whole_choice
from app.server.wire import (
    ChatRequest,
    ChunkDocument,
    DeltaDocument,
    LogprobsDocument,
    Source,
    TimingsDocument,
    completion_document,
    finish_reason,
    forced_call,
    keeps_call,
    logprob_entry,
    parse_chat,
    timings_document,
    tool_call_document,
    truncated_call,
    usage_document,
)
from engine.inference.events import Event, Finished, PrefillProgress, Reasoning, Stats, Token, ToolCall

if TYPE_CHECKING:
    from app.knowledge_glue import Passages
    from app.server.exchange import Exchange


def handle(handler: Exchange) -> None:
    """Answers ``POST /v1/chat/completions``."""
    state = handler.state
    body = handler.read_json()
    request, wanted = read_turn(
        handler, body, lambda b, chars, vocab, ctx: parse_chat(b, state.default_kbs, chars, vocab, ctx)
    )
    with hold_model(handler, wanted, request) as cancel:
        passages: Passages | None = None
        if request.knowledge_bases:
            query = request.user or _last_user_text(request)
            passages = map_errors(lambda: state.retrieve(request.knowledge_bases, query))
        documents = passages.documents if passages is not None else None
        check_fits(state.backend, request, documents)
        if request.stream:
            _stream(handler, request, passages, cancel)
        else:
            choices = [whole_choice(handler, request, index, passages, cancel) for index in range(request.n)]
            stats = choices[0].finished.stats  # the same passages for every choice
            sources: list[Source] = kept_sources(passages, stats)
            completion = completion_document(
                f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), state.model_id, choices, sources, request.top_logprobs
            )
            if stats.documents_dropped:
                completion["documents_dropped"] = stats.documents_dropped
            handler.send_json(200, completion)


def _last_user_text(request: ChatRequest) -> str:
    return next((m.content for m in reversed(request.messages) if m.role == "user"), "")


# ---------------------------------------------------------------------------- streaming


def _stream(handler: Exchange, request: ChatRequest, passages: Passages | None, cancel: threading.Event) -> None:
    def produce(first: Iterator[Event]) -> None:
        _ChunkStream(handler, request, passages, cancel).produce(first)

    handler.stream(
        open_stream(handler.state.backend, request, 0, passages, cancel), cancel, produce, openai_error_events
    )


class _ChunkStream:
    """The ``chat.completion.chunk`` events of one streamed request, choice after choice."""

    def __init__(
        self,
        handler: Exchange,
        request: ChatRequest,
        passages: Passages | None,
        cancel: threading.Event,
    ) -> None:
        self.handler = handler
        self.request = request
        self.passages = passages  # their sources, and how many the band dropped, end the last choice
        self.cancel = cancel
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = handler.state.model_id
        self.first_stats: Stats | None = None
        self.completion_tokens = 0
        self.clock = _RunningTimings()  # timings_per_token: the figures so far, in each chunk

    def chunk(
        self,
        index: int,
        delta: DeltaDocument,
        finish: str | None = None,
        logprobs: LogprobsDocument | None = None,
    ) -> ChunkDocument:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
        }

    def produce(self, first: Iterator[Event]) -> None:
        """Streams every choice (``first``: choice 0's events), the usage when asked, then ``[DONE]``."""
        request, handler = self.request, self.handler
        for index in range(request.n):
            if index == 0:
                events = first
            else:
                events = handler.generation(
                    open_stream(handler.state.backend, request, index, self.passages, self.cancel), self.cancel
                )
            self.choice(index, events)
        if request.include_usage and self.first_stats is not None:
            usage: ChunkDocument = {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": usage_document(self.first_stats, self.completion_tokens),
            }
            if request.timings_per_token:
                usage["timings"] = timings_document(self.first_stats)
            handler.send_event(usage)
        handler.send_event("[DONE]")

    def choice(self, index: int, events: Iterator[Event]) -> None:
        """The chunks of one choice: the role, then its tokens, thinking and calls, then its end."""
        request = self.request
        clock = self.clock
        clock.start()

        def send(document: ChunkDocument | str) -> None:
            if request.timings_per_token and not isinstance(document, str) and "timings" not in document:
                document["timings"] = clock.document()
            self.handler.send_event(document)

        self.handler.send_event(self.chunk(index, {"role": "assistant", "content": ""}))  # no timings yet
        calls = 0
        # A forced call's text is the call's JSON (the parser holds it to the end anyway): kept
        # until the end says whether it is a call cut off by max_tokens (sent as a call) or text.
        held: list[Token] | None = [] if forced_call(request) else None
        for event in events:
            if isinstance(event, PrefillProgress):
                clock.prompt_n = event.total
            elif isinstance(event, Token):
                clock.token()
            if held is not None and isinstance(event, Token):
                held.append(event)
            elif isinstance(event, Token) and (event.text or event.logprob is not None):
                logprobs: LogprobsDocument | None = None
                if request.top_logprobs is not None and event.logprob is not None:
                    logprobs = {"content": [logprob_entry(event, request.top_logprobs)], "refusal": None}
                send(self.chunk(index, {"content": event.text}, logprobs=logprobs))
            elif isinstance(event, Reasoning) and event.text:
                send(self.chunk(index, {"reasoning_content": event.text}))
            elif isinstance(event, ToolCall) and keeps_call(request, calls):
                send(self.chunk(index, {"tool_calls": [tool_call_document(event, calls)]}))
                calls += 1
            elif isinstance(event, Finished):
                cut = None
                if held is not None and not calls and event.reason == "length":
                    cut = truncated_call("".join(t.text for t in held), request)
                if cut is not None:
                    send(self.chunk(index, {"tool_calls": [tool_call_document(cut, 0, truncated=True)]}))
                    calls = 1
                elif held:
                    text = "".join(t.text for t in held)
                    if text:
                        send(self.chunk(index, {"content": text}))
                self.first_stats = self.first_stats or event.stats
                self.completion_tokens += event.stats.completion_tokens
                last = self.chunk(index, {}, finish_reason(event.reason, calls > 0, cut is not None))
                last["timings"] = timings_document(event.stats)
                sources = kept_sources(self.passages, event.stats)
                if sources and index == request.n - 1:
                    last["sources"] = sources
                if event.stats.documents_dropped and index == request.n - 1:
                    last["documents_dropped"] = event.stats.documents_dropped
                send(last)


class _RunningTimings:
    """llama.cpp's ``timings`` of a reply so far, by the server's clock (``timings_per_token``):
    the prompt's tokens and time until the first token, the tokens since and their rate. The
    reply's last chunk carries the engine's own figures."""

    def __init__(self) -> None:
        self.start()

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self.t_first: float | None = None
        self.prompt_n = 0
        self.predicted_n = 0

    def token(self) -> None:
        if self.t_first is None:
            self.t_first = time.perf_counter()
        self.predicted_n += 1

    def document(self) -> TimingsDocument:
        now = time.perf_counter()
        first = self.t_first if self.t_first is not None else now
        prompt_ms = (first - self.t0) * 1000
        predicted_ms = (now - first) * 1000 if self.t_first is not None else 0.0
        decoded = max(self.predicted_n - 1, 0)
        return {
            "prompt_n": self.prompt_n,
            "cache_n": 0,
            "prompt_ms": round(prompt_ms, 2),
            "prompt_per_second": round(self.prompt_n / (prompt_ms / 1000), 2) if prompt_ms > 0 else 0.0,
            "predicted_n": self.predicted_n,
            "predicted_ms": round(predicted_ms, 2),
            "predicted_per_second": round(decoded / (predicted_ms / 1000), 2) if predicted_ms > 0 else 0.0,
        }
