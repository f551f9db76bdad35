"""What this machine has for running models: RAM, cores, GPUs, and its memory bandwidth.

Decode speed on a local model is bound by memory bandwidth (every token reads all the weights), so
the bandwidth probe gives the user a ceiling to compare the measured speed with. GPU probing uses
the vendors' command-line tools (``nvidia-smi``, ``rocm-smi``) with short timeouts and never fails:
an absent or broken tool just means no GPU of that kind.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from engine.atomic import write_text_atomic
from engine.cpu_backend import cpu_name, load_backends

__all__ = [
    "GpuInfo",
    "HardwareInfo",
    "cached_memory_bandwidth",
    "cpu_name",
    "llama_supports_gpu_offload",
    "measure_memory_bandwidth",
    "parse_nvidia_smi",
    "parse_rocm_smi",
    "probe_hardware",
]

MIB = 1 << 20
TOOL_TIMEOUT_S = 3.0
# Metal lets one process wire about this share of unified memory (recommendedMaxWorkingSetSize is
# ~2/3 to ~3/4 of RAM depending on the machine); the lower figure keeps the estimate honest.
APPLE_GPU_SHARE = 0.66


@dataclass(frozen=True)
class GpuInfo:
    """One GPU. ``unified_memory`` is True where VRAM is the system RAM (Apple Silicon)."""

    name: str
    vendor: str  # "nvidia" | "amd" | "apple"
    total_vram: int
    free_vram: int
    unified_memory: bool = False


@dataclass(frozen=True)
class HardwareInfo:
    """A snapshot of the machine. Sizes in bytes."""

    total_ram: int
    available_ram: int
    cpu_count_physical: int
    cpu_count_logical: int
    cpu_name: str
    gpu_offload_supported: bool
    gpus: list[GpuInfo] = field(default_factory=list)
    # The CPU code llama.cpp runs on here (engine.cpu_backend.BackendInfo.to_dict()); None: not asked.
    cpu_backend: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


Runner = Callable[[list[str]], str | None]


def _run_tool(argv: list[str]) -> str | None:
    """Runs a probe tool; its stdout, or None when it is absent, fails or hangs."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=TOOL_TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def parse_nvidia_smi(text: str) -> list[GpuInfo]:
    """Parses ``nvidia-smi --query-gpu=name,memory.total,memory.free --format=csv,noheader,nounits``.

    Memory figures are MiB; rows that do not parse (``[N/A]``, a driver error) are skipped.
    """
    gpus: list[GpuInfo] = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.rsplit(",", 2)]
        if len(parts) != 3:
            continue
        name, total, free = parts
        try:
            gpus.append(GpuInfo(name, "nvidia", int(float(total) * MIB), int(float(free) * MIB)))
        except ValueError:
            continue
    return gpus


def parse_rocm_smi(text: str) -> list[GpuInfo]:
    """Parses ``rocm-smi --showmeminfo vram --json`` (bytes, per ``cardN``)."""
    try:
        data = json.loads(text)
    except ValueError:
        return []
    gpus: list[GpuInfo] = []
    if not isinstance(data, dict):
        return gpus
    for card, fields in sorted(data.items()):
        if not isinstance(fields, dict):
            continue
        total = used = None
        for key, value in fields.items():
            lowered = str(key).lower()
            if "vram total memory" in lowered:
                total = _to_int(value)
            elif "vram total used memory" in lowered:
                used = _to_int(value)
        if total is not None:
            gpus.append(GpuInfo(f"AMD GPU {card}", "amd", total, max(0, total - (used or 0))))
    return gpus


def _to_int(value: object) -> int | None:
    try:
        return int(str(value).strip())
    except ValueError:
        return None


def llama_supports_gpu_offload() -> bool:
    """Whether the installed llama-cpp-python build can offload layers (CUDA, Metal, Vulkan...).

    In the portable build the GPU backends are libraries loaded at run time, so they are loaded
    first (:func:`engine.cpu_backend.load_backends`; nothing runs on them here).
    """
    load_backends()
    try:
        # lazy: heavy (llama_cpp), optional
        import llama_cpp
    except ImportError:
        return False
    try:
        return bool(llama_cpp.llama_supports_gpu_offload())
    except (AttributeError, OSError):
        return False


def _backend_dict() -> dict[str, Any]:
    return load_backends().to_dict()


