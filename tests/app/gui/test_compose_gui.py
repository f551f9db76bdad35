"""The window's side of app/compose.py (offscreen Qt, fake sessions): ``gpu_layers="auto"`` is
computed once per load on the LLM worker thread, never on the GUI thread, and the model picker and
``settings.last_model`` hold typed references' keys (an old ``glassbox-remote/...`` last model is
still read)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from gui_support import start_window

from app import compose
from app.paths import Paths
from app.settings import Settings
from engine import fit, hardware
from engine.library import read_model_info

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]


def test_auto_gpu_layers_are_probed_once_on_the_worker_thread(
    qtbot: Any, paths: Paths, fake_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probed_on: list[threading.Thread] = []
    hw = hardware.HardwareInfo(
        total_ram=8 << 30,
        available_ram=7 << 30,
        cpu_count_physical=2,
        cpu_count_logical=2,
        cpu_name="test",
        gpu_offload_supported=True,
        gpus=[hardware.GpuInfo(name="GPU", vendor="nvidia", total_vram=8 << 30, free_vram=8 << 30)],
    )

    def probe() -> hardware.HardwareInfo:
        probed_on.append(threading.current_thread())
        return hw

    monkeypatch.setattr(hardware, "probe_hardware", probe)
    w = start_window(qtbot, paths, settings=Settings(theme="light", gpu_layers="auto", n_ctx=512))
    try:
        assert len(probed_on) == 1, "one probe per load"
        assert probed_on[0] is not threading.main_thread(), "the hardware probe ran on the GUI thread"
        assert w.sessions[-1].request.n_gpu_layers == fit.auto_gpu_layers(read_model_info(fake_model), 512, hw) > 0
        assert w.settings.last_model == str(fake_model)  # a local model is saved as its path, as before
        w.model_control.load_model(fake_model)
        qtbot.waitUntil(lambda: len(w.sessions) == 2, timeout=10000)
        assert len(probed_on) == 2 and probed_on[1] is not threading.main_thread()
    finally:
        w.shutdown()


def test_an_old_remote_last_model_is_read_and_a_local_model_loads(qtbot: Any, paths: Paths, fake_model: Path) -> None:
    settings = Settings(theme="light", gpu_layers=0, last_model="glassbox-remote/lab/org%2Fbig")
    w = start_window(qtbot, paths, settings=settings)
    try:
        assert w.sessions[-1].request.model_path == fake_model  # as before: a remote one is not loaded at start
        picker = w.header.model_bar.picker
        assert [picker.itemData(i) for i in range(picker.count())] == [compose.model_key(fake_model)]
    finally:
        w.shutdown()
