"""Attachments checked before any decoder sees them (engine/media.py) and decoded under limits
(engine/media_decode.py): the formats by content, the hostile shapes refused in one line with
bounded memory, the pixels a projector gets."""

from __future__ import annotations

import hashlib
import os
import struct
import sys
import tracemalloc
from pathlib import Path

import pytest

from engine.media import MAX_IMAGE_PIXELS, MAX_MEDIA_BYTES, MediaError, load_media, read_media
from engine.media_decode import decode_image, fit_size, thumbnail_in_child, thumbnail_png
from tests.engine import media_fixtures as fx


@pytest.mark.parametrize(
    ("fmt", "kwargs"),
    [
        ("png", {}),
        ("png", {"mode": "RGBA"}),
        ("jpeg", {}),
        ("webp", {}),
        ("gif", {"mode": "P"}),
        ("bmp", {}),
    ],
)
def test_each_format_is_read_by_its_content_and_decodes_to_its_pixels(fmt: str, kwargs: dict[str, str]) -> None:
    data = fx.good_image(fmt, (96, 64), **kwargs)  # type: ignore[arg-type]
    media = read_media(data, name=f"picture.{fmt}")
    assert (media.kind, media.format, media.width, media.height) == ("image", fmt, 96, 64)
    assert media.digest == hashlib.sha256(data).hexdigest()
    decoded = decode_image(media)
    assert (decoded.width, decoded.height, len(decoded.rgb)) == (96, 64, 96 * 64 * 3)
    assert decoded.note == ""
    if kwargs.get("mode") == "RGBA":  # half-transparent red-ish over white, never over black
        r, g, b = decoded.rgb[0:3]
        assert min(r, g, b) >= 127


def test_the_format_comes_from_the_bytes_not_the_name(tmp_path: Path) -> None:
    png = fx.write(tmp_path, "holiday.jpg", fx.good_image("png"))
    media = load_media(png)
    assert (media.format, media.name, media.media_type, media.suffix) == ("png", "holiday.jpg", "image/png", ".png")
    page = fx.write(tmp_path, "cat.png", b"<!DOCTYPE html><html><body>404</body></html>")
    with pytest.raises(MediaError) as info:
        load_media(page)
    assert str(info.value) == f"{page}: this is an HTML page, not an image (a saved web page?)"


def test_an_animation_is_read_as_its_first_frame() -> None:
    media = read_media(fx.good_image("gif", (40, 30), frames=3, mode="P"), name="a.gif")
    assert media.frames == 3 and media.label == "GIF 40×30, first frame"
    decoded = decode_image(media)
    assert decoded.note == "its first frame of 3"
    webp = read_media(fx.good_image("webp", (40, 30), frames=2), name="a.webp")
    assert webp.frames == 2


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (fx.png_bomb(), "the image is 50,000×50,000 pixels; at most 16,384 a side"),
        (fx.png_bomb(16_000, 4_300), "the image is 16,000×4,300 pixels"),
        (fx.jpeg_huge_sof(), "the image is 65,535×65,535 pixels"),
        (fx.gif_huge_screen(), "the image is 60,000×60,000 pixels"),
        (fx.webp_huge_canvas(), "the image is 50,000×50,000 pixels"),
        (fx.bmp_header_only(50_000, 50_000), "the image is 50,000×50,000 pixels"),
    ],
    ids=["png-50k", "png-69-megapixels", "jpeg", "gif", "webp", "bmp"],
)
def test_a_huge_header_is_refused_before_decoding_with_bounded_memory(data: bytes, reason: str) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(MediaError) as info:
            read_media(data, name="bomb.png")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert reason in str(info.value)
    assert str(info.value).startswith("bomb.png: ") and "\n" not in str(info.value)
    assert peak < 2 * len(data) + 256 * 1024  # the check reads the header; it never allocates pixels
    assert MAX_IMAGE_PIXELS < 16_000 * 4_300


