"""Tools through ChatSession.stream with a scripted worker: events, budget bands, continuation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.agent.loop import Agent
from engine.errors import EngineError
from engine.inference.context import TRUNCATION_MARKER, Message
from engine.inference.events import Finished, Token, ToolCall
from engine.inference.tools import ToolSpec
from tests.engine import family_templates as ft
from tests.engine.scripted_worker import Script, scripted_session
from tests.engine.test_agent import ADD, FakeProvider

CALL_REPLY = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


@pytest.mark.parametrize("piece", [1, 2, 5, 13, len(CALL_REPLY)])
def test_a_call_streams_as_one_event_after_the_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, piece: int
) -> None:
    script = Script(replies=[CALL_REPLY], piece=piece)
    session = scripted_session(tmp_path, monkeypatch, ft.QWEN3, script)
    events = list(session.stream([], "What is 2+3?", tools=[ADD]))
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert [(c.name, c.arguments) for c in calls] == [("add", {"a": 2, "b": 3})]
    assert calls[0].raw.startswith("<tool_call>") and len(calls[0].id) == 9
    text = "".join(e.text for e in events if isinstance(e, Token))
    assert text == "Let me add."  # the newline before the call is the format's
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.tool_calls == tuple(calls) and finished.text == text
    assert "<tools>" in script.prompts[0] and '"name": "add"' in script.prompts[0]
    assert script.params[0].json_schema is None  # auto: the model chooses


def test_budget_has_tools_and_tool_results_bands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = Script(replies=[CALL_REPLY, "It is 5."])
    session = scripted_session(tmp_path, monkeypatch, ft.QWEN3, script)
    first = list(session.stream([], "What is 2+3?", tools=[ADD]))[-1]
    assert isinstance(first, Finished)
    budget = first.stats.budget
    assert budget["tools"] > len(json.dumps(ADD.as_openai()))  # byte tokens: at least the JSON's length
    assert budget["tool_results"] == 0 and sum(budget.values()) == 4096
    [call] = first.tool_calls
    history = [
        Message("user", "What is 2+3?"),
        Message("assistant", first.text, tool_calls=(call,)),
        Message("tool", "the sum is 5", tool_call_id=call.id, name="add"),
    ]
    second = list(session.stream(history, None, tools=[ADD]))[-1]
    assert isinstance(second, Finished) and second.text == "It is 5."
    prompt = script.prompts[-1]
    assert prompt.endswith("<tool_response>\nthe sum is 5\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert prompt.count("What is 2+3?") == 1  # continued: no new user message
    assert second.stats.budget["tool_results"] == len(b"the sum is 5")
    assert sum(second.stats.budget.values()) == 4096


@pytest.mark.parametrize("choice", ["add", "required"])
def test_forced_choice_constrains_the_reply_with_the_call_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, choice: str
) -> None:
    script = Script(replies=['{"name": "add", "arguments": {"a": 1, "b": 2}}'])
    session = scripted_session(tmp_path, monkeypatch, ft.QWEN3, script)
    finished = list(session.stream([], "1+2?", tools=[ADD], tool_choice=choice))[-1]
    assert isinstance(finished, Finished)
    schema = json.loads(script.params[0].json_schema or "null")
    variant = schema.get("anyOf", [schema])[0]
    assert variant["properties"]["name"] == {"const": "add"}
    assert [(c.name, c.arguments) for c in finished.tool_calls] == [("add", {"a": 1, "b": 2})]


def test_bad_tool_choices_are_clear_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    session = scripted_session(tmp_path, monkeypatch, ft.QWEN3, Script())
    with pytest.raises(EngineError, match="'mul' is not one of the tools offered"):
        list(session.stream([], "hi", tools=[ADD], tool_choice="mul"))
    with pytest.raises(EngineError, match="needs tools"):
        list(session.stream([], "hi", tool_choice="required"))
    with pytest.raises(EngineError, match="no spaces"):
        list(session.stream([], "hi", tools=[ToolSpec("two words", "", {"type": "object"})]))
    with pytest.raises(EngineError, match="no turn to continue"):
        list(session.stream([], None))


def test_tool_choice_none_offers_nothing_and_parses_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = Script(replies=[CALL_REPLY])
    session = scripted_session(tmp_path, monkeypatch, ft.QWEN3, script)
    finished = list(session.stream([], "hi", tools=[ADD], tool_choice="none"))[-1]
    assert isinstance(finished, Finished) and finished.tool_calls == () and finished.text == CALL_REPLY
    assert "<tools>" not in script.prompts[0] and finished.stats.budget["tools"] == 0


def test_agent_over_the_session_runs_the_call_and_cuts_a_huge_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script(replies=[CALL_REPLY, "It is 5."])
    session = scripted_session(tmp_path, monkeypatch, ft.QWEN3, script, n_ctx=2048)
    provider = FakeProvider([ADD], behaviour="huge")
    agent = Agent(session, [provider], allow={"add"})
    run = agent.run([], "What is 2+3?")
    list(run)
    [step] = run.result.steps
    assert provider.calls == [("add", {"a": 2, "b": 3})]
    assert step.truncated and TRUNCATION_MARKER.split(":")[0] in step.result.content
    # the cut result is in the next prompt, and the prompt fits the window
    assert step.result.content in script.prompts[1] and len(script.prompts[1].encode()) < 2048
    assert run.result.text == "It is 5."


@pytest.mark.parametrize("piece", [1, 4, 100])
def test_control_token_markers_reach_the_parser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, piece: int) -> None:
    # Mistral's [TOOL_CALLS] is a control token: the worker streams it with no text.
    script = Script(
        replies=['[TOOL_CALLS][{"name": "add", "arguments": {"a": 4, "b": 5}}]'],
        piece=piece,
        control={"[TOOL_CALLS]": 5},
    )
    session = scripted_session(tmp_path, monkeypatch, ft.MISTRAL, script, architecture="llama")
    finished = list(session.stream([], "4+5?", tools=[ADD]))[-1]
    assert isinstance(finished, Finished)
    assert [(c.name, c.arguments) for c in finished.tool_calls] == [("add", {"a": 4, "b": 5})]
    assert finished.text == ""
