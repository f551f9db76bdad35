"""Hostile stdio MCP servers (engine.agent.mcp_stdio under engine.agent.mcp_client): children that try to
outlive the chat, output that is not JSON-RPC, answers too large or too deep to read. Real servers
written with the SDK (tests/mcp_servers.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import pytest

from engine.agent import mcp_stdio
from engine.agent.mcp_client import McpServer, McpServerConfig, McpServerError
from engine.agent.mcp_stdio import MAX_CUT_TEXT_CHARS, MAX_MESSAGE_BYTES
from tests.mcp_servers import SERVER_SCRIPT
from tests.mcp_servers import process_alive as _alive
from tests.mcp_servers import wait_gone as _wait_gone

REPO = Path(__file__).resolve().parents[2]
MODES = ("group", "session", "daemon")

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the process-tree and signal cases are POSIX")


def _server(name: str, *flags: str, **env: str) -> McpServer:
    config = McpServerConfig(name, command=sys.executable, args=(str(SERVER_SCRIPT), *flags), env=env)
    return McpServer(config, connect_timeout_s=120)  # far past every bound below: a timeout is not the answer


# ---------------------------------------------------------------------- the process tree


@pytest.mark.slow
@pytest.mark.parametrize("supervised", [True, False], ids=["linux-supervisor", "process-group-only"])
def test_close_ends_every_process_the_server_started(monkeypatch: pytest.MonkeyPatch, supervised: bool) -> None:
    if not supervised:
        monkeypatch.setenv("GLASSBOX_MCP_NO_SUPERVISOR", "1")
    elif not sys.platform.startswith("linux"):
        pytest.skip("the supervisor (a child subreaper) is Linux's")
    server = _server("spawner")
    pids = {mode: int(server.call("spawn", {"mode": mode}, timeout_s=30).content) for mode in MODES}
    server_pid = int(server.call("whoami", {}, timeout_s=10).content)
    assert all(_alive(pid) for pid in pids.values())
    server.close()
    assert _wait_gone(server_pid, 10)
    escaped = [mode for mode, pid in pids.items() if not _wait_gone(pid, 10)]
    for pid in pids.values():
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)  # leave nothing behind, whatever the verdict
    # Without a subreaper only the server's own process group can be reached: a child in a session
    # of its own escapes there (the Linux supervisor exists for it).
    assert escaped == ([] if supervised else ["session", "daemon"])


_PARENT = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {repo!r})
    from engine.agent.mcp_client import McpServer, McpServerConfig
    server = McpServer(McpServerConfig("child", command=sys.executable, args=({script!r},)))
    pids = [server.call("spawn", {{"mode": mode}}, timeout_s=30).content for mode in ("group", "session", "daemon")]
    pids.append(server.call("whoami", {{}}, timeout_s=20).content)
    print(" ".join(pids), flush=True)
    if sys.argv[1] == "wait":
        time.sleep(120)
    """
)


