"""The agent's parts of a reply in the transcript: a card per tool call, the approval card, and the
thinking folded where it came: above the text it preceded (issue 12, "The app"; issue 28).

Contract: ARCHITECTURE.md, 'app.gui.tool_card'.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QToolButton, QVBoxLayout, QWidget

from app.gui.display_text import plain_label, plain_tooltip

if TYPE_CHECKING:
    from app.gui.workers.agent_turn import ApprovalRequest

FOLD_CHARS = 400
"""A result longer than this (or than :data:`FOLD_LINES` lines) is folded to its start."""
FOLD_LINES = 8
APPROVAL_WORDS = {
    "allowed": "allowed once",
    "always": "always allowed",
    "allow-listed": "on the allow list",
    "denied": "denied: it did not run",
    "unknown-tool": "no such tool: it did not run",
    "invalid-arguments": "arguments rejected: it did not run",
    "cancelled": "stopped: it did not run",
}


def arguments_text(arguments: Mapping[str, object]) -> str:
    """The call's arguments exactly, as indented JSON."""
    return json.dumps(dict(arguments), ensure_ascii=False, indent=2, sort_keys=False)


def _number(value: object) -> float:
    """A number kept in a stored step or reply: 0 when missing or empty."""
    return float(value) if isinstance(value, (int, float, str)) and value else 0.0


def _mapping(value: object) -> Mapping[str, object]:
    """A JSON object kept in a stored step or reply; anything else is an empty one."""
    return value if isinstance(value, Mapping) else {}


def folded(text: str) -> tuple[str, bool]:
    """The start of a long text and whether it was cut."""
    lines = text.splitlines()
    if len(text) <= FOLD_CHARS and len(lines) <= FOLD_LINES:
        return text, False
    head = "\n".join(lines[:FOLD_LINES])[:FOLD_CHARS]
    return head.rstrip() + " …", True


def format_duration_ms(ms: float) -> str:
    return f"{ms:.0f} ms" if ms < 1000 else f"{ms / 1000:.1f} s"


def step_summary(step: Mapping[str, object]) -> str:
    """``add · testtools · allowed once · 12 ms · +3 tokens`` (the card's header)."""
    parts = [str(step.get("name", "?"))]
    if step.get("source"):
        parts.append(str(step["source"]))
    parts.append(APPROVAL_WORDS.get(str(step.get("approval")), str(step.get("approval") or "")))
    if step.get("ran"):
        parts.append(format_duration_ms(_number(step.get("ms"))))
    parts.append(f"+{int(_number(step.get('tokens'))):,} tokens")
    if step.get("truncated"):
        parts.append("result cut to fit the window")
    return " · ".join(p for p in parts if p)


def _label(text: str = "", name: str = "toolText") -> QLabel:
    """A plain-text label: tool and server names, arguments and results are shown as they are
    (a character that does not print as itself is escaped: ``app.gui.display_text.shown``)."""
    label = plain_label(text)
    label.setObjectName(name)
    label.setWordWrap(True)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    return label


def _mono_label(text: str, name: str) -> QLabel:
    """A label showing ``text`` exactly (plain text, fixed-width font)."""
    label = _label(text, name)
    label.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
    return label


