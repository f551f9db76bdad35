"""``glassbox serve``'s bounds on every dialect (issue 27): hostile tool-call arguments in history,
the size and count limits of ``/v1/messages`` and ``/v1/responses``, a client that opens a stream
and stops reading, and a request that waits too long for the model.

Before these fixes: arguments nested 100,000 levels deep (or 50,000 nested objects, or holding a
lone surrogate) were a 500 on ``/v1/chat/completions`` and on ``/v1/responses`` ``function_call``
items; a 10 MB system prompt on ``/v1/messages`` and 8,001 ``/v1/responses`` items were tokenized
(tens of seconds with the model locked) before the 400; an unread stream kept the model generating
for nobody until the kernel's buffers filled and then held it for the handler's 120 s timeout.
Every bound here is counted (tokens generated, calls reaching the backend), never timed.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.paths import Paths
from app.server import exchange as server_exchange
from app.server import state as server_state
from app.server.http import ServerHandle, start_server
from app.server.wire import MAX_MESSAGES, MIN_TEXT_CHARS
from engine.inference.events import Event, Finished, Stats, Token
from tests.app.server import serve_support
from tests.app.server.serve_support import KEY, ScriptedBackend, post
from tests.fake_backend import StreamCall

served = serve_support.served

CHAT = "/v1/chat/completions"
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def _history_with_arguments(arguments: str) -> dict[str, Any]:
    call = {**CALL, "function": {"name": "f", "arguments": arguments}}
    return {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ]
    }


def _responses_with_arguments(arguments: str) -> dict[str, Any]:
    return {
        "input": [
            {"role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": arguments},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        ]
    }


HOSTILE_ARGUMENTS = {
    "100,000 levels": "[" * 100_000 + "]" * 100_000,
    "50,000 nested objects": '{"a":' * 50_000 + "1" + "}" * 50_000,
    "a lone surrogate": '{"a": "\\ud800"}',
    "a 1,000-digit number": '{"a": ' + "9" * 1000 + "}",
    "broken JSON": '{"a": ',
    "not an object": "[1, 2]",
}


@pytest.mark.parametrize("shape", sorted(HOSTILE_ARGUMENTS))
def test_hostile_call_arguments_in_history_are_a_400_naming_the_field(
    served: tuple[ServerHandle, ScriptedBackend], shape: str
) -> None:
    handle, backend = served
    arguments = HOSTILE_ARGUMENTS[shape]
    status, body = post(handle, CHAT, _history_with_arguments(arguments))
    assert status == 400, body
    assert body["error"]["param"] == "messages[1].tool_calls[0].function.arguments"
    assert body["error"]["message"].startswith("messages[1].tool_calls[0].function.arguments: ")
    status, body = post(handle, "/v1/responses", _responses_with_arguments(arguments))
    assert status == 400, body
    assert body["error"]["param"] == "input[1].arguments"
    assert backend.calls == []
    # Sane arguments in the same places are served.
    assert post(handle, CHAT, _history_with_arguments('{"a": [1, {"b": "\\u00e9"}]}'))[0] == 200
    assert post(handle, "/v1/responses", _responses_with_arguments('{"a": 1}'))[0] == 200


def test_messages_refuse_a_10_mb_system_prompt_before_tokenizing_it(
    served: tuple[ServerHandle, ScriptedBackend],
) -> None:
    handle, backend = served
    counted: list[str] = []
    backend.count_text = lambda text: counted.append(text) or len(text.split())  # type: ignore[method-assign]
    body = {"max_tokens": 8, "system": "s " * 5_000_000, "messages": [{"role": "user", "content": "hi"}]}
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        status, answer = post(handle, path, body)
        assert status == 400, answer
        assert answer["type"] == "error"
        assert answer["error"]["type"] == "invalid_request_error"
        assert answer["error"]["message"].startswith("prompt is too long")  # Anthropic's words
        assert f"more than {MIN_TEXT_CHARS} characters" in answer["error"]["detail"]
    # As text blocks too, and the tools count with it.
    blocks = {**body, "system": [{"type": "text", "text": "s" * (MIN_TEXT_CHARS + 1)}]}
    assert post(handle, "/v1/messages", blocks)[0] == 400
    tools = [{"name": f"t{i}", "description": "d" * 4096, "input_schema": {"type": "object"}} for i in range(100)]
    assert post(handle, "/v1/messages", {**body, "system": "s", "tools": tools})[0] == 400
    assert backend.calls == [] and counted == []
    too_many = [{"role": "user" if i % 2 == 0 else "assistant", "content": "a"} for i in range(MAX_MESSAGES + 1)]
    status, answer = post(handle, "/v1/messages", {"max_tokens": 8, "messages": too_many})
    assert status == 400
    assert f"at most {MAX_MESSAGES}" in answer["error"]["message"]
    assert backend.calls == []


def test_responses_refuse_8001_items_and_huge_instructions_before_tokenizing(
    served: tuple[ServerHandle, ScriptedBackend],
) -> None:
    handle, backend = served
    items = [{"role": "user", "content": "a"}] * 8001
    status, answer = post(handle, "/v1/responses", {"input": items})
    assert status == 400
    assert answer["error"]["code"] == "too_many_messages"
    assert answer["error"]["param"] == "input"
    status, answer = post(handle, "/v1/responses", {"instructions": "i" * (MIN_TEXT_CHARS + 1), "input": "hi"})
    assert status == 400
    assert answer["error"]["code"] == "context_length_exceeded"
    assert answer["error"]["message"].startswith("This model's maximum context length is")
    # The arguments of calls in the input count with the text.
    call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": json.dumps({"a": "x" * MIN_TEXT_CHARS})}
    items = [{"role": "user", "content": "hi"}, call, {"type": "function_call_output", "call_id": "c", "output": "1"}]
    assert post(handle, "/v1/responses", {"input": items})[0] == 400
    assert backend.calls == []
    assert post(handle, "/v1/responses", {"input": [{"role": "user", "content": "a"}] * MAX_MESSAGES})[0] == 200


# ----------------------------------------------------------------------------- a client that stops reading


class EndlessBackend(ScriptedBackend):
    """Generates until it is cancelled (at most ``limit`` tokens), counting what it made; with
    ``hold`` set, it instead waits for ``release`` before its one token."""

    def __init__(self, limit: int = 1_000_000) -> None:
        super().__init__()
        self.limit = limit
        self.produced = 0
        self.cancelled = threading.Event()
        self.started = threading.Event()
        self.hold = False
        self.release = threading.Event()

    def script(self, call: StreamCall) -> Iterator[Event]:
        cancel = call.cancel
        assert cancel is not None
        self.started.set()
        try:
            if self.hold:
                self.release.wait(30)
                yield Token("done", 0)
            else:
                while not cancel.is_set() and self.produced < self.limit:
                    yield Token(" word", self.produced)
                    self.produced += 1
        finally:
            if cancel.is_set():
                self.cancelled.set()
        stats = Stats(prompt_tokens=1, completion_tokens=self.produced)
        yield stats
        yield Finished("cancelled" if cancel.is_set() else "stop", stats, "")


@pytest.fixture
def endless(tmp_path: Path) -> Iterator[tuple[ServerHandle, EndlessBackend]]:
    backend = EndlessBackend()
    with start_server(Paths.resolve(tmp_path / "home"), port=0, api_key=KEY, backend=backend) as handle:
        yield handle, backend


def _open_unread_stream(handle: ServerHandle, path: str, body: dict[str, Any]) -> socket.socket:
    """Sends a streaming request on a socket with a small receive buffer, and never reads it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((handle.host, handle.port))
    data = json.dumps({**body, "stream": True}).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)
    return sock


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (CHAT, {"messages": [{"role": "user", "content": "go"}], "max_tokens": 1_000_000}),
        ("/v1/messages", {"messages": [{"role": "user", "content": "go"}], "max_tokens": 1_000_000}),
        ("/v1/responses", {"input": "go", "max_output_tokens": 1_000_000}),
    ],
)
def test_a_stream_nobody_reads_is_cancelled_and_frees_the_model(
    endless: tuple[ServerHandle, EndlessBackend], monkeypatch: pytest.MonkeyPatch, path: str, body: dict[str, Any]
) -> None:
    handle, backend = endless
    monkeypatch.setattr(server_exchange, "WRITE_STALL_S", 0.5)
    sock = _open_unread_stream(handle, path, body)
    try:
        assert backend.cancelled.wait(60), f"the unread stream was never cancelled ({backend.produced} tokens)"
        # Generation ran ahead of the reader by what the socket buffers hold, then stopped: a few
        # thousand small events at most (before, the kernel's autotuned buffers took ~10^5).
        assert backend.produced < 5000, backend.produced
        # The model is free: the next client is answered.
        print(f"{path}: {backend.produced} tokens generated before the stall was seen")
        backend.produced, backend.limit = 0, 3
        status, answer = post(handle, CHAT, {"messages": [{"role": "user", "content": "next"}]})
        assert status == 200, answer
        assert answer["choices"][0]["message"]["content"] == " word word word"
    finally:
        sock.close()


def test_a_request_that_waits_too_long_gets_503_with_retry_after(
    endless: tuple[ServerHandle, EndlessBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    handle, backend = endless
    backend.hold = True
    monkeypatch.setattr(server_state, "QUEUE_WAIT_S", 0.3)
    first = threading.Thread(target=post, args=(handle, CHAT, {"messages": [{"role": "user", "content": "a"}]}))
    first.start()
    try:
        assert backend.started.wait(30)
        second = [{"role": "user", "content": "b"}]
        for path, body, status, kind in (
            (CHAT, {"messages": second}, 503, "server_error"),
            ("/v1/messages", {"max_tokens": 4, "messages": second}, 529, "overloaded_error"),
        ):
            connection = http.client.HTTPConnection(handle.host, handle.port, timeout=30)
            connection.request(
                "POST",
                path,
                body=json.dumps(body),
                headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
            )
            response = connection.getresponse()
            answer = json.loads(response.read())
            connection.close()
            assert response.status == status, answer
            assert response.getheader("Retry-After") == str(server_state.BUSY_RETRY_AFTER_S)
            error = answer["error"]
            assert error["type"] == kind
            assert "busy" in error["detail"]
    finally:
        backend.release.set()
        first.join(30)
