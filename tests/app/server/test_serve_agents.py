"""``glassbox serve``'s ``/v1/responses`` (the official ``openai`` client) and Anthropic's
``/v1/messages`` (raw HTTP: the ``anthropic`` package is not installed), over the scripted backend
of tests/app/server/serve_support.py, and one real-model turn of each.

What the coding agents need: text, tool calls, the tool's result sent back, thinking apart from the
answer, the streamed event sequences, errors in each API's own shape.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest

from app.paths import Paths
from app.server.http import ServerHandle, start_server
from tests.app.server import serve_support
from tests.app.server.serve_support import KEY, ScriptedBackend, client, post

WEATHER_FN = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": WEATHER_FN["parameters"],
}


served = serve_support.served  # the fixture: a server in front of a ScriptedBackend


# ----------------------------------------------------------------------------- /v1/responses


def test_responses_text_and_instructions(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    handle, backend = served
    response = client(handle).responses.create(
        model="fake-model", instructions="be brief", input="alpha beta", max_output_tokens=8, temperature=0
    )
    assert response.output_text == "beta alpha"
    assert response.status == "completed"
    assert response.usage is not None and response.usage.output_tokens == 2
    call = backend.calls[0]
    assert (call.system, call.user, call.params.max_tokens, call.params.temperature) == ("be brief", "alpha beta", 8, 0)
    short = client(handle).responses.create(model="fake-model", input="a b c", max_output_tokens=1)
    assert short.status == "incomplete" and short.incomplete_details is not None
    assert short.incomplete_details.reason == "max_output_tokens"


def test_responses_function_calls_and_their_outputs(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    handle, backend = served
    api = client(handle)
    response = api.responses.create(model="fake-model", input="weather in Paris?", tools=[WEATHER_FN])  # type: ignore[list-item]
    calls = [item for item in response.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert backend.calls[0].tools is not None and backend.calls[0].tools[0].name == "get_weather"
    follow = api.responses.create(
        model="fake-model",
        input=[
            {"role": "user", "content": "weather in Paris?"},
            {
                "type": "function_call",
                "call_id": calls[0].call_id,
                "name": "get_weather",
                "arguments": calls[0].arguments,
            },
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"},
        ],
        tools=[WEATHER_FN],  # type: ignore[list-item]
        tool_choice="none",
    )
    assert follow.status == "completed"
    sent = backend.calls[1]
    assert sent.user is None  # the turn continues after the tool's result
    assert sent.history[1].tool_calls[0].name == "get_weather"
    assert (sent.history[2].role, sent.history[2].content, sent.history[2].name) == ("tool", "sunny", "get_weather")


def test_responses_streamed_events(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    handle, _ = served
    stream = client(handle).responses.create(model="fake-model", input="think of a b", tools=[WEATHER_FN], stream=True)  # type: ignore[list-item]
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "b a of think"
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "Let me see."
    done = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
    assert [json.loads(a) for a in done] == [{"city": "Paris"}]
    final = events[-1].response  # type: ignore[union-attr]
    assert [item.type for item in final.output] == ["reasoning", "message", "function_call"]
    assert final.output_text == "b a of think"
    # What stateless agents ask for is accepted; reasoning is not carried into the next turn.
    again = client(handle).responses.create(model="fake-model", input="think", include=["reasoning.encrypted_content"])
    assert again.output[0].type == "reasoning" and again.output[0].encrypted_content is None


def test_responses_refuse_what_they_cannot_do(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    handle, backend = served
    for extra, param in (
        ({"tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"include": ["file_search_call.results"]}, "include"),
        ({"background": True}, "background"),
    ):
        with pytest.raises(openai.BadRequestError) as caught:
            client(handle).responses.create(model="fake-model", input="x", extra_body=extra)
        assert caught.value.body["param"] == param  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client(handle).responses.create(model="other", input="x")
    assert backend.calls == []


def test_responses_text_format_is_the_constraint(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    handle, backend = served
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    client(handle).responses.create(
        model="fake-model",
        input="x",
        text={"format": {"type": "json_schema", "name": "a", "schema": schema}},  # type: ignore[typeddict-item]
    )
    assert json.loads(backend.calls[0].params.json_schema) == schema


# ----------------------------------------------------------------------------- /v1/messages (Anthropic)


def _anthropic(handle: ServerHandle, body: dict[str, Any], path: str = "/v1/messages") -> tuple[int, Any]:
    import http.client

    connection = http.client.HTTPConnection(handle.host, handle.port, timeout=30)
    try:
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "x-api-key": KEY, "anthropic-version": "2023-06-01"}
        connection.request("POST", path, body=data, headers=headers)
        response = connection.getresponse()
        raw = response.read().decode()
        if (response.getheader("Content-Type") or "").startswith("text/event-stream"):
            from tests.app.server.serve_support import sse_events

            return response.status, sse_events(raw)
        return response.status, json.loads(raw)
    finally:
        connection.close()


def test_messages_text_thinking_and_tool_use(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    handle, backend = served
    status, body = _anthropic(
        handle,
        {
            "model": "fake-model",
            "max_tokens": 16,
            "system": [{"type": "text", "text": "be brief"}],
            "messages": [{"role": "user", "content": "think about Paris"}],
            "tools": [WEATHER_TOOL],
            "tool_choice": {"type": "tool", "name": "get_weather"},
        },
    )
    assert status == 200, body
    assert body["type"] == "message" and body["role"] == "assistant"
    assert [b["type"] for b in body["content"]] == ["thinking", "text", "tool_use"]
    assert body["content"][2]["input"] == {"city": "Paris"} and body["stop_reason"] == "tool_use"
    assert body["usage"]["output_tokens"] == 3
    assert backend.calls[0].tool_choice == "get_weather" and backend.calls[0].system == "be brief"
    status, body = _anthropic(
        handle,
        {
            "model": "fake-model",
            "max_tokens": 16,
            "messages": [
                {"role": "user", "content": "weather?"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}],
                },
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]},
            ],
            "tools": [WEATHER_TOOL],
            "tool_choice": {"type": "none"},
        },
    )
    assert status == 200, body
    sent = backend.calls[1]
    assert sent.user is None and sent.history[-1].role == "tool" and sent.history[-1].content == "sunny"
    assert body["stop_reason"] == "end_turn"


def test_messages_streamed_events(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    handle, _ = served
    status, events = _anthropic(
        handle,
        {"model": "fake-model", "max_tokens": 2, "stream": True, "messages": [{"role": "user", "content": "a b c"}]},
    )
    assert status == 200
    kinds = [e.event for e in events]
    assert kinds == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(e.data["type"] == e.event for e in events)
    assert "".join(e.data["delta"]["text"] for e in events if e.event == "content_block_delta") == "c b"
    assert events[5].data["delta"]["stop_reason"] == "max_tokens"


def test_messages_errors_in_anthropics_shape(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    handle, backend = served
    status, body = _anthropic(handle, {"model": "fake-model", "messages": [{"role": "user", "content": "x"}]})
    assert status == 400
    assert body == {"type": "error", "error": {"type": "invalid_request_error", "message": "'max_tokens' is required"}}
    status, body = _anthropic(
        handle,
        {
            "model": "fake-model",
            "max_tokens": 4,
            "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}],
        },
    )
    assert status == 400 and "content[0].source must be {'type': 'base64'" in body["error"]["message"]
    status, body = _anthropic(
        handle,
        {"model": "fake-model", "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "document"}]}]},
    )
    assert status == 400 and "'document' blocks are not supported" in body["error"]["message"]
    status, body = _anthropic(
        handle, {"model": "claude-x", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}
    )
    assert status == 404 and body["error"]["type"] == "not_found_error"
    status, body = _anthropic(
        handle, {"model": "fake-model", "messages": [{"role": "user", "content": "x"}]}, "/v1/messages/count_tokens"
    )
    assert status == 400 and body["error"]["message"] == "this server's backend cannot count tokens"
    status, _ = post(
        handle, "/v1/messages", {"model": "fake-model", "max_tokens": 4, "messages": []}, key="wrong-key-123"
    )
    assert status == 401
    assert backend.calls == []


# ----------------------------------------------------------------------------- the real model


@pytest.mark.model
def test_responses_and_messages_with_the_starter_model(starter_model: Path, tmp_path: Path) -> None:
    """One turn each with a named tool: the call validates against its schema (the grammar)."""
    import jsonschema

    with start_server(Paths.resolve(tmp_path), port=0, model_path=starter_model, n_ctx=1024) as handle:
        api = openai.OpenAI(base_url=f"{handle.url}/v1", api_key="unused", max_retries=0, timeout=120)
        response = api.responses.create(
            model=handle.model,
            input="What is the weather in Paris?",
            tools=[WEATHER_FN],  # type: ignore[list-item]
            tool_choice={"type": "function", "name": "get_weather"},
            max_output_tokens=64,
        )
        (call,) = [item for item in response.output if item.type == "function_call"]
        jsonschema.validate(json.loads(call.arguments), WEATHER_FN["parameters"])
        status, body = _anthropic(
            handle,
            {
                "model": handle.model,
                "max_tokens": 64,
                "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
                "tools": [WEATHER_TOOL],
                "tool_choice": {"type": "any"},
            },
        )
        assert status == 200, body
        (use,) = [block for block in body["content"] if block["type"] == "tool_use"]
        jsonschema.validate(use["input"], WEATHER_TOOL["input_schema"])
        assert body["stop_reason"] == "tool_use"
        # count_tokens counts the very prompt a reply reads (template and tools included).
        question = {"messages": [{"role": "user", "content": "Name a city."}], "tools": [WEATHER_TOOL]}
        status, counted = _anthropic(handle, {"model": handle.model, **question}, "/v1/messages/count_tokens")
        assert status == 200, counted
        status, body = _anthropic(handle, {"model": handle.model, "max_tokens": 1, **question})
        usage = body["usage"]
        assert counted["input_tokens"] == usage["input_tokens"] + usage["cache_read_input_tokens"]
