"""A chat whose attached knowledge base was deleted: the deleted one is skipped (the others are
still searched), the documents button says "(missing)", one notice says so once, and no turn
shows a retrieval error."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gui_support
import pytest
from gui_support import FakeSession, start_window

from app.gui.workers.knowledge_chat import ChatSearcher
from app.paths import Paths
from rag.errors import KnowledgeBaseError

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]

OTTERS = "Sea otters hold hands while they sleep so that they do not drift apart."


class Service:
    """A knowledge service that knows ``existing`` (and ``foreign`` on a Chroma server), and
    fails as ``rag.knowledge.KnowledgeBases`` does on a name it does not know."""

    def __init__(self, existing: Sequence[str], foreign: Sequence[str] = ()) -> None:
        self.existing = set(existing)
        self.foreign = list(foreign)
        self.queries: list[list[str]] = []

    def query_many(self, names: Sequence[str], text: str, *, k: int = 5) -> list[Any]:
        self.queries.append(list(names))
        for name in names:
            if name not in self.existing and name not in self.foreign:
                raise KnowledgeBaseError(f"{name}: no such knowledge base")
        return [SimpleNamespace(path="/docs/otters.md", page=None, heading=None, text=OTTERS, fused_score=0.5)]

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if method == "get":
            if args[0] not in self.existing:
                raise KnowledgeBaseError(f"{args[0]}: no such knowledge base")
            return SimpleNamespace(name=args[0])
        if method == "foreign":
            return list(self.foreign)
        raise AssertionError(method)

    def close(self) -> None:
        pass


def test_the_searcher_skips_deleted_knowledge_bases_and_says_which() -> None:
    service = Service(["otters"], foreign=["shared"])
    told: list[list[str]] = []
    searcher = ChatSearcher(lambda: service, told.append)
    found = searcher.query_many(["otters", "gone", "shared"], "sleep")
    assert [p.text for p in found] == [OTTERS]
    assert told == [["gone"]]  # another home's knowledge base on the server is not "missing"
    assert service.queries[-1] == ["otters", "shared"]
    # Only deleted ones: nothing to search, no error.
    assert searcher.query_many(["gone"], "sleep") == [] and told[-1] == ["gone"]
    # Another knowledge-base error (every name exists) is not hidden.
    broken = Service(["otters"])
    broken.query_many = lambda names, text, k=5: (_ for _ in ()).throw(KnowledgeBaseError("index damaged"))
    with pytest.raises(KnowledgeBaseError, match="index damaged"):
        ChatSearcher(lambda: broken, told.append).query_many(["otters"], "x")


@pytest.fixture
def window(qtbot: Any, paths: Paths, fake_model: Path) -> Iterator[Any]:
    w = start_window(qtbot, paths, FakeSession, fake_model)
    w.knowledge.service.close()
    w.knowledge.service = Service(["otters"])
    # The knowledge bases as the registry lists them now: "trains" was deleted.
    w.knowledge.list_names = lambda: w.knowledge.names_listed.emit(["otters"])
    yield w
    w.shutdown()


send = functools.partial(gui_support.send, timeout_ms=10000)


def test_a_deleted_knowledge_base_is_skipped_marked_missing_and_said_once(qtbot: Any, window: Any) -> None:
    w = window
    errors: list[str] = []
    notices: list[str] = []
    w.chat.error_occurred.connect(errors.append)
    w.statusBar().messageChanged.connect(notices.append)
    w.documents.set_chat_documents(["otters", "trains"])
    qtbot.waitUntil(
        lambda: (
            w.chat.conversation is not None and list(w.chat.conversation.knowledge_bases or []) == ["otters", "trains"]
        ),
        timeout=5000,
    )
    for question in ("Where do otters sleep?", "And at night?", "Why?"):
        send(qtbot, w, question)
        # The answer still comes from the knowledge base that exists.
        assert OTTERS in (w.sessions[-1].calls[-1].documents or "")
    assert errors == []  # never "Documents not used: ..." on a turn
    assert not w.banner.isVisible()
    said = [n for n in notices if "no longer exists" in n]
    assert said == ["Knowledge base “trains” no longer exists: this chat skips it (untick it under Documents)."]
    qtbot.waitUntil(lambda: "trains (missing)" in w.documents_bar.button.full_text(), timeout=5000)
    assert w.documents_bar.button.full_text() == "Documents: otters, trains (missing)"
    assert "trains" in w.documents_bar.button.toolTip() and "skipped" in w.documents_bar.button.toolTip()
    # The chat keeps its choice (nothing detached behind the user's back); unticking it clears the mark.
    assert list(w.chat.conversation.knowledge_bases) == ["otters", "trains"]
    w.documents_bar.toggle("trains", False)
    assert w.documents_bar.button.full_text() == "Documents: otters"


def test_a_knowledge_base_being_created_is_not_missing(qtbot: Any) -> None:
    from app.gui.documents_bar import DocumentsBarWidget

    bar = DocumentsBarWidget()
    qtbot.addWidget(bar)
    bar.creating.add("papers")
    bar.set_attached(["papers"])
    bar.set_available([])
    assert bar.button.full_text() == "Documents: papers"
    bar.creating.discard("papers")
    bar.set_available([])
    assert bar.button.full_text() == "Documents: papers (missing)"
