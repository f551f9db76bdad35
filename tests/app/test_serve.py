"""``glassbox serve``: the OpenAI-compatible API over the local engine, driven by the official
``openai`` client; and the ``glassbox endpoints`` commands.

Fast tests run the server with a scripted fake backend (auth, host checks, request validation,
queueing); ``@pytest.mark.model`` tests serve the real starter model.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest

from app.cli import main
from app.paths import Paths
from app.serve import ServeError, ServerHandle, check_host, is_loopback, start_server
from engine.errors import ContextOverflow
from engine.events import Event, Finished, PrefillProgress, Stats, Token
from engine.runtime import GenerationParams

KEY = "test-key-0123456789"
ROOT = Path(__file__).resolve().parents[2]


class FakeBackend:
    """Answers every turn with the user's words reversed, one word per token, slowly.

    Records which requests overlap, so a test can prove that requests queue.
    """

    model = "fake-model"

    def __init__(self, delay: float = 0.01) -> None:
        self.delay = delay
        self.active = 0
        self.max_active = 0
        self.calls: list[tuple[str, str | None, int]] = []
        self.closed = False
        self._guard = threading.Lock()

    def load(self, cancel: threading.Event | None = None) -> object:
        return None

    def count_text(self, text: str) -> int:
        return len(text.split())

    def close(self) -> None:
        self.closed = True

    def stream(
        self,
        history: Sequence[Any],
        user: str,
        params: GenerationParams | None = None,
        *,
        system: str | None = None,
        documents: str | None = None,
        cancel: threading.Event | None = None,
    ) -> Iterator[Event]:
        params = params or GenerationParams()
        if "overflow" in user:
            raise ContextOverflow("conversation needs 9999 tokens but the context window is 64")
        with self._guard:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            self.calls.append((user, system, len(history)))
        try:
            yield PrefillProgress(0, 3)
            words = list(reversed(user.split()))[: params.max_tokens]
            text = ""
            reason = "stop"
            for i, word in enumerate(words):
                if cancel is not None and cancel.is_set():
                    reason = "cancelled"
                    break
                time.sleep(self.delay)
                piece = word if i == 0 else f" {word}"
                text += piece
                yield Token(piece, i)
            stats = Stats(prompt_tokens=len(user.split()), completion_tokens=len(words), decode_tps=10.0)
            yield stats
            yield Finished(reason, stats, text)  # type: ignore[arg-type]
        finally:
            with self._guard:
                self.active -= 1


@pytest.fixture
def fake_server(tmp_path: Path) -> Iterator[tuple[ServerHandle, FakeBackend]]:
    backend = FakeBackend()
    handle = start_server(Paths.resolve(tmp_path / "home"), port=0, api_key=KEY, backend=backend)
    yield handle, backend
    handle.stop()


def _client(handle: ServerHandle, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{handle.url}/v1", api_key=key, max_retries=0, timeout=60)


def _raw(
    handle: ServerHandle,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any]]:
    connection = http.client.HTTPConnection(handle.host, handle.port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        connection.close()


def _env_without_key() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "GLASSBOX_SERVE_API_KEY"}


# ----------------------------------------------------------------------------- security


def test_loopback_detection() -> None:
    assert is_loopback("127.0.0.1")
    assert is_loopback("localhost")
    assert is_loopback("::1")
    assert is_loopback("[::1]")
    assert not is_loopback("0.0.0.0")
    assert not is_loopback("192.168.1.4")
    assert not is_loopback("example.com")


def test_non_loopback_host_without_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ServeError, match="without an API key"):
        start_server(Paths.resolve(tmp_path), host="0.0.0.0", port=0, backend=FakeBackend())
    with pytest.raises(ServeError, match="too short"):
        check_host("0.0.0.0", "short")
    check_host("0.0.0.0", KEY)  # a real key is enough


def test_cli_refuses_non_loopback_without_key(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "app", "--home", str(tmp_path), "serve", "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        env=_env_without_key(),
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "glassbox: error: 0.0.0.0: refusing to serve on a non-loopback address without an API key "
        "(pass --api-key KEY, or use --host 127.0.0.1)"
    ]
    assert "Traceback" not in result.stderr


def test_wrong_or_missing_key_gets_401(fake_server: tuple[ServerHandle, FakeBackend]) -> None:
    handle, backend = fake_server
    with pytest.raises(openai.AuthenticationError) as caught:
        _client(handle, "wrong-key-123456").chat.completions.create(
            model="x", messages=[{"role": "user", "content": "hi"}]
        )
    assert caught.value.status_code == 401
    with pytest.raises(openai.AuthenticationError):
        _client(handle, "wrong-key-123456").models.list()
    status, body = _raw(handle, "GET", "/v1/models")
    assert status == 401
    assert body["error"]["code"] == "invalid_api_key"
    assert backend.calls == []  # nothing reached the model
    assert [m.id for m in _client(handle).models.list().data] == ["fake-model"]


def test_foreign_host_header_refused_without_key(tmp_path: Path) -> None:
    """DNS rebinding: a page on evil.example resolving to 127.0.0.1 must not reach the API."""
    with start_server(Paths.resolve(tmp_path), port=0, backend=FakeBackend()) as handle:
        status, body = _raw(handle, "GET", "/v1/models", headers={"Host": "evil.example:8080"})
        assert status == 403
        assert "loopback only" in body["error"]["message"]
        status, _ = _raw(handle, "GET", "/v1/models", headers={"Host": f"localhost:{handle.port}"})
        assert status == 200
        # A cross-site form can only send text/plain: refused before the model sees it.
        status, body = _raw(
            handle,
            "POST",
            "/v1/chat/completions",
            body=b'{"messages": []}',
            headers={"Content-Type": "text/plain"},
        )
        assert status == 415


# ----------------------------------------------------------------------------- requests


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ({"messages": []}, "non-empty list"),
        ({"messages": [{"role": "assistant", "content": "hi"}]}, "last message must be from the user"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "role 'tool' is not supported"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "only text content",
        ),
        ({"messages": [{"role": "user", "content": "hi"}], "temperature": -1}, "temperature"),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, "only n=1"),
        ({"messages": [{"role": "user", "content": "overflow please"}]}, "context window is 64"),
    ],
)
def test_bad_requests_get_400_with_a_reason(
    fake_server: tuple[ServerHandle, FakeBackend], payload: dict[str, Any], fragment: str
) -> None:
    handle, _ = fake_server
    status, body = _raw(
        handle,
        "POST",
        "/v1/chat/completions",
        json.dumps(payload).encode(),
        {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
    )
    assert status == 400
    assert fragment in body["error"]["message"]
    assert "\n" not in body["error"]["message"]


def test_malformed_json_unknown_path_and_huge_body(fake_server: tuple[ServerHandle, FakeBackend]) -> None:
    handle, _ = fake_server
    auth = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
    status, body = _raw(handle, "POST", "/v1/chat/completions", b"{not json", auth)
    assert status == 400
    assert "not valid JSON" in body["error"]["message"]
    status, _ = _raw(handle, "GET", "/v1/nothing", headers=auth)
    assert status == 404
    status, _ = _raw(handle, "POST", "/v1/chat/completions", b"", {**auth, "Content-Length": str(10**9)})
    assert status == 413


def test_messages_map_to_system_history_and_user(fake_server: tuple[ServerHandle, FakeBackend]) -> None:
    handle, backend = fake_server
    reply = _client(handle).chat.completions.create(
        model="anything",
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "eno"},
            {"role": "user", "content": [{"type": "text", "text": "alpha beta"}]},
        ],
    )
    assert reply.choices[0].message.content == "beta alpha"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.model == "fake-model"
    assert backend.calls == [("alpha beta", "be brief", 2)]


def test_requests_queue_one_at_a_time(fake_server: tuple[ServerHandle, FakeBackend]) -> None:
    handle, backend = fake_server
    prompts = [f"w{i} x{i} y{i} z{i}" for i in range(6)]

    def ask(prompt: str) -> str:
        stream = _client(handle).chat.completions.create(
            model="m", messages=[{"role": "user", "content": prompt}], stream=True
        )
        return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)

    with ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(ask, prompts))
    assert replies == [" ".join(reversed(p.split())) for p in prompts]
    assert backend.max_active == 1


def test_client_disconnect_cancels_the_reply(tmp_path: Path) -> None:
    backend = FakeBackend(delay=0.05)
    with start_server(Paths.resolve(tmp_path), port=0, backend=backend) as handle:
        connection = http.client.HTTPConnection(handle.host, handle.port, timeout=30)
        words = " ".join(f"w{i}" for i in range(200))
        body = json.dumps({"messages": [{"role": "user", "content": words}], "stream": True})
        connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200
        response.read1(64)
        response.close()  # the user pressed Stop
        connection.close()
        deadline = time.monotonic() + 10
        while backend.active and time.monotonic() < deadline:
            time.sleep(0.02)
        assert backend.active == 0
        # The next request is served normally.
        reply = _client(handle).chat.completions.create(model="m", messages=[{"role": "user", "content": "a b"}])
        assert reply.choices[0].message.content == "b a"


def test_port_in_use_is_a_clear_error(fake_server: tuple[ServerHandle, FakeBackend], tmp_path: Path) -> None:
    handle, _ = fake_server
    second = FakeBackend()
    with pytest.raises(ServeError) as caught:
        start_server(Paths.resolve(tmp_path), port=handle.port, backend=second)
    assert str(caught.value).startswith(f"127.0.0.1:{handle.port}: cannot listen there")
    assert not second.closed  # the caller owns a backend it passed in


def test_stop_closes_backend_and_port(tmp_path: Path) -> None:
    backend = FakeBackend()
    handle = start_server(Paths.resolve(tmp_path), port=0, backend=backend)
    port = handle.port
    handle.stop()
    handle.stop()  # idempotent
    assert not backend.closed  # the caller owns a backend it passed in
    assert handle.wait(5)
    with pytest.raises(ConnectionRefusedError):
        http.client.HTTPConnection("127.0.0.1", port, timeout=2).request("GET", "/health")


# ----------------------------------------------------------------------------- endpoints CLI


def test_endpoints_cli_add_list_remove(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = str(tmp_path / "home")
    assert (
        main(
            [
                "endpoints",
                "--home",
                home,
                "add",
                "http://10.1.2.3:8080/v1/",
                "--api-key",
                "sk-secret-abcd",
                "--name",
                "lab",
                "--no-check",
                "--json",
            ]
        )
        == 0
    )
    added = json.loads(capsys.readouterr().out)
    assert added == {"name": "lab", "url": "http://10.1.2.3:8080", "api_key": "sk-…abcd"}
    file = Paths.resolve(home).config / "endpoints.json"
    assert stat.S_IMODE(file.stat().st_mode) == 0o600
    assert json.loads(file.read_text())["endpoints"][0]["api_key"] == "sk-secret-abcd"

    assert main(["endpoints", "--home", home, "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed == {"endpoints": [added]}
    assert "sk-secret-abcd" not in json.dumps(listed)

    assert main(["endpoints", "--home", home, "add", "http://10.9.9.9", "--name", "lab", "--no-check"]) == 1
    assert "already exists" in capsys.readouterr().err
    assert main(["endpoints", "--home", home, "add", "ftp://x", "--no-check"]) == 1
    assert (
        capsys.readouterr().err.strip() == "glassbox: error: ftp://x: not an http:// or https:// URL with a host name"
    )
    assert main(["endpoints", "--home", home, "remove", "lab"]) == 0
    assert main(["endpoints", "--home", home, "remove", "lab"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["glassbox: error: lab: no saved endpoint by that name (none saved)"]


def test_endpoints_add_checks_and_lists_models(
    fake_server: tuple[ServerHandle, FakeBackend], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    handle, _ = fake_server
    home = str(tmp_path / "home")
    assert main(["endpoints", "--home", home, "add", handle.url, "--api-key", "wrong-key-9999"]) == 1
    assert "refused the API key" in capsys.readouterr().err
    assert main(["endpoints", "--home", home, "add", handle.url, "--api-key", KEY, "--name", "me"]) == 0
    capsys.readouterr()
    assert main(["endpoints", "--home", home, "models", "me", "--json"]) == 0
    models = json.loads(capsys.readouterr().out)["models"]
    assert [m["id"] for m in models] == ["fake-model"]


# ----------------------------------------------------------------------------- the real model


@pytest.fixture(scope="module")
def serve_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("serve-home")


@pytest.fixture(scope="module")
def model_server(starter_model: Path, serve_home: Path) -> Iterator[ServerHandle]:
    from engine.starter import starter_embedder_path

    home = serve_home
    handle = start_server(
        Paths.resolve(home),
        port=0,
        api_key=KEY,
        model_path=starter_model,
        n_ctx=512,
        embedder_path=starter_embedder_path(),
    )
    yield handle
    handle.stop()


PROMPTS = ["The capital of France is", "Water boils at", "Once upon a time, a"]


def _ask(handle: ServerHandle, prompt: str, stream: bool, max_tokens: int = 8) -> str:
    client = _client(handle)
    messages = [{"role": "user", "content": prompt}]
    if not stream:
        reply = client.chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=max_tokens)
        return reply.choices[0].message.content or ""
    chunks = client.chat.completions.create(
        model="m", messages=messages, temperature=0, max_tokens=max_tokens, stream=True
    )
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


@pytest.mark.model
def test_openai_client_stream_and_non_stream_agree(model_server: ServerHandle) -> None:
    client = _client(model_server)
    assert model_server.model in [m.id for m in client.models.list().data]
    reply = client.chat.completions.create(
        model=model_server.model,
        messages=[{"role": "user", "content": PROMPTS[0]}],
        temperature=0,
        max_tokens=12,
    )
    text = reply.choices[0].message.content or ""
    assert text.strip()
    assert reply.usage is not None
    assert 0 < reply.usage.completion_tokens <= 12
    assert reply.usage.prompt_tokens > 3
    chunks = list(
        client.chat.completions.create(
            model=model_server.model,
            messages=[{"role": "user", "content": PROMPTS[0]}],
            temperature=0,
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == reply.usage.completion_tokens
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [reply.choices[0].finish_reason]


@pytest.mark.model
def test_concurrent_requests_get_their_own_replies(model_server: ServerHandle) -> None:
    sequential = [_ask(model_server, p, stream=True) for p in PROMPTS]
    assert len(set(sequential)) == len(PROMPTS)  # distinct, so mixing would show
    with ThreadPoolExecutor(3) as pool:
        concurrent = list(pool.map(lambda p: _ask(model_server, p, stream=True), PROMPTS))
    assert concurrent == sequential


@pytest.mark.model
@pytest.mark.slow  # loads torch and the embedding model
def test_embeddings_through_openai_client(model_server: ServerHandle) -> None:
    import numpy as np

    client = _client(model_server)
    result = client.embeddings.create(model="any", input=["a cat sat on the mat", "a kitten on a rug", "tax law"])
    vectors = np.array([d.embedding for d in result.data])  # the client asked for base64 and decoded it
    assert vectors.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]
    floats = client.embeddings.create(model="any", input="a cat sat on the mat", encoding_format="float")
    assert np.allclose(floats.data[0].embedding, vectors[0], atol=1e-5)


@pytest.mark.model
def test_remote_session_reads_glassbox_serve(model_server: ServerHandle) -> None:
    """Glassbox as a client of Glassbox: exact token counts, the server's context size and usage."""
    from engine.remote import RemoteSession

    with RemoteSession(model_server.url, model_server.model, api_key=KEY) as remote:
        info = remote.load()
        assert (info.tokenizer, info.n_ctx) == ("llama.cpp", 512)
        events = list(remote.stream([], PROMPTS[1], GenerationParams(temperature=0, max_tokens=12)))
    finished = events[-1]
    assert isinstance(finished, Finished)
    assert finished.text == _ask(model_server, PROMPTS[1], stream=False, max_tokens=12)
    assert "estimated" not in finished.stats.budget
    assert finished.stats.n_ctx == 512
    assert finished.stats.completion_tokens > 0


