"""The stdio transport to an MCP server: its process tree held, its output bounded and sifted.

Contract: ARCHITECTURE.md, 'engine.agent.mcp_stdio'.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

log = logging.getLogger(__name__)

#: The most bytes of one message (one line) read from a server; the rest is skipped.
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
#: The most characters of a cut ``tools/call`` answer's text that are kept (with its marker, within
#: ``engine.agent.mcp_client.MAX_RESULT_CHARS``, so the marker is never cut off).
MAX_CUT_TEXT_CHARS = 190_000
#: Lines that are not JSON-RPC before the first message after which a program is not an MCP server.
MAX_JUNK_BEFORE_START = 200
#: Bytes of such lines before the first message after which a program is not an MCP server.
MAX_JUNK_BYTES_BEFORE_START = 1024 * 1024
#: Seconds a program that printed junk and no message yet may stay silent before it is not an MCP server.
JUNK_GRACE_S = 10.0
#: Skipped lines logged one by one (then one line per :data:`_JUNK_LOG_EVERY`).
LOGGED_JUNK_LINES = 10
#: Seconds the server gets to exit after its stdin is closed, before its tree is terminated.
EXIT_GRACE_S = 2.0
#: Seconds the tree gets after SIGTERM (the supervisor's own grace included) before SIGKILL.
TERMINATE_GRACE_S = 4.0

_TAIL_BYTES = 4096
_READ_CHUNK = 256 * 1024
_JUNK_LOG_EVERY = 1000
_SUPERVISOR_SCRIPT = Path(__file__).with_name("mcp_supervisor.py")
_ID = rb'"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.){0,200}")'
_HEAD_ID = re.compile(rb'^\s*\{(?:(?!"result"|"error").){0,200}?' + _ID, re.DOTALL)
_TAIL_ID = re.compile(_ID)
_TEXT_START = re.compile(rb'"text"\s*:\s*"')


def _preview(line: bytes, limit: int = 120) -> str:
    text = line[: limit * 4].decode("utf-8", "replace").strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class _Oversized:
    """A line longer than :data:`MAX_MESSAGE_BYTES`: its start, its end and its length."""

    head: bytes
    tail: bytes
    size: int


class _LineSplitter:
    """Splits a byte stream into lines, keeping at most ``limit`` bytes (and a tail) of each."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._buffer = bytearray()
        self._tail = bytearray()
        self._size = 0
        self._over = False

    def feed(self, chunk: bytes) -> list[bytes | _Oversized]:
        lines: list[bytes | _Oversized] = []
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            self._add(memoryview(chunk)[start : len(chunk) if end < 0 else end])
            if end < 0:
                return lines
            lines.append(self._finish())
            start = end + 1

    def rest(self) -> bytes | _Oversized | None:
        """What is left after the stream ended (a last line without a newline), if anything."""
        return self._finish() if self._size else None

    def _add(self, piece: memoryview) -> None:
        self._size += len(piece)
        if not self._over:
            room = self.limit - len(self._buffer)
            if len(piece) <= room:
                self._buffer += piece
                return
            self._buffer += piece[:room]
            self._over = True
            piece = piece[room:]
        self._tail += piece[-_TAIL_BYTES:]
        if len(self._tail) > _TAIL_BYTES:
            del self._tail[: len(self._tail) - _TAIL_BYTES]

    def _finish(self) -> bytes | _Oversized:
        line: bytes | _Oversized
        if self._over:
            line = _Oversized(bytes(self._buffer), bytes(self._tail), self._size)
        else:
            line = bytes(self._buffer)
        self._buffer = bytearray()
        self._tail = bytearray()
        self._size = 0
        self._over = False
        return line


