"""The errors ``glassbox serve`` answers with: a status and an OpenAI-style ``{"error": {...}}`` body
(Anthropic's ``{"type": "error", ...}`` on ``/v1/messages``), and the typed errors of the engine and
rag mapped to them.

Answers never carry Python exception text: the server's own failures are a fixed message, and the
detail goes to the server log (:func:`http_error_for`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from engine.errors import (
    ContextOverflow,
    EngineCrashed,
    EngineError,
    ModelFileError,
    ModelLoadError,
    TemplateError,
)
from engine.media import MediaError
from rag.errors import RagError

log = logging.getLogger("glassbox.serve")

T = TypeVar("T")


class HttpError(Exception):
    """An error answer: status and an OpenAI-style error body.

    ``retry_after`` (seconds), when set, is sent as a ``Retry-After`` header. Where clients match
    an error by its words (a context overflow, an unknown model: LiteLLM's exception mapping, the
    SDKs' error classes), ``message`` is in OpenAI's words, ``anthropic`` in Anthropic's (for
    ``/v1/messages``), and Glassbox's own explanation goes in the body's ``detail`` field.
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
        detail: str | None = None,
        anthropic: tuple[int, str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.code = code
        self.retry_after = retry_after
        self.param = param
        self.detail = detail
        self.anthropic = anthropic  # (status, error type, message) where Anthropic's differ

    def body(self) -> dict[str, dict[str, str | None]]:
        error = {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}
        if self.detail is not None:
            error["detail"] = self.detail
        return {"error": error}


class ClientGone(Exception):
    """The client closed its connection while its request waited: nobody to answer."""


def anthropic_status(error: HttpError) -> int:
    """The status of ``error`` in Anthropic's API (an overload is its 529)."""
    return error.anthropic[0] if error.anthropic is not None else error.status


def anthropic_error(error: HttpError) -> dict[str, object]:
    """Anthropic's error body (``{"type": "error", "error": {"type", "message"}}``; Glassbox's own
    explanation, where the message is Anthropic's wording, in ``detail``)."""
    if error.anthropic is not None:
        _, kind, message = error.anthropic
    else:
        kinds = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error"}
        kinds.update({404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error"})
        kinds[503] = "overloaded_error"
        kind = kinds.get(error.status, "api_error" if error.status >= 500 else "invalid_request_error")
        message = error.message
    body: dict[str, object] = {"type": kind, "message": message}
    if error.detail is not None:
        body["detail"] = error.detail
    return {"type": "error", "error": body}


def context_length_error(
    n_ctx: int | None, prompt_tokens: int | None, reserve: int, detail: str, param: str | None = "messages"
) -> HttpError:
    """A 400 ``context_length_exceeded`` in the words OpenAI and Anthropic use, which clients match
    (LiteLLM raises ``ContextWindowExceededError`` and runs its fallbacks on them); ``detail`` is
    Glassbox's own explanation."""
    window = f"{n_ctx} tokens" if n_ctx is not None else "smaller than this request"
    if prompt_tokens is None:
        told = "your messages resulted in more tokens than that. Please reduce the length of the messages"
        anthropic = f"prompt is too long: it exceeds the {window} maximum"
    elif n_ctx is not None and prompt_tokens <= n_ctx and reserve:
        told = (
            f"you requested {prompt_tokens + reserve} tokens ({prompt_tokens} in the messages, {reserve} in the "
            "completion). Please reduce the length of the messages or completion"
        )
        anthropic = f"prompt is too long: {prompt_tokens} tokens + {reserve} max_tokens > {n_ctx} maximum"
    else:
        told = f"your messages resulted in {prompt_tokens} tokens. Please reduce the length of the messages"
        anthropic = f"prompt is too long: {prompt_tokens} tokens > {n_ctx} maximum"
    return HttpError(
        400,
        f"This model's maximum context length is {window}. However, {told}.",
        code="context_length_exceeded",
        param=param,
        detail=detail,
        anthropic=(400, "invalid_request_error", anthropic),
    )


def model_not_found(name: str, detail: str, param: str = "model") -> HttpError:
    """OpenAI's 404 ``model_not_found`` (Anthropic's ``not_found_error``) for a model not served."""
    shown = name[:200]
    return HttpError(
        404,
        f"The model `{shown}` does not exist or you do not have access to it.",
        code="model_not_found",
        param=param,
        detail=detail,
        anthropic=(404, "not_found_error", f"model: {shown}"),
    )


def overloaded(detail: str, retry_after: int) -> HttpError:
    """A 503 with ``Retry-After`` (Anthropic: 529 ``overloaded_error``) when the model is busy:
    the SDKs retry both after the time the header says."""
    return HttpError(
        503,
        f"The server is overloaded with other requests. Please retry your request after {retry_after} seconds.",
        "server_error",
        "overloaded",
        retry_after=retry_after,
        detail=detail,
        anthropic=(529, "overloaded_error", "Overloaded"),
    )


def map_errors(fn: Callable[[], T]) -> T:
    """Runs ``fn``, turning the engine's and rag's typed errors into HTTP errors (:func:`http_error_for`)."""
    try:
        return fn()
    except (EngineError, RagError) as exc:
        raise http_error_for(exc) from None


REQUEST_FIELDS = ("json_schema", "grammar", "logit_bias")
"""The fields whose refusals the decode loop names first ("json_schema: 'minimum' at ... cannot be
enforced"): its EngineError crosses the worker's pipe as text, and such an error is the request's."""


def _request_field(exc: BaseException) -> str | None:
    if type(exc) is not EngineError:
        return None
    text = str(exc)
    return next((name for name in REQUEST_FIELDS if text.startswith(f"{name}: ")), None)


def http_error_for(exc: BaseException) -> HttpError:
    """The answer for an error raised while serving a request.

    A fault of the request (it does not fit the context window; the model's chat template refuses
    it) says why. Every other failure is the server's: the answer is a fixed message and the detail,
    which may hold file paths or Python exception text (the inference worker passes those on as
    ``EngineError``), goes to the server log.
    """
    if isinstance(exc, HttpError):
        return exc
    if isinstance(exc, ContextOverflow):
        return context_length_error(exc.n_ctx, exc.prompt_tokens, exc.reserve, str(exc))
    if isinstance(exc, MediaError):
        # An image the model cannot see (no projector) or cannot read: the request's fault, named.
        return HttpError(400, str(exc), code="invalid_image")
    field = _request_field(exc)
    if field is not None:
        return HttpError(400, str(exc), code="invalid_value", param=field)
    if isinstance(exc, TemplateError):
        # Only a template's own raise_exception(message) is about the conversation; a template
        # that breaks says Python's words, which stay here.
        # lazy: start-up (+35 ms: jinja2)
        from engine.inference.template_sandbox import TemplateRaised

        if isinstance(exc.__cause__, TemplateRaised):
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
