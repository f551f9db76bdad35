"""Helpers that write test documents, good and bad, into a folder the test owns.

Every writer returns the path it wrote. The ``*_loader`` functions are module-level stand-ins for
``rag.loaders.load_document`` that misbehave inside the parser child (hang, crash, eat memory);
they must live in an importable module because the spawned child imports them by name.
"""

from __future__ import annotations

import io
import os
import signal
import time
import zipfile
import zlib
from pathlib import Path

from rag.loaders import load_document
from rag.sections import ParsedDocument

LOREM = (
    "Glassbox keeps every document on this computer. The parser runs in a child process. "
    "If a file hangs the parser, the child is killed and the batch goes on. "
    "Each chunk remembers its page and heading, so answers can cite the exact place. "
)


def word_count(text: str) -> int:
    """A real-ish token counter: words and punctuation marks, roughly like WordPiece."""
    import re

    return len(re.findall(r"\w+|[^\w\s]", text))


def write_pdf(path: Path, pages: list[str], titles: list[str] | None = None) -> Path:
    """A text PDF (fpdf2) with one page per string; ``titles`` adds an outline entry per page."""
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_font("helvetica", size=11)
    for n, text in enumerate(pages):
        pdf.add_page()
        if titles:
            pdf.start_section(titles[n])
        pdf.multi_cell(0, 6, text)
    pdf.output(str(path))
    return path


def write_encrypted_pdf(path: Path, text: str = "Secret plans.") -> Path:
    """A PDF with a user password (RC4-128, which pypdf reads without extra packages)."""
    from pypdf import PdfReader, PdfWriter

    plain = write_pdf(path.with_suffix(".plain.pdf"), [text])
    writer = PdfWriter(clone_from=PdfReader(plain))
    writer.encrypt("s3cret", "owner", algorithm="RC4-128")
    with path.open("wb") as fh:
        writer.write(fh)
    plain.unlink()
    return path


def write_scanned_pdf(path: Path, n_pages: int = 2) -> Path:
    """A PDF whose pages hold only drawings, like a scan without a text layer."""
    from fpdf import FPDF

    pdf = FPDF()
    for _ in range(n_pages):
        pdf.add_page()
        pdf.set_fill_color(40, 40, 40)
        pdf.rect(20, 20, 120, 80, style="F")
    pdf.output(str(path))
    return path


