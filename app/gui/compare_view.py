"""The inspector's comparison with the base model: the last reply's prompt decoded greedily with the
chat's LoRA adapters and without them (``engine.inference.base_compare``), the two replies one above
the other in token pieces, the tokens they share in grey, the first one where they part marked in
each, and every piece's probabilities on hover."""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING

from PySide6.QtCore import QEvent, QPoint
from PySide6.QtGui import QHelpEvent
from PySide6.QtWidgets import QTextBrowser, QToolTip, QWidget

from app.gui.display_text import plain_tooltip, rich
from engine.inference.base_compare import probability_text

if TYPE_CHECKING:
    from engine.inference.base_compare import BaseComparison, ComparedToken


class CompareView(QTextBrowser):
    """The two greedy replies of a :class:`BaseComparison`, token by token; hovering a piece shows
    its probability with the adapters and under the base model, and the alternatives there."""

    SHARED_LIGHT, SHARED_DARK = "#e5e7eb", "#3a3f47"
    ADAPTED_LIGHT, ADAPTED_DARK = "#fed7aa", "#7c3f12"  # the adapter's reply after the divergence
    BASE_LIGHT, BASE_DARK = "#bfdbfe", "#1e3a5f"  # the base's reply after it
    MARK_LIGHT, MARK_DARK = "#f97316", "#fb923c"  # the first token that differs (both sides)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.setAccessibleName("Comparison with the base model")
        self.comparison: BaseComparison | None = None
        self.dark = False

    def legend_html(self) -> str:
        """The tints, as rich text for the label under the view."""

        def swatch(color: str) -> str:
            return f'<span style="background-color:{color};">&nbsp;&nbsp;&nbsp;&nbsp;</span>'

        return (
            f"{swatch(self._color('SHARED'))} the same in both&nbsp;&nbsp; "
            f"{swatch(self._color('MARK'))} where they part&nbsp;&nbsp; "
            f"{swatch(self._color('ADAPTED'))} the adapter's after it&nbsp;&nbsp; "
            f"{swatch(self._color('BASE'))} the base's after it"
        )

    def set_comparison(self, comparison: BaseComparison | None) -> None:
        """Shows ``comparison`` (None: nothing)."""
        self.comparison = comparison
        self.rerender()
        self.setAccessibleDescription(comparison.summary() if comparison is not None else "")

    def rerender(self) -> None:
        """Draws what is shown again (after a theme change)."""
        c = self.comparison
        if c is None:
            self.clear()
            return
        d = c.divergence
        adapted_title = f"With the adapter ({rich(c.adapters)})" if c.adapters else "With the adapter (scale 0)"
        parts = [
            self._row("a", adapted_title, c.adapted, d, c.adapted_reason, self._color("ADAPTED")),
            self._row("b", "Base model", c.base, d, c.base_reason, self._color("BASE")),
        ]
        self.setHtml('<div style="font-family: monospace; line-height: 160%;">' + "<br>".join(parts) + "</div>")

    def _color(self, name: str) -> str:
        return str(getattr(self, f"{name}_{'DARK' if self.dark else 'LIGHT'}"))

    def _row(
        self, side: str, title: str, tokens: tuple[ComparedToken, ...], d: int | None, reason: str, after: str
    ) -> str:
        shared, mark = self._color("SHARED"), self._color("MARK")
        out = [f"<b>{title}</b> <i>({len(tokens)} tokens, {html.escape(reason)})</i><br>"]
        for i, token in enumerate(tokens):
            if d is None or i < d:
                out.append(_piece(f"{side}:{i}", token.text, shared))
            elif i == d:
                out.append(_piece(f"{side}:{i}", token.text, mark, marked=True))
            else:
                out.append(_piece(f"{side}:{i}", token.text, after))
        if d is not None and d == len(tokens):
            out.append(_piece(f"{side}:end", "⏹ end", mark, marked=True))
        return "".join(out)

    def tooltip_from_anchor(self, anchor: str) -> str | None:
        """What hovering a piece (``a:I`` the adapter's reply, ``b:I`` the base's) says."""
        c = self.comparison
        side, _, index_text = anchor.partition(":")
        if c is None or side not in ("a", "b"):
            return None
        tokens = c.adapted if side == "a" else c.base
        if index_text == "end":
            who = "the adapter's" if side == "a" else "the base's"
            return f"{who} reply ended here (token {len(tokens) + 1})"
        if not index_text.isdigit() or int(index_text) >= len(tokens):
            return None
        i = int(index_text)
        token = tokens[i]
        lines = [f"token {i + 1}  id {token.token_id}  {token.text!r}"]
        if side == "a" and i < len(c.base_logprobs):
            p, base = c.moved(i)
            lines.append(f"with the adapter p={probability_text(p)}   base p={probability_text(base)}")
        else:
            lines.append(f"{'with the adapter' if side == 'a' else 'base'} p={probability_text(token.p)}")
        if c.divergence is not None and i == c.divergence:
            lines.append("the first token where the two replies differ")
        if token.top:
            lines.append(
                "alternatives: " + ", ".join(f"{text!r} {probability_text(math.exp(lp))}" for text, lp in token.top)
            )
        return "\n".join(lines)

    def tooltip_at(self, pos: QPoint) -> str | None:
        """What hovering the piece under a viewport position says, or None."""
        return self.tooltip_from_anchor(self.anchorAt(pos))

    def viewportEvent(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ToolTip and isinstance(event, QHelpEvent):
            text = self.tooltip_at(event.pos())
            if text is not None:
                QToolTip.showText(event.globalPos(), plain_tooltip(text), self)
            else:
                QToolTip.hideText()
            return True
        return super().viewportEvent(event)


def _piece(href: str, piece: str, color: str, marked: bool = False) -> str:
    text = html.escape(piece).replace("\n", "↵<br>").replace(" ", "&nbsp;") or "∅"
    weight = " font-weight:bold; text-decoration:underline;" if marked else " text-decoration:none;"
    return f'<a href="{href}" style="background-color:{color};{weight} color:inherit;">{text}</a>'
