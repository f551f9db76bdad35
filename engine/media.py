"""Images and audio clips attached to a message, checked in Python before any decoder sees them.

Contract: ARCHITECTURE.md, 'engine.media'.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from engine.errors import EngineError, ModelFileError
from engine.gguf_file import open_model_file

__all__ = [
    "AUDIO_SUFFIXES",
    "IMAGE_SUFFIXES",
    "MAX_AUDIO_SECONDS",
    "MAX_IMAGE_PIXELS",
    "MAX_IMAGE_SIDE",
    "MAX_MEDIA_BYTES",
    "Media",
    "MediaError",
    "MediaKind",
    "MediaRef",
    "load_media",
    "read_media",
]

MediaKind = Literal["image", "audio"]

MAX_MEDIA_BYTES: Final = 32 * 2**20
"""The largest file attached (32 MiB)."""
MAX_IMAGE_SIDE: Final = 16_384
"""The longest side an image's header may give, in pixels."""
MAX_IMAGE_PIXELS: Final = 64 * 2**20
"""The most pixels an image's header may give (67 megapixels: a 48-megapixel photo passes, a
decompression bomb does not; the decoded image is at most ~200 MB of RGB in the worker)."""
MAX_AUDIO_SECONDS: Final = 600.0
"""The longest clip (10 minutes)."""

IMAGE_SUFFIXES: Final = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp")
"""What a file picker offers for images (the format is still read from the content)."""
AUDIO_SUFFIXES: Final = (".wav", ".mp3", ".flac")
"""What a file picker offers for audio."""

_MEDIA_TYPES: Final = {
    "png": "image/png",
    "jpeg": "image/jpeg",
    "webp": "image/webp",
    "gif": "image/gif",
    "bmp": "image/bmp",
    "wav": "audio/wav",
    "mp3": "audio/mpeg",
    "flac": "audio/flac",
}
_SUFFIX: Final = {"png": ".png", "jpeg": ".jpg", "webp": ".webp", "gif": ".gif", "bmp": ".bmp"}
_SUFFIX.update({"wav": ".wav", "mp3": ".mp3", "flac": ".flac"})


class MediaError(EngineError):
    """An attachment that cannot be used, in one line: ``"<name>: <reason>"``.

    Args:
        name: the file's name (or what the caller calls it: ``messages[0].content[1]``).
        reason: what is wrong.
    """

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason
        super().__init__(f"{name}: {reason}" if name else reason)


@dataclass(frozen=True)
class Media:
    """An image or a clip that passed the checks.

    Attributes:
        kind: ``image`` or ``audio``.
        format: ``png``, ``jpeg``, ``webp``, ``gif``, ``bmp``; ``wav``, ``mp3``, ``flac``.
        digest: the SHA-256 of ``data`` (hex): its identity, in the history and in the worker.
        data: the file's bytes.
        name: the name shown (the file's name; "" when there was none).
        width, height: an image's size in pixels from its header (0 for audio).
        seconds: a clip's length from its header (0.0 for an image; an MP3's is estimated).
        frames: more than 1 for an animated GIF or WebP (only the first frame is read).
    """

    kind: MediaKind
    format: str
    digest: str
    data: bytes = field(repr=False)
    name: str = ""
    width: int = 0
    height: int = 0
    seconds: float = 0.0
    frames: int = 1

    @property
    def media_type(self) -> str:
        """The MIME type (``image/png``)."""
        return _MEDIA_TYPES[self.format]

    @property
    def suffix(self) -> str:
        """The file suffix of its format (``.png``), for a content-addressed file."""
        return _SUFFIX[self.format]

    @property
    def label(self) -> str:
        """What it is, in a few words: ``"PNG 640×480"``, ``"WAV 12.5 s"``."""
        return self.ref.label

    @property
    def ref(self) -> MediaRef:
        """What the history keeps of it: everything but the bytes (kept by content address)."""
        fields = (self.name, self.width, self.height, self.seconds, self.frames)
        return MediaRef(self.kind, self.format, self.digest, *fields)


