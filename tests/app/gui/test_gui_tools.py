"""Agents in the app (issue 12, "The app"): the chat's Tools switch runs the agent loop on the LLM
thread, each call waits for Allow once / Always allow / Deny in the transcript (an unapproved call
never runs, Stop refuses a waiting one), each call is a card with its result, saved as it happens
and shown again after a restart; the thinking is folded under the answer and never sent back;
Settings → Tools lists a real MCP server's tools."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gui_support import FakeSession, start_window
from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QApplication
from shiboken6 import isValid

from app.gui.workers.chat_state import ChatState
from app.paths import Paths
from engine.inference.context import Message
from engine.inference.events import Finished, PrefillProgress, Reasoning, Stats, Token, ToolCall
from engine.inference.tools import ToolResult, ToolSpec
from tests.fake_backend import StreamCall
from tests.mcp_servers import register

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]

ADD = ToolSpec(
    "add",
    "Adds two integers.",
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]},
    source="fake",
)
THOUGHT = "I should add the numbers before answering."


class FakeToolSession(FakeSession):
    """Asks for ``add(2, 3)`` when tools are offered and no result came back yet; then answers with
    the result. Thinks first (``Reasoning`` events) when ``think`` is set."""

    def __init__(self, request: Any, bandwidth: float | None, think: bool = False) -> None:
        super().__init__(request, bandwidth)
        self.think = think

    @property
    def thinking_controls(self) -> frozenset[str]:
        return frozenset({"enable_thinking"})

    def script(self, call: StreamCall) -> Iterator[Any]:
        history, user = call.history, call.user
        yield PrefillProgress(10, 10)
        reasoning = ""
        if self.think:
            for piece in THOUGHT.split(" "):
                reasoning += piece + " "
                yield Reasoning(piece + " ")
        last = history[-1] if history else None
        results = [m for m in history if isinstance(m, Message) and m.role == "tool"]
        asking = bool(call.tools) and user is not None
        stats = Stats(
            n_ctx=self.request.n_ctx,
            prompt_tokens=30,
            completion_tokens=4,
            context_used=34,
            prefill_ms=5.0,
            decode_ms=20.0,
            budget={"reserve": 64},
        )
        if asking:
            yield Token("Let me add.", 1)
            made = ToolCall("call_1", "add", {"a": 2, "b": 3}, '<tool_call>{"name": "add"}</tool_call>')
            yield stats
            yield Finished(
                "stop",
                stats,
                "Let me add.",
                reasoning=reasoning,
                reasoning_tokens=len(THOUGHT.split()) if reasoning else 0,
                reasoning_ms=40.0 if reasoning else 0.0,
                tool_calls=(made,),
            )
            return
        answer = f"The tool said {last.content}." if isinstance(last, Message) and last.role == "tool" else "Hi."
        if not results and user is None:
            answer = "No result."
        yield Token(answer, 2)
        yield stats
        yield Finished(
            "stop",
            stats,
            answer,
            reasoning=reasoning,
            reasoning_tokens=len(THOUGHT.split()) if reasoning else 0,
            reasoning_ms=40.0 if reasoning else 0.0,
        )


class FakeToolSet:
    """A ToolSet with one tool (``add``) that records every call it runs."""

    def __init__(self) -> None:
        self.ran: list[dict[str, Any]] = []
        self.allowed: set[str] = set()
        self.problems: list[str] = []
        self.closed = False

    def tools(self) -> list[ToolSpec]:
        return [ADD]

    def always_allows(self, name: str) -> bool:
        return name in self.allowed

    def allow_always(self, name: str) -> None:
        self.allowed.add(name)

    def call(
        self, name: str, arguments: dict[str, Any], *, timeout_s: float, cancel: threading.Event | None = None
    ) -> ToolResult:
        self.ran.append(dict(arguments))
        return ToolResult(str(arguments["a"] + arguments["b"]))

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def toolset(monkeypatch: pytest.MonkeyPatch) -> FakeToolSet:
    fake = FakeToolSet()
    monkeypatch.setattr("app.gui.workers.agent_tools.default_open_tools", lambda request, session: fake)
    return fake


@pytest.fixture
def open_window(qtbot: Any, paths: Paths, fake_model: Path) -> Iterator[Any]:
    """Builds a window on ``paths`` with FakeToolSession (the library lists ``fake_model``, a
    well-formed GGUF header); call again to 'restart'."""
    windows: list[Any] = []
    sessions: list[FakeToolSession] = []

    def build(think: bool = False) -> Any:
        def factory(request: Any, bandwidth: float | None) -> FakeToolSession:
            session = FakeToolSession(request, bandwidth, think=think)
            sessions.append(session)
            return session

        w = start_window(qtbot, paths, factory, fake_model)
        w.sessions = sessions  # every window's sessions, in order
        windows.append(w)
        return w

    yield build
    for w in windows:
        if not w._closing:
            w.shutdown()


def type_and_send(qtbot: Any, w: Any, text: str) -> None:
    w.composer.edit.setPlainText(text)
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)


def wait_idle(qtbot: Any, w: Any) -> None:
    qtbot.waitUntil(lambda: not w.chat.busy and w.chat.state is ChatState.IDLE, timeout=10000)
    qtbot.waitUntil(lambda: w.chat.thread_messages and w.chat.thread_messages[-1].state != "pending", timeout=10000)


def pending_approval(qtbot: Any, w: Any) -> Any:
    qtbot.waitUntil(
        lambda: bool(w.chat_view.cards) and any(a.pending for a in w.chat_view.cards[-1].agent_parts.approvals),
        timeout=10000,
    )
    return next(a for a in w.chat_view.cards[-1].agent_parts.approvals if a.pending)


def test_allow_once_runs_the_call_and_its_card_shows_the_result(
    qtbot: Any, open_window: Any, toolset: FakeToolSet
) -> None:
    w = open_window()
    w.tools_button.set_tools_on(True)
    type_and_send(qtbot, w, "What is 2 + 3?")
    card = pending_approval(qtbot, w)
    assert '"a": 2' in card.arguments.text() and '"b": 3' in card.arguments.text()  # the exact arguments
    assert toolset.ran == []  # waiting for the user: nothing ran
    qtbot.mouseClick(card.once_button, Qt.MouseButton.LeftButton)
    wait_idle(qtbot, w)
    assert toolset.ran == [{"a": 2, "b": 3}]
    assert toolset.allowed == set()  # once: not added to the allow list
    reply = w.chat.thread_messages[-1]
    assert reply.content == "Let me add.\n\nThe tool said 5."
    step = reply.stats["tool_steps"][0]
    assert (step["name"], step["result"], step["approval"]) == ("add", "5", "allowed")
    cards = w.chat_view.cards[-1].agent_parts.cards
    assert len(cards) == 1
    assert "add" in cards[0].header.text() and "allowed once" in cards[0].header.text()
    assert "ms" in cards[0].header.text() and "+1 tokens" in cards[0].header.text()
    assert "5" in cards[0].result.text()
    # The second generation got the call and its result; the saved reply keeps both for later turns.
    second = w.sessions[-1].calls[-1].history
    assert [m.role for m in second[-2:]] == ["assistant", "tool"] and second[-1].content == "5"
    assert [m["role"] for m in reply.stats["agent_messages"]] == ["assistant", "tool", "assistant"]
    # The inspector's Speed section shows the loop: generation, call, generation.
    timeline = w.inspector.loop_timeline
    assert [e["kind"] for e in timeline.entries] == ["generate", "tool", "generate"]
    assert "add:" in timeline.caption.text()


def test_deny_never_runs_the_call_and_the_model_gets_a_refusal(
    qtbot: Any, open_window: Any, toolset: FakeToolSet
) -> None:
    w = open_window()
    w.tools_button.set_tools_on(True)
    type_and_send(qtbot, w, "What is 2 + 3?")
    qtbot.mouseClick(pending_approval(qtbot, w).deny_button, Qt.MouseButton.LeftButton)
    wait_idle(qtbot, w)
    assert toolset.ran == []
    step = w.chat.thread_messages[-1].stats["tool_steps"][0]
    assert step["approval"] == "denied" and not step["ran"] and step["is_error"]
    refusal = w.sessions[-1].calls[-1].history[-1]
    assert refusal.role == "tool" and "denied" in refusal.content
    assert "denied" in w.chat_view.cards[-1].agent_parts.cards[0].header.text()


def test_always_allow_puts_the_tool_on_the_allow_list_and_later_calls_do_not_ask(
    qtbot: Any, open_window: Any, toolset: FakeToolSet
) -> None:
    w = open_window()
    w.tools_button.set_tools_on(True)
    type_and_send(qtbot, w, "What is 2 + 3?")
    qtbot.mouseClick(pending_approval(qtbot, w).always_button, Qt.MouseButton.LeftButton)
    wait_idle(qtbot, w)
    assert toolset.allowed == {"add"} and len(toolset.ran) == 1
    type_and_send(qtbot, w, "And again?")
    wait_idle(qtbot, w)
    assert len(toolset.ran) == 2  # ran without asking
    assert not w.chat_view.cards[-1].agent_parts.approvals
    assert w.chat.thread_messages[-1].stats["tool_steps"][0]["approval"] == "allow-listed"


def test_stop_refuses_a_waiting_call(qtbot: Any, open_window: Any, toolset: FakeToolSet) -> None:
    w = open_window()
    w.tools_button.set_tools_on(True)
    type_and_send(qtbot, w, "What is 2 + 3?")
    pending_approval(qtbot, w)
    w.chat.turns.stop()
    wait_idle(qtbot, w)
    assert toolset.ran == []
    step = w.chat.thread_messages[-1].stats["tool_steps"][0]
    assert step["approval"] == "cancelled"
    parts = w.chat_view.cards[-1].agent_parts
    assert not parts.approvals  # the approval card gave way to the call's card
    assert "stopped: it did not run" in parts.cards[0].header.text()


def test_tools_off_by_default_and_the_switch_is_saved_with_the_chat(
    qtbot: Any, open_window: Any, toolset: FakeToolSet
) -> None:
    w = open_window()
    assert w.tools_button.text() == "Tools: off"
    type_and_send(qtbot, w, "Hello?")
    wait_idle(qtbot, w)
    assert not w.sessions[-1].calls[-1].tools  # a plain turn: no tools offered
    w.tools_button.set_tools_on(True)
    qtbot.waitUntil(lambda: (w.chat.conversation.settings or {}).get("tools", {}).get("on") is True, timeout=5000)
    w.tools_button.build_menu()
    builtin = w.tools_button.action("source_builtin")
    assert builtin is not None and builtin.isChecked()


def test_tool_cards_survive_a_restart_and_old_replies_read_as_before(
    qtbot: Any, open_window: Any, toolset: FakeToolSet
) -> None:
    w = open_window()
    type_and_send(qtbot, w, "A plain question")  # a reply without tools, as histories before had
    wait_idle(qtbot, w)
    w.tools_button.set_tools_on(True)
    type_and_send(qtbot, w, "What is 2 + 3?")
    qtbot.mouseClick(pending_approval(qtbot, w).once_button, Qt.MouseButton.LeftButton)
    wait_idle(qtbot, w)
    conv_id = w.chat.conversation.id
    w.shutdown()

    w2 = open_window()
    w2.chat.conversations.open(conv_id)
    qtbot.waitUntil(lambda: len(w2.chat_view.cards) == 4, timeout=10000)
    assert w2.tools_button.text().startswith("Tools: builtin")  # the chat's switch came back with it
    plain, tooled = w2.chat_view.cards[1], w2.chat_view.cards[3]
    assert not plain.agent_parts.cards and not plain.agent_parts.isVisibleTo(w2)
    assert len(tooled.agent_parts.cards) == 1 and "5" in tooled.agent_parts.cards[0].result.text()
    toolset.allowed.add("add")
    type_and_send(qtbot, w2, "Thanks")
    wait_idle(qtbot, w2)
    sent = w2.sessions[-1].calls[0].history
    roles = [m.role for m in sent]
    assert roles == ["user", "assistant", "user", "assistant", "tool", "assistant"]
    assert sent[4].content == "5" and sent[3].tool_calls[0].name == "add"


def test_reasoning_is_folded_under_the_answer_and_never_sent_back(qtbot: Any, open_window: Any) -> None:
    w = open_window(think=True)
    w.tools_button.set_thinking("on")
    type_and_send(qtbot, w, "Think, then answer")
    wait_idle(qtbot, w)
    assert w.sessions[-1].calls[-1].thinking is True  # the template has the switch
    reply = w.chat.thread_messages[-1]
    assert reply.content == "Hi." and THOUGHT not in reply.content
    assert reply.stats["reasoning"]["tokens"] == len(THOUGHT.split())
    fold = w.chat_view.cards[-1].agent_parts.fold
    assert fold.isVisibleTo(w) and not fold.unfolded
    assert "Thought for 40 ms" in fold.title and f"{len(THOUGHT.split())} tokens" in fold.title
    fold.toggle.click()
    assert fold.unfolded and THOUGHT in fold.body.text()
    type_and_send(qtbot, w, "Again")
    wait_idle(qtbot, w)
    sent = w.sessions[-1].calls[-1].history
    assert sent and all(THOUGHT not in (m.content if isinstance(m, Message) else m[1]) for m in sent)


def test_a_thinking_budget_goes_to_the_session(qtbot: Any, open_window: Any) -> None:
    w = open_window()
    w.tools_button.set_thinking(256)
    assert "thinking ≤ 256" in w.tools_button.text()
    type_and_send(qtbot, w, "Go")
    wait_idle(qtbot, w)
    call = w.sessions[-1].calls[-1]
    assert call.thinking_budget == 256 and call.thinking is None


def test_settings_tools_lists_a_real_mcp_servers_tools(qtbot: Any, paths: Paths) -> None:
    from app.gui.tools_settings import COL_ALLOW, COL_ON, ToolsSettingsDialog
    from app.tool_config import Permissions

    register(paths, "testtools")
    dialog = ToolsSettingsDialog(paths)
    qtbot.addWidget(dialog)
    dialog.show()
    assert dialog.checking and dialog.progress.isVisibleTo(dialog)  # the start runs in the background
    qtbot.waitUntil(lambda: not dialog.checking, timeout=60000)
    names = dialog.tool_names("testtools")
    assert {"add", "echo", "whoami"} <= set(names)
    server = dialog.item_for("testtools")
    assert server is not None and server.text(3).startswith("works")
    assert "calculator" in dialog.tool_names("builtin")
    echo = dialog.item_for("testtools", "echo")
    assert echo is not None
    echo.setCheckState(COL_ON, Qt.CheckState.Unchecked)
    add = dialog.item_for("testtools", "add")
    assert add is not None
    add.setCheckState(COL_ALLOW, Qt.CheckState.Checked)
    saved = Permissions.load(paths)
    assert saved.is_off("testtools", "echo") and saved.always_allows("testtools", "add")
    assert [dialog.allow_list.item(i).text() for i in range(dialog.allow_list.count())] == ["testtools/add"]
    dialog.close()


def test_settings_tools_add_and_paste_errors_are_one_line_in_place(qtbot: Any, paths: Paths) -> None:
    from app.gui.tools_settings import ToolsSettingsDialog

    dialog = ToolsSettingsDialog(paths, check_on_open=False)
    qtbot.addWidget(dialog)
    dialog.name_edit.setText("bad name!")
    dialog.target_edit.setText("python -m server")
    dialog.add_button.click()
    assert dialog.error_label.isVisibleTo(dialog) and "\n" not in dialog.error_label.text()
    assert "bad name!" in dialog.error_label.text()
    dialog.paste.setPlainText('{"mcpServers": {"x": {"command": 5}}}')
    dialog.import_button.click()
    assert "pasted" in dialog.error_label.text() and "\n" not in dialog.error_label.text()
    dialog.paste.setPlainText('{"mcpServers": {"web": {"url": "http://127.0.0.1:9/mcp"}}}')
    dialog.import_button.click()
    assert not dialog.error_label.isVisibleTo(dialog)
    assert dialog.item_for("web") is not None
    qtbot.waitUntil(lambda: not dialog.checking, timeout=60000)
    status = dialog.item_for("web").text(3)  # type: ignore[union-attr]
    assert status.startswith("It did not start: http://127.0.0.1:9/mcp") and "\n" not in status
    assert status.count("did not start") == 1  # said once (issue 28: "did not start: it did not start: ...")
    dialog.close()
    assert Path(paths.mcp_config).exists()


def test_each_step_is_in_the_history_before_the_turn_ends(
    qtbot: Any, open_window: Any, paths: Paths, toolset: FakeToolSet
) -> None:
    """A crash while a call waits loses nothing: the reply's row already holds the call."""
    from engine.history import HistoryStore

    w = open_window()
    w.tools_button.set_tools_on(True)
    type_and_send(qtbot, w, "What is 2 + 3?")
    card = pending_approval(qtbot, w)
    conv_id = w.chat.conversation.id

    def saved_call() -> Any:
        with HistoryStore(paths.history_db) as store:  # another reader, as after a restart
            reply = store.thread(conv_id)[-1]
        agent = (reply.stats or {}).get("agent_messages") or []
        return reply.state, agent[0]["tool_calls"][0] if agent else None

    qtbot.waitUntil(lambda: saved_call()[1] is not None, timeout=5000)
    state, call = saved_call()
    assert state == "pending" and call["name"] == "add" and call["arguments"] == {"a": 2, "b": 3}
    card.decide("once")
    wait_idle(qtbot, w)


