"""Body parsers of the formats that write each argument between tags, typed by the tool's schema
(:func:`engine.inference.tool_calls.values.typed_value`):

Contract: ARCHITECTURE.md, 'engine.inference.tool_calls.xml_calls'.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from engine.inference.tool_calls.call import INCOMPLETE, Parsed, ParsedCall, Schemas, single_raw
from engine.inference.tool_calls.values import property_schema, schema_types, typed_value


def _value(text: str, schemas: Schemas, tool: str, key: str) -> Any:
    return typed_value(text, property_schema(schemas.get(tool), key))


def _ends_value(text: str, at: int, nexts: tuple[str, ...]) -> bool:
    """Whether ``text`` from ``at`` (after whitespace) starts one of ``nexts`` or is over."""
    rest = text[at:].lstrip()
    return not rest or rest.startswith(nexts)


def _close_of_value(text: str, start: int, close: str, nexts: tuple[str, ...]) -> int:
    """Where a value that begins at ``start`` ends: the first ``close`` followed by one of
    ``nexts`` or by the end of the body; -1 when there is none (the value goes on)."""
    at = text.find(close, start)
    while at >= 0:
        if _ends_value(text, at + len(close), nexts):
            return at
        at = text.find(close, at + 1)
    return -1


# ---------------------------------------------------------------- <function=NAME><parameter=KEY>
QWEN_FUNCTION = "<function="
QWEN_FUNCTION_END = "</function>"
QWEN_PARAMETER = "<parameter="
QWEN_PARAMETER_END = "</parameter>"


def _one_newline(value: str) -> str:
    """A value as Qwen writes it, ``\nVALUE\n``: one newline off each side (Seed-OSS writes the
    value alone, and a value of its own may end with a newline: kept)."""
    if not value.startswith("\n"):
        return value
    value = value[1:]
    return value.removesuffix("\r\n") if value.endswith("\r\n") else value.removesuffix("\n")


def qwen_function(body: str, raw: str, schemas: Schemas) -> Parsed:
    """A ``<function=NAME>...`` a model wrote without the ``<tool_call>`` around it (the stream
    parser stopped at its ``</function>``)."""
    return qwen_xml(body.rstrip() + QWEN_FUNCTION_END, raw, schemas)


def qwen_xml(body: str, raw: str, schemas: Schemas) -> Parsed:
    """``<function=NAME>`` with ``<parameter=KEY>`` values, each function closed by ``</function>``
    (the body of a ``<tool_call>``)."""
    text = body.strip()
    calls: list[ParsedCall] = []
    at = 0
    while at < len(text):
        if not text.startswith(QWEN_FUNCTION, at):
            return None if text[at:].strip() else single_raw(calls, raw) or None
        start = at
        head_end = text.find(">", at)
        if head_end < 0:
            return INCOMPLETE
        name = text[at + len(QWEN_FUNCTION) : head_end].strip()
        if not name or "<" in name or "\n" in name:
            return None
        at = head_end + 1
        arguments: dict[str, Any] = {}
        while True:
            rest = text[at:].lstrip()
            at = len(text) - len(rest)
            if rest.startswith(QWEN_FUNCTION_END):
                at += len(QWEN_FUNCTION_END)
                break
            if not rest:
                return INCOMPLETE  # the closing marker was inside a value
            if not rest.startswith(QWEN_PARAMETER):
                return None
            key_end = text.find(">", at)
            if key_end < 0:
                return INCOMPLETE
            key = text[at + len(QWEN_PARAMETER) : key_end].strip()
            value_end = _close_of_value(
                text, key_end + 1, QWEN_PARAMETER_END, (QWEN_PARAMETER, QWEN_FUNCTION_END, QWEN_FUNCTION)
            )
            if not key:
                return None
            if value_end < 0:
                return INCOMPLETE
            arguments[key] = _value(_one_newline(text[key_end + 1 : value_end]), schemas, name, key)
            at = value_end + len(QWEN_PARAMETER_END)
        calls.append(ParsedCall(name, arguments, text[start:at]))
        at += len(text[at:]) - len(text[at:].lstrip())
    return single_raw(calls, raw) or None


# ---------------------------------------------------------------- NAME<arg_key>KEY</arg_key>...
def arg_pairs(body: str, raw: str, schemas: Schemas, suffix: str = "", name_end: str = "") -> Parsed:
    """``NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>...`` (GLM); ``suffix`` goes inside
    each tag (Hunyuan's ``<arg_key:opensource>``), ``name_end`` ends the name where a format has one."""
    key_open, key_close = f"<arg_key{suffix}>", f"</arg_key{suffix}>"
    value_open, value_close = f"<arg_value{suffix}>", f"</arg_value{suffix}>"
    text = body.strip()
    cut = text.find(name_end) if name_end else -1
    if cut < 0:
        cut = text.find(key_open)
    name = (text if cut < 0 else text[:cut]).strip()
    if not name or "<" in name or "\n" in name.strip():
        return None if name or cut >= 0 else INCOMPLETE
    at = len(text) if cut < 0 else cut + (len(name_end) if name_end and text.startswith(name_end, cut) else 0)
    arguments: dict[str, Any] = {}
    while True:
        rest = text[at:].lstrip()
        at = len(text) - len(rest)
        if not rest:
            break
        if not rest.startswith(key_open):
            return None
        key_end = text.find(key_close, at)
        if key_end < 0:
            return INCOMPLETE
        key = text[at + len(key_open) : key_end].strip()
        at = key_end + len(key_close)
        rest = text[at:].lstrip()
        at = len(text) - len(rest)
        if not rest.startswith(value_open):
            return INCOMPLETE if value_open.startswith(rest) else None
        start = at + len(value_open)
        value_end = _close_of_value(text, start, value_close, (key_open,))
        if value_end < 0:
            return INCOMPLETE
        arguments[key] = _value(text[start:value_end], schemas, name, key)
        at = value_end + len(value_close)
    return [ParsedCall(name, arguments, raw)]


def glm(body: str, raw: str, schemas: Schemas) -> Parsed:
    """GLM 4.5-4.7 / Spark / Ling / Laguna: the body of one ``<tool_call>``."""
    return arg_pairs(body, raw, schemas)


HUNYUAN_SUFFIX = ":opensource"
HUNYUAN_CALL = f"<tool_call{HUNYUAN_SUFFIX}>"
HUNYUAN_CALL_END = f"</tool_call{HUNYUAN_SUFFIX}>"
HUNYUAN_SEP = f"<tool_sep{HUNYUAN_SUFFIX}>"


def hunyuan(body: str, raw: str, schemas: Schemas) -> Parsed:
    """Hunyuan 3: ``<tool_call:opensource>NAME<tool_sep:opensource>`` and suffixed argument tags,
    one or more inside ``<tool_calls:opensource>``."""
    calls: list[ParsedCall] = []
    parts = body.split(HUNYUAN_CALL)
    if parts[0].strip():
        return None
    for part in parts[1:]:
        inner, sep, after = part.partition(HUNYUAN_CALL_END)
        if not sep:
            return INCOMPLETE
        if after.strip():
            return None
        found = arg_pairs(inner, HUNYUAN_CALL + part, schemas, HUNYUAN_SUFFIX, HUNYUAN_SEP)
        if not isinstance(found, list):
            return found
        calls.extend(found)
    return single_raw(calls, raw) if calls else None


# ---------------------------------------------------------------- <invoke name="NAME"><parameter name="KEY">
DSML = "｜DSML｜"
ATEM = "atem:"


def invoke_calls(body: str, raw: str, schemas: Schemas, prefix: str = "") -> Parsed:
    """``<{prefix}invoke name="NAME">`` with ``<{prefix}parameter name="KEY">`` values."""
    invoke = re.compile(rf'<{re.escape(prefix)}invoke\s+name="([^"]*)"\s*>')
    parameter = re.compile(rf'<{re.escape(prefix)}parameter\s+name="([^"]*)"(?:\s+string="(true|false)")?\s*>')
    invoke_end = f"</{prefix}invoke>"
    parameter_end = f"</{prefix}parameter>"
    parameter_start = f"<{prefix}parameter "
    text = body.strip()
    calls: list[ParsedCall] = []
    at = 0
    while True:
        rest = text[at:].lstrip()
        at = len(text) - len(rest)
        if not rest:
            break
        head = invoke.match(text, at)
        if head is None:
            return INCOMPLETE if f"<{prefix}invoke".startswith(rest[: len(prefix) + 7]) and ">" not in rest else None
        name, start = head.group(1), at
        at = head.end()
        arguments: dict[str, Any] = {}
        while True:
            rest = text[at:].lstrip()
            at = len(text) - len(rest)
            if rest.startswith(invoke_end):
                at += len(invoke_end)
                break
            if not rest:
                return INCOMPLETE
            param = parameter.match(text, at)
            if param is None:
                return INCOMPLETE if ">" not in rest else None
            key, string_flag = param.group(1), param.group(2)
            value_end = _close_of_value(text, param.end(), parameter_end, (parameter_start, invoke_end))
            if value_end < 0:
                return INCOMPLETE
            value_text = text[param.end() : value_end]
            if string_flag == "true":
                arguments[key] = value_text
            elif string_flag == "false":
                try:
                    arguments[key] = json.loads(value_text)
                except (json.JSONDecodeError, RecursionError):
                    arguments[key] = _value(value_text, schemas, name, key)
            else:
                arguments[key] = _value(value_text, schemas, name, key)
            at = value_end + len(parameter_end)
        calls.append(ParsedCall(name, arguments, text[start:at]))
    return single_raw(calls, raw) if calls else None


def minimax_m2(body: str, raw: str, schemas: Schemas) -> Parsed:
    """MiniMax M2: the body of ``<minimax:tool_call>``."""
    return invoke_calls(body, raw, schemas)


def dsml(body: str, raw: str, schemas: Schemas) -> Parsed:
    """DeepSeek V3.2/V4: the body of ``<｜DSML｜function_calls>`` (``tool_calls`` in V4)."""
    return invoke_calls(body, raw, schemas, DSML)


def atem(body: str, raw: str, schemas: Schemas) -> Parsed:
    """Muse: the body of ``<atem:function_calls>``."""
    return invoke_calls(body, raw, schemas, ATEM)


# ---------------------------------------------------------------- MiniMax M3's nested elements
M3 = "]<]minimax[>["
M3_TOOL_CALL = f"{M3}<tool_call>"
M3_TOOL_CALL_END = f"{M3}</tool_call>"
_M3_INVOKE = re.compile(re.escape(M3) + r'<invoke\s+name="([^"]*)"\s*>')
_M3_TAG = re.compile(re.escape(M3) + r"<(/?)([^<>\s/]+)>")


_M3_MAX_DEPTH = 32
"""Nesting deeper than this is no argument (and each level costs a scan of what it holds)."""


class _M3Syntax(ValueError):
    pass


class _M3TooDeep(ValueError):
    pass


def _m3_children(text: str) -> list[tuple[str, str]] | None:
    """The elements directly inside ``text``: (name, content); None when ``text`` is plain text."""
    if M3 not in text:
        return None
    out: list[tuple[str, str]] = []
    at = 0
    while True:
        rest = text[at:].lstrip()
        at = len(text) - len(rest)
        if not rest:
            return out
        opened = _M3_TAG.match(text, at)
        if opened is None or opened.group(1):
            raise _M3Syntax("text between elements")
        name = opened.group(2)
        depth, scan, close_at = 1, opened.end(), opened.end()
        while depth:
            tag = _M3_TAG.search(text, scan)
            if tag is None:
                raise _M3Syntax("an unclosed element")
            if tag.group(2) == name:
                depth += -1 if tag.group(1) else 1
            scan, close_at = tag.end(), tag.start()
        content = text[opened.end() : close_at]
        out.append((name, content))
        at = scan


def _m3_value(content: str, schema: Mapping[str, Any] | None, depth: int = 0) -> Any:
    types = schema_types(schema)
    if "string" in types:
        return content
    if depth > _M3_MAX_DEPTH:
        raise _M3TooDeep("nested too deeply")
    children = _m3_children(content)
    if children is None:
        return typed_value(content, schema)
    if children and all(name == "item" for name, _ in children) and (not types or "array" in types):
        items = _array_items(schema)
        return [_m3_value(child, items, depth + 1) for _, child in children]
    properties = _object_properties(schema)
    return {name: _m3_value(child, properties.get(name), depth + 1) for name, child in children}


def _array_items(schema: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    for option in _options(schema):
        items = option.get("items")
        if option.get("type") == "array" and isinstance(items, Mapping):
            return items
    return None


def _object_properties(schema: Mapping[str, Any] | None) -> Mapping[str, Any]:
    for option in _options(schema):
        properties = option.get("properties")
        if isinstance(properties, Mapping):
            return properties
    return {}


def _options(schema: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    if not isinstance(schema, Mapping):
        return []
    found = [schema]
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list):
            found.extend(option for option in options if isinstance(option, Mapping))
    return found


def minimax_m3(body: str, raw: str, schemas: Schemas) -> Parsed:
    """MiniMax M3: the body of ``]<]minimax[>[<tool_call>``: invokes of nested elements."""
    text = body.strip()
    calls: list[ParsedCall] = []
    at = 0
    invoke_end = f"{M3}</invoke>"
    while True:
        rest = text[at:].lstrip()
        at = len(text) - len(rest)
        if not rest:
            break
        head = _M3_INVOKE.match(text, at)
        if head is None:
            return INCOMPLETE if (M3 + "<invoke").startswith(rest[:20]) else None
        name, start = head.group(1), at
        end = text.find(invoke_end, head.end())
        if end < 0:
            return INCOMPLETE
        inner = text[head.end() : end]
        tool = schemas.get(name)
        try:
            children = _m3_children(inner) or []
            arguments = {key: _m3_value(content, property_schema(tool, key)) for key, content in children}
        except _M3Syntax:
            return INCOMPLETE
        except (_M3TooDeep, RecursionError):
            return None
        at = end + len(invoke_end)
        calls.append(ParsedCall(name, arguments, text[start:at]))
    return single_raw(calls, raw) if calls else None


# ---------------------------------------------------------------- <function name="NAME"><param name="KEY">
_CPM_FUNCTION = re.compile(r'<function\s+name="([^"]*)"\s*>')
_CPM_PARAM = re.compile(r'<param\s+name="([^"]*)"\s*>')
CDATA_OPEN, CDATA_CLOSE = "<![CDATA[", "]]>"


def minicpm(body: str, raw: str, schemas: Schemas) -> Parsed:
    """MiniCPM 5: ``<function name="NAME">`` with ``<param name="KEY">`` values (one call)."""
    text = body.strip()
    head = _CPM_FUNCTION.match(text)
    if head is None:
        return INCOMPLETE if ">" not in text else None
    name = head.group(1)
    at = head.end()
    arguments: dict[str, Any] = {}
    while True:
        rest = text[at:].lstrip()
        at = len(text) - len(rest)
        if rest.startswith("</function>"):
            at += len("</function>")
            break
        if not rest:
            break  # the stream parser stopped at the function's end
        param = _CPM_PARAM.match(text, at)
        if param is None:
            return INCOMPLETE if ">" not in rest else None
        key, at = param.group(1), param.end()
        if text.startswith(CDATA_OPEN, at):
            end = text.find(CDATA_CLOSE, at + len(CDATA_OPEN))
            if end < 0:
                return INCOMPLETE
            value = text[at + len(CDATA_OPEN) : end]
            at = end + len(CDATA_CLOSE)
            if not text.startswith("</param>", at):
                return INCOMPLETE if "</param>".startswith(text[at:]) else None
            arguments[key] = value
        else:
            end = text.find("</param>", at)
            if end < 0:
                return INCOMPLETE
            arguments[key] = _value(text[at:end], schemas, name, key)
            at = end
        at += len("</param>")
    if text[at:].strip():
        return None
    return [ParsedCall(name, arguments, raw)]
