"""Reasoning models: thinking streamed apart, counted and timed, and never sent back as history."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import EngineError
from engine.inference.context import Message
from engine.inference.events import Finished, Reasoning, Token
from engine.inference.reasoning import ReasoningSplitter, opened_in_prompt, strip_reasoning, thinking_controls
from engine.inference.reply import THINK_END, ReplyShaper
from tests.engine import family_templates as ft
from tests.engine.scripted_worker import Script, scripted_session

THOUGHT = "The user wants 2+3. That is 5."
REPLY = f"<think>\n{THOUGHT}\n</think>\n\nIt is 5."


def _split(reply: str, size: int, started: bool = False) -> tuple[str, str]:
    splitter = ReasoningSplitter(started=started)
    pieces = []
    for start in range(0, len(reply), size):
        pieces += splitter.feed(reply[start : start + size])
    pieces += splitter.finish()
    return (
        "".join(text for kind, text in pieces if kind == "reasoning"),
        "".join(text for kind, text in pieces if kind == "text"),
    )


@pytest.mark.parametrize(
    ("reply", "started", "reasoning", "answer"),
    [
        (REPLY, False, f"\n{THOUGHT}\n", "It is 5."),
        (f"  {REPLY}", False, f"\n{THOUGHT}\n", "It is 5."),
        (f"{THOUGHT}</think>\n\nIt is 5.", True, THOUGHT, "It is 5."),  # the prompt opened <think>
        ("It is 5. <think>not thinking</think>", False, "", "It is 5. <think>not thinking</think>"),
        ("<think>cut off mid-thou", False, "cut off mid-thou", ""),
        ("<thinking is a word", False, "", "<thinking is a word"),
        ("<think></think>It is 5.", False, "", "It is 5."),
    ],
)
def test_splitter_in_pieces_of_every_size(reply: str, started: bool, reasoning: str, answer: str) -> None:
    for size in range(1, len(reply) + 1):
        assert _split(reply, size, started) == (reasoning, answer), f"pieces of {size}"


def test_shaper_counts_and_times_the_thinking() -> None:
    ticks = iter(range(100))
    shaper = ReplyShaper(clock=lambda: float(next(ticks)))
    tokens = ["<think>", "\nThe", " user", "\n</think>", "\n\n", "It", " is", " 5."]
    events = []
    for index, text in enumerate(tokens):
        events += shaper.on_token(Token(text, index))
    events += shaper.finish()
    assert "".join(e.text for e in events if isinstance(e, Reasoning)) == "\nThe user\n"
    assert "".join(e.text for e in events if isinstance(e, Token)) == "It is 5."
    assert shaper.reasoning_tokens == 4  # <think>, two words, </think>
    assert shaper.reasoning_ms == 3000.0  # from the first thinking token (t=0) to the one closing it (t=3)
    assert shaper.answer == "It is 5."


def test_strip_reasoning_from_old_history() -> None:
    assert strip_reasoning(REPLY) == "It is 5."
    assert strip_reasoning(f"{THOUGHT}</think>\n\nIt is 5.") == "It is 5."
    assert strip_reasoning("<think>never finished") == ""
    assert strip_reasoning("No thinking here.") == "No thinking here."
    assert Message("assistant", REPLY).template_dict()["content"] == "It is 5."
    assert Message("user", REPLY).template_dict()["content"] == REPLY  # a user's text is theirs


def test_prompt_and_template_detection() -> None:
    assert opened_in_prompt("<｜Assistant｜><think>\n")
    assert not opened_in_prompt("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert thinking_controls(ft.QWEN3) == frozenset({"enable_thinking"})
    assert thinking_controls("{{ reasoning_effort }}") == frozenset({"reasoning_effort"})
    assert thinking_controls(None) == frozenset()


def test_scripted_backend_thinking_is_streamed_apart_and_never_sent_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script(replies=[REPLY, "<think>\nNow 5 times 2.\n</think>\n\nThat is 10."], piece=2)
    session = scripted_session(tmp_path, monkeypatch, ft.QWEN3, script)
    events = list(session.stream([], "What is 2+3?"))
    finished = events[-1]
    assert isinstance(finished, Finished)
    assert finished.text == "It is 5." and finished.reasoning == f"\n{THOUGHT}\n"
    assert finished.reasoning_tokens > 0
    assert "".join(e.text for e in events if isinstance(e, Token)) == "It is 5."
    assert "".join(e.text for e in events if isinstance(e, Reasoning)) == f"\n{THOUGHT}\n"
    # The caller keeps the answer only; a history saved by an older version still has the raw text.
    for kept in (finished.text, REPLY):
        history = [Message("user", "What is 2+3?"), Message("assistant", kept)]
        second = list(session.stream(history, "And times 2?"))[-1]
        assert isinstance(second, Finished) and second.text == "That is 10."
        assert "<think>" not in script.prompts[-1] and THOUGHT not in script.prompts[-1]
        assert "<|im_start|>assistant\nIt is 5.<|im_end|>" in script.prompts[-1]
        script.replies.append("<think>\nNow 5 times 2.\n</think>\n\nThat is 10.")


def test_a_template_that_opens_the_thinking_in_the_prompt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = Script(replies=[f"{THOUGHT}\n</think>\n\nIt is 5."], piece=1)
    session = scripted_session(tmp_path, monkeypatch, ft.R1, script, architecture="qwen2")
    finished = list(session.stream([], "What is 2+3?"))[-1]
    assert isinstance(finished, Finished)
    assert finished.reasoning == f"{THOUGHT}\n" and finished.text == "It is 5."


def test_the_thinking_switch_reaches_the_template(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = Script(replies=["It is 5.", "It is 5."])
    session = scripted_session(tmp_path, monkeypatch, ft.QWEN3, script)
    list(session.stream([], "2+3?", thinking=False))
    assert script.prompts[-1].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    list(session.stream([], "2+3?", thinking=True))
    assert script.prompts[-1].endswith("<|im_start|>assistant\n")


def test_a_switch_the_template_lacks_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    session = scripted_session(tmp_path, monkeypatch, ft.R1, Script(), architecture="qwen2")
    with pytest.raises(EngineError, match="no thinking switch"):
        list(session.stream([], "hi", thinking=False))
    with pytest.raises(EngineError, match="no reasoning_effort switch"):
        list(session.stream([], "hi", reasoning_effort="low"))


def test_a_thinking_budget_closes_the_thinking_and_the_reply_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    endless = "<think>\n" + "hmm " * 200
    script = Script(replies=[endless, "It is 5."], piece=1)
    session = scripted_session(tmp_path, monkeypatch, ft.QWEN3, script)
    events = list(session.stream([], "What is 2+3?", thinking_budget=12))
    finished = events[-1]
    assert isinstance(finished, Finished)
    assert finished.text == "It is 5."
    assert finished.reasoning.startswith("\nhmm") and len(finished.reasoning) < 20
    assert 12 <= finished.reasoning_tokens <= 14  # the budget, and the tag that closed it
    first, second = script.prompts
    thought = second[len(first) : -len(THINK_END)]
    assert second == first + thought + THINK_END and thought.startswith("<think>\nhmm")  # went on from there
    assert finished.stats.completion_tokens == len(thought) + len("It is 5.")
    assert "".join(e.text for e in events if isinstance(e, Token)) == "It is 5."


def test_a_reply_within_its_thinking_budget_is_one_generation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = Script(replies=[REPLY], piece=4)
    session = scripted_session(tmp_path, monkeypatch, ft.QWEN3, script)
    finished = list(session.stream([], "What is 2+3?", thinking_budget=1000))[-1]
    assert isinstance(finished, Finished) and finished.text == "It is 5." and len(script.prompts) == 1
    with pytest.raises(EngineError, match="thinking budget"):
        list(session.stream([], "hi", thinking_budget=-1))
