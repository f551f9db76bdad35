"""The local API server of the desktop app: ``glassbox serve`` run in-process
(``app.server.http.start_server``) over the window's loaded session while the "Local API server"
setting is on, restarted when the model or the settings change, and stopped with the window.

Starting binds a port and may wait, so it runs on a background thread; the status bar's
permanent label says where it is. Every collaborator is given in the constructor.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Slot

from app.gui.display_text import plain_label
from app.gui.tasks import describe_error, run_in_background
from app.gui.workers.chat_state import ModelState

if TYPE_CHECKING:
    from PySide6.QtWidgets import QStatusBar

    from app.gui.window_services import Notices, SettingsStore
    from app.gui.workers.chat_adapter import ChatAdapter
    from app.gui.workers.knowledge_worker import KnowledgeAdapter
    from app.paths import Paths
    from app.server.http import ServerHandle
    from engine.inference.backends import ChatBackend

log = logging.getLogger(__name__)


class SharedKnowledge:
    """The window's knowledge bases as the API server uses them (``app.server.state`` and
    ``app.knowledge_glue.make_retriever``): each call goes to the window's knowledge process, from
    the server's thread, so the GUI process never opens them itself (the knowledge folder has one
    owner). The window keeps owning the process: :meth:`close` does nothing."""

    def __init__(self, adapter: KnowledgeAdapter) -> None:
        self._adapter = adapter

    def get(self, name: str) -> object:
        """The knowledge base called ``name`` (``KnowledgeBaseError`` when there is none)."""
        return self._adapter.calls.get(name)

    def searchable(self, names: Sequence[str]) -> list[str]:
        """The names that are this home's own (raises for one that cannot be searched)."""
        return self._adapter.calls.searchable(names)

    def pending(self, names: Sequence[str] | None = None) -> int:
        """How many stored chunks of ``names`` wait for their embedding."""
        return self._adapter.calls.pending(names)

    def rebuild(self, names: Sequence[str] | None = None) -> object:
        """Embeds the chunks of ``names`` still waiting (blocks the server's thread)."""
        return self._adapter.calls.rebuild(names)

    def query_many(self, names: Sequence[str], text: str, *, k: int = 5) -> list[object]:
        """The passages of ``names`` nearest ``text`` (a ``rag.knowledge.Searcher``)."""
        return list(self._adapter.calls.query_many(names, text, k=k))

    def close(self) -> None:
        """Nothing: the window owns its knowledge process."""


class ApiServerControl(QObject):
    """Starts, restarts and stops the local API server to match the settings and the loaded model.

    Args:
        settings: the window's settings (``api_server_enabled``, ``api_server_port``, ``api_server_key``).
        chat: the chat adapter (the session served; its model state restarts the server).
        knowledge: the knowledge adapter (the server answers from the same knowledge bases).
        paths: the data folders.
        status_bar: where the server's state is shown (a permanent label).
        notices: the error banner and the status bar.
        parent: the owner (the window).
    """

    def __init__(
        self,
        *,
        settings: SettingsStore,
        chat: ChatAdapter,
        knowledge: KnowledgeAdapter,
        paths: Paths,
        status_bar: QStatusBar,
        notices: Notices,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.settings = settings
        self.chat = chat
        self.knowledge = knowledge
        self.paths = paths
        self.notices = notices
        self.server: ServerHandle | None = None  # while serving
        self._server_backend: ChatBackend | None = None
        self._server_config: tuple[int, str | None] | None = None
        self._generation = 0
        self._closed = False
        self.server_status = plain_label("")
        self.server_status.setObjectName("apiServerStatus")
        status_bar.addPermanentWidget(self.server_status)
        chat.model_state_changed.connect(self._on_model_state_changed)

    def apply_settings(self) -> None:
        """Starts, restarts or stops the server to match the settings and the loaded model."""
        settings = self.settings.current
        backend = self.chat.model.session()
        if not settings.api_server_enabled:
            self.stop_server()
            self.server_status.setText("")
            return
        if backend is None:
            self.stop_server()
            self.server_status.setText("API server: waiting for a model")
            return
        config = (settings.api_server_port, settings.api_server_key or None)
        if self.server is not None and backend is self._server_backend and config == self._server_config:
            return
        self.stop_server()
        self._start_server(backend, config)

    def _start_server(self, backend: ChatBackend, config: tuple[int, str | None]) -> None:
        # lazy: start-up (+235 ms)
        from app.server.http import start_server

        self._generation += 1
        generation = self._generation
        paths = self.paths
        knowledge = SharedKnowledge(self.knowledge)
        port, key = config
        self.server_status.setText("API server: starting…")

        def start() -> ServerHandle:
            return start_server(paths, "127.0.0.1", port, key, backend=backend, knowledge=knowledge)

        def started(handle: ServerHandle) -> None:
            if self._closed or generation != self._generation:
                handle.stop()
                return
            self.server, self._server_backend, self._server_config = handle, backend, config
            self.server_status.setText(f"API server: {self.server_url}")
            self.notices.show_status(f"Local API server at {self.server_url}", 8000)

        def failed(exc: BaseException) -> None:
            if generation != self._generation:
                return
            self.server_status.setText("API server: off")
            self.notices.show_error(f"Local API server: {describe_error(exc)}")

        run_in_background(start, started, failed)

    @property
    def server_url(self) -> str | None:
        """The OpenAI base URL (``http://127.0.0.1:PORT/v1``) while serving, else None."""
        return f"{self.server.url}/v1" if self.server is not None else None

    def stop_server(self) -> None:
        """Stops the server (if running) and forgets a start still in flight."""
        self._generation += 1
        handle, self.server, self._server_backend, self._server_config = self.server, None, None, None
        if handle is not None:
            handle.stop()

    @Slot(object, str)
    def _on_model_state_changed(self, state: ModelState, _detail: str) -> None:
        if state in (ModelState.LOADED, ModelState.NONE, ModelState.FAILED):
            self.apply_settings()
        elif state is ModelState.LOADING:
            self.stop_server()  # the old session is about to be closed

    def shutdown(self) -> None:
        """Stops the server; called when the window closes."""
        self._closed = True
        self.stop_server()
