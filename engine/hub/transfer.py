"""The moving parts of one transfer, each small and testable on its own.

``Reporter`` turns byte counts into throttled ``DownloadProgress`` reports with a moving-average
speed and an ETA (and keeps reporting while no bytes arrive, so a stall shows as falling speed,
not a frozen one). ``Watchdog`` is a thread that shuts the socket down on cancel, pause or a stall,
which wakes a blocked read at once. ``BackgroundHasher`` and ``BackgroundSync`` move sha256 and
fdatasync off the download loop (both release the GIL), so verifying and durability cost little
throughput.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

DownloadState = Literal["connecting", "downloading", "paused", "retrying", "verifying", "done"]
_PROGRESS_INTERVAL_S = 0.1
_SPEED_WINDOW_S = 5.0


@dataclass(frozen=True)
class DownloadProgress:
    """One progress report.

    ``total`` is 0 while unknown; ``eta_s`` is None while the speed is unknown or zero;
    ``attempt`` counts connection attempts (1 for the first). ``state`` is ``paused`` while the
    pause event holds the transfer.
    """

    filename: str
    done: int
    total: int
    speed_bps: float
    eta_s: float | None
    state: DownloadState
    attempt: int
    message: str = ""


ProgressCallback = Callable[[DownloadProgress], None]


class Reporter:
    """Turns byte counts into throttled ``DownloadProgress`` calls with a moving-average speed."""

    def __init__(self, filename: str, callback: ProgressCallback | None) -> None:
        self.filename = filename
        self.callback = callback
        self.samples: deque[tuple[float, int]] = deque()
        self.last_emit = 0.0
        self.lock = threading.Lock()
        self.state: DownloadState = "connecting"
        self.done = 0
        self.total = 0
        self.attempt = 1

    def speed(self, now: float) -> float:
        """Bytes per second over the last few seconds (0 until there is a fair sample)."""
        while self.samples and now - self.samples[0][0] > _SPEED_WINDOW_S:
            self.samples.popleft()
        if not self.samples:
            return 0.0
        t0, d0 = self.samples[0]
        return (self.done - d0) / (now - t0) if now - t0 > 0.2 else 0.0

    def emit(self, state: DownloadState, message: str = "", *, force: bool = True) -> None:
        """Reports ``state``; unforced ``downloading`` reports are throttled to about 10 a second."""
        now = time.monotonic()
        with self.lock:
            if state == "downloading":
                self.samples.append((now, self.done))
            else:
                self.samples.clear()
            if not force and state == self.state and now - self.last_emit < _PROGRESS_INTERVAL_S:
                return
            self.state = state
            self.last_emit = now
            if self.callback is None:
                return
            speed = self.speed(now) if state == "downloading" else 0.0
            eta = (self.total - self.done) / speed if speed > 0 and self.total >= self.done else None
            report = DownloadProgress(self.filename, self.done, self.total, speed, eta, state, self.attempt, message)
            self.callback(report)

    def idle_tick(self) -> None:
        """Called by the watchdog while no bytes arrive: the shown speed decays instead of freezing."""
        if self.state == "downloading" and time.monotonic() - self.last_emit >= 1.0:
            self.emit("downloading", "waiting for data")


class Watchdog:
    """A thread that shuts the current socket down on cancel, pause or a stall.

    Shutting the socket down wakes a blocked read at once (it returns EOF); ``reason`` then says
    why the stream ended.
    """

    def __init__(self, cancel: threading.Event, pause: threading.Event, stall_s: float, reporter: Reporter) -> None:
        self.cancel = cancel
        self.pause = pause
        self.stall_s = stall_s
        self.reporter = reporter
        self.lock = threading.Lock()
        self.sock: Any = None
        self.last_byte = time.monotonic()
        self.reason: str | None = None
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="download-watchdog", daemon=True)

    def __enter__(self) -> Watchdog:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join()

    def arm(self, sock: object) -> None:
        with self.lock:
            self.sock = sock
            self.reason = None
            self.last_byte = time.monotonic()

    def disarm(self) -> None:
        with self.lock:
            self.sock = None

    def touch(self) -> None:
        self.last_byte = time.monotonic()

    def _run(self) -> None:
        interval = min(0.05, self.stall_s / 4)
        while not self.stopped.wait(interval):
            with self.lock:
                if self.sock is None:
                    continue
                if self.cancel.is_set():
                    reason = "cancel"
                elif self.pause.is_set():
                    reason = "pause"
                elif time.monotonic() - self.last_byte > self.stall_s:
                    reason = "stall"
                else:
                    reason = None
                if reason is not None:
                    self.reason = reason
                    self._cut()
                    continue
            try:
                self.reporter.idle_tick()
            except Exception:  # noqa: BLE001 - a failing progress callback must not kill the watchdog
                continue

    def _cut(self) -> None:
        # lazy: start-up (+10 ms)
        import socket

        sock, self.sock = self.sock, None
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class BackgroundHasher:
    """sha256 in a helper thread, so hashing overlaps the network and the disk.

    ``hashlib`` releases the GIL on large buffers; the bounded queue keeps memory to a few
    chunks. ``hexdigest`` waits for the queue to drain; ``close`` abandons the work.
    """

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=8)
        self._thread = threading.Thread(target=self._run, name="download-sha256", daemon=True)
        self._thread.start()
        self._digest: str | None = None

    def _run(self) -> None:
        while (chunk := self._queue.get()) is not None:
            self._hash.update(chunk)

    def update(self, chunk: bytes) -> None:
        self._queue.put(chunk)

    def hexdigest(self) -> str:
        if self._digest is None:
            self._queue.put(None)
            self._thread.join()
            self._digest = self._hash.hexdigest()
        return self._digest

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()


class BackgroundSync:
    """Writes the partial file back to disk in a helper thread while the download runs.

    The download loop calls ``wrote`` after each write; once a few MiB are dirty the thread
    flushes them (``fdatasync`` releases the GIL), so disk writeback overlaps the network and
    the final fsync before the rename only has the last few MiB left. Without it that fsync
    wrote the whole file at once: 0.33 s of a 0.72 s loopback download of 200 MiB here.
    """

    def __init__(self, fd: int, *, dirty_bytes: int = 4 << 20, interval_s: float = 1.0) -> None:
        self._fd = fd
        self._dirty_limit = dirty_bytes
        self._interval_s = interval_s
        self._dirty = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="download-sync", daemon=True)

    def __enter__(self) -> BackgroundSync:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join()

    def wrote(self, n: int) -> None:
        """Counts ``n`` more dirty bytes; wakes the thread once enough are waiting."""
        self._dirty += n
        if self._dirty >= self._dirty_limit:
            self._dirty = 0
            self._wake.set()

    def _run(self) -> None:
        sync = getattr(os, "fdatasync", os.fsync)
        while True:
            self._wake.wait(self._interval_s)
            if self._stop.is_set():
                return
            self._wake.clear()
            try:
                sync(self._fd)
            except OSError:
                return
