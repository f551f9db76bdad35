"""``glassbox chat --tools`` and the history, from outside with the starter model: each step is saved
as it happens (a process killed mid-loop loses nothing on disk), a continued conversation sends the
calls and results back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import psutil
import pytest

from app.agent_history import INTERRUPTED_RESULT
from app.paths import Paths
from tests.app.cli.test_cli_chat_tools import glassbox, tools_home

pytestmark = [pytest.mark.model, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
# The test server plus a tool that never answers in time: the loop is caught in the middle of a call.
BLOCKING_SERVER = (
    "import sys\n"
    f"sys.path.insert(0, {str(ROOT)!r})\n"
    "from tests import mcp_servers\n"
    "server = mcp_servers.build_server()\n"
    "@server.tool(description='Looks a word up in the archive.')\n"
    "async def lookup(word: str) -> str:\n"
    "    import anyio\n"
    "    await anyio.sleep(600)\n"
    "    return 'found'\n"
    "server.run('stdio')\n"
)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A home with the test MCP server as ``tt`` and the blocking one as ``slowtools``."""
    from app.tool_config import add_server, parse_server

    root = tools_home(tmp_path)
    slow = parse_server("slowtools", {"command": sys.executable, "args": ["-c", BLOCKING_SERVER]})
    add_server(Paths.resolve(root), slow)
    return root


def _thread(home: Path, conversation: int) -> list[Any]:
    from engine.history import HistoryStore

    with HistoryStore(Paths.resolve(home).history_db) as store:
        return store.thread(conversation)


def _pending_call(home: Path) -> int | None:
    """The conversation whose pending reply holds the assistant's call, read without writing (the
    CLI may be creating the database): None before."""
    import sqlite3

    db = Paths.resolve(home).history_db
    if not db.exists():
        return None
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
        try:
            rows = conn.execute("SELECT conversation_id, stats FROM messages WHERE state = 'pending'").fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    for conversation, stats in rows:
        if stats and json.loads(stats).get("agent_messages"):
            return int(conversation)
    return None


def test_a_process_killed_mid_call_loses_nothing_and_the_chat_continues(starter_model: Path, home: Path) -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app",
            "chat",
            "--model",
            str(starter_model),
            "--tools",
            "slowtools",
            "--tool-choice",
            "lookup",
            "--yes",
            "--prompt",
            "Look up the word 'harbour'.",
            "--temperature",
            "0",
            "--max-tokens",
            "40",
            "--n-ctx",
            "2048",
            "--home",
            str(home),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    children: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 300
        conversation = None
        while conversation is None and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.1)
            conversation = _pending_call(home)
        assert conversation is not None, process.communicate(timeout=30)
        time.sleep(1.0)  # the call is running now (the server sleeps): the loop is mid-call
        assert process.poll() is None, "the call should still be running"
        children = psutil.Process(process.pid).children(recursive=True)
        process.send_signal(signal.SIGKILL)
        process.wait(30)
    finally:
        if process.poll() is None:
            process.kill()
        for child in children:  # the MCP server, orphaned by the kill
            if child.is_running():
                child.kill()
        process.communicate(timeout=30)

    thread = _thread(home, conversation)
    assert [(m.role, m.state) for m in thread] == [("user", "complete"), ("assistant", "pending")]
    assert thread[0].content == "Look up the word 'harbour'."
    stats = thread[1].stats
    # On disk: the assistant's call with its exact arguments, the first generation on the timeline.
    [message] = stats["agent_messages"]
    [call] = message["tool_calls"]
    assert call["name"] == "lookup" and call["id"]
    jsonschema.validate(
        call["arguments"], {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}
    )
    assert stats["tool_steps"] == [] and [e["kind"] for e in stats["loop"]] == ["generate"]

    # Continued in a new process: the interrupted call is answered, so the history is well formed.
    result = glassbox(
        "chat",
        "--model",
        str(starter_model),
        "--conversation",
        str(conversation),
        "--prompt",
        "Never mind. Say hello.",
        "--temperature",
        "0",
        "--max-tokens",
        "8",
        "--n-ctx",
        "2048",
        "--json",
        home=home,
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["conversation_id"] == conversation
    assert document["budget"]["tool_results"] > 0  # the call's (interrupted) result reached the prompt
    thread = _thread(home, conversation)
    assert [(m.role, m.state) for m in thread] == [
        ("user", "complete"),
        ("assistant", "partial"),
        ("user", "complete"),
        ("assistant", "complete"),
    ]
    assert thread[1].stats == stats  # the dead reply was ended as it was, every saved step kept
    from app.cli.commands.chat_history import ChatLog

    with ChatLog(Paths.resolve(home), conversation, None) as log:
        sent = log.history()
    assert [(m.role, m.tool_call_id) for m in sent[1:3]] == [("assistant", ""), ("tool", call["id"])]
    assert sent[2].content == INTERRUPTED_RESULT and sent[1].tool_calls[0].arguments == call["arguments"]


def test_a_tool_turn_is_saved_with_its_steps_and_a_continued_chat_sends_them_back(
    starter_model: Path, home: Path
) -> None:
    common = (
        "--tools",
        "tt",
        "--yes",
        "--temperature",
        "0",
        "--max-tokens",
        "24",
        "--n-ctx",
        "2048",
        "--max-steps",
        "1",
        "--json",
    )
    first = glassbox(
        "chat", "--model", str(starter_model), "--tool-choice", "add", "--prompt", "What is 2+3?", *common, home=home
    )
    assert first.returncode == 0, first.stderr
    turn = json.loads(first.stdout)
    conversation = turn["conversation_id"]
    [call] = turn["tool_calls"]
    assert call["result"] == str(call["arguments"]["a"] + call["arguments"]["b"])
    # The generation after the result ran under the chat's KV key: its state was saved for the next
    # process (tests/engine/test_agent_kv_cache.py restores one).
    assert turn["kv_saved_bytes"] > 0
    assert len(list((home / "data" / "kv_cache").glob("*.kv"))) == 1

    [_user, reply] = _thread(home, conversation)
    assert reply.state == "complete"
    stats = reply.stats
    assert [s["name"] for s in stats["tool_steps"]] == ["add"] and stats["tool_steps"][0]["result"] == call["result"]
    assert [m["role"] for m in stats["agent_messages"]] == ["assistant", "tool", "assistant"]
    assert [e["kind"] for e in stats["loop"]] == ["generate", "tool", "generate"]
    assert stats["agent_messages"][-1]["content"] == turn["text"]
    assert stats["finish_reason"] == turn["finish_reason"]

    second = glassbox(
        "chat",
        "--model",
        str(starter_model),
        "--conversation",
        str(conversation),
        "--tool-choice",
        "add",
        "--prompt",
        "And 10+20?",
        *common,
        home=home,
    )
    assert second.returncode == 0, second.stderr
    again = json.loads(second.stdout)
    # The first turn's call and result went back to the model.
    assert again["budget"]["tool_results"] > call["tokens"]
