"""Real MCP servers for the tests, written with the official SDK (``mcp.server.mcpserver``).

Run one as a child: ``python tests/mcp_servers.py [--junk] [--hostile] [--http PORT]`` (stdio by
default; ``--junk`` first prints lines that are not JSON-RPC on stdout, as careless servers do;
``--hostile`` adds the tools of :func:`add_hostile_tools`). Its tools:

- ``add(a, b)``: the sum, as text.
- ``echo(text)``: the text back.
- ``whoami()``: the server's process id (tests check that a child is gone).
- ``crash()``: the server says ``fatal: out of cheese`` on stderr and dies (exit code 3), mid-call.
- ``hang(seconds)``: the server blocks its whole process for ``seconds`` (a server that hangs).
- ``slow(seconds)``: the call takes ``seconds``; the server still answers other requests.
- ``fail(message)``: a tool error (``isError``) with ``message``.
- ``big(n)``: ``n`` characters of text.
- ``header(name)``: the value of an HTTP request header (streamable HTTP only).
- ``spawn(mode)``: starts a process that sleeps for five minutes and returns its pid: ``group`` in
  the server's process group, ``session`` in a new session (``setsid``), ``daemon`` by a double
  fork (its parent exits at once, so it is an orphan in a session of its own).

The modes that start the server: ``--dots`` first prints ``Loading...`` with no newline (the first
message follows on the same line); ``--garbage`` prints only lines that are not JSON-RPC and then
sleeps (``--garbage exit``: exits; ``--garbage flood``: prints them forever); ``--chatty`` relays
the server's output with a log line (not JSON-RPC) before each message. Environment:
``GLASSBOX_TEST_MCP_HUGE_DESCRIPTION=N`` gives ``echo`` a description of N characters.

The environment variable ``GLASSBOX_TEST_MCP_MARK``, when set, is prefixed to every ``echo``, so a
test sees that the configured ``env`` reached the server. Used by ``tests/engine/test_mcp_client.py``,
``tests/app/cli/test_cli_mcp.py`` and the ``glassbox chat --tools`` end-to-end tests.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

# At module level: the SDK reads the tools' annotations (``ctx: Context``) from the module's globals.
from mcp.server.mcpserver import Context

#: This file, to put in a server's ``args``: ``[sys.executable, str(SERVER_SCRIPT)]``.
SERVER_SCRIPT = Path(__file__).resolve()


def stdio_command() -> tuple[str, list[str]]:
    """``(command, args)`` that start this test server over stdio."""
    return sys.executable, [str(SERVER_SCRIPT)]


def register(paths: object, name: str = "testtools", **env: str) -> None:
    """Adds this server (stdio) to the ``mcp.json`` of ``paths`` (an ``app.paths.Paths``) as
    ``name``, with ``env`` for it; ``glassbox chat --tools NAME`` then offers its tools."""
    from app.tool_config import add_server, parse_server

    command, args = stdio_command()
    entry: dict[str, object] = {"command": command, "args": args}
    if env:
        entry["env"] = dict(env)
    add_server(paths, parse_server(name, entry), replace=True)  # type: ignore[arg-type]


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped, counts as gone)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pid: int, seconds: float) -> bool:
    """Waits up to ``seconds`` for process ``pid`` to end; whether it did."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not process_alive(pid):
            return True
        time.sleep(0.05)
    return not process_alive(pid)


def build_server() -> object:
    """The test server (an ``MCPServer``)."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("glassbox-test")

    @server.tool(description="Adds two integers and returns the sum.")
    def add(a: int, b: int) -> str:
        return str(a + b)

    @server.tool(description="Returns the text it is given.")
    def echo(text: str) -> str:
        return os.environ.get("GLASSBOX_TEST_MCP_MARK", "") + text

    @server.tool(description="The server's process id.")
    def whoami() -> str:
        return str(os.getpid())

    @server.tool(description="Kills the server mid-call.")
    def crash() -> str:
        sys.stderr.write("fatal: out of cheese\n")
        sys.stderr.flush()
        os._exit(3)

    @server.tool(description="Blocks the whole server for some seconds.")
    async def hang(seconds: float = 60.0) -> str:
        time.sleep(seconds)  # blocks the server's event loop: it answers nothing, not even a ping
        return "woke up"

    @server.tool(description="Waits some seconds without blocking the server.")
    async def slow(seconds: float = 60.0) -> str:
        import anyio

        await anyio.sleep(seconds)
        return "done"

    @server.tool(description="Fails with a tool error.")
    def fail(message: str = "it failed") -> str:
        from mcp.server.mcpserver.exceptions import ToolError

        raise ToolError(message)

    @server.tool(description="Returns n characters.")
    def big(n: int) -> str:
        return "x" * n

    @server.tool(description="The value of an HTTP request header (empty over stdio).")
    def header(name: str, ctx: Context) -> str:
        return (ctx.headers or {}).get(name.lower(), "")

    @server.tool(description="Starts a long-lived process and returns its pid.")
    def spawn(mode: str = "group") -> str:
        return str(_spawn(mode))

    huge = int(os.environ.get("GLASSBOX_TEST_MCP_HUGE_DESCRIPTION", "0"))
    if huge:
        server._tool_manager._tools["echo"].description = "d" * huge  # type: ignore[attr-defined]
    return server


_DAEMON = """
import os, sys, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.write(w, str(os.getpid()).encode())
        os.close(w)
        time.sleep(300)
        os._exit(0)
    os._exit(0)
