"""A reply made with tools reads in the order the agent loop ran it (issue 12, "agents made visible"):
each step's text, then its calls' cards (approvals in place), then the next step's, the answer last;
live while it streams and the same when the chat is opened again. A history stored without the
turn's messages shows its cards above the whole text, as it always did."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QPoint
from PySide6.QtWidgets import QApplication, QWidget

from app.agent_history import AgentRecord, ReplyText, generation_record, message_record, reasoning_dict
from app.gui.chat_view import ChatView
from app.gui.message_card import MessageCard
from app.gui.theme import LIGHT, stylesheet
from app.gui.tool_card import TurnLayout, thoughts_of, turn_layout
from app.gui.workers.agent_turn import ApprovalGate, ApprovalRequest
from app.gui.workers.history_reads import DisplayMessage
from engine.agent.loop import ToolStep
from engine.inference.context import Message
from engine.inference.events import Finished, Stats, ToolCall
from engine.inference.tools import ToolResult

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]

FIRST = "I'll look up the weather in Paris first."
SECOND = "It rains there. Now the local time, to say whether the shops are open."
ANSWER = "In Paris it is **14:05** and 18 °C with light rain: the shops are open, take an umbrella."
WEATHER = ToolCall("call_1", "get_weather", {"city": "Paris"}, "")
CLOCK = ToolCall("call_2", "local_time", {"timezone": "Europe/Paris"}, "")


def _step(round_: int, call: ToolCall, result: str, ms: float) -> ToolStep:
    return ToolStep(round_, call, "builtin", "allow-listed", ToolResult(result), ms, len(result.split()))


THOUGHTS = ("The user wants the weather first.", "", "Both known: answer.")


def _finished(said: str, thought: str, calls: tuple[ToolCall, ...] = ()) -> Finished:
    stats = Stats(prompt_tokens=40, completion_tokens=12, decode_ms=30.0)
    tokens, ms = len(thought.split()), 10.0 * len(thought.split())
    return Finished("stop", stats, said, reasoning=thought, reasoning_tokens=tokens, reasoning_ms=ms, tool_calls=calls)


def two_step_turn(answer: str = ANSWER, thoughts: tuple[str, str, str] = THOUGHTS) -> tuple[str, dict[str, Any]]:
    """The text and stats of a two-step turn (each generation's thinking: ``thoughts``), built with
    the recorders the app saves a turn with."""
    record = AgentRecord()
    text = ReplyText()
    weather = _step(1, WEATHER, "18 °C, light rain", 41.0)
    clock = _step(2, CLOCK, "14:05", 3.0)
    for round_, said, step in ((1, FIRST, weather), (2, SECOND, clock)):
        text.add(said)
        text.end_generation()
        record.add(generation_record(round_, _finished(said, thoughts[round_ - 1], (step.call,))))
        record.add(message_record(Message("assistant", said, tool_calls=(step.call,)), None))
        record.add(
            message_record(Message("tool", step.result.content, tool_call_id=step.call.id, name=step.call.name), step)
        )
    text.add(answer)
    record.add(generation_record(3, _finished(answer, thoughts[2])))
    record.add(message_record(Message("assistant", answer), None))
    joined = "\n\n".join(t for t in thoughts if t)  # as engine.agent.loop joins them
    record.reasoning_done = reasoning_dict(joined, sum(len(t.split()) for t in thoughts), 90.0)
    return text.text, {"completion_tokens": 36, "decode_tps": 41.5, **record.stats()}


def message(i: int, role: str, content: str, stats: dict[str, Any] | None = None, state: str = "complete") -> Any:
    return DisplayMessage(i, i - 1 or None, role, content, state, stats, None, None, None, (i,))


def top(widget: QWidget, card: QWidget) -> int:
    return widget.mapTo(card, QPoint(0, 0)).y()


def answer_html(card: MessageCard) -> str:
    return "".join(label.text() for label in card._answer.labels())


def reading_order(card: MessageCard) -> list[str]:
    """What the card shows, top to bottom: step texts, tool cards, approvals, the answer."""
    shown: list[tuple[int, str]] = []
    for group in card.agent_parts.groups:
        if group.text_widget.isVisibleTo(card):
            shown.append((top(group.text_widget, card), "text:" + group.text_widget.text))
        if group.fold.isVisibleTo(card):
            shown.append((top(group.fold, card), f"thinking {card.agent_parts.groups.index(group) + 1}"))
        for widget in group.widgets():
            name = widget.step["name"] if hasattr(widget, "step") else "approval:" + widget.request.name
            shown.append((top(widget, card), str(name)))
    shown.append((top(card.body, card), "answer"))
    if card.agent_parts.fold.isVisibleTo(card):
        shown.append((top(card.agent_parts.fold, card), "thinking"))
    return [what for _y, what in sorted(shown)]


# ---------------------------------------------------------------------------- the layout, pure
def test_a_stored_two_step_turn_is_laid_out_in_the_order_it_ran() -> None:
    content, stats = two_step_turn()
    layout = turn_layout(content, stats)
    assert layout.ordered
    assert [(s.text, s.call_ids) for s in layout.steps] == [(FIRST, ("call_1",)), (SECOND, ("call_2",))]
    assert [[d["result"] for d in s.steps] for s in layout.steps] == [["18 °C, light rain"], ["14:05"]]
    assert layout.answer == ANSWER


def test_a_history_without_the_turns_messages_keeps_every_card_above_the_whole_text() -> None:
    content, stats = two_step_turn()
    old = {k: v for k, v in stats.items() if k != "agent_messages"}  # only the cards were stored
    layout = turn_layout(content, old)
    assert not layout.ordered and layout.answer == content
    assert [len(s.steps) for s in layout.steps] == [2] and layout.steps[0].text == ""
    plain = turn_layout("Hello.", {"completion_tokens": 3})
    assert plain == TurnLayout((), "Hello.")


def test_text_that_does_not_match_its_messages_falls_back_to_the_old_placement() -> None:
    _content, stats = two_step_turn()
    layout = turn_layout("edited elsewhere", stats)
    assert not layout.ordered and layout.answer == "edited elsewhere" and len(layout.steps[0].steps) == 2


def test_live_text_behind_its_messages_is_an_empty_answer_not_a_mismatch() -> None:
    _content, stats = two_step_turn()
    first = {"agent_messages": stats["agent_messages"][:1], "tool_steps": []}  # call 1 asked, not run
    layout = turn_layout(FIRST[:10], first, live=True)  # the worker has not sent the rest yet
    assert layout.ordered and layout.answer == "" and layout.steps[0].text == FIRST
    assert not turn_layout(FIRST[:10], first).ordered  # a stored reply must match


def test_a_turn_stopped_after_its_calls_has_no_answer() -> None:
    content, stats = two_step_turn(answer="")
    layout = turn_layout(content, stats)
    assert layout.ordered and layout.answer == "" and len(layout.steps) == 2


# ---------------------------------------------------------------------------- the card, reopened
def test_a_reopened_two_step_turn_reads_in_order_with_copy_stats_and_search(qtbot: Any, tmp_path: Path) -> None:
    content, stats = two_step_turn()
    view = ChatView()
    qtbot.addWidget(view)
    view.setStyleSheet(stylesheet(LIGHT))
    view.resize(700, 900)
    view.show()
    view.set_thread([message(1, "user", "Weather and time in Paris?"), message(2, "assistant", content, stats)])
    QApplication.processEvents()
    card = view.cards[1]
    assert reading_order(card) == [  # each thinking above the text it came before (issue 28)
        "thinking 1",
        "text:" + FIRST,
        "get_weather",
        "text:" + SECOND,
        "local_time",
        "thinking",
        "answer",
    ]
    assert "14:05" in answer_html(card) and FIRST not in answer_html(card)  # the answer alone in the body
    assert card.agent_parts.fold.text == THOUGHTS[2] and card.agent_parts.fold.title == "Thought for 30 ms · 3 tokens"
    first_fold = card.agent_parts.groups[0].fold
    assert first_fold.text == THOUGHTS[0] and first_fold.title == "Thought for 60 ms · 6 tokens"
    assert not first_fold.unfolded and not card.agent_parts.groups[1].fold.isVisibleTo(card)
    card.copy_button.click()
    assert QApplication.clipboard().text() == content  # Copy copies the reply's whole text, as before
    assert card.stats_label.text() == "36 tokens · 41.5 tok/s" and card.stats_label.isVisible()
    assert card.highlight(["umbrella", "weather"]) == 2  # the answer and step 1's text
    assert "background-color" in card.agent_parts.groups[0].text_widget.labels()[0].text()
    out = Path(os.environ.get("GLASSBOX_SHOTS") or tmp_path) / "agent_order_two_steps.png"
    assert view.widget().grab().save(str(out))
    assert out.stat().st_size > 10_000


def test_markdown_and_code_copies_work_in_a_steps_text(qtbot: Any) -> None:
    content, stats = two_step_turn()
    step_text = "Checking:\n\n```\ncurl wttr.in/Paris\n```"
    stats["agent_messages"][0]["content"] = step_text
    content = content.replace(FIRST, step_text, 1)
    card = MessageCard(message(2, "assistant", content, stats), LIGHT.code, "Assistant")
    qtbot.addWidget(card)
    assert card.copy_code(0) == "curl wttr.in/Paris\n"  # the step's code block comes first
    labels = card.agent_parts.groups[0].text_widget.labels()
    assert any("<pre" in label.text() or "curl" in label.text() for label in labels)


def test_an_old_reply_with_cards_but_no_messages_looks_as_it_did(qtbot: Any) -> None:
    content, stats = two_step_turn()
    old = {k: v for k, v in stats.items() if k != "agent_messages"}
    card = MessageCard(message(2, "assistant", content, old), LIGHT.code, "Assistant")
    qtbot.addWidget(card)
    card.resize(700, 800)
    card.show()
    QApplication.processEvents()
    assert reading_order(card) == ["get_weather", "local_time", "thinking", "answer"]
    assert FIRST in answer_html(card) and "14:05" in answer_html(card)  # the whole text, as before
    assert card.agent_parts.fold.text == "\n\n".join(t for t in THOUGHTS if t)  # one fold, all of it


# ---------------------------------------------------------------------------- the card, live
def test_while_streaming_each_steps_text_comes_before_its_cards(qtbot: Any, tmp_path: Path) -> None:
    content, stats = two_step_turn()
    messages, steps = stats["agent_messages"], stats["tool_steps"]
    view = ChatView()
    qtbot.addWidget(view)
    view.setStyleSheet(stylesheet(LIGHT))
    view.resize(700, 900)
    view.show()
    view.set_thread([message(1, "user", "Weather?"), message(2, "assistant", "", None, state="pending")])
    view.begin_stream(2)
    card = view.cards[1]
    view.append_stream(FIRST[:12])
    view.set_live_agent({"agent_messages": messages[:1], "tool_steps": []})  # the rest of the text lags
    gate = ApprovalGate(threading.Event())
    approval = view.show_approval(ApprovalRequest(1, "call_1", "get_weather", {"city": "Paris"}, "", "", gate))
    assert approval is not None
    view.append_stream(FIRST[12:])  # the lagging text arrives
    view._render_stream()
    QApplication.processEvents()
    assert reading_order(card) == ["text:" + FIRST, "approval:get_weather", "answer"]
    assert "…" in card.body.text()  # the loop goes on below the waiting call
    qtbot.wait(30)
    shots = Path(os.environ.get("GLASSBOX_SHOTS") or tmp_path)
    assert view.widget().grab().save(str(shots / "agent_order_waiting.png"))
    approval.decide("once")
    view.add_tool_step(steps[0])
    view.set_live_agent({"agent_messages": messages[:2], "tool_steps": steps[:1]})
    view.append_stream("\n\n" + SECOND)
    view.set_live_agent({"agent_messages": messages[:3], "tool_steps": steps[:1]})
    view.add_tool_step(steps[1])  # allow-listed: no approval card first
    view.set_live_agent({"agent_messages": messages[:4], "tool_steps": steps})
    view.append_stream("\n\n" + ANSWER)
    view._render_stream()
    QApplication.processEvents()
    assert reading_order(card) == ["text:" + FIRST, "get_weather", "text:" + SECOND, "local_time", "answer"]
    assert "umbrella" in answer_html(card) and SECOND not in answer_html(card)
    assert view.streamed_text == content
    first_card = card.agent_parts.cards[0]
    view.end_stream()
    view.set_thread([message(1, "user", "Weather?"), message(2, "assistant", content, stats)])
    QApplication.processEvents()
    assert reading_order(view.cards[1])[:5] == reading_order(card)[:5]  # saved, it reads the same
    assert view.cards[1].agent_parts.cards[0] is first_card  # the cards were kept, not rebuilt


def test_stop_expires_a_waiting_approval_in_its_step(qtbot: Any) -> None:
    _content, stats = two_step_turn()
    view = ChatView()
    qtbot.addWidget(view)
    view.set_thread([message(1, "user", "Weather?"), message(2, "assistant", "", None, state="pending")])
    view.begin_stream(2)
    view.append_stream(FIRST)
    view.set_live_agent({"agent_messages": stats["agent_messages"][:1], "tool_steps": []})
    gate = ApprovalGate(threading.Event())
    approval = view.show_approval(ApprovalRequest(1, "call_1", "get_weather", {"city": "Paris"}, "", "", gate))
    assert approval is not None and approval.parentWidget() is not None
    assert approval in view.cards[1].agent_parts.groups[0].widgets()
    view.end_stream()
    assert not approval.pending and gate.answered and gate.wait() == "deny"


def test_a_call_shown_before_its_step_is_known_stays_in_view(qtbot: Any) -> None:
    """Without the running turn's messages (nothing forwards them), a call's card still shows, above
    the text that streams on, as every card did before."""
    _content, stats = two_step_turn()
    view = ChatView()
    qtbot.addWidget(view)
    view.set_thread([message(1, "user", "Weather?"), message(2, "assistant", "", None, state="pending")])
    view.begin_stream(2)
    view.append_stream(FIRST)
    view.add_tool_step(stats["tool_steps"][0])
    view.append_stream("\n\n" + ANSWER)
    view._render_stream()
    parts = view.cards[1].agent_parts
    assert [c.step["name"] for c in parts.cards] == ["get_weather"] and parts.cards[0].parent() is not None
    assert parts.cards[0] in parts.groups[0].widgets()
    view.end_stream()


def test_thinking_without_its_lengths_stays_in_one_fold_above_the_answer(qtbot: Any) -> None:
    content, stats = two_step_turn()
    for entry in stats["loop"]:  # a history written before the records kept them
        entry.pop("reasoning_chars", None)  # (tool entries never had it)
    card = MessageCard(message(2, "assistant", content, stats), LIGHT.code, "Assistant")
    qtbot.addWidget(card)
    assert card.agent_parts.fold.text == "\n\n".join(t for t in THOUGHTS if t)
    assert card.agent_parts.fold.title == "Thought for 90 ms · 9 tokens"
    assert all(not g.fold.text for g in card.agent_parts.groups)
    assert thoughts_of(stats, "anything") is None


def test_thoughts_are_cut_by_their_lengths_and_a_mismatch_is_refused() -> None:
    _content, stats = two_step_turn()
    split = thoughts_of(stats, stats["reasoning"]["text"])
    assert split is not None and [t.text for t in split[0]] == list(THOUGHTS) and split[1] == ""
    assert thoughts_of(stats, stats["reasoning"]["text"] + "x") is None
    live = thoughts_of({"loop": stats["loop"][:1]}, THOUGHTS[0] + "Both", live=True)
    assert live is not None and [t.text for t in live[0]] == [THOUGHTS[0]] and live[1] == "Both"


def test_live_thinking_goes_with_its_step_once_the_step_is_recorded(qtbot: Any) -> None:
    content, stats = two_step_turn()
    messages, steps, loop = stats["agent_messages"], stats["tool_steps"], stats["loop"]
    view = ChatView()
    qtbot.addWidget(view)
    view.set_thread([message(1, "user", "Weather?"), message(2, "assistant", "", None, state="pending")])
    view.begin_stream(2)
    card = view.cards[1]
    view.append_reasoning(THOUGHTS[0][:10])
    assert card.agent_parts.fold.title == "Thinking…" and card.agent_parts.fold.text == THOUGHTS[0][:10]
    view.append_reasoning(THOUGHTS[0][10:])
    view.append_stream(FIRST)
    view.set_live_agent({"agent_messages": messages[:1], "tool_steps": [], "loop": loop[:1]})
    assert card.agent_parts.groups[0].fold.text == THOUGHTS[0]
    assert card.agent_parts.fold.text == ""  # the answer has no thinking yet
    view.add_tool_step(steps[0])
    view.set_live_agent({"agent_messages": messages[:2], "tool_steps": steps[:1], "loop": loop[:2]})
    view.append_stream("\n\n" + SECOND)
    view.set_live_agent({"agent_messages": messages[:3], "tool_steps": steps[:1], "loop": loop[:3]})
    view.add_tool_step(steps[1])
    view.set_live_agent({"agent_messages": messages[:4], "tool_steps": steps, "loop": loop[:4]})
    view.append_reasoning(THOUGHTS[2])
    assert card.agent_parts.fold.text == THOUGHTS[2] and card.agent_parts.fold.title == "Thinking…"
    assert card.agent_parts.groups[0].fold.text == THOUGHTS[0] and not card.agent_parts.groups[1].fold.text
    view.append_stream("\n\n" + ANSWER)
    view.end_stream()
    view.set_thread([message(1, "user", "Weather?"), message(2, "assistant", content, stats)])
    saved = view.cards[1].agent_parts
    assert saved.groups[0].fold.text == THOUGHTS[0] and saved.fold.text == THOUGHTS[2]
    assert saved.fold.title == "Thought for 30 ms · 3 tokens"


def test_a_transcript_rebuilt_while_a_call_waits_keeps_the_step_its_thinking_and_the_approval(qtbot: Any) -> None:
    _content, stats = two_step_turn()
    view = ChatView()
    qtbot.addWidget(view)
    thread = [message(1, "user", "Weather?"), message(2, "assistant", "", None, state="pending")]
    view.set_thread(thread)
    view.begin_stream(2)
    view.append_reasoning(THOUGHTS[0])
    view.append_stream(FIRST)
    view.set_live_agent({"agent_messages": stats["agent_messages"][:1], "tool_steps": [], "loop": stats["loop"][:1]})
    gate = ApprovalGate(threading.Event())
    view.show_approval(ApprovalRequest(1, "call_1", "get_weather", {"city": "Paris"}, "", "", gate))
    view.set_thread(thread, evicted=1)  # another shape: every card is built again
    parts = view.cards[1].agent_parts
    assert parts.groups[0].text_widget.text == FIRST and parts.groups[0].fold.text == THOUGHTS[0]
    assert [a.request.call_id for a in parts.groups[0].widgets() if a in parts.approvals] == ["call_1"]
    assert not gate.answered  # still waiting for the user, in its new card
    view.end_stream()
    assert gate.answered


def test_the_worker_sends_a_steps_streamed_text_and_thinking_before_its_approval_question(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Text and thinking are coalesced (~30 updates a second); a step's record or its call's
    approval question must not overtake what was streamed before it, or a waiting approval would
    show under a step whose thinking is cut short."""
    from app.gui.workers import llm_worker
    from app.gui.workers.llm_worker import Coalescer, LlmWorker
    from engine.inference.events import Reasoning, Token

    monkeypatch.setattr(llm_worker, "COALESCE_S", 3600.0)  # nothing is due by itself in this test

    sent: list[tuple[str, object]] = []
    stream = Coalescer(
        7,
        lambda rid, text, n: sent.append(("text", text)),
        lambda rid, text: sent.append(("thinking", text)),
        lambda rid, done, total: None,
    )
    stream.take(Token("", 1))  # the first update goes at once; what follows waits for the next tick
    sent.clear()
    stream.take(Reasoning("I should look it up."))
    stream.take(Token("Let me check.", 42))
    assert sent == []  # still coalescing

    class Signal:
        def emit(self, rid: int, payload: object) -> None:
            sent.append(("approval", payload))

    LlmWorker._after_flush(stream, Signal(), 7, "ask")  # type: ignore[arg-type]
    assert sent == [("thinking", "I should look it up."), ("text", "Let me check."), ("approval", "ask")]


def test_a_plain_replys_thinking_is_folded_above_its_answer_with_its_time(qtbot: Any) -> None:
    """Issue 28: the fold showed tokens but no time, and sat below the answer although it came first."""
    stats = {"completion_tokens": 40, "reasoning": {"text": "Two and two make four.", "tokens": 7, "ms": 1234.0}}
    card = MessageCard(message(2, "assistant", "Four.", stats), LIGHT.code, "Assistant")
    qtbot.addWidget(card)
    card.resize(700, 400)
    card.show()
    QApplication.processEvents()
    fold = card.agent_parts.fold
    assert fold.isVisibleTo(card) and fold.title == "Thought for 1.2 s · 7 tokens"
    assert top(fold, card) < top(card.body, card)
