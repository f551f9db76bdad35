"""The chat adapter: the one GUI-side object widgets talk to about chatting (CONTRIBUTING.md rules 2, 12).

It owns the LLM worker thread and the history service, holds the UI state enum, and composes the
parts of a chat: the model (:class:`~app.gui.workers.chat_model.ModelSlot`), the conversations
(:class:`~app.gui.workers.chat_conversations.Conversations`), the running turn
(:class:`~app.gui.workers.chat_turn.TurnRunner`: save the question first, the passages from the
knowledge worker, the generation, the reply saved with its stats and sources), the saving of
replies (:class:`~app.gui.workers.chat_reply.ReplyKeeper`: checkpoints, retries on a full disk)
and the agent side of a turn with tools (:class:`~app.gui.workers.chat_agent.AgentSide`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

from PySide6.QtCore import QCoreApplication, QEvent, QObject, QThread, QTimer, Signal, Slot

from app.gui.workers.chat_agent import AgentSide
from app.gui.workers.chat_conversations import ConversationChanges, Conversations, Opened, last_stats
from app.gui.workers.chat_model import ModelSlot
from app.gui.workers.chat_reply import ReplyKeeper
from app.gui.workers.chat_retrieval import RetrieverFactory
from app.gui.workers.chat_state import ChatState, ModelState, TurnContext
from app.gui.workers.chat_turn import TurnRunner
from app.gui.workers.history_reads import DisplayMessage
from app.gui.workers.history_service import HistoryService
from app.gui.workers.llm_loading import SessionFactory
from app.gui.workers.llm_requests import LoadedModel, LoadRequest
from app.gui.workers.llm_worker import LlmWorker
from app.gui.workers.model_routing import RoutingSessionFactory

if TYPE_CHECKING:
    from engine.history_schema import Conversation
    from engine.inference.backends import ChatBackend
    from engine.inference.events import Stats
    from engine.media import Media


class ChatAdapter(QObject):
    """Fronts the LLM worker and the history for the widgets.

    Args:
        history: the history service.
        session_factory: passed to the LlmWorker (tests inject fakes).
        retriever_factory: the retriever of a turn's knowledge bases (``KnowledgeAdapter.chat_retriever``:
            it searches on the knowledge thread before the request reaches the LLM worker).
        parent: the Qt parent.
        endpoints_file: the saved remote endpoints.

    Signals:
        state_changed(object): the new :class:`ChatState`.
        model_state_changed(object, str): :class:`ModelState` and a one-line detail.
        model_loaded(object): the :class:`LoadedModel`.
        conversations_changed(object): list of ``engine.history.Conversation``.
        conversation_opened(object, object): the Conversation and its thread (list of DisplayMessage).
        reply_started(int): id of the pending reply message.
        reply_delta(str, int): text delta, number of tokens in it.
        prefill_progressed(int, int): tokens evaluated, total.
        reply_finished(object): the :class:`GenerationOutcome`.
        stats_updated(object): the last turn's ``engine.inference.events.Stats`` as a dict, with its ``finish_reason``.
        prompt_view_updated(object): ``engine.inference.session.PromptView`` of the last prompt.
        error_occurred(str): a one-line message for the user.
        message_not_saved(str, object): the text of a message that could not be saved and the id of
            the message it was editing (or None): it goes back to the composer.
        history_unreadable(str): the history file is not SQLite or is corrupt (left untouched).
        notice_posted(str): a passing note for the status bar (a reply saved late, passages left out).
        bandwidth_measured(float): the machine's memory bandwidth (GB/s).
        sources_found(object): the sources (list of dicts) of the passages retrieved for the reply.
        reasoning_delta(str): thinking text of the running reply (shown folded, never sent back).
        tool_step_added(object): a tool call of the running reply was handled (agent_history.step_dict).
        loop_updated(object): the running turn's timeline (generations and calls, list of dicts).
        approval_requested(object): an ``agent_turn.ApprovalRequest`` the user must answer.
        call_progressed(int): the tokens of the tool call the model is writing (0: it is not now).
        media_not_saved(object): the attachments of a message that could not be saved (a tuple of
            ``engine.media.Media``): they go back to the composer.
        media_measured(object): each attachment's cost for the loaded model: a list of
            ``MediaInfo``, None (a server counts them itself) or the exception (it cannot see them).
        load_requested(object), generate_requested(object), unload_requested(),
        shutdown_requested(), media_info_requested(object): commands to the worker (queued).
    """

    state_changed = Signal(object)
    model_state_changed = Signal(object, str)
    model_loaded = Signal(object)
    conversations_changed = Signal(object)
    conversation_opened = Signal(object, object)
    reply_started = Signal(int)
    reply_delta = Signal(str, int)
    prefill_progressed = Signal(int, int)
    reply_finished = Signal(object)
    stats_updated = Signal(object)
    prompt_view_updated = Signal(object)
    error_occurred = Signal(str)
    message_not_saved = Signal(str, object)
    media_not_saved = Signal(object)
    media_measured = Signal(object)
    history_unreadable = Signal(str)
    notice_posted = Signal(str)
    bandwidth_measured = Signal(float)
    sources_found = Signal(object)
    reasoning_delta = Signal(str)
    tool_step_added = Signal(object)
    loop_updated = Signal(object)
    approval_requested = Signal(object)
    call_progressed = Signal(int)

    load_requested = Signal(object)
    generate_requested = Signal(object)
    media_info_requested = Signal(object)
    unload_requested = Signal()
    shutdown_requested = Signal()

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
        self.retriever_factory = retriever_factory
        self.state = ChatState.IDLE
        self.conversation: Conversation | None = None
        self.thread_messages: list[DisplayMessage] = []
        self.last_stats: Stats | dict[str, Any] | None = None
        self._closed = False
        self._media_request = 0
        self.model = ModelSlot(self)
        self.conversations = Conversations(self)
        self.replies = ReplyKeeper(self)
        self.turns = TurnRunner(self)
        self.agent = AgentSide(self)
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
        worker.media_measured.connect(self._on_worker_media_measured)
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
        worker.reasoning_received.connect(self.agent.on_reasoning)
        worker.agent_recorded.connect(self.agent.on_record)
        worker.approval_requested.connect(self.agent.on_approval)
        worker.call_progressed.connect(turns.on_call_progress)

    # ------------------------------------------------------------------ state
    def set_state(self, state: ChatState) -> None:
        """Moves to ``state`` (``state_changed`` when it changes)."""
        if state is not self.state:
            self.state = state
            self.state_changed.emit(state)

    def show_thread(self, conversation: Conversation, messages: list[DisplayMessage]) -> None:
        """Makes ``conversation`` the open one, showing ``messages`` (``conversation_opened``)."""
        self.conversation = conversation
        self.thread_messages = messages
        self.last_stats = last_stats(messages)
        self.conversation_opened.emit(conversation, messages)

    def show_thread_of(self, conversation_id: int, messages: list[DisplayMessage]) -> None:
        """Shows ``messages`` when ``conversation_id`` is still the open conversation."""
        if self.conversation is not None and self.conversation.id == conversation_id:
            self.thread_messages = messages
            self.conversation_opened.emit(self.conversation, messages)

    @property
    def busy(self) -> bool:
        """True while a reply is being produced or stopped."""
        return self.turns.turn is not None

    @property
    def model_state(self) -> ModelState:
        """Whether a model is loaded."""
        return self.model.state

    @property
    def loaded(self) -> LoadedModel | None:
        """The loaded model, or None."""
        return self.model.loaded

    @property
    def _retry_timer(self) -> QTimer:
        """The timer that retries replies the disk refused (tests look at it)."""
        return self.replies.retry_timer

    # ------------------------------------------------------------------ model
    def load_model(self, request: LoadRequest) -> None:
        """Loads a model on the worker (cancels a running turn first)."""
        self.model.load(request)

    def cancel_load(self) -> None:
        """Cancels the load in progress (the model bar's Cancel); the end is said."""
        self.model.cancel_load(by_user=True)

    def current_session(self) -> ChatBackend | None:
        """The loaded model's session (local or remote), or None when no model is loaded.

        Other parts of the app (the local API server) may share it: sessions serialize their turns
        with their own lock. The LLM worker thread keeps owning (and closing) it.
        """
        return self.model.session()

    def unload_model(self) -> None:
        """Closes the loaded model."""
        self.model.unload()

    # ------------------------------------------------------------------ conversations
    def refresh_conversations(self) -> None:
        """Reloads the conversation list (emits conversations_changed)."""
        self.conversations.refresh()

    def open_conversation(self, conversation_id: int) -> None:
        """Shows a conversation (its current branch)."""
        self.conversations.open(conversation_id)

    def new_conversation(self, system_prompt: str | None = None, settings: Mapping[str, object] | None = None) -> None:
        """Creates and opens an empty conversation."""
        self.conversations.new(system_prompt, settings)

    def _after_create(self, result: Opened) -> None:
        """A conversation was created elsewhere (the document drop): open and list it."""
        self.conversations.created(result)

    def reload_thread(self) -> None:
        """Re-reads the open conversation's current branch."""
        self.conversations.reload()

    def select_branch(self, message_id: int) -> None:
        """Switches the open conversation to the branch through ``message_id``."""
        self.conversations.select_branch(message_id)

    def update_conversation(self, **changes: Unpack[ConversationChanges]) -> None:
        """Saves per-conversation settings (system_prompt, settings, knowledge_bases)."""
        self.conversations.update(**changes)

    # ------------------------------------------------------------------ turns
    def send(self, text: str, context: TurnContext, edit_of: int | None = None, media: tuple[Media, ...] = ()) -> bool:
        """Starts a turn: saves the user message and a pending reply, then generates.

        Args:
            text: the user's message.
            context: system prompt, sampling parameters, knowledge bases.
            edit_of: id of a user message this one replaces as a new branch (None: append).
            media: the images and clips attached to it.

        Returns:
            False when the turn cannot start (no model, already busy, nothing to send).
        """
        return self.turns.send(text, context, edit_of, media)

    def measure_media(self, media: tuple[Media, ...]) -> None:
        """Asks the loaded model what these attachments cost (answered by ``media_measured``)."""
        from app.gui.workers.llm_requests import MediaInfoRequest

        self._media_request += 1
        if not media or self.loaded is None:
            self.media_measured.emit([] if media == () else None)
            return
        self.media_info_requested.emit(MediaInfoRequest(self._media_request, tuple(media)))

    @Slot(int, object)
    def _on_worker_media_measured(self, request_id: int, answer: object) -> None:
        if request_id == self._media_request:  # an older question's answer is stale
            self.media_measured.emit(answer)

    def regenerate(self, reply_id: int, context: TurnContext) -> bool:
        """Generates a new sibling of an assistant reply (the old one stays reachable)."""
        return self.turns.regenerate(reply_id, context)

    def stop(self) -> None:
        """Stops the running turn (during retrieval too)."""
        self.turns.stop()

    @property
    def reply_so_far(self) -> str:
        """The streamed text of the running turn."""
        turn = self.turns.turn
        return turn.reply_text if turn is not None else ""

    def live_agent_record(self, reply_id: int | None) -> dict[str, object] | None:
        """The agent loop of the running turn so far (its steps and their calls, as a stored reply's
        stats keep them), when the running turn is ``reply_id``'s; else None."""
        turn = self.turns.turn
        if turn is None or reply_id is None or turn.reply_id != reply_id:
            return None
        return turn.agent.stats()

    def live_tokens(self) -> tuple[int, float, float | None]:
        """Tokens received, seconds since the turn started, and when the first token came."""
        turn = self.turns.turn
        if turn is None:
            return 0, 0.0, None
        return turn.tokens, time.perf_counter() - turn.started, turn.first_token_at

    # ------------------------------------------------------------------ shutdown
    def shutdown(self, deadline_s: float = 5.0) -> bool:
        """Stops work, closes the model and the worker thread; waits at most ``deadline_s``.

        Returns:
            True when everything stopped in time (else the inference child was killed).
        """
        self.stop()
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
        self._closed = True
        self.history.close(wait=True)
        return bool(clean)
