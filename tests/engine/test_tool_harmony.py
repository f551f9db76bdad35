"""gpt-oss's harmony format: channels split into thinking, answer and calls, as they stream."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.inference.events import Finished, Reasoning, Token, ToolCall
from engine.inference.harmony import MARKERS, HarmonyPiece, HarmonySplitter
from engine.inference.templates import select_template
from engine.inference.tool_calls import ParsedCall
from tests.engine import family_templates as ft
from tests.engine.scripted_worker import Script, scripted_session
from tests.engine.test_agent import ADD

CALL = (
    "<|channel|>analysis<|message|>They want a sum. I will call add.<|end|>"
    '<|start|>assistant<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 2, "b": 3}<|call|>'
)
ANSWER = (
    "<|channel|>analysis<|message|>Simple: 5.<|end|><|start|>assistant<|channel|>final<|message|>It is 5.<|return|>"
)

RECORDED: list[tuple[str, bool, str, str, list[tuple[str, dict[str, object]]]]] = [
    (CALL, True, "They want a sum. I will call add.", "", [("add", {"a": 2, "b": 3})]),
    (ANSWER, True, "Simple: 5.", "It is 5.", []),
    ("It is 5, plainly.", True, "", "It is 5, plainly.", []),  # not harmony at all
    (
        "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant to=functions.add"
        '<|channel|>commentary json<|message|>{"a": 1, "b": 1}<|call|>',
        True,
        "",
        "Let me check.",
        [("add", {"a": 1, "b": 1})],
    ),
    ("<|channel|>commentary to=functions.add <|constrain|>json<|message|>{broken<|call|>", True, "", "{broken", []),
    # no tools offered: a call is shown as text
    ('<|channel|>commentary to=functions.add<|message|>{"a": 1}<|call|>', False, "", '{"a": 1}', []),
    ("<|channel|>analysis<|message|>cut off mid-thou", True, "cut off mid-thou", "", []),
]


def _split(reply: str, size: int, tools: bool) -> list[HarmonyPiece]:
    splitter = HarmonySplitter(tools_offered=tools)
    pieces: list[HarmonyPiece] = []
    for start in range(0, len(reply), size):
        pieces += splitter.feed(reply[start : start + size])
    return pieces + splitter.finish()


@pytest.mark.parametrize(("reply", "tools", "reasoning", "text", "calls"), RECORDED)
def test_recorded_replies_in_pieces_of_every_size(
    reply: str, tools: bool, reasoning: str, text: str, calls: list[tuple[str, dict[str, object]]]
) -> None:
    for size in range(1, len(reply) + 1):
        pieces = _split(reply, size, tools)
        got = (
            "".join(p[1] for p in pieces if isinstance(p, tuple) and p[0] == "reasoning"),
            "".join(p[1] for p in pieces if isinstance(p, tuple) and p[0] == "text"),
            [(p.name, p.arguments) for p in pieces if isinstance(p, ParsedCall)],
        )
        assert got == (reasoning, text, calls), f"pieces of {size}"


def test_thinking_streams_before_its_message_ends() -> None:
    splitter = HarmonySplitter()
    assert splitter.feed("<|channel|>analysis<|message|>Thinking about") == [("reasoning", "Thinking about")]
    assert splitter.in_reasoning
    assert splitter.feed(" it<|en") == [("reasoning", " it")]
    assert splitter.feed("d|>") == [] and not splitter.in_reasoning


def test_a_harmony_template_is_recognised_with_its_effort_switch() -> None:
    template = select_template(ft.HARMONY, "gpt-oss", "<|startoftext|>", "<|return|>")
    assert template.source == "gguf" and template.harmony and template.supports_tools
    assert template.thinking == frozenset({"reasoning_effort"})
    prompt = template.render([{"role": "user", "content": "hi"}], tools=[ADD], reasoning_effort="high")
    assert "Reasoning: high" in prompt and "type add = (_: {" in prompt and prompt.endswith("<|start|>assistant")


def test_through_the_session_with_markers_as_control_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    control = {marker: 200 + index for index, marker in enumerate(MARKERS)}
    script = Script(replies=[CALL, ANSWER], piece=3, control=control)
    session = scripted_session(tmp_path, monkeypatch, ft.HARMONY, script, architecture="gpt-oss")
    events = list(session.stream([], "What is 2+3?", tools=[ADD], reasoning_effort="low"))
    finished = events[-1]
    assert isinstance(finished, Finished)
    assert [(c.name, c.arguments) for c in finished.tool_calls] == [("add", {"a": 2, "b": 3})]
    assert finished.reasoning == "They want a sum. I will call add." and finished.reasoning_tokens > 0
    assert "".join(e.text for e in events if isinstance(e, Reasoning)) == finished.reasoning
    assert [e for e in events if isinstance(e, Token) and e.text] == []
    assert "Reasoning: low" in script.prompts[0]
    [call] = [e for e in events if isinstance(e, ToolCall)]
    from engine.inference.context import Message

    history = [
        Message("user", "What is 2+3?"),
        Message("assistant", "", tool_calls=(call,)),
        Message("tool", "5", tool_call_id=call.id, name="add"),
    ]
    second = list(session.stream(history, None, tools=[ADD]))[-1]
    assert isinstance(second, Finished) and second.text == "It is 5." and second.reasoning == "Simple: 5."
    assert script.prompts[1].endswith(
        '<|start|>functions.add to=assistant<|channel|>commentary<|message|>"5"<|end|><|start|>assistant'
    )
    assert "They want a sum" not in script.prompts[1]  # old thinking is never sent back


def test_harmony_markers_stay_silent_for_other_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    control = {marker: 200 + index for index, marker in enumerate(MARKERS)}
    script = Script(replies=["It is<|end|> 5."], piece=2, control=control)
    session = scripted_session(tmp_path, monkeypatch, ft.QWEN3, script)
    finished = list(session.stream([], "2+3?"))[-1]
    assert isinstance(finished, Finished) and finished.text == "It is 5."
