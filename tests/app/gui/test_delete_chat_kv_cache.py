"""Deleting a chat in the app removes the KV caches saved with it (they hold its tokens), off the
GUI thread; other chats keep theirs, and Undo brings the chat back (it only prefills again)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from gui_support import FakeSession, make_window
from PySide6.QtCore import Qt

from app.gui.workers.chat_state import ChatState, ModelState
from app.paths import Paths
from engine.inference.kv_cache import KvCacheStore, KvIdentity, KvKey

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]

IDENTITY = KvIdentity("m", 512, "f16", "t", "0")


def test_deleting_a_chat_removes_its_saved_kv_caches_off_the_gui_thread(
    qtbot: Any, paths: Paths, fake_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    removed_on: list[str] = []
    original = KvCacheStore.remove_conversation

    def spy(self: KvCacheStore, conversation: str) -> int:
        removed_on.append(threading.current_thread().name)
        return original(self, conversation)

    monkeypatch.setattr(KvCacheStore, "remove_conversation", spy)
    w = make_window(
        paths, lambda request, bandwidth: FakeSession(request, bandwidth, reply="Hi."), probe_bandwidth=False
    )
    qtbot.addWidget(w)
    w.show()
    w.start()
    try:
        qtbot.waitUntil(lambda: w.chat.model_state is ModelState.LOADED, timeout=30000)
        w.composer.edit.setPlainText("remember this")
        qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
        qtbot.waitUntil(lambda: not w.chat.busy and w.chat.state is ChatState.IDLE, timeout=10000)
        conversation = w.chat.conversation.id
        store = KvCacheStore(paths.kv_cache)
        for key in (KvKey(str(conversation), "2"), KvKey(str(conversation), "4")):  # two branches
            store.save(key, IDENTITY, [1, 2, 3, int(key.branch)], bytes(1000))
        other = store.path_for(KvKey(str(conversation + 1), "9"))
        store.save(KvKey(str(conversation + 1), "9"), IDENTITY, [1, 2], bytes(1000))
        assert store.usage()[0] == 3
        qtbot.waitUntil(lambda: w.sidebar.list.count() == 1, timeout=10000)  # the list is filled off-thread

        w.conversations.delete_conversation(conversation)
        qtbot.waitUntil(lambda: w.sidebar.list.count() == 0, timeout=10000)
        qtbot.waitUntil(lambda: store.files() == [other], timeout=10000)  # only another chat's cache is left
        assert removed_on and threading.main_thread().name not in removed_on

        w.toast.action.click()  # Undo: the chat comes back, without a saved cache
        qtbot.waitUntil(lambda: w.sidebar.list.count() == 1, timeout=10000)
        assert store.files() == [other]
    finally:
        w.shutdown()
