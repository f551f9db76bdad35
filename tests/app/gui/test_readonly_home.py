"""A read-only home: the GUI and every subcommand say "the data folder <path> is read-only" in one
line and exit with code 1; never "another Glassbox holds this data folder", never a traceback.

The real checks run ``glassbox`` in a child process on a folder that is really read-only: its mode
(0555) for an ordinary user; for root, whom modes do not stop, a read-only bind mount of it in a
private mount namespace (``unshare``), which stops root too. They are skipped only where root has
no mount namespaces. The simulated checks, which run everywhere, raise the error a read-only file
system gives (EROFS, EACCES) at the call that meets it.
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from app.cli.main import main
from app.paths import Paths, ReadOnlyFolder

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX permissions and mounts")

ROOT = Path(__file__).resolve().parents[3]
_MOUNT_READ_ONLY = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'


def _error(folder: Path) -> str:
    return f"glassbox: error: the data folder {folder} is read-only"


@functools.cache
def _root_can_mount_read_only() -> bool:
    """Whether ``unshare`` gives this root a mount namespace where a read-only bind mount works."""
    if shutil.which("unshare") is None:
        return False
    with tempfile.TemporaryDirectory() as folder:
        try:
            probe = subprocess.run(
                [
                    "unshare",
                    "--mount",
                    "--propagation",
                    "private",
                    "sh",
                    "-c",
                    _MOUNT_READ_ONLY,
                    "sh",
                    folder,
                    "sh",
                    "-c",
                    f'! touch "{folder}/probe" 2>/dev/null',
                ],
                capture_output=True,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        return probe.returncode == 0 and not Path(folder, "probe").exists()


def _tree(folder: Path) -> list[Path]:
    return [folder, *(p for p in folder.rglob("*") if p.is_dir())]


def run_read_only(folder: Path, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Runs ``argv`` (a Python program) in a child while ``folder`` and everything in it are read-only."""
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(ROOT)}
    env.pop("GLASSBOX_HOME", None)
    command = [sys.executable, *argv]
    if os.geteuid() != 0:
        folders = _tree(folder)
        for each in folders:
            each.chmod(0o555)
        try:
            return subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
        finally:
            for each in folders:
                each.chmod(0o700)
    if not _root_can_mount_read_only():
        pytest.skip("running as root, whom chmod 0555 does not stop, and no mount namespace for a read-only mount")
    command = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        _MOUNT_READ_ONLY,
        "sh",
        str(folder),
        *command,
    ]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)


def _only_error_line(result: subprocess.CompletedProcess[str], expected: str) -> None:
    assert "Traceback" not in result.stderr
    assert "another Glassbox" not in result.stderr
    said = [line for line in result.stderr.splitlines() if line.startswith("glassbox:")]
    assert said == [expected]
    assert result.returncode == 1


# ----------------------------------------------------------------------------- real


