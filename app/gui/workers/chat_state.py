"""What the chat tells the widgets: its signals and the state they read (:class:`ChatSignals`),
the enums of that state, and what a turn is asked with (:class:`TurnContext`).

The chat's parts (the model slot, the conversations, the running turn, the reply keeper, the agent
side) are given a :class:`ChatSignals` and their few collaborators, never the adapter
(:mod:`app.gui.workers.chat_adapter`), which composes them: the composition goes one way.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal

if TYPE_CHECKING:
    from pathlib import Path

    from app.gui.workers.agent_tools import ToolsRequest
    from app.gui.workers.history_reads import DisplayMessage
    from app.gui.workers.llm_requests import LoadedModel
    from engine.history_schema import Conversation
    from engine.inference.events import Stats
    from engine.inference.runtime import GenerationParams


class ChatState(enum.Enum):
    """What the chat is doing (gpt4all's ResponseState, CONTRIBUTING.md rule 12)."""

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


class ChatSignals(QObject):
    """The chat's signals, and the state the widgets read; each part sets the state it owns.

    Attributes:
        state: what the chat is doing (:class:`ChatState`; the running turn and the model slot set it).
        model_state: whether a model is loaded (the model slot's).
        loaded: the loaded model, or None (the model slot's).
        busy: a reply is being produced or stopped (the running turn's).
        conversation: the open conversation, or None (the conversations').
        thread_messages: its current branch, as the transcript shows it.
        last_stats: the stats of its last reply that has some, or of the last turn.

    Signals:
        state_changed(object): the new :class:`ChatState`.
        model_state_changed(object, str): :class:`ModelState` and a one-line detail.
        model_loaded(object): the ``LoadedModel``.
        conversations_changed(object): list of ``engine.history.Conversation``.
        conversation_opened(object, object): the Conversation and its thread (list of DisplayMessage).
        conversation_updated(object): the open Conversation, its settings saved anew.
        reply_started(int): id of the pending reply message.
        reply_delta(str, int): text delta, number of tokens in it.
        prefill_progressed(int, int): tokens evaluated, total.
        reply_finished(object): the ``GenerationOutcome``.
        stats_updated(object): the last turn's ``engine.inference.events.Stats`` as a dict, with its ``finish_reason``.
        prompt_view_updated(object): ``engine.inference.session.PromptView`` of the last prompt.
        error_occurred(str): a one-line message for the user.
        message_not_saved(str, object): the text of a message that could not be saved and the id of
            the message it was editing (or None): it goes back to the composer.
        media_not_saved(object): the attachments of a message that could not be saved (a tuple of
            ``engine.media.Media``): they go back to the composer.
        media_measured(object): each attachment's cost for the loaded model: a list of
            ``MediaInfo``, None (a server counts them itself) or the exception (it cannot see them).
        history_unreadable(str): the history file is not SQLite or is corrupt (left untouched).
        notice_posted(str): a passing note for the status bar (a reply saved late, passages left out).
        bandwidth_measured(float): the machine's memory bandwidth (GB/s).
        resident_models_changed(object): the models kept loaded beside the chat's (a
            ``resident_models.ResidentState``; Settings' ``models_kept_loaded``).
        sources_found(object): the sources (list of dicts) of the passages retrieved for the reply.
        reasoning_delta(str): thinking text of the running reply (shown folded, never sent back).
        tool_step_added(object): a tool call of the running reply was handled (agent_history.step_dict).
        loop_updated(object): the running turn's timeline (generations and calls, list of dicts).
        approval_requested(object): an ``agent_turn.ApprovalRequest`` the user must answer.
        call_progressed(int): the tokens of the tool call the model is writing (0: it is not now).
        comparison_changed(bool): a comparison with the base model started (True) or ended.
        comparison_finished(object): its ``llm_requests.CompareOutcome`` (the comparison None
            when it was stopped).
        load_requested(object), generate_requested(object), unload_requested(),
        shutdown_requested(), media_info_requested(object), compare_requested(object): commands
            to the worker (queued).
    """

    state_changed = Signal(object)
    model_state_changed = Signal(object, str)
    model_loaded = Signal(object)
    conversations_changed = Signal(object)
    conversation_opened = Signal(object, object)
    conversation_updated = Signal(object)
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
    resident_models_changed = Signal(object)
    sources_found = Signal(object)
    reasoning_delta = Signal(str)
    tool_step_added = Signal(object)
    loop_updated = Signal(object)
    approval_requested = Signal(object)
    call_progressed = Signal(int)
    comparison_changed = Signal(bool)
    comparison_finished = Signal(object)

    load_requested = Signal(object)
    generate_requested = Signal(object)
    media_info_requested = Signal(object)
    unload_requested = Signal()
    shutdown_requested = Signal()
    compare_requested = Signal(object)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.state = ChatState.IDLE
        self.model_state = ModelState.NONE
        self.loaded: LoadedModel | None = None
        self.busy = False
        self.conversation: Conversation | None = None
        self.thread_messages: list[DisplayMessage] = []
        self.last_stats: Stats | dict[str, Any] | None = None

    def set_state(self, state: ChatState) -> None:
        """Moves to ``state`` (``state_changed`` when it changes)."""
        if state is not self.state:
            self.state = state
            self.state_changed.emit(state)


@dataclass(frozen=True)
class TurnContext:
    """What a chat turn needs besides the text.

    Attributes:
        system: the system prompt.
        params: the sampling parameters.
        knowledge_bases: the knowledge bases whose passages the turn is given.
        tools: set when the turn runs the agent loop.
        thinking: the template's thinking switch (None: its default).
        thinking_budget: the most thinking tokens (None: no cap).
        adapters: the chat's LoRA adapters, ``(file, scale)`` each (the chat settings' own).
    """

    system: str | None
    params: GenerationParams
    knowledge_bases: tuple[str, ...] = ()
    tools: ToolsRequest | None = None
    thinking: bool | None = None
    thinking_budget: int | None = None
    adapters: tuple[tuple[Path, float], ...] = ()
