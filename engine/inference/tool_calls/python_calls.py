"""Calls written as Python: ``[f(a=1), g(b="x")]`` (LFM2, Llama 3.2), ``f(a=1)`` lines (Gemma's
``tool_code``), Llama 3.1's built-in ``brave_search.call(query="...")``; and Gemma 4's own syntax,
``call:NAME{key:value,...}`` with ``<|"|>`` around strings.

Nothing is evaluated: the text is parsed (:mod:`ast` for Python) and only literal arguments are
accepted (:func:`engine.inference.tool_calls.values.literal`).
"""

from __future__ import annotations

import ast
from typing import Any

from engine.inference.tool_calls.call import INCOMPLETE, Parsed, ParsedCall
from engine.inference.tool_calls.values import NotLiteral, dotted_name, literal

_BUILTIN_SUFFIX = ".call"
"""Llama 3.1 writes a built-in tool's call as ``NAME.call(...)``."""


def python_calls(body: str, raw: str) -> Parsed:
    """Calls in Python syntax: one per line, or a list (or tuple) of them; keyword arguments only.

    Returns:
        The calls; :data:`INCOMPLETE` for text that does not parse yet but may once it goes on;
        None when it is not calls.
    """
    text = body.strip()
    if not text:
        return None
    try:
        tree = ast.parse(text, mode="exec")
    except SyntaxError:
        return INCOMPLETE if _open_brackets(text) else None
    except (ValueError, RecursionError, MemoryError):
        return None
    nodes: list[ast.expr] = []
    for statement in tree.body:
        if not isinstance(statement, ast.Expr):
            return None
        value = statement.value
        nodes.extend(value.elts if isinstance(value, ast.List | ast.Tuple) else [value])
    calls: list[ParsedCall] = []
    for node in nodes:
        call = _call(node)
        if call is None:
            return None
        calls.append(ParsedCall(call[0], call[1], raw if len(nodes) == 1 else ast.unparse(node)))
    return calls or None


def _call(node: ast.expr) -> tuple[str, dict[str, Any]] | None:
    if not isinstance(node, ast.Call) or node.args:
        return None
    name = dotted_name(node.func)
    if name is None:
        return None
    arguments: dict[str, Any] = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            return None
        try:
            arguments[keyword.arg] = literal(keyword.value)
        except (NotLiteral, RecursionError):
            return None
    return name.removesuffix(_BUILTIN_SUFFIX), arguments


def _open_brackets(text: str) -> bool:
    """Whether a Python-ish text still has open brackets or quotes at its end."""
    depth, quote, escaped = 0, "", False
    for char in text:
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = ""
        elif char in "\"'":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
    return bool(quote) or depth > 0


# ---------------------------------------------------------------- Gemma 4
GEMMA4_QUOTE = '<|"|>'


class _Gemma4Syntax(ValueError):
    """Not Gemma 4's value syntax."""


class _Gemma4Reader:
    """``{key:value,...}`` with bare keys, ``<|"|>``-quoted strings, numbers, true/false/null, lists."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0

    def skip(self) -> None:
        while self.at < len(self.text) and self.text[self.at] in " \t\r\n":
            self.at += 1

    def expect(self, char: str) -> None:
        self.skip()
        if not self.text.startswith(char, self.at):
            raise _Gemma4Syntax(f"expected {char!r} at {self.at}")
        self.at += len(char)

    def value(self) -> Any:
        self.skip()
        text, at = self.text, self.at
        if text.startswith(GEMMA4_QUOTE, at):
            end = text.find(GEMMA4_QUOTE, at + len(GEMMA4_QUOTE))
            if end < 0:
                raise _Gemma4Syntax("an unclosed string")
            self.at = end + len(GEMMA4_QUOTE)
            return text[at + len(GEMMA4_QUOTE) : end]
        if text.startswith("{", at):
            return self.mapping()
        if text.startswith("[", at):
            return self.sequence()
        end = at
        while end < len(text) and text[end] not in ",}]":
            end += 1
        word = text[at:end].strip()
        self.at = end
        return _scalar(word)

    def mapping(self) -> dict[str, Any]:
        self.expect("{")
        out: dict[str, Any] = {}
        self.skip()
        if self.text.startswith("}", self.at):
            self.at += 1
            return out
        while True:
            self.skip()
            colon = self.text.find(":", self.at)
            if colon < 0:
                raise _Gemma4Syntax("a key without a value")
            key = self.text[self.at : colon].strip()
            if key.startswith(GEMMA4_QUOTE) and key.endswith(GEMMA4_QUOTE):
                key = key[len(GEMMA4_QUOTE) : -len(GEMMA4_QUOTE)]
            if not key or any(c in key for c in "{}[],"):
                raise _Gemma4Syntax("a bad key")
            self.at = colon + 1
            out[key] = self.value()
            self.skip()
            if self.text.startswith(",", self.at):
                self.at += 1
                continue
            self.expect("}")
            return out

    def sequence(self) -> list[Any]:
        self.expect("[")
        out: list[Any] = []
        self.skip()
        if self.text.startswith("]", self.at):
            self.at += 1
            return out
        while True:
            out.append(self.value())
            self.skip()
            if self.text.startswith(",", self.at):
                self.at += 1
                continue
            self.expect("]")
            return out


def _scalar(word: str) -> Any:
    if word in ("true", "false"):
        return word == "true"
    if word == "null":
        return None
    try:
        number = float(word)
    except ValueError:
        raise _Gemma4Syntax(f"not a value: {word!r}") from None
    if word.lstrip("+-").isdigit():
        return int(word)
    return number


def gemma4_calls(body: str, raw: str) -> Parsed:
    """The body of ``<|tool_call>call:NAME{...}<tool_call|>``: one call."""
    text = body.strip()
    if not text.startswith("call:"):
        return None
    brace = text.find("{")
    name = text[len("call:") : brace if brace >= 0 else len(text)].strip()
    if brace < 0 or not name:
        return INCOMPLETE if brace < 0 else None
    reader = _Gemma4Reader(text[brace:])
    try:
        arguments = reader.mapping()
    except _Gemma4Syntax:
        return INCOMPLETE if GEMMA4_QUOTE in text and text.count(GEMMA4_QUOTE) % 2 else None
    except RecursionError:
        return None
    reader.skip()
    if reader.at != len(reader.text):
        return None
    return [ParsedCall(name, arguments, raw)]
