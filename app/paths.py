"""The one module that knows where Glassbox keeps things.

Everything lives under four roots from platformdirs (data, cache, config, logs). ``GLASSBOX_HOME``
or ``--home DIR`` re-roots all four under one folder, so tests and second profiles never touch the
user's data. Core code (engine, rag) never calls this: it is handed the paths it needs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

APP_NAME = "Glassbox"
HOME_ENV = "GLASSBOX_HOME"


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
        import platformdirs

        dirs = platformdirs.PlatformDirs(APP_NAME, appauthor=False)
        return cls(
            data=Path(dirs.user_data_dir),
            cache=Path(dirs.user_cache_dir),
            config=Path(dirs.user_config_dir),
            logs=Path(dirs.user_log_dir),
        )

    def ensure(self) -> Paths:
        for folder in (self.data, self.cache, self.config, self.logs, self.models, self.knowledge):
            folder.mkdir(parents=True, exist_ok=True)
        return self

    @property
    def models(self) -> Path:
        return self.data / "models"

    @property
    def knowledge(self) -> Path:
        return self.data / "knowledge"

    @property
    def download_queue(self) -> Path:
        """The downloads the user asked for and has not got yet (``engine.download_queue``)."""
        return self.data / "download_queue.json"

    @property
    def history_db(self) -> Path:
        return self.data / "history.sqlite3"

    @property
    def settings_file(self) -> Path:
        return self.config / "settings.json"

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
    def lock_file(self) -> Path:
        return self.data / "glassbox.lock"
