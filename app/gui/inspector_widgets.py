"""The inspector's painted pieces: the context map, the decode-speed chart, the memory wall meter
and the token view (their names and the tokens/s format: :mod:`app.gui.inspector_terms`; sizes and
durations: ``engine.units``).
Each tells assistive technology what it shows (an accessible name, and a description that follows
its values)."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

from PySide6.QtCore import QEvent, QPoint, QRectF, QSize, Qt
from PySide6.QtGui import (
    QAccessible,
    QAccessibleEvent,
    QColor,
    QFont,
    QHelpEvent,
    QPainter,
    QPainterPath,
    QPaintEvent,
    QPen,
)
from PySide6.QtWidgets import QTextBrowser, QToolTip, QWidget

from app.gui.inspector_terms import SEGMENTS
from app.gui.theme import LIGHT


def _describe(widget: QWidget, text: str) -> None:
    """Sets what assistive technology reads for a painted widget, and tells it the value changed."""
    if widget.accessibleDescription() == text:
        return
    widget.setAccessibleDescription(text)
    if QAccessible.isActive():
        QAccessible.updateAccessibility(QAccessibleEvent(widget, QAccessible.Event.DescriptionChanged))


class ContextBar(QWidget):
    """A stacked horizontal bar of the context budget."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.budget: dict[str, int] = {}
        self.colors = LIGHT
        self.setMinimumHeight(22)
        self.setMouseTracking(True)
        self.setFocusPolicy(Qt.FocusPolicy.TabFocus)
        self.setAccessibleName("Context window map")
        _describe(self, "no turn yet")

    def sizeHint(self) -> QSize:
        return QSize(240, 22)

    def set_budget(self, budget: Mapping[str, int]) -> None:
        self.budget = {k: int(v) for k, v in budget.items()}
        parts = [f"{label}: {self.budget.get(key, 0):,} tokens" for key, label in SEGMENTS if key in self.budget]
        _describe(self, "; ".join(parts) or "no turn yet")
        self.update()

    def _spans(self) -> list[tuple[str, float, float]]:
        total = sum(max(self.budget.get(key, 0), 0) for key, _ in SEGMENTS)
        if total <= 0:
            return []
        spans = []
        x = 0.0
        width = float(self.width())
        for key, _label in SEGMENTS:
            part = max(self.budget.get(key, 0), 0) / total * width
            if part > 0:
                spans.append((key, x, part))
                x += part
        return spans

    def paintEvent(self, _event: QPaintEvent) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        rect = QRectF(0, 0, self.width(), self.height())
        clip = QPainterPath()
        clip.addRoundedRect(rect, 6, 6)
        painter.setClipPath(clip)
        painter.fillRect(rect, QColor(self.colors.seg_free))
        for key, x, w in self._spans():
            painter.fillRect(QRectF(x, 0, w, self.height()), QColor(self.colors.segment(key)))
        painter.end()

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ToolTip and isinstance(event, QHelpEvent):
            for key, x, w in self._spans():
                if x <= event.pos().x() <= x + w:
                    label = dict(SEGMENTS)[key]
                    QToolTip.showText(event.globalPos(), f"{label}: {self.budget.get(key, 0)} tokens", self)
                    return True
            QToolTip.hideText()
            return True
        return super().event(event)


