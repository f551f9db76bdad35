"""The model manager: the local library (fit badges, load, delete, quantize, quality) and Discover
(Hub search, a repo's files with size and fit, the download queue)."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.inspector import format_bytes
from app.job_footer import add_job_footer
from app.workers.chat_adapter import model_label, model_tooltip
from app.workers.models_worker import ModelsAdapter, Transfer

VERDICT_TEXT = {"gpu": "fits on GPU", "partial": "partial offload", "ram": "fits in RAM", "no": "won't fit"}
VERDICT_COLOR = {"gpu": "#16a34a", "partial": "#0891b2", "ram": "#4f46e5", "no": "#dc2626"}


def format_params(n: int | None) -> str:
    if not n:
        return "—"
    return f"{n / 1e9:.1f} B" if n >= 1e9 else f"{n / 1e6:.0f} M"


def format_speed(bps: float) -> str:
    return f"{bps / 2**20:.1f} MiB/s" if bps else "—"


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h left"
    if seconds >= 90:
        return f"{seconds / 60:.0f} min left"
    return f"{seconds:.0f} s left"


def _item(text: str, tip: str = "", align_right: bool = False) -> QTableWidgetItem:
    item = QTableWidgetItem(text)
    if tip:
        item.setToolTip(tip)
    if align_right:
        item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
    return item


def _verdict_item(fit: Any) -> QTableWidgetItem:
    if fit is None:
        return _item("…", "checking this machine")
    item = _item(f"● {VERDICT_TEXT.get(fit.verdict, fit.verdict)}", fit.message)
    item.setForeground(QColor(VERDICT_COLOR.get(fit.verdict, "#6b7280")))
    return item


class QuantizeDialog(QDialog):
    """Pick a quantization type (expected size, speed and fit per type), then watch it run."""

    def __init__(self, adapter: ModelsAdapter, entry: Any, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        from engine.quantize import default_output_path, quant_types

        self.setWindowTitle(f"Quantize {entry.name}")
        self.setMinimumWidth(720)
        self.adapter = adapter
        self.entry = entry
        self.transfer: Transfer | None = None
        self._default_output = default_output_path
        layout = QVBoxLayout(self)
        source_type = entry.quant or "?"
        note = QLabel(
            f"Source: <b>{html.escape(entry.name)}</b> ({source_type}, {format_bytes(entry.size)}). "
            "Quantizing from F16/F32/BF16 keeps the most quality; re-quantizing a quantized model loses more."
        )
        note.setWordWrap(True)
        layout.addWidget(note)
        self.table = QTableWidget(0, 5)
        self.table.setHorizontalHeaderLabels(["Type", "Expected size", "Expected decode", "Fit", "About"])
        self.table.verticalHeader().setVisible(False)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.horizontalHeader().setSectionResizeMode(4, QHeaderView.ResizeMode.Stretch)
        params = entry.params or 0
        bandwidth = adapter.bandwidth_gbps
        self.types = [t for t in quant_types() if t.available]
        self.table.setRowCount(len(self.types))
        for row, qtype in enumerate(self.types):
            size = qtype.estimate_bytes(params)
            speed = f"≈ {bandwidth * 1e9 / size:.0f} tok/s" if bandwidth and size else "—"
            self.table.setItem(row, 0, _item(qtype.name))
            self.table.setItem(row, 1, _item(format_bytes(size), align_right=True))
            self.table.setItem(
                row,
                2,
                _item(speed, "bandwidth ÷ weights: decode reads every weight per token", align_right=True),
            )
            self.table.setItem(row, 3, _verdict_item(adapter.fit_for_size(size)))
            self.table.setItem(row, 4, _item(qtype.description))
            if qtype.name == "Q4_K_M":
                self.table.selectRow(row)
        layout.addWidget(self.table, 1)
        footer = add_job_footer(layout, "Quantize")
        self.progress, self.status, self.buttons = footer.progress, footer.status, footer.buttons
        self.start_button, self.cancel_button = footer.start_button, footer.cancel_button
        self.start_button.clicked.connect(self._on_start_button_clicked)
        self.cancel_button.clicked.connect(self._on_cancel_button_clicked)
        adapter.transfer_changed.connect(self._on_adapter_transfer_changed)

    def selected_type(self) -> str | None:
        rows = self.table.selectionModel().selectedRows()
        return self.types[rows[0].row()].name if rows else None

    @Slot()
    def _on_start_button_clicked(self) -> None:
        qtype = self.selected_type()
        if qtype is None:
            return
        dst = self._default_output(self.entry.path, qtype, self.adapter.models_dir)
        self.transfer = self.adapter.quantize(self.entry.path, qtype, dst)
        self.start_button.setEnabled(False)
        self.table.setEnabled(False)
        self.progress.setVisible(True)
        self.progress.setRange(0, 0)
        self.status.setText(f"Writing {dst.name}…")

    @Slot()
    def _on_cancel_button_clicked(self) -> None:
        if self.transfer is not None and self.transfer.state not in ("done", "error", "cancelled"):
            self.transfer.cancel.set()
            self.status.setText("Cancelling…")
            return
        self.reject()

    @Slot(object)
    def _on_adapter_transfer_changed(self, transfer: Transfer) -> None:
        if transfer is not self.transfer:
            return
        if transfer.total:
            self.progress.setRange(0, transfer.total)
            self.progress.setValue(transfer.done)
        if transfer.state in ("done", "error", "cancelled"):
            self.progress.setVisible(transfer.state == "done")
            self.status.setText(f"{transfer.state}: {transfer.message}")
            self.cancel_button.setText("Close")
        else:
            self.status.setText(f"{transfer.done}/{transfer.total} tensors · {transfer.message}")


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
        self.repo_files: Any = None
        layout = QVBoxLayout(self)
        layout.setContentsMargins(18, 14, 18, 14)
        self.tabs = QTabWidget()
        layout.addWidget(self.tabs)
        self.tabs.addTab(self._build_library(), "Library")
        self.tabs.addTab(self._build_discover(), "Discover")
        adapter.library_changed.connect(self._on_adapter_library_changed)
        adapter.hardware_ready.connect(lambda _hw: self._on_adapter_library_changed(adapter.entries))
        adapter.search_finished.connect(self._on_adapter_search_finished)
        adapter.files_listed.connect(self._on_adapter_files_listed)
        adapter.transfer_changed.connect(self._on_adapter_transfer_changed)
        adapter.transfer_removed.connect(self._on_adapter_transfer_removed)
        for transfer in list(adapter.transfers.values()):  # found or started before this page existed
            self._on_adapter_transfer_changed(transfer)

    def showEvent(self, event: Any) -> None:
        super().showEvent(event)
        if not self._started:
            self._started = True
            self.adapter.probe()
            self.adapter.scan()
            self.adapter.find_unfinished()

    # ------------------------------------------------------------------ library
    def _build_library(self) -> QWidget:
        page = QWidget()
        lay = QVBoxLayout(page)
        self.hardware_label = QLabel("")
        self.hardware_label.setObjectName("explain")
        lay.addWidget(self.hardware_label)
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
        lay.addWidget(self.library, 1)
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
        ):
            row.addWidget(button)
        row.addStretch(1)
        row.addWidget(self.convert_button)
        row.addWidget(self.folder_button)
        lay.addLayout(row)
        self.library_status = QLabel("")
        self.library_status.setObjectName("explain")
        self.library_status.setWordWrap(True)
        lay.addWidget(self.library_status)
        return page

    def selected_entry(self) -> Any:
        rows = self.library.selectionModel().selectedRows()
        if not rows:
            return None
        index = rows[0].row()
        return self.adapter.entries[index] if index < len(self.adapter.entries) else None

    @Slot(object)
    def _on_adapter_library_changed(self, entries: list[Any]) -> None:
        hw = self.adapter.hardware
        if hw is not None:
            gpus = ", ".join(g.name for g in getattr(hw, "gpus", [])) or "no GPU"
            self.hardware_label.setText(
                f"This machine: {format_bytes(hw.total_ram)} RAM ({format_bytes(hw.available_ram)} free), "
                f"{hw.cpu_count_physical} cores, {gpus}. Fit verdicts assume a {self.n_ctx}-token context."
            )
        self.library.setRowCount(len(entries))
        for row, entry in enumerate(entries):
            label = entry.provenance.get("label") or model_label(entry.path)
            name = label + ("  (loaded)" if self.loaded_path == entry.path else "")
            tip = model_tooltip(entry.path)
            if entry.provenance:
                tip += "\n" + "\n".join(f"{k}: {v}" for k, v in entry.provenance.items())
            if entry.duplicates:
                tip += "\nduplicates: " + ", ".join(str(p) for p in entry.duplicates)
            self.library.setItem(row, 0, _item(name, tip))
            if entry.error:
                self.library.setItem(row, 1, _item("unusable", entry.error))
                for col in range(2, 7):
                    self.library.setItem(row, col, _item(""))
                continue
            self.library.setItem(row, 1, _item(entry.architecture or "?"))
            self.library.setItem(row, 2, _item(format_params(entry.params), align_right=True))
            self.library.setItem(row, 3, _item(entry.quant or "?"))
            self.library.setItem(row, 4, _item(format_bytes(entry.size), align_right=True))
            self.library.setItem(row, 5, _item(str(entry.context_length or "?"), align_right=True))
            self.library.setItem(row, 6, _verdict_item(self.adapter.fit(entry, self.n_ctx)))
        self.library.resizeColumnsToContents()
        self.library.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        if entries and not self.library.selectionModel().selectedRows():
            self.library.selectRow(0)

    def set_loaded(self, path: Path | None) -> None:
        self.loaded_path = path
        self._on_adapter_library_changed(self.adapter.entries)

    @Slot()
    def _on_load_clicked(self) -> None:
        entry = self.selected_entry()
        if entry is not None and not entry.error:
            self.load_requested.emit(entry.path)

    @Slot()
    def _on_delete_clicked(self) -> None:
        entry = self.selected_entry()
        if entry is None:
            return
        if not entry.owned:
            QMessageBox.information(
                self,
                "Delete",
                f"{entry.path} is indexed in place from a folder you added; "
                "Glassbox only deletes files in its own models folder.",
            )
            return
        answer = QMessageBox.question(
            self, "Delete model", f"Delete {entry.path.name} ({format_bytes(entry.size)}) from disk?"
        )
        if answer == QMessageBox.StandardButton.Yes:
            if self.loaded_path == entry.path:
                self.unload_requested.emit()
            self.adapter.delete(entry.path)

    @Slot()
    def _on_convert_clicked(self) -> None:
        from app.convert_dialog import ConvertDialog

        ConvertDialog(self.adapter, parent=self).exec()

    @Slot()
    def _on_quantize_clicked(self) -> None:
        entry = self.selected_entry()
        if entry is None or entry.error:
            return
        try:
            dialog = QuantizeDialog(self.adapter, entry, self)
        except ImportError as exc:
            self.library_status.setText(f"Quantization is unavailable: {exc}")
            return
        dialog.exec()

    @Slot()
    def _on_quality_clicked(self) -> None:
        entry = self.selected_entry()
        source = entry.provenance.get("quantized_from") if entry is not None else None
        if entry is None or not source:
            self.library_status.setText("Pick a model you quantized here: the check compares it with its source.")
            return
        self.library_status.setText(f"Checking the quality of {entry.name} against {Path(source).name}…")
        self.adapter.check_quality(
            Path(source),
            entry.path,
            entry.quant or "?",
            lambda report: self.library_status.setText(report.summary()),
        )

    @Slot()
    def _on_folder_clicked(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Add a model folder", str(Path.home()))
        if folder:
            self.adapter.add_folder(Path(folder))

    # ------------------------------------------------------------------ discover
    def _build_discover(self) -> QWidget:
        page = QWidget()
        lay = QVBoxLayout(page)
        row = QHBoxLayout()
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search Hugging Face for GGUF models (e.g. qwen 0.5b instruct)")
        self.search.returnPressed.connect(self._on_search_return_pressed)
        self.search_button = QPushButton("Search")
        self.search_button.clicked.connect(self._on_search_return_pressed)
        row.addWidget(self.search, 1)
        row.addWidget(self.search_button)
        lay.addLayout(row)
        splitter = QSplitter(Qt.Orientation.Horizontal)
        self.results = QListWidget()
        self.results.currentItemChanged.connect(self._on_results_current_item_changed)
        splitter.addWidget(self.results)
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        self.repo_label = QLabel("Pick a repository to see its files.")
        self.repo_label.setWordWrap(True)
        rl.addWidget(self.repo_label)
        self.files = QTableWidget(0, 4)
        self.files.setHorizontalHeaderLabels(["File", "Quant", "Size", "Fit on this machine"])
        self.files.verticalHeader().setVisible(False)
        self.files.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.files.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.files.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.files.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        rl.addWidget(self.files, 1)
        self.download_button = QPushButton("Download")
        self.download_button.setObjectName("primary")
        self.download_button.clicked.connect(self._on_download_clicked)
        rl.addWidget(self.download_button, 0, Qt.AlignmentFlag.AlignRight)
        splitter.addWidget(right)
        splitter.setSizes([320, 700])
        lay.addWidget(splitter, 2)
        title = QLabel("DOWNLOADS")
        title.setObjectName("sectionTitle")
        lay.addWidget(title)
        self.queue = QTableWidget(0, 5)
        self.queue.setObjectName("downloadQueue")
        self.queue.setHorizontalHeaderLabels(["Model", "Progress", "Speed", "Status", ""])
        self.queue.verticalHeader().setVisible(False)
        self.queue.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.queue.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.queue.horizontalHeader().setSectionResizeMode(3, QHeaderView.ResizeMode.Stretch)
        lay.addWidget(self.queue, 1)
        return page

    @Slot()
    def _on_search_return_pressed(self) -> None:
        text = self.search.text().strip()
        if text:
            self.results.clear()
            self.results.addItem("Searching…")
            self.adapter.search(text)

    @Slot(str, object)
    def _on_adapter_search_finished(self, query: str, hits: list[Any]) -> None:
        if query != self.search.text().strip():
            return
        self.results.clear()
        if not hits:
            self.results.addItem("No GGUF repositories found.")
        for hit in hits:
            lock = "  🔒 gated" if hit.gated else ""
            item = QListWidgetItem(f"{hit.id}{lock}\n↓ {hit.downloads:,}  ♥ {hit.likes:,}")
            item.setData(Qt.ItemDataRole.UserRole, hit.id)
            self.results.addItem(item)

    @Slot(QListWidgetItem, QListWidgetItem)
    def _on_results_current_item_changed(self, item: QListWidgetItem | None, _prev: Any) -> None:
        repo = item.data(Qt.ItemDataRole.UserRole) if item is not None else None
        if repo:
            self.repo_label.setText(f"<b>{html.escape(repo)}</b>: listing files…")
            self.files.setRowCount(0)
            self.adapter.list_files(repo)

    @Slot(str, object)
    def _on_adapter_files_listed(self, repo: str, files: Any) -> None:
        self.repo_files = files
        extra = " · gated: accept the licence on the website first" if files.gated else ""
        unsafe = f" · {len(files.unsafe_names)} unsafe file names hidden" if files.unsafe_names else ""
        self.repo_label.setText(f"<b>{html.escape(repo)}</b> — {len(files.choices)} models{extra}{unsafe}")
        self.files.setRowCount(len(files.choices))
        for row, choice in enumerate(files.choices):
            parts = f" ({len(choice.files)} parts)" if len(choice.files) > 1 else ""
            vision = " + vision projector" if choice.mmproj else ""
            self.files.setItem(row, 0, _item(choice.name + parts + vision))
            self.files.setItem(row, 1, _item(choice.quant or "?"))
            self.files.setItem(row, 2, _item(format_bytes(choice.total_size), align_right=True))
            self.files.setItem(row, 3, _verdict_item(self.adapter.fit_for_size(choice.total_size)))

    @Slot()
    def _on_download_clicked(self) -> None:
        rows = self.files.selectionModel().selectedRows()
        if not rows or self.repo_files is None:
            return
        choice = self.repo_files.choices[rows[0].row()]
        self.adapter.download(self.repo_files.repo, choice, self.repo_files.commit)

    def _queue_row(self, key: str) -> int | None:
        for row in range(self.queue.rowCount()):
            item = self.queue.item(row, 0)
            if item is not None and item.data(Qt.ItemDataRole.UserRole) == key:
                return row
        return None

    @Slot(object)
    def _on_adapter_transfer_changed(self, transfer: Transfer) -> None:
        if transfer.kind != "download":
            return
        row = self._queue_row(transfer.key)
        if row is None:
            row = self.queue.rowCount()
            self.queue.insertRow(row)
            name = _item(transfer.label, "\n".join(str(p) for p in transfer.paths))
            name.setData(Qt.ItemDataRole.UserRole, transfer.key)
            self.queue.setItem(row, 0, name)
            bar = QProgressBar()
            bar.setTextVisible(False)
            self.queue.setCellWidget(row, 1, bar)
            buttons = TransferButtonsWidget(transfer)
            buttons.resume_requested.connect(self._on_transfer_buttons_resume_requested)
            buttons.discard_requested.connect(self._on_transfer_buttons_discard_requested)
            self.queue.setCellWidget(row, 4, buttons)
            # Cell widgets do not take part in ResizeToContents: size the row and column for them.
            hint = buttons.sizeHint()
            self.queue.setRowHeight(row, max(self.queue.rowHeight(row), hint.height() + 6))
            header = self.queue.horizontalHeader()
            header.resizeSection(4, max(header.sectionSize(4), hint.width() + 8))
        name_item = self.queue.item(row, 0)
        if name_item is not None and name_item.text() != transfer.label:  # another transfer took the row over
            name_item.setText(transfer.label)
            name_item.setToolTip("\n".join(str(p) for p in transfer.paths))
        cell = self.queue.cellWidget(row, 1)
        if isinstance(cell, QProgressBar):
            # In permille: QProgressBar takes a 32-bit int, and model files pass 2 GiB.
            cell.setRange(0, 1000)
            cell.setValue(min(1000, transfer.done * 1000 // transfer.total) if transfer.total > 0 else 0)
        speed = format_speed(transfer.speed_bps) if transfer.running else ""
        self.queue.setItem(row, 2, _item(speed, align_right=True))
        self.queue.setItem(row, 3, _item(transfer_status(transfer), transfer.message))
        cell_buttons = self.queue.cellWidget(row, 4)
        if isinstance(cell_buttons, TransferButtonsWidget):
            cell_buttons.update_for(transfer)

    @Slot(object)
    def _on_adapter_transfer_removed(self, transfer: Transfer) -> None:
        row = self._queue_row(transfer.key)
        if row is not None:
            self.queue.removeRow(row)

    @Slot(object)
    def _on_transfer_buttons_resume_requested(self, transfer: Transfer) -> None:
        self.adapter.resume(transfer)

    @Slot(object)
    def _on_transfer_buttons_discard_requested(self, transfer: Transfer) -> None:
        kept = f" ({format_bytes(transfer.done)} downloaded)" if transfer.done else ""
        complete = ""
        if transfer.files_done and len(transfer.paths) > 1:
            complete = f" The {transfer.files_done} file(s) already complete stay in the models folder."
        answer = QMessageBox.question(
            self,
            "Discard download",
            f"Delete the unfinished download of {transfer.label}{kept}? It cannot be resumed afterwards.{complete}",
        )
        if answer == QMessageBox.StandardButton.Yes:
            self.adapter.discard(transfer)


def format_progress(done: int, total: int) -> str:
    """``1.2 of 4.0 GiB``: both numbers in the unit of the total (or just the bytes done)."""
    if total <= 0:
        return format_bytes(done)
    unit, scale = "B", 1
    for name, size in (("KiB", 2**10), ("MiB", 2**20), ("GiB", 2**30), ("TiB", 2**40)):
        if total >= size:
            unit, scale = name, size
    if scale == 1:
        return f"{done} of {total} B"
    return f"{done / scale:.1f} of {total / scale:.1f} {unit}"


def transfer_status(transfer: Transfer) -> str:
    """The Status cell of a download row, e.g. ``paused — 1.2 of 4.0 GiB``."""
    if transfer.state == "unreadable":
        size = f" ({format_bytes(transfer.done)} on disk)" if transfer.done else ""
        return f"can't resume — {transfer.message}{size}"
    if transfer.state == "discarded":
        return "discarded"
    state = transfer.state
    if transfer.state == "cancelled" and transfer.done:
        state = "stopped"
    status = f"{state} — {format_progress(transfer.done, transfer.total)}"
    count = len(transfer.paths)
    if transfer.kind == "download" and count > 1:  # a split model (or a model with its mmproj)
        noun = "parts" if not any("mmproj" in p.name.lower() for p in transfer.paths) else "files"
        status += f" · {transfer.files_done} of {count} {noun} done"
    eta = format_eta(transfer.eta_s) if transfer.state == "downloading" else ""
    if eta:
        status += f" · {eta}"
    if transfer.message and transfer.state in ("error", "retrying", "cancelled"):
        status += f" · {transfer.message}"
    return status


class TransferButtonsWidget(QWidget):
    """A download row's buttons: Pause/Cancel while it runs, Resume/Discard once it stopped.

    Pause and Cancel set the transfer's events directly (CONTRIBUTING.md rule 9); Resume and Discard go
    through the panel (Discard asks first).

    Signals:
        resume_requested(object): the :class:`Transfer` to start again from its partial files.
        discard_requested(object): the :class:`Transfer` whose partial files to delete.
    """

    resume_requested = Signal(object)
    discard_requested = Signal(object)

    def __init__(self, transfer: Transfer, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.transfer = transfer
        row = QHBoxLayout(self)
        row.setContentsMargins(2, 0, 2, 0)
        self.pause_button = QPushButton("Pause")
        self.pause_button.setCheckable(True)
        self.pause_button.toggled.connect(self._on_pause_button_toggled)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Stop the download; the bytes so far are kept to resume later")
        self.cancel_button.clicked.connect(self._on_cancel_button_clicked)
        self.resume_button = QPushButton("Resume")
        self.resume_button.setObjectName("primary")
        self.resume_button.clicked.connect(lambda: self.resume_requested.emit(self.transfer))
        self.discard_button = QPushButton("Discard…")
        self.discard_button.setToolTip("Delete the partial download from disk")
        self.discard_button.clicked.connect(lambda: self.discard_requested.emit(self.transfer))
        row.addStretch(1)
        for button in (self.pause_button, self.cancel_button, self.resume_button, self.discard_button):
            row.addWidget(button)
        self.update_for(transfer)

    def update_for(self, transfer: Transfer) -> None:
        """Shows the buttons that fit the transfer's state."""
        self.transfer = transfer
        running = transfer.running
        stopped = not running and transfer.state not in ("done", "discarded")
        self.pause_button.setVisible(running)
        self.cancel_button.setVisible(running)
        self.resume_button.setVisible(stopped and transfer.resumable)
        self.resume_button.setText("Resume" if transfer.done or transfer.restored else "Retry")
        self.discard_button.setVisible(stopped)
        if not running and self.pause_button.isChecked():
            self.pause_button.blockSignals(True)
            self.pause_button.setChecked(False)
            self.pause_button.setText("Pause")
            self.pause_button.blockSignals(False)
        self.setEnabled(transfer.state not in ("done", "discarded"))

    @Slot(bool)
    def _on_pause_button_toggled(self, paused: bool) -> None:
        if paused:
            self.transfer.pause.set()
        else:
            self.transfer.pause.clear()
        self.pause_button.setText("Resume" if paused else "Pause")

    @Slot()
    def _on_cancel_button_clicked(self) -> None:
        self.transfer.pause.clear()
        self.transfer.cancel.set()


def quant_type_names() -> list[str]:
    """Names of the types Glassbox can write (for menus and tests)."""
    from engine.quantize import quant_types

    return [t.name for t in quant_types() if t.available]
