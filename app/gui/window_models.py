"""The main window's model actions: scanning the models folder, the starter model, the model picker,
loading and ejecting, and the model's state in the header. A mixin of
:class:`app.gui.main_window.MainWindow` (kept apart for size)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import shiboken6
from PySide6.QtCore import Qt, Slot

from app.compose import RemoteModel, model_key
from app.gui.tasks import describe_error, run_in_background
from app.gui.workers.chat_adapter import ModelState
from app.gui.workers.llm_worker import LoadRequest
from app.gui.workers.model_routing import model_label, model_tooltip, picker_model
from app.gui.workers.speculative import draft_for

if TYPE_CHECKING:
    from PySide6.QtWidgets import QComboBox, QLabel, QPushButton, QStatusBar

    from app.gui.chat_view import ChatView
    from app.gui.composer import Composer
    from app.gui.endpoints_dialog import RemoteIntegration
    from app.gui.inspector import InspectorPanel
    from app.gui.workers.chat_adapter import ChatAdapter
    from app.gui.workers.llm_worker import LoadedModel
    from app.gui.workers.models_worker import ModelsAdapter
    from app.paths import Paths
    from app.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")


def list_model_files(folder: Path) -> list[Path]:
    """GGUF files in the models folder (sorted, no partial downloads)."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.rglob("*.gguf") if p.is_file() and not p.name.startswith("."))


def chat_model_files(folder: Path) -> list[Path]:
    """:func:`list_model_files` without the models that cannot chat: embedders and vision
    projectors (which fail deep in llama.cpp) and files whose header is unreadable (the Models page
    lists those with the reason)."""
    from engine.errors import ModelFileError
    from engine.library import model_kind, read_model_info, split_parts

    out = []
    for path in list_model_files(folder):
        parts = split_parts(path)
        if parts is not None and path != parts[0]:
            continue  # a later part of a split model: the first part stands for it
        try:
            if model_kind(read_model_info(path)) != "chat":
                continue
        except ModelFileError:
            continue
        out.append(path)
    return out


