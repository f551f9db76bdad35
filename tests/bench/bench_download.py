"""Download throughput: ``engine.downloads.download_file`` vs a plain streaming copy of the same bytes.

Run explicitly: ``pytest tests/bench/bench_download.py -s`` (``BENCH_DOWNLOAD_MIB`` sets the size,
default 200; ``BENCH_DOWNLOAD_RUNS`` the runs per side, default 5).

The fake Hub serves the file from memory in a separate process (so the server does not compete
for this process's GIL). The baseline is a urllib read loop into a file, with no hashing, no
resume metadata and no checks; Glassbox's downloader also hashes every byte (sha256), writes its
resume checkpoints, fsyncs and renames. Runs alternate (ours, plain, ours, ...) and the median
ratio is printed. Budget (issue 3): ratio >= 0.8.
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
from pathlib import Path

from engine.downloads import download_file

ROOT = Path(__file__).resolve().parents[2]
MIB = int(os.environ.get("BENCH_DOWNLOAD_MIB", "200"))
RUNS = int(os.environ.get("BENCH_DOWNLOAD_RUNS", "5"))
REPO = "bench/big-GGUF"
NAME = "big-Q4_K_M.gguf"

_SERVER = textwrap.dedent(f"""
    import sys, threading
    sys.path.insert(0, {str(ROOT / "tests" / "engine")!r})
    from hub_server import FakeHub, random_bytes
    with FakeHub() as hub:
        hub.add_repo({REPO!r}, {{{NAME!r}: random_bytes(int(sys.argv[1]) * 2**20, 7)}})
        print(hub.url, flush=True)
        sys.stdin.read()  # serve until the benchmark closes our stdin
""")


def _plain_copy(url: str, target: Path) -> None:
    with urllib.request.urlopen(url) as response, open(target, "wb") as out:
        while chunk := response.read(1 << 20):
            out.write(chunk)


def test_download_throughput_vs_plain_copy() -> None:
    server = subprocess.Popen([sys.executable, "-c", _SERVER, str(MIB)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    work = Path(tempfile.mkdtemp(prefix="bench-download-"))
    try:
        assert server.stdout is not None
        endpoint = server.stdout.readline().strip()
        url = f"{endpoint}/{REPO}/resolve/main/{NAME}"
        ours: list[float] = []
        plain: list[float] = []
        size = MIB * 2**20
        _plain_copy(url, work / "warmup")  # warm the page cache and the server
        (work / "warmup").unlink()
        for _ in range(RUNS):
            began = time.perf_counter()
            result = download_file(REPO, NAME, work / "ours", endpoint=endpoint, disk_margin_bytes=0)
            ours.append(time.perf_counter() - began)
            assert result.size == size
            shutil.rmtree(work / "ours")
            began = time.perf_counter()
            _plain_copy(url, work / "plain")
            plain.append(time.perf_counter() - began)
            assert (work / "plain").stat().st_size == size
            (work / "plain").unlink()
        ratios = [p / o for o, p in zip(ours, plain, strict=True)]
        ratio = statistics.median(ratios)
        print(f"\ndownload {MIB} MiB x {RUNS} (interleaved), loopback fake Hub in another process")
        print(f"  glassbox (sha256 + resume checkpoints + fsync): median {statistics.median(ours):.3f} s "
              f"= {MIB / statistics.median(ours):.0f} MiB/s")
        print(f"  plain urllib copy (no hashing):                 median {statistics.median(plain):.3f} s "
              f"= {MIB / statistics.median(plain):.0f} MiB/s")
        print(f"  throughput ratio glassbox/plain: median {ratio:.2f} (runs: "
              f"{', '.join(f'{r:.2f}' for r in ratios)}); budget >= 0.8")
        assert ratio >= 0.8, f"download throughput ratio {ratio:.2f} < 0.8"
    finally:
        if server.stdin is not None:
            server.stdin.close()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        shutil.rmtree(work, ignore_errors=True)
