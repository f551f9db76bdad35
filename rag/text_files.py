"""Reading a text file safely: whatever its encoding, in bounded steps, refusing binary content.

Owns :func:`read_text` (decoded with :func:`rag.detect.sniff_encoding`'s codec, NUL and zero-width
characters dropped, newlines normalised, never past ``max_chars``, and checked window by window so
a file that turns binary after some text is skipped) and :func:`paragraphs`, the split every
plain-text loader uses.
"""

from __future__ import annotations

import codecs
import io
import re
from collections.abc import Iterator
from pathlib import Path

from rag.detect import CONTROL_BYTES, SNIFF_BYTES, open_error, open_regular, sniff_encoding
from rag.errors import DocumentError

__all__ = ["ZERO_WIDTH", "paragraphs", "read_text"]

_READ_BYTES = 1 << 20  # a multiple of SNIFF_BYTES: the binary check looks at whole windows
_FINE_BYTES = 512  # window size when placing where binary content starts
ZERO_WIDTH = dict.fromkeys(map(ord, "\x00\u200b\u2060\ufeff"))
_NOT_CONTROL = bytes(b for b in range(256) if b not in CONTROL_BYTES)  # deleted to count control bytes
_CONTROL_RE = re.compile(b"[" + re.escape(bytes(sorted(CONTROL_BYTES))) + b"]")
_CONTROL_CHARS = re.compile("[" + re.escape("".join(map(chr, sorted(CONTROL_BYTES)))) + "]")


def _looks_binary(nuls: int, controls: int, size: int) -> bool:
    """The measure of :func:`rag.detect.sniff_encoding`: more than one NUL in 200 bytes (or characters), or more
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


def _binary_at(window: bytes, codec: str, *, first: bool, full: int = SNIFF_BYTES) -> int | None:
    """Where binary content starts in ``window`` (a byte offset into it), or None when it reads as text.

    Binary is what :func:`rag.detect.sniff_encoding` calls binary (NULs and control bytes; in UTF-16 and UTF-32
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
            head = fh.read(SNIFF_BYTES)
            fh.seek(0)
        except OSError as exc:
            raise open_error(path, exc) from exc
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
                raise open_error(path, exc) from exc
            for start in range(0, len(block), SNIFF_BYTES):
                window = block[start : start + SNIFF_BYTES]
                at = _binary_at(window, scan, first=not offset + start)
                if at is not None:
                    near = _binary_start(before + window, scan)
                    at = offset + start + at if near is None else offset + start - len(before) + near
                    raise DocumentError(path, f"skipped: binary content after byte {at:,}")
                before = window
            offset += len(block)
            part = decoder.decode(block, final=not block)
            part = part.translate(ZERO_WIDTH)
            total += len(part)
            if total > max_chars:
                raise DocumentError(path, f"skipped: too much text (over {max_chars:,} characters)")
            parts.append(part)
            if not block:
                break
    return "".join(parts)


def paragraphs(text: str) -> Iterator[str]:
    """The paragraphs of ``text``: the pieces between blank lines."""
    yield from re.split(r"\n[ \t]*\n", text)
