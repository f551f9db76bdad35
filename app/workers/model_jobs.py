"""The models adapter's long jobs: quantization, conversion, the quality check, size estimates.

A mixin of :class:`app.workers.models_worker.ModelsAdapter` (kept apart for size). Quantize,
convert and the quality check run one at a time on ``glassbox-quantize``; the engine runs their
native part in a child process, so Cancel really stops them. Each reports through the adapter's
``transfer_changed`` with a :class:`~app.workers.models_worker.Transfer` whose ``state`` ends in
``done``, ``error`` or ``cancelled``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.tasks import call_on_gui_thread, describe_error, run_in_background

if TYPE_CHECKING:
    from PySide6.QtCore import SignalInstance

    from app.tasks import SerialExecutor
    from app.workers.models_worker import Transfer

PROGRESS_INTERVAL_S = 0.2
QUALITY_STEPS = ("the source", "the result")


class ModelJobs:
    """Quantize, convert, check quality and estimate (needs the attributes annotated below)."""

    models_dir: Path
    transfers: dict[str, Transfer]
    transfer_changed: SignalInstance
    _quantize: SerialExecutor

    if TYPE_CHECKING:  # provided by ModelsAdapter

        def library(self) -> Any: ...
        def scan(self) -> None: ...

    def _new_transfer(self, key: str, label: str, kind: str) -> Transfer:
        from app.workers.models_worker import Transfer

        transfer = Transfer(key=key, label=label, kind=kind)
        self.transfers[key] = transfer
        self.transfer_changed.emit(transfer)
        return transfer

    def quantize(self, src: Path, qtype: str, dst: Path, *, allow_requantize: bool = False) -> Transfer:
        """Quantizes ``src`` to ``qtype`` at ``dst`` (atomic; Cancel kills the child process).

        ``allow_requantize`` accepts an already quantized source (quality suffers).
        """
        transfer = self._new_transfer(f"quantize:{dst}", f"{src.name} → {qtype}", "quantize")
        last = [0.0]

        def progress(update: Any) -> None:
            now = time.perf_counter()
            transfer.done, transfer.total = update.done_tensors, update.total_tensors
            transfer.state = "quantizing"
            transfer.message = update.tensor_name
            if now - last[0] >= PROGRESS_INTERVAL_S:
                last[0] = now
                call_on_gui_thread(lambda: self.transfer_changed.emit(transfer))

        def work() -> Any:
            from engine.quantize import quantize_model

            return quantize_model(src, dst, qtype, allow_requantize=allow_requantize, cancel=transfer.cancel,
                                  progress=progress)

        def done(result: Any) -> None:
            from engine.quantize import size_change

            transfer.state = "done"
            transfer.result = result
            transfer.message = (
                f"{result.dst_bytes / 2**20:.0f} MiB, {size_change(result.ratio)}, {result.seconds:.0f} s"
            )
            self.transfer_changed.emit(transfer)
            run_in_background(
                lambda: self.library().record_provenance(dst, quantized_from=str(src), source="quantized"),
                lambda _r: self.scan(),
            )

        self._quantize.submit(work, done, self._job_failed(transfer))
        return transfer

    def convert(self, folder: Path, qtype: str, keep_intermediate: bool = False) -> Transfer:
        """Converts a Hugging Face checkpoint folder to GGUF in the models folder, quantized to
        ``qtype`` (``engine.convert.convert_and_quantize``; Cancel kills the running stage's child)."""
        transfer = self._new_transfer(f"convert:{folder}:{qtype}", f"{folder.name} → {qtype}", "convert")
        last = [0.0]

        def progress(update: Any) -> None:
            now = time.perf_counter()
            new_stage = update.stage != transfer.state
            transfer.done, transfer.total = update.done, update.total
            transfer.state = update.stage
            transfer.message = f"Step {update.step} of {update.steps}: {update.text}"
            if new_stage or now - last[0] >= PROGRESS_INTERVAL_S:
                last[0] = now
                call_on_gui_thread(lambda: self.transfer_changed.emit(transfer))

        def work() -> Any:
            from engine.convert import convert_and_quantize

            self.models_dir.mkdir(parents=True, exist_ok=True)
            return convert_and_quantize(
                folder, qtype, out_folder=self.models_dir, keep_intermediate=keep_intermediate,
                library=self.library(), cancel=transfer.cancel, progress=progress,
            )  # fmt: skip

        def done(result: Any) -> None:
            transfer.state = "done"
            transfer.result = result
            seconds = f"{result.seconds:.0f} s"
            transfer.message = f"wrote {result.path.name} ({result.dst_bytes / 2**20:.1f} MiB) in {seconds}"
            self.transfer_changed.emit(transfer)
            self.scan()

        self._quantize.submit(work, done, self._job_failed(transfer))
        return transfer

    def _job_failed(self, transfer: Transfer) -> Callable[[BaseException], None]:
        """The failure handler of a job: the transfer says cancelled or the error."""

        def failed(exc: BaseException) -> None:
            from engine.errors import Cancelled

            transfer.state = "cancelled" if isinstance(exc, Cancelled) else "error"
            transfer.message = describe_error(exc)
            self.transfer_changed.emit(transfer)

        return failed

    def check_quality(
        self, source: Path, result: Path, qtype: str, on_done: Callable[[Any], None] | None = None
    ) -> Transfer:
        """Compares the perplexity of a model and its quantization on the shipped text, as
        ``glassbox models quantize --check-quality`` does: step 1 of 2 the source, 2 of 2 the result.

        ``transfer.result`` is the ``engine.perplexity.QualityReport``; Cancel kills the child.
        """
        transfer = self._new_transfer(f"quality:{result}", f"Quality check {result.name}", "quality")
        transfer.total = len(QUALITY_STEPS)

        def step(index: int) -> None:
            transfer.state = "measuring"
            transfer.done = index
            transfer.message = f"Step {index + 1} of {len(QUALITY_STEPS)}: perplexity of {QUALITY_STEPS[index]}"
            call_on_gui_thread(lambda: self.transfer_changed.emit(transfer))

        def work() -> Any:
            from app.paths import resource_path
            from engine.perplexity import QualityReport, perplexity

            text = resource_path("perplexity.txt").read_text(encoding="utf-8")
            step(0)
            before = perplexity(source, text, 256, cancel=transfer.cancel)
            step(1)
            after = perplexity(result, text, 256, cancel=transfer.cancel)
            ratio = source.stat().st_size / max(result.stat().st_size, 1)
            return QualityReport(qtype=qtype, size_ratio=ratio, source_perplexity=before, result_perplexity=after)

        def done(report: Any) -> None:
            transfer.state = "done"
            transfer.done = transfer.total
            transfer.result = report
            ppl = f"{report.source_perplexity:.2f} → {report.result_perplexity:.2f}"
            transfer.message = f"{report.summary()} (perplexity {ppl})"
            self.transfer_changed.emit(transfer)
            if on_done is not None:
                on_done(report)

        self._quantize.submit(work, done, self._job_failed(transfer))
        return transfer

    def estimate_quantizations(
        self, path: Path, qtypes: list[str], on_done: Callable[[dict[str, Any]], None],
        on_failed: Callable[[BaseException], None],
    ) -> None:
        """Per-tensor size estimates (``engine.quant_estimate.QuantEstimate`` by type name) of
        quantizing ``path`` to each of ``qtypes``, read off the GUI thread."""

        def work() -> dict[str, Any]:
            from engine.quant_estimate import estimate_quantized, read_tensor_shapes

            info, shapes = read_tensor_shapes(path)
            out: dict[str, Any] = {}
            for q in qtypes:
                try:
                    out[q] = estimate_quantized(info, shapes, q)
                except ValueError:
                    continue  # a type the estimator does not know: the dialog falls back on bits per weight
            return out

        run_in_background(work, on_done, on_failed)