def test_a_long_result_is_folded_and_unfolds(qtbot: Any) -> None:
    from app.gui.tool_card import FOLD_CHARS, ToolCallCardWidget

    long = "line of output\n" * 200
    card = ToolCallCardWidget(
        {
            "id": "c",
            "name": "big",
            "arguments": {"n": 3000},
            "source": "srv",
            "approval": "allowed",
            "ran": True,
            "result": long,
            "is_error": False,
            "ms": 1234.0,
            "tokens": 600,
            "truncated": True,
        }
    )
    qtbot.addWidget(card)
    assert card.foldable and len(card.result.text()) <= FOLD_CHARS + 2
    assert "1.2 s" in card.header.text() and "+600 tokens" in card.header.text()
    assert "cut to fit" in card.header.text()
    card.expand_button.click()
    assert card.result.text() == long
    short = ToolCallCardWidget(
        {
            "id": "d",
            "name": "add",
            "arguments": {},
            "approval": "denied",
            "ran": False,
            "result": "refused",
            "ms": 0,
            "tokens": 3,
        }
    )
    qtbot.addWidget(short)
    assert not short.foldable and short.expand_button.isHidden()
    assert "did not run" in short.header.text() and " ms" not in short.header.text()


def test_a_thinking_budget_on_a_remote_model_is_a_clear_error(qtbot: Any, paths: Paths) -> None:
    from app.gui.workers.llm_requests import GenerateRequest, LoadRequest
    from app.gui.workers.llm_worker import LlmWorker
    from app.turn import TurnRequest
    from engine.inference.remote import RemoteInfo, RemoteSession

    def remote(request: Any, bandwidth: float | None) -> RemoteSession:
        session = RemoteSession("http://127.0.0.1:9", "m")  # never contacted: loaded already, refused before
        session.info = RemoteInfo("http://127.0.0.1:9", "m", 4096, "estimate")
        return session

    worker = LlmWorker(remote)
    failed: list[Any] = []
    worker.generation_failed.connect(lambda _rid, exc: failed.append(exc))
    worker._on_load_requested(LoadRequest(model_path=paths.models / "x.gguf"))
    worker._on_generate_requested(GenerateRequest(1, TurnRequest((), "hi", None, thinking_budget=64)))
    assert len(failed) == 1 and "thinking budget needs a local model" in str(failed[0])
    worker._on_shutdown_requested()


