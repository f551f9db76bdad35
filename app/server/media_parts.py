"""Images and clips in a request's content parts, read inline and checked like an attachment.

OpenAI's ``image_url`` parts (``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}``,
the Responses API's ``input_image`` with its ``image_url`` text) and ``input_audio`` parts
(``{"data": base64, "format": "wav"}``), and Anthropic's ``image`` blocks
(``{"type": "image", "source": {"type": "base64", "media_type": ..., "data": ...}}``) become
:class:`engine.media.Media`, through :func:`engine.media.read_media`'s checks (the format by
content, bombs, truncation). Nothing is ever fetched: an ``http(s)`` URL (or an Anthropic ``url``
source) is a 400 that says to send the bytes inline. Every refusal is a 400 naming the part.
See ARCHITECTURE.md, "The HTTP contract".
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping

from app.server.errors import HttpError
from engine.media import MAX_MEDIA_BYTES, Media, MediaError, read_media

__all__ = ["anthropic_image", "audio_part", "image_url_part"]

_MAX_BASE64 = (MAX_MEDIA_BYTES // 3 + 1) * 4


def image_url_part(part: Mapping[str, object], where: str) -> Media:
    """An OpenAI ``image_url`` part (or a Responses ``input_image`` part).

    Raises:
        HttpError: 400 for a URL that is not ``data:``, bad base64, or bytes that are not a usable image.
    """
    value = part.get("image_url")
    url = value.get("url") if isinstance(value, Mapping) else value
    spot = f"{where}.image_url" + (".url" if isinstance(value, Mapping) else "")
    if isinstance(value, Mapping) and value.get("detail") not in (None, "auto", "low", "high"):
        raise HttpError(400, f"{spot}: 'detail' must be auto, low or high", code="invalid_value", param=spot)
    if not isinstance(url, str) or not url:
        raise HttpError(400, f"{spot} must be a data: URL", code="invalid_value", param=spot)
    head = url[:16].lower()
    if head.startswith(("http://", "https://")):
        raise HttpError(
            400,
            f"{spot}: this server does not fetch images from URLs; send the image inline as a data: URL "
            "(data:image/png;base64,...)",
            code="unsupported_image_url",
            param=spot,
        )
    if not head.startswith("data:"):
        raise HttpError(400, f"{spot} must be a data: URL (data:image/png;base64,...)", param=spot)
    meta, comma, payload = url.partition(",")
    if not comma or not meta.lower().endswith(";base64"):
        raise HttpError(400, f"{spot}: only base64 data: URLs are read", code="invalid_value", param=spot)
    return _media(_decode(payload, spot), spot, "image")


def audio_part(part: Mapping[str, object], where: str) -> Media:
    """An OpenAI ``input_audio`` part: ``{"data": base64, "format": "wav" | "mp3" | "flac"}``.

    Raises:
        HttpError: 400 for a bad part or bytes that are not a usable clip.
    """
    value = part.get("input_audio")
    spot = f"{where}.input_audio"
    if not isinstance(value, Mapping) or not isinstance(value.get("data"), str):
        raise HttpError(400, f"{spot} must be {{'data': base64, 'format': 'wav'}}", code="invalid_value", param=spot)
    if value.get("format") not in (None, "wav", "mp3", "flac"):
        raise HttpError(400, f"{spot}.format must be wav, mp3 or flac", code="invalid_value", param=f"{spot}.format")
    return _media(_decode(str(value["data"]), f"{spot}.data"), spot, "audio")


def anthropic_image(block: Mapping[str, object], where: str) -> Media:
    """An Anthropic ``image`` block with a ``base64`` source.

    Raises:
        HttpError: 400 for a ``url`` source (nothing is fetched), bad base64 or a bad image.
    """
    source = block.get("source")
    spot = f"{where}.source"
    if not isinstance(source, Mapping):
        raise HttpError(400, f"{spot} must be a base64 image source", code="invalid_value", param=spot)
    if source.get("type") == "url":
        raise HttpError(
            400,
            f"{spot}: this server does not fetch images from URLs; send it as a base64 source",
            code="unsupported_image_url",
            param=spot,
        )
    if source.get("type") != "base64" or not isinstance(source.get("data"), str):
        raise HttpError(400, f"{spot} must be {{'type': 'base64', 'media_type', 'data'}}", param=spot)
    return _media(_decode(str(source["data"]), f"{spot}.data"), spot, "image")


def _decode(payload: str, spot: str) -> bytes:
    if len(payload) > _MAX_BASE64:
        limit = MAX_MEDIA_BYTES // 2**20
        raise HttpError(400, f"{spot}: more than the {limit} MiB an image may be", code="invalid_image", param=spot)
    try:
        return base64.b64decode("".join(payload.split()), validate=True)
    except (binascii.Error, ValueError):
        raise HttpError(400, f"{spot}: not valid base64", code="invalid_value", param=spot) from None


def _media(data: bytes, spot: str, kind: str) -> Media:
    try:
        media = read_media(data, name=spot)
    except MediaError as exc:
        raise HttpError(400, str(exc), code="invalid_image", param=spot) from None
    if media.kind != kind:
        raise HttpError(400, f"{spot}: this is {media.label}, not an {kind}", code="invalid_image", param=spot)
    return media
