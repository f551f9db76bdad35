"""Images and clips built in the test: good ones (Pillow writes them) and hostile shapes (bombs,
huge headers, truncations, files that are not images), written with ``struct`` and ``zlib``."""

from __future__ import annotations

import io
import math
import struct
import zlib
from pathlib import Path

__all__ = [
    "bmp_header_only",
    "gif_huge_screen",
    "good_image",
    "jpeg_huge_sof",
    "png_bomb",
    "png_bytes",
    "png_corrupt_data",
    "wav_bytes",
    "webp_huge_canvas",
]


def good_image(fmt: str, size: tuple[int, int] = (96, 64), *, frames: int = 1, mode: str = "RGB") -> bytes:
    """A real image of ``fmt`` (Pillow's writer): a gradient, so decoders have work to do."""
    from PIL import Image

    width, height = size
    images = []
    for frame in range(frames):
        image = Image.new(mode if mode != "P" else "RGB", size)
        pixels = [((x * 255) // max(width - 1, 1), (y * 255) // max(height - 1, 1), (frame * 80) % 256)
                  for y in range(height) for x in range(width)]  # fmt: skip
        image.putdata(pixels)  # type: ignore[arg-type]
        if mode == "RGBA":
            image.putalpha(128)
        if mode == "P":
            image = image.convert("P")
        images.append(image)
    out = io.BytesIO()
    pil = {"jpeg": "JPEG", "png": "PNG", "webp": "WEBP", "gif": "GIF", "bmp": "BMP"}[fmt]
    if frames > 1:
        images[0].save(out, pil, save_all=True, append_images=images[1:], duration=100, loop=0)
    else:
        images[0].save(out, pil)
    return out.getvalue()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_bytes(width: int, height: int, idat: bytes, *, iend: bool = True) -> bytes:
    """A PNG of the given header size around ``idat`` (already compressed)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat)
    return body + (_chunk(b"IEND", b"") if iend else b"")


def png_bomb(width: int = 50_000, height: int = 50_000) -> bytes:
    """A decompression bomb: a huge header over a few KiB of compressed zero rows."""
    rows = zlib.compressobj(9)
    data = b""
    row = b"\x00" * (1 + 3 * min(width, 4096))
    for _ in range(64):
        data += rows.compress(row)
    return png_bytes(width, height, data + rows.flush())


def png_corrupt_data(width: int = 32, height: int = 32) -> bytes:
    """A PNG whose structure is sound and whose pixel data is not zlib: only a decoder finds it."""
    return png_bytes(width, height, b"\x78\x9c" + b"\xff\xfe\xfd\xfc" * 64)


def jpeg_huge_sof(width: int = 65_535, height: int = 65_535) -> bytes:
    """A JPEG whose frame header claims a huge image."""
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, height, width, 3) + b"\x01\x11\x00\x02\x11\x01\x03\x11\x01"
    return b"\xff\xd8" + sof + b"\xff\xda\x00\x08\x01\x01\x00\x00\x3f\x00" + b"\x00" * 64 + b"\xff\xd9"


def gif_huge_screen(width: int = 60_000, height: int = 60_000) -> bytes:
    """A GIF whose logical screen is huge around a 1×1 frame."""
    head = b"GIF89a" + struct.pack("<HHBBB", width, height, 0, 0, 0)
    frame = b"\x2c" + struct.pack("<HHHHB", 0, 0, 1, 1, 0) + b"\x02\x02\x44\x01\x00"
    return head + frame + b"\x3b"


def webp_huge_canvas(width: int = 50_000, height: int = 50_000) -> bytes:
    """An extended WebP (VP8X) whose canvas is huge."""
    vp8x = bytes([0, 0, 0, 0]) + (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    chunk = b"VP8X" + struct.pack("<I", len(vp8x)) + vp8x
    body = b"WEBP" + chunk
    return b"RIFF" + struct.pack("<I", len(body)) + body


def bmp_header_only(width: int, height: int, bpp: int = 24) -> bytes:
    """A BMP header (BITMAPINFOHEADER) with no pixel rows after it."""
    dib = struct.pack("<IiiHHIIiiII", 40, width, height, 1, bpp, 0, 0, 2835, 2835, 0, 0)
    return b"BM" + struct.pack("<IHHI", 14 + len(dib), 0, 0, 14 + len(dib)) + dib


def wav_bytes(seconds: float, rate: int = 16_000, channels: int = 1) -> bytes:
    """A 16-bit PCM WAV of a 440 Hz tone."""
    n = int(seconds * rate)
    tone = (int(8000 * math.sin(2 * math.pi * 440 * i / rate)) for i in range(n))
    samples = b"".join(struct.pack("<h", value) * channels for value in tone)
    fmt = struct.pack("<HHIIHH", 1, channels, rate, rate * channels * 2, channels * 2, 16)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(samples)) + samples
    return b"RIFF" + struct.pack("<I", len(body)) + body


def write(folder: Path, name: str, data: bytes) -> Path:
    path = folder / name
    path.write_bytes(data)
    return path


def flac_bytes(seconds: float, rate: int = 16_000) -> bytes:
    """A FLAC's metadata (STREAMINFO) and the start of a frame: what the header check reads."""
    samples = int(seconds * rate)
    info = (rate << 44) | (0 << 41) | (15 << 36) | samples  # mono, 16 bits
    streaminfo = struct.pack(">HH", 4096, 4096) + b"\x00" * 6 + info.to_bytes(8, "big") + b"\x00" * 16
    return b"fLaC" + bytes([0x80]) + len(streaminfo).to_bytes(3, "big") + streaminfo + b"\xff\xf8" + b"\x00" * 32


def mp3_bytes(frames: int = 40) -> bytes:
    """An ID3 tag and ``frames`` MPEG-1 layer III frames of 128 kbit/s at 44.1 kHz (silent)."""
    tag = b"ID3\x03\x00\x00" + bytes([0, 0, 0, 10]) + b"\x00" * 10
    frame = b"\xff\xfb\x90\x64" + b"\x00" * (417 - 4)
    return tag + frame * frames
