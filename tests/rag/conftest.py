"""Knowledge-base fixtures: one MiniLM and one parser child per session, knowledge bases per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from standins import CountingParser, MakeKbs

from rag.embeddings import Embedder, SentenceTransformerEmbedder
from rag.knowledge import KnowledgeBases
from rag.parsing import ParserPool


@pytest.fixture(scope="session")
def minilm(embedder_path: Path) -> SentenceTransformerEmbedder:
    """The bundled all-MiniLM-L6-v2, loaded once."""
    embedder = SentenceTransformerEmbedder(embedder_path, device="cpu")
    embedder.encode(["warm up"])
    return embedder


@pytest.fixture(scope="session")
def parser_pool() -> Iterator[ParserPool]:
    """One parser child for the whole session."""
    with ParserPool() as pool:
        yield pool


@pytest.fixture
def make_kbs(tmp_path: Path, minilm: SentenceTransformerEmbedder, parser_pool: ParserPool) -> Iterator[MakeKbs]:
    """Opens ``KnowledgeBases`` under ``tmp_path`` sharing the session's model and parser.

    Keyword arguments: ``root`` (default ``tmp_path/"kb"``), ``embedders`` (folder -> embedder,
    used before the MiniLM), ``parser``, ``chunker``, ``chroma_url``.
    """
    opened: list[KnowledgeBases] = []

    def make(
        *,
        root: Path | None = None,
        embedders: dict[str, Embedder] | None = None,
        parser: Any = None,
        chunker: Any = None,
        chroma_url: str | None = None,
    ) -> KnowledgeBases:
        table = {str(Path(k).resolve()): v for k, v in (embedders or {}).items()}

        def factory(folder: Path) -> Embedder:
            return table.get(str(folder.resolve()), minilm)

        kbs = KnowledgeBases(
            root or tmp_path / "kb",
            minilm.folder,
            chroma_url,
            embedder_factory=factory,
            parser=parser or CountingParser(parser_pool),
            chunker=chunker,
        )
        opened.append(kbs)
        return kbs

    yield make
    for kbs in opened:
        kbs.close()
