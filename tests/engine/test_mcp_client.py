"""engine.agent.mcp_client against real MCP servers written with the SDK (tests/mcp_servers.py), over
stdio and streamable HTTP: listing, calls, tool errors, a crash mid-call, a hang, restarts, cancel,
bad commands, and no child left behind (closed, at exit, and when the parent is killed)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.agent.mcp_client import MAX_FAILED_STARTS, McpServer, McpServerConfig, McpServerError
from engine.inference.tools import ToolProvider, ToolResult
from tests.mcp_servers import SERVER_SCRIPT, stdio_command
from tests.mcp_servers import process_alive as _alive
from tests.mcp_servers import wait_gone as _wait_gone

REPO = Path(__file__).resolve().parents[2]


def _config(name: str = "test", **env: str) -> McpServerConfig:
    command, args = stdio_command()
    return McpServerConfig(name, command=command, args=tuple(args), env=env)


@pytest.fixture(scope="module")
def server() -> Iterator[McpServer]:
    with McpServer(_config(GLASSBOX_TEST_MCP_MARK="env:")) as provider:
        yield provider


def test_is_a_tool_provider(server: McpServer) -> None:
    assert isinstance(server, ToolProvider)


def test_lists_the_tools_with_their_schemas(server: McpServer) -> None:
    tools = {tool.name: tool for tool in server.tools()}
    assert {"add", "echo", "whoami", "crash", "hang", "slow", "fail", "big", "header"} <= set(tools)
    add = tools["add"]
    assert add.source == "test"
    assert add.description == "Adds two integers and returns the sum."
    assert add.parameters["type"] == "object"
    assert set(add.parameters["properties"]) == {"a", "b"}
    assert add.parameters["required"] == ["a", "b"]
    assert server.status().state == "running"


def test_calls_a_tool(server: McpServer) -> None:
    result = server.call("add", {"a": 2, "b": 40}, timeout_s=10)
    assert result.content == "42"
    assert not result.is_error


def test_the_configured_environment_reaches_the_server(server: McpServer) -> None:
    assert server.call("echo", {"text": "hi"}, timeout_s=10).content == "env:hi"


def test_a_tool_error_is_an_error_result(server: McpServer) -> None:
    result = server.call("fail", {"message": "the disk is on fire"}, timeout_s=10)
    assert result.is_error
    assert "the disk is on fire" in result.content


def test_an_unknown_tool_and_bad_arguments_are_error_results(server: McpServer) -> None:
    unknown = server.call("no_such_tool", {}, timeout_s=10)
    assert unknown.is_error
    assert "no_such_tool" in unknown.content
    bad = server.call("add", {"a": "two"}, timeout_s=10)
    assert bad.is_error
    assert server.call("add", {"a": 1, "b": 1}, timeout_s=10).content == "2"  # still usable


def test_a_long_result_is_cut_with_a_marker(server: McpServer) -> None:
    from engine.agent import mcp_client

    result = server.call("big", {"n": mcp_client.MAX_RESULT_CHARS + 500}, timeout_s=20)
    assert not result.is_error
    assert result.content.endswith("[... 500 more characters cut by Glassbox]")


def test_a_slow_call_times_out_and_the_server_stays(server: McpServer) -> None:
    pid = server.call("whoami", {}, timeout_s=10).content
    started = time.monotonic()
    result = server.call("slow", {"seconds": 30}, timeout_s=0.5)
    # A hang guard, not a speed target: half the 30 s call, 30x its 0.5 s timeout.
    assert time.monotonic() - started < 15
    assert result.is_error
    assert result.content == "MCP server 'test': slow timed out after 0.5 s"
    assert server.call("whoami", {}, timeout_s=10).content == pid


def test_cancel_returns_at_once(server: McpServer) -> None:
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    started = time.monotonic()
    result = server.call("slow", {"seconds": 30}, timeout_s=60, cancel=cancel)
    # A hang guard, not a speed target: half the 30 s call, 50x the 0.3 s to the cancel.
    assert time.monotonic() - started < 15
    assert result.is_error
    assert "cancelled" in result.content
    assert server.call("add", {"a": 1, "b": 2}, timeout_s=10).content == "3"


def test_calls_from_several_threads_at_once(server: McpServer) -> None:
    results: dict[int, str] = {}

    def work(i: int) -> None:
        results[i] = server.call("add", {"a": i, "b": 1000}, timeout_s=20).content

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == {i: str(i + 1000) for i in range(8)}


@pytest.mark.slow
def test_a_crash_mid_call_is_one_line_and_the_server_restarts() -> None:
    with McpServer(_config("crashy")) as server:
        first = int(server.call("whoami", {}, timeout_s=10).content)
        result = server.call("crash", {}, timeout_s=10)
        assert result.is_error
        assert result.content == (
            "MCP server 'crashy': it stopped during the call to crash (it said: fatal: out of cheese); "
            "it restarts on next use"
        )
        assert "\n" not in result.content
        assert _wait_gone(first, 5)
        assert server.status().state == "stopped"
        second = int(server.call("whoami", {}, timeout_s=10).content)
        assert second != first
        assert server.status().starts == 2
        assert [tool.name for tool in server.tools()][:2] == ["add", "echo"]  # listed again after the restart


@pytest.mark.slow
def test_a_hung_server_times_out_is_stopped_and_restarts() -> None:
    with McpServer(_config("stuck")) as server:
        first = int(server.call("whoami", {}, timeout_s=10).content)
        started = time.monotonic()
        result = server.call("hang", {"seconds": 120}, timeout_s=1)
        took = time.monotonic() - started
        assert result.is_error
        assert result.content.startswith("MCP server 'stuck': hang timed out after 1 s; it did not answer")
        assert "stopped" in result.content
        # A hang guard, not a speed target: half the 120 s hang, over 10x the few seconds here.
        assert took < 60
        assert _wait_gone(first, 5)
        second = int(server.call("whoami", {}, timeout_s=10).content)
        assert second != first


def test_a_missing_command_is_one_line() -> None:
    with McpServer(McpServerConfig("ghost", command="/nonexistent/mcp-server")) as server:
        result = server.call("anything", {}, timeout_s=5)
        assert result.is_error
        assert result.content == (
            "MCP server 'ghost': it did not start: the command '/nonexistent/mcp-server' was not found; "
            "the call to anything did not run"
        )
        with pytest.raises(McpServerError, match=r"^MCP server 'ghost': it did not start: the command"):
            server.tools()


def test_a_missing_working_folder_is_named() -> None:
    config = McpServerConfig("lost", command=sys.executable, args=(str(SERVER_SCRIPT),), cwd="/nonexistent/folder")
    with McpServer(config) as server, pytest.raises(McpServerError) as caught:
        server.tools()
    assert (
        str(caught.value)
        == "MCP server 'lost': it did not start: its working folder '/nonexistent/folder' does not exist"
    )


def test_a_server_that_exits_at_once_says_its_last_words() -> None:
    script = "import sys; print('missing API key FOO_TOKEN', file=sys.stderr); sys.exit(2)"
    with McpServer(McpServerConfig("quitter", command=sys.executable, args=("-c", script))) as server:
        with pytest.raises(McpServerError) as caught:
            server.tools()
        message = str(caught.value)
        assert message.startswith("MCP server 'quitter': it did not start")
        assert "(it said: missing API key FOO_TOKEN)" in message
        assert "\n" not in message
        for _ in range(MAX_FAILED_STARTS - 1):
            with pytest.raises(McpServerError):
                server.tools()
        assert server.status().state == "failed"
        starts = server.status().starts
        with pytest.raises(McpServerError, match="not retried"):
            server.tools()
        assert server.status().starts == starts  # not started again
        server.reset()
        with pytest.raises(McpServerError, match="it did not start"):
            server.tools()
        assert server.status().starts == starts + 1


def test_a_server_that_never_answers_the_handshake_times_out() -> None:
    script = "import time; time.sleep(60)"
    config = McpServerConfig("mute", command=sys.executable, args=("-c", script))
    with McpServer(config, connect_timeout_s=1.0) as server:
        started = time.monotonic()
        with pytest.raises(McpServerError, match="did not answer within 1 s of starting"):
            server.tools()
        # A hang guard, not a speed target: half the 60 s silence, over 10x the ~2 s here.
        assert time.monotonic() - started < 30


_NO_SDK = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {repo!r})

    class LeftOut:  # as in a bundle built without starlette: importing it fails
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] == "starlette":
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

    sys.meta_path.insert(0, LeftOut())
    from engine.agent.mcp_client import McpServer, McpServerConfig, McpServerError
    assert "mcp" not in sys.modules  # the SDK is imported on first use, inside the start
    marker = {marker!r}
    config = McpServerConfig("tiny", command=sys.executable, args=("-c", f"open({{marker!r}}, 'w')"))
    started = time.monotonic()
    with McpServer(config, connect_timeout_s=60) as server:
        try:
            server.tools()
        except McpServerError as exc:
            print(f"{{time.monotonic() - started:.2f}} {{exc}}")
    """
)


