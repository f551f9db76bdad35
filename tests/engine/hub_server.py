"""A loopback fake of the Hugging Face Hub, for tests (``HF_ENDPOINT=http://127.0.0.1:PORT``).

It speaks the endpoints Glassbox uses, the way the real Hub answers them:

- ``GET /api/models?search=&filter=gguf&sort=&limit=&expand=...`` (repos with a ``.gguf`` file;
  each further ``filter`` is a tag the repo must have, e.g. ``lora`` or ``base_model:adapter:X``;
  each hit lists its ``tags`` and ``cardData``);
- ``GET /api/models/{repo}/revision/{rev}`` (``sha``, ``gated``, ``siblings``);
- ``GET /api/models/{repo}/tree/{rev}?recursive=true`` (``path``, ``size``, ``oid``, ``lfs.oid``,
  paginated with a ``Link: <...>; rel="next"`` header when ``page_size`` is small);
- ``GET|HEAD /{repo}/resolve/{rev}/{path}``: for LFS files a 302 to a CDN-like path
  ``/cdn/{sha256}`` (on ``cdn_host``, by default the same host) with ``X-Repo-Commit``,
  ``X-Linked-Etag`` and ``X-Linked-Size``; small git files are answered directly;
- ``GET /cdn/{sha256}``: the bytes, with ``Range: bytes=N-`` support (206 / 416).

Fault switches (``Faults``) make it misbehave on the file bytes: drop the connection after N body
bytes (N times), ignore ``Range``, send a short body under the full ``Content-Length``, flip one
byte, stall, throttle, and answer a status (401/403/404/429 with ``Retry-After``, 500) for
matching paths. ``requests`` records every request (method, path, headers) for assertions.

Run it as a script (``python hub_server.py``) to serve a demo repo until killed; it prints its
URL on the first line.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class FakeRepo:
    """One repository: file path -> bytes, plus what the Hub says about it."""

    files: dict[str, bytes]
    commit: str = ""
    gated: bool = False
    token: str | None = None  # the token that opens a gated/private repo
    downloads: int = 0
    likes: int = 0
    last_modified: str = "2025-01-01T00:00:00.000Z"
    lfs: bool = True  # small text files (json, md) are never LFS, like on the Hub
    declared_sha: dict[str, str] = field(default_factory=dict)  # override the listed LFS sha256
    declared_size: dict[str, int] = field(default_factory=dict)  # override the listed size
    tags: list[str] = field(default_factory=list)  # the Hub's tags (``lora``, ``base_model:adapter:X``)
    card_data: dict[str, Any] = field(default_factory=dict)  # the model card's metadata

    def is_lfs(self, path: str) -> bool:
        return self.lfs and not path.endswith((".json", ".md", ".txt"))


@dataclass
class Faults:
    """What goes wrong on file bytes (``/cdn`` and direct resolves). Counters count down."""

    drop_after: int = 0  # drop the connection after this many body bytes ...
    drop_times: int = 0  # ... in this many responses
    ignore_range: bool = False  # answer 200 with the whole file to a Range request
    short_body_times: int = 0  # send half the promised bytes, then close, this many times
    flip_byte_times: int = 0  # flip the middle byte of the file in this many responses
    stall_after: int = 0  # stall after this many body bytes ...
    stall_s: float = 0.0  # ... for this long ...
    stall_times: int = 0  # ... in this many responses
    stall_headers_times: int = 0  # stall before sending any header (stall_s), this many times
    throttle_bps: float = 0.0  # limit the body rate (0: unlimited)
    status: list[tuple[str, int, int, float | None]] = field(default_factory=list)
    # (path substring, status, times, Retry-After seconds or None)


class FakeHub:
    """The server; use as a context manager. ``url`` is the endpoint."""

    def __init__(self, *, page_size: int = 1000, cdn_host: str | None = None) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.faults = Faults()
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.page_size = page_size
        self.lock = threading.Lock()
        self.cdn_host = cdn_host
        self.blobs: dict[str, bytes] = {}
        self.snapshots: dict[tuple[str, str], FakeRepo] = {}  # older commits stay reachable
        self._server = _QuietServer(("127.0.0.1", 0), _make_handler(self))
        self._server.daemon_threads = True
        self._server.block_on_close = False
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-hub", daemon=True
        )

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def add_repo(self, repo_id: str, files: dict[str, bytes], **kwargs: Any) -> FakeRepo:
        """Adds (or replaces) a repository; its commit sha is derived from its content."""
        repo = FakeRepo(files=dict(files), **kwargs)
        if not repo.commit:
            digest = hashlib.sha1(repo_id.encode())
            for name in sorted(files):
                digest.update(name.encode() + hashlib.sha256(files[name]).digest())
            repo.commit = digest.hexdigest()
        for data in files.values():
            self.blobs[hashlib.sha256(data).hexdigest()] = data
        previous = self.repos.get(repo_id)
        if previous is not None:
            self.snapshots[(repo_id, previous.commit)] = previous
        self.repos[repo_id] = repo
        return repo

    def count(self, method: str, path_contains: str) -> int:
        """How many requests with this method had ``path_contains`` in their path."""
        return sum(1 for m, p, _ in self.requests if m == method and path_contains in p)

    def take(self, name: str) -> bool:
        """Decrements the fault counter ``name`` if positive; True if the fault fires now."""
        with self.lock:
            left = getattr(self.faults, name)
            if left > 0:
                setattr(self.faults, name, left - 1)
                return True
            return False

    def status_for(self, path: str) -> tuple[int, float | None] | None:
        with self.lock:
            for i, (needle, status, times, retry_after) in enumerate(self.faults.status):
                if needle in path and times > 0:
                    self.faults.status[i] = (needle, status, times - 1, retry_after)
                    return status, retry_after
        return None


class _QuietServer(ThreadingHTTPServer):
    """Clients that hang up (killed downloads, cut connections) are normal here, not errors."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def random_bytes(n: int, seed: int = 0) -> bytes:
    """``n`` pseudo-random bytes (fast, reproducible)."""
    return random.Random(seed).randbytes(n)


