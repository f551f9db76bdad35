"""The remote backend with tools, reasoning, constraints and logprobs (:mod:`engine.inference.remote`), against
a scripted OpenAI-shaped server: what it sends, and how it reads the server's streamed
``tool_calls`` (arguments in pieces, as OpenAI sends them) and ``reasoning_content``."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import pytest

from engine.errors import EngineError
from engine.inference.context import Message
from engine.inference.events import Finished, Reasoning, Token, ToolCall
from engine.inference.remote import RemoteSession
from engine.inference.runtime import GenerationParams
from engine.inference.tools import ToolSpec
from tests.engine import test_remote
from tests.engine.test_remote import Route, ScriptedServer, sse

scripted = test_remote.scripted  # the fixture: scripted servers on loopback, closed after the test
WEATHER = ToolSpec("get_weather", "The weather", {"type": "object", "properties": {"city": {"type": "string"}}})


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish, **extra}]}


def test_streamed_tool_calls_and_reasoning_become_events(
    scripted: Callable[[dict[str, Route]], ScriptedServer],
) -> None:
    events = sse(
        chunk({"role": "assistant", "reasoning_content": "The user wants "}),
        chunk({"reasoning_content": "the weather."}),
        chunk({"content": "Checking."}),
        chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"ci'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Paris"}'}}]}),
        chunk({"tool_calls": [{"index": 1, "id": "c2", "function": {"name": "get_weather", "arguments": "{}"}}]}),
        chunk({}, "tool_calls"),
    )
    server = scripted({"/v1/chat/completions": lambda body: (200, events)})
    session = RemoteSession(server.url, "m1")
    out = list(session.stream([], "weather?", GenerationParams(max_tokens=32), tools=[WEATHER], tool_choice="auto"))
    assert [e.text for e in out if isinstance(e, Reasoning)] == ["The user wants ", "the weather."]
    assert "".join(e.text for e in out if isinstance(e, Token)) == "Checking."
    calls = [e for e in out if isinstance(e, ToolCall)]
    assert [(c.id, c.name, c.arguments) for c in calls] == [
        ("c1", "get_weather", {"city": "Paris"}),
        ("c2", "get_weather", {}),
    ]
    finished = out[-1]
    assert isinstance(finished, Finished)
    assert finished.tool_calls == tuple(calls) and finished.reasoning == "The user wants the weather."
    assert finished.text == "Checking." and finished.reason == "stop"
    body = server.requests[-1][1]
    assert body["tools"] == [WEATHER.as_openai()] and body["tool_choice"] == "auto"


INLINE = ["<thi", "nk>\nThe user ", "wants 2+3.", "\n</th", "ink>\n\n", "It is ", "5."]


@pytest.mark.parametrize("pieces", [INLINE, ["".join(INLINE)], list("".join(INLINE))], ids=["tokens", "whole", "chars"])
def test_inline_thinking_in_the_content_is_folded_and_never_sent_back(
    scripted: Callable[[dict[str, Route]], ScriptedServer], pieces: list[str]
) -> None:
    """A server without a reasoning parser streams ``<think>...</think>`` in the content: it is
    shaped as a local reply is, thinking apart, and the next request's assistant message is the
    answer alone."""
    replies = [
        sse(chunk({"role": "assistant", "content": ""}), *(chunk({"content": p}) for p in pieces), chunk({}, "stop")),
        sse(chunk({"content": "It is 10."}), chunk({}, "stop")),
    ]
    server = scripted({"/v1/chat/completions": lambda body: (200, replies.pop(0))})
    session = RemoteSession(server.url, "m1")
    out = list(session.stream([], "What is 2+3?", GenerationParams(max_tokens=32)))
    assert "".join(e.text for e in out if isinstance(e, Reasoning)) == "\nThe user wants 2+3.\n"
    assert "".join(e.text for e in out if isinstance(e, Token)) == "It is 5."
    finished = out[-1]
    assert isinstance(finished, Finished)
    assert finished.text == "It is 5." and finished.reasoning == "\nThe user wants 2+3.\n"
    assert finished.reasoning_tokens > 0
    # the next turn sends the answer only, as does a history an older version saved with the thinking in it
    for kept in (finished.text, "".join(INLINE)):
        replies.append(sse(chunk({"content": "It is 10."}), chunk({}, "stop")))
        history = [Message("user", "What is 2+3?"), Message("assistant", kept)]
        again = list(session.stream(history, "And times 2?", GenerationParams(max_tokens=32)))[-1]
        assert isinstance(again, Finished) and again.text == "It is 10."
        sent = server.requests[-1][1]["messages"]
        assert [m["content"] for m in sent if m["role"] == "assistant"] == ["It is 5."]
        assert "think" not in json.dumps(sent)


def test_server_reasoning_and_inline_thinking_add_up(scripted: Callable[[dict[str, Route]], ScriptedServer]) -> None:
    events = sse(
        chunk({"reasoning_content": "From the server. "}),
        chunk({"content": "<think>Inline.</think>Answer."}),
        chunk({}, "stop"),
    )
    server = scripted({"/v1/chat/completions": lambda body: (200, events)})
    finished = list(RemoteSession(server.url, "m1").stream([], "hi", GenerationParams(max_tokens=8)))[-1]
    assert isinstance(finished, Finished)
    assert finished.reasoning == "From the server. Inline." and finished.text == "Answer."


def test_what_the_request_sends(scripted: Callable[[dict[str, Route]], ScriptedServer]) -> None:
    done = sse(chunk({"content": "ok"}, "stop"))
    server = scripted({"/v1/chat/completions": lambda body: (200, done)})
    session = RemoteSession(server.url, "m1")
    call = ToolCall("c1", "get_weather", {"city": "Paris"}, "")
    history = [
        Message("user", "weather?"),
        Message("assistant", "", tool_calls=(call,)),
        Message("tool", "sunny", tool_call_id="c1", name="get_weather"),
    ]
    params = GenerationParams(
        max_tokens=8, json_schema='{"type": "object", "properties": {"a": {"type": "integer"}}}',
        logit_bias=((5, -math.inf), (7, 2.0)), logprobs=2,
    )  # fmt: skip
    list(session.stream(history, None, params, tools=[WEATHER], tool_choice="get_weather", reasoning_effort="low"))
    body = server.requests[-1][1]
    assistant, tool = body["messages"][1], body["messages"][2]
    assert assistant["content"] is None
    assert assistant["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert tool == {"role": "tool", "content": "sunny", "tool_call_id": "c1", "name": "get_weather"}
    assert body["messages"][-1]["role"] == "tool"  # no new user message: the turn continues
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert body["response_format"]["json_schema"]["schema"] == json.loads(params.json_schema or "")
    assert body["logit_bias"] == {"5": -100.0, "7": 2.0}
    assert (body["logprobs"], body["top_logprobs"]) == (True, 2)
    assert body["reasoning_effort"] == "low"
    list(session.stream([], "hi", GenerationParams(max_tokens=2, json_schema='{"type": "object"}'), thinking=False))
    body = server.requests[-1][1]
    assert body["response_format"] == {"type": "json_object"}
    assert body["chat_template_kwargs"] == {"enable_thinking": False}


def test_refusals_are_clear(scripted: Callable[[dict[str, Route]], ScriptedServer]) -> None:
    broken = sse(
        chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": "{not"}}]}, "tool_calls")
    )
    server = scripted({"/v1/chat/completions": lambda body: (200, broken)})
    session = RemoteSession(server.url, "m1")
    with pytest.raises(EngineError, match="whose arguments are not JSON"):
        list(session.stream([], "x", GenerationParams(max_tokens=4), tools=[WEATHER]))
    with pytest.raises(EngineError, match="no GBNF grammar"):
        list(session.stream([], "x", GenerationParams(max_tokens=4, grammar='root ::= "a"')))
    with pytest.raises(EngineError, match="not one of the tools offered"):
        list(session.stream([], "x", GenerationParams(max_tokens=4), tools=[WEATHER], tool_choice="nope"))


def test_logprobs_from_the_server_reach_the_tokens(scripted: Callable[[dict[str, Route]], ScriptedServer]) -> None:
    logprobs = {
        "content": [
            {
                "token": "Hi",
                "logprob": -0.25,
                "top_logprobs": [{"token": "Hi", "logprob": -0.25}, {"token": "Yo", "logprob": -2.0}],
            }
        ]
    }
    events = sse(chunk({"content": "Hi"}, None, logprobs=logprobs), chunk({}, "stop"))
    server = scripted({"/v1/chat/completions": lambda body: (200, events)})
    tokens = [
        e for e in RemoteSession(server.url, "m1").stream([], "x", GenerationParams(logprobs=2)) if isinstance(e, Token)
    ]
    assert tokens[0].logprob == -0.25 and tokens[0].top_logprobs == (("Hi", -0.25), ("Yo", -2.0))
