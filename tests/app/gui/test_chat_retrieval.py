"""A chat turn's passages (issue 13, "a straight, typed chat turn"): the knowledge worker searches on
its own thread before the request reaches the LLM worker, which gets the passages as data; the
engine's documents band keeps the best that fit and the reply records how many were dropped; Stop
during the search ends the turn; a failed search costs the turn its documents, not the chat."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from gui_support import FakeSession

from app.gui.workers.chat_adapter import ChatAdapter
from app.gui.workers.chat_state import ChatState, ModelState, TurnContext
from app.gui.workers.history_service import HistoryService
from app.gui.workers.knowledge_worker import KnowledgeAdapter
from app.gui.workers.llm_requests import GenerateRequest, LoadRequest
from app.paths import Paths
from engine.inference.runtime import GenerationParams

pytestmark = [pytest.mark.gui]


def passage(n: int, words: int = 5) -> SimpleNamespace:
    text = " ".join([f"p{n}w{i}" for i in range(words)])
    return SimpleNamespace(path=f"/docs/doc{n}.md", page=None, heading=None, text=text, fused_score=1.0 - n / 10)


class FakeService:
    """The knowledge service's ``query_many``: records the thread, may wait for a release or fail."""

    def __init__(self, passages: list[Any], *, fail: Exception | None = None, hold: bool = False) -> None:
        self.passages = passages
        self.fail = fail
        self.release = threading.Event()
        self.entered = threading.Event()
        if not hold:
            self.release.set()
        self.threads: list[str] = []

    def query_many(self, names: Sequence[str], text: str, *, k: int = 5) -> list[Any]:
        self.threads.append(threading.current_thread().name)
        self.entered.set()
        self.release.wait(10)
        if self.fail is not None:
            raise self.fail
        return list(self.passages)[:k]

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"unexpected knowledge call {method}")

    def close(self) -> None:
        pass


@pytest.fixture
def chat(qtbot: Any, paths: Paths, fake_model: Path) -> Iterator[tuple[ChatAdapter, KnowledgeAdapter, list[Any]]]:
    knowledge = KnowledgeAdapter(paths.knowledge, kb_factory=lambda: None, check_at_start=False)
    sessions: list[FakeSession] = []

    def factory(request: Any, bandwidth: float | None) -> FakeSession:
        sessions.append(FakeSession(request, bandwidth))
        return sessions[-1]

    adapter = ChatAdapter(HistoryService(paths.history_db), factory, knowledge.chat_retriever)
    adapter.model.load(LoadRequest(fake_model, n_ctx=512))
    qtbot.waitUntil(lambda: adapter.model_state is ModelState.LOADED, timeout=10000)
    yield adapter, knowledge, sessions
    adapter.shutdown()
    knowledge.shutdown()


def context() -> TurnContext:
    return TurnContext(system=None, params=GenerationParams(max_tokens=32), knowledge_bases=("notes",))


def finish(qtbot: Any, adapter: ChatAdapter) -> Any:
    qtbot.waitUntil(lambda: not adapter.busy and adapter.state is ChatState.IDLE, timeout=10000)
    qtbot.waitUntil(lambda: bool(adapter.thread_messages) and adapter.thread_messages[-1].state != "pending")
    return adapter.thread_messages[-1]


def test_the_passages_are_searched_on_the_knowledge_thread_and_reach_the_worker_as_data(
    qtbot: Any, chat: tuple[ChatAdapter, KnowledgeAdapter, list[FakeSession]]
) -> None:
    adapter, knowledge, sessions = chat
    knowledge.service = service = FakeService([passage(1), passage(2)])
    requests: list[GenerateRequest] = []
    adapter.generate_requested.connect(requests.append)
    found: list[Any] = []
    adapter.sources_found.connect(found.append)
    assert adapter.turns.send("What is in my notes?", context())
    reply = finish(qtbot, adapter)
    assert service.threads and all(name.startswith("glassbox-kb-query") for name in service.threads)
    assert threading.main_thread().name not in service.threads
    # The request carried the passages themselves; the worker ran no search of its own.
    passages = requests[0].turn.passages if len(requests) == 1 else None
    assert passages is not None and passages.documents.count == 2
    assert len(service.threads) == 1
    documents = sessions[-1].calls[-1].documents or ""
    assert "p1w0" in documents and "p2w0" in documents
    assert [s["path"] for s in found[0]] == ["/docs/doc1.md", "/docs/doc2.md"]
    assert reply.state == "complete" and [s["path"] for s in reply.sources] == ["/docs/doc1.md", "/docs/doc2.md"]
    assert "documents_dropped" not in (reply.stats or {})


