"""Server-sent events of ``glassbox serve``: one event as a chunk of the chunked body, and the events
that end a stream after a failure, in each dialect (ARCHITECTURE.md, "The HTTP contract").
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from app.server.body import encode_text
from app.server.errors import HttpError, anthropic_error

if TYPE_CHECKING:
    from engine.inference.events import Event

SseEvent = tuple[str | None, Mapping[str, object] | str]
"""One server-sent event to send: its ``event:`` name (None: unnamed) and its data."""

END_OF_BODY = b"0\r\n\r\n"
"""The last chunk of a chunked body: the stream is over."""


def event_chunk(payload: str | Mapping[str, object], event: str | None = None) -> bytes:
    """One event as one chunk: ``data:`` (a JSON document or text), after ``event:`` when named."""
    text = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    data = encode_text(f"{head}data: {text}\n\n")
    return b"%x\r\n%s\r\n" % (len(data), data)


def openai_error_events(error: HttpError) -> list[SseEvent]:
    """The events that end an OpenAI stream after a failure: the error, then ``[DONE]``."""
    return [(None, {"error": {"message": error.message, "type": error.kind, "code": error.code}}), (None, "[DONE]")]


def anthropic_error_events(error: HttpError) -> list[SseEvent]:
    """The event that ends an Anthropic stream after a failure: ``error``, with the error's body."""
    return [("error", anthropic_error(error))]


def with_head(head: Event, events: Iterator[Event]) -> Iterator[Event]:
    """``events`` after ``head``, their first event, pulled before the stream started."""
    yield head
    yield from events
