"""``glassbox serve`` with several models resident: the starter and a tiny Qwen 3 built in the test,
answering interleaved requests of the official ``openai`` client without reloading either; their
loaded flags; ``keep_alive``; aliases and the default model for unknown names; the queue's 503
with ``Retry-After``; an embedding request beside a chat one; LoRA adapters at ``/lora-adapters``
and per request; llama.cpp's ``/tokenize`` and ``/detokenize``, ``/chat/completions`` without
``/v1`` and CORS; a worker killed mid-reply or idle, failing nothing but its own model; LRU
eviction under a small budget; a prompt saved before an unload and restored after the reload."""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import psutil
import pytest

from app.paths import Paths
from app.server.http import ServerHandle, start_server
from engine.inference.adapters import LoraAdapter
from engine.inference.kv_cache import KvCacheConfig
from engine.inference.pool import PoolSettings
from tests.engine.lora_fixtures import write_gguf_lora

pytestmark = [pytest.mark.model, pytest.mark.slow]

ASK = [{"role": "user", "content": "Say something about rivers."}]


class TwoModels:
    """The library: ``tiny`` (a tiny Qwen 3) beside the starter the server starts with."""

    def __init__(self, tiny: Path) -> None:
        self.tiny = tiny

    def find(self, name: str) -> Path | None:
        return self.tiny if name == "tiny" else None

    def names(self) -> list[str]:
        return ["tiny"]


