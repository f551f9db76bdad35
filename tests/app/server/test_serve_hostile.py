"""``glassbox serve`` against hostile inputs: nesting bombs, huge numbers, lone surrogates, failures
whose text must stay in the log, and a burst of streaming requests.

Every test talks to a real server on 127.0.0.1 (a scripted fake backend; the last test serves the
starter model). Each states its bound: how many requests, and the work they may cost (counted, not
timed: CI machines are noisy).
Before these fixes the nesting bombs, the 100,000-digit integer and the lone surrogates got
"Remote end closed connection without response", an engine failure answered with the Python
exception's text, and ``"temperature": 1e400`` was served as an infinite temperature.
"""

from __future__ import annotations

import http.client
import json
import logging
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from app.paths import Paths
from app.server.body import MAX_JSON_DEPTH, MAX_NUMBER_CHARS, nesting_exceeds
from app.server.http import ServerHandle, start_server
from app.server.state import MAX_QUEUED
from engine.errors import EngineCrashed, EngineError, ModelLoadError
from engine.inference.adapters import LoraAdapter
from engine.inference.events import Event, Finished, PrefillProgress, Stats, Token
from tests.fake_backend import FakeBackend, StreamCall

CHAT = "/v1/chat/completions"
JSON_ENDPOINTS = (CHAT, "/v1/completions", "/v1/responses", "/v1/embeddings", "/tokenize")
"""Every route that reads a JSON body and answers in OpenAI's shape (/v1/messages answers in Anthropic's)."""
SECRET = "/home/alice/secret-path"  # stands for what exception text leaks: paths, Python internals


