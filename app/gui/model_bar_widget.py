"""The model bar's widgets: the picker, Load/Eject and Add endpoint (:class:`ModelBarWidget`), and
the line under it that offers the open chat's own model (:class:`ChatModelOfferWidget`).

They are part of the window's first frame; what drives them (``app.gui.model_bar.ModelController``,
with its workers and requests) is built after it, so this module imports only Qt and two helpers.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from app.gui.display_text import plain_tooltip
from app.gui.window_layout import ElidedLabel


class ChatModelOfferWidget(QWidget):
    """One line under the model bar, shown while the open chat used another model than the loaded
    one: its name and Load it, or that it is no longer in the library (then no button)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(6)
        self.text = ElidedLabel("", min_chars=20)
        self.text.setObjectName("chatModelNote")
        self.text.setAccessibleName("This chat's model")
        row.addWidget(self.text, 1)
        self.load_button = QPushButton("Load it")
        self.load_button.setObjectName("chatModelLoad")
        row.addWidget(self.load_button)
        self.setVisible(False)

    def say(self, text: str, button: str | None, tooltip: str = "") -> None:
        """Shows ``text``, with a button saying ``button`` (None: no button)."""
        self.setToolTip("")
        self.text.setText(text)
        self.load_button.setVisible(button is not None)
        if button is not None:
            self.load_button.setText(button)
            self.load_button.setToolTip(plain_tooltip(tooltip))
            self.load_button.setAccessibleDescription(tooltip)
        self.setVisible(True)

    def clear(self) -> None:
        self.setVisible(False)
        self.text.setText("")
        self.setToolTip("")


class ModelBarWidget(QWidget):
    """The chat header's first row: the model picker, Load (Eject once loaded) and Add endpoint;
    under it, while needed, the open chat's own model (:class:`ChatModelOfferWidget`)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        rows = QVBoxLayout(self)
        rows.setContentsMargins(0, 0, 0, 0)
        rows.setSpacing(4)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(6)
        rows.addLayout(row)
        self.picker = QComboBox()
        self.picker.setObjectName("modelPicker")
        self.picker.setMinimumWidth(120)
        self.picker.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.picker.setMinimumContentsLength(12)
        self.picker.setToolTip("The model to chat with")
        self.picker.setAccessibleName("Model")
        self.picker.setAccessibleDescription("The model to chat with; choosing one loads it")
        self.picker.setPlaceholderText("No models yet")
        row.addWidget(self.picker, 1)
        self.resident = QLabel()  # the models kept loaded beside the chat's (hidden when none)
        self.resident.setObjectName("residentModels")
        self.resident.setVisible(False)
        row.addWidget(self.resident)
        self.load_button = QPushButton("Load")
        self.load_button.setToolTip("Load the selected model (Ctrl+L)")
        self.load_button.setAccessibleDescription(
            "Load the selected model, eject the loaded one, or cancel the load in progress"
        )
        row.addWidget(self.load_button)
        self.add_endpoint_button = QPushButton("Add endpoint…")
        self.add_endpoint_button.setToolTip("Chat with models on an OpenAI-compatible server (vLLM, Ollama, …)")
        self.add_endpoint_button.setAccessibleDescription(self.add_endpoint_button.toolTip())
        row.addWidget(self.add_endpoint_button)
        self.chat_model = ChatModelOfferWidget()
        rows.addWidget(self.chat_model)

    def changeEvent(self, event: QEvent) -> None:
        # The button says Load, Eject or Cancel: as wide as the widest, so the row never moves.
        super().changeEvent(event)
        if event.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange, QEvent.Type.PolishRequest):
            self._fit_load_button()

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        self._fit_load_button()

    def _fit_load_button(self) -> None:
        button = self.load_button
        text = button.text()
        widths = []
        for word in ("Load", "Eject", "Cancel"):
            button.setText(word)
            widths.append(button.sizeHint().width())
        button.setText(text)
        button.setMinimumWidth(max(widths))
