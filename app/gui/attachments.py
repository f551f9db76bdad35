"""The composer's attachments: images (and clips) dropped, pasted or picked, each with its thumbnail
and its cost in tokens for the loaded model, before the message is sent.

A file or pasted picture is read on a background thread (``engine.media``'s header checks, then a
thumbnail made in a limited child: ``engine.media_decode.thumbnail_in_child``), never on the GUI
thread and never by Qt's own decoders (the thumbnail is a PNG Pillow wrote). A refused file says
why in one line and nothing else happens. :class:`AttachmentStrip` shows the chips; the cost
comes from the chat adapter (the projector's own count, ``ChatSession.media_info``) and a chip
says "does not fit" when the images are more than the window has room for.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import shiboken6
from PySide6.QtCore import QBuffer, QIODevice, QMimeData, QSize, Qt, Signal, Slot
from PySide6.QtGui import QImage, QPixmap
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QToolButton, QVBoxLayout, QWidget

from app.gui.display_text import plain_label
from app.gui.tasks import describe_error, run_in_background
from engine.media import AUDIO_SUFFIXES, IMAGE_SUFFIXES, Media, MediaError, load_media, read_media

if TYPE_CHECKING:
    from engine.inference.projector import MediaInfo

__all__ = [
    "THUMBNAIL_SIDE",
    "Attached",
    "AttachmentStrip",
    "MediaRowWidget",
    "cost_texts",
    "file_filter",
    "media_from_mime",
    "remember",
]

THUMBNAIL_SIDE = 72
MAX_ATTACHMENTS = 8


@dataclass(frozen=True)
class Attached:
    """One attachment: the checked media and its thumbnail (PNG bytes; b"" for a clip)."""

    media: Media
    thumbnail: bytes


def file_filter() -> str:
    """The file picker's filter (the format is still read from the content)."""
    images = " ".join(f"*{s}" for s in IMAGE_SUFFIXES)
    clips = " ".join(f"*{s}" for s in AUDIO_SUFFIXES)
    return f"Images ({images});;Audio clips ({clips});;All files (*)"


def read_attachment(source: Path | tuple[str, bytes]) -> Attached:
    """Reads one attachment (a file, or ``(name, bytes)`` pasted) and makes its thumbnail; on a
    background thread. Raises MediaError (one line naming it)."""
    # lazy: start-up (+17 ms)
    from engine.media_decode import thumbnail_in_child

    media = load_media(source) if isinstance(source, Path) else read_media(source[1], name=source[0])
    thumbnail = thumbnail_in_child(media, THUMBNAIL_SIDE * 2) if media.kind == "image" else b""
    return Attached(media, thumbnail)


def media_from_mime(mime: QMimeData) -> list[Path | tuple[str, bytes]]:
    """What a drop or a paste holds: local files, or a picture (written as PNG by Qt from the pixels
    the clipboard already decoded; its bytes are then checked like a file's)."""
    if mime.hasUrls():
        paths = [Path(url.toLocalFile()) for url in mime.urls() if url.isLocalFile()]
        if paths:
            return list(paths)
    if mime.hasImage():
        image = mime.imageData()
        if isinstance(image, QImage) and not image.isNull():
            buffer = QBuffer()
            buffer.open(QIODevice.OpenModeFlag.WriteOnly)
            image.save(buffer, "PNG")  # type: ignore[call-overload]  # PySide6 6.12 takes the format as str
            buffer.close()
            return [("pasted image.png", bytes(buffer.data().data()))]
    return []


