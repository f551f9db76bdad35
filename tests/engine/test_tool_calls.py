"""The streaming tool-call parser's mechanics: what streams when, what is held, what comes back as
text, and detection from a template's own rendering of a call. Every format's replies are in
``tests/engine/call_format_cases.py`` (run by ``test_call_formats.py``)."""

from __future__ import annotations

import pytest

from engine.inference.tool_calls import (
    FAMILIES,
    MAX_CALL_CHARS,
    Family,
    ParsedCall,
    Piece,
    ToolCallParser,
    detect_family,
    parse_tool_calls,
)
from engine.inference.tool_calls.stream import MAX_PARSE_WORK
from engine.inference.tool_calls.values import typed_value

NAMES = ("get_weather", "add")


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


def test_text_before_a_call_streams_before_the_call_is_complete() -> None:
    parser = ToolCallParser("hermes", NAMES)
    assert parser.feed("Sure, one moment. ") == ["Sure, one moment."]  # the space waits: a call may follow
    assert parser.feed('<tool_call>\n{"name": "add", ') == []
    assert parser.in_call
    done = parser.feed('"arguments": {"a": 1, "b": 2}}\n</tool_call>')
    raw = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    assert done == [ParsedCall("add", {"a": 1, "b": 2}, raw)]
    assert parser.calls_found == 1 and not parser.in_call


def test_a_partial_marker_is_held_back_and_released_when_it_is_not_one() -> None:
    parser = ToolCallParser("hermes", NAMES)
    assert parser.feed("a <tool_c") == ["a"]
    assert parser.feed("atalog>") == [" <tool_catalog>"]


def test_whitespace_around_calls_is_the_formats_but_text_keeps_its_own() -> None:
    call = '<tool_call>{"name": "add", "arguments": {}}</tool_call>'
    reply = f"One.\n\n{call}\n\nTwo.\n"
    assert parse_tool_calls(reply, "hermes") == ("One.Two.\n", [ParsedCall("add", {}, call)])
    assert parse_tool_calls("Just text.\n\nMore.\n", "hermes")[0] == "Just text.\n\nMore.\n"


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
        ("lfm2", "<|tool_call_start|>[f(a=b)]<|tool_call_end|>"),  # a name, not a literal
        ("qwen_xml", "<tool_call>\n<function=add>\nloose text\n</function>\n</tool_call>"),
        ("glm", "<tool_call>add<arg_value>1</arg_value></tool_call>"),  # a value without its key
        ("gemma4", "<|tool_call>call:add{a:notaword}<tool_call|>"),
        ("hermes", '<tool_call>\n{"name": "add", "arguments": {}'),  # never closed
    ],
)
def test_broken_markup_comes_back_as_text_not_lost(family: Family, reply: str) -> None:
    for size in (1, 3, len(reply)):
        text, calls = _split(_stream(family, reply, size))
        assert calls == []
        assert text == reply


def test_a_broken_call_does_not_hide_the_calls_after_it() -> None:
    reply = '<tool_call>{bad}</tool_call> then <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    for size in (1, 5, len(reply)):
        assert _split(_stream("hermes", reply, size)) == ("<tool_call>{bad}</tool_call> then", [("add", {"a": 1})])


def test_a_closing_marker_inside_a_string_is_read_past() -> None:
    reply = '<tool_call>{"name": "add", "arguments": {"note": "</tool_call>"}}</tool_call>'
    assert parse_tool_calls(reply, "hermes")[1] == [ParsedCall("add", {"note": "</tool_call>"}, reply)]


def test_json_family_takes_a_bare_object_only_when_it_names_an_offered_tool() -> None:
    answer = '{"name": "Ada", "arguments": {"born": 1815}}'
    assert parse_tool_calls(answer, "json", NAMES) == (answer, [])
    assert parse_tool_calls('{"city": "Paris"}', "json", NAMES) == ('{"city": "Paris"}', [])
    call = '{"name": "add", "arguments": {"a": 1, "b": 2}}'
    assert parse_tool_calls(call, "json", NAMES)[1][0].arguments == {"a": 1, "b": 2}
    assert parse_tool_calls('{"name": "add", "arguments": "{\\"a\\": 2}"}', "json", NAMES)[1][0].arguments == {"a": 2}


def test_a_reply_starting_like_json_but_plain_is_released_once_it_cannot_be_a_call() -> None:
    parser = ToolCallParser("llama3", NAMES)
    assert parser.feed("[1") == []  # may still be a list of calls
    assert parser.feed("] The first source says") == ["[1] The first source says"]  # "[1]" is none
    assert parser.finish() == []


def test_runaway_markup_is_not_parsed() -> None:
    huge = '<tool_call>{"name": "add", "arguments": {"a": "' + "x" * MAX_CALL_CHARS + '"}}</tool_call>'
    text, calls = parse_tool_calls(huge, "hermes", NAMES)
    assert calls == [] and text == huge
    parser = ToolCallParser("hermes", NAMES)
    held = parser.feed("<tool_call>" + "x" * (MAX_CALL_CHARS + 100))
    assert "".join(p for p in held if isinstance(p, str)).startswith("<tool_call>xxx")  # released, not held forever