@pytest.mark.model
def test_cli_serve_subprocess_starts_answers_and_stops(starter_model: Path, tmp_path: Path) -> None:
    env = {**_env_without_key(), "GLASSBOX_HOME": str(tmp_path)}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app",
            "serve",
            "--model",
            str(starter_model),
            "--port",
            "0",
            "--n-ctx",
            "256",
            "--no-embeddings",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    try:
        assert process.stdout is not None
        started = json.loads(process.stdout.readline())
        assert started["url"].startswith("http://127.0.0.1:")
        assert started["api_key_required"] is False
        client = openai.OpenAI(base_url=started["openai_base_url"], api_key="unused", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == [started["model"]]
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


@pytest.mark.model
@pytest.mark.slow  # indexes a document with the embedding model
def test_knowledge_base_field_gives_a_cited_answer(
    model_server: ServerHandle,
    serve_home: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    note = tmp_path / "launch.txt"
    note.write_text("The launch code of the Glassbox rocket is PELICAN-42. It is kept in the blue safe.\n")
    monkeypatch.setenv("GLASSBOX_HOME", str(serve_home))  # the server's profile
    assert main(["kb", "create", "notes"]) == 0
    assert main(["kb", "add", "notes", str(note)]) == 0
    capsys.readouterr()
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "What is the launch code of the rocket?"}],
        "temperature": 0,
        "max_tokens": 8,
        "knowledge_base": "notes",
    }
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
    status, reply = _raw(model_server, "POST", "/v1/chat/completions", json.dumps(body).encode(), headers)
    assert status == 200, reply
    assert [Path(source["path"]).name for source in reply["sources"]] == ["launch.txt"]
    assert reply["usage"]["prompt_tokens"] > 20  # the passage went into the prompt
    body["knowledge_base"] = ["no-such-kb"]
    status, reply = _raw(model_server, "POST", "/v1/chat/completions", json.dumps(body).encode(), headers)
    assert status == 400
    assert "no-such-kb" in reply["error"]["message"]


def test_api_key_from_environment_keeps_it_out_of_the_process_list(monkeypatch: pytest.MonkeyPatch) -> None:
    from app.cli import build_parser

    monkeypatch.setenv("GLASSBOX_SERVE_API_KEY", KEY)
    assert build_parser().parse_args(["serve", "--host", "0.0.0.0"]).api_key == KEY
    monkeypatch.delenv("GLASSBOX_SERVE_API_KEY")
    assert build_parser().parse_args(["serve"]).api_key is None
