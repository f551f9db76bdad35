"""Start-up time: launch to "main window shown" for Glassbox vs an empty PySide6 window.

Run explicitly: ``pytest tests/bench/bench_startup.py -s`` (``BENCH_STARTUP_RUNS`` runs per side,
default 21: a run takes 0.1-0.3 s, and medians of 9 moved the ratio by 0.3 from one run of the
benchmark to the next), or ``python tests/bench/bench_startup.py``.

Each run is a fresh Python process (offscreen platform), measured from just before the process is
spawned until it prints a line once its window's first frame is painted (the empty window: after
``show()`` and one event-loop pass). Glassbox's side is the real launch, ``python -m app --home
DIR`` (the ``glassbox`` command): the command line, the single-instance lock, a glance at the
settings file, the window's first step (``GLASSBOX_TEST_EXIT_WHEN_SHOWN`` makes
``app.gui.launch.run_gui`` print "shown" once the first frame is on screen, then "complete" once
what that frame left out, the settings read in full, the controllers and adapters and the
inspector's tabs, is built and painted, and leave: ARCHITECTURE.md, "The window's start"). The two
sides alternate (empty then Glassbox, Glassbox then empty, ...) so machine load affects both alike;
medians and their ratio are printed. Glassbox starts with a fresh temporary home and no model
auto-load (the model loads after the window shows, so it does not belong in this number). The
children write their bytecode cache, as an installed app has one (``PYTHONDONTWRITEBYTECODE`` in
the caller's environment would have Glassbox's side compile its modules at every run). Budgets
(ARCHITECTURE.md): the window shown within 2x the empty window's time, and <= 1.0 s; the complete
window is reported without one.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNS = int(os.environ.get("BENCH_STARTUP_RUNS", "21"))

EMPTY = """
from PySide6.QtWidgets import QApplication, QMainWindow
app = QApplication([])
w = QMainWindow()
w.resize(1320, 820)
w.show()
app.processEvents()
print("shown", flush=True)
"""


def time_to_shown(code: str | None, *args: str) -> tuple[float, float]:
    """Seconds from spawning a Python process running ``code`` (None: ``python -m app ARGS``, the
    app's launch) to its "shown" line, and to its "complete" line (the empty window: "shown")."""
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(ROOT), "GLASSBOX_TEST_EXIT_WHEN_SHOWN": "1"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    command = [sys.executable, "-m", "app", *args] if code is None else [sys.executable, "-c", code, *args]
    started = time.perf_counter()
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    shown = time.perf_counter() - started
    if line.strip() != "shown":
        proc.wait(timeout=60)
        raise RuntimeError(f"the window did not show (exit code {proc.returncode})")
    complete = shown
    if code is None:
        line = proc.stdout.readline()
        complete = time.perf_counter() - started
        if line.strip() != "complete":
            proc.wait(timeout=60)
            raise RuntimeError(f"the window was not completed (exit code {proc.returncode})")
    proc.wait(timeout=60)
    return shown, complete


def measure(runs: int = RUNS) -> dict[str, float]:
    """Interleaved runs; returns the medians and their ratio."""
    empty: list[float] = []
    ours: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        time_to_shown(EMPTY)  # warm the OS file cache (and the bytecode cache) for both sides
        time_to_shown(None, "--home", str(Path(tmp) / "warm"), "--safe-mode")
        for i in range(runs):
            # A fresh home each time, in safe mode: no model is loaded (it would load after the
            # window shows, so it does not belong in this number).
            home = str(Path(tmp) / f"home{i}")
            pair = [lambda: empty.append(time_to_shown(EMPTY)[0]),
                    lambda h=home: ours.append(time_to_shown(None, "--home", h, "--safe-mode"))]  # fmt: skip
            for run in pair if i % 2 == 0 else reversed(pair):
                run()
    result = {
        "empty_median_s": statistics.median(empty),
        "glassbox_median_s": statistics.median(shown for shown, _ in ours),
        "complete_median_s": statistics.median(complete for _, complete in ours),
    }
    result["ratio"] = result["glassbox_median_s"] / result["empty_median_s"]
    result["complete_ratio"] = result["complete_median_s"] / result["empty_median_s"]
    return result


def report(result: dict[str, float]) -> str:
    return (
        f"startup: empty PySide6 window {result['empty_median_s']:.3f} s, "
        f"Glassbox {result['glassbox_median_s']:.3f} s (median of {RUNS}), ratio {result['ratio']:.2f}; "
        f"complete {result['complete_median_s']:.3f} s, ratio {result['complete_ratio']:.2f}"
    )


def test_startup_time() -> None:
    result = measure()
    print(report(result))
    from tests.bench.results import budgets, record

    with budgets():
        record(
            "window vs bare Qt: start-up",
            result["ratio"],
            at_most=2.0,
            detail=f"{result['glassbox_median_s']:.3f} vs {result['empty_median_s']:.3f} s, median of {RUNS}",
        )
        record(
            "main window shown",
            result["glassbox_median_s"],
            unit="s",
            at_most=1.0,
            detail=f"median of {RUNS}, fresh home, no model",
        )
        record(  # what the first frame left out built too: no budget, for the table
            "window vs bare Qt: complete",
            result["complete_ratio"],
            detail=f"{result['complete_median_s']:.3f} vs {result['empty_median_s']:.3f} s, median of {RUNS}",
        )


if __name__ == "__main__":
    print(report(measure()))