def test_closing_markers_written_over_and_over_inside_an_argument_cost_bounded_work() -> None:
    inner = "</tool_call>" * 20_000
    reply = f'<tool_call>{{"name": "add", "arguments": {{"note": "{inner}"}}}}</tool_call> Done.'
    parser = ToolCallParser("hermes", NAMES)
    pieces: list[Piece] = []
    for start in range(0, len(reply), 7):
        pieces += parser.feed(reply[start : start + 7])
    pieces += parser.finish()
    assert _split(pieces) == ("Done.", [("add", {"note": inner})])  # the call, found at the end
    assert parser.parsed_chars <= MAX_PARSE_WORK


def test_many_broken_calls_at_the_end_neither_recurse_nor_take_quadratic_work() -> None:
    reply = '<tool_call>{"name": "add", "arguments": {"a": "</tool_call>' * 5_000
    parser = ToolCallParser("hermes", NAMES)
    text, calls = _split(parser.feed(reply) + parser.finish())
    assert calls == [] and text == reply
    assert parser.parsed_chars <= MAX_PARSE_WORK
    deep = "<|tool_call_start|>" + "[" * 100_000
    assert parse_tool_calls(deep, "lfm2") == (deep, [])
    nested = "<tool_call>" + "[" * 100_000 + "</tool_call>"
    assert parse_tool_calls(nested, "hermes") == (nested, [])


def test_unknown_and_whole_reply_families_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown tool-call family"):
        ToolCallParser("cobol")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="whole-reply structure"):
        ToolCallParser("harmony")


@pytest.mark.parametrize(
    ("text", "schema", "value"),
    [
        ("42", {"type": "integer"}, 42),
        ("42", {"type": "string"}, "42"),
        (" 3.5 ", {"type": "number"}, 3.5),
        ("true", {"type": "boolean"}, True),
        ("null", {"type": ["string", "null"]}, None),
        ("123 Main St", {"type": ["string", "null"]}, "123 Main St"),
        ("1abc", {"type": ["string", "integer"]}, "1abc"),
        ('{"a": 1}', {"type": ["string", "object"]}, {"a": 1}),
        ("{not json", {"type": ["string", "object"]}, "{not json"),
        ("celsius", {"enum": ["celsius", "fahrenheit"]}, "celsius"),
        ("7", {"anyOf": [{"type": "integer"}, {"type": "object"}]}, 7),
        ("True", {"type": "boolean"}, True),
        ("3", None, 3),
        ("plain words", None, "plain words"),
    ],
)
def test_argument_text_is_typed_by_the_tools_schema(text: str, schema: dict[str, object] | None, value: object) -> None:
    assert typed_value(text, schema) == value


QWEN35_CALL = (
    "<tool_call>\n<function=glassbox_probe_tool>\n<parameter=word>\nglassbox-probe-value\n</parameter>\n</function>"
    "\n</tool_call>"
)
HERMES_CALL = '<tool_call>\n{"name": "glassbox_probe_tool", "arguments": {"word": "glassbox-probe-value"}}</tool_call>'


@pytest.mark.parametrize(
    ("template", "rendered", "family"),
    [
        ("{% if tools %}<tool_call>{{ tools }}</tool_call>{% endif %}", HERMES_CALL, "hermes"),
        # the template holds <tool_call>, but it writes XML inside: not Hermes's JSON parser
        ("<tool_call>{{ x }}</tool_call> <function=...> <parameter=...>", QWEN35_CALL, "qwen_xml"),
        ("<tool_call>{{ x }}</tool_call>", QWEN35_CALL, "qwen_xml"),
        # a call in a syntax no parser reads: no format (the fallback prompt is used)
        ("<tool_call>{{ x }}</tool_call>", "<tool_call>((glassbox_probe_tool glassbox-probe-value))</tool_call>", None),
        # a template that drops past calls is judged by its markers
        ("List of tools: <|tool_list_start|>{{ tools }}<|tool_list_end|>", "<|im_start|>assistant\n", "lfm2"),
        ("[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS][TOOL_CALLS]", None, "mistral"),
        ("<tool_call>{{ tools }} <arg_key>k</arg_key><arg_value>", None, "glm"),
        ("{{ messages }}", None, None),
        (None, None, None),
    ],
)
def test_family_detection_from_the_templates_rendering_then_its_markers(
    template: str | None, rendered: str | None, family: Family | None
) -> None:
    found = detect_family(
        template, rendered=rendered, probe_name="glassbox_probe_tool", probe_arguments={"word": "glassbox-probe-value"}
    )
    assert found == family


def test_every_family_is_detectable_from_its_markers() -> None:
    from engine.inference.tool_calls import FORMATS

    for family in FAMILIES:
        fmt = FORMATS[family]
        if not fmt.signatures:
            continue  # the generic fallback: never a template's own
        template = " ".join(fmt.signatures[0])
        assert detect_family(template) == family, family
