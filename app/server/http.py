"""``glassbox serve``: an OpenAI-compatible HTTP API over the local engine.

Other tools (editors, scripts, coding agents, the ``openai`` and ``anthropic`` clients, LangChain,
LiteLLM, LlamaIndex) use the models Glassbox manages through it. :func:`start_server` returns a
:class:`ServerHandle` (``url``, ``stop()``), for the CLI and for the GUI's settings toggle.

Contract: ARCHITECTURE.md, 'The HTTP contract' (its limits: 'Security and bounded work').
"""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, cast

from app.paths import Paths
from app.server.cors import CorsPolicy
from app.server.handler import Handler
from app.server.served import AdapterSlot, ModelCatalog, ServedModels
from app.server.state import ServerState
from engine.errors import EngineError
from engine.inference.pool import ModelPool, PoolSettings

if TYPE_CHECKING:
    from engine.inference.adapters import LoraAdapter
    from engine.inference.backends import ChatBackend
    from engine.inference.kv_cache import KvCacheConfig
    from engine.inference.session import ChatSession

log = logging.getLogger("glassbox.serve")

LISTEN_BACKLOG = 1024
"""Connections the kernel holds until they are accepted (socketserver's default of 5 resets bursts)."""
STOP_GRACE_S = 1.0
"""How long stopping waits for the reply in progress to see its cancel before killing the worker."""


class ServeError(EngineError):
    """The server cannot start (unsafe host without a key, port in use, no model)."""


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_host(host: str, api_key: str | None) -> None:
    """Refuses to expose the API beyond this machine without a key (ROBUSTNESS.md 4.9).

    Raises:
        ServeError: ``host`` is not loopback and there is no API key, or the key is shorter than 8.
    """
    if is_loopback(host):
        return
    if not api_key:
        raise ServeError(
            f"{host}: refusing to serve on a non-loopback address without an API key "
            "(pass --api-key KEY, or use --host 127.0.0.1)"
        )
    if len(api_key) < 8:
        raise ServeError(f"{host}: the API key is too short for a server on the network (use 8+ characters)")


@dataclass
class ServerHandle:
    """A running server.

    Attributes:
        url: the base URL clients use (``http://127.0.0.1:8080``; add ``/v1`` for OpenAI clients).
        host: the address it is bound to.
        port: the port it listens on (the real one when 0 was asked for).
        model: the chat model's id in ``/v1/models``.
    """

    url: str
    host: str
    port: int
    model: str
    _stop: Callable[[], None] = field(repr=False)
    _thread: threading.Thread = field(repr=False)

    def stop(self) -> None:
        """Stops accepting requests, cancels replies in progress, and unloads the model."""
        self._stop()

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until the server stops; returns False on timeout."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = LISTEN_BACKLOG
    state: ServerState

    def handle_error(self, request: object, client_address: object) -> None:
        """Logs instead of printing a traceback on stderr; a client hanging up is routine."""
        del request

        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError):
            log.debug("client %s went away: %s", client_address, exc)
        else:
            log.error("request from %s failed", client_address, exc_info=exc)


class _Server6(_Server):
    address_family = socket.AF_INET6


def _kill_worker(backend: ChatBackend) -> None:
    """Ends the inference worker process of a local model at once: the call waiting on it raises
    ``EngineCrashed`` and lets go of the model."""
    pid = backend.local.worker_pid if backend.local is not None else None
    if pid is None:
        return
    log.warning("the reply in progress did not stop within %.1f s; ending the inference worker", STOP_GRACE_S)
    try:
        os.kill(pid, getattr(signal, "SIGKILL", signal.SIGTERM))
    except OSError:
        pass


def _kill_busy(pool: ModelPool[ChatSession]) -> None:
    """Ends the worker of every model of the pool still answering."""
    for resident in pool.resident():
        if resident.state == "busy" and resident.pid is not None:
            log.warning("a reply of %s did not stop within %.1f s; ending its worker", resident.name, STOP_GRACE_S)
            try:
                os.kill(resident.pid, getattr(signal, "SIGKILL", signal.SIGTERM))
            except OSError:
                pass


def _nothing() -> None:
    pass


# ---------------------------------------------------------------------------- start and stop


