"""Quantizing a GGUF model with llama.cpp, in a killable child process.

Contract: ARCHITECTURE.md, 'engine.convert.quantize'.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import multiprocessing
import multiprocessing.connection
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine.convert.child_entry import child_main, quantize_child
from engine.errors import Cancelled, ModelFileError, QuantizeError
from engine.gguf import read_gguf_info
from engine.library import read_model_info, split_parts
from engine.units import format_bytes

# --------------------------------------------------------------------------- the types on offer

# Name, llama_cpp constant, approximate bits per weight of a whole file, needs an importance
# matrix, description. Bits per weight are file-level figures (embeddings and output head
# included) for an 8B Llama; the shape of a given model moves them a little. The imatrix column
# follows llama.cpp's own rule (src/llama-quant.cpp ``tensor_requires_imatrix``): the default
# tensor type of these file types is IQ1_*, IQ2_XXS/XS/S or IQ3_XXS, or Q2_K inside Q2_K_S, and
# llama.cpp refuses to write them without one.
_TABLE: tuple[tuple[str, str, float, bool, str], ...] = (
    ("F32", "LLAMA_FTYPE_ALL_F32", 32.0, False, "32-bit float: no loss, largest"),
    ("F16", "LLAMA_FTYPE_MOSTLY_F16", 16.0, False, "16-bit float: practically lossless"),
    ("BF16", "LLAMA_FTYPE_MOSTLY_BF16", 16.0, False, "bfloat16: practically lossless"),
    ("Q8_0", "LLAMA_FTYPE_MOSTLY_Q8_0", 8.5, False, "8-bit: nearly lossless"),
    ("Q6_K", "LLAMA_FTYPE_MOSTLY_Q6_K", 6.57, False, "6-bit K-quant: very close to F16"),
    ("Q5_K_M", "LLAMA_FTYPE_MOSTLY_Q5_K_M", 5.70, False, "5-bit K-quant, medium: very low loss"),
    ("Q5_K_S", "LLAMA_FTYPE_MOSTLY_Q5_K_S", 5.57, False, "5-bit K-quant, small: low loss"),
    ("Q5_1", "LLAMA_FTYPE_MOSTLY_Q5_1", 6.04, False, "5-bit legacy quant with offset"),
    ("Q5_0", "LLAMA_FTYPE_MOSTLY_Q5_0", 5.57, False, "5-bit legacy quant"),
    ("Q4_K_M", "LLAMA_FTYPE_MOSTLY_Q4_K_M", 4.90, False, "4-bit K-quant, medium: the usual choice"),
    ("Q4_K_S", "LLAMA_FTYPE_MOSTLY_Q4_K_S", 4.67, False, "4-bit K-quant, small"),
    ("Q4_1", "LLAMA_FTYPE_MOSTLY_Q4_1", 5.11, False, "4-bit legacy quant with offset"),
    ("Q4_0", "LLAMA_FTYPE_MOSTLY_Q4_0", 4.64, False, "4-bit legacy quant: fast on ARM via repacking"),
    ("IQ4_NL", "LLAMA_FTYPE_MOSTLY_IQ4_NL", 4.50, False, "4-bit non-linear quant"),
    (
        "IQ4_XS",
        "LLAMA_FTYPE_MOSTLY_IQ4_XS",
        4.25,
        False,
        "4.25-bit non-linear quant: Q4_K_S quality, smaller",
    ),
    (
        "MXFP4_MOE",
        "LLAMA_FTYPE_MOSTLY_MXFP4_MOE",
        4.25,
        False,
        "MXFP4 experts, Q8_0 elsewhere (mixture-of-experts)",
    ),
    ("Q3_K_L", "LLAMA_FTYPE_MOSTLY_Q3_K_L", 4.31, False, "3-bit K-quant, large"),
    ("Q3_K_M", "LLAMA_FTYPE_MOSTLY_Q3_K_M", 4.00, False, "3-bit K-quant, medium: noticeable loss"),
    ("Q3_K_S", "LLAMA_FTYPE_MOSTLY_Q3_K_S", 3.65, False, "3-bit K-quant, small: clear loss"),
    ("IQ3_M", "LLAMA_FTYPE_MOSTLY_IQ3_M", 3.66, False, "3.66-bit non-linear mix"),
    ("IQ3_S", "LLAMA_FTYPE_MOSTLY_IQ3_S", 3.44, False, "3.44-bit non-linear quant"),
    ("IQ3_XS", "LLAMA_FTYPE_MOSTLY_IQ3_XS", 3.30, False, "3.3-bit non-linear quant"),
    ("IQ3_XXS", "LLAMA_FTYPE_MOSTLY_IQ3_XXS", 3.06, True, "3.06-bit non-linear quant"),
    ("Q2_K", "LLAMA_FTYPE_MOSTLY_Q2_K", 3.17, False, "2-bit K-quant: large loss"),
    ("Q2_K_S", "LLAMA_FTYPE_MOSTLY_Q2_K_S", 2.96, True, "2-bit K-quant, small"),
    ("IQ2_M", "LLAMA_FTYPE_MOSTLY_IQ2_M", 2.70, True, "2.7-bit non-linear quant"),
    ("IQ2_S", "LLAMA_FTYPE_MOSTLY_IQ2_S", 2.50, True, "2.5-bit non-linear quant"),
    ("IQ2_XS", "LLAMA_FTYPE_MOSTLY_IQ2_XS", 2.31, True, "2.31-bit non-linear quant"),
    ("IQ2_XXS", "LLAMA_FTYPE_MOSTLY_IQ2_XXS", 2.06, True, "2.06-bit non-linear quant"),
    ("Q2_0", "LLAMA_FTYPE_MOSTLY_Q2_0", 2.25, False, "2.25-bit quant (group 64), for models trained for it"),
    ("IQ1_M", "LLAMA_FTYPE_MOSTLY_IQ1_M", 1.75, True, "1.75-bit quant: extreme loss"),
    ("IQ1_S", "LLAMA_FTYPE_MOSTLY_IQ1_S", 1.56, True, "1.56-bit quant: extreme loss"),
    ("Q1_0", "LLAMA_FTYPE_MOSTLY_Q1_0", 1.125, False, "1-bit quant, for models trained for it"),
    ("TQ2_0", "LLAMA_FTYPE_MOSTLY_TQ2_0", 2.06, False, "ternary, for ternary (BitNet-style) models only"),
    ("TQ1_0", "LLAMA_FTYPE_MOSTLY_TQ1_0", 1.69, False, "ternary, for ternary (BitNet-style) models only"),
)
# Aliases llama-quantize accepts.
_ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}
UNQUANTIZED_TYPES = frozenset({"F32", "F16", "BF16"})
"""Source types quantization starts from without ``allow_requantize``."""

_TENSOR_LINE = re.compile(r"\[\s*(\d+)\s*/\s*(\d+)\s*\]\s+(\S+)")
_FAILED = re.compile(r"failed to quantize:\s*(.+)")
_SPACE_MARGIN = 64 * 2**20
_NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)})
# How a full disk shows in a child's log when it says so: "[Errno 28] No space left on device" from
# Python code. llama.cpp's std::ofstream only says "basic_ios::clear: iostream error" (the errno is
# lost), so after any failure the free space is checked again (space_after_failure).
_NO_SPACE_TEXT = re.compile(
    r"no space left on device|disk quota exceeded|\[errno (?:28|122)\]|\bENOSPC\b|\bEDQUOT\b", re.IGNORECASE
)
_DRAIN_S = 5.0


@dataclass(frozen=True)
class QuantType:
    """One quantization type the pinned llama.cpp can write.

    Attributes:
        name: the llama-quantize name, e.g. ``"Q4_K_M"``.
        ftype: the ``LLAMA_FTYPE_*`` value.
        bits_per_weight: approximate file size in bits per parameter.
        needs_imatrix: llama.cpp refuses this type without an importance matrix, which Glassbox
            does not compute; such types are listed but unavailable.
        description: one line for people choosing a type.
    """

    name: str
    ftype: int
    bits_per_weight: float
    needs_imatrix: bool
    description: str

    @property
    def available(self) -> bool:
        """True when Glassbox can produce this type (no importance matrix needed)."""
        return not self.needs_imatrix

    def estimate_bytes(self, n_params: int) -> int:
        """Approximate output size for a model of ``n_params`` parameters."""
        return int(n_params * self.bits_per_weight / 8)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "available": self.available}


def expected_bytes(src: Path, qtype: QuantType, n_params: int = 0) -> int:
    """The expected output size of quantizing ``src`` to ``qtype``: per tensor, from the real
    shapes and the types llama.cpp picks (:mod:`engine.convert.quant_estimate`); the file-level bits per
    weight of ``qtype`` only when the header cannot be read again."""
    # lazy: start-up (+9 ms)
    from engine.convert.quant_estimate import estimate_quantized, read_tensor_shapes

    try:
        source, shapes = read_tensor_shapes(src)
        return estimate_quantized(source, shapes, qtype.name).file_bytes
    except (ModelFileError, ValueError, KeyError):
        return qtype.estimate_bytes(n_params)


def size_change(ratio: float) -> str:
    """``"3.6x smaller"``, ``"2.0x larger"`` or ``"about the same size"`` for ``src / dst``."""
    if ratio <= 0:
        return "size unknown"
    if 0.95 <= ratio <= 1.05:
        return "about the same size"
    return f"{ratio:.1f}x smaller" if ratio > 1 else f"{1 / ratio:.1f}x larger"


@dataclass(frozen=True)
class QuantizeProgress:
    """``done_tensors`` of ``total_tensors`` written; ``tensor_name`` is the last one done."""

    done_tensors: int
    total_tensors: int
    tensor_name: str


@dataclass(frozen=True)
class QuantizeResult:
    """A finished quantization. ``ratio`` is ``src_bytes / dst_bytes`` (3.6 means 3.6x smaller)."""

    path: Path
    src_bytes: int
    dst_bytes: int
    ratio: float
    seconds: float
    qtype: str
    source: Path
    source_type: str

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "path": str(self.path), "source": str(self.source)}


@functools.cache
def quant_types() -> list[QuantType]:
    """Every type the installed llama-cpp-python build can quantize to, best quality first.

    Types that need an importance matrix are included with ``needs_imatrix=True``.
    """
    # lazy: heavy (llama_cpp)
    import llama_cpp.llama_cpp as native

    offered: list[QuantType] = []
    for name, constant, bpw, imatrix, text in _TABLE:
        value = getattr(native, constant, None)
        if isinstance(value, int):
            offered.append(QuantType(name, value, bpw, imatrix, text))
    return offered


def find_quant_type(name: str) -> QuantType:
    """The type called ``name`` (case-insensitive; ``Q4_K`` means ``Q4_K_M``).

    Raises:
        QuantizeError: no such type in this build; the message lists the available ones.
    """
    wanted = name.strip().upper().replace("-", "_")
    wanted = _ALIASES.get(wanted, wanted)
    types = quant_types()
    for qt in types:
        if qt.name == wanted:
            return qt
    names = ", ".join(qt.name for qt in types if qt.available)
    raise QuantizeError(f"unknown quantization type {name!r}; available: {names}")


# Work files a killed quantize or convert leaves behind: ``<dst>.tmp-<pid>`` (quantize),
# ``.glassbox-convert-<pid>-<thread>.tmp`` (convert) and ``.<name>.<F16|BF16|F32>-<pid>-<thread>.gguf``
# (the intermediate of convert + quantize). Each carries the pid of the process that wrote it.
_WORK_FILE = re.compile(
    r"^(?:.+\.gguf\.tmp-(?P<a>\d+)|\.glassbox-convert-(?P<b>\d+)-\d+\.tmp|\..+\.(?:F16|BF16|F32)-(?P<c>\d+)-\d+\.gguf)$"
)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    if sys.platform == "win32":  # pragma: no cover - no cheap liveness check there: keep the file
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's process
    return True


def sweep_work_files(folder: Path, *, min_age_s: float = 300.0) -> list[Path]:
    """Deletes the temporary files of quantize and convert runs that were killed (their process
    is gone), so a crash does not keep gigabytes of half-written model in ``folder``.

    Only names that match the work-file patterns exactly, whose writer's pid is not running and
    that were untouched for ``min_age_s``, are removed. Returns what was deleted.
    """
    removed: list[Path] = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    now = time.time()
    for name in names:
        match = _WORK_FILE.match(name)
        if match is None:
            continue
        pid = int(match.group("a") or match.group("b") or match.group("c"))
        path = folder / name
        try:
            if not path.is_file() or now - path.stat().st_mtime < min_age_s or _pid_alive(pid):
                continue
            path.unlink()
        except OSError:
            continue
        removed.append(path)
    return removed


def default_output_path(src: Path, qtype: str, folder: Path | None = None) -> Path:
    """``<folder>/<model>-<QTYPE>.gguf``, dropping a type suffix already in the source's name.

    ``gemma-2b-F16.gguf`` quantized to Q4_K_M becomes ``gemma-2b-Q4_K_M.gguf``.
    """
    stem = re.sub(r"-\d{5}-of-\d{5}$", "", src.stem)
    stem = re.sub(r"[-_.](?:f32|f16|bf16|q\d\w*|iq\d\w*|tq\d\w*)$", "", stem, flags=re.IGNORECASE)
    return (folder if folder is not None else src.parent) / f"{stem or 'model'}-{qtype}.gguf"


# --------------------------------------------------------------------------- the child process


@dataclass(frozen=True)
class ChildOutcome:
    """How a child from :func:`run_logged_child` ended.

    Attributes:
        exitcode: the process exit code; negative for a signal (``-9``: SIGKILL).
        value: what the target returned (None when it raised or crashed).
        error: ``"<ExceptionType>: <message>"`` on one line when the target raised, else None.
        log: the last lines the child wrote to stdout/stderr (native code included).
    """

    exitcode: int | None
    value: Any
    error: str | None
    log: list[str]

    @property
    def crashed(self) -> bool:
        """True when a signal ended the child (native crash, out-of-memory kill)."""
        return self.exitcode is not None and self.exitcode < 0

    def last_error_line(self) -> str | None:
        """The last log line that looks like an error, for a one-line summary."""
        for line in reversed(self.log):
            if re.search(r"error|failed|exception|abort|assert", line, re.IGNORECASE):
                return line.strip()
        return None


def describe_exit(exitcode: int | None) -> str:
    """``"killed by SIGKILL"``, ``"exit code 3"``: a child's end, in words."""
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


