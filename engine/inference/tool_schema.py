"""A tool's argument schema, checked before it is used, and arguments checked against it, both bounded.

Contract: ARCHITECTURE.md, 'engine.inference.tool_schema'.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

__all__ = [
    "MAX_PATTERN_CHARS",
    "MAX_SCHEMA_BYTES",
    "MAX_SCHEMA_DEPTH",
    "PATTERN_BUDGET_S",
    "argument_problem",
    "schema_depth",
    "schema_problem",
    "subschemas",
]

#: The largest argument schema of one tool, as JSON (MCP servers' schemas are a few KiB).
MAX_SCHEMA_BYTES = 256 * 1024
#: The deepest nesting of objects and lists in one argument schema.
MAX_SCHEMA_DEPTH = 64
#: The longest regular expression a schema may hold (``pattern``, ``patternProperties``).
MAX_PATTERN_CHARS = 1000
#: Seconds of CPU time every regular expression of one arguments check may take together (the
#: ``regex`` engine's timeout counts CPU time, so a loaded machine does not cut a check short).
PATTERN_BUDGET_S = 0.25

# Keywords whose subschema applies to the same value (not to a part of it): a loop through them
# alone never ends.
_IN_PLACE_LISTS = ("allOf", "anyOf", "oneOf")
_IN_PLACE_ONE = ("not", "if", "then", "else")
_REF_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")


def schema_problem(schema: object) -> str | None:
    """Why ``schema`` cannot be used as a tool's argument schema (one line), or None when it can."""
    if not isinstance(schema, dict):
        return "its parameters are not a JSON object schema"
    depth = schema_depth(schema)
    if depth > MAX_SCHEMA_DEPTH:
        return f"its schema is nested more than {MAX_SCHEMA_DEPTH} levels deep"
    size = len(json.dumps(schema, ensure_ascii=False, default=str).encode("utf-8"))
    if size > MAX_SCHEMA_BYTES:
        return f"its schema is {size:,} bytes as JSON (the limit is {MAX_SCHEMA_BYTES:,})"
    for where, node in subschemas(schema, ""):
        for keyword in _REF_KEYWORDS:
            ref = node.get(keyword)
            if ref is None:
                continue
            problem = _ref_problem(schema, ref)
            if problem is not None:
                return f"its {keyword} {_short(ref)}{_at(where)} {problem}"
        pattern = node.get("pattern")
        if pattern is not None:
            problem = _pattern_problem(pattern)
            if problem is not None:
                return f"its pattern {_short(pattern)}{_at(where)} {problem}"
        names = node.get("patternProperties")
        if isinstance(names, dict):
            for name in names:
                problem = _pattern_problem(name)
                if problem is not None:
                    return f"its patternProperties name {_short(name)}{_at(where)} {problem}"
    loop = _endless_loop(schema)
    if loop is not None:
        where = _at(loop) if loop else " at the root"
        return f"its $ref{where} leads back to itself without reaching a value (an endless loop)"
    return None


def argument_problem(arguments: object, schema: dict[str, Any]) -> str | None:
    """Why ``arguments`` break ``schema`` (one line), or None when they match.

    ``schema`` should have passed :func:`schema_problem`; a schema that did not is answered with
    its problem, never fetched from or looped over.
    """
    # lazy: start-up (+174 ms: jsonschema, attrs, referencing)
    import jsonschema
    import referencing
    import referencing.exceptions

    problem = schema_problem(schema)
    if problem is not None:
        return f"the tool cannot be checked: {problem}"
    budget = _Budget(PATTERN_BUDGET_S)
    base = jsonschema.validators.validator_for(schema)
    checked = jsonschema.validators.extend(
        base, {"pattern": _pattern_keyword(budget), "patternProperties": _pattern_properties_keyword(budget)}
    )
    try:
        validator = checked(schema, registry=referencing.Registry())  # empty: no reference is ever retrieved
        error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
    except jsonschema.exceptions.SchemaError as exc:
        return f"the tool's own schema is invalid ({_first_line(exc.message)})"
    except (referencing.exceptions.Unresolvable, jsonschema.exceptions._WrappedReferencingError):
        return "the tool's schema refers to something it does not contain"
    except RecursionError:
        return "the arguments are nested too deeply to check"
    except _PatternTimeout as exc:
        return str(exc)
    if error is None:
        return None
    where = ".".join(str(part) for part in error.absolute_path)
    message = _first_line(error.message)
    return f"{where}: {message}" if where else message


# ---------------------------------------------------------------------- the schema's shape