def test_a_waiting_call_survives_a_redrawn_transcript_and_leaving_the_chat_refuses_it(
    qtbot: Any, open_window: Any, toolset: FakeToolSet
) -> None:
    w = open_window()
    w.tools_button.set_tools_on(True)
    type_and_send(qtbot, w, "What is 2 + 3?")
    first = pending_approval(qtbot, w)
    # The transcript is rebuilt while the call waits (here: an eviction marker appears).
    w.chat_view.set_thread(list(w.chat.thread_messages), evicted=1)
    qtbot.waitUntil(lambda: not isValid(first), timeout=5000)
    again = pending_approval(qtbot, w)
    assert again is not first and again.request.call_id == first.request.call_id
    again.decide("once")
    wait_idle(qtbot, w)
    assert toolset.ran == [{"a": 2, "b": 3}]

    type_and_send(qtbot, w, "Once more?")
    pending_approval(qtbot, w)
    w.chat.conversations.new()  # another chat is shown: nobody can answer, so the call is refused
    qtbot.waitUntil(lambda: not w.chat.busy, timeout=10000)
    assert len(toolset.ran) == 1


def test_the_switch_names_the_builtin_source_as_the_configuration_does() -> None:
    from app import tool_config
    from app.gui import chat_tools_menu

    assert chat_tools_menu.BUILTIN == tool_config.BUILTIN
    assert chat_tools_menu.describe({"tools": {"on": True, "sources": ["builtin", "srv"]}}) == "Tools: builtin, srv"
    tools, thinking, budget = chat_tools_menu.turn_options(
        {"tools": {"on": True, "sources": ["srv"]}, "thinking": "off"}, None, ()
    )
    assert tools is not None and tools.selection == ("srv",)
    assert thinking is None and budget is None  # no switch in this template: the model's default