def test_subcommand_on_a_read_only_home_says_so_and_exits_1(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()  # empty: the first folder to create is refused
    result = run_read_only(home, ["-m", "app", "--home", str(home), "kb", "list"])
    _only_error_line(result, _error(home))
    assert list(home.iterdir()) == []


def test_gui_on_a_read_only_home_with_logs_missing_says_so_and_exits_1(tmp_path: Path) -> None:
    home = tmp_path / "home"
    paths = Paths.resolve(home).ensure()
    paths.logs.rmdir()
    result = run_read_only(home, ["-m", "app", "--home", str(home)])
    _only_error_line(result, _error(paths.data))
    assert not paths.lock_file.exists()


def test_lock_in_a_read_only_folder_is_not_taken_for_another_instance(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    script = f"""
import sys
from pathlib import Path
from app.gui.single_instance import SingleInstance
try:
    acquired = SingleInstance(Path({str(data / "glassbox.lock")!r})).acquire()
except OSError as exc:  # ReadOnlyFolder is one
    print(f"glassbox: error: {{exc}}", file=sys.stderr)
    sys.exit(1)
print(f"glassbox: acquire() returned {{acquired}}", file=sys.stderr)
"""
    result = run_read_only(data, ["-c", script])
    _only_error_line(result, _error(data))


# ----------------------------------------------------------------------------- simulated


@pytest.fixture
def refuse_writes(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``refuse(folder, errno)``: from now on, creating anything under ``folder`` or writing to it
    fails as on a read-only file system (the calls ``Paths.ensure`` makes: ``mkdir``, ``access``)."""
    refused: dict[Path, int] = {}
    real_mkdir = Path.mkdir
    real_access = os.access

    def under(path: Path) -> int | None:
        for folder, code in refused.items():
            if path == folder or folder in path.parents:
                return code
        return None

    def mkdir(self: Path, mode: int = 0o777, parents: bool = False, exist_ok: bool = False) -> None:
        code = under(self.absolute())
        if code is not None and not (exist_ok and self.is_dir()):
            raise OSError(code, os.strerror(code), str(self))
        real_mkdir(self, mode, parents, exist_ok)

    def access(path: Any, mode: int, **kwargs: Any) -> bool:
        if mode & os.W_OK and under(Path(path).absolute()) is not None:
            return False
        return real_access(path, mode, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    monkeypatch.setattr(os, "access", access)

    def refuse(folder: Path, code: int = errno.EROFS) -> None:
        refused[folder.absolute()] = code

    return refuse


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES], ids=["EROFS", "EACCES"])
def test_simulated_subcommand_on_a_read_only_home(
    tmp_path: Path, refuse_writes: Any, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    refuse_writes(home, code)
    with pytest.raises(ReadOnlyFolder) as caught:
        Paths.resolve(home).ensure()
    assert str(caught.value) == f"the data folder {home} is read-only"
    assert main(["--home", str(home), "kb", "list"]) == 1
    assert capsys.readouterr().err.splitlines() == [_error(home)]


def test_simulated_subcommand_with_existing_read_only_folders(
    tmp_path: Path, refuse_writes: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    paths = Paths.resolve(home).ensure()
    refuse_writes(home)
    assert main(["--home", str(home), "endpoints", "list"]) == 1
    assert capsys.readouterr().err.splitlines() == [_error(paths.data)]


@pytest.mark.gui
def test_simulated_gui_start_with_logs_missing(
    qapp: Any, tmp_path: Path, refuse_writes: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.gui.launch import run_gui

    home = tmp_path / "home"
    paths = Paths.resolve(home).ensure()
    paths.logs.rmdir()
    refuse_writes(paths.logs, errno.EACCES)  # only creating logs/ fails, as in the report
    names = (qapp.applicationName(), qapp.organizationName(), qapp.desktopFileName())
    try:
        assert run_gui(paths) == 1
    finally:
        qapp.setApplicationName(names[0])
        qapp.setOrganizationName(names[1])
        qapp.setDesktopFileName(names[2])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines() == [_error(home)]  # where logs/ could not be made


@pytest.mark.gui
def test_simulated_lock_that_cannot_be_created(tmp_path: Path) -> None:
    from PySide6.QtCore import QLockFile

    from app.gui.single_instance import SingleInstance

    class RefusedLock:
        """What QLockFile reports when open(O_CREAT) fails with EACCES or EROFS."""

        def tryLock(self, timeout: int) -> bool:  # Qt's names
            return False

        def error(self) -> QLockFile.LockError:
            return QLockFile.LockError.PermissionError

        def removeStaleLockFile(self) -> bool:
            raise AssertionError("a lock that could not be created is not stale")

        def isLocked(self) -> bool:
            return False

    instance = SingleInstance(tmp_path / "data" / "glassbox.lock")
    instance._lock = RefusedLock()  # type: ignore[assignment]
    with pytest.raises(ReadOnlyFolder, match=r"^the data folder .*/data is read-only$"):
        instance.acquire()
