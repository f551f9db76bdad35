"""``glassbox chat --tools`` from outside, with a real MCP stdio server (tests/mcp_servers.py) and the
starter model (a base model: the calls are grammar-constrained, so they validate every time)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from app.paths import Paths
from tests import mcp_servers

ADD_ARGUMENTS = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}


def glassbox(*args: str, home: Path, stdin: str = "", timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args, "--home", str(home)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def tools_home(tmp_path: Path) -> Path:
    """A new home under ``tmp_path`` with the test MCP server configured as ``tt``."""
    root = tmp_path / "home"
    paths = Paths.resolve(root)
    paths.ensure()
    mcp_servers.register(paths, "tt")
    return root


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A home with the test MCP server configured as ``tt``."""
    return tools_home(tmp_path)


def _chat(model: Path, home: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return glassbox(
        "chat",
        "--model",
        str(model),
        "--tools",
        "tt",
        "--n-ctx",
        "2048",
        "--max-tokens",
        "40",
        "--max-steps",
        "1",
        "--temperature",
        "1",
        "--json",
        *args,
        home=home,
        stdin=stdin,
    )


@pytest.mark.model
@pytest.mark.slow
def test_named_call_reaches_the_server_and_its_result_the_context(starter_model: Path, home: Path) -> None:
    result = _chat(
        starter_model, home, "--tool-choice", "add", "--yes", "--seed", "7", stdin="What is 2+3?\nAnd what is 10+20?\n"
    )
    assert result.returncode == 0, result.stderr
    turns = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(turns) == 2
    for turn in turns:
        [call] = turn["tool_calls"]
        assert call["name"] == "add" and call["source"] == "tt" and call["approval"] == "allowed"
        jsonschema.validate(call["arguments"], ADD_ARGUMENTS)
        # the server computed it: the result is the sum of the arguments the model chose
        assert call["result"] == str(call["arguments"]["a"] + call["arguments"]["b"])
        assert call["tokens"] > 0 and call["ms"] > 0 and not call["is_error"]
        # the last generation's prompt held the result, as its own band of the context map
        assert turn["budget"]["tool_results"] >= call["tokens"]
        assert set(turn["reasoning"]) == {"text", "tokens", "ms"}
    # the second turn's prompt kept the first turn's call and result in its history
    assert turns[1]["budget"]["tool_results"] > turns[0]["tool_calls"][0]["tokens"]


@pytest.mark.model
@pytest.mark.slow
def test_without_yes_a_run_with_no_terminal_refuses_the_call(starter_model: Path, home: Path) -> None:
    # whoami takes no arguments, so the forced call is complete within the 40 tokens whatever the
    # sampler draws (echo's text could run past them at temperature 1, leaving no call to refuse).
    result = _chat(starter_model, home, "--tool-choice", "whoami", "--prompt", "Say hello")
    assert result.returncode == 0, result.stderr
    assert "glassbox: tool call whoami refused: not approved (no terminal to ask; pass --yes" in result.stderr
    [call] = json.loads(result.stdout)["tool_calls"]
    assert call["approval"] == "denied" and call["is_error"] and "denied" in call["result"]


@pytest.mark.model
@pytest.mark.slow
def test_a_server_that_crashes_mid_call_is_a_clear_error_and_the_chat_goes_on(starter_model: Path, home: Path) -> None:
    result = _chat(starter_model, home, "--tool-choice", "crash", "--yes", "--prompt", "Crash it")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    [call] = document["tool_calls"]
    assert call["is_error"] and call["approval"] == "allowed"
    assert "\n" not in call["result"] and len(call["result"]) < 2000
    assert "Traceback" not in result.stderr
    assert document["finish_reason"] in ("stop", "length")  # the model answered after the error


@pytest.mark.model
@pytest.mark.slow
def test_json_schema_file_constrains_the_reply(starter_model: Path, tmp_path: Path) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"],
        "additionalProperties": False,
    }
    file = tmp_path / "schema.json"
    file.write_text(json.dumps(schema))
    result = glassbox(
        "chat",
        "--model",
        str(starter_model),
        "--json-schema",
        str(file),
        "--prompt",
        "The weather in Paris, as JSON:",
        "--max-tokens",
        "60",
        "--temperature",
        "1",
        "--seed",
        "3",
        "--n-ctx",
        "1024",
        "--json",
        home=tmp_path / "h",
    )
    assert result.returncode == 0, result.stderr
    jsonschema.validate(json.loads(json.loads(result.stdout)["text"]), schema)


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("--tool-choice", "add"), 2, "glassbox: error: --tool-choice needs --tools"),
        (("--tools", "nosuchserver"), 1, "nosuchserver"),
        (("--json-schema", "/nonexistent/schema.json"), 1, "/nonexistent/schema.json: cannot read the JSON schema"),
        (("--tools", "tt", "--tool-timeout", "0"), 2, "--tool-timeout must be positive"),
    ],
)
def test_bad_tool_options_are_one_line_errors(
    starter_model: Path, home: Path, args: tuple[str, ...], code: int, message: str
) -> None:
    result = glassbox("chat", "--model", str(starter_model), "--prompt", "hi", *args, home=home, timeout=120)
    assert result.returncode == code, result.stderr
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_a_schema_file_that_is_not_json_is_named(starter_model: Path, tmp_path: Path) -> None:
    file = tmp_path / "bad.json"
    file.write_text("{not json")
    result = glassbox(
        "chat",
        "--model",
        str(starter_model),
        "--prompt",
        "hi",
        "--json-schema",
        str(file),
        home=tmp_path / "h",
        timeout=120,
    )
    assert result.returncode == 1
    assert f"glassbox: error: {file}: not JSON (line 1" in result.stderr


