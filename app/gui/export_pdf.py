"""Export to PDF: the HTML export laid out by Qt's text engine onto A4 pages.

Qt only (QtGui: ``QTextDocument`` and ``QPdfWriter``, no print-support module). Exports run on a
worker thread; the layout runs in a short-lived ``QThread`` of its own, because Qt's text layout
starts timers, which need a thread Qt started (a pool thread has no event dispatcher). The text
stays text in the PDF: searchable and copyable.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QMarginsF, QThread
from PySide6.QtGui import QPageLayout, QPageSize, QPdfWriter, QTextDocument


def write_pdf(path: Path, page_html: str, title: str) -> None:
    """Lays out ``page_html`` on A4 pages with 15 mm margins and writes the PDF to ``path``.

    Call it from any thread but the GUI thread's event handlers (it waits for the layout).

    Raises:
        OSError: the file could not be written.
    """
    job = _PdfJob(path, page_html, title)
    job.start()
    job.wait()
    if job.error is not None:
        raise OSError(f"{path}: the PDF could not be written ({job.error})")
    if not path.is_file() or path.stat().st_size == 0:
        raise OSError(f"{path}: the PDF could not be written")


class _PdfJob(QThread):
    def __init__(self, path: Path, page_html: str, title: str) -> None:
        super().__init__()
        self.path, self.page_html, self.title = path, page_html, title
        self.error: str | None = None

    def run(self) -> None:
        try:
            writer = QPdfWriter(str(self.path))
            writer.setTitle(self.title)
            writer.setCreator("Glassbox")
            writer.setResolution(96)
            writer.setPageLayout(
                QPageLayout(QPageSize(QPageSize.PageSizeId.A4), QPageLayout.Orientation.Portrait,
                            QMarginsF(15, 15, 15, 15), QPageLayout.Unit.Millimeter)
            )  # fmt: skip
            document = QTextDocument()
            document.setHtml(self.page_html)
            document.print_(writer)
            del document, writer  # the writer closes the file when it goes
        except Exception as exc:  # noqa: BLE001 - reported to the caller's thread as text
            self.error = " ".join(str(exc).split()) or type(exc).__name__
