"""Benchmarks take minutes, more on a busy machine: each gets an hour (the suite's limit is 600 s)."""

from __future__ import annotations

import pytest

BENCH_TIMEOUT_S = 3600


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name.startswith("bench_"):
            item.add_marker(pytest.mark.timeout(BENCH_TIMEOUT_S))
