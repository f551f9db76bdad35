"""Tools from MCP servers, on the official ``mcp`` SDK (stdio and streamable-HTTP servers).

:class:`McpServer` is a :class:`engine.inference.tools.ToolProvider` for one server. The SDK is async; this
module gives it the provider's synchronous shape by running an asyncio event loop in a daemon
thread per server, and by holding the SDK's ``Client`` inside one long-lived task of that loop
(the SDK's cancel scopes must be entered and left in the same task). Callers on any thread submit
coroutines to that loop and wait on their futures, watching their own cancel event.

Contract: ARCHITECTURE.md, 'engine.agent.mcp_client'.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import json
import logging
import os
import tempfile
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import IO, Any, Literal, TypeVar

from engine.errors import EngineError
from engine.inference.tools import ToolResult, ToolSpec

_T = TypeVar("_T")

#: Seconds a server may take to start and answer the handshake.
CONNECT_TIMEOUT_S = 30.0
#: Seconds the tool listing may take.
LIST_TIMEOUT_S = 30.0
#: Seconds a server gets to answer a ping after a call timed out, before it is stopped.
PING_TIMEOUT_S = 2.0
#: Seconds :meth:`McpServer.close` waits for the transport's shutdown (stdin closed, 2 s grace,
#: SIGTERM, 4 s, SIGKILL) before abandoning the loop thread.
CLOSE_TIMEOUT_S = 10.0
#: Failed starts in a row after which a server is left stopped until :meth:`McpServer.reset`.
MAX_FAILED_STARTS = 3
#: The most characters of a result kept (a marker says what was cut).
MAX_RESULT_CHARS = 200_000
#: The most tool-list pages read from one server.
MAX_LIST_PAGES = 50
#: The most bytes of a server's stderr read back to explain a failure.
_STDERR_TAIL_BYTES = 4096
#: A server's stderr log is emptied when it grows past this (checked as each call begins).
_STDERR_MAX_BYTES = 1024 * 1024

ServerState = Literal["stopped", "starting", "running", "failed", "closed"]


class McpServerError(EngineError):
    """An MCP server cannot be used: it does not start, does not answer, or died.

    Args:
        server: the server's name.
        reason: one line saying what went wrong.
    """

    def __init__(self, server: str, reason: str) -> None:
        self.server = server
        self.reason = reason
        super().__init__(f"MCP server {server!r}: {reason}")


@dataclass(frozen=True)
class McpServerConfig:
    """How to reach one server: a command (stdio) or a URL (streamable HTTP).

    Attributes:
        name: the server's name (the key in ``mcp.json``).
        command: the program to run for a stdio server.
        args: its arguments.
        env: environment variables for it, over a minimal inherited set (the SDK's default:
            ``HOME``, ``PATH``, ``USER``, ... on POSIX).
        cwd: its working folder (default: the app's).
        url: the endpoint of a streamable-HTTP server (``http(s)://host:port/mcp``).
        headers: HTTP headers sent with every request (e.g. ``Authorization``).
    """

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise McpServerError(self.name, "give either a command (stdio) or a url (streamable HTTP)")

    @property
    def transport(self) -> Literal["stdio", "http"]:
        """``"stdio"`` for a command, ``"http"`` for a URL."""
        return "stdio" if self.command is not None else "http"

    def describe(self) -> str:
        """The command line or the URL, for listings (header values are not shown)."""
        if self.command is not None:
            return " ".join([self.command, *self.args])
        return str(self.url)


@dataclass(frozen=True)
class McpServerStatus:
    """What a server is doing, for the CLI and the settings page.

    Attributes:
        name: the server's name.
        state: ``stopped`` (not started yet, or died and restarts on next use), ``starting``,
            ``running``, ``failed`` (too many failed starts), ``closed``.
        starts: how many times it was started (more than one: it was restarted).
        last_error: the last problem, one line, or ``None``.
        skipped_lines: lines of its output that were not JSON-RPC, skipped (banners, logs) since
            its last start (a stdio server).
    """

    name: str
    state: ServerState
    starts: int
    last_error: str | None
    skipped_lines: int = 0


# The SDK logs a server's bad output with a traceback (``logger.exception``). A handler of our own on
# its logger keeps logging's last resort from printing that on the terminal when the app has not
# configured logging (the CLI); records still propagate to the app's handlers, the log files.
logging.getLogger("mcp").addHandler(logging.NullHandler())

_LIVE: weakref.WeakSet[McpServer] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()


def _close_all_at_exit() -> None:
    """Closes every server still open, all at once (each may take a few seconds to stop)."""
    with _LIVE_LOCK:
        servers = list(_LIVE)
    closers = [threading.Thread(target=server.close, daemon=True) for server in servers]
    for closer in closers:
        closer.start()
    for closer in closers:
        closer.join(CLOSE_TIMEOUT_S + 3.0)


atexit.register(_close_all_at_exit)


class _WatchedReadStream:
    """The transport's read stream, noticing when it ends (the server died or hung up).

    Only forwards what the SDK's ``ReadStream`` protocol asks for; ``on_end`` runs once.
    """

    def __init__(self, inner: Any, on_end: Callable[[], None]) -> None:
        self._inner = inner
        self._on_end = on_end

    def __getattr__(self, name: str) -> Any:  # e.g. ``last_context``
        return getattr(self._inner, name)

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except BaseException:
            self._on_end()
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _WatchedReadStream:
        return self

    async def __anext__(self) -> Any:
        # lazy: start-up (+4 ms: anyio)
        import anyio

        try:
            return await self.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _WatchedReadStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class McpServer:
    """One MCP server as a tool provider (a child process or an HTTP endpoint).

    Nothing starts until the first :meth:`tools`, :meth:`call` or :meth:`start`. Thread-safe:
    calls may come from several threads at once.

    Args:
        config: where the server is.
        connect_timeout_s: the longest a start (spawn and handshake) may take.
        list_timeout_s: the longest the tool listing may take.
    """

    def __init__(
        self,
        config: McpServerConfig,
        *,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        list_timeout_s: float = LIST_TIMEOUT_S,
    ) -> None:
        self.config = config
        self.name = config.name
        self._connect_timeout_s = connect_timeout_s
        self._list_timeout_s = list_timeout_s
        self._lock = threading.Lock()  # guards the loop thread's creation and _closed
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        # The fields below are touched only on the loop's thread.
        self._client: Any = None
        self._holder: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._stop_requested = False
        self._connect_lock: asyncio.Lock | None = None
        self._tools: list[ToolSpec] | None = None
        self._stderr: IO[bytes] | None = None
        self._stderr_path: str | None = None
        self._http_status: str | None = None  # the last HTTP error status an HTTP server answered
        self._stdio: Any = None  # the stdio transport of the current or last connection
        self._stderr_mark = 0  # where the server's stderr stood when the current call began
        # Read from any thread (plain assignments only).
        self._state: ServerState = "stopped"
        self._starts = 0
        self._failed_starts = 0
        self._last_error: str | None = None
        with _LIVE_LOCK:
            _LIVE.add(self)

    # ------------------------------------------------------------------ the public API

    def status(self) -> McpServerStatus:
        """Its state now; starts nothing."""
        stdio = self._stdio
        skipped = stdio.skipped_lines if stdio is not None else 0
        return McpServerStatus(self.name, self._state, self._starts, self._last_error, skipped)

    def start(self) -> None:
        """Starts the server now (a no-op when it runs) and lists its tools.

        Raises:
            McpServerError: it does not start, does not answer, or was closed.
        """
        self._run(self._ensure_tools(), self._connect_timeout_s + self._list_timeout_s + 5.0)

    def tools(self) -> list[ToolSpec]:
        """The server's tools (listed once per start), each with ``source`` set to its name.

        Raises:
            McpServerError: the server does not start, does not answer, or sent a bad listing.
        """
        return list(self._run(self._ensure_tools(), self._connect_timeout_s + self._list_timeout_s + 5.0))

    def call(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        timeout_s: float,
        cancel: threading.Event | None = None,
    ) -> ToolResult:
        """Calls one tool; every failure is an error result with one line (never an exception).

        Args:
            name: the tool.
            arguments: its arguments (a JSON object).
            timeout_s: the longest the call may take (starting the server not included).
            cancel: set it to give up waiting; the call is cancelled on the server.

        Returns:
            The tool's text (its content blocks joined), ``is_error`` when the tool said so or
            the call failed.
        """
        try:
            loop = self._ensure_loop()
        except McpServerError as exc:
            return ToolResult(str(exc), is_error=True)
        future = asyncio.run_coroutine_threadsafe(self._call(name, arguments, timeout_s), loop)
        deadline = time.monotonic() + self._connect_timeout_s + self._list_timeout_s + timeout_s + 10.0
        while True:
            if self._closed:  # closed from another thread: the loop may stop before this call ends
                future.cancel()
                return ToolResult(f"MCP server {self.name!r}: it was closed during the call to {name}", is_error=True)
            if cancel is not None and cancel.is_set():
                future.cancel()
                return ToolResult(f"the call to {name} on MCP server {self.name!r} was cancelled", is_error=True)
            try:
                return future.result(timeout=0.05)
            except concurrent.futures.TimeoutError:
                if time.monotonic() > deadline:  # the loop itself is stuck: should not happen
                    future.cancel()
                    return ToolResult(f"MCP server {self.name!r}: no answer from its event loop", is_error=True)
            except concurrent.futures.CancelledError:
                return ToolResult(f"the call to {name} on MCP server {self.name!r} was cancelled", is_error=True)

    def reset(self) -> None:
        """Allows a server that failed to start :data:`MAX_FAILED_STARTS` times to be tried again."""
        self._failed_starts = 0
        if self._state == "failed":
            self._state = "stopped"

    def close(self) -> None:
        """Stops the server and the loop thread; safe to call twice, from any thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop, thread = self._loop, self._thread
        with _LIVE_LOCK:
            _LIVE.discard(self)
        if loop is not None and thread is not None and thread.is_alive():
            try:
                future = asyncio.run_coroutine_threadsafe(self._shutdown(), loop)
                future.result(timeout=CLOSE_TIMEOUT_S)
            except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError, RuntimeError):
                pass  # the loop is gone or stuck: the daemon thread dies with the process
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=2.0)
        self._state = "closed"

    def __enter__(self) -> McpServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the loop thread

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise McpServerError(self.name, "it was closed")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                started = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(started.set)
                    try:
                        loop.run_forever()
                    finally:
                        with contextlib.suppress(RuntimeError):
                            loop.run_until_complete(loop.shutdown_asyncgens())
                        loop.close()

                thread = threading.Thread(target=run, name=f"mcp-{self.name}", daemon=True)
                thread.start()
                started.wait(timeout=5.0)
                self._loop, self._thread = loop, thread
            return self._loop

    def _run(self, coro: Coroutine[Any, Any, _T], timeout_s: float) -> _T:
        """Runs ``coro`` on the loop and waits for it; a timeout here is a stuck server."""
        try:
            loop = self._ensure_loop()
        except McpServerError:
            coro.close()
            raise
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        deadline = time.monotonic() + timeout_s
        while True:
            if self._closed:  # closed from another thread: the loop may stop before this ends
                future.cancel()
                raise McpServerError(self.name, "it was closed")
            try:
                return future.result(timeout=0.05)
            except concurrent.futures.TimeoutError:
                if time.monotonic() > deadline:
                    future.cancel()
                    raise McpServerError(self.name, f"no answer within {timeout_s:g} s") from None
            except concurrent.futures.CancelledError:
                raise McpServerError(self.name, "it was closed") from None

    # ------------------------------------------------------------------ on the loop

    @asynccontextmanager
    async def _transport(self, on_end: Callable[[], None]) -> AsyncIterator[Any]:
        """The SDK transport for the config, its read stream watched for the end."""
        config = self.config
        if config.command is not None:
            # lazy: start-up (+849 ms: mcp, pydantic)
            from mcp.client.stdio import get_default_environment

            # lazy: start-up (+13 ms)
            from engine.agent.mcp_stdio import StdioTransport

            assert self._stderr is not None
            stdio = StdioTransport(
                self.name,
                config.command,
                list(config.args),
                get_default_environment() | dict(config.env),
                config.cwd,
                self._stderr,
            )
            self._stdio = stdio
            async with stdio.connect() as (read, write):
                yield _WatchedReadStream(read, on_end), write
        else:
            # lazy: start-up (+922 ms: httpx2, mcp, pydantic)
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            self._http_status = None

            async def note_status(response: Any) -> None:
                if response.status_code >= 400:
                    self._http_status = f"HTTP {response.status_code} {response.reason_phrase}".strip()

            # lazy: start-up (+64 ms: httpx2)
            from engine.agent.mcp_http import CappedTransport

            timeout = httpx2.Timeout(30.0, read=300.0)
            hooks = {"response": [note_status]}
            capped = CappedTransport(self.name)  # one answer is read up to 8 MiB, cut past that
            async with (
                httpx2.AsyncClient(
                    headers=dict(config.headers), timeout=timeout, event_hooks=hooks, transport=capped
                ) as http,
                streamable_http_client(str(config.url), http_client=http) as (read, write),
            ):
                yield _WatchedReadStream(read, on_end), write

    async def _hold(self, ready: asyncio.Future[None]) -> None:
        """Holds one connection: enters the SDK client, waits for a stop or the end, leaves it.

        Every failure before the connection stands, the SDK's own import included, goes to
        ``ready``: a start that cannot happen says why at once, never as a timeout.
        """
        assert self._wake is not None
        wake = self._wake
        ended = False

        def on_end() -> None:
            nonlocal ended
            ended = True
            wake.set()

        try:
            # lazy: start-up (+742 ms: mcp, pydantic)
            from mcp import Client

            transport = self._transport(on_end)
            async with Client(transport) as client:
                self._client = client
                if not ready.done():
                    ready.set_result(None)
                while not (ended or self._stop_requested):
                    await wake.wait()
                    wake.clear()
        except asyncio.CancelledError:
            if not ready.done():
                ready.cancel()
            raise
        except BaseException as exc:  # the boundary: any failure of the connection is reported
            if not ready.done():
                ready.set_exception(exc)
            elif not self._stop_requested:
                self._last_error = self._explain(exc, "the connection failed")
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
        finally:
            self._client = None
            self._tools = None
            if self._state == "running":
                self._state = "stopped"
            if ended and not self._stop_requested and self._last_error is None:
                self._last_error = f"it stopped{self._last_words()}"

    async def _ensure_client(self) -> Any:
        """The connected SDK client, starting the server first when it is not running."""
        if self._connect_lock is None:
            self._connect_lock = asyncio.Lock()
        async with self._connect_lock:
            if self._client is not None and self._holder is not None and not self._holder.done():
                return self._client
            if self._failed_starts >= MAX_FAILED_STARTS:
                raise McpServerError(
                    self.name, f"it failed to start {self._failed_starts} times ({self._last_error}); not retried"
                )
            await self._stop_holder()
            self._stop_requested = False
            self._wake = asyncio.Event()
            self._stdio = None
            self._open_stderr()
            self._state = "starting"
            self._starts += 1
            ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._holder = asyncio.get_running_loop().create_task(self._hold(ready))
            self._holder.add_done_callback(lambda holder: _settle(ready, holder))
            try:
                await asyncio.wait_for(asyncio.shield(ready), self._connect_timeout_s)
            except BaseException as exc:  # the boundary: any failure of the connection is reported
                await self._stop_holder()
                self._failed_starts += 1
                self._state = "failed" if self._failed_starts >= MAX_FAILED_STARTS else "stopped"
                if isinstance(exc, asyncio.CancelledError):
                    raise
                verdict = self._stdio.not_mcp if self._stdio is not None else None
                if isinstance(exc, (asyncio.TimeoutError, TimeoutError)) and verdict is None:
                    reason = f"it did not answer within {self._connect_timeout_s:g} s of starting{self._last_words()}"
                else:
                    reason = self._explain(exc, "it did not start")
                self._last_error = reason
                raise McpServerError(self.name, reason) from None
            self._failed_starts = 0
            self._last_error = None
            self._state = "running"
            return self._client

    async def _ensure_tools(self) -> list[ToolSpec]:
        client = await self._ensure_client()
        if self._tools is not None:
            return self._tools
        try:
            specs = await asyncio.wait_for(self._list(client), self._list_timeout_s)
        except TimeoutError:
            await self._stop_holder()
            raise McpServerError(self.name, f"it did not list its tools within {self._list_timeout_s:g} s") from None
        except McpServerError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken server: one line, and it is stopped
            await self._stop_holder()
            raise McpServerError(self.name, self._explain(exc, "listing its tools failed")) from None
        self._tools = specs
        return specs

    async def _list(self, client: Any) -> list[ToolSpec]:
        specs: list[ToolSpec] = []
        cursor: str | None = None
        for _ in range(MAX_LIST_PAGES):
            page = await client.list_tools(cursor=cursor)
            for tool in page.tools:
                schema = tool.input_schema if isinstance(tool.input_schema, dict) else {}
                if schema.get("type", "object") != "object":
                    raise McpServerError(self.name, f"tool {tool.name!r} has parameters that are not an object schema")
                parameters = {"type": "object", **schema}
                specs.append(ToolSpec(tool.name, tool.description or "", parameters, source=self.name))
            cursor = page.next_cursor
            if cursor is None:
                break
        return specs

    async def _call(self, name: str, arguments: dict[str, Any], timeout_s: float) -> ToolResult:
        # lazy: start-up (+742 ms: mcp, pydantic)
        from mcp.shared.exceptions import MCPError

        try:
            client = await self._ensure_client()
        except McpServerError as exc:
            return ToolResult(f"{exc}; the call to {name} did not run", is_error=True)
        self._stderr_mark = self._stderr_size()
        self._http_status = None
        try:
            result = await asyncio.wait_for(client.call_tool(name, arguments), timeout_s)
        except TimeoutError:
            alive = await self._answers_ping(client)
            if not alive:
                await self._stop_holder()
                tail = "; it did not answer another request either, so it was stopped (it restarts on next use)"
            else:
                tail = ""
            self._last_error = f"{name} timed out after {timeout_s:g} s"
            return ToolResult(f"MCP server {self.name!r}: {name} timed out after {timeout_s:g} s{tail}", is_error=True)
        except MCPError as exc:
            # lazy: start-up (+312 ms: pydantic, mcp_types)
            from mcp_types import CONNECTION_CLOSED

            if exc.error.code == CONNECTION_CLOSED:
                await self._stop_holder()
                return ToolResult(self._died(name), is_error=True)
            return ToolResult(f"MCP server {self.name!r}: {name} failed: {_one_line(exc.error.message)}", is_error=True)
        except Exception as exc:  # noqa: BLE001 - a transport failure (HTTP down, broken pipe): one line
            await self._stop_holder()
            reason = self._explain(exc, f"{name} failed")
            self._last_error = reason
            return ToolResult(f"MCP server {self.name!r}: {reason} (it restarts on next use)", is_error=True)
        return _to_result(result)

    def _died(self, name: str) -> str:
        if self._closed:
            return f"MCP server {self.name!r}: it was closed during the call to {name}"
        if self.config.url is not None:
            reason = f"the connection to {self.config.url} was lost during the call to {name}"
        else:
            reason = f"it stopped during the call to {name}{self._last_words()}"
        self._last_error = reason
        return f"MCP server {self.name!r}: {reason}; it restarts on next use"

    async def _answers_ping(self, client: Any) -> bool:
        # A fresh tool listing, not ``ping``: ping is gone from the 2026-07-28 protocol.
        try:
            await asyncio.wait_for(client.list_tools(cache_mode="refresh"), PING_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - any failure to answer counts as not alive
            return False
        return True

    async def _stop_holder(self) -> None:
        """Leaves the current connection (the SDK stops the process) and waits for it."""
        holder, self._holder = self._holder, None
        if holder is None:
            return
        self._stop_requested = True
        if self._wake is not None:
            self._wake.set()
        if self._client is None:  # still starting (inside the handshake): it does not see the wake
            holder.cancel()
        try:
            await asyncio.wait_for(asyncio.shield(holder), CLOSE_TIMEOUT_S - 1.0)
        except TimeoutError:
            holder.cancel()
        except (Exception, asyncio.CancelledError):
            if not holder.done():
                raise
        self._client = None
        self._tools = None
        if self._state in ("running", "starting"):
            self._state = "stopped"

    async def _shutdown(self) -> None:
        await self._stop_holder()
        # Calls still running (their callers were told the server closed): cancel them, so the
        # loop stops with no task pending.
        others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in others:
            task.cancel()
        if others:
            await asyncio.wait(others, timeout=2.0)
        self._close_stderr()

    # ------------------------------------------------------------------ explanations

    def _open_stderr(self) -> None:
        """A fresh private file for the server's stderr (the child appends; we read it by name,
        through a file of our own, so that reading never moves the child's write position)."""
        if self.config.command is None:
            return
        self._close_stderr()
        fd, name = tempfile.mkstemp(prefix="glassbox-mcp-", suffix=".log")  # owner-only
        os.close(fd)
        self._stderr = open(name, "ab")  # noqa: SIM115 - lives as long as the child
        self._stderr_path = name
        self._stderr_mark = 0

    def _close_stderr(self) -> None:
        err, name = self._stderr, self._stderr_path
        self._stderr, self._stderr_path = None, None
        if err is not None:
            err.close()
        if name is not None:
            with contextlib.suppress(OSError):
                os.unlink(name)

    def _stderr_size(self) -> int:
        """Its size now; a log past :data:`_STDERR_MAX_BYTES` is emptied first (the child appends)."""
        name = self._stderr_path
        if name is None:
            return 0
        try:
            size = os.path.getsize(name)
            if size > _STDERR_MAX_BYTES:
                os.truncate(name, 0)
                size = 0
        except OSError:
            return 0
        return size

    def _last_words(self) -> str:
        """``" (it said: <its last line on stderr since the call began>)"`` or ``""``."""
        name = self._stderr_path
        if name is None:
            return ""
        try:
            with open(name, "rb") as reader:
                size = os.fstat(reader.fileno()).st_size
                reader.seek(max(min(self._stderr_mark, size), size - _STDERR_TAIL_BYTES))
                tail = reader.read(_STDERR_TAIL_BYTES).decode("utf-8", "replace")
        except OSError:
            return ""
        # The last line with words in it (log frames drawn with box characters are skipped).
        lines = [line.strip() for line in tail.splitlines() if any(c.isalnum() for c in line)]
        return f" (it said: {_one_line(lines[-1])})" if lines else ""

    def _explain(self, exc: BaseException, what: str) -> str:
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        verdict = self._stdio.not_mcp if self._stdio is not None else None
        if verdict is not None:
            return f"{what}: {verdict}{self._last_words()}"
        cwd = self.config.cwd
        if isinstance(exc, (FileNotFoundError, NotADirectoryError)) and cwd and not os.path.isdir(cwd):
            return f"{what}: its working folder {cwd!r} does not exist"
        if isinstance(exc, FileNotFoundError):
            return f"{what}: the command {self.config.command!r} was not found"
        if isinstance(exc, PermissionError):
            return f"{what}: the command {self.config.command!r} cannot be run (permission denied)"
        if isinstance(exc, ImportError):
            missing = f"the module {exc.name!r} is missing" if exc.name else _one_line(str(exc))
            return f"{what}: Glassbox's MCP support cannot load ({missing}; this installation is incomplete)"
        text = _one_line(str(exc)) or type(exc).__name__
        if text == "Connection closed" and self.config.command is not None:
            text = "it exited or closed its output before answering"
        if self.config.url is not None:
            status = self._http_status
            if status is not None:
                hint = " (check its headers: a key or token?)" if status[5:8] in ("401", "403") else ""
                return f"{what}: {self.config.url} answered {status}{hint}"
            return f"{what}: {self.config.url}: {text}"
        return f"{what}: {text}{self._last_words()}"


def _settle(ready: asyncio.Future[None], holder: asyncio.Task[None]) -> None:
    """Ends a start's wait when its holder task ended without a word (a bug there, not a timeout)."""
    if ready.done():
        return
    if holder.cancelled():
        ready.cancel()
        return
    exc = holder.exception()
    ready.set_exception(exc if exc is not None else RuntimeError("the connection ended before it was made"))


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _to_result(result: Any) -> ToolResult:
    """An SDK ``CallToolResult`` as text: text blocks as they are, other blocks described."""
    parts: list[str] = []
    for block in result.content or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            size = len(block.data) * 3 // 4
            parts.append(f"[{kind}: {block.mime_type}, about {size} bytes, not shown]")
        elif kind == "resource":
            inner = block.resource
            text = getattr(inner, "text", None)
            parts.append(text if isinstance(text, str) else f"[resource {inner.uri}, binary, not shown]")
        elif kind == "resource_link":
            parts.append(f"[resource link: {block.uri}]")
        else:
            parts.append(f"[{kind or 'unknown'} content, not shown]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(parts)
    if len(text) > MAX_RESULT_CHARS:
        cut = len(text) - MAX_RESULT_CHARS
        text = f"{text[:MAX_RESULT_CHARS]}\n[... {cut} more characters cut by Glassbox]"
    return ToolResult(text, is_error=bool(result.is_error))
