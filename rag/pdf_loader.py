"""The PDF loader: text page by page through pypdf, under decompression limits, headed by the outline.

Owns :data:`PDF_MAX_STREAM_BYTES` (the per-stream decompression limit handed to pypdf) and
:func:`load_pdf`; a damaged page is skipped, a password, AES without its package, a PDF bomb, no
page read or no text layer each give their own one-line reason. The entry point is
:func:`rag.loaders.load_document`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from rag.detect import open_error
from rag.errors import DocumentError
from rag.sections import SectionBuilder
from rag.text_files import ZERO_WIDTH, paragraphs

__all__ = ["PDF_MAX_STREAM_BYTES", "load_pdf"]

MB = 2**20
# PDF: per-stream decompression limit handed to pypdf (its default is 75 MB).
PDF_MAX_STREAM_BYTES = 64 * MB


def _pdf_outline(reader: Any) -> list[tuple[int, str]]:
    """(page index, heading path) for each outline (bookmark) entry, sorted by page; [] if none."""
    # lazy: start-up (+111 ms: pypdf, fontTools)
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


def load_pdf(path: Path, build: SectionBuilder) -> int:
    # lazy: start-up (+225 ms: pypdf, fontTools)
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
                text = re.sub(r"[ \t]+\n", "\n", text.translate(ZERO_WIDTH))
                for para in paragraphs(text):
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
        raise open_error(path, exc) from exc
    except corrupt as exc:
        reason = f"skipped: corrupt PDF ({type(exc).__name__}: {exc})".split("\n")[0]
        raise DocumentError(path, reason) from exc
    if not build.sections:
        if n_pages and good_pages == 0:
            raise DocumentError(path, "skipped: corrupt PDF (no page could be read)")
        if n_pages:
            raise DocumentError(path, "skipped: no text layer (scanned?); OCR is not supported")
    return n_pages
