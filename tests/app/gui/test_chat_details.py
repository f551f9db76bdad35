"""The transcript, the sidebar's search hits, the inspector's honesty about whose numbers it shows,
export, per-chat sampling and the settings dialog (issue 15, minor items)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from gui_support import send, start_window
from PySide6.QtWidgets import QApplication, QPushButton

from app.gui.chat_view import ChatView
from app.gui.inspector import InspectorPanel
from app.gui.message_card import format_stats_line, format_stats_tooltip, highlight_html, search_terms
from app.gui.theme import DARK, LIGHT, contrast_ratio
from app.gui.workers.history_reads import DisplayMessage
from app.paths import Paths
from app.settings import Settings

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "engine"))
from tiny_models import write_tiny_llama_gguf

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]


def msg(i: int, role: str, content: str = "", **kw: Any) -> DisplayMessage:
    fields: dict[str, Any] = {"state": "complete", "stats": None, "sources": None, "model": None, "error": None}
    fields.update(kw)
    return DisplayMessage(
        i, i - 1 or None, role, content or f"m{i}", fields["state"], fields["stats"], fields["sources"],
        fields["model"], fields["error"], (i,),
    )  # fmt: skip


@pytest.fixture
def window(qtbot: Any, paths: Paths) -> Any:
    write_tiny_llama_gguf(paths.models / "tiny.gguf", n_ctx=512)
    w = start_window(qtbot, paths)
    yield w
    w.shutdown()


# ---------------------------------------------------------------------------- the transcript
def test_token_counts_are_singular_for_one() -> None:
    assert format_stats_line({"completion_tokens": 1}) == "1 token"
    assert format_stats_line({"completion_tokens": 2}).startswith("2 tokens")
    assert format_stats_line({"completion_tokens": 3812}).startswith("3,812 tokens")


def test_long_stats_or_error_line_does_not_clip_the_card(qtbot: Any) -> None:
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(560, 500)
    view.show()
    error = "the worker died: " + "/very/long/path/without/spaces" * 12
    view.set_thread([msg(1, "user", "question"), msg(2, "assistant", "", state="error", error=error)])
    QApplication.processEvents()
    viewport = view.viewport().width()
    body = view.widget()
    assert body.minimumSizeHint().width() <= viewport, (body.minimumSizeHint(), viewport)
    edit = view.cards[0].edit_button
    assert edit is not None and edit.isVisible()
    right = edit.mapTo(view.viewport(), edit.rect().topRight()).x()
    assert right <= viewport
    assert view.cards[1].stats_label.toolTip() == f"error: {error}"


def test_a_crashed_reply_says_interrupted_not_stopped(qtbot: Any) -> None:
    view = ChatView()
    qtbot.addWidget(view)
    crashed = msg(2, "assistant", "half a", state="partial", error="the model process crashed")
    stats = {"completion_tokens": 3, "finish_reason": "cancelled"}
    stopped = msg(4, "assistant", "half b", state="partial", stats=stats)
    view.set_thread([msg(1, "user"), crashed, msg(3, "user"), stopped])
    assert "interrupted" in view.cards[1].stats_label.text()
    assert "stopped" not in view.cards[1].stats_label.text()
    assert "stopped" in view.cards[3].stats_label.text()


def test_single_newlines_in_a_reply_are_line_breaks(qtbot: Any) -> None:
    view = ChatView()
    qtbot.addWidget(view)
    view.set_thread([msg(1, "user", "say cat twice"), msg(2, "assistant", "cat\ncat")])
    assert "<br" in view.cards[1].body.text()


def test_switching_branches_keeps_the_scroll_position(qtbot: Any) -> None:
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(600, 400)
    view.show()
    long = "words " * 120
    messages = [msg(i, "user" if i % 2 else "assistant", long) for i in range(1, 13)]
    messages[2] = DisplayMessage(3, 2, "user", long, "complete", None, None, None, None, (3, 30))
    view.set_thread(messages)
    qtbot.waitUntil(lambda: view.verticalScrollBar().maximum() > 1000, timeout=3000)
    QApplication.processEvents()
    card = view.cards[2]
    view.ensureWidgetVisible(card, 0, 0)
    QApplication.processEvents()
    offset = card.y() - view.verticalScrollBar().value()
    requested: list[int] = []
    view.branch_requested.connect(requested.append)
    card.next_button.click()
    assert requested == [30]
    edited = DisplayMessage(30, 2, "user", "short edit", "complete", None, None, None, None, (3, 30))
    switched = [*messages[:2], edited]
    view.set_thread([*switched, *[msg(i, "assistant", long) for i in range(31, 34)]])
    qtbot.waitUntil(lambda: view.card_for(30) is not None, timeout=2000)
    QApplication.processEvents()
    QApplication.processEvents()
    bar = view.verticalScrollBar()
    assert bar.value() < bar.maximum()
    new_card = view.card_for(30)
    assert new_card is not None
    assert abs((new_card.y() - bar.value()) - offset) <= 2


def test_highlight_marks_text_not_tags() -> None:
    markup = '<p>The <a href="zebra">zebra</a> crossed; ZEBRA!</p>'
    out = highlight_html(markup, search_terms('"zebra"'))
    assert out.count("background-color:#fde68a") == 2
    assert 'href="zebra"' in out


# ---------------------------------------------------------------------------- search
def test_search_hits_show_and_mark_the_matched_words(qtbot: Any, window: Any) -> None:
    from app.gui.sidebar import HIT_HTML_ROLE

    send(qtbot, window, "the zebra question")
    zebra_id = window.chat.thread_messages[0].id
    window.conversations.new_chat()
    qtbot.waitUntil(lambda: window.chat.conversation is not None and not window.chat.thread_messages, timeout=5000)
    send(qtbot, window, "a giraffe question")
    window.sidebar.search.setText("zebra")
    qtbot.waitUntil(lambda: "RESULT" in window.sidebar.title.text(), timeout=5000)
    item = window.sidebar.list.item(0)
    markup = item.data(HIT_HTML_ROLE)
    assert ">zebra</span>" in markup and "background-color" in markup
    assert window.sidebar.list.visualItemRect(item).height() > window.sidebar.list.fontMetrics().height() * 1.5
    window.sidebar.list.itemClicked.emit(item)
    qtbot.waitUntil(lambda: window.chat_view.card_for(zebra_id) is not None, timeout=5000)
    qtbot.waitUntil(lambda: ">zebra</span>" in window.chat_view.card_for(zebra_id).body.text(), timeout=5000)


# ---------------------------------------------------------------------------- inspector
def test_inspector_says_whose_numbers_it_shows(qtbot: Any, window: Any) -> None:
    inspector = window.inspector
    qtbot.waitUntil(lambda: inspector.shown.get("kv_cache_bytes", "—") != "—", timeout=5000)  # known at load
    send(qtbot, window, "first")
    assert inspector.shown["freshness"] == "The reply that just finished"
    assert inspector.shown["ttft_ms"] == "12 ms"
    inspector.begin_generation()  # a reply starts: the last turn's numbers are not shown as live
    assert inspector.shown["freshness"].startswith("Live")
    assert inspector.shown["ttft_ms"] == "…" and inspector.shown["cached_tokens"] == "…"
    conv_id = window.chat.conversation.id
    window.conversations.new_chat()
    qtbot.waitUntil(lambda: window.chat.conversation.id != conv_id, timeout=5000)
    assert inspector.shown["freshness"] == "No reply yet in this chat"
    assert inspector.shown["ttft_ms"] == "—"
    window.chat.conversations.open(conv_id)
    qtbot.waitUntil(lambda: inspector.shown["freshness"].endswith("(saved)"), timeout=5000)
    assert inspector.shown["ttft_ms"] == "12 ms"
    window.conversations.delete_conversation(conv_id)
    qtbot.waitUntil(lambda: inspector.shown["freshness"] == "No chat open", timeout=5000)
    assert inspector.shown["decode_tps"] == "—"


def test_inspector_shows_what_a_reply_may_use(qtbot: Any) -> None:
    panel = InspectorPanel()
    qtbot.addWidget(panel)
    panel.set_reply_limit(512)
    budget = {"system": 10, "documents": 0, "history": 0, "current": 32, "reserve": 256, "free": 726}
    panel.set_stats({"n_ctx": 1024, "prompt_tokens": 42, "context_used": 50, "budget": budget})
    assert panel.shown["reply_may_use"] == "512"
    assert "up to 512 tokens" in panel.reserve_label.text() and "256" in panel.reserve_label.text()


def test_inspector_shows_restored_kv_and_speculative_acceptance(qtbot: Any) -> None:
    panel = InspectorPanel()
    qtbot.addWidget(panel)
    stats = {"prompt_tokens": 3900, "prefill_tps": 93.0, "completion_tokens": 200, "kv_restored_tokens": 3812,
             "kv_restore_ms": 90.0, "draft_tokens": 200, "accepted_tokens": 140}  # fmt: skip
    panel.set_stats(stats)
    assert panel.shown["kv_restored"] == "restored 3,812 tokens from disk in 90 ms (prefill would take 41 s)"
    assert panel.restore_label.isVisibleTo(panel)
    assert "70% of drafted tokens accepted (140 of 200)" in panel.shown["draft"]
    assert "3.33 tokens per weight read" in panel.shown["draft"]
    panel.set_stats({"prompt_tokens": 10})
    assert "kv_restored" not in panel.shown and not panel.restore_label.isVisibleTo(panel)


def test_inspector_says_how_a_recurrent_model_took_back_its_drafts(qtbot: Any) -> None:
    panel = InspectorPanel()
    qtbot.addWidget(panel)
    panel.set_stats({"completion_tokens": 60, "draft_tokens": 40, "accepted_tokens": 30, "draft_restores": 4})
    assert "75% of drafted tokens accepted" in panel.shown["draft"]
    assert "4 rejected drafts undone by restoring the model's recurrent state" in panel.shown["draft"]
    note = "speculative decoding is off for this model: llama.cpp could not copy this model's sequence state"
    panel.set_stats({"completion_tokens": 60, "speculation_note": note})
    assert panel.shown["draft"] == "S" + note[1:] and panel.draft_label.isVisibleTo(panel)
    panel.set_stats({"completion_tokens": 60})
    assert "draft" not in panel.shown


def test_meters_are_described_to_assistive_technology(qtbot: Any) -> None:
    panel = InspectorPanel()
    qtbot.addWidget(panel)
    for meter in (panel.context_bar, panel.chart, panel.wall):
        assert meter.accessibleName()
    panel.set_stats({"n_ctx": 100, "budget": {"system": 10, "free": 90}, "bandwidth_gbps": 5.0,
                     "machine_bandwidth_gbps": 20.0})  # fmt: skip
    assert "System prompt: 10 tokens" in panel.context_bar.accessibleDescription()
    assert panel.wall.accessibleDescription().startswith("25% of the wall")
    panel.chart.set_samples([10.0, 30.0, 20.0])
    assert "peak 30 tok/s" in panel.chart.accessibleDescription()


def test_buttons_have_names_and_dark_links_have_contrast(window: Any) -> None:
    for button in window.findChildren(QPushButton):
        if not button.isVisibleTo(window):
            continue
        assert button.text().strip() or button.accessibleName(), button.objectName()
    assert window.composer.edit.accessibleName() == "Message"
    assert window.header.model_bar.picker.accessibleName() == "Model"
    for theme in (LIGHT, DARK):
        for background in (theme.window, theme.surface, theme.surface_alt, theme.user_bubble):
            assert contrast_ratio(theme.accent, background) >= 4.5, (theme.name, background)
        code = theme.code
        for background in (code.code_bg, code.code_header_bg, theme.window):
            assert contrast_ratio(code.link, background) >= 4.5, (theme.name, code.link, background)
        assert contrast_ratio(theme.danger_text, theme.danger) >= 4.5
        assert contrast_ratio(theme.muted, theme.surface) >= 3.0  # the unchecked checkbox's border


# ---------------------------------------------------------------------------- export, sampling, settings
def test_export_is_named_for_the_chat_and_keeps_the_system_prompt(
    qtbot: Any, window: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    from PySide6.QtWidgets import QFileDialog

    send(qtbot, window, "Plan the Q3 budget")
    qtbot.waitUntil(lambda: bool(window.sidebar.title_of(window.chat.conversation.id)), timeout=5000)
    asked: list[str] = []
    target = tmp_path / "out.md"

    def save_name(_parent: Any, _caption: str, default: str, *_a: Any) -> tuple[str, str]:
        asked.append(default)
        return str(target), ""

    monkeypatch.setattr(QFileDialog, "getSaveFileName", save_name)
    window.conversations.export_conversation(None, "md")
    qtbot.waitUntil(target.exists, timeout=5000)
    assert Path(asked[0]).name == "Plan the Q3 budget.md"
    assert f"**System prompt:** {window.settings.default_system_prompt}" in target.read_text()


def test_sampling_controls_per_chat(qtbot: Any, window: Any, monkeypatch: Any) -> None:
    from app.gui.conversation_settings import ConversationSettingsDialog

    send(qtbot, window, "first")

    def accept(dialog: ConversationSettingsDialog) -> int:
        dialog.preset.setCurrentIndex(dialog.preset.findData("Creative"))
        assert dialog.temperature.value() == 1.0  # the preset fills the controls
        dialog.temperature.setValue(0.4)
        dialog.top_k.setValue(7)
        dialog.max_tokens.setValue(128)
        dialog.seed.setValue(1234)
        return 1

    monkeypatch.setattr(ConversationSettingsDialog, "exec", accept)
    window.conversations.open_conversation_settings()
    qtbot.waitUntil(lambda: bool((window.chat.conversation.settings or {}).get("sampling")), timeout=5000)
    params = window.turns.turn_context().params
    assert (params.temperature, params.top_k, params.max_tokens, params.seed) == (0.4, 7, 128, 1234)
    assert params.top_p == window.settings.preset("Creative").top_p  # the rest from the preset
    assert window.chat.conversation.settings["sampling"] == {"temperature": 0.4, "top_k": 7, "max_tokens": 128,
                                                              "seed": 1234}  # fmt: skip


def test_settings_dialog_gpu_layers_and_kv_size(qtbot: Any, paths: Paths) -> None:
    from app.gui.settings_dialog import SettingsDialog

    model = write_tiny_llama_gguf(paths.models / "tiny.gguf", n_ctx=512)
    dialog = SettingsDialog(Settings(gpu_layers="auto", n_ctx=1024), model_path=model)
    qtbot.addWidget(dialog)
    assert dialog.height() <= dialog.screen().availableGeometry().height()  # the form scrolls instead
    dialog.show()
    body = dialog._scroll.widget()
    dialog.resize(dialog.width(), 420)  # as on a short screen: the form scrolls
    qtbot.waitUntil(lambda: dialog._scroll.verticalScrollBar().isVisible())
    # Beside the scroll bar the form keeps its own width: no control is cut at the right edge.
    assert body.width() <= dialog._scroll.viewport().width()
    assert dialog.gpu_mode.currentData() == "auto" and not dialog.gpu_count.isEnabled()
    for mode, expected in (("all", -1), ("cpu", 0), ("auto", "auto")):
        dialog.gpu_mode.setCurrentIndex(dialog.gpu_mode.findData(mode))
        assert dialog.result_settings().gpu_layers == expected
    dialog.gpu_mode.setCurrentIndex(dialog.gpu_mode.findData("count"))
    assert dialog.gpu_count.isEnabled()
    dialog.gpu_count.setValue(12)
    assert dialog.result_settings().gpu_layers == 12
    qtbot.waitUntil(lambda: "KV cache at 1,024 tokens" in dialog.kv_label.text(), timeout=5000)
    first = dialog.kv_label.text()
    dialog.n_ctx.setValue(2048)
    assert "KV cache at 2,048 tokens" in dialog.kv_label.text() and dialog.kv_label.text() != first


def test_a_theme_change_renders_the_shown_replies_again(qtbot: Any) -> None:
    view = ChatView()
    qtbot.addWidget(view)
    view.set_colors(LIGHT.code)
    view.set_thread([msg(1, "user", "code please"), msg(2, "assistant", "```py\nx = 1\n```")])
    assert LIGHT.code.code_bg in view.cards[1].body.text()
    view.set_colors(DARK.code)
    assert DARK.code.code_bg in view.cards[1].body.text()
    assert LIGHT.code.code_bg not in view.cards[1].body.text()


def test_tool_segments_show_only_when_a_turn_used_them(qtbot: Any) -> None:
    panel = InspectorPanel()
    qtbot.addWidget(panel)
    budget = {"system": 10, "documents": 0, "tools": 120, "history": 0, "tool_results": 40, "current": 30,
              "reserve": 256, "free": 568}  # fmt: skip
    panel.set_stats({"n_ctx": 1024, "budget": budget})
    assert sum(int(panel.shown[f"budget.{k}"]) for k in budget) == 1024
    assert all(w.isVisibleTo(panel) for w in panel.legend_rows["tools"])
    panel.set_stats({"n_ctx": 1024, "budget": {**budget, "tools": 0, "tool_results": 0, "free": 728}})
    assert not any(w.isVisibleTo(panel) for w in panel.legend_rows["tools"])


def test_the_stats_tooltip_says_how_many_passages_did_not_fit() -> None:
    """A reply whose retrieved passages did not all fit the window says so on hover; one where all
    fitted (or none were retrieved) shows no such row."""
    stats = {"prompt_tokens": 400, "n_ctx": 512, "documents_dropped": 4}
    assert "<td>Passages left out&nbsp;&nbsp;</td><td><b>4</b></td>" in format_stats_tooltip(stats, "m")
    assert "Passages left out" not in format_stats_tooltip({**stats, "documents_dropped": 0}, "m")
    assert "Passages left out" not in format_stats_tooltip({"prompt_tokens": 3}, "m")


def test_a_long_user_message_fits_a_narrow_transcript(qtbot: Any) -> None:
    """At 1024 px with the inspector open a long message's bubble was cut at the transcript's edge."""
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(520, 500)
    view.show()
    long_line = "The lighthouse keeper wrote in his log every evening about the wind and the sea. " * 8
    view.set_thread([msg(1, "user", long_line), msg(2, "assistant", "ok")])
    QApplication.processEvents()
    viewport = view.viewport().width()
    assert view.widget().minimumSizeHint().width() <= viewport
    bubble = view.cards[0].body
    assert bubble.mapTo(view.viewport(), bubble.rect().topRight()).x() <= viewport
    view.resize(900, 500)  # wider again: the bubble takes the room it had
    QApplication.processEvents()
    assert view.cards[0].body.minimumWidth() == 560
