"""One request of ``glassbox serve`` and its answer, as every endpoint sees it: the body, JSON answers,
server-sent events, the one-model-at-a-time queue and the watch for a client that left.

:class:`Exchange` is what an endpoint's ``handle(handler)`` is given; :mod:`app.server.handler`
routes a request to it. :meth:`Exchange.read_json` reads a body (Content-Length only, at most
:data:`MAX_BODY_BYTES`, JSON only, the hostile-body checks of :mod:`app.server.body`);
:meth:`Exchange.use_model` waits its turn for the model; :meth:`Exchange.stream` streams a reply,
its first event pulled before the 200 (ARCHITECTURE.md, "The HTTP contract").
"""

from __future__ import annotations

import json
import logging
import select
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING

from app.server import state as server_state
from app.server.body import encode_text, parse_body, parse_document
from app.server.errors import ClientGone, HttpError, http_error_for, map_errors, overloaded
from app.server.sse import END_OF_BODY, SseEvent, event_chunk, with_head
from app.server.state import ServerState
from engine.errors import EngineError

if TYPE_CHECKING:
    from http.server import ThreadingHTTPServer

    from engine.inference.events import Event

log = logging.getLogger("glassbox.serve")

MAX_BODY_BYTES = 16 * 2**20

WRITE_STALL_S = 15.0
"""How long one write to a client may block (its socket full, because it stopped reading) before
the reply is cancelled and the model let go: a client that opens a stream and never reads it does
not hold the model for others."""

STREAM_SEND_BUFFER = 64 * 1024
"""The kernel send buffer of a streamed reply, in bytes: with the client's receive buffer, how far
generation may run ahead of a client that stopped reading before a write blocks."""


