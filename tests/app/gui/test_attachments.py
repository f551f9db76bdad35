"""Images in the window: dropped, pasted or picked into the composer (thumbnails made off the GUI
thread, a bad file refused in one line), each one's cost on its chip, "does not fit" and "cannot
see images" before the send, the context map's own band, and the whole turn on the tiny vision
model built in the test (tests/engine/tiny_vision.py): sent, shown with its thumbnail in the
transcript, kept in the history, its encoding a phase of the timeline."""

from __future__ import annotations

import io
import shutil
from pathlib import Path
from typing import Any

import pytest
from gui_support import make_window
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent, QImage

from app.gui.attachments import cost_texts
from app.gui.composer import Composer, is_media_drop
from app.gui.inspector_widgets import ContextBar
from app.gui.message_card import MessageCard
from app.gui.workers.chat_state import ChatState, ModelState
from app.paths import Paths
from app.settings import SamplingPreset, Settings
from engine.history import HistoryStore
from engine.inference.projector import MediaInfo
from engine.media import read_media
from tests.engine.tiny_vision import IMAGE_TOKENS

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]


def _png(size: tuple[int, int] = (120, 80), colour: tuple[int, int, int] = (220, 40, 60)) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, "PNG")
    return out.getvalue()


def _drop(widget: Any, mime: QMimeData) -> None:
    event = QDropEvent(
        QPointF(5, 5), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier
    )
    widget.dropEvent(event)


def test_drop_paste_and_a_bad_file_in_the_composer(qtbot: Any, tmp_path: Path) -> None:
    composer = Composer()
    qtbot.addWidget(composer)
    composer.set_ready(True)
    failures: list[str] = []
    composer.attachment_failed.connect(failures.append)
    image = tmp_path / "red.png"
    image.write_bytes(_png())
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(image))])
    assert is_media_drop(mime)
    _drop(composer, mime)
    qtbot.waitUntil(lambda: len(composer.attachments.media) == 1, timeout=30_000)
    chip = next(iter(composer.attachments._chips.values()))
    assert chip.thumb.pixmap() is not None and not chip.thumb.pixmap().isNull()  # the child's PNG, shown
    assert composer.attachments.media[0].name == "red.png"
    # A picture pasted from the clipboard is attached, not typed.
    pasted = QMimeData()
    picture = QImage(40, 30, QImage.Format.Format_RGB32)
    picture.fill(Qt.GlobalColor.blue)
    pasted.setImageData(picture)
    composer.edit.insertFromMimeData(pasted)
    qtbot.waitUntil(lambda: len(composer.attachments.media) == 2, timeout=30_000)
    assert composer.attachments.media[1].name == "pasted image.png"
    assert composer.edit.toPlainText() == ""
    # A file that is not an image: one line, nothing attached.
    page = tmp_path / "cat.png"
    page.write_bytes(b"<!DOCTYPE html><html><body>404</body></html>")
    bad = QMimeData()
    bad.setUrls([QUrl.fromLocalFile(str(page))])
    _drop(composer, bad)
    qtbot.waitUntil(lambda: bool(failures), timeout=30_000)
    assert failures == [f"{page}: this is an HTML page, not an image (a saved web page?)"]
    assert len(composer.attachments.media) == 2
    # A document dropped on the window still goes to the documents, not the composer.
    doc = QMimeData()
    doc.setUrls([QUrl.fromLocalFile(str(tmp_path / "notes.pdf"))])
    assert not is_media_drop(doc)
    # Removing a chip takes the image off the message; the send goes with what is left.
    composer.attachments.remove(composer.attachments.media[0].digest)
    assert [m.name for m in composer.attachments.media] == ["pasted image.png"]


def test_attachments_keep_the_order_they_were_added_in(qtbot: Any, tmp_path: Path) -> None:
    composer = Composer()
    qtbot.addWidget(composer)
    big, small = tmp_path / "big.png", tmp_path / "small.png"
    big.write_bytes(_png((3000, 2000)))  # read and thumbnailed last, added first
    small.write_bytes(_png((8, 8), (0, 0, 255)))
    composer.attachments.add_sources([big, small])
    assert composer.attachments.reading and not composer.send_button.isEnabled()
    qtbot.waitUntil(lambda: len(composer.attachments.media) == 2, timeout=60_000)
    assert [m.name for m in composer.attachments.media] == ["big.png", "small.png"]
    layout = composer.attachments._row
    shown = [layout.itemAt(i).widget() for i in range(layout.count() - 1)]
    assert [chip.attached.media.name for chip in shown] == ["big.png", "small.png"]