def test_an_sdk_that_cannot_be_imported_is_one_line_at_once(tmp_path: Path) -> None:
    # The frozen bundle once left out a module the SDK imports: the start's task died on the import,
    # nothing told the caller, and the user waited 30 s for "did not answer within 30 s of starting".
    marker = tmp_path / "server-ran"
    script = tmp_path / "no_sdk.py"
    script.write_text(_NO_SDK.format(repo=str(REPO), marker=str(marker)))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    seconds, message = done.stdout.strip().split(" ", 1)
    assert message == (
        "MCP server 'tiny': it did not start: Glassbox's MCP support cannot load "
        "(the module 'starlette' is missing; this installation is incomplete)"
    )
    assert float(seconds) < 30  # at once, not after the 60 s connect timeout (a hang guard: ~2 s here)
    assert not marker.exists()  # the server was never run


def test_a_start_whose_task_dies_unheard_fails_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken_hold(self: McpServer, ready: object) -> None:
        raise RuntimeError("the holder broke")

    monkeypatch.setattr(McpServer, "_hold", broken_hold)
    with McpServer(_config("broken"), connect_timeout_s=60) as server:
        started = time.monotonic()
        with pytest.raises(McpServerError, match=r"^MCP server 'broken': it did not start: the holder broke"):
            server.tools()
        # A hang guard, not a speed target: half the 60 s connect timeout.
        assert time.monotonic() - started < 30


