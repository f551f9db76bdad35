"""What the Models page shows of a download or a model job: frozen :class:`Transfer` snapshots.

A transfer is never changed in place. The adapter that runs it (downloads in
:mod:`app.gui.workers.downloads_adapter`, quantize, convert and quality checks in
:mod:`app.gui.workers.model_jobs`) keeps the latest snapshot of each on the GUI thread and emits a new
one, made with :func:`dataclasses.replace`, at each change; worker threads hand it only frozen
progress reports from the engine. The ``cancel`` and ``pause`` events of a run travel in every
snapshot of it: the GUI sets them directly (CONTRIBUTING.md rule 9), and they tell one run of a key
from the next (:meth:`Transfer.same_run`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.hub.model_download import FileJob
    from engine.hub.queue import PartialDownload, QueuedOnDisk

__all__ = ["Transfer", "download_label", "from_partial", "from_queue"]


#: The states in which a model job (quantize, convert, quality check) has ended.
JOB_ENDED = ("done", "error", "cancelled")


@dataclass(frozen=True)
class Transfer:
    """One download (or quantization, conversion, quality check) as it stands now.

    A download is ``running`` from the moment it is queued until its job ends. A stopped one
    (cancelled, failed, or found on disk after a restart, state ``paused``) keeps its partial
    files: ``files`` resume it, ``paths`` are the final paths whose partials Discard deletes.
    ``files`` is empty for a partial that cannot be resumed (``message`` says why).
    """

    key: str
    label: str
    kind: str  # "download" | "quantize" | "convert" | "quality"
    cancel: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)
    pause: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)
    state: str = "queued"
    done: int = 0
    total: int = 0
    speed_bps: float = 0.0
    eta_s: float | None = None
    message: str = ""
    result: Any = None
    repo: str = ""
    files: tuple[FileJob, ...] = ()
    paths: tuple[Path, ...] = ()
    running: bool = False
    restored: bool = False  # found on disk at startup rather than started in this session
    queue_key: str | None = None  # its item in the download queue, if it has one
    files_done: int = 0  # files complete (of ``paths``)

    @property
    def resumable(self) -> bool:
        return bool(self.files) and not self.running and self.state != "done"

    def same_run(self, other: Transfer | None) -> bool:
        """Whether ``other`` is a snapshot of this very run (the same key and the same events)."""
        return other is not None and other.key == self.key and other.cancel is self.cancel


def download_label(name: str, repo: str, filenames: list[str]) -> str:
    """A download row's name: ``model-Q4_K_M.gguf (3 parts + mmproj, owner/repo)``."""
    mmproj = [f for f in filenames if "mmproj" in f.rsplit("/", 1)[-1].lower()]
    parts = len(filenames) - len(mmproj)
    extras = []
    if parts > 1:
        extras.append(f"{parts} parts")
    if mmproj:
        extras.append("+ mmproj" if extras else "with mmproj")
    detail = " ".join(extras)
    return f"{name} ({detail}, {repo})" if detail else f"{name} ({repo})"


def from_queue(status: QueuedOnDisk, endpoint: str | None) -> Transfer:
    """The stopped row of a download queue item found at startup (all its files, one row)."""
    # lazy: start-up (+71 ms)
    from engine.hub.model_download import FileJob

    item = status.item
    dest = Path(item.dest_dir)
    return Transfer(
        key=f"{item.repo}/{item.name}",
        label=download_label(item.name, item.repo, [f.filename for f in item.files]),
        kind="download",
        state="error" if item.state == "failed" else "paused",
        done=status.done,
        total=status.total or sum(f.total or 0 for f in status.files),
        message=item.error or "",
        repo=item.repo,
        files=tuple(
            FileJob(
                item.repo,
                f.filename,
                dest,
                item.revision,
                item.endpoint or endpoint,
                f.expected_sha256,
                f.expected_size,
            )
            for f in item.files
        ),
        paths=tuple(item.paths),
        restored=True,
        queue_key=item.key,
        files_done=status.files_done,
    )


def from_partial(partial: PartialDownload, endpoint: str | None) -> Transfer:
    """The stopped row of a partial file no queue item claims: ``paused``, or ``unreadable``
    (only Discard) when its resume metadata is gone."""
    # lazy: start-up (+58 ms)
    from engine.hub.model_download import FileJob

    files: tuple[FileJob, ...] = ()
    if partial.resumable:
        files = (
            FileJob(
                partial.repo,
                partial.filename,
                partial.dest_dir,
                partial.revision,
                partial.endpoint or endpoint,
                partial.expected_sha256,
                partial.expected_size,
            ),
        )
    return Transfer(
        key=f"partial:{partial.path}",
        label=f"{partial.path.name} ({partial.repo})" if partial.resumable else partial.path.name,
        kind="download",
        state="paused" if partial.resumable else "unreadable",
        done=partial.done,
        total=partial.total or partial.expected_size or 0,
        message=partial.error or "",
        repo=partial.repo,
        files=files,
        paths=(partial.path,),
        restored=True,
    )
