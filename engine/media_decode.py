"""Decoding an image that passed :mod:`engine.media`'s checks: Pillow, under limits, out of the app.

:func:`decode_image` turns an image's bytes into RGB pixels, scaled down to what a projector reads
(aspect kept), with its EXIF orientation applied, transparency on white and an animation's first
frame; Pillow's decoders are told the format :mod:`engine.media` found (no other plugin is tried),
its pixel limit is Glassbox's, a truncated file is an error, and a JPEG is decoded at a reduced
scale when that is enough. It runs where a crashing decoder cannot take the app with it: in the
inference worker (:mod:`engine.inference.projector`) and in the thumbnail child
(:func:`thumbnail_in_child`, a spawned process with an address-space limit and a timeout, for a
front end that shows an image before any model reads it).

Pillow is imported by these functions only (a module-level import would cost every start-up).
"""

from __future__ import annotations

import io
import math
import multiprocessing
import warnings
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Final

from engine.errors import Cancelled
from engine.media import MAX_IMAGE_PIXELS, Media, MediaError

__all__ = ["DecodedImage", "decode_image", "fit_size", "thumbnail_in_child", "thumbnail_png"]

_PIL_FORMATS: Final = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP", "gif": "GIF", "bmp": "BMP"}
THUMBNAIL_TIMEOUT_S: Final = 20.0
THUMBNAIL_MEMORY_BYTES: Final = 1536 * 2**20


@dataclass(frozen=True)
class DecodedImage:
    """An image's RGB pixels (``width * height * 3`` bytes, rows top down) and what was done to it.

    Attributes:
        original: the size the file has (after its EXIF orientation).
        note: "" or what was changed, in words ("scaled down from 4000×3000 to 896×672 ...").
    """

    width: int
    height: int
    rgb: bytes
    original: tuple[int, int]
    note: str = ""


def fit_size(width: int, height: int, max_side: int | None, max_pixels: int | None) -> tuple[int, int]:
    """The size an image is scaled down to so that neither limit is passed (never scaled up)."""
    scale = 1.0
    if max_side and max(width, height) > max_side:
        scale = max_side / max(width, height)
    if max_pixels and width * height * scale * scale > max_pixels:
        scale = math.sqrt(max_pixels / (width * height))
    if scale >= 1.0:
        return width, height
    return max(1, round(width * scale)), max(1, round(height * scale))


def decode_image(
    media: Media, *, max_side: int | None = None, max_pixels: int | None = None, why: str = ""
) -> DecodedImage:
    """The image's RGB pixels, scaled down to ``max_side`` / ``max_pixels`` (``why`` says whose limit).

    Raises:
        MediaError: Pillow could not decode it (truncated, corrupt, a bomb past the header check).
    """
    # lazy: start-up (+20 ms: PIL)
    from PIL import Image, ImageFile, ImageOps

    if media.kind != "image":
        raise MediaError(media.name, "not an image")
    ImageFile.LOAD_TRUNCATED_IMAGES = False
    Image.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(media.data), formats=[_PIL_FORMATS[media.format]]) as opened:
                image: Any = opened
                if (image.width, image.height) != (media.width, media.height) and media.format != "gif":
                    raise MediaError(
                        media.name,
                        f"its header says {media.width}×{media.height}, the decoder {image.width}×{image.height}",
                    )
                if media.format == "jpeg":
                    target = fit_size(image.width, image.height, max_side, max_pixels)
                    image.draft("RGB", target)  # decode at 1/2, 1/4 or 1/8 scale when that is enough
                image.seek(0)
                image.load()
                before = (image.width, image.height)
                oriented = ImageOps.exif_transpose(image)
                image = oriented if oriented is not None else image
                # The file's size, turned as its EXIF orientation says (a JPEG may be decoded smaller).
                turned = (image.width, image.height) == before[::-1] and before[0] != before[1]
                original = (media.height, media.width) if turned else (media.width, media.height)
                image = _rgb(image)
                size = fit_size(image.width, image.height, max_side, max_pixels)
                if size != (image.width, image.height):
                    image = image.resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)
                rgb = image.tobytes()
    except MediaError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise MediaError(media.name, "the decoder found more pixels than its header says (a bomb)") from None
    except MemoryError:
        raise MediaError(media.name, "not enough memory to decode it") from None
    except (OSError, SyntaxError, ValueError, EOFError, IndexError, KeyError, TypeError) as exc:
        raise MediaError(media.name, f"the image cannot be decoded ({_pillow_reason(exc)})") from None
    note = ""
    if (image.width, image.height) != original:
        reason = f" ({why})" if why else ""
        note = f"scaled down from {original[0]}×{original[1]} to {image.width}×{image.height}{reason}"
    if media.frames > 1:
        first = "its first frame of " + str(media.frames)
        note = f"{first}; {note}" if note else first
    return DecodedImage(image.width, image.height, rgb, original, note)


