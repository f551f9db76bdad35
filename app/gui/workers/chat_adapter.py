"""The chat adapter: the one GUI-side object widgets talk to about chatting (STYLE.md rules 2, 12).

It owns the LLM worker thread and the history service, holds the UI state enum, and runs a chat
turn as DESIGN.md describes it: save the user message (and a pending reply) first, optionally
retrieve documents, ask the worker to generate, show coalesced text, checkpoint the reply every
second, and save it (partial if stopped) with its stats and sources when it ends.

On a full disk nothing is lost: a message the history refuses goes back to the composer
(``message_not_saved``) with how much space is needed and where; a reply it refuses stays whole in
memory and on screen, is tried again every :data:`RETRY_S` s, before the next history write and at
quit, and its row is marked complete (or partial) only once that save succeeded.
"""

from __future__ import annotations

import enum
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QCoreApplication, QEvent, QObject, QThread, QTimer, Signal, Slot

if TYPE_CHECKING:
    from engine.inference.backends import ChatBackend

from app.agent_history import AgentRecord, model_history
from app.gui.tasks import describe_error
from app.gui.workers.chat_agent import ChatAgentMixin
from app.gui.workers.history_service import (
    DisplayMessage,
    HistoryDiskFull,
    HistoryService,
    display_thread,
    is_unreadable,
)
from app.gui.workers.llm_worker import (
    GenerateRequest,
    GenerationOutcome,
    LlmWorker,
    LoadedModel,
    LoadRequest,
    SessionFactory,
)

# The model paths and their backends (split out; these names are still importable from here).
from app.gui.workers.model_routing import (
    REMOTE_ROOT,
    STARTER_SHORT_LABEL,
    RemoteSessionFactory,
    RoutingSessionFactory,
    make_remote_session,
    model_label,
    model_tooltip,
    parse_remote_model,
    remote_model_path,
)

__all__ = [
    "REMOTE_ROOT",
    "STARTER_SHORT_LABEL",
    "ChatAdapter",
    "ChatState",
    "ModelState",
    "RemoteSessionFactory",
    "RetrieverFactory",
    "RoutingSessionFactory",
    "TurnContext",
    "make_remote_session",
    "model_label",
    "model_tooltip",
    "parse_remote_model",
    "remote_model_path",
]

log = logging.getLogger(__name__)
CHECKPOINT_S = 1.0
RETRY_S = 5.0
"""How often replies the disk refused are tried again while it stays full."""


class ChatState(enum.Enum):
    """What the chat is doing (gpt4all's ResponseState, STYLE.md rule 12)."""

    IDLE = "Idle"
    LOADING_MODEL = "Loading model"
    RETRIEVING = "Searching documents"
    PROCESSING_PROMPT = "Reading the prompt"
    GENERATING = "Generating"
    CANCELLING = "Stopping"


class ModelState(enum.Enum):
    """Whether a model is loaded."""

    NONE = "No model"
    LOADING = "Loading"
    LOADED = "Loaded"
    FAILED = "Failed"


@dataclass(frozen=True)
class TurnContext:
    """What a chat turn needs besides the text: system prompt, sampling, documents."""

    system: str | None
    params: Any  # engine.inference.runtime.GenerationParams
    knowledge_bases: tuple[str, ...] = ()
    tools: Any = None  # app.gui.workers.agent_turn.ToolsRequest: the turn runs the agent loop
    thinking: bool | None = None  # the template's thinking switch (None: its default)
    thinking_budget: int | None = None  # the most thinking tokens (None: no cap)


RetrieverFactory = Callable[[tuple[str, ...]], Callable[[str, Any], tuple[str | None, list[dict[str, Any]]]]]
"""``kb_names -> retrieve(query, session) -> (documents_block, sources)``; retrieve runs on the LLM thread."""


@dataclass
class _StoredText:
    """How many characters of a streaming reply its row holds (read and written on the history thread)."""

    chars: int = 0