class SpeedChart(QWidget):
    """A small line chart of decode tokens/s over the current generation."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.samples: list[float] = []
        self.colors = LIGHT
        self.setMinimumHeight(70)
        self.setFocusPolicy(Qt.FocusPolicy.TabFocus)
        self.setAccessibleName("Decode speed chart")
        _describe(self, "decode speed appears while generating")

    def sizeHint(self) -> QSize:
        return QSize(240, 80)

    def set_samples(self, samples: Sequence[float]) -> None:
        self.samples = list(samples)[-120:]
        if self.samples:
            _describe(self, f"now {self.samples[-1]:.0f} tok/s, peak {max(self.samples):.0f} tok/s")
        else:
            _describe(self, "decode speed appears while generating")
        self.update()

    def paintEvent(self, _event: QPaintEvent) -> None:
        painter = QPainter(self)
        w, h = float(self.width()), float(self.height())
        painter.setPen(QPen(QColor(self.colors.border), 1))
        painter.setBrush(QColor(self.colors.surface_alt))
        painter.drawRoundedRect(QRectF(0.5, 0.5, w - 1, h - 1), 6, 6)
        if len(self.samples) < 2:
            painter.setPen(QColor(self.colors.muted))
            painter.drawText(QRectF(0, 0, w, h), Qt.AlignmentFlag.AlignCenter, "decode speed appears while generating")
            painter.end()
            return
        top = max(self.samples) * 1.15 or 1.0
        pad = 6.0
        step = (w - 2 * pad) / (len(self.samples) - 1)
        path = QPainterPath()
        for i, value in enumerate(self.samples):
            x = pad + i * step
            y = h - pad - (value / top) * (h - 2 * pad)
            if i == 0:
                path.moveTo(x, y)
            else:
                path.lineTo(x, y)
        area = QPainterPath(path)
        area.lineTo(pad + (len(self.samples) - 1) * step, h - pad)
        area.lineTo(pad, h - pad)
        area.closeSubpath()
        # An opaque blend of accent and background: alpha fills are slow in software rendering.
        back, accent = QColor(self.colors.surface_alt), QColor(self.colors.accent)
        fill = QColor(
            (back.red() * 5 + accent.red()) // 6,
            (back.green() * 5 + accent.green()) // 6,
            (back.blue() * 5 + accent.blue()) // 6,
        )
        painter.fillPath(area, fill)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setPen(QPen(accent, 2))
        painter.drawPath(path)
        painter.setPen(QColor(self.colors.muted))
        painter.setFont(QFont(self.font().family(), 8))
        peak = f"peak {max(self.samples):.0f} tok/s"
        painter.drawText(QRectF(pad, 2, w - 2 * pad, 14), Qt.AlignmentFlag.AlignRight, peak)
        painter.end()


class WallMeter(QWidget):
    """The memory wall meter: achieved bandwidth as a share of the machine's measured bandwidth."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.achieved: float | None = None
        self.limit: float | None = None
        self.colors = LIGHT
        self.setMinimumHeight(26)
        self.setFocusPolicy(Qt.FocusPolicy.TabFocus)
        self.setAccessibleName("Memory wall meter")
        _describe(self, "no measurement yet")

    def sizeHint(self) -> QSize:
        return QSize(240, 26)

    def set_values(self, achieved: float | None, limit: float | None) -> None:
        self.achieved, self.limit = achieved, limit
        ratio = self.ratio
        if ratio is None:
            _describe(self, "no measurement yet")
        else:
            _describe(self, f"{ratio * 100:.0f}% of the wall: {achieved:.1f} of {limit:.1f} GB/s")
        self.update()

    @property
    def ratio(self) -> float | None:
        if not self.achieved or not self.limit:
            return None
        return self.achieved / self.limit

    def paintEvent(self, _event: QPaintEvent) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        w, h = float(self.width()), float(self.height())
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(QColor(self.colors.surface_alt))
        painter.drawRoundedRect(QRectF(0, 0, w, h), 6, 6)
        ratio = self.ratio
        if ratio is not None:
            shown = min(ratio, 1.0)
            color = self.colors.ok if ratio < 0.6 else self.colors.warning if ratio < 0.9 else self.colors.danger
            painter.setBrush(QColor(color))
            painter.drawRoundedRect(QRectF(0, 0, max(w * shown, 8), h), 6, 6)
            # The label is drawn twice: in the text colour, then clipped to the fill in a colour
            # that reads on it (white on the light theme's strong colours, near-black on the dark
            # theme's pale ones), so every letter has contrast wherever the fill ends.
            text = f"{ratio * 100:.0f}% of the wall"
            painter.setPen(QColor(self.colors.text))
            painter.drawText(QRectF(8, 0, w - 16, h), Qt.AlignmentFlag.AlignVCenter, text)
            painter.setClipRect(QRectF(0, 0, max(w * shown, 8), h))
            painter.setPen(QColor("#ffffff" if self.colors.name == "light" else "#111318"))
            painter.drawText(QRectF(8, 0, w - 16, h), Qt.AlignmentFlag.AlignVCenter, text)
        else:
            painter.setPen(QColor(self.colors.muted))
            painter.drawText(QRectF(8, 0, w - 16, h), Qt.AlignmentFlag.AlignVCenter, "no measurement yet")
        painter.end()


