"""A whole turn through a ChatSession for published chat templates: the template llama.cpp keeps
(read from the pinned sdist) is rendered with a tool, the model's reply in that family's own
format streams back with its control tokens as single tokens without text (as llama.cpp renders
them), and the session's shaping gives the thinking, the answer and the call apart.

The worker is scripted (tests/engine/scripted_worker.py): no model runs, the template, the format
detection, the markers put back and the reply shaping are the real ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from engine.inference.events import Finished, Reasoning, Token, ToolCall
from engine.inference.tools import ToolSpec
from tests.engine.scripted_worker import Script, scripted_session

WEATHER = ToolSpec(
    "get_weather",
    "The weather in a city.",
    {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city."}, "days": {"type": "integer"}},
        "required": ["city"],
    },
)
PARIS = ("get_weather", {"city": "Paris", "days": 2})
DS = "｜DSML｜"


@dataclass(frozen=True)
class Turn:
    template: str
    reply: str
    control: tuple[str, ...]
    reasoning: str = ""
    content: str = ""
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=lambda: [PARIS])
    family: str = ""
    options: dict[str, Any] = field(default_factory=dict)


TURNS = [
    Turn(
        "Qwen3.5-4B.jinja",  # the prompt opens <think>; the call is XML inside <tool_call>
        "The weather tool.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
        "</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
        ("<tool_call>", "</tool_call>", "</think>"),
        reasoning="The weather tool.\n",
        family="qwen_xml",
    ),
    Turn(
        "GLM-4.7-Flash.jinja",
        "Weather.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
        "<arg_key>days</arg_key><arg_value>2</arg_value></tool_call>",
        ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "</think>"),
        reasoning="Weather.",
        family="glm",
    ),
    Turn(
        "deepseek-ai-DeepSeek-V3.2.jinja",
        f'Weather.</think>\n\n<{DS}function_calls>\n<{DS}invoke name="get_weather">\n'
        f'<{DS}parameter name="city" string="true">Paris</{DS}parameter>\n'
        f'<{DS}parameter name="days" string="false">2</{DS}parameter>\n</{DS}invoke>\n</{DS}function_calls>',
        (),
        reasoning="Weather.",
        family="dsml",
        options={"thinking": True},
    ),
    Turn(
        "google-gemma-4-31B-it.jinja",
        '<|channel>thought\nWeather.<channel|><|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:2}<tool_call|>',
        ("<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", '<|"|>'),
        reasoning="Weather.",
        family="gemma4",
    ),
    Turn(
        "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
        '[THINK]Weather.[/THINK][TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 2}',
        ("[THINK]", "[/THINK]", "[TOOL_CALLS]", "[ARGS]"),
        reasoning="Weather.",
        family="mistral",
    ),
    Turn(
        "openai-gpt-oss-120b.jinja",
        "<|channel|>analysis<|message|>Weather.<|end|><|start|>assistant to=functions.get_weather<|channel|>"
        'commentary <|constrain|>json<|message|>{"city": "Paris", "days": 2}<|call|>',
        ("<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|constrain|>", "<|call|>"),
        reasoning="Weather.",
        family="harmony",
    ),
    Turn(
        "MiniMax-M2.jinja",
        'Weather.\n</think>\n\n<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris'
        '</parameter>\n<parameter name="days">2</parameter>\n</invoke>\n</minimax:tool_call>',
        ("<minimax:tool_call>", "</minimax:tool_call>", "</think>"),
        reasoning="Weather.\n",
        family="minimax_m2",
    ),
    Turn(
        "moonshotai-Kimi-K2.jinja",
        "Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        '<|tool_call_argument_begin|>{"city": "Paris", "days": 2}<|tool_call_end|><|tool_calls_section_end|>',
        ("<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"),
        content="Checking.",
        family="kimi_k2",
    ),
    Turn(
        "LFM2.5-Instruct.jinja",
        'Checking.<|tool_call_start|>[get_weather(city="Paris", days=2)]<|tool_call_end|>',
        ("<|tool_call_start|>", "<|tool_call_end|>"),
        content="Checking.",
        family="lfm2",
    ),
    Turn(
        "ByteDance-Seed-OSS.jinja",
        "<seed:think>Weather.</seed:think>\n<seed:tool_call>\n<function=get_weather>\n"
        "<parameter=city>Paris</parameter>\n<parameter=days>2</parameter>\n</function>\n</seed:tool_call>",
        ("<seed:think>", "</seed:think>", "<seed:tool_call>", "</seed:tool_call>"),
        reasoning="Weather.",
        family="seed_xml",
    ),
    Turn(
        "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja",
        "<|START_THINKING|>Weather.<|END_THINKING|><|START_ACTION|>[\n"
        '    {"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Paris", "days": 2}}\n'
        "]<|END_ACTION|>",
        ("<|START_THINKING|>", "<|END_THINKING|>", "<|START_ACTION|>", "<|END_ACTION|>"),
        reasoning="Weather.",
        family="cohere",
    ),
    Turn(
        "Kimi-K3.jinja",  # the prompt opens the think section
        "Weather.<|close|>think<|sep|><|open|>response<|sep|>On it.<|close|>response<|sep|><|open|>tools<|sep|>"
        '<|open|>call tool="get_weather" index="1"<|sep|><|open|>argument key="city" type="string"<|sep|>Paris'
        '<|close|>argument<|sep|><|open|>argument key="days" type="number"<|sep|>2<|close|>argument<|sep|>'
        "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>",
        ("<|open|>", "<|close|>", "<|sep|>"),
        reasoning="Weather.",
        content="On it.",
        family="kimi_k3",
    ),
    Turn(
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}',
        (),
        family="llama3",
    ),
    Turn(
        "openbmb-MiniCPM5-1B.jinja",
        'Weather.</think><function name="get_weather"><param name="city">Paris</param>'
        '<param name="days">2</param></function>',
        ("</think>",),
        reasoning="Weather.",
        family="minicpm",
        options={"thinking": True},
    ),
]


@pytest.mark.parametrize("turn", TURNS, ids=[t.template.removesuffix(".jinja") for t in TURNS])
@pytest.mark.parametrize("piece", [1, 4, 1000])
def test_a_published_templates_turn_with_a_call(
    llama_cpp_source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, turn: Turn, piece: int
) -> None:
    source = (llama_cpp_source / "models" / "templates" / turn.template).read_text(encoding="utf-8")
    control = {marker: 1000 + index for index, marker in enumerate(turn.control)}
    script = Script(replies=[turn.reply], piece=piece, control=control)
    session = scripted_session(tmp_path, monkeypatch, source, script, architecture="llama", n_ctx=32768)
    template = session.template
    assert template.supports_tools and template.tool_family == turn.family
    events = list(session.stream([], "The weather in Paris for two days?", tools=[WEATHER], **turn.options))
    assert "get_weather" in script.prompts[0]  # rendered by the model's own template
    finished = events[-1]
    assert isinstance(finished, Finished)
    assert "".join(e.text for e in events if isinstance(e, Reasoning)) == turn.reasoning == finished.reasoning
    assert "".join(e.text for e in events if isinstance(e, Token)) == turn.content == finished.text
    calls = [(e.name, e.arguments) for e in events if isinstance(e, ToolCall)]
    assert calls == turn.calls == [(c.name, c.arguments) for c in finished.tool_calls]


@pytest.mark.parametrize(
    ("name", "reply", "close"),
    [
        ("Qwen3.5-4B.jinja", "hmm " * 50, "\n</think>\n\n"),
        ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", "[THINK]" + "hmm " * 50, "[/THINK]"),
        ("google-gemma-4-31B-it.jinja", "<|channel>thought\n" + "hmm " * 50, "<channel|>"),
    ],
)
def test_a_thinking_budget_closes_the_thinking_in_the_templates_own_marker(
    llama_cpp_source: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    reply: str,
    close: str,
) -> None:
    source = (llama_cpp_source / "models" / "templates" / name).read_text(encoding="utf-8")
    script = Script(replies=[reply, "It is sunny."], piece=1)
    session = scripted_session(tmp_path, monkeypatch, source, script, architecture="llama")
    options: dict[str, Any] = {"thinking": True} if "enable_thinking" in session.template.thinking else {}
    finished = list(session.stream([], "Weather?", thinking_budget=10, **options))[-1]
    assert isinstance(finished, Finished)
    assert finished.text == "It is sunny." and finished.reasoning.strip().startswith("hmm")
    assert 10 <= finished.reasoning_tokens <= 12
    first, second = script.prompts
    assert second.endswith(close) and second.startswith(first)


@pytest.mark.parametrize(
    ("name", "options", "in_prompt", "reply", "reasoning", "content"),
    [
        (
            "Kimi-K3.jinja",
            {"thinking": False},
            "<|open|>response<|sep|>",
            "It is sunny.<|close|>response<|sep|>",
            "",
            "It is sunny.",
        ),
        (
            "Kimi-K3.jinja",
            {"reasoning_effort": "low"},
            "thinking_effort=low",
            "Hm.<|close|>think<|sep|><|open|>response<|sep|>Sunny.",
            "Hm.",
            "Sunny.",
        ),
        ("MiniMax-M3.jinja", {"thinking": False}, "Current thinking mode: disabled", "</mm:think>Sunny.", "", "Sunny."),
        (
            "ByteDance-Seed-OSS.jinja",
            {"thinking_budget": 64},
            "thinking budget, which is 64",
            "<seed:think>Hm.</seed:think>Sunny.",
            "Hm.",
            "Sunny.",
        ),
        (
            "tencent-Hy3.jinja",
            {"thinking": True},
            "<think:opensource>",
            "Hm.</think:opensource>Sunny.",
            "Hm.",
            "Sunny.",
        ),
        ("tencent-Hy3.jinja", {"thinking": False}, "</think:opensource>", "Sunny.", "", "Sunny."),
        (
            "deepseek-ai-DeepSeek-V4.jinja",
            {"thinking": True, "reasoning_effort": "max"},
            "Reasoning Effort: Absolute maximum",
            "Hm.</think>Sunny.",
            "Hm.",
            "Sunny.",
        ),
        ("deepseek-ai-DeepSeek-V3.1.jinja", {"thinking": True}, "<think>", "Hm.</think>Sunny.", "Hm.", "Sunny."),
        (
            "Cohere2MoE.jinja",
            {"thinking": False},
            "<|START_THINKING|><|END_THINKING|>",
            "<|START_TEXT|>Sunny.<|END_TEXT|>",
            "",
            "Sunny.",
        ),
        (
            "openai-gpt-oss-120b.jinja",
            {"reasoning_effort": "high"},
            "Reasoning: high",
            "<|channel|>final<|message|>Sunny.",
            "",
            "Sunny.",
        ),
    ],
)
def test_thinking_options_reach_each_templates_own_switches(
    llama_cpp_source: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    options: dict[str, Any],
    in_prompt: str,
    reply: str,
    reasoning: str,
    content: str,
) -> None:
    source = (llama_cpp_source / "models" / "templates" / name).read_text(encoding="utf-8")
    script = Script(replies=[reply], piece=2)
    session = scripted_session(tmp_path, monkeypatch, source, script, architecture="llama", n_ctx=32768)
    finished = list(session.stream([], "Weather?", **options))[-1]
    assert in_prompt in script.prompts[0]
    assert isinstance(finished, Finished)
    assert (finished.reasoning, finished.text) == (reasoning, content)


def test_an_effort_the_template_does_not_name_is_refused(
    llama_cpp_source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.errors import EngineError

    source = (llama_cpp_source / "models" / "templates" / "Kimi-K3.jinja").read_text(encoding="utf-8")
    session = scripted_session(tmp_path, monkeypatch, source, Script(), architecture="llama", n_ctx=32768)
    with pytest.raises(EngineError, match="reasoning_effort must be one of low, medium, high, max"):
        list(session.stream([], "hi", reasoning_effort="extreme"))
    source = (llama_cpp_source / "models" / "templates" / "meta-llama-Llama-3.1-8B-Instruct.jinja").read_text(
        encoding="utf-8"
    )
    session = scripted_session(tmp_path, monkeypatch, source, Script(), architecture="llama", n_ctx=32768)
    with pytest.raises(EngineError, match="no thinking switch"):
        list(session.stream([], "hi", thinking=True))
