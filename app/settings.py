"""The one settings model (STYLE.md rule 14): Qt-free, typed, versioned, saved atomically.

``Settings`` is a pydantic model with a ``schema_version``. ``load_settings`` reads
``paths.settings_file``, runs the registered migrations for older versions, and falls back to the
defaults (keeping a copy of the unreadable file) when the file is damaged. ``save_settings`` writes a
temporary file, fsyncs it and renames it over the old one, so a crash or a full disk never leaves a
half-written file. ``QSettings`` keeps only window geometry.

The file can hold ``api_server_key``, so it and the kept copy of a damaged one are owner-only
(0600) from their first byte; older ones left readable by others are made owner-only when read.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

# Glassbox uses no pydantic plugins; skipping their entry-point scan saves ~0.1 s at start-up.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.atomic import PRIVATE_FILE_MODE, make_private, write_bytes_atomic

SCHEMA_VERSION = 1

Theme = Literal["system", "light", "dark"]
OverflowPolicy = Literal["rolling", "refuse"]
log = logging.getLogger(__name__)

Migration = Callable[[dict[str, Any]], dict[str, Any]]
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


DEFAULT_PRESETS: tuple[SamplingPreset, ...] = (
    SamplingPreset(name="Balanced"),
    SamplingPreset(name="Precise (greedy)", temperature=0.0, top_k=1, top_p=1.0, min_p=0.0),
    SamplingPreset(name="Creative", temperature=1.0, top_k=100, top_p=0.98, min_p=0.02),
)


class Settings(BaseModel):
    """Everything the user can set. Unknown keys from newer versions are ignored, not lost on read."""

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


def _migrate(raw: dict[str, Any], path: Path) -> dict[str, Any]:
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
    ``<name>.bad`` (owner-only, so nothing the user wrote is lost) and the defaults are used, with a
    warning. The file and an older ``<name>.bad`` are made owner-only if others could read them.

    Args:
        path: ``paths.settings_file``.

    Returns:
        The settings, and a one-line warning when the file could not be used as is.
    """
    backup = path.with_name(path.name + ".bad")
    make_private(backup)
    if not path.exists():
        return SettingsLoad(settings=Settings())
    make_private(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: expected a JSON object")
        newer = isinstance(raw.get("schema_version"), int) and raw["schema_version"] > SCHEMA_VERSION
        raw = _migrate(raw, path)
        settings = Settings.model_validate(raw)
    except (OSError, ValueError, ValidationError) as exc:
        try:
            write_bytes_atomic(backup, path.read_bytes(), mode=PRIVATE_FILE_MODE)  # it may hold the API key
        except OSError:
            pass
        reason = _first_line(exc)
        return SettingsLoad(
            settings=Settings(),
            warning=(f"{path}: settings could not be read ({reason}); using defaults, old file kept as {backup.name}"),
        )
    if newer:
        settings = settings.model_copy(update={"schema_version": SCHEMA_VERSION})
        return SettingsLoad(
            settings=settings,
            warning=f"{path}: written by a newer Glassbox; unknown settings are ignored",
        )
    return SettingsLoad(settings=settings)


def save_settings(settings: Settings, path: Path) -> None:
    """Writes the settings atomically: temp file, flush, fsync, rename; the file is owner-only (0600).

    Raises:
        OSError: the folder is not writable or the disk is full; the old file is left intact.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    data = settings.model_dump(mode="json")
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE_MODE)
        with open(fd, "w", encoding="utf-8") as out:
            os.chmod(tmp, PRIVATE_FILE_MODE)  # it can hold the API key: owner-only before the first byte
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _first_line(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ())) or "value"
        return f"{where}: {err.get('msg', 'invalid')}"
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