@dataclass(frozen=True)
class MediaRef:
    """An attachment without its bytes: what a message in the history holds (the bytes are a file
    named by ``digest``, engine/media_store.py). The fields are :class:`Media`'s."""

    kind: MediaKind
    format: str
    digest: str
    name: str = ""
    width: int = 0
    height: int = 0
    seconds: float = 0.0
    frames: int = 1

    @property
    def suffix(self) -> str:
        return _SUFFIX[self.format]

    @property
    def media_type(self) -> str:
        return _MEDIA_TYPES[self.format]

    @property
    def label(self) -> str:
        """``"PNG 640×480"``, ``"WAV 12.5 s"``."""
        if self.kind == "image":
            animated = ", first frame" if self.frames > 1 else ""
            return f"{self.format.upper()} {self.width}×{self.height}{animated}"
        return f"{self.format.upper()} {self.seconds:.1f} s"

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "format": self.format,
            "digest": self.digest,
            "name": self.name,
            "width": self.width,
            "height": self.height,
            "seconds": self.seconds,
            "frames": self.frames,
        }

    @classmethod
    def from_dict(cls, data: object) -> MediaRef:
        """The reference a :meth:`to_dict` wrote.

        Raises:
            ValueError: not such a dict (a damaged row).
        """
        if not isinstance(data, dict):
            raise ValueError("an attachment record must be an object")
        kind, fmt, digest = data.get("kind"), data.get("format"), data.get("digest")
        if kind not in ("image", "audio") or fmt not in _MEDIA_TYPES or not _is_digest(digest):
            raise ValueError(f"not an attachment record: {data!r:.120}")
        return cls(
            kind,
            str(fmt),
            str(digest),
            str(data.get("name") or ""),
            int(data.get("width") or 0),
            int(data.get("height") or 0),
            float(data.get("seconds") or 0.0),
            int(data.get("frames") or 1),
        )


def load_media(path: Path | str, *, name: str | None = None) -> Media:
    """Reads and checks an attachment from a file (a named pipe or a device is refused unopened).

    Raises:
        MediaError: not a regular file, unreadable, too large, not a supported image or clip.
    """
    path = Path(path)
    shown = name if name is not None else path.name
    try:
        fh = open_model_file(path)
    except ModelFileError as exc:
        reason = exc.reason.replace("not a model file", "not an image")
        raise MediaError(str(path), reason) from None
    with fh:
        size = os.fstat(fh.fileno()).st_size
        if size > MAX_MEDIA_BYTES:
            raise MediaError(str(path), f"{_mib(size)} is more than the {_mib(MAX_MEDIA_BYTES)} an attachment may be")
        try:
            data = fh.read(MAX_MEDIA_BYTES + 1)
        except OSError as exc:
            raise MediaError(str(path), f"cannot read the file ({exc.strerror or exc})") from None
    return read_media(data, name=shown, where=str(path))


def read_media(data: bytes, *, name: str = "", where: str | None = None) -> Media:
    """Checks an attachment's bytes: the format by content, the header's sizes, the structure's end.

    Args:
        data: the whole file.
        name: the name shown with it.
        where: what errors name (the path, or a request's field); ``name`` when not given.

    Raises:
        MediaError: the reason in one line.
    """
    label = where if where is not None else name
    if len(data) > MAX_MEDIA_BYTES:
        raise MediaError(label, f"{_mib(len(data))} is more than the {_mib(MAX_MEDIA_BYTES)} an attachment may be")
    if not data:
        raise MediaError(label, "the file is empty (0 bytes)")
    fmt = _sniff(data)
    if fmt is None:
        raise MediaError(label, _not_media(data))
    try:
        if fmt in ("png", "jpeg", "webp", "gif", "bmp"):
            width, height, frames = _IMAGE_READERS[fmt](data)
            _check_size(width, height)
            return Media("image", fmt, _digest(data), data, name, width, height, frames=frames)
        seconds = _AUDIO_READERS[fmt](data)
    except _Truncated as exc:
        raise MediaError(label, f"the {fmt.upper()} file is truncated ({exc}): it ends before its data does") from None
    except _Bad as exc:
        raise MediaError(label, f"not a valid {fmt.upper()} file ({exc})") from None
    except _TooLarge as exc:
        raise MediaError(label, str(exc)) from None
    if seconds > MAX_AUDIO_SECONDS:
        raise MediaError(label, f"the clip is {seconds:.0f} s long; at most {MAX_AUDIO_SECONDS:.0f} s are read")
    return Media("audio", fmt, _digest(data), data, name, seconds=seconds)


