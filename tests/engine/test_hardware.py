"""Hardware probe: GPU tool parsing, fake tools on PATH, the bandwidth probe and its cache."""

from __future__ import annotations

import json
import math
import os
import stat
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from engine import hardware
from engine.hardware import (
    GpuInfo,
    cached_memory_bandwidth,
    cpu_name,
    llama_supports_gpu_offload,
    measure_memory_bandwidth,
    parse_nvidia_smi,
    parse_rocm_smi,
    probe_hardware,
)

NVIDIA_CSV = "NVIDIA GeForce RTX 3060, 12288, 11950\nNVIDIA H200, 143771, [N/A]\nTesla T4, 15360, 15000\n"
ROCM_JSON = json.dumps(
    {
        "card0": {"VRAM Total Memory (B)": "17163091968", "VRAM Total Used Memory (B)": "1073741824"},
        "card1": {"VRAM Total Memory (B)": "oops"},
        "system": "not a card",
    }
)
MIB = 1 << 20


def test_parse_nvidia_smi_skips_rows_it_cannot_read() -> None:
    gpus = parse_nvidia_smi(NVIDIA_CSV)
    assert gpus == [
        GpuInfo("NVIDIA GeForce RTX 3060", "nvidia", 12288 * MIB, 11950 * MIB),
        GpuInfo("Tesla T4", "nvidia", 15360 * MIB, 15000 * MIB),
    ]
    assert parse_nvidia_smi("") == []
    assert parse_nvidia_smi("NVIDIA-SMI has failed because it couldn't communicate with the driver") == []


def test_parse_rocm_smi() -> None:
    assert parse_rocm_smi(ROCM_JSON) == [GpuInfo("AMD GPU card0", "amd", 17163091968, 17163091968 - 2**30)]
    assert parse_rocm_smi("not json") == []
    assert parse_rocm_smi("[1, 2]") == []


def test_probe_with_fake_tools() -> None:
    calls: list[str] = []

    def run(argv: list[str]) -> str | None:
        calls.append(argv[0])
        return {"nvidia-smi": NVIDIA_CSV, "rocm-smi": ROCM_JSON}.get(argv[0])

    hw = probe_hardware(run=run, system="Linux", machine="x86_64", offload=True)
    assert calls == ["nvidia-smi", "rocm-smi"]
    assert [g.vendor for g in hw.gpus] == ["nvidia", "nvidia", "amd"]
    assert hw.gpu_offload_supported
    assert 0 < hw.available_ram <= hw.total_ram
    assert 1 <= hw.cpu_count_physical <= hw.cpu_count_logical
    assert hw.to_dict()["gpus"][0]["name"] == "NVIDIA GeForce RTX 3060"


def test_probe_without_gpus() -> None:
    hw = probe_hardware(run=lambda argv: None, system="Linux", machine="x86_64", offload=False)
    assert hw.gpus == []
    assert not hw.gpu_offload_supported


def test_apple_silicon_is_unified_memory() -> None:
    hw = probe_hardware(
        run=lambda argv: pytest.fail("no tools on macOS"), system="Darwin", machine="arm64", offload=True
    )
    (gpu,) = hw.gpus
    assert gpu.vendor == "apple"
    assert gpu.unified_memory
    assert gpu.total_vram < hw.total_ram
    assert gpu.free_vram <= gpu.total_vram


def _fake_tool(folder: Path, name: str, body: str) -> None:
    tool = folder / name
    tool.write_text(f"#!{sys.executable}\n{body}\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)


@pytest.mark.skipif(sys.platform == "win32", reason="shebang tools")
def test_real_subprocess_probe_with_tools_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_tool(tmp_path, "nvidia-smi", f"import sys; sys.stdout.write({NVIDIA_CSV!r})")
    _fake_tool(tmp_path, "rocm-smi", "import sys; sys.exit(3)")  # a broken tool is no GPU, not an error
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ.get("PATH", ""))
    hw = probe_hardware(system="Linux", machine="x86_64", offload=False)
    assert [g.name for g in hw.gpus] == ["NVIDIA GeForce RTX 3060", "Tesla T4"]


@pytest.mark.skipif(sys.platform == "win32", reason="shebang tools")
def test_hanging_tool_times_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_tool(tmp_path, "nvidia-smi", "import time; time.sleep(30)")
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.setattr(hardware, "TOOL_TIMEOUT_S", 0.5)
    start = time.monotonic()
    hw = probe_hardware(system="Linux", machine="x86_64", offload=False)
    # A hang guard, not a speed target: the tool hangs 30 s; 20 s is 40x its 0.5 s timeout.
    assert time.monotonic() - start < 20
    assert hw.gpus == []


def test_offload_flag_is_false_without_llama_cpp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # makes `import llama_cpp` fail
    assert llama_supports_gpu_offload() is False


def test_cpu_name_is_not_empty() -> None:
    assert cpu_name().strip()


def test_measure_memory_bandwidth_is_a_plausible_rate() -> None:
    gbps = measure_memory_bandwidth(seconds=0.05, size_bytes=16 * MIB, threads=2)
    assert math.isfinite(gbps)
    assert 0.1 < gbps < 10_000


class _Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def test_bandwidth_cache_lifecycle(tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "memory_bandwidth.json"
    measured: list[float] = []

    def measure() -> float:
        measured.append(10.0 + len(measured))
        return measured[-1]

    clock = _Clock()
    assert cached_memory_bandwidth(cache, measure=measure, now=clock) == 10.0
    record = json.loads(cache.read_text())
    assert record["gbps"] == 10.0
    assert record["cpu"] == cpu_name()
    assert datetime.fromisoformat(record["measured_at"]) == clock.now
    # fresh: served from the cache
    clock.now += timedelta(days=29)
    assert cached_memory_bandwidth(cache, measure=measure, now=clock) == 10.0
    assert len(measured) == 1
    # stale: measured again
    clock.now += timedelta(days=2)
    assert cached_memory_bandwidth(cache, measure=measure, now=clock) == 11.0
    # another CPU (the cache moved with a profile): measured again
    record = json.loads(cache.read_text())
    cache.write_text(json.dumps({**record, "cpu": "Some Other CPU"}))
    assert cached_memory_bandwidth(cache, measure=measure, now=clock) == 12.0
    # corrupt: measured again, and repaired
    cache.write_text("{not json")
    assert cached_memory_bandwidth(cache, measure=measure, now=clock) == 13.0
    assert json.loads(cache.read_text())["gbps"] == 13.0
    # no temporary files left behind
    assert [p.name for p in cache.parent.iterdir()] == [cache.name]


def test_bandwidth_cache_survives_an_unwritable_folder(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert cached_memory_bandwidth(blocker / "sub" / "bw.json", measure=lambda: 5.0) == 5.0