class ModelActions:
    """Model actions of the main window (needs the attributes annotated below)."""

    paths: Paths
    settings: Settings
    safe_mode: bool
    probe_bandwidth: bool
    models: list[Path]
    chat: ChatAdapter
    models_adapter: ModelsAdapter
    remote: RemoteIntegration
    chat_view: ChatView
    composer: Composer
    inspector: InspectorPanel
    model_picker: QComboBox
    load_button: QPushButton
    model_status: QLabel
    starter_note: QLabel
    banner: QLabel
    _models_page: Any
    _other_apps_note: str  # the offer of other apps' model folders, until a load message repeats it

    if TYPE_CHECKING:  # provided by MainWindow / QMainWindow; declared for the type checker only

        def statusBar(self) -> QStatusBar: ...
        def show_error(self, message: str) -> None: ...
        def show_page(self, index: int) -> None: ...
        def save_settings(self) -> None: ...

    def models_folder(self) -> Path:
        return self.settings.models_folder(self.paths.models)

    def widgets_alive(self) -> bool:
        """Whether the window still shows its model widgets: not closing, and the picker's C++
        object still exists (Qt deletes it with the window)."""
        return not getattr(self, "_closing", False) and shiboken6.isValid(self.model_picker)

    def _while_open(self, callback: Callable[[T], None]) -> Callable[[T], None]:
        """``callback`` for a background job's answer, dropped once the window has closed: the
        answer is queued on the GUI thread and may arrive after the widgets are deleted."""

        def guarded(value: T) -> None:
            if self.widgets_alive():
                callback(value)
            else:
                log.debug("a background answer came after the window closed; dropped")

        return guarded

    def refresh_models(self, first_start: bool = False) -> None:
        folder = self.models_folder()

        def scan() -> list[Path]:
            return chat_model_files(folder)

        run_in_background(
            scan,
            self._while_open(lambda found: self._on_models_scanned(found, first_start)),
            self._while_open(self._on_scan_failed),
        )

    def _on_scan_failed(self, exc: BaseException) -> None:
        self.show_error(f"Model folder unavailable: {describe_error(exc)}")
        self.composer.set_ready(False, "No model folder")

    def _on_models_scanned(self, found: list[Path], first_start: bool) -> None:
        self.set_models(found)
        if first_start:  # the Hugging Face cache and LM Studio's folder are hidden: offer them by name
            self.models_adapter.library.other_folders_found.connect(self._on_models_other_folders_found)
            self.models_adapter.library.find_other_apps()
        if not found and first_start:
            self._install_starter()
            return
        if first_start:
            self._auto_load()
        elif self.chat.model_state is not ModelState.LOADED:
            self.composer.set_ready(False, "Pick a model and press Load")

    def set_models(self, found: list[Path]) -> None:
        if not self.widgets_alive():
            return  # a queued answer after the window closed (its picker is gone)
        current = self.model_picker.currentData()
        self.models = list(found)
        self.model_picker.clear()
        entries: list[Path | RemoteModel] = [*found, *self.remote.remote_models]
        for path in entries:
            self.model_picker.addItem(model_label(path), model_key(path))
            self.model_picker.setItemData(
                self.model_picker.count() - 1, model_tooltip(path), Qt.ItemDataRole.ToolTipRole
            )
        if current is not None:
            index = self.model_picker.findData(current)
            if index >= 0:
                self.model_picker.setCurrentIndex(index)
        self.load_button.setEnabled(self.model_picker.count() > 0)

    def _install_starter(self) -> None:
        from engine.starter import starter_package_available

        if not starter_package_available():
            self.composer.set_ready(False, "No models yet: download one from the Models page.")
            self.statusBar().showMessage("No models installed. Open Models → Discover to download one.")
            return
        self.model_status.setText("Preparing the starter model…")
        self.composer.set_ready(False, "Preparing the starter model (one time, ~250 MB)…")
        folder = self.models_folder()

        def install() -> Any:
            from engine.starter import install_starter_model

            return install_starter_model(folder)

        def done(model: Any) -> None:
            if model is None:
                self.composer.set_ready(False, "The starter model is not installed.")
                return
            self.set_models(chat_model_files(folder) or [model.path])
            self.models_adapter.library.scan()
            self._auto_load(prefer=model.path)

        run_in_background(
            install,
            self._while_open(done),
            self._while_open(lambda e: self.show_error(f"Starter model: {describe_error(e)}")),
        )

    def _auto_load(self, prefer: Path | None = None) -> None:
        if self.safe_mode:
            self.composer.set_ready(False, "Safe mode: no model was loaded automatically. Pick one and press Load.")
            self.model_status.setText("Safe mode")
            return
        if not self.settings.auto_load_model or not self.models:
            self.composer.set_ready(False, "Pick a model and press Load")
            return
        target = prefer
        if target is None and self.settings.last_model:
            last = picker_model(self.settings.last_model)  # a remote model is not loaded at start
            target = last if isinstance(last, Path) and last in self.models else None
        if target is None:
            target = self.models[0]
        index = self.model_picker.findData(model_key(target))
        if index >= 0:
            self.model_picker.setCurrentIndex(index)
        self.load_model(target)

    # ------------------------------------------------------------------ loading
    def load_request_for(self, path: Path | RemoteModel) -> LoadRequest:
        """The load of ``path`` with Settings' parameters; ``gpu_layers="auto"`` stays "auto" here and
        is computed on the LLM worker thread (it probes the hardware: never on the GUI thread)."""
        return LoadRequest(
            model_path=path,
            n_ctx=self.settings.n_ctx,
            n_threads=self.settings.n_threads,
            n_gpu_layers=self.settings.gpu_layers,
            overflow_policy=self.settings.overflow_policy,
            reply_reserve=self.settings.reply_reserve,
            label=model_label(path),
            breadcrumb=self.paths.breadcrumb,
            bandwidth_cache=self.paths.bandwidth_cache if self.probe_bandwidth else None,
            backend_state=self.paths.cpu_backend_state,
            kv_cache_dir=self.paths.kv_cache,
            kv_cache_max_bytes=self.settings.kv_cache_max_bytes,
            # speculative decoding's draft, from Settings (a remote model decodes on its own)
            draft_model_path=draft_for(self.settings, path) if isinstance(path, Path) else None,
        )

    def load_model(self, path: Path | RemoteModel) -> None:
        path = picker_model(path)  # an old glassbox-remote/... pseudo path: the remote model it meant
        self.chat.load_model(self.load_request_for(path))
        self.settings.last_model = model_key(path)
        self.save_settings()

    @Slot()
    def _on_load_button_clicked(self) -> None:
        loaded = self.chat.loaded
        if (
            self.chat.model_state is ModelState.LOADED
            and loaded is not None
            and picker_model(self.model_picker.currentData() or "") == loaded.path
        ):
            self.chat.unload_model()
            return
        data = self.model_picker.currentData()
        if data:
            self.load_model(picker_model(data))

    @Slot(int)
    def _on_model_picker_activated(self, index: int) -> None:
        data = self.model_picker.itemData(index)
        loaded = self.chat.loaded
        if data and (loaded is None or loaded.path != picker_model(data)):
            self.load_model(picker_model(data))

    @Slot(object, str)
    def _on_chat_model_state_changed(self, state: ModelState, detail: str) -> None:
        if state is ModelState.LOADING:
            self.model_status.setText("⟳ Loading…")
            self.composer.set_ready(False, f"Loading {detail}…")
            self.load_button.setText("Load")
        elif state is ModelState.LOADED:
            self.model_status.setText("● Loaded")
            self.composer.set_ready(True)
            self.composer.set_state_text("")
            self.load_button.setText("Eject")
        elif state is ModelState.FAILED:
            self.model_status.setText("✕ Failed")
            self.composer.set_ready(False, detail)
            self.load_button.setText("Load")
        else:
            self.model_status.setText("No model loaded")
            self.composer.set_ready(False, "No model loaded")
            self.load_button.setText("Load")
            self.starter_note.setVisible(False)

    @Slot(object)
    def _on_models_library_changed(self, entries: list[Any]) -> None:
        self.set_models([e.path for e in entries if e.chat_problem() is None])  # no embedders, no mmproj

    @Slot(object)
    def _on_models_other_folders_found(self, folders: list[Any]) -> None:
        self.models_adapter.library.other_folders_found.disconnect(self._on_models_other_folders_found)
        if folders:
            names = ", ".join(sorted({f.app for f in folders}))
            self._other_apps_note = f"Models from {names} were found here: open Models → Library to use them."
            self.statusBar().showMessage(self._other_apps_note, 20000)

    @Slot(object)
    def _on_models_page_load_requested(self, path: Path) -> None:
        index = self.model_picker.findData(model_key(path))
        if index < 0:
            self.model_picker.addItem(model_label(path), model_key(path))
            index = self.model_picker.count() - 1
        self.model_picker.setCurrentIndex(index)
        self.load_model(path)
        self.show_page(0)

    @Slot(float)
    def _on_chat_bandwidth_measured(self, gbps: float) -> None:
        self.models_adapter.library.bandwidth_gbps = gbps

    @Slot(object)
    def _on_chat_model_loaded(self, loaded: LoadedModel) -> None:
        from engine.starter import STARTER_MODEL_FILE

        info = loaded.info
        self.starter_note.setVisible(loaded.path.name == STARTER_MODEL_FILE)
        self.chat_view.set_assistant_name(loaded.label)
        self.inspector.set_model(
            getattr(info, "model_bytes", None), getattr(info, "n_ctx", None), loaded.machine_bandwidth_gbps
        )
        self.inspector.set_cpu_backend(getattr(info, "cpu_backend", None), loaded.backend_note)
        note = getattr(self, "_other_apps_note", "")  # said once more, or the load message would hide it
        self._other_apps_note = ""
        loaded_text = f"Loaded {loaded.label} in {loaded.load_ms / 1000:.1f} s"
        if loaded.draft_path is not None:
            loaded_text += f", {loaded.draft_path.name} drafting for it"
        self.statusBar().showMessage(f"{loaded_text} · {note}" if note else loaded_text, 20000 if note else 8000)
        if self._models_page is not None:
            self._models_page.set_loaded(loaded.path if isinstance(loaded.path, Path) else None)
        if loaded.machine_bandwidth_gbps:
            self.models_adapter.library.bandwidth_gbps = loaded.machine_bandwidth_gbps
        self.banner.setVisible(False)
        if loaded.draft_note:  # the draft model chosen in Settings was refused: said, not hidden
            self.show_error(loaded.draft_note)
