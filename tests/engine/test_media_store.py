"""A chat's images kept by content in the data folder and named by the history: written once,
read back checked, kept across edits and branches, swept when no message refers to them."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from engine.history import HistoryStore
from engine.media import MediaError, MediaRef, read_media
from engine.media_store import MediaStore
from tests.engine import media_fixtures as fx


def test_an_image_is_one_file_per_content_read_back_checked(tmp_path: Path) -> None:
    store = MediaStore(tmp_path / "media")
    cat = read_media(fx.good_image("png", (32, 24)), name="cat.png")
    ref = store.put(cat)
    again = store.put(read_media(cat.data, name="same-cat.png"))  # another name, the same bytes
    path = store.path(ref)
    assert ref.digest == again.digest == cat.digest and path.name == f"{cat.digest}.png"
    assert [p for p in (tmp_path / "media").rglob("*") if p.is_file()] == [path]
    if sys.platform != "win32":
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE((tmp_path / "media").stat().st_mode) == 0o700
    loaded = store.load(ref)
    assert loaded.data == cat.data and loaded.name == "cat.png" and loaded.ref == ref
    # A file changed on disk is never sent as the image that was attached.
    path.write_bytes(fx.good_image("png", (32, 24), mode="RGBA"))
    with pytest.raises(MediaError) as info:
        store.load(ref)
    assert str(info.value) == f"cat.png: its file in the data folder was changed since it was attached ({path})"
    os.unlink(path)
    with pytest.raises(MediaError) as info:
        store.load(ref)
    assert "its file is missing from the data folder" in str(info.value)


def test_the_history_keeps_a_messages_images_across_edits_and_branches(tmp_path: Path) -> None:
    media = MediaStore(tmp_path / "media")
    cat = media.put(read_media(fx.good_image("png"), name="cat.png"))
    dog = media.put(read_media(fx.good_image("jpeg"), name="dog.jpg"))
    history = HistoryStore(tmp_path / "history.sqlite3")
    chat = history.create_conversation("pets")
    asked = history.add_message(chat.id, "user", "Which is which?", media=(cat, dog))
    history.add_message(chat.id, "assistant", "noise")
    # An edit is a sibling that carries the images the user kept; the old branch keeps its own.
    edited = history.add_message(chat.id, "user", "Only the cat?", parent_id=None, media=(cat,))
    assert asked.media == (cat, dog)
    assert [m.media for m in history.thread(chat.id)] == [(cat,)]
    history.select_branch(asked.id)
    assert [m.media for m in history.thread(chat.id)] == [(cat, dog), ()]
    assert history.get_message(edited.id).media == (cat,)
    # A restart reads the same references back.
    history.close()
    reopened = HistoryStore(tmp_path / "history.sqlite3")
    assert reopened.thread(chat.id)[0].media == (cat, dog)
    assert reopened.media_in_use() == {cat.digest, dog.digest}
    # The chat deleted and purged: nothing refers to the images; the sweep takes their files.
    other = reopened.create_conversation("keeps the cat")
    reopened.add_message(other.id, "user", "again", media=(cat,))
    reopened.delete(chat.id)
    assert media.sweep(reopened.media_in_use()) == 0  # a deleted chat can be restored until purged
    reopened.purge_deleted()
    assert media.sweep(reopened.media_in_use()) == 1
    assert media.path(cat).is_file() and not media.path(dog).exists()
    reopened.close()


def test_a_damaged_attachment_record_costs_only_itself(tmp_path: Path) -> None:
    history = HistoryStore(tmp_path / "history.sqlite3")
    chat = history.create_conversation()
    good = MediaRef("image", "png", "a" * 64, "ok.png", 1, 1)
    message = history.add_message(chat.id, "user", "hi", media=(good,))
    history._query(  # an older or broken writer: one record that is not an attachment
        lambda c: c.execute(
            "UPDATE messages SET media = ? WHERE id = ?",
            ('[{"kind": "image", "format": "png", "digest": "' + "a" * 64 + '"}, {"kind": "exe"}]', message.id),
        )
    )
    assert [r.digest for r in history.get_message(message.id).media] == ["a" * 64]
    assert history.get_message(message.id).content == "hi"
    history.close()