def test_the_cost_label_says_tokens_does_not_fit_or_cannot_see(qtbot: Any) -> None:
    first = read_media(_png((40, 30)), name="a.png")
    second = read_media(_png((40, 30), (1, 2, 3)), name="b.png")
    infos: dict[str, object] = {
        first.digest: MediaInfo(first.digest, 256, 258, 1, 40, 30),
        second.digest: MediaInfo(second.digest, 256, 258, 1, 40, 30, "scaled down from 4000×3000 to 896×672"),
    }
    costs = cost_texts([first, second], infos, None, room=1000)
    assert costs[first.digest] == ("256 tokens", "", False)
    assert costs[second.digest] == ("256 tokens", "scaled down from 4000×3000 to 896×672", False)
    tight = cost_texts([first, second], infos, None, room=300)
    assert tight[first.digest][0] == "256 tokens" and tight[second.digest][0] == "does not fit"
    assert tight[second.digest][2] is True
    blind = cost_texts([first], {}, "this model cannot see images: m.gguf was loaded without a projector", room=None)
    assert blind[first.digest] == (
        "cannot see it",
        "this model cannot see images: m.gguf was loaded without a projector",
        True,
    )
    # The composer keeps Send off and says why.
    composer = Composer()
    qtbot.addWidget(composer)
    composer.set_ready(True)
    composer.edit.setPlainText("what is it?")
    assert composer.send_button.isEnabled()
    composer.set_attachment_block("This image does not fit the context window: remove it or start a new chat.")
    assert not composer.send_button.isEnabled()
    assert composer.state_label.text().startswith("This image does not fit")
    composer.set_attachment_block("")
    assert composer.send_button.isEnabled()


def test_the_context_map_gives_images_their_own_band(qtbot: Any) -> None:
    bar = ContextBar()
    qtbot.addWidget(bar)
    bar.resize(400, 22)
    budget = {"system": 10, "history": 40, "media": 256, "current": 30, "reserve": 64, "free": 624}
    bar.set_budget(budget)
    spans = {key: width for key, _x, width in bar._spans()}
    assert set(spans) == set(budget)
    assert spans["media"] == pytest.approx(400 * 256 / 1024)
    assert bar.colors.segment("media") not in {bar.colors.segment(k) for k in budget if k != "media"}
    assert "Images: 256 tokens" in bar.accessibleDescription()


# ----------------------------------------------------------------------------- the whole turn
def _settings(folder: Path) -> Settings:
    return Settings(
        theme="light",
        models_dir=folder,
        n_ctx=512,
        reply_reserve=32,
        presets=[SamplingPreset(name="Test", temperature=0.0, top_k=1, top_p=1.0, min_p=0.0, max_tokens=6)],
        default_preset="Test",
    )


def _window(qtbot: Any, paths: Paths, model: Path) -> Any:
    w = make_window(paths, None, _settings(model.parent), probe_bandwidth=False)
    qtbot.addWidget(w)
    w.show()
    w.start()
    if w.chat.model_state is not ModelState.LOADED:
        w.model_control.load_model(model)
    qtbot.waitUntil(lambda: w.chat.model_state in (ModelState.LOADED, ModelState.FAILED), timeout=120_000)
    assert w.chat.model_state is ModelState.LOADED, w.composer.state_label.text()
    return w


