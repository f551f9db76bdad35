"""A turn's tools on the LLM worker: how a call waits for the user's approval.

The loop itself is the app's one turn (``app.turn.run_turn``, over ``engine.agent.loop.Agent``); the
window's part is here:

* :class:`ApprovalGate` is how a call waits for the user: the worker thread blocks on a
  ``threading.Event`` (polling the turn's Stop event, so Stop cancels a pending approval: the call
  is then refused and the loop ends); the GUI answers ``once``, ``always`` or ``deny``.
* :func:`gated_tools` gives the turn its tools with that approval; a chat's saved tool choice that
  names a tool no longer offered becomes the model's choice (Auto), said as a problem.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.turn import TurnRequest, TurnTools

if TYPE_CHECKING:
    from app.gui.workers.agent_tools import ToolsRequest
    from app.turn import TurnToolset
    from engine.agent.loop import Decision
    from engine.inference.events import ToolCall
    from engine.inference.tools import ToolSpec

APPROVAL_POLL_S = 0.05
"""How often a waiting approval looks at the turn's Stop event."""
DECISIONS = ("once", "always", "deny")


class ApprovalGate:
    """One call waiting for the user's decision (created on the worker thread, answered on the GUI's).

    Args:
        cancel: the turn's Stop event: a wait ends with ``deny`` as soon as it is set.
    """

    def __init__(self, cancel: threading.Event) -> None:
        self._cancel = cancel
        self._answered = threading.Event()
        self._decision: Decision = "deny"
        self._lock = threading.Lock()

    def answer(self, decision: str) -> bool:
        """Gives the decision (the first answer wins). Returns False when it was already answered."""
        if decision not in DECISIONS:
            raise ValueError(f"an approval is one of {', '.join(DECISIONS)}, not {decision!r}")
        with self._lock:
            if self._answered.is_set():
                return False
            self._decision = "once" if decision == "once" else "always" if decision == "always" else "deny"
            self._answered.set()
            return True

    @property
    def answered(self) -> bool:
        return self._answered.is_set()

    def wait(self) -> Decision:
        """Blocks the worker until the GUI answers or Stop is pressed (then ``deny``)."""
        while not self._answered.wait(APPROVAL_POLL_S):
            if self._cancel.is_set():
                self.answer("deny")
        return self._decision


@dataclass(frozen=True)
class ApprovalRequest:
    """What the approval card shows: the exact call, and the gate to answer it."""

    request_id: int
    call_id: str
    name: str
    arguments: dict[str, object]
    source: str
    description: str
    gate: ApprovalGate = field(compare=False, repr=False)

    def answer(self, decision: str) -> bool:
        """``once``, ``always`` or ``deny``; False when already answered (or stopped)."""
        return self.gate.answer(decision)


# ---------------------------------------------------------------------- the worker side


def gated_tools(
    request_id: int,
    turn: TurnRequest,
    tools: ToolsRequest,
    toolset: TurnToolset,
    ask: Callable[[ApprovalRequest], None],
) -> TurnRequest:
    """``turn`` with the chat's open tools, each call not allowed always waiting on an
    :class:`ApprovalGate` that ``ask`` shows the user (on the worker thread). A tool choice that
    names a tool no longer on becomes the model's (Auto), said with the tools' problems."""

    def approve(call: ToolCall, spec: ToolSpec) -> Decision:
        gate = ApprovalGate(turn.cancel)
        ask(ApprovalRequest(request_id, call.id, call.name, dict(call.arguments), spec.source, spec.description, gate))
        return gate.wait()

    choice, problems = tools.tool_choice, []
    if choice not in (None, "auto", "required", "none") and choice not in {spec.name for spec in toolset.tools()}:
        problems.append(f"{choice} is not on any more: the model decides this turn (Auto)")
        choice = None
    gated = TurnTools(toolset, approve, tools.max_steps, tools.timeout_s, tuple(problems))
    return dataclasses.replace(turn, tools=gated, tool_choice=choice)