def _read_some(conn: multiprocessing.connection.Connection) -> bytes:
    if sys.platform == "win32":  # pragma: no cover
        try:
            return conn.recv_bytes()
        except EOFError:
            return b""
    return os.read(conn.fileno(), 65536)


def _stop(process: Any, grace: float = 2.0) -> None:
    """Terminate, then kill after ``grace`` seconds."""
    if process.pid is None:
        return  # never started
    if process.is_alive():
        process.terminate()
        process.join(grace)
    if process.is_alive():
        process.kill()
    process.join(5.0)


@functools.cache
def child_context() -> Any:
    """The multiprocessing context for native jobs: the fork server on POSIX, spawn elsewhere.

    A spawned child starts a new interpreter and imports its entry module (about 0.1 s here);
    a child forked from the fork server starts in a few milliseconds. The server is a clean,
    single-threaded process started on first use with :mod:`engine.convert.child_entry` (stdlib only)
    imported, so forking it is safe even though this process runs Qt and llama.cpp threads. A
    frozen app, and Windows, use spawn.

    Each child still imports the launching script again when the app was started from a script
    (the ``glassbox`` console script); the server's ``__main__`` preload that would avoid it is
    ignored by Python 3.11's multiprocessing, so that script imports nothing heavy instead
    (``app.__main__``).
    """
    if sys.platform == "win32" or getattr(sys, "frozen", False):
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    preload = ["__main__", "engine.convert.child_entry"]
    if sys.platform.startswith("linux"):
        # Not on macOS: Apple's frameworks (Metal) are not safe to use in a forked child.
        preload.append("engine.convert.native_preload")
    ctx.set_forkserver_preload(preload)
    return ctx