@dataclass
class _Turn:
    request: GenerateRequest
    conversation_id: int
    reply_id: int
    started: float
    text: list[str] = field(default_factory=list)
    tokens: int = 0
    sources: list[dict[str, Any]] = field(default_factory=list)
    last_checkpoint: float = 0.0
    first_token_at: float | None = None
    stored: _StoredText = field(default_factory=_StoredText)
    save_failed: bool = False
    agent: AgentRecord = field(default_factory=AgentRecord)  # tool steps, thinking (agent_turn)


class ChatAdapter(ChatAgentMixin, QObject):
    """Fronts the LLM worker and the history for the widgets (a turn with tools: ChatAgentMixin).

    Args:
        history: the history service.
        session_factory: passed to the LlmWorker (tests inject fakes).
        retriever_factory: builds the documents retriever for a turn's knowledge bases.

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
        stats_updated(object): ``engine.inference.events.Stats`` of the last turn.
        prompt_view_updated(object): ``engine.inference.session.PromptView`` of the last prompt.
        error_occurred(str): a one-line message for the user.
        message_not_saved(str, object): the text of a message that could not be saved and the id of
            the message it was editing (or None): it goes back to the composer.
        history_unreadable(str): the history file is not SQLite or is corrupt (left untouched).
        notice_posted(str): a passing note for the status bar (a reply saved late).
        bandwidth_measured(float): the machine's memory bandwidth (GB/s).
        sources_found(object): the sources (list of dicts) the running reply is given.
        reasoning_delta(str): thinking text of the running reply (shown folded, never sent back).
        tool_step_added(object): a tool call of the running reply was handled (agent_history.step_dict).
        loop_updated(object): the running turn's timeline (generations and calls, list of dicts).
        approval_requested(object): an ``agent_turn.ApprovalRequest`` the user must answer.
        load_requested(object), generate_requested(object), unload_requested(),
        shutdown_requested(): commands to the worker (queued).
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
    history_unreadable = Signal(str)
    notice_posted = Signal(str)
    bandwidth_measured = Signal(float)
    sources_found = Signal(object)
    reasoning_delta = Signal(str)
    tool_step_added = Signal(object)
    loop_updated = Signal(object)
    approval_requested = Signal(object)

    load_requested = Signal(object)
    generate_requested = Signal(object)
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
        self.model_state = ModelState.NONE
        self.loaded: LoadedModel | None = None
        self.conversation: Any = None
        self.thread_messages: list[DisplayMessage] = []
        self.last_stats: Any = None
        self._turn: _Turn | None = None
        self._load: LoadRequest | None = None
        self._ids = itertools.count(1)
        self._closed = False
        # Replies the disk refused are tried again on this timer until the history holds them all.
        self._retry_timer = QTimer(self)
        self._retry_timer.setInterval(int(RETRY_S * 1000))
        self._retry_timer.timeout.connect(self._on_retry_timer_timeout)

        self._thread = QThread()
        self._thread.setObjectName("glassbox-llm")
        self.worker = LlmWorker(self.sessions)
        self.worker.moveToThread(self._thread)
        self.load_requested.connect(self.worker._on_load_requested)
        self.generate_requested.connect(self.worker._on_generate_requested)
        self.unload_requested.connect(self.worker._on_unload_requested)
        self.shutdown_requested.connect(self.worker._on_shutdown_requested)
        self.worker.model_loaded.connect(self._on_worker_model_loaded)
        self.worker.model_load_failed.connect(self._on_worker_model_load_failed)
        self.worker.model_unloaded.connect(self._on_worker_model_unloaded)
        self.worker.tokens_received.connect(self._on_worker_tokens_received)
        self.worker.prefill_progressed.connect(self._on_worker_prefill_progressed)
        self.worker.generation_finished.connect(self._on_worker_generation_finished)
        self.worker.generation_failed.connect(self._on_worker_generation_failed)
        self.worker.prompt_view_ready.connect(self.prompt_view_updated)
        self.worker.bandwidth_measured.connect(self.bandwidth_measured)
        self.worker.retrieval_started.connect(self._on_worker_retrieval_started)
        self.worker.sources_found.connect(self._on_worker_sources_found)
        self.worker.retrieval_failed.connect(self._on_worker_retrieval_failed)
        self.worker.reasoning_received.connect(self._on_worker_reasoning_received)
        self.worker.agent_recorded.connect(self._on_worker_agent_recorded)
        self.worker.approval_requested.connect(self._on_worker_approval_requested)
        self._thread.start()

    # ------------------------------------------------------------------ state
    def _set_state(self, state: ChatState) -> None:
        if state is not self.state:
            self.state = state
            self.state_changed.emit(state)

    def _set_model_state(self, state: ModelState, detail: str = "") -> None:
        self.model_state = state
        self.model_state_changed.emit(state, detail)

    @property
    def busy(self) -> bool:
        """True while a reply is being produced or stopped."""
        return self._turn is not None

    # ------------------------------------------------------------------ model
    def load_model(self, request: LoadRequest) -> None:
        """Loads a model on the worker (cancels a running turn first)."""
        self.stop()
        if self._load is not None:
            self._load.cancel.set()
        self._load = request
        self._set_model_state(ModelState.LOADING, request.label or request.model_path.name)
        self._set_state(ChatState.LOADING_MODEL)
        self.load_requested.emit(request)

    def current_session(self) -> ChatBackend | None:
        """The loaded model's session (local or remote), or None when no model is loaded.

        Other parts of the app (the local API server) may share it: sessions serialize their turns
        with their own lock. The LLM worker thread keeps owning (and closing) it.
        """
        if self.model_state is not ModelState.LOADED or self.loaded is None:
            return None
        return self.sessions.last_session

    def unload_model(self) -> None:
        """Closes the loaded model."""
        self.stop()
        self.unload_requested.emit()

    @Slot(object)
    def _on_worker_model_loaded(self, loaded: LoadedModel) -> None:
        if self._load is None or loaded.path != self._load.model_path:
            return  # a newer load request replaced this one
        self._load = None
        self.loaded = loaded
        self._set_model_state(ModelState.LOADED, loaded.label)
        self._set_state(ChatState.IDLE)
        self.model_loaded.emit(loaded)

    @Slot(object)
    def _on_worker_model_load_failed(self, exc: BaseException) -> None:
        from engine.errors import Cancelled

        self._load = None
        self.loaded = None
        self._set_state(ChatState.IDLE)
        if isinstance(exc, Cancelled):
            self._set_model_state(ModelState.NONE, "")
            return
        message = describe_error(exc)
        self._set_model_state(ModelState.FAILED, message)
        self.error_occurred.emit(f"Could not load the model: {message}")

    @Slot()
    def _on_worker_model_unloaded(self) -> None:
        self.loaded = None
        self._set_model_state(ModelState.NONE, "")

    # ------------------------------------------------------------------ conversations
    def refresh_conversations(self) -> None:
        """Reloads the conversation list (emits conversations_changed)."""
        self.history.call(lambda s: s.list_conversations(), self.conversations_changed.emit, self._on_history_error)

    def open_conversation(self, conversation_id: int) -> None:
        """Shows a conversation (its current branch)."""

        def load(store: Any) -> tuple[Any, list[DisplayMessage]]:
            return store.get_conversation(conversation_id), display_thread(store, conversation_id)

        self.history.call(load, self._on_history_opened, self._on_history_error)

    def new_conversation(self, system_prompt: str | None = None, settings: dict[str, Any] | None = None) -> None:
        """Creates and opens an empty conversation."""

        def create(store: Any) -> tuple[Any, list[DisplayMessage]]:
            conv = store.create_conversation(system_prompt=system_prompt, settings=settings or {})
            return conv, []

        self.history.call(create, self._after_create, self._on_history_error)

    def _after_create(self, result: tuple[Any, list[DisplayMessage]]) -> None:
        self._on_history_opened(result)
        self.refresh_conversations()

    def _on_history_opened(self, result: tuple[Any, list[DisplayMessage]]) -> None:
        conversation, messages = result
        self.conversation = conversation
        self.thread_messages = messages
        self.last_stats = _last_stats(messages)
        self.conversation_opened.emit(conversation, messages)

    def reload_thread(self) -> None:
        """Re-reads the open conversation's current branch."""
        if self.conversation is not None:
            self.open_conversation(self.conversation.id)

    def select_branch(self, message_id: int) -> None:
        """Switches the open conversation to the branch through ``message_id``."""
        if self.busy or self.conversation is None:
            return
        conv_id = self.conversation.id

        def switch(store: Any) -> tuple[Any, list[DisplayMessage]]:
            store.select_branch(message_id)
            return store.get_conversation(conv_id), display_thread(store, conv_id)

        self.history.call(switch, self._on_history_opened, self._on_history_error)

    def update_conversation(self, **changes: Any) -> None:
        """Saves per-conversation settings (system_prompt, settings, knowledge_bases)."""
        if self.conversation is None:
            return
        conv_id = self.conversation.id

        def update(store: Any) -> Any:
            store.update_conversation(conv_id, **changes)
            return store.get_conversation(conv_id)

        def done(conv: Any) -> None:
            if self.conversation is not None and self.conversation.id == conv.id:
                self.conversation = conv

        self.history.call(update, done, self._on_history_error)

    def _on_history_error(self, exc: BaseException) -> None:
        self.error_occurred.emit(f"History: {describe_error(exc)}")
        if is_unreadable(exc):
            self.history_unreadable.emit(describe_error(exc))

    # ------------------------------------------------------------------ turns
    def send(self, text: str, context: TurnContext, edit_of: int | None = None) -> bool:
        """Starts a turn: saves the user message and a pending reply, then generates.

        Args:
            text: the user's message.
            context: system prompt, sampling parameters, knowledge bases.
            edit_of: id of a user message this one replaces as a new branch (None: append).

        Returns:
            False when the turn cannot start (no model, already busy, empty text).
        """
        text = text.strip()
        if not text or self.busy or self.loaded is None:
            return False
        conv = self.conversation
        model_name = self.loaded.label
        parent: int | str | None = "leaf"
        if edit_of is not None:
            edited = next((m for m in self.thread_messages if m.id == edit_of), None)
            parent = edited.parent_id if edited is not None else "leaf"

        done: dict[str, Any] = {}  # what the save got to before a failure (written on the history thread)

        def save(store: Any) -> tuple[Any, int, list[DisplayMessage]]:
            nonlocal conv
            if conv is None:
                title = _title_from(text)
                conv = store.create_conversation(title=title)
                done["conversation"] = conv
            elif not store.thread(conv.id) and conv.title in ("New chat", ""):
                store.rename(conv.id, _title_from(text))
            store.add_message(conv.id, "user", text, parent_id=parent)
            done["user"] = True
            reply = store.add_message(conv.id, "assistant", "", state="pending", model=model_name)
            return store.get_conversation(conv.id), reply.id, display_thread(store, conv.id)

        def failed(exc: BaseException) -> None:
            self._on_send_save_failed(exc, text, edit_of, done)

        self._begin_turn_placeholder()
        size = len(text.encode("utf-8", "replace"))
        self.history.call(save, lambda r: self._start_generation(r, context), failed, size_hint=size)
        return True

    def _on_send_save_failed(self, exc: BaseException, text: str, edit_of: int | None, done: dict[str, Any]) -> None:
        """The user's message could not be saved: it goes back to the composer, never lost."""
        self._turn = None
        self._set_state(ChatState.IDLE)
        reason = describe_error(exc)
        created = done.get("conversation")
        if created is not None and self.conversation is None:
            # The chat was made before the disk refused the message: open it, so Send again uses it.
            self.conversation = created
            self.thread_messages = []
            self.conversation_opened.emit(created, [])
            self.refresh_conversations()
        if done.get("user"):
            # The question is saved; only its reply's row could not be made.
            self.reload_thread()
            self.error_occurred.emit(f"Your message is saved, but the reply could not start: {reason}")
            return
        if is_unreadable(exc):
            then = "start a new history, then press Send again"
        elif isinstance(exc, HistoryDiskFull):
            then = "free some space, then press Send again"
        else:
            then = "press Send again"
        self.message_not_saved.emit(text, edit_of)
        self.error_occurred.emit(f"Your message was not saved: {reason}. It is back in the box: {then}.")
        if is_unreadable(exc):
            self.history_unreadable.emit(reason)

    def regenerate(self, reply_id: int, context: TurnContext) -> bool:
        """Generates a new sibling of an assistant reply (the old one stays reachable)."""
        if self.busy or self.loaded is None or self.conversation is None:
            return False
        reply = next((m for m in self.thread_messages if m.id == reply_id), None)
        if reply is None or reply.role != "assistant" or reply.parent_id is None:
            return False
        conv_id = self.conversation.id
        model_name = self.loaded.label

        def save(store: Any) -> tuple[Any, int, list[DisplayMessage]]:
            new = store.add_message(
                conv_id, "assistant", "", parent_id=reply.parent_id, state="pending", model=model_name
            )
            return store.get_conversation(conv_id), new.id, display_thread(store, conv_id)

        self._begin_turn_placeholder()
        self.history.call(save, lambda r: self._start_generation(r, context), self._on_turn_save_failed)
        return True

    def _begin_turn_placeholder(self) -> None:
        # Mark busy at once so a double Enter cannot start two turns while the save is queued.
        self._turn = _Turn(GenerateRequest(0, (), "", None), -1, -1, time.perf_counter())
        self._set_state(ChatState.PROCESSING_PROMPT)

    def _on_turn_save_failed(self, exc: BaseException) -> None:
        self._turn = None
        self._set_state(ChatState.IDLE)
        self.error_occurred.emit(f"Could not save the message: {describe_error(exc)}")
        if is_unreadable(exc):
            self.history_unreadable.emit(describe_error(exc))

    def _start_generation(self, saved: tuple[Any, int, list[DisplayMessage]], context: TurnContext) -> None:
        conversation, reply_id, messages = saved
        placeholder = self._turn
        self.conversation = conversation
        self.thread_messages = messages
        self.conversation_opened.emit(conversation, messages)
        self.refresh_conversations()
        if placeholder is None:  # stopped before the save came back: keep the question, mark the reply

            def cancel(store: Any) -> list[DisplayMessage]:
                store.finish_message(reply_id, "", state="partial", stats={"finish_reason": "cancelled"})
                return display_thread(store, conversation.id)

            def shown(updated: list[DisplayMessage]) -> None:
                if self.conversation is not None and self.conversation.id == conversation.id:
                    self.thread_messages = updated
                    self.conversation_opened.emit(self.conversation, updated)

            self.history.keep(("reply", reply_id), cancel, shown, self._on_history_error)
            return
        # messages ends with [..., user, pending reply]; history is everything before the user turn.
        user_msg = messages[-2]
        history = model_history(messages[:-2])  # a reply made with tools: its calls and results too
        request = GenerateRequest(
            request_id=next(self._ids),
            history=history,
            user=user_msg.content,
            params=context.params,
            system=context.system,
            cancel=placeholder.request.cancel,
            cache_key=(str(conversation.id), str(reply_id)),  # the KV cache saved with the chat
            tools=context.tools,
            thinking=context.thinking,
            thinking_budget=context.thinking_budget,
        )
        turn = _Turn(request, conversation.id, reply_id, time.perf_counter())
        self._turn = turn
        self.reply_started.emit(reply_id)
        if request.cancel.is_set():
            self._finish_turn("cancelled", "", None)
            return
        if context.knowledge_bases and self.retriever_factory is not None:
            request = replace(request, retrieve=self.retriever_factory(context.knowledge_bases))
            turn.request = request
        self._set_state(ChatState.PROCESSING_PROMPT)
        self.generate_requested.emit(request)

    def stop(self) -> None:
        """Stops the running turn: sets its cancel event directly (STYLE.md rule 9)."""
        turn = self._turn
        if turn is None:
            return
        turn.request.cancel.set()
        if self.state is not ChatState.IDLE:
            self._set_state(ChatState.CANCELLING)
        if turn.reply_id < 0:
            self._turn = None  # the save is still queued; _start_generation sees the stop
            self._set_state(ChatState.IDLE)

    @Slot(int)
    def _on_worker_retrieval_started(self, request_id: int) -> None:
        if self._turn is not None and self._turn.request.request_id == request_id:
            self._set_state(ChatState.RETRIEVING)

    @Slot(int, object)
    def _on_worker_sources_found(self, request_id: int, sources: list[dict[str, Any]]) -> None:
        if self._turn is not None and self._turn.request.request_id == request_id:
            self._turn.sources = list(sources)
            self.sources_found.emit(list(sources))
            self._set_state(ChatState.PROCESSING_PROMPT)

    @Slot(int, object)
    def _on_worker_retrieval_failed(self, request_id: int, exc: BaseException) -> None:
        if self._turn is not None and self._turn.request.request_id == request_id:
            self.error_occurred.emit(f"Documents not used: {describe_error(exc)}")
            self._set_state(ChatState.PROCESSING_PROMPT)

    @Slot(int, int, int)
    def _on_worker_prefill_progressed(self, request_id: int, done: int, total: int) -> None:
        if self._turn is not None and self._turn.request.request_id == request_id:
            self.prefill_progressed.emit(done, total)

    @Slot(int, str, int)
    def _on_worker_tokens_received(self, request_id: int, text: str, count: int) -> None:
        turn = self._turn
        if turn is None or turn.request.request_id != request_id:
            return
        if turn.first_token_at is None:
            turn.first_token_at = time.perf_counter()
            if self.state is ChatState.PROCESSING_PROMPT:
                self._set_state(ChatState.GENERATING)
        turn.text.append(text)
        turn.tokens += count
        self.reply_delta.emit(text, count)
        now = time.perf_counter()
        if now - turn.last_checkpoint >= CHECKPOINT_S:
            turn.last_checkpoint = now
            self._checkpoint(turn)

    def _checkpoint(self, turn: _Turn) -> None:
        """Saves the reply so far. The row gets what it lacks of the text streamed until now; a
        checkpoint the disk refused is replaced by the next one (or the final save), which then
        writes what the failed one did not."""
        text, stored, reply_id = "".join(turn.text), turn.stored, turn.reply_id

        def save(store: Any) -> None:
            if len(text) > stored.chars:
                store.append_text(reply_id, text[stored.chars :])
                stored.chars = len(text)

        def failed(exc: BaseException) -> None:
            self._on_reply_save_failed(turn, exc)

        self.history.keep(("reply", reply_id), save, None, failed, size_hint=len(text))

    def _on_reply_save_failed(self, turn: _Turn, exc: BaseException) -> None:
        self._retry_timer.start()
        if turn.save_failed:
            return  # said once per reply
        turn.save_failed = True
        self.error_occurred.emit(
            f"The reply is not saved yet: {describe_error(exc)}. Glassbox keeps all of it and saves it "
            "as soon as there is space (it tries again every few seconds and when it quits)."
        )

    @Slot()
    def _on_retry_timer_timeout(self) -> None:
        self.history.retry_unsaved(self._after_retry)

    def _after_retry(self, unsaved: int) -> None:
        if not unsaved:
            self._retry_timer.stop()

    @Slot(object)
    def _on_worker_generation_finished(self, outcome: GenerationOutcome) -> None:
        turn = self._turn
        if turn is None or turn.request.request_id != outcome.request_id:
            return
        self.last_stats = outcome.stats
        self.stats_updated.emit(outcome.stats)
        turn.agent.reasoning_done = outcome.reasoning
        self._finish_turn(outcome.reason, outcome.text, outcome.stats)
        self.reply_finished.emit(outcome)

    @Slot(int, object)
    def _on_worker_generation_failed(self, request_id: int, exc: BaseException) -> None:
        turn = self._turn
        if turn is None or turn.request.request_id != request_id:
            return
        from engine.errors import EngineCrashed

        message = describe_error(exc)
        text = "".join(turn.text)
        self._finish_turn("error", text, None, error=message)
        if isinstance(exc, EngineCrashed) and not exc.will_repeat:
            self.error_occurred.emit(f"{message}. Send again to restart the model.")
        else:
            self.error_occurred.emit(message)

    def _finish_turn(self, reason: str, text: str, stats: Any, error: str | None = None) -> None:
        turn = self._turn
        assert turn is not None
        self._turn = None
        if reason == "error":
            state = "error" if not text else "partial"
        elif reason == "cancelled":
            state = "partial"
        else:
            state = "complete"
        stats_dict = stats.to_dict() if stats is not None and hasattr(stats, "to_dict") else None
        if stats_dict is not None:
            stats_dict["finish_reason"] = reason
        extra = turn.agent.stats()  # tool calls and results, the loop's timeline, the thinking
        if extra:
            stats_dict = {**(stats_dict or {}), **extra}
        reply_id, conv_id, sources = turn.reply_id, turn.conversation_id, turn.sources or None

        def save(store: Any) -> list[DisplayMessage]:
            store.finish_message(reply_id, text, state=state, stats=stats_dict, sources=sources, error=error)
            return display_thread(store, conv_id)

        def saved(messages: list[DisplayMessage]) -> None:
            if self.conversation is not None and self.conversation.id == conv_id:
                self.thread_messages = messages
                self.conversation_opened.emit(self.conversation, messages)
            if turn.save_failed:
                self.notice_posted.emit("The reply was saved.")

        def failed(exc: BaseException) -> None:
            # Show the whole reply from memory, in its final state, while the disk refuses it.
            if self.conversation is not None and self.conversation.id == conv_id:
                self.thread_messages = [
                    replace(m, content=text, state=state, stats=stats_dict, sources=sources, error=error)
                    if m.id == reply_id
                    else m
                    for m in self.thread_messages
                ]
                self.conversation_opened.emit(self.conversation, self.thread_messages)
            self._on_reply_save_failed(turn, exc)

        self.history.keep(("reply", reply_id), save, saved, failed, size_hint=len(text))
        self._set_state(ChatState.IDLE)

    # ------------------------------------------------------------------ shutdown
    def shutdown(self, deadline_s: float = 5.0) -> bool:
        """Stops work, closes the model and the worker thread; waits at most ``deadline_s``.

        Returns:
            True when everything stopped in time (else the inference child was killed).
        """
        self.stop()
        self._retry_timer.stop()  # the history tries the unsaved replies once more as it closes
        if self._load is not None:
            self._load.cancel.set()
        self.shutdown_requested.emit()
        self._thread.quit()
        clean = self._thread.wait(int(deadline_s * 1000))
        if not clean:
            self.worker.kill_for_shutdown()
            self._thread.terminate()
            self._thread.wait(1000)
        # Deliver what the worker sent before it stopped (the final text and stats), so the reply
        # is saved with them; a turn still open after that is saved as partial.
        QCoreApplication.sendPostedEvents(self, QEvent.Type.MetaCall.value)
        if self._turn is not None and self._turn.reply_id >= 0:
            self._finish_turn("cancelled", "".join(self._turn.text), None)
        self._turn = None
        self._closed = True
        self.history.close(wait=True)
        return bool(clean)

    @property
    def reply_so_far(self) -> str:
        """The streamed text of the running turn."""
        return "".join(self._turn.text) if self._turn is not None else ""

    def live_tokens(self) -> tuple[int, float, float | None]:
        """Tokens received, seconds since the turn started, and when the first token came."""
        turn = self._turn
        if turn is None:
            return 0, 0.0, None
        return turn.tokens, time.perf_counter() - turn.started, turn.first_token_at


def _title_from(text: str) -> str:
    line = " ".join(text.split())
    return (line[:48] + "…") if len(line) > 48 else line or "New chat"


def _last_stats(messages: list[DisplayMessage]) -> dict[str, Any] | None:
    for message in reversed(messages):
        if message.role == "assistant" and message.stats:
            return message.stats
    return None
