"""The desktop app's API server answers from the window's knowledge bases through the window's
knowledge process (``app.gui.api_server_control.SharedKnowledge``): every call the server's
retrieval makes reaches it by name, and an unknown knowledge base is the knowledge base's own error."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from app.gui.api_server_control import SharedKnowledge
from app.gui.workers.knowledge_worker import KnowledgeAdapter
from app.knowledge_glue import make_retriever
from app.paths import Paths
from rag.errors import KnowledgeBaseError

pytestmark = pytest.mark.gui


class RecordingKnowledgeBases:
    """What the server's retrieval asks of ``rag.knowledge.KnowledgeBases``, recorded; one
    knowledge base, ``notes``, with 3 chunks waiting for their embedding."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.waiting = 3

    def get(self, name: str) -> dict[str, str]:
        self.calls.append(("get", name))
        if name != "notes":
            raise KnowledgeBaseError(f"no knowledge base named {name!r}")
        return {"name": name}

    def searchable(self, names: Sequence[str]) -> list[str]:
        self.calls.append(("searchable", list(names)))
        for name in names:
            self.get(name)
        return list(names)

    def pending(self, names: Sequence[str] | None = None) -> int:
        self.calls.append(("pending", names))
        return self.waiting

    def rebuild(self, names: Sequence[str] | None = None, **_: object) -> None:
        self.calls.append(("rebuild", names))
        self.waiting = 0

    def query_many(self, names: Sequence[str], text: str, *, k: int = 5) -> list[object]:
        self.calls.append(("query_many", (list(names), text, k)))
        return []


@pytest.fixture
def knowledge(qapp: object, tmp_path: Path) -> Iterator[tuple[SharedKnowledge, RecordingKnowledgeBases]]:
    kbs = RecordingKnowledgeBases()
    adapter = KnowledgeAdapter(tmp_path / "knowledge", kb_factory=lambda: kbs, check_at_start=False)
    try:
        yield SharedKnowledge(adapter), kbs
    finally:
        adapter.shutdown()


def test_the_servers_retrieval_reaches_the_windows_knowledge_bases(
    knowledge: tuple[SharedKnowledge, RecordingKnowledgeBases], tmp_path: Path
) -> None:
    shared, kbs = knowledge
    shared.get("notes")
    retrieve = make_retriever(Paths.resolve(tmp_path), ["notes"], kbs=shared)
    found = retrieve("where is the lighthouse?")
    assert found is None  # nothing found: no passages
    assert [name for name, _ in kbs.calls] == ["get", "searchable", "get", "pending", "rebuild", "query_many"]
    assert kbs.calls[-1][1][:2] == (["notes"], "where is the lighthouse?")  # type: ignore[index]
    shared.close()  # the window keeps owning its knowledge process
    assert shared.pending(["notes"]) == 0


def test_an_unknown_knowledge_base_is_its_own_one_line_error(
    knowledge: tuple[SharedKnowledge, RecordingKnowledgeBases],
) -> None:
    shared, _ = knowledge
    with pytest.raises(KnowledgeBaseError, match="no knowledge base named 'drafts'"):
        shared.get("drafts")
