"""What the request handlers of ``glassbox serve`` share: the backend (one passed in, such as the
window's, with its one-model-at-a-time queue; or the models the server owns, several resident:
:mod:`app.server.served`), the embedding model and the knowledge bases, each opened on first use,
and the stored ``/v1/responses`` (:class:`ResponseStore`: in memory, bounded, forgotten when the
server stops).

A request's model is the thread's: the server answers each request on its own thread, and
:meth:`ServerState.check_model` sets what ``backend`` and ``model_id`` say for the rest of it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from app.knowledge_glue import make_retriever, open_knowledge_bases
from app.paths import Paths
from app.server.cors import CorsPolicy
from app.server.embeddings import Embeddings
from app.server.errors import HttpError, model_not_found, overloaded
from app.server.served import KEEP_ALIVE_HEADER, ServedModels, keep_alive_of
from app.server.served import ModelCatalog as ModelCatalog  # where the CLI's catalog is typed
from engine.inference.pool import KEEP_DEFAULT
from rag.errors import KnowledgeBaseError

if TYPE_CHECKING:
    from app.knowledge_glue import Passages
    from engine.inference.backends import ChatBackend
    from engine.inference.session import ChatSession

log = logging.getLogger("glassbox.serve")

MAX_QUEUED = 32
"""Requests that may wait for the model; past that the answer is a 503 with ``Retry-After``."""
RETRY_AFTER_S = 2
"""The ``Retry-After`` sent with a 503 when :data:`MAX_QUEUED` requests already wait."""
QUEUE_WAIT_S = 20.0
"""How long a request waits for the model before it is answered 503 with ``Retry-After`` (rather
than left to its client's own timeout, which ends in a dropped connection)."""
BUSY_RETRY_AFTER_S = 5
"""The ``Retry-After`` of a request that waited :data:`QUEUE_WAIT_S` for the model."""


class Headers(Protocol):
    """A request's headers (``http.client.HTTPMessage``: names in any case)."""

    def get(self, name: str) -> str | None: ...


MAX_STORED_RESPONSES = 256
"""The stored ``/v1/responses`` a server keeps: past that, the oldest is forgotten."""
MAX_STORED_BYTES = 64 * 1024 * 1024
"""The JSON text the stored responses may hold in all (each holds its whole conversation); past
that, the oldest are forgotten, and a response larger than this alone is not kept."""


class ResponseStore:
    """The responses ``/v1/responses`` stored (``store`` true, OpenAI's default), by id, for
    ``previous_response_id``, ``GET`` and ``DELETE /v1/responses/{id}``.

    In memory only: a server restart forgets them. Bounded: the last ``max_responses``, at most
    ``max_bytes`` of JSON text in all, the oldest forgotten first. Thread-safe (the server answers
    on several threads). Each entry is kept as JSON text, so what a caller does with what it put or
    got never changes what is stored.
    """

    def __init__(self, max_responses: int = MAX_STORED_RESPONSES, max_bytes: int = MAX_STORED_BYTES) -> None:
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[str, int]] = OrderedDict()  # id -> (JSON [document, items], bytes)
        self._bytes = 0

    def put(self, response_id: str, document: Mapping[str, object], items: Sequence[Mapping[str, object]]) -> bool:
        """Stores a response: its document as answered and its conversation (the input items, those
        of the responses it continued first, then its output). False when it alone is too large."""
        text = json.dumps([document, list(items)], ensure_ascii=False)
        size = len(text.encode("utf-8"))
        if size > self.max_bytes:
            log.warning("response %s (%d bytes) is larger than the store (%d bytes): not kept", response_id,
                        size, self.max_bytes)  # fmt: skip
            return False
        with self._lock:
            self._drop(response_id)
            self._entries[response_id] = (text, size)
            self._bytes += size
            while len(self._entries) > self.max_responses or self._bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))
        return True

    def get(self, response_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        """The stored document and conversation items of ``response_id``, or None (unknown,
        forgotten, deleted, or made with ``store: false``)."""
        with self._lock:
            entry = self._entries.get(response_id)
        if entry is None:
            return None
        document, items = json.loads(entry[0])
        return document, items

    def delete(self, response_id: str) -> bool:
        """Forgets ``response_id``; False when it was not stored."""
        with self._lock:
            return self._drop(response_id)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def _drop(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self._bytes -= entry[1]
        return True


class ServerState:
    """Everything the request handlers share; one per server.

    Attributes:
        backend: the chat backend of this request's model (a ``ChatSession`` or a
            ``RemoteSession``); outside a request, the model the server started with.
        model_id: this request's model's id in ``/v1/models``; requests naming another get a 404.
        lock: one model at a time for a backend passed in: every request that uses it holds it.
        served: the models the server owns, resident in a pool (None: it serves a backend passed in).
        responses: the stored ``/v1/responses`` of this server (:class:`ResponseStore`).
    """

    def __init__(
        self,
        paths: Paths,
        backend: ChatBackend,
        model_id: str,
        api_key: str | None,
        loopback: bool,
        embedder_path: Path | None,
        default_kbs: tuple[str, ...],
        chroma_url: str | None,
        knowledge: Any,
    ) -> None:
        self.paths = paths
        self._backend = backend
        self._model_id = model_id
        self._request = threading.local()  # this request's model: set by check_model
        self.served: ServedModels | None = None
        self.cors = CorsPolicy()  # the origins browser pages may call from (app.server.cors)
        self.api_key = api_key
        self.loopback = loopback
        self.embedder_path = embedder_path
        self.default_kbs = default_kbs
        self.chroma_url = chroma_url
        self.created = int(time.time())
        self.lock = threading.Lock()
        self._counter_lock = threading.Lock()
        self._idle = threading.Condition(self._counter_lock)
        self.queued = 0
        self.closed = False
        self.active: set[threading.Event] = set()
        self._embedder: Embeddings | None = None
        self._embed_lock = threading.Lock()
        self._knowledge = knowledge  # a rag.knowledge.KnowledgeBases, opened on first use
        self._own_knowledge = knowledge is None
        self.responses = ResponseStore()

    # this request's model ----------------------------------------------------------------------
    @property
    def backend(self) -> ChatBackend:
        """This request's model (after :meth:`check_model`), else the one the server started with."""
        backend: ChatBackend | None = getattr(self._request, "backend", None)
        return backend if backend is not None else self._backend

    @property
    def model_id(self) -> str:
        """This request's model's id, else that of the model the server started with."""
        name: str | None = getattr(self._request, "model", None)
        return name if name is not None else self._model_id

    def begin_request(self, headers: Headers | None = None) -> None:
        """Forgets the last request's model (a keep-alive connection answers several on one
        thread) and keeps this one's headers (its keep_alive may be one)."""
        self._request.__dict__.clear()
        self._request.headers = headers

    @property
    def request_model(self) -> str:
        """The model this request leases from the pool (:meth:`check_model` resolved it)."""
        return str(getattr(self._request, "model", None) or self._model_id)

    @property
    def request_keep_alive(self) -> float | None:
        """This request's keep_alive (:func:`app.server.served.keep_alive_of`)."""
        value: float | None = getattr(self._request, "keep_alive", KEEP_DEFAULT)
        return value

    @property
    def request_lora(self) -> object:
        """This request's ``lora`` field (None: the server's adapter scales)."""
        return getattr(self._request, "lora", None)

    def set_leased(self, backend: ChatBackend) -> None:
        """The loaded session this request holds from the pool."""
        self._request.backend = backend

    # the one-model-at-a-time queue -------------------------------------------------------------
    def enter_queue(self) -> None:
        with self._counter_lock:
            if self.closed:
                raise HttpError(503, "the server is shutting down", "server_error")
            if self.queued >= MAX_QUEUED:
                raise overloaded(f"too many requests waiting ({MAX_QUEUED}); try again later", RETRY_AFTER_S)
            self.queued += 1

    def leave_queue(self) -> None:
        with self._counter_lock:
            self.queued -= 1

    def activate(self, cancel: threading.Event) -> None:
        """Registers the reply about to use the model, so that stopping cancels it (called under ``lock``)."""
        with self._counter_lock:
            if self.closed:
                raise HttpError(503, "the server is shutting down", "server_error")
            self.active.add(cancel)

    def deactivate(self, cancel: threading.Event) -> None:
        with self._counter_lock:
            self.active.discard(cancel)
            self._idle.notify_all()

    def cancel_all(self) -> None:
        with self._counter_lock:
            self.closed = True
            for event in self.active:
                event.set()

    def wait_idle(self, timeout: float) -> bool:
        """Waits until no reply uses the model; False when one still does after ``timeout`` seconds."""
        with self._counter_lock:
            return self._idle.wait_for(lambda: not self.active, timeout)

    # models -----------------------------------------------------------------------------------
    @property
    def n_ctx(self) -> int | None:
        """The chat model's context window, when the backend says (a model of the pool not loaded
        yet: the window it will be loaded with)."""
        pooled: ChatSession | None = getattr(self._request, "pooled", None)
        if pooled is not None:
            return pooled.n_ctx or pooled.load_params.n_ctx
        return self.backend.n_ctx or None

    @property
    def embedder_id(self) -> str | None:
        """The embedding model's id in ``/v1/models`` (None: no embeddings offered)."""
        if self.embedder_path is None:
            return None
        path = self.embedder_path
        return path.parent.name if path.name in ("model", "models") else path.name

    def check_model(self, body: dict[str, Any], *, embeddings: bool = False) -> str | None:
        """Says which model a request gets, or refuses a model this server does not serve (OpenAI's
        404 ``model_not_found``).

        A request that names no model gets the one the server started with. With the models the
        server owns (:attr:`served`), a name of the library or an alias is that model: ``backend``
        and ``model_id`` say so for the rest of the request, and its ``keep_alive`` and ``lora``
        fields (taken out of ``body``, so no dialect sees them) apply when it leases the model.

        Returns:
            The model to lease (with :attr:`served`), else None.

        Raises:
            HttpError: 404 naming the model asked for and the one served; 400 when ``model`` is
                not a string, or for a bad ``keep_alive``.
        """
        name = body.get("model")
        if name is not None and not isinstance(name, str):
            raise HttpError(400, "'model' must be a string", code="invalid_value", param="model")
        served = self.served
        if served is not None and not embeddings:
            headers: Headers | None = getattr(self._request, "headers", None)
            header = headers.get(KEEP_ALIVE_HEADER) if headers is not None else None
            keep = body.pop("keep_alive", None)
            self._request.keep_alive = keep_alive_of(keep if keep is not None else header)
            self._request.lora = body.pop("lora", None)
            resolved = served.resolve(name)
            self._request.model = resolved
            self._request.pooled = self._request.backend = served.session(resolved)
            return resolved
        if name is None or name == "":
            return None
        expected = self.embedder_id if embeddings else self.model_id
        if expected is not None and name == expected:
            return None
        what = "embedding model" if embeddings else "model"
        offered = f"this server serves {expected!r}" if expected else "this server serves no embedding model"
        raise model_not_found(name, f"the {what} {name[:200]!r} does not exist here; {offered}")

    # lazily built helpers ---------------------------------------------------------------------
    @property
    def embedder_loaded(self) -> bool:
        """Whether the embedding model is loaded (``/v1/models`` says)."""
        return self._embedder is not None

    def embedder(self) -> Embeddings:
        with self._embed_lock:
            if self._embedder is None:
                if self.embedder_path is None:
                    raise HttpError(501, "no embedding model is installed", "server_error")

                self._embedder = Embeddings(self.embedder_path)
            return self._embedder

    def retrieve(self, names: tuple[str, ...], query: str) -> Passages | None:
        """The passages for ``query`` from ``names``, ranked, not fitted (called under ``lock``):
        the backend's documents band keeps the best that fit, and its Stats say how many of the
        lowest-ranked it dropped (the reply's ``documents_dropped``). None when nothing matched.

        One ``KnowledgeBases`` serves every request: it holds the knowledge folder's lock, so a
        second one in the same process would be refused.
        """
        if self._knowledge is None:
            self._knowledge = open_knowledge_bases(
                self.paths, self.embedder_path, self.chroma_url, report=lambda line: log.warning("%s", line)
            )
        for name in names:
            try:
                self._knowledge.get(name)
            except KnowledgeBaseError:  # the one error of the client's making: say so, by name
                raise HttpError(
                    400, f"{name[:200]!r}: no such knowledge base", code="knowledge_base_error", param="knowledge_base"
                ) from None
        retriever = make_retriever(self.paths, names, kbs=self._knowledge)
        return retriever(query)

    def close_knowledge(self) -> None:
        if self._knowledge is not None and self._own_knowledge:
            self._knowledge.close()
            self._knowledge = None
