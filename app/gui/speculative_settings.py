"""The "Speculative decoding" group of the settings dialog (issue 14, section 2).

Decoding reads every weight once per token; speculative decoding proposes several tokens and the
model checks them all in one read, so each accepted token is one read saved (the output does not
change). Two ways to propose them:

* prompt lookup (``settings.speculative``): copy what follows the last few tokens where they
  appeared earlier in the prompt or the reply; free, and it pays when replies quote their context;
* a draft model per chat model (``settings.draft_models``): a smaller model of the same vocabulary,
  loaded beside it; the line under the choice says the memory it adds (``engine.fit``).

The library's entries already hold their headers, so the estimate is arithmetic on the GUI thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypedDict

from PySide6.QtWidgets import QComboBox, QFormLayout, QGroupBox, QWidget
from shiboken6 import isValid

from app.gui.display_text import plain_label, shown
from app.gui.workers.library_adapter import LibraryAdapter
from app.settings import Settings
from engine.units import format_bytes

if TYPE_CHECKING:
    from engine.library import LibraryEntry

MODES = (
    ("Prompt lookup: draft from the prompt and the reply so far", "lookup"),
    ("Off", "off"),
)


class ModelsLibrary(Protocol):
    """What the group reads of the models library (``app.gui.workers.library_adapter.LibraryAdapter``);
    its ``hardware``, ``bandwidth_gbps``, ``library_changed`` and ``scan`` are used when it has them."""

    @property
    def entries(self) -> Sequence[LibraryEntry]: ...


class SpeculativeUpdates(TypedDict):
    """The settings the group sets (``Settings.speculative``, ``Settings.draft_models``)."""

    speculative: str
    draft_models: dict[str, str]


def chat_entries(library: ModelsLibrary | None) -> list[LibraryEntry]:
    """The library's models that can chat and whose header was read (``library.entries``)."""
    return _chat_models(list(getattr(library, "entries", None) or []))


def _chat_models(entries: Sequence[LibraryEntry]) -> list[LibraryEntry]:
    return [e for e in entries if e.info is not None and e.available and e.kind == "chat" and not e.error]


