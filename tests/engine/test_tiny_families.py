"""A whole tool turn per model family, end to end, on tiny random-weight models of the real
architectures with their published templates (tests/engine/tiny_arch.py).

Each family's turn runs through the real engine: a ChatSession (the worker process, llama.cpp),
and for the first of the two tests the agent loop (engine/agent/loop.py). The model's own template
renders the prompt; each of the template's control tokens in it is one token. First a call
constrained by a JSON-schema grammar (a named function or ``required``) is parsed, checked and
run, its result goes back as a ``tool`` message, and the next prompt renders the call and the
result the family's way and is generated. Then the model writes a call in the family's own format
under ``auto``, with the template's control tokens as single tokens, and the parser chosen from
the template must find it. The models' answers are noise; the mechanics are exact.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from engine.agent.loop import Agent, ToolStep
from engine.inference.context import Message
from engine.inference.events import Finished, Token, ToolCall
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
        call: a call as the family writes it (``{city}`` for the city): the JSON object of the
            fallback prompt unless the family has its own format.
    """

    family: str
    choice: str
    markers: tuple[str, ...]
    native: bool = True
    call: str = '{"name": "get_weather", "arguments": {"city": "{city}", "unit": "celsius"}}'


_JSON_CITY = '"city": "{city}"'
_HERMES = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "{city}", "unit": "celsius"}}\n</tool_call>'
CASES = [
    Case(
        "qwen2.5",
        "get_weather",
        ("<tool_call>", _JSON_CITY, "</tool_call><|im_end|>", "<tool_response>", RESULT),
        call=_HERMES,
    ),
    Case(
        "qwen3",
        "required",
        ("<tool_call>", _JSON_CITY, "</tool_call><|im_end|>", "<tool_response>", RESULT),
        call=_HERMES,
    ),
    Case(
        "qwen3.5",
        "get_weather",
        ("<tool_call>\n<function=get_weather>", "<parameter=city>\n{city}\n</parameter>", "<tool_response>", RESULT),
        call="<tool_call>\n<function=get_weather>\n<parameter=city>\n{city}\n</parameter>\n"
        "<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>",
    ),
    Case(
        "llama3",
        "get_weather",
        (_JSON_CITY, "<|start_header_id|>ipython<|end_header_id|>", RESULT, "<|eot_id|>"),
        call='{"name": "get_weather", "parameters": {"city": "{city}", "unit": "celsius"}}',
    ),
    Case(
        "mistral-nemo",
        "required",
        ("[TOOL_CALLS]", _JSON_CITY, "[TOOL_RESULTS]", RESULT, "[/TOOL_RESULTS]"),
        call='[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "{city}", "unit": "celsius"}, '
        '"id": "a1b2c3d4e"}]',
    ),
    Case(
        "gpt-oss",
        "get_weather",
        ("to=functions.get_weather", _JSON_CITY, "<|call|>", "<|start|>functions.get_weather", RESULT),
        call="<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"city": "{city}", "unit": "celsius"}',
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
        call='<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="city" string="true">{city}</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="unit" string="true">celsius</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜function_calls>",
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
    Case(
        "gemma4",
        "get_weather",
        (
            "<|tool_call>call:get_weather{",
            'city:<|"|>{city}<|"|>',
            "<tool_call|><|tool_response>response:get_weather{",
            RESULT,
            "<tool_response|>",
        ),
        call='<|tool_call>call:get_weather{city:<|"|>{city}<|"|>,unit:<|"|>celsius<|"|>}<tool_call|>',
    ),
    Case("mamba", "get_weather", ("<tool_call>", _JSON_CITY, "<tool_response>", RESULT), call=_HERMES),
    Case("granite4-hybrid", "required", ("<tool_call>", _JSON_CITY, "<tool_response>", RESULT), call=_HERMES),
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


@pytest.fixture(scope="class", params=CASES, ids=[c.family for c in CASES])
def case(request: pytest.FixtureRequest) -> Case:
    """One family; the class's tests run family by family, so each family's worker starts once."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(scope="class")
def session(case: Case, tiny_model: Callable[[str], Path]) -> Iterator[ChatSession]:
    """The family's tiny model in a worker process."""
    with ChatSession(LoadParams(model_path=tiny_model(case.family), n_ctx=2048, n_threads=2, n_batch=256)) as chat:
        chat.load()
        yield chat


class TestFamily:
    """A tool turn of each family, the forced call through the agent loop and the family's own."""

    def test_a_tool_turn_runs_end_to_end(self, session: ChatSession, llama_cpp_source: Path, case: Case) -> None:
        _forced_call_turn(session, llama_cpp_source, case)

    def test_the_familys_own_call_is_parsed_from_the_models_tokens(self, session: ChatSession, case: Case) -> None:
        _own_call_turn(session, case)


def _forced_call_turn(session: ChatSession, llama_cpp_source: Path, case: Case) -> None:
    """The first generation constrained to a call (a named function or ``required``) under the
    agent loop: the call parsed, checked and run, the next prompt rendered and generated."""
    family = FAMILIES[case.family]
    published = (llama_cpp_source / "models" / "templates" / family.template).read_text(encoding="utf-8")
    tool = _Weather()
    prompts: list[list[int]] = []
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


def _literal(text: str) -> str:
    """A GBNF grammar whose only sentence is ``text``."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'root ::= "{escaped}"'


def _own_call_turn(session: ChatSession, case: Case) -> None:
    """The model writes a call in its family's own format under ``auto`` (a grammar spells it out;
    a bias on the template's control tokens makes the sampler pick them as the single tokens a
    trained model writes, which reach the parser as markers): the reply's parser chosen from the
    template finds the call, none of its markup reaches the answer, and the result goes into the
    next prompt."""
    family = FAMILIES[case.family]
    call = case.call.replace("{city}", "Lyon")
    assert session.template is not None and session.worker is not None
    off = {"thinking": False} if "enable_thinking" in session.template.thinking else {}
    controls = {
        session.worker.tokenize(t, add_bos=False, special=True)[0]: t for t in family.tokens_in_template if t in call
    }
    params = GenerationParams(
        max_tokens=160,
        temperature=0.0,
        grammar=_literal(call),
        logit_bias=tuple((token, 30.0) for token in controls),
    )
    sampled: list[int] = []
    generate = session.worker.generate

    def recording(*args: Any, **kwargs: Any) -> Any:
        inner = generate(*args, **kwargs)
        while True:
            try:
                event = next(inner)
            except StopIteration as done:
                return done.value
            if isinstance(event, Token):
                sampled.append(event.token_id)
            yield event

    session.worker.generate = recording  # type: ignore[method-assign]
    events = list(session.stream([], QUESTION, params, tools=[WEATHER], tool_choice="auto", **off))
    session.worker.generate = generate  # type: ignore[method-assign]
    # The control tokens were written as such, one token each (the first of the reply, where
    # the call starts with one; later ones as the tokens before them allow).
    assert {controls[t] for t in sampled if t in controls} <= set(controls.values())
    first = [token for token, text in controls.items() if call.startswith(text)]
    assert sampled[:1] == first[:1] or not first, (sampled[:3], controls)
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.reason == "stop", finished
    assert [(c.name, c.arguments) for c in finished.tool_calls] == [
        ("get_weather", {"city": "Lyon", "unit": "celsius"})
    ]
    assert [e for e in events if isinstance(e, ToolCall)] == list(finished.tool_calls)
    assert finished.text.strip() == "", f"call markup shown as the answer: {finished.text!r}"
    [parsed] = finished.tool_calls
    history = [
        Message("user", QUESTION),
        Message("assistant", finished.text, tool_calls=(parsed,)),
        Message("tool", RESULT, tool_call_id=parsed.id, name="get_weather"),
    ]
    again = list(session.stream(history, None, GenerationParams(max_tokens=8, temperature=0.0), tools=[WEATHER], **off))
    assert isinstance(again[-1], Finished) and again[-1].stats.completion_tokens > 0
    assert "".join(session.pieces(session.last_prompt)).count(RESULT) == 1