def test_close_during_a_start_ends_the_wait_at_once() -> None:
    config = McpServerConfig("mute", command=sys.executable, args=("-c", "import time; time.sleep(60)"))
    server = McpServer(config, connect_timeout_s=60)
    threading.Timer(0.5, server.close).start()
    started = time.monotonic()
    with pytest.raises(McpServerError, match=r"^MCP server 'mute': it was closed$"):
        server.tools()
    # A hang guard, not a speed target: half the 60 s connect timeout, 60x the 0.5 s to the close.
    assert time.monotonic() - started < 30


def test_close_stops_the_child_and_later_calls_say_so() -> None:
    server = McpServer(_config("closer"))
    pid = int(server.call("whoami", {}, timeout_s=10).content)
    assert _alive(pid)
    log = Path(str(server._stderr_path))
    assert log.is_file()  # the server's stderr, kept to explain a crash
    server.close()
    assert _wait_gone(pid, 5)
    assert not log.exists()
    assert server.status().state == "closed"
    result = server.call("add", {"a": 1, "b": 2}, timeout_s=5)
    assert result == result.__class__("MCP server 'closer': it was closed", is_error=True)
    server.close()  # twice is fine


_PARENT = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {repo!r})
    from engine.agent.mcp_client import McpServer, McpServerConfig
    server = McpServer(McpServerConfig("child", command=sys.executable, args=({script!r},)))
    print(server.call("whoami", {{}}, timeout_s=20).content, flush=True)
    if sys.argv[1] == "wait":
        time.sleep(60)
    """
)


def _parent(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[str], int]:
    script = tmp_path / "parent.py"
    script.write_text(_PARENT.format(repo=str(REPO), script=str(SERVER_SCRIPT)))
    proc = subprocess.Popen(
        [sys.executable, str(script), mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip().isdigit(), proc.stderr.read() if proc.stderr else line
    return proc, int(line)


@pytest.mark.slow
def test_junk_on_a_servers_stdout_is_survived_quietly(tmp_path: Path) -> None:
    script = tmp_path / "junk.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(REPO)!r})
            from engine.agent.mcp_client import McpServer, McpServerConfig
            config = McpServerConfig("junk", command=sys.executable, args=({str(SERVER_SCRIPT)!r}, "--junk"))
            with McpServer(config) as server:
                print(server.call("add", {{"a": 1, "b": 2}}, timeout_s=20).content)
            """
        )
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stdout) == (0, "3\n"), done.stderr
    assert "Traceback" not in done.stderr  # the SDK's complaint goes to the log, not the terminal


