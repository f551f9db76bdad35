"""A full disk: what the user typed and what the model answered is never lost.

The disk fills where the real write happens: SQLite's connection refuses writes with the error it
gives on a full disk (``database or disk is full``, after rolling the transaction back, as SQLite
does), so ``engine.history`` maps it as it would. One test also fills a real small tmpfs, where
``mount -t tmpfs`` works (root on Linux); it is skipped, with the reason, elsewhere.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gui_support import FakeSession, make_window
from PySide6.QtCore import Qt

from app.gui.workers import chat_reply
from app.gui.workers.chat_state import ChatState, ModelState
from app.gui.workers.history_disk import SAVE_MARGIN, HistoryDiskFull
from app.gui.workers.history_service import HistoryService
from app.paths import Paths
from engine.history import HistoryStore
from engine.units import format_bytes
from tests.disk_support import fill, mounted_tmpfs
from tests.engine.gguf_fixtures import build as build_gguf
from tests.fake_backend import StreamCall

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]

LONG_REPLY = " ".join(f"word{i}" for i in range(300))
_WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP")


# ---------------------------------------------------------------------------- a disk that fills
class Disk:
    """Whether the (pretend) disk is full; ``fill_after`` lets that many more commits through first."""

    def __init__(self) -> None:
        self.full = False
        self.fill_after: int | None = None
        self.refused = 0

    def refuses(self) -> bool:
        if self.fill_after is not None:
            if self.fill_after == 0:
                self.full, self.fill_after = True, None
            else:
                self.fill_after -= 1
        if self.full:
            self.refused += 1
        return self.full


class FullDiskConnection:
    """An ``sqlite3.Connection`` whose writes fail as on a full disk while ``disk.full``."""

    def __init__(self, conn: sqlite3.Connection, disk: Disk) -> None:
        self._conn = conn
        self._disk = disk

    def execute(self, sql: str, *args: Any) -> Any:
        word = sql.lstrip().split(None, 1)[0].upper()
        if word == "COMMIT" and self._disk.refuses():
            self._conn.execute("ROLLBACK")  # SQLite rolls back by itself on SQLITE_FULL
            raise sqlite3.OperationalError("database or disk is full")
        if word in _WRITES and not self._conn.in_transaction and self._disk.full:
            raise sqlite3.OperationalError("database or disk is full")
        return self._conn.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def _shown(label: Any) -> str:
    """A wrapping label's text as the user reads it (without the zero-width break points)."""
    return str(label.text()).replace("\u200b", "")


def full_disk_store(disk: Disk) -> Any:
    """A history store factory: the real ``HistoryStore`` on a connection that can run out of disk."""

    def factory(path: Path) -> HistoryStore:
        store = HistoryStore(path)
        store._conn = FullDiskConnection(store._conn, disk)  # type: ignore[assignment]
        return store

    return factory


def stored_messages(paths: Paths) -> list[Any]:
    """Every message of every chat, read through a connection of its own."""
    with HistoryStore(paths.history_db) as store:
        return [m for conv in store.list_conversations() for m in store.thread(conv.id)]


def little_free(monkeypatch: pytest.MonkeyPatch, folder: Path, free: int) -> None:
    """The history's folder reports ``free`` bytes free (other folders keep their real numbers)."""
    real = shutil.disk_usage

    def usage(path: Any) -> Any:
        if Path(path) == folder:
            return shutil._ntuple_diskusage(10 * 2**30, 10 * 2**30 - free, free)  # type: ignore[attr-defined]
        return real(path)

    monkeypatch.setattr(shutil, "disk_usage", usage)


class LiveReplySession(FakeSession):
    """A fake session that streams whatever ``reply`` holds when a turn starts (no reload needed)."""

    def __init__(self, request: Any, bandwidth: float | None, reply: dict[str, Any]) -> None:
        super().__init__(request, bandwidth)
        self._live = reply

    def script(self, call: StreamCall) -> Iterator[Any]:
        self.reply, self.delay_s = self._live["text"], self._live["delay"]
        return super().script(call)


@pytest.fixture
def disk() -> Disk:
    return Disk()


