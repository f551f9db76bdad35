"""``glassbox mcp ...`` as a user runs it, and ``app.tool_setup``: the mcp.json it keeps, the
permissions, and ``open_tools`` turning a ``--tools`` selection into running providers (a real
SDK server from tests/mcp_servers.py)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.cli.main import main
from app.paths import Paths
from app.tool_config import (
    Permissions,
    ToolSetupError,
    add_server,
    get_server,
    load_servers,
    parse_mcp_json,
    parse_server,
    remove_server,
)
from app.tool_setup import KnowledgeSearchTool, open_tools, parse_selection
from engine.agent.mcp_client import McpServer
from engine.inference.tools import ToolProvider, ToolResult
from tests.mcp_servers import SERVER_SCRIPT, wait_gone


def glassbox(*args: str, home: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        check=False,
    )


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def paths(glassbox_home: Path) -> Paths:
    return Paths.resolve(glassbox_home).ensure()


def _add_test_server(capsys: pytest.CaptureFixture[str], name: str = "calc", *extra: str) -> None:
    code, _, err = _run(capsys, "mcp", "add", name, *extra, "--", sys.executable, str(SERVER_SCRIPT))
    assert code == 0, err


# ---------------------------------------------------------------------- the CLI


def test_add_list_tools_remove_from_outside(tmp_path: Path) -> None:
    home = tmp_path / "home"
    added = glassbox(
        "mcp", "add", "calc", "--env", "GLASSBOX_TEST_MCP_MARK=k:", "--json", "--", sys.executable,
        str(SERVER_SCRIPT), home=home,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["server"] == {
        "name": "calc",
        "transport": "stdio",
        "command": sys.executable,
        "args": [str(SERVER_SCRIPT)],
        "env": ["GLASSBOX_TEST_MCP_MARK"],
    }
    stored = json.loads((home / "config" / "mcp.json").read_text())
    assert stored == {
        "mcpServers": {
            "calc": {"command": sys.executable, "args": [str(SERVER_SCRIPT)], "env": {"GLASSBOX_TEST_MCP_MARK": "k:"}}
        }
    }
    assert stat.S_IMODE((home / "config" / "mcp.json").stat().st_mode) == 0o600  # env values may be keys

    tools = glassbox("mcp", "tools", "calc", "--json", home=home)
    assert tools.returncode == 0, tools.stderr
    listing = json.loads(tools.stdout)
    assert listing["server"] == "calc"
    by_name = {tool["name"]: tool for tool in listing["tools"]}
    assert by_name["add"]["description"] == "Adds two integers and returns the sum."
    assert by_name["add"]["parameters"]["required"] == ["a", "b"]
    assert by_name["add"]["off"] is False
    assert by_name["add"]["always_allow"] is False

    checked = glassbox("mcp", "list", "--check", "--json", home=home)
    assert checked.returncode == 0, checked.stderr
    (row,) = json.loads(checked.stdout)["servers"]
    assert (row["name"], row["tool_count"], row["error"], row["off"]) == ("calc", len(by_name), None, False)

    removed = glassbox("mcp", "remove", "calc", home=home)
    assert (removed.returncode, removed.stdout) == (0, "removed calc\n")
    empty = glassbox("mcp", "list", home=home)
    assert empty.stdout.startswith("no MCP servers")


def test_add_by_url_with_headers_keeps_the_values_out_of_listings(
    paths: Paths, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(
        capsys, "mcp", "add", "web", "--url", "https://tools.example/mcp", "--header", "Authorization=Bearer s3cret",
        "--json",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["server"] == {
        "name": "web",
        "transport": "http",
        "url": "https://tools.example/mcp",
        "headers": ["Authorization"],
    }
    code, out, _ = _run(capsys, "mcp", "list", "--json")
    assert "s3cret" not in out
    assert json.loads(out)["servers"][0]["headers"] == ["Authorization"]
    code, out, _ = _run(capsys, "mcp", "list")
    assert out == "web  http  https://tools.example/mcp\n"
    assert get_server(paths, "web").config.headers == {"Authorization": "Bearer s3cret"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["add", "x"], "glassbox mcp add: give the server: -- COMMAND [ARGS...] or --url URL"),
        (["add", "x", "--url", "u", "--", "cmd"], "give either -- COMMAND [ARGS...] or --url URL, not both"),
        (["add", "x", "--url", "ftp://x"], "glassbox mcp add: mcpServers.x.url: must be an http:// or https:// URL"),
        (["add", "x", "--header", "A=1", "--", "cmd"], "--header goes with --url, not with a command"),
        (["add", "x", "--env", "novalue", "--", "cmd"], "--env: 'novalue' is not K=V"),
        (["add", "all", "--", "cmd"], "server name 'all' is reserved (it is a --tools word)"),
        (["add", "two words", "--", "cmd"], "server name 'two words': use letters, digits"),
        (["tools", "ghost"], "no MCP server named 'ghost' (configured: none yet; add one with: glassbox mcp add"),
        (["remove", "ghost"], "no MCP server named 'ghost'"),
    ],
)
def test_bad_input_is_one_line(paths: Paths, capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    code, out, err = _run(capsys, "mcp", *args)
    assert code == 1
    assert out == ""
    assert err.startswith("glassbox: error: ")
    assert message in err
    assert err.count("\n") == 1
    assert not paths.mcp_config.exists()  # nothing written


def test_a_command_without_dashes_is_a_usage_error(paths: Paths, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["mcp", "add", "x", "npx", "server"])
    assert caught.value.code == 2
    assert "put the server's command after --" in capsys.readouterr().err


def test_a_name_taken_needs_replace(paths: Paths, capsys: pytest.CaptureFixture[str]) -> None:
    _add_test_server(capsys)
    code, _, err = _run(capsys, "mcp", "add", "calc", "--", "other")
    assert (code, err) == (1, f"glassbox: error: {paths.mcp_config}: a server named 'calc' exists (remove it first)\n")
    code, _, err = _run(capsys, "mcp", "add", "calc", "--replace", "--", "other", "--flag")
    assert code == 0, err
    assert get_server(paths, "calc").config.args == ("--flag",)


def test_a_relative_command_path_is_made_absolute(paths: Paths, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "mcp", "add", "rel", "--", "bin/server", "x")
    assert code == 0, err
    assert get_server(paths, "rel").config.command == str(Path("bin/server").absolute())
    code, _, err = _run(capsys, "mcp", "add", "onpath", "--", "npx", "-y", "pkg")
    assert get_server(paths, "onpath").config.command == "npx"  # found on PATH when it starts


def test_tools_of_a_server_that_does_not_start_is_one_line(paths: Paths, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = _run(capsys, "mcp", "add", "broken", "--", "/nonexistent/server-binary")
    assert code == 0
    code, out, err = _run(capsys, "mcp", "tools", "broken")
    assert code == 1
    assert err == (
        "glassbox: error: MCP server 'broken': it did not start: "
        "the command '/nonexistent/server-binary' was not found\n"
    )
    code, out, err = _run(capsys, "mcp", "list", "--check")
    assert code == 0
    assert out.startswith("broken  stdio  /nonexistent/server-binary  error: MCP server 'broken': it did not start")


# ---------------------------------------------------------------------- import


CLAUDE_DESKTOP = {
    "mcpServers": {
        "filesystem": {
            "command": "npx",
            "args": ["-y", "@modelcontextprotocol/server-filesystem", "/Users/me/Desktop"],
        },
        "github": {
            "command": "docker",
            "args": ["run", "-i", "--rm", "-e", "GITHUB_TOKEN", "ghcr.io/github/github-mcp-server"],
            "env": {"GITHUB_TOKEN": "ghp_x"},
            "disabled": False,
            "autoApprove": [],
        },
        "remote": {"type": "http", "url": "https://mcp.example.com/mcp", "headers": {"X-Key": "k"}},
    }
}


def test_import_an_mcp_json_keeps_every_field(paths: Paths, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    source = tmp_path / "claude_desktop_config.json"
    source.write_text(json.dumps({**CLAUDE_DESKTOP, "globalShortcut": "Ctrl+Space"}))
    code, out, err = _run(capsys, "mcp", "import", str(source), "--json")
    assert code == 0, err
    assert json.loads(out) == {"imported": ["filesystem", "github", "remote"], "file": str(source)}
    stored = json.loads(paths.mcp_config.read_text())
    assert stored == {"mcpServers": CLAUDE_DESKTOP["mcpServers"]}  # unknown keys of the entries kept
    servers = load_servers(paths)
    assert servers["github"].config.env == {"GITHUB_TOKEN": "ghp_x"}
    assert servers["remote"].config.transport == "http"
    code, _, err = _run(capsys, "mcp", "import", str(source))
    assert code == 1
    assert err == (
        f"glassbox: error: {source}: servers already configured: filesystem, github, remote "
        "(use --replace to replace them)\n"
    )
    code, out, _ = _run(capsys, "mcp", "import", str(source), "--replace")
    assert (code, out) == (0, "imported 3 servers: filesystem, github, remote\n")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"mcpServers": {', "not valid JSON (line 1, column 17: Expecting property name enclosed in double quotes)"),
        ("[1, 2]", 'must be a JSON object like {"mcpServers": {...}}'),
        ('{"servers": {"a": 1}}', 'no "mcpServers" object (the standard mcp.json shape)'),
        ('{"mcpServers": []}', "mcpServers: must be an object of servers"),
        ('{"mcpServers": {"a": "npx"}}', "mcpServers.a: must be an object with a command or a url"),
        ('{"mcpServers": {"a": {}}}', "mcpServers.a: give either a command (stdio) or a url (streamable HTTP)"),
        ('{"mcpServers": {"a": {"command": "x", "url": "http://x"}}}', "mcpServers.a: give either a command"),
        ('{"mcpServers": {"a": {"command": ""}}}', "mcpServers.a.command: must be a non-empty string"),
        ('{"mcpServers": {"a": {"command": "x", "args": "-y"}}}', "mcpServers.a.args: must be a list of strings"),
        ('{"mcpServers": {"a": {"command": "x", "env": {"K": 1}}}}', "mcpServers.a.env.K: must be a string"),
        ('{"mcpServers": {"a": {"url": "http://x", "headers": []}}}', "mcpServers.a.headers: must be an object"),
        ('{"mcpServers": {"a": {"type": "sse", "url": "http://x/sse"}}}', "mcpServers.a.type: 'sse' is not supported"),
        ('{"mcpServers": {"builtin": {"command": "x"}}}', "server name 'builtin' is reserved"),
        ('{"mcpServers": {"a": {"command": "x\\u0000y"}}}', "mcpServers.a.command: contains a NUL character"),
        ('{"mcpServers": {"a": {"command": "x", "env": {"K": "\\u0000"}}}}', "mcpServers.a.env.K: contains a NUL"),
        ("[" * 100_000, "not valid JSON"),
    ],
)
def test_import_of_a_bad_file_names_it_and_changes_nothing(
    paths: Paths, capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, reason: str
) -> None:
    _add_test_server(capsys)
    before = paths.mcp_config.read_bytes()
    bad = tmp_path / "mcp.json"
    bad.write_text(text)
    code, _, err = _run(capsys, "mcp", "import", str(bad))
    assert code == 1
    assert err.startswith(f"glassbox: error: {bad}: ")
    assert reason in err
    assert err.count("\n") == 1
    assert paths.mcp_config.read_bytes() == before


def test_import_of_a_missing_or_binary_file(paths: Paths, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = _run(capsys, "mcp", "import", str(tmp_path / "nope.json"))
    assert (code, err) == (1, f"glassbox: error: {tmp_path / 'nope.json'}: no such file\n")
    blob = tmp_path / "blob.json"
    blob.write_bytes(b"\xff\xfe\x00garbage")
    code, _, err = _run(capsys, "mcp", "import", str(blob))
    assert (code, err) == (1, f"glassbox: error: {blob}: not UTF-8 text\n")


def test_a_damaged_mcp_json_is_reported_and_kept(paths: Paths, capsys: pytest.CaptureFixture[str]) -> None:
    paths.mcp_config.write_text('{"mcpServers": {"a": {"command": ')
    for args in (["list"], ["add", "b", "--", "x"], ["remove", "a"], ["tools", "a"]):
        code, _, err = _run(capsys, "mcp", *args)
        assert code == 1, args
        assert err.startswith(f"glassbox: error: {paths.mcp_config}: not valid JSON")
    assert paths.mcp_config.read_text() == '{"mcpServers": {"a": {"command": '  # never replaced


def test_a_pasted_mcp_json_is_imported(paths: Paths) -> None:
    from app.tool_config import import_servers_text

    assert import_servers_text(paths, json.dumps(CLAUDE_DESKTOP)) == ["filesystem", "github", "remote"]
    with pytest.raises(ToolSetupError, match=r"^the pasted mcp.json: not valid JSON"):
        import_servers_text(paths, '{"mcpServers": ')
    assert list(load_servers(paths)) == ["filesystem", "github", "remote"]


def test_a_bare_object_of_servers_is_accepted() -> None:
    servers = parse_mcp_json('{"fs": {"command": "npx", "args": ["-y", "fs"]}}', "pasted")
    assert list(servers) == ["fs"]
    assert parse_mcp_json("{}", "pasted") == {}


# ---------------------------------------------------------------------- permissions


def test_permissions_are_saved_and_removed_with_their_server(paths: Paths) -> None:
    add_server(paths, parse_server("calc", {"command": sys.executable, "args": [str(SERVER_SCRIPT)]}))
    permissions = Permissions.load(paths)
    permissions.set_always_allow("calc", "add")
    permissions.set_always_allow("builtin", "calculator")
    permissions.set_off("calc", "crash")
    again = Permissions.load(paths)
    assert again.always_allows("calc", "add")
    assert not again.always_allows("calc", "echo")
    assert again.is_off("calc", "crash")
    assert not again.is_off("calc")
    assert again.allowed() == ["builtin/calculator", "calc/add"]
    assert stat.S_IMODE(paths.tool_permissions.stat().st_mode) == 0o600
    again.set_always_allow("calc", "add", False)
    assert not Permissions.load(paths).always_allows("calc", "add")
    remove_server(paths, "calc")
    assert Permissions.load(paths).allowed() == ["builtin/calculator"]
    assert Permissions.load(paths).turned_off() == []


def test_a_damaged_permissions_file_is_one_line(paths: Paths) -> None:
    paths.tool_permissions.write_text("{nope")
    with pytest.raises(ToolSetupError, match=r"tool_permissions.json: not valid JSON \(line 1"):
        Permissions.load(paths)
    paths.tool_permissions.write_text('{"always_allow": "calc/add"}')
    with pytest.raises(ToolSetupError, match="always_allow: must be a list of strings"):
        Permissions.load(paths)


# ---------------------------------------------------------------------- open_tools


def test_selection_words() -> None:
    servers = {"calc": object(), "web": object()}
    assert parse_selection("builtin", servers) == (["current_time", "calculator", "read_file", "search_knowledge"], [])
    assert parse_selection("calc,calculator", servers) == (["calculator"], ["calc"])
    assert parse_selection(["web", "calc, web"], servers) == ([], ["web", "calc"])
    assert parse_selection("all", servers)[1] == ["calc", "web"]
    assert parse_selection(None, servers) == ([], [])
    assert parse_selection("none", servers) == ([], [])
    with pytest.raises(ToolSetupError, match=r"^--tools: no MCP server named 'wbe' \(configured: calc, web\)"):
        parse_selection("calc,wbe", servers)


def test_open_tools_runs_builtins_and_a_server_and_stops_it(paths: Paths) -> None:
    add_server(paths, parse_server("calc", {"command": sys.executable, "args": [str(SERVER_SCRIPT)]}))
    Permissions.load(paths).set_off("calc", "crash")
    Permissions.load(paths).set_always_allow("calc", "add")
    with open_tools("builtin,calc", paths) as tools:
        assert isinstance(tools, ToolProvider)
        names = [spec.name for spec in tools.tools()]
        assert names[:2] == ["current_time", "calculator"]  # no files, no knowledge bases: not offered
        assert "read_file" not in names
        assert "search_knowledge" not in names
        assert "add" in names
        assert "crash" not in names  # turned off
        assert tools.source_of("add") == "calc"
        assert tools.always_allows("add")
        assert not tools.always_allows("calculator")
        tools.allow_always("calculator")
        assert tools.always_allows("calculator")
        assert Permissions.load(paths).always_allows("builtin", "calculator")  # saved
        with pytest.raises(ToolSetupError, match="there is no tool 'nope' to allow"):
            tools.allow_always("nope")
        assert tools.call("add", {"a": 2, "b": 3}, timeout_s=10) == ToolResult("5")
        assert tools.call("calculator", {"expression": "6*7"}, timeout_s=10) == ToolResult("42")
        assert tools.call("crash", {}, timeout_s=10).content.startswith("there is no tool 'crash'")
        (server,) = tools.servers
        pid = int(tools.call("whoami", {}, timeout_s=10).content)
    assert server.status().state == "closed"
    assert wait_gone(pid, 5)


def test_the_test_server_registers_itself(paths: Paths) -> None:
    from tests import mcp_servers

    mcp_servers.register(paths, "tt", GLASSBOX_TEST_MCP_MARK="m:")
    with open_tools("tt", paths) as tools:
        assert tools.call("echo", {"text": "x"}, timeout_s=10) == ToolResult("m:x")


def test_open_tools_with_a_broken_server_goes_on_without_it(paths: Paths) -> None:
    add_server(paths, parse_server("broken", {"command": "/nonexistent/server"}))
    with open_tools("calculator,broken", paths) as tools:
        assert [spec.name for spec in tools.tools()] == ["calculator"]
        assert tools.problems == [
            "MCP server 'broken': it did not start: the command '/nonexistent/server' was not found"
        ]
        with pytest.raises(Exception, match="it did not start"):
            tools.start()


def test_open_tools_offers_read_file_only_for_attached_files(paths: Paths, tmp_path: Path) -> None:
    note = tmp_path / "note.txt"
    note.write_text("remember the milk")
    with open_tools("read_file", paths, attached_files=[note]) as tools:
        assert [spec.name for spec in tools.tools()] == ["read_file"]
        assert tools.call("read_file", {"path": "note.txt"}, timeout_s=5) == ToolResult("remember the milk")
    with open_tools("read_file", paths) as tools:
        assert tools.tools() == []


def test_all_leaves_out_servers_turned_off_unless_named(paths: Paths) -> None:
    add_server(paths, parse_server("calc", {"command": sys.executable, "args": [str(SERVER_SCRIPT)]}))
    Permissions.load(paths).set_off("calc")
    with open_tools("all", paths) as tools:
        assert tools.servers == []
    with open_tools("calc", paths) as tools:
        assert [type(p) for p in tools.providers] == [McpServer]


@dataclass(frozen=True)
class _Passage:
    path: str
    page: int | None
    heading: str | None
    text: str
    fused_score: float


class _Searcher:
    def __init__(self) -> None:
        self.asked: list[tuple[list[str], str]] = []

    def query_many(self, names: list[str], text: str, *, k: int = 5) -> list[_Passage]:
        self.asked.append((list(names), text))
        if "nothing" in text:
            return []
        return [_Passage("/docs/lighthouse.md", None, "Lighthouses", "The Pharos of Alexandria was a wonder.", 0.9)]


def test_search_knowledge_uses_the_retrieval_block(paths: Paths) -> None:
    searcher = _Searcher()
    with open_tools("builtin", paths, knowledge_bases=["notes"], searcher=searcher) as tools:
        spec = next(spec for spec in tools.tools() if spec.name == "search_knowledge")
        assert "notes" in spec.description
        result = tools.call("search_knowledge", {"query": "Pharos"}, timeout_s=10)
        assert not result.is_error
        assert "The Pharos of Alexandria was a wonder." in result.content
        assert "[1]" in result.content
        assert searcher.asked == [(["notes"], "Pharos")]
        empty = tools.call("search_knowledge", {"query": "nothing at all"}, timeout_s=10)
        assert empty == ToolResult("search_knowledge: nothing in notes matches 'nothing at all'")
        bad = tools.call("search_knowledge", {"query": " "}, timeout_s=10)
        assert bad == ToolResult("search_knowledge: query must be a non-empty string", is_error=True)
        (search,) = [p for p in tools.providers if isinstance(p, KnowledgeSearchTool)]
        assert [source["path"] for source in search.sources] == ["/docs/lighthouse.md"]


def test_search_knowledge_of_an_unknown_knowledge_base_is_one_line(paths: Paths) -> None:
    with open_tools("search_knowledge", paths, knowledge_bases=["ghost"]) as tools:
        result = tools.call("search_knowledge", {"query": "x"}, timeout_s=30)
        assert result.is_error
        assert result.content.startswith("search_knowledge: ")
        assert "ghost" in result.content
        assert "\n" not in result.content


@pytest.mark.model
def test_search_knowledge_finds_a_real_passage(paths: Paths, tmp_path: Path, embedder_path: Path) -> None:
    from rag.knowledge import KnowledgeBases

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "kiwi.txt").write_text("The kiwi is a flightless bird that lives in New Zealand.\n", encoding="utf-8")
    (docs / "pharos.md").write_text("# Pharos\n\nThe lighthouse of Alexandria was a wonder.\n", encoding="utf-8")
    with KnowledgeBases(paths.knowledge, embedder_path=embedder_path) as kbs:
        kbs.create("notes")
        kbs.add("notes", [docs])
    with open_tools("search_knowledge", paths, knowledge_bases=["notes"], embedder_path=embedder_path) as tools:
        result = tools.call("search_knowledge", {"query": "Which bird cannot fly?"}, timeout_s=120)
        assert not result.is_error, result.content
        first = result.content.split("[2]")[0]
        assert "kiwi is a flightless bird" in first
        (search,) = tools.providers
        assert isinstance(search, KnowledgeSearchTool)
        assert search.sources[0]["path"].endswith("kiwi.txt")


# ---------------------------------------------------------------------- names others chose


def _no_terminal_control(text: str) -> None:
    for ch in ("\x1b", "\x07", "\r", "\u202e", "\u200b"):
        assert ch not in text, (ch, text)


def test_tools_of_a_hostile_server_are_listed_with_their_controls_escaped(
    paths: Paths, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.mcp_servers import HOSTILE_NAME

    code, _, err = _run(capsys, "mcp", "add", "hostile", "--", sys.executable, str(SERVER_SCRIPT), "--hostile")
    assert code == 0, err
    code, out, err = _run(capsys, "mcp", "tools", "hostile")
    assert code == 0, err
    _no_terminal_control(out)
    assert "evil\\x1b]0;pwned\\x07name\\u202egpj.exe" in out
    assert "\\x1b[2J\\x1b[Hcleared over\\u200bwritten \\u202eesrever" in out  # the summary folds whitespace
    code, out, err = _run(capsys, "mcp", "tools", "hostile", "--json")
    assert code == 0, err
    _no_terminal_control(out)
    assert HOSTILE_NAME in [tool["name"] for tool in json.loads(out)["tools"]]  # the same data, escaped as JSON


def test_an_imported_server_is_listed_with_its_controls_escaped(
    paths: Paths, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    source = tmp_path / "mcp.json"
    hostile = {"command": "npx\x1b[2J", "args": ["-y", "srv\u202egpj.exe", "\rover"]}
    source.write_text(json.dumps({"mcpServers": {"fine": hostile}}))
    code, out, err = _run(capsys, "mcp", "import", str(source))
    assert code == 0, err
    code, out, err = _run(capsys, "mcp", "list")
    assert code == 0, err
    _no_terminal_control(out)
    assert "npx\\x1b[2J -y srv\\u202egpj.exe \\rover" in out


@pytest.mark.parametrize("name", ["calc\n", "calc\r", "ca\u202elc"])
def test_a_server_name_with_a_line_break_or_bidi_character_is_refused(
    paths: Paths, capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str
) -> None:
    source = tmp_path / "mcp.json"
    source.write_text(json.dumps({"mcpServers": {name: {"command": "x"}}}))
    code, _, err = _run(capsys, "mcp", "import", str(source))
    assert code == 1
    assert "server name" in err
    assert err.count("\n") == 1
    _no_terminal_control(err)


def test_a_hostile_servers_schemas_are_left_out_named_and_never_fetched(
    paths: Paths, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.engine.test_tool_schema import counting_schema_server

    with counting_schema_server() as (url, hits):
        entry = {"command": sys.executable, "args": [str(SERVER_SCRIPT), "--hostile"]}
        add_server(paths, parse_server("hostile", {**entry, "env": {"GLASSBOX_TEST_MCP_REF_URL": url}}))
        with open_tools("hostile", paths) as tools:
            names = [spec.name for spec in tools.tools()]
            assert "add" in names and "echo" in names  # the server's other tools are offered
            for bad in ("ref_root", "ref_remote", "deep"):
                assert bad not in names
            problems = " | ".join(tools.problems)
            assert "tool 'ref_root' of 'hostile' is left out: its $ref at the root leads back to itself" in problems
            assert f"tool 'ref_remote' of 'hostile' is left out: its $ref '{url}'" in problems
            assert "tool 'deep' of 'hostile' is left out: its schema is nested more than 64 levels deep" in problems
            assert tools.call("add", {"a": 1, "b": 2}, timeout_s=20) == ToolResult("3")
        code, out, err = _run(capsys, "mcp", "tools", "hostile")
        assert code == 0, err
        assert (
            "ref_root  Its schema refers to itself at the root.\n  not offered to a model: its $ref at the root" in out
        )
        assert hits == []  # the URL the server chose was never requested
