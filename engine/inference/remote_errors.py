"""An OpenAI-compatible server's failures as the engine's typed errors (for :mod:`engine.inference.remote`).

Whatever a server's dialect (OpenAI's ``{"error": {"message", "code"}}``, llama.cpp's, vLLM's
``detail``, a plain text body), the error names the server's URL and its message on one line: a
refused key and a 5xx are :class:`~engine.errors.EngineError`, an unknown model
:class:`~engine.errors.ModelLoadError`, a context-length refusal (in the answer, or as an error
event in the middle of a stream) :class:`~engine.errors.ContextOverflow`.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from engine.errors import ContextOverflow, EngineError, ModelLoadError

_MESSAGE_MAX = 300


def one_line(text: str) -> str:
    """``text`` on one line, cut to a readable length."""
    line = " ".join(text.split())
    return line if len(line) <= _MESSAGE_MAX else line[: _MESSAGE_MAX - 1] + "…"


def _server_message(response: httpx.Response) -> tuple[str, str]:
    """The (message, code) a server put in an error response, whatever its dialect."""
    try:
        body = response.read()
    except httpx.HTTPError:
        body = b""
    text = body.decode("utf-8", errors="replace")
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        return one_line(text) or response.reason_phrase, ""
    return message_from_document(document, text)


def message_from_document(document: Any, fallback: str) -> tuple[str, str]:
    """The (message, code) of an error document (``fallback`` when it has no message)."""
    error = document.get("error", document) if isinstance(document, dict) else document
    if isinstance(error, dict):
        message = error.get("message") or error.get("detail") or fallback
        code = error.get("code") or error.get("type") or ""
        return one_line(str(message)), str(code)
    return one_line(str(error)), ""


def looks_like_context_overflow(message: str, code: str) -> bool:
    """Whether a server's error says the prompt exceeds the context (each server words it its own way)."""
    lowered = f"{code} {message}".lower()
    return any(
        needle in lowered
        for needle in (
            "context_length_exceeded",
            "context length",
            "context window",
            "exceed_context_size",
            "maximum context",
            "too many tokens",
        )
    )


def raise_for_status(response: httpx.Response, base_url: str, model: str | None = None) -> None:
    """Maps an HTTP error response to the engine's typed errors (see the module docstring).

    Raises:
        EngineError: 401/403 ("refused the API key"), 5xx and anything else not 2xx.
        ModelLoadError: 404, or a ``model_not_found`` code.
        ContextOverflow: a 400 (or 413) that says the prompt exceeds the context.
    """
    status = response.status_code
    if status < 400:
        return
    message, code = _server_message(response)
    if status in (401, 403):
        raise EngineError(f"{base_url}: the server refused the API key ({status}: {message})")
    if status in (400, 413, 422) and looks_like_context_overflow(message, code):
        raise ContextOverflow(f"{base_url}: the conversation does not fit the server's context: {message}")
    if status == 404 or "model_not_found" in code:
        what = f"model {model!r}" if model else "the requested resource"
        raise ModelLoadError(f"{base_url}: the server has no {what} ({status}: {message})")
    if status >= 500:
        raise EngineError(f"{base_url}: the server failed ({status}): {message}")
    raise EngineError(f"{base_url}: the server rejected the request ({status}): {message}")


def connection_error(base_url: str, exc: httpx.HTTPError) -> EngineError:
    """The one-line error for a transport failure (refused, DNS, TLS, timeout)."""
    if isinstance(exc, httpx.TimeoutException):
        return EngineError(f"{base_url}: the server did not answer in time ({type(exc).__name__})")
    reason = one_line(str(exc)) or type(exc).__name__
    if isinstance(exc, httpx.ConnectError):
        return EngineError(f"cannot reach {base_url}: {reason}")
    return EngineError(f"{base_url}: the connection failed: {reason}")