def start_server(
    paths: Paths,
    host: str = "127.0.0.1",
    port: int = 8080,
    api_key: str | None = None,
    model_path: Path | None = None,
    *,
    n_ctx: int = 4096,
    n_threads: int | None = None,
    n_gpu_layers: int = 0,
    knowledge_bases: tuple[str, ...] = (),
    chroma_url: str | None = None,
    knowledge: object = None,
    embedder_path: Path | None = None,
    backend: ChatBackend | None = None,
    machine_bandwidth_gbps: float | None = None,
    catalog: ModelCatalog | None = None,
    pool_settings: PoolSettings | None = None,
    aliases: Mapping[str, str] | None = None,
    default_model: str | None = None,
    adapters: Sequence[LoraAdapter] = (),
    cors_origins: Sequence[str] = (),
    kv_cache: KvCacheConfig | None = None,
) -> ServerHandle:
    """Loads the model and serves it on ``host:port`` in a background thread.

    Args:
        paths: the app's folders (knowledge bases live there).
        host: the address to bind; anything but loopback requires ``api_key``.
        port: the port; 0 picks a free one (read it from the handle).
        api_key: when set, every ``/v1`` request must send ``Authorization: Bearer <api_key>``.
        model_path: the GGUF to serve (ignored when ``backend`` is given).
        n_ctx: the context window.
        n_threads: CPU threads for llama.cpp (None: its choice).
        n_gpu_layers: layers to offload to the GPU.
        knowledge_bases: knowledge bases used when a request names none.
        chroma_url: a Chroma server for the knowledge bases, if they live on one.
        knowledge: an open ``rag.knowledge.KnowledgeBases`` to answer from (the GUI passes its own:
            the knowledge folder has one owner per process); the caller keeps owning it. None: the
            server opens one on the first request that names a knowledge base.
        embedder_path: the sentence-transformers folder for ``/v1/embeddings`` (None: no embeddings).
        backend: an already loaded chat backend (``ChatSession`` or ``RemoteSession``) to serve
            instead of loading ``model_path``, e.g. the GUI's own session: the caller keeps owning
            it (the server never closes it), and its lock keeps the GUI's and the API's turns apart.
        machine_bandwidth_gbps: reported in Stats.
        catalog: the models a request may name (the library): the server owns them, resident in a
            model pool (``engine.inference.pool``), several at once, loaded by the first request
            that names one, ``model_path`` first. Only for models the server loads itself: a
            backend passed in stays the one served.
        pool_settings: what stays resident (memory budget, count, idle time, queue per model).
        aliases: other names for the catalog's models (``gpt-4o`` -> a model's name).
        default_model: the model for names the server does not know (None: they are a 404).
        adapters: LoRA adapters offered at ``/lora-adapters``, with their starting scales.
        cors_origins: the origins browser pages may call from (``app.server.cors``; none: no CORS).
        kv_cache: where a model's prompt is saved before the pool unloads it (None: not saved).

    Returns:
        The running server's handle.

    Raises:
        ServeError: a non-loopback host without an API key, a short key, no model, or the port is taken.
        ModelFileError, ModelLoadError, EngineCrashed: the model cannot be loaded.
    """
    check_host(host, api_key)
    try:
        cors = CorsPolicy.parse(cors_origins)
    except EngineError as exc:
        raise ServeError(str(exc)) from None
    served: ServedModels | None = None
    if backend is None:
        if model_path is None:
            raise ServeError("serve: no model given")
        open_session = _owned_sessions(paths, n_ctx, n_threads, n_gpu_layers, machine_bandwidth_gbps)
        model_id, owned = model_path.stem, True
        if catalog is not None:
            served = _pool(catalog, (model_id, model_path), open_session, pool_settings, kv_cache)
            served.aliases, served.default_model = dict(aliases or {}), default_model
            served.adapters = [AdapterSlot(a.path, a.scale) for a in adapters]
            _check_names(served)
            backend = served.session(model_id)
        else:
            backend = open_session(model_path)
    else:
        model_id = backend.model_id or (model_path.stem if model_path else "glassbox")
        owned = False
    server = _bind_and_load(host, port, backend, owned, served)
    state = ServerState(
        paths, backend, model_id, api_key, is_loopback(host), embedder_path, knowledge_bases, chroma_url, knowledge
    )
    state.served, state.cors = served, cors
    return _serve(server, state, host, owned)


