"""What the request handlers of ``glassbox serve`` share: the backend, the one-model-at-a-time
queue, the embedding model and the knowledge bases, each opened on first use, and the stored
``/v1/responses`` (:class:`ResponseStore`: in memory, bounded, forgotten when the server stops).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from app.paths import Paths
from app.server.errors import HttpError, model_not_found, overloaded

if TYPE_CHECKING:
    from app.knowledge_glue import Passages
    from app.server.embeddings import Embeddings
    from engine.inference.backends import ChatBackend

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


class ModelCatalog(Protocol):
    """The models a request may name, beyond the one served (the CLI passes the library's)."""

    def find(self, name: str) -> Path | None:
        """The chat model file called ``name`` (a name, never a path), or None."""
        ...

    def names(self) -> list[str]:
        """The ids of the chat models offered, for ``/v1/models``."""
        ...


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
        backend: the chat backend (a ``ChatSession`` or a ``RemoteSession``).
        model_id: the chat model's id in ``/v1/models``; requests naming another get a 404.
        lock: one model at a time: every request that uses the backend holds it.
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
        self.backend = backend
        self.model_id = model_id
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
        self.catalog: ModelCatalog | None = None
        self._open_session: Callable[[Path], ChatBackend] | None = None
        self.model_path: Path | None = None
        self._first: tuple[str, Path | None] = (model_id, None)
        self.responses = ResponseStore()

    def allow_switching(self, catalog: ModelCatalog, open_session: Callable[[Path], ChatBackend], path: Path) -> None:
        """Lets requests name the catalog's models: :meth:`switch_model` loads them with ``open_session``."""
        self.catalog, self._open_session, self.model_path = catalog, open_session, path
        self._first = (self.model_id, path)  # the model the server started with stays available

    @property
    def first_model_id(self) -> str:
        """The id of the model the server started with."""
        return self._first[0]

    def switch_model(self, path: Path, cancel: threading.Event) -> None:
        """Serves the model at ``path`` from now on (called under ``lock``, with no reply running).

        The model served is closed first (two models may not fit in memory together); when the new
        one fails to load, the old one is loaded again and the error raised. Stopping the server
        (which sets ``cancel``) ends a load in progress.

        Raises:
            ModelFileError, ModelLoadError, EngineCrashed: the new model cannot be loaded.
            HttpError: 503, the server stopped during the load.
        """
        if path == self.model_path or self._open_session is None:
            return
        old, new = self.backend, self._open_session(path)
        old.close()
        try:
            new.load(cancel)
        except BaseException:
            new.close()
            if cancel.is_set():
                raise HttpError(503, "the server is shutting down", "server_error") from None
            log.warning("loading %s failed; serving %s again", path, self.model_path)
            old.load()
            raise
        log.info("now serving %s", path)
        self.backend, self.model_path, self.model_id = new, path, path.stem

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
        """The chat model's context window, when the backend says."""
        return self.backend.n_ctx or None

    @property
    def embedder_id(self) -> str | None:
        """The embedding model's id in ``/v1/models`` (None: no embeddings offered)."""
        if self.embedder_path is None:
            return None
        path = self.embedder_path
        return path.parent.name if path.name in ("model", "models") else path.name

    def check_model(self, body: dict[str, Any], *, embeddings: bool = False) -> Path | None:
        """Refuses a request for a model this server does not serve (OpenAI's 404 ``model_not_found``).

        A request that names no model gets the one served; one that names a model of the catalog
        (the library, when the server loaded its model itself) gets that model's file, to load
        under the lock (:meth:`switch_model`).

        Raises:
            HttpError: 404 naming the model asked for and the one served; 400 when ``model`` is
                not a string.
        """
        name = body.get("model")
        if name is None or name == "":
            return None
        if not isinstance(name, str):
            raise HttpError(400, "'model' must be a string", code="invalid_value", param="model")
        served = self.embedder_id if embeddings else self.model_id
        if served is not None and name == served:
            return None
        if not embeddings and self.catalog is not None and "/" not in name and "\\" not in name:
            from app.server.errors import map_errors

            if name == self._first[0]:
                return self._first[1]
            path = map_errors(lambda: self.catalog.find(name) if self.catalog is not None else None)
            if path is not None:
                return Path(path)
        what = "embedding model" if embeddings else "model"
        offered = f"this server serves {served!r}" if served else "this server serves no embedding model"
        raise model_not_found(name, f"the {what} {name[:200]!r} does not exist here; {offered}")

    # lazily built helpers ---------------------------------------------------------------------
    def embedder(self) -> Embeddings:
        with self._embed_lock:
            if self._embedder is None:
                if self.embedder_path is None:
                    raise HttpError(501, "no embedding model is installed", "server_error")
                from app.server.embeddings import Embeddings

                self._embedder = Embeddings(self.embedder_path)
            return self._embedder

    def retrieve(self, names: tuple[str, ...], query: str) -> Passages | None:
        """The passages for ``query`` from ``names``, ranked, not fitted (called under ``lock``):
        the backend's documents band keeps the best that fit, and its Stats say how many of the
        lowest-ranked it dropped (the reply's ``documents_dropped``). None when nothing matched.

        One ``KnowledgeBases`` serves every request: it holds the knowledge folder's lock, so a
        second one in the same process would be refused.
        """
        from app.knowledge_glue import make_retriever, open_knowledge_bases

        if self._knowledge is None:
            self._knowledge = open_knowledge_bases(
                self.paths, self.embedder_path, self.chroma_url, report=lambda line: log.warning("%s", line)
            )
        from rag.errors import KnowledgeBaseError

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