def run_logged_child(
    target: Callable[..., Any],
    args: Sequence[Any],
    *,
    on_line: Callable[[str], None] | None = None,
    cancel: threading.Event | None = None,
    timeout: float | None = None,
    env: dict[str, str] | None = None,
    keep_lines: int = 40,
) -> ChildOutcome:
    """Runs ``target(*args)`` in a child process and streams its output lines back.

    The child's file descriptors 1 and 2 go into a pipe, so native messages are captured too; each
    line (split on ``\\n`` and ``\\r``) is passed to ``on_line`` in the calling thread.

    Args:
        target: a module-level function (it is pickled by name).
        args: picklable arguments.
        on_line: called for each output line.
        cancel: set it to terminate the child (then kill after a grace period).
        timeout: seconds before the child is killed and ``TimeoutError`` raised.
        env: extra environment variables for the child.
        keep_lines: how many trailing lines :attr:`ChildOutcome.log` keeps.

    Returns:
        How the child ended.

    Raises:
        Cancelled: ``cancel`` was set before the child finished (the child is gone).
        TimeoutError: the child ran longer than ``timeout`` (the child is gone).
    """
    ctx = child_context()
    log_r, log_w = ctx.Pipe(duplex=False)
    res_r, res_w = ctx.Pipe(duplex=False)
    child_env = {**os.environ, **(env or {})}
    process = ctx.Process(
        target=child_main, args=(target, tuple(args), log_w, res_w, child_env, os.getcwd()), daemon=True
    )
    started = time.monotonic()
    tail: list[str] = []
    pending = b""
    result: tuple[Any, ...] | None = None
    log_open = res_open = True

    def emit(raw: bytes) -> None:
        line = raw.decode("utf-8", "replace").rstrip()
        if not line:
            return
        tail.append(line)
        if len(tail) > keep_lines:
            del tail[0]
        if on_line is not None:
            on_line(line)

    try:
        process.start()
        log_w.close()
        res_w.close()
        died_at: float | None = None
        while log_open or res_open or process.is_alive():
            if cancel is not None and cancel.is_set():
                raise Cancelled("cancelled")
            now = time.monotonic()
            if timeout is not None and now - started > timeout:
                raise TimeoutError(f"took longer than {timeout:g} s")
            if died_at is None and not process.is_alive():
                died_at = now
            elif died_at is not None and now - died_at > _DRAIN_S:
                break  # a grandchild still holds a pipe: stop waiting for it
            waitables: list[Any] = [process.sentinel] if died_at is None else []
            if log_open:
                waitables.append(log_r)
            if res_open:
                waitables.append(res_r)
            ready = multiprocessing.connection.wait(waitables, timeout=0.05)
            if log_open and log_r in ready:
                chunk = _read_some(log_r)
                if not chunk:
                    log_open = False
                pending += chunk
                *lines, pending = re.split(rb"[\r\n]", pending)
                for raw in lines:
                    emit(raw)
            if res_open and res_r in ready:
                try:
                    result = res_r.recv()
                except (EOFError, OSError):
                    res_open = False
        emit(pending)
        process.join()
    except BaseException:
        _stop(process)
        raise
    finally:
        log_r.close()
        res_r.close()
    if cancel is not None and cancel.is_set():
        raise Cancelled("cancelled")
    value = result[1] if result is not None and result[0] == "ok" else None
    error = result[1] if result is not None and result[0] == "error" else None
    return ChildOutcome(process.exitcode, value, error, tail)


