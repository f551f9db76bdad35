"""The agent's parts of a reply in the transcript: a card per tool call, the approval card, and the
thinking folded under the answer (issue 12, "The app").

* :class:`ToolCallCardWidget`: the tool, its source, the exact arguments, the result (folded when
  long), how long it ran and the tokens it added to the context; a call that did not run says why.
* :class:`ApprovalCardWidget`: a call waiting for the user, with its exact arguments and *Allow
  once* / *Always allow this tool* / *Deny*; Stop (or the end of the turn) closes it unanswered.
* :class:`ReasoningFoldWidget`: the thinking, folded, with its token count and time.
* :class:`AgentPartsWidget`: a reply's cards and approvals (above the answer) and its fold (below).

The data are plain dicts (``app.agent_history.step_dict``, the reply's ``stats``), so a
stored reply shows the same cards after a restart.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QToolButton, QVBoxLayout, QWidget

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
    label = QLabel(text)
    label.setObjectName(name)
    label.setWordWrap(True)
    label.setTextFormat(Qt.TextFormat.PlainText)
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

    @property
    def expanded(self) -> bool:
        return self.expand_button.isChecked()

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
        self.always_button.setToolTip(f"Run {request.name} without asking from now on (Settings → Tools lists it)")
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
    """The thinking, folded under the answer: ``Thought for 1.2 s · 84 tokens``; a click unfolds it."""

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
        self.setVisible(False)

    def set_reasoning(self, text: str, tokens: int = 0, ms: float = 0.0, live: bool = False) -> None:
        """Shows the thinking (hidden when there is none)."""
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


class AgentPartsWidget(QWidget):
    """A reply's tool cards and approvals; the reply card puts it above its answer, and
    :attr:`fold` below it."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.setSpacing(4)
        self.cards: list[ToolCallCardWidget] = []
        self.approvals: list[ApprovalCardWidget] = []
        self.fold = ReasoningFoldWidget()
        self._live_reasoning: list[str] = []
        self.setVisible(False)

    def set_stats(self, stats: Mapping[str, object] | None) -> None:
        """Shows a stored reply's calls and thinking (``stats`` of the history)."""
        stats = stats or {}
        saved = stats.get("tool_steps")
        steps = [s for s in saved if isinstance(s, Mapping)] if isinstance(saved, Sequence) else []
        if [c.step for c in self.cards] != [dict(s) for s in steps]:
            for card in self.cards:  # approvals still waiting stay (a reply saved mid-turn)
                card.setParent(None)
                card.deleteLater()
            self.cards.clear()
            for step in steps:
                self.add_step(step)
        self.setVisible(bool(self.cards or self.approvals))
        reasoning = _mapping(stats.get("reasoning"))
        self._live_reasoning = []
        self.fold.set_reasoning(
            str(reasoning.get("text", "")), int(_number(reasoning.get("tokens"))), _number(reasoning.get("ms"))
        )

    def add_step(self, step: Mapping[str, object]) -> ToolCallCardWidget:
        """A call was handled: its card takes the place of its approval card, if any."""
        for approval in list(self.approvals):
            if approval.request.call_id == step.get("id"):  # handled: answered, or refused by Stop
                self.approvals.remove(approval)
                approval.setParent(None)
                approval.deleteLater()
        card = ToolCallCardWidget(step)
        self._layout.addWidget(card)
        self.cards.append(card)
        self.setVisible(True)
        return card

    def add_approval(self, request: ApprovalRequest) -> ApprovalCardWidget:
        card = ApprovalCardWidget(request)
        self._layout.addWidget(card)
        self.approvals.append(card)
        self.setVisible(True)
        return card

    def take_pending(self) -> list[ApprovalRequest]:
        """The requests still waiting for the user (the card is about to be rebuilt)."""
        return [card.request for card in self.approvals if card.pending and not card.request.gate.answered]

    def expire_approvals(self) -> None:
        for card in self.approvals:
            card.expire()

    def append_reasoning(self, text: str) -> None:
        self._live_reasoning.append(text)
        self.fold.set_reasoning("".join(self._live_reasoning), live=True)
