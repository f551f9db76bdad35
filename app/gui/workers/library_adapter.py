"""The model library adapter: scans, the hardware probe, fit verdicts and the folders it indexes.

Every call into the engine runs on the shared background pool, never on the GUI thread; results
come back as signals. The one :class:`engine.library.ModelLibrary` it builds is shared with the
downloads and model-jobs adapters (they record where files came from and ask for a rescan).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from PySide6.QtCore import QObject, Signal

from app.gui.tasks import describe_error, run_in_background

if TYPE_CHECKING:
    from app.model_folders import OtherAppFolder
    from engine.fit import FitEstimate
    from engine.gguf import GgufInfo
    from engine.hardware import HardwareInfo
    from engine.library import LibraryEntry, ModelLibrary

DECLINED_FILE_NAME = "model_folders_declined.json"


class LibraryAdapter(QObject):
    """Fronts the model library and this machine's fit for models.

    Args:
        models_dir: the owned models folder.
        manifest: the library manifest file.
        folders_file: where added folders are kept.

    Signals:
        library_changed(object): list of ``engine.library.LibraryEntry``.
        hardware_ready(object): ``engine.hardware.HardwareInfo``.
        other_folders_found(object): :class:`~app.model_folders.OtherAppFolder` list, the model
            folders of other apps that exist here and are neither in the library nor declined.
        error_occurred(str): a one-line message.
    """

    library_changed = Signal(object)
    hardware_ready = Signal(object)
    other_folders_found = Signal(object)
    error_occurred = Signal(str)

    def __init__(self, models_dir: Path, manifest: Path, folders_file: Path, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.models_dir = models_dir
        self.manifest = manifest
        self.folders_file = folders_file
        self.hardware: HardwareInfo | None = None
        self.bandwidth_gbps: float | None = None
        self.entries: list[LibraryEntry] = []
        self._library_lock = threading.Lock()
        self._library: ModelLibrary | None = None
        self._library_where: tuple[Path, Path, Path] | None = None

    def model_library(self) -> ModelLibrary:
        """The library (pure to build; call it off the GUI thread to use it).

        One instance while the folders stay the same: its lock keeps a scan from writing back a
        manifest read before a concurrent ``record_provenance`` (both run on the background pool).
        """
        # lazy: start-up (+35 ms)
        from engine.library import ModelLibrary

        where = (self.models_dir, self.manifest, self.folders_file)
        with self._library_lock:
            if self._library is None or self._library_where != where:
                self._library = ModelLibrary(
                    self.models_dir, manifest_path=self.manifest, folders_file=self.folders_file
                )
                self._library_where = where
            return self._library

    def fail(self, prefix: str) -> Callable[[BaseException], None]:
        """An error handler that says ``prefix: reason`` on ``error_occurred``."""
        return lambda exc: self.error_occurred.emit(f"{prefix}: {describe_error(exc)}")

    # ------------------------------------------------------------------ the library
    def scan(self) -> None:
        """Rescans the library (library_changed)."""

        def done(entries: list[LibraryEntry]) -> None:
            self.entries = entries
            self.library_changed.emit(entries)

        run_in_background(lambda: self.model_library().scan(), done, self.fail("Model library"))

    def record(self, repo: str, records: list[tuple[Path, str, str | None]], *, base_model: str | None = None) -> None:
        """Records where downloaded files came from (``(path, revision, sha256)`` each; for a LoRA
        adapter, the base its repository names), then rescans."""
        run_in_background(
            lambda: record_provenance(self.model_library(), repo, records, base_model), lambda _r: self.scan()
        )

    def add_folder(self, folder: Path) -> None:
        self.add_folders([folder])

    def add_folders(self, folders: list[Path]) -> None:
        """Indexes ``folders`` in place, one after the other in one job (each write of the folder
        list reads the previous one), then rescans."""

        def work() -> None:
            library = self.model_library()
            for folder in folders:
                library.add_folder(folder)

        run_in_background(work, lambda _r: self.scan(), self.fail("Add folder"))

    def set_projector(self, model: Path, projector: Path | None, on_error: Callable[[str], None] | None = None) -> None:
        """Chooses ``model``'s projector by hand (None: back to the one found beside it), then
        rescans; a file that is not a projector, or another model's, is one line on
        ``error_occurred`` (and to ``on_error``) and changes nothing."""

        def failed(exc: BaseException) -> None:
            reason = f"Projector: {describe_error(exc)}"
            self.error_occurred.emit(reason)
            if on_error is not None:
                on_error(reason)

        run_in_background(lambda: self.model_library().set_projector(model, projector), lambda _r: self.scan(), failed)

    def projector_of(self, model: Path) -> Path | Literal["auto"] | None:
        """The projector a load of ``model`` uses: the library's (chosen by hand, else found beside
        it; None: it sees nothing), or "auto" when the library has not listed ``model`` yet."""
        for entry in self.entries:
            if entry.path == model:
                return entry.projector
        return "auto"

    def delete(self, path: Path) -> None:
        """Deletes a model file the library owns (the caller asked for confirmation)."""
        run_in_background(lambda: self.model_library().remove(path), lambda _r: self.scan(), self.fail("Delete"))

    # ------------------------------------------------------------------ other apps' folders
    @property
    def declined_file(self) -> Path:
        """Other apps' model folders the user said no to (beside the folder list)."""
        return self.folders_file.with_name(DECLINED_FILE_NAME)

    def find_other_apps(self) -> None:
        """Looks for the Hugging Face cache and LM Studio's models folder (other_folders_found)."""

        def work() -> list[OtherAppFolder]:
            # lazy: start-up (+6 ms)
            from app.model_folders import offered_folders

            return offered_folders(self.model_library().extra_dirs, self.declined_file)

        run_in_background(work, self.other_folders_found.emit, self.fail("Model folders of other apps"))

    def decline_folders(self, folders: list[Path]) -> None:
        """Remembers that the user does not want these folders offered again."""

        def work() -> None:
            # lazy: start-up (+5 ms)
            from app.model_folders import decline

            decline(self.declined_file, folders)

        run_in_background(work, None, self.fail("Model folders"))

    # ------------------------------------------------------------------ hardware and fit
    def probe(self) -> None:
        """Probes the hardware once (for fit badges)."""

        def work() -> HardwareInfo:
            # lazy: start-up (+33 ms)
            from engine.hardware import probe_hardware

            return probe_hardware()

        def done(hw: HardwareInfo) -> None:
            self.hardware = hw
            self.hardware_ready.emit(hw)

        run_in_background(work, done, self.fail("Hardware probe"))

    def fit(self, entry: LibraryEntry, n_ctx: int) -> FitEstimate | None:
        """The fit estimate for a library entry, its projector counted when it has one (None when
        unknown). Cheap: pure arithmetic on headers the scan read."""
        return self.fit_for_info(
            entry.info, min(n_ctx, entry.context_length or n_ctx), projector=self.projector_info(entry)
        )

    def projector_info(self, entry: LibraryEntry) -> GgufInfo | None:
        """The header of ``entry``'s projector, as the scan read it (None: it has none)."""
        return entry.projector_facts.header if entry.projector_facts is not None else None

    def fit_for_size(self, size: int) -> FitEstimate | None:
        """A rough fit verdict for a file not downloaded yet."""
        if self.hardware is None or size <= 0:
            return None
        # lazy: start-up (+56 ms)
        from engine.fit import estimate_fit_from_size

        return estimate_fit_from_size(size, self.hardware, self.bandwidth_gbps)

    def fit_for_info(
        self, info: GgufInfo | None, n_ctx: int, *, projector: GgufInfo | None = None
    ) -> FitEstimate | None:
        """The fit estimate for a header (say, of a file a quantization will write), with its
        projector's header when it has one; None when unknown."""
        if self.hardware is None or info is None:
            return None
        # lazy: start-up (+44 ms)
        from engine.fit import estimate_fit

        try:
            return estimate_fit(
                info,
                self.hardware,
                min(n_ctx, info.context_length or n_ctx),
                bandwidth_gbps=self.bandwidth_gbps,
                projector=projector,
            )
        except (ValueError, ArithmeticError):
            return None


def record_provenance(
    library: ModelLibrary, repo: str, records: list[tuple[Path, str, str | None]], base_model: str | None = None
) -> None:
    """Records where downloaded files came from: ``(path, revision, sha256)`` each, and for a LoRA
    adapter the ``base_model`` its repository names (None: keep what was recorded)."""
    for path, revision, sha256 in records:
        fields = {"repo": repo, "revision": revision}
        if sha256:  # unknown for a skipped file without a listed hash: keep what was recorded
            fields["sha256"] = sha256
        if base_model:
            fields["base_model"] = base_model
        library.record_provenance(path, **fields)
