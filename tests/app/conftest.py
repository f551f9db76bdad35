"""GUI test fixtures (helpers live in gui_support.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.paths import Paths


@pytest.fixture
def paths(glassbox_home: Path) -> Paths:
    return Paths.resolve(glassbox_home).ensure()


@pytest.fixture
def fake_model(paths: Paths) -> Path:
    """A file in the models folder for the picker (the fake session never reads it)."""
    model = paths.models / "fake-model.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 64)
    return model
