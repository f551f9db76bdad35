"""The chat adapter: the one GUI-side object widgets talk to about chatting (CONTRIBUTING.md rules 2, 12).

It is the chat's signals and state (:class:`~app.gui.workers.chat_state.ChatSignals`), owns the
LLM worker thread, and composes the parts of a chat, each given the signals and its few
collaborators, never the adapter: the model (``model``: :class:`~app.gui.workers.chat_model.ModelSlot`),
the conversations (``conversations``: :class:`~app.gui.workers.chat_conversations.Conversations`),
the running turn (``turns``: :class:`~app.gui.workers.chat_turn.TurnRunner`), the saving of replies
(``replies``: :class:`~app.gui.workers.chat_reply.ReplyKeeper`) and the agent side of a turn with
tools (``agent``: :class:`~app.gui.workers.chat_agent.AgentSide`), and the last reply compared
with the base model (``compare``: :class:`~app.gui.workers.chat_compare.BaseComparer`).
Controllers call the part they use; the adapter forwards nothing.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QCoreApplication, QEvent, QObject, QThread

from app.gui.workers.chat_agent import AgentSide
from app.gui.workers.chat_compare import BaseComparer
from app.gui.workers.chat_conversations import Conversations
from app.gui.workers.chat_model import ModelSlot
from app.gui.workers.chat_reply import ReplyKeeper
from app.gui.workers.chat_retrieval import RetrieverFactory
from app.gui.workers.chat_state import ChatSignals
from app.gui.workers.chat_turn import TurnRunner
from app.gui.workers.history_service import HistoryService
from app.gui.workers.llm_loading import SessionFactory
from app.gui.workers.llm_worker import LlmWorker
from app.gui.workers.model_routing import RoutingSessionFactory


class ChatAdapter(ChatSignals):
    """The chat's signals and state (see :class:`ChatSignals`), its worker thread and its parts.

    Args:
        history: the history service.
        session_factory: passed to the LlmWorker (tests inject fakes).
        retriever_factory: the retriever of a turn's knowledge bases (``KnowledgeAdapter.chat_retriever``:
            it searches on the knowledge thread before the request reaches the LLM worker).
        parent: the Qt parent.
        endpoints_file: the saved remote endpoints.
    """

    def __init__(
        self,
        history: HistoryService,
        session_factory: SessionFactory | None = None,
        retriever_factory: RetrieverFactory | None = None,
        parent: QObject | None = None,
        endpoints_file: Path | None = None,
    ) -> None:
        super().__init__(parent)
        self.sessions = RoutingSessionFactory(endpoints_file, session_factory)
        self.history = history
        self.conversations = Conversations(self, history)
        self.replies = ReplyKeeper(self, history, self.conversations)
        self.model = ModelSlot(self, self.sessions, lambda: self.turns.stop())
        self.turns = TurnRunner(self, history, self.conversations, self.replies, self.model, retriever_factory)
        self.agent = AgentSide(self, self.turns, self.replies)
        self.compare = BaseComparer(self)
        self._thread = QThread()
        self._thread.setObjectName("glassbox-llm")
        self.worker = LlmWorker(self.sessions)
        self.worker.moveToThread(self._thread)
        self._connect_worker()
        self._thread.start()

    def _connect_worker(self) -> None:
        worker, turns = self.worker, self.turns
        self.load_requested.connect(worker._on_load_requested)
        self.generate_requested.connect(worker._on_generate_requested)
        self.media_info_requested.connect(worker._on_media_info_requested)
        worker.media_measured.connect(self.model.on_media_measured)
        self.unload_requested.connect(worker._on_unload_requested)
        self.shutdown_requested.connect(worker._on_shutdown_requested)
        worker.model_loaded.connect(self.model.on_loaded)
        worker.model_load_failed.connect(self.model.on_load_failed)
        worker.model_unloaded.connect(self.model.on_unloaded)
        worker.tokens_received.connect(turns.on_tokens)
        worker.prefill_progressed.connect(turns.on_prefill)
        worker.generation_finished.connect(turns.on_finished)
        worker.generation_failed.connect(turns.on_failed)
        worker.prompt_view_ready.connect(self.prompt_view_updated)
        worker.bandwidth_measured.connect(self.bandwidth_measured)
        worker.resident_changed.connect(self.resident_models_changed)
        worker.reasoning_received.connect(self.agent.on_reasoning)
        worker.agent_recorded.connect(self.agent.on_record)
        worker.approval_requested.connect(self.agent.on_approval)
        worker.call_progressed.connect(turns.on_call_progress)
        self.compare_requested.connect(worker._on_compare_requested)
        worker.comparison_finished.connect(self.compare.on_finished)
        worker.comparison_failed.connect(self.compare.on_failed)

    # ------------------------------------------------------------------ shutdown
    def shutdown(self, deadline_s: float = 5.0) -> bool:
        """Stops work, closes the model and the worker thread; waits at most ``deadline_s``.

        Returns:
            True when everything stopped in time (else the inference child was killed).
        """
        self.turns.stop()
        self.compare.stop()
        self.replies.retry_timer.stop()  # the history tries the unsaved replies once more as it closes
        self.model.cancel_load()
        self.shutdown_requested.emit()
        self._thread.quit()
        clean = self._thread.wait(int(deadline_s * 1000))
        if not clean:
            self.worker.kill_for_shutdown()
            self._thread.terminate()
            self._thread.wait(1000)
        # Deliver what the worker sent before it stopped (the final text and stats), so the reply
        # is saved with them; a turn still open after that is saved as partial.
        QCoreApplication.sendPostedEvents(self.turns, QEvent.Type.MetaCall.value)
        QCoreApplication.sendPostedEvents(self.agent, QEvent.Type.MetaCall.value)
        self.turns.finish_at_shutdown()
        self.history.close(wait=True)
        return bool(clean)
