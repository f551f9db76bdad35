"""What every call format shares: a parsed call, the pieces a parser returns, and JSON call objects.

A format's body parser turns the text inside a call's markup into :class:`ParsedCall` objects, or
says that the text is not a call (``None``: the markup is shown as text) or that it may not be over
yet (:data:`INCOMPLETE`: the closing marker it stopped at was inside an argument, so the stream
parser reads on to the next one).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from engine.inference.tool_calls.values import NotLiteral, literal

MAX_CALL_CHARS = 256 * 1024
"""A call's markup longer than this is not parsed (it is emitted as text): bounds the JSON and
:mod:`ast` work on a runaway generation."""

Schemas = Mapping[str, Mapping[str, Any]]
"""The tools offered: name -> the JSON schema of its arguments (formats that write arguments as
text, such as the XML ones, type each value by it)."""


@dataclass(frozen=True)
class ParsedCall:
    """One call found in the reply: the function, its arguments, and the text that asked for it."""

    name: str
    arguments: dict[str, Any]
    raw: str


Piece = str | ParsedCall
"""What a call parser returns: answer text, or a complete call."""

SplitPiece = tuple[Literal["reasoning", "text"], str] | ParsedCall
"""What a whole-reply splitter returns (harmony's channels, Kimi K3's sections): thinking, answer
text, or a complete call."""


class _Incomplete:
    """The body stops inside an argument: the closing marker found was part of it."""

    def __repr__(self) -> str:
        return "INCOMPLETE"


INCOMPLETE: Final = _Incomplete()

Parsed = list[ParsedCall] | _Incomplete | None
"""What a body parser returns: the calls, :data:`INCOMPLETE`, or None (not a call: shown as text)."""


def partial_suffix(text: str, markers: Iterable[str]) -> int:
    """The length of the longest end of ``text`` that is the start of a marker (held back).

    Args:
        text: the text decoded so far.
        markers: the markers a stream parser waits for.

    Returns:
        How many characters at the end of ``text`` may begin a marker (0 when none can).
    """
    longest = 0
    for marker in markers:
        if not marker:
            continue
        first = marker[0]
        at = text.find(first, max(0, len(text) - len(marker) + 1))
        while at >= 0 and len(text) - at > longest:  # the earliest start is the longest one
            if marker.startswith(text[at:]):
                longest = len(text) - at
                break
            at = text.find(first, at + 1)
    return longest


def merge(pieces: Iterable[Piece]) -> list[Piece]:
    """Joins adjacent text pieces and drops empty ones."""
    out: list[Piece] = []
    for piece in pieces:
        if isinstance(piece, str):
            if not piece:
                continue
            if out and isinstance(out[-1], str):
                out[-1] += piece
                continue
        out.append(piece)
    return out


# ---------------------------------------------------------------- JSON
def json_values(text: str) -> list[Any] | None:
    """Every JSON value in ``text``, separated by whitespace, commas or semicolons; None unless the
    whole text is such values."""
    decoder = json.JSONDecoder()
    values: list[Any] = []
    at, end = 0, len(text)
    while True:
        while at < end and text[at] in " \t\r\n,;":
            at += 1
        if at >= end:
            return values or None
        try:
            value, at = decoder.raw_decode(text, at)
        except (json.JSONDecodeError, RecursionError):
            return None
        values.append(value)


def python_values(text: str) -> list[Any] | None:
    """A Python literal where JSON was asked for: ``{'name': 'f', 'arguments': {'on': True}}`` (single
    quotes, ``True``/``None``), as a list of values; None unless the whole text is one. Read with
    :mod:`ast`, never evaluated."""
    if not text or text[0] not in "{[" or len(text) > MAX_CALL_CHARS:
        return None
    try:
        tree = ast.parse(text, mode="eval")
        value = literal(tree.body)
    except (SyntaxError, ValueError, NotLiteral, RecursionError, MemoryError):
        return None
    return [value]


def json_prefix(text: str) -> tuple[Any, int] | None:
    """The JSON value at the start of ``text`` (after whitespace) and where it ends; None if none."""
    start = len(text) - len(text.lstrip())
    try:
        return json.JSONDecoder().raw_decode(text, start)
    except (json.JSONDecodeError, RecursionError):
        return None


def open_json(text: str) -> bool:
    """Whether ``text`` starts a JSON value that is not finished (so more may be on the way)."""
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        return exc.pos >= len(text.rstrip()) or _unterminated(text)
    except RecursionError:
        return False
    return False


def _unterminated(text: str) -> bool:
    """A JSON text whose strings or brackets are still open at its end."""
    depth, in_string, escaped = 0, False, False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
    return in_string or depth > 0


def arguments_object(value: Any) -> dict[str, Any] | None:
    """Arguments as a dict: an object, or a JSON string of one (OpenAI's wire shape); else None."""
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            value = json.loads(value)
        except (json.JSONDecodeError, RecursionError):
            return None
    if value is None:
        return {}
    return value if isinstance(value, dict) else None


NAME_KEYS = ("name", "tool_name", "function_name")
ARGUMENT_KEYS = ("arguments", "parameters", "args", "tool_input")


def call_from_object(obj: Any, raw: str) -> ParsedCall | None:
    """A call from one JSON object: ``{"name", "arguments"|"parameters"}``, OpenAI's
    ``{"function": {"name", "arguments"}}`` or Cohere's ``{"tool_name", "parameters"}``."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):
        obj = obj["function"]
    name = next((obj[key] for key in NAME_KEYS if key in obj), None)
    if not isinstance(name, str) or not name:
        return None
    arguments: Any = {}
    for key in ARGUMENT_KEYS:
        if key in obj:
            arguments = obj[key]
            break
    parsed = arguments_object(arguments)
    return None if parsed is None else ParsedCall(name, parsed, raw)


def calls_from_json(text: str, raw: str, *, name_as_key: bool = False) -> Parsed:
    """The calls in a JSON text: one object, several, a list of them, or ``{"tool_calls": [...]}``.

    Args:
        text: the JSON.
        raw: the markup the calls came from (a call's ``raw`` when it is the only one).
        name_as_key: objects are ``{"NAME": {arguments}}`` (Apertus).

    Returns:
        The calls; :data:`INCOMPLETE` when the JSON is unfinished; None when it is not calls.
    """
    stripped = text.strip()
    values = json_values(stripped)
    if values is None:
        values = python_values(stripped)
    if values is None:
        return INCOMPLETE if stripped and open_json(stripped) else None
    objects: list[Any] = []
    for value in values:
        if isinstance(value, dict) and isinstance(value.get("tool_calls"), list):
            objects.extend(value["tool_calls"])
        elif isinstance(value, list):
            objects.extend(value)
        else:
            objects.append(value)
    calls: list[ParsedCall] = []
    for obj in objects:
        own = raw if len(objects) == 1 else json.dumps(obj, ensure_ascii=False)
        call = _name_keyed(obj, own) if name_as_key else call_from_object(obj, own)
        if call is None:
            return None
        calls.append(call)
    return calls or None


def _name_keyed(obj: Any, raw: str) -> ParsedCall | None:
    if not isinstance(obj, dict) or len(obj) != 1:
        return None
    ((name, arguments),) = obj.items()
    parsed = arguments_object(arguments)
    return None if parsed is None or not name else ParsedCall(str(name), parsed, raw)


def single_raw(calls: list[ParsedCall], raw: str) -> list[ParsedCall]:
    """One call carries the whole markup as its ``raw``; several keep their own."""
    if len(calls) == 1:
        return [ParsedCall(calls[0].name, calls[0].arguments, raw)]
    return calls
