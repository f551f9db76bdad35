"""Quantizing onto a disk that is full, or fills up while llama.cpp writes.

Up front, the expected size is checked against the free space (the downloads' check); when the
disk fills anyway, llama.cpp's "basic_ios::clear: iostream error", an ENOSPC from the child or
from the final flush all become the same line: ``the disk is full: N.N MiB more are needed on
<folder>``. The child is faked where the failure is injected; one test fills a real small tmpfs,
where ``mount -t tmpfs`` works (root on Linux), and is skipped with the reason elsewhere.
"""

from __future__ import annotations

import errno
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tiny_models import write_tiny_llama_gguf

import engine.convert.quantize as quantize
from engine.convert.quantize import ChildOutcome, find_quant_type, quantize_model
from engine.errors import QuantizeError
from engine.gguf import read_gguf_info
from engine.units import format_bytes
from tests.disk_support import mounted_tmpfs

MIB = 2**20
MARGIN = 64 * MIB
IOSTREAM = "llama_model_quantize: failed to quantize: basic_ios::clear: iostream error"


@pytest.fixture(scope="module")
def tiny_f32(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama_gguf(tmp_path_factory.mktemp("tiny") / "tiny-F32.gguf", dtype="F32")


@pytest.fixture
def out(tmp_path: Path) -> Path:
    folder = tmp_path / "out"
    folder.mkdir()
    return folder


def needed_for(src: Path, qtype: str) -> int:
    """What ``quantize_model`` expects the output to take (before its margin)."""
    return int(find_quant_type(qtype).estimate_bytes(read_gguf_info(src).n_params) * 1.05)


def mib(n: int) -> str:
    return format_bytes(n)


class Volume:
    """``shutil.disk_usage`` for ``folder``: ``free`` bytes (other folders answer for real)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, folder: Path, free: int) -> None:
        self.folder = folder
        self.free = free
        real = shutil.disk_usage

        def usage(path: Any) -> Any:
            if Path(path) == folder:
                return shutil._ntuple_diskusage(100 * 2**30, 100 * 2**30 - self.free, self.free)  # type: ignore[attr-defined]
            return real(path)

        monkeypatch.setattr(shutil, "disk_usage", usage)


def fake_child(
    monkeypatch: pytest.MonkeyPatch,
    volume: Volume,
    *,
    write: int,
    free_after: int,
    exitcode: int = 3,
    error: str | None = "SystemExit: exit code 3",
    log: tuple[str, ...] = (IOSTREAM,),
    tensors: tuple[int, int] = (10, 21),
) -> list[Path]:
    """Replaces the quantize child: it writes ``write`` bytes of output, leaves ``free_after`` free,
    reports ``tensors`` progress and ends as told. Returns the output paths it was given."""
    given: list[Path] = []

    def child(target: Any, args: Any, *, on_line: Any = None, cancel: Any = None, **_kw: Any) -> ChildOutcome:
        tmp = Path(args[1])
        given.append(tmp)
        tmp.write_bytes(b"\0" * write)
        done, total = tensors
        lines = [
            f"[{i:4d}/{total:4d}] blk.{i}.attn_q.weight - [256, 256, 1, 1], type = f32, converting"
            for i in range(1, done + 1)
        ]
        for line in lines:
            on_line(line)
        volume.free = free_after
        return ChildOutcome(exitcode, None, error, [*lines[-3:], *log])

    monkeypatch.setattr(quantize, "run_logged_child", child)
    return given


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text and "Traceback" not in text
    return text


def test_the_up_front_check_says_how_much_more_is_needed(
    tiny_f32: Path, out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    free = 10 * MIB
    Volume(monkeypatch, out, free)
    needed = needed_for(tiny_f32, "Q8_0")
    with pytest.raises(QuantizeError) as err:
        quantize_model(tiny_f32, out / "o.gguf", "Q8_0")
    text = one_line(err.value)
    assert f"the disk is full: {mib(needed + MARGIN - free)} more are needed on {out}" in text
    assert f"{mib(free)} free" in text
    assert list(out.iterdir()) == []  # nothing started


def test_an_iostream_error_on_a_disk_that_filled_says_the_disk_is_full(
    tiny_f32: Path, out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    volume = Volume(monkeypatch, out, 10 * 2**30)  # room up front; someone else fills it meanwhile
    given = fake_child(monkeypatch, volume, write=3 * MIB, free_after=4096)
    needed = needed_for(tiny_f32, "Q8_0")
    with pytest.raises(QuantizeError) as err:
        quantize_model(tiny_f32, out / "o.gguf", "Q8_0")
    text = one_line(err.value)
    # The output had what it wrote plus what is free; the share written says it needs 21/10 of it.
    whole = max(needed, 3 * MIB * 21 // 10)
    missing = whole + MARGIN - 3 * MIB - 4096
    assert text == (
        f"{tiny_f32}: quantization to Q8_0 failed after 10 of 21 tensors: "
        f"the disk is full: {mib(missing)} more are needed on {out}; no file was written"
    )
    assert "basic_ios" not in text
    assert given and not given[0].exists()  # the partial output is gone
    assert list(out.iterdir()) == []


def test_enospc_said_by_the_child_is_the_same_message_even_with_room_now(
    tiny_f32: Path, out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    volume = Volume(monkeypatch, out, 10 * 2**30)
    fake_child(
        monkeypatch, volume, write=MIB, free_after=10 * 2**30, exitcode=1,
        error="OSError: [Errno 28] No space left on device", log=("OSError: [Errno 28] No space left on device",),
    )  # fmt: skip
    with pytest.raises(QuantizeError) as err:
        quantize_model(tiny_f32, out / "o.gguf", "Q8_0")
    where = re.escape(str(out))
    said = one_line(err.value)
    assert re.search(rf"after 10 of 21 tensors: the disk is full: [\d.]+ MiB more are needed on {where}", said), said
    assert list(out.iterdir()) == []


def test_an_iostream_error_with_room_to_spare_is_reported_as_it_was(
    tiny_f32: Path, out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    volume = Volume(monkeypatch, out, 10 * 2**30)
    fake_child(monkeypatch, volume, write=MIB, free_after=10 * 2**30)  # not a full disk: an I/O error
    with pytest.raises(QuantizeError) as err:
        quantize_model(tiny_f32, out / "o.gguf", "Q8_0")
    text = one_line(err.value)
    assert text.endswith("failed after 10 of 21 tensors: basic_ios::clear: iostream error")
    assert "disk is full" not in text


def test_enospc_on_the_final_flush_is_the_same_message(
    tiny_f32: Path, out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    volume = Volume(monkeypatch, out, 10 * 2**30)

    def child(target: Any, args: Any, **_kw: Any) -> ChildOutcome:
        shutil.copyfile(tiny_f32, args[1])  # a whole, readable GGUF with the right tensors
        volume.free = 0
        return ChildOutcome(0, 0, None, [])

    def flush(_path: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(quantize, "run_logged_child", child)
    monkeypatch.setattr(quantize, "_fsync", flush)
    with pytest.raises(QuantizeError) as err:
        quantize_model(tiny_f32, out / "o.gguf", "Q8_0")
    text = one_line(err.value)
    assert text.startswith(f"{tiny_f32}: quantization to Q8_0 failed while saving: the disk is full: ")
    assert f"MiB more are needed on {out}; no file was written" in text
    assert list(out.iterdir()) == []


def test_another_os_error_on_the_final_flush_is_not_called_a_full_disk(
    tiny_f32: Path, out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def child(target: Any, args: Any, **_kw: Any) -> ChildOutcome:
        shutil.copyfile(tiny_f32, args[1])
        return ChildOutcome(0, 0, None, [])

    def flush(_path: Path) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(quantize, "run_logged_child", child)
    monkeypatch.setattr(quantize, "_fsync", flush)
    with pytest.raises(OSError, match="Input/output error") as err:
        quantize_model(tiny_f32, out / "o.gguf", "Q8_0")
    assert not isinstance(err.value, QuantizeError)
    assert list(out.iterdir()) == []


# ---------------------------------------------------------------------------- a real full tmpfs
@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 512 KiB tmpfs (the tiny model's Q8_0 needs about 1.6 MB), where mounting one works."""
    yield from mounted_tmpfs(tmp_path, "512k", "0755")


@pytest.mark.model
def test_llama_cpp_on_a_real_disk_that_fills_says_the_disk_is_full(
    tiny_f32: Path, small_tmpfs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As if the disk filled after the check passed: the check is skipped, llama.cpp meets the full disk.
    monkeypatch.setattr(quantize, "check_free_space", lambda _folder, _needed: None)
    with pytest.raises(QuantizeError) as err:
        quantize_model(tiny_f32, small_tmpfs / "o.gguf", "Q8_0", threads=1)
    text = one_line(err.value)
    where = re.escape(str(small_tmpfs))
    assert re.search(rf"the disk is full: [\d.]+ MiB more are needed on {where}; no file was written$", text), text
    assert "basic_ios" not in text
    assert list(small_tmpfs.iterdir()) == []
