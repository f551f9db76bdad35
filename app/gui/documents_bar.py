"""The chat header's documents control, and the overlay shown while files are dragged over the window.

:class:`DocumentsBarWidget` shows which knowledge bases the open chat uses ("Documents: notes,
manuals", elided to the room it gets; the whole list in its tooltip) and opens a menu with every knowledge base as a
check box (several at once), "Add files to this chat…" and "Manage knowledge bases…". It only
emits what the user chose; :class:`app.gui.documents_controller.DocumentsController` saves it with the chat.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from PySide6.QtCore import QEvent, QRect, QSize, Qt, Signal, Slot
from PySide6.QtGui import QAction, QColor, QPainter, QPaintEvent, QPen, QResizeEvent
from PySide6.QtWidgets import QHBoxLayout, QMenu, QPushButton, QSizePolicy, QWidget

from app.gui import display_text
from app.gui.display_text import plain_tooltip

#: The widest the button grows (its text elides beyond it), so the header never widens the window.
MAX_BUTTON_WIDTH = 240


def documents_name(paths: Sequence[Path]) -> str:
    """A name for a knowledge base made from dropped files: the one item's name (a folder's, or a
    file's), the shared folder of several files, else the first one's name and how many more.

    Args:
        paths: what was dropped, in order.
    """
    items = [Path(p) for p in paths]
    if not items:
        return "Documents"
    first = items[0]
    if len(items) == 1:
        return first.name or str(first)
    parents = {p.parent for p in items}
    if len(parents) == 1 and first.parent.name:
        return first.parent.name
    return f"{first.name} + {len(items) - 1} more"


def attached_text(names: Sequence[str], missing: Sequence[str] = ()) -> str:
    """What the button says: ``Documents: off``, ``Documents: notes``, ``Documents: a, b``;
    a knowledge base that no longer exists is ``gone (missing)``."""
    listed = [f"{name} (missing)" if name in missing else name for name in names]
    return f"Documents: {display_text.shown(', '.join(listed))}" if names else "Documents: off"


class _ElidingButton(QPushButton):
    """A push button whose text elides to the width it gets, so it never widens the header; it
    asks for its whole text (up to :data:`MAX_BUTTON_WIDTH`) when there is room."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self._full = text

    def set_full_text(self, text: str) -> None:
        self._full = text
        self.updateGeometry()
        self._elide()

    def full_text(self) -> str:
        """The whole text (what is shown may be elided)."""
        return self._full

    def _chrome(self) -> int:
        """The button's width beyond its text (padding, frame, the menu arrow), as the style draws
        it: measured from the plain button's own size hint, so a stylesheet's padding is counted."""
        shown = super().text()
        natural = super().sizeHint().width() - self.fontMetrics().horizontalAdvance(shown)
        return max(natural, 44 if self.menu() is not None else 24)

    def sizeHint(self) -> QSize:
        hint = super().sizeHint()
        width = self.fontMetrics().horizontalAdvance(self._full) + self._chrome()
        return QSize(min(width, MAX_BUTTON_WIDTH), hint.height())

    def minimumSizeHint(self) -> QSize:
        hint = super().minimumSizeHint()
        width = self.fontMetrics().horizontalAdvance("Documents…") + self._chrome()
        return QSize(min(width, self.sizeHint().width()), hint.height())

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._elide()

    def changeEvent(self, event: QEvent) -> None:
        # A stylesheet or theme changes the font and padding after the layout sized the button:
        # ask for the new size and elide again, else the text stays cut in a button with room.
        super().changeEvent(event)
        if event.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange):
            self.updateGeometry()
            self._elide()

    def _elide(self) -> None:
        room = max(self.width() - self._chrome(), 20)
        metrics = self.fontMetrics()
        # elidedText cuts a text whose advance equals the room exactly: the whole text fits there.
        fits = metrics.horizontalAdvance(self._full) <= room
        shown = self._full if fits else metrics.elidedText(self._full, Qt.TextElideMode.ElideRight, room)
        if shown != super().text():
            super().setText(shown)


