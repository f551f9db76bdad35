"""The KV cache saved with each chat, in the app: the chat's key reaches the session, the load asks
for the cache folder under the settings' cap, and the restore and save figures arrive in Stats."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gui_support import FakeSession, make_window
from PySide6.QtCore import Qt

from app.gui.workers.chat_state import ChatState, ModelState
from app.gui.workers.llm_loading import default_session_factory
from app.gui.workers.llm_requests import GenerateRequest, LoadRequest
from app.gui.workers.llm_worker import LlmWorker
from app.paths import Paths
from app.settings import Settings
from app.turn import TurnRequest
from engine.inference.context import Message
from engine.inference.kv_cache import KvKey
from tests.fake_backend import StreamCall


class KvFakeSession(FakeSession):
    """A fake session that saves KV caches: records each turn's key, reports restore figures."""

    def __init__(self, request: Any, bandwidth: float | None) -> None:
        super().__init__(request, bandwidth, reply="Hello from the cache")
        self.keys: list[Any] = []

    def script(self, call: StreamCall) -> Iterator[Any]:
        from engine.inference.events import Finished, Stats

        self.keys.append(call.cache_key)
        extra = {"kv_restored_tokens": 35, "kv_restore_ms": 4.5, "kv_saved_bytes": 123_000}
        for event in super().script(call):
            if isinstance(event, Stats):
                event = dataclasses.replace(event, **extra)
            elif isinstance(event, Finished):
                event = dataclasses.replace(event, stats=dataclasses.replace(event.stats, **extra))
            yield event


@pytest.mark.gui
@pytest.mark.qt_log_ignore("propagateSizeHints")
def test_a_chat_turn_passes_its_conversation_and_reply_as_the_cache_key(qtbot: Any, tmp_path: Path) -> None:
    from engine.inference.kv_cache import KvKey

    paths = Paths.resolve(tmp_path / "home").ensure()
    (paths.models / "tiny.gguf").write_bytes(b"GGUF")
    sessions: list[KvFakeSession] = []

    def factory(request: LoadRequest, bandwidth: float | None) -> KvFakeSession:
        sessions.append(KvFakeSession(request, bandwidth))
        return sessions[-1]

    w = make_window(paths, factory, Settings(theme="light", kv_cache_max_gb=2.5), probe_bandwidth=False)
    qtbot.addWidget(w)
    w.show()
    w.start()
    # The placeholder file is no model, so the window installs the starter first: a copy of the
    # package's ~250 MB, hashed as it is written, whose time follows the disk (seconds to tens).
    qtbot.waitUntil(lambda: w.chat.model_state is ModelState.LOADED, timeout=90_000)
    request = sessions[-1].request
    assert (request.kv_cache_dir, request.kv_cache_max_bytes) == (paths.kv_cache, int(2.5 * 2**30))
    w.composer.edit.setPlainText("Hi there")
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: w.chat.state is ChatState.IDLE and w.chat.last_stats is not None, timeout=20000)
    conversation = w.chat.conversation
    reply = [m for m in w.chat.thread_messages if m.role == "assistant"][-1]
    assert sessions[-1].keys == [KvKey(str(conversation.id), str(reply.id))]
    stats = w.chat.last_stats
    assert (stats.kv_restored_tokens, stats.kv_restore_ms, stats.kv_saved_bytes) == (35, 4.5, 123_000)


def test_every_backend_is_given_the_chats_key_and_one_without_saved_caches_ignores_it() -> None:
    sessions: list[FakeSession] = []
    worker = LlmWorker(session_factory=lambda r, b: sessions.append(FakeSession(r, b, reply="plain")) or sessions[-1])
    worker._on_load_requested(LoadRequest(model_path=Path("m.gguf")))
    finished: list[Any] = []
    worker.generation_finished.connect(finished.append)
    worker._on_generate_requested(GenerateRequest(1, TurnRequest((), "Hi", None, cache_key=("1", "2"))))
    assert [o.text for o in finished] == ["plain"]
    assert sessions[-1].calls[-1].cache_key == KvKey("1", "2")


@pytest.mark.model
def test_stats_of_the_real_engine_carry_the_restore_across_processes(starter_model: Path, tmp_path: Path) -> None:
    from engine.inference.runtime import GenerationParams

    params = GenerationParams(temperature=0.0, max_tokens=8, repeat_penalty=1.0)
    document = " ".join(f"Note {i}: the lamp in room {i % 9} was replaced on day {i}." for i in range(30))
    load = LoadRequest(
        model_path=starter_model, n_ctx=1024, n_threads=2, kv_cache_dir=tmp_path / "kv", kv_cache_max_bytes=10**9
    )
    outcomes: list[Any] = []
    first = LlmWorker(session_factory=default_session_factory)
    first.generation_finished.connect(outcomes.append)
    first._on_load_requested(load)
    first._on_generate_requested(GenerateRequest(1, TurnRequest((), f"Read: {document}", params, cache_key=("5", "9"))))
    first._on_shutdown_requested()  # the worker process ends: only the file remains
    second = LlmWorker(session_factory=default_session_factory)
    second.generation_finished.connect(outcomes.append)
    second._on_load_requested(load)
    history = (Message("user", f"Read: {document}"), Message("assistant", outcomes[0].text))
    second._on_generate_requested(
        GenerateRequest(2, TurnRequest(history, "Which room?", params, cache_key=("5", "11")))
    )
    second._on_shutdown_requested()
    saved, restored = outcomes[0].stats, outcomes[1].stats
    assert saved.kv_saved_bytes > 0 and saved.kv_restored_tokens == 0
    assert restored.kv_restored_tokens >= saved.prompt_tokens - 1
    assert restored.kv_restore_ms > 0


@pytest.mark.gui
def test_the_settings_dialog_sets_the_cap_and_clears_the_saved_caches(qtbot: Any, tmp_path: Path) -> None:
    from app.gui.settings_dialog import SettingsDialog
    from engine.inference.kv_cache import KvCacheStore, KvIdentity, KvKey

    folder = tmp_path / "kv"
    store = KvCacheStore(folder)
    identity = KvIdentity("m", 512, "f16", "t", "0")
    for branch in ("1", "2"):
        store.save(KvKey("3", branch), identity, [int(branch), 5, 6], bytes(1_500_000))
    dialog = SettingsDialog(Settings(kv_cache_max_gb=4.0), kv_cache_dir=folder)
    qtbot.addWidget(dialog)
    group = dialog.kv_caches
    qtbot.waitUntil(lambda: group.usage.text() == "2 chat branches, 2.9 MiB", timeout=5000)
    group.cap.setValue(0.5)
    assert dialog.result_settings().kv_cache_max_gb == 0.5
    qtbot.mouseClick(group.clear_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: group.usage.text().startswith("none (cleared 2.9 MiB"), timeout=5000)
    assert store.usage() == (0, 0) and group.clear_button.isEnabled()


@pytest.mark.gui
def test_without_a_folder_the_group_offers_only_the_cap(qtbot: Any) -> None:
    from app.gui.settings_dialog import SettingsDialog

    dialog = SettingsDialog(Settings(kv_cache_max_gb=0.0))
    qtbot.addWidget(dialog)
    assert not dialog.kv_caches.clear_button.isEnabled()
    assert dialog.kv_caches.cap.text().startswith("off")
    assert dialog.result_settings().kv_cache_max_gb == 0.0