# --------------------------------------------------------------------------- the parent side


def _check_destination(src: Path, dst: Path, overwrite: bool) -> None:
    if dst.suffix.lower() != ".gguf":
        raise QuantizeError(f"{dst}: the output file name must end in .gguf")
    if not dst.parent.is_dir():
        raise QuantizeError(f"{dst.parent}: the output folder does not exist")
    if not os.access(dst.parent, os.W_OK):
        raise QuantizeError(f"{dst.parent}: the output folder is not writable")
    if dst.exists():
        if dst.resolve() == src.resolve():
            raise QuantizeError(f"{dst}: the output would overwrite the source")
        if not overwrite:
            raise QuantizeError(f"{dst}: already exists; choose another name or remove it first")


def check_free_space(folder: Path, needed: int) -> None:
    """Raises :class:`QuantizeError` unless ``folder`` has ``needed`` bytes plus a margin free.

    The free space is measured by the downloads' check (``engine.disk.missing_space``).
    """
    # lazy: start-up (+1 ms)
    from engine.disk import missing_space

    missing, free = missing_space(folder, needed + _SPACE_MARGIN)
    if missing:
        raise QuantizeError(
            f"not enough free space (needs about {format_bytes(needed + _SPACE_MARGIN)}, {format_bytes(free)} free): "
            f"{disk_full_reason(folder, missing)}"
        )