class DocumentsBarWidget(QWidget):
    """The documents button of the chat header and its menu.

    Signals:
        attachments_changed(object): the tuple of knowledge-base names the user chose for this chat.
        add_files_requested(): "Add files to this chat…" was chosen.
        manage_requested(): "Manage knowledge bases…" was chosen (the Knowledge page).
        menu_opening(): the menu is about to show (a moment to refresh the list).
    """

    attachments_changed = Signal(object)
    add_files_requested = Signal()
    manage_requested = Signal()
    menu_opening = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.button = _ElidingButton(attached_text(()))
        self.button.setObjectName("documentsButton")
        self.button.setAccessibleName("Documents in this chat")
        self.button.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.button.setMaximumWidth(MAX_BUTTON_WIDTH)
        self.menu = QMenu(self.button)
        self.menu.setObjectName("documentsMenu")
        self.menu.aboutToShow.connect(self._on_menu_about_to_show)
        self.button.setMenu(self.menu)
        layout.addWidget(self.button)
        self.attached: tuple[str, ...] = ()
        self.available: tuple[str, ...] = ()
        self.listed = False  # the knowledge bases have been listed once: "missing" means something
        self.creating: set[str] = set()  # attached while being created: not missing
        self.enabled_for_chat = True
        self._rebuild()

    # ------------------------------------------------------------------ state
    def set_attached(self, names: Sequence[str]) -> None:
        """Shows the open chat's knowledge bases (no signal)."""
        self.attached = tuple(dict.fromkeys(names))
        self._rebuild()

    def set_available(self, names: Sequence[str]) -> None:
        """The knowledge bases that exist (from the knowledge adapter's list)."""
        self.available = tuple(names)
        self.listed = True
        self._rebuild()

    @property
    def missing(self) -> tuple[str, ...]:
        """The attached knowledge bases that no longer exist (the chat skips them)."""
        if not self.listed:
            return ()
        return tuple(name for name in self.attached if name not in self.available and name not in self.creating)

    def actions_by_name(self) -> dict[str, QAction]:
        """The check box of each knowledge base in the menu (tests and accessibility)."""
        return {str(a.data()): a for a in self.menu.actions() if a.isCheckable() and isinstance(a.data(), str)}

    def toggle(self, name: str, on: bool) -> None:
        """Attaches or detaches ``name`` as if its check box was clicked."""
        names = [n for n in self.attached if n != name]
        if on:
            names.append(name)
        if tuple(names) != self.attached:
            self.attached = tuple(names)
            # Only the button: the menu is rebuilt when it opens next (this may run inside the
            # toggled signal of one of its actions, which must not be deleted under it).
            self._update_button()
            self.attachments_changed.emit(self.attached)

    # ------------------------------------------------------------------ drawing the menu
    def _rebuild(self) -> None:
        self._update_button()
        self._rebuild_menu()

    def _update_button(self) -> None:
        missing = self.missing
        self.button.set_full_text(attached_text(self.attached, missing))
        if self.attached:
            tip = "This chat answers from: " + ", ".join(self.attached) + ". Click to change."
            if missing:
                tip += " No longer there (deleted), so skipped: " + ", ".join(missing) + ". Untick it in this menu."
        else:
            tip = "This chat uses no documents. Click to choose knowledge bases, or drop files on the window."
        self.button.setToolTip(plain_tooltip(tip))
        self.button.setAccessibleDescription(tip)

    def _rebuild_menu(self) -> None:
        self.menu.clear()
        title = self.menu.addAction("Use in this chat:")
        title.setEnabled(False)
        missing = [n for n in self.attached if n not in self.available]
        for name in (*self.available, *missing):
            label = name if name in self.available else f"{name} (missing)"
            action = self.menu.addAction(display_text.shown(label).replace("&", "&&"))
            action.setCheckable(True)
            action.setChecked(name in self.attached)
            action.setData(name)
            action.toggled.connect(lambda on, name=name: self.toggle(name, on))
        if not self.available and not missing:
            empty = self.menu.addAction("No knowledge bases yet")
            empty.setEnabled(False)
        self.menu.addSeparator()
        add = self.menu.addAction("Add files to this chat…")
        add.triggered.connect(self.add_files_requested)
        manage = self.menu.addAction("Manage knowledge bases…")
        manage.triggered.connect(self.manage_requested)

    @Slot()
    def _on_menu_about_to_show(self) -> None:
        self._rebuild_menu()
        self.menu_opening.emit()


class DropOverlayWidget(QWidget):
    """A translucent cover over the window while files are dragged over it, saying where they go.

    It lets mouse and drag events through to the window underneath.
    """

    def __init__(self, parent: QWidget) -> None:
        super().__init__(parent)
        self.setObjectName("dropOverlay")
        self.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents, True)
        self.setAttribute(Qt.WidgetAttribute.WA_NoSystemBackground, True)
        self.message = ""
        self.setVisible(False)

    def show_message(self, message: str) -> None:
        """Covers the parent and shows ``message``."""
        self.message = message
        self.setAccessibleName(message)
        parent = self.parentWidget()
        if parent is not None:
            self.setGeometry(parent.rect())
        self.raise_()
        self.setVisible(True)
        self.update()

    def paintEvent(self, event: QPaintEvent) -> None:
        del event  # the whole cover is repainted
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        accent = self.palette().highlight().color()
        fill = QColor(accent)
        fill.setAlpha(40)
        painter.fillRect(self.rect(), fill)
        pen = QPen(accent, 3, Qt.PenStyle.DashLine)
        painter.setPen(pen)
        painter.drawRoundedRect(self.rect().adjusted(12, 12, -12, -12), 12, 12)
        box = QRect(0, 0, min(self.width() - 80, 560), 72)
        box.moveCenter(self.rect().center())
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(self.palette().window())
        painter.drawRoundedRect(box, 10, 10)
        painter.setPen(self.palette().windowText().color())
        font = painter.font()
        font.setPointSizeF(font.pointSizeF() * 1.2)
        painter.setFont(font)
        flags = Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap
        painter.drawText(box.adjusted(12, 6, -12, -6), int(flags), self.message)
        painter.end()
