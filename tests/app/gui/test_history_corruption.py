"""A damaged ``history.sqlite3`` (ROBUSTNESS P2, P5): a real history, cut short at several offsets or
with bytes flipped in its pages, gives one clear line naming the file, leaves the file as it was,
and never a traceback or another exception type.

The history is read the way the app reads it at start (``app.gui.workers.history_service`` opens an
``engine.history.HistoryStore``, recovers pending replies, lists the chats and opens the newest),
then every chat and a search. No command of the ``glassbox`` CLI reads the history (``chat`` keeps
its turns in memory); the window's start path with an unreadable file is covered by
``tests/app/gui/test_full_disk.py::test_an_unreadable_history_keeps_the_message_and_offers_a_new_history_beside_it``.

Bound: one history of about 50 pages (12 chats of 8 messages), 10 truncations and 2 x 32 pages with
flipped bytes or bits; each case copies well under a MB and reads it once (the whole file runs in about a
second).
"""

from __future__ import annotations

import random
import stat
from pathlib import Path

import pytest

from app.gui.workers.history_disk import is_unreadable
from engine.errors import HistoryError
from engine.history import HistoryStore

PAGE = 4096
SECRET = "pelican-7781"  # in every message: an error must never quote the chats


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("history") / "history.sqlite3"
    with HistoryStore(path) as store:
        for c in range(12):
            conv = store.create_conversation(f"chat {c}")
            parent = None
            for m in range(8):
                text = f"message {c}.{m} {SECRET}\nsecond line\n" + "the quick brown fox jumps " * 40
                parent = store.add_message(conv.id, "user" if m % 2 == 0 else "assistant", text, parent_id=parent).id
        assert store.integrity_check() == "ok"
    data = path.read_bytes()
    assert len(data) // PAGE >= 40, len(data)
    return data


def _read_like_the_app(path: Path) -> int:
    """Opens the history as the app does at start, then reads every chat; returns the messages read."""
    with HistoryStore(path) as store:
        store.recover_pending()
        chats = store.list_conversations()
        read = sum(len(store.thread(chat.id)) for chat in chats)
        store.search("fox")
        return read


def _damaged(tmp_path: Path, name: str, content: bytes) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    path = folder / "history.sqlite3"
    path.write_bytes(content)
    path.chmod(stat.S_IRUSR | stat.S_IWUSR)  # as the app makes it: no permission change to log
    return path


def _outcome(path: Path, content: bytes) -> HistoryError | None:
    """Reads the damaged file; returns the error (checked to be one clear line), None if it read."""
    error: HistoryError | None = None
    try:
        _read_like_the_app(path)
    except HistoryError as exc:
        error = exc
    assert path.read_bytes() == content, "the damaged file was changed"
    assert sorted(p.name for p in path.parent.iterdir()) == ["history.sqlite3"]  # no -wal/-shm left
    if error is not None:
        line = str(error)
        assert line.startswith(f"{path}: ")
        assert "\n" not in line and len(line) < len(str(path)) + 200, line
        assert SECRET not in line and "quick brown" not in line, line
    return error


CUTS = [10, 50, 99, 100, 1000, PAGE, PAGE + 100, "third", "half", "last page"]


@pytest.mark.parametrize("cut", CUTS, ids=str)
def test_a_truncated_history_is_one_clear_line_and_left_as_it_is(
    tmp_path: Path, history: bytes, cut: int | str
) -> None:
    size = len(history)
    offset = {"third": size // 3, "half": size // 2, "last page": size - PAGE}.get(str(cut), cut)
    assert isinstance(offset, int)
    content = history[:offset]
    path = _damaged(tmp_path, "cut", content)
    error = _outcome(path, content)
    assert error is not None, f"a history cut at byte {offset} of {size} read without an error"
    assert is_unreadable(error), error.reason  # the window offers to start a new history beside it
    assert "left untouched" in error.reason


@pytest.mark.parametrize("flip", ["bytes", "bits"])
def test_flipped_bytes_in_its_pages_are_one_clear_line_or_read_and_left_as_they_are(
    tmp_path: Path, history: bytes, flip: str
) -> None:
    """32 pages (the first, the second, the last and 29 drawn), each with 32 bytes inverted
    (``bytes``) or 32 single bits flipped (``bits``, bit rot that keeps ASCII text ASCII)."""
    n_pages = len(history) // PAGE
    pages = sorted({0, 1, n_pages - 1, *random.Random(7).sample(range(2, n_pages - 1), 29)})
    errors: dict[int, str] = {}
    for page in pages:
        damaged = bytearray(history)
        rng = random.Random(page)
        first = 100 if page == 0 else 0  # keep the 100-byte file header: that case is the truncations'
        for _ in range(32):
            damaged[page * PAGE + rng.randrange(first, PAGE)] ^= 0xFF if flip == "bytes" else 1 << rng.randrange(8)
        content = bytes(damaged)
        error = _outcome(_damaged(tmp_path, f"page{page}", content), content)
        if error is not None:
            assert is_unreadable(error), error.reason
            errors[page] = error.reason
    assert errors, "no flipped page was noticed: the damage did not reach what the app reads"