@pytest.fixture(scope="module")
def starter_lora(starter_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf_lora(tmp_path_factory.mktemp("lora") / "starter-lora.gguf", starter_model, strength=1.0)


@pytest.fixture
def serve(
    starter_model: Path, tiny_model: Callable[[str], Path], tmp_path: Path
) -> Iterator[Callable[..., ServerHandle]]:
    handles: list[ServerHandle] = []

    def start(**kw: object) -> ServerHandle:
        settings = kw.pop("pool_settings", PoolSettings(memory_budget=8 << 30))
        handle = start_server(
            Paths.resolve(tmp_path / "home"),
            port=0,
            model_path=starter_model,
            n_ctx=1024,
            catalog=TwoModels(tiny_model("qwen3")),
            pool_settings=settings,  # type: ignore[arg-type]
            **kw,  # type: ignore[arg-type]
        )
        handles.append(handle)
        return handle

    yield start
    for handle in handles:
        handle.stop()


def _api(handle: ServerHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{handle.url}/v1", api_key="unused", max_retries=0, timeout=120)


def _get(handle: ServerHandle, path: str) -> dict:  # type: ignore[type-arg]
    connection = http.client.HTTPConnection(handle.host, handle.port, timeout=60)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        assert response.status == 200, response.read()
        return json.loads(response.read())  # type: ignore[no-any-return]
    finally:
        connection.close()


def _post(
    handle: ServerHandle, path: str, body: object, headers: dict[str, str] | None = None
) -> tuple[int, object, dict[str, str]]:
    connection = http.client.HTTPConnection(handle.host, handle.port, timeout=120)
    try:
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json", **(headers or {})})
        response = connection.getresponse()
        data = response.read()
        return response.status, json.loads(data) if data else None, dict(response.getheaders())
    finally:
        connection.close()


def _resident(handle: ServerHandle) -> dict[str, dict]:  # type: ignore[type-arg]
    return {m["name"]: m for m in _get(handle, "/glassbox/ps")["models"]}


def _wait_for(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.05)


def test_two_models_answer_alternately_without_reloading_either(serve: Callable[..., ServerHandle]) -> None:
    handle = serve()
    api = _api(handle)
    first = handle.model
    texts: dict[str, set[str]] = {first: set(), "tiny": set()}
    for _ in range(3):
        for name in (first, "tiny"):
            reply = api.chat.completions.create(model=name, messages=ASK, max_tokens=6, temperature=0)  # type: ignore[arg-type]
            assert reply.model == name
            texts[name].add(reply.choices[0].message.content or "")
        if not _resident(handle).get("tiny"):
            pytest.fail("the tiny model was unloaded between requests")
    assert all(len(seen) == 1 for seen in texts.values())  # greedy, the same model each time
    resident = _resident(handle)
    assert set(resident) == {first, "tiny"}
    assert resident[first]["requests"] == 3 + 1  # and the load at start
    assert resident["tiny"]["requests"] == 3
    assert resident[first]["pid"] != resident["tiny"]["pid"]
    listed = {m["id"]: m for m in _get(handle, "/v1/models")["data"]}
    assert listed[first]["loaded"] and listed["tiny"]["loaded"]
    assert listed["tiny"]["status"] == {"value": "loaded"}
    assert _get(handle, "/v1/models/tiny")["loaded"] is True
    assert _get(handle, "/glassbox/ps")["evictions"] == []


def test_keep_alive_zero_unloads_after_the_reply_and_the_listing_says_so(serve: Callable[..., ServerHandle]) -> None:
    handle = serve()
    api = _api(handle)
    reply = api.chat.completions.create(model="tiny", messages=ASK, max_tokens=2, extra_body={"keep_alive": 0})  # type: ignore[arg-type]
    assert reply.choices[0].message.content is not None
    assert _get(handle, "/v1/models/tiny")["loaded"] is False  # unloading once the reply was sent
    _wait_for(lambda: "tiny" not in _resident(handle))
    evictions = _get(handle, "/glassbox/ps")["evictions"]
    assert [(e["name"], e["cause"]) for e in evictions] == [("tiny", "keep_alive")]
    status, answer, _ = _post(handle, "/v1/chat/completions", {"model": "tiny", "messages": ASK, "keep_alive": "soon"})
    assert status == 400 and answer["error"]["param"] == "keep_alive"  # type: ignore[index]
    status, _, _ = _post(handle, "/glassbox/unload", {"model": handle.model})
    assert status == 200 and _resident(handle) == {}


def test_an_idle_model_is_unloaded_by_the_server(serve: Callable[..., ServerHandle]) -> None:
    handle = serve(pool_settings=PoolSettings(memory_budget=8 << 30, idle_unload_s=None, idle_per_model={"tiny": 0.3}))
    _api(handle).chat.completions.create(model="tiny", messages=ASK, max_tokens=2)  # type: ignore[arg-type]
    _wait_for(lambda: "tiny" not in _resident(handle))
    assert [e["cause"] for e in _get(handle, "/glassbox/ps")["evictions"]] == ["idle"]
    assert handle.model in _resident(handle)  # never idle-unloaded


def test_aliases_and_the_default_model_for_unknown_names(serve: Callable[..., ServerHandle]) -> None:
    handle = serve(aliases={"gpt-4o": "tiny"})
    api = _api(handle)
    assert api.chat.completions.create(model="gpt-4o", messages=ASK, max_tokens=2).model == "tiny"  # type: ignore[arg-type]
    listed = {m["id"]: m for m in _get(handle, "/v1/models")["data"]}
    assert listed["gpt-4o"]["alias_of"] == "tiny" and listed["gpt-4o"]["loaded"] is True
    with pytest.raises(openai.NotFoundError) as caught:
        api.chat.completions.create(model="gpt-3.5-turbo", messages=ASK, max_tokens=2)  # type: ignore[arg-type]
    assert caught.value.code == "model_not_found"
    handle.stop()
    fallback = serve(default_model="tiny")
    assert _api(fallback).chat.completions.create(model="gpt-3.5-turbo", messages=ASK, max_tokens=2).model == "tiny"  # type: ignore[arg-type]


def test_past_the_queue_a_request_gets_503_with_retry_after(serve: Callable[..., ServerHandle]) -> None:
    handle = serve(pool_settings=PoolSettings(memory_budget=8 << 30, queue_depth=0, retry_after_s=4))
    connection = http.client.HTTPConnection(handle.host, handle.port, timeout=120)
    body = {"model": "tiny", "messages": ASK, "max_tokens": 400, "stream": True, "temperature": 1.0}
    connection.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    streaming = connection.getresponse()
    assert streaming.status == 200
    streaming.readline()  # the model is answering this one
    status, answer, headers = _post(handle, "/v1/chat/completions", {"model": "tiny", "messages": ASK})
    assert status == 503 and headers["Retry-After"] == "4"
    assert answer["error"]["code"] == "overloaded"  # type: ignore[index]
    assert "at most 0 may wait" in answer["error"]["detail"]  # type: ignore[index]
    connection.close()


def test_an_embedding_request_and_a_chat_request_run_without_unloading_each_other(
    serve: Callable[..., ServerHandle], embedder_path: Path
) -> None:
    handle = serve(pool_settings=PoolSettings(memory_budget=8 << 30, max_resident=1), embedder_path=embedder_path)
    api = _api(handle)
    pid = _resident(handle)[handle.model]["pid"]
    embedder = next(m["id"] for m in _get(handle, "/v1/models")["data"] if m["id"] not in (handle.model, "tiny"))
    results: dict[str, object] = {}

    def embed() -> None:
        results["embedding"] = api.embeddings.create(model=embedder, input=["a river", "a town"])

    def chat() -> None:
        results["chat"] = api.chat.completions.create(model=handle.model, messages=ASK, max_tokens=8)  # type: ignore[arg-type]

    threads = [threading.Thread(target=embed), threading.Thread(target=chat)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert len(results["embedding"].data) == 2  # type: ignore[attr-defined]
    assert results["chat"].choices[0].message.content is not None  # type: ignore[attr-defined]
    assert _resident(handle)[handle.model]["pid"] == pid  # the chat model was never unloaded
    listed = {m["id"]: m for m in _get(handle, "/v1/models")["data"]}
    assert listed[embedder]["loaded"] is True and listed[handle.model]["loaded"] is True


def test_lora_adapters_are_listed_scaled_and_applied_per_request(
    serve: Callable[..., ServerHandle], starter_lora: Path
) -> None:
    handle = serve(adapters=[LoraAdapter(starter_lora, 0.0)])
    api = _api(handle)
    first = handle.model
    pid = _resident(handle)[first]["pid"]

    def reply(model: str, **extra: object) -> str:
        answer = api.chat.completions.create(model=model, messages=ASK, max_tokens=8, temperature=0, extra_body=extra)  # type: ignore[arg-type]
        return answer.choices[0].message.content or ""

    base = reply(first)
    tiny = reply("tiny")
    connection = http.client.HTTPConnection(handle.host, handle.port, timeout=60)
    connection.request("GET", "/lora-adapters")
    assert json.loads(connection.getresponse().read()) == [{"id": 0, "path": str(starter_lora), "scale": 0.0}]
    connection.close()
    status, listed, _ = _post(handle, "/lora-adapters", [{"id": 0, "scale": 1.0}])
    assert status == 200 and listed == [{"id": 0, "path": str(starter_lora), "scale": 1.0}]
    adapted = reply(first)
    assert adapted != base
    assert reply("tiny") == tiny  # the adapter fits the starter only: the other model is untouched
    assert reply(first, lora=[{"id": 0, "scale": 0.0}]) == base  # a request's own scales
    assert reply(first) == adapted
    status, answer, _ = _post(
        handle, "/v1/chat/completions", {"model": "tiny", "messages": ASK, "lora": [{"id": 0, "scale": 1.0}]}
    )
    assert status == 400 and answer["error"]["param"] == "lora"  # type: ignore[index]
    assert "does not fit" in answer["error"]["message"]  # type: ignore[index]
    status, answer, _ = _post(handle, "/lora-adapters", [{"id": 7, "scale": 1.0}])
    assert status == 400 and "no adapter with id 7" in answer["error"]["message"]  # type: ignore[index]
    assert _resident(handle)[first]["pid"] == pid  # switched in the worker, never reloaded


def test_llama_cpp_tokenize_detokenize_and_chat_without_v1(serve: Callable[..., ServerHandle]) -> None:
    handle = serve()
    content = "What is the capital of France ? 媽 🤗"
    status, plain, _ = _post(handle, "/tokenize", {"content": content})
    assert status == 200
    tokens = plain["tokens"]  # type: ignore[index]
    status, with_bos, _ = _post(handle, "/tokenize", {"content": content, "add_special": True})
    assert with_bos["tokens"][0] == 2 and with_bos["tokens"][1:] == tokens  # type: ignore[index]  # Gemma's BOS
    status, pieces, _ = _post(handle, "/tokenize", {"content": content, "with_pieces": True})
    assert [p["id"] for p in pieces["tokens"]] == tokens  # type: ignore[index]
    text = ""
    for piece in pieces["tokens"]:  # type: ignore[index]
        assert piece["piece"]
        text += piece["piece"] if isinstance(piece["piece"], str) else bytes(piece["piece"]).decode("latin-1")
    status, back, _ = _post(handle, "/detokenize", {"tokens": tokens})
    assert status == 200 and back["content"] == content  # type: ignore[index]
    status, bad, _ = _post(handle, "/detokenize", {"tokens": [10**9]})
    assert status == 400 and bad["error"]["param"] == "tokens"  # type: ignore[index]
    status, chat, _ = _post(handle, "/chat/completions", {"messages": ASK, "max_tokens": 2})
    assert status == 200 and chat["object"] == "chat.completion"  # type: ignore[index]
    status, _, _ = _post(handle, "/tokenize", {"content": "hi", "model": "tiny"})
    assert status == 200 and "tiny" in _resident(handle)  # the model a tokenize names


def _dead(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_worker_killed_mid_reply_fails_that_reply_only_and_the_next_request_reloads_it(
    serve: Callable[..., ServerHandle],
) -> None:
    handle = serve()
    api = _api(handle)
    first = handle.model

    def reply(model: str) -> str:
        answer = api.chat.completions.create(model=model, messages=ASK, max_tokens=6, temperature=0)  # type: ignore[arg-type]
        return answer.choices[0].message.content or ""

    tiny_before = reply("tiny")
    resident = _resident(handle)
    first_pid, tiny_pid = resident[first]["pid"], resident["tiny"]["pid"]
    count = [{"role": "user", "content": "Count from 1 to 300, one number per line."}]
    stream = api.chat.completions.create(model=first, messages=count, max_tokens=300, temperature=0, stream=True)  # type: ignore[arg-type]
    chunks = iter(stream)
    next(chunks)  # the starter is answering
    os.kill(first_pid, signal.SIGKILL)
    with pytest.raises(openai.APIError) as caught:
        for _ in chunks:
            pass
    assert "crashed" in str(caught.value)
    _wait_for(lambda: _dead(first_pid))
    assert reply("tiny") == tiny_before  # the other model's worker never noticed
    resident = _resident(handle)
    assert set(resident) == {"tiny"} and resident["tiny"]["pid"] == tiny_pid
    assert [(e["name"], e["cause"]) for e in _get(handle, "/glassbox/ps")["evictions"]] == [(first, "crashed")]
    assert _get(handle, f"/v1/models/{first}")["loaded"] is False
    assert reply(first)  # loaded again by the next request
    resident = _resident(handle)
    assert resident[first]["pid"] not in (None, first_pid) and resident["tiny"]["pid"] == tiny_pid


def test_an_idle_worker_killed_is_seen_and_the_other_model_answers_on(serve: Callable[..., ServerHandle]) -> None:
    handle = serve()
    api = _api(handle)
    first = handle.model
    before = api.chat.completions.create(model=first, messages=ASK, max_tokens=6, temperature=0)  # type: ignore[arg-type]
    api.chat.completions.create(model="tiny", messages=ASK, max_tokens=2)  # type: ignore[arg-type]
    resident = _resident(handle)
    first_pid, tiny_pid = resident[first]["pid"], resident["tiny"]["pid"]
    os.kill(tiny_pid, signal.SIGKILL)
    _wait_for(lambda: _dead(tiny_pid))
    again = api.chat.completions.create(model=first, messages=ASK, max_tokens=6, temperature=0)  # type: ignore[arg-type]
    assert again.choices[0].message.content == before.choices[0].message.content
    _wait_for(lambda: "tiny" not in _resident(handle))  # the pool saw the dead worker
    assert _resident(handle)[first]["pid"] == first_pid
    assert [(e["name"], e["cause"]) for e in _get(handle, "/glassbox/ps")["evictions"]] == [("tiny", "crashed")]
    assert api.chat.completions.create(model="tiny", messages=ASK, max_tokens=2).model == "tiny"  # type: ignore[arg-type]
    assert _resident(handle)["tiny"]["pid"] not in (None, tiny_pid)


def test_under_a_small_budget_the_least_recently_used_model_makes_room(serve: Callable[..., ServerHandle]) -> None:
    probe = serve()
    _api(probe).chat.completions.create(model="tiny", messages=ASK, max_tokens=2)  # type: ignore[arg-type]
    totals = {name: r["memory"]["total"] for name, r in _resident(probe).items()}
    probe.stop()
    assert len(totals) == 2
    handle = serve(pool_settings=PoolSettings(memory_budget=sum(totals.values()) - 1))  # one at a time
    api = _api(handle)
    first = handle.model
    assert set(_resident(handle)) == {first}
    api.chat.completions.create(model="tiny", messages=ASK, max_tokens=2)  # type: ignore[arg-type]
    assert set(_resident(handle)) == {"tiny"}
    api.chat.completions.create(model=first, messages=ASK, max_tokens=2)  # type: ignore[arg-type]
    assert set(_resident(handle)) == {first}
    evictions = _get(handle, "/glassbox/ps")["evictions"]
    assert [(e["name"], e["cause"]) for e in evictions] == [(first, "memory"), ("tiny", "memory")]
    assert "make room for tiny" in evictions[0]["reason"] and f"make room for {first}" in evictions[1]["reason"]
    listed = {m["id"]: m for m in _get(handle, "/v1/models")["data"]}
    assert listed[first]["loaded"] is True and listed["tiny"]["loaded"] is False


def test_a_prompt_saved_before_an_unload_is_restored_after_the_reload(
    serve: Callable[..., ServerHandle], tmp_path: Path
) -> None:
    handle = serve(kv_cache=KvCacheConfig(tmp_path / "kv"))
    api = _api(handle)
    question = [{"role": "user", "content": "Tell me about the river that runs past the old town. " * 20}]
    cold = api.chat.completions.create(model="tiny", messages=question, max_tokens=4, temperature=0)  # type: ignore[arg-type]
    assert cold.usage is not None and cold.usage.prompt_tokens > 200
    assert cold.usage.prompt_tokens_details.cached_tokens == 0  # type: ignore[union-attr]
    tiny_pid = _resident(handle)["tiny"]["pid"]
    status, _, _ = _post(handle, "/glassbox/unload", {"model": "tiny"})
    assert status == 200 and "tiny" not in _resident(handle)
    eviction = _get(handle, "/glassbox/ps")["evictions"][-1]
    assert eviction["name"] == "tiny" and eviction["cause"] == "request" and eviction["kv_saved_bytes"] > 0
    warm = api.chat.completions.create(model="tiny", messages=question, max_tokens=4, temperature=0)  # type: ignore[arg-type]
    assert _resident(handle)["tiny"]["pid"] != tiny_pid  # a new worker: the weights were loaded again
    assert warm.usage is not None and warm.usage.prompt_tokens == cold.usage.prompt_tokens
    # every prompt token but the last came from the state saved before the unload
    assert warm.usage.prompt_tokens_details.cached_tokens == warm.usage.prompt_tokens - 1  # type: ignore[union-attr]
    assert warm.choices[0].message.content == cold.choices[0].message.content