def _rgb(image: Any) -> Any:
    """RGB, transparency composited on white (a transparent PNG's background is not black)."""
    # lazy: start-up (+14 ms: PIL)
    from PIL import Image

    if image.mode == "RGB":
        return image
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = image.convert("RGBA")
        background = Image.new("RGB", rgba.size, (255, 255, 255))
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):
        image = image.point(lambda value: value / 257).convert("L")
    return image.convert("RGB")


def _pillow_reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:160]


def thumbnail_png(media: Media, size: int) -> tuple[bytes, str]:
    """A PNG of the image at most ``size`` pixels a side, and the decode's note (in this process)."""
    # lazy: start-up (+18 ms: PIL)
    from PIL import Image

    decoded = decode_image(media, max_side=size)
    out = io.BytesIO()
    Image.frombytes("RGB", (decoded.width, decoded.height), decoded.rgb).save(out, "PNG")
    return out.getvalue(), decoded.note


def _thumbnail_child(conn: Connection, media: Media, size: int, max_memory: int) -> None:
    try:
        # lazy: POSIX only
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        soft = max_memory if hard == resource.RLIM_INFINITY else min(max_memory, hard)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    except (ImportError, ValueError, OSError):
        pass  # not Linux: the timeout still bounds it
    try:
        conn.send(("ok", thumbnail_png(media, size)))
    except MediaError as exc:
        conn.send(("error", exc.reason))
    except MemoryError:
        conn.send(("error", "not enough memory to decode it"))
    finally:
        conn.close()


def thumbnail_in_child(
    media: Media,
    size: int = 256,
    *,
    timeout_s: float = THUMBNAIL_TIMEOUT_S,
    max_memory: int = THUMBNAIL_MEMORY_BYTES,
    cancel: Any = None,
) -> bytes:
    """A PNG thumbnail made in a spawned child (address space and time limited): a decoder that
    crashes or spins there is killed, and the caller gets a one-line error.

    Raises:
        MediaError: the image could not be decoded, the child crashed or ran out of time.
        Cancelled: ``cancel`` (a ``threading.Event``) was set.
    """
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_thumbnail_child, args=(child, media, size, max_memory), name="glassbox-thumbnail")
    proc.daemon = True
    proc.start()
    child.close()
    try:
        waited = 0.0
        while not parent.poll(0.05):
            waited += 0.05
            if cancel is not None and cancel.is_set():
                raise Cancelled("thumbnail cancelled")
            if not proc.is_alive() and not parent.poll(0):
                raise MediaError(media.name, f"the image decoder crashed (exit code {proc.exitcode})")
            if waited > timeout_s:
                raise MediaError(media.name, f"decoding took longer than {timeout_s:.0f} s")
        try:
            kind, payload = parent.recv()
        except (EOFError, OSError):
            raise MediaError(media.name, f"the image decoder crashed (exit code {proc.exitcode})") from None
        if kind != "ok":
            raise MediaError(media.name, str(payload))
        png, _note = payload
        return bytes(png)
    finally:
        parent.close()
        if proc.is_alive():
            proc.kill()
        proc.join(5)
