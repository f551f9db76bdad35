"""The open chat's last reply compared with the base model (``engine.inference.base_compare``): the
reply's turn asked again of the LLM worker, greedily, with the chat's LoRA adapters and without
them. It is not a turn: nothing is written to the history, and the worker puts the chat's adapters
and KV cache back after it (ARCHITECTURE.md, "Threads and processes").
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Slot

from app.agent_history import model_history
from app.gui.tasks import describe_error
from app.gui.workers.history_reads import DisplayMessage
from app.gui.workers.llm_requests import CompareOutcome, CompareRequest
from app.turn import TurnRequest

if TYPE_CHECKING:
    from app.gui.workers.chat_state import ChatSignals, TurnContext


class BaseComparer(QObject):
    """Compares the open chat's last reply with the base model, one comparison at a time.

    Args:
        signals: the chat's signals and state (``comparison_changed`` and
            ``comparison_finished`` are this part's).
    """

    def __init__(self, signals: ChatSignals) -> None:
        super().__init__(signals)
        self._chat = signals
        self._running: CompareRequest | None = None
        self._ids = itertools.count(1)
        self.last: CompareOutcome | None = None
        """The last comparison that ended (None before any)."""

    @property
    def running(self) -> bool:
        """A comparison is on the worker."""
        return self._running is not None

    def last_reply(self) -> DisplayMessage | None:
        """The open branch's last reply, when it answers a question (else None)."""
        messages = self._chat.thread_messages
        if len(messages) < 2 or messages[-1].role != "assistant" or messages[-2].role != "user":
            return None
        return messages[-1] if messages[-1].state != "pending" else None

    def unavailable(self, context: TurnContext | Callable[[], TurnContext]) -> str | None:
        """Why the last reply cannot be compared now (a tooltip's line), or None when it can.

        Args:
            context: the open chat's next turn context, or what makes it: called only once a local
                model is loaded (making one imports the engine's runtime, which the window's first
                frame does not wait for).
        """
        chat = self._chat
        if self.running:
            return "A comparison is running"
        if chat.loaded is None or getattr(chat.loaded.info, "kind", "") != "local":
            return "Needs a local model loaded"
        if callable(context):
            context = context()
        if not any(scale != 0 for _path, scale in context.adapters):
            return "This chat has no LoRA adapter applied (Chat settings → LoRA adapter)"
        if context.tools is not None or context.knowledge_bases:
            # The comparison reads the reply's prompt as the chat's history and question alone.
            return "Compare with base reads the prompt without tools or documents: switch them off to compare"
        if chat.busy:
            return "Wait for the reply to finish"
        if self.last_reply() is None:
            return "No reply to compare yet"
        return None

    def start(self, context: TurnContext) -> bool:
        """Asks the worker to decode the last reply's prompt greedily with the chat's adapters and
        without them, ``max_tokens`` as the chat's (False: :meth:`unavailable` says why not)."""
        if self.unavailable(context) is not None:
            return False
        messages = self._chat.thread_messages
        reply, question = messages[-1], messages[-2]
        turn = TurnRequest(
            history=model_history(messages[:-2], lambda row: row.media if isinstance(row, DisplayMessage) else ()),
            user=question.content,
            media=question.media,
            params=context.params,  # the worker decodes greedily, without speculation
            system=context.system,
            thinking=context.thinking,
            cancel=threading.Event(),
        )
        self._running = CompareRequest(next(self._ids), reply.id, turn, context.adapters)
        self._chat.comparison_changed.emit(True)
        self._chat.compare_requested.emit(self._running)
        return True

    def stop(self) -> None:
        """Stops the running comparison (its own event, set here: CONTRIBUTING.md rule 9)."""
        if self._running is not None:
            self._running.cancel.set()

    @Slot(object)
    def on_finished(self, outcome: CompareOutcome) -> None:
        """The worker's answer: shown (a stopped one says so)."""
        if self._running is None or outcome.request_id != self._running.request_id:
            return
        self._running = None
        self.last = outcome
        self._chat.comparison_changed.emit(False)
        self._chat.comparison_finished.emit(outcome)

    @Slot(int, object)
    def on_failed(self, request_id: int, exc: BaseException) -> None:
        """The comparison failed: one line for the user."""
        if self._running is None or request_id != self._running.request_id:
            return
        self._running = None
        self._chat.comparison_changed.emit(False)
        self._chat.error_occurred.emit(f"Could not compare with the base model: {describe_error(exc)}")
