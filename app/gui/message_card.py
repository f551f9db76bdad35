"""A message of the transcript: its card (role, body, actions, stats, sources) and what the card
shows: the stats line and tooltip, the source labels, search highlighting.

Each message is a card with a rich-text body (safe Markdown, :mod:`app.gui.markdown_render`, one label
per block: :mod:`app.gui.reply_blocks`), an action row (copy, edit, regenerate, ‹ 1/2 › between
branches) and, for replies, a stats line and its sources. A reply made with tools reads in the order
the loop ran it: each step's text, then its calls' cards, then the answer
(``app.gui.tool_card.turn_layout``), live and when opened again. :mod:`app.gui.chat_view` imports this
module with its first card: the window's first frame shows an empty transcript.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from PySide6.QtCore import Qt, QUrl, Signal, Slot
from PySide6.QtGui import QDesktopServices, QGuiApplication
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.gui.attachments import MediaRowWidget
from app.gui.display_text import plain_label, plain_tooltip, rich, shown
from app.gui.markdown_render import COPY_SCHEME, SAFE_LINK_SCHEMES, CodeColors, plain_html
from app.gui.reply_blocks import BlockLabel, TextBlocks
from app.gui.reply_links import confirm_link
from app.gui.tool_card import AgentPartsWidget, StepTextWidget, turn_layout
from app.gui.window_layout import make_wrapping, set_wrapped_text
from app.gui.workers.history_reads import DisplayMessage

SOURCE_SCHEME = "gb-source"


def plural(n: int, word: str) -> str:
    """``1 token``, ``2 tokens``, ``3,812 tokens``."""
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def _count(value: object) -> int:
    """A count kept in a reply's stats: 0 when missing or empty."""
    return int(value) if isinstance(value, (int, float, str)) and value else 0


def format_stats_line(stats: Mapping[str, object] | None) -> str:
    """A one-line summary of a reply's stats (tokens, TTFT, speeds)."""
    if not stats:
        return ""
    parts = [plural(_count(stats.get("completion_tokens")), "token")]
    if stats.get("ttft_ms"):
        parts.append(f"TTFT {stats['ttft_ms']:.0f} ms")
    if stats.get("decode_tps"):
        parts.append(f"{stats['decode_tps']:.1f} tok/s")
    if stats.get("cached_tokens"):
        parts.append(f"{_count(stats['cached_tokens']):,} reused from cache")
    reason = stats.get("finish_reason")
    if reason and reason != "stop":
        parts.append({"length": "hit max tokens", "cancelled": "stopped"}.get(str(reason), str(reason)))
    return " · ".join(parts)


def format_stats_tooltip(stats: Mapping[str, object] | None, model: str | None) -> str:
    """The full per-message stats shown on hover."""
    if not stats:
        return plain_tooltip(model) if model else ""
    rows = [
        ("Model", rich(model or "?")),
        ("Prompt tokens", f"{stats.get('prompt_tokens', 0)} ({stats.get('cached_tokens', 0)} reused)"),
        ("Reply tokens", str(stats.get("completion_tokens", 0))),
        ("Time to first token", f"{stats.get('ttft_ms', 0):.0f} ms"),
        ("Prefill", f"{stats.get('prefill_tps', 0):.1f} tok/s"),
        ("Decode", f"{stats.get('decode_tps', 0):.1f} tok/s"),
        ("Context used", f"{stats.get('context_used', 0)} / {stats.get('n_ctx', 0)}"),
        ("Evicted messages", str(stats.get("evicted_messages", 0))),
    ]
    dropped = stats.get("documents_dropped")
    if isinstance(dropped, int) and dropped > 0:  # passages found that did not fit the window
        rows.append(("Passages left out", str(dropped)))
    return "<table>" + "".join(f"<tr><td>{k}&nbsp;&nbsp;</td><td><b>{v}</b></td></tr>" for k, v in rows) + "</table>"


def source_label(source: Mapping[str, object], number: int) -> str:
    """``[1] report.pdf, p. 3 — “snippet…”`` for a source dict (path, page, snippet, score)."""
    path = str(source.get("path") or source.get("file") or "?")
    name = Path(path).name
    page = source.get("page")
    where = f", p. {rich(page)}" if page not in (None, "", 0) else ""
    snippet = " ".join(str(source.get("snippet") or source.get("text") or "").split())
    if len(snippet) > 110:
        snippet = snippet[:110] + "…"
    return f'[{number}] <a href="{SOURCE_SCHEME}:{number - 1}">{rich(name)}{where}</a>' + (
        f" — “{html.escape(snippet)}”" if snippet else ""
    )


HIGHLIGHT_STYLE = "background-color:#fde68a; color:#111318;"
_TAG = re.compile(r"(<[^>]*>)")