# ----------------------------------------------------------------------------- what the bytes are
def _sniff(data: bytes) -> str | None:
    head = data[:16]
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if head[:2] == b"BM" and len(data) >= 26:
        return "bmp"
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "wav"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:3] == b"ID3" or (len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE6 == 0xE2):
        return "mp3"  # an ID3 tag, or an MPEG audio frame header (layer III)
    return None


def _not_media(data: bytes) -> str:
    """Why bytes that are not a supported image or clip are refused, naming what they look like."""
    head = data[:64]
    lowered = data[:2048].lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    others = (
        ((b"II*\x00", b"MM\x00*"), "a TIFF image, which is not supported: convert it to PNG or JPEG"),
        ((b"%PDF",), "a PDF document, not an image: attach it as a document instead"),
        ((b"PK\x03\x04", b"PK\x05\x06"), "a zip archive, not an image"),
        ((b"GGUF",), "a GGUF model file, not an image"),
        ((b"\x7fELF", b"MZ"), "a program, not an image"),
        ((b"OggS",), "an Ogg file, which is not supported: convert it to WAV, MP3 or FLAC"),
        ((b"\x00\x00\x01\x00",), "an icon (ICO), which is not supported: convert it to PNG"),
    )
    for magics, reason in others:
        if head.startswith(magics):
            return f"this is {reason}"
    if head[4:8] == b"ftyp":
        brand = head[8:12]
        if brand in (b"heic", b"heix", b"mif1", b"msf1", b"hevc"):
            return "this is a HEIC image, which is not supported: convert it to JPEG or PNG"
        if brand in (b"avif", b"avis"):
            return "this is an AVIF image, which is not supported: convert it to PNG or JPEG"
        return "this is an MP4/QuickTime file, which is not supported"
    if lowered.startswith((b"<!doctype html", b"<html")) or b"<html" in lowered:
        return "this is an HTML page, not an image (a saved web page?)"
    if lowered.startswith((b"<?xml", b"<svg")) and b"<svg" in lowered:
        return "this is an SVG drawing, which is not supported: export it as PNG"
    if head[:4] == b"RIFF":
        return f"this is a RIFF file of type {head[8:12]!r}, not a WAV clip or a WebP image"
    sample = data[:512]
    if all(32 <= b < 127 or b in (9, 10, 13) for b in sample):
        return "this is a text file, not an image"
    return f"not a PNG, JPEG, WebP, GIF or BMP image, nor a WAV, MP3 or FLAC clip (it starts with 0x{head[:4].hex()})"


def _check_size(width: int, height: int) -> None:
    if width <= 0 or height <= 0:
        raise _Bad(f"a size of {width}×{height} pixels")
    if max(width, height) > MAX_IMAGE_SIDE or width * height > MAX_IMAGE_PIXELS:
        raise _TooLarge(
            f"the image is {width:,}×{height:,} pixels; at most {MAX_IMAGE_SIDE:,} a side and "
            f"{MAX_IMAGE_PIXELS / 1e6:.0f} megapixels are read (a decompression bomb, or scale it down first)"
        )


class _Truncated(Exception):
    pass


class _Bad(Exception):
    pass


class _TooLarge(Exception):
    pass


def _need(data: bytes, end: int, what: str) -> None:
    if end > len(data):
        raise _Truncated(f"{what} needs {end:,} bytes, the file has {len(data):,}")


