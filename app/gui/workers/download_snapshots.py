"""How a download's :class:`~app.gui.workers.transfers.Transfer` snapshot changes, as pure functions.

The downloads adapter keeps the latest snapshot of each download on the GUI thread; each of these
makes the next one with :func:`dataclasses.replace` from a frozen engine report, never changing
one in place:

* :func:`new_download`: a model choice (every part of a split model, and the one mmproj a load would use) becomes its
  first snapshot and the download-queue item that remembers it across restarts.
* :func:`after_progress`: one throttled ``FilesProgress``.
* :func:`after_outcome` and :func:`after_failure`: the end of a run (complete, cancelled or
  failed); :func:`provenance` is what the library records of the files that came.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from app.gui.tasks import describe_error
from app.gui.workers.transfers import Transfer, download_label
from engine.errors import Cancelled

if TYPE_CHECKING:
    from engine.hub.model_download import FilesOutcome, FilesProgress
    from engine.hub.queue import QueueItem
    from engine.hub.search import ModelChoice

KEPT = "the partial download is kept"
"""What a stopped download says of its files."""


def new_download(
    repo: str, choice: ModelChoice, commit: str | None, models_dir: Path, endpoint: str | None
) -> tuple[Transfer, QueueItem]:
    """The first snapshot of a download of ``choice`` into ``<models>/<owner>/<repo>/``
    (``engine.hub.model_download.model_folder``), and its download-queue item."""
    # lazy: start-up (+99 ms)
    from engine.hub.model_download import FileJob, model_folder
    from engine.hub.queue import QueueFile, make_item

    listed = (*choice.files, *((choice.projector,) if choice.projector is not None else ()))  # one projector
    dest = model_folder(models_dir, repo, [f.filename for f in listed])
    files = tuple(FileJob(repo, f.filename, dest, commit or "main", endpoint, f.sha256, f.size or None) for f in listed)
    item = make_item(
        repo,
        choice.name,
        dest,
        [QueueFile(f.filename, f.expected_sha256, f.expected_size) for f in files],
        revision=commit or "main",
        endpoint=endpoint,
    )
    transfer = Transfer(
        key=f"{repo}/{choice.name}",
        label=download_label(choice.name, repo, [f.filename for f in files]),
        kind="download",
        repo=repo,
        files=files,
        paths=tuple(f.path for f in files),
        queue_key=item.key,
        total=sum(f.size for f in listed),
    )
    return transfer, item


def after_progress(current: Transfer, update: FilesProgress) -> Transfer:
    """``current`` after one progress report of its run."""
    return dataclasses.replace(
        current,
        done=update.done,
        total=update.total if update.count == 1 and update.total else current.total,
        speed_bps=update.file.speed_bps,
        eta_s=update.file.eta_s,
        state=update.state,
        files_done=update.files_done,
        message=update.file.message,
    )


def after_outcome(current: Transfer, outcome: FilesOutcome) -> Transfer:
    """``current`` once its run returned: ``done`` when every file came, else ``cancelled``."""
    complete = outcome.complete
    return dataclasses.replace(
        current,
        running=False,
        state="done" if complete else "cancelled",
        done=current.total if complete else current.done,
        speed_bps=0.0,
        eta_s=None,
        message="" if complete else KEPT,
        result=list(outcome.downloaded),
        files_done=len(outcome.downloaded) + len(outcome.skipped) if complete else current.files_done,
    )


def after_failure(current: Transfer, exc: BaseException) -> Transfer:
    """``current`` once its run raised: ``cancelled`` (Stop) or ``error`` with the one-line reason."""

    cancelled = isinstance(exc, Cancelled)
    return dataclasses.replace(
        current,
        running=False,
        state="cancelled" if cancelled else "error",
        speed_bps=0.0,
        eta_s=None,
        message=KEPT if cancelled else describe_error(exc),
    )


def provenance(outcome: FilesOutcome) -> list[tuple[Path, str, str | None]]:
    """``(path, revision, sha256)`` of each file a run downloaded or found complete."""
    records: list[tuple[Path, str, str | None]] = [(r.path, r.revision, r.sha256) for r in outcome.downloaded]
    records += [(job.path, job.revision, job.expected_sha256) for job in outcome.skipped]
    return records
