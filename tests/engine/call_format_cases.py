"""Replies in every call format, with the thinking, answer and calls each must come apart into.

The cases are written here, in each family's syntax as its published chat template writes it (the
templates llama.cpp keeps in ``models/templates/``), after the edge cases llama.cpp's own parser
tests (``tests/test-chat.cpp``) check for the same formats: parallel calls, text before a call, a
call right after the thinking or inside it (the thinking never closed after it), a mention of the
markup inside thinking that goes on, arguments with nested JSON and with strings holding the
closing markup, typed arguments (the XML formats take the types from the tool's schema), and a
call cut off by the end of the reply (its markup comes back as text: nothing is lost, nothing is
run). ``tests/engine/test_call_formats.py`` feeds each through the reply shaper in pieces of every
size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.inference.tool_calls import Family

TOOLS: dict[str, dict[str, Any]] = {
    "get_weather": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
    "run": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    "write_file": {
        "type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"],
    },
    "set_config": {
        "type": "object",
        "properties": {
            "config": {"type": "object"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "on": {"type": "boolean"},
            "ratio": {"type": "number"},
        },
    },
    "note": {
        "type": "object",
        "properties": {"text": {"type": ["string", "null"]}, "n": {"type": ["string", "integer"]}},
    },
    "ping": {"type": "object", "properties": {}},
    "Calendar.create_event": {
        "type": "object",
        "properties": {"title": {"type": "string"}, "people": {"type": "array", "items": {"type": "string"}}},
    },
}

Call = tuple[str, dict[str, Any]]
PARIS: Call = ("get_weather", {"city": "Paris"})
PARIS_2: Call = ("get_weather", {"city": "Paris", "days": 2})
LS: Call = ("run", {"command": "ls -la"})
CODE = 'def f():\n    return "</parameter></tool_call>"\n'
WRITE: Call = ("write_file", {"path": "a.py", "content": CODE})
CONFIG: Call = ("set_config", {"config": {"theme": "dark", "limits": {"n": [1, 2]}}, "tags": ["a", "b"], "on": True})


@dataclass(frozen=True)
class Case:
    """One reply and what it must come apart into.

    Attributes:
        id: the test id.
        family: the call format.
        reply: the model's text after the generation prompt.
        reasoning: the thinking.
        content: the answer.
        calls: the calls, in order.
        think: the thinking format.
        started: the prompt opened the thinking (the reply starts inside it).
        tools: tools were offered (else calls are text).
    """

    id: str
    family: Family
    reply: str
    reasoning: str = ""
    content: str = ""
    calls: list[Call] = field(default_factory=list)
    think: str = "think"
    started: bool = False
    tools: bool = True


KIMI_CALL = "<|tool_call_begin|>functions.{name}:{i}<|tool_call_argument_begin|>{args}<|tool_call_end|>"
K3_ARG = '<|open|>argument key="{key}" type="{kind}"<|sep|>{value}<|close|>argument<|sep|>'
DSB, DSE = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DCB, DCE, DSEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"

CASES: list[Case] = [
    # ------------------------------------------------------------ Hermes JSON (Qwen 2.5/3, Hermes, Granite 4)
    Case(
        "hermes-text-then-call",
        "hermes",
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        content="Let me check.",
        calls=[PARIS],
    ),
    Case(
        "hermes-parallel",
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>\n'
        '<tool_call>\n{"name": "run", "arguments": {"command": "ls -la"}}\n</tool_call>',
        calls=[PARIS_2, LS],
    ),
    Case(
        "hermes-after-thinking",
        "hermes",
        '<think>\nThe weather tool.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
        "\n</tool_call>",
        reasoning="\nThe weather tool.\n",
        calls=[PARIS],
    ),
    Case(
        "hermes-call-inside-opened-thinking",
        "hermes",
        'Listing files.\n<tool_call>\n{"name": "run", "arguments": {"command": "ls -la"}}\n</tool_call>',
        reasoning="Listing files.\n",
        calls=[LS],
        started=True,
    ),
    Case(
        "hermes-markup-mentioned-in-thinking",
        "hermes",
        'Maybe <tool_call>{"name": "run", "arguments": {"command": "rm"}}</tool_call>? No.\n</think>\n\nNo tool.',
        reasoning='Maybe <tool_call>{"name": "run", "arguments": {"command": "rm"}}</tool_call>? No.\n',
        content="No tool.",
        started=True,
    ),
    Case(
        "hermes-closing-markup-in-a-string",
        "hermes",
        '<tool_call>\n{"name": "write_file", "arguments": {"path": "a.py", "content": '
        '"def f():\\n    return \\"</parameter></tool_call>\\"\\n"}}\n</tool_call>',
        calls=[WRITE],
    ),
    Case(
        "hermes-python-dict-instead-of-json",
        "hermes",
        "<tool_call>{'name': 'get_weather', 'arguments': {'city': 'Paris', 'days': 2}}</tool_call>",
        calls=[PARIS_2],
    ),
    Case(
        "hermes-nested-json",
        "hermes",
        '<tool_call>{"name": "set_config", "arguments": {"config": {"theme": "dark", "limits": {"n": [1, 2]}}, '
        '"tags": ["a", "b"], "on": true}}</tool_call>',
        calls=[CONFIG],
    ),
    Case(
        "hermes-cut-off",
        "hermes",
        'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"ci',
        content='Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"ci',
    ),
    Case(
        "hermes-no-tools-offered",
        "hermes",
        '<tool_call>{"name": "run", "arguments": {"command": "ls"}}</tool_call>',
        content='<tool_call>{"name": "run", "arguments": {"command": "ls"}}</tool_call>',
        tools=False,
    ),
    # ------------------------------------------------------------ Kimi K2
    Case(
        "kimi_k2-text-and-parallel",
        "kimi_k2",
        "Checking.<|tool_calls_section_begin|>"
        + KIMI_CALL.format(name="get_weather", i=0, args='{"city": "Paris"}')
        + KIMI_CALL.format(name="run", i=1, args='{"command": "ls -la"}')
        + "<|tool_calls_section_end|>",
        content="Checking.",
        calls=[PARIS, LS],
    ),
    Case(
        "kimi_k2-after-thinking",
        "kimi_k2",
        "<think>Need weather.</think><|tool_calls_section_begin|>"
        + KIMI_CALL.format(name="get_weather", i=0, args='{"city": "Paris"}')
        + "<|tool_calls_section_end|>",
        reasoning="Need weather.",
        calls=[PARIS],
    ),
    Case(
        "kimi_k2-inside-thinking-without-end-markers",
        "kimi_k2",
        "<think>I need two calls"
        '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}'
        '<|tool_call_begin|>functions.run:1<|tool_call_argument_begin|>{"command": "ls -la"}',
        reasoning="I need two calls",
        calls=[PARIS, LS],
    ),
    Case(
        "kimi_k2-closing-markup-in-a-string",
        "kimi_k2",
        "<|tool_calls_section_begin|>"
        + KIMI_CALL.format(name="note", i=0, args='{"text": "<|tool_call_end|><|tool_calls_section_end|>"}')
        + "<|tool_calls_section_end|>",
        calls=[("note", {"text": "<|tool_call_end|><|tool_calls_section_end|>"})],
    ),
    # ------------------------------------------------------------ Kimi K3
    Case(
        "kimi_k3-thinking-answer-and-calls",
        "kimi_k3",
        "I should call it<|close|>think<|sep|><|open|>response<|sep|>On it.<|close|>response<|sep|>"
        '<|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>'
        + K3_ARG.format(key="city", kind="string", value="Paris")
        + K3_ARG.format(key="days", kind="number", value="2")
        + '<|close|>call<|sep|><|open|>call tool="set_config" index="2"<|sep|>'
        '<|open|>json type="object"<|sep|>{"config": {"theme": "dark", "limits": {"n": [1, 2]}}, '
        '"tags": ["a", "b"], "on": true}<|close|>json<|sep|><|close|>call<|sep|>'
        "<|close|>tools<|sep|><|close|>message<|sep|>",
        reasoning="I should call it",
        content="On it.",
        calls=[PARIS_2, CONFIG],
        started=True,
    ),
    Case(
        "kimi_k3-answer-only",
        "kimi_k3",
        "<|open|>response<|sep|>Use the response tag.<|close|>response<|sep|><|close|>message<|sep|>",
        content="Use the response tag.",
    ),
    Case(
        "kimi_k3-cut-off-in-thinking",
        "kimi_k3",
        "Still thinking when the budget ran out",
        reasoning="Still thinking when the budget ran out",
        started=True,
    ),
    # ------------------------------------------------------------ DeepSeek V3 / R1 / V3.1
    Case(
        "deepseek-r1-after-opened-thinking",
        "deepseek",
        f'Thinking.</think>{DSB}{DCB}function{DSEP}get_weather\n```json\n{{"city": "Paris"}}\n```{DCE}{DSE}',
        reasoning="Thinking.",
        calls=[PARIS],
        started=True,
    ),
    Case(
        "deepseek-v31-text-and-parallel",
        "deepseek",
        f'Both.{DSB}{DCB}get_weather{DSEP}{{"city": "Paris", "days": 2}}{DCE}{DCB}run{DSEP}'
        f'{{"command": "ls -la"}}{DCE}{DSE}',
        content="Both.",
        calls=[PARIS_2, LS],
    ),
    # ------------------------------------------------------------ Mistral
    Case(
        "mistral-v11-parallel-with-ids",
        "mistral",
        '[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}'
        '[TOOL_CALLS]run[CALL_ID]f5g6h7i8j[ARGS]{"command": "ls -la"}',
        calls=[PARIS, LS],
    ),
    Case(
        "mistral-v3-list",
        "mistral",
        'Here.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "123456789"}]',
        content="Here.",
        calls=[PARIS],
    ),
    Case(
        "mistral-after-thinking-and-a-mention-in-it",
        "mistral",
        '[THINK]Maybe [TOOL_CALLS]run[ARGS]{"command": "rm"}? No, the weather.[/THINK]'
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
        reasoning='Maybe [TOOL_CALLS]run[ARGS]{"command": "rm"}? No, the weather.',
        calls=[PARIS],
        think="mistral",
    ),
    Case(
        "mistral-marker-in-a-string",
        "mistral",
        '[TOOL_CALLS]note[ARGS]{"text": "[TOOL_CALLS]x[ARGS]{}"}',
        calls=[("note", {"text": "[TOOL_CALLS]x[ARGS]{}"})],
    ),
    Case(
        "mistral-cut-off",
        "mistral",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Par',
        content='[TOOL_CALLS]get_weather[ARGS]{"city": "Par',
    ),
    # ------------------------------------------------------------ Llama 3.x
    Case("llama3-bare-json", "llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}', calls=[PARIS]),
    Case(
        "llama3-python-tag",
        "llama3",
        '<|python_tag|>{"name": "set_config", "parameters": {"config": {"theme": "dark", "limits": {"n": [1, 2]}}, '
        '"tags": ["a", "b"], "on": true}}',
        calls=[CONFIG],
    ),
    Case(
        "llama32-pythonic-list",
        "llama3",
        '[get_weather(city="Paris", days=2), run(command="ls -la")]',
        calls=[PARIS_2, LS],
    ),
    Case(
        "llama31-builtin-call",
        "llama3",
        '<|python_tag|>brave_search.call(query="weather in Paris")',
        calls=[("brave_search", {"query": "weather in Paris"})],
    ),
    Case("llama3-a-bracket-that-is-text", "llama3", "[1] The first source.", content="[1] The first source."),
    # ------------------------------------------------------------ functionary
    Case(
        "functionary_v31-text-and-parallel",
        "functionary_v31",
        'Both.<function=get_weather>{"city": "Paris"}</function><function=note>{"text": "</function>"}</function>',
        content="Both.",
        calls=[PARIS, ("note", {"text": "</function>"})],
    ),
    Case(
        "functionary_v31-python-tag",
        "functionary_v31",
        "<|python_tag|>print(2 + 3)",
        calls=[("python", {"code": "print(2 + 3)"})],
    ),
    Case("functionary_v32-answer", "functionary_v32", "all\nHello there.", content="Hello there."),
    Case(
        "functionary_v32-text-then-calls",
        "functionary_v32",
        'all\nLet me check.>>>get_weather\n{"city": "Paris"}>>>run\n{"command": "ls -la"}',
        content="Let me check.",
        calls=[PARIS, LS],
    ),
    Case(
        "functionary_v32-cut-off",
        "functionary_v32",
        'get_weather\n{"city": "Pa',
        content='>>>get_weather\n{"city": "Pa',
    ),
    # ------------------------------------------------------------ FireFunction v2
    Case(
        "firefunction-parallel",
        "firefunction",
        ' functools[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "run", "arguments": {"command": "ls -la"}}]',
        calls=[PARIS, LS],
    ),
    Case("firefunction-answer", "firefunction", "Hello, world!", content="Hello, world!"),
    # ------------------------------------------------------------ Command R7B / Command A (Cohere)
    Case(
        "cohere-after-thinking-parallel",
        "cohere",
        "<|START_THINKING|>Plan.<|END_THINKING|><|START_ACTION|>[\n"
        '    {"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Paris"}},\n'
        '    {"tool_call_id": "1", "tool_name": "run", "parameters": {"command": "ls -la"}}\n]<|END_ACTION|>',
        reasoning="Plan.",
        calls=[PARIS, LS],
        think="cohere",
    ),
    Case(
        "cohere-response-tags-dropped",
        "cohere",
        "<|START_RESPONSE|>Hello, world!<|END_RESPONSE|>",
        content="Hello, world!",
        think="cohere",
    ),
    Case(
        "cohere2-opened-thinking-and-text",
        "cohere",
        "I'm thinking<|END_THINKING|><|START_TEXT|>Hello!<|END_TEXT|>",
        reasoning="I'm thinking",
        content="Hello!",
        think="cohere",
        started=True,
    ),
    Case(
        "command_r_plus-action",
        "command_r_plus",
        'Action:\n```json\n[{"tool_name": "get_weather", "parameters": {"city": "Paris"}}]\n```',
        calls=[PARIS],
    ),
    # ------------------------------------------------------------ JSON lists in tags
    Case(
        "nemotron-after-opened-thinking",
        "nemotron",
        'I\'m\nthinking\n</think>\n<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "run", "arguments": {"command": "ls -la"}}]</TOOLCALL>\n',
        reasoning="I'm\nthinking\n",
        calls=[PARIS, LS],
        started=True,
    ),
    Case(
        "apriel-reasoning-then-call",
        "apriel",
        'Thinking here.\n[BEGIN FINAL RESPONSE]\n<tool_calls>[{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}]</tool_calls>',
        reasoning="Thinking here.\n",
        calls=[PARIS],
        think="apriel",
    ),
    Case(
        "apriel-answer",
        "apriel",
        "Simple.\n[BEGIN FINAL RESPONSE]\nIt is 5.\n[END FINAL RESPONSE]",
        reasoning="Simple.\n",
        content="It is 5.\n",
        think="apriel",
    ),
    Case(
        "minimax_m1-json-lines",
        "minimax_m1",
        '<tool_calls>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        '{"name": "run", "arguments": {"command": "ls -la"}}\n</tool_calls>',
        calls=[PARIS, LS],
    ),
    Case(
        "granite-tool-call-list",
        "granite",
        '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        calls=[PARIS],
        think="granite",
    ),
    Case(
        "granite-thinking-and-response-tags",
        "granite",
        "<think>Plan.</think><response>Hello!</response>",
        reasoning="Plan.",
        content="Hello!",
        think="granite",
    ),
    Case(
        "gigachat-function-call",
        "gigachat",
        'Let me see.<|message_sep|>\n\nfunction call<|role_sep|>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}',
        content="Let me see.",
        calls=[PARIS],
    ),
    Case(
        "gigachat31-function-call",
        "gigachat",
        '<|function_call|>{"name": "get_weather", "arguments": {"city": "Paris"}}',
        calls=[PARIS],
    ),
    Case(
        "apertus-name-keyed",
        "apertus",
        '<|tools_prefix|>[{"get_weather": {"city": "Paris"}}, {"run": {"command": "ls -la"}}]<|tools_suffix|>',
        calls=[PARIS, LS],
    ),
    Case(
        "solar-thinking-and-calls",
        "solar",
        "<|think|>Plan.<|end|><|begin|>assistant<|tool_calls|><|tool_call:begin|>abc<|tool_call:name|>"
        'get_weather<|tool_call:args|>{"city": "Paris"}<|tool_call:end|><|calls|>',
        reasoning="Plan.",
        calls=[PARIS],
        think="solar",
    ),
    # ------------------------------------------------------------ Gemma 4
    Case(
        "gemma4-after-thinking-parallel",
        "gemma4",
        '<|channel>thought\nPlan.<channel|><|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:2}<tool_call|>'
        '<|tool_call>call:run{command:<|"|>ls -la<|"|>}<tool_call|>',
        reasoning="Plan.",
        calls=[PARIS_2, LS],
        think="gemma4",
    ),
    Case(
        "gemma4-text-nested-and-markup-in-a-string",
        "gemma4",
        'Setting it.<|tool_call>call:set_config{config:{theme:<|"|>dark<|"|>,limits:{n:[1,2]}},'
        'tags:[<|"|>a<|"|>,<|"|>b<|"|>],on:true}<tool_call|>'
        '<|tool_call>call:note{text:<|"|>}<tool_call|>{<|"|>}<tool_call|>',
        content="Setting it.",
        calls=[CONFIG, ("note", {"text": "}<tool_call|>{"})],
        think="gemma4",
    ),
    Case(
        "gemma4-empty-thinking-and-stray-markers",
        "gemma4",
        "<|channel><|channel>thought\n<channel|>Hello!<|channel>thought\n<channel|><channel|>",
        content="Hello!",
        think="gemma4",
    ),
    # ------------------------------------------------------------ LFM2
    Case(
        "lfm2-text-and-parallel",
        "lfm2",
        'Let me check.<|tool_call_start|>[get_weather(city="Paris", days=2), run(command="ls -la")]<|tool_call_end|>',
        content="Let me check.",
        calls=[PARIS_2, LS],
    ),
    Case(
        "lfm2-python-literals",
        "lfm2",
        '<|tool_call_start|>[set_config(config={"theme": "dark", "limits": {"n": [1, 2]}}, tags=["a", "b"], '
        'on=True), note(text=None, n=3), write_file(path="a.py", content="def f():\\n    return '
        '\\"</parameter></tool_call>\\"\\n")]<|tool_call_end|>',
        calls=[CONFIG, ("note", {"text": None, "n": 3}), WRITE],
    ),
    Case(
        "lfm2-dotted-name-after-thinking",
        "lfm2",
        '<think>Plan.</think><|tool_call_start|>[Calendar.create_event(title="demo", people=["Ada", "Bo"])]'
        "<|tool_call_end|>",
        reasoning="Plan.",
        calls=[("Calendar.create_event", {"title": "demo", "people": ["Ada", "Bo"]})],
    ),
    Case(
        "lfm2-markdown-links-stay-text",
        "lfm2",
        "See [the docs](https://example.org) and [this](x).",
        content="See [the docs](https://example.org) and [this](x).",
    ),
    Case(
        "lfm2-mention-in-thinking",
        "lfm2",
        '<think>About <|tool_call_start|>[run(command="rm")]<|tool_call_end|> no.</think>'
        '<|tool_call_start|>[run(command="ls -la")]<|tool_call_end|>',
        reasoning='About <|tool_call_start|>[run(command="rm")]<|tool_call_end|> no.',
        calls=[LS],
    ),
    Case(
        "lfm2-cut-off",
        "lfm2",
        '<|tool_call_start|>[get_weather(city="Pa',
        content='<|tool_call_start|>[get_weather(city="Pa',
    ),
    # ------------------------------------------------------------ Gemma 3 tool_code
    Case(
        "gemma-tool-code",
        "gemma",
        'I will look it up.\n```tool_code\nget_weather(city="Paris")\n```',
        content="I will look it up.",
        calls=[PARIS],
    ),
    # ------------------------------------------------------------ gpt-oss harmony
    Case(
        "harmony-analysis-then-call",
        "harmony",
        "<|channel|>analysis<|message|>They want the weather.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>',
        reasoning="They want the weather.",
        calls=[PARIS],
    ),
    Case(
        "harmony-recipient-before-the-channel",
        "harmony",
        ' to=functions.get_weather<|channel|>analysis<|message|>{"city": "Paris", "days": 2}',
        calls=[PARIS_2],
    ),
    Case(
        "harmony-builtin-tool-is-not-the-answer",
        "harmony",
        "<|channel|>analysis<|message|>I will run python.<|end|><|start|>assistant<|channel|>commentary "
        "to=python <|constrain|>code<|message|>print(1)",
        reasoning="I will run python.print(1)",
    ),
    Case(
        "harmony-two-channel-tags",
        "harmony",
        "<|channel|>commentary to=assistant<|channel|>analysis<|message|>Hmm.<|end|><|start|>assistant"
        "<|channel|>final<|message|>It is 5.<|return|>",
        reasoning="Hmm.",
        content="It is 5.",
    ),
    # ------------------------------------------------------------ Muse
    Case(
        "muse-thinking-then-call",
        "muse",
        " to=self<|message|>Plan.<|eom|><|start|>assistant to=get_weather<|message|><atem:function_calls>\n"
        '<atem:invoke name="get_weather">\n<atem:parameter name="city">Paris</atem:parameter>\n'
        '<atem:parameter name="days">2</atem:parameter>\n</atem:invoke>\n</atem:function_calls>',
        reasoning="Plan.",
        calls=[PARIS_2],
    ),
    Case(
        "muse-quoted-markup-is-text",
        "muse",
        ' to=user<|message|>Like this: <atem:function_calls><atem:invoke name="ping"></atem:invoke>'
        "</atem:function_calls><|eot|>",
        content='Like this: <atem:function_calls><atem:invoke name="ping"></atem:invoke></atem:function_calls>',
    ),
    # ------------------------------------------------------------ the generic JSON fallback
    Case(
        "json-fenced",
        "json",
        '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```',
        calls=[PARIS],
    ),
    Case(
        "json-an-answer-that-is-json",
        "json",
        '{"name": "Ada", "arguments": {"born": 1815}}',
        content='{"name": "Ada", "arguments": {"born": 1815}}',
    ),
]
