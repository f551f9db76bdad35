"""The Models page as a new user meets it (issue 15): Discover offline and its suggestions, the
quantize dialog on a model that is already quantized, the library's selection across rescans,
embedders, unloadable entries, and other apps' model folders."""

from __future__ import annotations

import shutil
import socket
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from gui_support import FakeSession, make_window
from PySide6.QtCore import Qt

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "engine"))
from hub_server import FakeHub, random_bytes
from tiny_models import write_tiny_llama_gguf

from app.curated_models import load_curated
from app.gui.quantize_dialog import QuantizeDialog
from app.gui.workers.chat_state import ModelState
from app.paths import Paths
from engine.errors import Cancelled
from engine.units import format_bytes

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]


def _dead_endpoint() -> str:
    """A loopback URL nobody listens on: the Hub as an offline machine sees it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _entries(adapter: Any) -> list[str]:
    return [e.name for e in adapter.entries]


# ---------------------------------------------------------------------- Discover
def test_offline_search_fails_on_discover_with_a_retry(
    qtbot: Any, open_panel: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", _dead_endpoint())
    adapter, panel = open_panel()
    d = panel.discover
    errors: list[str] = []
    adapter.error_occurred.connect(errors.append)  # what the main window shows on the chat page
    panel.search.setText("tiny")
    panel.search_button.click()
    assert panel.results.item(0).text() == "Searching…"
    qtbot.waitUntil(lambda: d.search_error.isVisible(), timeout=15000)
    assert "Could not search Hugging Face" in d.search_error.text()
    assert "offline" in d.search_error.text()
    assert d.search_retry.isVisible()
    assert panel.results.item(0).text() == "The search failed."
    assert not panel.results.item(0).flags() & Qt.ItemFlag.ItemIsSelectable  # a note, not a model
    assert errors == []  # not on the chat page
    # Offline, the way back to the suggested models is one click.
    assert d.back_to_suggestions.isVisible()
    d.back_to_suggestions.click()
    assert d.showing_suggestions() and panel.results.count() == len(d.curated)
    assert not d.search_error.isVisible() and not d.back_to_suggestions.isVisible()
    panel.search.setText("tiny")
    panel.search_button.click()
    qtbot.waitUntil(lambda: d.search_error.isVisible(), timeout=15000)
    with FakeHub() as hub:  # the network is back
        hub.add_repo("acme/tiny-GGUF", {"tiny-Q4_K_M.gguf": random_bytes(4096, 1)}, downloads=3)
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        d.search_retry.click()
        qtbot.waitUntil(
            lambda: panel.results.count() == 1 and "acme/tiny-GGUF" in panel.results.item(0).text(), timeout=15000
        )
        assert not d.search_error.isVisible()
        assert not d.search_retry.isVisible()


def test_suggestions_before_any_search_with_fit_verdicts(
    qtbot: Any, open_panel: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", _dead_endpoint())
    curated = load_curated()
    assert 5 <= len(curated) <= 12
    assert all(m.repo.count("/") == 1 and m.file.endswith(".gguf") and m.size > 0 and m.license for m in curated)
    adapter, panel = open_panel()
    d = panel.discover
    assert d.showing_suggestions()
    assert panel.results.count() == len(curated)
    assert panel.results.item(0).text().startswith(curated[0].label)
    qtbot.waitUntil(lambda: adapter.hardware is not None, timeout=10000)
    qtbot.waitUntil(lambda: "checking" not in panel.results.item(0).text(), timeout=5000)
    texts = [panel.results.item(i).text() for i in range(panel.results.count())]
    assert all(any(v in t for v in ("fits on GPU", "partial offload", "fits in RAM", "won't fit")) for t in texts)
    assert all(m.license in t for m, t in zip(curated, texts, strict=True))
    # Offline, picking one says so where it was picked, with a Retry.
    panel.results.setCurrentRow(0)
    qtbot.waitUntil(lambda: d.files_error.isVisible(), timeout=15000)
    assert curated[0].repo in d.files_error.text()
    assert d.files_retry.isVisible()


def test_a_suggestion_downloads_its_file_when_online(
    qtbot: Any, open_panel: Any, monkeypatch: pytest.MonkeyPatch, paths: Paths
) -> None:
    first = load_curated()[0]
    payload = random_bytes(300_000, 5)
    with FakeHub() as hub:
        other = first.file.replace("q4_k_m", "q8_0").replace("Q4_K_M", "Q8_0")
        hub.add_repo(first.repo, {other: random_bytes(2000, 6), first.file: payload, "README.md": b"x"})
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        _adapter, panel = open_panel()
        panel.results.setCurrentRow(0)
        qtbot.waitUntil(lambda: panel.files.rowCount() == 2, timeout=15000)
        rows = panel.files.selectionModel().selectedRows()
        assert len(rows) == 1
        assert panel.files.item(rows[0].row(), 0).text() == first.file  # the suggested file is picked
        panel.download_button.click()
        qtbot.waitUntil(lambda: panel.queue.rowCount() == 1 and "done" in panel.queue.item(0, 3).text(), timeout=30000)
    assert next(paths.models.rglob(first.file)).read_bytes() == payload


# ---------------------------------------------------------------------- the library
def test_selection_survives_a_rescan_by_identity(qtbot: Any, open_panel: Any, paths: Paths) -> None:
    write_tiny_llama_gguf(paths.models / "m-first.gguf", seed=1)
    write_tiny_llama_gguf(paths.models / "m-second.gguf", seed=2)
    adapter, panel = open_panel()
    panel.tabs.setCurrentIndex(0)
    qtbot.waitUntil(lambda: panel.library.rowCount() == 2, timeout=10000)
    assert panel.select_model(paths.models / "m-second.gguf")
    assert panel.selected_entry().name == "m-second.gguf"
    # A quantization (or a download) adds a file that sorts first: the rows move, the selection does not.
    write_tiny_llama_gguf(paths.models / "a-new.gguf", seed=3)
    with qtbot.waitSignal(adapter.library_changed, timeout=10000):
        adapter.library.scan()
    assert panel.library.rowCount() == 3
    assert panel.selected_entry().name == "m-second.gguf"
    row = panel.library.selectionModel().selectedRows()[0].row()
    assert panel.library.item(row, 0).text().startswith("m-second")
    loaded: list[Path] = []
    panel.load_requested.connect(loaded.append)
    panel.load_button.click()
    assert loaded == [paths.models / "m-second.gguf"]  # Load acts on the model shown, not on row 1
    # The selected model deleted: the selection falls back on the first row.
    (paths.models / "m-second.gguf").unlink()
    with qtbot.waitSignal(adapter.library_changed, timeout=10000):
        adapter.library.scan()
    assert panel.library.selectionModel().selectedRows()[0].row() == 0
    assert panel.selected_entry() is adapter.entries[0]
    assert panel.selected_entry().name != "m-second.gguf"


def test_embedders_and_broken_files_say_why_they_cannot_load(qtbot: Any, paths: Paths) -> None:
    write_tiny_llama_gguf(paths.models / "chat-F32.gguf")
    write_tiny_llama_gguf(paths.models / "minilm-F32.gguf", arch="bert", seed=2)
    (paths.models / "broken.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 7)
    w = make_window(paths, lambda r, b: FakeSession(r, b), probe_bandwidth=False)
    qtbot.addWidget(w)
    w.show()
    w.start()
    qtbot.waitUntil(lambda: w.chat.model_state is ModelState.LOADED, timeout=10000)
    assert w.chat.loaded.path.name == "chat-F32.gguf"  # the embedder was never a candidate
    w.show_page(1)
    panel = w.models_page
    qtbot.waitUntil(lambda: panel.library.rowCount() == 3, timeout=10000)
    picker = [w.header.model_bar.picker.itemText(i) for i in range(w.header.model_bar.picker.count())]
    assert not any("minilm" in name.lower() for name in picker)
    assert not any("broken" in name.lower() for name in picker)
    loads: list[Path] = []
    panel.load_requested.connect(loads.append)

    assert panel.select_model(paths.models / "minilm-F32.gguf")
    row = panel.library.selectionModel().selectedRows()[0].row()
    assert panel.library.item(row, 1).text() == "bert (embedder)"
    assert panel.library.item(row, 6).text().startswith("not a chat model")
    panel.load_button.click()
    assert "cannot be loaded: an embedding model (bert)" in panel.library_status.text()

    assert panel.select_model(paths.models / "broken.gguf")
    panel.load_button.click()
    assert "broken.gguf cannot be loaded:" in panel.library_status.text()
    assert "incomplete" in panel.library_status.text() or "malformed" in panel.library_status.text()
    assert loads == []
    w.shutdown()


@pytest.mark.model
def test_a_vision_model_is_marked_and_its_fit_counts_its_projector(
    qtbot: Any, paths: Paths, tiny_vision_model: tuple[Path, Path]
) -> None:
    from engine.fit import projector_bytes
    from engine.gguf import read_gguf_info

    folder = paths.models / "owner" / "tiny-vision"
    folder.mkdir(parents=True)
    for path in tiny_vision_model:
        shutil.copy(path, folder / path.name)
    model, mmproj = (folder / p.name for p in tiny_vision_model)
    write_tiny_llama_gguf(paths.models / "text-F32.gguf")
    w = make_window(paths, lambda r, b: FakeSession(r, b), probe_bandwidth=False)
    qtbot.addWidget(w)
    w.show()
    w.start()
    w.show_page(1)
    panel, adapter = w.models_page, w.models_adapter
    qtbot.waitUntil(lambda: panel.library.rowCount() == 3 and adapter.hardware is not None, timeout=10000)
    qtbot.waitUntil(lambda: "●" in (panel.library.item(0, 6).text() if panel.library.item(0, 6) else ""), timeout=5000)

    def row_of(path: Path) -> int:
        assert panel.select_model(path)
        return int(panel.library.selectionModel().selectedRows()[0].row())

    seeing = panel.library.item(row_of(model), 1)
    assert seeing.text() == "gemma3, sees images"
    assert mmproj.name in seeing.toolTip()
    verdict = panel.library.item(row_of(model), 6)
    size = projector_bytes(read_gguf_info(mmproj))
    assert f"+ projector {format_bytes(size)}" in verdict.toolTip()
    fit = adapter.library.fit(next(e for e in adapter.entries if e.path == model), panel.n_ctx)
    assert fit is not None and fit.projector_bytes == size
    text = panel.library.item(row_of(paths.models / "text-F32.gguf"), 1)
    assert text.text() == "llama" and "no projector" in text.toolTip()
    assert "projector" not in panel.library.item(row_of(paths.models / "text-F32.gguf"), 6).toolTip()
    assert panel.library.item(row_of(mmproj), 1).text().endswith("(vision projector)")
    w.shutdown()


def test_other_apps_folders_are_offered_and_added_or_declined(
    qtbot: Any, open_panel: Any, paths: Paths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "user"
    lmstudio = home / ".lmstudio" / "models" / "publisher" / "repo"
    lmstudio.mkdir(parents=True)
    write_tiny_llama_gguf(lmstudio / "from-lmstudio.gguf")
    hf = home / ".cache" / "huggingface" / "hub" / "models--a--b" / "snapshots" / "abc"
    hf.mkdir(parents=True)
    write_tiny_llama_gguf(hf / "from-hf.gguf", seed=4)
    monkeypatch.setenv("HOME", str(home))
    for name in ("HF_HOME", "HF_HUB_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    adapter, panel = open_panel()
    panel.tabs.setCurrentIndex(0)
    qtbot.waitUntil(lambda: panel.offer_bar.isVisible(), timeout=10000)
    assert "LM Studio" in panel.offer_label.text() and "Hugging Face cache" in panel.offer_label.text()
    with qtbot.waitSignal(adapter.library_changed, timeout=10000):
        panel.offer_add_button.click()
    qtbot.waitUntil(lambda: sorted(_entries(adapter)) == ["from-hf.gguf", "from-lmstudio.gguf"], timeout=10000)
    assert not panel.offer_bar.isVisible()
    # Offered once: a folder in the library (or declined) is not offered again.
    with qtbot.waitSignal(adapter.library.other_folders_found, timeout=10000) as found:
        adapter.library.find_other_apps()
    assert found.args[0] == []


def test_declined_folders_are_not_offered_again(
    qtbot: Any, open_panel: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "user"
    folder = home / ".lmstudio" / "models"
    folder.mkdir(parents=True)
    write_tiny_llama_gguf(folder / "x.gguf")
    monkeypatch.setenv("HOME", str(home))
    adapter, panel = open_panel()
    panel.tabs.setCurrentIndex(0)
    qtbot.waitUntil(lambda: panel.offer_bar.isVisible(), timeout=10000)
    panel.offer_dismiss_button.click()
    assert not panel.offer_bar.isVisible()
    qtbot.waitUntil(adapter.library.declined_file.exists, timeout=5000)
    with qtbot.waitSignal(adapter.library.other_folders_found, timeout=10000) as found:
        adapter.library.find_other_apps()
    assert found.args[0] == []
    assert _entries(adapter) == []  # declined: nothing was added


# ---------------------------------------------------------------------- quantize
@pytest.fixture
def q4_model(paths: Paths, tmp_path: Path) -> Path:
    """A tiny model that is already Q4_K_M, like the bundled starter."""
    from engine.convert.quantize import quantize_model

    src = write_tiny_llama_gguf(tmp_path / "tiny-F16.gguf", dtype="F16")
    return quantize_model(src, paths.models / "tiny-Q4_K_M.gguf", "Q4_K_M", threads=2).path


def _dialog(qtbot: Any, open_panel: Any, name: str) -> tuple[Any, Any, QuantizeDialog]:
    adapter, panel = open_panel()
    panel.tabs.setCurrentIndex(0)
    qtbot.waitUntil(lambda: panel.library.rowCount() >= 1, timeout=10000)
    assert panel.select_model(next(e.path for e in adapter.entries if e.name == name))
    panel.quantize_button.click()  # window-modal, no nested event loop
    dialog = panel.dialog
    assert isinstance(dialog, QuantizeDialog)
    qtbot.waitUntil(lambda: bool(dialog.estimates), timeout=10000)
    return adapter, panel, dialog


def _select(dialog: QuantizeDialog, qtype: str) -> int:
    row = next(i for i, t in enumerate(dialog.types) if t.name == qtype)
    dialog.table.selectRow(row)
    return row


@pytest.mark.model
def test_the_quantize_dialog_offers_requantizing_a_q4_k_m_model(
    qtbot: Any, open_panel: Any, q4_model: Path, paths: Paths
) -> None:
    _adapter, _panel, dialog = _dialog(qtbot, open_panel, "tiny-Q4_K_M.gguf")
    assert dialog.warning_label.isVisible()
    assert "already quantized" in dialog.warning_label.text()
    assert dialog.requantize_check.isVisible()
    assert not dialog.start_button.isEnabled()  # not without saying yes to the quality loss
    row = _select(dialog, "Q8_0")
    estimate = dialog.estimates["Q8_0"]
    assert dialog.table.item(row, 1).text() == format_bytes(estimate.file_bytes)
    dialog.requantize_check.setChecked(True)
    assert dialog.start_button.isEnabled()
    dialog.quality_check.setChecked(True)
    dialog.start_button.click()
    assert dialog.cancel_button.text() == "Cancel"
    qtbot.waitUntil(
        lambda: dialog.transfer is not None and dialog.transfer.state in ("done", "error", "cancelled"), timeout=60000
    )
    assert dialog.transfer.state == "done", dialog.transfer.message
    out = dialog.transfer.result.path
    assert out == paths.models / "tiny-Q8_0.gguf"
    assert abs(out.stat().st_size - estimate.file_bytes) <= 64  # the per-tensor estimate held
    qtbot.waitUntil(
        lambda: dialog.quality_transfer is not None and dialog.quality_transfer.state == "done", timeout=120000
    )
    assert "perplexity" in dialog.status.text()
    assert "x larger" in dialog.status.text()  # Q4_K_M -> Q8_0 grows: not "0.5x smaller"
    assert dialog.start_button.text() == "Quantize again"
    assert dialog.cancel_button.text() == "Close"
    dialog.reject()


def test_the_quality_check_shows_progress_and_cancels(
    qtbot: Any, open_panel: Any, paths: Paths, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_tiny_llama_gguf(paths.models / "src-F32.gguf")
    result = write_tiny_llama_gguf(paths.models / "src-Q8_0.gguf", seed=1)
    adapter, panel = open_panel()
    panel.tabs.setCurrentIndex(0)
    qtbot.waitUntil(lambda: panel.library.rowCount() == 2, timeout=10000)
    adapter.library.model_library().record_provenance(result, quantized_from=str(paths.models / "src-F32.gguf"))
    with qtbot.waitSignal(adapter.library_changed, timeout=10000):
        adapter.library.scan()
    started = threading.Event()

    def slow_perplexity(path: Path, text: str, n_ctx: int, threads: Any = None, *, cancel: Any, **kw: Any) -> float:
        assert text.strip()
        kw["on_progress"](100, 400)  # a quarter of the source's tokens scored
        started.set()
        if not cancel.wait(30):
            raise AssertionError("never cancelled")
        raise Cancelled(f"{path}: perplexity cancelled")

    monkeypatch.setattr("engine.convert.perplexity.perplexity", slow_perplexity)
    assert panel.select_model(result)
    assert panel.quality_button.isEnabled()
    panel.quality_button.click()
    dialog = panel.dialog
    qtbot.waitUntil(started.is_set, timeout=10000)
    qtbot.waitUntil(lambda: "100 of 400 tokens" in dialog.status.text(), timeout=5000)
    assert dialog.status.text().startswith("Step 1 of 2")
    # Real progress: a quarter of step 1 of 2 is an eighth of the bar (it sat at 0% until a step ended).
    assert dialog.progress.isVisible() and dialog.progress.maximum() == 2000
    assert dialog.progress.value() == 250
    dialog.cancel_button.click()
    assert dialog.isVisible() and dialog.status.text() == "Cancelling…"
    qtbot.waitUntil(lambda: dialog.transfer.state == "cancelled", timeout=10000)
    assert dialog.start_button.text() == "Retry" and dialog.start_button.isEnabled()
    monkeypatch.setattr(
        "engine.convert.perplexity.perplexity", lambda path, *a, **k: 10.0 if "F32" in path.name else 11.0
    )
    dialog.start_button.click()
    qtbot.waitUntil(lambda: dialog.transfer.state == "done", timeout=10000)
    assert "perplexity +10.0%" in dialog.status.text()
    dialog.reject()


def test_cancel_before_the_first_tensor_leaves_no_busy_bar(
    qtbot: Any, open_panel: Any, paths: Paths, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 28: after Cancel the bar kept its busy animation."""
    write_tiny_llama_gguf(paths.models / "tiny-F16.gguf", dtype="F16")
    _adapter, _panel, dialog = _dialog(qtbot, open_panel, "tiny-F16.gguf")
    started = threading.Event()

    def slow(*_a: Any, cancel: Any = None, **_k: Any) -> None:
        started.set()
        if not cancel.wait(30):
            raise AssertionError("never cancelled")
        raise Cancelled("tiny-F16.gguf: quantization cancelled")

    monkeypatch.setattr("engine.convert.quantize.quantize_model", slow)
    dialog.start_button.click()
    qtbot.waitUntil(started.is_set, timeout=10000)
    assert dialog.progress.maximum() == 0  # busy: no tensor reported yet
    dialog.cancel_button.click()
    qtbot.waitUntil(lambda: dialog.transfer.state == "cancelled", timeout=10000)
    assert dialog.progress.maximum() != 0 or not dialog.progress.isVisible()  # no busy animation left
    assert not dialog.progress.isVisible()
    assert dialog.start_button.text() == "Retry" and dialog.cancel_button.text() == "Close"
    dialog.reject()


