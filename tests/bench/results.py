"""One machine-readable record per benchmark figure, for the ``make bench`` summary, and the budget
check itself.

Every benchmark calls :func:`record` for each figure it reports. The record is printed (one
``BENCH {...}`` line, so a log shows it) and, when ``GLASSBOX_BENCH_RESULTS`` names a file, appended
to it as one JSON line; ``tests/bench/summary.py`` turns that file into the table.

A figure with a budget (``at_least`` / ``at_most``) is checked where it is recorded: a miss raises
:class:`BudgetMissed` (a test failure), unless it is a known miss, listed in :data:`KNOWN_MISSES`
with the issue that will close it (then the row says so and nothing fails). A figure without a
budget has no verdict (``passed`` is None): it is reported, never "ok". Inside ``with budgets():``
the misses are raised together at the end, so that every figure of a benchmark is recorded even
when the first one misses.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

RESULTS_ENV = "GLASSBOX_BENCH_RESULTS"

KNOWN_MISSES: dict[str, str] = {}
"""Figures known to miss their budget, by name, with the issue that will close each ("issue 23").
A known miss is shown as such in the table and does not fail ``make bench``; one that passes
again is shown as passing (then remove it here)."""


PICKING_ROUNDS = (0, 3)
"""Of every 4 rounds of a benchmark that holds the app's choice to the fastest of several
alternatives, those that pick the fastest (one in each order); the others compare the two. Picked
and compared on the same rounds, the best of several noisy medians is faster than that
alternative really is."""


def picking_round(index: int) -> bool:
    """Whether round ``index`` picks the fastest alternative (:data:`PICKING_ROUNDS`) or compares."""
    return index % 4 in PICKING_ROUNDS


class BudgetMissed(AssertionError):
    """A figure missed its budget and is not a known miss."""


_deferred: list[list[dict[str, Any]]] = []


def _budget_text(entry: dict[str, Any]) -> str:
    unit = "" if entry["unit"] in ("x", "") else f" {entry['unit']}"
    parts = []
    if entry["at_least"] is not None:
        parts.append(f">= {entry['at_least']:g}{unit}")
    if entry["at_most"] is not None:
        parts.append(f"<= {entry['at_most']:g}{unit}")
    return " and ".join(parts)


def describe_miss(entry: dict[str, Any]) -> str:
    """One line: the figure, its value and the budget it missed."""
    unit = {"x": "x", "": ""}.get(entry["unit"], f" {entry['unit']}")
    detail = f" ({entry['detail']})" if entry.get("detail") else ""
    return f"{entry['name']}: {entry['value']:g}{unit}, budget {_budget_text(entry)}{detail}"


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
    """Reports one figure and checks its budget.

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

    Raises:
        BudgetMissed: the figure missed its budget and is not in :data:`KNOWN_MISSES` (inside
            :func:`budgets`, raised when the block ends instead).
    """
    budgeted = at_least is not None or at_most is not None
    passed: bool | None = None
    if budgeted:
        passed = (at_least is None or value >= at_least) and (at_most is None or value <= at_most)
    entry: dict[str, Any] = {
        "name": name,
        "value": round(float(value), 4),
        "unit": unit,
        "at_least": at_least,
        "at_most": at_most,
        "passed": passed,
        "known_miss": KNOWN_MISSES.get(name) if passed is False else None,
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
    if passed is False and entry["known_miss"] is None:
        if _deferred:
            _deferred[-1].append(entry)
        else:
            raise BudgetMissed(describe_miss(entry))
    return entry


@contextlib.contextmanager
def budgets() -> Iterator[None]:
    """Records every figure of the block, then raises :class:`BudgetMissed` naming all that missed."""
    _deferred.append([])
    try:
        yield
    finally:
        missed = _deferred.pop()
    if missed:
        raise BudgetMissed("; ".join(describe_miss(entry) for entry in missed))
