"""Every chat template llama.cpp publishes renders in Glassbox as transformers' reference renders it.

The templates are read from the pinned llama-cpp-python sdist at test time (`tests/llama_sdist.py`),
never copied here. For each one and each conversation below (a plain chat; a system prompt; tools
offered; a call whose arguments are a dict or JSON text, and its result; a follow-up after it; with
and without the generation prompt; each value of each thinking switch the template reads),
Glassbox's prompt is compared with the one `transformers.utils.chat_template_utils.render_jinja_template`
renders for the same inputs.

Where they differ, the difference must be one that ARCHITECTURE.md lists ("Chat templates: where
Glassbox differs from the reference"): the reference, given the input as Glassbox rewrites it (the
fallback tool prompt, the folded system prompt, parsed arguments...; transformers' renderer with
Glassbox's dialect where the sandbox differs), renders exactly Glassbox's prompt, and each rewrite
applied is needed (without it the reference renders something else, or raises). Every listed
difference shows up somewhere, so the list cannot rot, and no prompt has an HTML entity the
reference's has not.

The facts Glassbox reports per template are checked against the template's text and the
reference: tool support, whether calls render, the arguments' form, the thinking switches.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import date, datetime
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from jinja2.exceptions import SecurityError
from jinja2.sandbox import SandboxedEnvironment

from engine.errors import TemplateError
from engine.inference import template_sandbox, templates
from engine.inference.templates import ChatTemplate, Switch, select_template
from engine.inference.tool_prompt import fold_tools, template_message
from engine.inference.tools import ToolSpec
from tests import llama_sdist

ROOT = Path(__file__).resolve().parents[2]
BOS, EOS = "<s>", "</s>"
NOW = datetime(2026, 3, 14, 9, 26, 53)
"""The clock both renderers read (Llama 3.2 and Granite print today's date)."""

WEATHER = ToolSpec(
    "get_weather",
    "Gets the current weather for a city.",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "The city, e.g. Zürich"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "The unit"},
        },
        "required": ["city"],
    },
)
ARGS = {"city": "Zürich", "unit": "celsius"}
ARGS_TEXT = '{"city":"Zürich","unit":"celsius"}'
"""The arguments as a model may write them (compact, not as json.dumps would)."""
RESULT = 'Sunny, 22 °C, wind < 5 km/h & "calm"'
SYSTEM = 'You are a helpful assistant. Keep answers <short> & "polite".'

THOUGHT = {"reasoning_content": "Let me think.", "reasoning": "Let me think.", "thought": "Let me think."}
HISTORY_WITH_THINKING: list[dict[str, Any]] = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "Hi!"},
    {"role": "assistant", "content": "<think>A greeting.</think>Hello!", **THOUGHT},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "4", **THOUGHT},
    {"role": "user", "content": "Thanks."},
]
"""For the switches that change how earlier thinking renders (the reference only: Glassbox never
sends earlier thinking back): thinking as a message field (under the names templates read) and
inside the text."""

THINKING_NAME = re.compile(r"think|reason|thought|effort", re.IGNORECASE)
ENTITY = re.compile(r"&(?:[a-zA-Z]+|#[0-9]+|#x[0-9a-fA-F]+);")
EXERCISED_ELSEWHERE = {
    "null-content": "test_null_content_renders_as_empty_text_where_the_reference_raises",
    "do-tag": "tests/engine/test_template_dialect.py",
    "limits": "tests/engine/test_templates.py, tests/engine/test_template_limits.py",
}
"""Listed differences that no case of the matrix shows, and the tests that show them."""


def chat(*, system: bool) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = [
        {"role": "user", "content": 'Is 3 < 5 & is "A" a letter?'},
        {"role": "assistant", "content": "Yes, and yes."},
        {"role": "user", "content": "Wie ist das Wetter in Zürich?"},
    ]
    return [{"role": "system", "content": SYSTEM}, *turns] if system else turns


def tool_turn(arguments: dict[str, Any] | str, *, follow_up: bool = False) -> list[dict[str, Any]]:
    call = {"id": "call12345", "type": "function", "function": {"name": WEATHER.name, "arguments": arguments}}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What's the weather in Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": RESULT, "tool_call_id": "call12345", "name": WEATHER.name},
    ]
    if follow_up:
        messages += [
            {"role": "assistant", "content": "It is sunny and 22 °C in Zürich."},
            {"role": "user", "content": "And in Paris?"},
        ]
    return messages


