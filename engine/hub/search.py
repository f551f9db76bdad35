"""The Hugging Face Hub: search for GGUF models and list a repository's files.

``search_models`` and ``list_repo_files`` talk to the Hub's HTTP API through ``engine.hub.http``
(``/api/models``, ``/api/models/{repo}/revision/{rev}``, ``/api/models/{repo}/tree/{commit}``).
The listing parses quant types from file names, groups split GGUF parts into one
``ModelChoice``, pairs ``mmproj`` projectors with the models, sets unsafe names aside and refuses
repositories whose only weights are pickles.

``huggingface_hub`` is deliberately not used: the Hub HTTP API is small and stable, and owning
the client gives one place for retries, error messages and token handling.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from engine.errors import DownloadError
from engine.hub.http import (
    get_json,
    next_link,
    resolve_endpoint,
)

__all__ = [
    "PICKLE_SUFFIXES",
    "ModelChoice",
    "ModelFile",
    "RepoFiles",
    "RepoSummary",
    "SortKey",
    "build_repo_files",
    "check_filename",
    "check_repo_id",
    "check_revision",
    "list_repo_files",
    "parse_quant",
    "parse_split",
    "resolve_commit",
    "search_models",
    "unsafe_name_reason",
]

SortKey = Literal["downloads", "likes", "recent"]
_SORT_FIELDS: dict[str, str] = {"downloads": "downloads", "likes": "likes", "recent": "lastModified"}


def check_search(sort: str, limit: int) -> None:
    """A Hub search's sort order and limit; raises DownloadError in one line for a bad one."""
    if sort not in _SORT_FIELDS:
        raise DownloadError(f"{sort}: unknown sort order (use downloads, likes or recent)")
    if not 1 <= limit <= 1000:
        raise DownloadError(f"{limit}: the search limit must be between 1 and 1000")


_MAX_TREE_PAGES = 200
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")
PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle"})
_WINDOWS_RESERVED = frozenset(
    {"con", "prn", "aux", "nul"} | {f"com{i}" for i in range(1, 10)} | {f"lpt{i}" for i in range(1, 10)}
)
# Quant names as llama.cpp and the big GGUF publishers write them, longest alternatives first.
_QUANT = re.compile(
    r"(?<![A-Za-z0-9])("
    r"UD-)?("
    r"IQ[1-4]_(?:XXS|XS|NL|S|M)"
    r"|Q[2-8]_K(?:_(?:XXL|XL|L|M|S))?"
    r"|Q[4-8]_[01](?:_L)?"
    r"|TQ[12]_0|MXFP4(?:_MOE)?|BF16|FP16|F16|FP32|F32"
    r")(?![A-Za-z0-9])",
    re.IGNORECASE,
)
_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<part>\d{5})-of-(?P<total>\d{5})\.gguf$", re.IGNORECASE)


# ----------------------------------------------------------------------------- names and checks


def check_repo_id(repo: str) -> str:
    """Returns ``repo`` if it looks like ``owner/name``.

    Raises:
        DownloadError: anything else (spaces, slashes, ``..``, URL syntax).
    """
    if not _REPO_ID.match(repo) or ".." in repo:
        raise DownloadError(f"{repo}: not a Hugging Face repository id (expected owner/name)")
    return repo


def check_revision(revision: str) -> str:
    """Returns ``revision`` if it is a plausible branch, tag or commit name.

    Raises:
        DownloadError: empty, ``..``, or characters that have no place in a git ref.
    """
    if not _REVISION.match(revision) or ".." in revision or revision.endswith("/"):
        raise DownloadError(f"{revision}: not a valid revision (branch, tag or commit)")
    return revision


def unsafe_name_reason(filename: str) -> str | None:
    """Why ``filename`` (a path inside a repository) is unsafe to write locally, or None if safe.

    Unsafe: empty, absolute, ``..`` or ``.`` parts, backslashes, drive letters and other colons,
    NUL and control characters, Windows reserved names, over-long parts or paths.
    """
    if not filename:
        return "empty file name"
    if "\x00" in filename or any(ord(c) < 32 or ord(c) == 127 for c in filename):
        return "control character in file name"
    if "\\" in filename:
        return "backslash in file name"
    if ":" in filename:
        return "drive letter or colon in file name"
    if filename.startswith("/"):
        return "absolute path"
    if len(filename.encode("utf-8")) > 1024:
        return "file name too long"
    for part in filename.split("/"):
        if part in ("", ".", ".."):
            return "relative path component (.., . or //)"
        if len(part.encode("utf-8")) > 255:
            return "file name too long"
        if part.split(".")[0].lower() in _WINDOWS_RESERVED or part.endswith((" ", ".")):
            return "reserved or invalid file name on Windows"
    return None


