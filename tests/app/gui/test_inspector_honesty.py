"""The inspector for every backend, and whose numbers it shows (issue 28: major 2 and the minor
items on stale values, "Tokens used", and Stop during prefill).

* No text widens the panel: a remote model's long summary, a long server address or CPU line
  wraps, and every number stays inside the panel's width.
* A remote model's memory is its server's: no local KV size, no "0 B" weights, no local ceiling.
* Each number says whose it is: after a reload or a restart the open chat's saved reply is shown
  whole (its legend, its speeds), a reopened chat has no speed chart of another reply, the reply
  reserve line names the open chat's max tokens.
* "Tokens used" is the prompt plus the reply, as the legend adds them up.
* After Stop during prefill: what was read, that it was stopped; no TTFT, no inflated prefill speed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gui_support import FakeSession, send, start_window
from PySide6.QtWidgets import QApplication, QLabel

from app.gui.inspector import InspectorPanel
from app.gui.window_layout import ElidedLabel
from app.gui.workers.chat_state import ModelState
from app.paths import Paths
from engine.inference.events import Finished, PrefillProgress, Stats
from tests.fake_backend import StreamCall

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]

LONG_URL = "http://inference-gateway.internal.example.com:8000/openai/deployments/very-long-name"


def remote_stats(**extra: Any) -> dict[str, Any]:
    budget = {"system": 10, "history": 15, "current": 25, "reserve": 512, "free": 0, "n_ctx_unknown": 1, "estimated": 1}
    stats = Stats(n_ctx=0, prompt_tokens=50, completion_tokens=12, context_used=62, ttft_ms=210.0,
                  prefill_tps=300.0, decode_tps=41.0, template=f"remote:{LONG_URL}", budget=budget)  # fmt: skip
    return {**stats.to_dict(), "finish_reason": "stop", **extra}


def local_stats(**extra: Any) -> dict[str, Any]:
    budget = {"system": 10, "documents": 0, "history": 0, "current": 11, "reserve": 512, "free": 4096 - 533}
    stats = Stats(n_ctx=4096, prompt_tokens=21, completion_tokens=512, context_used=532, ttft_ms=50.0,
                  prefill_ms=40.0, decode_ms=9000.0, prefill_tps=525.0, decode_tps=56.8, kv_cache_bytes=72 * 2**20,
                  kv_used_bytes=2**20, model_bytes=253_000_000, bandwidth_gbps=14.4, machine_bandwidth_gbps=37.6,
                  template="gguf:gguf", budget=budget)  # fmt: skip
    return {**stats.to_dict(), "finish_reason": "length", **extra}


@pytest.fixture
def panel(qtbot: Any) -> InspectorPanel:
    inspector = InspectorPanel()
    qtbot.addWidget(inspector)
    inspector.resize(320, 700)
    inspector.show()
    return inspector


def overflow(inspector: InspectorPanel) -> list[str]:
    """The labels of the Live tab that reach past its viewport, and its content's minimum width."""
    QApplication.processEvents()
    scroll = inspector.tabs.widget(0)
    viewport = scroll.viewport().width()
    content = scroll.widget()
    found = []
    if content.minimumSizeHint().width() > viewport:
        found.append(f"the content asks for {content.minimumSizeHint().width()} px of {viewport}")
    for label in content.findChildren(QLabel):
        if not label.isVisibleTo(content) or not label.text():
            continue
        right = label.mapTo(content, label.rect().topRight()).x()
        if right > viewport:
            found.append(f"{label.objectName()} {label.text()[:40]!r} ends at {right} of {viewport}")
    return found


