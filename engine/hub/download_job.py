"""One download's job: the state of a ``download_file`` call, its attempts, resume and verification.

Owns :class:`DownloadJob` (the connection attempts with backoff, the resume point re-hashed from the
partial, the sidecar checkpoints, the status and header checks, streaming into the locked partial,
the sha256 check and the final fsync and rename) and :class:`DownloadResult`. The entry point and
its argument checks are :func:`engine.hub.downloads.download_file`; the partial's files and lock
are :mod:`engine.hub.partials`; the helper threads :mod:`engine.hub.transfer`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import http.client
import os
import re
import sys
import threading
import time
import urllib.parse
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine.atomic import fsync_dir, write_json_atomic
from engine.disk import missing_space
from engine.errors import Cancelled, DownloadError
from engine.hub.http import (
    HttpResponse,
    OfflineError,
    backoff_delay,
    is_retryable_status,
    open_url,
    retry_after_seconds,
    status_error,
)
from engine.hub.partials import META_FORMAT, check_disk_space, partial_paths, read_meta_file
from engine.hub.transfer import BackgroundHasher, BackgroundSync, Reporter, Watchdog
from engine.units import format_bytes

__all__ = ["SHA256_HEX", "DownloadJob", "DownloadResult", "hash_file", "write_all"]

_CHUNK = 1 << 20
_CHECKPOINT_S = 1.0
_PROGRESS_BYTES = 64 * 1024
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_NO_SPACE = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


@dataclass(frozen=True)
class DownloadResult:
    """A finished, verified download. ``revision`` is the commit sha when the Hub told it."""

    path: Path
    sha256: str
    size: int
    repo: str
    revision: str

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["path"] = str(self.path)
        return data


def _agree(ours: object, theirs: object) -> bool:
    """Two optional facts agree when either is unknown or they are equal."""
    return ours is None or theirs is None or ours == theirs


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Writes all of ``data`` to ``fd`` (a raw, unbuffered descriptor: ENOSPC surfaces here)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class _Retry(Exception):
    """One attempt failed in a way worth retrying."""

    def __init__(self, message: str, *, progressed: bool = False, wait_s: float | None = None) -> None:
        super().__init__(message)
        self.progressed = progressed
        self.wait_s = wait_s


class _Paused(Exception):
    """The pause event stopped the transfer."""


class DownloadJob:
    """The state of one :func:`engine.hub.downloads.download_file` call; see there for the parameters."""

    def __init__(
        self,
        *,
        repo: str,
        filename: str,
        dest_dir: Path,
        revision: str,
        endpoint: str,
        expected_sha256: str | None,
        expected_size: int | None,
        cancel: threading.Event,
        pause: threading.Event,
        reporter: Reporter,
        max_retries: int,
        stall_timeout_s: float,
        disk_margin_bytes: int,
        backoff_s: float,
        max_backoff_s: float,
        checksum_retries: int,
        fd: int,
    ) -> None:
        self.repo = repo
        self.filename = filename
        self.revision = revision
        self.endpoint = endpoint
        self.final, self.partial, self.meta_path = partial_paths(dest_dir, filename)
        self.folder = self.final.parent
        self.expected_sha256 = expected_sha256
        self.expected_size = expected_size
        self.cancel = cancel
        self.pause = pause
        self.reporter = reporter
        self.max_retries = max_retries
        self.stall_timeout_s = stall_timeout_s
        self.disk_margin_bytes = disk_margin_bytes
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.checksum_retries = checksum_retries
        self.fd = fd
        self.commit: str | None = revision if _COMMIT.match(revision) else None
        self.etag: str | None = None
        self.total: int | None = expected_size
        self.done = 0
        self.hasher = BackgroundHasher()
        self.writeback = BackgroundSync(fd)
        self.attempt = 0
        self.high_water = 0  # the most bytes ever held: progress means passing it
        self.last_checkpoint = time.monotonic()
        self.space_checked_for: int | None = None

    # ------------------------------------------------------------------ metadata and resume
    def url(self) -> str:
        ref = urllib.parse.quote(self.commit or self.revision, safe="")
        return f"{self.endpoint}/{self.repo}/resolve/{ref}/{urllib.parse.quote(self.filename)}"

    def save_meta(self) -> None:
        write_json_atomic(
            self.meta_path,
            durable=False,
            document={
                "format": META_FORMAT,
                "repo": self.repo,
                "filename": self.filename,
                "revision": self.revision,
                "commit": self.commit,
                "url": self.url(),
                "endpoint": self.endpoint,
                "expected_size": self.expected_size,
                "expected_sha256": self.expected_sha256,
                "etag": self.etag,
                "total": self.total,
                "done": self.done,
                "updated_at": time.time(),
            },
        )

    def checkpoint(self, *, force: bool = False) -> None:
        """Records the bytes written so far (about once a second) for a resume.

        No fsync here: bytes handed to the OS survive the app being killed, and an fsync a
        second halves throughput. After a power cut the tail may be garbage; the sha256 check
        at the end catches that (and downloads again). The final file is always fsynced.
        """
        now = time.monotonic()
        if not force and now - self.last_checkpoint < _CHECKPOINT_S:
            return
        self.last_checkpoint = now
        # A failed checkpoint only makes a later resume start earlier; a full disk shows at the
        # next write anyway.
        with contextlib.suppress(OSError):
            self.save_meta()

    def reset(self) -> None:
        """Back to byte 0 (the partial is truncated, the hash restarted)."""
        os.ftruncate(self.fd, 0)
        os.lseek(self.fd, 0, os.SEEK_SET)
        self.done = 0
        self.hasher.close()
        self.hasher = BackgroundHasher()
        self.reporter.done = 0

    def load_resume_point(self) -> None:
        meta = read_meta_file(self.meta_path)
        size = os.fstat(self.fd).st_size
        usable = (
            meta is not None
            and meta.get("repo") == self.repo
            and meta.get("filename") == self.filename
            and meta.get("revision") == self.revision
            and meta.get("endpoint") in (None, self.endpoint)
            and _agree(self.expected_sha256, meta.get("expected_sha256"))
            and _agree(self.expected_size, meta.get("expected_size"))
            and _agree(self.expected_size, meta.get("total"))
            and isinstance(meta.get("done"), int)
        )
        if meta is None or not usable:
            if size:
                self.reset()
            return
        commit = meta.get("commit")
        self.commit = commit if isinstance(commit, str) and _COMMIT.match(commit) else self.commit
        if self.expected_sha256 is None and isinstance(meta.get("expected_sha256"), str):
            self.expected_sha256 = meta["expected_sha256"]
        if self.expected_size is None and isinstance(meta.get("expected_size"), int):
            self.expected_size = meta["expected_size"]
        etag = meta.get("etag")
        self.etag = etag if isinstance(etag, str) else None
        total = meta.get("total")
        if isinstance(total, int) and total >= 0:
            self.total = total
        offset = max(0, min(int(meta["done"]), size, self.total if self.total is not None else size))
        os.ftruncate(self.fd, offset)
        self.rehash(offset)

    def rehash(self, length: int) -> None:
        """Hashes the bytes already on disk (the fast path of a resume)."""
        self.reporter.total = self.total or 0
        self.reporter.done = length
        self.reporter.emit("verifying", f"checking the {length} bytes already downloaded")
        os.lseek(self.fd, 0, os.SEEK_SET)
        remaining = length
        while remaining:
            if self.cancel.is_set():
                raise Cancelled(f"{self.filename}: download cancelled; the partial file is kept for resume")
            chunk = os.read(self.fd, min(8 * _CHUNK, remaining))
            if not chunk:
                break
            self.hasher.update(chunk)
            remaining -= len(chunk)
        self.done = self.high_water = length - remaining
        os.ftruncate(self.fd, self.done)
        os.lseek(self.fd, self.done, os.SEEK_SET)
        self.reporter.done = self.done

    def check_space(self) -> None:
        if self.total is None or self.space_checked_for == self.total:
            return
        check_disk_space(self.folder, max(0, self.total - self.done) + self.disk_margin_bytes, self.filename)
        self.space_checked_for = self.total

    # --------------------------------------------------------------------------- the loop
    def run(self) -> DownloadResult:
        try:
            return self._run()
        finally:
            self.hasher.close()

    def _run(self) -> DownloadResult:
        self.load_resume_point()
        self.check_space()
        failures = 0
        checksum_retries = self.checksum_retries
        with Watchdog(self.cancel, self.pause, self.stall_timeout_s, self.reporter) as watchdog, self.writeback:
            while True:
                self.wait_while_paused()
                self.check_cancel()
                try:
                    complete = self.attempt_once(watchdog)
                except _Paused:
                    continue
                except _Retry as retry:
                    failures = 0 if retry.progressed else failures + 1
                    if failures > self.max_retries:
                        self.checkpoint(force=True)
                        raise DownloadError(
                            f"{self.filename}: {retry}; gave up after {self.max_retries} retries "
                            f"({self.done} of {self.total or '?'} bytes kept, download again to resume)"
                        ) from None
                    self.checkpoint(force=True)
                    wait = backoff_delay(failures or 1, self.backoff_s, self.max_backoff_s)
                    wait = max(wait, retry.wait_s or 0.0)
                    self.reporter.emit("retrying", f"{retry}; retrying in {wait:.1f} s")
                    self.sleep(wait)
                    continue
                if not complete:
                    continue
                if self.verify():
                    return self.finish()
                if checksum_retries <= 0:
                    raise DownloadError(self.mismatch_message + "; deleted, please retry")
                checksum_retries -= 1
                self.reporter.emit("retrying", self.mismatch_message + "; downloading it again")

    def check_cancel(self) -> None:
        if self.cancel.is_set():
            self.checkpoint(force=True)
            raise Cancelled(f"{self.filename}: download cancelled; {self.done} bytes kept, download again to resume")

    def wait_while_paused(self) -> None:
        if not self.pause.is_set():
            return
        self.checkpoint(force=True)
        self.reporter.emit("paused", "paused")
        while self.pause.is_set() and not self.cancel.is_set():
            self.cancel.wait(0.05)

    def sleep(self, seconds: float) -> None:
        """Waits out a backoff; cancel or pause end the wait early."""
        deadline = time.monotonic() + seconds
        while not self.cancel.is_set() and not self.pause.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.cancel.wait(min(left, 0.1))

    def attempt_once(self, watchdog: Watchdog) -> bool:
        """One request; True when every byte is in (or, with no known size, the body ended)."""
        self.attempt += 1
        self.reporter.attempt = self.attempt
        self.reporter.emit("connecting", f"connecting to {self.endpoint}")
        headers = {"Range": f"bytes={self.done}-"} if self.done else {}
        try:
            response = open_url(
                self.url(),
                endpoint=self.endpoint,
                headers=headers,
                timeout=2 * self.stall_timeout_s + 5,
                on_socket=watchdog.arm,
            )
        except OfflineError as exc:
            watchdog.disarm()
            if watchdog.reason in ("cancel", "pause"):
                self.check_cancel()
                raise _Paused from None
            if watchdog.reason == "stall":
                raise _Retry(f"no answer for {self.stall_timeout_s:g} s (stalled); reconnecting") from None
            raise _Retry(str(exc)) from None
        try:
            self.absorb_headers(response)
            body_total = self.check_status(response)
            if body_total is None:
                return True
            if self.total is None and body_total >= 0:
                self.total = body_total
            elif body_total >= 0 and body_total != self.total:
                self.size_mismatch(body_total)
            self.reporter.total = self.total or 0
            self.check_space()
            self.checkpoint(force=True)
            return self.stream(response, watchdog)
        finally:
            watchdog.disarm()
            response.close()

    def absorb_headers(self, response: HttpResponse) -> None:
        """Learns the commit, the LFS sha256 and size from the Hub's own (first-hop) headers."""
        first = response.first_headers
        commit = first.get("x-repo-commit", "").strip().lower()
        if _COMMIT.match(commit) and self.commit is None:
            self.commit = commit
        linked = first.get("x-linked-etag") or ""
        linked = linked.removeprefix("W/").strip().strip('"').lower()
        if SHA256_HEX.match(linked):
            if self.expected_sha256 is None:
                self.expected_sha256 = linked
            elif linked != self.expected_sha256:
                self.discard()
                raise DownloadError(
                    f"{self.filename}: the server's sha256 differs from the one expected: the repository "
                    "changed; refresh the file list and download again"
                )
        etag = linked or first.get("etag", "").removeprefix("W/").strip().strip('"')
        if etag and self.etag is not None and etag != self.etag and self.done:
            self.reset()
        self.etag = etag or self.etag
        linked_size = first.get("x-linked-size", "")
        if linked_size.isdigit():
            if self.total is None:
                self.total = int(linked_size)
            elif int(linked_size) != self.total:
                self.size_mismatch(int(linked_size))

    def size_mismatch(self, server_size: int) -> None:
        self.discard()
        raise DownloadError(
            f"{self.filename}: size mismatch: expected {self.total} bytes but the server has {server_size}; "
            "the repository changed or the mirror is broken; refresh and retry"
        )

    def check_status(self, response: HttpResponse) -> int | None:
        """Interprets the status and range headers. Returns the full file size (-1 if unknown),
        or None when the file turns out to be complete already.
        """
        status = response.status
        headers = response.headers
        if status == 416:
            match = re.match(r"bytes \*/(\d+)", headers.get("content-range", ""))
            if match and self.done == int(match.group(1)) and (self.total in (None, self.done)):
                self.total = self.done
                return None
            self.reset()
            raise _Retry("the server refused the resume point; starting over")
        if status in (401, 403, 404) or (status >= 400 and not is_retryable_status(status)):
            raise status_error(status, f"{self.repo}/{self.filename}", self.endpoint, headers)
        if is_retryable_status(status):
            error = status_error(status, f"{self.repo}/{self.filename}", self.endpoint, headers)
            raise _Retry(str(error), wait_s=retry_after_seconds(headers))
        if status == 200:
            if self.done:
                self.reporter.emit("retrying", "the server ignored the resume request; starting over")
                self.reset()
            length = headers.get("content-length", "")
            return int(length) if length.isdigit() else -1
        if status == 206:
            match = re.match(r"bytes (\d+)-(\d+)/(\d+|\*)", headers.get("content-range", ""))
            if match is None or int(match.group(1)) != self.done:
                self.reset()
                raise _Retry("the server sent the wrong part of the file; starting over")
            return int(match.group(3)) if match.group(3) != "*" else -1
        raise status_error(status, f"{self.repo}/{self.filename}", self.endpoint, headers)

    def stream(self, response: HttpResponse, watchdog: Watchdog) -> bool:
        """Copies the body to the partial file while hashing it."""
        body = response.body
        total = self.total
        reporter = self.reporter
        reporter.emit("downloading")
        while total is None or self.done < total:
            want = _CHUNK if total is None else min(_CHUNK, total - self.done)
            failure: BaseException | None = None
            try:
                chunk = body.read1(want)
            except (OSError, http.client.HTTPException) as exc:
                chunk, failure = b"", exc
            if not chunk:
                return self.stream_ended(watchdog, failure)
            watchdog.touch()
            self.write(chunk)
            self.writeback.wrote(len(chunk))
            self.hasher.update(chunk)
            self.done += len(chunk)
            reporter.done = self.done
            reporter.emit("downloading", force=False)
            self.checkpoint()
            if self.cancel.is_set() or self.pause.is_set():
                self.checkpoint(force=True)
                self.check_cancel()
                raise _Paused
        return True

    def stream_ended(self, watchdog: Watchdog, failure: BaseException | None) -> bool:
        # An attempt that only re-fetched bytes we had before (a server ignoring Range) is no
        # progress: otherwise such a server could keep us retrying forever.
        progressed = self.done - self.high_water >= _PROGRESS_BYTES
        self.high_water = max(self.high_water, self.done)
        self.checkpoint(force=True)
        reason = watchdog.reason
        if reason == "cancel" or self.cancel.is_set():
            self.check_cancel()
        if reason == "pause" or self.pause.is_set():
            raise _Paused
        if reason == "stall":
            raise _Retry(f"no data for {self.stall_timeout_s:g} s (stalled); reconnecting", progressed=progressed)
        if self.total is None and failure is None:
            return True
        got = f"{self.done} of {self.total} bytes" if self.total is not None else f"{self.done} bytes"
        raise _Retry(f"the connection dropped at {got}", progressed=progressed)

    def write(self, chunk: bytes) -> None:
        try:
            write_all(self.fd, chunk)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, self.done)
                os.lseek(self.fd, self.done, os.SEEK_SET)
            raise self.write_error(exc) from None

    def write_error(self, exc: OSError) -> DownloadError:
        """The one-line error for a failed write, sync or rename; the partial is kept for later."""
        with contextlib.suppress(OSError):
            self.save_meta()
        if exc.errno in _NO_SPACE:
            need = max(0, (self.total or self.done) - self.done) + self.disk_margin_bytes
            try:
                free = format_bytes(missing_space(self.folder, 0)[1])
            except OSError:
                free = "no space"
            return DownloadError(
                f"not enough disk space for {self.filename}: need {format_bytes(need)}, {free} "
                f"free on {self.folder} (the partial download is kept: free some space, then retry)"
            )
        return DownloadError(f"{self.partial}: cannot write: {exc.strerror or exc}")

    # ---------------------------------------------------------------------- the end
    mismatch_message = ""

    def verify(self) -> bool:
        self.reporter.emit("verifying", "checking the sha256")
        digest = self.hasher.hexdigest()
        size = os.fstat(self.fd).st_size
        if self.total is not None and size != self.total:
            self.mismatch_message = f"{self.filename}: size mismatch ({size} of {self.total} bytes)"
        elif self.expected_size is not None and size != self.expected_size:
            self.mismatch_message = (
                f"{self.filename}: size mismatch ({size} bytes, the repository lists {self.expected_size})"
            )
        elif self.expected_sha256 is not None and digest != self.expected_sha256:
            self.mismatch_message = (
                f"{self.filename}: checksum mismatch (expected sha256 {self.expected_sha256[:12]}…, got "
                f"{digest[:12]}…): the download was corrupted"
            )
        else:
            return True
        self.reset()
        with contextlib.suppress(FileNotFoundError):
            self.meta_path.unlink()
        return False

    def discard(self) -> None:
        self.reset()
        with contextlib.suppress(FileNotFoundError):
            self.meta_path.unlink()

    def finish(self) -> DownloadResult:
        digest = self.hasher.hexdigest()
        try:
            # Delayed allocation can report a full disk only here.
            os.fsync(self.fd)
            if sys.platform == "win32":
                os.close(self.fd)  # Windows cannot rename an open file
            os.replace(self.partial, self.final)
        except OSError as exc:
            raise self.write_error(exc) from None
        fsync_dir(self.folder)
        with contextlib.suppress(FileNotFoundError):
            self.meta_path.unlink()
        self.reporter.emit("done", str(self.final))
        return DownloadResult(self.final, digest, self.done, self.repo, self.commit or self.revision)


def hash_file(path: Path, cancel: threading.Event) -> str:
    """The sha256 of the file at ``path``, hex; raises ``Cancelled`` once ``cancel`` is set."""
    hasher = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(8 * _CHUNK):
            if cancel.is_set():
                raise Cancelled(f"{path}: cancelled")
            hasher.update(chunk)
    return hasher.hexdigest()
