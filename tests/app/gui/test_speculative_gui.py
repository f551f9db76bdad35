"""Speculative decoding in the app (issue 14, section 2): a chat turn decodes with the setting or the
draft model chosen for its model, a draft the engine refuses is said in one line and the model
loads without it, Settings chooses both (with the draft's memory), and the inspector's token view
tints the reply's tokens accepted from a draft."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gui_support import FakeSession, start_window
from PySide6.QtCore import Qt

from app.gui.inspector import InspectorPanel
from app.gui.speculative_settings import SpeculativeSettingsWidget
from app.gui.theme import DARK
from app.gui.workers.chat_state import ChatState
from app.gui.workers.llm_requests import LoadRequest
from app.gui.workers.llm_worker import LlmWorker
from app.gui.workers.speculative import TokensView, load_session
from app.paths import Paths
from app.settings import Settings
from engine.errors import ModelLoadError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "engine"))
from tiny_models import write_tiny_llama_gguf

from tests.fake_backend import StreamCall

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]

DRAFTED = [False, True, True, False, True]  # which of the fake reply's five tokens a draft proposed


class DraftingSession(FakeSession):
    """A fake session that records each turn's GenerationParams, marks some reply tokens as
    accepted from a draft, and reports the drafting in Stats; with ``refuse_draft`` its load
    fails the way the engine refuses a draft model of another vocabulary."""

    refuse_draft = False

    def __init__(self, request: Any, bandwidth: float | None) -> None:
        super().__init__(request, bandwidth, reply="one two three four five")
        self.params: list[Any] = []

    def load(self, cancel: Any = None) -> Any:
        draft = self.request.draft_model_path
        if self.refuse_draft and draft is not None:
            raise ModelLoadError(f"{draft}: cannot draft for this model: the vocabularies differ (token 5)")
        return super().load(cancel)

    def script(self, call: StreamCall) -> Iterator[Any]:
        import dataclasses

        from engine.inference.events import Finished, Stats, Token

        self.params.append(call.params)
        extra = {"draft_tokens": 4, "accepted_tokens": 3}
        for event in super().script(call):
            if isinstance(event, Token):
                event = dataclasses.replace(event, drafted=DRAFTED[event.token_id])
            elif isinstance(event, Stats):
                event = dataclasses.replace(event, **extra)
            elif isinstance(event, Finished):
                event = dataclasses.replace(event, stats=dataclasses.replace(event.stats, **extra))
            yield event


class RefusingSession(DraftingSession):
    refuse_draft = True


@pytest.fixture
def models(paths: Paths) -> tuple[Path, Path]:
    """A chat model and a smaller one of the same vocabulary, in the models folder."""
    big = write_tiny_llama_gguf(paths.models / "big.gguf", n_embd=256, n_ctx=512)
    small = write_tiny_llama_gguf(paths.models / "small.gguf", n_embd=64, n_ff=128, n_ctx=512)
    return big, small


def _window(qtbot: Any, paths: Paths, settings: Settings, session_type: type[DraftingSession]) -> tuple[Any, list[Any]]:
    w = start_window(qtbot, paths, session_type, settings=settings)
    return w, w.sessions


def _send(qtbot: Any, w: Any, text: str = "Hi there") -> None:
    w.composer.edit.setPlainText(text)
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: w.chat.state is ChatState.IDLE and w.chat.last_stats is not None, timeout=20000)


def test_a_turn_drafts_with_the_model_chosen_in_settings_and_the_token_view_tints_its_accepted_tokens(
    qtbot: Any, paths: Paths, models: tuple[Path, Path]
) -> None:
    big, small = models
    settings = Settings(theme="light", last_model=str(big), draft_models={str(big): str(small)})
    w, sessions = _window(qtbot, paths, settings, DraftingSession)
    assert sessions[-1].request.model_path == big and sessions[-1].request.draft_model_path == small
    assert w.chat.loaded.draft_path == small
    assert "small.gguf drafting for it" in w.statusBar().currentMessage()
    _send(qtbot, w)
    assert [p.speculative for p in sessions[-1].params] == ["draft"]

    inspector = w.inspector
    qtbot.waitUntil(lambda: inspector.tokens_view.reply_ids == [0, 1, 2, 3, 4], timeout=5000)
    view = inspector.tokens_view
    assert view.reply_drafted == DRAFTED
    assert view.reply_pieces == ["one", " two", " three", " four", " five"]
    assert view.token_ids == [1, 2, 3]  # the prompt comes first, as before
    page = view.toHtml().lower()
    assert page.count(view.DRAFTED_LIGHT) == sum(DRAFTED)
    assert page.count(view.REPLY_LIGHT) == len(DRAFTED) - sum(DRAFTED)
    assert "5 tokens, 3 of them accepted from a draft" in inspector.tokens_caption.text()
    assert not inspector.tokens_legend.isHidden()
    legend = inspector.tokens_legend.text()
    assert view.DRAFTED_LIGHT in legend and "accepted from a draft" in legend and "decoded by the model" in legend
    assert "75% of drafted tokens accepted (3 of 4)" in inspector.draft_label.text()
    assert "(accepted from a draft)" in (view.tooltip_from_anchor("rep:1") or "")
    assert "(decoded by the model)" in (view.tooltip_from_anchor("rep:0") or "")

    inspector.set_colors(DARK)  # a theme change redraws the reply too, in the dark tints
    page = view.toHtml().lower()
    assert page.count(view.DRAFTED_DARK) == sum(DRAFTED) and view.DRAFTED_DARK in inspector.tokens_legend.text()


@pytest.mark.parametrize("mode", ["lookup", "off"])
def test_without_a_draft_model_a_turn_decodes_with_the_setting(
    qtbot: Any, paths: Paths, models: tuple[Path, Path], mode: str
) -> None:
    big, _small = models
    w, sessions = _window(qtbot, paths, Settings(theme="light", last_model=str(big), speculative=mode), DraftingSession)
    assert sessions[-1].request.draft_model_path is None
    _send(qtbot, w)
    assert [p.speculative for p in sessions[-1].params] == [mode]


def test_a_draft_model_the_engine_refuses_is_said_in_one_line_and_the_model_loads_without_it(
    qtbot: Any, paths: Paths, models: tuple[Path, Path]
) -> None:
    big, small = models
    settings = Settings(theme="light", last_model=str(big), draft_models={str(big): str(small)})
    w, sessions = _window(qtbot, paths, settings, RefusingSession)
    assert [s.request.draft_model_path for s in sessions] == [small, None]
    assert sessions[0].closed and not sessions[1].closed
    assert w.chat.loaded.path == big and w.chat.loaded.draft_path is None
    assert not w.banner.isHidden()
    message = w.banner.text()
    assert "small.gguf" in message and "vocabularies differ" in message and "big.gguf loads without it" in message
    assert "\n" not in w.chat.loaded.draft_note
    _send(qtbot, w)
    assert [p.speculative for p in sessions[-1].params] == ["lookup"]  # the setting, not the refused draft


def test_a_chat_model_that_fails_to_load_is_not_tried_again_without_its_draft(tmp_path: Path) -> None:
    calls: list[LoadRequest] = []

    class Broken(FakeSession):
        def load(self, cancel: Any = None) -> Any:
            raise ModelLoadError(f"{self.request.model_path}: llama.cpp could not load it (bad tensor)")

    def factory(request: LoadRequest, bandwidth: float | None) -> Broken:
        calls.append(request)
        return Broken(request, bandwidth)

    draft = tmp_path / "small.gguf"
    draft.write_bytes(b"GGUF")
    worker = LlmWorker(session_factory=factory)
    failed: list[BaseException] = []
    worker.model_load_failed.connect(failed.append)
    worker._on_load_requested(LoadRequest(model_path=tmp_path / "big.gguf", draft_model_path=draft))
    assert len(calls) == 1 and [str(e) for e in failed] == [
        f"{tmp_path / 'big.gguf'}: llama.cpp could not load it (bad tensor)"
    ]


def test_a_missing_draft_model_file_is_said_and_not_loaded(tmp_path: Path) -> None:
    calls: list[LoadRequest] = []

    def factory(request: LoadRequest, bandwidth: float | None) -> FakeSession:
        calls.append(request)
        return FakeSession(request, bandwidth)

    gone = tmp_path / "gone.gguf"
    _session, info, request, note = load_session(
        factory, LoadRequest(model_path=tmp_path / "big.gguf", draft_model_path=gone), None
    )
    assert [c.draft_model_path for c in calls] == [None] and request.draft_model_path is None
    assert info.path == str(tmp_path / "big.gguf")
    assert note is not None and str(gone) in note and "missing" in note and "big.gguf loads without it" in note


# ---------------------------------------------------------------------------- Settings


class Library:
    """The models library adapter's surface the Settings group reads."""

    def __init__(self, models: list[Path], hardware: Any = None) -> None:
        from engine.gguf import read_gguf_info
        from engine.library import LibraryEntry

        self.entries = [
            LibraryEntry(p.name, p, p.parent, p.stat().st_size, True, True, info=read_gguf_info(p)) for p in models
        ]
        self.hardware = hardware
        self.bandwidth_gbps: float | None = None


