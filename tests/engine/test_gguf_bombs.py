"""Hostile GGUF files, second round: each ends in a one-line error or a bounded, correct result.

Every test states its bound, as work counted, never as time, so a busy machine does not fail it:
the reader's look-ups, bytes read and strings walked (:func:`read_work`); memory is the
``tracemalloc`` peak in-process, or the child's peak RSS for the command line. A child's timeout is
only a hang guard. The large files are sparse: gigabytes apparent, a few
hundred KB on disk. A named pipe would hang an in-process test until the global timeout, so every
pipe test runs in a child with its own timeout.

Measured on the 2-core dev machine, before -> after (see each test for its bound):

* named pipe: ``models info``, ``models fit``, ``chat`` blocked until killed -> exit 1 in ~0.3 s;
* 64 strings of 16 MiB: ``models info`` 1064 MiB peak RSS, ``models fit`` 1065 MiB, the scan
  +1041 MiB -> 25 MiB, 47 MiB, +1 MiB;
* 512 MiB sparse header claiming 65,536 keys of 2^24-string arrays: 10.5 s CPU -> 0.002 s.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from gguf_fixtures import (
    ARRAY,
    F32,
    INT32,
    STRING,
    TEMPLATE,
    UINT8,
    UINT32,
    default_kvs,
    default_tensors,
    gstr,
    kv,
    nbytes,
    pad,
    tensor_info,
    u32,
    u64,
)

from engine import gguf
from engine.errors import ModelFileError
from engine.gguf import GgufInfo, read_gguf_info
from engine.gguf_file import sniff_model_file
from engine.gguf_reader import HeaderReader
from engine.library import ModelLibrary

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20
Piece = bytes | int  # bytes are written; an int is a hole of that many zero bytes


# ------------------------------------------------------------------ helpers
def sparse_gguf(
    path: Path,
    kv_pieces: Sequence[Piece],
    n_kv: int,
    tensors: Sequence[tuple[str, Sequence[int], int]] = (),
    *,
    size: int | None = None,
) -> Path:
    """A GGUF whose key/value section is ``kv_pieces``, then ``tensors`` with their data as a hole."""
    with path.open("wb") as fh:
        fh.write(b"GGUF" + u32(3) + u64(len(tensors)) + u64(n_kv))
        for piece in kv_pieces:
            if isinstance(piece, int):
                fh.seek(piece, os.SEEK_CUR)
            else:
                fh.write(piece)
        at = 0
        for name, dims, ttype in tensors:
            fh.write(tensor_info(name, dims, ttype, at))
            at += pad(nbytes(dims, ttype))
        here = fh.tell()
        fh.truncate(size if size is not None else pad(here) + at)
    if path.stat().st_blocks * 512 > 64 * MIB:
        pytest.skip("this file system does not keep files sparse")
    return path


def memory_bomb(path: Path, n: int = 64, length: int = 16 * MIB) -> Path:
    """A valid model with ``n`` extra metadata strings of ``length`` bytes each."""
    kvs: list[Piece] = list(default_kvs())
    for i in range(n):
        kvs += [gstr(f"bomb.{i}") + u32(STRING) + u64(length) + b"x" * 16, length - 16]
    return sparse_gguf(path, kvs, len(default_kvs()) + n, default_tensors())


def string_arrays(path: Path, *, n_kv: int, count: int, size: int, etype: int = STRING) -> Path:
    """General.architecture, then as many ``count``-entry arrays as ``size`` bytes hold (entries are
    zeros: empty strings, or zero numbers)."""
    entry = 8 if etype == STRING else {UINT8: 1, INT32: 4}[etype]
    pieces: list[Piece] = [kv("general.architecture", STRING, "llama")]
    used = 24 + len(pieces[0])
    i = 0
    while used < size and i < n_kv - 1:
        record = gstr(f"k{i}") + u32(ARRAY) + u32(etype) + u64(count)
        pieces += [record, count * entry]
        used += len(record) + count * entry
        i += 1
    return sparse_gguf(path, pieces, n_kv, size=size)


@dataclass
class ReadWork:
    """What the header reader did in one call: its work, counted (a slow machine changes none of it)."""

    lookups: int = 0  # buffer look-ups: every value read goes through one, and so does each refill
    bytes_read: int = 0  # bytes read from the file
    strings_walked: int = 0  # strings walked past, one by one, to find where an array ends


def read_work(monkeypatch: pytest.MonkeyPatch, fn: object, *args: object) -> tuple[ReadWork, object]:
    """(the reader's work, result or the ModelFileError raised) of one call."""
    assert callable(fn)
    work = ReadWork()
    readers: list[HeaderReader] = []
    real_init, real_window, real_skip_strings = HeaderReader.__init__, HeaderReader._window, HeaderReader.skip_strings

    def init(self: HeaderReader, *a: Any, **k: Any) -> None:
        real_init(self, *a, **k)
        readers.append(self)

    def window(self: HeaderReader, n: int) -> Any:
        work.lookups += 1
        return real_window(self, n)

    def skip_strings(self: HeaderReader, count: int, what: str) -> Any:
        marks = real_skip_strings(self, count, what)
        work.strings_walked += count  # only a walk that ended: one that raises walked at most that
        return marks

    with monkeypatch.context() as patch:
        patch.setattr(HeaderReader, "__init__", init)
        patch.setattr(HeaderReader, "_window", window)
        patch.setattr(HeaderReader, "skip_strings", skip_strings)
        try:
            result: object = fn(*args)
        except ModelFileError as exc:
            result = exc
    work.bytes_read = sum(reader.bytes_read for reader in readers)
    return work, result


def traced_peak(fn: object, *args: object) -> tuple[int, object]:
    """(tracemalloc peak in bytes, result or the ModelFileError raised) of one call."""
    assert callable(fn)
    tracemalloc.start()
    try:
        try:
            result: object = fn(*args)
        except ModelFileError as exc:
            result = exc
        return tracemalloc.get_traced_memory()[1], result
    finally:
        tracemalloc.stop()


def cli(home: Path, *argv: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], float, int]:
    """Runs ``glassbox ARGV`` in a child: (result, wall seconds, the child's peak RSS in bytes).

    The peak is the child's own ``VmHWM`` where Linux has it: ``ru_maxrss`` starts from the parent's
    peak (it survives exec), so a child of a test process that once held 1 GB would report 1 GB.
    """
    rss_file = home.parent / f"rss-{time.monotonic_ns()}"
    child = (
        "import json, os, resource, sys\n"
        "from datetime import UTC, datetime\n"
        "from app.cli.main import main\n"
        "from app.paths import Paths\n"
        "from engine.hardware import cpu_name\n"
        "paths = Paths.resolve(sys.argv[-1]).ensure()  # a measured bandwidth: fit does not measure it\n"
        "record = {'gbps': 20.0, 'measured_at': datetime.now(UTC).isoformat(), 'cpu': cpu_name()}\n"
        "paths.bandwidth_cache.write_text(json.dumps(record))\n"
        "try:\n"
        "    code = main(sys.argv[1:])\n"
        "finally:\n"
        "    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == 'darwin' else 1024)\n"
        "    if os.path.exists('/proc/self/status'):  # ru_maxrss keeps the parent's peak across exec\n"
        "        for line in open('/proc/self/status'):\n"
        "            if line.startswith('VmHWM:'):\n"
        "                peak = int(line.split()[1]) * 1024\n"
        "    open(os.environ['RSS_FILE'], 'w').write(str(peak))\n"
        "sys.exit(code)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RSS_FILE": str(rss_file)}
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", child, *argv, "--home", str(home)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )
    wall = time.monotonic() - start
    peak = int(rss_file.read_text()) if rss_file.exists() else 0
    return done, wall, peak


