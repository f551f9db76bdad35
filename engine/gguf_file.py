"""Opening model files safely, and naming what a file is when it is not GGUF.

Owns :func:`open_model_file` (refuses a named pipe, socket, device or folder before opening it,
and opens non-blocking, so nothing called ``*.gguf`` can block the caller), :func:`describe_non_gguf`
and :func:`sniff_model_file` (a one-line reason from a file's first bytes: an empty file, a Git LFS
pointer, an HTML page, safetensors, a pickle, old GGML ...) and :func:`os_error` (an ``OSError`` as
a one-line :class:`engine.errors.ModelFileError`). The header itself is parsed by :mod:`engine.gguf`.
"""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path
from typing import BinaryIO

from engine.errors import ModelFileError
from engine.gguf_format import GGUF_MAGIC

__all__ = ["describe_non_gguf", "open_model_file", "os_error", "sniff_model_file"]

_OLD_GGML_MAGICS = {b"ggml": "ggml", b"ggmf": "ggmf", b"ggjt": "ggjt", b"ggla": "ggla", b"ggsn": "ggsn"}
_U64 = struct.Struct("<Q")


def sniff_model_file(path: Path | str) -> str | None:
    """Names what a file is when it is clearly not GGUF (see :func:`describe_non_gguf`).

    Args:
        path: the file.

    Returns:
        A one-line reason, or None when the file starts like GGUF.

    Raises:
        OSError: the file cannot be read.
    """
    try:
        fh = open_model_file(path)
    except ModelFileError as exc:
        if exc.__cause__ is not None:
            raise exc.__cause__ from None  # the OSError, as documented
        return exc.reason  # not a regular file: a named pipe would block, a folder has no bytes
    with fh:
        size = os.fstat(fh.fileno()).st_size
        return describe_non_gguf(fh.read(4096), size)


def open_model_file(path: Path | str) -> BinaryIO:
    """Opens a model file for reading, refusing anything but a regular file before opening it.

    The type is checked with ``os.stat`` first, so a named pipe called ``model.gguf`` is refused
    instead of blocking the caller until a writer comes (and a device is never opened); the open
    itself is non-blocking and the type is checked again on the open file, in case the path was
    swapped in between.

    Args:
        path: the file (symlinks are followed).

    Returns:
        The file, open in binary mode; the caller closes it.

    Raises:
        ModelFileError: the path is missing, not a regular file or unreadable; its ``reason`` says
            which. An ``OSError`` behind it is its ``__cause__``.
    """
    path = Path(path)
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise ModelFileError(path, _not_regular(st.st_mode))
        flags = os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(path, flags | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise os_error(path, exc) from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ModelFileError(path, _not_regular(st.st_mode))
        if hasattr(os, "O_NONBLOCK"):
            os.set_blocking(fd, True)  # a regular file reads the same either way; keep it plain
        return os.fdopen(fd, "rb")
    except BaseException as exc:
        os.close(fd)
        if isinstance(exc, OSError):
            raise os_error(path, exc) from exc
        raise


def _not_regular(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "is a folder, not a model file"
    if stat.S_ISFIFO(mode):
        kind = "a named pipe"
    elif stat.S_ISSOCK(mode):
        kind = "a socket"
    elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        kind = "a device file"
    else:
        kind = "a special file"
    return f"not a regular file ({kind})"


def os_error(path: Path, exc: OSError) -> ModelFileError:
    """The one-line :class:`ModelFileError` for an ``OSError`` met opening or reading ``path``."""
    if isinstance(exc, FileNotFoundError):
        return ModelFileError(path, "no such file")
    if isinstance(exc, IsADirectoryError):
        return ModelFileError(path, "is a folder, not a model file")
    if isinstance(exc, PermissionError):
        return ModelFileError(path, "permission denied")
    return ModelFileError(path, f"cannot read the file ({exc.strerror or exc})")


def describe_non_gguf(head: bytes, file_size: int) -> str | None:
    """Names what a file is when it is clearly not GGUF, from its first bytes.

    Args:
        head: the first bytes of the file (at least 64 are best; up to a few KiB help HTML).
        file_size: the whole file's size.

    Returns:
        A one-line reason (e.g. "this is a Git LFS pointer, not the model: download the real
        file"), or None when the file starts like GGUF (or is too short to tell).
    """
    if file_size == 0:
        return "the file is empty (0 bytes): download it again"
    if head.startswith(GGUF_MAGIC):
        return None
    if len(head) < 4 and GGUF_MAGIC.startswith(head):
        return None  # the parser reports it as incomplete
    stripped = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    lowered = stripped[:2048].lower()
    if stripped.startswith(b"version https://git-lfs"):
        return "this is a Git LFS pointer, not the model: download the real file"
    if lowered.startswith((b"<!doctype html", b"<html", b"<head", b"<body")) or b"<html" in lowered:
        return "this is an HTML page, not a model (wrong URL?): download the file itself"
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "this is a zip archive (for example a PyTorch checkpoint), not a GGUF model"
    if len(head) >= 9 and head[8:9] == b"{":
        header_len = int(_U64.unpack_from(head, 0)[0])
        if 2 <= header_len <= file_size - 8:
            return "this is a safetensors file, not GGUF: convert it first (glassbox models convert)"
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "this is a Python pickle (PyTorch) file, an unsafe format Glassbox never loads"
    for magic in (head[:4], head[:4][::-1]):
        if magic in _OLD_GGML_MAGICS:
            return f"old GGML format ({_OLD_GGML_MAGICS[magic]}), not supported: convert it to GGUF"
    if head[:4].lower() == b"gguf" or head[:4] == b"FUGG":
        return f"not a GGUF file (wrong magic {head[:4]!r})"
    sample = head[:512]
    if sample and all(32 <= b < 127 or b in (9, 10, 13) for b in sample):
        return "this is a text file, not a GGUF model"
    return f"not a GGUF file (it starts with 0x{head[:4].hex()})"
