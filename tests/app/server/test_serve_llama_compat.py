"""What llama.cpp's own server tests ask of an OpenAI-compatible server, on a scripted backend:
CORS (off unless allowed, by origin; never credentials), ``timings_per_token``, ``/tokenize``
``with_pieces`` and ``add_special``, ``/detokenize``, the routes without ``/v1``, and the
embedding inputs' mixed forms (read without a model: the shapes, then the texts)."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.paths import Paths
from app.server import embeddings
from app.server.cors import CorsPolicy
from app.server.errors import HttpError
from app.server.http import ServeError, ServerHandle, start_server
from engine.errors import EngineError
from tests.app.server.serve_support import BOS, ScriptedBackend, post

ASK = [{"role": "user", "content": "one two three four"}]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerHandle]:
    with start_server(
        Paths.resolve(tmp_path / "home"),
        port=0,
        backend=ScriptedBackend(),
        cors_origins=["https://chat.example.org", "localhost"],
    ) as handle:
        yield handle


def _request(handle: ServerHandle, method: str, path: str, headers: dict[str, str], body: bytes | None = None):  # type: ignore[no-untyped-def]
    connection = http.client.HTTPConnection(handle.host, handle.port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        data = response.read()
        return response.status, dict(response.getheaders()), data
    finally:
        connection.close()


def _preflight(handle: ServerHandle, origin: str) -> tuple[int, dict[str, str]]:
    status, headers, _ = _request(
        handle,
        "OPTIONS",
        "/v1/chat/completions",
        {"Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "Authorization"},
    )
    return status, headers


@pytest.mark.parametrize(
    "origin", ["https://chat.example.org", "http://localhost:3000", "http://127.0.0.1", "http://[::1]:8080"]
)
def test_an_allowed_origin_gets_the_preflight_and_the_answer(server: ServerHandle, origin: str) -> None:
    status, headers = _preflight(server, origin)
    assert status == 200
    assert headers["Access-Control-Allow-Origin"] == origin
    assert headers["Access-Control-Allow-Methods"] == "GET, POST, DELETE, OPTIONS"
    assert headers["Access-Control-Allow-Headers"] == "Authorization"
    assert "Access-Control-Allow-Credentials" not in headers
    body = json.dumps({"messages": ASK}).encode()
    status, headers, _ = _request(
        server, "POST", "/v1/chat/completions", {"Origin": origin, "Content-Type": "application/json"}, body
    )
    assert status == 200 and headers["Access-Control-Allow-Origin"] == origin
    assert "Retry-After" in headers["Access-Control-Expose-Headers"]


@pytest.mark.parametrize(
    "origin", ["https://evil.example.org", "http://localhost.evil.com", "http://127.evil.com", "null"]
)
def test_another_origin_gets_no_cors_header(server: ServerHandle, origin: str) -> None:
    status, headers = _preflight(server, origin)
    assert status == 200
    assert "Access-Control-Allow-Origin" not in headers and headers["Vary"] == "Origin"


def test_cors_is_off_by_default_and_the_wildcard_never_carries_credentials(tmp_path: Path) -> None:
    with start_server(Paths.resolve(tmp_path / "a"), port=0, backend=ScriptedBackend()) as handle:
        status, headers = _preflight(handle, "http://localhost:3000")
        assert status == 200 and not any(name.startswith("Access-Control") for name in headers)
    with start_server(Paths.resolve(tmp_path / "b"), port=0, backend=ScriptedBackend(), cors_origins=["*"]) as handle:
        _, headers = _preflight(handle, "https://anywhere.example")
        assert headers["Access-Control-Allow-Origin"] == "*" and "Access-Control-Allow-Credentials" not in headers
    with pytest.raises(ServeError, match="give an origin"):
        start_server(Paths.resolve(tmp_path / "c"), port=0, backend=ScriptedBackend(), cors_origins=["example.org/x"])
    with pytest.raises(EngineError, match="give an origin"):
        CorsPolicy.parse(["ftp:/x"])


def test_timings_per_token_puts_llama_cpps_timings_on_every_chunk_but_the_first(server: ServerHandle) -> None:
    status, events = post(
        server,
        "/chat/completions",  # without /v1, as llama.cpp serves it
        {"messages": ASK, "stream": True, "stream_options": {"include_usage": True}, "timings_per_token": True},
    )
    assert status == 200
    chunks = [e.data for e in events if e.data != "[DONE]"]
    assert "timings" not in chunks[0] and chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    content = [c for c in chunks[1:] if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert [c["timings"]["predicted_n"] for c in content] == [1, 2, 3, 4]
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 4
    assert {"prompt_per_second", "predicted_per_second", "predicted_n"} <= set(usage["timings"])
    status, plain = post(server, "/v1/chat/completions", {"messages": ASK, "stream": True})
    assert all("timings" not in e.data for e in plain[:-2] if isinstance(e.data, dict))  # only the end has them


def test_tokenize_with_pieces_bos_and_detokenize(server: ServerHandle) -> None:
    status, answer = post(server, "/tokenize", {"content": "ab"})
    assert (status, answer) == (200, {"tokens": [97, 98]})
    status, answer = post(server, "/tokenize", {"content": "ab", "add_special": True})
    assert answer == {"tokens": [BOS, 97, 98]}
    status, answer = post(server, "/tokenize", {"content": "a\u00e9", "with_pieces": True})
    # é is two bytes, two tokens here: each alone is not UTF-8, so its piece is its bytes
    assert answer == {
        "tokens": [{"id": 97, "piece": "a"}, {"id": 0xC3, "piece": [0xC3]}, {"id": 0xA9, "piece": [0xA9]}]
    }
    status, answer = post(server, "/detokenize", {"tokens": [97, 0xC3, 0xA9]})
    assert (status, answer) == (200, {"content": "a\u00e9"})
    status, answer = post(server, "/detokenize", {"tokens": [5000]})
    assert status == 400 and answer["error"]["param"] == "tokens"
    status, answer = post(server, "/tokenize", {"content": "ab", "with_pieces": "yes"})
    assert status == 400 and answer["error"]["param"] == "with_pieces"


def test_the_routes_without_v1(server: ServerHandle) -> None:
    status, _headers, data = _request(server, "GET", "/models", {})
    assert status == 200 and json.loads(data)["data"][0]["loaded"] is True
    status, _, data = _request(server, "GET", "/v1/health", {})
    assert (status, json.loads(data)) == (200, {"status": "ok"})
    assert post(server, "/responses", {"input": "one two"})[0] == 200


def test_embedding_inputs_in_llama_cpps_mixed_forms() -> None:
    shapes = {
        "": [[""]],
        "string": [["string"]],
        json.dumps([12, 34, "string", 56, 78]): [[[12, 34], "string", [56, 78]]],
        json.dumps(["string1", [12, 34, 56]]): [["string1"], [[12, 34, 56]]],
        json.dumps([[12, 34, 56], [12, "string", 34, 56]]): [[[12, 34, 56]], [[12], "string", [34, 56]]],
        json.dumps({"prompt_string": "string"}): [["string"]],
        json.dumps({"content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]}): [
            ["hello ", "world"]
        ],
    }
    for text, expected in shapes.items():
        value = json.loads(text) if text and text[0] in "[{" else text
        assert embeddings._inputs(value) == expected, text
    for bad in ([], {"content": "string"}, {"content": [{"type": "image_url", "image_url": {"url": "x"}}]}, [True]):
        with pytest.raises(HttpError):
            embeddings._inputs(bad)
    # ids are cl100k_base tokens, decoded and joined with the text between them
    table = embeddings.cl100k_table()
    if table is not None:
        assert embeddings._texts([[[9906], " there"]]) == ["Hello there"]
