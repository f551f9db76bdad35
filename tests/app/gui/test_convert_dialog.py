"""The Convert… dialog: targets on offer, a real conversion through the models adapter, Cancel."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "engine"))
from tiny_models import cached_tiny_hf_llama

from app.gui.convert_dialog import ConvertDialog
from app.gui.workers.models_worker import ModelsAdapter
from app.gui.workers.transfers import Transfer
from app.paths import Paths
from engine.errors import Cancelled
from engine.gguf import read_gguf_info

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]
_CACHE = Path(os.environ.get("GLASSBOX_TEST_CACHE", Path(__file__).resolve().parents[3] / ".home" / "test-cache"))


@pytest.fixture
def adapter(paths: Paths) -> Iterator[ModelsAdapter]:
    models = ModelsAdapter(paths.models, paths.models / "manifest.json", paths.config / "model_folders.json")
    yield models
    models.shutdown(wait=True)


def _messages(adapter: ModelsAdapter) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    adapter.jobs.transfer_changed.connect(lambda t: seen.append((t.state, t.message)))
    return seen


def test_the_targets_on_offer(qtbot: Any, adapter: ModelsAdapter) -> None:
    dialog = ConvertDialog(adapter)
    qtbot.addWidget(dialog)
    names = [dialog.type_combo.itemData(i) for i in range(dialog.type_combo.count())]
    assert names[:3] == ["F16", "BF16", "Q8_0"]
    assert "Q4_K_M" in names
    assert "IQ4_XS" in names
    assert "IQ2_XXS" not in names  # needs an importance matrix
    assert "F32" not in names
    assert len(names) == len(set(names))
    assert dialog.selected_type() == "Q4_K_M"
    assert dialog.keep_check.isEnabled()
    assert not dialog.start_button.isEnabled()  # no folder yet
    dialog.type_combo.setCurrentIndex(names.index("Q8_0"))
    assert not dialog.keep_check.isEnabled()  # one stage: nothing to keep
    dialog.folder_edit.setText("/somewhere")
    assert dialog.start_button.isEnabled()


@pytest.mark.model
@pytest.mark.slow
def test_convert_and_quantize_through_the_dialog(
    qtbot: Any, adapter: ModelsAdapter, paths: Paths, tmp_path_factory: pytest.TempPathFactory
) -> None:
    folder = cached_tiny_hf_llama(_CACHE, tmp_path_factory.mktemp("scratch"))
    seen = _messages(adapter)
    dialog = ConvertDialog(adapter, folder)
    qtbot.addWidget(dialog)
    with qtbot.waitSignal(adapter.library_changed, timeout=120_000) as scanned:
        dialog.start_button.click()
        assert not dialog.start_button.isEnabled()
        qtbot.waitUntil(lambda: dialog.transfer is not None and dialog.transfer.state == "done", timeout=120_000)
    transfer = dialog.transfer
    assert transfer is not None
    result = transfer.result.path
    assert result == paths.models / "tiny-hf-llama-v1-Q4_K_M.gguf"
    assert read_gguf_info(result).file_type == "Q4_K_M"
    assert sorted(p.name for p in paths.models.iterdir()) == ["manifest.json", result.name]  # no intermediate
    assert any(state == "converting" and msg.startswith("Step 1 of 2: converting") for state, msg in seen)
    assert any(state == "quantizing" and msg.startswith("Step 2 of 2: quantizing") for state, msg in seen)
    assert dialog.status.text().startswith(f"done: wrote {result.name}")
    assert dialog.cancel_button.text() == "Close"
    # The library was rescanned and knows where the model came from.
    entries = scanned.args[0]
    assert [e.path for e in entries] == [result]
    assert entries[0].provenance["source"] == f"converted from {folder.resolve()}, quantized to Q4_K_M"
    manifest = json.loads((paths.models / "manifest.json").read_text())
    assert result.name in manifest["models"]


def test_cancel_stops_the_conversion_and_keeps_the_dialog_responsive(
    qtbot: Any, adapter: ModelsAdapter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.convert.hf_to_gguf import PipelineProgress

    started = threading.Event()
    calls: list[tuple[Path, str, bool]] = []

    def slow_conversion(folder: Path, qtype: str, **kwargs: Any) -> None:
        calls.append((folder, qtype, kwargs["keep_intermediate"]))
        cancel: threading.Event = kwargs["cancel"]
        kwargs["progress"](PipelineProgress("converting", 1, 2, "preparing", 3, 21, "blk.0.attn_q.weight"))
        started.set()
        deadline = time.monotonic() + 30
        while not cancel.wait(0.01):
            assert time.monotonic() < deadline, "the dialog never cancelled"
        raise Cancelled(f"{folder}: cancelled while converting; no file was written")

    monkeypatch.setattr("engine.convert.hf_to_gguf.convert_and_quantize", slow_conversion)
    dialog = ConvertDialog(adapter, tmp_path)
    qtbot.addWidget(dialog)
    dialog.show()
    dialog.keep_check.setChecked(True)
    qtbot.waitExposed(dialog)
    form_height = (dialog.type_combo.height(), dialog.folder_edit.height())
    dialog.start_button.click()
    qtbot.waitUntil(started.is_set, timeout=10_000)
    qtbot.wait(50)  # let the layout settle with the progress bar shown
    assert dialog.progress.isVisible()
    assert (dialog.type_combo.height(), dialog.folder_edit.height()) == form_height  # not squashed
    qtbot.waitUntil(lambda: dialog.status.text() == "Step 1 of 2: converting: 3/21 tensors", timeout=5000)
    assert calls == [(tmp_path, "Q4_K_M", True)]
    assert dialog.progress.maximum() == 21
    assert dialog.progress.value() == 3

    dialog.cancel_button.click()  # the first click cancels; the dialog stays open until it has stopped
    assert dialog.isVisible()
    assert dialog.status.text() == "Cancelling…"
    transfer: Transfer | None = dialog.transfer
    assert transfer is not None
    assert transfer.cancel.is_set()
    qtbot.waitUntil(lambda: dialog.transfer is not None and dialog.transfer.state == "cancelled", timeout=10_000)
    assert dialog.transfer.same_run(transfer)  # a later snapshot of the same run
    qtbot.waitUntil(lambda: dialog.cancel_button.text() == "Close", timeout=5000)
    assert dialog.status.text() == f"cancelled: {tmp_path}: cancelled while converting; no file was written"
    assert dialog.cancel_button.isEnabled()
    # Retry: the form is back, and Start runs the conversion again.
    assert dialog.start_button.text() == "Retry"
    assert dialog.start_button.isEnabled() and dialog.folder_edit.isEnabled() and dialog.type_combo.isEnabled()
    started.clear()
    dialog.start_button.click()
    qtbot.waitUntil(started.is_set, timeout=10_000)
    assert len(calls) == 2
    assert not dialog.transfer.same_run(transfer)  # a new run
    assert dialog.cancel_button.text() == "Cancel"
    dialog.cancel_button.click()
    qtbot.waitUntil(lambda: dialog.cancel_button.text() == "Close", timeout=10_000)
    dialog.cancel_button.click()  # now it closes
    assert not dialog.isVisible()


def test_the_models_page_opens_the_dialog(qtbot: Any, adapter: ModelsAdapter, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.gui.model_panel import ModelPanel

    panel = ModelPanel(adapter, 2048)
    qtbot.addWidget(panel)
    assert panel.convert_button.text() == "Convert…"
    panel.convert_button.click()  # window-modal, no nested event loop
    dialog = panel.dialog
    assert isinstance(dialog, ConvertDialog)
    assert dialog.isVisible()
    assert dialog.adapter is adapter
    assert dialog.parent() is panel
    dialog.reject()
    qtbot.waitUntil(lambda: panel.dialog is None, timeout=2000)
