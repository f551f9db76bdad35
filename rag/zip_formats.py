"""The zip-based document formats, DOCX and EPUB, read under zip-bomb limits.

Owns the archive caps (:data:`ZIP_MAX_UNCOMPRESSED_BYTES`, :data:`ZIP_MAX_RATIO`,
:data:`ZIP_MAX_MEMBERS`), :func:`check_zip` (the central directory checked before any member is
read), the inflated copy python-docx is handed (members read in steps, CRC-checked, under the caps)
and the loaders :func:`load_docx` and :func:`load_epub`. The entry point is
:func:`rag.loaders.load_document`.
"""

from __future__ import annotations

import io
import re
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from rag.detect import SNIFF_BYTES, open_error, sniff_encoding
from rag.errors import DocumentError
from rag.markup import html_sections
from rag.sections import SectionBuilder

__all__ = ["ZIP_MAX_MEMBERS", "ZIP_MAX_RATIO", "ZIP_MAX_UNCOMPRESSED_BYTES", "check_zip", "load_docx", "load_epub"]

MB = 2**20

# Zip-based formats (DOCX, EPUB): limits checked on the central directory before any member is read.
ZIP_MAX_UNCOMPRESSED_BYTES = 256 * MB
ZIP_MAX_RATIO = 100
ZIP_MAX_MEMBERS = 10_000


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
        raise open_error(path, exc) from exc
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


def load_docx(path: Path, build: SectionBuilder) -> None:
    # lazy: start-up (+204 ms: docx, lxml)
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
    return data.decode(sniff_encoding(data[:SNIFF_BYTES]) or "utf-8", errors="replace")


def _epub_spine(path: Path, zf: zipfile.ZipFile) -> list[str]:
    """Chapter member names in reading order (the OPF spine), else every XHTML member sorted."""
    # lazy: start-up (+4 ms)
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


def load_epub(path: Path, build: SectionBuilder) -> None:
    with _open_zip(path) as zf:
        for name in _epub_spine(path, zf):
            for kind, text, heading in html_sections(_read_member(path, zf, name)):
                build.add(text, kind, heading)
