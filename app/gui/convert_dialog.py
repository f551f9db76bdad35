"""The Convert… dialog: a Hugging Face safetensors checkpoint folder to a GGUF of a chosen type.

The dialog only chooses and watches. :meth:`app.gui.workers.model_jobs.ModelJobsAdapter.convert` runs
:func:`engine.convert.hf_to_gguf.convert_and_quantize` on the jobs adapter's quantization worker (one child
process per stage, so Cancel really stops it) and reports frozen snapshots through ``transfer_changed``.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Slot
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.gui.job_footer import add_job_footer
from app.gui.workers.models_worker import ModelsAdapter
from app.gui.workers.transfers import JOB_ENDED, Transfer

DEFAULT_TYPE = "Q4_K_M"


def convert_targets() -> list[tuple[str, str]]:
    """``(type, description)`` for every target: F16, BF16 and Q8_0, which the converter writes,
    then the quantization types that need no importance matrix, best quality first."""
    # lazy: start-up (+107 ms)
    from engine.convert.hf_to_gguf import CONVERT_OUTTYPES
    from engine.convert.quantize import quant_types

    described = {qt.name: qt.description for qt in quant_types()}
    direct = [name for name, _bpp in CONVERT_OUTTYPES.values()]
    targets = [(name, described.get(name, "")) for name in direct]
    targets += [(qt.name, qt.description) for qt in quant_types() if qt.available and qt.name not in {"F32", *direct}]
    return targets


class ConvertDialog(QDialog):
    """Pick a checkpoint folder and a target type, then watch the conversion run.

    Args:
        adapter: the models adapter that runs the conversion.
        folder: a folder to start with (None: pick one with Choose…).
        parent: the parent widget.
    """

    def __init__(self, adapter: ModelsAdapter, folder: Path | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Convert a Hugging Face checkpoint")
        self.setMinimumWidth(620)
        self.adapter = adapter
        self.transfer: Transfer | None = None
        layout = QVBoxLayout(self)
        note = QLabel(
            "Converts a folder with <code>config.json</code>, the tokenizer and <code>*.safetensors</code> "
            "weights to GGUF in the models folder. Pickle weights (<code>.bin</code>, <code>.pt</code>) are "
            "refused and custom model code is never run. Other types than F16, BF16 and Q8_0 are converted "
            "to F16 (BF16 for a bfloat16 checkpoint) first, then quantized."
        )
        note.setTextFormat(Qt.TextFormat.RichText)
        note.setWordWrap(True)
        layout.addWidget(note)
        form = QFormLayout()
        row = QHBoxLayout()
        self.folder_edit = QLineEdit(str(folder) if folder is not None else "")
        self.folder_edit.setPlaceholderText("a Hugging Face checkpoint folder")
        self.folder_edit.textChanged.connect(self._on_folder_edit_text_changed)
        self.browse_button = QPushButton("Choose…")
        self.browse_button.clicked.connect(self._on_browse_button_clicked)
        row.addWidget(self.folder_edit, 1)
        row.addWidget(self.browse_button)
        form.addRow("Checkpoint", row)
        self.type_combo = QComboBox()
        for name, description in convert_targets():
            self.type_combo.addItem(f"{name} — {description}" if description else name, name)
        self.type_combo.setCurrentIndex(max(0, self.type_combo.findData(DEFAULT_TYPE)))
        self.type_combo.currentIndexChanged.connect(self._on_type_combo_current_index_changed)
        form.addRow("Type", self.type_combo)
        self.keep_check = QCheckBox("Also keep the F16/BF16 conversion")
        form.addRow("", self.keep_check)
        layout.addLayout(form)
        self.footer = footer = add_job_footer(layout, "Convert")
        self.progress, self.status, self.buttons = footer.progress, footer.status, footer.buttons
        self.start_button, self.cancel_button = footer.start_button, footer.cancel_button
        self.start_button.clicked.connect(self._on_start_button_clicked)
        self.cancel_button.clicked.connect(self._on_cancel_button_clicked)
        adapter.jobs.transfer_changed.connect(self._on_adapter_transfer_changed)
        self._on_type_combo_current_index_changed()
        self._on_folder_edit_text_changed()

    def selected_type(self) -> str:
        return str(self.type_combo.currentData())

    def running(self) -> bool:
        return self.transfer is not None and self.transfer.state not in JOB_ENDED

    @Slot()
    def _on_browse_button_clicked(self) -> None:
        start = self.folder_edit.text().strip() or str(Path.home())
        folder = QFileDialog.getExistingDirectory(self, "Choose a Hugging Face checkpoint folder", start)
        if folder:
            self.folder_edit.setText(folder)

    @Slot()
    def _on_folder_edit_text_changed(self) -> None:
        self.start_button.setEnabled(bool(self.folder_edit.text().strip()) and not self.running())

    @Slot()
    def _on_type_combo_current_index_changed(self) -> None:
        # lazy: start-up (+60 ms)
        from engine.convert.hf_to_gguf import CONVERT_OUTTYPES

        two_stages = self.selected_type().lower() not in CONVERT_OUTTYPES
        self.keep_check.setEnabled(two_stages)
        if not two_stages:
            self.keep_check.setChecked(False)

    @Slot()
    def _on_start_button_clicked(self) -> None:
        text = self.folder_edit.text().strip()
        if not text or self.running():
            return
        folder = Path(text).expanduser()
        self.transfer = self.adapter.jobs.convert(
            folder, self.selected_type(), keep_intermediate=self.keep_check.isChecked()
        )
        self._set_form_enabled(False)
        self.cancel_button.setText("Cancel")
        self.cancel_button.setEnabled(True)
        self.progress.setVisible(True)
        self.progress.setRange(0, 0)
        self.status.setText(f"Converting {folder.name}…")

    def _set_form_enabled(self, enabled: bool) -> None:
        for widget in (self.folder_edit, self.browse_button, self.type_combo):
            widget.setEnabled(enabled)
        self.start_button.setEnabled(enabled and bool(self.folder_edit.text().strip()))
        if enabled:
            self._on_type_combo_current_index_changed()
        else:
            self.keep_check.setEnabled(False)

    @Slot()
    def _on_cancel_button_clicked(self) -> None:
        self.reject()

    def reject(self) -> None:
        """Cancel (and Escape, and the close button) stops a running conversion first; the dialog
        stays open until it has stopped, so the user sees that nothing was left behind."""
        if self.transfer is not None and self.running():
            self.footer.cancel_job(self.transfer)
            return
        super().reject()

    @Slot(object)
    def _on_adapter_transfer_changed(self, transfer: Transfer) -> None:
        if not transfer.same_run(self.transfer):
            return
        self.transfer = transfer
        if transfer.state in JOB_ENDED:
            self.progress.setVisible(transfer.state == "done")
            if transfer.state == "done":
                self.progress.setRange(0, 1)
                self.progress.setValue(1)
            self.status.setText(f"{transfer.state}: {transfer.message}")
            self.cancel_button.setText("Close")
            self.cancel_button.setEnabled(True)
            # Fix the folder or the type and go again, or convert another checkpoint.
            self.start_button.setText("Convert another" if transfer.state == "done" else "Retry")
            self._set_form_enabled(True)
            return
        if transfer.total:
            self.progress.setRange(0, transfer.total)
            self.progress.setValue(transfer.done)
        if not self.transfer.cancel.is_set():
            self.status.setText(transfer.message)
