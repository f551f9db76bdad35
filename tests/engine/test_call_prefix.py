"""A reply that starts like a bare tool call streams as text as soon as it cannot be one, and the
tokens held meanwhile are reported (issue 28, major 3: ``{"name": "add", "arguments": {...}},
"required": …`` was held back for its whole length, 75 s, under a stale status).

The parser side is :class:`engine.inference.call_prefix.BareCallPrefix` in the tool-call parser's
bare state; the shaper reports each held token as ``CallProgress``; the remote backend reports a
server's streamed ``tool_calls`` deltas the same way.
"""

from __future__ import annotations

import json
import random

import pytest

from engine.inference.call_prefix import BareCallPrefix
from engine.inference.events import CallProgress, Reasoning, Token, ToolCall
from engine.inference.reply import ReplyShaper
from engine.inference.tool_calls import ParsedCall, ToolCallParser, parse_tool_calls

TRIAL = '{"name": "add", "arguments": {"a": 2, "b": 3}}, "required": ["a", "b"], "properties": {}'
"""What the starter wrote in the trial: a call, then the rest of the tool's schema."""

CALLS = [
    '{"name": "add", "arguments": {"a": 2, "b": 3}}',
    '  {"name":"add","arguments":{}}\n',
    '{"name": "add", "parameters": {"x": -1.5e3, "y": true, "z": null, "w": [1, 2, {"k": false}]}}',
    '{"name": "add", "arguments": {"s": "a\\"b\\\\ \\u00e9 }{ ][", "t": "\\n"}}',
    '[{"name": "add", "arguments": {}}, {"name": "now", "arguments": {"tz": "UTC"}}]',
    '{"tool_calls": [{"function": {"name": "add", "arguments": "{\\"a\\": 1}"}}]}',
    '{"name": "add", "arguments": {}}; {"name": "now", "arguments": {}}',
    '```json\n{"name": "add", "arguments": {"a": 1}}\n```',
    '```\n{"name": "now", "arguments": {}}\n```\n',
]
NOT_CALLS = [
    (TRIAL, '{"name": "add", "arguments": {"a": 2, "b": 3}}, "'),
    ('{"answer": 42} and that is all', '{"answer": 42}'),
    ('{"name": add}', '{"name": a'),
    ('{"name": "add", "arguments": {"a": 01}}', '{"name": "add", "arguments": {"a": 01}'),
    ('{"name": "add",}', '{"name": "add",}'),
    ("[1, 2, 3]", "[1, 2, 3]"),
    ('{"name": "add", "arguments": {}} Done.', '{"name": "add", "arguments": {}} D'),
    ('```json\n{"name": "add", "arguments": {}}\n``` then text', '```json\n{"name": "add", "arguments": {}}\n``` t'),
    ('{"name": "not_offered", "arguments": {}}', '{"name": "not_offered", "arguments": {}}'),
    ('{"name": "add", "arguments": {"a": tru}}', '{"name": "add", "arguments": {"a": tru}'),
    ('{"a" 1}', '{"a" 1'),
]
NAMES = ("add", "now")


def feed_all(parser: ToolCallParser, text: str, size: int) -> list[tuple[int, object]]:
    """Feeds ``text`` in pieces of ``size``; returns (characters fed so far, piece) for each piece out."""
    out: list[tuple[int, object]] = []
    for at in range(0, len(text), size):
        for piece in parser.feed(text[at : at + size]):
            out.append((min(at + size, len(text)), piece))
    for piece in parser.finish():
        out.append((len(text) + 1, piece))
    return out


# ---------------------------------------------------------------------------- the parser
@pytest.mark.parametrize(("text", "released_at"), NOT_CALLS)
@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_a_reply_that_cannot_be_a_call_streams_as_text_from_there(text: str, released_at: str, size: int) -> None:
    parser = ToolCallParser("json", NAMES)
    out = feed_all(parser, text, size)
    assert "".join(str(p) for _, p in out) == text  # nothing lost, nothing taken for a call
    assert all(isinstance(p, str) for _, p in out)
    first = out[0][0]
    # Released with the piece that showed it is no call, not at the end of the reply.
    assert first <= len(released_at) + size - 1, (first, released_at)
    assert first <= len(text)


@pytest.mark.parametrize("text", CALLS)
@pytest.mark.parametrize("size", [1, 2, 5, 1000])
def test_a_call_is_held_to_its_end_and_parsed_as_before(text: str, size: int) -> None:
    parser = ToolCallParser("json", NAMES)
    out = feed_all(parser, text, size)
    assert all(at == len(text) + 1 for at, _ in out), out  # nothing before the end
    calls = [p for _, p in out if isinstance(p, ParsedCall)]
    assert calls and calls == parse_tool_calls(text, "json", NAMES)[1]


def test_a_python_style_call_list_is_held_to_its_end() -> None:
    text = '[get_weather(city="Paris"), now()]'
    parser = ToolCallParser("llama3")
    out = feed_all(parser, text, 1)
    assert [p.name for _, p in out if isinstance(p, ParsedCall)] == ["get_weather", "now"]


