"""A reply's text as the transcript shows it: one rich-text label per Markdown block.

:class:`TextBlocks` renders a text (safe Markdown, :mod:`app.gui.markdown_render`) into a layout,
one :class:`BlockLabel` per block (:func:`stream_segments`): while a reply streams only its last
block changes, so only that label is laid out again. A message card has one for its answer and
one per step of a turn made with tools (``app.gui.tool_card.StepGroupWidget``).
"""

from __future__ import annotations

import html
from collections.abc import Callable

from PySide6.QtCore import QEvent
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from app.gui.markdown_render import CodeColors, render_markdown, split_blocks

STREAM_CHUNK = 900
"""While streaming, long paragraphs are cut into labels of about this many characters."""
PLACEHOLDER = "\0placeholder"
STALE = "\0stale"


class BlockLabel(QLabel):
    """A rich-text label that remembers its height for each width.

    QLabel lays its rich text out again every time a layout asks ``heightForWidth``; a transcript
    asks every label on each streamed update. Caching until the text changes makes an update cost
    one layout (the streaming label's) instead of one per label on screen.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._heights: dict[int, int] = {}

    def setText(self, text: str) -> None:
        self._heights.clear()
        super().setText(text)

    def heightForWidth(self, width: int) -> int:
        height = self._heights.get(width)
        if height is None:
            height = super().heightForWidth(width)
            self._heights[width] = height
        return height

    def changeEvent(self, event: QEvent) -> None:
        if event.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange):
            self._heights.clear()
        super().changeEvent(event)


def stream_segments(text: str, final: bool) -> list[str]:
    """The pieces a reply is rendered in: Markdown blocks, and long paragraphs cut at spaces.

    Cut points depend only on the text before them, so pieces that are complete never change
    while more text streams in and are rendered once. Code fences are never cut.
    """
    del final  # the same pieces when finished: nothing is laid out twice
    blocks = split_blocks(text)
    out: list[str] = []
    for block in blocks:
        if len(block) <= STREAM_CHUNK or block.lstrip().startswith(("```", "~~~")):
            out.append(block)
            continue
        start = 0
        while len(block) - start > STREAM_CHUNK:
            cut = block.rfind(" ", start + STREAM_CHUNK // 2, start + STREAM_CHUNK)
            cut = cut if cut > start else start + STREAM_CHUNK
            out.append(block[start:cut])
            start = cut
        out.append(block[start:])
    return out


class TextBlocks:
    """A Markdown text in ``layout``, one label per block; a block already shown is not rendered again.

    Args:
        layout: where the labels go (``first`` is in it already).
        first: the label of the first block (a card's ``body``).
        new_label: makes the label of each further block.
    """

    def __init__(self, layout: QVBoxLayout, first: QLabel, new_label: Callable[[], QLabel]) -> None:
        self.layout = layout
        self.first = first
        self._new_label = new_label
        self.blocks: list[tuple[str, QLabel, tuple[str, ...]]] = []

    def render(self, text: str, colors: CodeColors, final: bool = False) -> None:
        """Shows ``text`` (only the blocks that changed are rendered)."""
        blocks = stream_segments(text, final) or [""]
        for index, block in enumerate(blocks):
            if index < len(self.blocks) and self.blocks[index][0] == block:
                continue  # a finished block: rendered already
            rendered = render_markdown(block, colors)
            if index < len(self.blocks):
                label = self.blocks[index][1]
            elif index == 0:
                label = self.first
            else:
                label = self._new_label()
                self.layout.addWidget(label)
            label.setText(rendered.html)
            entry = (block, label, rendered.code_blocks)
            if index < len(self.blocks):
                self.blocks[index] = entry
            else:
                self.blocks.append(entry)
        for _block, label, _code in self.blocks[len(blocks) :]:
            label.setParent(None)
            label.deleteLater()
        del self.blocks[len(blocks) :]

    def placeholder(self, colors: CodeColors, note: str = "") -> None:
        """An ellipsis while the text has not started, or a note of what the model is doing."""
        self.render("", colors)
        self.first.setText(f'<span style="color:{colors.muted};">{html.escape(note) or "…"}</span>')
        self.blocks[0] = (PLACEHOLDER, self.first, ())

    def mark_stale(self) -> None:
        """Every block is rendered again by the next :meth:`render` (the colours changed)."""
        self.blocks = [(STALE, label, codes) for _block, label, codes in self.blocks]

    @property
    def code_blocks(self) -> tuple[str, ...]:
        """The raw text of every code block, in order."""
        return tuple(code for _b, _l, codes in self.blocks for code in codes)

    def labels(self) -> list[QLabel]:
        """The labels shown (the first one at least)."""
        return [label for _b, label, _c in self.blocks] or [self.first]

    def codes_of(self, label: QLabel) -> tuple[str, ...] | None:
        """The code blocks of one of this text's labels (None: not one of them)."""
        return next((codes for _b, lab, codes in self.blocks if lab is label), None)