def highlight_html(markup: str, terms: Sequence[str]) -> str:
    """``markup`` with each of ``terms`` (case-insensitive, in text only, never inside a tag) marked."""
    words = sorted({html.escape(t) for t in terms if t.strip()}, key=len, reverse=True)
    if not words:
        return markup
    pattern = re.compile("(" + "|".join(re.escape(w) for w in words) + ")", re.IGNORECASE)
    parts = _TAG.split(markup)
    for i in range(0, len(parts), 2):  # even indexes are text between tags
        parts[i] = pattern.sub(lambda m: f'<span style="{HIGHLIGHT_STYLE}">{m.group(0)}</span>', parts[i])
    return "".join(parts)


def search_terms(query: str) -> list[str]:
    """The words of a search, as the history's full-text search matches them (quotes dropped)."""
    return [w for w in re.split(r"[^\w]+", query) if w]


class MarkdownStepText(StepTextWidget):
    """The text of one step of a tool turn in a reply card: Markdown, as the answer is (its links
    and code copies are the card's)."""

    def __init__(self, card: MessageCard) -> None:
        super().__init__(card.new_block_label())
        self._card = card
        self.blocks = TextBlocks(self.box, self.label, card.new_block_label)

    def set_text(self, text: str) -> None:
        self.text = text
        self.blocks.render(text, self._card.colors, final=True)

    def restyle(self) -> None:
        """Renders the text again (the theme's colours changed)."""
        self.blocks.mark_stale()
        self.blocks.render(self.text, self._card.colors, final=True)

    @property
    def code_blocks(self) -> tuple[str, ...]:
        return self.blocks.code_blocks

    def labels(self) -> list[QLabel]:
        return self.blocks.labels()


