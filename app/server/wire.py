"""The OpenAI chat-completions wire format for ``glassbox serve`` (:mod:`app.server.http`).

Turns request bodies into engine calls (messages into system prompt, history and the new user
message; sampling fields into :class:`~engine.runtime.GenerationParams`) and engine results into
OpenAI-shaped documents (``chat.completion``, ``usage``, and llama.cpp-style ``timings``). Errors are
:class:`HttpError`: a status plus an OpenAI-style ``{"error": {...}}`` body.

Hostile bodies (:func:`parse_body`): a body must be UTF-8 JSON, nested at most :data:`MAX_JSON_DEPTH`
levels (checked before parsing, without recursion), with no number literal longer than
:data:`MAX_NUMBER_CHARS` characters, no ``NaN``/``Infinity`` and no number too large for a float, and
no lone UTF-16 surrogate (``"\\ud800"``) in any string; anything else is a 400 naming what is wrong.
Answers never carry Python exception text: the server's own failures are a fixed message, and
the detail goes to the server log (:func:`http_error_for`).
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.errors import (
    ContextOverflow,
    EngineCrashed,
    EngineError,
    ModelFileError,
    ModelLoadError,
    TemplateError,
)

log = logging.getLogger("glassbox.serve")

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

MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects in a request body (the API's own documents need 5)."""

MAX_NUMBER_CHARS = 100
"""Longest number literal in a request body (Python refuses integers of more than 4,300 digits, and
converting a long one costs quadratic time)."""


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
        param: str | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.code = code
        self.retry_after = retry_after
        self.param = param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


# ---------------------------------------------------------------------------- hostile bodies

_NOT_MARKS = bytes(b for b in range(256) if b not in b'"[]{}')
_FLAT = bytes.maketrans(b"{}", b"[]")
_QUOTED = re.compile(rb'"[^"]*"')
_RUN = re.compile(rb"\[+|\]+")
_LEAF_PASSES = 12
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_SIMPLE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


class _BadNumber(ValueError):
    """A number literal the parser refuses (raised from inside ``json.loads``)."""