class Exchange(BaseHTTPRequestHandler):
    """A request being answered (the standard library's handler, one per connection, reused by
    each request a keep-alive connection sends: :meth:`begin` starts each)."""

    protocol_version = "HTTP/1.1"
    server_version = "Glassbox"
    sys_version = ""
    timeout = 120  # seconds an idle keep-alive connection may hold a thread
    server: ThreadingHTTPServer
    _body_read = False
    _responded = False  # a status line is on its way: an error can no longer be a fresh answer
    _live: Iterator[Event] | None = None  # the generation being streamed, drained after a failure
    anthropic = False  # the endpoint answers errors in Anthropic's shape

    def setup(self) -> None:
        super().setup()
        # Each token is one small write: without this, Nagle's algorithm delays them.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def handle_one_request(self) -> None:
        # A keep-alive connection waits for its next request with the idle timeout, whatever a
        # reply's writes were bounded by (_bound_writes).
        self.connection.settimeout(self.timeout)
        super().handle_one_request()

    def _bound_writes(self, stream: bool = False) -> None:
        """Bounds how long a write may block (:data:`WRITE_STALL_S`) and, for a stream, how much it
        may buffer (:data:`STREAM_SEND_BUFFER`)."""
        self.connection.settimeout(WRITE_STALL_S)
        if stream:
            try:
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, STREAM_SEND_BUFFER)
            except OSError:
                pass

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the stdlib's name)
        log.debug("%s %s", self.address_string(), format % args)

    def begin(self, anthropic: bool) -> None:
        """Starts answering a request: nothing read or sent yet, no warnings; ``anthropic``: its
        errors answer in Anthropic's shape."""
        self._body_read = False
        self._responded = False
        self._live = None
        self.warnings: list[str] = []  # said in the X-Glassbox-Warning header (fields with no effect)
        self.anthropic = anthropic
        self.state.begin_request(self.headers)

    def send_response(self, code: int, message: str | None = None) -> None:
        self._responded = True
        super().send_response(code, message)

    @property
    def state(self) -> ServerState:
        return self.server.state  # type: ignore[attr-defined, no-any-return]

    # request and response plumbing -----------------------------------------------------------
    def read_json(self) -> dict[str, object]:
        """The request's JSON body (see the module docstring). Raises HttpError."""
        return parse_body(self._read_body())

    def read_document(self) -> object:
        """The request's JSON body, an object or a list (llama.cpp's ``POST /lora-adapters``)."""
        return parse_document(self._read_body())

    def _read_body(self) -> bytes:
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
        return body

    def send_json(
        self, status: int, document: Mapping[str, object], *, close: bool = False, retry_after: int | None = None
    ) -> None:
        self.send_json_value(status, document, close=close, retry_after=retry_after)

    def send_json_value(
        self, status: int, document: object, *, close: bool = False, retry_after: int | None = None
    ) -> None:
        """A JSON answer whose document may be a list (llama.cpp's ``/lora-adapters``)."""
        data = encode_text(json.dumps(document, ensure_ascii=False))
        self._bound_writes()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if retry_after is not None:
            self.send_header("Retry-After", str(retry_after))
        self._send_warnings()
        self._send_cors()
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def start_sse(self) -> None:
        self._bound_writes(stream=True)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("X-Accel-Buffering", "no")
        self._send_warnings()
        self._send_cors()
        self.end_headers()

    def _send_cors(self) -> None:
        for name, value in self.state.cors.headers(self.headers.get("Origin")):
            self.send_header(name, value)

    def _send_warnings(self) -> None:
        if self.warnings:
            text = "; ".join(self.warnings).encode("ascii", "replace").decode("ascii")
            self.send_header("X-Glassbox-Warning", text.replace("\r", " ").replace("\n", " ")[:2000])

    def send_event(self, payload: str | Mapping[str, object], event: str | None = None) -> None:
        """One server-sent event: ``data:`` (a JSON document or text), after ``event:`` when named."""
        self.wfile.write(event_chunk(payload, event))  # one write per chunk

    def end_sse(self) -> None:
        self.wfile.write(END_OF_BODY)

    def hung_up(self) -> bool:
        """True when the client has closed (or reset) its connection; reads nothing it sent."""
        return _peer_closed(self.connection)

    # the model --------------------------------------------------------------------------------
    @contextmanager
    def use_model(self, switch_to: str | None = None) -> Iterator[threading.Event]:
        """Holds the request's model for one request; yields the request's cancel event.

        With the models the server owns (``ServerState.served``), the model ``check_model`` chose
        (or ``switch_to``) is leased from the pool: loaded if needed, its queue waited (503 with
        ``Retry-After`` past it), the request's adapters applied. A backend passed in has one queue
        (:meth:`_model_lock`).

        Raises:
            HttpError: 503 when too many requests wait or the server is stopping; the model asked
                for cannot be loaded.
            ClientGone: the client left while the request waited.
        """
        state = self.state
        cancel = threading.Event()
        state.enter_queue()
        try:
            served = state.served
            if served is not None:
                with self._active(cancel):
                    name = switch_to or state.request_model
                    with served.lease(name, cancel, state.request_keep_alive, state.request_lora) as session:
                        state.set_leased(session)
                        if self.hung_up():
                            raise ClientGone
                        yield cancel
                return
            with self._model_lock(), self._active(cancel):
                if self.hung_up():
                    raise ClientGone
                yield cancel
        finally:
            state.leave_queue()

    @contextmanager
    def _active(self, cancel: threading.Event) -> Iterator[None]:
        """Registers the request's cancel event, so that stopping the server cancels it."""
        state = self.state
        state.activate(cancel)
        try:
            yield
        except HttpError as exc:
            if state.closed and exc.status >= 500:
                raise HttpError(503, "the server is shutting down", "server_error") from None
            raise
        finally:
            state.deactivate(cancel)

    @contextmanager
    def _model_lock(self) -> Iterator[None]:
        """The model's lock, waited for at most :data:`~app.server.state.QUEUE_WAIT_S` (then a 503
        with ``Retry-After``: an answer, not a connection its client gives up on)."""
        lock = self.state.lock
        if not lock.acquire(timeout=server_state.QUEUE_WAIT_S):
            if self.hung_up():
                raise ClientGone
            raise overloaded(
                f"the model was busy with other requests for {server_state.QUEUE_WAIT_S:g} s",
                server_state.BUSY_RETRY_AFTER_S,
            )
        try:
            yield
        finally:
            lock.release()

    def generation(self, events: Iterator[Event], cancel: threading.Event) -> Iterator[Event]:
        """``events``, watched for a client that leaves; kept so that a failure can drain it."""
        self._live = self._watched(events, cancel)
        return self._live

    def _watched(self, events: Iterator[Event], cancel: threading.Event) -> Iterator[Event]:
        try:
            for event in events:
                if not cancel.is_set() and self.hung_up():
                    log.debug("client %s went away; cancelling its reply", self.address_string())
                    cancel.set()
                yield event
        except GeneratorExit:
            cancel.set()  # closed before its end (its reader failed): nobody wants the rest
            raise
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()

    def first(self, events: Iterator[Event]) -> Event:
        """The first event: planning errors become HTTP errors here, before any 200."""
        return map_errors(lambda: next(events))

    def stream(
        self,
        events: Iterator[Event],
        cancel: threading.Event,
        produce: Callable[[Iterator[Event]], None],
        error_events: Callable[[HttpError], list[SseEvent]],
    ) -> None:
        """Streams the reply of ``events`` (:meth:`generation`): its first event is pulled before the
        200 (:meth:`first`), then ``produce`` sends the events of all of them (:meth:`sse`)."""
        watched = self.generation(events, cancel)
        head = self.first(watched)
        self.sse(lambda: produce(with_head(head, watched)), cancel, error_events)

    def sse(
        self,
        produce: Callable[[], None],
        cancel: threading.Event,
        error_events: Callable[[HttpError], list[SseEvent]],
    ) -> None:
        """Streams a reply: ``produce`` sends its events; a failure mid-stream cancels the model,
        lets the worker settle, and ends the stream with ``error_events`` (the endpoint's dialect)."""
        self.start_sse()
        try:
            produce()
            self.end_sse()
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            # The client went away (its Stop button), or stopped reading for WRITE_STALL_S: stop the
            # model and let the worker settle.
            log.debug("client %s went away or stopped reading; cancelling its reply", self.address_string())
            cancel.set()
            self._drain()
            self.close_connection = True
        except Exception as exc:  # noqa: BLE001 - the stream ends with an error event; the log has the detail
            error = http_error_for(exc)  # a fixed message for the server's own failures; logs them
            log.warning("generation failed mid-stream: %s", error.message)
            cancel.set()  # when this code, not the model, failed: stop the model and let it settle
            self._drain()
            try:
                for name, payload in error_events(error):
                    self.send_event(payload, name)
                self.end_sse()
            except OSError:
                self.close_connection = True

    def _drain(self) -> None:
        events, self._live = self._live, None
        if events is None:
            return
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