def check_filename(filename: str) -> str:
    """Returns ``filename`` if it is safe to create below a destination folder.

    Raises:
        DownloadError: the name is unsafe (see ``unsafe_name_reason``); raised before any request.
    """
    reason = unsafe_name_reason(filename)
    if reason is not None:
        raise DownloadError(f"{filename!r}: unsafe file name in the repository ({reason}); refusing it")
    return filename


def parse_quant(filename: str) -> str | None:
    """The quantization type named in ``filename`` (``Q4_K_M``, ``IQ4_XS``, ``BF16``...), or None.

    The last match wins (names like ``Llama-3-8B-Q4_K_M.gguf``); ``FP16`` reads as ``F16``;
    Unsloth's dynamic quants keep their ``UD-`` prefix.
    """
    base = filename.rsplit("/", 1)[-1]
    matches = list(_QUANT.finditer(base))
    if not matches:
        return None
    last = matches[-1]
    name = last.group(2).upper()
    name = {"FP16": "F16", "FP32": "F32"}.get(name, name)
    return f"UD-{name}" if last.group(1) else name


def parse_split(filename: str) -> tuple[int, int] | None:
    """``(part, total)`` for a split GGUF part (``-00001-of-00003.gguf``), else None."""
    match = _SPLIT.match(filename.rsplit("/", 1)[-1])
    if match is None:
        return None
    part, total = int(match["part"]), int(match["total"])
    if total < 1 or not 1 <= part <= total:
        return None
    return part, total


# ------------------------------------------------------------------------------------ data types


@dataclass(frozen=True)
class RepoSummary:
    """One search hit."""

    id: str
    downloads: int
    likes: int
    last_modified: str | None
    gated: bool
    private: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ModelFile:
    """One file of a repository.

    ``sha256`` is the LFS hash (None for small files stored in git); ``quant`` is parsed from the
    name; ``split`` is ``(part, total)`` for split GGUF parts.
    """

    filename: str
    size: int
    sha256: str | None
    quant: str | None = None
    split: tuple[int, int] | None = None
    is_mmproj: bool = False

    @property
    def is_gguf(self) -> bool:
        return self.filename.lower().endswith(".gguf")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["split"] = list(self.split) if self.split else None
        return data


@dataclass(frozen=True)
class ModelChoice:
    """One downloadable model: a single GGUF, or all parts of a split GGUF.

    ``mmproj`` lists the vision projector files that go with it (same folder, or the repo root);
    ``projector`` is the one of them a load uses, and the one a download fetches.
    ``complete`` is False when a split part is missing from the listing.
    """

    name: str
    quant: str | None
    files: tuple[ModelFile, ...]
    mmproj: tuple[ModelFile, ...] = ()
    complete: bool = True

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def projector(self) -> ModelFile | None:
        """The projector of ``mmproj`` that a load of this model would pick once downloaded beside
        it (``engine.mmproj.find_projector``: the closest name, then F16, BF16, F32, Q8_0); None
        without any. A repository often offers one projector in several types: one is enough."""
        if not self.mmproj:
            return None
        # lazy: start-up (+19 ms)
        from engine.mmproj import find_projector

        def beside(filename: str) -> Path:  # every candidate in the model's folder, as downloaded
            return Path("model") / PurePosixPath(filename).name

        by_path = {beside(m.filename): m for m in self.mmproj}
        chosen = find_projector(beside(self.files[0].filename), list(by_path))
        return by_path[chosen] if chosen is not None else self.mmproj[0]

    def to_dict(self) -> dict[str, Any]:
        projector = self.projector
        return {
            "name": self.name,
            "quant": self.quant,
            "total_size": self.total_size,
            "complete": self.complete,
            "files": [f.to_dict() for f in self.files],
            "mmproj": [f.to_dict() for f in self.mmproj],
            "projector": projector.filename if projector is not None else None,
        }


@dataclass(frozen=True)
class RepoFiles:
    """What a repository offers at one revision.

    Args:
        repo: ``owner/name``.
        revision: the revision asked for.
        commit: the commit sha it resolved to, when the Hub said.
        files: every (safe) file.
        choices: the GGUF models, split parts grouped, mmproj paired.
        mmproj: all vision projector files.
        has_safetensors: safetensors weights present (convertible to GGUF).
        unsafe_names: names rejected as unsafe; never downloadable.
        gated: the repository asks users to accept a licence.
    """

    repo: str
    revision: str
    commit: str | None
    files: tuple[ModelFile, ...]
    choices: tuple[ModelChoice, ...]
    mmproj: tuple[ModelFile, ...] = ()
    has_safetensors: bool = False
    unsafe_names: tuple[str, ...] = ()
    gated: bool = False

    def find(self, filename: str) -> ModelFile | None:
        """The file called ``filename``, if listed."""
        return next((f for f in self.files if f.filename == filename), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "repo": self.repo,
            "revision": self.revision,
            "commit": self.commit,
            "gated": self.gated,
            "has_safetensors": self.has_safetensors,
            "unsafe_names": list(self.unsafe_names),
            "choices": [c.to_dict() for c in self.choices],
            "mmproj": [f.to_dict() for f in self.mmproj],
            "files": [f.to_dict() for f in self.files],
        }


