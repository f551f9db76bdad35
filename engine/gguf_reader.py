"""The bounded forward reader under the GGUF header parser, and the caps it enforces itself.

Owns :class:`HeaderReader` (reads a file of known size through its own read-ahead buffer, checking
every read against the size first, so no count or length from the file can make it read or
allocate past the end), :class:`StringArray` (where a walked string array's entries start), the
two internal errors the parser turns into :class:`engine.errors.ModelFileError` (:class:`Truncated`,
:class:`Malformed`), and the caps the reader checks: the bytes read per header
(:data:`MAX_HEADER_READ_BYTES`), one string's length (:data:`MAX_STRING_LEN`) and how often a walked
string array remembers an offset (:data:`TOKEN_CHECKPOINT_EVERY`). See :mod:`engine.gguf`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import BinaryIO

from engine.gguf_format import FLOAT_TYPES, T_BOOL, VALUE_TYPES

__all__ = [
    "MAX_HEADER_READ_BYTES",
    "MAX_STRING_LEN",
    "TOKEN_CHECKPOINT_EVERY",
    "HeaderReader",
    "Malformed",
    "StringArray",
    "Truncated",
]

MAX_STRING_LEN = 16 << 20
MAX_HEADER_READ_BYTES = 128 << 20  # bytes read from the file per header; real: the header's size, a few MiB
TOKEN_CHECKPOINT_EVERY = 4096  # token-array offsets remembered for cheap id -> string look-ups

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


class Truncated(Exception):
    """The file ends before byte ``needed``."""

    def __init__(self, needed: int) -> None:
        super().__init__(needed)
        self.needed = needed


class Malformed(Exception):
    """The file breaks a rule; the message says which."""


class HeaderReader:
    """A forward reader over a file of known size, with its own read-ahead buffer.

    Every read checks ``pos + n <= size`` first, so a count or length from the file can never make
    it read (or allocate) past the end. The read-ahead is a full ``_CHUNK`` only while reading on
    from where the buffer ended; after a seek past skipped data it is ``_MIN_CHUNK``, so a header
    of long values that are seeked past does not read them anyway. All reads together are capped
    at :data:`MAX_HEADER_READ_BYTES`.
    """

    _CHUNK = 1 << 20
    _MIN_CHUNK = 1 << 12

    def __init__(self, fh: BinaryIO, size: int) -> None:
        self._fh = fh
        self.size = size
        self.pos = 0
        self._buf = b""
        self._buf_start = 0
        self.bytes_read = 0
        self._sought = False  # a skip went past the buffer since it was filled

    def _window(self, n: int) -> tuple[bytes, int]:
        end = self.pos + n
        if end > self.size:
            raise Truncated(end)
        rel = self.pos - self._buf_start
        if rel < 0 or rel + n > len(self._buf):
            onward = not self._sought and 0 <= rel <= len(self._buf) + self._MIN_CHUNK
            self._sought = False
            want = max(n, self._CHUNK if onward else self._MIN_CHUNK)
            self.bytes_read += want
            if self.bytes_read > MAX_HEADER_READ_BYTES:
                raise Malformed(
                    f"reading its header takes more than {MAX_HEADER_READ_BYTES >> 20} MiB "
                    "(a real model's header is a few MiB)"
                )
            self._fh.seek(self.pos)
            self._buf = self._fh.read(want)
            self._buf_start = self.pos
            rel = 0
            if len(self._buf) < n:  # the file shrank, or a prefix ended early
                raise Truncated(end)
        return self._buf, rel

    def u32(self) -> int:
        buf, rel = self._window(4)
        self.pos += 4
        return int(_U32.unpack_from(buf, rel)[0])

    def u64(self) -> int:
        buf, rel = self._window(8)
        self.pos += 8
        return int(_U64.unpack_from(buf, rel)[0])

    def scalar(self, vtype: int) -> int | float | bool:
        _, size, fmt = VALUE_TYPES[vtype]
        buf, rel = self._window(size)
        self.pos += size
        value = struct.unpack_from(fmt, buf, rel)[0]
        if vtype == T_BOOL:
            return bool(value)
        return float(value) if vtype in FLOAT_TYPES else int(value)

    def raw(self, n: int) -> bytes:
        buf, rel = self._window(n)
        self.pos += n
        return buf[rel : rel + n]

    def skip(self, n: int) -> None:
        end = self.pos + n
        if end > self.size:
            raise Truncated(end)
        if n > self._MIN_CHUNK and end > self._buf_start + len(self._buf):
            self._sought = True  # the next refill need not read ahead much: skipped data follows data
        self.pos = end

    def string(self, cap: int, what: str) -> str:
        length = self.u64()
        if length > cap:
            raise Malformed(f"{what} claims a string of {length} bytes (limit {cap})")
        return self.raw(length).decode("utf-8", errors="replace")

    def string_prefix(self, keep: int, cap: int, what: str) -> tuple[str, int]:
        """A string's first ``keep`` bytes, decoded, and its full length; the rest is seeked past."""
        length = self.u64()
        if length > cap:
            raise Malformed(f"{what} claims a string of {length} bytes (limit {cap})")
        if length <= keep:
            return self.raw(length).decode("utf-8", errors="replace"), length
        text = self.raw(keep).decode("utf-8", errors="replace")
        self.skip(length - keep)
        return text, length

    def scalars(self, vtype: int, count: int) -> list[int | float | bool]:
        """``count`` values of a fixed-size type, unpacked at once."""
        _, size, fmt = VALUE_TYPES[vtype]
        buf, rel = self._window(count * size)
        self.pos += count * size
        values = struct.unpack_from(f"<{count}{fmt[1]}", buf, rel)
        if vtype == T_BOOL:
            return [bool(v) for v in values]
        if vtype in FLOAT_TYPES:
            return [float(v) for v in values]
        return [int(v) for v in values]

    def skip_strings(self, count: int, what: str) -> list[int]:
        """Walks ``count`` strings without keeping them; returns every N-th start offset.

        The hot loop of the reader (a vocabulary has up to a few hundred thousand entries), so it
        works on local variables and refills the buffer only when a length prefix crosses its end.
        """
        marks: list[int] = []
        unpack = _U64.unpack_from
        size = self.size
        pos = self.pos
        if pos + 8 * count > size:  # every string has its 8-byte length: refuse before walking
            raise Truncated(pos + 8 * count)
        buf, base = self._buf, self._buf_start
        end_of_buf = base + len(buf)
        for first in range(0, count, TOKEN_CHECKPOINT_EVERY):
            marks.append(pos)
            for _ in range(min(TOKEN_CHECKPOINT_EVERY, count - first)):
                if pos + 8 > end_of_buf or pos < base:
                    self.pos = pos
                    self._window(8)
                    buf, base = self._buf, self._buf_start
                    end_of_buf = base + len(buf)
                length = unpack(buf, pos - base)[0]
                if length > MAX_STRING_LEN:
                    limit = MAX_STRING_LEN
                    raise Malformed(f"array {what!r} claims a string of {length} bytes (limit {limit})")
                pos += 8 + length
                if pos > size:
                    raise Truncated(pos)
        self.pos = pos
        return marks


@dataclass
class StringArray:
    """A string array that was walked, not kept: its entry count and every N-th entry's offset."""

    count: int
    marks: list[int]