@dataclass(frozen=True)
class Case:
    """One rendering: what Glassbox is given (the reference gets the same)."""

    name: str
    messages: list[dict[str, Any]]
    tools: tuple[ToolSpec, ...] = ()
    generation_prompt: bool = True
    switches: Mapping[str, object] = field(default_factory=dict)
    legacy: bool = False  # the switch goes through render's enable_thinking / reasoning_effort


BASE_CASES = (
    Case("chat", chat(system=False)),
    Case("chat, no generation prompt", chat(system=False), generation_prompt=False),
    Case("system", chat(system=True)),
    Case("system, no generation prompt", chat(system=True), generation_prompt=False),
    Case("tools offered", chat(system=True), (WEATHER,)),
    Case("call (dict) and result", tool_turn(ARGS), (WEATHER,)),
    Case("call (dict) and result, no generation prompt", tool_turn(ARGS), (WEATHER,), generation_prompt=False),
    Case("call (JSON text) and result", tool_turn(ARGS_TEXT), (WEATHER,)),
    Case("call (dict), result, follow-up", tool_turn(ARGS, follow_up=True), (WEATHER,)),
    Case("call (JSON text), result, follow-up", tool_turn(ARGS_TEXT, follow_up=True), (WEATHER,)),
)


def values_of(switch: Switch) -> tuple[object, ...]:
    """The values to try for a switch: both for a bool, two budgets, the strings the template names."""
    if switch.kind == "bool":
        return (True, False)
    if switch.kind == "number":
        return (0, 512)
    named = (*switch.values, *((switch.default,) if isinstance(switch.default, str) else ()))
    return tuple(dict.fromkeys(named if switch.values else (*named, "low", "medium", "high")))


def cases_for(template: ChatTemplate) -> list[Case]:
    cases = list(BASE_CASES)
    for name, value in ((s.name, v) for s in template.switches for v in values_of(s)):
        legacy = name == "enable_thinking" or (name == "reasoning_effort" and value in ("low", "medium", "high"))
        for base in (BASE_CASES[0], BASE_CASES[4]):
            cases.append(Case(f"{base.name}, {name}={value!r}", base.messages, base.tools, True, {name: value}, legacy))
    return cases


# ---------------------------------------------------------------- the two renderers
@pytest.fixture(scope="module")
def hf() -> ModuleType:
    from transformers.utils import chat_template_utils

    return chat_template_utils


