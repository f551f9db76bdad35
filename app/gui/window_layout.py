"""What keeps the main window on the screen: the first size, restoring a saved one, labels that
never widen the window, and the chat page that gives way on a narrow window.

* The first window takes most of the screen's available geometry (never more), and a saved
  geometry is restored only if it fits the screen it would be on now.
* Status and error lines never set the window's width: :class:`ElidedLabel` elides one line (the
  full text is its tooltip), :func:`wrap_anywhere` lets a wrapped label break a long path or URL.
* :class:`ChatSplitter` asks only for the width of two of its three panels: when the window is too
  narrow for the chats, the conversation and the inspector together, the inspector collapses to its
  toggle, and when the user opens it there the chat list gives way. Nothing is ever cut.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from PySide6.QtCore import QByteArray, QPoint, QRect, QSize, Qt
from PySide6.QtGui import QGuiApplication, QResizeEvent, QScreen
from PySide6.QtWidgets import QLabel, QLayout, QLayoutItem, QSizePolicy, QSplitter, QWidget

from app.gui.display_text import plain_tooltip, shown, shown_lines

FIRST_SIZE = QSize(1320, 820)
"""The first window's size on a screen with room for it."""
SCREEN_MARGIN = 0.92
"""The share of the available geometry the first window may take on a smaller screen."""

_LONG_RUN = re.compile(r"\S{28,}")
_ZWSP = "\u200b"


def initial_geometry(available: QRect, wanted: QSize = FIRST_SIZE) -> QRect:
    """The first window's geometry: ``wanted``, shrunk to fit ``available``, centred in it.

    Args:
        available: the screen's available geometry (without panels and docks).
        wanted: the preferred size.
    """
    width = min(wanted.width(), int(available.width() * SCREEN_MARGIN))
    height = min(wanted.height(), int(available.height() * SCREEN_MARGIN))
    if available.width() <= wanted.width() or available.height() <= wanted.height():
        # A small screen: take all of it but a frame's margin, so nothing is below the edge.
        width = min(max(width, available.width() - 16), available.width())
        height = min(max(height, available.height() - 40), available.height())
    x = available.x() + (available.width() - width) // 2
    y = available.y() + (available.height() - height) // 2
    return QRect(x, y, width, height)


def geometry_fits(saved: QRect, available: QRect) -> bool:
    """Whether a saved window rectangle lies wholly inside a screen's available geometry."""
    return saved.isValid() and available.contains(saved)


def apply_first_geometry(window: QWidget) -> None:
    """Sizes a new window to its screen's available geometry (a small screen gets all of it)."""
    screen: QScreen | None = window.screen() or QGuiApplication.primaryScreen()
    if screen is None:  # no screen at all (some offscreen setups): the plain first size
        window.resize(FIRST_SIZE)
        return
    window.setGeometry(initial_geometry(screen.availableGeometry()))


def restore_geometry(window: QWidget, saved: object) -> None:
    """Restores a saved geometry only where it fits a screen as it is now, else keeps the window's
    size (a window saved on a big monitor must not open past the edge of a laptop's screen).

    Args:
        window: the top-level window.
        saved: what ``saveGeometry`` gave (anything else is ignored).
    """
    if not isinstance(saved, QByteArray):
        return
    first = window.geometry()
    if window.restoreGeometry(saved) and not fits_a_screen(window):
        window.setWindowState(Qt.WindowState.WindowNoState)
        window.setGeometry(first)


def fits_a_screen(window: QWidget) -> bool:
    """Whether the window is maximized, full screen, or wholly inside one screen's available area."""
    if window.isMaximized() or window.isFullScreen():
        return True
    frame = window.frameGeometry()
    return any(geometry_fits(frame, screen.availableGeometry()) for screen in QGuiApplication.screens())


def wrap_anywhere(text: str) -> str:
    """``text`` with zero-width spaces in runs of 28+ characters without a space (paths, URLs), so
    a word-wrapped label can break them instead of widening to the longest one."""

    def breakable(match: re.Match[str]) -> str:
        run = match.group(0)
        out: list[str] = []
        since = 0
        for char in run:
            out.append(char)
            since += 1
            if char in "/\\-_.,:;?&=" or since >= 20:
                out.append(_ZWSP)
                since = 0
        return "".join(out)

    return _LONG_RUN.sub(breakable, text)


def make_wrapping(label: QLabel) -> QLabel:
    """Makes ``label`` wrap and never set its layout's minimum width (use :func:`set_wrapped_text`)."""
    label.setWordWrap(True)
    label.setMinimumWidth(0)
    policy = label.sizePolicy()
    policy.setHorizontalPolicy(QSizePolicy.Policy.Ignored)
    policy.setHeightForWidth(True)
    label.setSizePolicy(policy)
    return label