def nesting_exceeds(body: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when the JSON text ``body`` nests arrays and objects more than ``limit`` levels deep.

    Brackets inside strings do not count. No recursion and no loop over bytes in Python: the
    strings are cut out and the brackets kept with C-speed byte operations, the innermost empty
    pairs are removed a few times over (each pass takes one level off every branch), and what is
    left is walked one run of equal brackets at a time. On malformed text the answer may be either;
    the parser rejects that text anyway, after at most ``2 * limit`` levels.
    """
    # Inside strings, a backslash always pairs with the next character: drop the escaped ones.
    unescaped = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    # Keep quotes and brackets. Two adjacent quotes are an empty string, or the end of one string
    # and the start of the next with nothing but separators between: either way, nothing to count.
    marks = unescaped.translate(None, _NOT_MARKS).replace(b'""', b"")
    brackets = _QUOTED.sub(b"", marks).translate(_FLAT, b'"')
    if b"[" * (limit + 1) in brackets:
        return True
    removed = 0
    while removed < _LEAF_PASSES:
        shorter = brackets.replace(b"[]", b"")
        if len(shorter) == len(brackets):
            break
        brackets = shorter
        removed += 1
    if removed > limit:
        return True
    depth = 0
    for run in _RUN.findall(brackets):
        depth += len(run) if run[:1] == b"[" else -len(run)
        if depth + removed > limit:
            return True
    return False


def _parse_int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise _BadNumber(f"the request body holds a number longer than {MAX_NUMBER_CHARS} characters")
    return int(text)


def _parse_float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise _BadNumber(f"the request body holds a number longer than {MAX_NUMBER_CHARS} characters")
    value = float(text)
    if not math.isfinite(value):
        raise _BadNumber("the request body holds a number too large for a 64-bit float")
    return value


def _parse_constant(text: str) -> Any:
    raise _BadNumber(f"the request body holds {text[:9]}, which is not JSON")


def _field_name(key: str) -> str:
    """How a key appears in a field's path: as is when plain, else quoted and cut (it is echoed back)."""
    return key if _SIMPLE_KEY.fullmatch(key) else json.dumps(key[:32])


def encode_text(text: str) -> bytes:
    """``text`` as UTF-8, a lone surrogate (which UTF-8 cannot carry) becoming U+FFFD."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text).encode("utf-8")


def lone_surrogate_field(document: Any) -> str | None:
    """The path (``messages[0].content``) of the first string or key in ``document`` holding a lone
    UTF-16 surrogate, which no UTF-8 text can carry; None when there is none. Iterative."""
    stack: list[tuple[Any, str]] = [(document, "")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                return where or "the request body"
        elif isinstance(value, dict):
            items = list(value.items())
            for key, _ in items:
                if _SURROGATE.search(key):
                    return f"{where or 'the request body'} (a key)"
            stack.extend(
                (item, f"{where}.{_field_name(key)}" if where else _field_name(key)) for key, item in reversed(items)
            )
        elif isinstance(value, list):
            stack.extend((item, f"{where}[{index}]") for index, item in reversed(list(enumerate(value))))
    return None


def parse_body(body: bytes) -> dict[str, Any]:
    """A request body as a JSON object, refusing hostile shapes with a 400 that says what is wrong.

    Raises:
        HttpError: 400: not UTF-8, not JSON, nested deeper than :data:`MAX_JSON_DEPTH`, a number
            longer than :data:`MAX_NUMBER_CHARS` or out of a float's range, ``NaN``/``Infinity``,
            not an object, or a string holding a lone surrogate (named in ``param``).
    """
    try:
        text = body.decode("utf-8-sig")  # strict: UTF-8-encoded surrogates are refused here
    except UnicodeDecodeError as exc:
        raise HttpError(400, f"the request body is not UTF-8 (byte {exc.start})", code="invalid_json") from None
    if nesting_exceeds(body):
        raise HttpError(
            400, f"the request body nests arrays or objects more than {MAX_JSON_DEPTH} levels deep", code="invalid_json"
        )
    try:
        document = json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)
    except json.JSONDecodeError as exc:
        raise HttpError(
            400, f"the request body is not valid JSON (line {exc.lineno}, column {exc.colno})", code="invalid_json"
        ) from None
    except _BadNumber as exc:
        raise HttpError(400, str(exc), code="invalid_json") from None
    except RecursionError:  # not reached past nesting_exceeds; kept so that a miss is still a 400
        raise HttpError(400, "the request body nests arrays or objects too deeply", code="invalid_json") from None
    if not isinstance(document, dict):
        raise HttpError(400, "the request body must be a JSON object", code="invalid_json")
    # Only a surrogate escape can put a surrogate in a string; most are pairs (an emoji from an
    # ensure_ascii client), which the parser joins: a C-speed look at the document tells, and only a
    # lone one pays for the walk that names its field.
    if _SURROGATE_ESCAPE.search(text) and _SURROGATE.search(json.dumps(document, ensure_ascii=False)):
        where = lone_surrogate_field(document) or "the request body"
        raise HttpError(
            400,
            f"{where}: holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape without its pair), which is "
            "not text: send valid Unicode",
            code="invalid_value",
            param=where,
        )
    return document


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
    """Runs ``fn``, turning the engine's and rag's typed errors into HTTP errors (:func:`http_error_for`)."""
    from rag.errors import RagError

    try:
        return fn()
    except (EngineError, RagError) as exc:
        raise http_error_for(exc) from None


def http_error_for(exc: BaseException) -> HttpError:
    """The answer for an error raised while serving a request.

    A fault of the request (it does not fit the context window; the model's chat template refuses
    it) says why. Every other failure is the server's: the answer is a fixed message and the detail,
    which may hold file paths or Python exception text (the inference worker passes those on as
    ``EngineError``), goes to the server log.
    """
    from rag.errors import RagError

    if isinstance(exc, HttpError):
        return exc
    if isinstance(exc, ContextOverflow):
        return HttpError(400, str(exc), code="context_length_exceeded")
    if isinstance(exc, TemplateError):
        # Only a template's own raise_exception(message) is about the conversation; a template
        # that breaks says Python's words, which stay here.
        from engine.templates import _TemplateRaised

        if isinstance(exc.__cause__, _TemplateRaised):
            return HttpError(400, str(exc), code="template_error")
        log.warning("the chat template failed: %s", exc)
        return HttpError(400, "the model's chat template could not render this conversation", code="template_error")
    if isinstance(exc, ModelFileError | ModelLoadError):
        log.error("the model is not available: %s", exc)
        return HttpError(
            503, "the model is not available; the server log says why", "server_error", "model_unavailable"
        )
    if isinstance(exc, EngineCrashed):
        log.error("%s", exc)
        return HttpError(500, "the inference worker crashed; the server log says why", "server_error", "engine_crashed")
    if isinstance(exc, EngineError):
        log.error("generation failed: %s", exc)
        return HttpError(500, "the model could not answer this request; the server log says why", "server_error")
    if isinstance(exc, RagError):
        log.error("the knowledge bases failed: %s", exc)
        return HttpError(
            500,
            "the knowledge bases could not be searched; the server log says why",
            "server_error",
            "knowledge_base_error",
        )
    log.error("unexpected error while serving a request", exc_info=exc)
    return HttpError(500, "internal server error; the server log says why", "server_error")


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
