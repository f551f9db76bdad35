"""``glassbox mcp ...``: the MCP servers whose tools a chat may use.

``add NAME -- COMMAND [ARGS...]`` (a stdio server, ``--env K=V``, ``--cwd DIR``),
``add NAME --url URL [--header K=V]`` (streamable HTTP), ``list [--check]``, ``tools NAME``,
``remove NAME``, ``import FILE [--replace]`` (an ``mcp.json`` from Claude Desktop, Cursor,
LM Studio), each with ``--json``. The servers are kept in the standard ``mcp.json`` shape in the
config folder (``app.tool_setup``); listings never show env or header values (they hold keys).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from app.cli.commands._output import add_json_flag, print_json
from app.paths import Paths
from engine.display import printable

if TYPE_CHECKING:
    from app.tool_config import ServerEntry


def _out(line: str = "") -> None:
    """Prints one line; the names and descriptions in it come from servers and files others wrote,
    so control and bidi characters are escaped (``engine.display.printable``)."""

    sys.stdout.write(printable(line) + "\n")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    """Adds the ``mcp`` group and its actions."""
    shared = argparse.ArgumentParser(add_help=False)
    add_json_flag(shared)
    parents = [common, shared]
    parser = sub.add_parser("mcp", parents=[common], help="MCP servers: tools a chat may use (glassbox chat --tools)")
    group = parser.add_subparsers(dest="mcp_command", metavar="ACTION", required=True, parser_class=type(parser))

    p = group.add_parser(
        "add",
        parents=parents,
        help="add a server: NAME -- COMMAND [ARGS...], or NAME --url URL",
        usage="glassbox mcp add NAME [--env K=V] [--cwd DIR] -- COMMAND [ARGS...]\n"
        "       glassbox mcp add NAME --url URL [--header K=V]",
    )
    p.__class__ = type("_AddParser", (_CommandAfterDashes, type(p)), {})
    p.add_argument("name")
    p.add_argument("--url", help="a streamable-HTTP server (http(s)://host:port/mcp)")
    p.add_argument("--header", action="append", default=[], metavar="K=V", help="an HTTP header (repeatable)")
    p.add_argument("--env", action="append", default=[], metavar="K=V", help="an environment variable (repeatable)")
    p.add_argument("--cwd", metavar="DIR", help="the server's working folder")
    p.add_argument("--replace", action="store_true", help="replace a server of the same name")
    p.set_defaults(handler=_add)

    p = group.add_parser("list", parents=parents, help="list the servers")
    p.add_argument("--check", action="store_true", help="start each server and say how many tools it offers")
    p.set_defaults(handler=_list)

    p = group.add_parser("tools", parents=parents, help="start a server and list its tools")
    p.add_argument("name")
    p.set_defaults(handler=_tools)

    p = group.add_parser("remove", parents=parents, help="remove a server")
    p.add_argument("name")
    p.set_defaults(handler=_remove)

    p = group.add_parser("import", parents=parents, help="add the servers of an mcp.json (Claude Desktop, Cursor, ...)")
    p.add_argument("file", type=Path)
    p.add_argument("--replace", action="store_true", help="replace servers of the same name")
    p.set_defaults(handler=_import)


class _CommandAfterDashes(argparse.ArgumentParser):
    """A parser that takes everything after ``--`` as ``command``, so options may come before it
    in any order (argparse alone would match an empty ``nargs="*"`` positional too early)."""

    def parse_known_args(  # type: ignore[override]  # argparse's overloads; this one keeps their shape
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        words = list(sys.argv[1:] if args is None else args)
        command: list[str] = []
        if "--" in words:
            at = words.index("--")
            words, command = words[:at], words[at + 1 :]
        parsed, extras = super().parse_known_args(words, namespace)
        if extras and not command and not any(word.startswith("-") for word in extras):
            self.error("put the server's command after --: glassbox mcp add NAME -- COMMAND [ARGS...]")
        parsed.command = command
        return parsed, extras


def _pairs(values: list[str], option: str) -> dict[str, str]:
    # lazy: start-up (+49 ms)
    from app.tool_config import ToolSetupError

    pairs: dict[str, str] = {}
    for value in values:
        key, sep, item = value.partition("=")
        if not sep or not key.strip():
            raise ToolSetupError(option, f"{value!r} is not K=V")
        pairs[key.strip()] = item
    return pairs


def _add(args: argparse.Namespace, paths: Paths) -> int:
    # lazy: start-up (+38 ms)
    from app.tool_config import ToolSetupError, add_server, parse_server

    if args.url and args.command:
        raise ToolSetupError("glassbox mcp add", "give either -- COMMAND [ARGS...] or --url URL, not both")
    if args.url:
        if args.env or args.cwd:
            raise ToolSetupError("glassbox mcp add", "--env and --cwd go with a command, not with --url")
        raw: dict[str, object] = {"url": args.url}
        if args.header:
            raw["headers"] = _pairs(args.header, "--header")
    elif args.command:
        if args.header:
            raise ToolSetupError("glassbox mcp add", "--header goes with --url, not with a command")
        command = args.command[0]
        if ("/" in command or "\\" in command) and not Path(command).is_absolute():
            command = str(Path(command).absolute())  # the app may start it from another folder
        raw = {"command": command, "args": args.command[1:]}
        if args.env:
            raw["env"] = _pairs(args.env, "--env")
        if args.cwd:
            raw["cwd"] = args.cwd
    else:
        raise ToolSetupError("glassbox mcp add", "give the server: -- COMMAND [ARGS...] or --url URL")
    entry = parse_server(args.name, raw, "glassbox mcp add")
    add_server(paths, entry, replace=args.replace)
    if args.json:
        print_json({"added": entry.name, "server": entry.describe(), "file": str(paths.mcp_config)})
    else:
        _out(f"added {entry.name}: {entry.config.describe()}")
    return 0


def _list(args: argparse.Namespace, paths: Paths) -> int:
    # lazy: start-up (+41 ms)
    from app.tool_config import Permissions, load_servers

    servers = load_servers(paths)
    permissions = Permissions.load(paths)
    rows: list[dict[str, object]] = []
    for name, entry in servers.items():
        row: dict[str, object] = {**entry.describe(), "off": permissions.is_off(name)}
        if args.check:
            row.update(_check(entry))
        rows.append(row)
    if args.json:
        print_json({"servers": rows, "file": str(paths.mcp_config)})
        return 0
    if not rows:
        _out("no MCP servers; add one with: glassbox mcp add NAME -- COMMAND [ARGS...]")
        return 0
    for row, entry in zip(rows, servers.values(), strict=True):
        flags = " (off)" if row["off"] else ""
        line = f"{row['name']}{flags}  {row['transport']}  {entry.config.describe()}"
        if args.check:
            line += f"  {row['tool_count']} tools" if row["error"] is None else f"  error: {row['error']}"
        _out(line)
    return 0


def _check(entry: ServerEntry) -> dict[str, object]:
    # lazy: start-up (+39 ms)
    from engine.agent.mcp_client import McpServer, McpServerError

    with McpServer(entry.config) as server:
        try:
            count = len(server.tools())
        except McpServerError as exc:
            return {"tool_count": None, "error": str(exc)}
    return {"tool_count": count, "error": None}


def _tools(args: argparse.Namespace, paths: Paths) -> int:
    # lazy: start-up (+78 ms)
    from app.tool_config import Permissions, get_server
    from engine.agent.mcp_client import McpServer
    from engine.inference.tool_schema import schema_problem

    entry = get_server(paths, args.name)
    permissions = Permissions.load(paths)
    with McpServer(entry.config) as server:
        specs = server.tools()
    rows = [
        {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters,
            "off": permissions.is_off(args.name, spec.name),
            "always_allow": permissions.always_allows(args.name, spec.name),
            "unusable": schema_problem(spec.parameters),
        }
        for spec in specs
    ]
    if args.json:
        print_json({"server": args.name, "tools": rows})
        return 0
    if not rows:
        _out(f"{args.name} offers no tools")
    for row in rows:
        flags = (" (off)" if row["off"] else "") + (" (always allowed)" if row["always_allow"] else "")
        summary = " ".join(str(row["description"]).split())
        _out(f"{row['name']}{flags}  {summary[:100]}")
        if row["unusable"] is not None:
            _out(f"  not offered to a model: {row['unusable']}")
    return 0


def _remove(args: argparse.Namespace, paths: Paths) -> int:
    # lazy: start-up (+51 ms)
    from app.tool_config import remove_server

    entry = remove_server(paths, args.name)
    if args.json:
        print_json({"removed": entry.name})
    else:
        _out(f"removed {entry.name}")
    return 0


def _import(args: argparse.Namespace, paths: Paths) -> int:
    # lazy: start-up (+56 ms)
    from app.tool_config import import_servers

    names = import_servers(paths, args.file.expanduser(), replace=args.replace)
    if args.json:
        print_json({"imported": names, "file": str(args.file)})
    elif names:
        _out(f"imported {len(names)} server{'s' if len(names) != 1 else ''}: {', '.join(names)}")
    else:
        _out(f"{args.file} has no servers")
    return 0