@pytest.fixture(autouse=True)
def frozen_clock(monkeypatch: pytest.MonkeyPatch, hf: ModuleType) -> None:
    class Frozen(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Frozen:
            return cls(NOW.year, NOW.month, NOW.day, NOW.hour, NOW.minute, NOW.second)

    class Today(date):
        @classmethod
        def today(cls) -> Today:
            return cls(NOW.year, NOW.month, NOW.day)

    monkeypatch.setattr(hf, "datetime", Frozen)
    monkeypatch.setattr(template_sandbox, "datetime", Frozen)
    monkeypatch.setattr(templates, "date", Today)


class Refused(Exception):
    """The reference renderer raised."""


def reference(
    hf: ModuleType,
    source: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    generation_prompt: bool,
    kwargs: Mapping[str, Any],
    *,
    dialect: bool = False,
) -> str:
    """transformers' rendering; with ``dialect``, in Glassbox's dialect (a mutable sandbox and a
    tojson that writes iterators as lists, ARCHITECTURE.md's owned-containers and tojson-iterators).

    Raises:
        Refused: the reference raised (the exception is its cause).
    """
    try:
        if not dialect:
            rendered, _ = hf.render_jinja_template(
                [copy.deepcopy(messages)],
                tools=copy.deepcopy(tools),
                chat_template=source,
                add_generation_prompt=generation_prompt,
                bos_token=BOS,
                eos_token=EOS,
                **kwargs,
            )
            return str(rendered[0])
        compiled = _dialect_template(hf, source)
        return str(
            compiled.render(
                messages=copy.deepcopy(messages),
                tools=copy.deepcopy(tools),
                documents=None,
                add_generation_prompt=generation_prompt,
                bos_token=BOS,
                eos_token=EOS,
                **kwargs,
            )
        )
    except Exception as exc:
        raise Refused(f"{type(exc).__name__}: {exc}") from exc


@cache
def _dialect_template(hf: ModuleType, source: str) -> Any:
    real = hf.ImmutableSandboxedEnvironment
    hf.ImmutableSandboxedEnvironment = SandboxedEnvironment
    try:
        compiled = hf._cached_compile_jinja_template(source)
    finally:
        hf.ImmutableSandboxedEnvironment = real
    tojson = compiled.environment.filters["tojson"]
    compiled.environment.filters["tojson"] = lambda value, **kw: tojson(
        list(value) if isinstance(value, Iterator) else value, **kw
    )
    return compiled


def glassbox(template: ChatTemplate, case: Case) -> str:
    if case.legacy:
        (name, value), *_ = case.switches.items()
        option = {"enable_thinking": value} if name == "enable_thinking" else {"reasoning_effort": value}
        return template.render(case.messages, case.generation_prompt, tools=list(case.tools), **option)  # type: ignore[arg-type]
    return template.render(case.messages, case.generation_prompt, tools=list(case.tools), switches=case.switches)


# ---------------------------------------------------------------- Glassbox's rewrites of the input
def fold_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system" and m["content"])
    rest = [dict(m) for m in messages if m["role"] != "system"]
    first_user = next(m for m in rest if m["role"] == "user")
    first_user["content"] = f"{system}\n\n{first_user['content']}"
    return rest


def with_arguments(messages: list[dict[str, Any]], convert: Callable[[Any], Any]) -> list[dict[str, Any]]:
    out = copy.deepcopy(messages)
    for message in out:
        for call in message.get("tool_calls", ()):
            call["function"]["arguments"] = convert(call["function"]["arguments"])
    return out


def has_tool_parts(case: Case) -> bool:
    return bool(case.tools) or any(m["role"] == "tool" or m.get("tool_calls") for m in case.messages)


def has_arguments(case: Case, kind: type) -> bool:
    calls = [c for m in case.messages for c in m.get("tool_calls", ())]
    return any(isinstance(c["function"]["arguments"], kind) for c in calls)


REWRITES = ("fallback-tool-prompt", "arguments-parsed", "arguments-as-text", "system-folded")
REWRITES += ("empty-tool-list", "convention-inputs")


def rewrites_for(template: ChatTemplate, case: Case) -> tuple[str, ...]:
    """The rewrites of ARCHITECTURE.md's list that Glassbox applies to this input."""
    applied = []
    native = template.supports_tools or not has_tool_parts(case)
    if not native:
        applied.append("fallback-tool-prompt")
    elif template.arguments == "object" and has_arguments(case, str):
        applied.append("arguments-parsed")
    elif template.arguments == "string" and has_arguments(case, dict):
        applied.append("arguments-as-text")
    if template.fold_system and any(m["role"] == "system" for m in case.messages):
        applied.append("system-folded")
    if template.empty_tools and (not case.tools or not native):
        applied.append("empty-tool-list")
    if template.conventions:
        applied.append("convention-inputs")
    return tuple(applied)


def rewritten(
    template: ChatTemplate, case: Case, rewrites: tuple[str, ...]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any]]:
    """The reference's input (messages, tools, keyword arguments) after ``rewrites``."""
    messages = copy.deepcopy(case.messages)
    tools = [tool.as_openai() for tool in case.tools] or None
    kwargs: dict[str, Any] = dict(case.switches)
    if case.tools:
        kwargs["tool_choice"] = "auto"
    if "fallback-tool-prompt" in rewrites:
        messages = fold_tools([template_message(m) for m in messages], list(case.tools), "auto")
        tools = None
        kwargs.pop("tool_choice", None)
    if "arguments-parsed" in rewrites:
        messages = with_arguments(messages, lambda a: json.loads(a) if isinstance(a, str) else a)
    if "arguments-as-text" in rewrites:
        messages = with_arguments(messages, lambda a: a if isinstance(a, str) else json.dumps(a, ensure_ascii=False))
    if "system-folded" in rewrites:
        messages = fold_system(messages)
    if "empty-tool-list" in rewrites:
        tools = tools or []
    if "convention-inputs" in rewrites:
        functions = [tool["function"] for tool in tools or ()]
        kwargs["functions"] = json.dumps(functions, ensure_ascii=False, indent=4)
        kwargs["datetime"] = NOW.strftime("%b %d %Y")
    return messages, tools, kwargs