def _pool(
    catalog: ModelCatalog,
    first: tuple[str, Path],
    open_session: Callable[[Path], ChatSession],
    settings: PoolSettings | None,
    kv_cache: KvCacheConfig | None,
) -> ServedModels:
    """The pool of the models a server owns: ``first`` and every model of ``catalog`` by name."""
    holder: list[ServedModels] = []

    def open_name(name: str) -> ChatSession | None:
        path = holder[0].path_of(name)
        return None if path is None else open_session(path)

    pool: ModelPool[ChatSession] = ModelPool(open_name, settings, kv_cache=kv_cache)
    holder.append(ServedModels(pool, catalog, first))
    return holder[0]


def _check_names(served: ServedModels) -> None:
    """Refuses an alias or a default model that names no model served (before anything loads)."""
    for alias, target in served.aliases.items():
        if served.path_of(target) is None:
            raise ServeError(f"--alias {alias}={target}: no model called {target!r} (see glassbox models list)")
    default = served.default_model
    if default is not None and served.path_of(default) is None:
        raise ServeError(f"--default-model {default}: no model called {default!r} (see glassbox models list)")


def _serve(server: _Server, state: ServerState, host: str, owned: bool) -> ServerHandle:
    """Starts the HTTP loop on its thread (``glassbox-serve``); the handle stops it."""
    server.state = state
    bound_port = int(server.server_address[1])
    url_host = f"[{host.strip('[]')}]" if isinstance(server, _Server6) else host
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="glassbox-serve", daemon=True
    )
    thread.start()
    log.info("serving %s on http://%s:%d", state.model_id, url_host, bound_port)
    stop = _Stopper(server, state, thread, owned)
    return ServerHandle(f"http://{url_host}:{bound_port}", host, bound_port, state.model_id, stop, thread)


def _owned_sessions(
    paths: Paths, n_ctx: int, n_threads: int | None, n_gpu_layers: int, machine_bandwidth_gbps: float | None
) -> Callable[[Path], ChatSession]:
    """How the server opens a model it owns (the one it starts with, and each one a request names)."""
    # lazy: start-up (+8 ms)
    from app.compose import BackendOptions, LoadSettings, load_params, open_local, projector_choice

    load = LoadSettings(n_ctx=n_ctx, n_threads=n_threads, gpu_layers=n_gpu_layers)
    # The API's contract: a conversation longer than the window is a 400 context_length_exceeded
    # (OpenAI, llama.cpp; LiteLLM's fallbacks rely on it), not trimmed like the GUI's.
    options = BackendOptions(
        overflow_policy="refuse", machine_bandwidth_gbps=machine_bandwidth_gbps, backend_state=paths.cpu_backend_state
    )

    def open_owned(path: Path) -> ChatSession:
        # the projector chosen by hand in the library (the Models page's Projector), else the one beside it
        with_projector = replace(load, mmproj=projector_choice(path, paths))
        return cast("ChatSession", open_local(load_params(path, with_projector), options))

    return open_owned


def _bind_and_load(host: str, port: int, backend: ChatBackend, owned: bool, served: ServedModels | None) -> _Server:
    """Binds ``host:port``, then loads the model (with a pool, the first one, through the pool): a
    taken port fails at once, before a model load. On failure an owned backend is closed.

    Raises:
        ServeError: the port cannot be bound.
        ModelFileError, ModelLoadError, EngineCrashed: the model cannot be loaded.
    """
    release = (served.pool.close if served is not None else backend.close) if owned else _nothing
    server_class = _Server6 if ":" in host.strip("[]") else _Server
    try:
        server = server_class((host.strip("[]"), port), Handler)
    except OSError as exc:
        release()
        raise ServeError(f"{host}:{port}: cannot listen there ({exc.strerror or exc})") from None
    try:
        if served is not None:
            with served.pool.lease(served.first[0]):
                pass
        else:
            backend.load()
    except BaseException:
        server.server_close()
        release()
        raise
    return server


class _Stopper:
    """Stops a running server once: cancels the replies, shuts the loop down, unloads an owned model."""

    def __init__(self, server: _Server, state: ServerState, thread: threading.Thread, owned: bool) -> None:
        self._server, self._state, self._thread, self._owned = server, state, thread, owned
        self._stopped = threading.Event()

    def __call__(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        state = self._state
        state.cancel_all()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)
        if self._owned and not state.wait_idle(STOP_GRACE_S):
            # A call that cannot see the cancel still holds a model: end its worker.
            if state.served is not None:
                _kill_busy(state.served.pool)
            else:
                _kill_worker(state.backend)
        if self._owned:
            # Waits for the reply in progress to let go of the model(s).
            if state.served is not None:
                state.served.pool.close()
            else:
                state.backend.close()
        state.close_knowledge()