def test_settings_choose_the_mode_and_a_draft_model_per_chat_model_with_its_memory(
    qtbot: Any, models: tuple[Path, Path]
) -> None:
    from engine.fit import draft_model_bytes
    from engine.hardware import HardwareInfo
    from engine.units import format_bytes

    big, small = models
    hw = HardwareInfo(
        total_ram=8 << 30,
        available_ram=7 << 30,
        cpu_count_physical=2,
        cpu_count_logical=2,
        cpu_name="test",
        gpu_offload_supported=False,
    )
    group = SpeculativeSettingsWidget(Settings(n_ctx=512), Library([big, small], hw), big)
    qtbot.addWidget(group)
    assert group.title() == "Speculative decoding"
    assert group.mode.currentData() == "lookup" and group.chat_model.currentData() == str(big)
    assert group.draft.currentText() == "None"
    assert [group.draft.itemData(i) for i in range(group.draft.count())] == ["", str(small)]  # not itself
    assert "No draft model" in group.memory.text()

    group.draft.setCurrentIndex(group.draft.findData(str(small)))
    small_info = group._entries[str(small)].info
    text = group.memory.text()
    assert f"adds {format_bytes(draft_model_bytes(small_info, 512))}" in text and "512 tokens" in text
    assert "fits in RAM" in text and "Note" not in text
    group.mode.setCurrentIndex(group.mode.findData("off"))
    assert group.updates() == {"speculative": "off", "draft_models": {str(big): str(small)}}

    group.chat_model.setCurrentIndex(group.chat_model.findData(str(small)))  # each model has its own choice
    assert group.draft.currentText() == "None"
    group.draft.setCurrentIndex(group.draft.findData(str(big)))
    assert "not smaller than the chat model" in group.memory.text()
    group.draft.setCurrentIndex(0)
    assert group.updates()["draft_models"] == {str(big): str(small)}