def test_a_failed_quantization_can_be_retried(
    qtbot: Any, open_panel: Any, paths: Paths, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.errors import QuantizeError

    write_tiny_llama_gguf(paths.models / "tiny-F16.gguf", dtype="F16")
    _adapter, _panel, dialog = _dialog(qtbot, open_panel, "tiny-F16.gguf")
    assert not dialog.warning_label.isVisible() and dialog.start_button.isEnabled()

    def fail(*_a: Any, **_k: Any) -> None:
        raise QuantizeError("tiny-F16.gguf: quantization to Q4_K_M failed: the disk is full")

    monkeypatch.setattr("engine.convert.quantize.quantize_model", fail)
    dialog.start_button.click()
    qtbot.waitUntil(lambda: dialog.transfer.state == "error", timeout=10000)
    assert "the disk is full" in dialog.status.text()
    assert dialog.start_button.text() == "Retry" and dialog.start_button.isEnabled()
    assert dialog.table.isEnabled()
    first = dialog.transfer
    monkeypatch.undo()
    _select(dialog, "Q8_0")
    dialog.start_button.click()
    assert not dialog.transfer.same_run(first)  # a new run
    qtbot.waitUntil(lambda: dialog.transfer.state in ("done", "error"), timeout=60000)
    assert dialog.transfer.state == "done", dialog.transfer.message
    dialog.reject()


def test_first_start_offers_lm_studio_in_the_status_bar(
    qtbot: Any, paths: Paths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "user"
    folder = home / ".lmstudio" / "models" / "pub" / "repo"
    folder.mkdir(parents=True)
    write_tiny_llama_gguf(folder / "m.gguf")
    write_tiny_llama_gguf(paths.models / "chat-F32.gguf")
    monkeypatch.setenv("HOME", str(home))
    w = make_window(paths, lambda r, b: FakeSession(r, b), probe_bandwidth=False)
    qtbot.addWidget(w)
    w.show()
    w.start()
    qtbot.waitUntil(lambda: "LM Studio" in w.statusBar().currentMessage(), timeout=10000)
    assert "Models → Library" in w.statusBar().currentMessage()
    qtbot.waitUntil(lambda: w.chat.model_state is ModelState.LOADED, timeout=10000)
    qtbot.wait(200)
    assert "LM Studio" in w.statusBar().currentMessage()  # the "Loaded …" message does not hide it
    w.shutdown()


def test_the_gui_and_the_cli_print_sizes_alike() -> None:
    """The Models page and ``glassbox models`` print sizes, speeds and times left with engine.units."""
    from app.cli.commands import models_hub, models_quant
    from app.gui import discover_panel, model_panel, quantize_dialog
    from engine import units

    for module in (discover_panel, model_panel, quantize_dialog, models_hub, models_quant):
        assert module.format_bytes is units.format_bytes, module.__name__
    for module in (discover_panel, models_hub):
        assert module.format_speed is units.format_speed and module.format_eta is units.format_eta
