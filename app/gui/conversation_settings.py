"""Per-conversation settings: the system prompt, the sampling (a preset as the starting point,
then temperature, top-p, top-k, min-p, repeat penalty, max tokens and seed of this chat's own) and
a LoRA adapter with its scale (set on the loaded model before each turn, without a reload)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSlider,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.gui.display_text import plain_label, shown
from app.gui.wheel_guard import guard_wheel
from app.settings import SamplingPreset, Settings

if TYPE_CHECKING:
    from engine.history_schema import Conversation

SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "max_tokens", "seed")
SCALE_STEPS = 100  # the scale slider's steps per 1.0 (it runs from 0 to 2)


def conversation_adapters(conversation_settings: Mapping[str, object] | None) -> tuple[tuple[Path, float], ...]:
    """A chat's LoRA adapters, ``(file, scale)`` each, from its settings (``"adapters"``: a list of
    ``{"path", "scale"}``); entries that are not of that shape are left out."""
    raw = dict(conversation_settings or {}).get("adapters")
    out: list[tuple[Path, float]] = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, dict):
            continue
        path, scale = item.get("path"), item.get("scale", 1.0)
        if isinstance(path, str) and path and isinstance(scale, (int, float)) and not isinstance(scale, bool):
            out.append((Path(path), float(scale)))
    return tuple(out)


def conversation_sampling(settings: Settings, conversation_settings: Mapping[str, object] | None) -> SamplingPreset:
    """The sampling a chat uses: its preset with its own values on top."""
    conv = dict(conversation_settings or {})
    preset = conv.get("preset")
    return settings.preset(preset if isinstance(preset, str) else None).with_overrides(conv.get("sampling"))


class ConversationSettingsDialog(QDialog):
    """Edits one chat's system prompt (or "use the default") and its sampling.

    Choosing a preset fills the controls with its values; changing a control makes it this chat's
    own value (saved with the chat, on top of the preset).

    Args:
        settings: the app settings (default prompt, presets).
        conversation: the open ``engine.history.Conversation`` (None: applies to a new chat).
    """

    def __init__(self, settings: Settings, conversation: Conversation | None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Chat settings")
        self.setMinimumWidth(480)
        self._settings = settings
        layout = QVBoxLayout(self)
        form = QFormLayout()
        system = getattr(conversation, "system_prompt", None)
        self.use_default = QCheckBox("Use the default system prompt from Settings")
        self.use_default.setChecked(system is None)
        self.prompt = QPlainTextEdit(system if system is not None else settings.default_system_prompt)
        self.prompt.setObjectName("systemPromptEdit")
        self.prompt.setAccessibleName("System prompt")
        self.prompt.setEnabled(system is not None)
        self.use_default.toggled.connect(lambda on: self.prompt.setEnabled(not on))
        form.addRow(self.use_default)
        form.addRow("System prompt:", self.prompt)
        layout.addLayout(form)
        note = plain_label("The system prompt is pinned: it is never evicted from the context window.")
        note.setObjectName("explain")
        note.setWordWrap(True)
        layout.addWidget(note)

        conv_settings = dict(getattr(conversation, "settings", None) or {})
        box = QGroupBox("Sampling")
        sampling = QFormLayout(box)
        self.preset = QComboBox()
        self.preset.setAccessibleName("Sampling preset")
        for preset in settings.presets:
            self.preset.addItem(shown(preset.name), preset.name)
        current = conv_settings.get("preset") or settings.default_preset
        self.preset.setCurrentIndex(max(self.preset.findData(current), 0))
        sampling.addRow("Start from preset:", self.preset)
        self.temperature = _double(0.0, 5.0, 0.05, 2, "0 is greedy: always the most likely token")
        sampling.addRow("Temperature:", self.temperature)
        self.top_p = _double(0.01, 1.0, 0.01, 2, "Sample from the smallest set of tokens whose chances add up to this")
        sampling.addRow("Top-p:", self.top_p)
        self.top_k = _int(0, 1000, "Sample from the k most likely tokens (0: no limit)")
        sampling.addRow("Top-k:", self.top_k)
        self.min_p = _double(0.0, 1.0, 0.01, 2, "Drop tokens less likely than this share of the most likely one")
        sampling.addRow("Min-p:", self.min_p)
        self.repeat_penalty = _double(0.5, 2.0, 0.05, 2, "Above 1 makes repeating recent tokens less likely")
        sampling.addRow("Repeat penalty:", self.repeat_penalty)
        self.max_tokens = _int(1, 32768, "The longest a reply may be, in tokens")
        self.max_tokens.setSingleStep(64)
        sampling.addRow("Max tokens:", self.max_tokens)
        self.seed = _int(-1, 2**31 - 1, "A fixed seed makes a reply repeatable; random gives a new one each time")
        self.seed.setSpecialValueText("random")
        sampling.addRow("Seed:", self.seed)
        layout.addWidget(box)
        layout.addWidget(self._adapter_box(conversation_adapters(conv_settings)))
        self._fill(conversation_sampling(settings, conv_settings))
        self.preset.currentIndexChanged.connect(self._on_preset_current_index_changed)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        guard_wheel(self)

    def _adapter_box(self, adapters: tuple[tuple[Path, float], ...]) -> QGroupBox:
        box = QGroupBox("LoRA adapter")
        form = QFormLayout(box)
        row = QHBoxLayout()
        self.adapter_path = QLineEdit(str(adapters[0][0]) if adapters else "")
        self.adapter_path.setPlaceholderText("none: the base model")
        self.adapter_path.setAccessibleName("LoRA adapter file")
        row.addWidget(self.adapter_path, 1)
        browse = QPushButton("Choose…")
        browse.clicked.connect(self._choose_adapter)
        row.addWidget(browse)
        form.addRow("Adapter:", row)
        scale_row = QHBoxLayout()
        self.adapter_scale = QSlider(Qt.Orientation.Horizontal)
        self.adapter_scale.setRange(0, 2 * SCALE_STEPS)
        self.adapter_scale.setValue(round((adapters[0][1] if adapters else 1.0) * SCALE_STEPS))
        self.adapter_scale.setAccessibleName("LoRA adapter scale")
        self.scale_text = QLabel()
        self.adapter_scale.valueChanged.connect(self._show_scale)
        self._show_scale(self.adapter_scale.value())
        scale_row.addWidget(self.adapter_scale, 1)
        scale_row.addWidget(self.scale_text)
        form.addRow("Scale:", scale_row)
        note = plain_label(
            "Set on the loaded model before this chat's next reply, without reloading it; a change "
            "makes the model read the chat again (the inspector says how much)."
        )
        note.setObjectName("explain")
        note.setWordWrap(True)
        form.addRow(note)
        return box

    def _show_scale(self, value: int) -> None:
        self.scale_text.setText(f"{value / SCALE_STEPS:.2f}")

    def _choose_adapter(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "LoRA adapter", self.adapter_path.text(), "GGUF (*.gguf)")
        if path:
            self.adapter_path.setText(path)

    def adapters(self) -> list[dict[str, object]]:
        """The chat's adapters as its settings keep them (empty: the base model)."""
        path = self.adapter_path.text().strip()
        if not path:
            return []
        return [{"path": str(Path(path).expanduser()), "scale": self.adapter_scale.value() / SCALE_STEPS}]

    def _fill(self, preset: SamplingPreset) -> None:
        self.temperature.setValue(preset.temperature)
        self.top_p.setValue(preset.top_p)
        self.top_k.setValue(preset.top_k)
        self.min_p.setValue(preset.min_p)
        self.repeat_penalty.setValue(preset.repeat_penalty)
        self.max_tokens.setValue(preset.max_tokens)
        self.seed.setValue(-1 if preset.seed is None else preset.seed)

    def _on_preset_current_index_changed(self, _index: int) -> None:
        self._fill(self._settings.preset(str(self.preset.currentData())))

    def sampling(self) -> dict[str, float | int | None]:
        """The controls' values that differ from the chosen preset (the chat's own values)."""
        base = self._settings.preset(str(self.preset.currentData()))
        values: dict[str, float | int | None] = {
            "temperature": round(self.temperature.value(), 4),
            "top_p": round(self.top_p.value(), 4),
            "top_k": self.top_k.value(),
            "min_p": round(self.min_p.value(), 4),
            "repeat_penalty": round(self.repeat_penalty.value(), 4),
            "max_tokens": self.max_tokens.value(),
            "seed": None if self.seed.value() < 0 else self.seed.value(),
        }
        return {k: v for k, v in values.items() if getattr(base, k) != v}

    def values(self) -> tuple[str | None, str]:
        """The system prompt (None: use the default) and the preset name."""
        system = None if self.use_default.isChecked() else self.prompt.toPlainText().strip()
        return system, str(self.preset.currentData())


def _double(low: float, high: float, step: float, decimals: int, tip: str) -> QDoubleSpinBox:
    box = QDoubleSpinBox()
    box.setRange(low, high)
    box.setSingleStep(step)
    box.setDecimals(decimals)
    box.setToolTip(tip)
    box.setAccessibleDescription(tip)
    return box


def _int(low: int, high: int, tip: str) -> QSpinBox:
    box = QSpinBox()
    box.setRange(low, high)
    box.setToolTip(tip)
    box.setAccessibleDescription(tip)
    return box
