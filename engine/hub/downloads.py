"""The downloader: one Hugging Face file to a folder, resumable, verified, never half-written.

``download_file`` streams ``{endpoint}/{repo}/resolve/{revision}/{filename}`` into
``<dest>/<filename>.partial`` with a JSON sidecar (repo, revision, the commit it resolved to, URL,
expected size/sha256/etag, bytes done); called again, in this process or a new one after a crash,
it resumes from the last checkpoint. The helper threads live in ``engine.hub.transfer``, the
remembered queue in ``engine.hub.queue``, HTTP in ``engine.hub.http``.

Contract: ARCHITECTURE.md, 'engine.hub.downloads'.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from engine.errors import DownloadError
from engine.hub.download_job import SHA256_HEX, DownloadJob, DownloadResult, hash_file
from engine.hub.http import resolve_endpoint
from engine.hub.partials import check_disk_space, locked_partial, partial_paths
from engine.hub.search import PICKLE_SUFFIXES, check_filename, check_repo_id, check_revision
from engine.hub.transfer import ProgressCallback, Reporter

__all__ = ["download_file"]


def download_file(
    repo: str,
    filename: str,
    dest_dir: Path,
    *,
    revision: str = "main",
    endpoint: str | None = None,
    expected_sha256: str | None = None,
    expected_size: int | None = None,
    cancel: threading.Event | None = None,
    pause: threading.Event | None = None,
    progress: ProgressCallback | None = None,
    max_retries: int = 8,
    stall_timeout_s: float = 30.0,
    disk_margin_bytes: int = 512 * 2**20,
    backoff_s: float = 1.0,
    max_backoff_s: float = 60.0,
    checksum_retries: int = 1,
) -> DownloadResult:
    """Downloads one file of a Hugging Face repository into ``dest_dir``, resumably and verified.

    Blocking; run it in a worker thread. ``progress`` is called from that thread (and, while no
    bytes arrive, from the watchdog thread; calls never overlap).

    Args:
        repo: ``owner/name``.
        filename: the path inside the repository; it keeps its folders under ``dest_dir``.
        dest_dir: where the file goes (created if missing).
        revision: branch, tag or commit; a resume sticks to the commit first resolved.
        endpoint: the Hub endpoint; default ``$HF_ENDPOINT`` or https://huggingface.co.
        expected_sha256: the LFS sha256 from the listing; default: the Hub's ``X-Linked-Etag``.
        expected_size: the size from the listing; the server must agree.
        cancel: set it to stop; raises ``Cancelled`` and keeps the partial for a later resume.
        pause: while set, the transfer stops with the connection closed; it resumes when cleared.
        progress: called with ``DownloadProgress`` (at most about 10 times a second while downloading).
        max_retries: consecutive failed attempts (without progress) before giving up.
        stall_timeout_s: seconds without a byte before reconnecting.
        disk_margin_bytes: free space to leave on the volume beyond the file itself.
        backoff_s: the first retry delay; doubles each consecutive failure (with jitter).
        max_backoff_s: the longest retry delay (``Retry-After`` may ask for more).
        checksum_retries: how many times a file with a wrong sha256 is downloaded again.

    Returns:
        The final path, its sha256 and size, the repo and the commit (or revision).

    Raises:
        DownloadError: unsafe name, pickle file, gated/missing repo, disk full, corruption that
            persisted, or retries exhausted; one line, fit for the user.
        Cancelled: ``cancel`` was set.
    """
    check_repo_id(repo)
    check_revision(revision)
    check_filename(filename)
    if os.path.splitext(filename)[1].lower() in PICKLE_SUFFIXES:
        raise DownloadError(f"{filename}: pickle weights (unsafe to load); Glassbox only uses GGUF or safetensors")
    if expected_sha256 is not None:
        expected_sha256 = expected_sha256.lower()
        if not SHA256_HEX.match(expected_sha256):
            raise DownloadError(f"{expected_sha256}: not a sha256 hex digest")
    if expected_size is not None and expected_size < 0:
        raise DownloadError(f"{expected_size}: not a file size")
    base = resolve_endpoint(endpoint)
    cancel = cancel if cancel is not None else threading.Event()
    pause = pause if pause is not None else threading.Event()
    reporter = Reporter(filename, progress)
    final, partial, _ = partial_paths(Path(dest_dir), filename)
    if final.is_file() and expected_sha256 is not None:
        reporter.emit("verifying", "checking the file already there")
        if hash_file(final, cancel) == expected_sha256:
            size = final.stat().st_size
            reporter.done = reporter.total = size
            reporter.emit("done", "already downloaded")
            return DownloadResult(final, expected_sha256, size, repo, revision)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DownloadError(f"{final.parent}: cannot create the folder: {exc.strerror or exc}") from None
    if expected_size is not None:
        have = partial.stat().st_size if partial.is_file() else 0
        check_disk_space(final.parent, max(0, expected_size - have) + disk_margin_bytes, filename)
    with locked_partial(partial, filename) as fd:
        job = DownloadJob(
            repo=repo,
            filename=filename,
            dest_dir=Path(dest_dir),
            revision=revision,
            endpoint=base,
            expected_sha256=expected_sha256,
            expected_size=expected_size,
            cancel=cancel,
            pause=pause,
            reporter=reporter,
            max_retries=max_retries,
            stall_timeout_s=stall_timeout_s,
            disk_margin_bytes=disk_margin_bytes,
            backoff_s=backoff_s,
            max_backoff_s=max_backoff_s,
            checksum_retries=checksum_retries,
            fd=fd,
        )
        try:
            return job.run()
        except BaseException:
            # Still holding the lock: an empty partial is ours to remove (nothing to resume).
            _drop_if_empty(partial)
            raise


def _drop_if_empty(partial: Path) -> None:
    """Removes a partial file with no bytes (and its metadata): nothing to resume, nothing to keep."""
    try:
        if partial.stat().st_size == 0:
            partial.unlink()
            partial.with_name(partial.name + ".json").unlink(missing_ok=True)
    except OSError:
        pass
