"""The chat's model: loading, unloading, what the LLM worker says about it, and what attachments
cost it."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Slot

from app.gui.tasks import describe_error
from app.gui.workers.chat_state import ChatSignals, ChatState, ModelState
from app.gui.workers.llm_requests import MediaInfoRequest
from engine.errors import Cancelled

if TYPE_CHECKING:
    from app.gui.workers.llm_requests import LoadedModel, LoadRequest
    from app.gui.workers.model_routing import RoutingSessionFactory
    from engine.inference.backends import ChatBackend
    from engine.media import Media


class ModelSlot(QObject):
    """The model the chat talks to: one load at a time; a newer request replaces an older one.

    The worker answers every load it is sent, in order, with a loaded model or a failure; the slot
    keeps the loads sent and not answered yet, so each answer is matched to its own request: the
    answer to a load that a newer one replaced (or that the user cancelled) never speaks for the
    newer one.

    Args:
        signals: the chat's signals and state (``model_state`` and ``loaded`` are this slot's).
        sessions: the backends the worker opened (the last one is the loaded model's).
        stop_turn: stops the running turn (before a load or an unload).
    """

    def __init__(self, signals: ChatSignals, sessions: RoutingSessionFactory, stop_turn: Callable[[], None]) -> None:
        super().__init__(signals)
        self._chat = signals
        self._sessions = sessions
        self._stop_turn = stop_turn
        self._media_request = 0
        self.pending: LoadRequest | None = None
        self._sent: deque[LoadRequest] = deque()  # loads the worker has not answered yet, oldest first
        self._cancelled: LoadRequest | None = None  # the load the user cancelled (said once it ends)

    def _set(self, state: ModelState, detail: str = "") -> None:
        self._chat.model_state = state
        self._chat.model_state_changed.emit(state, detail)

    def load(self, request: LoadRequest) -> None:
        """Loads a model on the worker (cancels a running turn and an older load first)."""
        chat = self._chat
        self._stop_turn()
        if self.pending is not None:
            self.pending.cancel.set()
        self.pending = request
        self._cancelled = None
        self._sent.append(request)
        self._set(ModelState.LOADING, request.label or request.model_path.name)
        chat.set_state(ChatState.LOADING_MODEL)
        chat.load_requested.emit(request)

    def unload(self) -> None:
        """Closes the loaded model."""
        self._stop_turn()
        self._chat.unload_requested.emit()

    def cancel_load(self, by_user: bool = False) -> None:
        """Cancels a load in progress (the Cancel button, ``by_user``; or at shutdown)."""
        if self.pending is not None:
            self.pending.cancel.set()
            if by_user:
                self._cancelled = self.pending

    def _answered(self) -> LoadRequest | None:
        """The load the worker's answer is for (the oldest one sent and not answered)."""
        return self._sent.popleft() if self._sent else None

    def session(self) -> ChatBackend | None:
        """The loaded model's session (local or remote), or None when no model is loaded."""
        if self._chat.model_state is not ModelState.LOADED or self._chat.loaded is None:
            return None
        return self._sessions.last_session

    @Slot(object)
    def on_loaded(self, loaded: LoadedModel) -> None:
        """The worker loaded a model (ignored when a newer request replaced it; closed again when
        the user cancelled it and it finished loading all the same)."""
        request = self._answered()
        if request is None or request is not self.pending:
            return  # a newer load replaced it: the worker closes this one before that one
        self.pending = None
        if request.cancel.is_set():
            self._chat.unload_requested.emit()
            self._end_cancelled(request)
            return
        self._chat.loaded = loaded
        self._set(ModelState.LOADED, loaded.label)
        self._chat.set_state(ChatState.IDLE)
        self._chat.model_loaded.emit(loaded)

    @Slot(object)
    def on_load_failed(self, exc: BaseException) -> None:
        """The load failed, or was cancelled (said when the user cancelled it)."""
        request = self._answered()
        if request is not None and request is not self.pending:
            return  # a newer load replaced it: that one speaks
        self.pending = None
        self._chat.loaded = None
        if isinstance(exc, Cancelled) or (request is not None and request.cancel.is_set()):
            self._end_cancelled(request)
            return
        self._chat.set_state(ChatState.IDLE)
        message = describe_error(exc)
        self._set(ModelState.FAILED, message)
        self._chat.error_occurred.emit(f"Could not load the model: {message}")

    def _end_cancelled(self, request: LoadRequest | None) -> None:
        """A load ended by Cancel: no model, and, when the user asked for it, said so."""
        self._chat.loaded = None
        self._chat.set_state(ChatState.IDLE)
        by_user = request is not None and request is self._cancelled
        self._cancelled = None
        label = (request.label or request.model_path.name) if request is not None else "the model"
        self._set(ModelState.NONE, f"Loading {label} was cancelled" if by_user else "")
        if by_user:
            self._chat.notice_posted.emit(f"Loading {label} was cancelled: no model is loaded.")

    @Slot()
    def on_unloaded(self) -> None:
        """The worker closed the model."""
        self._chat.loaded = None
        self._set(ModelState.NONE, "")

    def measure_media(self, media: tuple[Media, ...]) -> None:
        """Asks the loaded model what these attachments cost (answered by ``media_measured``)."""
        self._media_request += 1
        if not media or self._chat.loaded is None:
            self._chat.media_measured.emit([] if media == () else None)
            return
        self._chat.media_info_requested.emit(MediaInfoRequest(self._media_request, tuple(media)))

    @Slot(int, object)
    def on_media_measured(self, request_id: int, answer: object) -> None:
        """The worker's count for the attachments (an older question's answer is stale)."""
        if request_id == self._media_request:
            self._chat.media_measured.emit(answer)