# ----------------------------------------------------------------------------------- public API


def search_models(
    query: str,
    sort: SortKey = "downloads",
    limit: int = 20,
    endpoint: str | None = None,
    *,
    retries: int = 4,
    backoff_s: float = 1.0,
) -> list[RepoSummary]:
    """Searches the Hub for GGUF model repositories.

    Args:
        query: words to search for in repository names.
        sort: ``downloads``, ``likes`` or ``recent`` (last modified), always descending.
        limit: at most this many results (1..1000).
        endpoint: the Hub endpoint; default ``$HF_ENDPOINT`` or https://huggingface.co.
        retries: retries for rate limits and server errors.
        backoff_s: first backoff delay.

    Raises:
        DownloadError: bad arguments, or a typed HTTP/offline error.
    """
    check_search(sort, limit)
    base = resolve_endpoint(endpoint)
    params: list[tuple[str, str]] = [
        ("search", query.strip()),
        ("filter", "gguf"),
        ("sort", _SORT_FIELDS[sort]),  # the Hub sorts descending
        ("limit", str(limit)),
    ]
    params += [("expand", name) for name in ("downloads", "likes", "lastModified", "gated", "private")]
    url = f"{base}/api/models?{urllib.parse.urlencode(params)}"
    document, _ = get_json(url, endpoint=base, what="search", retries=retries, backoff_s=backoff_s)
    if not isinstance(document, list):
        raise DownloadError("search: unexpected answer from the Hub (not a list)")
    results: list[RepoSummary] = []
    for item in document[:limit]:
        if not isinstance(item, dict) or not isinstance(item.get("id") or item.get("modelId"), str):
            continue
        gated = item.get("gated", False)
        results.append(
            RepoSummary(
                id=str(item.get("id") or item.get("modelId")),
                downloads=_int(item.get("downloads")),
                likes=_int(item.get("likes")),
                last_modified=_str_or_none(item.get("lastModified") or item.get("createdAt")),
                gated=bool(gated) and gated != "false",
                private=item.get("private") is True,
            )
        )
    return results


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def resolve_commit(
    repo: str,
    revision: str = "main",
    endpoint: str | None = None,
    *,
    retries: int = 4,
    backoff_s: float = 1.0,
) -> tuple[str | None, bool]:
    """The commit sha that ``revision`` points to, and whether the repository is gated.

    Raises:
        DownloadError: a typed HTTP/offline error (404 for a missing repo or revision).
    """
    base = resolve_endpoint(endpoint)
    check_repo_id(repo)
    check_revision(revision)
    url = f"{base}/api/models/{repo}/revision/{urllib.parse.quote(revision, safe='')}"
    document, _ = get_json(url, endpoint=base, what=repo, retries=retries, backoff_s=backoff_s)
    if not isinstance(document, dict):
        raise DownloadError(f"{repo}: unexpected answer from the Hub")
    sha = document.get("sha")
    gated = document.get("gated", False)
    commit = sha if isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{40}", sha) else None
    return commit, bool(gated) and gated != "false"


def list_repo_files(
    repo: str,
    revision: str = "main",
    endpoint: str | None = None,
    *,
    retries: int = 4,
    backoff_s: float = 1.0,
) -> RepoFiles:
    """Lists a repository's files with sizes, LFS sha256, quant types, split groups and mmproj pairs.

    Args:
        repo: ``owner/name``.
        revision: branch, tag or commit.
        endpoint: the Hub endpoint; default ``$HF_ENDPOINT`` or https://huggingface.co.
        retries: retries for rate limits and server errors.
        backoff_s: first backoff delay.

    Raises:
        DownloadError: the repository has only pickle weights; or a typed HTTP/offline error.
    """
    base = resolve_endpoint(endpoint)
    check_repo_id(repo)
    check_revision(revision)
    commit, gated = resolve_commit(repo, revision, base, retries=retries, backoff_s=backoff_s)
    ref = urllib.parse.quote(commit or revision, safe="")
    url: str | None = f"{base}/api/models/{repo}/tree/{ref}?recursive=true"
    entries: list[dict[str, Any]] = []
    pages = 0
    while url is not None:
        pages += 1
        if pages > _MAX_TREE_PAGES:
            raise DownloadError(f"{repo}: the repository lists too many files")
        document, headers = get_json(url, endpoint=base, what=repo, retries=retries, backoff_s=backoff_s)
        if not isinstance(document, list):
            raise DownloadError(f"{repo}: unexpected answer from the Hub (file list)")
        entries += [e for e in document if isinstance(e, dict)]
        url = next_link(headers, base)
    return build_repo_files(repo, revision, commit, entries, gated=gated)


