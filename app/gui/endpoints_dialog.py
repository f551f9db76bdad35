"""Remote endpoints and the local API server in the desktop app.

* :class:`AddEndpointDialog`: URL, optional name and API key; checks the server with
  ``engine.inference.remote.list_models`` on a worker and saves it with ``engine.inference.endpoints.EndpointStore``.
* :class:`RemoteIntegration`: owned by the main window. Lists the saved endpoints' models for the
  model picker (as ``app.compose.RemoteModel`` references, side by side with
  the local files), and runs ``glassbox serve`` in-process (``app.server.http.start_server``) over the
  window's loaded session while the "Local API server" setting is on.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Slot
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QVBoxLayout,
    QWidget,
)

from app.compose import RemoteModel
from app.gui.tasks import describe_error, run_in_background
from app.gui.workers.chat_adapter import ModelState

log = logging.getLogger(__name__)
ENDPOINTS_FILE = "endpoints.json"


def endpoints_file(config: Path) -> Path:
    """Where the saved endpoints live (the same file ``glassbox endpoints`` uses)."""
    return config / ENDPOINTS_FILE


def list_remote_models(store_file: Path) -> tuple[list[RemoteModel], list[str]]:
    """Every saved endpoint's models for the picker, and one line per endpoint that failed.

    Runs on a worker (it talks to the servers).
    """
    from engine.errors import EngineError
    from engine.inference.endpoints import EndpointStore
    from engine.inference.remote import list_models

    found: list[RemoteModel] = []
    problems: list[str] = []
    try:
        endpoints = EndpointStore(store_file).all()
    except EngineError as exc:
        return [], [str(exc)]
    for endpoint in endpoints:
        try:
            models = list_models(endpoint.url, endpoint.api_key)
        except EngineError as exc:
            problems.append(f"{endpoint.name}: {exc}")
            continue
        found += [RemoteModel(endpoint.name, model.id) for model in models]
    return found, problems


class AddEndpointDialog(QDialog):
    """Asks for an OpenAI-compatible server, checks that it answers, and saves it.

    Args:
        store_file: the endpoints file (``paths.config / "endpoints.json"``).
        parent: the parent widget.
    """

    def __init__(self, store_file: Path, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Add endpoint")
        self.setMinimumWidth(480)
        self.store_file = store_file
        self.saved: Any = None  # engine.inference.endpoints.Endpoint once saved
        self.model_ids: list[str] = []
        layout = QVBoxLayout(self)
        intro = QLabel("An OpenAI-compatible server: vLLM, llama.cpp's server, Ollama, LM Studio, glassbox serve…")
        intro.setWordWrap(True)
        layout.addWidget(intro)
        form = QFormLayout()
        self.url = QLineEdit()
        self.url.setPlaceholderText("http://127.0.0.1:8080")
        form.addRow("URL:", self.url)
        self.name = QLineEdit()
        self.name.setPlaceholderText("default: from the host name")
        form.addRow("Name:", self.name)
        self.api_key = QLineEdit()
        self.api_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.api_key.setPlaceholderText("optional")
        form.addRow("API key:", self.api_key)
        layout.addLayout(form)
        self.status = QLabel("")
        self.status.setObjectName("endpointStatus")
        self.status.setWordWrap(True)
        layout.addWidget(self.status)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.save_button = self.buttons.addButton("Check and save", QDialogButtonBox.ButtonRole.AcceptRole)
        self.buttons.accepted.connect(self.check_and_save)
        self.buttons.rejected.connect(self.reject)
        layout.addWidget(self.buttons)

    @Slot()
    def check_and_save(self) -> None:
        """Validates the URL, lists the server's models on a worker, then saves (or shows why not)."""
        from engine.errors import EngineError
        from engine.inference.endpoints import normalize_url

        try:
            url = normalize_url(self.url.text())
        except EngineError as exc:
            self.status.setText(str(exc))
            return
        key = self.api_key.text().strip() or None
        self.status.setText(f"Checking {url}…")
        self.save_button.setEnabled(False)

        def check() -> list[str]:
            from engine.inference.remote import list_models

            return [model.id for model in list_models(url, key)]

        run_in_background(check, lambda ids: self._save(url, key, ids), self._on_check_failed)

    def _on_check_failed(self, exc: BaseException) -> None:
        self.save_button.setEnabled(True)
        self.status.setText(describe_error(exc))

    def _save(self, url: str, key: str | None, ids: list[str]) -> None:
        from engine.errors import EngineError
        from engine.inference.endpoints import EndpointStore

        self.save_button.setEnabled(True)
        try:
            self.saved = EndpointStore(self.store_file).add(url, name=self.name.text().strip() or None, api_key=key)
        except (EngineError, OSError) as exc:
            self.status.setText(describe_error(exc))
            return
        self.model_ids = ids
        self.accept()


