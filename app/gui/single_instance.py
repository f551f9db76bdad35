"""One Glassbox per data folder (ROBUSTNESS.md 4.1.5, P4).

The first instance holds a ``QLockFile`` in the data folder and listens on a ``QLocalServer`` named
after that folder. A second launch fails to take the lock, tells the first one to raise its window,
and exits before touching any data. A lock left by a crashed process is stale (its PID is gone) and
is removed by ``QLockFile`` itself. A lock that cannot be created at all (a read-only data folder)
is an error, never taken for another instance.
"""

from __future__ import annotations

import errno
import hashlib
from pathlib import Path

from PySide6.QtCore import QLockFile, QObject, Signal, Slot
from PySide6.QtNetwork import QLocalServer, QLocalSocket

from app.paths import ReadOnlyFolder

ACTIVATE = b"activate\n"


def server_name(lock_path: Path) -> str:
    """A local-socket name unique to a data folder (short enough for every OS)."""
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
        self.name = server_name(lock_path)

    def acquire(self) -> bool:
        """Takes the lock and starts listening; False when another instance holds it.

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
        server = QLocalServer(self)
        QLocalServer.removeServer(self.name)  # a socket file left by a crash
        server.listen(self.name)
        server.newConnection.connect(self._on_server_new_connection)
        self._server = server
        return True

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

    def notify_running(self, timeout_ms: int = 1000) -> bool:
        """Asks the running instance to raise its window. True when it answered."""
        socket = QLocalSocket()
        socket.connectToServer(self.name)
        if not socket.waitForConnected(timeout_ms):
            return False
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