def test_passages_that_do_not_fit_drop_the_lowest_ranked_and_the_reply_says_how_many(
    qtbot: Any, chat: tuple[ChatAdapter, KnowledgeAdapter, list[FakeSession]]
) -> None:
    adapter, knowledge, sessions = chat
    # A 512-token window gives the documents 179 (fake) tokens: two passages of 60 words fit, not six.
    knowledge.service = FakeService([passage(n, words=60) for n in range(1, 7)])
    notices: list[str] = []
    adapter.notice_posted.connect(notices.append)
    errors: list[str] = []
    adapter.error_occurred.connect(errors.append)
    assert adapter.turns.send("Tell me everything", context())
    reply = finish(qtbot, adapter)
    documents = sessions[-1].calls[-1].documents or ""
    assert "p1w0" in documents and "p2w0" in documents and "p3w0" not in documents and "p6w0" not in documents
    assert reply.state == "complete" and errors == []
    assert reply.stats["documents_dropped"] == 4
    assert [s["path"] for s in reply.sources] == ["/docs/doc1.md", "/docs/doc2.md"]
    assert any("4 of the passages" in note for note in notices)


def test_stop_while_searching_ends_the_turn_before_the_model_is_asked(
    qtbot: Any, chat: tuple[ChatAdapter, KnowledgeAdapter, list[FakeSession]]
) -> None:
    adapter, knowledge, sessions = chat
    knowledge.service = service = FakeService([passage(1)], hold=True)
    requests: list[GenerateRequest] = []
    adapter.generate_requested.connect(requests.append)
    assert adapter.turns.send("Search slowly", context())
    qtbot.waitUntil(lambda: adapter.state is ChatState.RETRIEVING, timeout=5000)
    assert service.entered.wait(5)
    adapter.turns.stop()
    assert not adapter.busy and adapter.state is ChatState.IDLE
    reply = finish(qtbot, adapter)
    assert reply.state == "partial" and reply.content == ""
    service.release.set()  # the search ends after the stop: its passages are ignored
    # The query thread answers in order: once a job queued after the search is back, so is the search.
    behind: list[object] = []
    knowledge.submit_query(lambda: "after the search", behind.append, behind.append)
    qtbot.waitUntil(lambda: behind == ["after the search"], timeout=5000)
    assert requests == [] and sessions[-1].calls == []
    assert not adapter.busy and adapter.state is ChatState.IDLE


def test_a_failed_search_is_one_line_and_the_reply_comes_without_documents(
    qtbot: Any, chat: tuple[ChatAdapter, KnowledgeAdapter, list[FakeSession]]
) -> None:
    from rag.errors import RagError

    adapter, knowledge, sessions = chat
    knowledge.service = FakeService([], fail=RagError("the index is unreadable"))
    errors: list[str] = []
    adapter.error_occurred.connect(errors.append)
    assert adapter.turns.send("Anything?", context())
    reply = finish(qtbot, adapter)
    assert errors == ["Documents not used: the index is unreadable"]
    assert reply.state == "complete" and not reply.sources
    assert sessions[-1].calls[-1].documents is None


def test_with_tools_the_turn_searches_up_front_only_when_the_model_cannot(paths: Paths) -> None:
    from app.gui.workers.agent_tools import ToolsRequest
    from app.gui.workers.chat_retrieval import model_searches
    from app.tool_config import BUILTIN, Permissions
    from app.tool_setup import SEARCH_KNOWLEDGE

    assert model_searches(None) is None
    assert model_searches(ToolsRequest(("builtin",), paths)) is None  # no knowledge bases: no search tool
    searches = model_searches(ToolsRequest(("builtin",), paths, knowledge_bases=("notes",)))
    assert searches is not None and searches() is True  # the model gets search_knowledge
    Permissions.load(paths).set_off(BUILTIN, SEARCH_KNOWLEDGE)
    assert searches() is False  # turned off: the passages come first, as without tools