class ToolCallCardWidget(QFrame):
    """One handled call: tool, arguments, result (folded when long), duration and tokens added."""

    def __init__(self, step: Mapping[str, object], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("toolCard")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.step = dict(step)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 6, 10, 6)
        lay.setSpacing(3)
        self.header = _label(
            ("✓ " if step.get("ran") and not step.get("is_error") else "⚠ ") + step_summary(step), "toolHeader"
        )
        self.header.setAccessibleName("Tool call")
        lay.addWidget(self.header)
        self.arguments = _mono_label(arguments_text(_mapping(step.get("arguments"))), "toolArguments")
        self.arguments.setAccessibleName("Arguments")
        lay.addWidget(self.arguments)
        result = str(step.get("result", ""))
        self._result = result
        self._head, self.foldable = folded(result)
        self.result_caption = _label("Result (an error)" if step.get("is_error") else "Result", "explain")
        lay.addWidget(self.result_caption)
        self.result = _mono_label(self._head, "toolResult")
        self.result.setAccessibleName("Result")
        lay.addWidget(self.result)
        self.expand_button = QToolButton()
        self.expand_button.setObjectName("toolExpand")
        self.expand_button.setAutoRaise(True)
        self.expand_button.setCheckable(True)
        self.expand_button.setText(f"Show the whole result ({len(result):,} characters)")
        self.expand_button.toggled.connect(self._on_expand_button_toggled)
        self.expand_button.setVisible(self.foldable)
        lay.addWidget(self.expand_button)

    @Slot(bool)
    def _on_expand_button_toggled(self, checked: bool) -> None:
        self.result.setText(self._result if checked else self._head)
        self.expand_button.setText(
            "Fold the result" if checked else f"Show the whole result ({len(self._result):,} characters)"
        )


class ApprovalCardWidget(QFrame):
    """A call waiting for the user: the exact arguments and three buttons.

    Args:
        request: an ``app.gui.workers.agent_turn.ApprovalRequest``.

    Signals:
        decided(str): ``once``, ``always`` or ``deny`` (after the gate was answered).
    """

    decided = Signal(str)

    def __init__(self, request: ApprovalRequest, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("approvalCard")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.request = request
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 8, 10, 8)
        lay.setSpacing(4)
        where = f" ({request.source})" if request.source else ""
        self.title = _label(f"The model wants to call {request.name}{where}. Run it?", "approvalTitle")
        lay.addWidget(self.title)
        if request.description:
            lay.addWidget(_label(request.description, "explain"))
        self.arguments = _mono_label(arguments_text(request.arguments), "toolArguments")
        self.arguments.setAccessibleName("Arguments of the call")
        lay.addWidget(self.arguments)
        row = QHBoxLayout()
        self.once_button = QPushButton("Allow once")
        self.always_button = QPushButton("Always allow this tool")
        self.deny_button = QPushButton("Deny")
        self.once_button.setObjectName("primaryButton")
        self.always_button.setToolTip(
            plain_tooltip(f"Run {request.name} without asking from now on (Settings → Tools lists it)")
        )
        self.deny_button.setToolTip("The call does not run; the model is told it was refused")
        for button, decision in (
            (self.once_button, "once"),
            (self.always_button, "always"),
            (self.deny_button, "deny"),
        ):
            button.clicked.connect(lambda _=False, d=decision: self.decide(d))
            row.addWidget(button)
        row.addStretch(1)
        lay.addLayout(row)
        self.status = _label("", "explain")
        self.status.setVisible(False)
        lay.addWidget(self.status)

    @property
    def pending(self) -> bool:
        return self.once_button.isEnabled()

    def decide(self, decision: str) -> None:
        """Answers the call (as the buttons do)."""
        if not self.pending:
            return
        answered = self.request.answer(decision)
        words = {"once": "Allowed once", "always": "Always allowed", "deny": "Denied: the call did not run"}
        self._close(words[decision] if answered else "Stopped: the call did not run")
        if answered:
            self.decided.emit(decision)

    def expire(self) -> None:
        """The turn ended or was stopped: the call is refused (if still waiting), the buttons go."""
        if self.pending:
            self.request.answer("deny")
            self._close("Stopped: the call did not run")

    def _close(self, text: str) -> None:
        for button in (self.once_button, self.always_button, self.deny_button):
            button.setEnabled(False)
            button.setVisible(False)
        self.status.setText(text)
        self.status.setVisible(True)


