"""The streaming tool-call parsers: each family's recorded replies, fed in pieces of every size.

The replies are written from each family's documented chat template and tool-use docs (the text
a model of that family emits after the template's generation prompt).
"""

from __future__ import annotations

import pytest

from engine.inference.tool_calls import (
    DS_CALL_BEGIN,
    DS_CALL_END,
    DS_CALLS_BEGIN,
    DS_CALLS_END,
    DS_SEP,
    MAX_CALL_CHARS,
    Family,
    ParsedCall,
    Piece,
    ToolCallParser,
    detect_family,
    parse_tool_calls,
)

WEATHER = {"city": "Paris", "unit": "celsius"}
NAMES = ("get_weather", "add")

# (family, reply, text the user sees, calls as (name, arguments))
RECORDED: list[tuple[Family, str, str, list[tuple[str, dict[str, object]]]]] = [
    (  # Qwen 2.5 / Qwen 3 / Hermes: text, then one block per call
        "hermes",
        'Let me check the weather.\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris", "unit": "celsius"}}\n</tool_call>',
        "Let me check the weather.\n",
        [("get_weather", WEATHER)],
    ),
    (  # Qwen parallel calls
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>',
        "\n",
        [("get_weather", WEATHER), ("add", {"a": 2, "b": 3})],
    ),
    (  # Llama 3.1 JSON tool calling: the whole reply is the call, "parameters" for the arguments
        "llama3",
        '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',
        "",
        [("get_weather", WEATHER)],
    ),
    (  # Llama 3.1 with the python tag
        "llama3",
        '<|python_tag|>{"name": "add", "parameters": {"a": 2, "b": 3}}',
        "",
        [("add", {"a": 2, "b": 3})],
    ),
    (  # Llama 3.2 lightweight models: a Python-style list
        "llama3",
        '[get_weather(city="Paris", unit="celsius"), add(a=2, b=3)]',
        "",
        [("get_weather", WEATHER), ("add", {"a": 2, "b": 3})],
    ),
    (  # Mistral v3 tokenizer
        "mistral",
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]',
        "",
        [("get_weather", WEATHER)],
    ),
    (  # Mistral v11+: name[ARGS]{...}, several calls
        "mistral",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"}[TOOL_CALLS]add[ARGS]{"a": 2, "b": 3}',
        "",
        [("get_weather", WEATHER), ("add", {"a": 2, "b": 3})],
    ),
    (  # Mistral with call ids
        "mistral",
        '[TOOL_CALLS]add[CALL_ID]a1b2c3d4e[ARGS]{"a": 2, "b": 3}',
        "",
        [("add", {"a": 2, "b": 3})],
    ),
    (  # Gemma: a tool_code block with a Python call
        "gemma",
        'I will look it up.\n```tool_code\nget_weather(city="Paris", unit="celsius")\n```',
        "I will look it up.\n",
        [("get_weather", WEATHER)],
    ),
    (  # DeepSeek V3 / R1
        "deepseek",
        f"Checking.{DS_CALLS_BEGIN}{DS_CALL_BEGIN}function{DS_SEP}get_weather\n```json\n"
        f'{{"city": "Paris", "unit": "celsius"}}\n```{DS_CALL_END}{DS_CALLS_END}',
        "Checking.",
        [("get_weather", WEATHER)],
    ),
    (  # DeepSeek V3.1: no type, no fence; two calls
        "deepseek",
        f'{DS_CALLS_BEGIN}{DS_CALL_BEGIN}add{DS_SEP}{{"a": 2, "b": 3}}{DS_CALL_END}'
        f'{DS_CALL_BEGIN}get_weather{DS_SEP}{{"city": "Paris", "unit": "celsius"}}{DS_CALL_END}{DS_CALLS_END}',
        "",
        [("add", {"a": 2, "b": 3}), ("get_weather", WEATHER)],
    ),
    (  # the generic fallback: a bare JSON object, in a fence
        "json",
        '```json\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n```',
        "",
        [("get_weather", WEATHER)],
    ),
    (  # the generic fallback: arguments as JSON text (OpenAI's wire shape)
        "json",
        '{"name": "add", "arguments": "{\\"a\\": 2, \\"b\\": 3}"}',
        "",
        [("add", {"a": 2, "b": 3})],
    ),
    (  # plain text: no call
        "hermes",
        "The weather in Paris is mild; no tool is needed. A <tool or a < sign is just text.",
        "The weather in Paris is mild; no tool is needed. A <tool or a < sign is just text.",
        [],
    ),
]


def _stream(family: Family, text: str, size: int) -> list[Piece]:
    parser = ToolCallParser(family, NAMES)
    pieces: list[Piece] = []
    for start in range(0, len(text), size):
        pieces += parser.feed(text[start : start + size])
    return pieces + parser.finish()


def _split(pieces: list[Piece]) -> tuple[str, list[tuple[str, dict[str, object]]]]:
    text = "".join(p for p in pieces if isinstance(p, str))
    calls = [(p.name, p.arguments) for p in pieces if isinstance(p, ParsedCall)]
    return text, calls


