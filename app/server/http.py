"""``glassbox serve``: an OpenAI-compatible HTTP API over the local engine.

Other tools (editors, scripts, the ``openai`` client) use the models Glassbox manages through:

* ``GET /v1/models``: the served chat model (and the embedding model);
* ``POST /v1/chat/completions``: streaming (SSE ``data: {...}`` chunks, then ``data: [DONE]``) and
  not. An extra field ``knowledge_base`` (a name or a list of names) answers from those knowledge
  bases; the reply then carries ``sources``. Replies also carry llama.cpp-style ``timings``;
* ``POST /v1/embeddings``: the sentence-transformers embedding model, loaded on first use;
* ``POST /tokenize`` and ``GET /props`` (llama.cpp's server's shape), so a Glassbox client of this
  server (:mod:`engine.remote`) gets exact token counts and the context size.

Security (ROBUSTNESS.md 4.9): bound to 127.0.0.1 by default. A host that is not loopback is refused
unless an API key is set; with a key, every ``/v1`` request needs ``Authorization: Bearer KEY``
(else 401). Without a key, requests whose ``Host`` header is not a loopback name are refused (a web
page cannot reach the API through DNS rebinding), and POST bodies must be JSON (a cross-site form
cannot post one without a CORS preflight, which this server never grants).

One model at a time: requests queue on one lock, so concurrent replies never mix. The stack is the
standard library's threading HTTP server (no new dependencies), HTTP/1.1 with keep-alive and
chunked streaming, ``TCP_NODELAY`` so each token leaves at once.

Hostile bodies (ROBUSTNESS.md 4.9): every JSON body goes through :func:`~app.server.wire.parse_body`
(UTF-8 only, at most 64 levels of nesting, no number literal over 100 characters or out of a float's
range, no lone surrogate in a string); what it refuses is a 400 with an OpenAI-style error, never a
dropped connection. An answer never carries Python exception text: the server's own failures get a
fixed message and a line in the server log, and anything unforeseen a 500 (or, mid-stream, an error
event), never a connection closed without an answer.

Bounded work per request: at most :data:`~app.server.wire.MAX_MESSAGES` messages and
:func:`~app.server.wire.text_limit` characters of text (32 per token of the window, at least 256 Ki),
at most 16 stop strings of 256 characters; anything more is a 400 before the model is touched.
A client that closes its connection cancels its reply (checked before the reply starts and between
its events; a client that half-closes its sending side counts as gone). Past
:data:`MAX_QUEUED` waiting requests the answer is a 503 with ``Retry-After``; the listen backlog
(:data:`LISTEN_BACKLOG`) is large enough that a burst of connections is answered, not reset.
Stopping cancels the reply in progress; one that has not ended within :data:`STOP_GRACE_S` (a
call that cannot see the cancel, such as a long tokenization) has its worker process killed when
the server owns the model.

:func:`start_server` returns a :class:`ServerHandle` (``url``, ``stop()``), for the CLI and for the
GUI's settings toggle.
"""

from __future__ import annotations

import base64
import hmac
import ipaddress
import json
import logging
import os
import select
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from app.paths import Paths
from app.server.wire import (
    ChatRequest,
    HttpError,
    completion_document,
    encode_text,
    finish_reason,
    http_error_for,
    map_errors,
    parse_body,
    parse_chat,
    text_limit,
    timings_document,
    usage_document,
)
from engine.errors import EngineError

log = logging.getLogger("glassbox.serve")

MAX_BODY_BYTES = 16 * 2**20
MAX_QUEUED = 32
RETRY_AFTER_S = 2
"""The ``Retry-After`` sent with a 503 when :data:`MAX_QUEUED` requests already wait."""
LISTEN_BACKLOG = 1024
"""Connections the kernel holds until they are accepted (socketserver's default of 5 resets bursts)."""
STOP_GRACE_S = 1.0
"""How long stopping waits for the reply in progress to see its cancel before killing the worker."""
MAX_EMBED_INPUTS = 2048
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1", "[::1]")


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


