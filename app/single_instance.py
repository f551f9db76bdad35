"""One Glassbox per data folder (ROBUSTNESS.md 4.1.5, P4).

The first instance holds a ``QLockFile`` in the data folder and listens on a ``QLocalServer`` named
after that folder. A second launch fails to take the lock, tells the first one to raise its window,
and exits before touching any data. A lock left by a crashed process is stale (its PID is gone) and
is removed by ``QLockFile`` itself.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from PySide6.QtCore import QLockFile, QObject, Signal, Slot
from PySide6.QtNetwork import QLocalServer, QLocalSocket

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
    """

    activation_requested = Signal()

    def __init__(self, lock_path: Path, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.lock_path = lock_path
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = QLockFile(str(lock_path))
        self._lock.setStaleLockTime(0)
        self._server: QLocalServer | None = None
        self.name = server_name(lock_path)

    def acquire(self) -> bool:
        """Takes the lock and starts listening; False when another instance holds it."""
        if not self._lock.tryLock(100):
            if self._lock.error() == QLockFile.LockError.LockFailedError and self._lock.removeStaleLockFile():
                if not self._lock.tryLock(100):
                    return False
            else:
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
