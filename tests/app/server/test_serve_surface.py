"""``glassbox serve``: the API surface real clients hit, with the official ``openai`` client against a
scripted backend (tests/app/server/serve_support.py): unsupported fields refused by name, constrained
output, ``n``, ``logprobs`` and ``logit_bias``, tools and ``tool_calls``, the usage chunk, unknown
models, and the legacy ``/v1/completions``.

What a field turns into is checked where it reaches the engine (the backend records every call);
the real model's behaviour under those fields is in test_serve_structured.py.
"""

from __future__ import annotations

import json
import math
from typing import Any

import openai
import pytest

from app.server.http import ServerHandle
from engine.errors import ContextOverflow, EngineError
from engine.media import MediaError
from tests.app.server import serve_support
from tests.app.server.serve_support import ScriptedBackend, client, post

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "alpha beta gamma"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


served = serve_support.served  # the fixture: a server in front of a ScriptedBackend


# ----------------------------------------------------------------------------- refused, not ignored


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"frequency_penalty": 2.5}, "frequency_penalty"),  # OpenAI's range is -2..2
        ({"web_search_options": {}}, "web_search_options"),  # it would change the answer
        ({"verbosity": "extreme"}, "verbosity"),
        ({"store": "yes"}, "store"),
        ({"mirostat": 3}, "mirostat"),
        ({"n_probs": 21}, "n_probs"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"audio": {"voice": "alloy"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema.schema",
        ),
        ({"tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"tools": [WEATHER], "tool_choice": "nope"}, "tool_choice"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"5000": 1}}, "logit_bias"),  # the vocabulary has 1000 tokens
        ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
        ({"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}}, "grammar"),
        ({"no_such_field": 1}, "no_such_field"),
    ],
)
def test_unsupported_fields_are_a_400_naming_them(
    served: tuple[ServerHandle, ScriptedBackend], extra: dict[str, Any], param: str
) -> None:
    handle, backend = served
    with pytest.raises(openai.BadRequestError) as caught:
        client(handle).chat.completions.create(model="fake-model", messages=HI, extra_body=extra)
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == param
    assert param.split(".")[0].split("[")[0] in error["message"]
    assert backend.calls == []  # refused before the model was touched


def test_fields_with_no_effect_are_accepted_and_said_so(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    handle, backend = served
    raw = client(handle).chat.completions.with_raw_response.create(
        model="fake-model",
        messages=HI,
        store=True,
        service_tier="auto",
        verbosity="low",
        prediction={"type": "content", "content": "gamma"},
        extra_body={"prompt_cache_retention": "24h"},
    )
    assert raw.parse().choices[0].message.content == "gamma beta alpha"
    warning = raw.headers["X-Glassbox-Warning"]
    assert "store: this server stores no chat completions" in warning
    assert "verbosity" in warning
    # tool_choice with no tools applies to nothing (LlamaIndex's structured_predict sends it): none.
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        raw = client(handle).chat.completions.with_raw_response.create(
            model="fake-model",
            messages=HI,
            tool_choice=choice,  # type: ignore[arg-type]
        )
        assert raw.parse().choices[0].message.content == "gamma beta alpha"
        assert "applies to nothing; taken as 'none'" in raw.headers["X-Glassbox-Warning"]
    assert [call.tool_choice for call in backend.calls] == [None, None, None]
    status, answer = post(handle, "/v1/messages", {"max_tokens": 9, "messages": HI, "tool_choice": {"type": "any"}})
    assert status == 200, answer


def test_sampling_fields_reach_the_engine(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    handle, backend = served
    client(handle).chat.completions.create(
        model="fake-model",
        messages=HI,
        frequency_penalty=0.5,
        presence_penalty=-1,
        extra_body={"typical_p": 0.9, "mirostat": 2, "mirostat_tau": 4.0, "mirostat_eta": 0.2, "n_probs": 3},
    )
    params = backend.calls[-1].params
    assert (params.frequency_penalty, params.presence_penalty, params.typical_p) == (0.5, -1.0, 0.9)
    assert (params.mirostat, params.mirostat_tau, params.mirostat_eta, params.logprobs) == (2, 4.0, 0.2, 3)
    status, body = post(handle, "/v1/responses", {"input": "a b", "frequency_penalty": 1.0, "top_logprobs": 2})
    assert status == 200, body
    assert backend.calls[-1].params.frequency_penalty == 1.0
    logprobs = body["output"][0]["content"][0]["logprobs"]
    assert [entry["token"] for entry in logprobs] == ["b", " a"]
    assert len(logprobs[0]["top_logprobs"]) == 2


def test_neutral_values_nulls_and_labels_are_accepted(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    handle, backend = served
    reply = client(handle).chat.completions.create(
        model="fake-model",
        messages=HI,
        frequency_penalty=0,
        presence_penalty=0.0,
        user="someone",
        metadata={"k": "v"},
        n=None,
        max_completion_tokens=None,
        max_tokens=2,
        response_format={"type": "text"},
    )
    assert reply.choices[0].message.content == "gamma beta"  # max_tokens=2, not hidden by the null
    assert backend.calls[0].params.max_tokens == 2
    status, body = post(handle, CHAT, {"messages": HI, "n": None, "max_completion_tokens": 1, "max_tokens": 3})
    assert status == 200
    assert body["choices"][0]["message"]["content"] == "gamma"  # max_completion_tokens wins when given


def test_an_unknown_model_is_a_404_and_the_served_one_is_listed(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    handle, backend = served
    with pytest.raises(openai.NotFoundError) as caught:
        client(handle).chat.completions.create(model="gpt-4o", messages=HI)
    assert caught.value.code == "model_not_found"
    # OpenAI's words (what clients match), and which model is served in Glassbox's own field.
    assert "The model `gpt-4o` does not exist or you do not have access to it." in caught.value.message
    assert isinstance(caught.value.body, dict)
    assert "'fake-model'" in caught.value.body["detail"]
    with pytest.raises(openai.NotFoundError):
        client(handle).completions.create(model="gpt-4o", prompt="x")
    assert client(handle).models.retrieve("fake-model").id == "fake-model"
    with pytest.raises(openai.NotFoundError):
        client(handle).models.retrieve("gpt-4o")
    status, _ = post(handle, CHAT, {"messages": HI})  # no model named: the served one
    assert status == 200
    assert len(backend.calls) == 1


# ----------------------------------------------------------------------------- constrained output


def test_response_format_and_grammar_reach_the_engine(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    handle, backend = served
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    api = client(handle)
    api.chat.completions.create(model="fake-model", messages=HI, response_format={"type": "json_object"})
    api.chat.completions.create(
        model="fake-model",
        messages=HI,
        response_format={"type": "json_schema", "json_schema": {"name": "count", "schema": schema, "strict": True}},
    )
    api.chat.completions.create(model="fake-model", messages=HI, extra_body={"grammar": 'root ::= "yes" | "no"'})
    first, second, third = (call.params for call in backend.calls)
    assert json.loads(first.json_schema) == {"type": "object"}
    assert json.loads(second.json_schema) == schema
    assert third.grammar == 'root ::= "yes" | "no"' and third.json_schema is None


def test_a_schema_the_grammar_cannot_enforce_is_refused(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    """``minimum`` would be ignored by the grammar, and the reply could break the schema: a 400."""
    handle, backend = served
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}}
    with pytest.raises(openai.BadRequestError) as caught:
        client(handle).chat.completions.create(
            model="fake-model",
            messages=HI,
            response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
        )
    assert caught.value.body["param"] == "response_format"  # type: ignore[index]
    assert "'minimum' at properties.n" in caught.value.message
    assert backend.calls == []


def test_the_decode_loops_refusal_of_a_constraint_is_a_400(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    """The worker refuses a grammar only once it builds its sampler: that error names the field
    and is the request's fault, not the server's."""
    handle, backend = served
    from engine.errors import EngineError

    def refusing(*args: Any, **kwargs: Any) -> Any:
        raise EngineError("grammar: parse error at line 1")

    backend.stream = refusing  # type: ignore[method-assign]
    with pytest.raises(openai.BadRequestError) as caught:
        client(handle).chat.completions.create(model="fake-model", messages=HI, extra_body={"grammar": "root ::="})
    assert caught.value.body["param"] == "grammar"  # type: ignore[index]
    assert caught.value.body["message"] == "grammar: parse error at line 1"  # type: ignore[index]


# ----------------------------------------------------------------------------- n, logprobs, logit_bias


def test_n_choices_each_with_its_own_seed(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    handle, backend = served
    reply = client(handle).chat.completions.create(model="fake-model", messages=HI, n=3, seed=7)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert [call.params.seed for call in backend.calls] == [7, 8, 9]
    assert reply.usage is not None and reply.usage.completion_tokens == 9  # three choices of three tokens
    stream = client(handle).chat.completions.create(model="fake-model", messages=HI, n=2, stream=True)
    text: dict[int, str] = {0: "", 1: ""}
    finishes = {}
    for chunk in stream:
        for choice in chunk.choices:
            text[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert text == {0: "gamma beta alpha", 1: "gamma beta alpha"}
    assert finishes == {0: "stop", 1: "stop"}


def test_logprobs_whole_and_streamed(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    handle, backend = served
    reply = client(handle).chat.completions.create(model="fake-model", messages=HI, logprobs=True, top_logprobs=2)
    assert backend.calls[-1].params.logprobs == 2
    content = reply.choices[0].logprobs.content  # type: ignore[union-attr]
    assert [entry.token for entry in content] == ["gamma", " beta", " alpha"]
    assert all(entry.logprob == -0.5 and len(entry.top_logprobs) == 2 for entry in content)
    assert content[0].top_logprobs[1].token == "gamma~1" and content[0].top_logprobs[1].logprob == -2.0
    only = client(handle).chat.completions.create(model="fake-model", messages=HI, logprobs=True)
    assert backend.calls[-1].params.logprobs == 1  # the engine computes one; the answer shows none
    assert only.choices[0].logprobs.content[0].top_logprobs == []  # type: ignore[union-attr]
    plain = client(handle).chat.completions.create(model="fake-model", messages=HI)
    assert plain.choices[0].logprobs is None
    stream = client(handle).chat.completions.create(
        model="fake-model", messages=HI, logprobs=True, top_logprobs=1, stream=True
    )
    streamed = [c.choices[0].logprobs.content[0] for c in stream if c.choices and c.choices[0].logprobs]
    assert [e.token for e in streamed] == ["gamma", " beta", " alpha"]


def test_logit_bias_reaches_the_engine_and_minus_100_bans(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    handle, backend = served
    client(handle).chat.completions.create(model="fake-model", messages=HI, logit_bias={"12": 5, "40": -100})
    bias = dict(backend.calls[0].params.logit_bias)
    assert bias[12] == 5.0
    assert bias[40] == -math.inf


# ----------------------------------------------------------------------------- streaming usage


def test_no_empty_choices_chunk_without_include_usage(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    handle, _ = served
    status, events = post(handle, CHAT, {"messages": HI, "stream": True})
    assert status == 200
    chunks = [e.data for e in events if e.data != "[DONE]"]
    assert events[-1].data == "[DONE]"
    assert all(chunk["choices"] for chunk in chunks)
    assert "timings" in chunks[-1] and chunks[-1]["choices"][0]["finish_reason"] == "stop"
    status, events = post(handle, CHAT, {"messages": HI, "stream": True, "stream_options": {"include_usage": True}})
    chunks = [e.data for e in events if e.data != "[DONE]"]
    assert [c for c in chunks if not c["choices"]] == [chunks[-1]]
    assert chunks[-1]["usage"]["completion_tokens"] == 3


# ----------------------------------------------------------------------------- tools


def test_tool_calls_in_a_whole_reply(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    handle, backend = served
    reply = client(handle).chat.completions.create(
        model="fake-model",
        messages=HI,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    call = backend.calls[0]
    assert [tool.name for tool in call.tools or []] == ["get_weather", "get_time"]
    assert call.tools is not None and call.tools[0].parameters == WEATHER["function"]["parameters"]  # type: ignore[index]
    assert call.tool_choice == "get_weather"
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    (made,) = choice.message.tool_calls
    assert made.type == "function" and made.function.name == "get_weather"
    assert json.loads(made.function.arguments) == {"city": "Paris"}
    for keyword in ("auto", "required", "none"):
        client(handle).chat.completions.create(model="fake-model", messages=HI, tools=[WEATHER], tool_choice=keyword)
        assert backend.calls[-1].tool_choice == keyword
    none = client(handle).chat.completions.create(model="fake-model", messages=HI, tools=[WEATHER], tool_choice="none")
    assert none.choices[0].message.tool_calls is None and none.choices[0].finish_reason == "stop"


def test_tool_calls_streamed_and_parallel_calls(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    handle, backend = served
    backend.calls_per_reply = 2
    stream = client(handle).chat.completions.create(model="fake-model", messages=HI, tools=[WEATHER], stream=True)
    deltas = []
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            deltas.extend(choice.delta.tool_calls or [])
            finish = choice.finish_reason or finish
    assert [(d.index, d.id, d.function.name) for d in deltas] == [
        (0, "call0", "get_weather"),
        (1, "call1", "get_weather"),
    ]
    assert all(json.loads(d.function.arguments) == {"city": "Paris"} for d in deltas)
    assert finish == "tool_calls"
    single = client(handle).chat.completions.create(
        model="fake-model", messages=HI, tools=[WEATHER], parallel_tool_calls=False
    )
    assert len(single.choices[0].message.tool_calls or []) == 1


def test_tool_messages_and_assistant_calls_reach_the_engine(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    handle, backend = served
    messages: list[Any] = [
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21 C"},
    ]
    client(handle).chat.completions.create(model="fake-model", messages=messages, tools=[WEATHER])
    call = backend.calls[0]
    assistant, tool = call.history[1], call.history[2]
    assert assistant.role == "assistant" and assistant.tool_calls[0].name == "get_weather"
    assert assistant.tool_calls[0].arguments == {"city": "Paris"} and assistant.tool_calls[0].id == "c1"
    assert (tool.role, tool.content, tool.tool_call_id, tool.name) == ("tool", "sunny, 21 C", "c1", "get_weather")
    assert call.user is None  # the reply continues after the tool's result


def test_reasoning_comes_apart_from_the_answer(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    handle, _ = served
    status, body = post(handle, CHAT, {"messages": [{"role": "user", "content": "think twice"}]})
    assert status == 200
    message = body["choices"][0]["message"]
    assert message["content"] == "twice think" and message["reasoning_content"] == "Let me see."
    status, events = post(handle, CHAT, {"messages": [{"role": "user", "content": "think twice"}], "stream": True})
    deltas = [e.data["choices"][0]["delta"] for e in events if e.data != "[DONE]" and e.data["choices"]]
    assert {"reasoning_content": "Let me see."} in deltas


# ----------------------------------------------------------------------------- /v1/completions


def test_completions_whole_streamed_echo_and_n(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    handle, backend = served
    api = client(handle)
    whole = api.completions.create(model="fake-model", prompt="one two three", max_tokens=2, temperature=0)
    assert whole.object == "text_completion"
    assert whole.choices[0].text == "three two"
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage is not None and whole.usage.prompt_tokens == len(b"one two three")
    assert backend.worker.prompts[0] == list(b"one two three")  # raw text: no chat template
    default = api.completions.create(model="fake-model", prompt=" ".join(["w"] * 40))
    assert default.usage is not None and default.usage.completion_tokens == 16  # OpenAI's default max_tokens
    streamed = "".join(
        c.choices[0].text
        for c in api.completions.create(model="fake-model", prompt="one two three", stream=True)
        if c.choices
    )
    assert streamed == "three two one"
    echoed = api.completions.create(model="fake-model", prompt="a b", echo=True)
    assert echoed.choices[0].text == "a bb a"
    many = api.completions.create(model="fake-model", prompt=["a b", "c d"], n=2, seed=3)
    assert [(c.index, c.text) for c in many.choices] == [(0, "b a"), (1, "b a"), (2, "d c"), (3, "d c")]
    assert [p.seed for p in backend.worker.params[-4:]] == [3, 4, 3, 4]
    ids = api.completions.create(model="fake-model", prompt=[104, 105, 32, 121, 111])  # "hi yo" as ids
    assert ids.choices[0].text == "yo hi"


def test_completions_logprobs_and_refusals(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    handle, _backend = served
    api = client(handle)
    reply = api.completions.create(model="fake-model", prompt="x y", logprobs=2)
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.tokens == ["y", " x"] and logprobs.token_logprobs == [-0.5, -0.5]
    assert logprobs.text_offset == [0, 1]
    assert logprobs.top_logprobs == [{"y~0": -1.0, "y~1": -2.0}, {" x~0": -1.0, " x~1": -2.0}]
    for extra, param in (
        ({"suffix": "end"}, "suffix"),
        ({"best_of": 3}, "best_of"),
        ({"echo": True, "logprobs": 1}, "echo"),
    ):
        with pytest.raises(openai.BadRequestError) as caught:
            api.completions.create(model="fake-model", prompt="x", extra_body=extra)
        assert caught.value.body["param"] == param  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as caught:
        api.completions.create(model="fake-model", prompt="w " * 250, max_tokens=16)  # 500 bytes > 256
    assert caught.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as caught:
        api.completions.create(model="fake-model", prompt="")
    assert caught.value.body["message"] == "'prompt' is empty"  # type: ignore[index]


def test_a_conversation_over_the_window_is_context_length_exceeded(
    served: tuple[ServerHandle, ScriptedBackend],
) -> None:
    """The engine's ContextOverflow (raised by a server-owned session, policy "refuse") is OpenAI's 400."""
    handle, _ = served
    from engine.errors import ContextOverflow

    def overflowing(*args: Any, **kwargs: Any) -> Any:
        raise ContextOverflow("the conversation needs 9000 tokens; the context window is 256")

    handle_backend = served[1]
    handle_backend.stream = overflowing  # type: ignore[method-assign]
    with pytest.raises(openai.BadRequestError) as caught:
        client(handle).chat.completions.create(model="fake-model", messages=HI)
    assert caught.value.code == "context_length_exceeded"


@pytest.mark.parametrize(
    ("failure", "code"),
    [
        (ContextOverflow("the conversation needs 9000 tokens; the context window is 256"), "context_length_exceeded"),
        (MediaError("messages[0].content[1]", "this model has no projector: it sees no images"), "invalid_image"),
        (EngineError("json_schema: 'minimum' at $.age cannot be enforced"), "invalid_value"),
    ],
    ids=["overflow", "image", "grammar"],
)
def test_a_stream_refused_while_it_is_planned_is_an_http_error(
    served: tuple[ServerHandle, ScriptedBackend], failure: Exception, code: str
) -> None:
    """3 streamed requests per failure (chat, Responses, Messages): the engine refuses the turn with
    its first event (planning: the window, the images, the grammar), and each client gets a 400 it
    raises as such, not a 200 whose stream holds an error event (the openai SDK would raise a bare
    APIError mid-iteration, with no status; the anthropic SDK likewise)."""
    import anthropic

    handle, backend = served

    def refusing(call: Any) -> Any:
        raise failure
        yield  # a generator: the failure comes with its first event, as the engine's planner raises it

    backend.script = refusing  # type: ignore[method-assign]
    api = client(handle)
    with pytest.raises(openai.BadRequestError) as caught:
        for _ in api.chat.completions.create(model="fake-model", messages=HI, stream=True):  # type: ignore[arg-type]
            pass
    assert caught.value.status_code == 400 and caught.value.code == code
    with pytest.raises(openai.BadRequestError) as caught:
        for _ in api.responses.create(model="fake-model", input="alpha beta", stream=True):
            pass
    assert caught.value.status_code == 400 and caught.value.code == code
    claude = anthropic.Anthropic(base_url=handle.url, api_key=serve_support.KEY, max_retries=0, timeout=60)
    with pytest.raises(anthropic.BadRequestError) as refused:
        for _ in claude.messages.create(
            model="fake-model", max_tokens=16, messages=[{"role": "user", "content": "alpha"}], stream=True
        ):
            pass
    assert refused.value.status_code == 400
    assert refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]


def test_a_shared_rolling_session_is_measured_before_it_trims(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    """The GUI's own session (policy "rolling") served through the API-server toggle: the API still
    answers an overflowing conversation with context_length_exceeded, before any generation."""
    handle, backend = served
    rooms: list[int] = [-40, 10]
    seen: list[Any] = []

    def result_room(messages: Any, params: Any, **kwargs: Any) -> int:
        seen.append((messages, kwargs["system"]))
        return rooms.pop(0)

    backend.overflow_policy = "rolling"  # type: ignore[attr-defined]
    backend.result_room = result_room  # type: ignore[attr-defined]
    messages = [{"role": "system", "content": "s"}, *HI]
    with pytest.raises(openai.BadRequestError) as caught:
        client(handle).chat.completions.create(model="fake-model", messages=messages)  # type: ignore[arg-type]
    assert caught.value.code == "context_length_exceeded"
    assert "40 tokens more" in caught.value.message
    assert backend.calls == []
    assert [m.content for m in seen[0][0]] == ["alpha beta gamma"] and seen[0][1] == "s"
    client(handle).chat.completions.create(model="fake-model", messages=HI)  # room left: served
    assert len(backend.calls) == 1


def test_logprobs_of_text_held_back_for_a_stop_string() -> None:
    """The decode loop reports every token with logprobs, the text of one that may begin a stop
    string held back (empty) and flushed with a later token or, at the end, a last Token without a
    log-probability: every token keeps its entry and the entries' text is the reply's."""
    from app.server.wire import logprobs_document
    from engine.inference.events import Token

    tokens = [
        Token("Hi", 1, -0.1, (("Hi", -0.1),)),
        Token("", 2, -0.2, (("<", -0.2),)),  # held back: it could begin "<end>"
        Token(" <e", 3, -0.3, (("e", -0.3),)),  # not a stop after all: both tokens' text
        Token("", 4, -0.4, (("n", -0.4),)),
        Token("n", -1),  # the tail, flushed when the reply ended on its length
    ]
    content = logprobs_document(tokens, 1)["content"]  # type: ignore[index]
    assert [e["logprob"] for e in content] == [-0.1, -0.2, -0.3, -0.4]
    assert "".join(e["token"] for e in content) == "Hi <en"
    assert content[-1]["token"] == "n" and content[-1]["bytes"] == [110]
