"""The Models page: the local library (fit badges, load, delete, quantize, quality, a vision model's
projector, folders) and Discover (:mod:`app.gui.discover_panel`: suggestions, Hub search, a repo's
files, the download queue).

The library keeps its selection by model identity (the file's path), not by row: a rescan after a
quantization, a conversion or a download highlights the same model, and Load, Quantize and Check
quality act on it. Entries that cannot chat (embedders, vision projectors, unreadable files) are
marked, and Load on one says why instead of doing nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QEvent, Qt, Signal, Slot
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QMenu,
    QPushButton,
    QTableWidget,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.gui.discover_panel import (
    DiscoverWidget,
)
from app.gui.display_text import confirm, inform, plain_label, plain_tooltip, shown
from app.gui.quantize_dialog import QualityDialog, QuantizeDialog
from app.gui.quantize_dialog import table_item as _item
from app.gui.quantize_dialog import verdict_item as _verdict_item
from app.gui.workers.model_routing import model_label, model_tooltip
from app.gui.workers.models_worker import ModelsAdapter
from engine.units import format_bytes

if TYPE_CHECKING:
    from app.model_folders import OtherAppFolder
    from engine.library import LibraryEntry

__all__ = ["ModelPanel", "format_params"]
PATH_ROLE = Qt.ItemDataRole.UserRole
KIND_TEXT = {"embedding": "embedder", "projector": "vision projector", "adapter": "LoRA adapter"}


def format_params(n: int | None) -> str:
    if not n:
        return "—"
    return f"{n / 1e9:.1f} B" if n >= 1e9 else f"{n / 1e6:.0f} M"


class ModelPanel(QWidget):
    """The Models page.

    Signals:
        load_requested(object): a model Path to load.
        unload_requested(): eject the loaded model.
    """

    load_requested = Signal(object)
    unload_requested = Signal()

    def __init__(self, adapter: ModelsAdapter, n_ctx: int, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.adapter = adapter
        self.n_ctx = n_ctx
        self.loaded_path: Path | None = None
        self._started = False
        self._rows: list[LibraryEntry] = []  # the entry shown in each row of the library table
        self._selected_path: Path | None = None  # the model the user picked, kept across rescans
        self._offered: list[OtherAppFolder] = []  # other apps' model folders on offer
        self.dialog: QDialog | None = None  # the Quantize / Check quality / Convert dialog open now
        layout = QVBoxLayout(self)
        layout.setContentsMargins(18, 14, 18, 14)
        self.tabs = QTabWidget()
        layout.addWidget(self.tabs)
        self.tabs.addTab(self._build_library(), "Library")
        self.discover = DiscoverWidget(adapter)
        self.tabs.addTab(self.discover, "Discover")
        # The Discover widgets, by their old names (tests and screenshots reach them here).
        d = self.discover
        self.search, self.search_button, self.results, self.files = d.search, d.search_button, d.results, d.files
        self.download_button, self.queue, self.repo_label = d.download_button, d.queue, d.repo_label
        adapter.library.library_changed.connect(self._on_adapter_library_changed)
        adapter.library.hardware_ready.connect(self._on_adapter_hardware_ready)
        adapter.library.other_folders_found.connect(self._on_adapter_other_folders_found)

    def changeEvent(self, event: QEvent) -> None:
        # Another theme: the verdicts' colours are set in code, so the rows are filled again.
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange and self._rows:
            self._on_adapter_library_changed(self.adapter.library.entries)

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if not self._started:
            self._started = True
            self.adapter.library.probe()
            self.adapter.library.scan()
            self.adapter.downloads.find_unfinished()
            self.adapter.library.find_other_apps()

    # ------------------------------------------------------------------ library
    def _build_library(self) -> QWidget:
        page = QWidget()
        lay = QVBoxLayout(page)
        self.hardware_label = plain_label("")
        self.hardware_label.setObjectName("explain")
        lay.addWidget(self.hardware_label)
        lay.addWidget(self._build_offer_bar())
        self.library = QTableWidget(0, 7)
        self.library.setObjectName("libraryTable")
        self.library.setHorizontalHeaderLabels(
            ["Model", "Architecture", "Parameters", "Quant", "Size", "Context", "Fit on this machine"]
        )
        self.library.verticalHeader().setVisible(False)
        self.library.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.library.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.library.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.library.setAlternatingRowColors(True)
        self.library.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.library.doubleClicked.connect(lambda _i: self._on_load_clicked())
        self.library.itemSelectionChanged.connect(self._on_library_item_selection_changed)
        lay.addWidget(self.library, 1)
        lay.addLayout(self._build_library_buttons())
        self.library_status = plain_label("")
        self.library_status.setObjectName("explain")
        self.library_status.setWordWrap(True)
        self.library_status.setTextFormat(Qt.TextFormat.PlainText)
        lay.addWidget(self.library_status)
        return page

    def _build_offer_bar(self) -> QWidget:
        """The bar that offers other apps' model folders (hidden until some are found)."""
        self.offer_bar = QWidget()
        self.offer_bar.setObjectName("offerBar")
        bar = QHBoxLayout(self.offer_bar)
        bar.setContentsMargins(0, 0, 0, 0)
        self.offer_label = plain_label("")
        self.offer_label.setWordWrap(True)
        self.offer_label.setTextFormat(Qt.TextFormat.PlainText)
        bar.addWidget(self.offer_label, 1)
        self.offer_add_button = QPushButton("Add them")
        self.offer_add_button.setObjectName("primary")
        self.offer_add_button.clicked.connect(self._on_offer_add_button_clicked)
        self.offer_dismiss_button = QPushButton("Not now")
        self.offer_dismiss_button.setToolTip("Do not offer these folders again (Add folder… still adds them)")
        self.offer_dismiss_button.clicked.connect(self._on_offer_dismiss_button_clicked)
        bar.addWidget(self.offer_add_button)
        bar.addWidget(self.offer_dismiss_button)
        self.offer_bar.setVisible(False)
        return self.offer_bar

    def _build_library_buttons(self) -> QHBoxLayout:
        """Load, Eject, Quantize, Check quality, Delete; Convert and Add folder on the right."""
        row = QHBoxLayout()
        self.load_button = QPushButton("Load")
        self.load_button.setObjectName("primary")
        self.load_button.clicked.connect(self._on_load_clicked)
        self.unload_button = QPushButton("Eject")
        self.unload_button.clicked.connect(self.unload_requested)
        self.quantize_button = QPushButton("Quantize…")
        self.quantize_button.clicked.connect(self._on_quantize_clicked)
        self.quality_button = QPushButton("Check quality…")
        self.quality_button.setToolTip("Compare the perplexity of a quantized model with its source")
        self.quality_button.clicked.connect(self._on_quality_clicked)
        self.delete_button = QPushButton("Delete…")
        self.delete_button.clicked.connect(self._on_delete_clicked)
        self.projector_button = QPushButton("Projector")
        self.projector_button.setToolTip("The vision projector (mmproj) loaded beside the selected model")
        projector_menu = QMenu(self.projector_button)
        self.choose_projector_action = projector_menu.addAction("Choose a projector file…")
        self.choose_projector_action.triggered.connect(self._on_choose_projector_action_triggered)
        self.found_projector_action = projector_menu.addAction("Use the one found beside it")
        self.found_projector_action.triggered.connect(self._on_found_projector_action_triggered)
        self.projector_button.setMenu(projector_menu)
        self.folder_button = QPushButton("Add folder…")
        self.folder_button.setToolTip("Index GGUF files in another folder in place (LM Studio, HF cache …)")
        self.folder_button.clicked.connect(self._on_folder_clicked)
        self.convert_button = QPushButton("Convert…")
        self.convert_button.setToolTip("Convert a Hugging Face safetensors checkpoint folder to GGUF, and quantize it")
        self.convert_button.clicked.connect(self._on_convert_clicked)
        for button in (
            self.load_button,
            self.unload_button,
            self.quantize_button,
            self.quality_button,
            self.delete_button,
            self.projector_button,
        ):
            row.addWidget(button)
        row.addStretch(1)
        row.addWidget(self.convert_button)
        row.addWidget(self.folder_button)
        return row

    def selected_entry(self) -> LibraryEntry | None:
        """The entry of the highlighted row (as shown: a rescan reselects it by path)."""
        rows = self.library.selectionModel().selectedRows()
        if not rows or rows[0].row() >= len(self._rows):
            return None
        return self._rows[rows[0].row()]

    def select_model(self, path: Path) -> bool:
        """Highlights the model at ``path``; False when the library does not list it."""
        for row, entry in enumerate(self._rows):
            if entry.path == path or path in entry.parts:
                self.library.selectRow(row)
                return True
        return False

    @Slot()
    def _on_library_item_selection_changed(self) -> None:
        entry = self.selected_entry()
        if entry is not None:
            self._selected_path = entry.path
        problem = entry.chat_problem() if entry is not None else None
        self.load_button.setToolTip(
            plain_tooltip(f"Cannot load: {problem}") if problem else "Load this model to chat with it"
        )
        self.quality_button.setEnabled(entry is not None and bool(entry.provenance.get("quantized_from")))

    @Slot(object)
    def _on_adapter_hardware_ready(self, _hw: object) -> None:
        self._on_adapter_library_changed(self.adapter.library.entries)

    @Slot(object)
    def _on_adapter_library_changed(self, entries: list[LibraryEntry]) -> None:
        hw = self.adapter.library.hardware
        if hw is not None:
            gpus = ", ".join(g.name for g in getattr(hw, "gpus", [])) or "no GPU"
            self.hardware_label.setText(
                f"This machine: {format_bytes(hw.total_ram)} RAM ({format_bytes(hw.available_ram)} free), "
                f"{hw.cpu_count_physical} cores, {gpus}. Fit verdicts assume a {self.n_ctx}-token context."
            )
        keep = self._selected_path
        self.library.blockSignals(True)
        self._rows = list(entries)
        self.library.clearSelection()
        self.library.setRowCount(len(entries))
        for row, entry in enumerate(entries):
            self._fill_row(row, entry)
        self.library.resizeColumnsToContents()
        self.library.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.library.blockSignals(False)
        if (keep is None or not self.select_model(keep)) and entries:
            self.library.selectRow(0)
        self._on_library_item_selection_changed()

    def _fill_row(self, row: int, entry: LibraryEntry) -> None:
        label = entry.provenance.get("label") or model_label(entry.path)
        name = label + ("  (loaded)" if self.loaded_path == entry.path else "")
        tip = model_tooltip(entry.path)
        if entry.provenance:
            tip += "\n" + "\n".join(f"{k}: {v}" for k, v in entry.provenance.items())
        if entry.duplicates:
            tip += "\nduplicates: " + ", ".join(str(p) for p in entry.duplicates)
        name_item = _item(name, tip)
        name_item.setData(PATH_ROLE, str(entry.path))
        self.library.setItem(row, 0, name_item)
        if entry.error:
            self.library.setItem(row, 1, _item("unusable", entry.error))
            for col in range(2, 7):
                self.library.setItem(row, col, _item(""))
            self.library.setItem(row, 6, _item(entry.error, entry.error))
            return
        kind = KIND_TEXT.get(entry.kind)
        arch = entry.architecture or "?"
        if kind and entry.kind == "adapter" and entry.base_model:  # the base it changes, in the row
            self.library.setItem(row, 1, _item(f"{arch} ({kind} for {entry.base_model})", entry.chat_problem() or ""))
        elif kind:
            self.library.setItem(row, 1, _item(f"{arch} ({kind})", entry.chat_problem() or ""))
        elif entry.sees and entry.projector is not None:
            seeing = f"sees {entry.sees} through {entry.projector.name}, loaded beside it"
            self.library.setItem(row, 1, _item(f"{arch}, sees {entry.sees}", seeing))
        else:
            blind = entry.chat_problem() or "text only: no projector (mmproj) beside it"
            self.library.setItem(row, 1, _item(arch, blind))
        self.library.setItem(row, 2, _item(format_params(entry.params), align_right=True))
        self.library.setItem(row, 3, _item(entry.quant or "?"))
        self.library.setItem(row, 4, _item(format_bytes(entry.size), align_right=True))
        self.library.setItem(row, 5, _item(str(entry.context_length or "?"), align_right=True))
        if kind:
            self.library.setItem(row, 6, _item(f"not a chat model ({kind})", entry.chat_problem() or ""))
        else:
            self.library.setItem(row, 6, _verdict_item(self.adapter.library.fit(entry, self.n_ctx)))

    def set_loaded(self, path: Path | None) -> None:
        self.loaded_path = path
        self._on_adapter_library_changed(self.adapter.library.entries)

    @Slot()
    def _on_load_clicked(self) -> None:
        entry = self.selected_entry()
        if entry is None:
            self.library_status.setText("Pick a model in the list first.")
            return
        problem = entry.chat_problem()
        if problem:
            self.library_status.setText(f"{shown(entry.label)} cannot be loaded: {shown(problem)}")
            return
        self.load_requested.emit(entry.path)

    @Slot()
    def _on_delete_clicked(self) -> None:
        entry = self.selected_entry()
        if entry is None:
            return
        if not entry.owned:
            inform(
                self,
                "Delete",
                f"{shown(entry.path)} is indexed in place from a folder you added; "
                "Glassbox only deletes files in its own models folder.",
            )
            return
        if confirm(self, "Delete model", f"Delete {shown(entry.path.name)} ({format_bytes(entry.size)}) from disk?"):
            if self.loaded_path == entry.path:
                self.unload_requested.emit()
            self.adapter.library.delete(entry.path)

    def _open(self, dialog: QDialog) -> None:
        """Shows ``dialog`` window-modal without a nested event loop (it deletes itself on close)."""
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.finished.connect(lambda _r: setattr(self, "dialog", None))
        self.dialog = dialog
        dialog.open()

    @Slot()
    def _on_convert_clicked(self) -> None:
        # lazy: start-up (+5 ms)
        from app.gui.convert_dialog import ConvertDialog

        self._open(ConvertDialog(self.adapter, parent=self))

    @Slot()
    def _on_quantize_clicked(self) -> None:
        entry = self.selected_entry()
        if entry is None:
            self.library_status.setText("Pick a model in the list first.")
            return
        if entry.error or not entry.available:
            self.library_status.setText(
                f"{shown(entry.label)} cannot be quantized: {shown(entry.error or 'it is unavailable')}"
            )
            return
        try:
            dialog = QuantizeDialog(self.adapter, entry, self, n_ctx=self.n_ctx)
        except ImportError as exc:
            self.library_status.setText(f"Quantization is unavailable: {exc}")
            return
        self._open(dialog)

    @Slot()
    def _on_quality_clicked(self) -> None:
        entry = self.selected_entry()
        source = entry.provenance.get("quantized_from") if entry is not None else None
        if entry is None or not source:
            self.library_status.setText("Pick a model you quantized here: the check compares it with its source.")
            return
        dialog = QualityDialog(self.adapter, Path(source), entry.path, entry.quant or "?", self)
        self._open(dialog)
        if dialog.start_button.isEnabled():
            dialog.start()

    @Slot()
    def _on_choose_projector_action_triggered(self) -> None:
        entry = self._chat_entry_for_projector()
        if entry is None:
            return
        start = entry.projector.parent if entry.projector is not None else entry.path.parent
        chosen = self.pick_projector_file(start)
        if chosen is not None:
            self.library_status.setText(f"{shown(entry.label)}: projector {shown(chosen.name)}")
            self.adapter.library.set_projector(entry.path, chosen, self.library_status.setText)

    @Slot()
    def _on_found_projector_action_triggered(self) -> None:
        entry = self._chat_entry_for_projector()
        if entry is not None:
            self.library_status.setText(f"{shown(entry.label)}: the projector found beside it, if any")
            self.adapter.library.set_projector(entry.path, None, self.library_status.setText)

    def _chat_entry_for_projector(self) -> LibraryEntry | None:
        entry = self.selected_entry()
        problem = "pick a model in the list first" if entry is None else entry.chat_problem()
        if entry is None or problem:
            self.library_status.setText(f"No projector to choose: {shown(problem or '')}")
            return None
        return entry

    def pick_projector_file(self, start: Path) -> Path | None:
        """Asks for a projector file (a dialog; tests replace this)."""
        name, _filter = QFileDialog.getOpenFileName(
            self, "Choose the vision projector (mmproj)", str(start), "GGUF files (*.gguf)"
        )
        return Path(name) if name else None

    @Slot()
    def _on_folder_clicked(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Add a model folder", str(Path.home()))
        if folder:
            self.adapter.library.add_folder(Path(folder))

    # ------------------------------------------------------------------ other apps' folders
    @Slot(object)
    def _on_adapter_other_folders_found(self, folders: list[OtherAppFolder]) -> None:
        self._offered = list(folders)
        if not folders:
            self.offer_bar.setVisible(False)
            return
        names = shown("; ".join(f"{f.app} ({f.path})" for f in folders))
        self.offer_label.setText(
            f"Models from other apps were found here: {names}. Use them in place (nothing is copied)?"
        )
        self.offer_label.setToolTip(plain_tooltip(names))
        self.offer_bar.setVisible(True)

    @Slot()
    def _on_offer_add_button_clicked(self) -> None:
        self.adapter.library.add_folders([folder.path for folder in self._offered])
        self.library_status.setText("Added: " + shown(", ".join(str(f.path) for f in self._offered)))
        self._offered = []
        self.offer_bar.setVisible(False)

    @Slot()
    def _on_offer_dismiss_button_clicked(self) -> None:
        self.adapter.library.decline_folders([f.path for f in self._offered])
        self._offered = []
        self.offer_bar.setVisible(False)
