"""Grammar-constrained calls with the starter model (a base model): the arguments validate every time."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

from engine.agent.loop import Agent
from engine.inference.events import Finished
from engine.inference.runtime import GenerationParams, LoadParams
from engine.inference.session import ChatSession
from engine.inference.tools import ToolResult, ToolSpec
from tests.engine.test_agent import FakeProvider

WEATHER = ToolSpec(
    "get_weather",
    "The current weather in a city.",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 40},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer"},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
)
CONVERT = ToolSpec(
    "convert",
    "Converts an amount between currencies.",
    {
        "type": "object",
        "properties": {"amount": {"type": "number"}, "to": {"type": "string", "enum": ["EUR", "USD"]}},
        "required": ["amount", "to"],
    },
)
TOOLS = {tool.name: tool for tool in (WEATHER, CONVERT)}

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def session(starter_model: Path) -> Iterator[ChatSession]:
    with ChatSession(LoadParams(model_path=starter_model, n_ctx=2048, n_threads=2)) as chat:
        chat.load()
        yield chat


def _call(session: ChatSession, choice: str, seed: int) -> Finished:
    params = GenerationParams(max_tokens=60, temperature=1.0, seed=seed)
    finished = list(
        session.stream(
            [], "What's the weather like in Paris today?", params, tools=[WEATHER, CONVERT], tool_choice=choice
        )
    )[-1]
    assert isinstance(finished, Finished)
    return finished


@pytest.mark.parametrize("seed", [1, 2])
def test_named_choice_yields_a_valid_call_every_time(session: ChatSession, seed: int) -> None:
    finished = _call(session, "get_weather", seed)
    assert finished.reason == "stop", finished
    [call] = finished.tool_calls
    assert call.name == "get_weather"
    jsonschema.validate(call.arguments, WEATHER.parameters)
    assert finished.stats.budget["tools"] > 50


@pytest.mark.parametrize("seed", [3, 4])
def test_required_choice_yields_a_valid_call_to_one_of_the_tools(session: ChatSession, seed: int) -> None:
    finished = _call(session, "required", seed)
    [call] = finished.tool_calls
    jsonschema.validate(call.arguments, TOOLS[call.name].parameters)


def test_agent_runs_the_call_and_its_result_reaches_the_prompt(session: ChatSession) -> None:
    class Weather(FakeProvider):
        def call(self, name: str, arguments: dict[str, object], **kwargs: object) -> ToolResult:
            self.calls.append((name, arguments))
            return ToolResult("Paris: 21 degrees, sunny (tool 7731)")

    provider = Weather([WEATHER])
    agent = Agent(session, [provider], allow={"get_weather"})
    run = agent.run(
        [],
        "What's the weather like in Paris today?",
        GenerationParams(max_tokens=80, temperature=0),
        tool_choice="get_weather",
    )
    list(run)
    assert len(provider.calls) >= 1 and provider.calls[0][0] == "get_weather"
    step = run.result.steps[0]
    assert step.ran and step.tokens > 5
    # the second generation's prompt holds the result, as the model saw it
    assert "Paris: 21 degrees, sunny (tool 7731)" in "".join(session.prompt_view().pieces)
    assert run.result.finished is not None and run.result.finished.stats.budget["tool_results"] >= step.tokens