class FakeWorker:
    """Tokenizes as llama.cpp's binding does: it encodes the text as UTF-8 first."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.failure: BaseException | None = None

    def tokenize(self, text: str, add_bos: bool = False, special: bool = True) -> list[int]:
        self.calls.append(text)
        if self.failure is not None:
            raise self.failure
        return list(text.encode("utf-8"))


class HostileBackend(FakeBackend):
    """Answers with the user's words reversed, one word per token, ``delay`` seconds each.

    ``failure`` is raised before the first event, or after ``fail_after`` tokens when that is set.
    A local model whose ``/tokenize`` goes to :class:`FakeWorker`; it completes no raw prompt.
    ``asked`` is the user's text of each reply that reached the model.
    """

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__(n_ctx=0, n_vocab=None, model_id="fake-model")
        self.delay = delay
        self.worker = FakeWorker()
        self.asked: list[str] = []
        self.failure: BaseException | None = None
        self.fail_after: int | None = None
        self.active = 0
        self.max_active = 0
        self.backend_note: str | None = None
        self.machine_bandwidth_gbps: float | None = None
        self._guard = threading.Lock()

    @property
    def local(self) -> HostileBackend:
        return self

    @property
    def template(self) -> None:
        return None

    @property
    def worker_pid(self) -> None:
        return None

    @property
    def worker_alive(self) -> bool:
        return False  # no worker process

    def kill_worker(self, timeout: float = 1.0) -> None:
        pass

    def tokenize(self, text: str, *, add_bos: bool = False, special: bool = True) -> list[int]:
        return self.worker.tokenize(text)

    adapters: tuple[LoraAdapter, ...] = ()

    def set_adapters(self, adapters: Sequence[LoraAdapter]) -> None:
        self.adapters = tuple(adapters)

    def token_bytes(self, tokens: Sequence[int]) -> list[bytes]:
        raise EngineError("this backend shows no pieces")

    def tokenize_prompt(self, text: str) -> list[int]:
        return self.worker.tokenize(text)

    def pieces(self, tokens: Sequence[int]) -> list[str]:
        raise EngineError("this backend shows no pieces")

    def complete(self, prompt: Any, params: Any = None, cancel: threading.Event | None = None) -> Iterator[Event]:
        raise EngineError("this backend completes no raw prompt")

    def script(self, call: StreamCall) -> Iterator[Event]:
        user, params = call.user or "", call.params
        with self._guard:
            self.asked.append(user)
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            if self.failure is not None and self.fail_after is None:
                raise self.failure
            yield PrefillProgress(0, 1)
            text = ""
            words = list(reversed(user.split()))[: params.max_tokens]
            for index, word in enumerate(words):
                if self.failure is not None and index == self.fail_after:
                    raise self.failure
                time.sleep(self.delay)
                piece = word if index == 0 else f" {word}"
                text += piece
                yield Token(piece, index)
            stats = Stats(prompt_tokens=len(user.split()), completion_tokens=len(words))
            yield stats
            yield Finished("stop", stats, text)
        finally:
            with self._guard:
                self.active -= 1


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[ServerHandle, HostileBackend]]:
    backend = HostileBackend()
    handle = start_server(Paths.resolve(tmp_path / "home"), port=0, backend=backend)
    yield handle, backend
    handle.stop()


def _post(handle: ServerHandle, path: str, body: bytes | str | dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """One POST on its own connection; the answer's status and JSON body (an exception if there is none)."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    connection = http.client.HTTPConnection(handle.host, handle.port, timeout=30)
    try:
        connection.request("POST", path, data, {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def _assert_openai_error(body: dict[str, Any]) -> dict[str, Any]:
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert "\n" not in error["message"]
    return error


def _chat(content: Any, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], **extra}


# ----------------------------------------------------------------------------- nesting bombs


def _nested_arrays(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


def _nested_objects(levels: int) -> bytes:
    return b'{"a":' * levels + b"1" + b"}" * levels


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The length of every text ``json.loads`` parses (the server's and the client's), for a test to
    prove that a bomb never reached the parser."""
    lengths: list[int] = []
    real_loads = json.loads

    def recorded_loads(text: str | bytes, *args: Any, **kwargs: Any) -> Any:
        lengths.append(len(text))
        return real_loads(text, *args, **kwargs)

    monkeypatch.setattr(json, "loads", recorded_loads)
    return lengths


def _scan_lines(body: bytes) -> tuple[bool, int]:
    """``nesting_exceeds(body)`` and the Python lines it ran: its work, counted, not timed (a loop
    over the bytes in Python would run a line per byte)."""
    lines = [0]

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            lines[0] += 1
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        exceeds = nesting_exceeds(body)
    finally:
        sys.settrace(previous)
    return exceeds, lines[0]


@pytest.mark.parametrize("path", JSON_ENDPOINTS)
@pytest.mark.parametrize(
    "body",
    [
        pytest.param(_nested_arrays(100_000), id="100k-arrays"),
        pytest.param(_nested_objects(100_000), id="100k-objects"),
        pytest.param(b'{"messages": ' + _nested_arrays(100_000) + b"}", id="100k-in-a-field"),
        pytest.param(b'{"content": "' + b"[" * 1000 + b'", "x": ' + _nested_arrays(MAX_JSON_DEPTH) + b"}", id="65"),
    ],
)
def test_nesting_bombs_get_400_on_every_json_endpoint(
    server: tuple[ServerHandle, HostileBackend], parsed: list[int], path: str, body: bytes
) -> None:
    """20 requests, one each. Bound, counted rather than timed: the bomb never reaches the JSON
    parser, and the scan that refuses it runs at most 100 Python lines. Before: the server's parser
    recursed, raised RecursionError and closed the connection without an answer. The last case is
    one level past the limit, with 1,000 brackets inside a string that do not count."""
    handle, backend = server
    status, answer = _post(handle, path, body)
    assert status == 400
    error = _assert_openai_error(answer)
    assert error["message"] == f"the request body nests arrays or objects more than {MAX_JSON_DEPTH} levels deep"
    assert error["type"] == "invalid_request_error"
    assert backend.asked == [] and backend.worker.calls == []
    assert max(parsed) < len(body), "the bomb went through the JSON parser"
    exceeds, lines = _scan_lines(body)
    assert exceeds
    assert lines <= 100, f"the nesting scan ran {lines} Python lines"


def test_nesting_at_the_limit_is_served_and_a_16_mb_bomb_never_reaches_the_parser(
    server: tuple[ServerHandle, HostileBackend], parsed: list[int]
) -> None:
    """Depth 64 (objects and arrays mixed, brackets in strings) is served on two endpoints; an 8-million-level
    bomb of 16 MB, just under the body cap, is a 400 without going through the JSON parser, refused by
    a scan of at most 100 Python lines (counted, not timed)."""
    handle, backend = server
    inner = b"[" * (MAX_JSON_DEPTH - 2) + b'"]]]}}"' + b"]" * (MAX_JSON_DEPTH - 2)  # 1 + 1 + 62 levels
    body = b'{"messages": [{"role": "user", "content": "a b"}], "metadata": {"x": ' + inner + b"}}"
    status, answer = _post(handle, CHAT, body)
    assert status == 200, answer
    assert answer["choices"][0]["message"]["content"] == "b a"
    status, answer = _post(handle, "/tokenize", b'{"content": "ab", "x": ' + _nested_arrays(MAX_JSON_DEPTH - 1) + b"}")
    assert (status, answer) == (200, {"tokens": [97, 98]})

    bomb = _nested_arrays(8 * 2**20 - 8)
    assert len(bomb) < 16 * 2**20
    parsed.clear()
    status, answer = _post(handle, CHAT, bomb)
    assert status == 400
    assert "levels deep" in _assert_openai_error(answer)["message"]
    assert max(parsed) < 1000, "the bomb went through the JSON parser"
    assert backend.asked == ["a b"]
    exceeds, lines = _scan_lines(bomb)
    assert exceeds
    assert lines <= 100, f"the nesting scan ran {lines} Python lines"


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(item) for item in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(item) for item in value.values()), default=0)
    return 0


def _random_document(rng: random.Random, levels: int) -> Any:
    """A document about ``levels`` deep: one branch goes on down, its siblings are small bushes."""
    if levels <= 0 or rng.random() < 0.02:
        return rng.choice([1, 'a"[{', "\\]}", "", [], {}, None])
    children = [_random_document(rng, rng.randint(0, min(3, levels - 1))) for _ in range(rng.randint(0, 2))]
    children.insert(rng.randint(0, len(children)), _random_document(rng, levels - 1))
    if rng.random() < 0.5:
        return children
    return {f"k{i}[": child for i, child in enumerate(children)}


def test_the_nesting_scan_agrees_with_the_real_depth() -> None:
    """2,000 random documents up to 80 levels (brackets, quotes and backslashes in strings and keys),
    each checked at its own depth and around it: the scan's answer is exactly ``depth > limit``."""
    rng = random.Random(7)
    for _ in range(2000):
        document = _random_document(rng, rng.randint(1, 80))
        depth = _depth(document)
        text = json.dumps(document).encode()
        for limit in {depth - 13, depth - 12, depth - 1, depth, depth + 1} - {-13, -12, -1}:
            if limit >= 0:
                assert nesting_exceeds(text, limit) == (depth > limit), (depth, limit, text[:200])


# ----------------------------------------------------------------------------- numbers


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        pytest.param(b'{"max_tokens": 1e400, "messages": [{"role": "user", "content": "a"}]}', "too large", id="1e400"),
        pytest.param(
            b'{"temperature": -1e400, "messages": [{"role": "user", "content": "a"}]}', "too large", id="-1e400"
        ),
        pytest.param(
            b'{"max_tokens": ' + b"9" * 100_000 + b', "messages": [{"role": "user", "content": "a"}]}',
            f"longer than {MAX_NUMBER_CHARS} characters",
            id="100k-digits",
        ),
        pytest.param(
            b'{"seed": -' + b"1" * 5000 + b', "messages": [{"role": "user", "content": "a"}]}',
            "longer than",
            id="5000-digits-negative",
        ),
        pytest.param(
            b'{"top_p": 0.' + b"1" * 100_000 + b', "messages": [{"role": "user", "content": "a"}]}',
            "longer than",
            id="100k-digit-float",
        ),
        pytest.param(b'{"temperature": NaN, "messages": []}', "NaN, which is not JSON", id="NaN"),
        pytest.param(b'{"temperature": Infinity, "messages": []}', "Infinity, which is not JSON", id="Infinity"),
    ],
)
def test_huge_numbers_get_400(
    server: tuple[ServerHandle, HostileBackend], monkeypatch: pytest.MonkeyPatch, body: bytes, fragment: str
) -> None:
    """7 requests on /v1/chat/completions. Bound, counted rather than timed: no literal longer than
    MAX_NUMBER_CHARS is ever converted (``int`` of a long one costs quadratic time). Before: the
    100,000-digit integer raised ValueError (Python's 4,300-digit limit) and the connection closed
    without an answer; ``1e400`` became infinity (a temperature of infinity was served)."""
    from app.server import body as body_module

    handle, backend = server
    converted: list[int] = []  # the length of every literal the server's parser converted

    def recorded(convert: Any) -> Any:
        def conversion(text: str) -> Any:
            converted.append(len(text))
            return convert(text)

        return conversion

    monkeypatch.setattr(body_module, "int", recorded(int), raising=False)
    monkeypatch.setattr(body_module, "float", recorded(float), raising=False)
    status, answer = _post(handle, CHAT, body)
    assert status == 400
    error = _assert_openai_error(answer)
    assert fragment in error["message"]
    assert backend.asked == []
    assert max(converted, default=0) <= MAX_NUMBER_CHARS, f"a {max(converted)}-character literal was converted"


