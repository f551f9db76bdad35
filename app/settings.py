"""The one settings model (CONTRIBUTING.md rule 14): Qt-free, typed, versioned, saved atomically.

``Settings`` is a pydantic model with a ``schema_version``. ``load_settings`` reads
``paths.settings_file``, runs the migrations for older versions and falls back to the defaults
(keeping a copy of a damaged file); ``save_settings`` writes a temporary file, fsyncs it and
renames it over the old one. ``QSettings`` keeps only window geometry.

Contract: ARCHITECTURE.md, 'app.settings'.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

# Glassbox uses no pydantic plugins; skipping their entry-point scan saves ~0.1 s at start-up.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from engine.atomic import PRIVATE_FILE_MODE, make_private, write_bytes_atomic, write_text_atomic

SCHEMA_VERSION = 1
MAX_BAD_COPIES = 5
"""How many copies of damaged settings files are kept (the newest; ``settings.json.<stamp>.bad``)."""

Theme = Literal["system", "light", "dark"]
OverflowPolicy = Literal["rolling", "refuse"]
log = logging.getLogger(__name__)

Migration = Callable[[dict[str, object]], dict[str, object]]
MIGRATIONS: dict[int, Migration] = {}
"""``MIGRATIONS[n]`` turns a version-``n`` dict into a version-``n + 1`` dict."""


def migration(from_version: int) -> Callable[[Migration], Migration]:
    """Registers a migration from ``from_version`` to the next version."""

    def register(fn: Migration) -> Migration:
        MIGRATIONS[from_version] = fn
        return fn

    return register


class SamplingPreset(BaseModel):
    """A named set of sampling parameters (the composer's preset menu)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    temperature: float = Field(default=0.7, ge=0.0, le=5.0)
    top_k: int = Field(default=40, ge=0)
    top_p: float = Field(default=0.95, gt=0.0, le=1.0)
    min_p: float = Field(default=0.05, ge=0.0, le=1.0)
    repeat_penalty: float = Field(default=1.1, gt=0.0)
    max_tokens: int = Field(default=512, ge=1, le=32768)
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1)
    """None: a new random seed each reply; a number makes replies repeatable."""

    def with_overrides(self, overrides: object) -> SamplingPreset:
        """This preset with a chat's own values (``conversation.settings["sampling"]``) on top.

        Values that do not fit a field (a hand-edited history) are left out; the preset's stay.
        """
        if not isinstance(overrides, dict):
            return self
        data = self.model_dump()
        for key, value in overrides.items():
            if key == "name" or key not in SamplingPreset.model_fields:
                continue
            try:
                data = SamplingPreset.model_validate({**data, key: value}).model_dump()
            except ValidationError:
                continue
        return SamplingPreset.model_validate(data)


DEFAULT_PRESETS: tuple[SamplingPreset, ...] = (
    SamplingPreset(name="Balanced"),
    SamplingPreset(name="Precise (greedy)", temperature=0.0, top_k=1, top_p=1.0, min_p=0.0),
    SamplingPreset(name="Creative", temperature=1.0, top_k=100, top_p=0.98, min_p=0.02),
)


