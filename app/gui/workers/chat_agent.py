"""The running turn's agent side, on the GUI thread: its thinking, tool steps and approvals.

The app's one turn (``app.turn``) runs the loop on the LLM thread; :class:`AgentSide` takes the LLM
worker's ``reasoning_received``, ``approval_requested`` and ``agent_recorded`` signals (the chat
adapter connects them) and keeps each step in the turn's record and the history.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Slot

if TYPE_CHECKING:
    from app.gui.workers.agent_turn import ApprovalRequest
    from app.gui.workers.chat_reply import ReplyKeeper, ReplyTurn
    from app.gui.workers.chat_state import ChatSignals
    from app.gui.workers.chat_turn import TurnRunner


class AgentSide(QObject):
    """The agent signals of the running turn.

    Args:
        signals: the chat's signals.
        turns: the running turn.
        replies: saves the reply as each step happens.
    """

    def __init__(self, signals: ChatSignals, turns: TurnRunner, replies: ReplyKeeper) -> None:
        super().__init__(signals)
        self._chat = signals
        self._turns = turns
        self._replies = replies

    def _current(self, request_id: int) -> ReplyTurn | None:
        return self._turns.current(request_id)

    @Slot(int, str)
    def on_reasoning(self, request_id: int, text: str) -> None:
        """Thinking text of the running reply (shown folded, never sent back)."""
        turn = self._current(request_id)
        if turn is not None:
            turn.agent.reasoning.append(text)
            self._chat.reasoning_delta.emit(text)

    @Slot(int, object)
    def on_approval(self, request_id: int, ask: ApprovalRequest) -> None:
        """A call waits for the user; a turn that is gone gets ``deny`` (nothing may run for it)."""
        if self._current(request_id) is None:
            ask.answer("deny")
            return
        self._chat.approval_requested.emit(ask)

    @Slot(int, object)
    def on_record(self, request_id: int, record: dict[str, Any]) -> None:
        """A record of the loop: tools that did not start, a message (saved at once), a generation."""
        turn = self._current(request_id)
        if turn is None:
            return
        chat = self._chat
        if record.get("kind") == "problems":
            chat.error_occurred.emit("Tools: " + "; ".join(record["problems"]))
            return
        turn.agent.add(record)
        step = record.get("step")
        if step is not None:
            chat.tool_step_added.emit(step)
        chat.loop_updated.emit(list(turn.agent.loop))
        if record.get("kind") == "message":
            self._replies.save_progress(turn)