@pytest.mark.parametrize("path", ["/tokenize", "/v1/embeddings", "/v1/completions", "/v1/responses"])
def test_huge_numbers_get_400_on_the_other_endpoints(server: tuple[ServerHandle, HostileBackend], path: str) -> None:
    """2 requests: a 100,000-digit integer in a field the endpoint ignores is still refused, by the parser."""
    handle, backend = server
    status, answer = _post(handle, path, b'{"content": "a", "input": "a", "n": ' + b"7" * 100_000 + b"}")
    assert status == 400
    assert f"longer than {MAX_NUMBER_CHARS} characters" in _assert_openai_error(answer)["message"]
    assert backend.worker.calls == []


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(_nested_arrays(100_000), id="100k-arrays"),
        pytest.param(b'{"max_tokens": ' + b"7" * 100_000 + b"}", id="huge-number"),
        pytest.param(b'{"messages": [{"role": "user", "content": "\\ud800"}]}', id="lone-surrogate"),
    ],
)
def test_anthropic_messages_refuse_hostile_bodies_in_their_shape(
    server: tuple[ServerHandle, HostileBackend], body: bytes
) -> None:
    """3 requests: the same parser guards /v1/messages; the answer is Anthropic's error document."""
    handle, backend = server
    status, answer = _post(handle, "/v1/messages", body)
    assert status == 400
    assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error"
    assert answer["error"]["message"] and "\n" not in answer["error"]["message"]
    assert backend.asked == []


