"""A scripted chat backend for ``glassbox serve`` tests of the API surface, and small helpers.

:class:`ScriptedBackend` answers with the user's words reversed, one per token, and records what
each call asked for (params, tools, messages), so a test can check that a field reached the engine.
It streams what the engine streams: ``Token`` (with log-probabilities when asked), ``Reasoning``
when the user's text holds "think", ``ToolCall`` when tools are offered (the call chosen by
``tool_choice``, or the first tool), then ``Stats`` and ``Finished``. Its ``complete`` (over its
``worker``) lets ``/v1/completions`` run: tokens are the prompt's bytes, the reply the prompt's
words reversed.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest

from app.paths import Paths
from app.server.http import ServerHandle, start_server
from engine.inference.adapters import LoraAdapter
from engine.inference.events import Event, Finished, PrefillProgress, Reasoning, Stats, Token, ToolCall
from engine.inference.runtime import GenerationParams, WorkerResult
from tests.fake_backend import FakeBackend, StreamCall

KEY = "test-key-0123456789"
BOS = 256
"""The scripted model's BOS token (its other tokens are the text's bytes)."""


def _token(text: str, index: int, params: GenerationParams) -> Token:
    if not params.logprobs:
        return Token(text, index)
    alternatives = tuple((f"{text}~{k}", -1.0 - k) for k in range(params.logprobs))
    return Token(text, index, logprob=-0.5, top_logprobs=alternatives)


class ScriptedWorker:
    """What ``/v1/completions`` needs of an inference worker."""

    def __init__(self) -> None:
        self.prompts: list[list[int]] = []
        self.params: list[GenerationParams] = []

    def tokenize(self, text: str, add_bos: bool = False, special: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def pieces(self, tokens: Sequence[int]) -> list[str]:
        return [bytes([t]).decode("latin-1") for t in tokens]

    def generate(
        self, tokens: Sequence[int], params: GenerationParams, cancel: threading.Event | None = None
    ) -> Iterator[Event]:
        self.prompts.append(list(tokens))
        self.params.append(params)
        words = list(reversed(bytes(tokens).decode("utf-8", "replace").split()))[: params.max_tokens]
        text = ""
        for index, word in enumerate(words):
            piece = word if index == 0 else f" {word}"
            text += piece
            yield _token(piece, index, params)
        reason = "length" if len(words) == params.max_tokens else "stop"
        return WorkerResult(reason, text, len(tokens), 0, len(words), len(tokens) + len(words), 1.0, 2.0, 3.0)


class ScriptedBackend(FakeBackend):
    """See the module docstring. ``tool_args`` are the arguments of every call it makes. It is a
    local model (``local`` is itself): ``/v1/completions`` and ``/tokenize`` run over its worker."""

    def __init__(self, n_ctx: int = 256) -> None:
        super().__init__(n_ctx=n_ctx, n_vocab=1000, model_id="fake-model")
        self.worker = ScriptedWorker()
        self.tool_args: dict[str, Any] = {"city": "Paris"}
        self.calls_per_reply = 1
        self.backend_note: str | None = None
        self.machine_bandwidth_gbps: float | None = None

    # the local model (engine.inference.backends.LocalBackend)
    @property
    def local(self) -> ScriptedBackend:
        return self

    @property
    def template(self) -> None:
        return None

    @property
    def worker_pid(self) -> int | None:
        return None

    @property
    def worker_alive(self) -> bool:
        return False  # no worker process

    def kill_worker(self, timeout: float = 1.0) -> None:
        pass

    def tokenize(self, text: str, *, add_bos: bool = False, special: bool = True) -> list[int]:
        return ([BOS] if add_bos else []) + self.worker.tokenize(text, add_bos=False, special=special)

    adapters: tuple[LoraAdapter, ...] = ()

    def set_adapters(self, adapters: Sequence[LoraAdapter]) -> None:
        self.adapters = tuple(adapters)

    def token_bytes(self, tokens: Sequence[int]) -> list[bytes]:
        return [b"<s>" if t == BOS else bytes([t]) for t in tokens]

    def tokenize_prompt(self, text: str) -> list[int]:
        return self.worker.tokenize(text, add_bos=False, special=True)

    def pieces(self, tokens: Sequence[int]) -> list[str]:
        return self.worker.pieces(tokens)

    def complete(
        self,
        prompt: str | Sequence[int],
        params: GenerationParams | None = None,
        cancel: threading.Event | None = None,
    ) -> Iterator[Event]:
        """As ``ChatSession.complete``: the worker's events, then Stats and Finished."""
        tokens = self.tokenize_prompt(prompt) if isinstance(prompt, str) else list(prompt)
        result = yield from self.worker.generate(tokens, params or GenerationParams(), cancel)
        stats = Stats(prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens, template="raw")
        yield stats
        yield Finished(result.reason, stats, result.text)  # type: ignore[arg-type]

    def script(self, call: StreamCall) -> Iterator[Event]:
        params, tools, tool_choice = call.params, call.tools, call.tool_choice
        user = call.user or ""
        yield PrefillProgress(0, 1)
        if "think" in user:
            yield Reasoning("Let me see.")
        words = list(reversed(user.split()))[: params.max_tokens]
        text = ""
        for index, word in enumerate(words):
            piece = word if index == 0 else f" {word}"
            text += piece
            yield _token(piece, index, params)
        calls: list[ToolCall] = []
        if tools and tool_choice != "none":
            name = tool_choice if tool_choice not in (None, "auto", "required") else tools[0].name
            for number in range(self.calls_per_reply):
                made = ToolCall(f"call{number}", name, dict(self.tool_args), "")
                calls.append(made)
                yield made
        stats = Stats(prompt_tokens=len(user.split()) + 1, completion_tokens=len(words), decode_tps=10.0)
        yield stats
        reason = "length" if len(words) == params.max_tokens and words else "stop"
        yield Finished(reason, stats, text, reasoning="Let me see." if "think" in user else "", tool_calls=tuple(calls))  # type: ignore[arg-type]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ServerHandle, ScriptedBackend]]:
    """A server with the test key in front of a fresh ScriptedBackend, on a free loopback port;
    stopped after the test. A test module uses it with ``served = serve_support.served``."""
    backend = ScriptedBackend()
    with start_server(Paths.resolve(tmp_path / "home"), port=0, api_key=KEY, backend=backend) as handle:
        yield handle, backend


def client(handle: ServerHandle, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{handle.url}/v1", api_key=key, max_retries=0, timeout=60)


def post(handle: ServerHandle, path: str, body: dict[str, Any], key: str = KEY) -> tuple[int, Any]:
    """POSTs a JSON body; returns the status and the JSON answer (or, for a stream, its events)."""
    connection = http.client.HTTPConnection(handle.host, handle.port, timeout=30)
    try:
        connection.request(
            "POST",
            path,
            body=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
        )
        response = connection.getresponse()
        data = response.read()
        if (response.getheader("Content-Type") or "").startswith("text/event-stream"):
            return response.status, sse_events(data.decode())
        return response.status, json.loads(data or b"{}")
    finally:
        connection.close()


@dataclass
class SseEvent:
    event: str | None
    data: Any = field(default=None)


def sse_events(text: str) -> list[SseEvent]:
    """The events of a server-sent stream (``data`` parsed as JSON, ``[DONE]`` kept as text)."""
    events: list[SseEvent] = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        name = None
        data: list[str] = []
        for line in block.splitlines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
        joined = "\n".join(data)
        events.append(SseEvent(name, joined if joined == "[DONE]" else json.loads(joined)))
    return events
