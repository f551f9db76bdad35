"""Sizes and durations across the app are worded by engine.units (no module keeps its own copy)."""

from __future__ import annotations

import importlib

import pytest

from engine import units

FORMERLY_OWN = ("format_bytes", "format_duration", "format_size", "_size")


@pytest.mark.parametrize(
    ("name", "uses"),
    [
        ("engine.fit", "format_bytes"),
        ("app.gui.inspector", "format_duration"),
        ("app.gui.saved_kv_caches", "format_bytes"),
        ("app.gui.workers.history_service", "format_bytes"),
        ("app.gui.inspector_widgets", None),
    ],
)
def test_the_former_copies_are_engine_units(name: str, uses: str | None) -> None:
    module = importlib.import_module(name)
    for attr in FORMERLY_OWN:
        value = getattr(module, attr, None)
        assert value is None or value is getattr(units, attr, None), f"{name}.{attr} is its own copy"
    if uses is not None:
        assert getattr(module, uses) is getattr(units, uses), name
