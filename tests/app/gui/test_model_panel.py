"""The Models page: library with fit badges, load from the table, download from the loopback Hub,
quantize through the dialog."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gui_support import FakeSession, make_window

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "engine"))
from hub_server import FakeHub, random_bytes
from tiny_models import write_tiny_llama_gguf

from app.gui.workers.chat_state import ModelState
from app.paths import Paths

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]
PAYLOAD = random_bytes(1_500_000, 7)


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with FakeHub() as server:
        server.add_repo("acme/tiny-GGUF", {"tiny-Q4_K_M.gguf": PAYLOAD, "README.md": b"hi"}, downloads=12, likes=3)
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


@pytest.fixture
def window(qtbot: Any, paths: Paths) -> Any:
    write_tiny_llama_gguf(paths.models / "tiny-F16.gguf", dtype="F16")
    w = make_window(paths, lambda r, b: FakeSession(r, b), probe_bandwidth=False)
    qtbot.addWidget(w)
    w.show()
    w.start()
    qtbot.waitUntil(lambda: w.chat.model_state is ModelState.LOADED, timeout=10000)
    w.show_page(1)
    yield w
    w.shutdown()


def test_library_lists_models_with_fit_and_loads_from_the_table(qtbot: Any, window: Any, paths: Paths) -> None:
    panel = window.models_page
    qtbot.waitUntil(lambda: panel.library.rowCount() == 1 and window.models_adapter.hardware is not None, timeout=10000)
    qtbot.waitUntil(
        lambda: panel.library.item(0, 6) is not None and "●" in panel.library.item(0, 6).text(), timeout=5000
    )
    assert panel.library.item(0, 1).text() == "llama"
    assert panel.library.item(0, 3).text() == "F16"
    assert "RAM" in panel.hardware_label.text()
    panel.library.selectRow(0)
    with qtbot.waitSignal(window.chat.model_loaded, timeout=5000) as loaded:
        panel.load_button.click()
    assert loaded.args[0].path == paths.models / "tiny-F16.gguf"
    assert window.pages.currentIndex() == 0


def test_download_from_the_hub_through_the_panel(qtbot: Any, window: Any, hub: FakeHub, paths: Paths) -> None:
    panel = window.models_page
    panel.tabs.setCurrentIndex(1)
    panel.search.setText("tiny")
    panel.search_button.click()
    qtbot.waitUntil(
        lambda: panel.results.count() == 1 and "acme/tiny-GGUF" in panel.results.item(0).text(), timeout=10000
    )
    panel.results.setCurrentRow(0)
    qtbot.waitUntil(lambda: panel.files.rowCount() == 1, timeout=10000)
    assert panel.files.item(0, 1).text() == "Q4_K_M"
    panel.files.selectRow(0)
    panel.download_button.click()
    qtbot.waitUntil(lambda: panel.queue.rowCount() == 1 and "done" in panel.queue.item(0, 3).text(), timeout=30000)
    target = next(paths.models.rglob("tiny-Q4_K_M.gguf"))
    assert target.read_bytes() == PAYLOAD
    assert not list(paths.models.rglob("*.partial"))


@pytest.mark.model
def test_quantize_through_the_dialog(qtbot: Any, window: Any, paths: Paths) -> None:
    from app.gui.quantize_dialog import QuantizeDialog

    panel = window.models_page
    qtbot.waitUntil(lambda: panel.library.rowCount() == 1, timeout=10000)
    entry = window.models_adapter.entries[0]
    dialog = QuantizeDialog(window.models_adapter, entry, panel)
    qtbot.addWidget(dialog)
    row = next(i for i, t in enumerate(dialog.types) if t.name == "Q8_0")
    dialog.table.selectRow(row)
    assert dialog.table.item(row, 1).text().endswith("MiB") or dialog.table.item(row, 1).text().endswith("KiB")
    dialog.start_button.click()
    qtbot.waitUntil(
        lambda: dialog.transfer is not None and dialog.transfer.state in ("done", "error", "cancelled"),
        timeout=120_000,
    )
    assert dialog.transfer.state == "done", dialog.transfer.message
    out = dialog.transfer.result.path
    assert out.exists()
    assert out.stat().st_size < entry.size
    qtbot.waitUntil(lambda: panel.library.rowCount() == 2, timeout=10000)