os.close(w)
print(os.read(r, 32).decode())
"""


def _spawn(mode: str) -> int:
    import subprocess

    quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    if mode == "group":
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], **quiet).pid  # type: ignore[call-overload]
    if mode == "session":
        command = [sys.executable, "-c", "import time; time.sleep(300)"]
        return subprocess.Popen(command, start_new_session=True, **quiet).pid  # type: ignore[call-overload]
    if mode == "daemon":
        done = subprocess.run([sys.executable, "-c", _DAEMON], capture_output=True, text=True, timeout=30, check=True)
        return int(done.stdout)
    raise ValueError(f"unknown mode {mode!r}")


def _garbage(how: str) -> None:
    """Prints what is not JSON-RPC, as a program that is not an MCP server does."""
    print("hello, I am not an MCP server", flush=True)
    print("usage: tool [--help]", flush=True)
    if how == "exit":
        return
    if how == "flood":
        while True:
            print("still not JSON", flush=True)
    time.sleep(300)


#: A tool name with an OSC sequence that retitles a terminal, a BEL and a right-to-left override.
HOSTILE_NAME = "evil\x1b]0;pwned\x07name\u202egpj.exe"
#: A description that clears the screen, returns the carriage and hides text behind a zero-width space.
HOSTILE_DESCRIPTION = "\x1b[2J\x1b[Hcleared\rover\u200bwritten \u202eesrever"


def add_hostile_tools(server: object) -> None:
    """Tools a hostile server offers: a name and description made of terminal controls and bidi
    characters, and argument schemas that attack the client's checks:

    - ``ref_root``: the parameters' schema is ``{"$ref": "#"}`` at its root (infinite recursion);
    - ``ref_remote``: a property's ``$ref`` points at the URL in ``GLASSBOX_TEST_MCP_REF_URL``;
    - ``redos``: a property's ``pattern`` is ``^(a+)+$`` (catastrophic backtracking);
    - ``deep``: a schema nested 90 levels deep (``GLASSBOX_TEST_MCP_DEEP`` levels, when set).
    """
    import typing

    mcp = typing.cast(typing.Any, server)

    @mcp.tool(name=HOSTILE_NAME, description=HOSTILE_DESCRIPTION)
    def hostile(text: str = "") -> str:
        return text

    @mcp.tool(description="Its schema refers to itself at the root.")
    def ref_root(value: str = "") -> str:
        return value

    @mcp.tool(description="Its schema refers to a remote URL.")
    def ref_remote(value: str = "") -> str:
        return value

    @mcp.tool(description="Its pattern backtracks exponentially.")
    def redos(value: str = "") -> str:
        return value

    @mcp.tool(description="Its schema is nested very deep.")
    def deep(value: str = "") -> str:
        return value

    tools = mcp._tool_manager._tools
    tools["ref_root"].parameters = {"type": "object", "$ref": "#"}
    url = os.environ.get("GLASSBOX_TEST_MCP_REF_URL", "http://127.0.0.1:9/schema.json")
    tools["ref_remote"].parameters = {"type": "object", "properties": {"value": {"$ref": url}}}
    tools["redos"].parameters = {"type": "object", "properties": {"value": {"type": "string", "pattern": "^(a+)+$"}}}
    nested: dict[str, object] = {"type": "string"}
    for _ in range(int(os.environ.get("GLASSBOX_TEST_MCP_DEEP", "90")) // 2):  # two levels each
        nested = {"type": "object", "properties": {"value": nested}}
    tools["deep"].parameters = nested


def _relay_chatty(argv: list[str]) -> None:
    """Runs the server as a child and relays its output, a log line before each message (the SDK's
    server guards its own stdout, so the lines a careless server logs there are written here)."""
    import subprocess

    child = subprocess.Popen([sys.executable, str(SERVER_SCRIPT), *argv], stdout=subprocess.PIPE)
    assert child.stdout is not None
    for line in child.stdout:
        sys.stdout.buffer.write(b"[INFO] handled a request\n" + line)
        sys.stdout.buffer.flush()
    sys.exit(child.wait())


def main(argv: list[str]) -> None:
    if argv[:1] == ["--chatty"]:
        _relay_chatty(argv[1:])
        return
    if argv[:1] == ["--garbage"]:
        _garbage(argv[1] if len(argv) > 1 else "sleep")
        return
    if argv[:1] == ["--dots"]:  # progress printed with no newline: the first message follows on its line
        argv = argv[1:]
        print("Loading...", end="", flush=True)
    if argv[:1] == ["--junk"]:  # a server that prints things that are not JSON-RPC on stdout first
        argv = argv[1:]
        print("Starting server... not JSON", flush=True)
        print('{"jsonrpc": "2.0", "method": 5}', flush=True)
    hostile = argv[:1] == ["--hostile"]
    if hostile:
        argv = argv[1:]
    server = build_server()
    if hostile:
        add_hostile_tools(server)
    if len(argv) >= 2 and argv[0] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(argv[1]))  # type: ignore[attr-defined]
    else:
        server.run("stdio")  # type: ignore[attr-defined]


if __name__ == "__main__":
    main(sys.argv[1:])