@pytest.mark.slow
def test_no_child_outlives_an_app_that_exits_without_closing(tmp_path: Path) -> None:
    proc, pid = _parent(tmp_path, "exit")
    assert proc.wait(timeout=30) == 0
    assert _wait_gone(pid, 2)


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_no_child_outlives_an_app_that_is_killed(tmp_path: Path) -> None:
    proc, pid = _parent(tmp_path, "wait")
    assert _alive(pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert _wait_gone(pid, 10)  # its stdin closed: the server exits by itself


# ---------------------------------------------------------------------- streamable HTTP


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def http_server() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, str(SERVER_SCRIPT), "--http", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail("the HTTP test server did not start")
    try:
        yield f"http://127.0.0.1:{port}/mcp", proc
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_a_streamable_http_server(http_server: tuple[str, subprocess.Popen[bytes]]) -> None:
    url, proc = http_server
    config = McpServerConfig("web", url=url, headers={"Authorization": "Bearer test"})
    with McpServer(config) as server:
        assert "add" in [tool.name for tool in server.tools()]
        assert server.call("add", {"a": 20, "b": 22}, timeout_s=10).content == "42"
        assert server.call("whoami", {}, timeout_s=10).content == str(proc.pid)
        assert server.call("header", {"name": "Authorization"}, timeout_s=10).content == "Bearer test"
        proc.kill()
        proc.wait()
        result = server.call("add", {"a": 1, "b": 2}, timeout_s=10)
        assert result.is_error
        assert result.content.startswith("MCP server 'web': ")
        assert "\n" not in result.content


@pytest.mark.slow
def test_a_100_mib_answer_over_http_is_cut_while_it_is_read(http_server: tuple[str, subprocess.Popen[bytes]]) -> None:
    import tracemalloc

    from engine.agent.mcp_stdio import MAX_CUT_TEXT_CHARS, MAX_MESSAGE_BYTES

    url, _ = http_server
    with McpServer(McpServerConfig("web", url=url)) as server:
        server.tools()
        tracemalloc.start()
        try:
            result = server.call("big", {"n": 100 * 1024 * 1024}, timeout_s=120)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert not result.is_error, result.content
        text, marker = result.content.split("\n[... ", 1)
        assert text == "x" * MAX_CUT_TEXT_CHARS
        assert marker.startswith("cut by Glassbox: the answer was 200.0 MiB, more than the 8.0 MiB Glassbox reads")
        assert peak < 4 * MAX_MESSAGE_BYTES, peak  # bounded by the cap, not by the answer
        assert server.call("add", {"a": 2, "b": 3}, timeout_s=20).content == "5"


def test_an_http_server_that_is_not_there_is_one_line() -> None:
    url = f"http://127.0.0.1:{_free_port()}/mcp"
    with McpServer(McpServerConfig("nowhere", url=url), connect_timeout_s=10) as server:
        with pytest.raises(McpServerError) as caught:
            server.tools()
        assert str(caught.value).startswith("MCP server 'nowhere': it did not start")
        assert "\n" not in str(caught.value)


def test_a_config_needs_a_command_or_a_url() -> None:
    with pytest.raises(McpServerError, match="either a command"):
        McpServerConfig("neither")
    with pytest.raises(McpServerError, match="either a command"):
        McpServerConfig("both", command="x", url="http://x")


def test_close_during_a_call_ends_the_call_at_once() -> None:
    server = McpServer(_config("busy"))
    pid = int(server.call("whoami", {}, timeout_s=10).content)
    threading.Timer(0.5, server.close).start()
    started = time.monotonic()
    result = server.call("slow", {"seconds": 60}, timeout_s=60)
    # A hang guard, not a speed target: half the 60 s call, over 10x the ~2.5 s here.
    assert time.monotonic() - started < 30
    assert result == ToolResult("MCP server 'busy': it was closed during the call to slow", is_error=True)
    assert _wait_gone(pid, 5)


@pytest.mark.parametrize(
    ("path", "said"),
    [
        ("/auth", " answered HTTP 401 Unauthorized (check its headers: a key or token?)"),
        ("/gone", " answered HTTP 404 Not Found"),
        ("/page", ": Unexpected content type: text/html"),
    ],
)
def test_an_http_endpoint_that_is_not_an_mcp_server_says_what_it_answered(path: str, said: str) -> None:
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            code = {"/auth": 401, "/gone": 404}.get(self.path, 200)
            body = b"<html>a web page</html>"
            self.send_response(code)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST

        def log_message(self, *args: object) -> None:
            pass

    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{web.server_address[1]}{path}"
    try:
        with McpServer(McpServerConfig("site", url=url), connect_timeout_s=10) as server:
            with pytest.raises(McpServerError) as caught:
                server.tools()
            assert str(caught.value) == f"MCP server 'site': it did not start: {url}{said}"
    finally:
        web.shutdown()
