"""The parent of a stdio MCP server on Linux: whatever the server starts ends with it.

Contract: ARCHITECTURE.md, 'engine.agent.mcp_supervisor'.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

#: The flag the frozen app runs this module on (installers/hooks/rthook_mcp_supervisor.py).
FROZEN_FLAG = "--glassbox-mcp-supervisor"
#: Seconds the tree gets between SIGTERM and SIGKILL.
GRACE_S = 1.5
#: Rounds of stop-and-kill before giving up on a tree that keeps forking (each round kills all it finds).
_KILL_ROUNDS = 200

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


class _Stop(Exception):
    """A stop signal arrived while waiting."""


def _prctl(libc: ctypes.CDLL, option: int, value: int) -> bool:
    return int(libc.prctl(option, value, 0, 0, 0)) == 0


def _on_stop(_signum: int, _frame: object) -> None:
    raise _Stop


def _descendants(root: int) -> list[int]:
    """The live (not zombie) descendants of ``root``, read from /proc."""
    children: dict[int, list[int]] = {}
    zombies: set[int] = set()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue  # gone meanwhile
        fields = stat[stat.rfind(b")") + 2 :].split()  # the name may hold spaces and parentheses
        if len(fields) < 2:
            continue
        pid = int(entry)
        children.setdefault(int(fields[1]), []).append(pid)
        if fields[0] == b"Z":
            zombies.add(pid)
    found: list[int] = []
    stack = list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, ()))
    return [pid for pid in found if pid not in zombies]


def _reap() -> None:
    """Reaps every child that ended (orphans of the tree are reparented here)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def stop_tree(root: int, grace_s: float = GRACE_S) -> None:
    """Ends every descendant of ``root`` (this process): SIGTERM, ``grace_s``, then stop and kill."""
    alive = _descendants(root)
    if not alive:
        _reap()
        return
    _signal_all(alive, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap()
        if not _descendants(root):
            return
        time.sleep(0.02)
    for _ in range(_KILL_ROUNDS):
        alive = _descendants(root)
        if not alive:
            break
        _signal_all(alive, signal.SIGSTOP)  # stopped, none of them forks again
        alive = _descendants(root)  # and any forked before the stop landed
        _signal_all(alive, signal.SIGKILL)
        _reap()
        time.sleep(0.005)
    _reap()


def _run_server(command: list[str]) -> int:
    supervisor = os.getpid()
    pid = os.fork()
    if pid == 0:  # the server
        try:
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(signum, signal.SIG_DFL)
            libc = ctypes.CDLL(None, use_errno=True)
            _prctl(libc, _PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != supervisor:  # the supervisor died before the request landed
                os._exit(137)
            os.execvp(command[0], command)
        except OSError as exc:
            os.write(2, f"glassbox: cannot run {command[0]}: {exc.strerror or exc}\n".encode(errors="replace"))
        finally:
            os._exit(127)
    return pid


def main(argv: list[str]) -> int:
    """``PARENT_PID -- COMMAND [ARGS...]``; returns the server's exit status."""
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        os.write(2, b"glassbox: mcp supervisor: usage: PARENT_PID -- COMMAND [ARGS...]\n")
        return 2
    parent, command = int(argv[0]), argv[2:]
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _on_stop)
    libc = ctypes.CDLL(None, use_errno=True)
    _prctl(libc, _PR_SET_CHILD_SUBREAPER, 1)
    _prctl(libc, _PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the app is gone already
        return 1
    me = os.getpid()
    status = 1
    try:
        server = _run_server(command)
        # The supervisor keeps no end of the server's pipes: their ends are the server's alone.
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.close(devnull)
        while True:
            pid, raw = os.waitpid(-1, 0)
            if pid == server:
                status = os.waitstatus_to_exitcode(raw)
                status = 128 - status if status < 0 else status
                break
    except _Stop:
        pass
    except ChildProcessError:
        pass
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)  # stopping now; a second signal must not interrupt it
    stop_tree(me)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
