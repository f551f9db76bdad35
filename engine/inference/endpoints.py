"""Saved remote endpoints: OpenAI-compatible servers the user added (URL, optional API key).

They live in one small JSON file in the user's config folder (the app passes its path in). The
file may hold API keys, so it is always written with owner-only permissions (0600) and atomically
(a temporary file in the same folder, fsync, rename): a crash never leaves a half-written file, and
the key is never readable by other users, not even for a moment. A file that others can read (left
by an older version, or copied in) is made owner-only when the store is opened.

The file format::

    {"version": 1, "endpoints": [{"name": "lab", "url": "http://10.0.0.5:8080", "api_key": "..."}]}
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from engine.atomic import PRIVATE_FILE_MODE, make_private, write_text_atomic
from engine.errors import EngineError

FILE_VERSION = 1
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_MAX_FILE_BYTES = 1 << 20


@dataclass(frozen=True)
class Endpoint:
    """One saved server.

    Attributes:
        name: the short name the user refers to it by (``glassbox endpoints models NAME``).
        url: the server's base URL, without a trailing ``/v1`` (normalized by :func:`normalize_url`).
        api_key: the bearer key, or None for servers that need none.
    """

    name: str
    url: str
    api_key: str | None = None

    def public_dict(self) -> dict[str, Any]:
        """A dict fit to print: the key is masked, never shown whole."""
        return {"name": self.name, "url": self.url, "api_key": mask_key(self.api_key)}


def mask_key(key: str | None) -> str | None:
    """``sk-…abcd``-style masking: enough to recognize a key, not enough to use it."""
    if not key:
        return None
    if len(key) <= 8:
        return "…"
    return f"{key[:3]}…{key[-4:]}"


def normalize_url(url: str) -> str:
    """Validates an endpoint URL and returns it without trailing slashes or ``/v1``.

    Raises:
        EngineError: not an http(s) URL with a host.
    """
    text = url.strip()
    try:
        parts = urlsplit(text)
        port = parts.port  # raises ValueError for a bad port
    except ValueError as exc:
        raise EngineError(f"{url}: not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EngineError(f"{url}: not an http:// or https:// URL with a host name")
    if parts.query or parts.fragment:
        raise EngineError(f"{url}: an endpoint URL takes no query or fragment")
    del port
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return f"{parts.scheme}://{parts.netloc}{path}"


def _default_name(url: str) -> str:
    parts = urlsplit(url)
    host = (parts.hostname or "server").replace(":", "-")
    name = f"{host}-{parts.port}" if parts.port else host
    return re.sub(r"[^A-Za-z0-9._-]", "-", name)[:64]


class EndpointStore:
    """The saved endpoints, kept in one JSON file.

    Args:
        path: the JSON file (the app passes ``paths.config / "endpoints.json"``).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        make_private(path)

    def all(self) -> list[Endpoint]:
        """All saved endpoints, in the order they were added.

        Raises:
            EngineError: the file exists but is unreadable or malformed.
        """
        return self._read()

    def get(self, name: str) -> Endpoint:
        """The endpoint called ``name``.

        Raises:
            EngineError: there is none by that name.
        """
        for endpoint in self._read():
            if endpoint.name == name:
                return endpoint
        known = ", ".join(e.name for e in self._read()) or "none saved"
        raise EngineError(f"{name}: no saved endpoint by that name ({known})")

    def add(self, url: str, *, name: str | None = None, api_key: str | None = None) -> Endpoint:
        """Saves a new endpoint and returns it.

        Raises:
            EngineError: bad URL, bad name, or the name is taken.
        """
        clean = normalize_url(url)
        chosen = name if name is not None else _default_name(clean)
        if not _NAME_RE.match(chosen):
            raise EngineError(
                f"{chosen}: an endpoint name is 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
            )
        if api_key is not None and (not api_key.strip() or any(c in api_key for c in "\r\n")):
            raise EngineError(f"{chosen}: the API key is empty or spans several lines")
        endpoints = self._read()
        if any(e.name == chosen for e in endpoints):
            raise EngineError(f"{chosen}: an endpoint by that name already exists (remove it first)")
        endpoint = Endpoint(name=chosen, url=clean, api_key=api_key.strip() if api_key else None)
        self._write([*endpoints, endpoint])
        return endpoint

    def remove(self, name: str) -> Endpoint:
        """Forgets the endpoint called ``name`` and returns it.

        Raises:
            EngineError: there is none by that name.
        """
        endpoint = self.get(name)
        self._write([e for e in self._read() if e.name != name])
        return endpoint

    # storage ----------------------------------------------------------------------------------
    def _read(self) -> list[Endpoint]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size > _MAX_FILE_BYTES:
            raise EngineError(f"{self.path}: the endpoints file is implausibly large ({size} bytes)")
        try:
            document = json.loads(self.path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise EngineError(f"{self.path}: the endpoints file is not valid JSON ({exc})") from None
        entries = document.get("endpoints") if isinstance(document, dict) else None
        if not isinstance(entries, list):
            raise EngineError(f"{self.path}: the endpoints file has no 'endpoints' list")
        endpoints: list[Endpoint] = []
        for entry in entries:
            if not (
                isinstance(entry, dict)
                and isinstance(entry.get("name"), str)
                and isinstance(entry.get("url"), str)
                and isinstance(entry.get("api_key"), str | None)
            ):
                raise EngineError(f"{self.path}: the endpoints file has a malformed entry")
            endpoints.append(Endpoint(entry["name"], entry["url"], entry.get("api_key")))
        return endpoints

    def _write(self, endpoints: list[Endpoint]) -> None:
        document = {
            "version": FILE_VERSION,
            "endpoints": [{"name": e.name, "url": e.url, "api_key": e.api_key} for e in endpoints],
        }
        # Owner-only (0600) from the first byte: the API keys are never readable by others.
        write_text_atomic(self.path, json.dumps(document, indent=2), mode=PRIVATE_FILE_MODE)