# ---------------------------------------------------------------------------- the panel's width
@pytest.mark.parametrize("server", [None, "the server “gateway”"])
def test_no_text_widens_the_inspector_for_any_backend(panel: InspectorPanel, server: str | None) -> None:
    from engine.cpu_backend import BackendInfo

    panel.set_model(None if server else 253_000_000, None if server else 4096, 37.6, server=server)
    backend = BackendInfo(
        "variants", "zen4" + "x" * 60, "libggml-cpu-zen4.so", ("AVX512F",) * 12, skipped=(("amx", "y" * 90),)
    )
    panel.set_cpu_backend(backend, "a note " * 20)
    panel.set_stats(remote_stats() if server else local_stats())
    assert overflow(panel) == []
    expected = "62 of an unknown window size tokens used (estimated" if server else "533 of 4096 tokens used"
    assert panel.shown["context_used"].startswith(expected)
    # What a label cannot show on one line is whole somewhere: wrapped, or in its tooltip.
    assert panel.phase_label.wordWrap()
    if server:
        assert LONG_URL in panel.phase_label.toolTip()
    # The break points are zero-width spaces, never shown as escapes.
    assert all("\\u200b" not in label.text() for label in panel.findChildren(QLabel))
    assert "\u200b" in panel.phase_label.text() or not server
    for label in panel.tabs.widget(0).widget().findChildren(QLabel):
        if isinstance(label, ElidedLabel) and label.shown_text() != label.text():
            assert label.toolTip(), label.objectName()


def test_a_long_live_phase_never_widens_the_inspector(panel: InspectorPanel) -> None:
    panel.set_model(253_000_000, 4096, 37.6)
    panel.begin_generation()
    panel.set_prefill(123_456_789, 987_654_321)
    panel.live_sample(1)
    panel.live_sample(99_999_999, writing_call=True)
    assert overflow(panel) == []


# ---------------------------------------------------------------------------- a remote model's memory
def test_a_remote_model_shows_no_local_memory(panel: InspectorPanel) -> None:
    panel.set_model(253_000_000, 4096, 37.6)
    panel.set_kv_allocation(72 * 2**20)
    assert panel.shown["kv_cache_bytes"] == "72.0 MiB"
    panel.set_model(0, 0, 37.6, server="the server “gateway”")  # the remote model loaded after it
    panel.clear_turn()
    for key in ("model_bytes", "kv_cache_bytes", "bandwidth_gbps", "machine_bandwidth_gbps"):
        assert panel.shown[key] == "on the server"
        assert not panel.metrics[key].isVisibleTo(panel)
    assert not panel.wall.isVisibleTo(panel) and not panel.ceiling_label.isVisibleTo(panel)
    assert panel.remote_note.isVisibleTo(panel) and "gateway" in panel.remote_note.text()
    panel.set_stats(remote_stats())  # a remote reply: the same, with its server's address
    assert panel.shown["model_bytes"] == "on the server" and LONG_URL in panel.remote_note.toolTip()
    panel.set_stats(local_stats(), saved=True)  # an older local reply of this chat: its own numbers
    assert panel.shown["model_bytes"] == "241.3 MiB" and panel.wall.isVisibleTo(panel)


# ---------------------------------------------------------------------------- "Tokens used"
def test_tokens_used_is_the_prompt_plus_the_reply(panel: InspectorPanel) -> None:
    panel.set_stats(local_stats())  # 21 prompt tokens + 512 of reply; the engine's KV holds 532
    assert panel.shown["context_used"] == "533 of 4096 tokens used"
    prompt = sum(int(panel.shown[f"budget.{k}"]) for k in ("system", "documents", "history", "current"))
    assert prompt == 21


# ---------------------------------------------------------------------------- whose numbers
def test_a_reopened_chat_has_no_speed_chart_of_another_reply(panel: InspectorPanel) -> None:
    panel.begin_generation()
    panel.live_sample(1)
    time.sleep(0.01)
    panel.live_sample(20)
    assert panel.chart.samples
    panel.set_stats(local_stats())  # the reply that just ran keeps its chart
    assert panel.chart.samples
    panel.set_stats(local_stats(), saved=True)  # another chat opened: a saved reply has none
    assert panel.chart.samples == []


def test_the_reserve_line_names_the_open_chats_max_tokens(qtbot: Any, paths: Paths, fake_model: Path) -> None:
    w = start_window(qtbot, paths)
    try:
        send(qtbot, w, "first")
        w.chat.conversations.update(settings={"sampling": {"max_tokens": 80}})
        qtbot.waitUntil(lambda: (w.chat.conversation.settings or {}).get("sampling") is not None, timeout=5000)
        w.turns.show_saved_numbers()
        assert "this chat's max tokens 80" in w.inspector.reserve_label.text()
        assert "512" not in w.inspector.reserve_label.text()
    finally:
        w.shutdown()


