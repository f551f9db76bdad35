"""The tools' configuration: the MCP servers (``mcp.json``) and the user's permissions.

Contract: ARCHITECTURE.md, 'app.tool_config'.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from app.paths import Paths
from engine.agent.mcp_client import McpServer, McpServerConfig, McpServerStatus
from engine.atomic import PRIVATE_FILE_MODE, write_text_atomic
from engine.errors import EngineError
from engine.inference.tools import BUILTIN_SOURCE

#: The source of the built-in tools, in permission keys and in ``ToolSpec.source``.
BUILTIN = BUILTIN_SOURCE
#: Selection words that are not server names.
RESERVED_NAMES = frozenset({BUILTIN, "all", "none"})
#: The longest ``mcp.json`` read (a pasted config is small; a 1 GB file is a mistake).
MAX_CONFIG_BYTES = 1024 * 1024

#: The app's step limit (rounds of tool calls in one turn): its default and range.
DEFAULT_MAX_STEPS = 8
MAX_STEPS_RANGE = (1, 64)
#: The app's per-call timeout in seconds: its default and range.
DEFAULT_TIMEOUT_S = 60
TIMEOUT_S_RANGE = (5, 600)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # fullmatch: "$" would let a final newline in
_PERMISSIONS_FORMAT = 1


@dataclass(frozen=True)
class ToolLimits:
    """How far one chat turn with tools may go (Settings → Tools; kept in ``tool_permissions.json``).

    Attributes:
        max_steps: rounds of tool calls before the model must answer without calling one.
        timeout_s: the longest one call may run, in seconds.
    """

    max_steps: int = DEFAULT_MAX_STEPS
    timeout_s: int = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        for name, (low, high) in (("max_steps", MAX_STEPS_RANGE), ("timeout_s", TIMEOUT_S_RANGE)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{name}: must be a whole number from {low} to {high}, not {value!r}")


class ToolSetupError(EngineError):
    """A tool configuration is wrong: a bad ``mcp.json``, an unknown server, a bad selection.

    Args:
        where: the file (or the option) at fault.
        reason: one line.
    """

    def __init__(self, where: Path | str, reason: str) -> None:
        self.where = str(where)
        self.reason = reason
        super().__init__(f"{where}: {reason}")


# ---------------------------------------------------------------------- mcp.json


class ServerListing(TypedDict, total=False):
    """A server as ``glassbox mcp list`` and Settings → Tools show it: no secret values."""

    name: str
    transport: str
    command: str
    args: list[str]
    env: list[str]  # the names only
    cwd: str
    url: str | None
    headers: list[str]  # the names only


@dataclass(frozen=True)
class ServerEntry:
    """One server of ``mcp.json``.

    Attributes:
        config: how to reach it.
        raw: its JSON object as read or given, unknown keys included (written back as it is).
    """

    config: McpServerConfig
    raw: Mapping[str, object] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.config.name

    def to_json(self) -> dict[str, object]:
        """The object to store under ``mcpServers.NAME`` (secrets included: the file is private)."""
        return dict(self.raw)

    def describe(self) -> ServerListing:
        """A listing entry without secrets: env and header values are not shown, only their names."""
        config = self.config
        listing: ServerListing = {"name": config.name, "transport": config.transport}
        if config.command is not None:
            listing.update({"command": config.command, "args": list(config.args), "env": sorted(config.env)})
            if config.cwd:
                listing["cwd"] = config.cwd
        else:
            listing.update({"url": config.url, "headers": sorted(config.headers)})
        return listing


def check_server_name(name: str, where: Path | str = "mcp.json") -> str:
    """``name`` if it can name a server: letters, digits, ``_ . -``, at most 64, not a reserved word.

    Raises:
        ToolSetupError: it cannot.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ToolSetupError(
            where, f"server name {name!r}: use letters, digits, '_', '.' or '-' (at most 64, first a letter or digit)"
        )
    if name.lower() in RESERVED_NAMES:
        raise ToolSetupError(where, f"server name {name!r} is reserved (it is a --tools word)")
    return name