def probe_hardware(
    *,
    run: Runner = _run_tool,
    system: str | None = None,
    machine: str | None = None,
    offload: bool | None = None,
) -> HardwareInfo:
    """Looks at RAM, CPU and GPUs. Never raises for a missing tool; takes at most a few seconds.

    Args:
        run: runs a probe tool and returns its stdout or None (tests pass a fake).
        system: ``platform.system()`` override (tests).
        machine: ``platform.machine()`` override (tests).
        offload: whether the llama.cpp build supports GPU offload; None asks llama-cpp-python.
    """
    # lazy: start-up (+14 ms: psutil)
    import psutil

    memory = psutil.virtual_memory()
    system = system or platform.system()
    machine = machine or platform.machine()
    logical = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    physical = psutil.cpu_count(logical=False) or logical
    name = cpu_name()
    gpus: list[GpuInfo] = []
    if system == "Darwin" and machine == "arm64":
        share = int(memory.total * APPLE_GPU_SHARE)
        gpus.append(GpuInfo(name, "apple", share, min(share, int(memory.available)), unified_memory=True))
    else:
        query = "--query-gpu=name,memory.total,memory.free"
        out = run(["nvidia-smi", query, "--format=csv,noheader,nounits"])
        if out:
            gpus += parse_nvidia_smi(out)
        out = run(["rocm-smi", "--showmeminfo", "vram", "--json"])
        if out:
            gpus += parse_rocm_smi(out)
    return HardwareInfo(
        total_ram=int(memory.total),
        available_ram=int(memory.available),
        cpu_count_physical=int(physical),
        cpu_count_logical=int(logical),
        cpu_name=name,
        gpu_offload_supported=llama_supports_gpu_offload() if offload is None else offload,
        cpu_backend=_backend_dict() if offload is None else None,
        gpus=gpus,
    )


def measure_memory_bandwidth(seconds: float = 0.5, size_bytes: int = 256 * MIB, threads: int | None = None) -> float:
    """Measures this machine's memory copy bandwidth in GB/s (10^9 bytes per second).

    Copies a ``size_bytes`` array into another, repeatedly for about ``seconds``, and keeps the
    best copy: each copy reads and writes ``size_bytes``, so it moves ``2 * size_bytes``. The array
    is far larger than CPU caches, so this is the RAM's sustained rate, the ceiling for decoding.
    One core rarely saturates a many-channel memory system, so half the time is spent copying with
    one thread and half with ``threads`` threads each copying a slice (numpy releases the GIL while
    copying); the better rate wins.

    Args:
        seconds: how long to keep measuring (at least three copies per mode are timed).
        size_bytes: the array size; keep it well above the last-level cache.
        threads: threads for the parallel half; None uses the physical cores (at most 8).
    """
    # lazy: start-up (+97 ms: numpy)
    import numpy as np

    src = np.ones(max(1, size_bytes // 8), dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch every page before timing
    if threads is None:
        # lazy: start-up (+20 ms: psutil)
        import psutil

        threads = min(8, psutil.cpu_count(logical=False) or os.cpu_count() or 1)
    best = _best_copy_time(lambda: np.copyto(dst, src), seconds / 2 if threads > 1 else seconds)
    if threads > 1:
        # lazy: start-up (+4 ms)
        from concurrent.futures import ThreadPoolExecutor

        bounds = [(len(src) * i // threads, len(src) * (i + 1) // threads) for i in range(threads)]

        def copy_slice(bound: tuple[int, int]) -> None:
            np.copyto(dst[bound[0] : bound[1]], src[bound[0] : bound[1]])

        with ThreadPoolExecutor(threads) as pool:
            best = min(best, _best_copy_time(lambda: list(pool.map(copy_slice, bounds)), seconds / 2))
    return 2 * src.nbytes / best / 1e9


def _best_copy_time(copy: Callable[[], object], seconds: float) -> float:
    best = float("inf")
    deadline = time.perf_counter() + seconds
    runs = 0
    while runs < 3 or time.perf_counter() < deadline:
        start = time.perf_counter()
        copy()
        best = min(best, time.perf_counter() - start)
        runs += 1
    return best


def cached_memory_bandwidth(
    cache_file: Path,
    max_age_days: float = 30,
    *,
    measure: Callable[[], float] = measure_memory_bandwidth,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> float:
    """The machine's memory bandwidth (GB/s), measured once and cached as JSON.

    The cache is ``{"gbps", "measured_at", "cpu"}``. It is measured again when the file is missing,
    unreadable or corrupt, older than ``max_age_days``, or was measured on a different CPU. The
    file is written atomically (temp file, fsync, rename); a failed write is not an error.
    """
    cpu = cpu_name()
    try:
        data = json.loads(cache_file.read_text(encoding="utf-8"))
        gbps = float(data["gbps"])
        measured_at = datetime.fromisoformat(str(data["measured_at"]))
        if measured_at.tzinfo is None:
            measured_at = measured_at.replace(tzinfo=UTC)
        fresh = now() - measured_at <= timedelta(days=max_age_days)
        if fresh and data.get("cpu") == cpu and gbps > 0:
            return gbps
    except (OSError, ValueError, KeyError, TypeError):
        pass
    gbps = float(measure())
    record = {"gbps": round(gbps, 3), "measured_at": now().isoformat(), "cpu": cpu}
    with contextlib.suppress(OSError):
        write_text_atomic(cache_file, json.dumps(record, indent=2) + "\n")
    return gbps