def set_wrapped_text(label: QLabel, text: str) -> None:
    """Shows plain ``text`` in a wrapping label, breakable anywhere; the tooltip keeps it whole.
    Characters that do not print as themselves (a name's ESC or U+202E) are shown escaped."""
    text = shown_lines(text)
    label.setTextFormat(Qt.TextFormat.PlainText)
    # QLabel's own setText: the text is shown already, and the break points are zero-width spaces
    # (a plain label would show them escaped).
    QLabel.setText(label, wrap_anywhere(text))
    label.setToolTip(plain_tooltip(text) if len(text) > 80 else "")


def chain_focus(widgets: Iterable[QWidget]) -> None:
    """Makes Tab go through ``widgets`` in this order (each right after the one before)."""
    previous: QWidget | None = None
    for widget in widgets:
        if previous is not None:
            QWidget.setTabOrder(previous, widget)
        previous = widget


class ElidedLabel(QLabel):
    """A one-line plain-text label that elides what does not fit, with the whole text as tooltip.

    Its minimum width is small, so a long status never widens the window; it asks for its full
    width when there is room.

    Args:
        text: the first text.
        min_chars: about how many characters it keeps at its minimum width.
        max_chars: at most about this many characters wide when there is room (None: the whole
            text), so that in a wrapping row a long status elides before it pushes buttons down.
    """

    def __init__(
        self, text: str = "", parent: QWidget | None = None, min_chars: int = 8, max_chars: int | None = None
    ) -> None:
        super().__init__(parent)
        self._full = ""
        self._min_chars = min_chars
        self._max_chars = max_chars
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.setText(text)

    def setText(self, text: str) -> None:
        self._full = shown(" ".join(str(text).split()) if "\n" in str(text) else str(text))
        self.setAccessibleDescription(self._full)
        self.updateGeometry()
        self._elide()

    def text(self) -> str:
        """The whole text (what is shown may be elided)."""
        return self._full

    def shown_text(self) -> str:
        """What the label shows now."""
        return super().text()

    def sizeHint(self) -> QSize:
        metrics = self.fontMetrics()
        margins = self.contentsMargins()
        extra = margins.left() + margins.right() + 2
        width = metrics.horizontalAdvance(self._full) + extra
        if self._max_chars is not None:
            width = min(width, metrics.averageCharWidth() * self._max_chars + extra)
        return QSize(width, super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:
        metrics = self.fontMetrics()
        width = min(self.sizeHint().width(), metrics.averageCharWidth() * self._min_chars)
        return QSize(width, super().minimumSizeHint().height())

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        width = max(self.contentsRect().width(), 0)
        elided = self.fontMetrics().elidedText(self._full, Qt.TextElideMode.ElideRight, width)
        super().setText(elided)
        self.setToolTip(plain_tooltip(self._full) if elided != self._full else "")


class FlowLayout(QLayout):
    """Lays its items out left to right and starts a new line when the next one does not fit: a
    header row that wraps instead of widening the window or cutting a button.

    Each item gets its size hint (never wider than the line); an item that can be narrower (an
    eliding label or button: its minimum width is below its hint) gives up room first, down to its
    minimum, so a long status or switch text elides before it pushes the next item onto a line of
    its own. Items are centred vertically in their line. The minimum width is that of the widest
    item.

    Args:
        parent: the widget it lays out (or None).
        spacing: pixels between items and between lines.
    """

    def __init__(self, parent: QWidget | None = None, spacing: int = 6) -> None:
        super().__init__(parent)
        self._items: list[QLayoutItem] = []
        self.setSpacing(spacing)
        self.setContentsMargins(0, 0, 0, 0)

    def addItem(self, item: QLayoutItem) -> None:
        self._items.append(item)

    def count(self) -> int:
        return len(self._items)

    def itemAt(self, index: int) -> QLayoutItem | None:
        return self._items[index] if 0 <= index < len(self._items) else None

    def takeAt(self, index: int) -> QLayoutItem | None:
        return self._items.pop(index) if 0 <= index < len(self._items) else None

    def expandingDirections(self) -> Qt.Orientation:
        return Qt.Orientation(0)

    def hasHeightForWidth(self) -> bool:
        return True

    def heightForWidth(self, width: int) -> int:
        return self._arrange(QRect(0, 0, width, 0), apply=False)

    def setGeometry(self, rect: QRect) -> None:
        super().setGeometry(rect)
        self._arrange(rect, apply=True)

    def sizeHint(self) -> QSize:
        visible = [item for item in self._items if not item.isEmpty()]
        width = sum(item.sizeHint().width() for item in visible) + self.spacing() * max(len(visible) - 1, 0)
        height = max((item.sizeHint().height() for item in visible), default=0)
        margins = self.contentsMargins()
        return QSize(width + margins.left() + margins.right(), height + margins.top() + margins.bottom())

    def minimumSize(self) -> QSize:
        size = QSize()
        for item in self._items:
            if not item.isEmpty():
                size = size.expandedTo(item.minimumSize())
        margins = self.contentsMargins()
        return size + QSize(margins.left() + margins.right(), margins.top() + margins.bottom())

    @staticmethod
    def _fit_line(line: list[tuple[QLayoutItem, QSize]], room: int, spacing: int) -> list[tuple[QLayoutItem, QSize]]:
        """The line's items at their hints where they fit; where not, the widest items that can
        shrink give up room first (down to a common width, never below their minimums), so a
        long text elides and a short one ("● Loaded") stays whole."""
        gaps = spacing * max(len(line) - 1, 0)
        if sum(size.width() for _item, size in line) + gaps <= room:
            return line
        least = [min(item.minimumSize().width(), size.width()) for item, size in line]

        def total(cap: int) -> int:
            return sum(max(low, min(size.width(), cap)) for low, (_item, size) in zip(least, line, strict=True))

        low, high = 0, max(size.width() for _item, size in line)
        while low < high:  # the widest cap at which the line fits
            cap = (low + high + 1) // 2
            if total(cap) + gaps <= room:
                low = cap
            else:
                high = cap - 1
        return [
            (item, QSize(max(floor, min(size.width(), low)), size.height()))
            for floor, (item, size) in zip(least, line, strict=True)
        ]

    def _arrange(self, rect: QRect, apply: bool) -> int:
        margins = self.contentsMargins()
        area = rect.adjusted(margins.left(), margins.top(), -margins.right(), -margins.bottom())
        spacing = self.spacing()
        lines: list[list[tuple[QLayoutItem, QSize]]] = [[]]
        x = 0  # the line's width with every item at its smallest
        for item in self._items:
            if item.isEmpty():
                continue
            hint = item.sizeHint()
            least = min(max(item.minimumSize().width(), 0), hint.width())
            size = QSize(max(min(hint.width(), area.width()), least), hint.height())
            if lines[-1] and x + least > area.width():
                lines.append([])
                x = 0
            lines[-1].append((item, size))
            x += least + spacing
        lines = [self._fit_line(line, area.width(), spacing) for line in lines]
        y = area.y()
        for line in lines:
            height = max((size.height() for _item, size in line), default=0)
            if apply:
                left = area.x()
                for item, size in line:
                    item.setGeometry(QRect(QPoint(left, y + (height - size.height()) // 2), size))
                    left += size.width() + spacing
            y += height + spacing
        used = y - spacing - area.y() if any(lines) else 0
        return used + margins.top() + margins.bottom()


class ChatSplitter(QSplitter):
    """The chat page's splitter (chats | conversation | inspector) that gives way when narrow.

    Its minimum width is that of the conversation and the wider side panel, not of all three.
    When its width cannot hold the three, it is *narrow*: ``on_narrow_changed(True)`` is called
    (the window collapses the inspector to its toggle), and while narrow the chat list hides
    whenever the inspector shows.

    Args:
        on_narrow_changed: called with the new narrow state when it changes.
    """

    def __init__(self, on_narrow_changed: Callable[[bool], None] | None = None) -> None:
        super().__init__(Qt.Orientation.Horizontal)
        self.narrow = False
        self._on_narrow_changed = on_narrow_changed

    def _panels(self) -> list[QWidget]:
        return [w for i in range(self.count()) if (w := self.widget(i)) is not None]

    def full_width(self) -> int:
        """The width the three panels need side by side."""
        panels = self._panels()
        handles = self.handleWidth() * max(len(panels) - 1, 0)
        return sum(_min_width(w) for w in panels) + handles

    def minimumSizeHint(self) -> QSize:
        hint = super().minimumSizeHint()
        panels = self._panels()
        if len(panels) < 3:
            return hint
        side, center, inspector = panels[0], panels[1], panels[2]
        width = _min_width(center) + max(_min_width(side), _min_width(inspector)) + self.handleWidth()
        return QSize(width, hint.height())

    def resizeEvent(self, event: QResizeEvent) -> None:
        self.update_narrow(event.size().width())
        super().resizeEvent(event)

    def update_narrow(self, width: int | None = None) -> None:
        """Re-decides the narrow state for ``width`` (default: the current width)."""
        width = self.width() if width is None else width
        narrow = width < self.full_width()
        if narrow != self.narrow:
            self.narrow = narrow
            if self._on_narrow_changed is not None:
                self._on_narrow_changed(narrow)


def _min_width(widget: QWidget) -> int:
    return max(widget.minimumWidth(), widget.minimumSizeHint().width())
