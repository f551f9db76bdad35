"""A full disk while the settings are saved (ROBUSTNESS P8): the previous file is intact, no
temporary file is left beside it, and the error is one line naming the settings file and the reason.

The disk fills inside the atomic write: each step of it in turn (the write of the text, the flush to
disk, the rename) raises ``OSError(ENOSPC)`` as the kernel would. Bound: one small file per case.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from app import settings as settings_mod
from app.gui.tasks import describe_error
from app.settings import Settings, load_settings, save_settings


def _no_space(*_args: Any, **_kwargs: Any) -> Any:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class _FullFile:
    """A file object whose every write fails as on a full disk."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def write(self, _data: str) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __enter__(self) -> _FullFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._inner.close()


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, Settings, bytes]:
    path = tmp_path / "config" / "settings.json"
    before = Settings(n_ctx=8192, theme="dark", default_system_prompt="Answer briefly.")
    save_settings(before, path)
    return path, before, path.read_bytes()


@pytest.mark.parametrize("step", ["write", "fsync", "replace"])
def test_a_full_disk_keeps_the_old_settings_and_says_so_in_one_line(
    saved: tuple[Path, Settings, bytes], monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    path, before, old_bytes = saved
    if step == "write":  # engine.atomic writes through os.fdopen
        real_fdopen = os.fdopen
        monkeypatch.setattr(settings_mod.os, "fdopen", lambda *a, **k: _FullFile(real_fdopen(*a, **k)))
    elif step == "fsync":
        monkeypatch.setattr(settings_mod.os, "fsync", _no_space)
    else:
        monkeypatch.setattr(settings_mod.os, "replace", _no_space)

    with pytest.raises(OSError, match="No space left on device") as caught:
        save_settings(Settings(n_ctx=1024, theme="light"), path)
    monkeypatch.undo()

    assert caught.value.errno == errno.ENOSPC
    line = describe_error(caught.value)
    assert line == f"{path}: No space left on device"
    assert "\n" not in line
    assert path.read_bytes() == old_bytes  # the previous file, byte for byte
    assert load_settings(path).settings == before
    assert [p.name for p in path.parent.iterdir()] == ["settings.json"]  # no temporary file left


def test_an_unwritable_folder_names_the_settings_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "settings.json"

    def refuse(*_args: Any, **_kwargs: Any) -> int:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(tmp_path / ".settings.json.tmp-1"))

    monkeypatch.setattr(settings_mod.os, "open", refuse)
    with pytest.raises(PermissionError) as caught:
        save_settings(Settings(), path)
    monkeypatch.undo()
    assert describe_error(caught.value) == f"{path}: Permission denied"
    assert not path.exists()
