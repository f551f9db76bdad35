"""One Glassbox per data folder (ROBUSTNESS.md 4.1.5, P4).

The first instance holds a ``QLockFile`` in the data folder and listens on a ``QLocalServer`` named
after that folder. A second launch fails to take the lock, tells the first one to raise its window,
and exits before touching any data. A lock left by a crashed process is stale (its PID is gone) and
is removed by ``QLockFile`` itself. A lock that cannot be created at all (a read-only data folder)
is an error, never taken for another instance.

The app takes the lock before its first frame and listens after it (``acquire(listen=False)``, then
:meth:`SingleInstance.listen`: Qt's network module and the name's hash are not on the way to the
first frame); a second launch in between keeps trying to reach the first for a while
(:meth:`SingleInstance.notify_running`), so it still raises that window.
"""

from __future__ import annotations

import errno
import functools
import time
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QLockFile, QObject, Signal, Slot

from app.paths import ReadOnlyFolder

if TYPE_CHECKING:
    from PySide6.QtNetwork import QLocalServer

ACTIVATE = b"activate\n"


def server_name(lock_path: Path) -> str:
    """A local-socket name unique to a data folder (short enough for every OS)."""
    import hashlib  # lazy: start-up (the name is needed once the first frame is shown)

    digest = hashlib.sha256(str(lock_path.resolve()).encode()).hexdigest()[:16]
    return f"glassbox-{digest}"


class SingleInstance(QObject):
    """Holds the lock and answers "raise your window" requests.

    Args:
        lock_path: ``paths.lock_file``.

    Signals:
        activation_requested(): another launch asked this instance to come forward.

    Raises:
        ReadOnlyFolder: the lock's folder cannot be created.
    """

    activation_requested = Signal()

    def __init__(self, lock_path: Path, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.lock_path = lock_path
        try:
            lock_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise ReadOnlyFolder(lock_path.parent) from exc
            raise
        self._lock = QLockFile(str(lock_path))
        self._lock.setStaleLockTime(0)
        self._server: QLocalServer | None = None

    @functools.cached_property
    def name(self) -> str:
        """The local socket's name (:func:`server_name`: a hash of the resolved path, made once)."""
        return server_name(self.lock_path)

    def acquire(self, listen: bool = True) -> bool:
        """Takes the lock and, unless ``listen`` is false (then :meth:`listen` later), starts
        listening; False when another instance holds it.

        Raises:
            ReadOnlyFolder: the lock file cannot be created for lack of permission (a read-only
                data folder): no other instance is involved.
            OSError: it cannot be created for another reason.
        """
        locked = self._lock.tryLock(100)
        held = not locked and self._lock.error() == QLockFile.LockError.LockFailedError
        if held and self._lock.removeStaleLockFile():
            locked = self._lock.tryLock(100)
        if not locked:
            error = self._lock.error()
            if error == QLockFile.LockError.PermissionError:
                raise ReadOnlyFolder(self.lock_path.parent)
            if error == QLockFile.LockError.UnknownError:
                raise OSError(errno.EIO, "the lock file cannot be created", str(self.lock_path))
            return False
        if listen:
            self.listen()
        return True

    def listen(self) -> None:
        """Answers other launches from now on (the lock is held: :meth:`acquire`)."""
        from PySide6.QtNetwork import QLocalServer  # lazy: start-up (after the first frame)

        if self._server is not None or not self._lock.isLocked():
            return
        name = self.name
        server = QLocalServer(self)
        QLocalServer.removeServer(name)  # a socket file left by a crash
        server.listen(name)
        server.newConnection.connect(self._on_server_new_connection)
        self._server = server

    @Slot()
    def _on_server_new_connection(self) -> None:
        assert self._server is not None
        while self._server.hasPendingConnections():
            socket = self._server.nextPendingConnection()
            socket.waitForReadyRead(200)
            data = bytes(socket.readAll().data())
            socket.disconnectFromServer()
            if data.startswith(ACTIVATE.strip()):
                self.activation_requested.emit()

    def notify_running(self, timeout_ms: int = 3000) -> bool:
        """Asks the running instance to raise its window. True when it answered within
        ``timeout_ms`` (it listens once its window is shown: until then, this tries again)."""
        from PySide6.QtNetwork import QLocalSocket  # lazy: start-up (a second launch only)

        name = self.name
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            socket = QLocalSocket()
            socket.connectToServer(name)
            left_ms = max(int((deadline - time.monotonic()) * 1000), 1)
            if socket.waitForConnected(min(left_ms, 250)):
                break
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        socket.write(ACTIVATE)
        socket.waitForBytesWritten(timeout_ms)
        socket.disconnectFromServer()
        return True

    def release(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._lock.isLocked():
            self._lock.unlock()