def test_numbers_within_the_limits_are_validated_not_refused(server: tuple[ServerHandle, HostileBackend]) -> None:
    """4 requests: a 100-character integer passes the parser, then validation has its say (a 400
    naming the field when out of range; a huge max_tokens is served, the reply ends on its own)."""
    handle, backend = server
    huge = int("9" * MAX_NUMBER_CHARS)  # a minus sign counts as one of the characters
    status, answer = _post(handle, CHAT, _chat("a", top_p=huge))
    assert status == 400
    assert _assert_openai_error(answer)["message"].startswith("top_p:")
    status, answer = _post(handle, CHAT, _chat("a b c", max_tokens=huge, seed=-(huge // 10)))
    assert status == 200, answer
    assert answer["choices"][0]["message"]["content"] == "c b a"
    status, answer = _post(handle, CHAT, _chat("a b c", max_tokens=2, temperature=1.5e-3, seed=-(2**63)))
    assert status == 200, answer
    assert answer["choices"][0]["message"]["content"] == "c b"
    status, answer = _post(handle, CHAT, b'{"messages": [{"role": "user", "content": "x"}], "top_p": 1E-2}')
    assert status == 200, answer
    assert backend.asked == ["a b c", "a b c", "x"]


# ----------------------------------------------------------------------------- lone surrogates

_LONE = "\ud800"  # json.dumps writes it as the escape \ud800, as a hostile client would


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        (CHAT, _chat(f"hello {_LONE} world"), "messages[0].content"),
        (
            CHAT,
            _chat([{"type": "text", "text": "ok"}, {"type": "text", "text": "\udfff"}]),
            "messages[0].content[1].text",
        ),
        (
            CHAT,
            {"messages": [{"role": "system", "content": "fine"}, {"role": "user", "content": "\udc00x"}]},
            "messages[1].content",
        ),
        (CHAT, _chat("a", stop=["ok", f"s{_LONE}"]), "stop[1]"),
        (CHAT, _chat("a", knowledge_base=_LONE), "knowledge_base"),
        (CHAT, {"messages": [{"role": "user", "content": "a", f"k{_LONE}": 1}]}, "messages[0] (a key)"),
        ("/tokenize", {"content": f"x{_LONE}"}, "content"),
        ("/v1/embeddings", {"input": ["fine", _LONE]}, "input[1]"),
        # An escaped backslash, the letters "ud800", then a real \udc00 escape: a lone low surrogate.
        (CHAT, b'{"messages": [{"role": "user", "content": "\\\\ud800\\udc00"}]}', "messages[0].content"),
    ],
)
def test_lone_surrogates_get_400_naming_the_field(
    server: tuple[ServerHandle, HostileBackend], path: str, body: dict[str, Any] | bytes, field: str
) -> None:
    """9 requests; each answered within the 30 s socket timeout (measured ~0.01 s). Before: chat
    answered by the fake closed the connection (UnicodeEncodeError writing the reply; the real
    model's worker answered 500 with the exception's text), /tokenize closed the connection."""
    handle, backend = server
    status, answer = _post(handle, path, body)
    assert status == 400
    error = _assert_openai_error(answer)
    assert error["param"] == field
    assert error["message"].startswith(f"{field}: holds a lone UTF-16 surrogate")
    assert error["code"] == "invalid_value"
    assert "codec" not in error["message"] and "Error" not in error["message"]
    assert backend.asked == [] and backend.worker.calls == []


def test_paired_surrogate_escapes_are_text_and_encoded_surrogates_are_not_utf8(
    server: tuple[ServerHandle, HostileBackend],
) -> None:
    """4 requests: an emoji sent as an escaped surrogate pair (Python's json.dumps does that) is served,
    and so is the text "\\ud800" (an escaped backslash, then letters); a surrogate encoded in the
    body's bytes is refused as not UTF-8 (before: the connection closed)."""
    handle, backend = server
    body = json.dumps(_chat("smile \U0001f600"))
    assert "\\ud83d\\ude00" in body
    status, answer = _post(handle, CHAT, body)
    assert status == 200, answer
    assert answer["choices"][0]["message"]["content"] == "\U0001f600 smile"
    status, answer = _post(handle, "/tokenize", json.dumps({"content": "\U0001f600"}))
    assert (status, answer) == (200, {"tokens": list("\U0001f600".encode())})
    status, answer = _post(handle, CHAT, _chat("literal \\ud800 text"))
    assert status == 200, answer
    assert answer["choices"][0]["message"]["content"] == "text \\ud800 literal"
    status, answer = _post(handle, CHAT, b'{"messages": [{"role": "user", "content": "\xed\xa0\x80"}]}')
    assert status == 400
    assert _assert_openai_error(answer)["message"] == "the request body is not UTF-8 (byte 43)"
    assert backend.asked == ["smile \U0001f600", "literal \\ud800 text"]


def test_malformed_json_says_where_not_the_parsers_words(server: tuple[ServerHandle, HostileBackend]) -> None:
    """3 requests: the answer gives the position of the fault, not the json module's message."""
    handle, _ = server
    for body, where in ((b"{not json", "line 1, column 2"), (b'{"a": 1,\n\n "b": }', "line 3, column 7")):
        status, answer = _post(handle, CHAT, body)
        assert status == 400
        assert _assert_openai_error(answer)["message"] == f"the request body is not valid JSON ({where})"
    status, answer = _post(handle, "/tokenize", b"[1, 2]")
    assert status == 400
    assert _assert_openai_error(answer)["message"] == "the request body must be a JSON object"


# ----------------------------------------------------------------------------- exception text


@pytest.mark.parametrize(
    ("failure", "status", "message"),
    [
        (
            EngineError("UnicodeEncodeError: 'utf-8' codec can't encode character '\\ud800' in position 0"),
            500,
            "the model could not answer this request; the server log says why",
        ),
        (
            EngineCrashed(-11, "generation", f"ggml.c:123 {SECRET}"),
            500,
            "the inference worker crashed; the server log says why",
        ),
        (
            ModelLoadError(f"{SECRET}/model.gguf: llama.cpp could not load it"),
            503,
            "the model is not available; the server log says why",
        ),
        (RuntimeError(f"unforeseen {SECRET}"), 500, "internal server error; the server log says why"),
    ],
    ids=["engine-error", "crash", "load-error", "unforeseen"],
)
def test_failures_answer_a_fixed_message_and_log_the_detail(
    server: tuple[ServerHandle, HostileBackend],
    caplog: pytest.LogCaptureFixture,
    failure: BaseException,
    status: int,
    message: str,
) -> None:
    """3 requests per case (chat before its first token, chat mid-stream, /tokenize). Before: the
    engine's errors answered with their text (a 500 quoting Python's UnicodeEncodeError), an
    unforeseen exception closed the connection without an answer, and /tokenize's closed it."""
    handle, backend = server
    backend.failure = failure
    backend.worker.failure = failure
    with caplog.at_level(logging.WARNING, logger="glassbox.serve"):
        got, answer = _post(handle, CHAT, _chat("a b c"))
        assert got == status
        error = _assert_openai_error(answer)
        assert error["message"] == message
        assert error["type"] == "server_error"
        answers = [json.dumps(answer)]

        backend.fail_after = 1  # after one token: the stream is on its way, so an error event ends it
        connection = http.client.HTTPConnection(handle.host, handle.port, timeout=30)
        try:
            connection.request(
                "POST", CHAT, json.dumps(_chat("a b c", stream=True)), {"Content-Type": "application/json"}
            )
            response = connection.getresponse()
            assert response.status == 200
            events = [line[6:] for line in response.read().decode().splitlines() if line.startswith("data: ")]
        finally:
            connection.close()
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["error"]["message"] == message
        assert json.loads(events[1])["choices"][0]["delta"] == {"content": "c"}

        got, answer = _post(handle, "/tokenize", {"content": "a"})
        assert got == status
        assert _assert_openai_error(answer)["message"] == message
        answers += [json.dumps(answer), *events]
    assert all(SECRET not in text and "codec" not in text for text in answers)
    detail = str(failure)  # the server log has it, once for each of the 3 requests
    assert sum(detail in record.getMessage() or record.exc_info is not None for record in caplog.records) >= 3


def test_an_unknown_knowledge_base_is_named(
    server: tuple[ServerHandle, HostileBackend],
) -> None:
    """1 request: a knowledge base that does not exist is the client's fault, and the 400 names it."""
    handle, backend = server
    status, answer = _post(handle, CHAT, _chat("a", knowledge_base=["no-such-kb"]))
    assert status == 400
    error = _assert_openai_error(answer)
    assert error["message"] == "'no-such-kb': no such knowledge base"
    assert error["param"] == "knowledge_base"
    assert backend.asked == []


# ----------------------------------------------------------------------------- a burst of streams


def test_100_concurrent_streams_against_a_slow_backend_are_all_answered(tmp_path: Path) -> None:
    """100 streaming chat requests at once against a backend that takes 0.05 s a token (6 tokens):
    each gets a complete stream (its own words back, then [DONE]) or a 503 with Retry-After and an
    OpenAI-style error, never a connection-level failure; then the server still answers. Hang guard,
    not a speed target: each request's socket waits at most 120 s for an answer (a served one
    waits behind at most MAX_QUEUED others of ~0.3 s; the whole burst takes ~10 s here), and a
    request that timed out is an outcome the test refuses."""
    backend = HostileBackend(delay=0.05)
    with start_server(Paths.resolve(tmp_path), port=0, backend=backend) as handle:
        barrier = threading.Barrier(100)

        def one(index: int) -> str:
            words = [f"w{index}-{i}" for i in range(6)]
            body = json.dumps(_chat(" ".join(words), stream=True))
            barrier.wait(30)
            connection = http.client.HTTPConnection("127.0.0.1", handle.port, timeout=120)
            try:
                connection.request("POST", CHAT, body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                data = response.read().decode()
            except (OSError, http.client.HTTPException) as exc:
                return type(exc).__name__
            finally:
                connection.close()
            if response.status == 503:
                error = json.loads(data)["error"]
                good = response.getheader("Retry-After", "").isdigit() and error["type"] == "server_error"
                return "503" if good else f"bad 503: {response.getheaders()} {data}"
            if response.status != 200:
                return f"{response.status}: {data[:200]}"
            events = [line[6:] for line in data.splitlines() if line.startswith("data: ")]
            text = "".join(
                chunk["choices"][0]["delta"].get("content", "")
                for chunk in map(json.loads, events[:-1])
                if chunk.get("choices")
            )
            return "200" if events[-1] == "[DONE]" and text == " ".join(reversed(words)) else f"bad 200: {data[-300:]}"

        with ThreadPoolExecutor(100) as pool:
            outcomes = Counter(pool.map(one, range(100)))
        assert set(outcomes) <= {"200", "503"}, outcomes  # a "TimeoutError" here is a request left hanging
        assert outcomes["200"] >= MAX_QUEUED // 2, outcomes  # requests waited in the queue, not all refused
        assert backend.max_active == 1
        status, answer = _post(handle, CHAT, _chat("after the burst"))
        assert status == 200
        assert answer["choices"][0]["message"]["content"] == "burst the after"


# ----------------------------------------------------------------------------- the real model


@pytest.mark.model
def test_real_model_refuses_lone_surrogates_and_keeps_serving(starter_model: Path, tmp_path: Path) -> None:
    """The starter model on 127.0.0.1, 4 requests, each within a 120 s socket timeout. Before:
    chat answered 500 with "UnicodeEncodeError: 'utf-8' codec can't encode character '\\ud800'...",
    and /tokenize closed the connection without an answer."""
    with start_server(Paths.resolve(tmp_path), port=0, model_path=starter_model, n_ctx=512) as handle:
        status, answer = _post(handle, CHAT, _chat(f"hi {_LONE}", max_tokens=2))
        assert status == 400
        assert _assert_openai_error(answer)["param"] == "messages[0].content"
        status, answer = _post(handle, "/tokenize", {"content": _LONE})
        assert status == 400
        assert _assert_openai_error(answer)["param"] == "content"
        status, answer = _post(handle, "/tokenize", {"content": "hello"})
        assert status == 200 and answer["tokens"] and all(isinstance(t, int) for t in answer["tokens"])
        status, answer = _post(handle, CHAT, _chat("Say hi", max_tokens=2, temperature=0))
        assert status == 200, answer
        assert answer["choices"][0]["finish_reason"] in ("stop", "length")
