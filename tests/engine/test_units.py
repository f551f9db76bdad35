"""engine.units: the one wording of sizes, speeds, times left and durations (the GUI and the CLI both print it)."""

from __future__ import annotations

import pytest

from engine.units import format_bytes, format_duration, format_eta, format_speed


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (None, "—"),
        (0, "0 B"),
        (512, "512 B"),
        (1536, "1.5 KiB"),
        (253_113_024, "241.4 MiB"),
        (3 * 2**30, "3.0 GiB"),
        (1.5 * 2**40, "1.5 TiB"),
        (2**50, "1024.0 TiB"),
    ],
)
def test_format_bytes(n: float | None, text: str) -> None:
    assert format_bytes(n) == text


def test_format_speed() -> None:
    assert format_speed(0) == "—"
    assert format_speed(2048.0) == "2.0 KiB/s"
    assert format_speed(12.34 * 2**20) == "12.3 MiB/s"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, ""),
        (-1.0, ""),
        (0.0, "0 s left"),
        (25.0, "25 s left"),
        (89.0, "89 s left"),
        (300.0, "5 min left"),
        (5400.0, "1.5 h left"),
    ],
)
def test_format_eta(seconds: float | None, text: str) -> None:
    assert format_eta(seconds) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0 ms"),
        (0.09, "90 ms"),
        (4.21, "4.2 s"),
        (41.2, "41 s"),
        (130.0, "2 min 10 s"),
        (3725.0, "62 min 5 s"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
