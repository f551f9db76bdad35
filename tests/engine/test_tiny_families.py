"""A whole tool turn per model family, end to end, on tiny random-weight models of the real
architectures with their published templates (tests/engine/tiny_arch.py).

Each family's turn runs through the real engine: a ChatSession (the worker process, llama.cpp)
under the agent loop (engine/agent/loop.py). The model's own template renders the prompt; each of
the template's control tokens in it is one token; the first generation is constrained to a call
of the offered tool (a named function or ``required``: a JSON-schema grammar); the call is parsed,
checked and run; its result goes back as a ``tool`` message; the next prompt renders the call and
the result the family's way, and is generated. The models' answers are noise; the mechanics are
exact.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from engine.agent.loop import Agent, ToolStep
from engine.inference.context import Message
from engine.inference.events import Finished
from engine.inference.runtime import GenerationParams, LoadParams
from engine.inference.session import ChatSession
from engine.inference.tools import ToolResult, ToolSpec
from tests.engine.tiny_arch import FAMILIES

pytestmark = pytest.mark.model

WEATHER = ToolSpec(
    "get_weather",
    "The current weather in a city.",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "enum": ["Paris", "Lyon", "Nice"]},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
)
RESULT = "sunny, 21 degrees"
QUESTION = "What is the weather in Paris?"


@dataclass(frozen=True)
class Case:
    """What one family's turn must show.

    Attributes:
        family: the tiny model (tests/engine/tiny_arch.py).
        choice: the tool choice of the first generation (a function name or ``required``).
        markers: text the second prompt must hold around the call and its result, in order (the
            family's own markup for them; ``{city}`` is the argument the call was given).
        native: the template renders tools itself (else Glassbox's fallback tool prompt does).
    """

    family: str
    choice: str
    markers: tuple[str, ...]
    native: bool = True


_JSON_CITY = '"city": "{city}"'
CASES = [
    Case("qwen2.5", "get_weather", ("<tool_call>", _JSON_CITY, "</tool_call><|im_end|>", "<tool_response>", RESULT)),
    Case("qwen3", "required", ("<tool_call>", _JSON_CITY, "</tool_call><|im_end|>", "<tool_response>", RESULT)),
    Case(
        "qwen3.5",
        "get_weather",
        ("<tool_call>\n<function=get_weather>", "<parameter=city>\n{city}\n</parameter>", "<tool_response>", RESULT),
    ),
    Case("llama3", "get_weather", (_JSON_CITY, "<|start_header_id|>ipython<|end_header_id|>", RESULT, "<|eot_id|>")),
    Case("mistral-nemo", "required", ("[TOOL_CALLS]", _JSON_CITY, "[TOOL_RESULTS]", RESULT, "[/TOOL_RESULTS]")),
    Case(
        "gpt-oss",
        "get_weather",
        ("to=functions.get_weather", _JSON_CITY, "<|call|>", "<|start|>functions.get_weather", RESULT),
    ),
    Case(
        "deepseek-v3.2",
        "required",
        (
            '<｜DSML｜invoke name="get_weather">',
            'name="city" string="true">{city}<',
            "</｜DSML｜function_calls>",
            "<function_results>",
            RESULT,
        ),
    ),
    # R1-Distill's and V3.1's published templates render earlier calls but never the tool list: the
    # fallback tool prompt offers the tools, the call is JSON and its result a user turn.
    Case(
        "deepseek-r1-distill-qwen",
        "get_weather",
        ("<｜Assistant｜>", _JSON_CITY, "<｜end▁of▁sentence｜><｜User｜>[tool result] get_weather", RESULT),
        native=False,
    ),
    Case(
        "deepseek-v3",
        "required",
        ("<｜Assistant｜><think></think>", _JSON_CITY, "<｜User｜>[tool result] get_weather", RESULT),
        native=False,
    ),
    Case("gemma3", "required", ("<start_of_turn>", _JSON_CITY, RESULT, "<end_of_turn>"), native=False),
    Case("mamba", "get_weather", ("<tool_call>", _JSON_CITY, "<tool_response>", RESULT)),
    Case("granite4-hybrid", "required", ("<tool_call>", _JSON_CITY, "<tool_response>", RESULT)),
]


@dataclass
class _Weather:
    """The tool: answers every call with :data:`RESULT` and records it."""

    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def tools(self) -> list[ToolSpec]:
        return [WEATHER]

    def call(
        self, name: str, arguments: dict[str, Any], *, timeout_s: float, cancel: threading.Event | None = None
    ) -> ToolResult:
        self.calls.append((name, arguments))
        return ToolResult(RESULT)

    def close(self) -> None:
        pass


def _one_token_each(session: ChatSession, tokens: list[int], specials: tuple[str, ...]) -> int:
    """Asserts that every occurrence of each of ``specials`` in the prompt is one token of its own;
    returns how many occurrences there were."""
    assert session.worker is not None
    text = "".join(session.pieces(tokens))
    seen = 0
    for special in specials:
        [token_id] = session.worker.tokenize(special, add_bos=False, special=True)
        in_text = text.count(special)
        as_token = tokens.count(token_id)
        assert as_token == in_text, f"{special!r}: {in_text} in the prompt, {as_token} of them as one token"
        seen += in_text
    return seen


@pytest.mark.parametrize("case", CASES, ids=[c.family for c in CASES])
def test_a_tool_turn_runs_end_to_end(tiny_model: Callable[[str], Path], llama_cpp_source: Path, case: Case) -> None:
    family = FAMILIES[case.family]
    model = tiny_model(case.family)
    published = (llama_cpp_source / "models" / "templates" / family.template).read_text(encoding="utf-8")
    tool = _Weather()
    prompts: list[list[int]] = []
    with ChatSession(LoadParams(model_path=model, n_ctx=2048, n_threads=2, n_batch=256)) as session:
        info = session.load()
        # The model's own template, the published one, rendered in the sandbox: no fallback.
        assert info.chat_template == published
        assert session.template is not None and session.template.source == "gguf", session.template
        assert session.template.supports_tools == case.native

        def on_step(message: Message, step: ToolStep | None) -> None:
            if message.role == "assistant":
                prompts.append(list(session.last_prompt))

        agent = Agent(session, [tool], allow={"get_weather"}, on_step=on_step, max_steps=2)
        params = GenerationParams(max_tokens=80, temperature=0.0)
        run = agent.run([], QUESTION, params, tool_choice=case.choice)
        events = list(run)
        result = run.result

        # The forced call: parsed, valid for the tool's schema, run once with those arguments.
        [step] = result.steps
        assert step.call.name == "get_weather" and step.approval == "allow-listed", step
        jsonschema.validate(step.call.arguments, WEATHER.parameters)
        assert tool.calls == [("get_weather", step.call.arguments)]
        assert result.messages[0].role == "assistant" and result.messages[0].tool_calls == (step.call,)
        assert result.messages[1].role == "tool" and result.messages[1].content == RESULT
        # The next generation read the call and its result, rendered the family's way, and ran.
        finished = [e for e in events if isinstance(e, Finished)]
        assert len(finished) >= 2 and result.finished is finished[-1]
        assert result.finished.reason in ("stop", "length") and result.finished.stats.completion_tokens > 0
        first, second = prompts[0], session.last_prompt
        assert second[: len(first) // 2] == first[: len(first) // 2]  # the same conversation, continued
        second_text = "".join(session.pieces(second))
        assert "get_weather" in "".join(session.pieces(first))  # the tool was offered
        assert second_text.count(RESULT) == 1
        at = 0
        for marker in (m.replace("{city}", str(step.call.arguments["city"])) for m in case.markers):
            found = second_text.find(marker, at)
            assert found >= 0, f"{marker!r} missing after position {at} of the second prompt:\n{second_text}"
            at = found + len(marker)
        # Every control token of the template is one token wherever the prompts hold it.
        specials = family.tokens_in_template
        assert _one_token_each(session, first, specials) > 0
        assert _one_token_each(session, second, specials) > 0
