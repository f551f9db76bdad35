"""Every call format through the reply shaper, whole and in pieces of every size: the thinking, the
answer and the calls come apart the same however the reply streams (the cases:
``tests/engine/call_format_cases.py`` and ``call_format_xml_cases.py``)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from engine.inference.events import CallProgress, Reasoning, Token, ToolCall
from engine.inference.reply import ReplyShaper
from engine.inference.tool_calls import FAMILIES, FORMATS
from tests.engine.call_format_cases import CASES as JSON_CASES
from tests.engine.call_format_cases import TOOLS, Case
from tests.engine.call_format_xml_cases import XML_CASES

CASES = JSON_CASES + XML_CASES


def _shape(case: Case, size: int) -> tuple[str, str, list[tuple[str, dict[str, object]]]]:
    shaper = ReplyShaper(
        family=case.family if case.tools else None,
        syntax=case.family,
        tool_names=list(TOOLS),
        schemas=TOOLS,
        think_format=case.think,
        think_started=case.started,
    )
    events = []
    for start in range(0, len(case.reply), size):
        events += shaper.on_token(Token(case.reply[start : start + size], start))
    events += shaper.finish()
    reasoning = "".join(e.text for e in events if isinstance(e, Reasoning))
    content = "".join(e.text for e in events if isinstance(e, Token))
    calls = [(e.name, e.arguments) for e in events if isinstance(e, ToolCall)]
    assert shaper.answer == content and shaper.reasoning == reasoning
    assert [(c.name, c.arguments) for c in shaper.calls] == calls
    return reasoning, content, calls


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_a_reply_comes_apart_the_same_in_pieces_of_every_size(case: Case) -> None:
    expected = (case.reasoning, case.content, case.calls)
    assert _shape(case, len(case.reply)) == expected, "whole"
    for size in range(1, len(case.reply)):
        assert _shape(case, size) == expected, f"pieces of {size}"


def test_every_format_has_cases() -> None:
    covered = {case.family for case in CASES}
    assert covered == set(FAMILIES), f"no cases for {sorted(set(FAMILIES) - covered)}"
    assert set(FORMATS) == set(FAMILIES)


def _mutations(count: int, seed: int) -> list[tuple[Case, str]]:
    """Replies of every format, damaged: spans cut, characters and the format's own markers put in."""
    rng = random.Random(seed)
    noise = [*'{}[]":,\n <>/=\\ab1', "</think>", "<think>"]
    out: list[tuple[Case, str]] = []
    for _ in range(count):
        case = rng.choice(CASES)
        fmt = FORMATS[case.family]
        markers = [m for block in fmt.blocks for m in (block.open, block.close) if m] or ["x"]
        text = case.reply
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(text) + 1)
            roll = rng.random()
            if roll < 0.35 and text:
                text = text[:at] + text[at + rng.randint(1, 6) :]
            else:
                text = text[:at] + rng.choice(noise if roll < 0.7 else markers) + text[at:]
        out.append((case, text))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_damaged_replies_never_raise_and_stream_as_they_parse_whole(seed: int) -> None:
    for case, text in _mutations(150, seed):
        damaged = dataclasses.replace(case, reply=text)
        whole = _shape(damaged, max(len(text), 1))
        for size in (1, 3):
            assert _shape(damaged, size) == whole, (case.id, text, size)


WRITTEN = [c for c in CASES if c.calls and c.tools and not c.started and "inside" not in c.id]  # not in thinking


@pytest.mark.parametrize("case", WRITTEN, ids=[c.id for c in WRITTEN])
def test_a_call_being_written_is_said_as_it_streams(case: Case) -> None:
    shaper = ReplyShaper(
        family=case.family, syntax=case.family, tool_names=list(TOOLS), schemas=TOOLS, think_format=case.think
    )
    progress = [
        e for i, ch in enumerate(case.reply) for e in shaper.on_token(Token(ch, i)) if isinstance(e, CallProgress)
    ]
    shaper.finish()
    assert progress, "no CallProgress while the call's markup streamed"
    assert [p.tokens for p in progress[:3]] == list(range(1, min(3, len(progress)) + 1))