@pytest.mark.model
def test_an_image_is_counted_sent_shown_and_kept(
    qtbot: Any, paths: Paths, tiny_vision_model: tuple[Path, Path], tmp_path: Path
) -> None:
    folder = tmp_path / "models" / "owner" / "tiny-vision"
    folder.mkdir(parents=True)
    for path in tiny_vision_model:
        shutil.copy(path, folder / path.name)
    w = _window(qtbot, paths, folder / tiny_vision_model[0].name)
    try:
        image = tmp_path / "red.png"
        image.write_bytes(_png((200, 120)))
        w.composer.attachments.add_sources([image])
        digest = read_media(image.read_bytes()).digest
        qtbot.waitUntil(lambda: w.composer.attachments.chip_text(digest) == f"{IMAGE_TOKENS} tokens", timeout=60_000)
        w.composer.edit.setPlainText("What is in this image?")
        qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
        qtbot.waitUntil(lambda: w.chat.busy, timeout=10_000)
        qtbot.waitUntil(lambda: not w.chat.busy and w.chat.state is ChatState.IDLE, timeout=120_000)
        qtbot.waitUntil(lambda: w.chat.thread_messages[-1].state != "pending", timeout=10_000)
        assert w.composer.attachments.media == ()  # it went with the message
        user = w.chat.thread_messages[-2]
        assert [m.digest for m in user.media] == [digest]
        reply = w.chat.thread_messages[-1]
        assert reply.stats is not None and reply.stats["media_tokens"] == IMAGE_TOKENS
        assert reply.stats["budget"]["media"] == IMAGE_TOKENS and reply.stats["encode_ms"] > 0
        # The transcript shows it, with its cost; the inspector shows the encode phase.
        card = next(c for c in w.chat_view.findChildren(MessageCard) if c.message.id == user.id)
        assert card.media_row is not None and card.media_row.captions[digest].text() == f"{IMAGE_TOKENS} tokens"
        qtbot.waitUntil(lambda: "encode" in w.inspector.media_label.text(), timeout=10_000)
        assert not w.inspector.media_label.isHidden()
        # Kept by content in the data folder and named by the history row.
        stored = list(paths.media.rglob(f"{digest}.png"))
        assert len(stored) == 1 and stored[0].read_bytes() == image.read_bytes()
        with HistoryStore(paths.history_db) as history:
            assert history.get_message(user.id).media[0].digest == digest
    finally:
        w.shutdown()


def _wait_reply(qtbot: Any, w: Any) -> None:
    qtbot.waitUntil(lambda: w.chat.busy, timeout=10_000)
    qtbot.waitUntil(lambda: not w.chat.busy and w.chat.state is ChatState.IDLE, timeout=120_000)
    qtbot.waitUntil(lambda: w.chat.thread_messages[-1].state != "pending", timeout=10_000)


@pytest.mark.model
def test_regenerate_edit_and_a_branch_keep_the_image(
    qtbot: Any, paths: Paths, tiny_vision_model: tuple[Path, Path], tmp_path: Path
) -> None:
    folder = tmp_path / "models" / "owner" / "tiny-vision"
    folder.mkdir(parents=True)
    for path in tiny_vision_model:
        shutil.copy(path, folder / path.name)
    w = _window(qtbot, paths, folder / tiny_vision_model[0].name)
    try:
        image = tmp_path / "red.png"
        image.write_bytes(_png((96, 64)))
        digest = read_media(image.read_bytes()).digest
        w.composer.attachments.add_sources([image])
        qtbot.waitUntil(lambda: w.composer.attachments.chip_text(digest) == f"{IMAGE_TOKENS} tokens", timeout=60_000)
        w.composer.edit.setPlainText("What is in this image?")
        qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
        _wait_reply(qtbot, w)
        user, first = w.chat.thread_messages[-2], w.chat.thread_messages[-1]
        # Regenerate: the new reply reads the same image again (the model saw it, by its count).
        w.turns.regenerate_last()
        _wait_reply(qtbot, w)
        again = w.chat.thread_messages[-1]
        assert again.id != first.id and w.chat.thread_messages[-2].id == user.id
        assert again.stats is not None and again.stats["media_tokens"] == IMAGE_TOKENS
        assert [m.digest for m in w.chat.thread_messages[-2].media] == [digest]
        # Edit: the image comes back to the composer and goes with the edited message, a new branch.
        w.chat_view.edit_requested.emit(user.id, user.content)
        qtbot.waitUntil(lambda: [m.digest for m in w.composer.attachments.media] == [digest], timeout=10_000)
        w.composer.edit.setPlainText("And now?")
        qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
        _wait_reply(qtbot, w)
        edited, reply = w.chat.thread_messages[-2], w.chat.thread_messages[-1]
        assert edited.id != user.id and edited.content == "And now?"
        assert [m.digest for m in edited.media] == [digest]
        assert reply.stats is not None and reply.stats["media_tokens"] == IMAGE_TOKENS
        # Back on the first branch: its message still shows the image, read back from the history.
        with HistoryStore(paths.history_db) as history:
            assert [m.id for m in history.siblings(user.id)] == [user.id, edited.id]
        w.chat_view.branch_requested.emit(first.id)
        qtbot.waitUntil(lambda: any(m.id == user.id for m in w.chat.thread_messages), timeout=10_000)
        back = next(m for m in w.chat.thread_messages if m.id == user.id)
        assert [m.digest for m in back.media] == [digest] and back.media[0].data == image.read_bytes()
        card = next(c for c in w.chat_view.findChildren(MessageCard) if c.message.id == user.id)
        assert card.media_row is not None and digest in card.media_row.captions
        assert len(list(paths.media.rglob(f"{digest}.png"))) == 1  # one file for every message naming it
    finally:
        w.shutdown()