def test_settings_without_chat_models_say_so_and_keep_the_saved_choices(qtbot: Any) -> None:
    saved = {"/models/a.gguf": "/models/b.gguf"}
    group = SpeculativeSettingsWidget(Settings(speculative="off", draft_models=saved), None, None)
    qtbot.addWidget(group)
    assert "No chat models in the library" in group.memory.text() and not group.draft.isEnabled()
    assert group.updates() == {"speculative": "off", "draft_models": saved}


def test_choosing_a_draft_for_the_loaded_model_in_settings_reloads_it_with_the_draft(
    qtbot: Any, paths: Paths, models: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.gui.settings_dialog import SettingsDialog

    big, small = models
    w, sessions = _window(qtbot, paths, Settings(theme="light", last_model=str(big)), DraftingSession)
    assert sessions[-1].request.draft_model_path is None

    def choose(dialog: SettingsDialog) -> int:
        group = dialog.speculative  # the library was not read yet: the group asks for it and fills in
        qtbot.waitUntil(lambda: group.chat_model.count() == 2, timeout=10000)
        assert group.chat_model.currentData() == str(big)  # the loaded model comes first
        group.draft.setCurrentIndex(group.draft.findData(str(small)))
        return 1

    monkeypatch.setattr(SettingsDialog, "exec", choose)
    w.open_settings()
    qtbot.waitUntil(lambda: w.chat.loaded is not None and w.chat.loaded.draft_path == small, timeout=20000)
    assert sessions[-1].request.draft_model_path == small
    assert w.settings.draft_models == {str(big): str(small)}


def test_the_inspector_shows_a_plain_prompt_view_without_a_reply(qtbot: Any) -> None:
    panel = InspectorPanel()
    qtbot.addWidget(panel)
    panel.set_prompt_view(TokensView([1, 2], ["a", "b"], [7, 8], ["c", "d"], [True, False]))
    assert not panel.tokens_legend.isHidden()
    panel.set_prompt_view(TokensView([1, 2], ["a", "b"]))  # a remote model's view, say: no reply tokens
    assert panel.tokens_view.reply_ids == [] and panel.tokens_legend.isHidden()
    assert "reply" not in panel.tokens_caption.text()


def test_automatic_gpu_layers_count_the_draft_model(
    qtbot: Any, paths: Paths, models: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine import hardware
    from engine.fit import VRAM_RESERVE, estimate_fit
    from engine.gguf import read_gguf_info

    big, small = models
    big_info, small_info = read_gguf_info(big), read_gguf_info(small)

    def machine(free_vram: int) -> Any:
        gpu = hardware.GpuInfo(name="test GPU", vendor="nvidia", total_vram=free_vram, free_vram=free_vram)
        return hardware.HardwareInfo(
            total_ram=8 << 30,
            available_ram=7 << 30,
            cpu_count_physical=2,
            cpu_count_logical=2,
            cpu_name="test",
            gpu_offload_supported=True,
            gpus=[gpu],
        )

    alone = estimate_fit(big_info, machine(1 << 40), 512)
    hw = machine(VRAM_RESERVE + alone.gpu_bytes + 1024)  # room for the model alone, not for its draft too
    without = estimate_fit(big_info, hw, 512).gpu_layers
    with_draft = estimate_fit(big_info, hw, 512, draft=small_info).gpu_layers
    assert with_draft < without
    monkeypatch.setattr(hardware, "probe_hardware", lambda: hw)
    settings = Settings(
        theme="light", last_model=str(big), n_ctx=512, gpu_layers="auto", draft_models={str(big): str(small)}
    )
    _w, sessions = _window(qtbot, paths, settings, DraftingSession)
    assert sessions[-1].request.n_gpu_layers == with_draft


def test_a_remote_model_is_never_asked_to_speculate() -> None:
    from app.compose import RemoteModel
    from app.gui.workers.llm_requests import LoadedModel
    from app.gui.workers.speculative import speculative_mode

    remote = LoadedModel(RemoteModel("lab", "qwen"), "qwen", None, 1.0, None)
    local = LoadedModel(Path("/m/big.gguf"), "big", None, 1.0, None)
    drafted = LoadedModel(Path("/m/big.gguf"), "big", None, 1.0, None, draft_path=Path("/m/small.gguf"))
    settings = Settings(speculative="lookup")
    assert [speculative_mode(m, settings) for m in (remote, local, drafted, None)] == ["off", "lookup", "draft", "off"]