def _parent(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[str], list[int]]:
    script = tmp_path / "parent.py"
    script.write_text(_PARENT.format(repo=str(REPO), script=str(SERVER_SCRIPT)))
    proc = subprocess.Popen(
        [sys.executable, str(script), mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip(), proc.stderr.read() if proc.stderr else line
    return proc, [int(word) for word in line.split()]


def _all_gone(pids: list[int], seconds: float) -> bool:
    gone = [_wait_gone(pid, seconds) for pid in pids]
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    return all(gone)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the supervisor is Linux's")
def test_nothing_the_server_started_outlives_an_app_that_exits_without_closing(tmp_path: Path) -> None:
    proc, pids = _parent(tmp_path, "exit")
    assert proc.wait(timeout=60) == 0
    assert _all_gone(pids, 10)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_nothing_the_server_started_outlives_an_app_killed_with_sigkill(tmp_path: Path) -> None:
    proc, pids = _parent(tmp_path, "wait")
    assert all(_alive(pid) for pid in pids)
    os.kill(proc.pid, signal.SIGKILL)  # no atexit, no close: the kernel tells the supervisor
    proc.wait(timeout=10)
    assert _all_gone(pids, 10)


# ---------------------------------------------------------------------- output that is not JSON-RPC


@pytest.mark.slow
def test_banners_log_lines_and_progress_before_a_message_are_skipped_and_counted() -> None:
    with _server("banner", "--junk") as server:  # two banner lines, one of them JSON but not JSON-RPC
        assert server.call("add", {"a": 1, "b": 2}, timeout_s=20).content == "3"
        assert server.status().skipped_lines == 2
    with _server("chatty", "--chatty") as server:  # a log line before every message it sends
        for i in range(3):
            assert server.call("echo", {"text": str(i)}, timeout_s=20).content == str(i)
        assert server.status().skipped_lines == 5  # the initialize answer, the listing, three calls
    with _server("dots", "--dots") as server:  # "Loading..." and the first answer on one line
        assert server.call("add", {"a": 2, "b": 2}, timeout_s=20).content == "4"
        assert server.status().skipped_lines == 1


@pytest.mark.slow
@pytest.mark.parametrize(
    ("how", "ending"),
    [
        ("exit", "(2 lines that are not JSON-RPC) and closed its output"),
        ("sleep", f"(2 lines that are not JSON-RPC) and nothing that is within {mcp_stdio.JUNK_GRACE_S:g} s"),
        ("flood", f"({mcp_stdio.MAX_JUNK_BEFORE_START + 1} lines that are not JSON-RPC) before any line that is"),
    ],
)
def test_a_program_that_prints_only_junk_is_not_an_mcp_server(how: str, ending: str) -> None:
    with _server("garbage", "--garbage", how) as server, pytest.raises(McpServerError) as caught:
        server.tools()
    said = "it printed 'hello, I am not an MCP server'"
    assert str(caught.value) == f"MCP server 'garbage': it did not start: not an MCP server: {said} {ending}"


# ---------------------------------------------------------------------- answers too large or too deep


@pytest.mark.slow
def test_a_100_mib_result_is_cut_while_it_is_read_and_says_so() -> None:
    with _server("big") as server:
        server.tools()
        tracemalloc.start()
        try:
            result = server.call("big", {"n": 100 * 1024 * 1024}, timeout_s=120)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert not result.is_error
        text, marker = result.content.split("\n[... ", 1)
        assert text == "x" * MAX_CUT_TEXT_CHARS
        assert marker == (  # 200 MiB on the wire: the SDK sends the text twice (content, structuredContent)
            f"cut by Glassbox: the answer was 200.0 MiB, more than the 8.0 MiB Glassbox reads of one answer; "
            f"the first {MAX_CUT_TEXT_CHARS:,} characters are above]"
        )
        # What was read is bounded by the cap, not by the answer (the whole answer would be 100 MiB).
        assert peak < 4 * MAX_MESSAGE_BYTES, peak
        assert server.call("add", {"a": 1, "b": 1}, timeout_s=20).content == "2"  # the stream is in step


@pytest.mark.slow
def test_a_listing_too_large_or_too_deep_to_read_fails_at_once_in_one_line() -> None:
    with _server("huge", GLASSBOX_TEST_MCP_HUGE_DESCRIPTION=str(9 * 1024 * 1024)) as server:
        with pytest.raises(McpServerError) as caught:
            server.tools()
        assert str(caught.value).startswith(
            "MCP server 'huge': listing its tools failed: its answer was 9.0 MiB, more than the 8.0 MiB"
        )
    with _server("deep", "--hostile", GLASSBOX_TEST_MCP_DEEP="240") as server:
        with pytest.raises(McpServerError) as caught:
            server.tools()
        assert str(caught.value).startswith(
            "MCP server 'deep': listing its tools failed: Glassbox could not read its answer (recursion limit exceeded"
        )


def test_a_cut_answer_and_its_marker_fit_in_a_result() -> None:
    from engine.agent.mcp_client import MAX_RESULT_CHARS

    assert MAX_CUT_TEXT_CHARS + 200 < MAX_RESULT_CHARS  # the marker is never cut off by the result's own cap


def test_cut_lines_keep_their_start_and_end_in_bounded_memory() -> None:
    splitter = mcp_stdio._LineSplitter(1000)
    lines = splitter.feed(b"short\n" + b"a" * 600)
    assert lines == [b"short"]
    for _ in range(1000):
        assert splitter.feed(b"b" * 1000) == []
    [cut] = splitter.feed(b"end\nnext")
    assert isinstance(cut, mcp_stdio._Oversized)
    assert cut.size == 600 + 1_000_000 + 3
    assert cut.head == b"a" * 600 + b"b" * 400
    assert cut.tail.endswith(b"bend") and len(cut.tail) == 4096
    assert splitter.rest() == b"next"


@pytest.mark.parametrize(
    ("head", "tail", "ident"),
    [
        (b'{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"xx', b'xx"}]}}', 7),
        (
            b'{"result":{"content":[{"type":"text","text":"x "id": 9',
            b'x"}],"isError":false},"jsonrpc":"2.0","id":"r-3"}',
            "r-3",
        ),
        (b'{"result":{"content":[{"type":"text","text":"xx', b'xx"}]}}', None),
    ],
)
def test_the_id_of_a_cut_answer_is_found_at_its_start_or_its_end(head: bytes, tail: bytes, ident: object) -> None:
    assert mcp_stdio._line_id(mcp_stdio._Oversized(head, tail, 10**9)) == ident


def test_the_text_of_a_cut_answer_is_decoded_up_to_the_cut() -> None:
    assert mcp_stdio._text_start(b'{"id":1,"result":{"content":[{"type":"text","text":"a\\"b\\u00e9c\\u00') == 'a"béc'
    assert mcp_stdio._text_start(b'{"text": "done", "more": 1}') == "done"
    assert mcp_stdio._text_start(b'{"text":"a cut escape \\') == "a cut escape "
    assert mcp_stdio._text_start(b'{"text":"an escaped backslash \\\\') == "an escaped backslash \\"
    assert mcp_stdio._text_start(b'{"content":[{"type":"image","data":"AAAA') is None
