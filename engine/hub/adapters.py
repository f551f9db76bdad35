"""LoRA adapters on the Hugging Face Hub: find GGUF adapter repositories, say the base model each
adapts, and read each adapter file's header before it is downloaded.

``search_adapters`` asks ``/api/models`` for GGUF repositories tagged ``lora`` (or, given a base
model, those tagged ``base_model:adapter:<base>``: what the Hub derives from a model card's
``base_model`` and ``base_model_relation: adapter``); the base each adapts comes from those tags,
else from the card's ``base_model``. ``inspect_adapter_repo`` lists a repository's GGUF files and
reads the first bytes of each by HTTP range request: a header that says ``general.type = adapter``
is checked against the given library models as a load would check it (``engine.lora``), so
Discover can say which model of the library an adapter fits before anything is downloaded.
A download is a model's (``engine.hub.model_download``); ARCHITECTURE.md, "engine.hub.adapters".
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import DownloadError, EngineError
from engine.gguf import GgufHeaderNeedsMoreBytes, GgufInfo
from engine.gguf_tensors import TensorShape, parse_tensor_shapes_prefix, read_tensor_shapes
from engine.hub.http import OfflineError, get_json, open_url, resolve_endpoint, status_error
from engine.hub.search import (
    _SORT_FIELDS,
    ModelChoice,
    RepoFiles,
    SortKey,
    check_repo_id,
    check_search,
    list_repo_files,
)
from engine.lora import adapter_from_header, check_adapter_header

__all__ = [
    "AdapterHit",
    "AdapterRepo",
    "RemoteAdapter",
    "adapter_base_from_tags",
    "inspect_adapter_repo",
    "read_remote_header",
    "search_adapters",
]

_FIRST_READ = 256 * 1024
_MAX_HEADER = 32 * 2**20  # an adapter's header is small: a file that needs more is not read here


@dataclass(frozen=True)
class AdapterHit:
    """One adapter repository found on the Hub.

    Attributes:
        id: ``owner/name``.
        base_model: the model it adapts (``owner/name``, from its tags or model card), or None.
        downloads, likes, gated: as for a model (``engine.hub.search.RepoSummary``).
    """

    id: str
    base_model: str | None
    downloads: int
    likes: int
    gated: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "base_model": self.base_model,
            "downloads": self.downloads,
            "likes": self.likes,
            "gated": self.gated,
        }


@dataclass(frozen=True)
class RemoteAdapter:
    """One GGUF file of an adapter repository, as its header (read before download) says.

    Attributes:
        choice: the file, downloadable as a model choice is.
        is_adapter: the header says ``general.type = adapter`` and ``adapter.type = lora``.
        architecture: ``general.architecture`` (None: the header was not read).
        rank: the rank of its first pair.
        base_model: the base the header names (``general.base_model.0.*``), or None.
        fits: the library models it fits (architecture, every tensor, every shape), in order.
        note: why the header was not read, or what it is instead of an adapter; None when it is one.
    """

    choice: ModelChoice
    is_adapter: bool
    architecture: str | None = None
    rank: int | None = None
    base_model: str | None = None
    fits: tuple[Path, ...] = ()
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.choice.files[0].filename,
            "size": self.choice.total_size,
            "is_adapter": self.is_adapter,
            "architecture": self.architecture,
            "rank": self.rank,
            "base_model": self.base_model,
            "fits": [str(p) for p in self.fits],
            "note": self.note,
        }


@dataclass(frozen=True)
class AdapterRepo:
    """An adapter repository's files (``files``) and each GGUF file's header (``adapters``, in the
    order of ``files.choices``)."""

    files: RepoFiles
    adapters: tuple[RemoteAdapter, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"repo": self.files.repo, "commit": self.files.commit, "adapters": [a.to_dict() for a in self.adapters]}


def adapter_base_from_tags(tags: Sequence[object], card: Mapping[str, Any] | None = None) -> str | None:
    """The base model an adapter repository names: its ``base_model:adapter:<repo>`` tag, else a
    ``base_model:<repo>`` tag, else its model card's ``base_model`` (a string or the first of a
    list); None when none says."""
    names = [t for t in tags if isinstance(t, str)]
    for prefix in ("base_model:adapter:", "base_model:"):
        for tag in names:
            rest = tag.removeprefix(prefix)
            if rest != tag and rest.count("/") == 1 and ":" not in rest:
                return rest
    base = (card or {}).get("base_model")
    if isinstance(base, list):
        base = next((b for b in base if isinstance(b, str)), None)
    return base if isinstance(base, str) and base else None


def search_adapters(
    query: str = "",
    *,
    base_model: str | None = None,
    sort: SortKey = "downloads",
    limit: int = 20,
    endpoint: str | None = None,
    retries: int = 4,
    backoff_s: float = 1.0,
) -> list[AdapterHit]:
    """Searches the Hub for GGUF LoRA adapter repositories.

    Args:
        query: words in the repository name (may be empty with ``base_model``).
        base_model: only adapters of this model (``owner/name``: the ``base_model:adapter:`` tag).
        sort: ``downloads``, ``likes`` or ``recent``, descending.
        limit: at most this many (1..1000).
        endpoint: the Hub endpoint; default ``$HF_ENDPOINT`` or https://huggingface.co.
        retries: retries for rate limits and server errors.
        backoff_s: first backoff delay.

    Raises:
        DownloadError: bad arguments, or a typed HTTP/offline error.
    """
    check_search(sort, limit)
    if base_model is not None:
        check_repo_id(base_model)
    base = resolve_endpoint(endpoint)
    params: list[tuple[str, str]] = [("filter", "gguf")]
    if query.strip():
        params.append(("search", query.strip()))
    params.append(("filter", f"base_model:adapter:{base_model}" if base_model else "lora"))
    params += [("sort", _SORT_FIELDS[sort]), ("limit", str(limit))]
    params += [("expand", name) for name in ("downloads", "likes", "gated", "tags", "cardData")]
    url = f"{base}/api/models?{urllib.parse.urlencode(params)}"
    document, _ = get_json(url, endpoint=base, what="adapter search", retries=retries, backoff_s=backoff_s)
    if not isinstance(document, list):
        raise DownloadError("adapter search: unexpected answer from the Hub (not a list)")
    hits: list[AdapterHit] = []
    for item in document[:limit]:
        repo = item.get("id") or item.get("modelId") if isinstance(item, dict) else None
        if not isinstance(repo, str):
            continue
        tags = item.get("tags") if isinstance(item.get("tags"), list) else []
        card = item.get("cardData") if isinstance(item.get("cardData"), dict) else None
        gated = item.get("gated", False)
        hits.append(
            AdapterHit(
                id=repo,
                base_model=adapter_base_from_tags(tags, card),
                downloads=_count(item.get("downloads")),
                likes=_count(item.get("likes")),
                gated=bool(gated) and gated != "false",
            )
        )
    return hits


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def read_remote_header(
    repo: str, filename: str, size: int, *, revision: str = "main", endpoint: str | None = None
) -> tuple[GgufInfo, list[TensorShape]]:
    """A GGUF file's header and tensor shapes, read from the Hub by HTTP range requests (the
    first 256 KiB, then as much as the header says it needs, up to 32 MiB).

    Args:
        repo: ``owner/name``.
        filename: the file in the repository.
        size: the file's size (from the listing).
        revision: the commit (or branch) to read.
        endpoint: the Hub endpoint.

    Raises:
        DownloadError: an HTTP or offline error, or a header larger than 32 MiB.
        ModelFileError: the bytes are not a GGUF header.
    """
    base = resolve_endpoint(endpoint)
    ref = urllib.parse.quote(revision, safe="")
    url = f"{base}/{repo}/resolve/{ref}/{urllib.parse.quote(filename)}"
    source = f"{repo}/{filename}"
    want = min(size, _FIRST_READ) if size > 0 else _FIRST_READ
    while True:
        prefix = _read_prefix(url, base, want, source)
        try:
            return parse_tensor_shapes_prefix(prefix, size or len(prefix), source)
        except GgufHeaderNeedsMoreBytes as exc:
            if exc.needed > _MAX_HEADER or len(prefix) < want:
                raise DownloadError(f"{source}: the header is too large to read before downloading") from None
            want = exc.needed


def _read_prefix(url: str, endpoint: str, n: int, source: str) -> bytes:
    response = open_url(url, endpoint=endpoint, headers={"Range": f"bytes=0-{n - 1}"})
    try:
        if response.status not in (200, 206):  # 200: a server that ignores Range; read n bytes of it
            raise status_error(response.status, source, endpoint, response.headers)
        chunks: list[bytes] = []
        got = 0
        while got < n:
            chunk = response.body.read(min(1 << 20, n - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise OfflineError(f"offline: the connection to {endpoint} dropped while reading {source} ({exc})") from None
    finally:
        response.close()


def inspect_adapter_repo(
    repo: str,
    models: Sequence[Path] = (),
    *,
    revision: str = "main",
    endpoint: str | None = None,
) -> AdapterRepo:
    """Lists ``repo``'s files and reads each GGUF file's header from the Hub: whether it is a LoRA
    adapter, its architecture and base, and which of ``models`` (local GGUF models, e.g. the
    library's chat models) it fits, by ``engine.lora``'s load-time check.

    A file whose header cannot be read keeps its row with a ``note``; a model in ``models`` that
    cannot be read is left out of ``fits``.

    Raises:
        DownloadError: the repository cannot be listed (see ``list_repo_files``).
    """
    files = list_repo_files(repo, revision, endpoint)
    local: dict[Path, tuple[GgufInfo, list[TensorShape]] | None] = {}
    adapters: list[RemoteAdapter] = []
    for choice in files.choices:
        first = choice.files[0]
        if len(choice.files) > 1:
            adapters.append(RemoteAdapter(choice, False, note="a split model, not an adapter"))
            continue
        try:
            info, shapes = read_remote_header(
                repo, first.filename, first.size, revision=files.commit or revision, endpoint=endpoint
            )
        except EngineError as exc:
            adapters.append(RemoteAdapter(choice, False, note=f"header not read: {exc}"))
            continue
        try:
            adapter, pairs = adapter_from_header(Path(f"{repo}/{first.filename}"), info, shapes)
        except EngineError:
            kind = info.metadata.get("general.type") or "model"
            adapters.append(RemoteAdapter(choice, False, info.architecture, note=f"a {kind} file, not a LoRA adapter"))
            continue
        fits: list[Path] = []
        for model in models:
            if model not in local:
                try:
                    local[model] = read_tensor_shapes(model)
                except EngineError:
                    local[model] = None
            header = local[model]
            if header is None or header[0].architecture != adapter.architecture:
                continue
            try:
                check_adapter_header(adapter, pairs, model, *header)
            except EngineError:
                continue
            fits.append(model)
        adapters.append(
            RemoteAdapter(choice, True, adapter.architecture, adapter.rank, adapter.base_model, tuple(fits))
        )
    return AdapterRepo(files, tuple(adapters))