def _make_handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
            pass

        # ---------------------------------------------------------------- helpers
        def _send_json(self, document: Any, status: int = 200, headers: dict[str, str] | None = None) -> None:
            body = json.dumps(document).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _error(self, status: int, retry_after: float | None = None) -> None:
            headers = {"X-Error-Code": {401: "GatedRepo", 404: "RepoNotFound"}.get(status, "Error")}
            if retry_after is not None:
                headers["Retry-After"] = f"{retry_after:g}"
            self._send_json({"error": f"status {status}"}, status, headers)

        def _repo(self, repo_id: str, rev: str) -> FakeRepo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._error(404)
                return None
            if repo.gated and self.headers.get("Authorization") != f"Bearer {repo.token}":
                self._error(401)
                return None
            if rev in ("main", repo.commit):
                return repo
            old = hub.snapshots.get((repo_id, rev))
            if old is None:
                self._error(404)
            return old

        # ---------------------------------------------------------------- routes
        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            parts = urllib.parse.urlsplit(self.path)
            path = urllib.parse.unquote(parts.path)
            hub.requests.append((self.command, self.path, dict(self.headers.items())))
            forced = hub.status_for(self.path)
            if forced is not None:
                self._error(*forced)
                return
            query = urllib.parse.parse_qs(parts.query)
            try:
                if path == "/api/models":
                    self._search(query)
                elif m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/(.+)", path):
                    self._revision(m.group(1), m.group(2))
                elif m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)", path):
                    self._tree(m.group(1), m.group(2), query)
                elif m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
                    self._resolve(m.group(1), m.group(2), m.group(3))
                elif m := re.fullmatch(r"/cdn/([0-9a-f]{64})", path):
                    data = hub.blobs.get(m.group(1))
                    if data is None:
                        self._error(404)
                    else:
                        self._send_bytes(data, {"ETag": f'"{m.group(1)}"'})
                else:
                    self._error(404)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def _search(self, query: dict[str, list[str]]) -> None:
            words = query.get("search", [""])[0].lower()
            sort = query.get("sort", ["downloads"])[0]
            limit = int(query.get("limit", ["20"])[0])
            tags = [t for t in query.get("filter", []) if t != "gguf"]
            hits = [
                (rid, r)
                for rid, r in hub.repos.items()
                if words in rid.lower() and any(p.endswith(".gguf") for p in r.files) and all(t in r.tags for t in tags)
            ]
            key = {
                "downloads": lambda h: h[1].downloads,
                "likes": lambda h: h[1].likes,
                "lastModified": lambda h: h[1].last_modified,
            }[sort]
            hits.sort(key=key, reverse=query.get("direction", ["-1"])[0] == "-1")
            self._send_json(
                [
                    {
                        "_id": rid,
                        "id": rid,
                        "downloads": r.downloads,
                        "likes": r.likes,
                        "lastModified": r.last_modified,
                        "gated": "manual" if r.gated else False,
                        "private": False,
                        "tags": ["gguf", *r.tags],
                        "cardData": r.card_data,
                    }
                    for rid, r in hits[:limit]
                ]
            )

        def _revision(self, repo_id: str, rev: str) -> None:
            repo = self._repo(repo_id, rev)
            if repo is None:
                return
            self._send_json(
                {
                    "id": repo_id,
                    "sha": repo.commit,
                    "gated": "manual" if repo.gated else False,
                    "private": False,
                    "siblings": [{"rfilename": p} for p in repo.files],
                }
            )

        def _tree(self, repo_id: str, rev: str, query: dict[str, list[str]]) -> None:
            repo = self._repo(repo_id, rev)
            if repo is None:
                return
            entries: list[dict[str, Any]] = []
            folders = sorted({p.rsplit("/", 1)[0] for p in repo.files if "/" in p})
            entries += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": f} for f in folders]
            for name, data in sorted(repo.files.items()):
                entry: dict[str, Any] = {
                    "type": "file",
                    "oid": hashlib.sha1(data).hexdigest(),
                    "size": repo.declared_size.get(name, len(data)),
                    "path": name,
                }
                if repo.is_lfs(name):
                    sha = repo.declared_sha.get(name, hashlib.sha256(data).hexdigest())
                    entry["lfs"] = {"oid": sha, "size": entry["size"], "pointerSize": 134}
                entries.append(entry)
            start = int(query.get("cursor", ["0"])[0])
            page = entries[start : start + hub.page_size]
            headers = {}
            if start + hub.page_size < len(entries):
                cursor = start + hub.page_size
                nxt = f"{hub.url}/api/models/{repo_id}/tree/{rev}?recursive=true&cursor={cursor}"
                headers["Link"] = f'<{nxt}>; rel="next"'
            self._send_json(page, headers=headers)

        def _resolve(self, repo_id: str, rev: str, name: str) -> None:
            repo = self._repo(repo_id, rev)
            if repo is None:
                return
            data = repo.files.get(name)
            if data is None:
                self._error(404)
                return
            common = {"X-Repo-Commit": repo.commit}
            if not repo.is_lfs(name):
                self._send_bytes(data, {**common, "ETag": f'"{hashlib.sha1(data).hexdigest()}"'})
                return
            sha = hashlib.sha256(data).hexdigest()
            host = f"{hub.cdn_host}:{hub.port}" if hub.cdn_host else self.headers.get("Host", "")
            self.send_response(302)
            self.send_header("Location", f"http://{host}/cdn/{sha}")
            self.send_header("X-Repo-Commit", repo.commit)
            self.send_header("X-Linked-Etag", f'"{sha}"')
            self.send_header("X-Linked-Size", str(len(data)))
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _send_bytes(self, data: bytes, headers: dict[str, str]) -> None:
            faults = hub.faults
            if faults.stall_headers_times and hub.take("stall_headers_times"):
                time.sleep(faults.stall_s)
            total = len(data)
            start = 0
            match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
            if match and not faults.ignore_range:
                start = int(match.group(1))
                end = int(match.group(2)) if match.group(2) else total - 1
                if start >= total:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{total}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end}/{total}")
                body = memoryview(data)[start : end + 1]
            else:
                self.send_response(200)
                body = memoryview(data)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Accept-Ranges", "bytes")
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            if self.command == "HEAD":
                return
            if faults.flip_byte_times and hub.take("flip_byte_times"):
                flipped = bytearray(body)
                middle = total // 2 - start
                if 0 <= middle < len(flipped):
                    flipped[middle] ^= 0xFF
                body = memoryview(bytes(flipped))
            limit = len(body)
            drop = faults.drop_times > 0 and faults.drop_after < limit and hub.take("drop_times")
            if drop:
                limit = faults.drop_after
            elif faults.short_body_times and hub.take("short_body_times"):
                limit = len(body) // 2
                drop = True
            stall_at = faults.stall_after if faults.stall_times and hub.take("stall_times") else -1
            self._write_body(body, limit, stall_at)
            if drop:
                self.close_connection = True
                self.connection.shutdown(2)

        def _write_body(self, body: memoryview, limit: int, stall_at: int) -> None:
            faults = hub.faults
            chunk = 64 * 1024
            if faults.throttle_bps:
                chunk = max(1024, int(faults.throttle_bps / 20))
            sent = 0
            began = time.monotonic()
            while sent < limit:
                if sent <= stall_at < sent + chunk:
                    self.wfile.write(body[sent:stall_at])
                    self.wfile.flush()
                    sent = stall_at
                    time.sleep(faults.stall_s)
                    stall_at = -1
                    continue
                piece = body[sent : min(limit, sent + chunk)]
                self.wfile.write(piece)
                sent += len(piece)
                if faults.throttle_bps:
                    ahead = sent / faults.throttle_bps - (time.monotonic() - began)
                    if ahead > 0:
                        time.sleep(ahead)
            self.wfile.flush()

    return Handler


def demo_hub() -> FakeHub:
    """A hub with a few repos, for manual runs."""
    hub = FakeHub()
    hub.add_repo(
        "demo/tiny-GGUF",
        {
            "tiny-Q4_K_M.gguf": random_bytes(2 << 20, 1),
            "tiny-Q8_0.gguf": random_bytes(3 << 20, 2),
            "README.md": b"# tiny\n",
        },
        downloads=10,
        likes=2,
    )
    return hub


if __name__ == "__main__":
    with demo_hub() as running:
        print(running.url, flush=True)
        if os.environ.get("HUB_THROTTLE_BPS"):
            running.faults.throttle_bps = float(os.environ["HUB_THROTTLE_BPS"])
        threading.Event().wait()
