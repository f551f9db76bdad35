"""The app's agent turn with the real engine (the starter model, a base model): the LLM worker runs
the loop on a real ChatSession with a built-in tool, a named tool choice makes the model call it
(grammar), the approval is asked before the call runs, and a denied call never runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.gui.workers.agent_tools import ToolsRequest
from app.gui.workers.llm_requests import GenerateRequest, LoadRequest
from app.gui.workers.llm_worker import LlmWorker
from app.paths import Paths
from app.turn import TurnRequest
from engine.inference.runtime import GenerationParams

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.gui]


@pytest.fixture(scope="module")
def loaded(starter_model: Path) -> Any:
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([])
    worker = LlmWorker()
    loads: list[Any] = []
    worker.model_loaded.connect(loads.append)
    worker.model_load_failed.connect(loads.append)
    worker._on_load_requested(LoadRequest(model_path=starter_model, n_ctx=2048))
    assert loads and not isinstance(loads[0], BaseException), loads
    yield worker
    worker._on_shutdown_requested()
    del app


def run_turn(worker: LlmWorker, paths: Paths, decision: str) -> dict[str, Any]:
    seen: dict[str, Any] = {"asked": [], "records": [], "finished": [], "failed": []}

    def ask(_rid: int, request: Any) -> None:
        seen["asked"].append(request)
        request.answer(decision)

    connections = [
        (worker.approval_requested, ask),
        (worker.agent_recorded, lambda _rid, record: seen["records"].append(record)),
        (worker.generation_finished, seen["finished"].append),
        (worker.generation_failed, lambda _rid, exc: seen["failed"].append(exc)),
    ]
    for signal, slot in connections:
        signal.connect(slot)
    try:
        tools = ToolsRequest(("calculator",), paths, tool_choice="calculator", max_steps=1)
        worker._on_generate_requested(
            GenerateRequest(
                1,
                TurnRequest((), "What is 6 times 7?", GenerationParams(max_tokens=96, temperature=0.0, seed=1)),
                tools,
            )
        )
    finally:
        for signal, slot in connections:
            signal.disconnect(slot)
    assert not seen["failed"], seen["failed"]
    return seen


def test_a_real_session_calls_the_builtin_after_approval(loaded: Any, paths: Paths) -> None:
    seen = run_turn(loaded, paths, "once")
    assert len(seen["asked"]) == 1 and seen["asked"][0].name == "calculator", seen["records"]
    steps = [r["step"] for r in seen["records"] if r.get("kind") == "message" and r.get("step")]
    assert len(steps) == 1 and steps[0]["name"] == "calculator" and steps[0]["ran"]
    assert steps[0]["approval"] == "allowed" and steps[0]["tokens"] > 0
    kinds = [r["kind"] for r in seen["records"]]
    assert kinds.count("generation") == 2  # the call, then the answer without tools (max_steps=1)
    assert seen["finished"] and seen["finished"][-1].reason in ("stop", "length")


def test_a_real_session_denied_call_never_runs(loaded: Any, paths: Paths) -> None:
    seen = run_turn(loaded, paths, "deny")
    steps = [r["step"] for r in seen["records"] if r.get("kind") == "message" and r.get("step")]
    assert len(steps) == 1 and not steps[0]["ran"] and steps[0]["approval"] == "denied"
    assert steps[0]["ms"] == 0.0
