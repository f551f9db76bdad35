"""How a turn with tools is stored (app.agent_history) and how ``glassbox chat`` saves it as it
happens (``glassbox chat``'s answer with ChatLog), with a scripted backend: no model, no Qt."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from app.agent_history import INTERRUPTED_RESULT, AgentRecord, ReplyText, message_record, model_history
from app.cli.commands.chat import answer
from app.cli.commands.chat_history import ChatLog
from app.cli.commands.chat_tools import ChatTools
from app.paths import Paths
from app.turn import TurnRequest
from engine.errors import EngineCrashed
from engine.history import HistoryStore
from engine.inference.context import Message
from engine.inference.events import Event, Finished, Reasoning, Stats, Token, ToolCall
from tests.fake_backend import FakeBackend, StreamCall


@dataclass
class Row:
    """What model_history reads of a stored message."""

    role: str
    content: str
    state: str = "complete"
    stats: dict[str, Any] | None = None


def _call(call_id: str, expression: str) -> ToolCall:
    return ToolCall(call_id, "calculator", {"expression": expression}, "")


def test_plain_turns_read_as_before_and_failed_or_empty_replies_stay_out() -> None:
    rows = [
        Row("user", "hi"),
        Row("assistant", "hello", stats={"reasoning": {"text": "hmm"}}),
        Row("user", "again"),
        Row("assistant", "", state="error"),
        Row("user", "once more"),
        Row("assistant", ""),
    ]
    assert model_history(rows) == (
        Message("user", "hi"),
        Message("assistant", "hello"),
        Message("user", "again"),
        Message("user", "once more"),
    )


def test_a_tool_reply_is_its_calls_results_and_answer() -> None:
    record = AgentRecord()
    first = Message("assistant", "Let me see.", tool_calls=(_call("c1", "2+3"),))
    result = Message("tool", "5", tool_call_id="c1", name="calculator")
    answer = Message("assistant", "It is 5.")
    for message in (first, result, answer):
        record.add(message_record(message, None))
    rows = [Row("user", "2+3?"), Row("assistant", "Let me see.\n\nIt is 5.", stats=record.stats())]
    assert model_history(rows) == (Message("user", "2+3?"), first, result, answer)


def test_a_call_a_crash_left_without_its_result_is_answered_as_interrupted() -> None:
    calls = (_call("c1", "1+1"), _call("c2", "2+2"))
    saved = [Message("assistant", "", tool_calls=calls), Message("tool", "2", tool_call_id="c1", name="calculator")]
    record = AgentRecord()
    for message in saved:
        record.add(message_record(message, None))
    rows = [Row("user", "sums"), Row("assistant", "", state="partial", stats=record.stats()), Row("user", "and?")]
    history = model_history(rows)
    assert history[1:3] == tuple(saved)
    assert history[3] == Message("tool", INTERRUPTED_RESULT, tool_call_id="c2", name="calculator")
    assert history[4] == Message("user", "and?")


def test_reply_text_puts_a_blank_line_between_generations_with_text() -> None:
    text = ReplyText()
    assert text.add("Let me") == "" and text.add(" look.") == ""
    text.end_generation()  # a generation with only a call adds no text
    text.end_generation()
    assert text.add("") == ""
    assert text.add("Found") == "\n\n"
    assert text.add(" it.") == ""
    assert text.text == "Let me look.\n\nFound it."
    quiet = ReplyText()
    quiet.end_generation()
    assert quiet.add("Only this") == "" and quiet.text == "Only this"


# ------------------------------------------------------------------ glassbox chat's saving, in process
class ScriptedSession(FakeBackend):
    """Two rounds of calculator calls, then an answer; each generation looks at the history on disk
    (through its own connection) before it streams, or fails when ``crash_at`` says so."""

    def __init__(self, db: Path, crash_at: int | None = None) -> None:
        super().__init__()
        self.db = db
        self.crash_at = crash_at
        self.seen_on_disk: list[Any] = []
        self.keys: list[Any] = []

    def script(self, call: StreamCall) -> Iterator[Event]:
        self.keys.append(call.cache_key)
        with HistoryStore(self.db) as store:
            [conversation] = store.list_conversations()
            self.seen_on_disk.append(store.thread(conversation.id)[-1])
        n = len(self.keys)
        if n == self.crash_at:
            raise EngineCrashed(-9, "generation", "killed")
        script = {
            1: ("Let me add.", (_call("c1", "2+3"),)),
            2: ("", (_call("c2", "6*7"),)),
            3: ("The answers are 5 and 42.", ()),
        }
        text, calls = script[n]
        yield Reasoning(f"thinking {n}")
        for word in text.split(" ") if text else ():
            yield Token(word if word == text.split(" ")[0] else " " + word, 1)
        yield from calls
        stats = Stats(n_ctx=4096, context_used=100, prompt_tokens=50 * n, budget={"reserve": 100})
        yield stats
        yield Finished(
            reason="stop",
            stats=stats,
            text=text,
            tool_calls=calls,
            reasoning=f"thinking {n}",  # type: ignore[arg-type]
            reasoning_tokens=2,
        )


def _args() -> argparse.Namespace:
    return argparse.Namespace(
        tools="calculator",
        kb=[],
        chroma_url=None,
        yes=True,
        max_steps=4,
        tool_timeout=5.0,
        tool_choice=None,
        thinking=None,
    )


def _turn(paths: Paths, session: ScriptedSession) -> tuple[ChatLog, int, Any]:
    log = ChatLog(paths, None, "scripted")
    conversation, _ = log.start_turn("What are 2+3 and 6*7?", None)
    tools = ChatTools(_args(), paths, session)
    try:
        request = TurnRequest((), "What are 2+3 and 6*7?", None, tools=tools.turn_tools, cache_key=log.cache_key())
        outcome = answer(session, request, True, progress=log.save_progress)
    except BaseException as exc:
        log.fail_turn(exc)
        tools.close()
        log.close()
        raise
    tools.close()
    return log, conversation, outcome


def test_each_step_is_on_disk_before_the_next_generation_and_the_reply_is_stored_as_the_app_stores_it(
    tmp_path: Path,
) -> None:
    paths = Paths.resolve(tmp_path / "home").ensure()
    session = ScriptedSession(paths.history_db)
    log, conversation, outcome = _turn(paths, session)
    log.finish_turn(outcome)
    log.close()

    # Every generation of the loop ran under the turn's KV key (the ones after a result too).
    assert len(session.keys) == 3 and len(set(session.keys)) == 1 and session.keys[0] is not None
    # Before generation 2 and 3, the steps before them were already committed.
    before_second, before_third = session.seen_on_disk[1], session.seen_on_disk[2]
    assert before_second.state == "pending" and before_second.content == "Let me add."
    assert [s["result"] for s in before_second.stats["tool_steps"]] == ["5"]
    assert [m["role"] for m in before_second.stats["agent_messages"]] == ["assistant", "tool"]
    assert [s["result"] for s in before_third.stats["tool_steps"]] == ["5", "42"]
    assert "thinking 1" in before_second.stats["reasoning"]["text"]

    with HistoryStore(paths.history_db) as store:
        user, reply = store.thread(conversation)
    assert (user.content, reply.state) == ("What are 2+3 and 6*7?", "complete")
    assert reply.content == "Let me add.\n\nThe answers are 5 and 42."
    assert outcome.answer == "The answers are 5 and 42."
    stats = reply.stats
    assert [m["role"] for m in stats["agent_messages"]] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert [(s["name"], s["approval"], s["round"]) for s in stats["tool_steps"]] == [
        ("calculator", "allowed", 1),
        ("calculator", "allowed", 2),
    ]
    assert [e["kind"] for e in stats["loop"]] == ["generate", "tool", "generate", "tool", "generate"]
    assert stats["reasoning"] == {"text": "thinking 1\n\nthinking 2\n\nthinking 3", "tokens": 6, "ms": 0.0}
    assert stats["finish_reason"] == "stop" and stats["prompt_tokens"] == 150

    # Read back as the model is sent it: the calls, the results, the answer (no thinking).
    with ChatLog(paths, conversation, "scripted") as again:
        history = again.history()
    assert history == [Message("user", "What are 2+3 and 6*7?"), *outcome.messages]
    assert all("thinking" not in m.content for m in history)


def test_a_crash_mid_loop_keeps_every_step_saved_and_the_history_reads_back_well_formed(tmp_path: Path) -> None:
    paths = Paths.resolve(tmp_path / "home").ensure()
    session = ScriptedSession(paths.history_db, crash_at=3)
    with pytest.raises(EngineCrashed):
        _turn(paths, session)
    with HistoryStore(paths.history_db) as store:
        [conversation] = store.list_conversations()
        _user, reply = store.thread(conversation.id)
    assert reply.state == "partial" and reply.content == "Let me add." and reply.error
    assert [s["result"] for s in reply.stats["tool_steps"]] == ["5", "42"]
    with ChatLog(paths, conversation.id, "scripted") as again:
        history = again.history()
    assert [m.role for m in history] == ["user", "assistant", "tool", "assistant", "tool"]
    assert [m.content for m in history if m.role == "tool"] == ["5", "42"]


def test_continuing_ends_a_reply_a_dead_process_left_pending(tmp_path: Path) -> None:
    paths = Paths.resolve(tmp_path / "home").ensure()
    record = AgentRecord()
    record.add(message_record(Message("assistant", "", tool_calls=(_call("c9", "1+1"),)), None))
    with HistoryStore(paths.history_db) as store:
        conversation = store.create_conversation(title="t")
        store.add_message(conversation.id, "user", "1+1?")
        pending = store.add_message(conversation.id, "assistant", "", state="pending")
        store.finish_message(pending.id, "Let me", state="pending", stats=record.stats())
    with ChatLog(paths, conversation.id, None) as log:
        history = log.history()
    with HistoryStore(paths.history_db) as store:
        reply = store.get_message(pending.id)
    assert reply.state == "partial" and reply.content == "Let me" and reply.stats == record.stats()
    assert history[-1] == Message("tool", INTERRUPTED_RESULT, tool_call_id="c9", name="calculator")
