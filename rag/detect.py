"""Opening a document file safely, and telling its format and text encoding from its content.

Owns :func:`open_regular` (refuses FIFOs, sockets and devices before opening them), the reasons for
files that are not regular (:func:`file_type`, :func:`not_regular`, :func:`open_error`),
:func:`sniff_encoding` (BOM, UTF-8, else charset-normalizer; None for binary), :func:`detect_kind`
(the format by magic bytes and structure first, extension second) and :data:`FILE_TYPES` (what a
file picker offers). Reading the text itself is :mod:`rag.text_files`.
"""

from __future__ import annotations

import codecs
import os
import stat
import zipfile
from pathlib import Path
from typing import IO

from rag.errors import DocumentError

__all__ = [
    "CONTROL_BYTES",
    "FILE_TYPES",
    "SNIFF_BYTES",
    "detect_kind",
    "file_type",
    "not_regular",
    "open_error",
    "open_regular",
    "sniff_encoding",
]

SNIFF_BYTES = 8192
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
_TIE_TO_CP1252 = {"cp1250", "iso8859_2", "mac_latin2", "cp1257", "iso8859_4", "iso8859_10", "iso8859_13"}
CONTROL_BYTES = frozenset(range(32)) - {9, 10, 12, 13, 27} | {127}


def open_error(path: Path, exc: OSError) -> DocumentError:
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
        raise open_error(path, exc) from exc
    try:
        mode = os.fstat(fh.fileno()).st_mode
    except OSError as exc:
        fh.close()
        raise open_error(path, exc) from exc
    if not stat.S_ISREG(mode):
        fh.close()
        raise not_regular(path, mode)
    return fh


def _read_head(path: Path) -> bytes:
    with open_regular(path) as fh:
        try:
            return fh.read(SNIFF_BYTES)
        except OSError as exc:
            raise open_error(path, exc) from exc


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
        raise open_error(path, exc) from exc
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
    if sample and sum(b in CONTROL_BYTES for b in sample) > 0.05 * len(sample):
        return None
    decoded = codecs.getincrementaldecoder("utf-8")(errors="replace").decode(sample, final=False)
    bad = decoded.count("\ufffd")
    if bad == 0 or sum(ch > "\x7f" for ch in decoded) - bad >= bad:
        return "utf-8"  # valid, or mostly valid UTF-8 with a few broken bytes (those become U+FFFD)
    # lazy: start-up (+20 ms: charset_normalizer)
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
