"""``/v1/responses`` stores responses as OpenAI does (the official ``openai`` client and raw HTTP,
over the scripted backend of tests/app/server/serve_support.py): stored unless ``store: false``,
``previous_response_id`` continues the conversation, ``GET``/``DELETE /v1/responses/{id}``, an id
not stored a 404 in OpenAI's shape; the store itself is bounded, thread-safe and per server."""

from __future__ import annotations

import http.client
import json
import threading
from pathlib import Path
from typing import Any

import openai
import pytest

from app.paths import Paths
from app.server.http import ServerHandle, start_server
from app.server.state import MAX_STORED_BYTES, MAX_STORED_RESPONSES, ResponseStore
from tests.app.server import serve_support
from tests.app.server.serve_support import KEY, ScriptedBackend, client, post

served = serve_support.served

WEATHER_FN = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def _request(handle: ServerHandle, method: str, path: str, key: str = KEY) -> tuple[int, Any]:
    connection = http.client.HTTPConnection(handle.host, handle.port, timeout=30)
    try:
        connection.request(method, path, headers={"Authorization": f"Bearer {key}"})
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        connection.close()


def _turns(history: list[Any]) -> list[tuple[str, str]]:
    return [(message.role, message.content) for message in history]


def test_a_response_is_stored_and_continued(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    handle, backend = served
    api = client(handle)
    first = api.responses.create(model="fake-model", input="alpha beta", instructions="Be brief.")
    assert first.model_dump()["store"] is True and first.output_text == "beta alpha"
    assert api.responses.retrieve(first.id).model_dump() == first.model_dump()
    second = api.responses.create(model="fake-model", input="gamma delta", previous_response_id=first.id)
    assert second.previous_response_id == first.id and second.output_text == "delta gamma"
    call = backend.calls[-1]
    assert _turns(call.history) == [("user", "alpha beta"), ("assistant", "beta alpha")]
    assert call.user == "gamma delta"
    assert call.system is None  # instructions do not carry over (OpenAI's rule)
    third = api.responses.create(
        model="fake-model",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "epsilon"}]}],
        previous_response_id=second.id,
        instructions="Again.",
    )
    assert third.output_text == "epsilon"
    call = backend.calls[-1]
    assert _turns(call.history) == [
        ("user", "alpha beta"),
        ("assistant", "beta alpha"),
        ("user", "gamma delta"),
        ("assistant", "delta gamma"),
    ]
    assert call.user == "epsilon" and call.system == "Again."
    # The first response is still what it was: continuing it changed nothing stored.
    assert api.responses.retrieve(first.id).model_dump() == first.model_dump()


