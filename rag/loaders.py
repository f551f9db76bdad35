"""Turn one document file into text sections: format detection by content, then a parser per format.

Everything here runs in-process and trusts nothing about the file: callers that handle untrusted
documents run :func:`load_document` in a killable child (``rag.parsing``). Every failure is a
:class:`~rag.errors.DocumentError` whose reason starts with ``"skipped: "``.

Contract: ARCHITECTURE.md, 'rag.loaders'.
"""

from __future__ import annotations

import csv
import io
import json
import re
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from rag.detect import detect_kind, not_regular, open_error
from rag.errors import DocumentError
from rag.markup import Block, html_sections, markdown_sections, rst_sections
from rag.pdf_loader import load_pdf
from rag.sections import ParsedDocument, SectionBuilder
from rag.text_files import paragraphs, read_text
from rag.zip_formats import load_docx, load_epub

__all__ = ["CSV_SECTION_CHARS", "check_size", "load_document"]

MB = 2**20
# Rows of a CSV file are grouped into sections of about this many characters (header repeated).
CSV_SECTION_CHARS = 600
_PARSER_BUGS = (ValueError, TypeError, KeyError, IndexError, AttributeError, AssertionError, LookupError,
                RecursionError, EOFError, OverflowError, ZeroDivisionError)  # fmt: skip
_DEF_LINE = re.compile(
    r"^\s*(?:export\s+|pub(?:\(\w+\))?\s+|public\s+|private\s+|protected\s+|static\s+|async\s+|abstract\s+"
    r"|final\s+|default\s+)*(?:def|class|function|fn|func|struct|enum|impl|trait|interface|type|module"
    r"|namespace|object|record|sub|procedure|macro_rules!)\b"
)


def _load_text(path: Path, build: SectionBuilder) -> None:
    for para in paragraphs(read_text(path, build.max_chars)):
        build.add(para)


def _code_heading(block: str) -> str | None:
    for line in block.splitlines()[:8]:
        if _DEF_LINE.match(line):
            return line.strip().rstrip("{:").strip()[:100]
    return None


def _load_code(path: Path, build: SectionBuilder) -> None:
    """Split source code into top-level blocks: a new block starts at an unindented line after a blank."""
    block: list[str] = []
    blank_before = False

    def flush() -> None:
        text = "\n".join(block)
        build.add(text, "code", _code_heading(text))
        block.clear()

    for line in read_text(path, build.max_chars).split("\n"):
        starts_block = blank_before and line[:1] not in ("", " ", "\t", "}", ")", "]")
        if starts_block and block:
            flush()
        block.append(line.rstrip())
        blank_before = not line.strip()
    flush()


def _load_markup(path: Path, build: SectionBuilder, parse: Callable[[str], Iterable[Block]]) -> None:
    for kind, text, heading in parse(read_text(path, build.max_chars)):
        build.add(text, kind, heading)


def _load_csv(path: Path, build: SectionBuilder) -> None:
    text = read_text(path, build.max_chars)
    try:
        dialect: type[csv.Dialect] | csv.Dialect = csv.Sniffer().sniff(text[:4096], delimiters=",;\t|")
    except csv.Error:
        dialect = csv.excel_tab if path.suffix.lower() == ".tsv" else csv.excel
    try:
        cells = csv.reader(io.StringIO(text), dialect)
        rows = [line for line in (" | ".join(cell.strip() for cell in row) for row in cells) if line.strip(" |")]
    except csv.Error:  # e.g. a field over csv.field_size_limit(): still worth indexing as text
        for para in paragraphs(text):
            build.add(para)
        return
    if not rows:
        return
    header, size = rows[0], 0
    group: list[str] = []
    for row in rows[1:]:
        if group and size + len(row) > CSV_SECTION_CHARS:
            build.add("\n".join([header, *group]), "table")
            group, size = [], 0
        group.append(row)
        size += len(row) + 1
    build.add("\n".join([header, *group]), "table")


