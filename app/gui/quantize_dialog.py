"""The Quantize… and Check quality… dialogs of the Models page.

Quantize: pick a type (expected size per tensor, decode speed and fit for each), optionally allow
requantizing an already quantized model (with its warning) and check the quality afterwards, then
watch it run with progress and Cancel; after an error or a cancel, Retry. Check quality: the
perplexity of a model and of its quantization on the shipped text, in two steps, with progress
and Cancel, as ``glassbox models quantize --check-quality`` does.

The dialogs only choose and watch: :class:`app.gui.workers.model_jobs.ModelJobsAdapter` runs the jobs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import shiboken6
from PySide6.QtCore import Qt, Slot
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QDialog,
    QHeaderView,
    QLabel,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.gui.display_text import plain_tooltip, rich, shown
from app.gui.job_footer import add_job_footer
from app.gui.tasks import describe_error
from app.gui.theme import ThemeColors, applied_colors
from app.gui.workers.models_worker import ModelsAdapter
from app.gui.workers.transfers import JOB_ENDED, Transfer
from engine.units import format_bytes

if TYPE_CHECKING:
    from engine.convert.quant_estimate import QuantEstimate
    from engine.fit import FitEstimate
    from engine.library import LibraryEntry

VERDICT_TEXT = {"gpu": "fits on GPU", "partial": "partial offload", "ram": "fits in RAM", "no": "won't fit"}

UNQUANTIZED = ("F32", "F16", "BF16")


def table_item(text: str, tip: str = "", align_right: bool = False) -> QTableWidgetItem:
    """A read-only cell with an optional tooltip (both plain: names in them are shown as they are)."""
    item = QTableWidgetItem(shown(text))
    if tip:
        item.setToolTip(plain_tooltip(tip))
    if align_right:
        item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
    return item


def verdict_item(fit: FitEstimate | None) -> QTableWidgetItem:
    """A coloured ``● fits in RAM`` cell (``…`` while the machine is being probed)."""
    if fit is None:
        return table_item("…", "checking this machine")
    item = table_item(f"● {VERDICT_TEXT.get(fit.verdict, fit.verdict)}", fit.message)
    item.setForeground(QColor(verdict_color(fit.verdict)))
    return item


def verdict_color(verdict: str, colors: ThemeColors | None = None) -> str:
    """The colour of a verdict's text in the theme shown (4.5:1 on the tables' rows)."""
    colors = colors or applied_colors()
    return str(getattr(colors, f"fit_{verdict}", colors.muted))


def is_quantized(quant: str | None) -> bool:
    """True for a file type other than F32/F16/BF16 (``None``: unknown, treated as quantized)."""
    return (quant or "?").upper() not in UNQUANTIZED


class QuantizeDialog(QDialog):
    """Pick a quantization type, then watch it (and the optional quality check) run.

    Args:
        adapter: the models adapter that runs the job.
        entry: the ``engine.library.LibraryEntry`` to quantize.
        n_ctx: the context length the fit verdicts assume.
        parent: the parent widget.
    """

    def __init__(
        self, adapter: ModelsAdapter, entry: LibraryEntry, parent: QWidget | None = None, n_ctx: int = 4096
    ) -> None:
        super().__init__(parent)
        # lazy: start-up (+67 ms)
        from engine.convert.quantize import default_output_path

        self.setWindowTitle(f"Quantize {shown(entry.name)}")
        self.setMinimumWidth(720)
        self.resize(780, 600)
        self.adapter = adapter
        self.entry = entry
        self.n_ctx = n_ctx
        self.transfer: Transfer | None = None
        self.quality_transfer: Transfer | None = None
        self.estimates: dict[str, QuantEstimate] = {}
        self._default_output = default_output_path
        layout = QVBoxLayout(self)
        source_type = entry.quant or "?"
        note = QLabel(
            f"Source: <b>{rich(entry.name)}</b> ({rich(source_type)}, {format_bytes(entry.size)}). "
            "Quantizing from F16/F32/BF16 keeps the most quality."
        )
        note.setTextFormat(Qt.TextFormat.RichText)  # the names in it are escaped (rich)
        note.setWordWrap(True)
        layout.addWidget(note)
        self.requantize = is_quantized(entry.quant)
        self.warning_label = QLabel(
            f"⚠ <b>This model is already quantized</b> ({rich(source_type)}). Quantizing it again loses "
            "quality on top of what its quantization lost; use the F16/BF16 original when you have it. "
            "A larger type (Q8_0, F16) cannot bring the lost quality back."
        )
        self.warning_label.setTextFormat(Qt.TextFormat.RichText)
        self.warning_label.setObjectName("warning")
        self.warning_label.setWordWrap(True)
        self.warning_label.setVisible(self.requantize)
        layout.addWidget(self.warning_label)
        self.requantize_check = QCheckBox("Allow requantizing (quality suffers)")
        self.requantize_check.setVisible(self.requantize)
        self.requantize_check.toggled.connect(self._update_start)
        layout.addWidget(self.requantize_check)
        self.table = self._build_table()
        self._fill_estimates()
        layout.addWidget(self.table, 1)
        self.quality_check = QCheckBox("Check the quality afterwards (perplexity of source and result)")
        self.quality_check.setToolTip(
            "Measures both models on a short shipped text, as `glassbox models quantize "
            "--check-quality` does; about a minute for a small model"
        )
        layout.addWidget(self.quality_check)
        self.footer = footer = add_job_footer(layout, "Quantize")
        self.progress, self.status, self.buttons = footer.progress, footer.status, footer.buttons
        self.start_button, self.cancel_button = footer.start_button, footer.cancel_button
        self.start_button.clicked.connect(self._on_start_button_clicked)
        self.cancel_button.clicked.connect(self._on_cancel_button_clicked)
        adapter.jobs.transfer_changed.connect(self._on_adapter_transfer_changed)
        adapter.library.hardware_ready.connect(self._on_adapter_hardware_ready)
        self._update_start()
        self.status.setText("Estimating the size of each type from the model's tensors…")
        adapter.jobs.estimate_quantizations(
            entry.path, [t.name for t in self.types], self._on_estimates_ready, self._on_estimates_failed
        )

    # ------------------------------------------------------------------ the table
    def _build_table(self) -> QTableWidget:
        """The types on offer (Q4_K_M selected); sizes, speeds and fit come with the estimates."""
        # lazy: start-up (+63 ms)
        from engine.convert.quantize import quant_types

        table = QTableWidget(0, 5)
        table.setHorizontalHeaderLabels(["Type", "Expected size", "Expected decode", "Fit", "About"])
        table.verticalHeader().setVisible(False)
        table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        table.horizontalHeader().setSectionResizeMode(4, QHeaderView.ResizeMode.Stretch)
        self.types = [t for t in quant_types() if t.available]
        table.setRowCount(len(self.types))
        for row, qtype in enumerate(self.types):
            table.setItem(row, 0, table_item(qtype.name))
            table.setItem(row, 4, table_item(qtype.description))
            if qtype.name == "Q4_K_M":
                table.selectRow(row)
        return table

    @Slot(object)
    def _on_adapter_hardware_ready(self, _hw: object) -> None:
        self._fill_estimates()

    def _on_estimates_ready(self, estimates: dict[str, QuantEstimate]) -> None:
        if not shiboken6.isValid(self):
            return  # closed before the estimate came back
        self.estimates = estimates
        if not self.running():
            self.status.setText("")
        self._fill_estimates()

    def _on_estimates_failed(self, exc: BaseException) -> None:
        if shiboken6.isValid(self) and not self.running():
            self.status.setText(f"Sizes are rough (bits per weight): {describe_error(exc)}")

    def _fill_estimates(self) -> None:
        # lazy: start-up (+47 ms)
        from engine.fit import decode_bytes_per_token

        bandwidth = self.adapter.library.bandwidth_gbps
        for row, qtype in enumerate(self.types):
            estimate = self.estimates.get(qtype.name)
            if estimate is not None:
                size = estimate.file_bytes
                fit = self.adapter.library.fit_for_info(estimate.info, self.n_ctx)
                per_token = decode_bytes_per_token(estimate.info)
                by_size = sorted(estimate.type_bytes.items(), key=lambda kv: -kv[1])
                tip = "per tensor, from the model's real shapes: " + ", ".join(
                    f"{name} {format_bytes(n)}" for name, n in by_size
                )
            else:
                size = qtype.estimate_bytes(self.entry.params or 0)
                fit = self.adapter.library.fit_for_size(size)
                per_token = size
                tip = "rough: bits per weight × parameters"
            tps = getattr(fit, "expected_decode_tps", None)
            if not tps and bandwidth and per_token:
                tps = bandwidth * 1e9 / per_token
            speed = f"≈ {tps:.0f} tok/s" if tps else "—"
            self.table.setItem(row, 1, table_item(format_bytes(size), tip, align_right=True))
            self.table.setItem(
                row,
                2,
                table_item(
                    speed, "memory bandwidth ÷ bytes read per token (the weights and the KV cache)", align_right=True
                ),
            )
            self.table.setItem(row, 3, verdict_item(fit))
        for column in range(4):
            self.table.resizeColumnToContents(column)

    def selected_type(self) -> str | None:
        rows = self.table.selectionModel().selectedRows()
        return self.types[rows[0].row()].name if rows else None

    def running(self) -> bool:
        return any(t is not None and t.state not in JOB_ENDED for t in (self.transfer, self.quality_transfer))

    @Slot()
    def _update_start(self) -> None:
        allowed = not self.requantize or self.requantize_check.isChecked()
        self.start_button.setEnabled(allowed and not self.running())
        if self.requantize and not allowed and not self.running():
            self.start_button.setToolTip("Tick “Allow requantizing” first: this model is already quantized")
        else:
            self.start_button.setToolTip("")

    # ------------------------------------------------------------------ running
    @Slot()
    def _on_start_button_clicked(self) -> None:
        qtype = self.selected_type()
        if qtype is None or self.running():
            return
        if self.requantize and not self.requantize_check.isChecked():
            self.status.setText("This model is already quantized: tick “Allow requantizing” to go on.")
            return
        dst = self._default_output(self.entry.path, qtype, self.adapter.library.models_dir)
        self.quality_transfer = None
        self.transfer = self.adapter.jobs.quantize(self.entry.path, qtype, dst, allow_requantize=self.requantize)
        self._set_running(True)
        self.progress.setRange(0, 0)
        self.status.setText(f"Writing {dst.name}…")

    def _set_running(self, running: bool) -> None:
        for widget in (self.table, self.requantize_check, self.quality_check):
            widget.setEnabled(not running)
        if running:
            self.progress.setVisible(True)
        elif self.progress.maximum() == 0:
            # A job that ended before it reported a step (a Cancel, a failure): no busy bar left.
            self.progress.setRange(0, 1)
            self.progress.setValue(0)
            self.progress.setVisible(False)
        self.cancel_button.setText("Cancel" if running else "Close")
        self.cancel_button.setEnabled(True)
        self._update_start()

    @Slot()
    def _on_cancel_button_clicked(self) -> None:
        self.reject()

    def reject(self) -> None:
        """Cancel (and Escape, and the close button) stops a running job first; the dialog stays
        open until it has stopped."""
        for transfer in (self.transfer, self.quality_transfer):
            if transfer is not None and transfer.state not in JOB_ENDED:
                self.footer.cancel_job(transfer)
                return
        super().reject()

    @Slot(object)
    def _on_adapter_transfer_changed(self, transfer: Transfer) -> None:
        if transfer.same_run(self.quality_transfer):
            self.quality_transfer = transfer  # the latest snapshot of the check
            self._on_quality_changed(transfer)
            return
        if not transfer.same_run(self.transfer):
            return
        self.transfer = transfer
        if transfer.state not in JOB_ENDED:
            if transfer.total:
                self.progress.setRange(0, transfer.total)
                self.progress.setValue(transfer.done)
            if not transfer.cancel.is_set():
                self.status.setText(f"{transfer.done}/{transfer.total} tensors · {transfer.message}")
            return
        if transfer.state == "done":
            self.progress.setRange(0, 1)
            self.progress.setValue(1)
            if self.quality_check.isChecked():
                self.status.setText(f"done: {transfer.message}. Checking the quality…")
                self.quality_transfer = self.adapter.jobs.check_quality(
                    self.entry.path, transfer.result.path, transfer.result.qtype
                )
                self.progress.setRange(0, self.quality_transfer.total)
                self.progress.setValue(0)
                return
            self.status.setText(f"done: {transfer.message}")
            self.start_button.setText("Quantize again")
        else:
            self.progress.setVisible(False)
            self.status.setText(f"{transfer.state}: {transfer.message}")
            self.start_button.setText("Retry")
        self._set_running(False)

    def _on_quality_changed(self, transfer: Transfer) -> None:
        if transfer.state not in JOB_ENDED:
            self.progress.setRange(0, transfer.total)
            self.progress.setValue(transfer.done)
            if not transfer.cancel.is_set():
                self.status.setText(f"Quality: {transfer.message}")
            return
        quantized = self.transfer.message if self.transfer is not None else ""
        if transfer.state == "done":
            self.progress.setValue(transfer.total)
            self.status.setText(f"done: {quantized}. Quality: {transfer.message}")
        else:
            self.status.setText(f"done: {quantized}. Quality check {transfer.state}: {transfer.message}")
        self.start_button.setText("Quantize again")
        self._set_running(False)


class QualityDialog(QDialog):
    """The perplexity of a model against its source, with progress, Cancel and Retry.

    Args:
        adapter: the models adapter that runs the check.
        source: the model it was quantized from.
        result: the quantized model.
        qtype: the result's type (for the summary).
        parent: the parent widget.
    """

    def __init__(
        self, adapter: ModelsAdapter, source: Path, result: Path, qtype: str, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle(f"Check the quality of {shown(result.name)}")
        self.setMinimumWidth(560)
        self.adapter = adapter
        self.source, self.result_path, self.qtype = source, result, qtype  # QDialog.result() is a method
        self.transfer: Transfer | None = None
        layout = QVBoxLayout(self)
        note = QLabel(
            f"Compares the perplexity of <b>{rich(result.name)}</b> with its source "
            f"<b>{rich(source.name)}</b> on a short shipped text (lower is better)."
        )
        note.setTextFormat(Qt.TextFormat.RichText)  # the names in it are escaped (rich)
        note.setWordWrap(True)
        layout.addWidget(note)
        self.footer = footer = add_job_footer(layout, "Check")
        self.progress, self.status = footer.progress, footer.status
        self.start_button, self.cancel_button = footer.start_button, footer.cancel_button
        self.start_button.clicked.connect(self.start)
        self.cancel_button.clicked.connect(self.reject)
        adapter.jobs.transfer_changed.connect(self._on_adapter_transfer_changed)
        if not source.exists():
            self.status.setText(f"The source {source} is gone: the check needs it.")
            self.start_button.setEnabled(False)

    def running(self) -> bool:
        return self.transfer is not None and self.transfer.state not in JOB_ENDED

    @Slot()
    def start(self) -> None:
        """Starts (or retries) the check."""
        if self.running():
            return
        self.transfer = self.adapter.jobs.check_quality(self.source, self.result_path, self.qtype)
        self.start_button.setEnabled(False)
        self.cancel_button.setText("Cancel")
        self.cancel_button.setEnabled(True)
        self.progress.setVisible(True)
        self.progress.setRange(0, self.transfer.total)
        self.progress.setValue(0)
        self.status.setText("Starting…")

    def reject(self) -> None:
        """Cancel stops a running check first (the dialog stays open until it has stopped)."""
        if self.transfer is not None and self.running():
            self.footer.cancel_job(self.transfer)
            return
        super().reject()

    @Slot(object)
    def _on_adapter_transfer_changed(self, transfer: Transfer) -> None:
        if not transfer.same_run(self.transfer):
            return
        self.transfer = transfer
        self.progress.setValue(transfer.done)
        if transfer.state not in JOB_ENDED:
            if not transfer.cancel.is_set():
                self.status.setText(transfer.message)
            return
        self.status.setText(transfer.message if transfer.state == "done" else f"{transfer.state}: {transfer.message}")
        self.start_button.setText("Check again" if transfer.state == "done" else "Retry")
        self.start_button.setEnabled(True)
        self.cancel_button.setText("Close")
        self.cancel_button.setEnabled(True)
