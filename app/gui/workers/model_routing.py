"""Which backend a model path gets, and the names the window shows for it: a file is a local
session, a pseudo path under ``glassbox-remote/ENDPOINT/MODEL`` is a model on a saved endpoint
(:class:`RoutingSessionFactory`, the LLM worker's session factory). Split from
``app.gui.workers.chat_adapter``, which re-exports these names.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import quote, unquote

from app.gui.workers.llm_worker import LoadRequest, SessionFactory, default_session_factory

if TYPE_CHECKING:
    from engine.inference.backends import ChatBackend

__all__ = [
    "REMOTE_ROOT",
    "STARTER_SHORT_LABEL",
    "RemoteSessionFactory",
    "RoutingSessionFactory",
    "make_remote_session",
    "model_label",
    "model_tooltip",
    "parse_remote_model",
    "remote_model_path",
]

STARTER_SHORT_LABEL = "Gemma 3 270M · starter (tiny base model)"


def model_label(path: Path) -> str:
    """The short name shown for a model file, or ``model-id · endpoint (remote)`` for a remote one.

    The starter model's short name says what it is; the full honest label
    (``engine.starter.STARTER_MODEL_LABEL``) is its tooltip, and a note under the model picker
    explains it while it is loaded.
    """
    from engine.starter import STARTER_MODEL_FILE

    remote = parse_remote_model(path)
    if remote is not None:
        return f"{remote[1]} · {remote[0]} (remote)"
    return STARTER_SHORT_LABEL if path.name == STARTER_MODEL_FILE else path.stem


def model_tooltip(path: Path) -> str:
    """The long description of a model file (the path; the starter's honest label)."""
    from engine.starter import STARTER_MODEL_FILE, STARTER_MODEL_LABEL

    remote = parse_remote_model(path)
    if remote is not None:
        return f"Model {remote[1]!r} on the saved endpoint {remote[0]!r} (an OpenAI-compatible server)"
    return f"{STARTER_MODEL_LABEL}\n{path}" if path.name == STARTER_MODEL_FILE else str(path)


# ---------------------------------------------------------------------------- remote models

REMOTE_ROOT = "glassbox-remote"
"""First part of the pseudo path that names a model on a saved endpoint (never a real file)."""

RemoteSessionFactory = Callable[[Any, str, LoadRequest], "ChatBackend"]
"""Builds a session for ``(engine.inference.endpoints.Endpoint, model_id, request)``."""


def remote_model_path(endpoint: str, model_id: str) -> Path:
    """The pseudo path standing for ``model_id`` on the saved endpoint ``endpoint``.

    The picker, ``LoadRequest.model_path`` and ``settings.last_model`` carry it like a file path;
    :class:`RoutingSessionFactory` turns it into a remote session.
    """
    return Path(REMOTE_ROOT, endpoint, quote(model_id, safe=""))


def parse_remote_model(path: Path) -> tuple[str, str] | None:
    """``(endpoint_name, model_id)`` for a :func:`remote_model_path`, else None (a local file)."""
    parts = path.parts
    if len(parts) != 3 or parts[0] != REMOTE_ROOT:
        return None
    return parts[1], unquote(parts[2])


def make_remote_session(endpoint: Any, model_id: str, request: LoadRequest) -> ChatBackend:
    """The real remote backend (``engine.inference.remote.RemoteSession``) for a saved endpoint."""
    from engine.inference.remote import RemoteSession

    return RemoteSession(
        endpoint.url,
        model_id,
        endpoint.api_key,
        overflow_policy=cast("Any", request.overflow_policy),
        reply_reserve=request.reply_reserve,
    )


class RoutingSessionFactory:
    """The worker's session factory: remote pseudo paths get a remote session, files a local one.

    Runs on the LLM worker thread, so the worker keeps owning every session it makes.

    Args:
        endpoints_file: the saved endpoints (``paths.config / "endpoints.json"``); None: no remotes.
        local: builds local sessions (default: the real engine; tests inject fakes).
        remote: builds remote sessions (default: :func:`make_remote_session`; tests inject fakes).
    """

    def __init__(
        self,
        endpoints_file: Path | None,
        local: SessionFactory | None = None,
        remote: RemoteSessionFactory | None = None,
    ) -> None:
        self.endpoints_file = endpoints_file
        self.local = local or default_session_factory
        self.remote = remote or make_remote_session
        self.last_session: ChatBackend | None = None

    def __call__(self, request: LoadRequest, bandwidth: float | None) -> ChatBackend:
        """A session for ``request``.

        Raises:
            EngineError: a remote model whose endpoint is no longer saved.
        """
        target = parse_remote_model(request.model_path)
        if target is None:
            session = self.local(request, bandwidth)
        else:
            from engine.errors import EngineError
            from engine.inference.endpoints import EndpointStore

            if self.endpoints_file is None:
                raise EngineError(f"{target[0]}: no saved endpoints in this window")
            endpoint = EndpointStore(self.endpoints_file).get(target[0])
            session = self.remote(endpoint, target[1], request)
        self.last_session = session
        return session