def test_no_prefix_of_a_call_is_ever_released() -> None:
    for text in CALLS:
        for end in range(len(text) + 1):
            prefix = BareCallPrefix(lambda value: bool(parse_tool_calls(value, "json", NAMES)[1]))
            assert prefix.feed(text[:end]), text[:end]


def test_what_is_released_early_would_never_have_been_a_call() -> None:
    """Random edits of calls and non-calls: whenever the prefix gives up, the whole text parses to
    no call (the parser never streams a call's markup as text)."""
    rng = random.Random(28)
    alphabet = '{}[]":,; \n0123456789-.eE+truefalsnl\\abc`'
    released = 0
    for _ in range(3000):
        base = rng.choice(CALLS + [text for text, _ in NOT_CALLS])
        chars = list(base)
        for _ in range(rng.randint(0, 3)):
            at = rng.randrange(len(chars) + 1)
            if chars and rng.random() < 0.5:
                del chars[min(at, len(chars) - 1)]
            else:
                chars.insert(at, rng.choice(alphabet))
        text = "".join(chars)
        prefix = BareCallPrefix(lambda value: bool(parse_tool_calls(value, "json", NAMES)[1]))
        if not text.lstrip() or text.lstrip()[0] not in "{[`":
            continue
        if not prefix.feed(text):
            released += 1
            assert parse_tool_calls(text, "json", NAMES)[1] == [], text
    assert released > 500  # the edits did exercise the early release


def test_the_prefix_reads_each_character_once() -> None:
    """A long held reply costs one pass, not one pass per token."""
    seen: list[str] = []
    prefix = BareCallPrefix(lambda value: seen.append(value) is None)
    value = json.dumps({"name": "add", "arguments": {"text": "x" * 50_000}})
    for at in range(0, len(value), 3):
        prefix.feed(value[at : at + 3])
    assert prefix.possible and seen == [value]  # the one finished value, checked once


# ---------------------------------------------------------------------------- the shaper's CallProgress
def shaped(shaper: ReplyShaper, pieces: list[str]) -> list[object]:
    events: list[object] = []
    for i, piece in enumerate(pieces):
        events += shaper.on_token(Token(piece, i))
    return events + shaper.finish()


def test_each_token_of_a_call_being_written_is_reported() -> None:
    pieces = ["<tool_call>", '\n{"name": ', '"add", ', '"arguments": {}}', "\n</tool_call>"]
    events = shaped(ReplyShaper(family="hermes", tool_names=["add"]), pieces)
    progress = [e.tokens for e in events if isinstance(e, CallProgress)]
    assert progress == [1, 2, 3, 4]  # the closing token emits the call itself
    assert [e.name for e in events if isinstance(e, ToolCall)] == ["add"]
    assert not [e for e in events if isinstance(e, Token)]


def test_a_held_reply_that_is_no_call_is_reported_then_streams() -> None:
    pieces = ['{"name": "add", ', '"arguments": {"a": 2}}', ', "required"', ': ["a"]', " and more"]
    events = shaped(ReplyShaper(family="json", tool_names=["add"]), pieces)
    assert [type(e).__name__ for e in events] == ["CallProgress", "CallProgress", "Token", "Token", "Token"]
    assert "".join(e.text for e in events if isinstance(e, Token)) == "".join(pieces)


def test_plain_text_and_thinking_report_no_call() -> None:
    events = shaped(ReplyShaper(family="hermes", tool_names=["add"]), ["<think>", "hm", "</think>", "Hello", " there"])
    assert not [e for e in events if isinstance(e, CallProgress)]
    assert [e for e in events if isinstance(e, Reasoning)]


# ---------------------------------------------------------------------------- a remote server's calls
def test_a_servers_streamed_call_deltas_are_reported() -> None:
    from engine.inference.remote_stream import StreamedReply, apply_chunk, tool_calls

    reply = StreamedReply()
    chunks = [
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "add"}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"a": '}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]
    events = [e for chunk in chunks for e in apply_chunk(json.dumps(chunk), reply, "http://server")]
    assert [e.tokens for e in events if isinstance(e, CallProgress)] == [1, 2, 3]
    (call,) = tool_calls(reply, "http://server")
    assert call.name == "add" and call.arguments == {"a": 1}


def test_a_servers_reasoning_content_is_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The thinking fold says how long a remote model thought (issue 28: it showed tokens, no time)."""
    from engine.inference import remote_stream
    from engine.inference.remote_stream import StreamedReply, apply_chunk

    clock = iter([10.0, 10.5, 12.0, 12.25, 13.0])
    monkeypatch.setattr(remote_stream.time, "perf_counter", lambda: next(clock))
    reply = StreamedReply()
    for delta in ({"reasoning_content": "Let me"}, {"reasoning_content": " think."}, {"content": "Four."}):
        apply_chunk(json.dumps({"choices": [{"index": 0, "delta": delta}]}), reply, "http://server")
    assert reply.reasoning_ms == 2000.0  # from the first thought (10.0) to the answer (12.0)
    assert StreamedReply().reasoning_ms == 0.0