def build_repo_files(
    repo: str, revision: str, commit: str | None, entries: Iterable[Mapping[str, Any]], *, gated: bool = False
) -> RepoFiles:
    """Turns tree entries (``type``, ``path``, ``size``, ``lfs.oid``) into a ``RepoFiles``.

    Raises:
        DownloadError: the weights are pickle files only.
    """
    files: list[ModelFile] = []
    unsafe: list[str] = []
    for entry in entries:
        path = entry.get("path")
        if entry.get("type", "file") != "file" or not isinstance(path, str):
            continue
        if unsafe_name_reason(path) is not None:
            unsafe.append(path)
            continue
        lfs = entry.get("lfs") if isinstance(entry.get("lfs"), dict) else None
        sha = lfs.get("oid") if lfs else None
        sha = sha.lower() if isinstance(sha, str) and re.fullmatch(r"[0-9a-fA-F]{64}", sha) else None
        size = _int(lfs.get("size") if lfs else None) or _int(entry.get("size"))
        is_gguf = path.lower().endswith(".gguf")
        files.append(
            ModelFile(
                filename=path,
                size=size,
                sha256=sha,
                quant=parse_quant(path) if is_gguf else None,
                split=parse_split(path) if is_gguf else None,
                is_mmproj=is_gguf and "mmproj" in path.rsplit("/", 1)[-1].lower(),
            )
        )
    suffixes = {os.path.splitext(f.filename)[1].lower() for f in files}
    has_gguf = ".gguf" in suffixes
    has_safetensors = ".safetensors" in suffixes
    if not has_gguf and not has_safetensors and suffixes & PICKLE_SUFFIXES:
        raise DownloadError(
            f"{repo}: contains only pickle weights (unsafe to load); Glassbox only uses GGUF or safetensors"
        )
    mmproj = tuple(f for f in files if f.is_mmproj)
    choices = _group_choices([f for f in files if f.is_gguf and not f.is_mmproj], mmproj)
    return RepoFiles(
        repo=repo,
        revision=revision,
        commit=commit,
        files=tuple(files),
        choices=choices,
        mmproj=mmproj,
        has_safetensors=has_safetensors,
        unsafe_names=tuple(unsafe),
        gated=gated,
    )


def _folder(filename: str) -> str:
    return filename.rsplit("/", 1)[0] if "/" in filename else ""


def _group_choices(ggufs: list[ModelFile], mmproj: tuple[ModelFile, ...]) -> tuple[ModelChoice, ...]:
    """One choice per single GGUF and per split set; mmproj files paired by folder."""
    singles = {f.filename: [f] for f in ggufs if f.split is None}
    splits: dict[str, list[ModelFile]] = {}
    for f in ggufs:
        match = _SPLIT.match(f.filename.rsplit("/", 1)[-1]) if f.split else None
        if match is not None:
            folder = _folder(f.filename)
            splits.setdefault(f"{folder}/{match['stem']}" if folder else match["stem"], []).append(f)
    groups = dict(singles)
    for stem, parts in splits.items():
        parts.sort(key=lambda f: f.split[0] if f.split else 0)
        # Named like the whole model; a real file of that name keeps it, the set takes its first part's.
        name = f"{stem}.gguf" if f"{stem}.gguf" not in singles else parts[0].filename
        groups[name] = parts
    choices: list[ModelChoice] = []
    for name, parts in groups.items():
        total = max((f.split[1] for f in parts if f.split), default=0)
        present = {f.split[0] for f in parts if f.split}
        complete = total == 0 or present == set(range(1, total + 1))
        folder = _folder(parts[0].filename)
        paired = tuple(m for m in mmproj if _folder(m.filename) == folder) or tuple(
            m for m in mmproj if _folder(m.filename) == ""
        )
        choices.append(
            ModelChoice(name=name, quant=parts[0].quant, files=tuple(parts), mmproj=paired, complete=complete)
        )
    choices.sort(key=lambda c: (c.total_size, c.name))
    return tuple(choices)