def test_function_calls_continue_from_a_stored_response(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    handle, backend = served
    api = client(handle)
    asked = api.responses.create(model="fake-model", input="weather in Paris?", tools=[WEATHER_FN])  # type: ignore[list-item]
    call = next(item for item in asked.output if item.type == "function_call")
    api.responses.create(
        model="fake-model",
        previous_response_id=asked.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
    )
    history = backend.calls[-1].history
    assert [message.role for message in history] == ["user", "assistant", "tool"]
    assert history[-1].content == "sunny"


def test_store_false_keeps_nothing(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    handle, backend = served
    api = client(handle)
    unstored = api.responses.create(model="fake-model", input="a b", store=False)
    assert unstored.model_dump()["store"] is False
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(unstored.id)
    calls = len(backend.calls)
    with pytest.raises(openai.NotFoundError) as caught:
        api.responses.create(model="fake-model", input="c", previous_response_id=unstored.id)
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == "previous_response_id"
    assert unstored.id in error["message"]
    assert len(backend.calls) == calls  # refused before the model was touched
    status, body = post(handle, "/v1/responses", {"model": "fake-model", "input": "x", "store": "yes"})
    assert status == 400 and body["error"]["param"] == "store"


def test_get_and_delete(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    handle, _ = served
    api = client(handle)
    kept = api.responses.create(model="fake-model", input="a b")
    status, body = _request(handle, "GET", f"/v1/responses/{kept.id}")
    assert status == 200 and body["id"] == kept.id and body["output"][0]["content"][0]["text"] == "b a"
    status, body = _request(handle, "DELETE", f"/v1/responses/{kept.id}")
    assert (status, body) == (200, {"id": kept.id, "object": "response", "deleted": True})
    for method in ("GET", "DELETE"):
        status, body = _request(handle, method, f"/v1/responses/{kept.id}")
        assert status == 404, (method, body)
        assert body == {
            "error": {
                "message": f"Response with id {kept.id!r} not found.",
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        }
    another = api.responses.create(model="fake-model", input="c")
    api.responses.delete(another.id)  # the official client's delete
    with pytest.raises(openai.NotFoundError):
        api.responses.delete(another.id)
    with pytest.raises(openai.NotFoundError):
        api.responses.create(model="fake-model", input="c", previous_response_id=another.id)


def test_the_routes_are_guarded_and_strict(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    handle, _ = served
    kept = client(handle).responses.create(model="fake-model", input="a")
    assert _request(handle, "GET", f"/v1/responses/{kept.id}", key="wrong-key-123")[0] == 401
    assert _request(handle, "DELETE", f"/v1/responses/{kept.id}", key="wrong-key-123")[0] == 401
    status, body = _request(handle, "GET", f"/v1/responses/{kept.id}?stream=true")
    assert status == 400 and body["error"]["param"] == "stream"
    assert _request(handle, "GET", f"/v1/responses/{kept.id}/input_items")[0] == 404
    assert _request(handle, "DELETE", "/v1/models/fake-model")[0] == 404
    assert _request(handle, "GET", f"/v1/responses/{kept.id}")[0] == 200  # nothing above deleted it


def test_a_streamed_response_is_stored(served: tuple[ServerHandle, ScriptedBackend]) -> None:
    handle, backend = served
    api = client(handle)
    events = list(api.responses.create(model="fake-model", input="think of a b", stream=True))
    final = events[-1]
    assert final.type == "response.completed"
    stored = api.responses.retrieve(final.response.id)
    assert stored.model_dump() == final.response.model_dump() and stored.model_dump()["store"] is True
    api.responses.create(model="fake-model", input="next", previous_response_id=stored.id)
    # The reasoning item is stored but, as always, not sent back.
    assert _turns(backend.calls[-1].history) == [("user", "think of a b"), ("assistant", "b a of think")]


def test_each_server_has_its_own_store(tmp_path: Path, served: tuple[ServerHandle, ScriptedBackend]) -> None:
    handle, _ = served
    kept = client(handle).responses.create(model="fake-model", input="a")
    with start_server(Paths.resolve(tmp_path / "other"), port=0, api_key=KEY, backend=ScriptedBackend()) as other:
        status, _ = _request(other, "GET", f"/v1/responses/{kept.id}")
        assert status == 404
    assert client(handle).responses.retrieve(kept.id).id == kept.id


# ----------------------------------------------------------------------------- the store itself


def test_the_store_keeps_the_last_responses() -> None:
    assert (MAX_STORED_RESPONSES, MAX_STORED_BYTES) == (256, 64 * 1024 * 1024)  # as the docstrings say
    store = ResponseStore(max_responses=3)
    for number in range(5):
        assert store.put(f"r{number}", {"id": f"r{number}"}, [{"n": number}])
    assert len(store) == 3
    assert store.get("r0") is None and store.get("r1") is None
    assert store.get("r4") == ({"id": "r4"}, [{"n": 4}])
    document, items = store.get("r2") or ({}, [])
    document["id"] = "changed"
    items.append({"n": 99})
    assert store.get("r2") == ({"id": "r2"}, [{"n": 2}])  # what a caller does to it changes nothing


def test_the_store_keeps_at_most_its_bytes() -> None:
    store = ResponseStore(max_bytes=1000)
    text = "x" * 300
    for number in range(5):
        assert store.put(f"r{number}", {"id": f"r{number}"}, [{"text": text}])
    assert len(store) == 3  # ~330 bytes each
    assert [store.get(f"r{n}") is not None for n in range(5)] == [False, False, True, True, True]
    assert not store.put("huge", {"id": "huge"}, [{"text": "y" * 2000}])
    assert store.get("huge") is None and len(store) == 3
    assert store.delete("r4") and not store.delete("r4")
    for number in range(5, 8):
        store.put(f"r{number}", {"id": f"r{number}"}, [{"text": text}])
    assert len(store) == 3 and store.get("r7") is not None


def test_the_store_is_thread_safe() -> None:
    store = ResponseStore(max_responses=50)
    failures: list[str] = []

    def work(worker: int) -> None:
        for number in range(300):
            name = f"w{worker}-{number}"
            store.put(name, {"id": name}, [{"n": number}])
            got = store.get(name)
            if got is not None and got != ({"id": name}, [{"n": number}]):
                failures.append(name)
            if number % 3 == 0:
                store.delete(f"w{worker}-{number - 1}")

    threads = [threading.Thread(target=work, args=(worker,)) for worker in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert 0 < len(store) <= 50
    assert sum(store.get(f"w{w}-299") is not None for w in range(8)) >= 1
    assert store._bytes == sum(size for _, size in store._entries.values())
