"""``glassbox chat --endpoint NAME``: the CLI chats with a saved OpenAI-compatible server.

Runs in-process against the scripted loopback server of ``tests/engine/test_remote.py`` (fast, no
model needed).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.cli.main import main
from engine.inference.endpoints import EndpointStore
from tests.engine import test_remote
from tests.engine.test_remote import ALIAS, ScriptedServer, delta, models_route, sse

llama_server = test_remote.llama_server
"""llama-cpp-python's server with the starter model (a module fixture of the engine's remote tests)."""


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    scripted = ScriptedServer(
        {
            "/v1/models": models_route("tiny-a", "tiny-b"),
            "/v1/chat/completions": lambda body: (200, sse(delta("Hel"), delta("lo!"), delta(finish="stop"))),
        }
    )
    yield scripted
    scripted.close()


def test_chat_endpoint_streams_the_servers_reply(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.paths import Paths

    paths = Paths.resolve(str(tmp_path))
    paths.config.mkdir(parents=True, exist_ok=True)
    EndpointStore(paths.config / "endpoints.json").add(server.url, name="lab", api_key="sk-secret-key-1234")
    code = main(
        [
            "chat",
            "--endpoint",
            "lab",
            "--model",
            "tiny-b",
            "--prompt",
            "Say hello",
            "--temperature",
            "0",
            "--json",
            "--home",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    doc = json.loads(out.out)
    assert doc["text"] == "Hello!"
    assert doc["finish_reason"] == "stop"
    chats = [(body, headers) for path, body, headers in server.requests if path == "/v1/chat/completions"]
    assert len(chats) == 1
    body, headers = chats[0]
    assert body["model"] == "tiny-b"
    assert body["messages"][-1] == {"role": "user", "content": "Say hello"}
    assert headers.get("Authorization") == "Bearer sk-secret-key-1234"


def test_chat_endpoint_without_model_uses_the_servers_first(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.paths import Paths

    paths = Paths.resolve(str(tmp_path))
    paths.config.mkdir(parents=True, exist_ok=True)
    EndpointStore(paths.config / "endpoints.json").add(server.url, name="lab")
    code = main(["chat", "--endpoint", "lab", "--prompt", "hi", "--home", str(tmp_path)])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert out.out == "Hello!\n"
    body = next(body for path, body, _ in server.requests if path == "/v1/chat/completions")
    assert body["model"] == "tiny-a"


def test_chat_unknown_endpoint_is_one_line_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["chat", "--endpoint", "nowhere", "--prompt", "hi", "--home", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("glassbox: error: nowhere: no saved endpoint by that name")
    assert err.count("\n") == 1


def test_chat_without_model_or_endpoint_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["chat", "--prompt", "hi", "--home", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert "--model" in err and "--endpoint" in err


@pytest.mark.model
def test_chat_endpoint_against_llama_cpp_server(
    llama_server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real thing: llama-cpp-python's OpenAI-compatible server with the starter model."""
    from app.paths import Paths

    paths = Paths.resolve(str(tmp_path))
    paths.config.mkdir(parents=True, exist_ok=True)
    EndpointStore(paths.config / "endpoints.json").add(llama_server, name="llama")
    args = [
        "chat",
        "--endpoint",
        "llama",
        "--model",
        ALIAS,
        "--prompt",
        "The capital of France is",
        "--temperature",
        "0",
        "--max-tokens",
        "8",
        "--n-ctx",
        "1024",
        "--json",
        "--home",
        str(tmp_path),
    ]
    code = main(args)
    out = capsys.readouterr()
    assert code == 0, out.err
    first = json.loads(out.out)
    assert first["text"].strip()
    assert first["finish_reason"] in ("stop", "length")
    assert 0 < first["completion_tokens"] <= 8
    assert first["n_ctx"] == 1024
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["text"] == first["text"], "greedy replies must repeat"


def test_chat_endpoint_with_a_thinking_budget_is_a_one_line_usage_error(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A budget in tokens has no field in OpenAI's API: a usage error (exit 2) before the server is
    asked and before a conversation is created (it was a TypeError traceback, then exit 1 after an
    empty conversation was saved); ``--thinking on`` still goes to the server as its template switch."""
    from app.paths import Paths
    from engine.history import HistoryStore

    paths = Paths.resolve(str(tmp_path))
    paths.config.mkdir(parents=True, exist_ok=True)
    EndpointStore(paths.config / "endpoints.json").add(server.url, name="lab")
    code = main(["chat", "--endpoint", "lab", "--prompt", "hi", "--thinking", "256", "--home", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("glassbox: error: --thinking TOKENS (a thinking budget) needs a local model")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not server.requests  # not even the model list
    if paths.history_db.exists():
        store = HistoryStore(paths.history_db)
        try:
            assert store.list_conversations(include_deleted=True) == []
        finally:
            store.close()
    code = main(["chat", "--endpoint", "lab", "--prompt", "hi", "--thinking", "on", "--home", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    body = next(body for path, body, _ in server.requests if path == "/v1/chat/completions")
    assert body["chat_template_kwargs"] == {"enable_thinking": True}
