"""The knowledge-base search as a tool in the app (issue 12, "Built-in tools"): with the chat's
Tools switch on and knowledge bases attached, the model is offered ``search_knowledge``; its call
reaches the knowledge service (the knowledge process's, called on the LLM thread), the passages
are the call's result on its card, and no passages are added up front (the model decides)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from gui_support import FakeSession, start_window
from PySide6.QtCore import Qt

from app.gui.workers.chat_state import ChatState
from app.paths import Paths
from engine.inference.context import Message
from engine.inference.events import Finished, PrefillProgress, Stats, Token, ToolCall
from tests.fake_backend import StreamCall

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]

OTTERS = "Sea otters hold hands while they sleep so that they do not drift apart."


class FakeService:
    """The knowledge service's ``query_many``, recorded (and the thread it was called on)."""

    def __init__(self) -> None:
        self.queries: list[tuple[list[str], str, str]] = []

    def query_many(self, names: Sequence[str], text: str, *, k: int = 5) -> list[Any]:
        self.queries.append((list(names), text, threading.current_thread().name))
        return [SimpleNamespace(path="/docs/otters.md", page=None, heading="Sea otters", text=OTTERS, fused_score=0.9)]

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"unexpected knowledge call {method}")

    def close(self) -> None:
        pass


class SearchingSession(FakeSession):
    """Calls ``search_knowledge`` when it is offered and no result came back yet, then quotes it."""

    def script(self, call: StreamCall) -> Iterator[Any]:
        history, user, tools = call.history, call.user, call.tool_names
        yield PrefillProgress(10, 10)
        stats = Stats(
            n_ctx=self.request.n_ctx,
            prompt_tokens=30,
            completion_tokens=4,
            context_used=34,
            prefill_ms=5.0,
            decode_ms=20.0,
            budget={"reserve": 64},
        )
        last = history[-1] if history else None
        if "search_knowledge" in tools and user is not None:
            call = ToolCall("call_1", "search_knowledge", {"query": "sea otters"}, "")
            yield Token("Looking.", 1)
            yield stats
            yield Finished("stop", stats, "Looking.", tool_calls=(call,))
            return
        answer = (
            "Found it."
            if isinstance(last, Message) and last.role == "tool" and "otters" in last.content
            else "Nothing."
        )
        yield Token(answer, 2)
        yield stats
        yield Finished("stop", stats, answer)


@pytest.fixture
def window(qtbot: Any, paths: Paths, fake_model: Path) -> Iterator[Any]:
    w = start_window(qtbot, paths, SearchingSession, fake_model)
    w.knowledge.service.close()
    w.knowledge.service = FakeService()
    yield w
    w.shutdown()


def send_and_allow(qtbot: Any, w: Any, text: str) -> None:
    w.composer.edit.setPlainText(text)
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)

    def waiting() -> Any:
        cards = w.chat_view.cards
        return next((a for a in cards[-1].agent_parts.approvals if a.pending), None) if cards else None

    qtbot.waitUntil(lambda: waiting() is not None, timeout=10000)
    card = waiting()
    assert card.request.name == "search_knowledge" and card.request.arguments == {"query": "sea otters"}
    qtbot.mouseClick(card.once_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not w.chat.busy and w.chat.state is ChatState.IDLE, timeout=10000)
    qtbot.waitUntil(lambda: w.chat.thread_messages[-1].state != "pending", timeout=10000)


def attach(qtbot: Any, w: Any, names: list[str]) -> None:
    w.documents.set_chat_documents(names)
    qtbot.waitUntil(
        lambda: w.chat.conversation is not None and list(w.chat.conversation.knowledge_bases or []) == names,
        timeout=5000,
    )


def test_the_models_search_reaches_the_knowledge_service_and_its_card_shows_the_passages(
    qtbot: Any, window: Any
) -> None:
    w = window
    attach(qtbot, w, ["otters", "notes"])
    w.tools_button.set_tools_on(True)
    send_and_allow(qtbot, w, "What do otters do at night?")
    service: FakeService = w.knowledge.service
    # One search, the model's, over both knowledge bases, off the GUI thread: none made up front.
    assert [q[:2] for q in service.queries] == [(["otters", "notes"], "sea otters")]
    assert service.queries[0][2] != threading.main_thread().name
    first = w.sessions[-1].calls[0]
    assert "search_knowledge" in first.tool_names and first.documents is None
    # The result went back to the model, and the card shows the passages.
    assert w.sessions[-1].calls[-1].history[-1].role == "tool"
    reply = w.chat.thread_messages[-1]
    assert reply.content.endswith("Found it.")
    step = reply.stats["tool_steps"][0]
    assert step["name"] == "search_knowledge" and not step["is_error"] and OTTERS in step["result"]
    card = w.chat_view.cards[-1].agent_parts.cards[0]
    assert "search_knowledge" in card.header.text()
    assert OTTERS in card.result.text() and "otters.md" in card.result.text()


def test_without_knowledge_bases_there_is_no_search_tool_and_without_tools_the_passages_come_first(
    qtbot: Any, window: Any
) -> None:
    w = window
    w.tools_button.set_tools_on(True)
    w.composer.edit.setPlainText("Hello")
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not w.chat.busy and w.chat.state is ChatState.IDLE, timeout=10000)
    assert "search_knowledge" not in w.sessions[-1].calls[-1].tool_names
    assert w.knowledge.service.queries == []
    # Tools off, documents attached: the turn retrieves before generating, as before.
    attach(qtbot, w, ["otters"])
    w.tools_button.set_tools_on(False)
    w.composer.edit.setPlainText("What do otters do?")
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not w.chat.busy and w.chat.state is ChatState.IDLE, timeout=10000)
    assert [q[:2] for q in w.knowledge.service.queries] == [(["otters"], "What do otters do?")]
    assert OTTERS in (w.sessions[-1].calls[-1].documents or "")
