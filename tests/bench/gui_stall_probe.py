"""The real window, offscreen, while a reply streams and a folder indexes: how long the GUI thread's
event loop goes without a turn (``tests/bench/bench_gui_stall.py`` runs it in a fresh interpreter).

Usage: ``python gui_stall_probe.py HOME MODEL EMBEDDER DOCS [THREADS [NICENESS]]`` prints
``RESULT {json}``. THREADS ("auto": the product's choice) is Settings' CPU threads; NICENESS puts
the inference process below the GUI's priority (default 0, the product's).

The window loads the model and warms the knowledge process (a one-file knowledge base), then
starts the two at once: a greedy chat reply of up to 200 tokens (the same reply every run: a sampled
one from the base starter sometimes ended after 57 tokens) and indexing the
folder DOCS into another knowledge base. A 5 ms precise timer on the GUI thread records when the
event loop runs it, and the GUI thread's own CPU time then; the longest gap between two of its
turns, while both ran, is the stall, and the CPU time says how much of it the GUI thread worked
(the rest it waited for a core).
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QApplication

TICK_MS = 5


def wait(app: QApplication, done: Callable[[], bool], timeout: float = 600) -> None:
    end = time.monotonic() + timeout
    while not done():
        if time.monotonic() > end:
            raise SystemExit("timed out")
        app.processEvents()
        time.sleep(0.005)


def main(argv: list[str]) -> dict[str, Any]:
    home, model, embedder, docs = (Path(p) for p in argv[:4])
    threads = None if len(argv) < 5 or argv[4] == "auto" else int(argv[4])
    niceness = int(argv[5]) if len(argv) > 5 else 0

    from app.gui.main_window import MainWindow
    from app.gui.workers.chat_state import ChatState, ModelState
    from app.paths import Paths
    from app.settings import SamplingPreset, Settings

    app = QApplication([])
    paths = Paths.resolve(home).ensure()
    greedy = SamplingPreset(name="Bench", temperature=0.0, top_k=1, top_p=1.0, min_p=0.0, max_tokens=200)
    settings = Settings(
        theme="light", embedding_model=str(embedder), auto_load_model=False, n_threads=threads,
        presets=[greedy], default_preset=greedy.name,
    )  # fmt: skip
    w = MainWindow(paths, settings, probe_bandwidth=False)
    w.show()
    w.start()
    w.model_control.load_model(model)
    wait(app, lambda: w.chat.model_state is ModelState.LOADED)
    if niceness:  # the inference worker below the GUI's priority, as the app ran it before issue 28
        import psutil

        for child in psutil.Process().children():
            if "resource_tracker" not in " ".join(child.cmdline()):
                os.setpriority(os.PRIO_PROCESS, child.pid, niceness)

    finished: list[Any] = []
    w.knowledge.job_finished.connect(lambda _job, report: finished.append(report))
    created: list[Any] = []
    w.knowledge.create("Warm", lambda kb: created.append(kb))
    w.knowledge.create("Docs", lambda kb: created.append(kb))
    wait(app, lambda: len(created) == 2)
    warm = home / "warm-docs"
    warm.mkdir(exist_ok=True)
    (warm / "one.md").write_text("A single note, so that the knowledge process and its model are up.\n")
    w.knowledge.add("Warm", [warm])
    wait(app, lambda: bool(finished))
    finished.clear()

    ticks: list[tuple[float, float]] = []  # (wall clock, the GUI thread's own CPU time) at each turn
    timer = QTimer()
    timer.setTimerType(Qt.TimerType.PreciseTimer)
    timer.timeout.connect(lambda: ticks.append((time.perf_counter(), time.thread_time())))
    progress: list[float] = []
    w.knowledge.progress_changed.connect(lambda _job, _update: progress.append(time.perf_counter()))
    reply: list[float] = []  # when the reply's text first and last changed
    w.chat.reply_delta.connect(lambda _text, _id: reply.append(time.perf_counter()))
    timer.start(TICK_MS)
    for _ in range(20):  # the timer runs before either starts
        app.processEvents()
        time.sleep(0.005)
    started = time.perf_counter()
    w.knowledge.add("Docs", [docs])
    w.composer.edit.setPlainText("Write a long story about a lighthouse keeper and the sea.")
    w.composer.send_button.click()
    wait(app, lambda: w.chat.busy)
    wait(app, lambda: not w.chat.busy and w.chat.state is ChatState.IDLE and bool(finished))
    ended = time.perf_counter()
    timer.stop()
    stats = w.chat.last_stats
    reply_tokens = int(getattr(stats, "completion_tokens", 0) or 0)
    decode_tps = float(getattr(stats, "decode_tps", 0.0) or 0.0)
    report = finished[0]
    during = [t for t in ticks if started <= t[0] <= ended]
    gaps = [((b[0] - a[0]) * 1000, (b[1] - a[1]) * 1000) for a, b in itertools.pairwise(during)]
    longest = max(gaps, default=(0.0, 0.0))
    result = {
        "longest_gap_ms": longest[0],
        # Of the longest gap, the time the GUI thread itself ran (the rest it waited for a core: the
        # machine's load), and the longest the GUI thread ran between two turns anywhere.
        "longest_gap_gui_cpu_ms": longest[1],
        "longest_gui_busy_ms": max((cpu for _wall, cpu in gaps), default=0.0),
        "p99_gap_ms": sorted(w for w, _ in gaps)[int(0.99 * (len(gaps) - 1))] if gaps else None,
        "median_gap_ms": statistics.median(w for w, _ in gaps) if gaps else None,
        "ticks": len(during),
        "seconds": ended - started,
        "reply_tokens": reply_tokens,
        "decode_tps": decode_tps,
        "indexed": getattr(report, "indexed", None),
        "chunks": getattr(report, "chunks_added", None),
        "index_progress_events": len(progress),
        "overlap_s": min(reply[-1], progress[-1]) - max(reply[0], progress[0]) if reply and progress else 0.0,
        "threads": threads,
    }
    w.shutdown()
    return result


if __name__ == "__main__":
    sys.stdout.write("RESULT " + json.dumps(main(sys.argv[1:])) + "\n")
    sys.stdout.flush()
    # Everything was shut down and printed above: leave without the interpreter's final garbage
    # collection, as the app does (app.gui.launch.leave_process).
    os._exit(0)
