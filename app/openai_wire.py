"""The OpenAI chat-completions wire format for ``glassbox serve`` (:mod:`app.serve`).

Turns request bodies into engine calls (messages into system prompt, history and the new user
message; sampling fields into :class:`~engine.runtime.GenerationParams`) and engine results into
OpenAI-shaped documents (``chat.completion``, ``usage``, and llama.cpp-style ``timings``). Errors are
:class:`HttpError`: a status plus an OpenAI-style ``{"error": {...}}`` body.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.errors import ContextOverflow, EngineError, ModelFileError, ModelLoadError, TemplateError

MAX_MESSAGES = 2048
"""Most messages one chat request may carry (planning the context window costs more per message)."""

TEXT_CHARS_PER_TOKEN = 32
"""Message text allowed per token of the context window: the cap on a request's text is this many
characters per token of the window, but never under :data:`MIN_TEXT_CHARS`."""

MIN_TEXT_CHARS = 256 * 1024
"""The cap on a request's text (all messages together, in characters) for a small or unknown window."""

MAX_STOP_STRINGS = 16
"""Most stop strings per request (OpenAI allows 4)."""

MAX_STOP_CHARS = 256
"""Longest stop string, in characters."""


def text_limit(n_ctx: int | None) -> int:
    """The most characters of message text one request may carry for a window of ``n_ctx`` tokens.

    Tokenizing costs more than linear time in the text (llama.cpp splits it at every special token,
    and some vocabularies make each newline one), so the text is capped before anything is counted.
    """
    return max(MIN_TEXT_CHARS, TEXT_CHARS_PER_TOKEN * (n_ctx or 0))


class HttpError(Exception):
    """An error answer: status and an OpenAI-style error body.

    ``retry_after`` (seconds), when set, is sent as a ``Retry-After`` header.
    """

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        code: str | None = None,
        *,
        retry_after: int | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.code = code
        self.retry_after = retry_after

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": None, "code": self.code}}


@dataclass(frozen=True)
class ChatRequest:
    """A parsed ``/v1/chat/completions`` body, in the engine's terms."""

    system: str | None
    history: list[Any]
    user: str
    params: Any
    stream: bool
    include_usage: bool
    knowledge_bases: tuple[str, ...]


