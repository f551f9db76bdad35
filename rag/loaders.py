"""Turn one document file into text sections: format detection by content, then a parser per format.

Everything here runs in-process and trusts nothing about the file: callers that handle untrusted
documents run :func:`load_document` in a killable child (``rag.parsing``). Every failure is a
:class:`~rag.errors.DocumentError` whose reason starts with ``"skipped: "``.

The document's full text is the concatenation of its section texts separated by ``"\\n\\n"``; each
:class:`Section` records its character span in it, so chunks and citations can point at exact text.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import os
import re
import stat
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

from rag.errors import DocumentError
from rag.markup import Block, SectionKind, html_sections, markdown_sections, rst_sections

SEPARATOR = "\n\n"
MB = 2**20

# Zip-based formats (DOCX, EPUB): limits checked on the central directory before any member is read.
ZIP_MAX_UNCOMPRESSED_BYTES = 256 * MB
ZIP_MAX_RATIO = 100
ZIP_MAX_MEMBERS = 10_000
# PDF: per-stream decompression limit handed to pypdf (its default is 75 MB).
PDF_MAX_STREAM_BYTES = 64 * MB
# Rows of a CSV file are grouped into sections of about this many characters (header repeated).
CSV_SECTION_CHARS = 600

_SNIFF_BYTES = 8192
_READ_BYTES = 1 << 20  # a multiple of _SNIFF_BYTES: the binary check looks at whole windows
_FINE_BYTES = 512  # window size when placing where binary content starts
_ZERO_WIDTH = dict.fromkeys(map(ord, "\x00\u200b\u2060\ufeff"))

_MARKDOWN_EXT = {".md", ".markdown", ".mdown", ".mkd", ".mdx"}
_RST_EXT = {".rst", ".rest"}
_CSV_EXT = {".csv", ".tsv"}
_JSON_EXT = {".json", ".jsonl", ".ndjson", ".geojson"}
_HTML_EXT = {".html", ".htm", ".xhtml"}
_CODE_EXT = {
    ".py", ".pyi", ".pyw", ".js", ".mjs", ".cjs", ".jsx", ".ts", ".tsx", ".c", ".h", ".cc", ".cpp", ".cxx",
    ".hpp", ".hh", ".hxx", ".java", ".kt", ".kts", ".scala", ".go", ".rs", ".rb", ".sh", ".bash", ".zsh",
    ".fish", ".ps1", ".bat", ".php", ".pl", ".pm", ".lua", ".r", ".jl", ".swift", ".m", ".mm", ".cs",
    ".fs", ".vb", ".sql", ".css", ".scss", ".less", ".vue", ".svelte", ".dart", ".ex", ".exs", ".erl",
    ".hs", ".ml", ".clj", ".el", ".toml", ".yaml", ".yml", ".ini", ".cfg", ".conf", ".xml", ".cmake",
    ".gradle", ".proto", ".tf", ".zig", ".nim", ".groovy", ".asm", ".s", ".f90", ".pas",
}  # fmt: skip
#: What a file picker offers, by kind: ``(label, extensions)``. The format is still detected by
#: content (:func:`detect_kind`), and any other text file is read as plain text.
FILE_TYPES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("PDF", (".pdf",)),
    ("Word", (".docx",)),
    ("EPUB", (".epub",)),
    ("Markdown", tuple(sorted(_MARKDOWN_EXT))),
    ("Text", (".txt", ".text", ".log")),
    ("reStructuredText", tuple(sorted(_RST_EXT))),
    ("HTML", tuple(sorted(_HTML_EXT))),
    ("CSV", tuple(sorted(_CSV_EXT))),
    ("JSON", tuple(sorted(_JSON_EXT))),
    ("Code", tuple(sorted(_CODE_EXT))),
)
_CODE_NAMES = {"makefile", "dockerfile", "cmakelists.txt", "gemfile", "rakefile", "jenkinsfile", "justfile"}
# Only magics that cannot start a text file; binaries with ASCII magics (GGUF, SQLite, MZ, RIFF, ...)
# are caught by their NUL and control bytes instead, so a note that starts with "GGUF" stays text.
_BINARY_MAGIC = (
    b"\x89PNG", b"\xff\xd8\xff", b"\x7fELF", b"\x1f\x8b", b"7z\xbc\xaf", b"\xfd7zXZ", b"\xca\xfe\xba\xbe",
    b"\xcf\xfa\xed\xfe", b"\xd0\xcf\x11\xe0", b"(\xb5/\xfd", b"\x00\x00\x01\x00",
)  # fmt: skip
_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"),
)  # fmt: skip
_PARSER_BUGS = (ValueError, TypeError, KeyError, IndexError, AttributeError, AssertionError, LookupError,
                RecursionError, EOFError, OverflowError, ZeroDivisionError)  # fmt: skip
_TIE_TO_CP1252 = {"cp1250", "iso8859_2", "mac_latin2", "cp1257", "iso8859_4", "iso8859_10", "iso8859_13"}
_CONTROL_BYTES = frozenset(range(32)) - {9, 10, 12, 13, 27} | {127}
_NOT_CONTROL = bytes(b for b in range(256) if b not in _CONTROL_BYTES)  # deleted to count control bytes
_CONTROL_RE = re.compile(b"[" + re.escape(bytes(sorted(_CONTROL_BYTES))) + b"]")
_CONTROL_CHARS = re.compile("[" + re.escape("".join(map(chr, sorted(_CONTROL_BYTES)))) + "]")
_DEF_LINE = re.compile(
    r"^\s*(?:export\s+|pub(?:\(\w+\))?\s+|public\s+|private\s+|protected\s+|static\s+|async\s+|abstract\s+"
    r"|final\s+|default\s+)*(?:def|class|function|fn|func|struct|enum|impl|trait|interface|type|module"
    r"|namespace|object|record|sub|procedure|macro_rules!)\b"
)


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


class _Builder:
    """Collects sections, assigns their spans and enforces the character cap."""

    def __init__(self, path: Path, max_chars: int) -> None:
        self.path = path
        self.max_chars = max_chars
        self.sections: list[Section] = []
        self._offset = 0

    def add(self, text: str, kind: SectionKind = "text", heading: str | None = None,
            page: int | None = None) -> None:  # fmt: skip
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
        if not self.sections:
            raise DocumentError(self.path, "skipped: empty (no text found)")
        return ParsedDocument(self.path, kind, self.sections, n_pages)


# ---------------------------------------------------------------------------------------- detection


def _open_error(path: Path, exc: OSError) -> DocumentError:
    """Map an OS error on opening or reading ``path`` to a one-line DocumentError."""
    if isinstance(exc, FileNotFoundError):
        return DocumentError(path, "skipped: file not found (moved or deleted?)")
    if isinstance(exc, PermissionError):
        return DocumentError(path, "skipped: permission denied")
    if isinstance(exc, IsADirectoryError):
        return DocumentError(path, "skipped: not a regular file")
    return DocumentError(path, f"skipped: cannot read the file ({exc.strerror or exc})")


def file_type(mode: int) -> str:
    """What a non-regular file is, for a reason: ``"a named pipe (FIFO)"``, ``"a socket"``, ...

    Args:
        mode: ``st_mode`` from ``os.stat`` or ``os.lstat``.
    """
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device file"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "a special file"


def not_regular(path: Path, mode: int) -> DocumentError:
    """The skip for a path that is no regular file (a folder keeps the plain reason)."""
    if stat.S_ISDIR(mode):
        return DocumentError(path, "skipped: not a regular file")
    return DocumentError(path, f"skipped: not a regular file: {file_type(mode)}")


def open_regular(path: Path) -> IO[bytes]:
    """Open a regular file for reading, refusing FIFOs, sockets and devices before opening them.

    The type is checked with ``stat`` first, so opening does not block on a named pipe nor touch a
    device, and again on the open file, in case the path was swapped for a folder or device in
    between (a swap for a FIFO in that instant could still block; callers in the parser child are
    under its timeout).

    Args:
        path: The file.

    Returns:
        The file, open in binary mode.

    Raises:
        DocumentError: The file is missing, unreadable or not a regular file.
    """
    try:
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode):
            raise not_regular(path, mode)
        fh = path.open("rb")
    except OSError as exc:
        raise _open_error(path, exc) from exc
    try:
        mode = os.fstat(fh.fileno()).st_mode
    except OSError as exc:
        fh.close()
        raise _open_error(path, exc) from exc
    if not stat.S_ISREG(mode):
        fh.close()
        raise not_regular(path, mode)
    return fh


def _read_head(path: Path) -> bytes:
    with open_regular(path) as fh:
        try:
            return fh.read(_SNIFF_BYTES)
        except OSError as exc:
            raise _open_error(path, exc) from exc


def _zip_kind(path: Path) -> str:
    try:
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
            if (
                "mimetype" in names
                and zf.getinfo("mimetype").file_size < 100
                and zf.read("mimetype").strip() == b"application/epub+zip"
            ):
                return "epub"
            if "[Content_Types].xml" in names and any(n.startswith("word/") for n in names):
                return "docx"
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as exc:
        raise DocumentError(path, f"skipped: corrupt or unsupported archive ({exc})") from exc
    except OSError as exc:
        raise _open_error(path, exc) from exc
    raise DocumentError(path, "skipped: unsupported file type (a zip archive that is not DOCX or EPUB)")


def _looks_utf16(sample: bytes) -> str | None:
    """Return ``"utf-16-le"``/``"utf-16-be"`` if ``sample`` is BOM-less UTF-16 text, else None."""
    if len(sample) < 4:
        return None
    even, odd = sample[0::2], sample[1::2]
    for zeros, codec in ((odd, "utf-16-le"), (even, "utf-16-be")):
        if zeros.count(0) >= 0.4 * len(zeros) and (even if zeros is odd else odd).count(0) == 0:
            text = sample[: len(sample) // 2 * 2].decode(codec, errors="replace")
            printable = sum(ch.isprintable() or ch in "\t\r\n" for ch in text)
            if printable >= 0.95 * len(text):
                return codec
    return None


def sniff_encoding(sample: bytes) -> str | None:
    """Guess the text encoding of ``sample`` (the start of a file), or None if it looks binary.

    Args:
        sample: The first few KB of the file.

    Returns:
        A Python codec name, or None for binary content.
    """
    for bom, codec in _BOMS:
        if sample.startswith(bom):
            return codec
    nuls = sample.count(0)
    if nuls:
        utf16 = _looks_utf16(sample)
        if utf16 is not None or nuls > max(1, len(sample) // 200):
            return utf16
        sample = sample.replace(b"\x00", b"")  # a stray NUL in text (I7) is dropped when reading
    if sample and sum(b in _CONTROL_BYTES for b in sample) > 0.05 * len(sample):
        return None
    decoded = codecs.getincrementaldecoder("utf-8")(errors="replace").decode(sample, final=False)
    bad = decoded.count("\ufffd")
    if bad == 0 or sum(ch > "\x7f" for ch in decoded) - bad >= bad:
        return "utf-8"  # valid, or mostly valid UTF-8 with a few broken bytes (those become U+FFFD)
    from charset_normalizer import from_bytes

    matches = list(from_bytes(sample))
    if not matches:
        return "cp1252"
    best = matches[0]
    # Short Western European text often ties between cp1250 (Central European) and cp1252, and
    # charset-normalizer lists cp1250 first; on a tie the more common cp1252 reads è, à, ñ correctly.
    tie = any(m.encoding == "cp1252" and m.chaos <= best.chaos for m in matches)
    if best.encoding in _TIE_TO_CP1252 and tie:
        return "cp1252"
    return str(best.encoding)


def detect_kind(path: Path) -> str:
    """Detect a document's format, by content first and by extension second.

    Args:
        path: The file.

    Returns:
        One of ``"text"``, ``"markdown"``, ``"rst"``, ``"code"``, ``"csv"``, ``"json"``, ``"html"``,
        ``"pdf"``, ``"docx"``, ``"epub"``.

    Raises:
        DocumentError: The file is binary, an unsupported archive, missing or unreadable.
    """
    head = _read_head(path)
    pdf_at = head.find(b"%PDF-", 0, 1024)  # the spec allows junk before the header; text may quote it
    if pdf_at == 0 or (pdf_at > 0 and path.suffix.lower() == ".pdf"):
        return "pdf"
    if head.startswith(b"PK\x03\x04"):
        return _zip_kind(path)
    if head.startswith(_BINARY_MAGIC) or (head and sniff_encoding(head) is None):
        raise DocumentError(path, "skipped: binary file (unsupported file type)")
    ext, name = path.suffix.lower(), path.name.lower()
    for exts, kind in ((_MARKDOWN_EXT, "markdown"), (_RST_EXT, "rst"), (_CSV_EXT, "csv"),
                       (_JSON_EXT, "json"), (_HTML_EXT, "html"), (_CODE_EXT, "code")):  # fmt: skip
        if ext in exts:
            return kind
    if name in _CODE_NAMES:
        return "code"
    start = head.lstrip()[:64].lower()
    if start.startswith((b"<!doctype html", b"<html")):
        return "html"
    return "text"


# ---------------------------------------------------------------------------------------- text files


def _looks_binary(nuls: int, controls: int, size: int) -> bool:
    """The measure of :func:`sniff_encoding`: more than one NUL in 200 bytes (or characters), or more
    than 5% other control bytes among those that are not NUL."""
    return nuls > max(1, size // 200) or controls > 0.05 * (size - nuls)


def _scan_codec(encoding: str, head: bytes) -> str:
    """The codec :func:`_binary_at` decodes windows with: UTF-16 and UTF-32 with their byte order
    made explicit (a window after the first has no BOM), else the normalised codec name."""
    name = codecs.lookup(encoding).name
    if name in ("utf-16", "utf-32"):
        little = head.startswith(codecs.BOM_UTF32_LE if name == "utf-32" else codecs.BOM_UTF16_LE)
        return name + ("-le" if little else "-be")
    return name


def _binary_at(window: bytes, codec: str, *, first: bool, full: int = _SNIFF_BYTES) -> int | None:
    """Where binary content starts in ``window`` (a byte offset into it), or None when it reads as text.

    Binary is what :func:`sniff_encoding` calls binary (NULs and control bytes; in UTF-16 and UTF-32
    the decoded characters are counted, as NUL bytes are normal there) and, in a UTF-8 file, more
    than 30% of bytes that are no UTF-8. A window after the first is judged as a whole one of
    ``full`` bytes even when shorter (the end of the file), so a few odd bytes at the end of a text
    file do not make it binary.
    """
    size = len(window) if first else max(len(window), full)
    if codec.startswith(("utf-16", "utf-32")):
        unit = 2 if codec.startswith("utf-16") else 4
        text = window.decode(codec, errors="replace")
        nuls = text.count("\x00")
        if not _looks_binary(nuls, len(_CONTROL_CHARS.findall(text)) - nuls, size // unit):
            return None
        char = _CONTROL_CHARS.search(text)
        return char.start() * unit if char is not None else 0
    nuls = window.count(0)
    if _looks_binary(nuls, len(window.translate(None, _NOT_CONTROL)) - nuls, size):
        byte = _CONTROL_RE.search(window)
        return byte.start() if byte is not None else 0
    if codec.startswith("utf-8"):
        invalid = len(window) - len(window.decode("utf-8", errors="ignore").encode("utf-8"))
        if invalid > 0.3 * size:
            try:
                window.decode("utf-8")
            except UnicodeDecodeError as exc:
                return exc.start
    return None


def _binary_start(near: bytes, codec: str) -> int | None:
    """Where binary content starts in ``near`` (a binary window and the text window before it), to
    the nearest of a few hundred bytes: the first small window of it that reads as binary."""
    for start in range(0, len(near), _FINE_BYTES):
        at = _binary_at(near[start : start + _FINE_BYTES], codec, first=False, full=_FINE_BYTES)
        if at is not None:
            return start + at
    return None


def read_text(path: Path, max_chars: int) -> str:
    """Read a text file whatever its encoding, in bounded steps, never past ``max_chars``.

    The encoding comes from a BOM, else UTF-8, else charset-normalizer; undecodable bytes become
    U+FFFD; NUL and zero-width characters are dropped; newlines are normalised to ``"\\n"``.
    The whole file is checked for binary content, window by window, not only its start: a file that
    turns into binary after some text is skipped rather than indexed as junk (a stray NUL or control
    byte in text is fine).

    Args:
        path: The file.
        max_chars: The most characters accepted.

    Returns:
        The decoded text.

    Raises:
        DocumentError: The file is unreadable, not a regular file, holds binary content after its
            text, or holds more than ``max_chars`` characters.
    """
    with open_regular(path) as fh:
        try:
            head = fh.read(_SNIFF_BYTES)
            fh.seek(0)
        except OSError as exc:
            raise _open_error(path, exc) from exc
        encoding = sniff_encoding(head) or "utf-8"
        scan = _scan_codec(encoding, head)
        decoder = io.IncrementalNewlineDecoder(codecs.getincrementaldecoder(encoding)(errors="replace"), True)
        parts: list[str] = []
        total = offset = 0
        before = b""  # the last window read as text, to place the start of binary content closely
        while True:
            try:
                block = fh.read(_READ_BYTES)
            except OSError as exc:
                raise _open_error(path, exc) from exc
            for start in range(0, len(block), _SNIFF_BYTES):
                window = block[start : start + _SNIFF_BYTES]
                at = _binary_at(window, scan, first=not offset + start)
                if at is not None:
                    near = _binary_start(before + window, scan)
                    at = offset + start + at if near is None else offset + start - len(before) + near
                    raise DocumentError(path, f"skipped: binary content after byte {at:,}")
                before = window
            offset += len(block)
            part = decoder.decode(block, final=not block)
            part = part.translate(_ZERO_WIDTH)
            total += len(part)
            if total > max_chars:
                raise DocumentError(path, f"skipped: too much text (over {max_chars:,} characters)")
            parts.append(part)
            if not block:
                break
    return "".join(parts)


def _paragraphs(text: str) -> Iterator[str]:
    yield from re.split(r"\n[ \t]*\n", text)


def _load_text(path: Path, build: _Builder) -> None:
    for para in _paragraphs(read_text(path, build.max_chars)):
        build.add(para)


def _code_heading(block: str) -> str | None:
    for line in block.splitlines()[:8]:
        if _DEF_LINE.match(line):
            return line.strip().rstrip("{:").strip()[:100]
    return None


def _load_code(path: Path, build: _Builder) -> None:
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


def _load_markup(path: Path, build: _Builder, parse: Callable[[str], Iterable[Block]]) -> None:
    for kind, text, heading in parse(read_text(path, build.max_chars)):
        build.add(text, kind, heading)


def _load_csv(path: Path, build: _Builder) -> None:
    text = read_text(path, build.max_chars)
    try:
        dialect: type[csv.Dialect] | csv.Dialect = csv.Sniffer().sniff(text[:4096], delimiters=",;\t|")
    except csv.Error:
        dialect = csv.excel_tab if path.suffix.lower() == ".tsv" else csv.excel
    try:
        cells = csv.reader(io.StringIO(text), dialect)
        rows = [line for line in (" | ".join(cell.strip() for cell in row) for row in cells) if line.strip(" |")]
    except csv.Error:  # e.g. a field over csv.field_size_limit(): still worth indexing as text
        for para in _paragraphs(text):
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


def _load_json(path: Path, build: _Builder) -> None:
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
                for para in _paragraphs(text):  # not JSON after all: index it as plain text
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


# ---------------------------------------------------------------------------------------- zip formats


def check_zip(path: Path, zf: zipfile.ZipFile) -> None:
    """Refuse zip bombs before reading any member: member count, total size and ratio limits.

    Args:
        path: The archive's path (for the error message).
        zf: The open archive.

    Raises:
        DocumentError: The archive would unpack to too much data.
    """
    infos = zf.infolist()
    if len(infos) > ZIP_MAX_MEMBERS:
        raise DocumentError(path, f"skipped: archive has {len(infos):,} members (possible zip bomb)")
    total = sum(info.file_size for info in infos)
    if total > ZIP_MAX_UNCOMPRESSED_BYTES:
        raise DocumentError(
            path,
            f"skipped: archive unpacks to {total / MB:,.0f} MB, "
            f"limit {ZIP_MAX_UNCOMPRESSED_BYTES / MB:,.0f} MB (possible zip bomb)",
        )
    for info in infos:
        ratio = info.file_size // max(info.compress_size, 1)
        if info.file_size > MB and ratio > ZIP_MAX_RATIO:
            raise DocumentError(
                path, f"skipped: archive member {info.filename!r} expands {ratio:,} times (possible zip bomb)"
            )


def _open_zip(path: Path) -> zipfile.ZipFile:
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as exc:
        raise DocumentError(path, f"skipped: corrupt archive ({exc})") from exc
    except OSError as exc:
        raise _open_error(path, exc) from exc
    try:
        check_zip(path, zf)
    except DocumentError:
        zf.close()
        raise
    return zf


def _inflated_copy(path: Path) -> io.BytesIO:
    """The archive's members inflated in 1 MB steps, under the total cap, into an uncompressed copy.

    :func:`check_zip` trusts the sizes the archive declares; a reader handed the archive itself
    (python-docx) then inflates each member in one call, however much it really holds. Read in
    steps, a member stops at its declared size and its CRC is checked, so a member that lies about
    its size is refused, and what the reader gets is bounded by the caps.

    Raises:
        DocumentError: the archive is corrupt, a member fails its CRC, or it unpacks past the caps.
    """
    copy = io.BytesIO()
    total = 0
    with _open_zip(path) as zf, zipfile.ZipFile(copy, "w", zipfile.ZIP_STORED) as out:
        for info in zf.infolist():
            if info.is_dir():
                continue
            try:
                with zf.open(info) as src, out.open(info.filename, "w", force_zip64=True) as dst:
                    while chunk := src.read(MB):
                        total += len(chunk)
                        if total > ZIP_MAX_UNCOMPRESSED_BYTES:
                            raise DocumentError(
                                path,
                                f"skipped: archive unpacks to more than {ZIP_MAX_UNCOMPRESSED_BYTES / MB:,.0f} MB "
                                "(possible zip bomb)",
                            )
                        dst.write(chunk)
            except (zipfile.BadZipFile, EOFError, ValueError, NotImplementedError, zlib.error) as exc:
                raise DocumentError(path, f"skipped: corrupt archive ({exc})".split("\n")[0]) from exc
    copy.seek(0)
    return copy


def _load_docx(path: Path, build: _Builder) -> None:
    import docx
    from docx.opc.exceptions import PackageNotFoundError
    from docx.table import Table
    from docx.text.paragraph import Paragraph

    source = _inflated_copy(path)
    try:
        document = docx.Document(source)
        headings: list[tuple[int, str]] = []
        for block in document.iter_inner_content():
            if isinstance(block, Paragraph):
                style = block.style.name if block.style is not None else ""
                level = _docx_heading_level(style or "")
                text = block.text
                if level is not None and text.strip():
                    headings = [(lvl, t) for lvl, t in headings if lvl < level] + [(level, text.strip())]
                    build.add(text, "heading", _path(headings))
                else:
                    build.add(text, "text", _path(headings))
            elif isinstance(block, Table):
                rows = []
                for row in block.rows:
                    cells: list[str] = []
                    seen: set[int] = set()
                    for cell in row.cells:  # a merged cell is listed once per grid column: keep one copy
                        element = id(getattr(cell, "_tc", cell))
                        if element not in seen:
                            seen.add(element)
                            cells.append(" ".join(cell.text.split()))
                    rows.append(" | ".join(cells))
                build.add("\n".join(r for r in rows if r.strip(" |")), "table", _path(headings))
    except (PackageNotFoundError, KeyError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise DocumentError(path, f"skipped: corrupt DOCX ({exc})".split("\n")[0]) from exc
    except SyntaxError as exc:  # lxml.etree.XMLSyntaxError derives from SyntaxError
        raise DocumentError(path, f"skipped: corrupt DOCX (bad XML: {exc})".split("\n")[0]) from exc


def _docx_heading_level(style: str) -> int | None:
    if style == "Title":
        return 0
    match = re.fullmatch(r"Heading\s*(\d)", style)
    return int(match.group(1)) if match else None


def _path(headings: list[tuple[int, str]]) -> str | None:
    return " > ".join(text for _, text in headings) or None


def _read_member(path: Path, zf: zipfile.ZipFile, name: str) -> str:
    try:
        with zf.open(name) as fh:
            data = fh.read(ZIP_MAX_UNCOMPRESSED_BYTES + 1)
    except (KeyError, zipfile.BadZipFile, EOFError, ValueError, OSError) as exc:
        raise DocumentError(path, f"skipped: corrupt EPUB ({exc})") from exc
    if len(data) > ZIP_MAX_UNCOMPRESSED_BYTES:
        raise DocumentError(path, "skipped: archive member too large (possible zip bomb)")
    return data.decode(sniff_encoding(data[:_SNIFF_BYTES]) or "utf-8", errors="replace")


def _epub_spine(path: Path, zf: zipfile.ZipFile) -> list[str]:
    """Chapter member names in reading order (the OPF spine), else every XHTML member sorted."""
    import xml.etree.ElementTree as ET

    names = zf.namelist()
    fallback = sorted(n for n in names if n.lower().endswith((".xhtml", ".html", ".htm")))
    try:
        container = ET.fromstring(_read_member(path, zf, "META-INF/container.xml"))
        rootfile = next(el for el in container.iter() if el.tag.endswith("rootfile"))
        opf_name = rootfile.attrib["full-path"]
        opf = ET.fromstring(_read_member(path, zf, opf_name))
    except (DocumentError, ET.ParseError, StopIteration, KeyError):
        return fallback
    base = PurePosixPath(opf_name).parent
    manifest = {el.get("id"): el.get("href", "") for el in opf.iter() if el.tag.rsplit("}", 1)[-1] == "item"}
    spine = [manifest.get(el.get("idref")) for el in opf.iter() if el.tag.endswith("itemref")]
    chapters = [str(base / href.split("#")[0]).removeprefix("./") for href in spine if href]
    chapters = [name for name in chapters if name in names]
    return chapters or fallback


def _load_epub(path: Path, build: _Builder) -> None:
    with _open_zip(path) as zf:
        for name in _epub_spine(path, zf):
            for kind, text, heading in html_sections(_read_member(path, zf, name)):
                build.add(text, kind, heading)


# ---------------------------------------------------------------------------------------- PDF


def _pdf_outline(reader: Any) -> list[tuple[int, str]]:
    """(page index, heading path) for each outline (bookmark) entry, sorted by page; [] if none."""
    from pypdf.errors import PyPdfError

    found: list[tuple[int, str]] = []

    def walk(items: list[Any], trail: tuple[str, ...]) -> None:
        last: tuple[str, ...] = trail
        for item in items:
            if isinstance(item, list):
                walk(item, last)
                continue
            page = reader.get_destination_page_number(item)
            last = (*trail, str(item.title).strip())
            if page is not None and page >= 0:
                found.append((page, " > ".join(last)))

    try:
        walk(reader.outline, ())
    except (PyPdfError, KeyError, ValueError, TypeError, AttributeError, IndexError, RecursionError):
        return []
    return sorted(found, key=lambda entry: entry[0])


def _load_pdf(path: Path, build: _Builder) -> int:
    from pypdf import PasswordType, PdfReader, apply_configuration
    from pypdf.errors import DependencyError, FileNotDecryptedError, LimitReachedError, PyPdfError

    limit = PDF_MAX_STREAM_BYTES
    corrupt = (PyPdfError, KeyError, ValueError, TypeError, AttributeError, IndexError, AssertionError,
               RecursionError, EOFError, OverflowError, ZeroDivisionError, UnicodeError)  # fmt: skip
    try:
        with apply_configuration(
            None,
            zlib_maximum_output_length=limit,
            lzw_maximum_output_length=limit,
            run_length_maximum_output_length=limit,
            array_based_stream_maximum_output_length=limit,
            maximum_declared_stream_length=limit,
        ):
            reader = PdfReader(path)
            if reader.is_encrypted and reader.decrypt("") == PasswordType.NOT_DECRYPTED:
                raise DocumentError(path, "skipped: password-protected")
            n_pages = len(reader.pages)
            outline = _pdf_outline(reader)
            good_pages = 0
            for index, page in enumerate(reader.pages):
                try:
                    text = page.extract_text()
                except LimitReachedError:
                    raise
                except corrupt:
                    continue  # one damaged page does not lose the rest
                good_pages += 1
                heading = None
                for first_page, title in outline:
                    if first_page > index:
                        break
                    heading = title
                text = re.sub(r"[ \t]+\n", "\n", text.translate(_ZERO_WIDTH))
                for para in _paragraphs(text):
                    build.add(para, "text", heading, index + 1)
    except FileNotDecryptedError as exc:
        raise DocumentError(path, "skipped: password-protected") from exc
    except DependencyError as exc:
        reason = "skipped: encrypted with AES; reading it needs the 'cryptography' package (missing component)"
        raise DocumentError(path, reason) from exc
    except LimitReachedError as exc:
        raise DocumentError(path, f"skipped: could not be parsed safely (possible PDF bomb: {exc})") from exc
    except MemoryError:
        raise
    except OSError as exc:
        raise _open_error(path, exc) from exc
    except corrupt as exc:
        reason = f"skipped: corrupt PDF ({type(exc).__name__}: {exc})".split("\n")[0]
        raise DocumentError(path, reason) from exc
    if not build.sections:
        if n_pages and good_pages == 0:
            raise DocumentError(path, "skipped: corrupt PDF (no page could be read)")
        if n_pages:
            raise DocumentError(path, "skipped: no text layer (scanned?); OCR is not supported")
    return n_pages


# ---------------------------------------------------------------------------------------- entry point


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
    build = _Builder(path, max_chars)
    n_pages: int | None = None
    try:
        if kind == "pdf":
            n_pages = _load_pdf(path, build)
        elif kind == "docx":
            _load_docx(path, build)
        elif kind == "epub":
            _load_epub(path, build)
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
        raise _open_error(path, exc) from exc
    if not stat.S_ISREG(st.st_mode):
        raise not_regular(path, st.st_mode)
    if st.st_size > max_file_bytes:
        raise DocumentError(path, f"skipped: too large: {st.st_size / MB:,.1f} MB, limit {max_file_bytes / MB:,.0f} MB")
    return st.st_size