class StdioTransport:
    """One connection to a stdio server; an async context manager yielding the SDK's two streams.

    Args:
        name: the server's name (for the log).
        command: the program.
        args: its arguments.
        env: its whole environment.
        cwd: its working folder, or None for the app's.
        errlog: a binary file the server's stderr goes to.
    """

    def __init__(
        self,
        name: str,
        command: str,
        args: list[str],
        env: dict[str, str],
        cwd: str | None,
        errlog: IO[bytes],
    ) -> None:
        self.name = name
        self.command = command
        self.args = args
        self.env = env
        self.cwd = cwd
        self.errlog = errlog
        #: Lines skipped because they are not JSON-RPC (since this connection began).
        self.skipped_lines = 0
        #: Set when the program is not an MCP server: why, in one line (``it printed ...``).
        self.not_mcp: str | None = None
        #: The process id of the server (of its supervisor on Linux) once started.
        self.pid: int | None = None
        self._messages = 0
        self._junk_bytes = 0
        self._first_junk: str | None = None
        self._pending: dict[object, str] = {}  # request id -> method, to answer a cut or unreadable reply
        self._supervised = False
        self._job: Any = None  # Windows: the job object's handle

    # ------------------------------------------------------------------ the connection

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[tuple[Any, Any]]:
        """Starts the server; yields ``(read_stream, write_stream)``; stops its tree on the way out.

        Raises:
            FileNotFoundError: the command or the working folder does not exist.
            PermissionError: the command cannot be run.
            OSError: the process cannot be started.
        """
        # lazy: start-up (+779 ms: anyio, mcp, pydantic)
        import anyio
        from mcp.shared.message import SessionMessage

        process = await self._start()
        to_session, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write_stream, from_session = anyio.create_memory_object_stream[SessionMessage](0)
        first_message = anyio.Event()

        async def read_stdout() -> None:
            assert process.stdout is not None
            splitter = _LineSplitter(MAX_MESSAGE_BYTES)
            listening = True  # False once the session left: the rest is read and dropped, so the
            # server never blocks on a full pipe while it is asked to exit
            async with to_session:
                while True:
                    try:
                        chunk = await process.stdout.receive(_READ_CHUNK)
                    except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                        break
                    if listening:
                        listening = await self._deliver_all(splitter.feed(chunk), to_session, first_message)
                if listening:
                    last = splitter.rest()
                    if last is not None:
                        await self._deliver_all([last], to_session, first_message)
                    if self._messages == 0 and self.skipped_lines and self.not_mcp is None:
                        self.not_mcp = self._verdict("and closed its output")

        async def write_stdin() -> None:
            assert process.stdin is not None
            try:
                async with from_session:
                    async for message in from_session:
                        envelope = message.message
                        method = getattr(envelope, "method", None)
                        ident = getattr(envelope, "id", None)
                        if method is not None and ident is not None:
                            if len(self._pending) > 10_000:  # answers that never came: forget the oldest
                                self._pending.pop(next(iter(self._pending)))
                            self._pending[ident] = method
                        data = envelope.model_dump_json(by_alias=True, exclude_unset=True)
                        await process.stdin.send(data.encode("utf-8") + b"\n")
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                await to_session.aclose()  # the server stopped reading: the session sees the end

        async def watch_junk() -> None:
            """Ends a start that printed junk and then nothing that is a message."""
            while not first_message.is_set():
                await anyio.sleep(0.1)
                if self._first_junk is not None and not first_message.is_set():
                    with anyio.move_on_after(JUNK_GRACE_S):
                        await first_message.wait()
                    if not first_message.is_set():
                        self.not_mcp = self._verdict(f"and nothing that is within {JUNK_GRACE_S:g} s")
                        await to_session.aclose()
                    return

        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(read_stdout)
                tasks.start_soon(write_stdin)
                tasks.start_soon(watch_junk)
                try:
                    yield read_stream, write_stream
                finally:
                    with anyio.CancelScope(shield=True):
                        read_stream.close()
                        write_stream.close()
                        await self._stop(process)
                    tasks.cancel_scope.cancel()
        finally:
            self._close_job()

    # ------------------------------------------------------------------ what the server says

    async def _deliver_all(self, lines: list[bytes | _Oversized], to_session: Any, first_message: Any) -> bool:
        """Passes each line on as a message, or skips it; False once the session is gone (it left, or
        the program is not an MCP server and the stream was ended)."""
        # lazy: start-up (+4 ms: anyio)
        import anyio

        for line in lines:
            message = self._message(line)
            if message is None:
                if self._messages == 0 and self.not_mcp is None and self._too_much_junk():
                    self.not_mcp = self._verdict("before any line that is")
                    await to_session.aclose()
                    return False
                continue
            self._messages += 1
            first_message.set()
            try:
                await to_session.send(message)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                return False
        return True

    def _message(self, line: bytes | _Oversized) -> Any:
        """The SDK message ``line`` holds (a cut or an error for an oversized or unreadable answer),
        or None when it is not one (it is counted and logged)."""
        # lazy: start-up (+274 ms: pydantic, mcp_types)
        import mcp_types

        if isinstance(line, _Oversized):
            return self._cut(line)
        line = line.rstrip(b"\r")
        if not line.strip():
            return None  # a blank line is nothing, not junk
        try:
            return self._received(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
        except ValueError as exc:
            found = line.find(b'{"jsonrpc"', 1)
            if found > 0:  # a message after junk on the same line (a progress line with no newline)
                with contextlib.suppress(ValueError):
                    message = self._received(mcp_types.jsonrpc_message_adapter.validate_json(line[found:]))
                    self._skipped(line[:found])
                    return message
            unreadable = self._unreadable_answer(line, exc)
            if unreadable is not None:
                return unreadable
        self._skipped(line)
        return None

    def _received(self, envelope: Any) -> Any:
        """``envelope`` as the SDK's message; a tool listing loses its output schemas.

        Glassbox reads a tool's text, never its structured content, and the SDK would check each
        result against its tool's ``outputSchema`` with Python's ``re`` and no time bound (a pattern
        of ``^(a+)+$`` there hangs a call): a listing's output schemas are dropped as it arrives.
        """
        # lazy: start-up (+748 ms: mcp, pydantic)
        from mcp.shared.message import SessionMessage

        ident = getattr(envelope, "id", None)
        method = self._pending.pop(ident, None) if ident is not None and not hasattr(envelope, "method") else None
        result = getattr(envelope, "result", None)
        if method == "tools/list" and isinstance(result, dict) and isinstance(result.get("tools"), list):
            for tool in result["tools"]:
                if isinstance(tool, dict):
                    tool.pop("outputSchema", None)
        return SessionMessage(envelope)

    def _skipped(self, line: bytes) -> None:
        self.skipped_lines += 1
        if self._messages == 0:
            self._junk_bytes += len(line)
            if self._first_junk is None:
                self._first_junk = _preview(line)
        if self.skipped_lines <= LOGGED_JUNK_LINES:
            log.warning("MCP server %r printed a line that is not JSON-RPC (skipped): %s", self.name, _preview(line))
        elif self.skipped_lines % _JUNK_LOG_EVERY == 0:
            log.warning("MCP server %r: %d lines that are not JSON-RPC skipped so far", self.name, self.skipped_lines)

    def _too_much_junk(self) -> bool:
        return self.skipped_lines > MAX_JUNK_BEFORE_START or self._junk_bytes > MAX_JUNK_BYTES_BEFORE_START

    def _verdict(self, how: str) -> str:
        count = self.skipped_lines
        lines = f"{count} line{'s' if count != 1 else ''}"
        return f"not an MCP server: it printed {self._first_junk!r} ({lines} that are not JSON-RPC) {how}"

    def _answer_to(self, ident: object) -> str | None:
        """The method of the request ``ident`` answers, if it is one of ours still waiting."""
        return self._pending.pop(ident, None)

    def _error(self, ident: object, text: str) -> Any:
        # lazy: start-up (+1091 ms: pydantic, mcp_types, mcp)
        import mcp_types
        from mcp.shared.message import SessionMessage

        envelope = {"jsonrpc": "2.0", "id": ident, "error": {"code": -32603, "message": text}}
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_python(envelope))

    def _unreadable_answer(self, line: bytes, exc: ValueError) -> Any:
        """An error for the request a response that cannot be parsed answers (so it fails now, not at
        its timeout), or None when the line answers nothing of ours."""
        if not line.lstrip().startswith(b"{") or b'"method"' in line[:256]:
            return None
        if b'"result"' not in line and b'"error"' not in line:
            return None
        ident = _line_id(_Oversized(line[:512], line[-512:], len(line)))
        if ident is None or self._answer_to(ident) is None:
            return None
        found = re.search(r"Invalid JSON: ([^\[\n]+)", str(exc))
        reason = found.group(1).strip() if found else "it is not a valid JSON-RPC answer"
        self.skipped_lines += 1
        log.warning("MCP server %r: an answer that cannot be read (%s)", self.name, reason)
        return self._error(ident, f"Glassbox could not read its answer ({reason})")

    def _cut(self, line: _Oversized) -> Any:
        """The answer to a request from the start of a line too long to read."""
        # lazy: start-up (+1158 ms: pydantic, mcp_types, mcp)
        import mcp_types
        from mcp.shared.message import SessionMessage

        ident = _line_id(line)
        method = self._answer_to(ident) if ident is not None else None
        if method is None:
            self._skipped(line.head[:200])
            log.warning("MCP server %r: a line of %s bytes skipped (it answers nothing of ours)", self.name, line.size)
            return None
        log.warning("MCP server %r: its answer to %s was cut (%s bytes)", self.name, method, line.size)
        envelope = cut_answer(ident, method, line.head, line.size)
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_python(envelope))

    # ------------------------------------------------------------------ the process

    async def _start(self) -> Any:
        # lazy: start-up (+5 ms: anyio)
        import anyio

        self._check_command()
        if sys.platform == "win32":  # pragma: no cover - Windows only
            return await self._start_windows()
        argv = [self._resolved(), *self.args]
        if sys.platform.startswith("linux") and not os.environ.get("GLASSBOX_MCP_NO_SUPERVISOR"):
            argv = [*_supervisor_command(), str(os.getpid()), "--", *argv]
            self._supervised = True
        process = await anyio.open_process(argv, env=self.env, cwd=self.cwd, stderr=self.errlog, start_new_session=True)
        self.pid = process.pid
        return process

    def _check_command(self) -> None:
        """The errors the SDK's spawn would raise, raised here: the supervisor runs the command itself."""
        if self.cwd is not None and not os.path.isdir(self.cwd):
            raise FileNotFoundError(errno.ENOENT, "no such folder", self.cwd)
        self._resolved()

    def _resolved(self) -> str:
        command = self.command
        if os.sep in command or (os.altsep and os.altsep in command):
            path = command if os.path.isabs(command) or self.cwd is None else os.path.join(self.cwd, command)
            if not os.path.exists(path):
                raise FileNotFoundError(errno.ENOENT, "not found", command)
            if not os.access(path, os.X_OK) or os.path.isdir(path):
                raise PermissionError(errno.EACCES, "permission denied", command)
            return command
        found = shutil.which(command, path=self.env.get("PATH", os.defpath))
        if found is None:
            raise FileNotFoundError(errno.ENOENT, "not found", command)
        return found

    async def _stop(self, process: Any) -> None:
        """Closes stdin, waits :data:`EXIT_GRACE_S`, then ends the tree (SIGTERM, then SIGKILL)."""
        # lazy: start-up (+5 ms: anyio)
        import anyio

        with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await process.stdin.aclose()
        exited = await _wait_exit(process, EXIT_GRACE_S)
        if sys.platform == "win32":  # pragma: no cover - Windows only
            if not exited:
                self._terminate_job()
                await _wait_exit(process, TERMINATE_GRACE_S)
        else:
            group = process.pid  # the leader of its own session (start_new_session)
            if not exited:
                # Supervised: SIGTERM to the supervisor, which ends the tree; else to the group.
                _signal(process.pid if self._supervised else -group, signal.SIGTERM)
                exited = await _wait_exit(process, TERMINATE_GRACE_S)
            # What is left in the group (everything when the server ignored SIGTERM; the children
            # of a server that exited by itself, when it is not supervised) is killed.
            _signal(-group, signal.SIGKILL)
            if not exited:
                await _wait_exit(process, 2.0)
        with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await process.stdout.aclose()
        transport = getattr(getattr(process, "_process", None), "_transport", None)
        close = getattr(transport, "close", None)
        if callable(close):
            with contextlib.suppress(OSError):
                close()

    # ------------------------------------------------------------------ Windows

    async def _start_windows(self) -> Any:  # pragma: no cover - Windows only
        """Spawns the server suspended, puts it in a kill-on-close job, resumes it."""
        # lazy: start-up (+8 ms)
        import subprocess

        # lazy: start-up (+5 ms: anyio)
        import anyio

        flags = getattr(subprocess, "CREATE_NO_WINDOW", 0) | _CREATE_SUSPENDED
        process = await anyio.open_process(
            [self._resolved(), *self.args], env=self.env, cwd=self.cwd, stderr=self.errlog, creationflags=flags
        )
        self.pid = process.pid
        try:
            try:
                self._job = _WindowsJob.around(process.pid)
            except OSError as exc:
                log.warning("MCP server %r: no job object (%s); its children may outlive it", self.name, exc)
                _WindowsJob.resume(process.pid)
        except BaseException:
            process.kill()  # never leave it suspended
            raise
        return process

    def _terminate_job(self) -> None:  # pragma: no cover - Windows only
        if self._job is not None:
            self._job.terminate()

    def _close_job(self) -> None:
        job, self._job = self._job, None
        if job is not None:  # pragma: no cover - Windows only
            job.close()  # KILL_ON_JOB_CLOSE: whatever is left in it ends now


