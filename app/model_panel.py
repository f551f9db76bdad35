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
    QDialogButtonBox,
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
        self.progress = QProgressBar()
        self.progress.setVisible(False)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        layout.addWidget(self.progress)
        layout.addWidget(self.status)
        self.buttons = QDialogButtonBox()
        self.start_button = self.buttons.addButton("Quantize", QDialogButtonBox.ButtonRole.AcceptRole)
        self.start_button.setObjectName("primary")
        self.cancel_button = self.buttons.addButton(QDialogButtonBox.StandardButton.Cancel)
        self.start_button.clicked.connect(self._on_start_button_clicked)
        self.cancel_button.clicked.connect(self._on_cancel_button_clicked)
        layout.addWidget(self.buttons)
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

    def showEvent(self, event: Any) -> None:
        super().showEvent(event)
        if not self._started:
            self._started = True
            self.adapter.probe()
            self.adapter.scan()

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
        self._queue_rows: dict[str, int] = {}
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

    @Slot(object)
    def _on_adapter_transfer_changed(self, transfer: Transfer) -> None:
        if transfer.kind != "download":
            return
        row = self._queue_rows.get(transfer.key)
        if row is None:
            row = self.queue.rowCount()
            self.queue.insertRow(row)
            self._queue_rows[transfer.key] = row
            self.queue.setItem(row, 0, _item(transfer.label))
            bar = QProgressBar()
            bar.setTextVisible(False)
            self.queue.setCellWidget(row, 1, bar)
            self.queue.setCellWidget(row, 4, self._transfer_buttons(transfer))
        cell = self.queue.cellWidget(row, 1)
        if isinstance(cell, QProgressBar):
            cell.setRange(0, max(transfer.total, 1))
            cell.setValue(min(transfer.done, max(transfer.total, 1)))
        self.queue.setItem(row, 2, _item(format_speed(transfer.speed_bps), align_right=True))
        status = f"{transfer.state} · {format_bytes(transfer.done)} of {format_bytes(transfer.total)}"
        eta = format_eta(transfer.eta_s) if transfer.state == "downloading" else ""
        if eta:
            status += f" · {eta}"
        if transfer.message and transfer.state in ("error", "retrying", "cancelled"):
            status += f" · {transfer.message}"
        self.queue.setItem(row, 3, _item(status, transfer.message))
        buttons = self.queue.cellWidget(row, 4)
        if buttons is not None and transfer.state in ("done", "error", "cancelled"):
            buttons.setEnabled(False)

    def _transfer_buttons(self, transfer: Transfer) -> QWidget:
        box = QWidget()
        row = QHBoxLayout(box)
        row.setContentsMargins(2, 0, 2, 0)
        pause = QPushButton("Pause")
        pause.setCheckable(True)

        def toggle(paused: bool) -> None:
            if paused:
                transfer.pause.set()
            else:
                transfer.pause.clear()
            pause.setText("Resume" if paused else "Pause")

        pause.toggled.connect(toggle)
        cancel = QPushButton("Cancel")

        def stop() -> None:
            transfer.pause.clear()
            transfer.cancel.set()

        cancel.clicked.connect(stop)
        row.addWidget(pause)
        row.addWidget(cancel)
        return box


def quant_type_names() -> list[str]:
    """Names of the types Glassbox can write (for menus and tests)."""
    from engine.quantize import quant_types

    return [t.name for t in quant_types() if t.available]
