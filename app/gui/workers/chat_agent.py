"""The running turn's agent side, on the GUI thread: its thinking, tool steps and approvals.

``app.gui.workers.agent_turn`` runs the loop on the LLM thread; :class:`AgentSide` takes the LLM
worker's ``reasoning_received``, ``approval_requested`` and ``agent_recorded`` signals for the chat
adapter (which connects them) and keeps each step in the turn's record and the history.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Slot

if TYPE_CHECKING:
    from app.gui.workers.agent_turn import ApprovalRequest
    from app.gui.workers.chat_adapter import ChatAdapter
    from app.gui.workers.chat_reply import ReplyTurn


class AgentSide(QObject):
    """The agent signals of the running turn.

    Args:
        chat: the adapter (the running turn, the reply keeper, the signals).
    """

    def __init__(self, chat: ChatAdapter) -> None:
        super().__init__(chat)
        self._chat = chat

    def _current(self, request_id: int) -> ReplyTurn | None:
        return self._chat.turns.current(request_id)

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
            chat.replies.save_progress(turn)
