"""The settings dialog: a form over :class:`app.settings.Settings`."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.settings import Settings


class SettingsDialog(QDialog):
    """Models folder, threads, GPU layers, context length, overflow policy, system prompt, embedder, theme."""

    def __init__(self, settings: Settings, parent: QWidget | None = None, server_url: str | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.setMinimumWidth(560)
        self._settings = settings
        layout = QVBoxLayout(self)
        form = QFormLayout()

        self.models_dir = QLineEdit(str(settings.models_dir) if settings.models_dir else "")
        self.models_dir.setPlaceholderText("default: the data folder's models/")
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse_models)
        row = QHBoxLayout()
        row.addWidget(self.models_dir, 1)
        row.addWidget(browse)
        form.addRow("Models folder:", row)

        self.threads = QSpinBox()
        self.threads.setRange(0, 512)
        self.threads.setSpecialValueText("automatic")
        self.threads.setValue(settings.n_threads or 0)
        form.addRow("CPU threads:", self.threads)

        self.gpu_layers = QSpinBox()
        self.gpu_layers.setRange(-2, 1000)
        self.gpu_layers.setSpecialValueText("auto (fit to free VRAM)")
        self.gpu_layers.setValue(-2 if settings.gpu_layers == "auto" else int(settings.gpu_layers))
        self.gpu_layers.setToolTip("auto: as many layers as fit; -1: all; 0: CPU only")
        form.addRow("GPU layers:", self.gpu_layers)

        self.n_ctx = QSpinBox()
        self.n_ctx.setRange(256, 1_048_576)
        self.n_ctx.setSingleStep(1024)
        self.n_ctx.setValue(settings.n_ctx)
        self.n_ctx.setSuffix(" tokens")
        form.addRow("Context length:", self.n_ctx)

        self.overflow = QComboBox()
        self.overflow.addItem("Rolling window: drop the oldest turns (marked in the chat)", "rolling")
        self.overflow.addItem("Refuse: stop and say the chat is too long", "refuse")
        self.overflow.setCurrentIndex(max(self.overflow.findData(settings.overflow_policy), 0))
        form.addRow("When the chat is too long:", self.overflow)

        self.system_prompt = QPlainTextEdit(settings.default_system_prompt)
        self.system_prompt.setFixedHeight(80)
        form.addRow("Default system prompt:", self.system_prompt)

        self.embedder = QLineEdit(settings.embedding_model)
        self.embedder.setPlaceholderText("default: the bundled all-MiniLM-L6-v2")
        form.addRow("Embedding model folder:", self.embedder)

        self.theme = QComboBox()
        for label, value in (("Follow the system", "system"), ("Light", "light"), ("Dark", "dark")):
            self.theme.addItem(label, value)
        self.theme.setCurrentIndex(max(self.theme.findData(settings.theme), 0))
        form.addRow("Theme:", self.theme)

        self.auto_load = QCheckBox("Load the last model when Glassbox starts")
        self.auto_load.setChecked(settings.auto_load_model)
        form.addRow(self.auto_load)
        layout.addLayout(form)
        layout.addWidget(self._server_section(settings, server_url))
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)

    def _server_section(self, settings: Settings, server_url: str | None) -> QGroupBox:
        box = QGroupBox("Local API server")
        form = QFormLayout(box)
        self.server_enabled = QCheckBox("Serve the loaded model as an OpenAI-compatible API on this computer")
        self.server_enabled.setChecked(settings.api_server_enabled)
        form.addRow(self.server_enabled)
        self.server_port = QSpinBox()
        self.server_port.setRange(0, 65535)
        self.server_port.setSpecialValueText("any free port")
        self.server_port.setValue(settings.api_server_port)
        form.addRow("Port:", self.server_port)
        self.server_key = QLineEdit(settings.api_server_key or "")
        self.server_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.server_key.setPlaceholderText("optional: clients must send it as a Bearer token")
        form.addRow("API key:", self.server_key)
        self.server_url = QLabel(f"Running at {server_url}" if server_url else "Not running")
        self.server_url.setObjectName("apiServerUrl")
        self.server_url.setTextInteractionFlags(self.server_url.textInteractionFlags() | _selectable())
        form.addRow("Status:", self.server_url)
        return box

    def _browse_models(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Models folder", self.models_dir.text() or str(Path.home()))
        if folder:
            self.models_dir.setText(folder)

    def result_settings(self) -> Settings:
        """A new Settings with the form's values."""
        gpu = self.gpu_layers.value()
        return self._settings.model_copy(
            update={
                "models_dir": Path(self.models_dir.text()).expanduser() if self.models_dir.text().strip() else None,
                "n_threads": self.threads.value() or None,
                "gpu_layers": "auto" if gpu == -2 else gpu,
                "n_ctx": self.n_ctx.value(),
                "overflow_policy": self.overflow.currentData(),
                "default_system_prompt": self.system_prompt.toPlainText().strip(),
                "embedding_model": self.embedder.text().strip(),
                "theme": self.theme.currentData(),
                "auto_load_model": self.auto_load.isChecked(),
                "api_server_enabled": self.server_enabled.isChecked(),
                "api_server_port": self.server_port.value(),
                "api_server_key": self.server_key.text().strip() or None,
            }
        )


def _selectable() -> Qt.TextInteractionFlag:
    return Qt.TextInteractionFlag.TextSelectableByMouse
