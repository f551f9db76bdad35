"""Glassbox as a client of Glassbox: :class:`engine.inference.remote.RemoteSession` against ``glassbox serve``
(scripted backend, tests/app/server/serve_support.py), with tools, tool results, reasoning, constrained
output and logprobs crossing the wire both ways."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.paths import Paths
from app.server.http import ServerHandle, start_server
from engine.inference.context import Message
from engine.inference.events import Finished, Reasoning, Token, ToolCall
from engine.inference.remote import RemoteSession
from engine.inference.runtime import GenerationParams
from engine.inference.tools import ToolSpec
from tests.app.server import serve_support
from tests.app.server.serve_support import KEY, ScriptedBackend

WEATHER = ToolSpec("get_weather", "The weather", {"type": "object", "properties": {"city": {"type": "string"}}})


served = serve_support.served  # the fixture: a server in front of a ScriptedBackend


@pytest.fixture
def pair(served: tuple[ServerHandle, ScriptedBackend]) -> Iterator[tuple[ServerHandle, ScriptedBackend, RemoteSession]]:
    handle, backend = served
    remote = RemoteSession(handle.url, "fake-model", api_key=KEY)
    yield handle, backend, remote
    remote.close()


def test_a_tool_turn_round_trips(pair: tuple[ServerHandle, ScriptedBackend, RemoteSession]) -> None:
    _, backend, remote = pair
    events = list(
        remote.stream(
            [], "think about Paris", GenerationParams(max_tokens=8), tools=[WEATHER], tool_choice="get_weather"
        )
    )
    assert [e.text for e in events if isinstance(e, Reasoning)] == ["Let me see."]
    assert "".join(e.text for e in events if isinstance(e, Token)) == "Paris about think"
    (call,) = [e for e in events if isinstance(e, ToolCall)]
    assert (call.name, call.arguments) == ("get_weather", {"city": "Paris"})
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.tool_calls == (call,)
    assert finished.reasoning == "Let me see."
    served = backend.calls[0]
    assert (
        served.tool_choice == "get_weather"
        and served.tools is not None
        and served.tools[0] == ToolSpec("get_weather", "The weather", WEATHER.parameters, source="request")
    )
    # The result goes back; the turn continues without a new user message.
    history = [
        Message("user", "think about Paris"),
        Message("assistant", "", tool_calls=(call,)),
        Message("tool", "sunny", tool_call_id=call.id, name="get_weather"),
    ]
    list(remote.stream(history, None, GenerationParams(max_tokens=4), tools=[WEATHER], tool_choice="none"))
    follow = backend.calls[1]
    assert follow.user is None
    assert [(m.role, m.content) for m in follow.history] == [
        ("user", "think about Paris"),
        ("assistant", ""),
        ("tool", "sunny"),
    ]
    assert follow.history[1].tool_calls[0].arguments == {"city": "Paris"}
    assert follow.history[2].tool_call_id == call.id


def test_constraints_and_logprobs_round_trip(pair: tuple[ServerHandle, ScriptedBackend, RemoteSession]) -> None:
    _, backend, remote = pair
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    params = GenerationParams(max_tokens=4, json_schema=json.dumps(schema), logprobs=2, logit_bias=((3, 1.5),))
    tokens = [e for e in remote.stream([], "a b", params) if isinstance(e, Token)]
    sent = backend.calls[0].params
    assert json.loads(sent.json_schema or "") == schema
    assert sent.logprobs == 2 and sent.logit_bias == ((3, 1.5),)
    assert tokens[0].logprob == -0.5 and tokens[0].top_logprobs == (("b~0", -1.0), ("b~1", -2.0))
    list(remote.stream([], "a b", GenerationParams(max_tokens=4, grammar='root ::= "x"')))
    assert backend.calls[1].params.grammar == 'root ::= "x"'  # a llama.cpp-family server: the grammar goes


def test_a_server_serving_a_remote_model_refuses_raw_completions(
    pair: tuple[ServerHandle, ScriptedBackend, RemoteSession], tmp_path: Path
) -> None:
    """``glassbox serve`` in front of a RemoteSession: chat goes through, ``/v1/completions`` (raw
    prompts: ChatSession.complete only) is a 400 naming the prompt, and nothing reaches the model."""
    from tests.app.server.serve_support import post

    _, backend, remote = pair
    with start_server(Paths.resolve(tmp_path / "front"), port=0, api_key=KEY, backend=remote) as front:
        status, answer = post(front, "/v1/completions", {"model": "fake-model", "prompt": "one two"})
        assert status == 400
        assert answer["error"]["param"] == "prompt"
        assert answer["error"]["message"] == "/v1/completions needs a local model; this server serves a remote one"
        assert backend.worker.prompts == [] and backend.calls == []
        status, answer = post(
            front, "/v1/chat/completions", {"model": "fake-model", "messages": [{"role": "user", "content": "one two"}]}
        )
        assert status == 200 and answer["choices"][0]["message"]["content"] == "two one"