@pytest.fixture
def open_window(qtbot: Any, fake_model: Path) -> Iterator[Any]:
    """Builds a started window with a fake model; the reply is ``w.reply["text"]``."""
    windows: list[Any] = []

    def build(paths: Paths, **kwargs: Any) -> Any:
        reply = {"text": "Hello from the fake model.", "delay": 0.0}

        def factory(request: Any, bandwidth: float | None) -> FakeSession:
            return LiveReplySession(request, bandwidth, reply)

        w = make_window(paths, factory, probe_bandwidth=False, **kwargs)
        w.reply = reply
        qtbot.addWidget(w)
        w.show()
        w.start()
        qtbot.waitUntil(lambda: w.chat.model_state is ModelState.LOADED, timeout=5000)
        started = w.history.call(lambda _store: None, None, lambda _exc: None)  # start-up history work done
        assert started is not None
        started.exception(timeout=5)
        windows.append(w)
        return w

    yield build
    for w in windows:
        w.shutdown()


def press_send(qtbot: Any, w: Any, text: str | None = None) -> None:
    if text is not None:
        w.composer.edit.setPlainText(text)
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)


def wait_idle(qtbot: Any, w: Any) -> None:
    qtbot.waitUntil(lambda: not w.chat.busy and w.chat.state is ChatState.IDLE, timeout=10000)


