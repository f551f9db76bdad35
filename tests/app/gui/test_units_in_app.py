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
        ("app.gui.workers.history_disk", "format_bytes"),
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


@pytest.mark.parametrize("name", ["app.gui.knowledge_panel", "app.cli.commands.kb"])
def test_the_indexing_time_left_is_engine_units_with_its_estimate_word(name: str) -> None:
    module = importlib.import_module(name)
    assert module.format_eta is units.format_eta, f"{name} keeps its own format_eta"


def test_the_indexing_time_left_reads_as_the_downloads_do() -> None:
    from types import SimpleNamespace

    from app.cli.commands.kb import _progress_words
    from app.gui.knowledge_panel import approximate_eta

    assert approximate_eta(40) == "~40 s left"
    assert approximate_eta(300) == "~5 min left"
    assert approximate_eta(5400) == "~1.5 h left"  # hours, as a download says them
    assert approximate_eta(None) == "" and approximate_eta(-1) == ""
    progress = SimpleNamespace(
        state="indexing", chunks_total=None, chunks_done=7, files_done=2, files_total=4, current_file=None, eta_s=5400.0
    )
    assert _progress_words(progress) == "indexing 2/4 files, 7 chunks, about 1.5 h left"  # type: ignore[arg-type]
    assert _progress_words(SimpleNamespace(**{**vars(progress), "eta_s": 0.0})).endswith("7 chunks")  # type: ignore[arg-type]
