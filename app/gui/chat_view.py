"""The chat transcript: the message cards (:mod:`app.gui.message_card`) in order, streaming, branches,
sources and the eviction marker.

The streaming reply is re-rendered at most ~30 times a second (the worker coalesces tokens); the
view follows the bottom only while the user has not scrolled up. The first frame shows an empty
transcript: the cards' module (the Markdown, tool and media widgets) is imported with the first card.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from PySide6.QtCore import QPoint, Qt, QTimer, Signal, Slot
from PySide6.QtGui import QGuiApplication, QResizeEvent
from PySide6.QtWidgets import QLabel, QScrollArea, QVBoxLayout, QWidget

from app.gui.display_text import plain_label
from app.gui.markdown_render import LIGHT_CODE, CodeColors
from app.gui.window_layout import chain_focus

if TYPE_CHECKING:
    from app.gui.message_card import MessageCard
    from app.gui.tool_card import ApprovalCardWidget
    from app.gui.workers.agent_turn import ApprovalRequest
    from app.gui.workers.history_reads import DisplayMessage


class ChatView(QScrollArea):
    """The scrolling transcript.

    Signals:
        copy_requested(int), edit_requested(int, str), regenerate_requested(int),
        branch_requested(int): the sibling message id to switch to.
        source_activated(object): a clicked source dict.
    """

    edit_requested = Signal(int, str)
    regenerate_requested = Signal(int)
    branch_requested = Signal(int)
    source_activated = Signal(object)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("transcript")
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self._body = QWidget()
        self._body.setObjectName("transcriptBody")
        self._layout = QVBoxLayout(self._body)
        self._layout.setContentsMargins(0, 12, 0, 12)
        self._layout.setSpacing(2)
        self._layout.addStretch(1)
        self.setWidget(self._body)
        self._colors = LIGHT_CODE
        self._assistant_name = "Assistant"
        self.cards: list[MessageCard] = []
        self.marker: QLabel | None = None
        self._evicted = 0
        self._streaming: MessageCard | None = None
        self._stream_text: list[str] = []
        self._live_agent: Mapping[str, object] | None = None  # the streaming turn's steps so far
        self._live_reasoning: list[str] = []  # and its thinking (a rebuilt card gets both)
        self._follow = True
        self._anchor: tuple[int, int] | None = None  # (message id, its y in the viewport) to keep
        self._reveal: tuple[int, list[str]] | None = None  # a search hit to show and mark
        self.empty = plain_label(
            "Ask anything.\nThe inspector on the right shows what the model is doing while it answers.\n"
            "Drop files or folders on the window to chat with your documents,\n"
            "or images on the message box to ask about them."
        )
        self.empty.setObjectName("emptyState")
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self._layout.insertWidget(0, self.empty)
        self.verticalScrollBar().valueChanged.connect(self._on_scrollbar_value_changed)
        self.verticalScrollBar().rangeChanged.connect(self._on_scrollbar_range_changed)
        self._render_timer = QTimer(self)
        self._render_timer.setSingleShot(True)
        self._render_timer.setInterval(33)
        self._render_timer.timeout.connect(self._render_stream)
        # Tab reaches the transcript's buttons in reading order, after the header, before focus_after.
        self.focus_after: QWidget | None = None
        self._focus_timer = QTimer(self)
        self._focus_timer.setSingleShot(True)
        self._focus_timer.setInterval(0)
        self._focus_timer.timeout.connect(self.order_focus)
        self._holding: tuple[int, int] | None = None  # a card kept in place while the layout settles
        self._hold_timer = QTimer(self)
        self._hold_timer.setSingleShot(True)
        self._hold_timer.setInterval(400)

    def set_colors(self, colors: CodeColors) -> None:
        """The theme's code and link colours; the cards shown are rendered again in them."""
        if colors == self._colors:
            return
        self._colors = colors
        for card in self.cards:
            card.set_colors(colors)

    def set_assistant_name(self, name: str) -> None:
        self._assistant_name = name

    # ------------------------------------------------------------------ whole thread
    def set_thread(self, messages: Sequence[DisplayMessage], evicted: int = 0) -> None:
        """Shows a conversation's current branch; ``evicted`` older messages get a marker after them."""
        streaming_id = self._streaming.message.id if self._streaming is not None else None
        same_shape = [c.message.id for c in self.cards] == [m.id for m in messages] and self._evicted == evicted
        if same_shape and messages:
            self._update_cards(messages, streaming_id)
            return
        self._evicted = evicted
        # Calls of the streaming reply still waiting for the user move to its new card (below).
        waiting = self._streaming.agent_parts.take_pending() if self._streaming is not None else []
        self._clear_cards()
        waiting = self._insert_cards(messages, evicted, streaming_id, waiting)
        for request in waiting:  # the reply is not shown any more: its calls are refused, never left waiting
            request.answer("deny")
        self.empty.setVisible(not messages)
        self._scroll_after_rebuild()
        self._focus_timer.start()

    def order_focus(self) -> None:
        """Puts the cards' buttons in the Tab order, in reading order, right after the transcript
        and before :attr:`focus_after` (new widgets otherwise join the end of the chain, and Tab
        went through every reply's buttons before it reached the header)."""
        after = self.focus_after
        if after is None:
            return
        stops: list[tuple[int, int, int, QWidget]] = []
        tab = Qt.FocusPolicy.TabFocus
        for index, card in enumerate(self.cards):
            for widget in card.findChildren(QWidget):
                if widget.focusPolicy() & tab == tab:
                    at = widget.mapTo(card, QPoint(0, 0))
                    stops.append((index, at.y(), at.x(), widget))
        chain_focus([self, *(widget for *_key, widget in sorted(stops, key=lambda s: s[:3])), after])

    def _update_cards(self, messages: Sequence[DisplayMessage], streaming_id: int | None) -> None:
        """The same messages (a reply finished, a checkpoint): updates the cards in place instead of
        rebuilding the transcript."""
        for card, message in zip(self.cards, messages, strict=True):
            if message.id == streaming_id and message.state == "pending":
                continue
            if card.message != message:
                card.update_message(message)
                if card is self._streaming:
                    card.set_streaming(False)
                    self._streaming = None

    def _clear_cards(self) -> None:
        """Removes every card and the eviction marker."""
        for card in self.cards:
            card.setParent(None)
            card.deleteLater()
        self.cards.clear()
        if self.marker is not None:
            self.marker.setParent(None)
            self.marker.deleteLater()
            self.marker = None
        self._streaming = None

    def _insert_cards(
        self,
        messages: Sequence[DisplayMessage],
        evicted: int,
        streaming_id: int | None,
        waiting: list[ApprovalRequest],
    ) -> list[ApprovalRequest]:
        """A card per message, the marker after the evicted ones; the streaming reply's card takes
        the text streamed so far and the ``waiting`` approvals. Returns those no card took."""
        position = 0
        for index, message in enumerate(messages):
            if evicted and index == evicted:
                self.marker = plain_label(
                    f"⤒ {evicted} earlier message{'s' if evicted != 1 else ''} no longer fit in the context "
                    "window and were not sent to the model"
                )
                self.marker.setObjectName("evictionMarker")
                self.marker.setAlignment(Qt.AlignmentFlag.AlignCenter)
                self._layout.insertWidget(position, self.marker)
                position += 1
            card = self._make_card(message)
            self._layout.insertWidget(position, card)
            position += 1
            if message.id == streaming_id and message.state == "pending":
                self._streaming = card
                card.set_streaming(True)
                card.agent_parts.reset_live(self._live_reasoning)
                card.set_agent(self._live_agent)
                card.set_text("".join(self._stream_text))
                for request in waiting:
                    card.agent_parts.add_approval(request)
                waiting = []
        return waiting

    def _scroll_after_rebuild(self) -> None:
        """Shows a search hit to reveal, else keeps a switched branch where it was, else follows the bottom."""
        if self._reveal is not None and self.card_for(self._reveal[0]) is not None:
            message_id, terms = self._reveal
            self._reveal = None
            revealed = self.card_for(message_id)
            assert revealed is not None
            revealed.highlight(terms)
            self._follow = False
            QTimer.singleShot(0, self, lambda c=revealed: self.ensureWidgetVisible(c, 0, 40))
        elif self._anchor is not None and self.card_for(self._anchor[0]) is not None:
            message_id, offset = self._anchor
            self._anchor = None
            self._follow = False
            QTimer.singleShot(0, self, lambda: self._scroll_card_to(message_id, offset))
        elif self._follow:
            QTimer.singleShot(0, self, self.scroll_to_bottom)

    def _make_card(self, message: DisplayMessage) -> MessageCard:
        from app.gui.message_card import MessageCard  # lazy: start-up (the first frame has no card)

        card = MessageCard(message, self._colors, self._assistant_name)
        card.set_room(self.viewport().width())
        card.action_triggered.connect(self._on_card_action_triggered)
        card.source_activated.connect(self.source_activated)
        self.cards.append(card)
        return card

    # ------------------------------------------------------------------ streaming
    def begin_stream(self, reply_id: int) -> None:
        """Marks the card of ``reply_id`` as the one receiving text."""
        self._stream_text = []
        self._live_agent = None
        self._live_reasoning = []
        self._follow = True
        for card in self.cards:
            if card.message.id == reply_id:
                self._streaming = card
                card.set_streaming(True)
                card.agent_parts.reset_live()
                card.set_agent(None)
                card.set_text("")
        self.scroll_to_bottom()

    def append_stream(self, text: str) -> None:
        """Adds streamed text; the card re-renders at most every 33 ms."""
        self._stream_text.append(text)
        if not self._render_timer.isActive():
            self._render_timer.start()

    def set_stream_note(self, note: str) -> None:
        """What the streaming reply's card says while it has no answer text yet ("" : an ellipsis)."""
        card = self._streaming
        if card is not None and card.stream_note != note:
            card.stream_note = note
            if not self._render_timer.isActive():
                self._render_timer.start()

    def end_stream(self) -> None:
        if self._streaming is not None:
            self._streaming.stream_note = ""
        self._render_timer.stop()
        self._render_stream()
        if self._streaming is not None:
            self._streaming.set_streaming(False)
            self._streaming.agent_parts.expire_approvals()  # Stop: a waiting call is refused
        self._streaming = None
        self._live_agent = None
        self._live_reasoning = []
        self._focus_timer.start()

    def set_live_agent(self, stats: Mapping[str, object]) -> None:
        """The streaming turn's steps so far (``app.agent_history.AgentRecord.stats``: its messages
        and calls, recorded as they happen): its card shows each step's text, then its calls."""
        self._live_agent = dict(stats)
        if self._streaming is not None:
            self._streaming.set_agent(self._live_agent)

    def add_tool_step(self, step: Mapping[str, object]) -> None:
        """A call of the streaming reply was handled: its card (app/gui/tool_card.py)."""
        if self._streaming is not None:
            self._streaming.agent_parts.add_step(step)
            self._focus_timer.start()

    def show_approval(self, request: ApprovalRequest) -> ApprovalCardWidget | None:
        """A call of the streaming reply waits for the user: its approval card (None: no reply
        streams, and the call is refused)."""
        if self._streaming is None:
            request.answer("deny")
            return None
        card = self._streaming.agent_parts.add_approval(request)
        QTimer.singleShot(0, self, lambda: self.ensureWidgetVisible(card, 0, 40))
        self._focus_timer.start()
        return card

    def append_reasoning(self, text: str) -> None:
        """Thinking of the streaming reply (folded above its answer)."""
        self._live_reasoning.append(text)
        if self._streaming is not None:
            self._streaming.agent_parts.append_reasoning(text)

    def _render_stream(self) -> None:
        if self._streaming is not None:
            self._streaming.set_text("".join(self._stream_text))

    @property
    def streamed_text(self) -> str:
        return "".join(self._stream_text)

    # ------------------------------------------------------------------ scrolling
    def reveal(self, message_id: int, terms: Sequence[str]) -> None:
        """When ``message_id`` is next shown (a search hit opening), scrolls to it and marks ``terms``."""
        card = self.card_for(message_id)
        if card is None:
            self._reveal = (message_id, list(terms))
            return
        self._reveal = None
        card.highlight(terms)
        self._follow = False
        self.ensureWidgetVisible(card, 0, 40)

    def _scroll_card_to(self, message_id: int, offset: int) -> None:
        card = self.card_for(message_id)
        if card is not None:
            # Held while the new cards settle their heights (the range grows in steps): a first
            # value clamped to a short range must not turn into following the bottom.
            self._holding = (message_id, offset)
            self._hold_timer.start()
            self._follow = False
            self.verticalScrollBar().setValue(max(card.y() - offset, 0))

    def scroll_to_bottom(self) -> None:
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())

    @Slot(int)
    def _on_scrollbar_value_changed(self, value: int) -> None:
        bar = self.verticalScrollBar()
        if self._holding is not None and self._hold_timer.isActive():
            return  # our own hold, not the user's scroll
        self._follow = value >= bar.maximum() - 24

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        for card in self.cards:
            card.set_room(self.viewport().width())

    @Slot(int, int)
    def _on_scrollbar_range_changed(self, _minimum: int, maximum: int) -> None:
        if self._holding is not None and self._hold_timer.isActive():
            message_id, offset = self._holding
            card = self.card_for(message_id)
            if card is not None:
                self._follow = False
                self.verticalScrollBar().setValue(max(card.y() - offset, 0))
                return
        if self._follow:
            self.verticalScrollBar().setValue(maximum)

    # ------------------------------------------------------------------ actions
    @Slot(str, int)
    def _on_card_action_triggered(self, action: str, message_id: int) -> None:
        card = next((c for c in self.cards if c.message.id == message_id), None)
        if card is None:
            return
        message = card.message
        if action == "copy":
            QGuiApplication.clipboard().setText(card.text)
        elif action == "edit":
            self.edit_requested.emit(message_id, message.content)
        elif action == "regenerate":
            self.regenerate_requested.emit(message_id)
        elif action in ("prev", "next"):
            step = -1 if action == "prev" else 1
            target = message.sibling_index + step
            if 0 <= target < len(message.sibling_ids):
                # The other branch shows where this one was: the view does not jump to the bottom.
                sibling = message.sibling_ids[target]
                self._anchor = (sibling, card.y() - self.verticalScrollBar().value())
                self._follow = False
                self.branch_requested.emit(sibling)

    def card_for(self, message_id: int) -> MessageCard | None:
        return next((c for c in self.cards if c.message.id == message_id), None)