class Settings(BaseModel):
    """Everything the user can set. Keys from other versions that this one does not know are not used,
    but they are kept and saved again (:meth:`file_data`)."""

    model_config = ConfigDict(extra="ignore", validate_assignment=True)

    schema_version: int = SCHEMA_VERSION
    models_dir: Path | None = None
    """Where GGUF files live; None means the data folder's ``models``."""
    n_threads: int | None = Field(default=None, ge=1, le=512)
    """None: let llama.cpp choose."""
    gpu_layers: int | Literal["auto"] = "auto"
    n_ctx: int = Field(default=4096, ge=256, le=1_048_576)
    overflow_policy: OverflowPolicy = "rolling"
    reply_reserve: int = Field(default=512, ge=16, le=32768)
    default_system_prompt: str = "You are a helpful assistant."
    embedding_model: str = ""
    """A sentence-transformers folder; empty means the bundled starter embedder."""
    theme: Theme = "system"
    last_model: str | None = None
    auto_load_model: bool = True
    presets: list[SamplingPreset] = Field(default_factory=lambda: list(DEFAULT_PRESETS))
    default_preset: str = "Balanced"
    show_inspector: bool = True
    api_server_enabled: bool = False
    """Serve the loaded model as an OpenAI-compatible API on loopback (``glassbox serve`` in the app)."""
    api_server_port: int = Field(default=8080, ge=0, le=65535)
    """0 picks a free port."""
    api_server_key: str | None = None
    """When set, API requests must send ``Authorization: Bearer <key>`` (the file is always 0600)."""
    kv_cache_max_gb: float = Field(default=4.0, ge=0.0, le=100_000.0)
    """The KV cache saved with each chat (``paths.kv_cache``): its size cap in GiB (the field keeps
    its first name), least recently used first out; 0 saves none."""
    speculative: Literal["off", "lookup"] = "lookup"
    """Speculative decoding for models without a draft model: prompt lookup, or none."""
    draft_models: dict[str, str] = Field(default_factory=dict)
    """Per chat model (its GGUF path): a smaller model of the same vocabulary that drafts for it."""
    models_kept_loaded: int = Field(default=1, ge=1, le=8)
    """Local chat models the window keeps loaded, the chat's included: choosing one of them again
    is a switch, not a load (each holds its memory; the least recently used goes first, and when
    the next model would not fit). 1 keeps only the chat's model."""
    models_idle_minutes: float = Field(default=5.0, ge=0.0, le=1440.0)
    """A model kept loaded and unused this long is unloaded (0: kept until another needs the room)."""
    knowledge_idle_minutes: float = Field(default=3.0, ge=0.0, le=1440.0)
    """The knowledge process (torch, the embedding model, Chroma: ~600 MB) stops after this long
    with nothing asked of it, and starts again on the next use; 0 keeps it until the app closes."""

    @property
    def kv_cache_max_bytes(self) -> int:
        return int(self.kv_cache_max_gb * 2**30)

    _unknown: dict[str, object] = PrivateAttr(default_factory=dict)
    """Keys of the file this version does not know, with their values as read."""
    _unread: dict[str, tuple[object, object]] = PrivateAttr(default_factory=dict)
    """Settings of a newer file this version could not read: ``(value in the file, value used)``."""

    def file_data(self) -> dict[str, object]:
        """What ``save_settings`` writes: the settings, plus what the file held that this version did
        not understand (unknown keys; a newer file's unreadable values the user has not changed)."""
        data = self.model_dump(mode="json")
        for key, (raw, used) in self._unread.items():
            if data.get(key) == used:
                data[key] = raw
        for key, value in self._unknown.items():
            data.setdefault(key, value)
        return data

    def preset(self, name: str | None) -> SamplingPreset:
        """The preset called ``name``, else the default one, else the first."""
        by_name = {p.name: p for p in self.presets}
        return by_name.get(name or "") or by_name.get(self.default_preset) or self.presets[0]

    def models_folder(self, data_models: Path) -> Path:
        """The models folder: the setting if given, else ``data_models``."""
        return self.models_dir if self.models_dir is not None else data_models