def _u16be(data: bytes, at: int) -> int:
    return int(struct.unpack_from(">H", data, at)[0])


def _u32be(data: bytes, at: int) -> int:
    return int(struct.unpack_from(">I", data, at)[0])


def _u16le(data: bytes, at: int) -> int:
    return int(struct.unpack_from("<H", data, at)[0])


def _u32le(data: bytes, at: int) -> int:
    return int(struct.unpack_from("<I", data, at)[0])


# ----------------------------------------------------------------------------- images
def _png(data: bytes) -> tuple[int, int, int]:
    """PNG: IHDR first, then chunks each within the file, up to IEND; APNG's frame count."""
    _need(data, 33, "the PNG header")
    if data[12:16] != b"IHDR" or _u32be(data, 8) != 13:
        raise _Bad("its first chunk is not IHDR")
    width, height = _u32be(data, 16), _u32be(data, 20)
    depth, color = data[24], data[25]
    if color not in (0, 2, 3, 4, 6) or depth not in (1, 2, 4, 8, 16):
        raise _Bad(f"bit depth {depth} with colour type {color}")
    at, frames, seen_data = 8, 1, False
    while True:
        _need(data, at + 8, "a chunk header")
        length, kind = _u32be(data, at), data[at + 4 : at + 8]
        if length > 2**31 - 1:
            raise _Bad(f"a chunk of {length:,} bytes")
        _need(data, at + 12 + length, f"the {kind.decode('latin-1')!r} chunk")
        if kind == b"acTL" and length >= 8:
            frames = max(1, _u32be(data, at + 8))
        elif kind == b"IDAT":
            seen_data = True
        elif kind == b"IEND":
            break
        at += 12 + length
    if not seen_data:
        raise _Bad("it holds no image data (IDAT)")
    return width, height, frames


_SOF_MARKERS: Final = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _jpeg(data: bytes) -> tuple[int, int, int]:
    """JPEG: markers walked from SOI to the first frame header (SOF), then an EOI after the scan."""
    at = 2
    size: tuple[int, int] | None = None
    while size is None:
        _need(data, at + 4, "a marker")
        if data[at] != 0xFF:
            raise _Bad(f"no marker at byte {at}")
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            at += 2
            continue
        if marker == 0xD9:
            raise _Bad("it ends before its frame header")
        length = _u16be(data, at + 2)
        if length < 2:
            raise _Bad(f"a segment of length {length}")
        _need(data, at + 2 + length, "a segment")
        if marker in _SOF_MARKERS:
            if length < 8:
                raise _Bad("a frame header too short")
            size = (_u16be(data, at + 7), _u16be(data, at + 5))
        at += 2 + length
    # Truncation: the entropy-coded data must end with EOI (cameras may append bytes after it).
    if data.rfind(b"\xff\xd9", at) < 0:
        raise _Truncated("no end-of-image marker after the image data")
    return size[0], size[1], 1


def _webp(data: bytes) -> tuple[int, int, int]:
    """WebP: the RIFF size within the file, then VP8 (lossy), VP8L (lossless) or VP8X (extended)."""
    _need(data, 30, "the WebP header")
    riff = _u32le(data, 4)
    _need(data, 8 + riff, "the RIFF container")
    kind, length = data[12:16], _u32le(data, 16)
    _need(data, 20 + length, f"the {kind.decode('latin-1')!r} chunk")
    body = 20
    if kind == b"VP8 ":
        if data[body + 3 : body + 6] != b"\x9d\x01\x2a":
            raise _Bad("a VP8 frame without its start code")
        return _u16le(data, body + 6) & 0x3FFF, _u16le(data, body + 8) & 0x3FFF, 1
    if kind == b"VP8L":
        if data[body] != 0x2F:
            raise _Bad("a VP8L stream without its signature")
        bits = _u32le(data, body + 1)
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1, 1
    if kind == b"VP8X":
        flags = data[body]
        width = 1 + int.from_bytes(data[body + 4 : body + 7], "little")
        height = 1 + int.from_bytes(data[body + 7 : body + 10], "little")
        frames = 1
        if flags & 0x02:  # animated: count the frames (bounded by the file)
            at, frames = 20 + length + (length & 1), 0
            while at + 8 <= 8 + riff:
                chunk, size = data[at : at + 4], _u32le(data, at + 4)
                _need(data, at + 8 + size, "a frame")
                frames += chunk == b"ANMF"
                at += 8 + size + (size & 1)
            frames = max(frames, 1)
        return width, height, frames
    raise _Bad(f"an unknown first chunk {kind!r}")