def schema_depth(schema: object) -> int:
    """How deep lists and objects nest in ``schema`` (iterative: a deep schema cannot overflow the stack)."""
    deepest = 0
    stack: list[tuple[object, int]] = [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if deepest > MAX_SCHEMA_DEPTH:
                return deepest
        if isinstance(node, dict):
            stack.extend((value, depth + 1) for value in node.values())
        elif isinstance(node, list):
            stack.extend((value, depth + 1) for value in node)
    return deepest


# Where a schema holds subschemas (JSON Schema 2020-12 and draft 7): the walk goes only there, so a
# property named "pattern" or "$ref" is a property, not a keyword.
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SUBSCHEMA_ONE = (
    "items",
    "additionalItems",
    "additionalProperties",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
)


def subschemas(schema: dict[str, Any], where: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every subschema of ``schema`` (itself included) with its JSON pointer (``/properties/a``)."""
    stack: list[tuple[str, dict[str, Any]]] = [(where, schema)]
    while stack:
        path, node = stack.pop()
        yield path, node
        for keyword in _SUBSCHEMA_MAPS:
            children = node.get(keyword)
            if isinstance(children, dict):
                stack.extend(
                    (f"{path}/{keyword}/{_escape(str(name))}", child)
                    for name, child in children.items()
                    if isinstance(child, dict)
                )
        for keyword in _SUBSCHEMA_LISTS:
            items = node.get(keyword)
            if isinstance(items, list):
                stack.extend(
                    (f"{path}/{keyword}/{i}", child) for i, child in enumerate(items) if isinstance(child, dict)
                )
        for keyword in _SUBSCHEMA_ONE:
            child = node.get(keyword)
            if isinstance(child, dict):
                stack.append((f"{path}/{keyword}", child))


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _resolve(schema: dict[str, Any], ref: str) -> tuple[str, object] | None:
    """The node a local ``$ref`` (``#`` or ``#/a/b``) points at, with its pointer; None if nowhere."""
    pointer = ref[1:]
    node: object = schema
    if pointer == "":
        return "", node

    for token in pointer.split("/")[1:]:
        key = _unescape(urllib.parse.unquote(token))
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    return pointer, node


def _ref_problem(schema: dict[str, Any], ref: object) -> str | None:
    if not isinstance(ref, str):
        return "is not a string"
    if not (ref == "#" or ref.startswith("#/")):
        return "points outside the schema (Glassbox follows only references into the schema, '#/...', and fetches none)"
    if _resolve(schema, ref) is None:
        return "points at nothing in the schema"
    return None


def _endless_loop(schema: dict[str, Any]) -> str | None:
    """The pointer of a ``$ref`` on a loop that applies to the same value forever, or None.

    From a subschema, ``$ref``, ``allOf``/``anyOf``/``oneOf``, ``not``, ``if``/``then``/``else``
    apply to the same value; ``properties``, ``items`` and the rest move to a part of it. A loop of
    the first kind alone is endless whatever the value.
    """
    nodes: dict[str, dict[str, Any]] = dict(subschemas(schema, ""))
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in nodes:
        if start in state:
            continue
        stack: list[tuple[str, Iterator[str]]] = [(start, _in_place(schema, nodes[start], start))]
        state[start] = 1
        while stack:
            at, edges = stack[-1]
            step = next(edges, None)
            if step is None:
                state[at] = 2
                stack.pop()
                continue
            if step not in nodes:
                continue  # a reference to a list or a value, not a schema: nothing to follow
            seen = state.get(step)
            if seen == 1:
                return at
            if seen is None:
                state[step] = 1
                stack.append((step, _in_place(schema, nodes[step], step)))
    return None


def _in_place(schema: dict[str, Any], node: dict[str, Any], where: str) -> Iterator[str]:
    """The pointers of the subschemas of ``node`` that apply to the same value as ``node``."""
    for keyword in _REF_KEYWORDS:
        ref = node.get(keyword)
        if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
            found = _resolve(schema, ref)
            if found is not None:
                yield found[0]
    for keyword in _IN_PLACE_LISTS:
        items = node.get(keyword)
        if isinstance(items, list):
            for i in range(len(items)):
                yield f"{where}/{keyword}/{i}"
    for keyword in _IN_PLACE_ONE:
        if isinstance(node.get(keyword), dict):
            yield f"{where}/{keyword}"


# ---------------------------------------------------------------------- regular expressions


class _PatternTimeout(Exception):
    """A pattern ran past the check's budget."""


class _Budget:
    """CPU seconds left for the patterns of one check (this thread's CPU time, as ``regex`` counts)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.deadline = time.thread_time() + seconds

    def left(self) -> float:
        return max(self.deadline - time.thread_time(), 0.001)


def _pattern_problem(pattern: object) -> str | None:
    if not isinstance(pattern, str):
        return "is not a string"
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"is longer than {MAX_PATTERN_CHARS} characters"
    # lazy: start-up (+16 ms: regex)
    import regex

    try:
        regex.compile(pattern)
    except (regex.error, ValueError, OverflowError, RecursionError) as exc:
        return f"is not a valid regular expression ({_first_line(str(exc))})"
    return None


def _search(budget: _Budget, pattern: str, text: str) -> bool:
    # lazy: start-up (+14 ms: regex)
    import regex

    try:
        return regex.search(pattern, text, timeout=budget.left()) is not None
    except TimeoutError:
        raise _PatternTimeout(
            f"checking the pattern {_short(pattern)} took more than {budget.seconds:g} s of CPU; the call was not run"
        ) from None


def _pattern_keyword(budget: _Budget) -> Any:
    # lazy: start-up (+89 ms: jsonschema, attrs)
    from jsonschema.exceptions import ValidationError

    def pattern(validator: Any, pattern: str, instance: object, schema: object) -> Iterator[Any]:  # noqa: ARG001
        if validator.is_type(instance, "string") and not _search(budget, pattern, str(instance)):
            yield ValidationError(f"{instance!r} does not match {pattern!r}")

    return pattern


def _pattern_properties_keyword(budget: _Budget) -> Any:
    def pattern_properties(
        validator: Any,
        patterns: dict[str, Any],
        instance: object,
        schema: object,  # noqa: ARG001 - jsonschema's keyword signature
    ) -> Iterator[Any]:
        if not validator.is_type(instance, "object"):
            return
        assert isinstance(instance, dict)
        for name_pattern, subschema in patterns.items():
            for key, value in instance.items():
                if _search(budget, name_pattern, str(key)):
                    yield from validator.descend(value, subschema, path=key, schema_path=name_pattern)

    return pattern_properties


def _at(where: str) -> str:
    return f" at {where}" if where else ""


def _short(text: object, limit: int = 60) -> str:
    shown = repr(text)
    return shown if len(shown) <= limit else shown[: limit - 1] + "…'"


def _first_line(text: str) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= 300 else line[:299] + "…"