class SpeculativeSettingsWidget(QGroupBox):
    """The mode for models without a draft model, and a draft model per chat model.

    Args:
        settings: the settings shown (``speculative``, ``draft_models``, ``n_ctx`` for the estimate).
        library: the models library adapter (``entries``, ``hardware``, ``bandwidth_gbps``); None: no
            chat models to choose from.
        model_path: the loaded model, chosen first in the chat-model list.
    """

    def __init__(
        self,
        settings: Settings,
        library: ModelsLibrary | None = None,
        model_path: Path | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__("Speculative decoding", parent)
        self.setObjectName("speculativeSettings")
        self._library = library
        self._n_ctx = settings.n_ctx
        self._choices = dict(settings.draft_models)
        self._entries = {str(e.path): e for e in chat_entries(library)}
        self._model_path = model_path
        self._scanning = False
        form = QFormLayout(self)
        self.mode = QComboBox()
        self.mode.setAccessibleName("Speculative decoding")
        for label, value in MODES:
            self.mode.addItem(label, value)
        self.mode.setCurrentIndex(max(self.mode.findData(settings.speculative), 0))
        self.mode.setToolTip(
            "The model checks several proposed tokens in one read of its weights; every accepted one "
            "is a read saved. The reply is the same as without it. Used when the model has no draft model."
        )
        form.addRow("Without a draft model:", self.mode)

        self.chat_model = QComboBox()
        self.chat_model.setAccessibleName("Chat model")
        self.draft = QComboBox()
        self.draft.setAccessibleName("Draft model")
        self.draft.setToolTip("A smaller model of the same vocabulary (the same family), loaded beside the chat model")
        self.memory = plain_label("")
        self.memory.setObjectName("explain")
        self.memory.setWordWrap(True)
        form.addRow("Chat model:", self.chat_model)
        form.addRow("Draft model:", self.draft)
        form.addRow(self.memory)
        self.chat_model.currentIndexChanged.connect(self._fill_drafts)
        self.draft.currentIndexChanged.connect(self._on_draft_chosen)
        self._fill_models()
        self._ask_library(library)

    def _ask_library(self, library: ModelsLibrary | None) -> None:
        """Scans the library (off the GUI thread) when it was not read yet, and probes the hardware
        for the fit estimate when it was not probed; the group fills in when they answer."""

        if not isinstance(library, LibraryAdapter):  # None, or a fixed list of entries
            return
        if not self._entries:
            self._scanning = True
            library.library_changed.connect(self._on_library_changed)
            library.scan()
            self._show_memory()
        if library.hardware is None:
            library.hardware_ready.connect(self._on_hardware_ready)
            library.probe()

    def _on_library_changed(self, entries: list[LibraryEntry]) -> None:
        if not isValid(self):
            return
        self._scanning = False
        self._entries = {str(e.path): e for e in _chat_models(entries)}
        self._fill_models()

    def _on_hardware_ready(self, _hw: object) -> None:
        if isValid(self):
            self._show_memory()

    def _fill_models(self) -> None:
        """The library's chat models, the loaded one chosen (or the one chosen before)."""
        current = self.chat_model.currentData() or (str(self._model_path) if self._model_path else None)
        self.chat_model.blockSignals(True)
        self.chat_model.clear()
        for path, entry in self._entries.items():
            self.chat_model.addItem(shown(entry.label), path)
        if current is not None:
            self.chat_model.setCurrentIndex(max(self.chat_model.findData(current), 0))
        self.chat_model.blockSignals(False)
        self._fill_drafts()

    def updates(self) -> SpeculativeUpdates:
        """The settings this group sets."""
        return {"speculative": self.mode.currentData(), "draft_models": dict(self._choices)}

    def _fill_drafts(self) -> None:
        """The draft choices for the chosen chat model: None, then the library's other chat models."""
        target = self.chat_model.currentData()
        self.draft.blockSignals(True)
        self.draft.clear()
        self.draft.addItem("None", "")
        for path, entry in self._entries.items():
            if path != target:
                self.draft.addItem(shown(entry.label), path)
        chosen = self._choices.get(target or "", "")
        if chosen and self.draft.findData(chosen) < 0:
            self.draft.addItem(f"{shown(Path(chosen).name)} (not in the library)", chosen)
        self.draft.setCurrentIndex(max(self.draft.findData(chosen), 0))
        self.draft.blockSignals(False)
        self.chat_model.setEnabled(bool(self._entries))
        self.draft.setEnabled(bool(self._entries))
        self._show_memory()

    def _on_draft_chosen(self, _index: int) -> None:
        target = self.chat_model.currentData()
        if not target:
            return
        chosen = self.draft.currentData()
        if chosen:
            self._choices[target] = chosen
        else:
            self._choices.pop(target, None)
        self._show_memory()

    def _show_memory(self) -> None:
        self.memory.setText(self.memory_text())

    def memory_text(self) -> str:
        """What the chosen draft model costs beside its chat model, and whether both fit."""
        if not self._entries and self._scanning:
            return "Reading the models library…"
        if not self._entries:
            return "No chat models in the library yet: add one on the Models page to choose a draft model for it."
        target = self._entries.get(self.chat_model.currentData() or "")
        chosen = self.draft.currentData()
        if target is None or not chosen:
            return "No draft model: this chat model uses the mode above."
        draft = self._entries.get(chosen)
        if draft is None:
            return f"{chosen} is not in the library: the model loads without it if it is missing."
        # lazy: start-up (+42 ms)
        from engine.fit import draft_model_bytes, estimate_fit

        target_info, draft_info = target.info, draft.info
        if target_info is None or draft_info is None:  # chat_entries keeps only read headers
            return "The header of a model was not read: its memory is unknown."
        n_ctx = min(self._n_ctx, target_info.context_length or self._n_ctx)
        try:
            extra = draft_model_bytes(draft_info, n_ctx)
        except (ValueError, ArithmeticError) as exc:
            return f"Memory of {draft.label} unknown: {exc}"
        text = f"{draft.label} adds {format_bytes(extra)} (weights, KV cache and buffers at {n_ctx:,} tokens)"
        hw = getattr(self._library, "hardware", None)
        if hw is not None:
            try:
                bandwidth = getattr(self._library, "bandwidth_gbps", None)
                fit = estimate_fit(target_info, hw, n_ctx, bandwidth_gbps=bandwidth, draft=draft_info)
                text += f"; with {target.label}: {fit.message}"
            except (ValueError, ArithmeticError):
                pass
        notes = []
        if draft_info.tensor_bytes >= target_info.tensor_bytes:
            notes.append("it is not smaller than the chat model, so drafting with it saves nothing")
        if draft_info.vocab_size and target_info.vocab_size and draft_info.vocab_size != target_info.vocab_size:
            notes.append(
                f"its vocabulary differs ({draft_info.vocab_size:,} tokens, the chat model has "
                f"{target_info.vocab_size:,}): the model will load without it"
            )
        return text + "." + "".join(f" Note: {n}." for n in notes)
