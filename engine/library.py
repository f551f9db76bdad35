"""The local model library: the models folder plus folders the user adds, indexed in place.

Nothing is copied. The models folder is *owned* (downloads, quantizations and the starter model
land there, and only files there can be deleted from the app); added folders (an LM Studio folder,
the Hugging Face cache) are only read. A folder that is missing (an unplugged drive) stays in the
library, shown as unavailable, with the models last seen in it.

Contract: ARCHITECTURE.md, 'engine.library'.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.atomic import write_json_atomic
from engine.errors import ModelFileError
from engine.gguf import GgufInfo, read_gguf_info
from engine.gguf_file import open_model_file
from engine.mmproj import ProjectorFacts, find_projector, projector_problem, read_projector

__all__ = [
    "EMBEDDING_ARCHITECTURES",
    "PROVENANCE_FIELDS",
    "FolderStatus",
    "LibraryEntry",
    "ModelLibrary",
    "adapter_base_name",
    "merge_split_infos",
    "model_kind",
    "read_model_info",
    "split_parts",
]

# Architectures that llama.cpp runs only as embedders (sentence vectors, no text generation); a
# chat with one fails deep in llama.cpp ("Memory is not initialized"). Other architectures that
# declare a pooling type and carry no chat template are embedders too (Qwen3-Embedding is qwen3).
EMBEDDING_ARCHITECTURES = frozenset(
    {
        "bert",
        "nomic-bert",
        "nomic-bert-moe",
        "neo-bert",
        "jina-bert-v2",
        "jina-bert-v3",
        "eurobert",
        "modern-bert",
        "gemma-embedding",
        "t5encoder",
        "llama-embed",
    }
)
PROJECTOR_ARCHITECTURES = frozenset({"clip"})

MANIFEST_VERSION = 1
PROVENANCE_FIELDS = ("repo", "revision", "sha256", "quantized_from", "label", "source", "base_model")
MAX_FILES_PER_FOLDER = 10_000
MAX_DEPTH = 8  # LM Studio: publisher/repo/file; HF cache: models--a--b/snapshots/rev/file
FINGERPRINT_BYTES = 1 << 20
_SPLIT_RE = re.compile(r"^(?P<stem>.+)-(?P<part>\d{5})-of-(?P<total>\d{5})\.gguf$", re.IGNORECASE)


@dataclass(frozen=True)
class LibraryEntry:
    """One model in the library.

    ``info`` is the header summary (None when the header failed; ``error`` says why).
    ``duplicates`` lists other paths holding the same file (same sha256 when the manifest knows it,
    else the same size and first/last MiB). ``parts`` lists the shards of a split GGUF.
    ``projector`` is the chat model's multimodal projector (``mmproj``): the one chosen by hand
    (:meth:`ModelLibrary.set_projector`), else one in the same folder by the Hub's naming that fits
    the model (engine/mmproj.py); ``projector_facts`` says what it reads.
    """

    name: str
    path: Path
    folder: Path
    size: int
    available: bool
    owned: bool
    architecture: str | None = None
    params: int | None = None
    quant: str | None = None
    context_length: int | None = None
    has_chat_template: bool = False
    title: str | None = None
    provenance: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    duplicates: list[Path] = field(default_factory=list)
    parts: list[Path] = field(default_factory=list)
    info: GgufInfo | None = None
    projector: Path | None = None
    projector_facts: ProjectorFacts | None = None

    @property
    def sees(self) -> str:
        """``"images"``, ``"audio"``, ``"images and audio"``, or ``""`` (text only: no projector)."""
        return self.projector_facts.sees if self.projector_facts is not None else ""

    base_model: str | None = None  # for a LoRA adapter: the base model it names or was converted for

    @property
    def label(self) -> str:
        """What to show the user: the manifest's label, else the file name."""
        return self.provenance.get("label") or self.name

    @property
    def kind(self) -> str:
        """``"chat"``, ``"embedding"`` (an embedder), ``"projector"`` (a vision mmproj),
        ``"adapter"`` (a LoRA adapter), or ``"unknown"`` when the header could not be read."""
        return model_kind(self.info) if self.info is not None else "unknown"

    def chat_problem(self) -> str | None:
        """Why this entry cannot be loaded to chat with (one line), or None when it can."""
        if not self.available:
            return self.error or "unavailable: the file is missing"
        if self.error:
            return self.error
        if self.kind == "embedding":
            return f"an embedding model ({self.architecture}): it makes vectors for search, it cannot chat"
        if self.kind == "projector":
            return "a vision projector (mmproj) that goes with a chat model, not a model to chat with"
        if self.kind == "adapter":
            base = f" for {self.base_model}" if self.base_model else ""
            return (
                f"a LoRA adapter{base}: it changes a chat model's replies (apply it with --lora), it cannot chat alone"
            )
        return None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (without the full header)."""
        return {
            "name": self.name,
            "label": self.label,
            "path": str(self.path),
            "folder": str(self.folder),
            "size": self.size,
            "available": self.available,
            "owned": self.owned,
            "architecture": self.architecture,
            "params": self.params,
            "quant": self.quant,
            "context_length": self.context_length,
            "has_chat_template": self.has_chat_template,
            "kind": self.kind,
            "base_model": self.base_model,
            "title": self.title,
            "provenance": dict(self.provenance),
            "error": self.error,
            "duplicates": [str(p) for p in self.duplicates],
            "parts": [str(p) for p in self.parts],
            "mmproj": str(self.projector) if self.projector is not None else None,
            "sees": self.sees,
        }


@dataclass(frozen=True)
class FolderStatus:
    """A library folder: the models folder (``owned``) or one the user added."""

    path: Path
    owned: bool
    available: bool
    n_models: int = 0
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "path": str(self.path),
            "owned": self.owned,
            "available": self.available,
            "n_models": self.n_models,
            "error": self.error,
        }


class ModelLibrary:
    """The models folder plus user-added folders.

    Args:
        models_dir: the owned models folder (created on first write).
        extra_dirs: more folders to index in place (in addition to those in ``folders_file``).
        manifest_path: the manifest JSON (provenance and header cache).
        folders_file: where :meth:`add_folder` keeps the added folders; None keeps them in memory.
    """

    def __init__(
        self,
        models_dir: Path,
        extra_dirs: Sequence[Path] = (),
        manifest_path: Path | None = None,
        *,
        folders_file: Path | None = None,
    ) -> None:
        self.models_dir = _absolute(models_dir)
        self.manifest_path = manifest_path or self.models_dir / "manifest.json"
        self.folders_file = folders_file
        self._extra = [_absolute(d) for d in extra_dirs]
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- folders
    @property
    def extra_dirs(self) -> list[Path]:
        """Added folders: the constructor's plus the saved ones, in order, without repeats."""
        seen: list[Path] = []
        for folder in [*self._extra, *self._saved_folders()]:
            if folder not in seen and folder != self.models_dir:
                seen.append(folder)
        return seen

    def folders(self) -> list[FolderStatus]:
        """The models folder and each added folder, with whether it is there now."""
        out = []
        for folder, owned in [(self.models_dir, True), *((d, False) for d in self.extra_dirs)]:
            available = folder.is_dir() or (owned and not folder.exists())
            error = None if available else "unavailable (missing or not a folder)"
            out.append(FolderStatus(folder, owned, available, 0, error))
        return out

    def add_folder(self, folder: Path) -> Path:
        """Indexes ``folder`` in place from now on; returns its absolute path.

        Raises:
            ModelFileError: it is not an existing folder, or no folder list file was given.
        """
        folder = _absolute(folder)
        if not folder.is_dir():
            raise ModelFileError(folder, "no such folder")
        if self.folders_file is None:
            if folder not in self._extra:
                self._extra.append(folder)
            return folder
        saved = self._saved_folders()
        if folder not in saved and folder != self.models_dir:
            folders = [str(p) for p in [*saved, folder]]
            write_json_atomic(self.folders_file, {"version": 1, "folders": folders})
        return folder

    def remove_folder(self, folder: Path) -> None:
        """Stops indexing ``folder``; its files are not touched.

        Raises:
            ModelFileError: the folder is not in the library (or is the models folder).
        """
        folder = _absolute(folder)
        if folder == self.models_dir:
            raise ModelFileError(folder, "the models folder cannot be removed from the library")
        saved = self._saved_folders()
        if folder not in saved and folder not in self._extra:
            raise ModelFileError(folder, "not a library folder")
        self._extra = [d for d in self._extra if d != folder]
        if folder in saved and self.folders_file is not None:
            write_json_atomic(self.folders_file, {"version": 1, "folders": [str(p) for p in saved if p != folder]})

    def _saved_folders(self) -> list[Path]:
        if self.folders_file is None:
            return []
        try:
            data = json.loads(self.folders_file.read_text(encoding="utf-8"))
            return [_absolute(Path(p)) for p in data["folders"] if isinstance(p, str)]
        except (OSError, ValueError, KeyError, TypeError):
            return []

    # ---------------------------------------------------------------- scanning
    def scan(self) -> list[LibraryEntry]:
        """Every model in every folder, once. Never raises for a bad file or a missing folder.

        Files that fail the header check are listed with ``error``; models last seen in a folder
        that is now missing are listed with ``available=False``.
        """
        with self._lock:
            manifest = self._load_manifest()
            before = json.dumps(manifest, sort_keys=True)
            entries: list[LibraryEntry] = []
            for status in self.folders():
                if status.available:
                    entries += self._scan_folder(status.path, status.owned, manifest)
                else:
                    entries += self._remembered(status.path, manifest)
            entries = self._merge_duplicates(entries)
            entries = self._pair_projectors(entries, manifest)
            if json.dumps(manifest, sort_keys=True) != before:
                with contextlib.suppress(OSError):
                    self._save_manifest(manifest)
        return entries

    def find(self, name_or_path: str | Path) -> LibraryEntry | None:
        """The entry for a path, a file name, a file name without ``.gguf`` or a label
        (case-insensitive). A name or path that is a duplicate's gives that copy's view of the entry.

        When several files match, an owned one wins, then the first found.
        """
        matches = self._matches(name_or_path, self.scan())
        matches.sort(key=lambda m: not _is_within(m[1], self.models_dir))
        if not matches:
            return None
        entry, path = matches[0]
        if path == entry.path or path in entry.parts:
            return entry
        others = [entry.path, *(d for d in entry.duplicates if d != path)]
        return _replace(
            entry,
            name=path.name,
            path=path,
            owned=_is_within(path, self.models_dir),
            folder=self._folder_of(path),
            duplicates=others,
        )

    def _matches(self, name_or_path: str | Path, entries: list[LibraryEntry]) -> list[tuple[LibraryEntry, Path]]:
        """(entry, the file that matched) pairs: exact paths first, else names and labels."""
        as_path = _absolute(Path(str(name_or_path)))
        by_path = [(e, p) for e in entries for p in (e.path, *e.duplicates, *e.parts) if p == as_path]
        if by_path:
            return by_path
        wanted = str(name_or_path).lower()
        out = []
        for e in entries:
            for p in (e.path, *e.duplicates):
                name = p.name.lower()
                by_label = p == e.path and wanted == e.label.lower()
                if wanted in (name, name.removesuffix(".gguf")) or by_label:
                    out.append((e, p))
        return out

    def _folder_of(self, path: Path) -> Path:
        for folder in [self.models_dir, *self.extra_dirs]:
            if _is_within(path, folder):
                return folder
        return path.parent

    def _scan_folder(self, folder: Path, owned: bool, manifest: dict[str, Any]) -> list[LibraryEntry]:
        files = list(_gguf_files(folder))
        splits: dict[tuple[Path, str, int], dict[int, Path]] = {}
        singles: list[Path] = []
        for path in files:
            m = _SPLIT_RE.match(path.name)
            if m:
                key = (path.parent, m["stem"], int(m["total"]))
                splits.setdefault(key, {})[int(m["part"])] = path
            else:
                singles.append(path)
        entries = [self._entry(path, folder, owned, manifest) for path in singles]
        for (_parent, _stem, total), parts in sorted(splits.items(), key=lambda kv: str(kv[0])):
            entries.append(self._split_entry(parts, total, folder, owned, manifest))
        return entries

    def _entry(self, path: Path, folder: Path, owned: bool, manifest: dict[str, Any]) -> LibraryEntry:
        key = self._key(path)
        record = manifest["models"].get(key, {})
        provenance = {k: str(v) for k, v in record.items() if k in PROVENANCE_FIELDS and v is not None}
        try:
            st = path.stat()
        except OSError as exc:
            return LibraryEntry(
                path.name,
                path,
                folder,
                0,
                False,
                owned,
                provenance=provenance,
                error=f"cannot read the file ({exc.strerror or exc})",
            )
        info, error = self._header(path, key, st, manifest)
        return _make_entry(path, folder, st.st_size, True, owned, provenance, info, error)

    def _split_entry(
        self, parts: dict[int, Path], total: int, folder: Path, owned: bool, manifest: dict[str, Any]
    ) -> LibraryEntry:
        ordered = [parts[i] for i in sorted(parts)]
        first = parts.get(1, ordered[0])
        size = 0
        for part in ordered:
            with contextlib.suppress(OSError):
                size += part.stat().st_size
        missing = sorted(set(range(1, total + 1)) - set(parts))
        key = self._key(first)
        record = manifest["models"].get(key, {})
        provenance = {k: str(v) for k, v in record.items() if k in PROVENANCE_FIELDS and v is not None}
        info: GgufInfo | None = None
        error: str | None = None
        if missing:
            error = f"part {missing[0]} of {total} is missing"
        else:
            infos: list[GgufInfo] = []
            for part in ordered:
                try:
                    part_info, error = self._header(part, self._key(part), part.stat(), manifest)
                except OSError as exc:
                    part_info, error = None, f"cannot read {part.name} ({exc.strerror or exc})"
                if part_info is None:
                    error = f"{part.name}: {error}" if part != first else error
                    break
                infos.append(part_info)
            else:
                info = merge_split_infos(infos)
        entry = _make_entry(first, folder, size, True, owned, provenance, info, error)
        return _replace(entry, parts=ordered)

    def _header(
        self, path: Path, key: str, st: os.stat_result, manifest: dict[str, Any]
    ) -> tuple[GgufInfo | None, str | None]:
        """The header summary, from the cache when size and mtime are unchanged."""
        cache = manifest["cache"]
        cached = cache.get(key)
        stamp = (st.st_size, st.st_mtime_ns)
        if isinstance(cached, dict) and (cached.get("size"), cached.get("mtime_ns")) == stamp:
            if cached.get("error"):
                return None, str(cached["error"])
            with contextlib.suppress(TypeError, ValueError, KeyError, AttributeError):
                return GgufInfo.from_dict({**cached["info"], "path": str(path)}), None
        try:
            info = read_gguf_info(path)
        except ModelFileError as exc:
            cache[key] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "error": exc.reason}
            return None, exc.reason
        cache[key] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "info": info.to_dict()}
        return info, None

    def _remembered(self, folder: Path, manifest: dict[str, Any]) -> list[LibraryEntry]:
        """Models last seen in a folder that is missing now, from the manifest's cache."""
        out = []
        for key, cached in sorted(manifest["cache"].items()):
            path = self._path(key)
            if not _is_within(path, folder) or not isinstance(cached, dict):
                continue
            record = manifest["models"].get(key, {})
            provenance = {k: str(v) for k, v in record.items() if k in PROVENANCE_FIELDS and v is not None}
            info = None
            with contextlib.suppress(TypeError, ValueError, KeyError, AttributeError):
                info = GgufInfo.from_dict({**cached["info"], "path": str(path)})
            size = int(cached.get("size") or 0)
            entry = _make_entry(path, folder, size, False, False, provenance, info, None)
            out.append(_replace(entry, error="unavailable: its folder is missing (unplugged drive?)"))
        return out

    @staticmethod
    def _merge_duplicates(entries: list[LibraryEntry]) -> list[LibraryEntry]:
        """Shows each file once: same sha256 (manifest), else same size and first/last MiB."""
        candidates = [e for e in entries if e.available and not e.parts]
        sizes: dict[int, int] = {}
        for e in candidates:
            sizes[e.size] = sizes.get(e.size, 0) + 1
        fingerprints: dict[Path, str] = {}
        for e in candidates:
            if sizes[e.size] > 1:  # only files whose size collides are worth hashing
                with contextlib.suppress(OSError, ModelFileError):
                    fingerprints[e.path] = f"{e.size}:{_fingerprint(e.path, e.size)}"
        # A copy known by sha256 lends its key to identical copies known only by fingerprint.
        fp_to_sha = {
            fingerprints[e.path]: e.provenance["sha256"].lower()
            for e in candidates
            if e.provenance.get("sha256") and e.path in fingerprints
        }
        groups: dict[str, list[LibraryEntry]] = {}
        for e in entries:
            key = f"path:{e.path}"
            if e.provenance.get("sha256") and e in candidates:
                key = f"sha:{e.provenance['sha256'].lower()}"
            elif e.path in fingerprints:
                fp = fingerprints[e.path]
                key = f"sha:{fp_to_sha[fp]}" if fp in fp_to_sha else f"fp:{fp}"
            groups.setdefault(key, []).append(e)
        merged: list[LibraryEntry] = []
        for group in groups.values():
            group = sorted(group, key=lambda e: (not e.owned, not e.provenance, str(e.path)))
            head = group[0]
            if len(group) > 1:
                provenance = dict(head.provenance)
                for other in group[1:]:
                    for k, v in other.provenance.items():
                        provenance.setdefault(k, v)
                head = _replace(head, duplicates=[e.path for e in group[1:]], provenance=provenance)
            merged.append(head)
        return merged

    def _pair_projectors(self, entries: list[LibraryEntry], manifest: dict[str, Any]) -> list[LibraryEntry]:
        """Each chat model with the projector that goes with it (see :class:`LibraryEntry`)."""
        projectors: dict[Path, tuple[GgufInfo, ProjectorFacts]] = {}
        for entry in entries:
            if entry.kind == "projector" and entry.available and entry.info is not None:
                with contextlib.suppress(ModelFileError):
                    projectors[entry.path] = (entry.info, read_projector(entry.path, entry.info))
        out = []
        for entry in entries:
            if entry.kind != "chat" or entry.info is None:
                out.append(entry)
                continue
            info = entry.info
            chosen = manifest["models"].get(self._key(entry.path), {}).get("mmproj")
            path: Path | None = None
            facts: ProjectorFacts | None = None
            if isinstance(chosen, str):
                path = _absolute(Path(chosen))
                facts = projectors[path][1] if path in projectors else _facts(path)
            if facts is None:  # none chosen, or the chosen file is gone: the one found beside it
                fitting = [p for p, (_i, f) in projectors.items() if projector_problem(f, info) is None]
                path = find_projector(entry.path, fitting)
                facts = projectors[path][1] if path is not None else None
            paired = path is not None and facts is not None
            out.append(_replace(entry, projector=path, projector_facts=facts) if paired else entry)
        return out

    def set_projector(self, model: Path, projector: Path | None) -> None:
        """Chooses the projector that goes with ``model`` by hand (None: back to the one found
        next to it).

        Raises:
            ModelFileError: ``projector`` is not a projector, or is another model's.
        """
        if projector is not None:
            facts = read_projector(projector)
            problem = projector_problem(facts, read_model_info(model))
            if problem is not None:
                raise ModelFileError(projector, problem)
        with self._lock:
            manifest = self._load_manifest()
            record = manifest["models"].setdefault(self._key(_absolute(model)), {})
            if projector is None:
                record.pop("mmproj", None)
            else:
                record["mmproj"] = str(_absolute(projector))
            self._save_manifest(manifest)

    def chosen_projector(self, model: Path) -> Path | None:
        """The projector chosen by hand for ``model`` (:meth:`set_projector`), read from the
        manifest without a scan; None when none was chosen, or the file chosen is gone (the one
        found beside the model is used then, as :meth:`scan` pairs it)."""
        with self._lock:
            manifest = self._load_manifest()
        chosen = manifest["models"].get(self._key(_absolute(model)), {}).get("mmproj")
        path = _absolute(Path(chosen)) if isinstance(chosen, str) else None
        return path if path is not None and path.is_file() else None

    # ---------------------------------------------------------------- provenance and removal
    def record_provenance(self, path: Path, **fields: str | None) -> None:
        """Records where a model came from (``repo``, ``revision``, ``sha256``, ``quantized_from``,
        ``label``, ``source``; for an adapter, ``base_model``). Fields given as None are removed.

        Raises:
            ValueError: an unknown field name.
        """
        unknown = set(fields) - set(PROVENANCE_FIELDS)
        if unknown:
            raise ValueError(f"unknown provenance fields: {', '.join(sorted(unknown))}")
        with self._lock:
            manifest = self._load_manifest()
            record = manifest["models"].setdefault(self._key(_absolute(path)), {})
            for k, v in fields.items():
                if v is None:
                    record.pop(k, None)
                else:
                    record[k] = str(v)
            record.setdefault("added_at", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            self._save_manifest(manifest)

    def remove(self, name_or_path: str | Path) -> list[Path]:
        """Deletes a model the library owns (all parts of a split model); returns what was deleted.

        Raises:
            ModelFileError: no such model, more than one match, or a file outside the models
                folder (Glassbox never deletes files it did not put there).
        """
        matches = self._matches(name_or_path, self.scan())
        if not matches:
            raise ModelFileError(str(name_or_path), "no such model in the library (see glassbox models list)")
        owned = [(e, p) for e, p in matches if _is_within(p, self.models_dir)]
        if not owned:
            raise ModelFileError(
                matches[0][1],
                "not in the models folder: Glassbox only deletes files it owns; remove the folder from the "
                "library or delete the file yourself",
            )
        if len(owned) > 1:
            raise ModelFileError(str(name_or_path), f"{len(owned)} models have that name: give the path")
        entry, target = owned[0]
        doomed = entry.parts if entry.parts and (target == entry.path or target in entry.parts) else [target]
        if not all(_is_within(p, self.models_dir) for p in doomed):
            raise ModelFileError(target, "not in the models folder: Glassbox only deletes files it owns")
        deleted = []
        for path in doomed:
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            deleted.append(path)
        with self._lock:
            manifest = self._load_manifest()
            for path in doomed:
                manifest["models"].pop(self._key(path), None)
                manifest["cache"].pop(self._key(path), None)
            self._save_manifest(manifest)
        return deleted

    # ---------------------------------------------------------------- manifest
    def _key(self, path: Path) -> str:
        """Owned files are keyed relative to the models folder, so the data folder can move."""
        path = _absolute(path)
        if _is_within(path, self.models_dir):
            return path.relative_to(self.models_dir).as_posix()
        return str(path)

    def _path(self, key: str) -> Path:
        candidate = Path(key)
        return candidate if candidate.is_absolute() else self.models_dir / candidate

    def _load_manifest(self) -> dict[str, Any]:
        empty: dict[str, Any] = {"version": MANIFEST_VERSION, "models": {}, "cache": {}}
        try:
            text = self.manifest_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return empty
        except OSError:
            return empty
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or not isinstance(data.get("models", {}), dict):
                raise ValueError("not a manifest")
        except ValueError:
            aside = self.manifest_path.with_name(f"{self.manifest_path.name}.corrupt-{int(time.time())}")
            with contextlib.suppress(OSError):
                os.replace(self.manifest_path, aside)
            return empty
        cache = data.get("cache")
        return {
            "version": MANIFEST_VERSION,
            "models": {k: v for k, v in data.get("models", {}).items() if isinstance(v, dict)},
            "cache": cache if isinstance(cache, dict) else {},
        }

    def _save_manifest(self, manifest: dict[str, Any]) -> None:
        write_json_atomic(self.manifest_path, manifest)


def model_kind(info: GgufInfo) -> str:
    """``"adapter"`` (``general.type = adapter``), ``"embedding"``, ``"projector"`` or ``"chat"``,
    from the header's type and architecture."""
    if info.metadata.get("general.type") == "adapter":
        return "adapter"
    arch = info.architecture
    if arch in PROJECTOR_ARCHITECTURES:
        return "projector"
    if arch in EMBEDDING_ARCHITECTURES:
        return "embedding"
    if f"{arch}.pooling_type" in info.metadata and not info.has_chat_template:
        return "embedding"
    return "chat"


def adapter_base_name(info: GgufInfo) -> str | None:
    """The base model an adapter's header names (``general.base_model.0.*``, from the model card
    of the PEFT folder it was converted from), or None."""
    meta = info.metadata
    url = meta.get("general.base_model.0.repo_url")
    if isinstance(url, str) and url:
        return url.removeprefix("https://huggingface.co/").rstrip("/")
    name = meta.get("general.base_model.0.name")
    if isinstance(name, str) and name:
        org = meta.get("general.base_model.0.organization")
        return f"{org}/{name}" if isinstance(org, str) and org and "/" not in name else name
    return None


# -------------------------------------------------------------------- split models
def split_parts(path: Path) -> list[Path] | None:
    """All parts of a split GGUF (``name-00001-of-00003.gguf``), or None for a single file."""
    m = _SPLIT_RE.match(path.name)
    if m is None:
        return None
    total = int(m["total"])
    width = len(m["part"])
    return [path.with_name(f"{m['stem']}-{i:0{width}d}-of-{m['total']}.gguf") for i in range(1, total + 1)]


def merge_split_infos(infos: Sequence[GgufInfo]) -> GgufInfo:
    """One header for a split model: the first part's metadata with every part's tensors."""
    first = infos[0]
    n_layers = max((len(i.layer_bytes) for i in infos), default=0)
    layer_bytes = [sum(i.layer_bytes[k] for i in infos if k < len(i.layer_bytes)) for k in range(n_layers)]
    return dataclasses.replace(
        first,
        file_size=sum(i.file_size for i in infos),
        n_params=sum(i.n_params for i in infos),
        n_tensors=sum(i.n_tensors for i in infos),
        tensor_bytes=sum(i.tensor_bytes for i in infos),
        layer_bytes=layer_bytes,
        other_bytes=sum(i.other_bytes for i in infos),
        expert_bytes=sum(i.expert_bytes for i in infos),
        embedding_bytes=max(i.embedding_bytes for i in infos),
        tied_embeddings=all(i.tied_embeddings for i in infos),
    )


def read_model_info(path: Path) -> GgufInfo:
    """:func:`engine.gguf.read_gguf_info`, reading all parts of a split model given its first part.

    Raises:
        ModelFileError: a bad header in any part, or a missing part ("part 2 of 3 is missing").
    """
    parts = split_parts(path)
    if parts is None or path != parts[0]:
        return read_gguf_info(path)
    for i, part in enumerate(parts, start=1):
        if not part.exists():
            raise ModelFileError(path, f"part {i} of {len(parts)} is missing ({part.name})")
    return merge_split_infos([read_gguf_info(p) for p in parts])


# -------------------------------------------------------------------- helpers
def _make_entry(
    path: Path,
    folder: Path,
    size: int,
    available: bool,
    owned: bool,
    provenance: dict[str, str],
    info: GgufInfo | None,
    error: str | None,
) -> LibraryEntry:
    if info is None:
        return LibraryEntry(path.name, path, folder, size, available, owned, provenance=provenance, error=error)
    return LibraryEntry(
        name=path.name,
        path=path,
        folder=folder,
        size=size,
        available=available,
        owned=owned,
        architecture=info.architecture,
        params=info.n_params,
        quant=info.file_type,
        context_length=info.context_length,
        has_chat_template=info.has_chat_template,
        title=info.name,
        provenance=provenance,
        error=error,
        info=info,
        base_model=provenance.get("base_model") or (adapter_base_name(info) if model_kind(info) == "adapter" else None),
    )


def _facts(path: Path) -> ProjectorFacts | None:
    """A hand-chosen projector's facts (None when it is gone or no longer a projector)."""
    try:
        return read_projector(path)
    except ModelFileError:
        return None


def _replace(entry: LibraryEntry, **changes: Any) -> LibraryEntry:
    return dataclasses.replace(entry, **changes)


def _gguf_files(folder: Path) -> Iterator[Path]:
    """``*.gguf`` files under ``folder`` (symlinks followed for files, not for folders), skipping
    hidden and temporary files; at most MAX_FILES_PER_FOLDER, at most MAX_DEPTH deep.

    A named pipe, socket or device called ``*.gguf`` is yielded too, so the scan lists it with its
    reason (the header reader refuses it before opening it); only dangling symlinks are dropped."""
    count = 0
    root_depth = len(folder.parts)
    for dirpath, dirnames, filenames in os.walk(folder, onerror=lambda _e: None):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        if len(here.parts) - root_depth >= MAX_DEPTH:
            dirnames[:] = []
        for name in sorted(filenames):
            if name.startswith(".") or not name.lower().endswith(".gguf"):
                continue
            path = here / name
            if not path.exists():  # a dangling symlink
                continue
            yield path
            count += 1
            if count >= MAX_FILES_PER_FOLDER:
                return


def _fingerprint(path: Path, size: int) -> str:
    """Raises ModelFileError for anything but a regular file (never blocks on a named pipe)."""
    digest = hashlib.sha256()
    with open_model_file(path) as fh:
        digest.update(fh.read(FINGERPRINT_BYTES))
        if size > FINGERPRINT_BYTES:
            fh.seek(max(FINGERPRINT_BYTES, size - FINGERPRINT_BYTES))
            digest.update(fh.read(FINGERPRINT_BYTES))
    return digest.hexdigest()


def _absolute(path: Path) -> Path:
    return Path(os.path.abspath(Path(path).expanduser()))


def _is_within(path: Path, folder: Path) -> bool:
    try:
        path.relative_to(folder)
    except ValueError:
        return False
    return True