def test_a_real_mcp_servers_tool_runs_from_the_chat_after_approval(qtbot: Any, open_window: Any, paths: Paths) -> None:
    register(paths, "testtools")
    w = open_window()
    w.tools_button.set_source("builtin", False)
    w.tools_button.set_source("testtools", True)
    assert w.tools_button.text() == "Tools: testtools"
    type_and_send(qtbot, w, "What is 2 + 3?")
    card = pending_approval(qtbot, w)
    assert card.request.source == "testtools"
    card.decide("once")
    wait_idle(qtbot, w)
    step = w.chat.thread_messages[-1].stats["tool_steps"][0]
    assert (step["source"], step["result"], step["ran"]) == ("testtools", "5", True)
    assert w.chat.thread_messages[-1].content.endswith("The tool said 5.")


def test_a_source_removed_from_mcp_json_can_still_be_unticked(qtbot: Any, paths: Paths) -> None:
    from app.gui.chat_tools_menu import ChatToolsButton

    button = ChatToolsButton(paths)
    qtbot.addWidget(button)
    button.set_conversation_settings({"tools": {"on": True, "sources": ["builtin", "gone"]}})
    button.build_menu()
    action = button.action("source_gone")
    assert action is not None and action.isChecked() and "not configured" in action.text()
    action.setChecked(False)
    assert button.settings["tools"]["sources"] == ["builtin"]