@pytest.mark.parametrize(("family", "reply", "text", "calls"), RECORDED)
def test_recorded_replies_parse_the_same_in_pieces_of_every_size(
    family: Family, reply: str, text: str, calls: list[tuple[str, dict[str, object]]]
) -> None:
    for size in range(1, len(reply) + 1):
        assert _split(_stream(family, reply, size)) == (text, calls), f"pieces of {size}"


@pytest.mark.parametrize(("family", "reply", "text", "calls"), RECORDED)
def test_whole_text_parse_matches_and_raw_keeps_the_markup(
    family: Family, reply: str, text: str, calls: list[tuple[str, dict[str, object]]]
) -> None:
    plain, parsed = parse_tool_calls(reply, family, NAMES)
    assert (plain, [(c.name, c.arguments) for c in parsed]) == (text, calls)
    for call in parsed:
        assert call.raw in reply or (len(parsed) > 1 and call.name in call.raw)


def test_text_before_a_call_streams_before_the_call_is_complete() -> None:
    parser = ToolCallParser("hermes", NAMES)
    first = parser.feed("Sure, one moment. ")
    assert first == ["Sure, one moment. "]
    assert parser.feed('<tool_call>\n{"name": "add", ') == []
    done = parser.feed('"arguments": {"a": 1, "b": 2}}\n</tool_call>')
    raw = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    assert done == [ParsedCall("add", {"a": 1, "b": 2}, raw)]
    assert parser.calls_found == 1


def test_a_partial_marker_is_held_back_and_released_when_it_is_not_one() -> None:
    parser = ToolCallParser("hermes", NAMES)
    assert parser.feed("a <tool_c") == ["a "]
    assert parser.feed("atalog>") == ["<tool_catalog>"]


@pytest.mark.parametrize(
    ("family", "reply"),
    [
        ("hermes", "Trying: <tool_call>\n{not json}\n</tool_call> done"),
        ("hermes", '<tool_call>{"arguments": {}}</tool_call>'),  # no name
        ("hermes", '<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>'),  # arguments not an object
        ("mistral", "[TOOL_CALLS] nonsense"),
        ("gemma", "```tool_code\nimport os\n```"),
        ("gemma", "```tool_code\nf(__import__('os').system('x'))\n```"),  # positional, not a literal
        ("gemma", "```tool_code\nf(a=open('x'))\n```"),  # not a literal: never evaluated
        (
            "deepseek",
            f"{DS_CALLS_BEGIN}{DS_CALL_BEGIN}function{DS_SEP}add\n```json\n{{oops\n```{DS_CALL_END}{DS_CALLS_END}",
        ),
        ("hermes", '<tool_call>\n{"name": "add", "arguments": {}'),  # never closed
    ],
)
def test_broken_markup_comes_back_as_text_not_lost(family: Family, reply: str) -> None:
    for size in (1, 3, len(reply)):
        text, calls = _split(_stream(family, reply, size))
        assert calls == []
        assert text == reply


def test_json_family_takes_a_bare_object_only_when_it_names_an_offered_tool() -> None:
    answer = '{"name": "Ada", "arguments": {"born": 1815}}'
    assert parse_tool_calls(answer, "json", NAMES) == (answer, [])
    assert parse_tool_calls('{"city": "Paris"}', "json", NAMES) == ('{"city": "Paris"}', [])
    call = '{"name": "add", "arguments": {"a": 1, "b": 2}}'
    assert parse_tool_calls(call, "json", NAMES)[1][0].arguments == {"a": 1, "b": 2}


def test_a_reply_starting_like_json_but_plain_is_released_once_it_cannot_be_a_call() -> None:
    parser = ToolCallParser("llama3", NAMES)
    assert parser.feed("[1") == []  # may still be a list of calls
    assert parser.feed("] The first source says") == ["[1] The first source says"]  # "[1]" is none
    assert parser.finish() == []


def test_runaway_markup_is_not_parsed() -> None:
    huge = '<tool_call>{"name": "add", "arguments": {"a": "' + "x" * MAX_CALL_CHARS + '"}}</tool_call>'
    text, calls = parse_tool_calls(huge, "hermes", NAMES)
    assert calls == [] and text == huge


def test_unknown_family_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown tool-call family"):
        ToolCallParser("cobol")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("template", "architecture", "family"),
    [
        ("{% if tools %}<tools>{{ tools }}</tools>{% endif %}<tool_call>", "qwen2", "hermes"),
        ("[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS][TOOL_CALLS]", "llama", "mistral"),
        ("<｜tool▁calls▁begin｜>", "deepseek2", "deepseek"),
        ("<|start_header_id|>ipython{% if tools %}{% endif %}<|python_tag|>", "llama", "llama3"),
        ("```tool_code\n", "gemma3", "gemma"),
        ("{{ messages }}", "qwen3", "hermes"),
        ("{{ messages }}", "phi3", "json"),
        (None, "llama", "json"),
    ],
)
def test_family_detection_from_template_markers(template: str | None, architecture: str, family: Family) -> None:
    assert detect_family(template, architecture) == family