class _SharedKnowledge:
    """The window's KnowledgeBases, opened on first use by a server thread (never by the GUI thread)."""

    def __init__(self, adapter: Any) -> None:
        self._adapter = adapter

    def __getattr__(self, name: str) -> Any:
        return getattr(self._adapter.kbs, name)


class RemoteIntegration(QObject):
    """Remote models in the picker and the local API server, for one main window.

    Args:
        window: the ``app.gui.main_window.MainWindow`` (its paths, settings, chat adapter, picker).
    """

    def __init__(self, window: Any) -> None:
        super().__init__(window)
        self.window = window
        self.store_file = endpoints_file(window.paths.config)
        self.remote_models: list[RemoteModel] = []
        self.server: Any = None  # app.server.http.ServerHandle while serving
        self._server_backend: Any = None
        self._server_config: tuple[int, str | None] | None = None
        self._generation = 0
        self._closed = False
        self.server_status = QLabel("")
        self.server_status.setObjectName("apiServerStatus")
        window.statusBar().addPermanentWidget(self.server_status)
        window.chat.model_state_changed.connect(self._on_model_state_changed)

    # ------------------------------------------------------------------ remote models
    def refresh_models(self) -> None:
        """Lists the saved endpoints' models on a worker, then refreshes the picker."""
        run_in_background(lambda: list_remote_models(self.store_file), self._on_models_listed, self._on_list_failed)

    def _on_models_listed(self, result: tuple[list[RemoteModel], list[str]]) -> None:
        if self._closed:
            return
        self.remote_models, problems = result
        self.window.set_models(self.window.models)
        if problems:
            self.window.statusBar().showMessage("Endpoint unavailable: " + "; ".join(problems), 10000)

    def _on_list_failed(self, exc: BaseException) -> None:
        self.window.statusBar().showMessage(f"Endpoints: {describe_error(exc)}", 10000)

    def add_endpoint(self) -> AddEndpointDialog:
        """Opens the "Add endpoint" dialog (non-modal); a saved endpoint refreshes the picker."""
        dialog = AddEndpointDialog(self.store_file, self.window)
        dialog.accepted.connect(self.refresh_models)
        dialog.open()
        return dialog

    # ------------------------------------------------------------------ local API server
    def apply_server_settings(self) -> None:
        """Starts, restarts or stops the server to match the settings and the loaded model."""
        settings = self.window.settings
        backend = self.window.chat.current_session()
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

    def _start_server(self, backend: Any, config: tuple[int, str | None]) -> None:
        from app.server.http import start_server

        self._generation += 1
        generation = self._generation
        paths = self.window.paths
        knowledge = _SharedKnowledge(self.window.knowledge)
        port, key = config
        self.server_status.setText("API server: starting…")

        def start() -> Any:
            return start_server(paths, "127.0.0.1", port, key, backend=backend, knowledge=knowledge)

        def started(handle: Any) -> None:
            if self._closed or generation != self._generation:
                handle.stop()
                return
            self.server, self._server_backend, self._server_config = handle, backend, config
            self.server_status.setText(f"API server: {self.server_url}")
            self.window.statusBar().showMessage(f"Local API server at {self.server_url}", 8000)

        def failed(exc: BaseException) -> None:
            if generation != self._generation:
                return
            self.server_status.setText("API server: off")
            self.window.show_error(f"Local API server: {describe_error(exc)}")

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
            self.apply_server_settings()
        elif state is ModelState.LOADING:
            self.stop_server()  # the old session is about to be closed

    def shutdown(self) -> None:
        """Stops the server; called when the window closes."""
        self._closed = True
        self.stop_server()
