"""Hostile tool schemas (an MCP server's or an API client's): refused when offered, or checked within
bounds; never a traceback, a network request or a hang (engine.inference.tool_schema, the agent loop)."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from engine.agent.loop import Agent
from engine.errors import EngineError
from engine.inference.tool_schema import (
    MAX_PATTERN_CHARS,
    MAX_SCHEMA_BYTES,
    MAX_SCHEMA_DEPTH,
    argument_problem,
    schema_problem,
)
from engine.inference.tools import ToolSpec, check_tools
from tests.engine.test_agent import FakeProvider, Reply, ScriptedBackend, call, run_all


@contextlib.contextmanager
def counting_schema_server() -> Iterator[tuple[str, list[str]]]:
    """A loopback HTTP server that serves a schema and records every request it gets: ``(url, hits)``."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            body = b'{"type": "string"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class names it
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/schema.json", hits
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def schema_host() -> Iterator[tuple[str, list[str]]]:
    with counting_schema_server() as hosted:
        yield hosted


def _object(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties}


def test_a_remote_ref_is_never_fetched(schema_host: tuple[str, list[str]]) -> None:
    url, hits = schema_host
    spec = ToolSpec("lookup", "", _object(value={"$ref": url}))
    with pytest.raises(EngineError) as caught:
        Agent(ScriptedBackend([]), [FakeProvider([spec])])  # offered: refused, named
    assert str(caught.value) == (
        f"tool 'lookup': its $ref '{url}' at /properties/value points outside the schema (Glassbox follows only "
        "references into the schema, '#/...', and fetches none)"
    )
    problem = argument_problem({"value": "x"}, spec.parameters)  # checked anyway: refused, not fetched
    assert problem is not None and "points outside the schema" in problem
    for ref in ("https://example.com/s.json", "file:///etc/passwd", "other.json", "#anchor"):
        assert "points outside the schema" in (schema_problem(_object(value={"$ref": ref})) or "")
    assert hits == []


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"type": "object", "$ref": "#"}, "at the root"),
        ({"type": "object", "allOf": [{"$ref": "#"}]}, "at /allOf/0"),
        (
            {
                "type": "object",
                "$defs": {"a": {"anyOf": [{"$ref": "#/$defs/b"}]}, "b": {"not": {"$ref": "#/$defs/a"}}},
                "properties": {"x": {"$ref": "#/$defs/a"}},
            },
            "at /$defs/",
        ),
    ],
)
def test_a_ref_that_loops_on_the_same_value_is_refused_in_one_line(schema: dict[str, Any], where: str) -> None:
    problem = schema_problem(schema)
    assert problem is not None and where in problem and "endless loop" in problem
    with pytest.raises(EngineError, match="endless loop"):
        check_tools([ToolSpec("loop", "", schema)])
    assert "endless loop" in (argument_problem({"x": 1}, schema) or "")  # never a RecursionError


def test_a_recursive_schema_that_consumes_the_value_is_fine_and_deep_arguments_are_one_line() -> None:
    tree = {"type": "object", "properties": {"name": {"type": "string"}, "child": {"$ref": "#"}}}
    assert schema_problem(tree) is None
    assert argument_problem({"name": "a", "child": {"name": "b", "child": {}}}, tree) is None
    assert argument_problem({"child": {"name": 5}}, tree) == "child.name: 5 is not of type 'string'"
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(5000):
        node["child"] = {}
        node = node["child"]
    assert argument_problem(deep, tree) == "the arguments are nested too deeply to check"


def test_a_backtracking_pattern_ends_within_its_budget() -> None:
    tool = ToolSpec("redos", "", _object(value={"type": "string", "pattern": "^(a+)+$"}))
    backend = ScriptedBackend([Reply("", (call("redos", value="a" * 40 + "!"),)), Reply("ok")])
    provider = FakeProvider([tool])
    _, result = run_all(Agent(backend, [provider], approve=lambda *_: "once"))
    [step] = result.steps
    assert step.approval == "invalid-arguments" and provider.calls == []
    assert step.result.content.endswith("does not match '^(a+)+$'")
    # A pattern the matcher cannot shortcut: the check stops at its budget and says so.
    worst = _object(value={"type": "string", "pattern": "^(a|a)*$"})
    assert argument_problem({"value": "a" * 60 + "!"}, worst) == (
        "checking the pattern '^(a|a)*$' took more than 0.25 s of CPU; the call was not run"
    )
    names = {"type": "object", "patternProperties": {"^(a|a)*$": {"type": "string"}}}
    assert "took more than" in (argument_problem({"a" * 60 + "!": "x"}, names) or "")
    assert argument_problem({"value": "aaa"}, worst) is None


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        ({"type": "object", "properties": {"p": {"pattern": "(unclosed"}}}, "is not a valid regular expression"),
        ({"type": "object", "properties": {"p": {"pattern": "a" * (MAX_PATTERN_CHARS + 1)}}}, "is longer than"),
        ({"type": "object", "properties": {"p": {"pattern": 5}}}, "is not a string"),
        ({"type": "object", "patternProperties": {"(": {}}}, "its patternProperties name '(' is not a valid"),
        ({"type": "object", "properties": {"p": {"$ref": "#/$defs/missing"}}}, "points at nothing in the schema"),
        ({"type": "object", "properties": {"p": {"$ref": 5}}}, "its $ref 5 at /properties/p is not a string"),
        ({"type": "object", "description": "x" * MAX_SCHEMA_BYTES}, f"(the limit is {MAX_SCHEMA_BYTES:,})"),
    ],
)
def test_bad_patterns_refs_and_sizes_are_named(schema: dict[str, Any], problem: str) -> None:
    found = schema_problem(schema)
    assert found is not None and problem in found and "\n" not in found


def test_a_schema_nested_too_deep_is_refused_without_recursion() -> None:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(50_000):
        schema = {"type": "object", "properties": {"v": schema}}
    assert schema_problem(schema) == f"its schema is nested more than {MAX_SCHEMA_DEPTH} levels deep"


def test_properties_named_like_keywords_are_properties() -> None:
    schema = _object(pattern={"type": "string"}, **{"$ref": {"type": "string"}, "allOf": {"type": "integer"}})
    assert schema_problem(schema) is None
    assert argument_problem({"pattern": "^x$", "$ref": "#", "allOf": 3}, schema) is None
    assert argument_problem({"allOf": "three"}, schema) == "allOf: 'three' is not of type 'integer'"


def test_local_refs_and_defs_still_validate() -> None:
    schema = {
        "type": "object",
        "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}},
        "properties": {"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/properties/a"}},
    }
    assert schema_problem(schema) is None
    assert argument_problem({"a": {"x": 1}, "b": {"x": 2}}, schema) is None
    assert argument_problem({"b": {}}, schema) == "b: 'x' is a required property"
