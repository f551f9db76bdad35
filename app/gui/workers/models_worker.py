"""The Models page's three adapters, built and shut down together.

* ``library``: :class:`~app.gui.workers.library_adapter.LibraryAdapter`, scans, the hardware probe,
  fit verdicts, the folders the library indexes;
* ``downloads``: :class:`~app.gui.workers.downloads_adapter.DownloadsAdapter`, Hub search and the
  downloads that survive a restart;
* ``jobs``: :class:`~app.gui.workers.model_jobs.ModelJobsAdapter`, quantize, convert, quality checks.

Each runs its engine calls off the GUI thread and reports frozen
:class:`~app.gui.workers.transfers.Transfer` snapshots. :class:`ModelsAdapter` only composes them
and gives the main window the few signals it listens to.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Signal

from app.gui.workers.downloads_adapter import DownloadsAdapter
from app.gui.workers.library_adapter import LibraryAdapter
from app.gui.workers.model_jobs import ModelJobsAdapter

if TYPE_CHECKING:
    from engine.hardware import HardwareInfo
    from engine.library import LibraryEntry

__all__ = ["ModelsAdapter"]

QUEUE_FILE_NAME = "download_queue.json"


class ModelsAdapter(QObject):
    """The model library, downloads and model jobs of one models folder.

    Args:
        models_dir: the owned models folder.
        manifest: the library manifest file.
        folders_file: where added folders are kept.
        endpoint: the Hub endpoint (None: ``$HF_ENDPOINT`` or huggingface.co).
        queue_file: the download queue (``Paths.download_queue``); default: ``download_queue.json``
            beside ``folders_file``.

    Signals:
        library_changed(object): the library's entries (from ``library``).
        unfinished_found(int): unfinished downloads of an earlier session (from ``downloads``).
        error_occurred(str): a one-line message from any of the three.
    """

    library_changed = Signal(object)
    unfinished_found = Signal(int)
    error_occurred = Signal(str)

    def __init__(
        self,
        models_dir: Path,
        manifest: Path,
        folders_file: Path,
        endpoint: str | None = None,
        parent: QObject | None = None,
        *,
        queue_file: Path | None = None,
    ) -> None:
        super().__init__(parent)
        self.library = LibraryAdapter(models_dir, manifest, folders_file, parent=self)
        queue = queue_file if queue_file is not None else folders_file.with_name(QUEUE_FILE_NAME)
        self.downloads = DownloadsAdapter(self.library, queue, endpoint, parent=self)
        self.jobs = ModelJobsAdapter(self.library, parent=self)
        self.library.library_changed.connect(self.library_changed)
        self.downloads.unfinished_found.connect(self.unfinished_found)
        self.library.error_occurred.connect(self.error_occurred)
        self.downloads.error_occurred.connect(self.error_occurred)

    @property
    def queue_file(self) -> Path:
        return self.downloads.queue_file

    @property
    def hardware(self) -> HardwareInfo | None:
        """``engine.hardware.HardwareInfo`` once probed, else None."""
        return self.library.hardware

    @property
    def entries(self) -> list[LibraryEntry]:
        """The library's entries at the last scan."""
        return self.library.entries

    def find_unfinished(self) -> None:
        """Brings back the downloads an earlier session left unfinished (``unfinished_found``)."""
        self.downloads.find_unfinished()

    def shutdown(self, wait: bool = True) -> None:
        """Cancels downloads (they keep their resumable partials) and model jobs."""
        self.jobs.cancel_all()
        self.downloads.shutdown(wait=wait)
        self.jobs.shutdown(wait=wait)
