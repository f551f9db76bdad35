"""Typed errors raised by rag; ``str()`` is one line naming the file (if any) and the reason."""

from __future__ import annotations

from pathlib import Path


class RagError(Exception):
    """Base class of every error rag raises on purpose."""


class DocumentError(RagError):
    """A document could not be read or indexed."""

    def __init__(self, path: Path | str, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


class KnowledgeBaseError(RagError):
    """A knowledge base operation failed (unknown name, store unreachable, ...)."""