def one_line_error(done: subprocess.CompletedProcess[str], path: Path, reason: str) -> None:
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0] == f"glassbox: error: {path}: {reason}"


def run_python(code: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Runs ``code`` in a child (for anything that would block forever if the fix broke)."""
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no named pipes on this platform")
    path = tmp_path / "pipe.gguf"
    os.mkfifo(path)
    return path


# ------------------------------------------------------------------ 1. named pipes
PIPE = "not a regular file (a named pipe)"


@pytest.mark.parametrize(
    "argv",
    [("models", "info"), ("models", "info", "--json"), ("models", "fit"), ("chat", "--prompt", "hi", "--model")],
    ids=["info", "info-json", "fit", "chat"],
)
def test_a_named_pipe_is_refused_at_once_by_the_commands(fifo: Path, tmp_path: Path, argv: tuple[str, ...]) -> None:
    # Bound: exit 1 with one line; the 60 s timeout is the hang guard, over 50x the 0.3-0.8 s it
    # takes here (before: blocked until killed).
    done, _, _ = cli(tmp_path / "home", *argv, str(fifo), timeout=60)
    one_line_error(done, fifo, PIPE)


def test_the_library_lists_a_named_pipe_with_its_reason(fifo: Path, tmp_path: Path) -> None:
    # Bound: the scan (duplicate fingerprints included: two pipes and an empty file share size 0)
    # ends; the 30 s timeout is the hang guard (about 1 s here). Each pipe is listed with the
    # reason, not dropped.
    os.mkfifo(tmp_path / "other.gguf")
    (tmp_path / "empty.gguf").write_bytes(b"")
    code = (
        "import json; from pathlib import Path; from engine.library import ModelLibrary\n"
        f"lib = ModelLibrary(Path({str(tmp_path)!r}), [], Path({str(tmp_path / 'manifest.json')!r}))\n"
        "print(json.dumps({e.name: e.error for e in lib.scan()}))\n"
    )
    done = run_python(code, timeout=30)
    assert done.returncode == 0, done.stderr
    errors = json.loads(done.stdout)
    assert errors == {
        "empty.gguf": "the file is empty (0 bytes): download it again",
        "other.gguf": PIPE,
        "pipe.gguf": PIPE,
    }


def test_the_reader_refuses_a_pipe_swapped_in_after_the_check(fifo: Path) -> None:
    # The path passes os.stat as a regular file, then is a pipe when opened: the non-blocking open
    # and the check on the open file refuse it. Bound: the 30 s timeout is the hang guard (about 1 s here).
    code = (
        "import os, stat, json\n"
        "from engine import gguf, gguf_file\n"
        "from engine.errors import ModelFileError\n"
        "real = os.stat\n"
        "def fake(path, *a, **k):\n"
        "    st = list(real(path, *a, **k)); st[0] = stat.S_IFREG | 0o644\n"
        "    return os.stat_result(st)\n"
        "gguf_file.os.stat = fake\n"
        "out = {}\n"
        "try:\n"
        f"    gguf.read_gguf_info({str(fifo)!r})\n"
        "except ModelFileError as exc:\n"
        "    out['read'] = exc.reason\n"
        f"out['sniff'] = gguf_file.sniff_model_file({str(fifo)!r})\n"
        "print(json.dumps(out))\n"
    )
    done = run_python(code, timeout=30)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"read": PIPE, "sniff": PIPE}


def test_sniffing_a_pipe_names_it_and_a_missing_file_still_raises(fifo: Path, tmp_path: Path) -> None:
    done = run_python(f"from engine.gguf_file import sniff_model_file; print(sniff_model_file({str(fifo)!r}))", 30)
    assert done.stdout.strip() == PIPE, done.stderr
    with pytest.raises(FileNotFoundError):
        sniff_model_file(tmp_path / "missing.gguf")


def test_folders_and_devices_keep_their_reasons(tmp_path: Path) -> None:
    folder = tmp_path / "folder.gguf"
    folder.mkdir()
    with pytest.raises(ModelFileError, match=r"is a folder, not a model file$"):
        read_gguf_info(folder)
    if Path("/dev/null").exists() and stat.S_ISCHR(os.stat("/dev/null").st_mode):
        with pytest.raises(ModelFileError, match=r"not a regular file \(a device file\)$"):
            read_gguf_info("/dev/null")


# ------------------------------------------------------------------ 2. memory bombs
def test_long_metadata_strings_are_not_held(tmp_path: Path) -> None:
    # 64 strings of 16 MiB (1 GiB apparent). Bound: tracemalloc peak under 8 MiB (before: over
    # 1 GiB), and the values keep what the app shows (the first 256 characters).
    bomb = memory_bomb(tmp_path / "bomb.gguf")
    peak, info = traced_peak(read_gguf_info, bomb)
    assert isinstance(info, GgufInfo), info
    assert peak < 8 * MIB
    assert info.file_size > 64 * 16 * MIB
    assert info.metadata["bomb.0"] == "x" * 16 + "\0" * 240
    assert info.chat_template == TEMPLATE  # what the app needs is all still there
    assert (info.architecture, info.n_layers, info.bos_token, info.eos_token) == ("llama", 2, "<s>", "</s>")


@pytest.mark.parametrize("argv", [("models", "info"), ("models", "info", "--json"), ("models", "fit", "--json")])
def test_long_metadata_strings_do_not_grow_the_commands(tmp_path: Path, argv: tuple[str, ...]) -> None:
    # Bound: the child's peak RSS on the 1 GiB bomb is within 48 MiB of the same command on a tiny
    # model (before: +1 GB for info and fit alike).
    home = tmp_path / "home"
    bomb = memory_bomb(tmp_path / "bomb.gguf")
    tiny = memory_bomb(tmp_path / "tiny.gguf", n=1, length=64)
    small, _, small_peak = cli(home, *argv, str(tiny))
    big, _, big_peak = cli(home, *argv, str(bomb))
    assert small.returncode == big.returncode == 0, big.stderr
    assert small_peak > 0
    assert big_peak - small_peak < 48 * MIB


def test_the_folder_scan_holds_no_long_value(tmp_path: Path) -> None:
    # Bound: tracemalloc peak of a scan of the bomb under 8 MiB (before: over 1 GiB); its manifest
    # under 128 KiB (64 values cut to 256 characters, each at most 6 bytes of JSON: 96 KiB).
    models = tmp_path / "models"
    models.mkdir()
    memory_bomb(models / "bomb.gguf")
    lib = ModelLibrary(models, [], tmp_path / "manifest.json")
    peak, entries = traced_peak(lib.scan)
    assert isinstance(entries, list)
    assert [(e.name, e.error, e.architecture) for e in entries] == [("bomb.gguf", None, "llama")]
    assert peak < 8 * MIB
    assert (tmp_path / "manifest.json").stat().st_size < 128 << 10


def test_long_name_and_architecture_are_cut_or_refused(tmp_path: Path) -> None:
    kvs = [k for k in default_kvs() if not k.startswith(gstr("general.name"))]
    kvs.append(kv("general.name", STRING, "é" * 100_000))
    info = read_gguf_info(sparse_gguf(tmp_path / "name.gguf", kvs, len(kvs), default_tensors()))
    assert info.name == "é" * 256
    kvs = [kv("general.architecture", STRING, "llama" * 100_000)]
    with pytest.raises(ModelFileError, match=r"general\.architecture 'llamallama.*' is not a valid name$"):
        read_gguf_info(sparse_gguf(tmp_path / "arch.gguf", kvs, 1))


def test_a_chat_template_over_the_cap_is_noted_not_kept(tmp_path: Path) -> None:
    # Bound: a 16 MiB template costs under 4 MiB of peak; one at the cap is kept whole.
    limit = gguf.MAX_CHAT_TEMPLATE_BYTES
    base = [k for k in default_kvs() if not k.startswith(gstr("tokenizer.chat_template"))]
    at_cap = TEMPLATE + " " * (limit - len(TEMPLATE))
    kept = read_gguf_info(
        sparse_gguf(
            tmp_path / "cap.gguf",
            [*base, kv("tokenizer.chat_template", STRING, at_cap)],
            len(base) + 1,
            default_tensors(),
        )
    )
    assert kept.chat_template == at_cap
    assert kept.notes == []
    over: list[Piece] = [*base, gstr("tokenizer.chat_template") + u32(STRING) + u64(16 * MIB) + b"{{", 16 * MIB - 2]
    peak, info = traced_peak(
        read_gguf_info, sparse_gguf(tmp_path / "over.gguf", over, len(base) + 1, default_tensors())
    )
    assert isinstance(info, GgufInfo), info
    assert peak < 4 * MIB
    assert info.chat_template is None
    assert info.notes == [
        f"tokenizer.chat_template is {16 * MIB} bytes, over the {limit}-byte limit: not kept "
        "(a built-in chat format is used)"
    ]
    assert GgufInfo.from_dict(info.to_dict()).notes == info.notes  # survives the library's cache


def test_metadata_over_the_total_cap_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 300 keys of 64 KiB (the longest a key may be): more than MAX_METADATA_BYTES (16 MiB) to
    # hold. Bound: refused having read at most 24 MiB in at most 10 look-ups a key (18 MiB and
    # 1,088 here), with a tracemalloc peak under 24 MiB.
    pieces: list[Piece] = list(default_kvs())
    for i in range(300):
        pieces += [u64(65535) + b"%08d" % i, 65535 - 8, u32(UINT32) + u32(i)]
    path = sparse_gguf(tmp_path / "keys.gguf", pieces, len(default_kvs()) + 300, default_tensors())
    work, error = read_work(monkeypatch, read_gguf_info, path)
    assert isinstance(error, ModelFileError)
    assert error.reason == (
        "model file is malformed: its metadata needs more than 16 MiB to hold (a real model's needs well under 1 MiB)"
    )
    assert work.bytes_read <= 24 * MIB, work
    assert work.lookups <= 10 * 300, work
    peak, _ = traced_peak(read_gguf_info, path)
    assert peak < 24 * MIB


def test_small_arrays_past_the_kept_budget_are_skipped_and_noted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 8,000 arrays of 4,096 entries: only MAX_KEPT_ARRAY_ITEMS entries are kept. Bound: at most 10
    # look-ups an array (5 here) and a tracemalloc peak under 16 MiB (before: each entry read one
    # by one, 32 million look-ups, and all kept).
    pieces: list[Piece] = list(default_kvs())
    for i in range(8000):
        pieces += [gstr(f"a{i}") + u32(ARRAY) + u32(UINT8) + u64(4096), 4096]
    path = sparse_gguf(tmp_path / "arrays.gguf", pieces, len(default_kvs()) + 8000, default_tensors())
    work, info = read_work(monkeypatch, read_gguf_info, path)
    assert isinstance(info, GgufInfo), info
    assert work.lookups <= 10 * 8000, work
    kept = gguf.MAX_KEPT_ARRAY_ITEMS // 4096 - 1  # the scores array (8 entries) is kept first
    assert info.notes == [
        f"{8000 - kept} metadata arrays were not kept: the header holds more than "
        f"{gguf.MAX_KEPT_ARRAY_ITEMS} array entries in all"
    ]
    assert info.vocab_size == 8
    peak, _ = traced_peak(read_gguf_info, path)
    assert peak < 16 * MIB


# ------------------------------------------------------------------ 3. time bombs
@pytest.mark.parametrize("size", [512 * MIB, 4096 * MIB], ids=["512MiB", "4GiB"])
def test_the_claimed_keys_and_arrays_are_refused_before_any_walk(
    tmp_path: Path, size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The reported file: 65,536 keys claimed, arrays of 2^24 empty strings. Bound: refused with no
    # string walked, at most 10 look-ups and 1 MiB read, whatever the file's size (before: 10.5 s
    # at 512 MiB walking strings, growing with the size).
    path = string_arrays(tmp_path / "claims.gguf", n_kv=65536, count=1 << 24, size=size)
    work, error = read_work(monkeypatch, read_gguf_info, path)
    assert isinstance(error, ModelFileError)
    assert error.reason == f"model file is malformed: it claims 65536 metadata keys (limit {gguf.MAX_KV})"
    assert work.strings_walked == 0, work
    assert work.lookups <= 10, work
    assert work.bytes_read <= MIB, work
    done, _, _ = cli(tmp_path / "home", "models", "info", str(path))
    one_line_error(done, path, error.reason)


def test_a_string_array_past_the_budget_is_refused_before_it_is_walked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same within the key cap: the first array's 2^24 strings are over MAX_ARRAY_STRINGS.
    # Bound: no string walked, at most 32 look-ups (13 here; before: the walk itself, 10 s).
    path = string_arrays(tmp_path / "claims.gguf", n_kv=gguf.MAX_KV, count=1 << 24, size=512 * MIB)
    work, error = read_work(monkeypatch, read_gguf_info, path)
    assert isinstance(error, ModelFileError)
    assert error.reason == (
        f"model file is malformed: array 'k0' claims {1 << 24} strings, past the {gguf.MAX_ARRAY_STRINGS} strings "
        "a header may hold in all (0 before it)"
    )
    assert work.strings_walked == 0, work
    assert work.lookups <= 32, work


def test_walking_the_whole_string_budget_walks_no_more_than_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Arrays of 2^20 strings: the first two fill the budget and are walked, the third is refused.
    # Bound: exactly the 2,097,152 strings of the budget walked (the worst a header can ask), in
    # at most 100 look-ups (39 here: the walk refills its buffer only at its end).
    path = string_arrays(tmp_path / "walk.gguf", n_kv=gguf.MAX_KV, count=1 << 20, size=512 * MIB)
    work, error = read_work(monkeypatch, read_gguf_info, path)
    assert isinstance(error, ModelFileError)
    assert "array 'k2' claims 1048576 strings" in error.reason
    assert f"({gguf.MAX_ARRAY_STRINGS} before it)" in error.reason
    assert work.strings_walked == gguf.MAX_ARRAY_STRINGS, work
    assert work.lookups <= 100, work


@pytest.mark.parametrize("etype", [UINT8, INT32], ids=["u8", "i32"])
def test_huge_fixed_size_arrays_are_seeked_past(tmp_path: Path, etype: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # 2^24-entry numeric arrays are never read: seeked past until the file ends. Bound: at most
    # 2 MiB of the 512 MiB read, in at most 1,000 look-ups (about 1.1 MiB and 50-170 here).
    path = string_arrays(tmp_path / "fixed.gguf", n_kv=gguf.MAX_KV, count=1 << 24, size=512 * MIB, etype=etype)
    work, error = read_work(monkeypatch, read_gguf_info, path)
    assert isinstance(error, ModelFileError)
    assert error.reason.startswith(f"model file is incomplete ({512 * MIB} of at least ")
    assert work.bytes_read <= 2 * MIB, work
    assert work.lookups <= 1000, work


def test_the_most_keys_and_tensors_allowed_cost_a_few_look_ups_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # MAX_KV keys and MAX_TENSORS tensors, all valid. Bound: at most 8 look-ups a key or tensor
    # (5.8 here) and 8 MiB read (the read speed itself is a benchmark's business, not a test's).
    pieces: list[Piece] = [kv("general.architecture", STRING, "llama"), kv("llama.block_count", UINT32, 512)]
    pieces += [kv(f"x.{i:05d}", UINT32, i) for i in range(gguf.MAX_KV - 2)]
    tensors = [(f"blk.{i % 512}.t{i:05d}", [32], F32) for i in range(gguf.MAX_TENSORS)]
    path = sparse_gguf(tmp_path / "many.gguf", pieces, gguf.MAX_KV, tensors)
    work, info = read_work(monkeypatch, read_gguf_info, path)
    assert isinstance(info, GgufInfo), info
    assert (info.n_tensors, len(info.metadata)) == (gguf.MAX_TENSORS, gguf.MAX_KV)
    assert work.lookups <= 8 * (gguf.MAX_KV + gguf.MAX_TENSORS), work
    assert work.bytes_read <= 8 * MIB, work


def test_long_values_that_are_skipped_are_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 4,000 values of exactly 1 MiB (the read-ahead's size; 4 GiB apparent): with a fixed 1 MiB
    # read-ahead each one was read in full only to be skipped. Bound: a correct result, under
    # 32 MiB read from the file (17 MiB here), at most 8 look-ups a value (5 here).
    pieces: list[Piece] = list(default_kvs())
    for i in range(4000):
        pieces += [gstr(f"v{i}") + u32(STRING) + u64(MIB), MIB]
    path = sparse_gguf(tmp_path / "values.gguf", pieces, len(default_kvs()) + 4000, default_tensors())
    work, info = read_work(monkeypatch, read_gguf_info, path)
    assert isinstance(info, GgufInfo), info
    assert info.metadata["v3999"] == "\0" * 256
    assert work.bytes_read < 32 * MIB, work
    assert work.lookups <= 8 * 4000, work


def test_a_header_that_needs_too_many_reads_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # One array of 1,000 strings of 1 MiB each, all there (1,000 MiB apparent): walking it reads
    # the whole array. Bound: refused once MAX_HEADER_READ_BYTES (128 MiB) are read, at most one
    # 1 MiB chunk past it (the old reader read all 1,000 MiB and accepted it; a larger claim read more).
    pieces: list[Piece] = [kv("general.architecture", STRING, "llama")]
    pieces.append(gstr("s") + u32(ARRAY) + u32(STRING) + u64(1000))
    for _ in range(1000):
        pieces += [u64(MIB - 8), MIB - 8]
    path = sparse_gguf(tmp_path / "reads.gguf", pieces, 2)
    work, error = read_work(monkeypatch, read_gguf_info, path)
    assert isinstance(error, ModelFileError)
    assert error.reason == (
        "model file is malformed: reading its header takes more than 128 MiB (a real model's header is a few MiB)"
    )
    assert work.bytes_read <= 128 * MIB + MIB, work


def test_models_info_prints_what_the_reader_left_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from app.cli.main import main

    base = [k for k in default_kvs() if not k.startswith(gstr("tokenizer.chat_template"))]
    over: list[Piece] = [*base, gstr("tokenizer.chat_template") + u32(STRING) + u64(16 * MIB) + b"{{", 16 * MIB - 2]
    path = sparse_gguf(tmp_path / "over.gguf", over, len(base) + 1, default_tensors())
    assert main(["models", "info", str(path), "--home", str(tmp_path / "home")]) == 0
    out = capsys.readouterr().out
    assert "note:" in out and "over the 65536-byte limit: not kept" in out