class _Chip(QFrame):
    """One attachment: its thumbnail, its cost, a remove button."""

    removed = Signal(str)

    def __init__(self, attached: Attached, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.attached = attached
        self.setObjectName("attachmentChip")
        media = attached.media
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.setSpacing(2)
        top = QHBoxLayout()
        top.setSpacing(2)
        self.thumb = QLabel()
        self.thumb.setFixedSize(QSize(THUMBNAIL_SIDE, THUMBNAIL_SIDE))
        self.thumb.setAlignment(Qt.AlignmentFlag.AlignCenter)
        pixmap = QPixmap()
        if attached.thumbnail and pixmap.loadFromData(attached.thumbnail, "PNG"):
            self.thumb.setPixmap(
                pixmap.scaled(THUMBNAIL_SIDE, THUMBNAIL_SIDE, Qt.AspectRatioMode.KeepAspectRatio,
                              Qt.TransformationMode.SmoothTransformation)
            )  # fmt: skip
        else:
            self.thumb.setText("♪" if media.kind == "audio" else "?")
        top.addWidget(self.thumb)
        close = QToolButton()
        close.setText("×")
        close.setAccessibleName(f"Remove {media.name or 'the attachment'}")
        close.setToolTip("Remove this attachment")
        close.clicked.connect(lambda: self.removed.emit(media.digest))
        top.addWidget(close, 0, Qt.AlignmentFlag.AlignTop)
        layout.addLayout(top)
        self.cost = plain_label("…")
        self.cost.setObjectName("attachmentCost")
        self.cost.setAccessibleName(f"Cost of {media.name or 'the attachment'}")
        layout.addWidget(self.cost)
        self.setToolTip(f"{media.name} — {media.label}")
        self.setAccessibleName(f"Attached {media.kind}: {media.name}, {media.label}")

    def set_cost(self, text: str, tooltip: str = "", problem: bool = False) -> None:
        self.cost.setText(text)
        self.cost.setProperty("problem", problem)
        self.cost.style().unpolish(self.cost)
        self.cost.style().polish(self.cost)
        tip = f"{self.attached.media.name} — {self.attached.media.label}"
        self.setToolTip(f"{tip}\n{tooltip}" if tooltip else tip)


class AttachmentStrip(QWidget):
    """The attachments of the message being written: a row of chips, hidden when empty.

    Signals:
        changed(): an attachment was added or removed.
        failed(str): an attachment was refused (one line: the file and the reason).
    """

    changed = Signal()
    failed = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._chips: dict[str, _Chip] = {}
        self._order: dict[str, int] = {}  # digest -> when its source was added (reads finish in any order)
        self._sequence = 0
        self._pending = 0
        self._row = QHBoxLayout(self)
        self._row.setContentsMargins(0, 0, 0, 0)
        self._row.setSpacing(6)
        self._row.addStretch(1)
        self.setVisible(False)
        self.setAccessibleName("Attachments")

    # ------------------------------------------------------------------ contents
    @property
    def media(self) -> tuple[Media, ...]:
        """The attachments, in the order they were added."""
        return tuple(chip.attached.media for chip in self._chips.values())

    @property
    def reading(self) -> bool:
        """An attachment is still being read (Send waits for it)."""
        return self._pending > 0

    def add_sources(self, sources: Iterable[Path | tuple[str, bytes]]) -> None:
        """Reads each source in the background, then adds it (or says why not)."""
        for source in sources:
            if len(self._chips) + self._pending >= MAX_ATTACHMENTS:
                self.failed.emit(f"at most {MAX_ATTACHMENTS} attachments per message")
                return
            self._pending += 1
            self._sequence += 1
            run_in_background(
                functools.partial(read_attachment, source),
                functools.partial(self._on_read, self._sequence),
                self._on_read_failed,
            )

    def add(self, attached: Attached, order: int | None = None) -> None:
        """Adds an attachment read already (a message being edited keeps its images), at its place
        in the order the sources were added."""
        digest = attached.media.digest
        if digest in self._chips:
            return
        if order is None:
            self._sequence += 1
            order = self._sequence
        chip = _Chip(attached, self)
        chip.removed.connect(self.remove)
        before = sorted(self._order[d] for d in self._chips)
        place = sum(1 for seen in before if seen < order)
        self._order[digest] = order
        self._chips = dict(sorted({**self._chips, digest: chip}.items(), key=lambda item: self._order[item[0]]))
        self._row.insertWidget(place, chip)
        self.setVisible(True)
        self.changed.emit()

    @Slot(str)
    def remove(self, digest: str) -> None:
        chip = self._chips.pop(digest, None)
        self._order.pop(digest, None)
        if chip is None:
            return
        chip.setParent(None)
        chip.deleteLater()
        self.setVisible(bool(self._chips))
        self.changed.emit()

    def clear(self) -> None:
        for digest in list(self._chips):
            self.remove(digest)

    def set_costs(self, costs: dict[str, tuple[str, str, bool]]) -> None:
        """``digest -> (text, tooltip, problem)`` for each chip (what the model makes of it)."""
        for digest, chip in self._chips.items():
            text, tooltip, problem = costs.get(digest, ("…", "", False))
            chip.set_cost(text, tooltip, problem)

    def chip_text(self, digest: str) -> str:
        chip = self._chips.get(digest)
        return chip.cost.text() if chip is not None else ""

    # ------------------------------------------------------------------ background results
    def _on_read(self, order: int, attached: Attached) -> None:
        self._pending -= 1
        remember(attached)
        self.add(attached, order)

    def _on_read_failed(self, exc: BaseException) -> None:
        self._pending -= 1
        self.failed.emit(str(exc) if isinstance(exc, MediaError) else describe_error(exc))
        self.changed.emit()


def cost_texts(
    media: Sequence[Media],
    infos: Mapping[str, MediaInfo],
    problem: str | None,
    room: int | None,
) -> dict[str, tuple[str, str, bool]]:
    """Each chip's cost line: ``"16 tokens"``, ``"does not fit"`` or the model's problem.

    Args:
        media: the attachments, in order.
        infos: digest -> ``engine.inference.projector.MediaInfo`` (the projector's count), for those measured.
        problem: why the model cannot read them (no projector), or None.
        room: the tokens the window has left for them (None: not known yet).
    """
    out: dict[str, tuple[str, str, bool]] = {}
    used = 0
    for item in media:
        if problem is not None:
            out[item.digest] = ("cannot see it", problem, True)
            continue
        info = infos.get(item.digest)
        if info is None:
            out[item.digest] = ("…", "counting its tokens", False)
            continue
        tokens = info.tokens
        used += tokens
        note = info.note
        if room is not None and used > room:
            out[item.digest] = (
                "does not fit",
                f"{tokens} tokens; the window has {max(room, 0)} left for images: remove it or start a new chat",
                True,
            )
        else:
            out[item.digest] = (f"{tokens} tokens", note, False)
    return out


# ---------------------------------------------------------------------------- in the transcript
_thumbnails: dict[str, bytes] = {}  # digest -> PNG thumbnail (made in the thumbnail child)
_tokens: dict[str, int] = {}  # digest -> the projector's count for the model that measured it last


def remember(attached: Attached | None = None, tokens: dict[str, int] | None = None) -> None:
    """Keeps a thumbnail made for the composer, and token counts measured, for the transcript."""
    if attached is not None and attached.thumbnail:
        _thumbnails[attached.media.digest] = attached.thumbnail
    if tokens:
        _tokens.update(tokens)


class MediaRowWidget(QWidget):
    """A sent message's images: thumbnails (made off the GUI thread) and what each is and costs."""

    def __init__(self, media: Sequence[Media], missing: Sequence[str] = (), parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("messageMedia")
        self.setAccessibleName("Attached images")
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(6)
        self._thumbs: dict[str, QLabel] = {}
        self.captions: dict[str, QLabel] = {}
        for item in media:
            cell = QVBoxLayout()
            cell.setSpacing(1)
            thumb = QLabel()
            thumb.setFixedSize(QSize(THUMBNAIL_SIDE, THUMBNAIL_SIDE))
            thumb.setAlignment(Qt.AlignmentFlag.AlignCenter)
            thumb.setToolTip(f"{item.name} — {item.label}")
            thumb.setAccessibleName(f"{item.kind}: {item.name}, {item.label}")
            cell.addWidget(thumb)
            caption = plain_label(self._caption(item))
            caption.setObjectName("attachmentCost")
            cell.addWidget(caption)
            row.addLayout(cell)
            self._thumbs[item.digest] = thumb
            self.captions[item.digest] = caption
            if item.kind != "image":
                thumb.setText("♪")
            elif item.digest in _thumbnails:
                self._show(item.digest, _thumbnails[item.digest])
            else:
                thumb.setText("…")
                run_in_background(
                    functools.partial(_thumbnail, item),
                    functools.partial(self._on_thumbnail, item.digest),
                    functools.partial(self._on_thumbnail_failed, item.digest),
                )
        for line in missing:
            gone = plain_label(f"image missing: {line}")
            gone.setObjectName("attachmentCost")
            gone.setProperty("problem", True)
            row.addWidget(gone)
        row.addStretch(1)

    @staticmethod
    def _caption(item: Media) -> str:
        tokens = _tokens.get(item.digest)
        return f"{tokens} tokens" if tokens is not None else item.label

    def _on_thumbnail_failed(self, digest: str, _exc: BaseException) -> None:
        if shiboken6.isValid(self):  # the message may have been redrawn meanwhile
            self._show(digest, b"")

    def _on_thumbnail(self, digest: str, png: bytes) -> None:
        if png:
            _thumbnails[digest] = png
        if shiboken6.isValid(self):
            self._show(digest, png)

    def _show(self, digest: str, png: bytes) -> None:
        thumb = self._thumbs.get(digest)
        if thumb is None:
            return
        pixmap = QPixmap()
        if png and pixmap.loadFromData(png, "PNG"):
            thumb.setPixmap(
                pixmap.scaled(THUMBNAIL_SIDE, THUMBNAIL_SIDE, Qt.AspectRatioMode.KeepAspectRatio,
                              Qt.TransformationMode.SmoothTransformation)
            )  # fmt: skip
        else:
            thumb.setText("?")

    def refresh_captions(self, media: Sequence[Media]) -> None:
        for item in media:
            caption = self.captions.get(item.digest)
            if caption is not None:
                caption.setText(self._caption(item))


def _thumbnail(media: Media) -> bytes:
    # lazy: start-up (+15 ms)
    from engine.media_decode import thumbnail_in_child

    return thumbnail_in_child(media, THUMBNAIL_SIDE * 2)