def _text_content(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                raise HttpError(400, f"messages[{index}]: only text content is supported", code="unsupported_content")
        return "".join(parts)
    raise HttpError(400, f"messages[{index}].content must be a string or a list of text parts")


def parse_chat(body: dict[str, Any], default_kbs: tuple[str, ...], max_chars: int = MIN_TEXT_CHARS) -> ChatRequest:
    """Turns a ``/v1/chat/completions`` body into engine terms.

    Args:
        body: the parsed JSON body.
        default_kbs: knowledge bases to answer from when the body names none.
        max_chars: the most characters of message text allowed (see :func:`text_limit`).

    Raises:
        HttpError: 400 with the reason (a bad field, more than :data:`MAX_MESSAGES` messages or
            ``max_chars`` characters, more than :data:`MAX_STOP_STRINGS` stop strings or one longer
            than :data:`MAX_STOP_CHARS`).
    """
    from pydantic import ValidationError

    from engine.context import Message
    from engine.runtime import GenerationParams

    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise HttpError(400, "'messages' must be a non-empty list", code="invalid_messages")
    if len(messages) > MAX_MESSAGES:
        raise HttpError(
            400,
            f"'messages' has {len(messages)} messages; at most {MAX_MESSAGES} are allowed per request",
            code="too_many_messages",
        )
    system_parts: list[str] = []
    turns: list[Message] = []
    chars = 0
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise HttpError(400, f"messages[{index}] must be an object")
        role = message.get("role")
        text = _text_content(message.get("content"), index)
        chars += len(text)
        if chars > max_chars:
            raise HttpError(
                400,
                f"the messages hold more than {max_chars} characters of text, the most allowed per request "
                "with this context window: shorten the conversation",
                code="context_length_exceeded",
            )
        if role in ("system", "developer"):
            system_parts.append(text)
        elif role == "user":
            turns.append(Message("user", text))
        elif role == "assistant":
            turns.append(Message("assistant", text))
        else:
            raise HttpError(400, f"messages[{index}]: role {role!r} is not supported (system, user, assistant)")
    if not turns or turns[-1].role != "user":
        raise HttpError(400, "the last message must be from the user", code="invalid_messages")
    if body.get("n", 1) != 1:
        raise HttpError(400, "only n=1 is supported")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if isinstance(stop, list):
        if len(stop) > MAX_STOP_STRINGS:
            raise HttpError(
                400, f"'stop' has {len(stop)} strings; at most {MAX_STOP_STRINGS} are allowed", code="invalid_value"
            )
        for index, string in enumerate(stop):
            if isinstance(string, str) and len(string) > MAX_STOP_CHARS:
                raise HttpError(
                    400,
                    f"stop[{index}] is {len(string)} characters long; at most {MAX_STOP_CHARS} are allowed",
                    code="invalid_value",
                )
    options: dict[str, Any] = {
        "max_tokens": body.get("max_completion_tokens", body.get("max_tokens")),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "top_k": body.get("top_k"),
        "min_p": body.get("min_p"),
        "repeat_penalty": body.get("repeat_penalty"),
        "seed": body.get("seed"),
        "stop": tuple(stop) if isinstance(stop, list) else stop,
    }
    try:
        params = GenerationParams(**{k: v for k, v in options.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "request"
        raise HttpError(400, f"{where}: {first.get('msg', 'invalid value')}", code="invalid_value") from None
    kbs = body.get("knowledge_base")
    if isinstance(kbs, str):
        kbs = [kbs]
    if kbs is None:
        kbs = list(default_kbs)
    if not isinstance(kbs, list) or not all(isinstance(k, str) and k for k in kbs):
        raise HttpError(400, "'knowledge_base' must be a name or a list of names")
    stream_options = body.get("stream_options")
    include_usage = isinstance(stream_options, dict) and bool(stream_options.get("include_usage"))
    return ChatRequest(
        system="\n\n".join(system_parts) if system_parts else None,
        history=turns[:-1],
        user=turns[-1].content,
        params=params,
        stream=bool(body.get("stream", False)),
        include_usage=include_usage,
        knowledge_bases=tuple(kbs),
    )


def map_errors(fn: Callable[[], Any]) -> Any:
    """Runs ``fn``, turning the engine's and rag's typed errors into HTTP errors."""
    from rag.errors import RagError

    try:
        return fn()
    except ContextOverflow as exc:
        raise HttpError(400, str(exc), code="context_length_exceeded") from None
    except TemplateError as exc:
        raise HttpError(400, str(exc), code="template_error") from None
    except (ModelFileError, ModelLoadError) as exc:
        raise HttpError(503, str(exc), "server_error", code="model_unavailable") from None
    except EngineError as exc:
        raise HttpError(500, str(exc), "server_error") from None
    except RagError as exc:
        raise HttpError(400, str(exc), code="knowledge_base_error") from None


def finish_reason(reason: str) -> str:
    return "length" if reason == "length" else "stop"


def usage_document(stats: Any) -> dict[str, Any]:
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.completion_tokens,
        "total_tokens": stats.prompt_tokens + stats.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.cached_tokens},
    }


def timings_document(stats: Any) -> dict[str, Any]:
    """llama.cpp's server's ``timings`` shape, so its clients read our figures too."""
    return {
        "prompt_n": stats.prompt_tokens - stats.cached_tokens,
        "cache_n": stats.cached_tokens,
        "prompt_ms": stats.prefill_ms,
        "prompt_per_second": stats.prefill_tps,
        "predicted_n": stats.completion_tokens,
        "predicted_ms": stats.decode_ms,
        "predicted_per_second": stats.decode_tps,
    }


def completion_document(
    completion_id: str, created: int, model: str, finished: Any, sources: list[dict[str, Any]]
) -> dict[str, Any]:
    document: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": finished.text},
                "finish_reason": finish_reason(finished.reason),
                "logprobs": None,
            }
        ],
        "usage": usage_document(finished.stats),
        "timings": timings_document(finished.stats),
    }
    if sources:
        document["sources"] = sources
    return document
