"""One machine-readable record per benchmark figure, for the ``make bench`` summary.

Every benchmark calls :func:`record` for each ratio (or latency) it asserts a budget on. The record
is printed (one ``BENCH {...}`` line, so a log shows it) and, when ``GLASSBOX_BENCH_RESULTS`` names a
file, appended to it as one JSON line. ``tests/bench/summary.py`` turns that file into the table.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

RESULTS_ENV = "GLASSBOX_BENCH_RESULTS"


def record(
    name: str,
    value: float,
    *,
    unit: str = "x",
    at_least: float | None = None,
    at_most: float | None = None,
    detail: str = "",
    bench: str = "",
) -> dict[str, Any]:
    """Reports one figure and its budget.

    Args:
        name: what is compared, as the table shows it ("engine vs raw: decode").
        value: the measured ratio (or latency, with ``unit``).
        unit: ``"x"`` for a ratio, else the unit of ``value`` ("ms").
        at_least: the budget's floor, if any.
        at_most: the budget's ceiling, if any.
        detail: the two sides' figures, short ("engine 61.2 tok/s, raw 62.0 tok/s").
        bench: the benchmark file (default: the caller's test, from pytest's environment).

    Returns:
        The record written.
    """
    passed = (at_least is None or value >= at_least) and (at_most is None or value <= at_most)
    entry = {
        "name": name,
        "value": round(float(value), 4),
        "unit": unit,
        "at_least": at_least,
        "at_most": at_most,
        "passed": passed,
        "detail": detail,
        "bench": bench or os.environ.get("PYTEST_CURRENT_TEST", "").split("::")[0],
        "at": time.time(),
    }
    print(f"BENCH {json.dumps(entry)}", flush=True)
    target = os.environ.get(RESULTS_ENV)
    if target:
        path = Path(target)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")
    return entry