def _gif(data: bytes) -> tuple[int, int, int]:
    """GIF: the logical screen, then blocks up to the first image's data, all within the file."""
    _need(data, 13, "the GIF header")
    width, height, packed = _u16le(data, 6), _u16le(data, 8), data[10]
    at = 13 + (3 * 2 ** ((packed & 7) + 1) if packed & 0x80 else 0)
    frames = 0
    while True:
        _need(data, at + 1, "a block")
        block = data[at]
        if block == 0x3B:  # trailer
            break
        if block == 0x21:  # extension: label, then sub-blocks
            at = _sub_blocks(data, at + 2)
            continue
        if block != 0x2C:
            raise _Bad(f"an unknown block 0x{block:02x} at byte {at}")
        _need(data, at + 10, "an image descriptor")
        left, top = _u16le(data, at + 1), _u16le(data, at + 3)
        frame_w, frame_h, local = _u16le(data, at + 5), _u16le(data, at + 7), data[at + 9]
        if frames == 0:
            width, height = max(width, left + frame_w), max(height, top + frame_h)
        at += 10 + (3 * 2 ** ((local & 7) + 1) if local & 0x80 else 0)
        _need(data, at + 1, "the image's code size")
        at = _sub_blocks(data, at + 1)
        frames += 1
        if frames >= 4096:
            break  # enough to know it is animated; the first frame is what is read
    if frames == 0:
        raise _Bad("it holds no image")
    return width, height, frames


def _sub_blocks(data: bytes, at: int) -> int:
    """The offset after a chain of GIF data sub-blocks (each a length byte and its bytes)."""
    while True:
        _need(data, at + 1, "a data sub-block")
        size = data[at]
        at += 1 + size
        if size == 0:
            return at
        _need(data, at, "a data sub-block")


def _bmp(data: bytes) -> tuple[int, int, int]:
    """BMP: the DIB header's size; an uncompressed bitmap's rows must all be in the file."""
    offset, header = _u32le(data, 10), _u32le(data, 14)
    if header == 12:
        _need(data, 26, "the BMP header")
        width, height, bpp, compression = _u16le(data, 18), _u16le(data, 20), _u16le(data, 24), 0
    elif header in (40, 52, 56, 64, 108, 124):
        _need(data, 14 + header, "the BMP header")
        width, height = struct.unpack_from("<ii", data, 18)
        bpp, compression = _u16le(data, 28), _u32le(data, 30)
        height = abs(height)  # negative: rows stored top-down
    else:
        raise _Bad(f"a DIB header of {header} bytes")
    if bpp not in (1, 4, 8, 16, 24, 32):
        raise _Bad(f"{bpp} bits per pixel")
    if width <= 0 or height <= 0:
        raise _Bad(f"a size of {width}×{height}")
    _check_size(width, height)
    if compression in (0, 3, 6):  # uncompressed (RGB or bit fields): the rows are a known size
        row = (width * bpp + 31) // 32 * 4
        _need(data, offset + row * height, "the pixel rows")
    return width, height, 1


_IMAGE_READERS: Final = {"png": _png, "jpeg": _jpeg, "webp": _webp, "gif": _gif, "bmp": _bmp}