def disk_full_reason(folder: Path, missing: int) -> str:
    """``the disk is full: 120.0 MiB more are needed on <folder>``: one wording for every place that
    runs out of space while writing a model."""
    return f"the disk is full: {format_bytes(max(missing, 2**20))} more are needed on {folder}"


def is_no_space(exc: BaseException) -> bool:
    """True for the OS's "no space left" (ENOSPC) and "quota exceeded" (EDQUOT) errors."""
    return isinstance(exc, OSError) and exc.errno in _NO_SPACE_ERRNOS


def space_after_failure(folder: Path, partial: Path, needed: int, done: int = 0, total: int = 0) -> tuple[int, bool]:
    """Re-checks the free space after a write failed, with its partial output still on disk.

    Args:
        folder: where the output was written.
        partial: the partial output (its size counts as space the output had).
        needed: the expected size of the whole output.
        done: tensors written so far, and ``total``: of how many (a low estimate is corrected by
            the share written).

    Returns:
        ``(missing, full)``: about how many more bytes were needed (at least the safety margin),
        and whether the volume is full now (less than the margin left), which tells a full disk
        from other failures that end a write.
    """
    # lazy: start-up (+1 ms)
    from engine.disk import missing_space

    try:
        written = partial.stat().st_size
    except OSError:
        written = 0
    projected = written * total // done if done and total else 0
    try:
        missing, free = missing_space(folder, max(needed, projected) + _SPACE_MARGIN - written)
    except OSError:
        return _SPACE_MARGIN, False
    return missing or _SPACE_MARGIN, free < _SPACE_MARGIN