class SettingsLoad(BaseModel):
    """What ``load_settings`` found: the settings and a warning for the user, if any."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    settings: Settings
    warning: str | None = None


def _migrate(raw: dict[str, object], path: Path) -> dict[str, object]:
    version = raw.get("schema_version", 1)
    if not isinstance(version, int) or version < 1:
        raise ValueError(f"{path}: schema_version {version!r} is not a positive integer")
    while version < SCHEMA_VERSION:
        step = MIGRATIONS.get(version)
        if step is None:
            raise ValueError(f"{path}: no migration from settings version {version}")
        raw = step(dict(raw))
        version += 1
        raw["schema_version"] = version
    return raw


def load_settings(path: Path) -> SettingsLoad:
    """Reads the settings file; never raises for a bad file.

    A missing file gives the defaults. An unreadable, invalid or unmigratable file is copied to
    ``<name>.<date>-<time>.bad`` (owner-only, so nothing the user wrote is lost; the newest
    :data:`MAX_BAD_COPIES` copies are kept) and the defaults are used, with a warning naming the
    copy. A value that does not fit its setting gets that setting's default, the other values are
    kept, the file is copied the same way, and the warning names the settings. Keys this version
    does not know are kept for the next save (:meth:`Settings.file_data`); a file from a newer
    Glassbox keeps its ``schema_version`` and, unless the user changes them, the values this version
    could not read. The file and older copies are made owner-only if others could read them.

    Args:
        path: ``paths.settings_file``.

    Returns:
        The settings, and a one-line warning when the file could not be used as is.
    """
    for copy in _bad_copies(path):
        make_private(copy)
    make_private(path.with_name(path.name + ".bad"))  # the one copy older versions kept
    if not path.exists():
        return SettingsLoad(settings=Settings())
    make_private(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: expected a JSON object")
        raw = _migrate(raw, path)
        settings, bad, reason = _validate_each(raw)
    except (OSError, ValueError, ValidationError) as exc:
        backup = _keep_copy(path)
        kept = f", old file kept as {backup}" if backup is not None else ""
        return SettingsLoad(
            settings=Settings(),
            warning=f"{path}: settings could not be read ({_first_line(exc)}); using defaults{kept}",
        )
    version = raw.get("schema_version", SCHEMA_VERSION)
    newer = isinstance(version, int) and version > SCHEMA_VERSION  # _migrate refused any other
    settings._unknown = {key: value for key, value in raw.items() if key not in Settings.model_fields}
    if newer and bad:
        used = settings.model_dump(mode="json")
        settings._unread = {key: (raw[key], used[key]) for key in dict.fromkeys(_key(b) for b in bad)}
    said: list[str] = []
    if newer:
        said.append(f"written by a newer Glassbox (schema {version}; this one reads up to {SCHEMA_VERSION})")
    if bad:
        backup = _keep_copy(path)
        kept = f"; the file as it was is kept as {backup}" if backup is not None else ""
        names = ", ".join(bad)
        if newer:
            said.append(
                f"could not read {names} ({reason}), so the default is used until changed here"
                f" and the file's value is saved back{kept}"
            )
        else:
            said.append(f"could not read {names} ({reason}), so the default is used for each{kept}")
    if newer:
        said.append("settings this version does not know are kept as they are")
    if said:
        return SettingsLoad(settings=settings, warning=f"{path}: " + "; ".join(said))
    return SettingsLoad(settings=settings)


def _validate_each(raw: dict[str, object]) -> tuple[Settings, list[str], str | None]:
    """Validates ``raw``, leaving out each value that does not fit (its setting gets the default).

    A bad item of a list (one preset) drops that item alone; a list left empty gets the default.

    Returns:
        The settings, the names of the values left out (``n_ctx``, ``presets[2]``), and the first
        reason given (None when nothing was left out).

    Raises:
        ValidationError: an error that names no setting.
    """
    data = dict(raw)
    bad: list[str] = []
    reason: str | None = None
    while True:  # each round leaves out at least one key or list item, so it ends
        try:
            return Settings.model_validate(data), bad, reason
        except ValidationError as exc:
            if reason is None:
                reason = _first_line(exc)
            keys: set[str] = set()
            items: dict[str, set[int]] = {}
            for err in exc.errors():
                loc = err.get("loc", ())
                if not loc or not isinstance(loc[0], str) or loc[0] not in data:
                    raise
                key = loc[0]
                if len(loc) > 1 and isinstance(loc[1], int) and isinstance(data[key], list):
                    items.setdefault(key, set()).add(loc[1])
                else:
                    keys.add(key)
            for key, indexes in items.items():
                if key in keys:
                    continue
                current = data[key]
                if not isinstance(current, list):  # item errors are recorded for lists only (above)
                    continue
                left = [value for i, value in enumerate(current) if i not in indexes]
                bad += [f"{key}[{i}]" for i in sorted(indexes)]
                if left:
                    data[key] = left
                else:
                    del data[key]
            for key in sorted(keys):
                del data[key]
                bad.append(key)


def _key(name: str) -> str:
    """The setting a name from ``_validate_each`` belongs to: ``presets[2]`` -> ``presets``."""
    return name.split("[", 1)[0]


def _bad_copies(path: Path) -> list[Path]:
    """The kept copies of damaged versions of ``path``, oldest first."""
    return [entry for _, _, entry in _stamped_copies(path)]


def _stamped_copies(path: Path) -> list[tuple[str, int, Path]]:
    """``(stamp, serial, copy)`` of each kept copy, oldest first (``settings.json.<stamp>[-<serial>].bad``)."""
    pattern = re.compile(re.escape(path.name) + r"\.(\d{8}-\d{6})(?:-(\d+))?\.bad")
    try:
        entries = list(path.parent.iterdir())
    except OSError:
        return []
    found: list[tuple[str, int, Path]] = []
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if match is not None:
            found.append((match.group(1), int(match.group(2) or 1), entry))
    return sorted(found)


def _keep_copy(path: Path) -> Path | None:
    """Copies the file as it is to ``<name>.<date>-<time>.bad`` beside it (owner-only: it may hold the
    API key) and removes the oldest copies past :data:`MAX_BAD_COPIES`.

    Returns:
        The copy (an existing one when it holds the same bytes), or None if it could not be made.
    """
    try:
        data = path.read_bytes()
        copies = _stamped_copies(path)
        for _, _, copy in reversed(copies):
            if copy.stat().st_size == len(data) and copy.read_bytes() == data:
                return copy  # the same damaged file read again: one copy is enough
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime())
        serial = 1 + max((n for at, n, _ in copies if at == stamp), default=0)  # more than one in a second
        backup = path.with_name(f"{path.name}.{stamp}.bad" if serial == 1 else f"{path.name}.{stamp}-{serial}.bad")
        write_bytes_atomic(backup, data, mode=PRIVATE_FILE_MODE)
    except OSError:
        return None
    for old in _bad_copies(path)[:-MAX_BAD_COPIES]:
        try:
            old.unlink()
        except OSError as exc:
            log.warning("could not remove an old copy of damaged settings %s: %s", old, exc)
    return backup


def save_settings(settings: Settings, path: Path) -> None:
    """Writes the settings atomically: temp file, flush, fsync, rename; the file is owner-only (0600).

    Raises:
        OSError: the folder is not writable or the disk is full; the old file is left intact. Its
            ``filename`` is ``path`` (not the temporary file, nor None when a write or the flush to
            disk failed), so the one-line error names the settings file and the reason.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    text = json.dumps(settings.file_data(), indent=2, sort_keys=True) + "\n"
    try:
        # It can hold the API key: the temporary file is owner-only before the first byte.
        write_text_atomic(path, text, mode=PRIVATE_FILE_MODE)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc  # the subclass follows errno


def _first_line(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ())) or "value"
        return f"{where}: {err.get('msg', 'invalid')}"
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