class TokensView(QTextBrowser):
    """The last prompt as coloured token pieces, then the reply's tokens (accepted drafts tinted);
    hovering a piece shows its id."""

    PALETTE_LIGHT = ("#dbeafe", "#fde68a", "#bbf7d0", "#fbcfe8", "#ddd6fe", "#fed7aa")
    PALETTE_DARK = ("#1e3a5f", "#5c4813", "#14532d", "#5b2145", "#3b2f6b", "#5a3514")
    # The reply: tokens the model decoded itself in grey, those accepted from a speculative draft
    # (engine.inference.events.Token.drafted) in a teal none of the prompt's colours comes near.
    REPLY_LIGHT, REPLY_DARK = "#e5e7eb", "#3a3f47"
    DRAFTED_LIGHT, DRAFTED_DARK = "#5eead4", "#0d7d72"

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.token_ids: list[int] = []
        self.pieces: list[str] = []
        self.reply_ids: list[int] = []
        self.reply_pieces: list[str] = []
        self.reply_drafted: list[bool] = []
        self.dark = False
        self._limit = 4000
        self.setPlaceholderText("The prompt appears here after the first reply.")

    @property
    def drafted_color(self) -> str:
        """The tint of a reply token accepted from a draft (the legend shows it too)."""
        return self.DRAFTED_DARK if self.dark else self.DRAFTED_LIGHT

    @property
    def reply_color(self) -> str:
        """The background of a reply token the model decoded itself."""
        return self.REPLY_DARK if self.dark else self.REPLY_LIGHT

    def legend_html(self) -> str:
        """The reply's two tints, as rich text for the label under the view."""

        def swatch(color: str) -> str:
            return f'<span style="background-color:{color};">&nbsp;&nbsp;&nbsp;&nbsp;</span>'

        return (
            f"{swatch(self.drafted_color)} accepted from a draft (speculative decoding)&nbsp;&nbsp; "
            f"{swatch(self.reply_color)} decoded by the model"
        )

    def set_tokens(
        self,
        token_ids: Sequence[int],
        pieces: Sequence[str],
        limit: int = 4000,
        reply_ids: Sequence[int] = (),
        reply_pieces: Sequence[str] = (),
        reply_drafted: Sequence[bool] = (),
    ) -> None:
        """Shows the prompt (the last ``limit`` tokens of a long one) and the reply after it."""
        self.token_ids, self.pieces = list(token_ids), list(pieces)
        self.reply_ids, self.reply_pieces = list(reply_ids), list(reply_pieces)
        self.reply_drafted = list(reply_drafted)
        self._limit = limit
        self.rerender()

    def rerender(self) -> None:
        """Draws what is shown again (after a theme change)."""
        palette = self.PALETTE_DARK if self.dark else self.PALETTE_LIGHT
        start = max(0, len(self.token_ids) - self._limit)
        parts: list[str] = []
        if start:
            parts.append(f"<i>… {start} earlier tokens not shown …</i><br>")
        for i in range(start, len(self.token_ids)):
            piece = self.pieces[i] if i < len(self.pieces) else ""
            parts.append(_token_link(f"tok:{i}", piece, palette[i % len(palette)]))
        if self.reply_ids:
            parts.append("<br><i>reply:</i> ")
            for j in range(min(len(self.reply_ids), self._limit)):
                piece = self.reply_pieces[j] if j < len(self.reply_pieces) else ""
                drafted = j < len(self.reply_drafted) and self.reply_drafted[j]
                parts.append(_token_link(f"rep:{j}", piece, self.drafted_color if drafted else self.reply_color))
        self.setHtml('<div style="font-family: monospace; line-height: 150%;">' + "".join(parts) + "</div>")

    def tooltip_at(self, pos: QPoint) -> str | None:
        """What hovering the piece under a viewport position says, or None."""
        return self.tooltip_from_anchor(self.anchorAt(pos))

    def tooltip_from_anchor(self, anchor: str) -> str | None:
        """What hovering the piece of this link (``tok:I`` in the prompt, ``rep:J`` in the reply) says."""
        kind, _, index_text = anchor.partition(":")
        if not index_text.isdigit():
            return None
        index = int(index_text)
        if kind == "tok" and index < len(self.token_ids):
            piece = self.pieces[index] if index < len(self.pieces) else ""
            return f"token #{index}  id {self.token_ids[index]}  {piece!r}"
        if kind == "rep" and index < len(self.reply_ids):
            piece = self.reply_pieces[index] if index < len(self.reply_pieces) else ""
            drafted = index < len(self.reply_drafted) and self.reply_drafted[index]
            how = "accepted from a draft" if drafted else "decoded by the model"
            return f"reply token #{index}  id {self.reply_ids[index]}  {piece!r}  ({how})"
        return None

    def viewportEvent(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ToolTip and isinstance(event, QHelpEvent):
            text = self.tooltip_at(event.pos())
            if text is not None:
                QToolTip.showText(event.globalPos(), text, self)
            else:
                QToolTip.hideText()
            return True
        return super().viewportEvent(event)


def _token_link(href: str, piece: str, color: str) -> str:
    text = html.escape(piece).replace("\n", "↵<br>").replace(" ", "&nbsp;") or "∅"
    return f'<a href="{href}" style="background-color:{color}; text-decoration:none; color:inherit;">{text}</a>'