def cut_answer(ident: object, method: str, head: bytes, size: int) -> dict[str, Any]:
    """The JSON-RPC answer to request ``ident`` (``method``) made from the start (``head``) of an
    answer of ``size`` bytes too large to read: for ``tools/call`` a result holding the start of
    its text and a marker saying how much was cut, for any other request an error naming the limit."""
    # lazy: start-up (+2 ms)
    from engine.units import format_bytes

    said = f"{format_bytes(size)}, more than the {format_bytes(MAX_MESSAGE_BYTES)} Glassbox reads of one answer"
    if method != "tools/call":
        return {"jsonrpc": "2.0", "id": ident, "error": {"code": -32603, "message": f"its answer was {said}"}}
    text = _text_start(head)
    if text is None:
        content = f"[the tool's answer was {said}; nothing of it is shown]"
        result = {"content": [{"type": "text", "text": content}], "isError": True, "resultType": "complete"}
    else:
        kept = text[:MAX_CUT_TEXT_CHARS]
        marker = f"\n[... cut by Glassbox: the answer was {said}; the first {len(kept):,} characters are above]"
        result = {"content": [{"type": "text", "text": kept + marker}], "isError": False, "resultType": "complete"}
    return {"jsonrpc": "2.0", "id": ident, "result": result}