def _fsync(path: Path) -> None:
    with path.open("rb+") as fh:
        os.fsync(fh.fileno())


class _Writeback:
    """Flushes the child's output file to disk while the child is still writing it (POSIX).

    The final fsync before the rename then has only the last moments' bytes to write instead of
    the whole file (0.05 s of a 3 s quantization of a 100 MB model here). On Windows a second
    handle on a file another process writes can fail, so the final fsync does all the work there.
    """

    def __init__(self, path: Path, interval_s: float = 0.25) -> None:
        self._path = path
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="quantize-writeback", daemon=True)

    def __enter__(self) -> _Writeback:
        if sys.platform != "win32":
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        fd: int | None = None
        sync = getattr(os, "fdatasync", os.fsync)
        try:
            while not self._stop.wait(self._interval_s):
                try:
                    if fd is None:
                        fd = os.open(self._path, os.O_RDONLY)
                    sync(fd)
                except OSError:
                    continue  # not created yet, or gone: try again next time
        finally:
            if fd is not None:
                os.close(fd)


def quantize_model(
    src: Path,
    dst: Path,
    qtype: str,
    *,
    allow_requantize: bool = False,
    threads: int | None = None,
    cancel: threading.Event | None = None,
    progress: Callable[[QuantizeProgress], None] | None = None,
    overwrite: bool = False,
) -> QuantizeResult:
    """Quantizes the GGUF ``src`` to ``qtype``, writing ``dst`` atomically.

    Args:
        src: an F32, F16 or BF16 GGUF (any GGUF with ``allow_requantize``).
        dst: the output ``.gguf``; its folder must exist.
        qtype: a name from :func:`quant_types` (case-insensitive).
        allow_requantize: accept an already quantized source (quality suffers).
        threads: llama.cpp worker threads; None uses all cores.
        cancel: set it to stop; the child is terminated and no file is left behind.
        progress: called with per-tensor progress, from the calling thread.
        overwrite: replace an existing ``dst``.

    Returns:
        Sizes, time and type of the result.

    Raises:
        ModelFileError: ``src`` is missing or not a valid GGUF.
        QuantizeError: bad type or destination, not enough space, an already quantized source,
            llama.cpp failed, or the child crashed.
        Cancelled: ``cancel`` was set.
    """
    src = Path(src)
    dst = Path(dst)
    qt = find_quant_type(qtype)
    if qt.needs_imatrix:
        raise QuantizeError(
            f"{qt.name} needs an importance matrix, which Glassbox does not compute; "
            "choose a type without one (for example Q4_K_M, IQ4_XS or Q3_K_M)"
        )
    # A split source (name-00001-of-00003.gguf) is read whole; llama.cpp writes one file.
    info = read_model_info(src)
    parts = split_parts(src)
    if parts is not None and src != parts[0]:
        raise QuantizeError(f"{src}: part of a split model; quantize its first part ({parts[0].name})")
    if info.file_type not in UNQUANTIZED_TYPES and not allow_requantize:
        raise QuantizeError(
            f"{src}: already quantized ({info.file_type}); quantize from the F16/BF16/F32 original, "
            "or allow requantizing (quality suffers)"
        )
    _check_destination(src, dst, overwrite)
    needed = int(expected_bytes(src, qt, info.n_params) * 1.05)
    check_free_space(dst.parent, needed)

    tmp = dst.with_name(f"{dst.name}.tmp-{os.getpid()}")
    done = 0

    def on_line(line: str) -> None:
        nonlocal done
        match = _TENSOR_LINE.search(line)
        if match is None:
            return
        done = int(match.group(1))
        if progress is not None:
            progress(QuantizeProgress(done, int(match.group(2)), match.group(3)))

    started = time.perf_counter()
    try:
        with _Writeback(tmp):
            outcome = run_logged_child(
                quantize_child,
                (str(src), str(tmp), qt.ftype, allow_requantize, threads or 0),
                on_line=on_line,
                cancel=cancel,
            )
        if outcome.exitcode != 0:
            space = _SpaceCheck(dst.parent, tmp, needed, done, info.n_tensors)
            raise QuantizeError(_failure(src, qt.name, outcome, done, info.n_tensors, space))
        try:
            result_info = read_gguf_info(tmp)
        except ModelFileError as exc:
            raise QuantizeError(f"{src}: llama.cpp wrote an unreadable file ({exc.reason})") from None
        if result_info.n_tensors != info.n_tensors:
            raise QuantizeError(f"{src}: the result has {result_info.n_tensors} tensors instead of {info.n_tensors}")
        _fsync(tmp)
        os.replace(tmp, dst)
    except Cancelled:
        raise Cancelled(f"{src}: quantization cancelled; no file was written") from None
    except OSError as exc:  # the final flush or rename: a full disk often shows only here
        if not is_no_space(exc):
            raise
        missing, _full = space_after_failure(dst.parent, tmp, needed, info.n_tensors, info.n_tensors)
        raise QuantizeError(
            f"{src}: quantization to {qt.name} failed while saving: {disk_full_reason(dst.parent, missing)}; "
            "no file was written"
        ) from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    seconds = time.perf_counter() - started
    src_bytes = info.file_size
    dst_bytes = dst.stat().st_size
    return QuantizeResult(
        path=dst,
        src_bytes=src_bytes,
        dst_bytes=dst_bytes,
        ratio=src_bytes / dst_bytes if dst_bytes else 0.0,
        seconds=seconds,
        qtype=qt.name,
        source=src,
        source_type=info.file_type,
    )


