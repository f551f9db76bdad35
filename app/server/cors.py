"""Cross-origin requests from browser front ends (``--cors-origin``): off unless allowed, by origin.

A web page may call ``glassbox serve`` only from an origin on the allow-list: an exact origin
(``https://chat.example.org``), ``localhost`` (any page served from this machine: ``localhost``,
``127.0.0.1`` or ``[::1]``, any scheme and port), or ``*`` (any origin). The answer to such a
request, and to its preflight (``OPTIONS``, always 200, as llama.cpp's server answers it), names
that origin in ``Access-Control-Allow-Origin`` (``*`` for the wildcard); an origin not on the list
gets no CORS header, so the browser keeps the answer from the page. ``Access-Control-Allow-Credentials``
is never sent: the API key travels in the ``Authorization`` header, which needs no credentials mode,
so the wildcard never comes with credentials. The Host check against DNS rebinding and the API key
hold whatever the origin.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

from engine.errors import EngineError

ALLOW_METHODS = "GET, POST, DELETE, OPTIONS"
EXPOSE_HEADERS = "Retry-After, X-Glassbox-Warning"
MAX_AGE_S = 600
_TOKEN_LIST = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+(\s*,\s*[A-Za-z0-9!#$%&'*+.^_`|~-]+)*$")
_ORIGIN = re.compile(r"^[a-z][a-z0-9+.-]*://[^\s/?#]+$")
_LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")


@dataclass(frozen=True)
class CorsPolicy:
    """The origins allowed (empty: cross-origin requests are not answered with CORS headers)."""

    origins: tuple[str, ...] = ()

    @classmethod
    def parse(cls, values: Sequence[str]) -> CorsPolicy:
        """The policy of ``--cors-origin`` values (each may hold several, comma-separated).

        Raises:
            EngineError: a value that is neither ``*``, ``localhost`` nor an origin
                (``scheme://host[:port]``, no path).
        """
        origins: list[str] = []
        for value in values:
            for item in value.split(","):
                origin = item.strip().lower().rstrip("/")
                if not origin:
                    continue
                if origin not in ("*", "localhost") and not _ORIGIN.match(origin):
                    raise EngineError(
                        f"--cors-origin {item.strip()!r}: give an origin (https://host[:port]), 'localhost' or '*'"
                    )
                origins.append(origin)
        return cls(tuple(dict.fromkeys(origins)))

    def allow_origin(self, origin: str | None) -> str | None:
        """What ``Access-Control-Allow-Origin`` says to a request from ``origin`` (None: nothing)."""
        if not origin or not self.origins:
            return None
        if "*" in self.origins:
            return "*"
        wanted = origin.strip().lower().rstrip("/")
        if wanted in self.origins:
            return origin.strip()
        if "localhost" in self.origins and _loopback(wanted):
            return origin.strip()
        return None

    def headers(self, origin: str | None, preflight: dict[str, str] | None = None) -> list[tuple[str, str]]:
        """The CORS headers of an answer to ``origin`` (with ``preflight``, the request's
        ``Access-Control-Request-*`` headers, those of a preflight's answer)."""
        allowed = self.allow_origin(origin)
        if allowed is None:
            return [("Vary", "Origin")] if self.origins else []
        out = [("Access-Control-Allow-Origin", allowed), ("Vary", "Origin")]
        if preflight is None:
            out.append(("Access-Control-Expose-Headers", EXPOSE_HEADERS))
            return out
        out.append(("Access-Control-Allow-Methods", ALLOW_METHODS))
        asked = preflight.get("Access-Control-Request-Headers", "").strip()
        if asked and _TOKEN_LIST.match(asked):
            out.append(("Access-Control-Allow-Headers", asked[:1000]))
        out.append(("Access-Control-Max-Age", str(MAX_AGE_S)))
        return out


def _loopback(origin: str) -> bool:
    rest = origin.split("://", 1)[1] if "://" in origin else origin
    host = rest.split("]", 1)[0] + "]" if rest.startswith("[") else rest.split(":", 1)[0]
    if host in _LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