@pytest.mark.model
def test_a_chats_image_survives_a_restart_and_its_kv_cache_holds_it(
    qtbot: Any, paths: Paths, tiny_vision_model: tuple[Path, Path], tmp_path: Path
) -> None:
    folder = tmp_path / "models" / "owner" / "tiny-vision"
    folder.mkdir(parents=True)
    for path in tiny_vision_model:
        shutil.copy(path, folder / path.name)
    image = tmp_path / "red.png"
    image.write_bytes(_png((90, 60)))
    digest = read_media(image.read_bytes()).digest
    w = _window(qtbot, paths, folder / tiny_vision_model[0].name)
    try:
        w.composer.attachments.add_sources([image])
        qtbot.waitUntil(lambda: w.composer.attachments.chip_text(digest) == f"{IMAGE_TOKENS} tokens", timeout=60_000)
        w.composer.edit.setPlainText("What is in this image?")
        qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
        _wait_reply(qtbot, w)
        user_id = w.chat.thread_messages[-2].id
    finally:
        w.shutdown()
    # A new session: the chat opens with its image read back from the data folder, shown, and
    # the next turn's prompt holds it again from the saved KV cache (nothing encoded again).
    w = _window(qtbot, paths, folder / tiny_vision_model[0].name)
    try:
        qtbot.waitUntil(lambda: any(m.id == user_id for m in w.chat.thread_messages), timeout=10_000)
        user = next(m for m in w.chat.thread_messages if m.id == user_id)
        assert [m.digest for m in user.media] == [digest] and user.media[0].data == image.read_bytes()
        card = next(c for c in w.chat_view.findChildren(MessageCard) if c.message.id == user_id)
        assert card.media_row is not None and digest in card.media_row.captions
        w.composer.edit.setPlainText("And the colour?")
        qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
        _wait_reply(qtbot, w)
        follow = w.chat.thread_messages[-1].stats
        assert follow is not None and follow["media_tokens"] == IMAGE_TOKENS
        assert follow["kv_restored_tokens"] > 0 and follow["media_encoded"] == 0
    finally:
        w.shutdown()


@pytest.mark.model
def test_a_model_without_a_projector_says_it_cannot_see_images(
    qtbot: Any, paths: Paths, tiny_vision_model: tuple[Path, Path], tmp_path: Path
) -> None:
    folder = tmp_path / "blind"
    folder.mkdir()
    model = folder / tiny_vision_model[0].name
    shutil.copy(tiny_vision_model[0], model)
    w = _window(qtbot, paths, model)
    try:
        image = tmp_path / "red.png"
        image.write_bytes(_png())
        w.composer.attachments.add_sources([image])
        w.composer.edit.setPlainText("What is this?")
        digest = read_media(image.read_bytes()).digest
        qtbot.waitUntil(lambda: w.composer.attachments.chip_text(digest) == "cannot see it", timeout=60_000)
        assert not w.composer.send_button.isEnabled()
        assert w.composer.state_label.text() == (
            "This model cannot see images: it has no projector (mmproj). Choose one in Models → Projector"
        )
        w.resize(1024, 700)  # the whole line, remedy included, at the smallest size the window is built for
        qtbot.waitUntil(lambda: w.composer.state_label.shown_text() == w.composer.state_label.text(), timeout=5000)
    finally:
        w.shutdown()