class MessageCard(QFrame):
    """One message: role, body, actions, stats and sources.

    Signals:
        action_triggered(str, int): ("copy" | "edit" | "regenerate" | "prev" | "next"), message id.
        source_activated(object): the source dict the user clicked.
    """

    action_triggered = Signal(str, int)
    source_activated = Signal(object)

    def __init__(self, message: DisplayMessage, colors: CodeColors, assistant_name: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("messageCard")
        self.message = message
        self._colors = colors
        self._code_blocks: tuple[str, ...] = ()
        self._text = message.content
        self._streaming_state = False
        self._agent_stats: Mapping[str, object] | None = None  # the turn's steps (stored, or live)
        self.stream_note = ""  # what the model does while no answer text shows (writing a tool call)
        self._text_width = 0  # a user message's widest line
        self._room = 560  # the widest a user message's text may be in the transcript now
        is_user = message.role == "user"

        inner = self._build_bubble(is_user, message.model or assistant_name or "Assistant")
        self.media_row: MediaRowWidget | None = None
        if is_user and (message.media or message.media_missing):
            self.media_row = MediaRowWidget(message.media, message.media_missing)
            inner.addWidget(self.media_row)
        self._build_body(inner)
        self._build_sources(inner)
        self._build_actions(inner, is_user)
        self._actions = [b for b in (self.copy_button, self.edit_button, self.regen_button) if b is not None]
        self.update_message(message)

    # ------------------------------------------------------------------ layout
    def _build_bubble(self, is_user: bool, assistant: str) -> QVBoxLayout:
        """The bubble (right-aligned for the user) with its role line; returns the bubble's layout."""
        outer = QHBoxLayout(self)
        outer.setContentsMargins(16, 6, 16, 6)
        bubble = QFrame()
        bubble.setObjectName("userBubble" if is_user else "assistantBubble")
        inner = QVBoxLayout(bubble)
        inner.setContentsMargins(14, 10, 14, 8)
        inner.setSpacing(4)
        if is_user:
            outer.addStretch(1)
            bubble.setMaximumWidth(640)
        outer.addWidget(bubble, 0 if is_user else 1)

        # The model's name is a file name someone else chose: plain text, never markup.
        role = plain_label("You" if is_user else shown(assistant))
        role.setObjectName("roleLabel")
        inner.addWidget(role)
        return inner

    def _build_body(self, inner: QVBoxLayout) -> None:
        """The body, one label per Markdown block, after the reply's steps and before its folded thinking."""
        # The body is one label per Markdown block (see markdown_render.split_blocks): while a
        # reply streams only the last block is re-rendered.
        self.body = self.new_block_label()
        self._body_layout = QVBoxLayout()
        self._body_layout.setContentsMargins(0, 0, 0, 0)
        self._body_layout.setSpacing(6)
        self._body_layout.addWidget(self.body)
        self._answer = TextBlocks(self._body_layout, self.body, self.new_block_label)
        # A turn with tools reads in the order it ran: each step's text and its calls' cards, then
        # the answer; the thinking is folded above the answer it came before (app/gui/tool_card.py).
        self.agent_parts = AgentPartsWidget(new_text=lambda: MarkdownStepText(self))
        inner.addWidget(self.agent_parts)
        inner.addWidget(self.agent_parts.fold)
        inner.addLayout(self._body_layout)

    def _build_sources(self, inner: QVBoxLayout) -> None:
        """The reply's cited sources, as links."""
        self.sources_box = QLabel()
        self.sources_box.setObjectName("sourceLink")
        self.sources_box.setWordWrap(True)
        self.sources_box.setTextFormat(Qt.TextFormat.RichText)
        self.sources_box.linkActivated.connect(self._on_sources_link_activated)
        self.sources_box.setVisible(False)
        inner.addWidget(self.sources_box)

    def _build_actions(self, inner: QVBoxLayout, is_user: bool) -> None:
        """‹ 1/2 ›, Copy, Edit (the user's) or Regenerate (a reply's), and the stats line under them."""
        actions = QHBoxLayout()
        actions.setSpacing(2)
        # The stats (or the error) wrap on a line of their own: a long one never widens the card
        # past the transcript (it hid the Edit button).
        self.stats_label = plain_label()
        self.stats_label.setObjectName("statsLine")
        make_wrapping(self.stats_label)
        self.stats_label.setAccessibleName("Reply details")
        self.prev_button = self._tool("‹", "Previous branch", "prev")
        self.branch_label = plain_label()
        self.branch_label.setObjectName("statsLine")
        self.next_button = self._tool("›", "Next branch", "next")
        actions.addWidget(self.prev_button)
        actions.addWidget(self.branch_label)
        actions.addWidget(self.next_button)
        self.copy_button = self._tool("Copy", "Copy this message", "copy")
        actions.addWidget(self.copy_button)
        if is_user:
            self.edit_button: QToolButton | None = self._tool("Edit", "Edit and resend as a new branch", "edit")
            actions.addWidget(self.edit_button)
            self.regen_button: QToolButton | None = None
        else:
            self.edit_button = None
            self.regen_button = self._tool("Regenerate", "Generate another reply (keeps this one)", "regenerate")
            actions.addWidget(self.regen_button)
        actions.addStretch(1)
        inner.addLayout(actions)
        inner.addWidget(self.stats_label)

    def _tool(self, text: str, tip: str, action: str) -> QToolButton:
        button = QToolButton()
        button.setText(text)
        button.setToolTip(tip)
        button.setAutoRaise(True)
        button.setObjectName(f"action_{action}")
        button.clicked.connect(lambda: self.action_triggered.emit(action, self.message.id))
        return button

    def update_message(self, message: DisplayMessage) -> None:
        """Shows a (re)loaded stored message."""
        self.message = message
        self._agent_stats = message.stats if message.role == "assistant" else None
        self.set_text(message.content, final=True)
        stats = message.stats
        line = format_stats_line(stats)
        if message.state == "partial" and message.error:
            # The engine crashed mid-reply: not a stop the user asked for.
            line = (line + " · " if line else "") + f"interrupted (partial): {message.error}"
        elif message.state == "partial" and "stopped" not in line:
            line = (line + " · " if line else "") + "stopped (partial)"
        if message.state == "error":
            line = f"error: {message.error or 'generation failed'}"
        if message.state == "pending":
            line = "interrupted (partial)" if message.content else "…"
        set_wrapped_text(self.stats_label, line)
        self.stats_label.setVisible(bool(line))
        self.setToolTip(format_stats_tooltip(stats, message.model) if message.role == "assistant" else "")
        many = message.sibling_count > 1
        for widget in (self.prev_button, self.branch_label, self.next_button):
            widget.setVisible(many)
        if many:
            self.branch_label.setText(f"{message.sibling_index + 1}/{message.sibling_count}")
            self.prev_button.setEnabled(message.sibling_index > 0)
            self.next_button.setEnabled(message.sibling_index < message.sibling_count - 1)
        self.set_sources(message.sources or [])

    @property
    def colors(self) -> CodeColors:
        return self._colors

    def new_block_label(self) -> QLabel:
        """A label for one Markdown block of the reply (links and code copies handled here)."""
        label = BlockLabel()
        label.setObjectName("messageBody")
        label.setWordWrap(True)
        label.setTextFormat(Qt.TextFormat.RichText)
        label.setTextInteractionFlags(
            Qt.TextInteractionFlag.TextSelectableByMouse | Qt.TextInteractionFlag.LinksAccessibleByMouse
        )
        label.setOpenExternalLinks(False)
        label.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        label.linkActivated.connect(lambda link, lab=label: self._on_block_link_activated(lab, link))
        return label

    def set_text(self, text: str, final: bool = False) -> None:
        """Renders the body (Markdown for replies, verbatim for the user); a reply made with tools
        reads in order: each step's text and cards, then the answer (:func:`turn_layout`)."""
        self._text = text
        if self.message.role == "user":
            self.body.setText(plain_html(text))
            # A wrapped label asks for its minimum width; size the bubble to the text instead,
            # never wider than the transcript has room for (set_room).
            metrics = self.body.fontMetrics()
            longest = max((metrics.horizontalAdvance(line) for line in text.splitlines() or [""]), default=0)
            self._text_width = longest + 8
            self._fit_user_text()
            return
        layout = turn_layout(text, self._agent_stats, live=not final)
        self.agent_parts.show_turn(layout, live=not final)
        self.agent_parts.show_thoughts(self._agent_stats, live=not final)
        if not layout.answer and not final:
            self._answer.placeholder(self._colors, self.stream_note)
        else:
            self._answer.render(layout.answer, self._colors, final)
        self._code_blocks = tuple(c for part in self._step_texts() for c in part.code_blocks) + self._answer.code_blocks

    def set_room(self, width: int) -> None:
        """The transcript's width: a user message's bubble never asks for more (at 1024 px with the
        inspector open a long message was cut at the transcript's edge)."""
        room = max(min(560, width - 60), 120)  # less the card's margins and the bubble's padding
        if room != self._room:
            self._room = room
            if self.message.role == "user":
                self._fit_user_text()

    def _fit_user_text(self) -> None:
        self.body.setMinimumWidth(min(self._text_width, self._room))

    def set_agent(self, stats: Mapping[str, object] | None) -> None:
        """The running turn's steps so far (its messages and calls, as they are stored): the text
        streamed so far is shown in their order."""
        self._agent_stats = stats
        self.set_text(self._text, final=not self._streaming_state)

    def _step_texts(self) -> list[StepTextWidget]:
        return [group.text_widget for group in self.agent_parts.groups]

    def _labels(self) -> list[QLabel]:
        """Every label of the reply's text, in order (the steps', then the answer's)."""
        return [label for part in self._step_texts() for label in part.labels()] + self._answer.labels()

    @property
    def text(self) -> str:
        """The message's whole text, as it is stored (what Copy copies)."""
        return self._text

    def set_colors(self, colors: CodeColors) -> None:
        """Renders the body again in another theme's colours (code blocks, links)."""
        self._colors = colors
        self._answer.mark_stale()
        for part in self._step_texts():
            if isinstance(part, MarkdownStepText):
                part.restyle()
        self.set_text(self._text, final=self._streaming_state is False)

    def highlight(self, terms: Sequence[str]) -> int:
        """Marks ``terms`` in the text (a search hit); returns how many blocks have one."""
        marked = 0
        for label in self._labels():
            before = label.text()
            after = highlight_html(before, terms)
            if after != before:
                label.setText(after)
                marked += 1
        return marked

    def set_sources(self, sources: Sequence[Mapping[str, object]]) -> None:
        self._sources = list(sources)
        if not sources:
            self.sources_box.setVisible(False)
            return
        lines = [source_label(s, i + 1) for i, s in enumerate(sources)]
        self.sources_box.setText("<b>Sources</b><br>" + "<br>".join(lines))
        self.sources_box.setVisible(True)

    def set_streaming(self, streaming: bool) -> None:
        self._streaming_state = streaming
        for button in self._actions:
            button.setEnabled(not streaming)
        if streaming:
            self.stats_label.setText("generating…")
            self.stats_label.setVisible(True)

    def _on_block_link_activated(self, label: QLabel, link: str) -> None:
        if link.startswith(f"{COPY_SCHEME}:"):
            codes = self._answer.codes_of(label)
            for part in self._step_texts():
                if codes is None and isinstance(part, MarkdownStepText):
                    codes = part.blocks.codes_of(label)
            codes = codes or ()
            index = int(link.split(":", 1)[1])
            if 0 <= index < len(codes):
                QGuiApplication.clipboard().setText(codes[index])
            return
        url = QUrl(link)
        # The renderer makes links only of these schemes; anything else (a local file, a script,
        # an app-internal scheme) is never handed to the desktop, whatever put it in the label.
        if not link.lower().startswith(SAFE_LINK_SCHEMES) or not url.isValid():
            return
        choice = confirm_link(self, url)
        if choice == "copy":
            QGuiApplication.clipboard().setText(url.toString())
        elif choice == "open":
            QDesktopServices.openUrl(url)

    def copy_code(self, index: int) -> str | None:
        """The raw text of the message's ``index``-th code block (for the Copy links)."""
        return self._code_blocks[index] if 0 <= index < len(self._code_blocks) else None

    @Slot(str)
    def _on_sources_link_activated(self, link: str) -> None:
        if link.startswith(f"{SOURCE_SCHEME}:"):
            index = int(link.split(":", 1)[1])
            if 0 <= index < len(self._sources):
                self.source_activated.emit(self._sources[index])