@pytest.mark.parametrize("fmt", ["png", "jpeg", "gif", "webp", "bmp"])
def test_a_truncated_image_says_so(fmt: str) -> None:
    data = fx.good_image(fmt, (64, 64))
    cut = data[: len(data) * 2 // 3]
    with pytest.raises(MediaError) as info:
        read_media(cut, name=f"cut.{fmt}")
    assert f"cut.{fmt}: the {fmt.upper()} file is truncated" in str(info.value)


def test_a_sound_structure_with_broken_pixels_fails_in_the_decoder_in_one_line() -> None:
    media = read_media(fx.png_corrupt_data(), name="broken.png")  # the structure is sound
    with pytest.raises(MediaError) as info:
        decode_image(media)
    assert str(info.value).startswith("broken.png: the image cannot be decoded (")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "the file is empty (0 bytes)"),
        (b"hello, this is plain text\n", "this is a text file, not an image"),
        (b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n", "this is a PDF document, not an image"),
        (b"PK\x03\x04" + b"\x00" * 40, "this is a zip archive, not an image"),
        (b"\x7fELF\x02\x01\x01" + b"\x00" * 40, "this is a program, not an image"),
        (b"\x00\x00\x00\x18ftypheic" + b"\x00" * 40, "this is a HEIC image, which is not supported"),
        (b"II*\x00" + b"\x00" * 40, "this is a TIFF image, which is not supported"),
        (b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg"/>', "this is an SVG drawing"),
        (b"GGUF\x03\x00\x00\x00" + b"\x00" * 40, "this is a GGUF model file, not an image"),
        (bytes(range(256)) * 2, "not a PNG, JPEG, WebP, GIF or BMP image"),
    ],
    ids=["empty", "text", "pdf", "zip", "elf", "heic", "tiff", "svg", "gguf", "binary"],
)
def test_what_is_not_an_image_is_named(data: bytes, reason: str) -> None:
    with pytest.raises(MediaError) as info:
        read_media(data, name="x.png")
    assert reason in str(info.value)


def test_files_that_would_block_or_are_too_large_are_refused_unopened(tmp_path: Path) -> None:
    if sys.platform != "win32":
        fifo = tmp_path / "pipe.png"
        os.mkfifo(fifo)
        with pytest.raises(MediaError) as info:
            load_media(fifo)  # a blocking open would hang the test
        assert "not a regular file (a named pipe)" in str(info.value)
    big = tmp_path / "big.png"
    with big.open("wb") as fh:  # sparse: nothing is written
        fh.truncate(MAX_MEDIA_BYTES + 1)
    with pytest.raises(MediaError) as info:
        load_media(big)
    assert "more than the 32.0 MiB an attachment may be" in str(info.value)
    with pytest.raises(MediaError) as info:
        load_media(tmp_path / "missing.png")
    assert str(info.value) == f"{tmp_path / 'missing.png'}: no such file"


def test_audio_clips_are_read_with_their_length() -> None:
    wav = read_media(fx.wav_bytes(1.5), name="tone.wav")
    assert (wav.kind, wav.format, round(wav.seconds, 3)) == ("audio", "wav", 1.5)
    flac = read_media(fx.flac_bytes(2.0), name="tone.flac")
    assert (flac.format, round(flac.seconds, 3)) == ("flac", 2.0)
    mp3 = read_media(fx.mp3_bytes(40), name="tone.mp3")
    assert mp3.format == "mp3" and abs(mp3.seconds - 40 * 1152 / 44_100) < 0.05
    assert mp3.media_type == "audio/mpeg" and wav.label == "WAV 1.5 s"


def test_hostile_clips_are_refused() -> None:
    long = fx.wav_bytes(0.01)
    header = bytearray(long)
    data_at = long.index(b"data")
    struct.pack_into("<I", header, data_at + 4, 16_000 * 2 * 3600)  # an hour of samples claimed
    with pytest.raises(MediaError) as info:
        read_media(bytes(header), name="hour.wav")
    assert "hour.wav: the WAV file is truncated" in str(info.value)
    with pytest.raises(MediaError) as info:
        read_media(fx.flac_bytes(3600.0), name="hour.flac")
    assert "hour.flac: the clip is 3600 s long; at most 600 s are read" in str(info.value)
    with pytest.raises(MediaError) as info:
        read_media(fx.wav_bytes(0.5)[:200], name="cut.wav")
    assert "cut.wav: the WAV file is truncated" in str(info.value)


def test_scaling_keeps_the_aspect_and_says_whose_limit() -> None:
    assert fit_size(4000, 3000, 896, None) == (896, 672)
    assert fit_size(800, 600, 896, None) == (800, 600)  # never scaled up
    assert fit_size(4000, 1000, None, 1_000_000) == (2000, 500)
    media = read_media(fx.good_image("jpeg", (640, 480)), name="photo.jpg")
    decoded = decode_image(media, max_side=64, why="the projector reads at most 64 pixels a side")
    assert (decoded.width, decoded.height, decoded.original) == (64, 48, (640, 480))
    assert decoded.note == "scaled down from 640×480 to 64×48 (the projector reads at most 64 pixels a side)"


def test_a_thumbnail_is_made_in_a_child_and_a_bad_image_fails_there() -> None:
    media = read_media(fx.good_image("png", (300, 200)), name="wide.png")
    png, note = thumbnail_png(media, 64)
    child_png = thumbnail_in_child(media, 64)
    assert child_png == png  # the same bytes, made out of process
    thumb = read_media(child_png, name="thumb.png")
    assert (thumb.width, thumb.height) == (64, 43) and "scaled down from 300×200" in note
    with pytest.raises(MediaError) as info:
        thumbnail_in_child(read_media(fx.png_corrupt_data(), name="broken.png"), 64)
    assert str(info.value).startswith("broken.png: the image cannot be decoded (")