@dataclass(frozen=True)
class _SpaceCheck:
    """What :func:`space_after_failure` needs to tell whether a failed run filled the disk."""

    folder: Path
    partial: Path
    needed: int
    done: int
    total: int

    def after_failure(self) -> tuple[int, bool]:
        return space_after_failure(self.folder, self.partial, self.needed, self.done, self.total)


def _failure(
    src: Path, qtype: str, outcome: ChildOutcome, done: int, total: int, space: _SpaceCheck | None = None
) -> str:
    where = f"after {done} of {total} tensors" if done else "before the first tensor"
    said_full = any(_NO_SPACE_TEXT.search(line) for line in [*outcome.log, outcome.error or ""])
    if space is not None and (said_full or not outcome.crashed):
        missing, full = space.after_failure()
        if said_full or full:
            return (
                f"{src}: quantization to {qtype} failed {where}: {disk_full_reason(space.folder, missing)}; "
                "no file was written"
            )
    if outcome.crashed:
        hint = " (out of memory?)" if outcome.exitcode == -signal.SIGKILL else ""
        return (
            f"{src}: the quantization process crashed {where} "
            f"({describe_exit(outcome.exitcode)}{hint}); no file was written"
        )
    reason = None
    for line in reversed(outcome.log):
        match = _FAILED.search(line)
        if match:
            reason = match.group(1).strip()
            break
    reason = reason or outcome.error or outcome.last_error_line() or describe_exit(outcome.exitcode)
    return f"{src}: quantization to {qtype} failed {where}: {reason}"


__all__ = [
    "UNQUANTIZED_TYPES",
    "ChildOutcome",
    "QuantType",
    "QuantizeProgress",
    "QuantizeResult",
    "check_free_space",
    "default_output_path",
    "describe_exit",
    "disk_full_reason",
    "expected_bytes",
    "find_quant_type",
    "is_no_space",
    "quant_types",
    "quantize_model",
    "run_logged_child",
    "size_change",
    "space_after_failure",
    "sweep_work_files",
]
