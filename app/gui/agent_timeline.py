"""The agent loop on the inspector's Speed timeline: each generation and each tool call of a turn,
in order, as bars as long as they took (issue 12: "the Speed section shows the loop's steps").

The entries are the turn's ``loop`` records (``app.agent_history.AgentRecord.loop``, saved in
the reply's stats): ``{"kind": "generate", "round", "ttft_ms", "prefill_ms", "decode_ms",
"tokens", "calls"}`` and ``{"kind": "tool", "name", "ms", "ran", "tokens"}``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QColor, QPainter, QPaintEvent
from PySide6.QtWidgets import QVBoxLayout, QWidget

from app.gui.display_text import plain_label
from app.gui.theme import LIGHT, ThemeColors

MIN_SEGMENT_PX = 3.0


def _number(value: object) -> float:
    """A number kept in a loop entry: 0 when missing or empty."""
    return float(value) if isinstance(value, (int, float, str)) and value else 0.0


def entry_ms(entry: Mapping[str, object]) -> float:
    """How long one step took (a generation: its prefill and decode)."""
    if entry.get("kind") == "tool":
        return _number(entry.get("ms"))
    return _number(entry.get("prefill_ms")) + _number(entry.get("decode_ms"))


def _ms(ms: float) -> str:
    return f"{ms:.0f} ms" if ms < 1000 else f"{ms / 1000:.1f} s"


def describe_loop(entries: Sequence[Mapping[str, object]]) -> str:
    """``generate 1: 420 ms, 31 tokens → add: 12 ms, +3 tokens → generate 2: …`` (empty: no loop)."""
    if not any(e.get("kind") == "tool" for e in entries):
        return ""
    parts = []
    for entry in entries:
        if entry.get("kind") == "tool":
            what = f"+{int(_number(entry.get('tokens'))):,} tokens" if entry.get("ran") else "did not run"
            parts.append(f"{entry.get('name', '?')}: {_ms(entry_ms(entry))}, {what}")
        else:
            parts.append(
                f"generate {entry.get('round', '?')}: {_ms(entry_ms(entry))}, "
                f"{int(_number(entry.get('tokens'))):,} tokens"
            )
    return " → ".join(parts)


class LoopBar(QWidget):
    """The painted strip: generations in the accent colour, calls in the tool results' colour."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.entries: list[dict[str, object]] = []
        self.colors = LIGHT
        self.setMinimumHeight(14)
        self.setFocusPolicy(Qt.FocusPolicy.TabFocus)
        self.setAccessibleName("Agent loop timeline")

    def sizeHint(self) -> QSize:
        return QSize(240, 16)

    def segments(self, width: float) -> list[tuple[float, float, str]]:
        """``(x, width, kind)`` of each step for a strip ``width`` pixels wide."""
        total = sum(entry_ms(e) for e in self.entries) or 1.0
        room = max(width - MIN_SEGMENT_PX * len(self.entries), 0.0)
        out, x = [], 0.0
        for entry in self.entries:
            w = MIN_SEGMENT_PX + room * entry_ms(entry) / total
            out.append((x, w, str(entry.get("kind", "generate"))))
            x += w
        return out

    def paintEvent(self, _event: QPaintEvent) -> None:
        painter = QPainter(self)
        h = float(self.height())
        painter.fillRect(QRectF(0, 0, self.width(), h), QColor(self.colors.surface_alt))
        for x, w, kind in self.segments(float(self.width())):
            color = self.colors.segment("tool_results") if kind == "tool" else self.colors.accent
            painter.fillRect(QRectF(x, 1, max(w - 1, 1.0), h - 2), QColor(color))
        painter.end()


class LoopTimelineWidget(QWidget):
    """The strip and its caption; hidden for a turn without tool calls."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 4, 0, 0)
        lay.setSpacing(2)
        title = plain_label("Agent loop")
        title.setObjectName("metricLabel")
        lay.addWidget(title)
        self.bar = LoopBar()
        lay.addWidget(self.bar)
        self.caption = plain_label("")
        self.caption.setObjectName("explain")
        self.caption.setWordWrap(True)
        lay.addWidget(self.caption)
        self.setVisible(False)

    @property
    def entries(self) -> list[dict[str, object]]:
        return self.bar.entries

    def set_entries(self, entries: Sequence[Mapping[str, object]]) -> None:
        self.bar.entries = [dict(e) for e in entries]
        text = describe_loop(self.bar.entries)
        self.caption.setText(text)
        self.bar.setAccessibleDescription(text)
        self.setVisible(bool(text))
        self.bar.update()

    def set_colors(self, colors: ThemeColors) -> None:
        self.bar.colors = colors
        self.bar.update()