def dialect_difference(refused: Refused) -> str | None:
    """Which of the sandbox's deliberate differences made the reference refuse, if one did."""
    cause = refused.__cause__
    if isinstance(cause, SecurityError) and re.search(r"attribute '(append|pop|extend|update)'", str(cause)):
        return "owned-containers"
    if isinstance(cause, TypeError) and "generator is not JSON serializable" in str(cause):
        return "tojson-iterators"
    return None


# ---------------------------------------------------------------- outcomes
@dataclass
class Outcome:
    case: str
    differences: tuple[str, ...]  # empty: equal to the reference
    problem: str = ""  # not explained by the listed differences


def render_reference(
    hf: ModuleType, source: str, template: ChatTemplate, case: Case, rewrites: tuple[str, ...]
) -> tuple[str, tuple[str, ...]]:
    """The reference's rendering of the rewritten input, in Glassbox's dialect where the plain
    sandbox refuses; and the dialect difference used, if any."""
    messages, tools, kwargs = rewritten(template, case, rewrites)
    try:
        return reference(hf, source, messages, tools, case.generation_prompt, kwargs), ()
    except Refused as refused:
        dialect = dialect_difference(refused)
        if dialect is None:
            raise
        return reference(hf, source, messages, tools, case.generation_prompt, kwargs, dialect=True), (dialect,)


def outcome(hf: ModuleType, source: str, template: ChatTemplate, case: Case) -> Outcome:
    mine = glassbox(template, case)
    messages, tools, kwargs = rewritten(template, case, ())
    try:
        plain: str | None = reference(hf, source, messages, tools, case.generation_prompt, kwargs)
    except Refused:
        plain = None
    if ENTITY.findall(mine) and not set(ENTITY.findall(mine)) <= set(ENTITY.findall(plain or "")):
        return Outcome(case.name, (), f"HTML entities the reference does not write: {set(ENTITY.findall(mine))}")
    if mine == plain:
        return Outcome(case.name, ())
    rewrites = rewrites_for(template, case)
    try:
        expected, dialect = render_reference(hf, source, template, case, rewrites)
    except Refused as refused:
        return Outcome(case.name, rewrites, f"the reference refuses even the rewritten input: {refused}")
    if mine != expected:
        return Outcome(
            case.name, rewrites, f"differs from the reference on the rewritten input\n{_diff(expected, mine)}"
        )
    for needed in rewrites:  # each rewrite changes the reference's rendering
        without = tuple(r for r in rewrites if r != needed)
        try:
            if render_reference(hf, source, template, case, without)[0] == mine:
                return Outcome(case.name, rewrites, f"the listed difference {needed!r} changes nothing here")
        except Refused:
            pass
    if dialect and rewrites:
        try:
            messages, tools, kwargs = rewritten(template, case, rewrites)
            reference(hf, source, messages, tools, case.generation_prompt, kwargs)
        except Refused:
            pass
        else:
            return Outcome(case.name, rewrites, "the dialect difference was not needed")
    if not rewrites and not dialect:
        return Outcome(case.name, (), f"differs from the reference for no listed reason\n{_diff(plain or '', mine)}")
    return Outcome(case.name, (*rewrites, *dialect))


def _diff(expected: str, mine: str) -> str:
    import difflib

    lines = difflib.unified_diff(expected.splitlines(), mine.splitlines(), "reference", "glassbox", lineterm="", n=1)
    return "\n".join(list(lines)[:40])


@cache
def template_source(name: str) -> str:
    return (llama_sdist.llama_cpp_source() / "models" / "templates" / name).read_text(encoding="utf-8")


@cache
def selected(name: str) -> ChatTemplate:
    return select_template(template_source(name), "llama", BOS, EOS)


_OUTCOMES: dict[str, list[Outcome]] = {}