def _supervisor_command() -> list[str]:
    """How to run :mod:`engine.agent.mcp_supervisor`: the frozen app runs it on a flag (its runtime
    hook); from source, Python runs the file in isolated mode (standard library only, fast)."""
    if getattr(sys, "frozen", False):
        # lazy: start-up (+8 ms)
        from engine.agent.mcp_supervisor import FROZEN_FLAG

        return [sys.executable, FROZEN_FLAG]
    return [sys.executable, "-I", "-S", str(_SUPERVISOR_SCRIPT)]


def _signal(target: int, signum: int) -> None:
    """``os.kill`` (a negative target is a process group), quiet when it is gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if target < 0:
            os.killpg(-target, signum)
        else:
            os.kill(target, signum)


async def _wait_exit(process: Any, timeout_s: float) -> bool:
    """Whether the process exited within ``timeout_s`` (by its return code: ``wait()`` would also
    wait for the pipes, which a surviving child may hold)."""
    # lazy: start-up (+5 ms: anyio)
    import anyio

    deadline = time.monotonic() + timeout_s
    while process.returncode is None:
        if time.monotonic() >= deadline:
            return False
        await anyio.sleep(0.01)
    return True


def _line_id(line: _Oversized) -> object:
    """The id of the JSON-RPC response a cut line holds, from its start or its end; None if not found."""
    match = _HEAD_ID.match(line.head[:512])
    if match is None:
        matches = list(_TAIL_ID.finditer(line.tail[-512:]))
        match = matches[-1] if matches else None
    if match is None:
        return None
    try:
        ident = json.loads(match.group(1))
    except ValueError:
        return None
    return ident if isinstance(ident, (int, str)) and not isinstance(ident, bool) else None


def _text_start(head: bytes) -> str | None:
    """The start of the first ``"text"`` string in a cut answer, decoded (at most
    :data:`MAX_CUT_TEXT_CHARS` characters' worth); None if there is none."""
    found = _TEXT_START.search(head)
    if found is None:
        return None
    start = found.end()
    end = min(len(head), start + 6 * MAX_CUT_TEXT_CHARS)  # a character is at most 6 bytes escaped
    at = start
    while True:  # the closing quote: one not escaped by an odd run of backslashes
        quote = head.find(b'"', at, end)
        if quote < 0:
            raw = head[start:end]
            break
        slashes = quote - 1
        while slashes >= start and head[slashes] == 0x5C:
            slashes -= 1
        if (quote - 1 - slashes) % 2 == 0:
            raw = head[start:quote]
            break
        at = quote + 1
    raw = re.sub(rb"\\u[0-9a-fA-F]{0,3}$", b"", raw)  # an escape the cut split
    if (len(raw) - len(raw.rstrip(b"\\"))) % 2:
        raw = raw[:-1]
    try:
        return str(json.loads(b'"' + raw.decode("utf-8", "ignore").encode("utf-8") + b'"'))
    except ValueError:
        return None


# ---------------------------------------------------------------------- Windows job objects

_CREATE_SUSPENDED = 0x00000004


class _WindowsJob:  # pragma: no cover - Windows only
    """A job object that kills its processes when its last handle closes (Win32 through ctypes)."""

    _JOB_OBJECT_EXTENDED_LIMIT_INFORMATION = 9
    _JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE = 0x00002000
    _PROCESS_SET_QUOTA = 0x0100
    _PROCESS_TERMINATE = 0x0001
    _PROCESS_SUSPEND_RESUME = 0x0800

    def __init__(self, handle: int) -> None:
        self.handle = handle

    @classmethod
    def around(cls, pid: int) -> _WindowsJob:
        """A new job holding the suspended process ``pid``, which is then resumed.

        Raises:
            OSError: the job cannot be made or the process cannot join it (the process is resumed
                by the caller then, outside any job).
        """
        # lazy: start-up (+12 ms)
        import ctypes
        from ctypes import wintypes

        kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
        kernel32.CreateJobObjectW.restype = wintypes.HANDLE
        kernel32.CreateJobObjectW.argtypes = (wintypes.LPVOID, wintypes.LPCWSTR)
        kernel32.OpenProcess.restype = wintypes.HANDLE
        kernel32.OpenProcess.argtypes = (wintypes.DWORD, wintypes.BOOL, wintypes.DWORD)
        kernel32.SetInformationJobObject.argtypes = (wintypes.HANDLE, ctypes.c_int, wintypes.LPVOID, wintypes.DWORD)
        kernel32.AssignProcessToJobObject.argtypes = (wintypes.HANDLE, wintypes.HANDLE)
        kernel32.CloseHandle.argtypes = (wintypes.HANDLE,)

        class _IoCounters(ctypes.Structure):
            _fields_ = [
                (name, ctypes.c_ulonglong)
                for name in (
                    "ReadOperationCount",
                    "WriteOperationCount",
                    "OtherOperationCount",
                    "ReadTransferCount",
                    "WriteTransferCount",
                    "OtherTransferCount",
                )
            ]

        class _BasicLimits(ctypes.Structure):
            _fields_ = [
                ("PerProcessUserTimeLimit", ctypes.c_longlong),
                ("PerJobUserTimeLimit", ctypes.c_longlong),
                ("LimitFlags", wintypes.DWORD),
                ("MinimumWorkingSetSize", ctypes.c_size_t),
                ("MaximumWorkingSetSize", ctypes.c_size_t),
                ("ActiveProcessLimit", wintypes.DWORD),
                ("Affinity", ctypes.c_size_t),
                ("PriorityClass", wintypes.DWORD),
                ("SchedulingClass", wintypes.DWORD),
            ]

        class _ExtendedLimits(ctypes.Structure):
            _fields_ = [
                ("BasicLimitInformation", _BasicLimits),
                ("IoInfo", _IoCounters),
                ("ProcessMemoryLimit", ctypes.c_size_t),
                ("JobMemoryLimit", ctypes.c_size_t),
                ("PeakProcessMemoryUsed", ctypes.c_size_t),
                ("PeakJobMemoryUsed", ctypes.c_size_t),
            ]

        job = kernel32.CreateJobObjectW(None, None)
        if not job:
            raise ctypes.WinError(ctypes.get_last_error())  # type: ignore[attr-defined]
        try:
            limits = _ExtendedLimits()
            limits.BasicLimitInformation.LimitFlags = cls._JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
            if not kernel32.SetInformationJobObject(
                job, cls._JOB_OBJECT_EXTENDED_LIMIT_INFORMATION, ctypes.byref(limits), ctypes.sizeof(limits)
            ):
                raise ctypes.WinError(ctypes.get_last_error())  # type: ignore[attr-defined]
            access = cls._PROCESS_SET_QUOTA | cls._PROCESS_TERMINATE
            process = kernel32.OpenProcess(access, False, pid)
            if not process:
                raise ctypes.WinError(ctypes.get_last_error())  # type: ignore[attr-defined]
            try:
                if not kernel32.AssignProcessToJobObject(job, process):
                    raise ctypes.WinError(ctypes.get_last_error())  # type: ignore[attr-defined]
            finally:
                kernel32.CloseHandle(process)
        except OSError:
            kernel32.CloseHandle(job)
            raise
        cls.resume(pid)  # in the job now: whatever it starts is in it too
        return cls(int(job))

    @classmethod
    def resume(cls, pid: int) -> None:
        """Resumes a process created suspended (``NtResumeProcess``: the thread handle is not kept)."""
        # lazy: start-up (+12 ms)
        import ctypes
        from ctypes import wintypes

        kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
        ntdll = ctypes.WinDLL("ntdll")  # type: ignore[attr-defined]
        kernel32.OpenProcess.restype = wintypes.HANDLE
        kernel32.OpenProcess.argtypes = (wintypes.DWORD, wintypes.BOOL, wintypes.DWORD)
        kernel32.CloseHandle.argtypes = (wintypes.HANDLE,)
        ntdll.NtResumeProcess.argtypes = (wintypes.HANDLE,)
        process = kernel32.OpenProcess(cls._PROCESS_SUSPEND_RESUME, False, pid)
        if not process:
            raise ctypes.WinError(ctypes.get_last_error())  # type: ignore[attr-defined]
        try:
            status = ntdll.NtResumeProcess(process)
            if status != 0:
                raise OSError(f"NtResumeProcess failed (NTSTATUS {status & 0xFFFFFFFF:#x})")
        finally:
            kernel32.CloseHandle(process)

    def terminate(self) -> None:
        """Ends every process in the job now."""
        # lazy: start-up (+11 ms)
        import ctypes
        from ctypes import wintypes

        kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
        kernel32.TerminateJobObject.argtypes = (wintypes.HANDLE, wintypes.UINT)
        kernel32.TerminateJobObject(self.handle, 1)

    def close(self) -> None:
        """Closes the job's handle: with KILL_ON_JOB_CLOSE, every process still in it ends."""
        # lazy: start-up (+10 ms)
        import ctypes
        from ctypes import wintypes

        kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
        kernel32.CloseHandle.argtypes = (wintypes.HANDLE,)
        kernel32.CloseHandle(self.handle)