# ----------------------------------------------------------------------------- audio
def _wav(data: bytes) -> float:
    """WAV: the fmt chunk (PCM, float or extensible), then the data chunk within the file."""
    _need(data, 12, "the WAV header")
    at, fmt = 12, None
    while True:
        _need(data, at + 8, "a chunk header")
        kind, size = data[at : at + 4], _u32le(data, at + 4)
        if kind == b"fmt ":
            _need(data, at + 8 + 16, "the fmt chunk")
            tag, channels, rate = _u16le(data, at + 8), _u16le(data, at + 10), _u32le(data, at + 12)
            bits = _u16le(data, at + 22)
            if tag not in (1, 3, 0xFFFE) or not 0 < channels <= 8 or not 1000 <= rate <= 384_000 or bits % 8:
                raise _Bad(f"format {tag}, {channels} channels, {rate} Hz, {bits} bits")
            fmt = (channels, rate, max(bits // 8, 1))
        elif kind == b"data":
            if fmt is None:
                raise _Bad("its data comes before its format")
            _need(data, at + 8 + size, "the data chunk")
            channels, rate, width = fmt
            return size / (channels * rate * width)
        at += 8 + size + (size & 1)


def _flac(data: bytes) -> float:
    """FLAC: the STREAMINFO block's rate and sample count; the metadata blocks within the file."""
    _need(data, 42, "the FLAC header")
    if data[4] & 0x7F != 0:
        raise _Bad("its first metadata block is not STREAMINFO")
    info = int.from_bytes(data[18:26], "big")
    rate = info >> 44
    samples = info & ((1 << 36) - 1)
    if not 1000 <= rate <= 655_350:
        raise _Bad(f"a sample rate of {rate} Hz")
    at = 4
    while True:
        _need(data, at + 4, "a metadata block")
        last, size = data[at] & 0x80, int.from_bytes(data[at + 1 : at + 4], "big")
        _need(data, at + 4 + size, "a metadata block")
        at += 4 + size
        if last:
            break
    _need(data, at + 2, "the first audio frame")
    if data[at] != 0xFF or data[at + 1] & 0xFC != 0xF8:
        raise _Bad("no audio frame after the metadata")
    return samples / rate if samples else (len(data) - at) * 8 / (rate * 16)


_MP3_RATES: Final = {
    3: (44100, 48000, 32000),  # MPEG-1
    2: (22050, 24000, 16000),  # MPEG-2
    0: (11025, 12000, 8000),  # MPEG-2.5
}
_MP3_KBPS: Final = {
    3: (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    2: (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}


def _mp3(data: bytes) -> float:
    """MP3: an ID3v2 tag skipped, then a layer III frame header; the length estimated from its bit rate."""
    at = 0
    if data[:3] == b"ID3":
        _need(data, 10, "the ID3 tag")
        size = (data[6] & 0x7F) << 21 | (data[7] & 0x7F) << 14 | (data[8] & 0x7F) << 7 | (data[9] & 0x7F)
        at = 10 + size
        _need(data, at + 4, "the ID3 tag and the first frame")
    found = False
    for start in range(at, min(at + 64 * 1024, len(data) - 3)):  # padding may come before the first frame
        if data[start] == 0xFF and data[start + 1] & 0xE6 == 0xE2:
            at, found = start, True
            break
    if not found:
        raise _Bad("no MPEG audio frame")
    version, index, rate_index = (data[at + 1] >> 3) & 3, data[at + 2] >> 4, (data[at + 2] >> 2) & 3
    if version == 1 or rate_index == 3 or index in (0, 15):
        raise _Bad("a frame header with reserved values (or a free bit rate)")
    rate = _MP3_RATES[version][rate_index]
    kbps = _MP3_KBPS[3 if version == 3 else 2][index]
    frame = (144 if version == 3 else 72) * kbps * 1000 // rate + ((data[at + 2] >> 1) & 1)
    _need(data, at + frame, "the first frame")
    return (len(data) - at) * 8 / (kbps * 1000)


_AUDIO_READERS: Final = {"wav": _wav, "flac": _flac, "mp3": _mp3}


def _digest(data: bytes) -> str:
    import hashlib  # lazy: start-up (the window's first frame imports this module's suffixes)

    return hashlib.sha256(data).hexdigest()


def _is_digest(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"