def _no_nul(text: str, where: Path | str, field_name: str) -> str:
    if "\x00" in text:
        raise ToolSetupError(where, f"{field_name}: contains a NUL character")
    return text


def _strings(value: object, where: Path | str, field_name: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ToolSetupError(where, f"{field_name}: must be a list of strings")
    return [_no_nul(item, where, field_name) for item in value]


def _string_map(value: object, where: Path | str, field_name: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ToolSetupError(where, f"{field_name}: must be an object of strings")
    for key, item in value.items():
        if not isinstance(item, str):
            raise ToolSetupError(where, f"{field_name}.{key}: must be a string")
        _no_nul(key + item, where, f"{field_name}.{key}")
    return dict(value)


def parse_server(name: str, entry: object, where: Path | str = "mcp.json") -> ServerEntry:
    """One ``mcpServers`` entry checked and turned into a :class:`ServerEntry`.

    Raises:
        ToolSetupError: the entry is not a stdio or a streamable-HTTP server.
    """
    check_server_name(name, where)
    prefix = f"mcpServers.{name}"
    if not isinstance(entry, dict):
        raise ToolSetupError(where, f"{prefix}: must be an object with a command or a url")
    kind = entry.get("type", entry.get("transport"))
    if kind is not None and kind not in ("stdio", "http", "streamable-http", "streamableHttp", "streamable_http"):
        raise ToolSetupError(
            where, f"{prefix}.type: {kind!r} is not supported (Glassbox speaks stdio and streamable HTTP)"
        )
    has_command, has_url = "command" in entry, "url" in entry
    if has_command == has_url:
        raise ToolSetupError(where, f"{prefix}: give either a command (stdio) or a url (streamable HTTP)")
    if has_command:
        command = entry["command"]
        if not isinstance(command, str) or not command.strip():
            raise ToolSetupError(where, f"{prefix}.command: must be a non-empty string")
        _no_nul(command, where, f"{prefix}.command")
        args = _strings(entry.get("args", []), where, f"{prefix}.args")
        env = _string_map(entry.get("env", {}), where, f"{prefix}.env")
        cwd = entry.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise ToolSetupError(where, f"{prefix}.cwd: must be a string")
        config = McpServerConfig(name, command=command, args=tuple(args), env=env, cwd=cwd or None)
    else:
        url = entry["url"]
        if not isinstance(url, str) or not re.match(r"^https?://[^\s/]+", url):
            raise ToolSetupError(where, f"{prefix}.url: must be an http:// or https:// URL")
        headers = _string_map(entry.get("headers", {}), where, f"{prefix}.headers")
        config = McpServerConfig(name, url=url, headers=headers)
    return ServerEntry(config, dict(entry))


def parse_mcp_json(text: str, where: Path | str) -> dict[str, ServerEntry]:
    """The servers of an ``mcp.json`` document (``{"mcpServers": {...}}``; a bare
    ``{NAME: {...}}`` object of servers is accepted too, as some apps export that).

    Raises:
        ToolSetupError: it is not JSON, or not that shape; the line names ``where``.
    """
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ToolSetupError(where, f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except RecursionError:
        raise ToolSetupError(where, "not valid JSON (nested too deeply)") from None
    if not isinstance(document, dict):
        raise ToolSetupError(where, 'must be a JSON object like {"mcpServers": {...}}')
    if "mcpServers" in document:
        servers = document["mcpServers"]
        if not isinstance(servers, dict):
            raise ToolSetupError(where, "mcpServers: must be an object of servers")
    elif document and all(isinstance(v, dict) and ("command" in v or "url" in v) for v in document.values()):
        servers = document
    elif not document:
        servers = {}
    else:
        raise ToolSetupError(where, 'no "mcpServers" object (the standard mcp.json shape)')
    return {name: parse_server(name, entry, where) for name, entry in servers.items()}


def read_mcp_json(path: Path) -> dict[str, ServerEntry]:
    """The servers in the ``mcp.json`` file at ``path``.

    Raises:
        ToolSetupError: it cannot be read, is too large, not UTF-8, or not that shape.
    """
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise ToolSetupError(path, "not a regular file")
        if size > MAX_CONFIG_BYTES:
            raise ToolSetupError(path, f"too large for an mcp.json ({size} bytes)")
        text = path.read_bytes().decode("utf-8-sig")
    except FileNotFoundError:
        raise ToolSetupError(path, "no such file") from None
    except UnicodeDecodeError:
        raise ToolSetupError(path, "not UTF-8 text") from None
    except OSError as exc:
        raise ToolSetupError(path, exc.strerror or str(exc)) from None
    return parse_mcp_json(text, path)


def load_servers(paths: Paths) -> dict[str, ServerEntry]:
    """The configured servers (none when there is no ``mcp.json`` yet).

    Raises:
        ToolSetupError: the file is damaged (it is left as it is, for the user to fix).
    """
    if not paths.mcp_config.exists():
        return {}
    return read_mcp_json(paths.mcp_config)


def get_server(paths: Paths, name: str) -> ServerEntry:
    """The configured server called ``name``.

    Raises:
        ToolSetupError: there is none (the line lists the servers configured), or the file is damaged.
    """
    servers = load_servers(paths)
    if name not in servers:
        raise ToolSetupError(paths.mcp_config, unknown_server_message(name, servers))
    return servers[name]


def _raw_document(paths: Paths) -> tuple[dict[str, object], dict[str, object]]:
    """The whole ``mcp.json`` (its other top-level keys kept), checked, and its ``mcpServers`` object."""
    if not paths.mcp_config.exists():
        servers: dict[str, object] = {}
        return {"mcpServers": servers}, servers
    load_servers(paths)  # refuses a damaged file before anything is written over it
    document = json.loads(paths.mcp_config.read_bytes().decode("utf-8-sig"))
    if "mcpServers" not in document:
        document = {"mcpServers": document}
    document = dict(document)
    servers = document["mcpServers"]
    if not isinstance(servers, dict):  # load_servers has refused such a file already
        raise ToolSetupError(paths.mcp_config, "mcpServers: must be an object of servers")
    return document, servers


def _save(paths: Paths, document: Mapping[str, object]) -> None:
    write_text_atomic(
        paths.mcp_config, json.dumps(document, indent=2, ensure_ascii=False) + "\n", mode=PRIVATE_FILE_MODE
    )


def add_server(paths: Paths, entry: ServerEntry, *, replace: bool = False) -> None:
    """Adds (or with ``replace``, replaces) one server in ``mcp.json``.

    Raises:
        ToolSetupError: the name is taken (without ``replace``), or the file is damaged.
    """
    document, servers = _raw_document(paths)
    if entry.name in servers and not replace:
        raise ToolSetupError(paths.mcp_config, f"a server named {entry.name!r} exists (remove it first)")
    servers[entry.name] = entry.to_json()
    _save(paths, document)


def remove_server(paths: Paths, name: str) -> ServerEntry:
    """Removes one server from ``mcp.json`` (its permissions go too) and returns it.

    Raises:
        ToolSetupError: there is no such server, or the file is damaged.
    """
    servers = load_servers(paths)
    if name not in servers:
        raise ToolSetupError(paths.mcp_config, unknown_server_message(name, servers))
    permissions = Permissions.load(paths)  # a damaged file refuses before anything changes
    document, stored = _raw_document(paths)
    del stored[name]
    _save(paths, document)
    permissions.forget_source(name)
    return servers[name]


def import_servers(paths: Paths, file: Path, *, replace: bool = False) -> list[str]:
    """Adds every server of another ``mcp.json`` (Claude Desktop's, Cursor's, ...).

    Nothing is written unless the whole file is good.

    Args:
        paths: where Glassbox keeps its files.
        file: the ``mcp.json`` to import.
        replace: replace servers of the same name (default: refuse them).

    Returns:
        The names imported.

    Raises:
        ToolSetupError: the file is missing or bad (named), or a name is taken without ``replace``.
    """
    return _merge(paths, read_mcp_json(file), file, replace)


def import_servers_text(
    paths: Paths, text: str, *, where: str = "the pasted mcp.json", replace: bool = False
) -> list[str]:
    """Adds every server of an ``mcp.json`` given as text (pasted in the settings page).

    Raises:
        ToolSetupError: the text is not that shape (the line names ``where``), or a name is taken.
    """
    return _merge(paths, parse_mcp_json(text, where), where, replace)


def _merge(paths: Paths, incoming: dict[str, ServerEntry], where: Path | str, replace: bool) -> list[str]:
    document, servers = _raw_document(paths)
    taken = [name for name in incoming if name in servers]
    if taken and not replace:
        raise ToolSetupError(where, f"servers already configured: {', '.join(taken)} (use --replace to replace them)")
    for name, entry in incoming.items():
        servers[name] = entry.to_json()
    _save(paths, document)
    return list(incoming)


def unknown_server_message(name: str, servers: Mapping[str, object]) -> str:
    known = ", ".join(sorted(servers)) or "none yet; add one with: glassbox mcp add NAME -- COMMAND"
    return f"no MCP server named {name!r} (configured: {known})"


def server_status(server: McpServer) -> dict[str, object]:
    """A running server's state as JSON (``state``, ``starts``, ``last_error``)."""
    status: McpServerStatus = server.status()
    return {"state": status.state, "starts": status.starts, "last_error": status.last_error}


# ---------------------------------------------------------------------- permissions

_LIMIT_KEYS = ("max_steps", "timeout_s")
_SEEN = "seen_tools"


def load_limits(paths: Paths | None) -> ToolLimits:
    """The saved step limit and per-call timeout; the defaults when the file is missing or damaged
    (a damaged file is reported where the tools are opened and in Settings → Tools), or without
    data folders (``paths`` None)."""
    if paths is None:
        return ToolLimits()
    try:
        return Permissions.load(paths).limits
    except ToolSetupError:
        return ToolLimits()


class Permissions:
    """The tools that run without asking, and the tools turned off (``tool_permissions.json``).

    Keys are ``SOURCE/TOOL`` or ``SOURCE/*``. Changes are saved at once, atomically. A damaged
    file raises on load (it is never silently replaced by an empty one: that would drop what the
    user allowed or turned off).
    """

    def __init__(
        self,
        path: Path,
        always_allow: Iterable[str] = (),
        off: Iterable[str] = (),
        extra: Mapping[str, object] | None = None,
        limits: ToolLimits | None = None,
    ) -> None:
        self.path = path
        self._allow = set(always_allow)
        self._off = set(off)
        self._extra = {k: v for k, v in (extra or {}).items() if k not in _LIMIT_KEYS}
        self._limits = limits or ToolLimits()
        seen = self._extra.get(_SEEN)
        self._seen: dict[str, list[str]] = (
            {k: [n for n in v if isinstance(n, str)] for k, v in seen.items() if isinstance(v, list)}
            if isinstance(seen, dict)
            else {}
        )
        self._extra.pop(_SEEN, None)
        self._set_here: set[str] = set()  # "limits", "seen": set through this object (else the file's are kept)
        self._lock = threading.Lock()

    @classmethod
    def load(cls, paths: Paths) -> Permissions:
        """The saved permissions (none when there is no file).

        Raises:
            ToolSetupError: the file is not JSON or not that shape.
        """
        return cls.load_file(paths.tool_permissions)

    @classmethod
    def load_file(cls, path: Path) -> Permissions:
        """The permissions saved at ``path`` (:meth:`load`'s file).

        Raises:
            ToolSetupError: the file is not JSON or not that shape.
        """
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return cls(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise ToolSetupError(path, getattr(exc, "strerror", None) or "cannot be read") from None
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ToolSetupError(path, f"not valid JSON (line {exc.lineno}: {exc.msg})") from None
        if not isinstance(document, dict):
            raise ToolSetupError(path, "must be a JSON object")
        lists = {}
        for key in ("always_allow", "off"):
            lists[key] = _strings(document.get(key, []), path, key)
        try:
            limits = ToolLimits(**{k: document[k] for k in _LIMIT_KEYS if k in document})
        except ValueError as exc:
            raise ToolSetupError(path, str(exc)) from None
        extra = {k: v for k, v in document.items() if k not in ("always_allow", "off", "format", *_LIMIT_KEYS)}
        return cls(path, lists["always_allow"], lists["off"], extra, limits)

    @property
    def limits(self) -> ToolLimits:
        """The step limit and the per-call timeout (the defaults when the file has none)."""
        with self._lock:
            return self._limits

    def seen_tools(self, source: str) -> list[str]:
        """The tools Settings → Tools last found on a server (none when never checked)."""
        with self._lock:
            return list(self._seen.get(source, []))

    def remember_tools(self, source: str, names: Iterable[str]) -> None:
        """Keeps the tools a server offered when it was last checked, and saves if they changed."""
        listed = list(names)
        with self._lock:
            if self._seen.get(source) == listed:
                return
            self._seen[source] = listed
            self._set_here.add("seen")
        self.save()

    def set_limits(self, limits: ToolLimits) -> None:
        """Changes the step limit and the per-call timeout, and saves."""
        with self._lock:
            if limits == self._limits:
                return
            self._limits = limits
            self._set_here.add("limits")
        self.save()

    @staticmethod
    def key(source: str, tool: str = "*") -> str:
        """``SOURCE/TOOL``, the key of one tool (or of every tool of a server)."""
        return f"{source}/{tool}"

    def always_allows(self, source: str, tool: str) -> bool:
        """Whether calls to this tool run without asking."""
        with self._lock:
            return self.key(source, tool) in self._allow or self.key(source) in self._allow

    def is_off(self, source: str, tool: str = "*") -> bool:
        """Whether this tool (or with ``tool="*"``, the whole server) is turned off."""
        with self._lock:
            return self.key(source, tool) in self._off or self.key(source) in self._off

    def allowed(self) -> list[str]:
        with self._lock:
            return sorted(self._allow)

    def turned_off(self) -> list[str]:
        with self._lock:
            return sorted(self._off)

    def set_always_allow(self, source: str, tool: str, allow: bool = True) -> None:
        """Adds (or removes) a tool from the allow list, and saves."""
        self._change(self._allow, self.key(source, tool), allow)

    def set_off(self, source: str, tool: str = "*", off: bool = True) -> None:
        """Turns a tool (or a whole server, ``tool="*"``) off or on, and saves."""
        self._change(self._off, self.key(source, tool), off)

    def forget_source(self, source: str) -> None:
        """Drops every key of a server (it was removed)."""
        with self._lock:
            before = (len(self._allow), len(self._off))
            self._allow = {k for k in self._allow if not k.startswith(f"{source}/")}
            self._off = {k for k in self._off if not k.startswith(f"{source}/")}
            forgot_seen = self._seen.pop(source, None) is not None
            if forgot_seen:
                self._set_here.add("seen")
            changed = before != (len(self._allow), len(self._off)) or forgot_seen
        if changed:
            self.save()

    def _change(self, target: set[str], key: str, present: bool) -> None:
        with self._lock:
            if (key in target) == present:
                return
            if present:
                target.add(key)
            else:
                target.discard(key)
        self.save()

    def save(self) -> None:
        """Writes the file. The limits and the servers' tools seen are the file's as it is now unless
        they were set through this object: a ToolSet's copy saving an "Always allow" keeps what
        Settings → Tools set meanwhile."""

        try:
            on_disk: Permissions | None = Permissions.load_file(self.path) if len(self._set_here) < 2 else None
        except ToolSetupError:
            on_disk = None
        with self._lock:
            if on_disk is not None and "limits" not in self._set_here:
                self._limits = on_disk._limits
            if on_disk is not None and "seen" not in self._set_here:
                self._seen = {**on_disk._seen}
            document = {
                "format": _PERMISSIONS_FORMAT,
                **self._extra,
                "always_allow": sorted(self._allow),
                "off": sorted(self._off),
                "max_steps": self._limits.max_steps,
                "timeout_s": self._limits.timeout_s,
                **({_SEEN: {k: list(v) for k, v in sorted(self._seen.items())}} if self._seen else {}),
            }
        write_text_atomic(self.path, json.dumps(document, indent=1) + "\n", mode=PRIVATE_FILE_MODE)
