"""Per-conversation settings: the system prompt and the sampling preset."""

from __future__ import annotations

from typing import Any

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QPlainTextEdit,
    QVBoxLayout,
    QWidget,
)

from app.settings import Settings


class ConversationSettingsDialog(QDialog):
    """Edits one chat's system prompt (or "use the default") and sampling preset.

    Args:
        settings: the app settings (default prompt, presets).
        conversation: the open ``engine.history.Conversation`` (None: applies to a new chat).
    """

    def __init__(self, settings: Settings, conversation: Any, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Chat settings")
        self.setMinimumWidth(520)
        layout = QVBoxLayout(self)
        form = QFormLayout()
        system = getattr(conversation, "system_prompt", None)
        self.use_default = QCheckBox("Use the default system prompt from Settings")
        self.use_default.setChecked(system is None)
        self.prompt = QPlainTextEdit(system if system is not None else settings.default_system_prompt)
        self.prompt.setObjectName("systemPromptEdit")
        self.prompt.setEnabled(system is not None)
        self.use_default.toggled.connect(lambda on: self.prompt.setEnabled(not on))
        form.addRow(self.use_default)
        form.addRow("System prompt:", self.prompt)
        self.preset = QComboBox()
        for preset in settings.presets:
            self.preset.addItem(
                f"{preset.name}  (temperature {preset.temperature:g}, top-p {preset.top_p:g}, "
                f"max {preset.max_tokens} tokens)",
                preset.name,
            )
        current = dict(getattr(conversation, "settings", None) or {}).get("preset") or settings.default_preset
        index = self.preset.findData(current)
        self.preset.setCurrentIndex(max(index, 0))
        form.addRow("Sampling preset:", self.preset)
        layout.addLayout(form)
        note = QLabel("The system prompt is pinned: it is never evicted from the context window.")
        note.setObjectName("explain")
        layout.addWidget(note)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)

    def values(self) -> tuple[str | None, str]:
        """The system prompt (None: use the default) and the preset name."""
        system = None if self.use_default.isChecked() else self.prompt.toPlainText().strip()
        return system, str(self.preset.currentData())