def outcomes(hf: ModuleType, name: str) -> list[Outcome]:
    if name not in _OUTCOMES:
        template = selected(name)
        _OUTCOMES[name] = [outcome(hf, template_source(name), template, case) for case in cases_for(template)]
    return _OUTCOMES[name]


def template_names() -> list[str]:
    try:
        folder = llama_sdist.llama_cpp_source() / "models" / "templates"
    except RuntimeError:
        return ["(the llama-cpp-python sdist is not available)"]
    return sorted(path.name for path in folder.glob("*.jinja"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "template_name" in metafunc.fixturenames:
        metafunc.parametrize("template_name", template_names())


# ---------------------------------------------------------------- tests
def test_every_published_template_is_kept(template_name: str, llama_cpp_source: Path) -> None:
    template = selected(template_name)
    assert template.source == "gguf", template.reason


def test_prompt_equals_the_reference_or_a_listed_difference(
    template_name: str, llama_cpp_source: Path, hf: ModuleType
) -> None:
    problems = [f"{o.case}: {o.problem}" for o in outcomes(hf, template_name) if o.problem]
    assert not problems, "\n\n".join(problems)


def test_the_listed_differences_are_exactly_those_that_show(llama_cpp_source: Path, hf: ModuleType) -> None:
    names = template_names()
    assert len(names) >= 60, names  # the folder is there and the matrix is not empty
    seen = {difference for name in names for o in outcomes(hf, name) for difference in o.differences}
    section = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8").split("## Chat templates: where Glassbox")[1]
    listed = set(re.findall(r"^- \*\*`([a-z-]+)`\*\*", section.split("\n## ")[0], re.MULTILINE))
    assert seen | set(EXERCISED_ELSEWHERE) == listed
    assert not seen & set(EXERCISED_ELSEWHERE)
    equal = sum(1 for name in names for o in outcomes(hf, name) if not o.differences)
    assert equal > 0.7 * sum(len(outcomes(hf, name)) for name in names)  # most render exactly as the reference


def test_null_content_renders_as_empty_text_where_the_reference_raises(llama_cpp_source: Path, hf: ModuleType) -> None:
    # OpenAI's wire sends a call without text as content null; transformers' apply_chat_template
    # drops the key, and templates that read message.content raise.
    refused = []
    for name in template_names():
        template = selected(name)
        empty = tool_turn(ARGS)
        null = copy.deepcopy(empty)
        null[2]["content"] = None
        assert template.render(null, tools=[WEATHER]) == template.render(empty, tools=[WEATHER]), name
        dropped = copy.deepcopy(empty)
        del dropped[2]["content"]
        case = Case("content dropped", dropped, (WEATHER,))
        messages, tools, kwargs = rewritten(template, case, rewrites_for(template, case))
        try:
            reference(hf, template_source(name), messages, tools, True, kwargs)
        except Refused:
            refused.append(name)
    assert "Qwen-QwQ-32B.jinja" in refused


# ---------------------------------------------------------------- facts
def native_input(
    template: ChatTemplate, case: Case
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any]]:
    """The reference's input for ``case`` as if the template rendered tools natively, arguments as given."""
    kept = ("system-folded", "empty-tool-list", "convention-inputs")
    native = replace(template, supports_tools=True, arguments="either")
    return rewritten(template, case, tuple(r for r in rewrites_for(native, case) if r in kept))


def reference_or_dialect(hf: ModuleType, source: str, case: Case, template: ChatTemplate) -> str | None:
    """The reference's rendering of ``case`` (native input), in Glassbox's dialect where only that
    refuses; None where the template refuses the input."""
    messages, tools, kwargs = native_input(template, case)
    try:
        return reference(hf, source, messages, tools, case.generation_prompt, kwargs)
    except Refused as refused:
        if dialect_difference(refused) is None:
            return None
        return reference(hf, source, messages, tools, case.generation_prompt, kwargs, dialect=True)


def region(rendered: str | None, question: str, result: str) -> str | None:
    """What a rendering shows between the question and the tool's result (where the call is)."""
    _, found, tail = (rendered or "").rpartition(question)
    return tail.split(result)[0] if found and result in tail else None


def test_tool_facts_match_the_source_and_the_reference(
    template_name: str, llama_cpp_source: Path, hf: ModuleType
) -> None:
    template, source = selected(template_name), template_source(template_name)
    listed = reference_or_dialect(hf, source, BASE_CASES[4], template) or ""
    reads_tools = {"tools", "functions"} & hf._get_template_variables(source)  # FireFunction's are `functions`
    shows_list = bool(reads_tools) and WEATHER.name in listed.split("Wie ist das")[0]
    # Plain parts of the question and the result (templates may write them as JSON strings).
    question, result = "the weather in", "Sunny, 22"
    as_dict = region(reference_or_dialect(hf, source, BASE_CASES[5], template), question, result)
    as_text = region(reference_or_dialect(hf, source, BASE_CASES[7], template), question, result)
    assert template.supports_tools == (shows_list and (as_dict is not None or as_text is not None))
    shows_call = any(WEATHER.name in r for r in (as_dict, as_text) if r is not None)
    assert template.renders_calls == (template.supports_tools and shows_call), (as_dict, as_text)
    if not template.renders_calls:
        assert template.arguments == "object"
        return
    dict_ok = as_dict is not None and "Zürich" in as_dict and "'city'" not in as_dict
    text_ok = as_text is not None and ARGS_TEXT in as_text
    assert template.arguments == ("either" if dict_ok and text_ok else "string" if text_ok else "object")
    if template.arguments == "either":  # the template tells text from a dict itself
        assert re.search(r"arguments'?\]?\s+is\s+(not\s+)?(string|mapping)", source)


def test_thinking_switches_match_the_source_and_the_reference(
    template_name: str, llama_cpp_source: Path, hf: ModuleType
) -> None:
    template, source = selected(template_name), template_source(template_name)
    assert template.thinking == frozenset(s.name for s in template.switches)
    reads = hf._get_template_variables(source)
    probes = (
        BASE_CASES[0],
        BASE_CASES[2],
        BASE_CASES[4],
        Case("tools offered, no system prompt", chat(system=False), (WEATHER,)),
        Case("earlier thinking", HISTORY_WITH_THINKING),
        Case(
            "a call after thinking",
            [{**m, **THOUGHT} if m.get("tool_calls") else m for m in tool_turn(ARGS)],
            (WEATHER,),
        ),
    )
    generic = (True, False, "low", "medium", "high", "max", "none", "enabled", "disabled", "on", "off", 0, 1024)

    def changes(name: str, values: tuple[object, ...]) -> bool:
        """Whether setting ``name`` changes the reference's rendering of a probe, with the other
        switches unset or at each of their values (Laguna's preserve_thinking shows only with
        enable_thinking off)."""
        others = [s for s in template.switches if s.name != name]
        settings: list[dict[str, object]] = [{}]
        for other in others:
            settings += [{**setting, other.name: v} for setting in settings for v in values_of(other)]
        for case in probes:
            for setting in settings:
                unset = reference_or_dialect(hf, source, replace(case, switches=setting), template)
                for value in values:
                    with_value = reference_or_dialect(
                        hf, source, replace(case, switches={**setting, name: value}), template
                    )
                    if with_value not in (unset, None):
                        return True
        return False

    for switch in template.switches:
        assert switch.name in reads and THINKING_NAME.search(switch.name)
        assert changes(switch.name, values_of(switch)), f"{switch.name} changes nothing the reference renders"
    for name in sorted(n for n in reads if THINKING_NAME.search(n) and template.switch(n) is None):
        assert not changes(name, generic), f"the template reads {name!r}, which is not reported"


def test_a_switch_the_template_does_not_read_is_refused(llama_cpp_source: Path) -> None:
    qwen = selected("Qwen-Qwen3-0.6B.jinja")
    with pytest.raises(TemplateError, match="reads no switch 'thinking_budget'"):
        qwen.render(chat(system=False), switches={"thinking_budget": 10})
    with pytest.raises(TemplateError, match="takes a bool"):
        qwen.render(chat(system=False), switches={"enable_thinking": "yes"})
    seed = selected("ByteDance-Seed-OSS.jinja")
    assert seed.switch("thinking_budget") is not None
    assert "the thinking budget, which is 512." in seed.render(chat(system=False), switches={"thinking_budget": 512})
