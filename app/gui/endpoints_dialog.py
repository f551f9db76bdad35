"""Remote endpoints in the desktop app.

* :class:`AddEndpointDialog`: URL, optional name and API key; checks the server with
  ``engine.inference.remote.list_models`` on a worker and saves it with ``engine.inference.endpoints.EndpointStore``.
* :func:`list_remote_models`: the saved endpoints' models for the model picker (as
  ``app.compose.RemoteModel`` references), listed by ``app.gui.model_bar.ModelController`` beside
  the local files.

The local API server the app can run is ``app.gui.api_server_control``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from PySide6.QtCore import Slot
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLineEdit,
    QVBoxLayout,
    QWidget,
)

from app.compose import RemoteModel
from app.gui.display_text import plain_label
from app.gui.tasks import describe_error, run_in_background
from engine.errors import EngineError

log = logging.getLogger(__name__)


def list_remote_models(store_file: Path) -> tuple[list[RemoteModel], list[str]]:
    """Every saved endpoint's models for the picker, and one line per endpoint that failed.

    Runs on a worker (it talks to the servers).
    """
    # lazy: start-up (+370 ms: rich, httpx)
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
        store_file: the endpoints file (``paths.endpoints_file``).
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
        intro = plain_label("An OpenAI-compatible server: vLLM, llama.cpp's server, Ollama, LM Studio, glassbox serve…")
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
        self.status = plain_label("")
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
        # lazy: start-up (+5 ms)
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
            # lazy: start-up (+358 ms: rich, httpx)
            from engine.inference.remote import list_models

            return [model.id for model in list_models(url, key)]

        run_in_background(check, lambda ids: self._save(url, key, ids), self._on_check_failed)

    def _on_check_failed(self, exc: BaseException) -> None:
        self.save_button.setEnabled(True)
        self.status.setText(describe_error(exc))

    def _save(self, url: str, key: str | None, ids: list[str]) -> None:
        # lazy: start-up (+6 ms)
        from engine.inference.endpoints import EndpointStore

        self.save_button.setEnabled(True)
        try:
            self.saved = EndpointStore(self.store_file).add(url, name=self.name.text().strip() or None, api_key=key)
        except (EngineError, OSError) as exc:
            self.status.setText(describe_error(exc))
            return
        self.model_ids = ids
        self.accept()
