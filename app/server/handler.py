"""The router of ``glassbox serve``: which endpoint answers a method and a path (:data:`ROUTES`), who
may call it (the API key, loopback hosts), and the answer when a request fails before or outside
its endpoint. Each endpoint is a ``handle(handler)`` in its own module, given the request as an
:class:`~app.server.exchange.Exchange` (ARCHITECTURE.md, "The HTTP contract").
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable

from app.server import chat, completions, embeddings, lora, messages, models, responses, tokens
from app.server.errors import ClientGone, HttpError, anthropic_error, anthropic_status, http_error_for
from app.server.exchange import Exchange

log = logging.getLogger("glassbox.serve")

_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1", "[::1]")

Endpoint = Callable[[Exchange], None]
"""An endpoint: answers the request it is given."""


def _health(handler: Exchange) -> None:
    handler.send_json(200, {"status": "ok"})


def _props(handler: Exchange) -> None:
    state = handler.state
    handler.send_json(200, {"model_alias": state.model_id, "default_generation_settings": {"n_ctx": state.n_ctx}})


ROUTES: dict[str, dict[str, Endpoint]] = {
    "GET": {
        "/v1/models": models.listing,
        "/models": models.listing,  # llama.cpp's, without /v1
        "/props": _props,
        "/health": _health,
        "/v1/health": _health,
        "/lora-adapters": lora.listing,
        "/glassbox/ps": models.ps,
    },
    "POST": {
        "/v1/chat/completions": chat.handle,
        "/chat/completions": chat.handle,  # llama.cpp's, without /v1
        "/v1/completions": completions.handle,
        "/v1/embeddings": embeddings.handle,
        "/v1/responses": responses.handle,
        "/responses": responses.handle,
        "/v1/messages": messages.handle,
        "/v1/messages/count_tokens": messages.count_tokens,
        "/tokenize": tokens.tokenize,
        "/detokenize": tokens.detokenize,
        "/lora-adapters": lora.set_scales,
        "/glassbox/unload": models.unload,
        "/models/unload": models.unload,  # llama.cpp's router
        "/models/load": models.load,
    },
    "DELETE": {},
}
"""The endpoints with a fixed path, by method; :func:`route` adds ``/v1/models/{id}`` and
``/v1/responses/{id}``."""


def route(method: str, path: str) -> Endpoint | None:
    """The endpoint that answers ``method`` on ``path`` (without its query and trailing ``/``), or None."""
    if method == "GET" and path.startswith("/v1/models/"):
        return lambda handler: models.one(handler, path[len("/v1/models/") :])
    if _is_response_path(path) and method in ("GET", "DELETE"):
        return responses.retrieve if method == "GET" else responses.delete
    return ROUTES.get(method, {}).get(path)


class Handler(Exchange):
    """The request handler the server is made with: each request routed to its endpoint."""

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def do_OPTIONS(self) -> None:
        """A CORS preflight: 200, with the CORS headers when the origin is allowed (app.server.cors)."""
        self.state.begin_request(self.headers)
        self._responded = True
        self.send_response(200)
        for name, value in self.state.cors.headers(self.headers.get("Origin"), dict(self.headers.items())):
            self.send_header(name, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _path(self) -> str:
        return self.path.split("?", 1)[0].rstrip("/") or "/"

    def _dispatch(self) -> None:
        path = self._path()
        endpoint = route(self.command, path)
        self.begin(anthropic=path.startswith("/v1/messages"))
        try:
            self._check_access()
            if endpoint is None:
                raise HttpError(404, f"no such endpoint: {self.command} {path[:200]}", code="not_found")
            endpoint(self)
        except HttpError as exc:
            # A body left unread would be taken for the next request: close instead.
            unread = self.command == "POST" and not self._body_read
            self.send_json(
                anthropic_status(exc) if self.anthropic else exc.status,
                anthropic_error(exc) if self.anthropic else exc.body(),
                close=unread or exc.status in (401, 403, 411, 413),
                retry_after=exc.retry_after,
            )
        except ClientGone:
            log.debug("client %s went away while queued", self.address_string())
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            # Gone, or stopped reading for WRITE_STALL_S: nobody to answer.
            self.close_connection = True
        except Exception as exc:  # noqa: BLE001 - whatever broke, the client gets an answer, the log the detail
            self.close_connection = True
            error = http_error_for(exc)  # logs it
            if not self._responded:
                try:
                    self.send_json(error.status, error.body(), close=True)
                except OSError:
                    pass

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
        if scheme.lower() != "bearer":
            given = self.headers.get("x-api-key") or ""  # Anthropic's clients send the key so
        if not hmac.compare_digest(given.strip().encode(), state.api_key.encode()):
            raise HttpError(401, "invalid or missing API key", code="invalid_api_key")


def _host_name(header: str) -> str:
    """The host part of a ``Host`` header (``[::1]:8080`` gives ``[::1]``), lower-cased."""
    header = header.strip().lower()
    if header.startswith("["):
        return header.split("]", 1)[0] + "]"
    return header.split(":", 1)[0]


def _is_response_path(path: str) -> bool:
    """Whether ``path`` is ``/v1/responses/{id}`` (a stored response)."""
    head, _, response_id = path.partition("/v1/responses/")
    return not head and bool(response_id) and "/" not in response_id
