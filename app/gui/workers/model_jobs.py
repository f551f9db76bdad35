"""The model-jobs adapter: quantization, conversion, the quality check, size estimates.

Quantize, convert and the quality check run one at a time on ``glassbox-quantize``; the engine
runs their native part in a child process, so Cancel really stops them. Each reports through
``transfer_changed`` with frozen :class:`~app.gui.workers.transfers.Transfer` snapshots whose
``state`` ends in ``done``, ``error`` or ``cancelled``. The worker thread hands the GUI thread only
the engine's frozen progress reports (``QuantizeProgress``, ``PipelineProgress``), throttled, and
the GUI thread makes each into the next snapshot.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, Unpack

from PySide6.QtCore import QObject, Signal

from app.gui.tasks import SerialExecutor, call_on_gui_thread, describe_error, run_in_background
from app.gui.workers.transfers import Transfer
from app.paths import resource_path
from engine.errors import Cancelled

if TYPE_CHECKING:
    from app.gui.workers.library_adapter import LibraryAdapter
    from engine.convert.hf_to_gguf import ConvertQuantizeResult, PipelineProgress
    from engine.convert.perplexity import QualityReport
    from engine.convert.quant_estimate import QuantEstimate
    from engine.convert.quantize import QuantizeProgress, QuantizeResult


class JobChanges(TypedDict, total=False):
    """What a model job changes in its :class:`~app.gui.workers.transfers.Transfer` snapshot."""

    state: str
    done: int
    total: int
    message: str
    result: object


PROGRESS_INTERVAL_S = 0.2
QUALITY_STEPS = ("the source", "the result")
QUALITY_UNITS = 1000
"""A quality check's progress is in thousandths of each step (the tokens scored of each model)."""


class _Throttle:
    """Worker-thread side: passes a report on at most every ``PROGRESS_INTERVAL_S`` (or when forced)."""

    def __init__(self) -> None:
        self.last = 0.0

    def due(self, force: bool = False) -> bool:
        now = time.perf_counter()
        if force or now - self.last >= PROGRESS_INTERVAL_S:
            self.last = now
            return True
        return False


