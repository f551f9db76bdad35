"""The HTTP side of a streamable-HTTP MCP server, bounded: one answer is read up to 8 MiB.

The SDK reads the answer to a ``POST`` whole (``response.aread()`` for JSON, the event stream for
SSE) before it parses it: a 100 MiB tool result took a gigabyte. :class:`CappedTransport` wraps the
HTTP client's transport: the body of an answer to one of our requests is read up to
:data:`engine.agent.mcp_stdio.MAX_MESSAGE_BYTES`; past that the rest is read and dropped (its end
kept for nothing but its length), and the SDK is handed instead the answer
:func:`engine.agent.mcp_stdio.cut_answer` makes of its start, in the shape the server used (JSON, or
one SSE ``message`` event): a tool's text, cut with a visible marker, or an error naming the limit.
The long-lived ``GET`` event stream (server notifications) is not capped: the SDK bounds each of its
events.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx2

from engine.agent.mcp_stdio import MAX_MESSAGE_BYTES, cut_answer

log = logging.getLogger(__name__)


class CappedTransport(httpx2.AsyncBaseTransport):
    """An ``httpx2`` transport that caps the answers of ``inner`` (see the module docstring).

    Args:
        name: the server's name, for the log.
        inner: the transport that does the requests (default: an ``httpx2.AsyncHTTPTransport``).
    """

    def __init__(self, name: str, inner: Any = None) -> None:
        self._name = name
        self._inner = inner if inner is not None else httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: Any) -> Any:
        response = await self._inner.handle_async_request(request)
        if request.method != "POST":
            return response  # the notification stream: the SDK bounds each event
        ident, method = _request_of(request)
        if ident is None or method is None:
            return response
        kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
        stream = _CappedBody(response.stream, ident, method, kind == "text/event-stream", self._name)
        return httpx2.Response(
            status_code=response.status_code,
            headers=[(k, v) for k, v in response.headers.raw if k.lower() != b"content-length"],
            stream=stream,
            extensions=response.extensions,
            request=request,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


def _request_of(request: Any) -> tuple[object, str | None]:
    """The id and method of the JSON-RPC request a POST carries (None, None for a notification)."""
    try:
        body = json.loads(request.content)
    except (ValueError, TypeError, AttributeError):
        return None, None
    if not isinstance(body, dict) or "id" not in body or not isinstance(body.get("method"), str):
        return None, None
    return body["id"], body["method"]


class _CappedBody(httpx2.AsyncByteStream):
    """An async byte stream that passes at most :data:`MAX_MESSAGE_BYTES` on, then the cut answer."""

    def __init__(self, inner: Any, ident: object, method: str, sse: bool, name: str) -> None:
        self._inner = inner
        self._ident = ident
        self._method = method
        self._sse = sse
        self._name = name

    async def __aiter__(self) -> AsyncIterator[bytes]:
        held = bytearray()  # what is held back until the answer is known to fit
        size = 0
        async for chunk in self._inner:
            size += len(chunk)
            if size <= MAX_MESSAGE_BYTES:
                held += chunk
                continue
            if len(held) < MAX_MESSAGE_BYTES:
                held += chunk[: MAX_MESSAGE_BYTES - len(held)]
            # past the cap: the rest is read and dropped
        if size <= MAX_MESSAGE_BYTES:
            yield _without_output_schemas(bytes(held), self._sse) if self._method == "tools/list" else bytes(held)
            return
        log.warning("MCP server %r: its answer to %s was cut (%s bytes)", self._name, self._method, size)
        answer = json.dumps(cut_answer(self._ident, self._method, bytes(held), size), ensure_ascii=False)
        yield (f"event: message\ndata: {answer}\n\n" if self._sse else answer).encode("utf-8")

    async def aclose(self) -> None:
        close = getattr(self._inner, "aclose", None)
        if close is not None:
            await close()


def _without_output_schemas(body: bytes, sse: bool) -> bytes:
    """A tool listing without its tools' ``outputSchema``: Glassbox reads a tool's text, and the
    SDK would check each result against it with Python's ``re`` and no time bound (as
    ``engine.agent.mcp_stdio`` does for a stdio server). A body it cannot read is left as it is."""
    if not sse:
        return _strip_listing(body) or body
    events = body.split(b"\n\n")
    out: list[bytes] = []
    for event in events:
        lines = event.split(b"\n")
        data = [line[5:].lstrip() for line in lines if line.startswith(b"data:")]
        stripped = _strip_listing(b"\n".join(data)) if data else None
        if stripped is None:
            out.append(event)
            continue
        kept = [line for line in lines if not line.startswith(b"data:")]
        out.append(b"\n".join([*kept, b"data: " + stripped]))
    return b"\n\n".join(out)


def _strip_listing(data: bytes) -> bytes | None:
    try:
        document = json.loads(data)
    except (ValueError, RecursionError):
        return None
    result = document.get("result") if isinstance(document, dict) else None
    tools = result.get("tools") if isinstance(result, dict) else None
    if not isinstance(tools, list):
        return None
    for tool in tools:
        if isinstance(tool, dict):
            tool.pop("outputSchema", None)
    return json.dumps(document, ensure_ascii=False).encode("utf-8")