def test_after_a_reload_or_a_restart_the_saved_reply_is_shown_whole(qtbot: Any, paths: Paths, fake_model: Path) -> None:
    w = start_window(qtbot, paths)
    try:
        send(qtbot, w, "numbers")
        saved = dict(w.inspector.shown)
        w.model_control.load_model(fake_model)  # a reload
        qtbot.waitUntil(lambda: w.chat.model_state is ModelState.LOADED, timeout=10000)
        shown = w.inspector.shown
        assert shown["freshness"] == "The last reply in this chat (saved)"
        for key in ("decode_tps", "ttft_ms", "budget.history", "budget.current", "budget.free", "context_used"):
            assert shown[key] == saved[key], key  # the legend and the speeds of the same reply
    finally:
        w.shutdown()
    again = start_window(qtbot, paths)  # a restart: the chat opens, then the model loads
    try:
        qtbot.waitUntil(lambda: again.inspector.shown.get("freshness", "").endswith("(saved)"), timeout=10000)
        assert again.inspector.shown["budget.current"] == saved["budget.current"] != "0"
        assert again.inspector.shown["decode_tps"] == saved["decode_tps"]
    finally:
        again.shutdown()


# ---------------------------------------------------------------------------- Stop during prefill
class PrefillStopSession(FakeSession):
    """Reads 300 of a 1,000-token prompt, then sees Stop: no token, a cancelled reply."""

    def script(self, call: StreamCall) -> Iterator[Any]:
        yield PrefillProgress(300, 1000)
        assert call.cancel is not None
        call.cancel.wait(10)
        budget = {"system": 100, "documents": 0, "history": 400, "current": 500, "reserve": 512, "free": 2584}
        stats = Stats(n_ctx=4096, prompt_tokens=1000, completion_tokens=0, context_used=300, ttft_ms=0.0,
                      prefill_ms=400.0, prefill_tps=2500.0, template="gguf:gguf", budget=budget)  # fmt: skip
        yield stats
        yield Finished(reason="cancelled", stats=stats, text="")


def test_after_stop_during_prefill_the_inspector_shows_what_was_read(
    qtbot: Any, paths: Paths, fake_model: Path
) -> None:
    w = start_window(qtbot, paths, make_session=PrefillStopSession)
    try:
        w.composer.edit.setPlainText("a long question")
        w.composer.send_button.click()
        qtbot.waitUntil(lambda: "300 / 1,000" in w.inspector.shown.get("phase", ""), timeout=10000)
        w.chat.turns.stop()
        qtbot.waitUntil(lambda: not w.chat.busy, timeout=10000)
        shown = w.inspector.shown
        assert shown["context_used"].startswith("Stopped while reading the prompt: 300 of 1,000 tokens read")
        assert shown["ttft_ms"] == "—" and shown["decode_tps"] == "—"
        assert shown["prefill_tps"] == "750.0 tok/s"  # 300 tokens in 0.4 s, not 1,000
        bar = w.inspector.context_bar.budget
        assert sum(bar.get(k, 0) for k in ("system", "documents", "history", "current")) == 300
        assert bar["reserve"] == 0 and bar["free"] == 4096 - 300
        assert (shown["budget.system"], shown["budget.history"], shown["budget.current"]) == ("100", "200", "0")
    finally:
        w.shutdown()


# ---------------------------------------------------------------------------- the CPU code
def test_a_reply_that_went_on_after_a_cpu_crash_says_so_under_the_cpu_line(panel: InspectorPanel) -> None:
    from engine.cpu_backend import BackendInfo

    panel.set_cpu_backend(
        BackendInfo(build="variants", variant="sapphirerapids", file="libggml-cpu-sapphirerapids.so", features=("AMX",))
    )
    before = panel.shown["cpu_backend"]
    panel.set_stats(local_stats())
    assert panel.shown["cpu_backend"] == before  # a reply without a note leaves the line alone
    note = "llama.cpp's sapphirerapids CPU code crashed after 3 tokens of this reply (SIGILL); the reply went on"
    panel.set_stats(local_stats(cpu_note=note))
    assert panel.shown["cpu_backend"].startswith(before + ". ")
    assert "Llama.cpp's sapphirerapids CPU code crashed after 3 tokens" in panel.shown["cpu_backend"]
    assert panel.cpu_label.toolTip()
