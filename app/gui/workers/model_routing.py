"""Which backend a model gets, and the names the window shows for it: a file is a local session, an
``app.compose.RemoteModel`` a model on a saved endpoint (:class:`RoutingSessionFactory`, the LLM
worker's session factory). The picker's data and ``settings.last_model`` hold ``app.compose.model_key``
texts, read back with ``app.compose.model_ref``. Split from ``app.gui.workers.chat_adapter``, which
re-exports these names.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from app.compose import BackendOptions, LocalModel, ModelRef, RemoteModel, find_endpoint, model_ref, open_remote_session
from app.gui.workers.llm_loading import SessionFactory, default_session_factory
from app.gui.workers.llm_requests import LoadRequest

if TYPE_CHECKING:
    from engine.inference.backends import ChatBackend
    from engine.inference.endpoints import Endpoint

__all__ = [
    "STARTER_SHORT_LABEL",
    "RemoteSessionFactory",
    "RoutingSessionFactory",
    "make_remote_session",
    "model_label",
    "model_tooltip",
    "parse_remote_model",
    "picker_model",
]

STARTER_SHORT_LABEL = "Gemma 3 270M · starter (tiny base model)"


def model_label(path: Path | ModelRef) -> str:
    """The short name shown for a model file, or ``model-id · endpoint (remote)`` for a remote one.

    The starter model's short name says what it is; the full honest label
    (``engine.starter.STARTER_MODEL_LABEL``) is its tooltip, and a note under the model picker
    explains it while it is loaded.
    """
    # lazy: start-up (+5 ms)
    from engine.starter import STARTER_MODEL_FILE

    ref = model_ref(path)
    if isinstance(ref, RemoteModel):
        return f"{ref.model_id} · {ref.endpoint} (remote)"
    return STARTER_SHORT_LABEL if ref.path.name == STARTER_MODEL_FILE else ref.path.stem


def model_tooltip(path: Path | ModelRef) -> str:
    """The long description of a model file (the path; the starter's honest label)."""
    # lazy: start-up (+4 ms)
    from engine.starter import STARTER_MODEL_FILE, STARTER_MODEL_LABEL

    ref = model_ref(path)
    if isinstance(ref, RemoteModel):
        return f"Model {ref.model_id!r} on the saved endpoint {ref.endpoint!r} (an OpenAI-compatible server)"
    return f"{STARTER_MODEL_LABEL}\n{ref.path}" if ref.path.name == STARTER_MODEL_FILE else str(ref.path)


def picker_model(data: str | Path | ModelRef) -> Path | RemoteModel:
    """The model a picker entry (an ``app.compose.model_key`` text) or a saved ``last_model``
    names, as the window's requests carry it: a local model as its file, a remote one as itself
    (an old ``glassbox-remote/...`` pseudo path is read as the remote model it meant)."""
    ref = model_ref(data)
    return ref.path if isinstance(ref, LocalModel) else ref


def parse_remote_model(model: str | Path | ModelRef) -> tuple[str, str] | None:
    """``(endpoint_name, model_id)`` when ``model`` names a model on a saved endpoint (an
    ``app.compose.RemoteModel``, its key, or an old ``glassbox-remote/...`` pseudo path), else None."""
    ref = model_ref(model)
    return (ref.endpoint, ref.model_id) if isinstance(ref, RemoteModel) else None


# ---------------------------------------------------------------------------- remote models

RemoteSessionFactory = Callable[["Endpoint", str, LoadRequest], "ChatBackend"]
"""Builds a session for ``(engine.inference.endpoints.Endpoint, model_id, request)``."""


def make_remote_session(endpoint: Endpoint, model_id: str, request: LoadRequest) -> ChatBackend:
    """The real remote backend (``engine.inference.remote.RemoteSession``) for a saved endpoint."""
    options = BackendOptions(overflow_policy=request.overflow_policy, reply_reserve=request.reply_reserve)
    return open_remote_session(endpoint, model_id, options)


class RoutingSessionFactory:
    """The worker's session factory: a remote model gets a remote session, a file a local one.

    Runs on the LLM worker thread, so the worker keeps owning every session it makes.

    Args:
        endpoints_file: the saved endpoints (``paths.endpoints_file``); None: no remotes.
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
        target = model_ref(request.model_path)
        if isinstance(target, LocalModel):
            session = self.local(request, bandwidth)
        else:
            endpoint = find_endpoint(self.endpoints_file, target.endpoint)
            session = self.remote(endpoint, target.model_id, request)
        self.last_session = session
        return session