class ModelJobsAdapter(QObject):
    """Quantize, convert, check quality and estimate.

    Args:
        library: the library adapter (the models folder, provenance, rescans).

    Signals:
        transfer_changed(object): the new :class:`Transfer` snapshot of a job.
    """

    transfer_changed = Signal(object)

    def __init__(self, library: LibraryAdapter, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.library = library
        self.transfers: dict[str, Transfer] = {}  # the latest snapshot of each, GUI thread only
        self._quantize = SerialExecutor("glassbox-quantize")
        self._closed = False

    @property
    def models_dir(self) -> Path:
        return self.library.models_dir

    def _start(self, key: str, label: str, kind: str, **fields: Unpack[JobChanges]) -> Transfer:
        return self._put(Transfer(key=key, label=label, kind=kind, **fields))

    def _put(self, transfer: Transfer) -> Transfer:
        self.transfers[transfer.key] = transfer
        self.transfer_changed.emit(transfer)
        return transfer

    def _update(self, run: Transfer, **changes: Unpack[JobChanges]) -> None:
        """GUI thread: the next snapshot of ``run`` (ignored once another run holds its key)."""
        current = self.transfers.get(run.key)
        if current is not None and current.same_run(run):
            self._put(dataclasses.replace(current, **changes))

    def _post(self, run: Transfer, **changes: Unpack[JobChanges]) -> None:
        """Worker thread: asks the GUI thread for the next snapshot of ``run``."""
        call_on_gui_thread(functools.partial(self._update, run, **changes))

    def _job_failed(self, run: Transfer) -> Callable[[BaseException], None]:
        """The failure handler of a job: the transfer says cancelled or the error."""

        def failed(exc: BaseException) -> None:
            self._update(run, state="cancelled" if isinstance(exc, Cancelled) else "error", message=describe_error(exc))

        return failed

    # ------------------------------------------------------------------ quantize
    def quantize(self, src: Path, qtype: str, dst: Path, *, allow_requantize: bool = False) -> Transfer:
        """Quantizes ``src`` to ``qtype`` at ``dst`` (atomic; Cancel kills the child process).

        ``allow_requantize`` accepts an already quantized source (quality suffers).
        """
        run = self._start(f"quantize:{dst}", f"{src.name} → {qtype}", "quantize")
        throttle = _Throttle()

        def progress(update: QuantizeProgress) -> None:
            if throttle.due():
                self._post(
                    run,
                    done=update.done_tensors,
                    total=update.total_tensors,
                    state="quantizing",
                    message=update.tensor_name,
                )

        def work() -> QuantizeResult:
            # lazy: start-up (+57 ms)
            from engine.convert.quantize import quantize_model

            return quantize_model(
                src, dst, qtype, allow_requantize=allow_requantize, cancel=run.cancel, progress=progress
            )

        def done(result: QuantizeResult) -> None:
            # lazy: start-up (+52 ms)
            from engine.convert.quantize import size_change

            self._update(
                run,
                state="done",
                result=result,
                message=f"{result.dst_bytes / 2**20:.0f} MiB, {size_change(result.ratio)}, {result.seconds:.0f} s",
            )
            run_in_background(
                lambda: self.library.model_library().record_provenance(
                    dst, quantized_from=str(src), source="quantized"
                ),
                lambda _r: self.library.scan(),
            )

        self._quantize.submit(work, done, self._job_failed(run))
        return run

    # ------------------------------------------------------------------ convert
    def convert(self, folder: Path, qtype: str, keep_intermediate: bool = False) -> Transfer:
        """Converts a Hugging Face checkpoint folder to GGUF in the models folder, quantized to
        ``qtype`` (``engine.convert.hf_to_gguf.convert_and_quantize``; Cancel kills the running stage's child)."""
        run = self._start(f"convert:{folder}:{qtype}", f"{folder.name} → {qtype}", "convert")
        throttle = _Throttle()
        stage = [""]  # the last stage posted (worker thread only)

        def progress(update: PipelineProgress) -> None:
            if throttle.due(force=update.stage != stage[0]):
                stage[0] = update.stage
                self._post(
                    run,
                    done=update.done,
                    total=update.total,
                    state=update.stage,
                    message=f"Step {update.step} of {update.steps}: {update.text}",
                )

        def work() -> ConvertQuantizeResult:
            # lazy: start-up (+72 ms)
            from engine.convert.hf_to_gguf import convert_and_quantize

            self.models_dir.mkdir(parents=True, exist_ok=True)
            return convert_and_quantize(
                folder, qtype, out_folder=self.models_dir, keep_intermediate=keep_intermediate,
                library=self.library.model_library(), cancel=run.cancel, progress=progress,
            )  # fmt: skip

        def done(result: ConvertQuantizeResult) -> None:
            self._update(
                run,
                state="done",
                result=result,
                message=f"wrote {result.path.name} ({result.dst_bytes / 2**20:.1f} MiB) in {result.seconds:.0f} s",
            )
            self.library.scan()

        self._quantize.submit(work, done, self._job_failed(run))
        return run

    # ------------------------------------------------------------------ quality
    def check_quality(
        self, source: Path, result: Path, qtype: str, on_done: Callable[[QualityReport], None] | None = None
    ) -> Transfer:
        """Compares the perplexity of a model and its quantization on the shipped text, as
        ``glassbox models quantize --check-quality`` does: step 1 of 2 the source, 2 of 2 the result.

        The last snapshot's ``result`` is the ``engine.convert.perplexity.QualityReport``; Cancel kills the child.
        """
        steps = len(QUALITY_STEPS)
        run = self._start(f"quality:{result}", f"Quality check {result.name}", "quality", total=steps * QUALITY_UNITS)
        last: dict[str, float] = {"at": 0.0, "scored": -1.0}

        def progress(index: int, scored: int, total: int) -> None:
            """Step ``index`` scored ``scored`` of ``total`` tokens: the bar moves with them (at
            most ~10 updates a second), not only when a step ends."""
            now = time.monotonic()
            if last["scored"] > 0 and 0 < scored < total and now - last["at"] < 0.1:
                return  # a batch's report within 0.1 s of the step's last one
            last["at"], last["scored"] = now, float(scored)
            share = scored * QUALITY_UNITS // total if total else 0
            what = f"Step {index + 1} of {steps}: perplexity of {QUALITY_STEPS[index]}"
            message = f"{what} · {scored:,} of {total:,} tokens" if total else what
            self._post(run, state="measuring", done=index * QUALITY_UNITS + share, message=message)

        def work() -> QualityReport:
            # lazy: start-up (+60 ms)
            from engine.convert.perplexity import QualityReport, perplexity

            text = resource_path("perplexity.txt").read_text(encoding="utf-8")
            progress(0, 0, 0)
            before = perplexity(source, text, 256, cancel=run.cancel, on_progress=lambda s, t: progress(0, s, t))
            progress(1, 0, 0)
            after = perplexity(result, text, 256, cancel=run.cancel, on_progress=lambda s, t: progress(1, s, t))
            ratio = source.stat().st_size / max(result.stat().st_size, 1)
            return QualityReport(qtype=qtype, size_ratio=ratio, source_perplexity=before, result_perplexity=after)

        def done(report: QualityReport) -> None:
            ppl = f"{report.source_perplexity:.2f} → {report.result_perplexity:.2f}"
            self._update(
                run, state="done", done=run.total, result=report, message=f"{report.summary()} (perplexity {ppl})"
            )
            if on_done is not None:
                on_done(report)

        self._quantize.submit(work, done, self._job_failed(run))
        return run

    # ------------------------------------------------------------------ estimates
    def estimate_quantizations(
        self,
        path: Path,
        qtypes: list[str],
        on_done: Callable[[dict[str, QuantEstimate]], None],
        on_failed: Callable[[BaseException], None],
    ) -> None:
        """Per-tensor size estimates (``engine.convert.quant_estimate.QuantEstimate`` by type name) of
        quantizing ``path`` to each of ``qtypes``, read off the GUI thread."""

        def work() -> dict[str, QuantEstimate]:
            # lazy: start-up (+52 ms)
            from engine.convert.quant_estimate import estimate_quantized, read_tensor_shapes

            info, shapes = read_tensor_shapes(path)
            out: dict[str, QuantEstimate] = {}
            for q in qtypes:
                try:
                    out[q] = estimate_quantized(info, shapes, q)
                except ValueError:
                    continue  # a type the estimator does not know: the dialog falls back on bits per weight
            return out

        run_in_background(work, on_done, on_failed)

    def cancel_all(self) -> None:
        """Sets every job's cancel event (the engine kills their child processes)."""
        for transfer in self.transfers.values():
            transfer.cancel.set()

    def shutdown(self, wait: bool = True) -> None:
        """Cancels the running and queued jobs and stops the jobs thread."""
        if self._closed:
            return
        self._closed = True
        self.cancel_all()
        self._quantize.shutdown(wait=wait)
