"""Argument values written as text, typed by the tool's JSON schema, and Python literals as JSON.

Formats that write each argument between tags (``<parameter=city>Paris</parameter>``,
``<arg_value>3</arg_value>``) give no JSON type: the tool's schema says it. A value whose schema
allows only strings is the text as written; one whose schema allows other types is parsed as JSON
when it parses to one of them (``42`` for an integer, ``{"a": 1}`` for an object), else kept as
text (``123 Main St`` for a string-or-null); ``null`` is null where the schema allows it. With no
schema for the argument, JSON that parses is taken as JSON, anything else as text.

Pythonic calls (LFM2's ``[f(a=1, b="x")]``, Llama 3.2's, Gemma's ``tool_code``) are read with
:mod:`ast`, never evaluated: only literals (strings, numbers, lists, dicts, tuples, ``True``/``true``,
``False``/``false``, ``None``/``null``, negative numbers) are accepted.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from typing import Any

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
    "string": (str,),
}


def schema_types(schema: Mapping[str, Any] | None) -> frozenset[str]:
    """The JSON types a schema allows (empty: anything, or it does not say)."""
    if not isinstance(schema, Mapping):
        return frozenset()
    declared = schema.get("type")
    if isinstance(declared, str):
        return frozenset({declared})
    if isinstance(declared, list):
        return frozenset(t for t in declared if isinstance(t, str))
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list):
            found: set[str] = set()
            for option in options:
                inner = schema_types(option)
                if not inner:
                    return frozenset()
                found |= inner
            return frozenset(found)
    for key in ("enum", "const"):
        values = schema.get(key) if key == "enum" else [schema.get(key)] if key in schema else None
        if isinstance(values, list) and values:
            return frozenset(_type_of(value) for value in values)
    return frozenset()


def _type_of(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    return "string"


def _matches(value: Any, types: frozenset[str]) -> bool:
    for name in types:
        kinds = _JSON_TYPES.get(name, ())
        if isinstance(value, bool) and name in ("integer", "number"):
            continue
        if isinstance(value, kinds):
            return True
    return False


def typed_value(text: str, schema: Mapping[str, Any] | None) -> Any:
    """The value of an argument written as ``text``, typed by its ``schema`` (see the module
    docstring)."""
    types = schema_types(schema)
    if types and types <= {"string"}:
        return text
    stripped = text.strip()
    try:
        value = json.loads(stripped)
    except (json.JSONDecodeError, RecursionError, ValueError):
        return text if "string" in types or not types else _python_scalar(stripped, text)
    if not types:
        return value
    if _matches(value, types - {"string"}):
        return value
    return text if "string" in types else value


def _python_scalar(stripped: str, text: str) -> Any:
    """``True``/``False``/``None`` as a model may write them where JSON was asked for."""
    return {"True": True, "False": False, "None": None}.get(stripped, text)


def property_schema(tool: Mapping[str, Any] | None, name: str) -> Mapping[str, Any] | None:
    """The schema of argument ``name`` in a tool's parameters schema, if it declares one."""
    if not isinstance(tool, Mapping):
        return None
    properties = tool.get("properties")
    if isinstance(properties, Mapping):
        found = properties.get(name)
        return found if isinstance(found, Mapping) else None
    return None


# ---------------------------------------------------------------- Python literals
class NotLiteral(ValueError):
    """The expression is not a literal (a call, a name, an operator...)."""


_NAMED = {"True": True, "true": True, "False": False, "false": False, "None": None, "null": None}


def literal(node: ast.expr) -> Any:
    """The value of a literal expression, as JSON would hold it.

    Raises:
        NotLiteral: anything but a literal.
    """
    if isinstance(node, ast.Constant) and isinstance(node.value, str | int | float | bool | type(None)):
        return node.value
    if isinstance(node, ast.Name) and node.id in _NAMED:
        return _NAMED[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        inner = literal(node.operand)
        if isinstance(inner, bool) or not isinstance(inner, int | float):
            raise NotLiteral("a sign before a non-number")
        return -inner if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.List | ast.Tuple):
        return [literal(item) for item in node.elts]
    if isinstance(node, ast.Dict):
        out: dict[str, Any] = {}
        for key, value in zip(node.keys, node.values, strict=True):
            if key is None:
                raise NotLiteral("a ** in a dict")
            name = literal(key)
            out[name if isinstance(name, str) else json.dumps(name)] = literal(value)
        return out
    raise NotLiteral(type(node).__name__)


def dotted_name(node: ast.expr) -> str | None:
    """``f`` or ``Calendar.create_event`` as a name; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = dotted_name(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None
