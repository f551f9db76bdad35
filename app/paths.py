"""The one module that knows where Glassbox keeps things.

Everything lives under four roots from platformdirs (data, cache, config, logs). ``GLASSBOX_HOME``
or ``--home DIR`` re-roots all four under one folder, so tests and second profiles never touch the
user's data. Core code (engine, rag) never calls this: it is handed the paths it needs.

The folders are private: ``ensure()`` creates them owner-only (0700) and makes existing ones
owner-only (saying so in the log), so no other account on the machine can read the chats, the
indexed documents or the keys inside. A folder that cannot be written (a read-only home or mount)
is :class:`ReadOnlyFolder`, reported in one line.
"""

from __future__ import annotations

import errno
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from engine.atomic import PRIVATE_FOLDER_MODE, make_private

APP_NAME = "Glassbox"
HOME_ENV = "GLASSBOX_HOME"
_NOT_WRITABLE = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


class ReadOnlyFolder(OSError):
    """A folder Glassbox must write to is read-only (a read-only home, mount or permissions).

    ``str()`` is the one line to print after ``glassbox: error:``.

    Args:
        folder: the read-only folder (the nearest existing one when a folder could not be created).
    """

    def __init__(self, folder: Path) -> None:
        super().__init__(errno.EROFS, "the data folder is read-only", str(folder))
        self.folder = folder

    def __str__(self) -> str:
        return f"the data folder {self.folder} is read-only"


def _nearest_existing(folder: Path) -> Path:
    """``folder`` or its closest ancestor that exists (where a failed ``mkdir`` was refused)."""
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            return candidate
    return folder


@dataclass(frozen=True)
class Paths:
    """Resolved locations; ``ensure()`` creates the folders."""

    data: Path
    cache: Path
    config: Path
    logs: Path

    @classmethod
    def resolve(cls, home: str | os.PathLike[str] | None = None) -> Paths:
        """Roots from ``home``, else ``$GLASSBOX_HOME``, else the platform's user folders."""
        root = home if home is not None else os.environ.get(HOME_ENV) or None
        if root is not None:
            base = Path(root).expanduser().resolve()
            return cls(data=base / "data", cache=base / "cache", config=base / "config", logs=base / "logs")
        # lazy: start-up (+6 ms: platformdirs)
        import platformdirs

        dirs = platformdirs.PlatformDirs(APP_NAME, appauthor=False)
        return cls(
            data=Path(dirs.user_data_dir),
            cache=Path(dirs.user_cache_dir),
            config=Path(dirs.user_config_dir),
            logs=Path(dirs.user_log_dir),
        )

    def ensure(self) -> Paths:
        """Creates the folders owner-only (0700) and makes existing ones owner-only (logged once,
        when it changes something).

        Raises:
            ReadOnlyFolder: a folder cannot be created or written (EROFS, EACCES, EPERM).
            OSError: another reason a folder cannot be created (a file in the way, a full disk).
        """
        for folder in self.folders:
            existed = folder.is_dir()
            if not existed:
                try:
                    folder.mkdir(mode=PRIVATE_FOLDER_MODE, parents=True, exist_ok=True)
                except OSError as exc:
                    if exc.errno in _NOT_WRITABLE:
                        raise ReadOnlyFolder(_nearest_existing(folder)) from exc
                    raise
            # POSIX only: Windows marks many writable folders read-only (there it means "customized").
            if os.name == "posix" and not os.access(folder, os.W_OK | os.X_OK):
                raise ReadOnlyFolder(folder)
            if existed:
                make_private(folder)
        return self

    @property
    def folders(self) -> tuple[Path, ...]:
        """Every folder ``ensure()`` creates, parents first."""
        return (self.data, self.cache, self.config, self.logs, self.models, self.knowledge)

    @property
    def models(self) -> Path:
        return self.data / "models"

    @property
    def knowledge(self) -> Path:
        return self.data / "knowledge"

    @property
    def download_queue(self) -> Path:
        """The downloads the user asked for and has not got yet (``engine.hub.queue``)."""
        return self.data / "download_queue.json"

    @property
    def history_db(self) -> Path:
        return self.data / "history.sqlite3"

    @property
    def settings_file(self) -> Path:
        return self.config / "settings.json"

    @property
    def mcp_config(self) -> Path:
        """The MCP servers, in the standard ``mcp.json`` shape (``app.tool_setup``)."""
        return self.config / "mcp.json"

    @property
    def tool_permissions(self) -> Path:
        """The tools always allowed without asking, and the tools turned off (``app.tool_setup``)."""
        return self.config / "tool_permissions.json"

    @property
    def endpoints_file(self) -> Path:
        """The remote servers the user saved (``engine.inference.endpoints.EndpointStore``)."""
        return self.config / "endpoints.json"

    @property
    def model_folders(self) -> Path:
        """The library's other folders (``app.model_folders``, ``engine.library``)."""
        return self.config / "model_folders.json"

    @property
    def models_manifest(self) -> Path:
        """Where each downloaded model came from (``engine.library``'s provenance manifest)."""
        return self.manifest_of(self.models)

    @staticmethod
    def manifest_of(models_folder: Path) -> Path:
        """The provenance manifest of a models folder (the settings may name another than ``models``)."""
        return models_folder / "manifest.json"

    @property
    def window_state(self) -> Path:
        """The main window's geometry and layout (``QSettings``, INI format; nothing else goes there)."""
        return self.config / "window.ini"

    @property
    def kv_cache(self) -> Path:
        """The KV cache saved with each chat (``engine.inference.kv_cache``; created owner-only on first save)."""
        return self.data / "kv_cache"

    @property
    def media(self) -> Path:
        """The chats' images and clips, one file per content (``engine.media_store``; owner-only)."""
        return self.data / "media"

    @property
    def bandwidth_cache(self) -> Path:
        return self.cache / "memory_bandwidth.json"

    @property
    def cpu_backend_state(self) -> Path:
        """What this machine showed about llama.cpp's CPU variants (engine.cpu_backend.BackendState)."""
        return self.cache / "cpu_backend.json"

    @property
    def breadcrumb(self) -> Path:
        return self.logs / "attempting.json"

    @property
    def selftest_document(self) -> Path:
        """The small document ``glassbox --self-test`` indexes (in its own throwaway home)."""
        return self.data / "selftest.txt"

    @property
    def lock_file(self) -> Path:
        return self.data / "glassbox.lock"


def resource_path(name: str) -> Path:
    """A file shipped in ``resources/`` (``perplexity.txt``, ``curated_models.json``): in the
    source tree, or in the frozen bundle's ``_MEIPASS`` (``installers/glassbox.spec`` lists it)."""

    base = getattr(sys, "_MEIPASS", None)
    root = Path(base) if base else Path(__file__).resolve().parent.parent
    return root / "resources" / name