def test_the_reply_reads_in_the_order_the_loop_ran_live_and_after_a_restart(
    qtbot: Any, open_window: Any, toolset: FakeToolSet
) -> None:
    w = open_window()
    w.tools_button.set_tools_on(True)
    type_and_send(qtbot, w, "What is 2 + 3?")
    approval = pending_approval(qtbot, w)
    parts = w.chat_view.cards[-1].agent_parts
    # Waiting: the step's text, then the call it asks for; the answer has not started.
    qtbot.waitUntil(lambda: parts.groups and parts.groups[0].text_widget.text == "Let me add.", timeout=5000)
    assert parts.groups[0].widgets() == [approval]
    assert "Let me add." not in w.chat_view.cards[-1].body.text()
    qtbot.mouseClick(approval.once_button, Qt.MouseButton.LeftButton)
    wait_idle(qtbot, w)

    def order(card: Any) -> list[str]:
        group = card.agent_parts.groups[0]
        assert group.text_widget.text == "Let me add." and len(card.agent_parts.groups) == 1
        assert [c.step["name"] for c in group.widgets()] == ["add"]
        QApplication.processEvents()
        assert group.mapTo(card, group.rect().bottomLeft()).y() <= card.body.mapTo(card, QPoint(0, 0)).y()
        return [group.text_widget.text, group.widgets()[0].step["result"], card.text]

    assert order(w.chat_view.cards[-1]) == ["Let me add.", "5", "Let me add.\n\nThe tool said 5."]
    assert "The tool said 5." in w.chat_view.cards[-1].body.text()
    assert "Let me add." not in w.chat_view.cards[-1].body.text()
    conv_id = w.chat.conversation.id
    w.shutdown()
    w2 = open_window()
    w2.chat.conversations.open(conv_id)
    qtbot.waitUntil(lambda: len(w2.chat_view.cards) == 2, timeout=10000)
    assert order(w2.chat_view.cards[-1]) == ["Let me add.", "5", "Let me add.\n\nThe tool said 5."]


