"""The remote backend (:mod:`engine.inference.remote`) and saved endpoints (:mod:`engine.inference.endpoints`).

Error mapping and stream parsing run against a scripted stdlib server on loopback (fast); the
``@pytest.mark.model`` tests run against llama-cpp-python's own OpenAI-compatible server
(``python -m llama_cpp.server``) with the starter model, started once for the module.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.errors import ContextOverflow, EngineError, ModelLoadError
from engine.inference.backends import ChatBackend
from engine.inference.context import Message
from engine.inference.endpoints import EndpointStore, mask_key, normalize_url
from engine.inference.events import Finished, PrefillProgress, Stats, Token
from engine.inference.remote import RemoteSession, api_root, list_models
from engine.inference.runtime import GenerationParams

GREEDY = GenerationParams(temperature=0, max_tokens=16)

# ----------------------------------------------------------------------------- a scripted server

Route = Callable[[dict[str, Any]], tuple[int, Any]]
"""Takes the JSON body (or {} for GET); returns (status, body): a dict/str body, or a list of SSE events."""


class ScriptedServer:
    """An OpenAI-shaped server whose answers the test writes; records the requests it got."""

    def __init__(self, routes: dict[str, Route]) -> None:
        self.routes = routes
        self.requests: list[tuple[str, dict[str, Any], dict[str, str]]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # bodies end when the connection closes

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._answer({})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self._answer(json.loads(self.rfile.read(length) or b"{}"))

            def _answer(self, body: dict[str, Any]) -> None:
                owner.requests.append((self.path, body, dict(self.headers)))
                route = owner.routes.get(self.path)
                status, answer = route(body) if route else (404, {"error": {"message": "not found"}})
                self.send_response(status)
                if isinstance(answer, list):
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    for event in answer:
                        self.wfile.write(event.encode() if isinstance(event, str) else event)
                        self.wfile.flush()
                    return
                data = answer.encode() if isinstance(answer, str) else json.dumps(answer).encode()
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def models_route(*ids: str, **extra: Any) -> Route:
    return lambda _body: (
        200,
        {"object": "list", "data": [{"id": i, "object": "model", **extra} for i in ids]},
    )


def sse(*chunks: dict[str, Any] | str, done: bool = True) -> list[str]:
    events = [f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n" for c in chunks]
    return [*events, "data: [DONE]\n\n"] if done else events


def delta(text: str | None = None, finish: str | None = None) -> dict[str, Any]:
    d = {"content": text} if text is not None else {}
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": d, "finish_reason": finish}]}


@pytest.fixture
def scripted() -> Iterator[Callable[[dict[str, Route]], ScriptedServer]]:
    servers: list[ScriptedServer] = []

    def make(routes: dict[str, Route]) -> ScriptedServer:
        server = ScriptedServer({"/v1/models": models_route("m1"), **routes})
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ----------------------------------------------------------------------------- errors and parsing


def test_connection_refused_is_one_line() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with RemoteSession(url, "m", timeout=5) as remote, pytest.raises(EngineError) as caught:
        list(remote.stream([], "hi"))
    message = str(caught.value)
    assert message.startswith(f"cannot reach {url}: ")
    assert "\n" not in message
    with pytest.raises(EngineError, match="cannot reach"):
        list_models(url)


@pytest.mark.parametrize(
    ("status", "body", "error", "fragment"),
    [
        (401, {"error": {"message": "Invalid API key"}}, EngineError, "refused the API key"),
        (403, "forbidden", EngineError, "refused the API key"),
        (500, {"error": {"message": "CUDA out of\nmemory"}}, EngineError, "failed (500): CUDA out of memory"),
        (503, {"detail": "loading"}, EngineError, "failed (503): loading"),
        (404, {"error": {"message": "model 'm1' not found"}}, ModelLoadError, "has no model 'm1'"),
        (
            400,
            {
                "error": {
                    "message": "This model's maximum context length is 1024 tokens.",
                    "code": "context_length_exceeded",
                }
            },
            ContextOverflow,
            "maximum context length is 1024",
        ),
        (
            400,
            {
                "error": {
                    "message": "the request exceeds the available context size",
                    "type": "exceed_context_size_error",
                }
            },
            ContextOverflow,
            "available context size",
        ),
        (
            400,
            {"error": {"message": "bad temperature"}},
            EngineError,
            "rejected the request (400): bad temperature",
        ),
    ],
)
def test_http_errors_map_to_typed_errors(
    scripted: Callable[[dict[str, Route]], ScriptedServer],
    status: int,
    body: Any,
    error: type[Exception],
    fragment: str,
) -> None:
    server = scripted({"/v1/chat/completions": lambda _b: (status, body)})
    with RemoteSession(server.url, "m1", api_key="k") as remote, pytest.raises(error) as caught:
        list(remote.stream([], "hi", GREEDY))
    assert type(caught.value) is error
    assert fragment in str(caught.value)
    assert str(caught.value).startswith(server.url)
    assert "\n" not in str(caught.value)


def test_models_list_auth_and_unknown_model(scripted: Callable[[dict[str, Route]], ScriptedServer]) -> None:
    server = scripted({"/v1/models": models_route("alpha", "beta", max_model_len=8192)})
    models = list_models(f"{server.url}/v1/", api_key="sk-1")
    assert [(m.id, m.context_length) for m in models] == [("alpha", 8192), ("beta", 8192)]
    assert server.requests[-1][2]["Authorization"] == "Bearer sk-1"
    with RemoteSession(server.url, "gamma") as remote, pytest.raises(ModelLoadError) as caught:
        remote.load()
    assert str(caught.value) == f"{server.url}: the server has no model 'gamma' (it offers: alpha, beta)"
    with RemoteSession(server.url) as remote:
        info = remote.load()
    assert (info.model, info.n_ctx, info.tokenizer) == ("alpha", 8192, "estimate")


def test_not_an_openai_server(scripted: Callable[[dict[str, Route]], ScriptedServer]) -> None:
    server = scripted({"/v1/models": lambda _b: (200, "<html>hello</html>")})
    with pytest.raises(EngineError, match="did not answer with JSON"):
        list_models(server.url)
    server.routes["/v1/models"] = lambda _b: (404, "nope")
    with pytest.raises(EngineError, match="is this an OpenAI-compatible server"):
        list_models(server.url)


def test_stream_uses_server_usage_and_timings(scripted: Callable[[dict[str, Route]], ScriptedServer]) -> None:
    usage = {
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": {"prompt_tokens": 21, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 5}},
    }
    timings = {
        "choices": [],
        "timings": {"prompt_ms": 8.0, "predicted_ms": 30.0, "prompt_n": 16, "cache_n": 5},
    }
    server = scripted(
        {
            "/v1/chat/completions": lambda _b: (
                200,
                [
                    ": ping\n\n",
                    *sse(delta(""), delta("Hel"), delta("lo"), delta("!", "stop"), usage, timings),
                ],
            ),
            "/tokenize": lambda b: (200, {"tokens": list(range(len(b["content"].split())))}),
            "/props": lambda _b: (200, {"default_generation_settings": {"n_ctx": 2048}}),
        }
    )
    history = [Message("user", "one two"), Message("assistant", "three")]
    with RemoteSession(server.url, "m1", reply_reserve=64) as remote:
        events = list(remote.stream(history, "four five six", GREEDY, system="be kind"))
    assert [e.text for e in events if isinstance(e, Token)] == ["Hel", "lo", "!"]
    assert isinstance(events[0], PrefillProgress)
    stats = next(e for e in events if isinstance(e, Stats))
    finished = events[-1]
    assert isinstance(finished, Finished)
    assert finished.reason == "stop"
    assert finished.text == "Hello!"
    assert (stats.n_ctx, stats.prompt_tokens, stats.cached_tokens, stats.completion_tokens) == (
        2048,
        21,
        5,
        3,
    )
    assert stats.prefill_ms == 8.0
    assert stats.prefill_tps == 2000.0
    assert stats.ttft_ms > 0
    assert stats.template == f"remote:{server.url}"
    assert "estimated" not in stats.budget
    assert sum(v for k, v in stats.budget.items()) == 2048
    assert stats.budget["system"] == 2
    assert stats.budget["reserve"] == 16
    sent = next(b for p, b, _h in server.requests if p == "/v1/chat/completions")
    assert sent["messages"] == [
        {"role": "system", "content": "be kind"},
        {"role": "user", "content": "one two"},
        {"role": "assistant", "content": "three"},
        {"role": "user", "content": "four five six"},
    ]
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}
    assert sent["temperature"] == 0
    assert sent["top_k"] == 40  # a llama.cpp-family server reads the extra sampling fields
    assert sent["max_tokens"] == 16


def test_stream_without_usage_or_tokenizer_is_marked_estimated(
    scripted: Callable[[dict[str, Route]], ScriptedServer],
) -> None:
    server = scripted({"/v1/chat/completions": lambda _b: (200, sse(delta("a"), delta("b"), delta(None, "length")))})
    with RemoteSession(server.url, "m1") as remote:
        events = list(remote.stream([], "x" * 40, GREEDY))
    finished = events[-1]
    assert isinstance(finished, Finished)
    assert finished.reason == "length"
    assert finished.stats.budget["estimated"] == 1
    assert finished.stats.budget["n_ctx_unknown"] == 1
    assert finished.stats.completion_tokens == 2  # counted from the deltas
    assert finished.stats.budget["current"] >= 10  # 40 characters at ~4 per token
    sent = server.requests[-1][1]
    assert "top_k" not in sent  # an unknown server may be strict about non-OpenAI fields
    assert "repeat_penalty" not in sent


def test_rolling_window_and_refusal_use_known_context(
    scripted: Callable[[dict[str, Route]], ScriptedServer],
) -> None:
    server = scripted({"/v1/chat/completions": lambda _b: (200, sse(delta("ok", "stop")))})
    history = [Message("user" if i % 2 == 0 else "assistant", "word " * 30) for i in range(10)]
    with RemoteSession(server.url, "m1", n_ctx=200, reply_reserve=16) as remote:
        finished = list(remote.stream(history, "new question", GREEDY))[-1]
        assert isinstance(finished, Finished)
        assert 0 < finished.stats.evicted_messages < 10
        sent = server.requests[-1][1]["messages"]
        assert len(sent) == 10 - finished.stats.evicted_messages + 1
    with RemoteSession(server.url, "m1", n_ctx=200, overflow_policy="refuse") as remote:
        calls = len(server.requests)
        with pytest.raises(ContextOverflow, match="conversation needs"):
            list(remote.stream(history, "new question", GREEDY))
        assert not any(p == "/v1/chat/completions" for p, _b, _h in server.requests[calls:])


def test_stream_errors_mid_reply(scripted: Callable[[dict[str, Route]], ScriptedServer]) -> None:
    server = scripted({"/v1/chat/completions": lambda _b: (200, sse(delta("a"), done=False))})
    with (
        RemoteSession(server.url, "m1") as remote,
        pytest.raises(EngineError, match="closed the stream before"),
    ):
        list(remote.stream([], "hi", GREEDY))
    server.routes["/v1/chat/completions"] = lambda _b: (200, sse(delta("a"), {"error": {"message": "oom"}}))
    with RemoteSession(server.url, "m1") as remote, pytest.raises(EngineError, match="failed mid-reply: oom"):
        list(remote.stream([], "hi", GREEDY))
    server.routes["/v1/chat/completions"] = lambda _b: (200, sse("{not json"))
    with (
        RemoteSession(server.url, "m1") as remote,
        pytest.raises(EngineError, match="malformed stream chunk"),
    ):
        list(remote.stream([], "hi", GREEDY))


def test_remote_session_is_a_chat_backend() -> None:
    remote = RemoteSession("http://127.0.0.1:9", "m")
    assert isinstance(remote, ChatBackend)
    remote.close()
    assert api_root("http://h:1/v1/") == "http://h:1"
    assert api_root("https://h/api") == "https://h/api"


# ----------------------------------------------------------------------------- saved endpoints


def test_endpoint_store_round_trip_with_owner_only_file(tmp_path: Path) -> None:
    store = EndpointStore(tmp_path / "config" / "endpoints.json")
    assert store.all() == []
    lab = store.add("http://10.0.0.5:8080/v1", api_key="sk-abcdefgh1234")
    local = store.add("https://llm.example.org/", name="cloud")
    assert (lab.name, lab.url) == ("10.0.0.5-8080", "http://10.0.0.5:8080")
    assert local.url == "https://llm.example.org"
    assert local.api_key is None
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert EndpointStore(store.path).all() == [lab, local]
    assert lab.public_dict()["api_key"] == "sk-…1234"
    assert mask_key("short") == "…"
    assert store.remove("cloud") == local
    assert [e.name for e in store.all()] == ["10.0.0.5-8080"]
    assert not [p for p in store.path.parent.iterdir() if p.name != "endpoints.json"]  # no temp files left


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("ftp://x", "not an http"),
        ("http://", "not an http"),
        ("http://h:99999", "not a valid URL"),
        ("http://h/?a=1", "no query"),
    ],
)
def test_bad_endpoint_urls(url: str, fragment: str) -> None:
    with pytest.raises(EngineError, match=fragment):
        normalize_url(url)


def test_endpoint_store_rejects_bad_names_duplicates_and_corrupt_files(tmp_path: Path) -> None:
    store = EndpointStore(tmp_path / "endpoints.json")
    store.add("http://a:1", name="a")
    with pytest.raises(EngineError, match="already exists"):
        store.add("http://b:1", name="a")
    with pytest.raises(EngineError, match="endpoint name"):
        store.add("http://b:1", name="../evil")
    with pytest.raises(EngineError, match="spans several lines"):
        store.add("http://b:1", name="b", api_key="k\nX-Injected: 1")
    with pytest.raises(EngineError, match="no saved endpoint by that name"):
        store.get("zzz")
    store.path.write_text("{broken")
    with pytest.raises(EngineError) as caught:
        store.all()
    assert str(caught.value).startswith(f"{store.path}: the endpoints file is not valid JSON")
    store.path.write_text(json.dumps({"endpoints": [{"name": 1}]}))
    with pytest.raises(EngineError, match="malformed entry"):
        store.all()


# ----------------------------------------------------------------------------- llama_cpp.server

# llama-cpp-python's own server, as a stand-in for a remote one. The portable llama.cpp build has
# its CPU code in a library that llama-cpp-python does not load by itself: load it first, as
# Glassbox's worker does.
LLAMA_SERVER = (
    sys.executable,
    "-c",
    "import runpy; from engine.cpu_backend import load_backends; load_backends(); "
    "runpy.run_module('llama_cpp.server', run_name='__main__', alter_sys=True)",
)
ALIAS = "gemma-starter"


@pytest.fixture(scope="module")
def llama_server(starter_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """llama-cpp-python's OpenAI-compatible server on loopback, with the starter model."""
    pytest.importorskip("llama_cpp.server.app", reason="the llama-cpp-python server extra is not installed")
    port = free_port()
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                *LLAMA_SERVER,
                "--model",
                str(starter_model),
                "--model_alias",
                ALIAS,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--n_ctx",
                "1024",
                # The starter GGUF has no chat template; without this the server falls back to
                # llama-2's format, where this base model answers with nothing at all.
                "--chat_format",
                "gemma",
                "--verbose",
                "False",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                pytest.fail(f"llama_cpp.server exited with {process.returncode}: {log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("llama_cpp.server did not come up in 120 s")
            time.sleep(0.3)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def _direct_reply(url: str, prompt: str, max_tokens: int) -> str:
    body = {
        "model": ALIAS,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "top_k": 40,
        "top_p": 0.95,
        "min_p": 0.05,
        "repeat_penalty": 1.0,
    }
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    response.raise_for_status()
    return str(response.json()["choices"][0]["message"]["content"])


@pytest.mark.model
def test_llama_server_models_and_tokenizer(llama_server: str) -> None:
    assert [m.id for m in list_models(llama_server)] == [ALIAS]
    with RemoteSession(llama_server, ALIAS, n_ctx=1024) as remote:
        info = remote.load()
        assert (info.model, info.n_ctx, info.tokenizer) == (ALIAS, 1024, "llama-cpp-python")
        assert 0 < remote.count_text("The quick brown fox jumps over the lazy dog") < 20


@pytest.mark.model
def test_llama_server_stream_matches_a_direct_client(llama_server: str) -> None:
    prompt = "Write a list of three fruits:"
    with RemoteSession(llama_server, ALIAS, n_ctx=1024) as remote:
        events = list(remote.stream([], prompt, GREEDY))
    tokens = [e for e in events if isinstance(e, Token)]
    finished = events[-1]
    assert isinstance(finished, Finished)
    assert finished.reason in ("stop", "length")
    assert len(tokens) > 1
    assert "".join(t.text for t in tokens) == finished.text
    assert finished.text == _direct_reply(llama_server, prompt, 16)
    stats = finished.stats
    assert stats.completion_tokens == len(tokens)
    assert stats.prompt_tokens > 3
    assert stats.ttft_ms > 0
    assert stats.n_ctx == 1024
    parts = ("system", "documents", "history", "current", "reserve", "free")
    assert sum(stats.budget[k] for k in parts) == 1024


@pytest.mark.model
def test_llama_server_stop_midway_then_next_turn(llama_server: str) -> None:
    cancel = threading.Event()
    texts: list[str] = []
    with RemoteSession(llama_server, ALIAS, n_ctx=1024) as remote:
        started = time.perf_counter()
        for event in remote.stream(
            [],
            "Count from one to one hundred:",
            GenerationParams(temperature=0, max_tokens=200),
            cancel=cancel,
        ):
            if isinstance(event, Token):
                texts.append(event.text)
                if len(texts) == 3:
                    cancel.set()
            elif isinstance(event, Finished):
                finished = event
        assert finished.reason == "cancelled"
        assert len(texts) == 3
        assert finished.text == "".join(texts)
        assert time.perf_counter() - started < 60
        again = list(remote.stream([Message("user", "hi"), Message("assistant", finished.text)], "Go on:", GREEDY))
        last = again[-1]
        assert isinstance(last, Finished)
        assert last.reason in ("stop", "length")


@pytest.mark.model
def test_llama_server_bad_model_and_context_overflow(llama_server: str) -> None:
    with RemoteSession(llama_server, "no-such-model") as remote, pytest.raises(ModelLoadError) as caught:
        list(remote.stream([], "hi", GREEDY))
    assert f"(it offers: {ALIAS})" in str(caught.value)
    with (
        RemoteSession(llama_server, ALIAS, n_ctx=1024, overflow_policy="refuse") as remote,
        pytest.raises(ContextOverflow, match="need"),
    ):
        list(remote.stream([], "word " * 2000, GREEDY))
