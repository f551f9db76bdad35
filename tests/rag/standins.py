"""Tiny stand-ins for the parser and chunker, so ingest tests do not depend on every format."""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rag.errors import DocumentError
from rag.knowledge import KnowledgeBases

MakeKbs = Callable[..., KnowledgeBases]


@dataclass(frozen=True)
class Doc:
    path: Path
    text: str


@dataclass(frozen=True)
class Piece:
    text: str
    page: int | None
    heading: str | None
    start: int
    end: int
    index: int


class TextParser:
    """Reads UTF-8 text; files starting with ``BINARY`` are refused like the real loaders do."""

    def __init__(self) -> None:
        self.calls = 0

    def parse(self, path: Path, timeout_s: float = 60.0, *, cancel: threading.Event | None = None) -> Doc:
        self.calls += 1
        data = path.read_bytes()
        if data.startswith(b"BINARY") or b"\0" in data[:1024]:
            raise DocumentError(path, "skipped: unsupported file type (binary)")
        return Doc(path, data.decode("utf-8", errors="replace"))

    def close(self) -> None:
        pass


def paragraph_chunks(
    doc: Doc,
    *,
    count_tokens: Callable[[str], int],
    max_tokens: int = 256,
    overlap_tokens: int = 32,
) -> list[Piece]:
    """One chunk per paragraph group up to ``max_tokens`` (no overlap; enough for these tests)."""
    pieces: list[Piece] = []
    start = 0
    buf: list[tuple[int, str]] = []

    def flush() -> None:
        if buf:
            s, e = buf[0][0], buf[-1][0] + len(buf[-1][1])
            pieces.append(Piece(doc.text[s:e], None, None, s, e, len(pieces)))
            buf.clear()

    for para in doc.text.split("\n\n"):
        pos = doc.text.index(para, start)
        start = pos + len(para)
        if not para.strip():
            continue
        joined = " ".join(t for _, t in buf) + " " + para
        if buf and count_tokens(joined) > max_tokens:
            flush()
        buf.append((pos, para))
    flush()
    return pieces


class FakeEmbedder:
    """Hashed bag of words: fast, deterministic, good enough for plumbing tests.

    Args:
        dimension: vector length.
        model_id: the id recorded with the collection.
        delay_s: sleep per text encoded (to widen windows in kill tests).
    """

    def __init__(self, dimension: int = 64, model_id: str = "fake-bow", delay_s: float = 0.0) -> None:
        self.dimension = dimension
        self.model_id = model_id
        self.max_tokens = 130
        self.delay_s = delay_s
        self.encoded = 0

    def encode(self, texts: Sequence[str], *, batch_size: int | None = None) -> np.ndarray:
        if self.delay_s:
            time.sleep(self.delay_s * len(texts))
        self.encoded += len(texts)
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                out[row, int(hashlib.md5(word.encode()).hexdigest()[:8], 16) % self.dimension] += 1.0
            norm = float(np.linalg.norm(out[row]))
            out[row] = out[row] / norm if norm else 1.0 / np.sqrt(self.dimension)
        return out

    def count_tokens(self, text: str) -> int:
        return len(text.split())


def write(folder: Path, name: str, text: str) -> Path:
    """Writes a UTF-8 file (folders created) and returns its path."""
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


class CountingParser:
    """Wraps a parser and counts the files it was asked to parse."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.parsed: list[Path] = []

    def parse(self, path: Path, timeout_s: float = 60.0, *, cancel: Any = None) -> Any:
        self.parsed.append(path)
        return self.inner.parse(path, timeout_s, cancel=cancel)
