"""Fakes for the documents band's tests through the front ends (``glassbox chat --kb``, ``glassbox
serve`` with ``knowledge_base``): knowledge bases that return a fixed ranking of passages, each
naming its rank in its text (``passage-3``), so a test can see which passages reached the model."""

from __future__ import annotations

from collections.abc import Sequence

from rag.errors import KnowledgeBaseError
from rag.retrieval import Passage


def ranked_passages(count: int, words: int) -> list[Passage]:
    """``count`` passages, best first, of ``words`` words each; the first word is ``passage-N``."""
    return [
        Passage(
            id=n,
            kb="notes",
            path=f"/docs/note-{n}.txt",
            page=None,
            heading=None,
            text=" ".join([f"passage-{n}", *(f"w{n}x{i}" for i in range(words - 1))]),
            start=0,
            end=0,
            dense_score=None,
            bm25_score=None,
            fused_score=1.0 / n,
        )
        for n in range(1, count + 1)
    ]


class RankedKnowledgeBases:
    """What the front ends' retrieval asks of ``rag.knowledge.KnowledgeBases``: one knowledge base,
    ``notes``, whose every search returns ``passages`` (cut to ``k``); the searches are recorded."""

    def __init__(self, passages: Sequence[Passage]) -> None:
        self.passages = list(passages)
        self.queries: list[tuple[list[str], str, int]] = []

    def get(self, name: str) -> dict[str, str]:
        if name != "notes":
            raise KnowledgeBaseError(f"no knowledge base named {name!r}")
        return {"name": name}

    def searchable(self, names: Sequence[str]) -> list[str]:
        for name in names:
            self.get(name)
        return list(names)

    def pending(self, names: Sequence[str] | None = None) -> int:
        return 0

    def query_many(self, names: Sequence[str], text: str, *, k: int = 5) -> list[Passage]:
        self.queries.append((list(names), text, k))
        return self.passages[:k]

    def close(self) -> None:
        pass


def passages_in(text: str) -> list[int]:
    """The ranks of the passages whose text is in ``text`` (``passage-N`` markers), in order."""
    import re

    return sorted({int(n) for n in re.findall(r"\bpassage-(\d+)\b", text)})
