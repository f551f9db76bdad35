"""The chat adapter's model: loading, unloading, and what the LLM worker says about it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Slot

from app.gui.tasks import describe_error
from app.gui.workers.chat_state import ChatState, ModelState

if TYPE_CHECKING:
    from app.gui.workers.chat_adapter import ChatAdapter
    from app.gui.workers.llm_requests import LoadedModel, LoadRequest
    from engine.inference.backends import ChatBackend


class ModelSlot(QObject):
    """The model the chat talks to: one load at a time; a newer request replaces an older one.

    Args:
        chat: the adapter (its worker commands, state and signals).
    """

    def __init__(self, chat: ChatAdapter) -> None:
        super().__init__(chat)
        self._chat = chat
        self.state = ModelState.NONE
        self.loaded: LoadedModel | None = None
        self.pending: LoadRequest | None = None

    def _set(self, state: ModelState, detail: str = "") -> None:
        self.state = state
        self._chat.model_state_changed.emit(state, detail)

    def load(self, request: LoadRequest) -> None:
        """Loads a model on the worker (cancels a running turn and an older load first)."""
        chat = self._chat
        chat.stop()
        if self.pending is not None:
            self.pending.cancel.set()
        self.pending = request
        self._set(ModelState.LOADING, request.label or request.model_path.name)
        chat.set_state(ChatState.LOADING_MODEL)
        chat.load_requested.emit(request)

    def unload(self) -> None:
        """Closes the loaded model."""
        self._chat.stop()
        self._chat.unload_requested.emit()

    def cancel_load(self) -> None:
        """Cancels a load in progress (at shutdown)."""
        if self.pending is not None:
            self.pending.cancel.set()

    def session(self) -> ChatBackend | None:
        """The loaded model's session (local or remote), or None when no model is loaded."""
        if self.state is not ModelState.LOADED or self.loaded is None:
            return None
        return self._chat.sessions.last_session

    @Slot(object)
    def on_loaded(self, loaded: LoadedModel) -> None:
        """The worker loaded a model (ignored when a newer request replaced it)."""
        if self.pending is None or loaded.path != self.pending.model_path:
            return
        self.pending = None
        self.loaded = loaded
        self._set(ModelState.LOADED, loaded.label)
        self._chat.set_state(ChatState.IDLE)
        self._chat.model_loaded.emit(loaded)

    @Slot(object)
    def on_load_failed(self, exc: BaseException) -> None:
        """The load failed (or was cancelled: then no message)."""
        from engine.errors import Cancelled

        self.pending = None
        self.loaded = None
        self._chat.set_state(ChatState.IDLE)
        if isinstance(exc, Cancelled):
            self._set(ModelState.NONE, "")
            return
        message = describe_error(exc)
        self._set(ModelState.FAILED, message)
        self._chat.error_occurred.emit(f"Could not load the model: {message}")

    @Slot()
    def on_unloaded(self) -> None:
        """The worker closed the model."""
        self.loaded = None
        self._set(ModelState.NONE, "")
