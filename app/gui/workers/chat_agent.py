"""The chat adapter's agent side: the tool steps, approvals and thinking of the running turn
(``app.gui.workers.agent_turn`` runs the loop on the LLM thread; this mixin takes its signals on the
GUI thread). Mixed into :class:`app.gui.workers.chat_adapter.ChatAdapter`, whose state it uses
(``_turn``, ``history``, the signals).
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Slot


class ChatAgentMixin:
    """The slots for the LLM worker's ``reasoning_received``, ``approval_requested`` and
    ``agent_recorded`` signals (ChatAdapter connects them)."""

    _turn: Any
    history: Any
    reasoning_delta: Any
    approval_requested: Any
    tool_step_added: Any
    loop_updated: Any
    error_occurred: Any
    _on_reply_save_failed: Any  # ChatAdapter's: a write the disk refused is kept and retried

    @Slot(int, str)
    def _on_worker_reasoning_received(self, request_id: int, text: str) -> None:
        if self._turn is not None and self._turn.request.request_id == request_id:
            self._turn.agent.reasoning.append(text)
            self.reasoning_delta.emit(text)

    @Slot(int, object)
    def _on_worker_approval_requested(self, request_id: int, ask: Any) -> None:
        if self._turn is None or self._turn.request.request_id != request_id:
            ask.answer("deny")  # a turn that is gone: nothing may run for it
            return
        self.approval_requested.emit(ask)

    @Slot(int, object)
    def _on_worker_agent_recorded(self, request_id: int, record: dict[str, Any]) -> None:
        turn = self._turn
        if turn is None or turn.request.request_id != request_id:
            return
        if record.get("kind") == "problems":
            self.error_occurred.emit("Tools: " + "; ".join(record["problems"]))
            return
        turn.agent.add(record)
        step = record.get("step")
        if step is not None:
            self.tool_step_added.emit(step)
        self.loop_updated.emit(list(turn.agent.loop))
        if record.get("kind") == "message":
            self._save_progress(turn)

    def _save_progress(self, turn: Any) -> None:
        """Saves the turn so far, its tool steps included, as each step happens (state stays
        ``pending``: a crash leaves it ``partial`` with every step before it)."""
        text, stored, reply_id, extra = "".join(turn.text), turn.stored, turn.reply_id, turn.agent.stats()

        def save(store: Any) -> None:
            store.finish_message(reply_id, text, state="pending", stats=extra)
            stored.chars = len(text)

        def failed(exc: BaseException) -> None:
            self._on_reply_save_failed(turn, exc)

        self.history.keep(("reply", reply_id), save, None, failed, size_hint=len(text))
