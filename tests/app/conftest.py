"""GUI test fixtures (helpers live in gui_support.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.paths import Paths


@pytest.fixture
def paths(glassbox_home: Path) -> Paths:
    return Paths.resolve(glassbox_home).ensure()


@pytest.fixture
def fake_model(paths: Paths) -> Path:
    """A model in the models folder for the picker: a well-formed GGUF header (the library lists it as
    a chat model) over zero weights; the fake session never loads it."""
    from tests.engine.gguf_fixtures import build

    model = paths.models / "fake-model.gguf"
    model.write_bytes(build().data)
    return model


@pytest.fixture
def open_panel(qtbot: Any, paths: Paths) -> Iterator[Any]:
    """Builds the Models page with its adapter on its Discover tab, as the app does at startup; call
    it again to 'restart' (every adapter is shut down at the end)."""
    from app.gui.model_panel import ModelPanel
    from app.gui.workers.models_worker import ModelsAdapter

    adapters: list[ModelsAdapter] = []

    def build() -> tuple[ModelsAdapter, ModelPanel]:
        adapter = ModelsAdapter(
            paths.models,
            paths.models / "manifest.json",
            paths.config / "model_folders.json",
            queue_file=paths.download_queue,
        )
        panel = ModelPanel(adapter, 2048)
        qtbot.addWidget(panel)
        panel.show()
        panel.tabs.setCurrentIndex(1)
        adapters.append(adapter)
        return adapter, panel

    yield build
    for adapter in adapters:
        adapter.shutdown(wait=True)