def test_each_steps_thinking_is_folded_with_its_step(qtbot: Any, open_window: Any, toolset: FakeToolSet) -> None:
    w = open_window(think=True)
    w.tools_button.set_thinking("on")
    w.tools_button.set_tools_on(True)
    type_and_send(qtbot, w, "What is 2 + 3?")
    approval = pending_approval(qtbot, w)
    parts = w.chat_view.cards[-1].agent_parts
    # Live, with its step (the worker may still hold the rest of it while the call waits).
    qtbot.waitUntil(lambda: parts.groups and THOUGHT.startswith(parts.groups[0].fold.text.strip() or "?"), timeout=5000)
    assert not parts.fold.text.strip()  # nothing of it under the answer
    qtbot.mouseClick(approval.once_button, Qt.MouseButton.LeftButton)
    wait_idle(qtbot, w)
    parts = w.chat_view.cards[-1].agent_parts
    assert parts.groups[0].fold.text.strip() == THOUGHT and parts.groups[0].fold.title.startswith("Thought for 40 ms")
    assert parts.fold.text.strip() == THOUGHT and parts.fold.title.startswith("Thought for 40 ms")  # the answer's
    reasoning = w.chat.thread_messages[-1].stats["reasoning"]
    assert reasoning["text"].count(THOUGHT) == 2  # stored once, joined: each fold shows its own part
