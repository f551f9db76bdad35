"""MCP in the frozen bundle, checked without building it.

The bundle once excluded starlette, sse_starlette and uvicorn, which the mcp SDK imports even for a
client: no MCP server started from the frozen app. These tests catch that in seconds: nothing the
SDK imports is in the spec's excludes, and the runtime hook that lets the bundle be the self-test's
stdio server (``glassbox --self-test-mcp-server``) really serves. The frozen proof is the self-test
that installers/build.py runs on the bundle (its MCP step).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.gui import selftest
from engine.agent.mcp_client import McpServer, McpServerConfig

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "installers" / "glassbox.spec"
RTHOOK = ROOT / "installers" / "hooks" / "rthook_self_test_mcp_server.py"

# Every import path of the SDK the app uses, the client and both transports (engine.agent.mcp_client)
# and the server class (the self-test's server), with the spec's excludes missing as in the bundle.
_SDK_IMPORTS = """
import json, sys

EXCLUDES = json.loads(sys.argv[1])


class LeftOut:
    def find_spec(self, name, path=None, target=None):
        if any(name == x or name.startswith(x + ".") for x in EXCLUDES):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


sys.meta_path.insert(0, LeftOut())
from mcp import Client
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import MCPServer
print("imported")
"""


def _spec_excludes() -> list[str]:
    tree = ast.parse(SPEC.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EXCLUDES" for t in node.targets):
            excludes = ast.literal_eval(node.value)
            assert isinstance(excludes, list)
            return [str(name) for name in excludes]
    raise AssertionError(f"{SPEC}: no EXCLUDES list")


def _import_sdk_without(excludes: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _SDK_IMPORTS, json.dumps(excludes)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )


def test_the_mcp_sdk_imports_without_what_the_spec_excludes() -> None:
    excludes = _spec_excludes()
    assert "fastapi" in excludes  # the list was found and parsed
    done = _import_sdk_without(excludes)
    last = (done.stderr.strip().splitlines() or [""])[-1]
    assert done.returncode == 0, f"installers/glassbox.spec excludes what the mcp SDK imports: {last}"
    assert done.stdout.strip() == "imported"


def test_the_import_check_catches_a_left_out_module() -> None:
    done = _import_sdk_without(["starlette"])  # the bundle's old mistake
    assert done.returncode == 1
    assert "No module named 'starlette" in done.stderr


def test_the_spec_runs_the_self_test_server_hook() -> None:
    text = SPEC.read_text(encoding="utf-8")
    assert f'"{RTHOOK.name}"' in text
    tree = ast.parse(RTHOOK.read_text(encoding="utf-8"))
    flags = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    assert selftest.MCP_SERVER_FLAG in flags  # the hook answers the flag the self-test sends


def test_the_runtime_hook_serves_the_self_test_tool() -> None:
    # As in the bundle: the hook runs first, with the flag as the only argument.
    config = McpServerConfig(
        "hook", command=sys.executable, args=(str(RTHOOK), selftest.MCP_SERVER_FLAG), env={"PYTHONPATH": str(ROOT)}
    )
    with McpServer(config) as server:
        assert [spec.name for spec in server.tools()] == ["add"]
        result = server.call("add", {"a": 20, "b": 22}, timeout_s=30)
    assert not result.is_error
    assert result.content.strip() == "42"


def test_the_runtime_hook_does_nothing_without_the_flag() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for argv in ([], ["--self-test"], [selftest.MCP_SERVER_FLAG, "extra"]):
        done = subprocess.run(
            [sys.executable, "-X", "importtime", str(RTHOOK), *argv],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == ""
        assert " mcp" not in done.stderr  # the SDK is not even imported


def test_the_self_test_launches_its_server_by_itself_when_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", "/opt/glassbox/glassbox")
    assert selftest.mcp_server_command() == ("/opt/glassbox/glassbox", (selftest.MCP_SERVER_FLAG,), None)


def test_the_self_test_mcp_step_passes_from_source() -> None:
    assert selftest._mcp_tools() == "a stdio server (Python) listed 1 tool; add(2, 3) = 5"


SUPERVISOR_HOOK = ROOT / "installers" / "hooks" / "rthook_mcp_supervisor.py"


def test_the_spec_runs_the_supervisor_hook_on_the_supervisors_flag() -> None:
    from engine.agent.mcp_supervisor import FROZEN_FLAG

    assert f'"{SUPERVISOR_HOOK.name}"' in SPEC.read_text(encoding="utf-8")
    tree = ast.parse(SUPERVISOR_HOOK.read_text(encoding="utf-8"))
    flags = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    assert FROZEN_FLAG in flags


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the supervisor is Linux's")
def test_the_frozen_app_supervises_its_servers_through_the_hook(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from tests.mcp_servers import SERVER_SCRIPT, wait_gone

    python = sys.executable  # the server's Python (it needs the SDK); the "bundle" below is the app's
    bundle = tmp_path / "glassbox"  # a stand-in for the bundle's executable: it runs the runtime hook first
    bundle.write_text(f'#!/bin/sh\nPYTHONPATH={ROOT} exec {python} {SUPERVISOR_HOOK} "$@"\n')
    bundle.chmod(0o755)
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", str(bundle))
    config = McpServerConfig("frozen", command=python, args=(str(SERVER_SCRIPT),))
    with McpServer(config) as server:
        child = int(server.call("spawn", {"mode": "daemon"}, timeout_s=30).content)
        supervisor = server._stdio.pid
        argv = Path(f"/proc/{supervisor}/cmdline").read_bytes().split(b"\0")
        assert argv[1:3] == [str(SUPERVISOR_HOOK).encode(), b"--glassbox-mcp-supervisor"]
    assert wait_gone(child, 10)  # the orphan the server made ended with it
