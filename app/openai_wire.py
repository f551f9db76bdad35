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


class HttpError(Exception):
    """An error answer: status and an OpenAI-style error body."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.code = code

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


def parse_chat(body: dict[str, Any], default_kbs: tuple[str, ...]) -> ChatRequest:
    from pydantic import ValidationError

    from engine.context import Message
    from engine.runtime import GenerationParams

    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise HttpError(400, "'messages' must be a non-empty list", code="invalid_messages")
    system_parts: list[str] = []
    turns: list[Message] = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise HttpError(400, f"messages[{index}] must be an object")
        role = message.get("role")
        text = _text_content(message.get("content"), index)
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