# ---------------------------------------------------------------------------- 1. the user's message
def test_a_message_the_full_disk_refuses_goes_back_to_the_composer_with_the_space_needed(
    qtbot: Any, open_window: Any, paths: Paths, disk: Disk, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = open_window(paths, history_factory=full_disk_store(disk))
    free = 200 * 1024
    little_free(monkeypatch, paths.history_db.parent, free)
    disk.full = True
    text = "Please remember this: the lighthouse keeper's notes."
    press_send(qtbot, w, text)
    qtbot.waitUntil(lambda: w.banner.isVisible(), timeout=5000)
    wait_idle(qtbot, w)

    assert w.composer.edit.toPlainText() == text  # not lost: back in the box
    missing = SAVE_MARGIN + 4 * len(text.encode()) - free
    banner = _shown(w.banner)
    assert f"the disk is full: {format_bytes(missing)} more are needed on {paths.history_db.parent}" in banner
    assert "It is back in the box" in banner
    assert disk.refused >= 1
    assert stored_messages(paths) == []  # nothing half-saved either

    disk.full = False
    press_send(qtbot, w)  # the same text, sent again once there is space
    wait_idle(qtbot, w)
    qtbot.waitUntil(lambda: bool(w.chat.thread_messages) and w.chat.thread_messages[-1].state == "complete")
    assert w.composer.edit.toPlainText() == ""
    saved = stored_messages(paths)
    assert [(m.role, m.content, m.state) for m in saved] == [
        ("user", text, "complete"),
        ("assistant", "Hello from the fake model.", "complete"),
    ]


def test_an_edit_the_full_disk_refuses_comes_back_as_the_same_edit(
    qtbot: Any, open_window: Any, paths: Paths, disk: Disk
) -> None:
    w = open_window(paths, history_factory=full_disk_store(disk))
    press_send(qtbot, w, "first question")
    wait_idle(qtbot, w)
    qtbot.waitUntil(lambda: w.chat.thread_messages[-1].state == "complete")
    user_id = w.chat.thread_messages[0].id
    w.chat_view.cards[0].edit_button.click()
    disk.full = True
    press_send(qtbot, w, "better question")
    qtbot.waitUntil(lambda: w.composer.edit.toPlainText() == "better question", timeout=5000)
    assert w.composer.editing == user_id  # sending again still makes the new branch
    assert w.composer.edit_banner.isVisible()
    assert [m.content for m in stored_messages(paths)] == ["first question", "Hello from the fake model."]


def test_a_new_chat_made_before_the_disk_filled_is_used_again(
    qtbot: Any, open_window: Any, paths: Paths, disk: Disk
) -> None:
    w = open_window(paths, history_factory=full_disk_store(disk))
    disk.fill_after = 1  # the new chat's row is saved, then the disk is full
    press_send(qtbot, w, "hello")
    qtbot.waitUntil(lambda: w.composer.edit.toPlainText() == "hello", timeout=5000)
    wait_idle(qtbot, w)
    assert w.chat.conversation is not None
    disk.full = False
    press_send(qtbot, w)
    wait_idle(qtbot, w)
    qtbot.waitUntil(lambda: bool(w.chat.thread_messages) and w.chat.thread_messages[-1].state == "complete")
    with HistoryStore(paths.history_db) as store:
        conversations = store.list_conversations()
        assert len(conversations) == 1  # no empty chat left behind by the failed send
        assert [m.content for m in store.thread(conversations[0].id)] == ["hello", "Hello from the fake model."]


def test_an_unreadable_history_keeps_the_message_and_offers_a_new_history_beside_it(
    qtbot: Any, open_window: Any, paths: Paths
) -> None:
    junk = b"these are not the chats you are looking for\n" * 50
    paths.history_db.write_bytes(junk)
    w = open_window(paths)
    qtbot.waitUntil(lambda: w.toast.isVisible() and w.toast.action.text() == "Start a new history", timeout=5000)

    press_send(qtbot, w, "a message with nowhere to go")
    qtbot.waitUntil(lambda: w.composer.edit.toPlainText() == "a message with nowhere to go", timeout=5000)
    wait_idle(qtbot, w)
    assert "not an SQLite database" in _shown(w.banner)
    assert paths.history_db.read_bytes() == junk  # left untouched
    assert w.toast.isVisible() and w.toast.action.text() == "Start a new history"

    w.toast.action.click()
    qtbot.waitUntil(lambda: "Started a new chat history" in w.statusBar().currentMessage(), timeout=5000)
    moved = [p for p in paths.history_db.parent.iterdir() if p.name.startswith("history.sqlite3.unreadable-")]
    assert len(moved) == 1
    assert moved[0].read_bytes() == junk  # the old file, kept as it was
    assert str(moved[0]) in w.statusBar().currentMessage()  # says where
    assert paths.history_db.read_bytes()[:16] == b"SQLite format 3\x00"
    assert w.composer.edit.toPlainText() == "a message with nowhere to go"

    press_send(qtbot, w)
    wait_idle(qtbot, w)
    qtbot.waitUntil(lambda: bool(w.chat.thread_messages) and w.chat.thread_messages[-1].state == "complete")
    assert [m.content for m in stored_messages(paths)] == ["a message with nowhere to go", "Hello from the fake model."]


# ---------------------------------------------------------------------------- 2. the model's reply
@pytest.mark.parametrize("stop", [False, True], ids=["finished", "stopped"])
def test_a_reply_written_while_the_disk_fills_is_saved_whole_when_space_returns(
    qtbot: Any, open_window: Any, paths: Paths, disk: Disk, monkeypatch: pytest.MonkeyPatch, stop: bool
) -> None:
    monkeypatch.setattr(chat_reply, "CHECKPOINT_S", 0.0)  # a checkpoint for every batch of tokens
    monkeypatch.setattr(chat_reply, "RETRY_S", 0.2)
    w = open_window(paths, history_factory=full_disk_store(disk))
    w.reply["text"] = LONG_REPLY
    w.reply["delay"] = 0.005
    deltas: list[str] = []

    def on_delta(text: str, _count: int) -> None:
        deltas.append(text)
        if len(deltas) == 3:
            disk.full = True  # a few checkpoints got in; the rest, and the final save, are refused
        if stop and len(deltas) == 10:
            w.chat.turns.stop()

    w.chat.reply_delta.connect(on_delta)
    press_send(qtbot, w, "tell me everything")
    wait_idle(qtbot, w)
    qtbot.waitUntil(lambda: "The reply is not saved yet" in _shown(w.banner), timeout=5000)
    expected = LONG_REPLY if not stop else w.chat_view.streamed_text
    expected_state = "partial" if stop else "complete"
    assert 0 < len(expected) <= len(LONG_REPLY)
    assert stop == (len(expected) < len(LONG_REPLY))

    # On screen: all of it, in its final state, while the disk refuses it.
    qtbot.waitUntil(lambda: w.chat.thread_messages[-1].state == expected_state, timeout=5000)
    assert w.chat.thread_messages[-1].content == expected
    assert w.chat.thread_messages[-1].state == expected_state
    assert w.chat_view.cards[-1].text == expected
    assert "the disk is full" in _shown(w.banner)
    # In the history: still pending, with what the first checkpoints saved, and kept in memory.
    row = stored_messages(paths)[-1]
    assert row.state == "pending"
    assert 0 < len(row.content) < len(expected)
    assert expected.startswith(row.content)
    assert w.history.unsaved == 1
    refused = disk.refused
    qtbot.waitUntil(lambda: disk.refused > refused, timeout=5000)  # it keeps trying while the disk is full
    assert stored_messages(paths)[-1].state == "pending"  # and is not marked saved meanwhile

    disk.full = False  # space comes back: the timer saves it
    qtbot.waitUntil(lambda: stored_messages(paths)[-1].state != "pending", timeout=5000)
    row = stored_messages(paths)[-1]
    assert row.content == expected
    assert row.state == expected_state
    assert row.stats is not None
    qtbot.waitUntil(lambda: w.history.unsaved == 0 and not w.chat.replies.retry_timer.isActive(), timeout=5000)
    assert w.statusBar().currentMessage() == "The reply was saved."


def test_an_unsaved_reply_is_saved_before_the_next_message(
    qtbot: Any, open_window: Any, paths: Paths, disk: Disk, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chat_reply, "RETRY_S", 3600.0)  # only the next write can save it
    w = open_window(paths, history_factory=full_disk_store(disk))

    def fill_up(_reply_id: int) -> None:
        disk.full = True

    w.chat.reply_started.connect(fill_up)
    press_send(qtbot, w, "first")
    wait_idle(qtbot, w)
    qtbot.waitUntil(lambda: w.history.unsaved == 1, timeout=5000)
    assert stored_messages(paths)[-1].state == "pending"
    w.chat.reply_started.disconnect(fill_up)

    disk.full = False
    press_send(qtbot, w, "second")
    wait_idle(qtbot, w)
    qtbot.waitUntil(lambda: bool(w.chat.thread_messages) and w.chat.thread_messages[-1].state == "complete")
    saved = stored_messages(paths)
    assert [(m.content, m.state) for m in saved] == [
        ("first", "complete"),
        ("Hello from the fake model.", "complete"),
        ("second", "complete"),
        ("Hello from the fake model.", "complete"),
    ]
    assert w.history.unsaved == 0


def test_a_kept_write_is_tried_again_at_close(qtbot: Any, paths: Paths, disk: Disk) -> None:
    service = HistoryService(paths.history_db, full_disk_store(disk))
    failures: list[BaseException] = []
    saved: list[str] = []
    with HistoryStore(paths.history_db) as store:
        conv = store.create_conversation(title="t")
        reply = store.add_message(conv.id, "assistant", "", state="pending")
    disk.full = True

    def finish(store: Any) -> str:
        store.finish_message(reply.id, "the whole reply", state="complete")
        return "saved"

    service.keep(("reply", reply.id), finish, saved.append, failures.append)
    qtbot.waitUntil(lambda: bool(failures), timeout=5000)
    assert isinstance(failures[0], HistoryDiskFull)
    assert str(failures[0]).startswith(f"{paths.history_db}: the disk is full: ")
    assert service.unsaved == 1
    disk.full = False
    service.close(wait=True)  # quitting: one last try, which now succeeds
    with HistoryStore(paths.history_db) as store:
        row = store.get_message(reply.id)
    assert (row.content, row.state) == ("the whole reply", "complete")
    assert service.unsaved == 0


# ---------------------------------------------------------------------------- a real full tmpfs
@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs, mounted where ``mount -t tmpfs`` works (root on Linux)."""
    yield from mounted_tmpfs(tmp_path, "4m")


def test_on_a_real_full_tmpfs_nothing_typed_or_answered_is_lost(
    qtbot: Any, open_window: Any, tmpfs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chat_reply, "RETRY_S", 0.2)
    paths = Paths.resolve(tmpfs / "home").ensure()
    (paths.models / "fake-model.gguf").write_bytes(build_gguf().data)
    w = open_window(paths)
    press_send(qtbot, w, "a first message, while there is room")
    wait_idle(qtbot, w)
    qtbot.waitUntil(lambda: bool(w.chat.thread_messages) and w.chat.thread_messages[-1].state == "complete")

    filler = fill(tmpfs)
    text = "typed on a full disk " * 40
    press_send(qtbot, w, text)
    qtbot.waitUntil(lambda: "Your message was not saved" in _shown(w.banner), timeout=10000)
    wait_idle(qtbot, w)
    assert w.composer.edit.toPlainText() == text.strip()
    assert "the disk is full: " in _shown(w.banner)
    assert f"more are needed on {paths.history_db.parent}" in _shown(w.banner)

    filler.unlink()
    w.reply["text"] = LONG_REPLY
    w.reply["delay"] = 0.002
    fillers: list[Path] = []

    def fill_up(_reply_id: int) -> None:
        fillers.append(fill(tmpfs))  # the disk is full while the model answers

    w.chat.reply_started.connect(fill_up)
    press_send(qtbot, w)
    wait_idle(qtbot, w)
    qtbot.waitUntil(lambda: "The reply is not saved yet" in _shown(w.banner), timeout=10000)
    assert w.chat_view.cards[-1].text == LONG_REPLY
    w.chat.reply_started.disconnect(fill_up)

    fillers[0].unlink()
    qtbot.waitUntil(lambda: w.history.unsaved == 0, timeout=10000)
    saved = stored_messages(paths)
    assert [(m.role, m.state) for m in saved[-2:]] == [("user", "complete"), ("assistant", "complete")]
    assert saved[-2].content == text.strip()
    assert saved[-1].content == LONG_REPLY