class ReasoningFoldWidget(QFrame):
    """The thinking, folded above the answer it came before: ``Thought for 1.2 s · 84 tokens``; a
    click unfolds it."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("reasoningFold")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 2, 0, 2)
        lay.setSpacing(2)
        self.toggle = QToolButton()
        self.toggle.setObjectName("reasoningToggle")
        self.toggle.setAutoRaise(True)
        self.toggle.setCheckable(True)
        self.toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.toggle.setArrowType(Qt.ArrowType.RightArrow)
        self.toggle.toggled.connect(self._on_toggle_toggled)
        lay.addWidget(self.toggle)
        self.body = _label("", "reasoningText")
        self.body.setVisible(False)
        lay.addWidget(self.body)
        self.text = ""
        self._shown: tuple[str, int, float, bool] | None = None
        self.setVisible(False)

    def set_reasoning(self, text: str, tokens: int = 0, ms: float = 0.0, live: bool = False) -> None:
        """Shows the thinking (hidden when there is none)."""
        if (text, tokens, ms, live) == self._shown:
            return
        self._shown = (text, tokens, ms, live)
        self.text = text
        if live:
            title = "Thinking…"
        else:
            parts = [f"Thought for {format_duration_ms(ms)}" if ms else "Thought"]
            if tokens:
                parts.append(f"{tokens:,} tokens")
            title = " · ".join(parts)
        self.toggle.setText(title)
        self.toggle.setAccessibleName(f"{title}. Show the thinking")
        self.body.setText(text.strip())
        self.setVisible(bool(text.strip()))

    @property
    def title(self) -> str:
        return self.toggle.text()

    @property
    def unfolded(self) -> bool:
        return self.body.isVisible()

    @Slot(bool)
    def _on_toggle_toggled(self, checked: bool) -> None:
        self.toggle.setArrowType(Qt.ArrowType.DownArrow if checked else Qt.ArrowType.RightArrow)
        self.body.setVisible(checked)


@dataclass(frozen=True)
class TurnStep:
    """One generation of a turn that called tools: its text, then its calls.

    Attributes:
        text: what the model wrote before calling (may be empty).
        call_ids: the ids of its calls, in the order it made them.
        steps: the handled calls (``app.agent_history.step_dict``) known so far, in that order.
    """

    text: str
    call_ids: tuple[str, ...]
    steps: tuple[Mapping[str, object], ...]


@dataclass(frozen=True)
class TurnLayout:
    """A reply in the order the loop ran: each calling generation's text and calls, then the answer.

    Attributes:
        steps: the generations that called tools, in order (none for a plain reply).
        answer: the text after the last call: the final answer (the whole text when not ordered).
        ordered: False when the stored turn cannot be put in order (a history without its
            messages): then one step without text holds every card, above the whole text.
    """

    steps: tuple[TurnStep, ...]
    answer: str
    ordered: bool = True


def _saved_steps(stats: Mapping[str, object]) -> list[Mapping[str, object]]:
    saved = stats.get("tool_steps")
    return [s for s in saved if isinstance(s, Mapping)] if isinstance(saved, Sequence) else []


def turn_layout(content: str, stats: Mapping[str, object] | None, *, live: bool = False) -> TurnLayout:
    """How a reply reads in order, from its text and its stats (stored, or the running turn's).

    The reply's text is every generation's text joined as ``app.agent_history.ReplyText`` joins
    them; each assistant message of ``agent_messages`` that has calls is one step, its calls' cards
    (``tool_steps``, matched by call id) after its text; what follows the last step's text is the
    answer. ``live``: the text may lag behind the messages (the worker sends text in batches), so a
    text shorter than the steps' is an empty answer, not a mismatch.
    """

    stats = stats or {}
    steps = _saved_steps(stats)
    messages = stats.get("agent_messages")
    calling = (
        [m for m in messages if isinstance(m, Mapping) and m.get("role") == "assistant" and m.get("tool_calls")]
        if isinstance(messages, Sequence)
        else []
    )
    if not calling:
        if not steps:
            return TurnLayout((), content)
        return TurnLayout((TurnStep("", tuple(str(s.get("id", "")) for s in steps), tuple(steps)),), content, False)
    # lazy: start-up (the window's first frame imports this module; the agent's events come later)
    from app.agent_history import ReplyText

    by_id = {str(s.get("id", "")): s for s in steps}
    joined = ReplyText()
    out: list[TurnStep] = []
    placed: set[str] = set()
    for message in calling:
        text = str(message.get("content") or "")
        joined.add(text)
        joined.end_generation()
        raw_calls = message.get("tool_calls")
        calls = raw_calls if isinstance(raw_calls, Sequence) else ()
        ids = tuple(str(c.get("id", "")) for c in calls if isinstance(c, Mapping))
        placed.update(ids)
        out.append(TurnStep(text, ids, tuple(by_id[i] for i in ids if i in by_id)))
    stray = [s for s in steps if str(s.get("id", "")) not in placed]  # a call no message names: kept in view
    if stray:
        last = out[-1]
        out[-1] = TurnStep(
            last.text, last.call_ids + tuple(str(s.get("id", "")) for s in stray), last.steps + tuple(stray)
        )
    prefix = joined.text
    if content.startswith(prefix):
        return TurnLayout(tuple(out), content[len(prefix) :].lstrip("\n"))
    if live and prefix.startswith(content):
        return TurnLayout(tuple(out), "")
    return TurnLayout((TurnStep("", tuple(str(s.get("id", "")) for s in steps), tuple(steps)),), content, False)


@dataclass(frozen=True)
class Thought:
    """One generation's thinking: its text, tokens and time."""

    text: str
    tokens: int = 0
    ms: float = 0.0


def thoughts_of(stats: Mapping[str, object], text: str, *, live: bool = False) -> tuple[list[Thought], str] | None:
    """Each finished generation's thinking, cut from the turn's ``text`` by the lengths its
    generation records keep (``reasoning_chars`` in ``loop``), and what follows them (the
    generation still thinking, live).

    The stored text joins the generations' thinking with a blank line (``engine.agent.loop``);
    ``live`` text is the streamed pieces, joined by nothing, and may lag behind the records.

    Returns:
        None when the records do not say (a history written before them, a plain reply) or the
        lengths do not add up: the thinking then stays in one fold above the answer.
    """
    loop = stats.get("loop")
    gens = [e for e in loop if isinstance(e, Mapping) and e.get("kind") == "generate"] if isinstance(loop, list) else []
    if not gens or any("reasoning_chars" not in e for e in gens):
        return None
    out: list[Thought] = []
    pos, seen = 0, False
    for entry in gens:
        size = int(_number(entry.get("reasoning_chars")))
        if size and seen and not live:
            if text[pos : pos + 2] != "\n\n":
                return None
            pos += 2
        seen = seen or bool(size)
        tokens, ms = int(_number(entry.get("reasoning_tokens"))), _number(entry.get("reasoning_ms"))
        out.append(Thought(text[pos : pos + size], tokens, ms))
        pos += size
    if not live and pos != len(text):
        return None
    return out, text[pos:]


class StepTextWidget(QWidget):
    """The text of one step of a turn (plain text; the message card gives a Markdown one).

    Args:
        label: the label of its first block (a plain one by default).
    """

    def __init__(self, label: QLabel | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("agentStepText")
        self.box = QVBoxLayout(self)
        self.box.setContentsMargins(0, 0, 0, 0)
        self.box.setSpacing(6)
        self.label = label if label is not None else _label("", "messageBody")
        self.box.addWidget(self.label)
        self.text = ""

    def set_text(self, text: str) -> None:
        self.text = text
        self.label.setText(text)

    @property
    def code_blocks(self) -> tuple[str, ...]:
        """The raw text of its code blocks (none in plain text)."""
        return ()

    def labels(self) -> list[QLabel]:
        """The labels its text is shown in."""
        return [self.label]


class StepGroupWidget(QWidget):
    """One step of a turn: the model's text, then its calls' cards (or their approval cards)."""

    def __init__(self, text_widget: StepTextWidget, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("agentStep")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(4)
        self.text_widget = text_widget
        self.fold = ReasoningFoldWidget()  # the thinking of this step's generation, when known: it came first
        lay.addWidget(self.fold)
        lay.addWidget(text_widget)
        self._calls = QVBoxLayout()
        self._calls.setContentsMargins(0, 0, 0, 2)
        self._calls.setSpacing(4)
        lay.addLayout(self._calls)
        self.call_ids: tuple[str, ...] = ()
        self.text: str | None = None
        text_widget.setVisible(False)

    def set_text(self, text: str) -> None:
        if text != self.text:
            self.text = text
            self.text_widget.set_text(text)
            self.text_widget.setVisible(bool(text.strip()))

    def widgets(self) -> list[QWidget]:
        """The cards shown, in order."""
        items = (self._calls.itemAt(i) for i in range(self._calls.count()))
        return [w for w in (item.widget() for item in items if item is not None) if w is not None]

    def set_widgets(self, widgets: Sequence[QWidget]) -> None:
        """Shows these cards, in this order (taken from wherever they were)."""
        if self.widgets() == list(widgets):
            return
        for widget in self.widgets():
            self._calls.removeWidget(widget)
        for widget in widgets:
            self._calls.addWidget(widget)

    def add_widget(self, widget: QWidget, replacing: QWidget | None = None) -> None:
        """Adds a card (where ``replacing`` was, if it is here)."""
        index = self._calls.indexOf(replacing) if replacing is not None else -1
        if index >= 0:
            self._calls.insertWidget(index, widget)
        else:
            self._calls.addWidget(widget)


class AgentPartsWidget(QWidget):
    """A reply's steps in order: each step's text, then its cards and approvals; the reply card
    puts it above its answer, and :attr:`fold` (the answer's thinking) between them.

    Args:
        new_text: makes a step's text widget (the message card gives a Markdown one).
    """

    def __init__(self, new_text: Callable[[], StepTextWidget] | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.setSpacing(6)
        self._new_text = new_text or StepTextWidget
        self.groups: list[StepGroupWidget] = []
        self.cards: list[ToolCallCardWidget] = []
        self.approvals: list[ApprovalCardWidget] = []
        self.fold = ReasoningFoldWidget()
        self._live_reasoning: list[str] = []
        self._thought_stats: Mapping[str, object] = {}
        self._shown: tuple[object, ...] | None = None
        self.setVisible(False)

    # ------------------------------------------------------------------ a whole turn
    def show_turn(self, layout: TurnLayout, live: bool = False) -> None:
        """Shows the steps of ``layout`` in order, keeping the cards already shown (an unfolded
        result stays unfolded) and the approvals still waiting (in their step).

        ``live``: the layout may be behind what was added since (:meth:`add_step`): a card it does
        not have yet stays, in the last step; a stored reply's layout is the whole truth.
        """
        key = tuple((s.text, s.call_ids, tuple(map(dict, s.steps))) for s in layout.steps)
        if key == self._shown:
            return
        self._shown = key
        self._drop_approvals_of({str(d.get("id", "")) for step in layout.steps for d in step.steps})
        cards = {str(c.step.get("id", "")): c for c in self.cards}
        used: list[ToolCallCardWidget] = []
        placed: list[ApprovalCardWidget] = []
        for index, step in enumerate(layout.steps):
            group = self._group(index)
            group.set_text(step.text)
            group.call_ids = step.call_ids
            widgets: list[QWidget] = []
            for data in step.steps:
                card = cards.pop(str(data.get("id", "")), None)
                if card is None or card.step != dict(data):
                    card = ToolCallCardWidget(data)
                used.append(card)
                widgets.append(card)
            waiting = [a for a in self.approvals if a.request.call_id in step.call_ids]
            placed += waiting
            group.set_widgets([*widgets, *waiting])
        newer: list[QWidget] = list(cards.values()) if live else []
        for card in [] if live else cards.values():
            card.setParent(None)
            card.deleteLater()
        self.cards = used + [c for c in self.cards if c in newer]
        stray = newer + [a for a in self.approvals if a not in placed]
        if stray:  # a call no step names (yet): it stays in view, in the last step
            last = self._group(max(len(layout.steps) - 1, 0))
            last.set_widgets([*(w for w in last.widgets() if w not in stray), *stray])
        keep = len(layout.steps) or (1 if stray else 0)
        for group in self.groups[keep:]:
            group.setParent(None)
            group.deleteLater()
        del self.groups[keep:]
        self.setVisible(bool(self.cards or self.approvals or any((g.text or "").strip() for g in self.groups)))

    def show_thoughts(self, stats: Mapping[str, object] | None, live: bool = False) -> None:
        """Folds each step's thinking above that step's text and the answer's above the answer
        (:func:`thoughts_of`); when the records do not say whose it is, all of it above the answer.

        ``live``: the thinking streamed so far (:meth:`append_reasoning`); else the stored one.
        """
        stats = stats or {}
        self._thought_stats = stats
        stored = _mapping(stats.get("reasoning"))
        text = "".join(self._live_reasoning) if live else str(stored.get("text", ""))
        if not live:
            self._live_reasoning = []
        split = thoughts_of(stats, text, live=live) if self.groups else None
        steps = len(self.groups)
        if split is None or len(split[0]) > steps + 1 or (not live and len(split[0]) < steps):
            for group in self.groups:
                group.fold.set_reasoning("")
            tokens, ms = int(_number(stored.get("tokens"))), _number(stored.get("ms"))
            self.fold.set_reasoning(text, 0 if live else tokens, 0.0 if live else ms, live=live)
            return
        thoughts, rest = split
        for index, group in enumerate(self.groups):
            own = thoughts[index] if index < len(thoughts) else Thought("")
            group.fold.set_reasoning(own.text, own.tokens, own.ms)
        answer = thoughts[steps] if len(thoughts) > steps else Thought("")
        if live and rest.strip():  # the generation thinking now
            self.fold.set_reasoning(answer.text + rest, live=True)
        else:
            self.fold.set_reasoning(answer.text, answer.tokens, answer.ms)

    def reset_live(self, reasoning: Sequence[str] = ()) -> None:
        """A reply streams into this card, with the thinking streamed so far (none when it starts)."""
        self._live_reasoning = list(reasoning)
        self._thought_stats = {}

    def _group(self, index: int) -> StepGroupWidget:
        while len(self.groups) <= index:
            group = StepGroupWidget(self._new_text())
            self._layout.addWidget(group)
            self.groups.append(group)
        return self.groups[index]

    def _group_of(self, call_id: object) -> StepGroupWidget:
        """The step a call belongs to; a call no step names yet goes to the last step (or a first one)."""
        for group in self.groups:
            if call_id in group.call_ids:
                return group
        return self._group(max(len(self.groups) - 1, 0))

    def _drop_approvals_of(self, handled: set[str]) -> None:
        for approval in list(self.approvals):
            if approval.request.call_id in handled:  # handled: answered, or refused by Stop
                self.approvals.remove(approval)
                approval.setParent(None)
                approval.deleteLater()

    # ------------------------------------------------------------------ live
    def add_step(self, step: Mapping[str, object]) -> ToolCallCardWidget:
        """A call was handled: its card takes the place of its approval card, if any, in its step."""
        call_id = str(step.get("id", ""))
        group = self._group_of(call_id)
        waiting = next((a for a in self.approvals if a.request.call_id == call_id), None)
        card = ToolCallCardWidget(step)
        group.add_widget(card, replacing=waiting)
        self._drop_approvals_of({call_id})
        self.cards.append(card)
        self._shown = None
        self.setVisible(True)
        return card

    def add_approval(self, request: ApprovalRequest) -> ApprovalCardWidget:
        """A call waits for the user: its card goes after its step's text."""
        card = ApprovalCardWidget(request)
        self._group_of(request.call_id).add_widget(card)
        self.approvals.append(card)
        self._shown = None
        self.setVisible(True)
        return card

    def take_pending(self) -> list[ApprovalRequest]:
        """The requests still waiting for the user (the card is about to be rebuilt)."""
        return [card.request for card in self.approvals if card.pending and not card.request.gate.answered]

    def expire_approvals(self) -> None:
        for card in self.approvals:
            card.expire()

    def append_reasoning(self, text: str) -> None:
        """Thinking of the streaming reply: folded with the step it belongs to, once known."""
        self._live_reasoning.append(text)
        self.show_thoughts(self._thought_stats, live=True)
