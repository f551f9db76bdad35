"""Download throughput: ``engine.hub.downloads.download_file`` vs a plain streaming copy of the same bytes.

Run explicitly: ``pytest tests/bench/bench_download.py -s`` (``BENCH_DOWNLOAD_MIB`` sets the size,
default 200; ``BENCH_DOWNLOAD_RUNS`` the runs per side, default 5).

The fake Hub serves the file from memory in a separate process (so the server does not compete
for this process's GIL). Glassbox's downloader hashes every byte (sha256), writes its resume
checkpoints, and makes the file durable before the atomic rename (ROBUSTNESS.md rule 3: fsync,
then ``os.replace``). Two baselines run interleaved with it (ours, plain, plain + fsync, ...):

- a urllib read loop into a file, no hashing and no checks, that ends with the bytes still in the
  page cache (the kernel writes them to disk after the clock stops);
- the same loop followed by one fsync: the same bytes made just as durable as ours.

On loopback the network outruns the disk: the same-durability ratio is the one the budget
(issue 3: ratio >= 0.8) is checked against at full loopback speed. The second test throttles the
server to 1 Gbit/s (a fast real connection, still far above most Hub downloads), where the disk
keeps up, and checks ours against the page-cache-only copy: there the background writeback and
hashing must hide behind the network.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.hub.downloads import download_file

ROOT = Path(__file__).resolve().parents[2]
MIB = int(os.environ.get("BENCH_DOWNLOAD_MIB", "200"))
RUNS = int(os.environ.get("BENCH_DOWNLOAD_RUNS", "5"))
REPO = "bench/big-GGUF"
NAME = "big-Q4_K_M.gguf"
GBIT_BPS = 125_000_000

_SERVER = textwrap.dedent(f"""
    import sys, threading
    sys.path.insert(0, {str(ROOT / "tests" / "engine")!r})
    from hub_server import FakeHub, random_bytes
    with FakeHub() as hub:
        hub.faults.throttle_bps = float(sys.argv[2])
        hub.add_repo({REPO!r}, {{{NAME!r}: random_bytes(int(sys.argv[1]) * 2**20, 7)}})
        print(hub.url, flush=True)
        sys.stdin.read()  # serve until the benchmark closes our stdin
""")


def _plain_copy(url: str, target: Path, *, fsync: bool) -> None:
    with urllib.request.urlopen(url) as response, open(target, "wb") as out:
        while chunk := response.read(1 << 20):
            out.write(chunk)
        if fsync:
            out.flush()
            os.fsync(out.fileno())


@pytest.fixture
def hub(request: pytest.FixtureRequest) -> Iterator[tuple[str, Path, int]]:
    mib, throttle = request.param
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVER, str(mib), str(throttle)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    work = Path(tempfile.mkdtemp(prefix="bench-download-"))
    try:
        assert server.stdout is not None
        yield server.stdout.readline().strip(), work, mib
    finally:
        if server.stdin is not None:
            server.stdin.close()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        shutil.rmtree(work, ignore_errors=True)


def _race(endpoint: str, work: Path, mib: int, runs: int) -> tuple[list[float], list[float], list[float]]:
    """Times (ours, plain, plain + fsync), interleaved, ``runs`` rounds."""
    url = f"{endpoint}/{REPO}/resolve/main/{NAME}"
    size = mib * 2**20
    ours: list[float] = []
    plain: list[float] = []
    durable: list[float] = []
    _plain_copy(url, work / "warmup", fsync=True)  # warm the server and the page cache
    (work / "warmup").unlink()

    def glassbox() -> None:
        os.sync()  # start each run with no dirty pages from the last one
        began = time.perf_counter()
        result = download_file(REPO, NAME, work / "ours", endpoint=endpoint, disk_margin_bytes=0)
        ours.append(time.perf_counter() - began)
        assert result.size == size
        shutil.rmtree(work / "ours")

    def plain_copies() -> None:
        for side, fsync in ((plain, False), (durable, True)):
            os.sync()
            began = time.perf_counter()
            _plain_copy(url, work / "plain", fsync=fsync)
            side.append(time.perf_counter() - began)
            assert (work / "plain").stat().st_size == size
            (work / "plain").unlink()

    for i in range(runs):  # alternate which side goes first
        for run in (glassbox, plain_copies) if i % 2 == 0 else (plain_copies, glassbox):
            run()
    return ours, plain, durable


def _ratios(ours: list[float], base: list[float]) -> tuple[float, str]:
    ratios = [b / o for o, b in zip(ours, base, strict=True)]
    return statistics.median(ratios), ", ".join(f"{r:.2f}" for r in ratios)


@pytest.mark.parametrize("hub", [(MIB, 0)], indirect=True)
def test_download_throughput_vs_plain_copy(hub: tuple[str, Path, int]) -> None:
    endpoint, work, mib = hub
    ours, plain, durable = _race(endpoint, work, mib, RUNS)
    vs_durable, runs_durable = _ratios(ours, durable)
    vs_plain, runs_plain = _ratios(ours, plain)
    med = statistics.median
    print(f"\ndownload {mib} MiB x {RUNS} (interleaved), loopback fake Hub in another process, full speed")
    print(f"  glassbox (sha256 + checkpoints + fsync + rename): median {med(ours):.3f} s = {mib / med(ours):.0f} MiB/s")
    print(
        f"  plain copy + fsync (same durability):             median {med(durable):.3f} s "
        f"= {mib / med(durable):.0f} MiB/s"
    )
    print(
        f"  plain copy left in the page cache:                median {med(plain):.3f} s = {mib / med(plain):.0f} MiB/s"
    )
    print(f"  ratio glassbox / plain + fsync: median {vs_durable:.2f} ({runs_durable}); budget >= 0.8")
    print(
        f"  ratio glassbox / page-cache copy: median {vs_plain:.2f} ({runs_plain}); bounded here by the "
        f"disk: durable writes run at {mib / med(durable):.0f} MiB/s, the loopback at {mib / med(plain):.0f}"
    )
    from tests.bench.results import record

    record("download vs durable plain copy", vs_durable, at_least=0.8, detail=f"{mib} MiB, loopback")


@pytest.mark.parametrize("hub", [(max(16, MIB // 2), GBIT_BPS)], indirect=True)
def test_download_throughput_at_one_gigabit(hub: tuple[str, Path, int]) -> None:
    endpoint, work, mib = hub
    runs = max(3, RUNS - 2)
    ours, plain, _ = _race(endpoint, work, mib, runs)
    vs_plain, runs_plain = _ratios(ours, plain)
    med = statistics.median
    print(f"\ndownload {mib} MiB x {runs} (interleaved), fake Hub throttled to 1 Gbit/s")
    print(f"  glassbox (sha256 + checkpoints + fsync + rename): median {med(ours):.3f} s = {mib / med(ours):.0f} MiB/s")
    print(
        f"  plain copy left in the page cache:                median {med(plain):.3f} s = {mib / med(plain):.0f} MiB/s"
    )
    print(f"  ratio glassbox / page-cache copy: median {vs_plain:.2f} ({runs_plain}); budget >= 0.8")
    from tests.bench.results import record

    record("download vs plain copy at 1 Gbit/s", vs_plain, at_least=0.8, detail=f"{mib} MiB")
