"""Tools in a prompt: the chat-template context for templates that know tools, and the documented
fallback prompt for those that do not.

Contract: ARCHITECTURE.md, 'engine.inference.tool_prompt'.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from engine.errors import TemplateError
from engine.inference.sampling import ENFORCED_FORMATS, ENFORCED_KEYWORDS, SCHEMA_LISTS, SCHEMA_MAPS
from engine.inference.tools import ToolSpec

FALLBACK_INSTRUCTIONS = (
    "You can call tools. To call one, answer with only a JSON object on one line, and nothing else:\n"
    '{"name": "<tool name>", "arguments": {<the arguments, as the tool\'s schema says>}}\n'
    "After the call you will get its result; then answer the user, or call another tool."
)
RESULT_HEADER = "[tool result]"
NO_CALL_NOTE = "Do not call a tool now: answer the user with what you have."
"""The note of ``tool_choice="none"`` when the tools stay in the prompt (an agent's step limit)."""


ArgumentsForm = Literal["object", "string", "either"]
"""How a chat template wants a call's arguments: a dict (the Hugging Face convention), JSON text
(functionary v3.2 writes ``'\\n' + arguments``), or either, as given (it tests ``is string``)."""


def template_message(message: Mapping[str, Any], arguments: ArgumentsForm = "object") -> dict[str, Any]:
    """A message as templates see it: text fields as strings (``None`` content as ``""``, as
    llama.cpp passes it), tool parts in the Hugging Face shape, arguments in the ``arguments`` form."""
    plain: dict[str, Any] = {"role": str(message["role"]), "content": str(message.get("content") or "")}
    calls = message.get("tool_calls")
    if calls:
        plain["tool_calls"] = [plain_call(call, arguments) for call in calls]
    for key in ("tool_call_id", "name"):
        if message.get(key):
            plain[key] = str(message[key])
    return plain


def plain_call(call: Mapping[str, Any], form: ArgumentsForm = "object") -> dict[str, Any]:
    """One call in the Hugging Face shape, its arguments in ``form``: a dict (OpenAI's wire sends
    JSON text, which is parsed), JSON text (a dict written by :func:`json.dumps`), or as given.

    Raises:
        TemplateError: the arguments are not a JSON object.
    """
    function = call.get("function") or call
    given = function.get("arguments") or {}
    arguments = given
    if isinstance(given, str):
        try:
            arguments = json.loads(given)
        except json.JSONDecodeError:
            raise TemplateError(f"tool call {function.get('name')!r}: its arguments are not JSON") from None
    if not isinstance(arguments, dict):
        raise TemplateError(f"tool call {function.get('name')!r}: its arguments must be a JSON object")
    if form == "string":
        arguments = given if isinstance(given, str) else json.dumps(arguments, ensure_ascii=False)
    elif form == "either":
        arguments = given
    return {
        "id": str(call.get("id") or ""),
        "type": "function",
        "function": {"name": str(function.get("name") or ""), "arguments": arguments},
    }


def has_tool_parts(message: Mapping[str, Any]) -> bool:
    """Whether a message is a tool result or carries calls."""
    return message["role"] == "tool" or bool(message.get("tool_calls"))


def tool_entries(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """The template's ``tools`` variable: OpenAI-shaped entries."""
    return [tool.as_openai() for tool in tools]


def fallback_system_text(tools: Sequence[ToolSpec]) -> str:
    """The fallback prompt's tool description (goes into the system message; the same for every
    tool choice, so the steps of a turn share it)."""
    lines = [FALLBACK_INSTRUCTIONS, "", "Tools (JSON schema of each one's arguments):"]
    for tool in tools:
        entry = {"name": tool.name, "description": tool.description, "parameters": tool.parameters}
        lines.append(json.dumps(entry, ensure_ascii=False))
    return "\n".join(lines)


def keeps_tools(tool_choice: str, messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the tools are rendered: for every choice but ``none``, and for ``none`` too when the
    conversation holds calls or results (the prompt of an agent's last step keeps the tool block of
    the steps before it, as OpenAI's ``none`` keeps the tools in the model's view)."""
    return tool_choice != "none" or any(has_tool_parts(m) for m in messages)


def choice_note(tool_choice: str, *, native: bool) -> str:
    """The line that tells the model this step's tool choice ("" for none): ``none`` (with the tools
    still rendered) gets :data:`NO_CALL_NOTE`; ``required`` and a named function get theirs only in
    the fallback prompt (``native=False``); a template with tool support relies on the grammar."""
    if tool_choice == "none":
        return NO_CALL_NOTE
    if native or tool_choice == "auto":
        return ""
    if tool_choice == "required":
        return "You must call one of these tools now."
    return f"You must call the tool {tool_choice} now."


def with_note(messages: list[dict[str, Any]], note: str) -> list[dict[str, Any]]:
    """``messages`` with ``note`` appended to the last one (a user message or a tool result; after
    anything else, as a new user message), so the note changes nothing before it."""
    if not note:
        return messages
    if messages and messages[-1]["role"] in ("user", "tool"):
        last = messages[-1]
        text = str(last.get("content") or "")
        return [*messages[:-1], {**last, "content": f"{text}\n\n{note}" if text else note}]
    return [*messages, {"role": "user", "content": note}]


def call_json(name: str, arguments: dict[str, Any]) -> str:
    """An earlier call as the fallback prompt shows it (and as the ``json`` family parses it)."""
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)


def fold_tools(messages: Sequence[dict[str, Any]], tools: Sequence[ToolSpec], tool_choice: str) -> list[dict[str, Any]]:
    """Rewrites a conversation with tools for a template without tool support.

    Args:
        messages: template dicts (``role``, ``content``, and ``tool_calls`` / ``tool_call_id`` /
            ``name`` where present).
        tools: the tools offered (none: only earlier calls and results are rewritten).
        tool_choice: ``auto``, ``required``, a function name, or ``none`` (tools given with it are
            described, and the model told not to call one: see :func:`keeps_tools`).

    Returns:
        Plain ``role``/``content`` dicts: the tool description prepended to the system message
        (one is created if there is none), calls as JSON text, results as user messages, and the
        choice's note (:func:`choice_note`) at the end of the last message.
    """
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message["role"]
        content = str(message.get("content") or "")
        if role == "assistant" and message.get("tool_calls"):
            calls = [
                call_json(call["function"]["name"], call["function"]["arguments"]) for call in message["tool_calls"]
            ]
            text = "\n".join([content, *calls]) if content.strip() else "\n".join(calls)
            out.append({"role": "assistant", "content": text})
        elif role == "tool":
            name = message.get("name") or "tool"
            block = f"{RESULT_HEADER} {name} (call {message.get('tool_call_id') or '?'}):\n{content}"
            if out and out[-1]["role"] == "user" and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_results": True})
        else:
            out.append({"role": role, "content": content})
    for message in out:
        message.pop("_tool_results", None)
    if tools:
        described = fallback_system_text(tools)
        if out and out[0]["role"] == "system":
            head = out[0]["content"]
            out[0] = {"role": "system", "content": f"{head}\n\n{described}" if head else described}
        else:
            out.insert(0, {"role": "system", "content": described})
        out = with_note(out, choice_note(tool_choice, native=False))
    return out


def call_schema(tools: Sequence[ToolSpec], tool_choice: str) -> dict[str, Any] | None:
    """The JSON schema of the call a constrained generation must produce, or None for ``auto`` and
    ``none``: ``{"name": <const>, "arguments": <the tool's schema>}``, one tool for a named choice,
    any of them (``anyOf``) for ``required``."""
    if tool_choice in ("auto", "none"):
        return None
    chosen = [tool for tool in tools if tool_choice == "required" or tool.name == tool_choice]
    variants = [
        {
            "type": "object",
            "properties": {"name": {"const": tool.name}, "arguments": _object_schema(tool.parameters)},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for tool in chosen
    ]
    if not variants:
        return None
    return variants[0] if len(variants) == 1 else {"anyOf": variants}


def _object_schema(parameters: dict[str, Any]) -> dict[str, Any]:
    schema = enforceable_schema(parameters)
    assert isinstance(schema, dict)
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    return schema


GRAMMAR_KEYWORDS = (ENFORCED_KEYWORDS - {"format"}) | {"description", "title"}
"""What a constrained call's schema keeps: the keywords llama.cpp's schema-to-grammar converter
enforces (``engine.inference.sampling``'s list, the one place it is kept) and two annotations; a
``format`` stays only when the converter enforces it."""


def enforceable_schema(schema: Any) -> Any:
    """A tool's argument schema with only what a grammar can enforce (for constrained calls).

    Tool schemas (from MCP servers especially) carry checks a grammar cannot express (``minimum``,
    ``multipleOf``, ``uniqueItems``, most formats, ...). The grammar enforces the structure; the
    full schema is checked on the arguments before the tool runs (engine/agent/loop.py).
    """
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "format" and value in ENFORCED_FORMATS:
            out[key] = value
        elif key not in GRAMMAR_KEYWORDS:
            continue
        elif key in SCHEMA_LISTS and isinstance(value, list):
            out[key] = [enforceable_schema(sub) for sub in value]
        elif key in SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: enforceable_schema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = enforceable_schema(value)
        else:
            out[key] = value
    return out
