"""The HTTP layer under ``engine.hub.search`` and ``engine.hub.downloads``: one small client over ``http.client``.

It follows redirects itself so that the token (``$HF_TOKEN``) is only ever sent to the Hub's own
host, never to a CDN it redirects to; keeps the headers of the first hop (``X-Repo-Commit``,
``X-Linked-Etag``, ``X-Linked-Size``); honours ``HTTPS_PROXY``/``NO_PROXY``; and hands out the
socket, so the downloader's watchdog can cut a stalled or cancelled transfer at once.

HTTP failures become typed errors with one-line messages: ``GatedRepoError`` (401/403),
``RepoNotFoundError`` (404), ``RateLimitedError`` (429, after retries that honour ``Retry-After``),
``OfflineError`` (connection refused, DNS failure, timeout) and ``HubHTTPError`` (the rest). All
are ``engine.errors.DownloadError``.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import random
import re
import socket
import ssl
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any

from engine.errors import DownloadError

DEFAULT_ENDPOINT = "https://huggingface.co"
USER_AGENT = "glassbox/0.1"
_MAX_JSON_BYTES = 64 * 2**20
_MAX_REDIRECTS = 10
_MAX_RETRY_AFTER_S = 300.0

# ---------------------------------------------------------------------------------------- errors


class GatedRepoError(DownloadError):
    """401/403: the repository is gated or private (or the token is wrong)."""


class RepoNotFoundError(DownloadError):
    """404: no such repository, revision or file."""


class RateLimitedError(DownloadError):
    """429 that persisted through the retries.

    Args:
        message: the one-line message.
        retry_after_s: what the server last asked us to wait, when it said.
    """

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(message)


class OfflineError(DownloadError):
    """The endpoint cannot be reached at all (connection refused, DNS failure, timeout)."""


class HubHTTPError(DownloadError):
    """Any other unexpected HTTP status (5xx after retries, odd 4xx).

    Args:
        message: the one-line message.
        status: the HTTP status code.
    """

    def __init__(self, message: str, status: int) -> None:
        self.status = status
        super().__init__(message)


# ---------------------------------------------------------------------------------------- endpoint


def resolve_endpoint(endpoint: str | None = None) -> str:
    """The Hub endpoint to use: ``endpoint``, else ``$HF_ENDPOINT``, else huggingface.co.

    Raises:
        DownloadError: the endpoint is not an http(s) URL.
    """
    chosen = (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).strip().rstrip("/")
    parts = urllib.parse.urlsplit(chosen)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DownloadError(f"{chosen}: not a valid Hugging Face endpoint (expected http:// or https://)")
    return chosen


def hf_token() -> str | None:
    """The access token from ``$HF_TOKEN`` (never logged, never sent to another host)."""
    token = os.environ.get("HF_TOKEN", "").strip()
    return token or None


# ------------------------------------------------------------------------------------------ HTTP


@dataclass
class HttpResponse:
    """An open response after redirects.

    Args:
        status: the final status code.
        headers: the final response's headers (lower-case names).
        first_headers: the first hop's headers (the Hub's own: ``x-repo-commit``, ``x-linked-etag``).
        url: the final URL.
        body: the ``http.client`` response, to be read.
        sock: the socket under it (shut it down to unblock a read from another thread).
    """

    status: int
    headers: dict[str, str]
    first_headers: dict[str, str]
    url: str
    body: http.client.HTTPResponse
    conn: http.client.HTTPConnection
    sock: socket.socket | None = None
    closed: bool = field(default=False)

    def close(self) -> None:
        """Closes the response and its connection; safe to call twice."""
        if self.closed:
            return
        self.closed = True
        try:
            self.body.close()
        finally:
            self.conn.close()


def _proxy_for(parts: urllib.parse.SplitResult) -> urllib.parse.SplitResult | None:
    host = parts.hostname or ""
    if host in ("localhost", "127.0.0.1", "::1") or host.startswith("127."):
        return None
    proxy = urllib.request.getproxies().get(parts.scheme)
    if not proxy or urllib.request.proxy_bypass(host):
        return None
    if "://" not in proxy:
        proxy = f"http://{proxy}"
    return urllib.parse.urlsplit(proxy)


def _connect(parts: urllib.parse.SplitResult, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
    """A connection for ``parts``; the flag says whether requests must use the absolute URL."""
    host = parts.hostname or ""
    port = parts.port
    proxy = _proxy_for(parts)
    if proxy is None:
        if parts.scheme == "https":
            return http.client.HTTPSConnection(host, port, timeout=timeout, context=ssl.create_default_context()), False
        return http.client.HTTPConnection(host, port, timeout=timeout), False
    proxy_headers: dict[str, str] = {}
    if proxy.username:
        raw = f"{urllib.parse.unquote(proxy.username)}:{urllib.parse.unquote(proxy.password or '')}"
        proxy_headers["Proxy-Authorization"] = "Basic " + base64.b64encode(raw.encode()).decode()
    if parts.scheme == "https":
        # CONNECT through the proxy, then TLS to the Hub itself (certificate checked for its name).
        tunnel = http.client.HTTPSConnection(
            proxy.hostname or "", proxy.port, timeout=timeout, context=ssl.create_default_context()
        )
        tunnel.set_tunnel(host, port, headers=proxy_headers)
        return tunnel, False
    return http.client.HTTPConnection(proxy.hostname or "", proxy.port, timeout=timeout), True


def _lower(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers}


def open_url(
    url: str,
    *,
    endpoint: str,
    headers: Mapping[str, str] | None = None,
    timeout: float = 30.0,
    method: str = "GET",
    on_socket: Callable[[socket.socket | None], None] | None = None,
) -> HttpResponse:
    """Opens ``url`` and follows redirects; the caller reads and closes the response.

    The ``Authorization`` header (from ``$HF_TOKEN``) goes only to the endpoint's own host.
    Connection errors raise ``OfflineError`` naming the endpoint; HTTP errors are returned, not
    raised (see ``raise_for_status``).

    Args:
        url: absolute http(s) URL.
        endpoint: the Hub endpoint (to decide where the token may go, and for messages).
        headers: extra request headers.
        timeout: socket timeout in seconds (connect and each read).
        method: ``GET`` or ``HEAD``.
        on_socket: called with each hop's socket once connected, before the request is sent
            (the downloader's watchdog uses it to cut a connection that hangs).
    """
    endpoint_host = urllib.parse.urlsplit(endpoint).netloc.lower()
    token = hf_token()
    first_headers: dict[str, str] | None = None
    current = url
    for _ in range(_MAX_REDIRECTS + 1):
        parts = urllib.parse.urlsplit(current)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise DownloadError(f"{current}: the server redirected to an unsupported URL")
        request_headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
        request_headers.update(headers or {})
        if token and parts.netloc.lower() == endpoint_host:
            request_headers["Authorization"] = f"Bearer {token}"
        try:
            conn, absolute = _connect(parts, timeout)
            conn.connect()
            sock = conn.sock
            if on_socket is not None:
                on_socket(sock)
            path_query = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
            target = current if absolute else path_query
            conn.request(method, target, headers=request_headers)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            raise OfflineError(f"offline: cannot reach {endpoint} ({_describe_oserror(exc)})") from None
        hop_headers = _lower(resp.getheaders())
        if first_headers is None:
            first_headers = hop_headers
        if resp.status in (301, 302, 303, 307, 308) and "location" in hop_headers:
            resp.read(65536)
            resp.close()
            conn.close()
            current = urllib.parse.urljoin(current, hop_headers["location"])
            continue
        return HttpResponse(resp.status, hop_headers, first_headers, current, resp, conn, sock)
    raise DownloadError(f"{url}: too many redirects")


def _describe_oserror(exc: BaseException) -> str:
    if isinstance(exc, socket.gaierror):
        return "name lookup failed"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timed out"
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return str(text).splitlines()[0] if str(text) else type(exc).__name__


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """The ``Retry-After`` header in seconds (delta-seconds or an HTTP date), capped; None if absent."""
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    return max(0.0, min(seconds, _MAX_RETRY_AFTER_S))


def status_error(status: int, what: str, endpoint: str, headers: Mapping[str, str]) -> DownloadError:
    """The typed, one-line error for an HTTP failure ``status`` while fetching ``what``."""
    if status in (401, 403):
        return GatedRepoError(f"{what}: gated or private: accept the licence on the model page and set HF_TOKEN")
    if status == 404:
        return RepoNotFoundError(f"{what}: no such repository/file (HTTP 404)")
    if status == 429:
        wait = retry_after_seconds(headers)
        hint = f"; try again in {wait:.0f} s" if wait else "; try again later"
        return RateLimitedError(f"{what}: rate limited by {endpoint}{hint}", wait)
    return HubHTTPError(f"{what}: the server answered HTTP {status}", status)


def backoff_delay(attempt: int, base_s: float, max_s: float) -> float:
    """Exponential backoff with jitter: about ``base_s * 2**(attempt-1)``, capped at ``max_s``."""
    delay: float = min(max_s, base_s * (2 ** max(0, attempt - 1)))
    return delay * random.uniform(0.5, 1.0)  # jitter, not security


def is_retryable_status(status: int) -> bool:
    """Whether an HTTP status is worth retrying (rate limits and server-side failures)."""
    return status in (408, 425, 429, 500, 502, 503, 504)


def get_json(
    url: str,
    *,
    endpoint: str,
    what: str,
    retries: int = 4,
    backoff_s: float = 1.0,
    timeout: float = 30.0,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[Any, dict[str, str]]:
    """GETs a JSON document, retrying rate limits and server errors.

    Args:
        url: the API URL.
        endpoint: the Hub endpoint (token scope and messages).
        what: what is being fetched, for messages (a repo id, or "search").
        retries: how many times to retry 429/5xx and dropped connections.
        backoff_s: first backoff delay; doubles each retry (``Retry-After`` wins when larger).
        timeout: socket timeout.
        sleep: the sleep function (tests pass a fake).

    Returns:
        The decoded document and the response headers.

    Raises:
        DownloadError: a typed subclass for 401/403/404/429/offline, or a bad document.
    """
    attempt = 0
    while True:
        attempt += 1
        response: HttpResponse | None = None
        try:
            response = open_url(url, endpoint=endpoint, headers={"Accept": "application/json"}, timeout=timeout)
            if response.status == 200:
                raw = response.body.read(_MAX_JSON_BYTES + 1)
                if len(raw) > _MAX_JSON_BYTES:
                    raise DownloadError(f"{what}: the server's answer is too large")
                try:
                    return json.loads(raw), response.headers
                except ValueError:
                    raise DownloadError(f"{what}: the server did not answer with JSON") from None
            error = status_error(response.status, what, endpoint, response.headers)
            if not is_retryable_status(response.status) or attempt > retries:
                raise error
            wait = max(backoff_delay(attempt, backoff_s, 60.0), retry_after_seconds(response.headers) or 0.0)
        except OfflineError:
            # Unreachable is usually not transient (no network, no DNS): one quick retry, then say so.
            if attempt > min(retries, 1):
                raise
            wait = min(backoff_s, 1.0)
        except (OSError, http.client.HTTPException) as exc:
            if attempt > retries:
                raise OfflineError(f"offline: cannot reach {endpoint} ({_describe_oserror(exc)})") from None
            wait = backoff_delay(attempt, backoff_s, 60.0)
        finally:
            if response is not None:
                response.close()
        sleep(wait)


def next_link(headers: Mapping[str, str], endpoint: str) -> str | None:
    """The ``rel="next"`` URL of a paginated answer, only if it stays on the endpoint's host."""
    link = headers.get("link", "")
    for item in link.split(","):
        match = re.match(r'\s*<([^>]+)>\s*;.*rel="?next"?', item)
        if match:
            url: str = urllib.parse.urljoin(endpoint + "/", match.group(1))
            if urllib.parse.urlsplit(url).netloc.lower() == urllib.parse.urlsplit(endpoint).netloc.lower():
                return url
    return None