def _raw_pdf(content: bytes, filters: str) -> bytes:
    """A one-page PDF with the given (already encoded) content stream, with a correct xref table."""
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 << /Type /Font /Subtype /Type1 /BaseFont /Helvetica >> >> >> >>",
        b"<< /Length %d %s >>\nstream\n" % (len(content), filters.encode()) + content + b"\nendstream",
    ]
    out = io.BytesIO()
    out.write(b"%PDF-1.7\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % number + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref))
    return out.getvalue()


def write_pdf_bomb(path: Path, decompressed_bytes: int = 80 * 2**20) -> Path:
    """A PDF whose content stream is small on disk but inflates to ``decompressed_bytes``."""
    compressor = zlib.compressobj(9)
    block = b" " * 2**20
    data = compressor.compress(b"BT /F1 12 Tf 72 700 Td (Hello from the bomb) Tj ET\n")
    data += b"".join(compressor.compress(block) for _ in range(decompressed_bytes // len(block)))
    path.write_bytes(_raw_pdf(data + compressor.flush(), "/Filter /FlateDecode"))
    return path


def write_corrupt_pdf(path: Path) -> Path:
    """A PDF header followed by junk."""
    path.write_bytes(b"%PDF-1.4\n" + bytes(range(256)) * 40 + b"\n%%EOF\n")
    return path


def write_docx(path: Path) -> Path:
    """A DOCX with a title, two heading levels, paragraphs and a table with a merged row."""
    import docx

    document = docx.Document()
    document.add_heading("Field guide", level=0)
    document.add_heading("Install", level=1)
    document.add_paragraph("Download the installer and run it.")
    document.add_heading("Linux", level=2)
    document.add_paragraph("Use the AppImage on Linux.")
    table = document.add_table(rows=4, cols=2)
    for row, (name, value) in zip(
        table.rows, [("Setting", "Value"), ("threads", "4"), ("context", "4096")], strict=False
    ):
        row.cells[0].text, row.cells[1].text = name, value
    merged = table.rows[3].cells[0].merge(table.rows[3].cells[1])
    merged.text = "same"
    document.add_heading("Usage", level=1)
    document.add_paragraph("Drop files on the window.")
    document.save(str(path))
    return path


def write_zip_bomb_docx(path: Path, member_bytes: int = 24 * 2**20) -> Path:
    """A valid DOCX plus one member of zeros that compresses about a thousand times."""
    write_docx(path)
    with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("word/media/filler.bin", b"\0" * member_bytes)
    return path


def write_epub(path: Path, chapters: list[tuple[str, str]]) -> Path:
    """An EPUB 3 (zip with mimetype, container, OPF spine) with one XHTML file per (title, body)."""
    manifest = "".join(
        f'<item id="c{n}" href="text/ch{n}.xhtml" media-type="application/xhtml+xml"/>' for n in range(len(chapters))
    )
    spine = "".join(f'<itemref idref="c{n}"/>' for n in reversed(range(len(chapters))))
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("mimetype", "application/epub+zip", compress_type=zipfile.ZIP_STORED)
        zf.writestr(
            "META-INF/container.xml",
            '<?xml version="1.0" encoding="UTF-8"?><container version="1.0" '
            'xmlns="urn:oasis:names:tc:opendocument:xmlns:container">'
            '<rootfiles><rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/>'
            "</rootfiles></container>",
        )
        zf.writestr(
            "OEBPS/content.opf",
            '<?xml version="1.0" encoding="UTF-8"?>'
            '<package xmlns="http://www.idpf.org/2007/opf" version="3.0">'
            f"<manifest>{manifest}</manifest><spine>{spine}</spine></package>",
        )
        for n, (title, body) in enumerate(chapters):
            zf.writestr(
                f"OEBPS/text/ch{n}.xhtml",
                f'<?xml version="1.0" encoding="UTF-8"?><html xmlns="http://www.w3.org/1999/xhtml"><head><title>{title}</title>'
                f"</head><body><h1>{title}</h1><p>{body}</p></body></html>",
                compress_type=zipfile.ZIP_DEFLATED,
            )
    return path


def write_binary(path: Path) -> Path:
    """Bytes that are no text format: a fake image with NULs and high bytes."""
    path.write_bytes(b"\x00\x01\x02garbage" + bytes(range(256)) * 16)
    return path


# ------------------------------------------------------------------------- misbehaving loaders


def hanging_loader(path: Path, *, max_chars: int) -> ParsedDocument:
    """Hangs on files named ``hang*``; parses everything else normally."""
    if path.name.startswith("hang"):
        time.sleep(600)
    return load_document(path, max_chars=max_chars)


def crashing_loader(path: Path, *, max_chars: int) -> ParsedDocument:
    """Dies by SIGSEGV, like a native parser crash, on files named ``crash*``."""
    if path.name.startswith("crash"):
        os.kill(os.getpid(), signal.SIGSEGV)
    return load_document(path, max_chars=max_chars)


def greedy_loader(path: Path, *, max_chars: int) -> ParsedDocument:
    """Tries to allocate 8 GB on files named ``greedy*``, like a decompression bomb."""
    if path.name.startswith("greedy"):
        hog = bytearray(8 * 2**30)
        hog[-1] = 1
    return load_document(path, max_chars=max_chars)


def buggy_loader(path: Path, *, max_chars: int) -> ParsedDocument:
    """Raises an unexpected exception, like a parser bug, on files named ``buggy*``."""
    if path.name.startswith("buggy"):
        raise ZeroDivisionError("parser bug\nsecond line")
    return load_document(path, max_chars=max_chars)
