"""Hostile request bodies for ``glassbox serve`` (ROBUSTNESS.md 4.9).

A body must be UTF-8 JSON, nested at most :data:`MAX_JSON_DEPTH` levels (checked before parsing,
without recursion), with no number literal longer than :data:`MAX_NUMBER_CHARS` characters, no
``NaN``/``Infinity`` and no number too large for a float, and no lone UTF-16 surrogate
(``"\\ud800"``) in any string; anything else is a 400 naming what is wrong (:func:`parse_body`).
"""

from __future__ import annotations

import json
import math
import re
from typing import NoReturn

from app.server.errors import HttpError

MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects in a request body (the API's own documents need 5)."""

MAX_NUMBER_CHARS = 100
"""Longest number literal in a request body (Python refuses integers of more than 4,300 digits, and
converting a long one costs quadratic time)."""

_NOT_MARKS = bytes(b for b in range(256) if b not in b'"[]{}')
_FLAT = bytes.maketrans(b"{}", b"[]")
_QUOTED = re.compile(rb'"[^"]*"')
_RUN = re.compile(rb"\[+|\]+")
_LEAF_PASSES = 12
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_SIMPLE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


class _BadNumber(ValueError):
    """A number literal the parser refuses (raised from inside ``json.loads``)."""


def nesting_exceeds(body: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when the JSON text ``body`` nests arrays and objects more than ``limit`` levels deep.

    Brackets inside strings do not count. No recursion and no loop over bytes in Python: the
    strings are cut out and the brackets kept with C-speed byte operations, the innermost empty
    pairs are removed a few times over (each pass takes one level off every branch), and what is
    left is walked one run of equal brackets at a time. On malformed text the answer may be either;
    the parser rejects that text anyway, after at most ``2 * limit`` levels.
    """
    # Inside strings, a backslash always pairs with the next character: drop the escaped ones.
    unescaped = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    # Keep quotes and brackets. Two adjacent quotes are an empty string, or the end of one string
    # and the start of the next with nothing but separators between: either way, nothing to count.
    marks = unescaped.translate(None, _NOT_MARKS).replace(b'""', b"")
    brackets = _QUOTED.sub(b"", marks).translate(_FLAT, b'"')
    if b"[" * (limit + 1) in brackets:
        return True
    removed = 0
    while removed < _LEAF_PASSES:
        shorter = brackets.replace(b"[]", b"")
        if len(shorter) == len(brackets):
            break
        brackets = shorter
        removed += 1
    if removed > limit:
        return True
    depth = 0
    for run in _RUN.findall(brackets):
        depth += len(run) if run[:1] == b"[" else -len(run)
        if depth + removed > limit:
            return True
    return False


def _parse_int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise _BadNumber(f"the request body holds a number longer than {MAX_NUMBER_CHARS} characters")
    return int(text)


def _parse_float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise _BadNumber(f"the request body holds a number longer than {MAX_NUMBER_CHARS} characters")
    value = float(text)
    if not math.isfinite(value):
        raise _BadNumber("the request body holds a number too large for a 64-bit float")
    return value


def _parse_constant(text: str) -> NoReturn:
    raise _BadNumber(f"the request body holds {text[:9]}, which is not JSON")


def _field_name(key: str) -> str:
    """How a key appears in a field's path: as is when plain, else quoted and cut (it is echoed back)."""
    return key if _SIMPLE_KEY.fullmatch(key) else json.dumps(key[:32])


def encode_text(text: str) -> bytes:
    """``text`` as UTF-8, a lone surrogate (which UTF-8 cannot carry) becoming U+FFFD."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text).encode("utf-8")


def lone_surrogate_field(document: object) -> str | None:
    """The path (``messages[0].content``) of the first string or key in ``document`` holding a lone
    UTF-16 surrogate, which no UTF-8 text can carry; None when there is none. Iterative."""
    stack: list[tuple[object, str]] = [(document, "")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                return where or "the request body"
        elif isinstance(value, dict):
            items = list(value.items())
            for key, _ in items:
                if _SURROGATE.search(key):
                    return f"{where or 'the request body'} (a key)"
            stack.extend(
                (item, f"{where}.{_field_name(key)}" if where else _field_name(key)) for key, item in reversed(items)
            )
        elif isinstance(value, list):
            stack.extend((item, f"{where}[{index}]") for index, item in reversed(list(enumerate(value))))
    return None


def parse_json_text(text: str, where: str) -> object:
    """JSON text held in a string field (a tool call's ``arguments``), under the same limits as a
    body: at most :data:`MAX_JSON_DEPTH` levels, no number longer than :data:`MAX_NUMBER_CHARS` or
    out of a float's range, no lone surrogate. The empty text is ``{}``.

    Raises:
        HttpError: 400 naming ``where`` and what is wrong (``param`` is ``where``).
    """
    if not text.strip():
        return {}
    reason: str | None = None
    if nesting_exceeds(text.encode("utf-8", "surrogatepass")):
        reason = f"nests arrays or objects more than {MAX_JSON_DEPTH} levels deep"
    else:
        try:
            value = json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)
        except json.JSONDecodeError as exc:
            reason = f"is not valid JSON (column {exc.colno})"
        except _BadNumber as exc:
            reason = str(exc).replace("the request body holds", "holds")
        except RecursionError:
            reason = "nests arrays or objects too deeply"
        else:
            if _SURROGATE.search(text) or (
                _SURROGATE_ESCAPE.search(text) and _SURROGATE.search(json.dumps(value, ensure_ascii=False))
            ):
                reason = "holds a lone UTF-16 surrogate, which is not text: send valid Unicode"
            else:
                return value
    raise HttpError(400, f"{where}: the JSON text {reason}", code="invalid_value", param=where)


def parse_body(body: bytes) -> dict[str, object]:
    """A request body as a JSON object, refusing hostile shapes with a 400 that says what is wrong
    (:func:`parse_document`; anything but an object is refused too)."""
    document = parse_document(body)
    if not isinstance(document, dict):
        raise HttpError(400, "the request body must be a JSON object", code="invalid_json")
    return document


def parse_document(body: bytes) -> object:
    """A request body as JSON (an object, or the list a few llama.cpp endpoints take), refusing
    hostile shapes with a 400 that says what is wrong.

    Raises:
        HttpError: 400: not UTF-8, not JSON, nested deeper than :data:`MAX_JSON_DEPTH`, a number
            longer than :data:`MAX_NUMBER_CHARS` or out of a float's range, ``NaN``/``Infinity``,
            or a string holding a lone surrogate (named in ``param``).
    """
    try:
        text = body.decode("utf-8-sig")  # strict: UTF-8-encoded surrogates are refused here
    except UnicodeDecodeError as exc:
        raise HttpError(400, f"the request body is not UTF-8 (byte {exc.start})", code="invalid_json") from None
    if nesting_exceeds(body):
        raise HttpError(
            400, f"the request body nests arrays or objects more than {MAX_JSON_DEPTH} levels deep", code="invalid_json"
        )
    try:
        document = json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)
    except json.JSONDecodeError as exc:
        raise HttpError(
            400, f"the request body is not valid JSON (line {exc.lineno}, column {exc.colno})", code="invalid_json"
        ) from None
    except _BadNumber as exc:
        raise HttpError(400, str(exc), code="invalid_json") from None
    except RecursionError:  # not reached past nesting_exceeds; kept so that a miss is still a 400
        raise HttpError(400, "the request body nests arrays or objects too deeply", code="invalid_json") from None
    # Only a surrogate escape can put a surrogate in a string; most are pairs (an emoji from an
    # ensure_ascii client), which the parser joins: a C-speed look at the document tells, and only a
    # lone one pays for the walk that names its field.
    if _SURROGATE_ESCAPE.search(text) and _SURROGATE.search(json.dumps(document, ensure_ascii=False)):
        where = lone_surrogate_field(document) or "the request body"
        raise HttpError(
            400,
            f"{where}: holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape without its pair), which is "
            "not text: send valid Unicode",
            code="invalid_value",
            param=where,
        )
    return document
