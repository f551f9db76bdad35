"""The "Saved KV caches" group of the settings dialog: the size cap and "Clear saved caches".

The KV cache of each chat is saved in the data folder (``paths.kv_cache``, ``engine.inference.kv_cache``) so
that reopening a long chat, even after a restart, does not prefill it again. Counting and clearing
the files run off the GUI thread (``app.gui.tasks``).
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QDoubleSpinBox, QFormLayout, QGroupBox, QHBoxLayout, QPushButton, QWidget
from shiboken6 import isValid

from app.gui.display_text import plain_label
from app.gui.tasks import run_in_background
from app.settings import Settings
from engine.units import format_bytes


class SavedKvCachesWidget(QGroupBox):
    """The cap (GiB, 0: none saved), what is saved now, and a button that removes it all.

    Args:
        settings: the settings shown (``kv_cache_max_gb``).
        folder: the saved caches' folder; None hides the usage and the button.
    """

    def __init__(self, settings: Settings, folder: Path | None, parent: QWidget | None = None) -> None:
        super().__init__("Saved KV caches", parent)
        self.folder = folder
        form = QFormLayout(self)
        self.cap = QDoubleSpinBox()
        self.cap.setRange(0.0, 100_000.0)
        self.cap.setDecimals(1)
        self.cap.setSingleStep(1.0)
        self.cap.setSuffix(" GiB")
        self.cap.setSpecialValueText("off: chats are not saved with their KV cache")
        self.cap.setValue(settings.kv_cache_max_gb)
        self.cap.setToolTip(
            "Each chat's KV cache is saved after every reply, so reopening a long chat (even after a "
            "restart) does not compute its prompt again. The least recently used go first."
        )
        form.addRow("Size cap:", self.cap)
        self.usage = plain_label("")
        self.usage.setObjectName("savedKvCachesUsage")
        self.clear_button = QPushButton("Clear saved caches")
        self.clear_button.clicked.connect(self.clear)
        row = QHBoxLayout()
        row.addWidget(self.usage, 1)
        row.addWidget(self.clear_button)
        form.addRow("Saved now:", row)
        if folder is None:
            self.usage.setText("no data folder")
            self.clear_button.setEnabled(False)
        else:
            self.refresh()

    def max_gb(self) -> float:
        return float(self.cap.value())

    def refresh(self) -> None:
        """Counts the saved caches off the GUI thread, then shows them."""
        folder = self.folder
        if folder is None:
            return
        # lazy: start-up (+16 ms)
        from engine.inference.kv_cache import KvCacheStore

        self.usage.setText("counting…")
        run_in_background(lambda: KvCacheStore(folder).usage(), self._show_usage, self._show_error)

    def clear(self) -> None:
        """Removes every saved cache off the GUI thread (the chats themselves are untouched)."""
        folder = self.folder
        if folder is None:
            return
        # lazy: start-up (+13 ms)
        from engine.inference.kv_cache import KvCacheStore

        self.clear_button.setEnabled(False)
        self.usage.setText("clearing…")

        def cleared(freed: int) -> None:
            if isValid(self):
                self.clear_button.setEnabled(True)
                self.usage.setText(f"none (cleared {format_bytes(freed)})")

        run_in_background(lambda: KvCacheStore(folder).clear(), cleared, self._show_error)

    def _show_usage(self, usage: tuple[int, int]) -> None:
        if not isValid(self):  # the dialog may be closed already
            return
        files, size = usage
        branches = f"{files} chat branch{'es' if files != 1 else ''}"
        self.usage.setText(f"{branches}, {format_bytes(size)}" if files else "none")

    def _show_error(self, exc: BaseException) -> None:
        if isValid(self):
            self.clear_button.setEnabled(True)
            self.usage.setText(f"unreadable: {exc}")