@pytest.mark.model
def test_a_projector_chosen_by_hand_on_the_models_page_is_the_one_loaded(
    qtbot: Any, paths: Paths, tiny_vision_model: tuple[Path, Path], tmp_path: Path
) -> None:
    from engine.fit import projector_bytes
    from engine.gguf import read_gguf_info
    from engine.units import format_bytes

    folder, elsewhere = tmp_path / "models" / "alone", tmp_path / "projectors"
    folder.mkdir(parents=True)
    elsewhere.mkdir()
    model = Path(shutil.copy(tiny_vision_model[0], folder / tiny_vision_model[0].name))
    projector = Path(shutil.copy(tiny_vision_model[1], elsewhere / "vision-encoder.gguf"))  # not beside it
    w = _window(qtbot, paths, model)
    try:
        panel, adapter = w.models_page, w.models_adapter.library
        w.show_page(1)
        qtbot.waitUntil(lambda: panel.select_model(model), timeout=10_000)

        def arch() -> str:
            panel.select_model(model)
            row = panel.library.selectionModel().selectedRows()[0].row()
            return str(panel.library.item(row, 1).text())

        assert arch() == "gemma3" and adapter.projector_of(model) is None
        # Not a projector: one line, nothing changed.
        picked: list[Path] = [model]
        panel.pick_projector_file = lambda _start: picked.pop()
        panel.choose_projector_action.trigger()
        qtbot.waitUntil(lambda: panel.library_status.text().startswith("Projector: "), timeout=10_000)
        assert "not a vision projector" in panel.library_status.text() and arch() == "gemma3"
        # The projector, from another folder: the row says it sees images, and a load takes it.
        picked.append(projector)
        panel.choose_projector_action.trigger()
        qtbot.waitUntil(lambda: arch() == "gemma3, sees images", timeout=10_000)
        assert adapter.projector_of(model) == projector
        row = panel.library.selectionModel().selectedRows()[0].row()  # its fit counts it, from outside the library
        size = projector_bytes(read_gguf_info(projector))
        assert f"+ projector {format_bytes(size)}" in panel.library.item(row, 6).toolTip()
        assert w.model_control.load_request_for(model).mmproj_path == projector
        w.model_control.load_model(model)
        qtbot.waitUntil(lambda: w.chat.model_state is ModelState.LOADED, timeout=120_000)
        w.show_page(0)
        image = tmp_path / "red.png"
        image.write_bytes(_png())
        w.composer.attachments.add_sources([image])
        digest = read_media(image.read_bytes()).digest
        qtbot.waitUntil(lambda: w.composer.attachments.chip_text(digest) == f"{IMAGE_TOKENS} tokens", timeout=60_000)
        # Back to the one found beside it: none, so the model is text only again.
        w.show_page(1)
        assert panel.select_model(model)
        panel.found_projector_action.trigger()
        qtbot.waitUntil(lambda: arch() == "gemma3", timeout=10_000)
        assert w.model_control.load_request_for(model).mmproj_path is None
    finally:
        w.shutdown()


def test_deleting_a_chat_deletes_the_images_only_it_used(paths: Paths) -> None:
    from app.gui.conversation_controller import purge_deleted_chats
    from engine.media_store import MediaStore

    media = MediaStore(paths.media)
    own = media.put(read_media(_png((20, 20)), name="own.png"))
    shared = media.put(read_media(_png((20, 20), (9, 9, 9)), name="shared.png"))
    with HistoryStore(paths.history_db) as history:
        doomed = history.create_conversation("doomed")
        history.add_message(doomed.id, "user", "a", media=(own, shared))
        kept = history.create_conversation("kept")
        history.add_message(kept.id, "user", "b", media=(shared,))
        history.delete(doomed.id)
        assert purge_deleted_chats(history) == 1  # at the next start: the Undo was this session's
        assert [c.title for c in history.list_conversations(include_deleted=True)] == ["kept"]
    assert not media.path(own).exists() and media.path(shared).is_file()
