"""The settings dialog: a form over :class:`app.settings.Settings`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QMargins, Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QStyle,
    QVBoxLayout,
    QWidget,
)
from shiboken6 import isValid

from app.gui.display_text import plain_label
from app.gui.saved_kv_caches import SavedKvCachesWidget
from app.gui.speculative_settings import SpeculativeSettingsWidget
from app.gui.tasks import run_in_background
from app.gui.wheel_guard import guard_wheel
from app.settings import Settings
from engine.units import format_bytes

if TYPE_CHECKING:
    from app.gui.workers.library_adapter import LibraryAdapter
    from app.paths import Paths
    from engine.gguf import GgufInfo

GPU_MODES = (
    ("Automatic: as many layers as fit in free GPU memory", "auto"),
    ("All layers on the GPU", "all"),
    ("CPU only", "cpu"),
    ("A number of layers", "count"),
)


class SettingsDialog(QDialog):
    """Models folder, threads, GPU layers, context length, overflow policy, system prompt, embedder, theme.

    Args:
        settings: the settings shown.
        server_url: the local API server's address, when it runs.
        model_path: the loaded local model: the context length shows the KV cache it implies.
        kv_cache_dir: where chats' KV caches are saved (the "Saved KV caches" group can clear it).
        tools_paths: the data folders: a "Tools…" button opens Settings → Tools (app/gui/tools_settings.py).
        library: the models library adapter: its chat models are the draft-model choices
            (the "Speculative decoding" group, app/gui/speculative_settings.py).
    """

    def __init__(
        self,
        settings: Settings,
        parent: QWidget | None = None,
        server_url: str | None = None,
        model_path: Path | None = None,
        kv_cache_dir: Path | None = None,
        tools_paths: Paths | None = None,
        library: LibraryAdapter | None = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.setMinimumWidth(560)
        self._settings = settings
        # The form scrolls when the screen is shorter than it (1024x700); the buttons stay in view.
        outer = QVBoxLayout(self)
        self._scroll = QScrollArea()
        self._scroll.setWidgetResizable(True)
        self._scroll.setFrameShape(QFrame.Shape.NoFrame)
        self._scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        body = QWidget()
        layout = QVBoxLayout(body)
        layout.setContentsMargins(0, 0, 0, 0)
        self._scroll.setWidget(body)
        outer.addWidget(self._scroll, 1)
        form = QFormLayout()
        self._build_models_rows(form, settings)
        self._build_gpu_row(form, settings)
        self._build_context_row(form, settings, model_path)
        self._build_chat_rows(form, settings, tools_paths)
        layout.addLayout(form)
        layout.addWidget(self._server_section(settings, server_url))
        self.kv_caches = SavedKvCachesWidget(settings, kv_cache_dir, self)
        layout.addWidget(self.kv_caches)
        self.speculative = SpeculativeSettingsWidget(settings, library, model_path, self)
        layout.addWidget(self.speculative)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        outer.addWidget(buttons)
        guard_wheel(self)  # the wheel scrolls the form, never a value under the pointer
        self._fit_to_screen(body, buttons)

    # ------------------------------------------------------------------ layout
    def _build_models_rows(self, form: QFormLayout, settings: Settings) -> None:
        """The models folder (with Browse) and the CPU threads."""
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

    def _build_gpu_row(self, form: QFormLayout, settings: Settings) -> None:
        """GPU layers: a choice, with a number only when the user wants one (a spin box whose -2
        meant "auto" read as a bug)."""
        self.gpu_mode = QComboBox()
        self.gpu_mode.setAccessibleName("GPU layers")
        for label, value in GPU_MODES:
            self.gpu_mode.addItem(label, value)
        self.gpu_count = QSpinBox()
        self.gpu_count.setRange(1, 1000)
        self.gpu_count.setSuffix(" layers")
        self.gpu_count.setAccessibleName("Layers on the GPU")
        gpu = settings.gpu_layers
        mode = "auto" if gpu == "auto" else "all" if int(gpu) < 0 else "cpu" if int(gpu) == 0 else "count"
        self.gpu_mode.setCurrentIndex(max(self.gpu_mode.findData(mode), 0))
        self.gpu_count.setValue(int(gpu) if mode == "count" else 20)
        self.gpu_count.setEnabled(mode == "count")
        self.gpu_mode.currentIndexChanged.connect(
            lambda _i: self.gpu_count.setEnabled(self.gpu_mode.currentData() == "count")
        )
        self.gpu_mode.setToolTip("Where the model's layers run; a CPU-only build runs them all on the CPU")
        gpu_row = QHBoxLayout()
        gpu_row.addWidget(self.gpu_mode, 1)
        gpu_row.addWidget(self.gpu_count)
        form.addRow("GPU layers:", gpu_row)

    def _build_context_row(self, form: QFormLayout, settings: Settings, model_path: Path | None) -> None:
        """The context length, with the KV cache it implies for the loaded model (read off the GUI thread)."""
        self.n_ctx = QSpinBox()
        self.n_ctx.setRange(256, 1_048_576)
        self.n_ctx.setSingleStep(1024)
        self.n_ctx.setValue(settings.n_ctx)
        self.n_ctx.setSuffix(" tokens")
        self.n_ctx.setAccessibleName("Context length")
        self.kv_label = plain_label("")
        self.kv_label.setObjectName("explain")
        self.kv_label.setWordWrap(True)
        ctx_box = QVBoxLayout()
        ctx_box.setSpacing(2)
        ctx_box.addWidget(self.n_ctx)
        ctx_box.addWidget(self.kv_label)
        form.addRow("Context length:", ctx_box)
        self._gguf: GgufInfo | None = None
        self._model_name = model_path.name if model_path is not None else ""
        self.n_ctx.valueChanged.connect(self._show_kv_size)
        self._show_kv_size()
        if model_path is not None:
            self._read_model(model_path)

    def _build_chat_rows(self, form: QFormLayout, settings: Settings, tools_paths: Paths | None) -> None:
        """Overflow policy, default system prompt, embedder, theme, auto-load and the Tools button."""
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

        self.knowledge_idle = QSpinBox()
        self.knowledge_idle.setRange(0, 1440)
        self.knowledge_idle.setSuffix(" min idle")
        self.knowledge_idle.setSpecialValueText("never")
        self.knowledge_idle.setValue(round(settings.knowledge_idle_minutes))
        self.knowledge_idle.setAccessibleName("Stop the document search process after")
        self.knowledge_idle.setToolTip(
            "The documents' search (the embedding model and the index, about 600 MB) runs in a process of "
            "its own; it stops after this long unused and starts again, in a few seconds, when needed"
        )
        form.addRow("Stop document search after:", self.knowledge_idle)

        self.kept_loaded = QSpinBox()
        self.kept_loaded.setRange(1, 8)
        self.kept_loaded.setValue(settings.models_kept_loaded)
        self.kept_loaded.setAccessibleName("Models kept loaded")
        self.kept_loaded.setToolTip(
            "Local models kept loaded, the chat's included: choosing one of them again is instant. Each "
            "holds its memory; the least recently used is unloaded first, and when the next would not fit"
        )
        form.addRow("Models kept loaded:", self.kept_loaded)
        self.kept_idle = QSpinBox()
        self.kept_idle.setRange(0, 1440)
        self.kept_idle.setSuffix(" min idle")
        self.kept_idle.setSpecialValueText("never")
        self.kept_idle.setValue(round(settings.models_idle_minutes))
        self.kept_idle.setAccessibleName("Unload a kept model after")
        self.kept_idle.setToolTip("A model kept loaded beside the chat's is unloaded after this long unused")
        form.addRow("Unload a kept model after:", self.kept_idle)

        self.theme = QComboBox()
        for label, value in (("Follow the system", "system"), ("Light", "light"), ("Dark", "dark")):
            self.theme.addItem(label, value)
        self.theme.setCurrentIndex(max(self.theme.findData(settings.theme), 0))
        form.addRow("Theme:", self.theme)

        self.auto_load = QCheckBox("Load the last model when Glassbox starts")
        self.auto_load.setChecked(settings.auto_load_model)
        form.addRow(self.auto_load)
        if tools_paths is not None:
            self.tools_button = QPushButton("MCP servers, tools and the allow list…")
            self.tools_button.clicked.connect(lambda: self._open_tools(tools_paths))
            form.addRow("Tools:", self.tools_button)

    def _open_tools(self, paths: Paths) -> None:
        # lazy: start-up (+65 ms)
        from app.gui.tools_settings import ToolsSettingsDialog

        self.tools_dialog = ToolsSettingsDialog(paths, self)
        self.tools_dialog.open()

    def _fit_to_screen(self, body: QWidget, buttons: QWidget) -> None:
        """Opens as tall as the form, but never taller than the screen's available height."""
        screen = self.screen() or QGuiApplication.primaryScreen()
        layout = self.layout()
        margins = layout.contentsMargins() if layout is not None else QMargins()
        # Room for the form, the dialog's margins and the scroll bar that shows on a short screen
        # (without it the form is squeezed under the bar and its right edge is cut).
        bar = self.style().pixelMetric(QStyle.PixelMetric.PM_ScrollBarExtent)
        frame = 2 * self._scroll.frameWidth()
        width = max(body.sizeHint().width() + margins.left() + margins.right() + bar + frame + 8, self.minimumWidth())
        height = body.sizeHint().height() + buttons.sizeHint().height() + margins.top() + margins.bottom() + 16
        if screen is not None:
            available = screen.availableGeometry()
            width = min(width, available.width() - 24)
            height = min(height, available.height() - 60)  # the title bar
        self.resize(width, height)

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
        self.server_url = plain_label(f"Running at {server_url}" if server_url else "Not running")
        self.server_url.setObjectName("apiServerUrl")
        self.server_url.setTextInteractionFlags(self.server_url.textInteractionFlags() | _selectable())
        form.addRow("Status:", self.server_url)
        return box

    def _read_model(self, path: Path) -> None:
        """Reads the model's header off the GUI thread, then shows the KV size."""

        def read() -> GgufInfo:
            # lazy: start-up (+14 ms)
            from engine.gguf import read_gguf_info

            return read_gguf_info(path)

        def done(info: GgufInfo) -> None:
            if isValid(self):  # the dialog may be closed already
                self._gguf = info
                self._show_kv_size()

        def failed(exc: BaseException) -> None:
            if isValid(self):
                self.kv_label.setText(f"KV size unknown: {exc}")

        run_in_background(read, done, failed)

    def _show_kv_size(self) -> None:
        if self._gguf is None:
            self.kv_label.setText("Load a model to see the memory its KV cache needs at this length.")
            return
        # lazy: start-up (+44 ms)
        from engine.fit import kv_cache_bytes

        n_ctx = self.n_ctx.value()
        kv = kv_cache_bytes(self._gguf, n_ctx)
        self.kv_label.setText(f"KV cache at {n_ctx:,} tokens: {format_bytes(kv)} for {self._model_name}")

    def _browse_models(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Models folder", self.models_dir.text() or str(Path.home()))
        if folder:
            self.models_dir.setText(folder)

    def result_settings(self) -> Settings:
        """A new Settings with the form's values."""
        mode = self.gpu_mode.currentData()
        choices: dict[str, int | str] = {"auto": "auto", "all": -1, "cpu": 0}
        gpu: int | str = choices.get(mode, self.gpu_count.value())
        return self._settings.model_copy(
            update={
                "models_dir": Path(self.models_dir.text()).expanduser() if self.models_dir.text().strip() else None,
                "n_threads": self.threads.value() or None,
                "gpu_layers": gpu,
                "n_ctx": self.n_ctx.value(),
                "overflow_policy": self.overflow.currentData(),
                "default_system_prompt": self.system_prompt.toPlainText().strip(),
                "embedding_model": self.embedder.text().strip(),
                "knowledge_idle_minutes": float(self.knowledge_idle.value()),
                "models_kept_loaded": self.kept_loaded.value(),
                "models_idle_minutes": float(self.kept_idle.value()),
                "theme": self.theme.currentData(),
                "auto_load_model": self.auto_load.isChecked(),
                "api_server_enabled": self.server_enabled.isChecked(),
                "api_server_port": self.server_port.value(),
                "api_server_key": self.server_key.text().strip() or None,
                "kv_cache_max_gb": self.kv_caches.max_gb(),
                **self.speculative.updates(),
            }
        )


def _selectable() -> Qt.TextInteractionFlag:
    return Qt.TextInteractionFlag.TextSelectableByMouse