def _flatten_json(value: Any, prefix: str, out: list[str], depth: int = 0) -> None:
    if depth > 200:
        raise RecursionError
    if isinstance(value, dict):
        if not value:
            out.append(f"{prefix}: {{}}")
        for key, item in value.items():
            _flatten_json(item, f"{prefix}.{key}" if prefix else str(key), out, depth + 1)
    elif isinstance(value, list):
        if not value:
            out.append(f"{prefix}: []")
        for i, item in enumerate(value):
            _flatten_json(item, f"{prefix}[{i}]", out, depth + 1)
    else:
        shown = value if isinstance(value, str) else json.dumps(value)
        out.append(f"{prefix}: {shown}" if prefix else str(shown))


def _load_json(path: Path, build: SectionBuilder) -> None:
    """JSON as ``key.path[0]: value`` lines, one section per top-level key (or item); JSON Lines too."""
    text = read_text(path, build.max_chars)
    try:
        try:
            values: list[Any] = [json.loads(text)]
            lines_mode = False
        except json.JSONDecodeError:
            try:
                values = [json.loads(line) for line in text.splitlines() if line.strip()]
                lines_mode = True
            except json.JSONDecodeError:
                for para in paragraphs(text):  # not JSON after all: index it as plain text
                    build.add(para)
                return
        for n, value in enumerate(values, 1):
            items: Iterable[tuple[Any, Any]] = []
            if isinstance(value, dict):
                items = value.items()
            elif isinstance(value, list):
                items = enumerate(value)
            if not items:
                lines: list[str] = []
                _flatten_json(value, "", lines)
                build.add("\n".join(lines), "text", f"line {n}" if lines_mode else None)
                continue
            for key, item in items:
                name = f"[{key}]" if isinstance(key, int) else str(key)
                lines = []
                _flatten_json(item, name, lines)
                build.add("\n".join(lines), "text", f"line {n} > {name}" if lines_mode else name)
    except RecursionError as exc:
        raise DocumentError(path, "skipped: JSON nested too deeply") from exc


def load_document(path: Path, *, max_chars: int = 20_000_000, max_file_bytes: int | None = None) -> ParsedDocument:
    """Parse one document in this process.

    Untrusted files should go through :func:`rag.parsing.parse_document`, which runs this in a
    killable child process with time and memory limits.

    Args:
        path: The file.
        max_chars: The most characters of text accepted (the document is skipped beyond it).
        max_file_bytes: If given, files larger than this are skipped without being read.

    Returns:
        The parsed document, with at least one section.

    Raises:
        DocumentError: The file was skipped; ``reason`` starts with ``"skipped: "``.
    """
    path = Path(path)
    if max_file_bytes is not None:
        check_size(path, max_file_bytes)
    kind = detect_kind(path)
    build = SectionBuilder(path, max_chars)
    n_pages: int | None = None
    try:
        if kind == "pdf":
            n_pages = load_pdf(path, build)
        elif kind == "docx":
            load_docx(path, build)
        elif kind == "epub":
            load_epub(path, build)
        elif kind == "markdown":
            _load_markup(path, build, markdown_sections)
        elif kind == "rst":
            _load_markup(path, build, rst_sections)
        elif kind == "html":
            _load_markup(path, build, html_sections)
        elif kind == "code":
            _load_code(path, build)
        elif kind == "csv":
            _load_csv(path, build)
        elif kind == "json":
            _load_json(path, build)
        else:
            _load_text(path, build)
    except _PARSER_BUGS as exc:  # a parser tripping over odd input: skip the file, never a traceback
        reason = f"skipped: could not be parsed ({type(exc).__name__}: {exc})".split("\n")[0]
        raise DocumentError(path, reason) from exc
    return build.build(kind, n_pages)


def check_size(path: Path, max_file_bytes: int) -> int:
    """Return the file's size, or raise if it is missing, not a file, or over ``max_file_bytes``.

    Args:
        path: The file.
        max_file_bytes: The size limit.

    Returns:
        The size in bytes.

    Raises:
        DocumentError: The file is missing, unreadable, not a regular file, or too large.
    """
    try:
        st = path.stat()
    except OSError as exc:
        raise open_error(path, exc) from exc
    if not stat.S_ISREG(st.st_mode):
        raise not_regular(path, st.st_mode)
    if st.st_size > max_file_bytes:
        raise DocumentError(path, f"skipped: too large: {st.st_size / MB:,.1f} MB, limit {max_file_bytes / MB:,.0f} MB")
    return st.st_size