class _State:
    """Everything the request handlers share; one per server."""

    def __init__(
        self,
        paths: Paths,
        backend: Any,
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
        self._embedder: Any = None
        self._embed_lock = threading.Lock()
        self._knowledge = knowledge  # a rag.knowledge.KnowledgeBases, opened on first use
        self._own_knowledge = knowledge is None

    # the one-model-at-a-time queue -------------------------------------------------------------
    def enter_queue(self) -> None:
        with self._counter_lock:
            if self.closed:
                raise HttpError(503, "the server is shutting down", "server_error")
            if self.queued >= MAX_QUEUED:
                raise HttpError(
                    503,
                    f"too many requests waiting ({MAX_QUEUED}); try again later",
                    "server_error",
                    retry_after=RETRY_AFTER_S,
                )
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

    # lazily built helpers ---------------------------------------------------------------------
    def embedder(self) -> Any:
        with self._embed_lock:
            if self._embedder is None:
                if self.embedder_path is None:
                    raise HttpError(501, "no embedding model is installed", "server_error")
                from rag.embeddings import SentenceTransformerEmbedder

                self._embedder = SentenceTransformerEmbedder(self.embedder_path)
            return self._embedder

    def retrieve(self, names: tuple[str, ...], query: str) -> tuple[str | None, list[dict[str, Any]]]:
        """The cited documents block for ``query`` from ``names``, and its sources (called under ``lock``).

        One ``KnowledgeBases`` serves every request: it holds the knowledge folder's lock, so a
        second one in the same process would be refused.
        """
        from app.knowledge_glue import make_retriever
        from rag.knowledge import KnowledgeBases

        if self._knowledge is None:
            self._knowledge = KnowledgeBases(
                self.paths.knowledge, embedder_path=self.embedder_path, chroma_url=self.chroma_url
            )
            if self._knowledge.recovered is not None:
                recovery = self._knowledge.recovered
                log.warning(
                    "the document index was damaged (%s); it was moved to %s and is being rebuilt",
                    recovery.reason,
                    recovery.moved_to,
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
        return retriever(query, self.backend)

    def close_knowledge(self) -> None:
        if self._knowledge is not None and self._own_knowledge:
            self._knowledge.close()
            self._knowledge = None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = LISTEN_BACKLOG
    state: _State

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Logs instead of printing a traceback on stderr; a client hanging up is routine."""
        import sys

        del request

        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError):
            log.debug("client %s went away: %s", client_address, exc)
        else:
            log.error("request from %s failed", client_address, exc_info=exc)


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "Glassbox"
    sys_version = ""
    timeout = 120  # seconds an idle keep-alive connection may hold a thread
    server: _Server
    _body_read = False
    _responded = False  # a status line is on its way: an error can no longer be a fresh answer

    def setup(self) -> None:
        super().setup()
        # Each token is one small write: without this, Nagle's algorithm delays them.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib's name)
        log.debug("%s %s", self.address_string(), format % args)

    # routing ----------------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._dispatch({"/v1/models": self._models, "/props": self._props, "/health": self._health})

    def do_POST(self) -> None:
        self._dispatch(
            {
                "/v1/chat/completions": self._chat,
                "/v1/embeddings": self._embeddings,
                "/tokenize": self._tokenize,
            }
        )

    def send_response(self, code: int, message: str | None = None) -> None:
        self._responded = True
        super().send_response(code, message)

    def _dispatch(self, routes: dict[str, Callable[[], None]]) -> None:
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        self._body_read = False
        self._responded = False
        try:
            self._check_access()
            route = routes.get(path)
            if route is None:
                raise HttpError(404, f"no such endpoint: {self.command} {path}", code="not_found")
            route()
        except HttpError as exc:
            # A body left unread would be taken for the next request: close instead.
            unread = self.command == "POST" and not self._body_read
            self._send_json(
                exc.status,
                exc.body(),
                close=unread or exc.status in (401, 403, 411, 413),
                retry_after=exc.retry_after,
            )
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # noqa: BLE001 - whatever broke, the client gets an answer, the log the detail
            self.close_connection = True
            error = http_error_for(exc)  # logs it
            if not self._responded:
                try:
                    self._send_json(error.status, error.body(), close=True)
                except OSError:
                    pass

    @property
    def state(self) -> _State:
        return self.server.state

    def _check_access(self) -> None:
        state = self.state
        if state.api_key is None:
            host = _host_name(self.headers.get("Host") or "")
            if host and state.loopback and host not in _LOOPBACK_NAMES:
                raise HttpError(403, f"requests for host {host!r} are refused (loopback only)", code="forbidden")
            return
        if self.path.startswith("/health"):
            return
        header = self.headers.get("Authorization") or ""
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), state.api_key.encode()):
            raise HttpError(401, "invalid or missing API key", code="invalid_api_key")

    # request and response plumbing -----------------------------------------------------------
    def _read_json(self) -> dict[str, Any]:
        if self.headers.get("Transfer-Encoding"):
            raise HttpError(411, "send the body with a Content-Length")
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            raise HttpError(411, "send the body with a Content-Length")
        try:
            length = int(length_text)
        except ValueError:
            raise HttpError(400, "bad Content-Length") from None
        if length < 0 or length > MAX_BODY_BYTES:
            raise HttpError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes")
        content_type = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        body = self.rfile.read(length)
        self._body_read = True
        if content_type != "application/json":
            raise HttpError(415, "the request body must be JSON (Content-Type: application/json)")
        return parse_body(body)

    def _send_json(
        self, status: int, document: dict[str, Any], *, close: bool = False, retry_after: int | None = None
    ) -> None:
        data = encode_text(json.dumps(document, ensure_ascii=False))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if retry_after is not None:
            self.send_header("Retry-After", str(retry_after))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def _start_sse(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("X-Accel-Buffering", "no")
        self.end_headers()

    def _send_event(self, payload: str) -> None:
        data = encode_text(f"data: {payload}\n\n")
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))  # one write per chunk

    def _end_sse(self) -> None:
        self.wfile.write(b"0\r\n\r\n")

    def _hung_up(self) -> bool:
        """True when the client has closed (or reset) its connection; reads nothing it sent."""
        return _peer_closed(self.connection)

    def _watched(self, events: Iterator[Any], cancel: threading.Event) -> Iterator[Any]:
        """``events``, cancelling the reply as soon as the client is found gone between two of them."""
        try:
            for event in events:
                if not cancel.is_set() and self._hung_up():
                    log.debug("client %s went away; cancelling its reply", self.address_string())
                    cancel.set()
                yield event
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()

    # endpoints --------------------------------------------------------------------------------
    def _health(self) -> None:
        self._send_json(200, {"status": "ok"})

    def _models(self) -> None:
        state = self.state
        info = _backend_n_ctx(state.backend)
        data = [
            {
                "id": state.model_id,
                "object": "model",
                "created": state.created,
                "owned_by": "glassbox",
                "context_length": info,
            }
        ]
        if state.embedder_path is not None:
            data.append(
                {
                    "id": _embedder_id(state.embedder_path),
                    "object": "model",
                    "created": state.created,
                    "owned_by": "glassbox",
                }
            )
        self._send_json(200, {"object": "list", "data": data})

    def _props(self) -> None:
        n_ctx = _backend_n_ctx(self.state.backend)
        self._send_json(200, {"model_alias": self.state.model_id, "default_generation_settings": {"n_ctx": n_ctx}})

    def _tokenize(self) -> None:
        body = self._read_json()
        content = body.get("content")
        if not isinstance(content, str):
            raise HttpError(400, "'content' must be a string")
        limit = text_limit(_backend_n_ctx(self.state.backend))
        if len(content) > limit:
            raise HttpError(400, f"'content' is longer than {limit} characters, the most allowed per request")
        worker = getattr(self.state.backend, "worker", None)
        if worker is None:
            raise HttpError(404, "this backend has no tokenizer", code="not_found")
        self.state.enter_queue()
        try:
            with self.state.lock:
                tokens = map_errors(lambda: worker.tokenize(content, add_bos=False, special=True))
        finally:
            self.state.leave_queue()
        self._send_json(200, {"tokens": tokens})

    def _embeddings(self) -> None:
        body = self._read_json()
        texts = body.get("input")
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise HttpError(
                400,
                "'input' must be a string or a non-empty list of strings (token arrays are not supported)",
                code="invalid_input",
            )
        if len(texts) > MAX_EMBED_INPUTS:
            raise HttpError(400, f"at most {MAX_EMBED_INPUTS} inputs per request")
        encoding = body.get("encoding_format", "float")
        if encoding not in ("float", "base64"):
            raise HttpError(400, "'encoding_format' must be 'float' or 'base64'")
        embedder = map_errors(self.state.embedder)
        vectors = map_errors(lambda: embedder.encode(texts))
        tokens = map_errors(lambda: sum(embedder.count_tokens(t) for t in texts))
        dimensions = body.get("dimensions")
        if dimensions is not None and dimensions != vectors.shape[1]:
            raise HttpError(400, f"this model makes {vectors.shape[1]}-dimensional vectors, not {dimensions}")
        data = []
        for index, vector in enumerate(vectors):
            if encoding == "base64":
                value: Any = base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
            else:
                value = [float(x) for x in vector]
            data.append({"object": "embedding", "index": index, "embedding": value})
        self._send_json(
            200,
            {
                "object": "list",
                "data": data,
                "model": embedder.model_id,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            },
        )

    def _chat(self) -> None:
        state = self.state
        request = parse_chat(self._read_json(), state.default_kbs, text_limit(_backend_n_ctx(state.backend)))
        cancel = threading.Event()
        state.enter_queue()
        try:
            with state.lock:
                state.activate(cancel)
                try:
                    if self._hung_up():
                        # The client left while its request waited: nobody to answer.
                        log.debug("client %s went away while queued", self.address_string())
                        self.close_connection = True
                        return
                    self._generate(request, cancel)
                except HttpError as exc:
                    if state.closed and exc.status >= 500:
                        raise HttpError(503, "the server is shutting down", "server_error") from None
                    raise
                finally:
                    state.deactivate(cancel)
        finally:
            state.leave_queue()

    def _generate(self, request: ChatRequest, cancel: threading.Event) -> None:
        from engine.events import Finished, Token

        state = self.state
        documents, sources = None, []
        if request.knowledge_bases:
            documents, sources = map_errors(lambda: state.retrieve(request.knowledge_bases, request.user))
        events = self._watched(
            state.backend.stream(
                request.history,
                request.user,
                request.params,
                system=request.system,
                documents=documents,
                cancel=cancel,
            ),
            cancel,
        )
        head = map_errors(lambda: next(events))  # planning errors become HTTP errors, before any 200
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        if not request.stream:
            finished = map_errors(lambda: _last_finished(head, events))
            self._send_json(200, completion_document(completion_id, created, state.model_id, finished, sources))
            return

        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            return json.dumps(
                {
                    "id": completion_id,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": state.model_id,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                },
                ensure_ascii=False,
            )

        self._start_sse()
        try:
            self._send_event(chunk({"role": "assistant", "content": ""}))
            for event in _prepend(head, events):
                if isinstance(event, Token) and event.text:
                    self._send_event(chunk({"content": event.text}))
                elif isinstance(event, Finished):
                    self._send_event(chunk({}, finish_reason(event.reason)))
                    tail: dict[str, Any] = {
                        "id": completion_id,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": state.model_id,
                        "choices": [],
                        "timings": timings_document(event.stats),
                    }
                    if request.include_usage:
                        tail["usage"] = usage_document(event.stats)
                    if sources:
                        tail["sources"] = sources
                    self._send_event(json.dumps(tail, ensure_ascii=False))
            self._send_event("[DONE]")
            self._end_sse()
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            # The client went away (its Stop button): stop the model and let the worker settle.
            cancel.set()
            _drain(events)
            self.close_connection = True
        except Exception as exc:  # noqa: BLE001 - the stream ends with an error event; the log has the detail
            error = http_error_for(exc)  # a fixed message for the server's own failures; logs them
            log.warning("generation failed mid-stream: %s", error.message)
            cancel.set()  # when this code, not the model, failed: stop the model and let it settle
            _drain(events)
            try:
                self._send_event(
                    json.dumps({"error": {"message": error.message, "type": error.kind, "code": error.code}})
                )
                self._send_event("[DONE]")
                self._end_sse()
            except OSError:
                self.close_connection = True


def _prepend(head: Any, events: Iterator[Any]) -> Iterator[Any]:
    yield head
    yield from events


def _last_finished(head: Any, events: Iterator[Any]) -> Any:
    from engine.events import Finished

    finished = None
    for event in _prepend(head, events):
        if isinstance(event, Finished):
            finished = event
    if finished is None:
        raise EngineError("the engine ended without finishing the reply")
    return finished


def _drain(events: Iterator[Any]) -> None:
    try:
        for _ in events:
            pass
    except EngineError as exc:
        log.warning("after a client disconnect: %s", exc)


def _peer_closed(sock: socket.socket) -> bool:
    """True when the other end of ``sock`` has closed or reset it (data waiting to be read says it has not)."""
    try:
        if hasattr(select, "poll"):
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            if not poller.poll(0):
                return False
        elif not select.select([sock], [], [], 0)[0]:
            return False
        return sock.recv(1, socket.MSG_PEEK) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:  # reset, or closed here
        return True


def _kill_worker(backend: Any) -> None:
    """Ends the inference worker process of a ``ChatSession`` at once: the call waiting on it raises
    ``EngineCrashed`` and lets go of the model."""
    worker = getattr(backend, "worker", None)
    pid = getattr(worker, "pid", None)
    if not isinstance(pid, int):
        return
    log.warning("the reply in progress did not stop within %.1f s; ending the inference worker", STOP_GRACE_S)
    try:
        os.kill(pid, getattr(signal, "SIGKILL", signal.SIGTERM))
    except OSError:
        pass


def _backend_n_ctx(backend: Any) -> int | None:
    info = getattr(backend, "info", None)
    n_ctx = getattr(info, "n_ctx", None)
    return n_ctx if isinstance(n_ctx, int) and n_ctx > 0 else None


def _nothing() -> None:
    pass


def _host_name(header: str) -> str:
    """The host part of a ``Host`` header (``[::1]:8080`` gives ``[::1]``), lower-cased."""
    header = header.strip().lower()
    if header.startswith("["):
        return header.split("]", 1)[0] + "]"
    return header.split(":", 1)[0]


def _embedder_id(path: Path) -> str:
    return path.parent.name if path.name in ("model", "models") else path.name


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
    knowledge: Any = None,
    embedder_path: Path | None = None,
    backend: Any = None,
    machine_bandwidth_gbps: float | None = None,
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

    Returns:
        The running server's handle.

    Raises:
        ServeError: a non-loopback host without an API key, a short key, no model, or the port is taken.
        ModelFileError, ModelLoadError, EngineCrashed: the model cannot be loaded.
    """
    check_host(host, api_key)
    loopback = is_loopback(host)
    if backend is None:
        if model_path is None:
            raise ServeError("serve: no model given")
        from engine.runtime import LoadParams
        from engine.session import ChatSession

        load = LoadParams(model_path=model_path, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers)
        backend = ChatSession(
            load, machine_bandwidth_gbps=machine_bandwidth_gbps, backend_state=paths.cpu_backend_state
        )
        model_id = model_path.stem
        owned = True
    else:
        model_id = getattr(backend, "model", None) or (model_path.stem if model_path else "glassbox")
        owned = False
    release = backend.close if owned else _nothing
    server_class = _Server6 if ":" in host.strip("[]") else _Server
    try:  # bind first: a taken port fails at once, before a model load
        server = server_class((host.strip("[]"), port), _Handler)
    except OSError as exc:
        release()
        raise ServeError(f"{host}:{port}: cannot listen there ({exc.strerror or exc})") from None
    try:
        backend.load()
    except BaseException:
        server.server_close()
        release()
        raise
    state = _State(paths, backend, model_id, api_key, loopback, embedder_path, knowledge_bases, chroma_url, knowledge)
    server.state = state
    bound_port = int(server.server_address[1])
    url_host = f"[{host.strip('[]')}]" if server_class is _Server6 else host
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="glassbox-serve", daemon=True
    )
    thread.start()
    stopped = threading.Event()

    def stop() -> None:
        if stopped.is_set():
            return
        stopped.set()
        state.cancel_all()
        server.shutdown()
        server.server_close()
        thread.join(5.0)
        if owned and not state.wait_idle(STOP_GRACE_S):
            _kill_worker(backend)  # a call that cannot see the cancel still holds the model
        release()  # waits for the reply in progress to let go of the model
        state.close_knowledge()

    log.info("serving %s on http://%s:%d", model_id, url_host, bound_port)
    return ServerHandle(f"http://{url_host}:{bound_port}", host, bound_port, model_id, stop, thread)
