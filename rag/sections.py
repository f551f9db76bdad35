"""A parsed document: its sections with character spans, and the builder every loader fills.

Owns :class:`Section`, :class:`ParsedDocument` (its :meth:`~ParsedDocument.full_text` is the
section texts joined by :data:`SEPARATOR`, and each section's span indexes into it) and
:class:`SectionBuilder`, which assigns the spans and enforces the character cap. The loaders are
:mod:`rag.loaders` (entry point), :mod:`rag.zip_formats` and :mod:`rag.pdf_loader`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rag.errors import DocumentError
from rag.markup import SectionKind

__all__ = ["SEPARATOR", "ParsedDocument", "Section", "SectionBuilder"]

SEPARATOR = "\n\n"


@dataclass(frozen=True)
class Section:
    """A structural piece of a document.

    Attributes:
        text: The section's text (never empty).
        page: 1-based page number for paged formats (PDF), else None.
        heading: The nearest heading path, e.g. ``"Install > Linux"``, or None.
        kind: ``"text"``, ``"heading"``, ``"code"`` or ``"table"``.
        start: Offset of ``text`` in :meth:`ParsedDocument.full_text`.
        end: ``start + len(text)``.
    """

    text: str
    page: int | None
    heading: str | None
    kind: SectionKind
    start: int
    end: int


@dataclass(frozen=True)
class ParsedDocument:
    """A document as sections of text.

    Attributes:
        path: The file it came from.
        kind: The detected format (``"text"``, ``"markdown"``, ``"rst"``, ``"code"``, ``"csv"``,
            ``"json"``, ``"html"``, ``"pdf"``, ``"docx"`` or ``"epub"``).
        sections: Sections in document order, with spans into :meth:`full_text`.
        n_pages: Page count for PDFs, else None.
    """

    path: Path
    kind: str
    sections: list[Section]
    n_pages: int | None

    def full_text(self) -> str:
        """The whole text: section texts joined by blank lines; section spans index into it."""
        return SEPARATOR.join(section.text for section in self.sections)


class SectionBuilder:
    """Collects sections, assigns their spans and enforces the character cap."""

    def __init__(self, path: Path, max_chars: int) -> None:
        self.path = path
        self.max_chars = max_chars
        self.sections: list[Section] = []
        self._offset = 0

    def add(self, text: str, kind: SectionKind = "text", heading: str | None = None,
            page: int | None = None) -> None:  # fmt: skip
        """Adds one section (stripped; an empty one is dropped); raises DocumentError past the cap."""
        text = text.strip()
        if not text:
            return
        start = self._offset + (len(SEPARATOR) if self.sections else 0)
        end = start + len(text)
        if end > self.max_chars:
            raise DocumentError(self.path, f"skipped: too much text (over {self.max_chars:,} characters)")
        self.sections.append(Section(text, page, heading, kind, start, end))
        self._offset = end

    def build(self, kind: str, n_pages: int | None = None) -> ParsedDocument:
        """The document of the sections added; raises DocumentError when there are none."""
        if not self.sections:
            raise DocumentError(self.path, "skipped: empty (no text found)")
        return ParsedDocument(self.path, kind, self.sections, n_pages)
