"""The errors ``glassbox serve`` answers with: a status and an OpenAI-style ``{"error": {...}}`` body.

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

log = logging.getLogger("glassbox.serve")

T = TypeVar("T")


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

    def body(self) -> dict[str, dict[str, str | None]]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def map_errors(fn: Callable[[], T]) -> T:
    """Runs ``fn``, turning the engine's and rag's typed errors into HTTP errors (:func:`http_error_for`)."""
    from rag.errors import RagError

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
    from rag.errors import RagError

    if isinstance(exc, HttpError):
        return exc
    if isinstance(exc, ContextOverflow):
        return HttpError(400, str(exc), code="context_length_exceeded")
    field = _request_field(exc)
    if field is not None:
        return HttpError(400, str(exc), code="invalid_value", param=field)
    if isinstance(exc, TemplateError):
        # Only a template's own raise_exception(message) is about the conversation; a template
        # that breaks says Python's words, which stay here.
        from engine.inference.templates import _TemplateRaised

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
