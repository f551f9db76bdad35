"""How the sidebar paints a search hit: rich text, the matched words marked (``app.gui.sidebar``
installs it with its first search; the first frame shows no hit and does not import it)."""

from __future__ import annotations

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, QSize
from PySide6.QtGui import QPainter, QPalette, QTextDocument
from PySide6.QtWidgets import QApplication, QListWidget, QStyle, QStyledItemDelegate, QStyleOptionViewItem, QWidget


class HitDelegate(QStyledItemDelegate):
    """Paints a search hit as rich text (the title, the snippet with its matched words marked); other
    items as usual. The item's plain text stays what assistive technology reads.

    Args:
        role: the item data role that holds a hit's markup (items without it paint as usual).
        parent: the list.
    """

    def __init__(self, role: int, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._role = role

    def _document(self, option: QStyleOptionViewItem, markup: str) -> QTextDocument:
        doc = QTextDocument()
        doc.setDefaultFont(option.font)
        doc.setDocumentMargin(6)
        doc.setDefaultStyleSheet(f"body {{ color: {option.palette.color(QPalette.ColorRole.Text).name()}; }}")
        doc.setHtml(f"<body>{markup}</body>")
        doc.setTextWidth(max(option.rect.width(), 120))
        return doc

    def paint(
        self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex
    ) -> None:
        markup = index.data(self._role)
        if not markup:
            super().paint(painter, option, index)
            return
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        opt.text = ""
        widget = opt.widget
        style = widget.style() if widget is not None else QApplication.style()
        style.drawControl(QStyle.ControlElement.CE_ItemViewItem, opt, painter, widget)
        doc = self._document(option, str(markup))
        painter.save()
        painter.translate(option.rect.topLeft())
        painter.setClipRect(0, 0, option.rect.width(), option.rect.height())
        doc.drawContents(painter)
        painter.restore()

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex) -> QSize:
        markup = index.data(self._role)
        if not markup:
            return super().sizeHint(option, index)
        width = option.widget.viewport().width() if isinstance(option.widget, QListWidget) else option.rect.width()
        opt = QStyleOptionViewItem(option)
        opt.rect.setWidth(max(width - 12, 120))
        doc = self._document(opt, str(markup))
        return QSize(int(doc.idealWidth()), int(doc.size().height()) + 2)