def _interactive(args: list[str], home: Path, answer: str, timeout: float = 600) -> tuple[int, str, str]:
    """Runs ``glassbox`` with a terminal as stdin (so it asks), answering the first question."""
    import pty
    import select
    import time

    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "app", *args, "--home", str(home)],
        stdin=follower,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    os.close(follower)
    asked = ""
    deadline = time.monotonic() + timeout
    assert process.stderr is not None
    while "Allow?" not in asked and time.monotonic() < deadline and process.poll() is None:
        ready, _, _ = select.select([process.stderr], [], [], 1.0)
        if ready:
            asked += os.read(process.stderr.fileno(), 4096).decode(errors="replace")
    os.write(leader, answer.encode() + b"\n")
    out, err = process.communicate(timeout=max(deadline - time.monotonic(), 1))
    os.close(leader)
    return process.returncode, out, asked + err


@pytest.mark.model
@pytest.mark.slow
def test_a_terminal_asks_and_always_allow_is_remembered(starter_model: Path, home: Path) -> None:
    args = [
        "chat",
        "--model",
        str(starter_model),
        "--tools",
        "tt",
        "--tool-choice",
        "add",
        "--n-ctx",
        "2048",
        "--max-tokens",
        "40",
        "--max-steps",
        "1",
        "--temperature",
        "1",
        "--seed",
        "5",
        "--json",
        "--prompt",
        "What is 2+3?",
    ]
    code, out, err = _interactive(args, home, "a")
    assert code == 0, err
    assert "[tool call] add (tt) {" in err and "Allow? [y]es once, [a]lways, [N]o:" in err
    [call] = json.loads(out)["tool_calls"]
    assert call["approval"] == "always" and call["result"] == str(call["arguments"]["a"] + call["arguments"]["b"])
    # remembered: a later run with no terminal and no --yes runs the call without asking
    later = _chat(starter_model, home, "--tool-choice", "add", "--seed", "6", "--prompt", "And 4+4?")
    assert later.returncode == 0, later.stderr
    [again] = json.loads(later.stdout)["tool_calls"]
    assert again["approval"] == "allow-listed" and "refused" not in later.stderr
