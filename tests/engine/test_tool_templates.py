"""Tools through chat templates: each family's own format, and the fallback prompt for the rest."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from engine.errors import TemplateError
from engine.inference.templates import fallback_template, select_template
from engine.inference.tool_prompt import (
    FALLBACK_INSTRUCTIONS,
    NO_CALL_NOTE,
    RESULT_HEADER,
    call_schema,
    enforceable_schema,
)
from engine.inference.tools import ToolSpec
from tests.engine import family_templates as ft

ADD = ToolSpec(
    "add",
    "Adds two numbers.",
    {
        "type": "object",
        "properties": {"a": {"type": "number", "minimum": 0}, "b": {"type": "number"}},
        "required": ["a", "b"],
    },
)
CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 plus 3?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "abcdefgh1", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}},
        ],
    },
    {"role": "tool", "content": "5", "tool_call_id": "abcdefgh1", "name": "add"},
]


@pytest.mark.parametrize(
    ("source", "architecture", "family"),
    [(ft.QWEN3, "qwen3", "hermes"), (ft.LLAMA31, "llama", "llama3"), (ft.MISTRAL, "llama", "mistral")],
)
def test_family_templates_are_tool_capable_with_their_call_format(source: str, architecture: str, family: str) -> None:
    template = select_template(source, architecture, "<s>", "</s>")
    assert template.source == "gguf"
    assert template.supports_tools and template.tool_family == family


def test_qwen_style_renders_tools_calls_and_results_in_its_own_format() -> None:
    template = select_template(ft.QWEN3, "qwen3", "<s>", "</s>")
    prompt = template.render(CONVERSATION, tools=[ADD])
    assert "<tools>\n" + json.dumps(ADD.as_openai(), ensure_ascii=False) in prompt
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>' in prompt
    assert "<tool_response>\n5\n</tool_response>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    assert template.thinking == frozenset({"enable_thinking"})


def test_llama_style_puts_results_in_the_ipython_role() -> None:
    template = select_template(ft.LLAMA31, "llama", "<|begin_of_text|>", "<|eot_id|>")
    prompt = template.render(CONVERSATION, tools=[ADD])
    assert '{"name": "add", "parameters": {"a": 2, "b": 3}}' in prompt
    assert "<|start_header_id|>ipython<|end_header_id|>\n\n5<|eot_id|>" in prompt


def test_mistral_style_needs_and_gets_nine_character_ids() -> None:
    template = select_template(ft.MISTRAL, "llama", "<s>", "</s>")
    prompt = template.render(CONVERSATION[1:], tools=[ADD])
    assert '[TOOL_CALLS][{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "abcdefgh1"}]' in prompt
    bad = [dict(m) for m in CONVERSATION[1:]]
    bad[1] = {**bad[1], "tool_calls": [{**bad[1]["tool_calls"][0], "id": "call_1"}]}
    with pytest.raises(TemplateError, match="9 characters"):
        template.render(bad, tools=[ADD])


def test_arguments_as_json_text_are_accepted_and_broken_ones_refused() -> None:
    template = select_template(ft.QWEN3, "qwen3", "<s>", "</s>")
    wire = [dict(m) for m in CONVERSATION]
    wire[2] = {
        **wire[2],
        "tool_calls": [
            {"id": "abcdefgh1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
        ],
    }
    assert template.render(wire, tools=[ADD]) == template.render(CONVERSATION, tools=[ADD])
    wire[2]["tool_calls"][0]["function"]["arguments"] = "{a: 2"
    with pytest.raises(TemplateError, match="arguments are not JSON"):
        template.render(wire, tools=[ADD])


def test_tool_choice_none_renders_no_tools() -> None:
    template = select_template(ft.QWEN3, "qwen3", "<s>", "</s>")
    assert "<tools>" not in template.render(CONVERSATION[:2], tools=[ADD], tool_choice="none")
    assert "<tools>" in template.render(CONVERSATION[:2], tools=[ADD], tool_choice="auto")


def test_tool_choice_none_after_calls_keeps_the_tools_and_says_not_to_call() -> None:
    template = select_template(ft.QWEN3, "qwen3", "<s>", "</s>")
    prompt = template.render(CONVERSATION, tools=[ADD], tool_choice="none")
    assert "<tools>\n" + json.dumps(ADD.as_openai(), ensure_ascii=False) in prompt
    assert f"<tool_response>\n5\n\n{NO_CALL_NOTE}\n</tool_response>" in prompt
    assert NO_CALL_NOTE not in template.render(CONVERSATION, tools=[ADD], tool_choice="auto")
    assert NO_CALL_NOTE not in template.render(CONVERSATION, tool_choice="none")  # no tools given: none to keep


SECOND_CALL = [
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "abcdefgh2", "type": "function", "function": {"name": "add", "arguments": {"a": 5, "b": 1}}},
        ],
    },
    {"role": "tool", "content": "6", "tool_call_id": "abcdefgh2", "name": "add"},
]


def _shared(earlier: str, later: str) -> int:
    """How many characters two prompts share from their start."""
    return len(os.path.commonprefix([earlier, later]))  # noqa: RUF071 - strings, not paths


@pytest.mark.parametrize("first_choice", ["auto", "required", "add"])
@pytest.mark.parametrize(
    ("source", "architecture"),
    [
        (ft.QWEN3, "qwen3"),
        (ft.LLAMA31, "llama"),
        (ft.NO_TOOLS, "qwen2"),
        (None, "gemma"),
        (None, "chatml"),
        (None, "llama3"),
        (None, "phi3"),
    ],
)  # not the Mistral sample: it renders the tools only when the last message is the user's (its choice)
def test_each_step_of_a_turn_starts_with_the_previous_steps_prompt(
    source: str | None, architecture: str, first_choice: str
) -> None:
    """One agent turn: a first step under ``first_choice``, the step after its call (``auto``), and
    the step limit after a second call (``none``). Each prompt holds the one before it, all but its
    generation prompt (which some templates write apart from a rendered reply, e.g. the Llama
    sample's header without its blank line)."""
    template = (
        select_template(source, architecture, "<s>", "</s>")
        if source is not None
        else fallback_template(architecture, "test", "<bos>")
    )  # type: ignore[arg-type]

    def prompt(messages: list[dict[str, Any]], choice: str, generation: bool = True) -> str:
        return template.render(messages, generation, tools=[ADD], tool_choice=choice)

    first, after_call = prompt(CONVERSATION[:2], first_choice), prompt(CONVERSATION, "auto")
    at_limit = prompt([*CONVERSATION, *SECOND_CALL], "none")
    # auto -> none: the tool block and everything before the new call unchanged
    assert _shared(after_call, at_limit) >= len(prompt(CONVERSATION, "auto", False))
    assert NO_CALL_NOTE in at_limit and NO_CALL_NOTE not in after_call
    if first_choice == "auto" or template.supports_tools:  # the grammar forces the call: nothing is said
        assert _shared(first, after_call) >= len(prompt(CONVERSATION[:2], first_choice, False))
    else:  # the fallback's "You must call ..." note ends the first prompt, and only it differs
        note = first.rindex("\n\nYou must call")
        assert _shared(first, after_call) >= note and "You must call" not in after_call


def test_template_without_tool_support_gets_the_documented_fallback_prompt() -> None:
    template = select_template(ft.NO_TOOLS, "qwen2", "<s>", "</s>")
    assert template.source == "gguf" and not template.supports_tools and template.tool_family == "json"
    prompt = template.render(CONVERSATION, tools=[ADD], tool_choice="add")
    system = prompt.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nBe brief.\n\n" + FALLBACK_INSTRUCTIONS)
    assert json.dumps({"name": "add", "description": ADD.description, "parameters": ADD.parameters}) in system
    assert "You must call" not in system  # the choice is said at the end: the system message is every step's
    assert '<|im_start|>assistant\n{"name": "add", "arguments": {"a": 2, "b": 3}}<|im_end|>' in prompt
    assert prompt.endswith(
        f"<|im_start|>user\n{RESULT_HEADER} add (call abcdefgh1):\n5\n\n"
        "You must call the tool add now.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert "<|im_start|>tool" not in prompt
    required = template.render(CONVERSATION[:2], tools=[ADD], tool_choice="required")
    assert required.endswith(
        "What is 2 plus 3?\n\nYou must call one of these tools now.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert "You must call" not in template.render(CONVERSATION, tools=[ADD])


def test_consecutive_results_share_one_user_turn_in_the_fallback() -> None:
    template = fallback_template("gemma", "test", "<bos>")
    two = [*CONVERSATION[1:], {"role": "tool", "content": "6", "tool_call_id": "x2", "name": "add"}]
    prompt = template.render(two, tools=[ADD])
    assert prompt.count("<start_of_turn>user") == 2  # the question, then both results together
    assert f"{RESULT_HEADER} add (call abcdefgh1):\n5\n\n{RESULT_HEADER} add (call x2):\n6" in prompt


@pytest.mark.parametrize("name", ["chatml", "gemma", "llama3", "mistral", "phi3", "plain"])
def test_every_builtin_format_takes_tools_through_the_fallback(name: str) -> None:
    template = fallback_template(name, "test")  # type: ignore[arg-type]
    assert not template.supports_tools
    prompt = template.render(CONVERSATION, tools=[ADD])
    assert FALLBACK_INSTRUCTIONS in prompt and "[tool result] add" in prompt
    assert "5" in prompt.split("[tool result] add")[1]


def test_thinking_switch_and_effort() -> None:
    template = select_template(ft.QWEN3, "qwen3", "<s>", "</s>")
    off = template.render(CONVERSATION[:2], enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert template.render(CONVERSATION[:2]).endswith("<|im_start|>assistant\n")
    with pytest.raises(TemplateError, match="reasoning_effort"):
        template.render(CONVERSATION[:2], reasoning_effort="extreme")


def test_call_schema_constrains_name_and_arguments() -> None:
    echo = ToolSpec("echo", "", {"type": "object", "properties": {"t": {"type": "string", "format": "email"}}})
    named = call_schema([ADD, echo], "add")
    assert named is not None and named["properties"]["name"] == {"const": "add"}
    assert named["properties"]["arguments"]["required"] == ["a", "b"]
    assert "minimum" not in json.dumps(named)  # not enforceable by a grammar: checked before the call runs
    anyof = call_schema([ADD, echo], "required")
    assert anyof is not None and [v["properties"]["name"]["const"] for v in anyof["anyOf"]] == ["add", "echo"]
    assert call_schema([ADD], "auto") is None and call_schema([ADD], "none") is None
    assert enforceable_schema(echo.parameters) == {"type": "object", "properties": {"t": {"type": "string"}}}


def test_a_long_tool_list_renders_within_the_size_limits() -> None:
    template = select_template(ft.QWEN3, "qwen3", "<s>", "</s>")
    big = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 200} for i in range(40)}}
    tools = [ToolSpec(f"tool_{n}", "A tool. " * 50, big) for n in range(150)]  # ~1.3M characters of JSON
    prompt = template.render(CONVERSATION[:2], tools=tools)
    assert prompt.count('"name": "tool_') == 150


def test_a_turn_under_none_with_tools_renders_them_after_calls_but_parses_no_call() -> None:
    from engine.inference.runtime import GenerationParams
    from engine.inference.turn import shape_turn

    template = select_template(ft.QWEN3, "qwen3", "<s>", "</s>")
    at_limit = shape_turn(template, GenerationParams(), tools=[ADD], tool_choice="none")
    assert at_limit.shaper("").family is None and at_limit.json_schema is None
    assert shape_turn(template, GenerationParams(), tools=[ADD], tool_choice="auto").shaper("").family == "hermes"
