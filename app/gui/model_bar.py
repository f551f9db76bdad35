"""What drives the model bar (``app.gui.model_bar_widget.ModelBarWidget``: the picker, Load/Eject
and Add endpoint), :class:`ModelController`: scanning the models folder, the starter model, the saved
endpoints' remote models (what is in memory listed first, marked), loading and ejecting, the
model's state in the header, and the open chat's own model (switched to when it is kept loaded,
else offered in one line under the bar).

The controller is given every collaborator in its constructor and connects their signals itself;
the main window only builds it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import shiboken6
from PySide6.QtCore import QObject, QPointF, Qt, QTimer, Slot
from PySide6.QtGui import QColor, QIcon, QPainter, QPen, QPixmap
from PySide6.QtWidgets import QLabel, QWidget

from app.compose import RemoteModel, model_key
from app.gui.display_text import plain_tooltip, shown
from app.gui.endpoints_dialog import AddEndpointDialog, list_remote_models
from app.gui.tasks import describe_error, run_in_background
from app.gui.window_services import while_alive
from app.gui.workers.chat_state import ModelState
from app.gui.workers.llm_requests import LoadRequest
from app.gui.workers.model_routing import model_label, model_tooltip, parse_remote_model, picker_model
from app.gui.workers.speculative import draft_for
from engine.errors import ModelFileError

if TYPE_CHECKING:
    from app.gui.chat_view import ChatView
    from app.gui.composer import Composer
    from app.gui.inspector import InspectorPanel
    from app.gui.model_bar_widget import ModelBarWidget
    from app.gui.window_services import Notices, SettingsStore
    from app.gui.workers.chat_adapter import ChatAdapter
    from app.gui.workers.llm_requests import LoadedModel
    from app.gui.workers.models_worker import ModelsAdapter
    from app.gui.workers.resident_models import ResidentState
    from app.model_folders import OtherAppFolder
    from app.paths import Paths
    from engine.history_schema import Conversation
    from engine.library import LibraryEntry
    from engine.starter import StarterModel

log = logging.getLogger(__name__)

START_WAIT_MS = 1500
"""How long the first load waits for the history's list of chats (its first chat's model wins)."""


def list_model_files(folder: Path) -> list[Path]:
    """GGUF files in the models folder (sorted, no partial downloads)."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.rglob("*.gguf") if p.is_file() and not p.name.startswith("."))


def chat_model_files(folder: Path) -> list[Path]:
    """:func:`list_model_files` without the models that cannot chat: embedders and vision
    projectors (which fail deep in llama.cpp) and files whose header is unreadable (the Models page
    lists those with the reason)."""
    from engine.library import model_kind, read_model_info, split_parts  # lazy: start-up (+21 ms: the GGUF reader)

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


_MARKS: dict[str, QIcon] = {}


def picker_mark(kind: str) -> QIcon:
    """The picker's mark: a dot for the chat's model (``"in use"``), a ring for one kept loaded
    (``"kept"``), blank otherwise (so that the names stay aligned)."""
    icon = _MARKS.get(kind)
    if icon is None:
        size = 12
        pixmap = QPixmap(size, size)
        pixmap.fill(Qt.GlobalColor.transparent)
        if kind:
            painter = QPainter(pixmap)
            painter.setRenderHint(QPainter.RenderHint.Antialiasing)
            green = QColor("#2e9d57")
            painter.setPen(QPen(green, 2))
            painter.setBrush(green if kind == "in use" else Qt.GlobalColor.transparent)
            painter.drawEllipse(QPointF(size / 2, size / 2), size / 2 - 1.5, size / 2 - 1.5)
            painter.end()
        icon = _MARKS[kind] = QIcon(pixmap)
    return icon


class ModelController(QObject):
    """The models the picker offers, loading and ejecting them, and the model's state in the header.

    Args:
        bar: the model bar (its picker and buttons are connected here).
        status: the header's model state line.
        starter_note: the note shown while the starter model is loaded.
        chat: the chat adapter (loads, ejects, says the model's state).
        models: the Models page's adapters (the library: its scans, other apps' folders, bandwidth).
        composer: the composer (ready or not, and why).
        chat_view: the transcript (the assistant's name).
        inspector: the inspector (the model's size, context and CPU variant).
        settings: the window's settings (load parameters, the last model, auto-load).
        paths: the data folders (models, KV caches, the breadcrumb, the endpoints file).
        notices: the error banner and the status bar.
        window: the parent of the Add endpoint dialog.
        safe_mode: no model is loaded automatically.
        probe_bandwidth: measure the memory bandwidth at load (tests turn it off).
    """

    def __init__(
        self,
        *,
        bar: ModelBarWidget,
        status: QLabel,
        starter_note: QLabel,
        chat: ChatAdapter,
        models: ModelsAdapter,
        composer: Composer,
        chat_view: ChatView,
        inspector: InspectorPanel,
        settings: SettingsStore,
        paths: Paths,
        notices: Notices,
        window: QWidget,
        safe_mode: bool = False,
        probe_bandwidth: bool = True,
    ) -> None:
        super().__init__(window)
        self.bar = bar
        self.picker = bar.picker
        self.status = status
        self.starter_note = starter_note
        self.chat = chat
        self.models_adapter = models
        self.composer = composer
        self.chat_view = chat_view
        self.inspector = inspector
        self.settings = settings
        self.paths = paths
        self.notices = notices
        self.window = window
        self.safe_mode = safe_mode
        self.probe_bandwidth = probe_bandwidth
        self.models: list[Path] = []  # the local chat models in the picker
        self.remote_models: list[RemoteModel] = []  # the saved endpoints' models, after the local ones
        self.endpoints_file = paths.endpoints_file
        self._closed = False
        self._other_apps_note = ""  # the offer of other apps' model folders, until a load message repeats it
        self._kept: tuple[Path | RemoteModel, ...] = ()  # the models kept loaded beside the chat's
        self._scanned = False  # the library was scanned (before, a chat's model is never said to be gone)
        self._remotes_listed = False  # the same for the endpoints' models
        self._open_chat: int | None = None  # the open chat's id (opening another one may switch models)
        self._picked: tuple[Path | RemoteModel, int] | None = None  # a model the user picked, and the open chat
        # At start the chat the history opens first goes on with its own model: the first load
        # waits for the history's list (or START_WAIT_MS, if the history does not answer).
        self._history_listed = False
        self._start_chat_model: Path | RemoteModel | None = None
        self._auto_load_due = False
        bar.load_button.clicked.connect(self.load_or_eject)
        bar.chat_model.load_button.clicked.connect(self._on_chat_model_load_clicked)
        chat.conversation_opened.connect(self._on_chat_conversation_opened)
        chat.conversations_changed.connect(self._on_chat_conversations_changed)
        bar.add_endpoint_button.clicked.connect(lambda: self.add_endpoint())
        bar.picker.activated.connect(self._on_model_picker_activated)
        chat.model_state_changed.connect(self._on_chat_model_state_changed)
        chat.model_loaded.connect(self._on_chat_model_loaded)
        chat.bandwidth_measured.connect(self._on_chat_bandwidth_measured)
        chat.resident_models_changed.connect(self._on_chat_resident_models_changed)
        models.library_changed.connect(self._on_models_library_changed)

    def start(self) -> None:
        """Finds the local models (then auto-loads one, or installs the starter) and the remote ones."""
        self.refresh_models(first_start=True)
        self.refresh_remote_models()

    def shutdown(self) -> None:
        """Later background answers are dropped (the window is closing)."""
        self._closed = True

    def models_folder(self) -> Path:
        return self.settings.current.models_folder(self.paths.models)

    def widgets_alive(self) -> bool:
        """Whether the model bar is still shown: not closing, and the picker's C++ object still
        exists (Qt deletes it with the window)."""
        return not self._closed and shiboken6.isValid(self.picker)

    # ------------------------------------------------------------------ the picker's models
    def refresh_models(self, first_start: bool = False) -> None:
        """Scans the models folder on a worker, then fills the picker."""
        folder = self.models_folder()

        def scan() -> list[Path]:
            return chat_model_files(folder)

        run_in_background(
            scan,
            while_alive(self.widgets_alive, lambda found: self._on_models_scanned(found, first_start)),
            while_alive(self.widgets_alive, self._on_scan_failed),
        )

    def _on_scan_failed(self, exc: BaseException) -> None:
        self.notices.show_error(f"Model folder unavailable: {describe_error(exc)}")
        self.composer.set_ready(False, "No model folder")

    def _on_models_scanned(self, found: list[Path], first_start: bool) -> None:
        self._scanned = True
        self.set_models(found)
        if first_start:  # the Hugging Face cache and LM Studio's folder are hidden: offer them by name
            self.models_adapter.library.other_folders_found.connect(self._on_models_other_folders_found)
            self.models_adapter.library.find_other_apps()
        if not found and first_start:
            self._install_starter()
            return
        if first_start:
            self._auto_load_due = True
            if self._history_listed:
                self._auto_load_once()
            else:
                QTimer.singleShot(START_WAIT_MS, self, self._auto_load_once)
        elif self.chat.model_state is not ModelState.LOADED:
            self.composer.set_ready(False, "Pick a model and press Load")

    def set_models(self, found: list[Path]) -> None:
        """Fills the picker with ``found`` and the remote models, keeping the current choice."""
        if not self.widgets_alive():
            return  # a queued answer after the window closed (its picker is gone)
        picker = self.picker
        current = picker.currentData()
        self.models = list(found)
        picker.clear()
        entries: list[Path | RemoteModel] = [*found, *self.remote_models]
        loaded = self.chat.loaded.path if self.chat.loaded is not None else None
        # What is in memory first: the chat's model, then the ones kept loaded (choosing one is a
        # switch), then the rest of the library; a blank mark keeps the names aligned.
        in_memory = [m for m in (loaded, *self._kept) if m is not None and m in entries]
        rest = [m for m in entries if m not in in_memory]
        for path in in_memory + rest:
            if path == loaded:
                mark, state, why = "in use", "Loaded", "the chat's model"
            elif path in in_memory:
                mark, state, why = "kept", "Kept loaded", "switching to it is instant"
            else:
                mark, state, why = "", "", ""
            label = shown(model_label(path))
            picker.addItem(picker_mark(mark), label, model_key(path))
            index = picker.count() - 1
            tip = model_tooltip(path)
            picker.setItemData(
                index, plain_tooltip(f"{state}: {why}\n{tip}" if state else tip), Qt.ItemDataRole.ToolTipRole
            )
            picker.setItemData(
                index, f"{label}, {state.lower()}" if state else label, Qt.ItemDataRole.AccessibleTextRole
            )
            if in_memory and path is in_memory[-1] and rest:
                picker.insertSeparator(picker.count())
        if current is not None:
            index = picker.findData(current)
            if index >= 0:
                picker.setCurrentIndex(index)
        self.bar.load_button.setEnabled(picker.count() > 0)
        self._say_chat_model()

    def refresh_remote_models(self) -> None:
        """Lists the saved endpoints' models on a worker, then refreshes the picker."""
        run_in_background(
            lambda: list_remote_models(self.endpoints_file),
            while_alive(self.widgets_alive, self._on_remote_models_listed),
            while_alive(self.widgets_alive, self._on_remote_list_failed),
        )

    def _on_remote_models_listed(self, result: tuple[list[RemoteModel], list[str]]) -> None:
        self.remote_models, problems = result
        self._remotes_listed = True
        self.set_models(self.models)
        if problems:
            self.notices.show_status("Endpoint unavailable: " + "; ".join(problems), 10000)

    def _on_remote_list_failed(self, exc: BaseException) -> None:
        self.notices.show_status(f"Endpoints: {describe_error(exc)}", 10000)

    def add_endpoint(self) -> AddEndpointDialog:
        """Opens the "Add endpoint" dialog (non-modal); a saved endpoint refreshes the picker."""
        dialog = AddEndpointDialog(self.endpoints_file, self.window)
        dialog.accepted.connect(self.refresh_remote_models)
        dialog.open()
        return dialog

    def _install_starter(self) -> None:
        from engine.starter import starter_package_available  # lazy: start-up (+2 ms)

        if not starter_package_available():
            self.composer.set_ready(False, "No models yet: download one from the Models page.")
            self.notices.show_status("No models installed. Open Models → Discover to download one.")
            return
        self.status.setText("Preparing the starter model…")
        self.composer.set_ready(False, "Preparing the starter model (one time, ~250 MB)…")
        folder = self.models_folder()

        def install() -> StarterModel | None:
            from engine.starter import install_starter_model  # lazy: start-up (+2 ms)

            return install_starter_model(folder)

        def done(model: StarterModel | None) -> None:
            if model is None:
                self.composer.set_ready(False, "The starter model is not installed.")
                return
            self.set_models(chat_model_files(folder) or [model.path])
            self.models_adapter.library.scan()
            self._auto_load(prefer=model.path)

        run_in_background(
            install,
            while_alive(self.widgets_alive, done),
            while_alive(self.widgets_alive, lambda e: self.notices.show_error(f"Starter model: {describe_error(e)}")),
        )

    @Slot(object)
    def _on_chat_conversations_changed(self, conversations: list[Conversation]) -> None:
        if self.chat.conversation is None:  # the open chat was deleted: its line goes with it
            self._open_chat = None
            self._say_chat_model()
        if self._history_listed:
            return
        self._history_listed = True  # the first list: its first chat is the one opened at start
        first = conversations[0] if conversations else None
        self._start_chat_model = picker_model(first.model) if first is not None and first.model else None
        self._auto_load_once()

    @Slot()
    def _auto_load_once(self) -> None:
        """The first load, once both the library and the history's first list are known (or the
        history is late); none when a model was asked for meanwhile (the user's choice stands)."""
        if self._auto_load_due and self.widgets_alive():
            self._auto_load_due = False
            if self.chat.model_state is ModelState.NONE:
                self._auto_load()

    def _auto_load(self, prefer: Path | None = None) -> None:
        settings = self.settings.current
        if self.safe_mode:
            self.composer.set_ready(False, "Safe mode: no model was loaded automatically. Pick one and press Load.")
            self.status.setText("Safe mode")
            return
        if not settings.auto_load_model or not self.models:
            self.composer.set_ready(False, "Pick a model and press Load")
            return
        target = prefer
        wanted = self._chat_model() or self._start_chat_model  # the chat open at start: its own model
        if target is None and isinstance(wanted, Path) and wanted in self.models:
            target = wanted
        if target is None and settings.last_model:
            last = picker_model(settings.last_model)  # a remote model is not loaded at start
            target = last if isinstance(last, Path) and last in self.models else None
        if target is None:
            target = self.models[0]
        index = self.picker.findData(model_key(target))
        if index >= 0:
            self.picker.setCurrentIndex(index)
        self.load_model(target)

    # ------------------------------------------------------------------ loading
    def load_request_for(self, path: Path | RemoteModel) -> LoadRequest:
        """The load of ``path`` with Settings' parameters; ``gpu_layers="auto"`` stays "auto" here and
        is computed on the LLM worker thread (it probes the hardware: never on the GUI thread)."""
        settings = self.settings.current
        return LoadRequest(
            model_path=path,
            n_ctx=settings.n_ctx,
            n_threads=settings.n_threads,
            n_gpu_layers=settings.gpu_layers,
            overflow_policy=settings.overflow_policy,
            reply_reserve=settings.reply_reserve,
            label=model_label(path),
            breadcrumb=self.paths.breadcrumb,
            bandwidth_cache=self.paths.bandwidth_cache if self.probe_bandwidth else None,
            backend_state=self.paths.cpu_backend_state,
            kv_cache_dir=self.paths.kv_cache,
            kv_cache_max_bytes=settings.kv_cache_max_bytes,
            # speculative decoding's draft, from Settings (a remote model decodes on its own)
            draft_model_path=draft_for(settings, path) if isinstance(path, Path) else None,
            # the projector the library pairs it with (chosen by hand on the Models page, or found)
            mmproj_path=self.models_adapter.library.projector_of(path) if isinstance(path, Path) else None,
            keep_loaded=settings.models_kept_loaded,
            kept_idle_s=settings.models_idle_minutes * 60 or None,
        )

    def load_model(self, path: Path | RemoteModel) -> None:
        """Loads ``path`` (a local file or a remote model) and remembers it as the last model."""
        path = picker_model(path)  # an old glassbox-remote/... pseudo path: the remote model it meant
        self.chat.model.load(self.load_request_for(path))
        self.settings.current.last_model = model_key(path)
        self.settings.save()

    def pick(self, path: Path | RemoteModel) -> None:
        """Loads a model the user chose (the picker, Load, the Models page): once it is loaded, the
        chat open now remembers it."""
        path = picker_model(path)
        conv = self.chat.conversation
        self._picked = (path, conv.id) if conv is not None else None
        self.load_model(path)

    def load_from_page(self, path: Path) -> None:
        """Loads a model chosen on the Models page (the picker shows it, even a new file)."""
        self._select(path)
        self.pick(path)

    def _select(self, path: Path | RemoteModel) -> None:
        """Shows ``path`` in the picker (added when the picker does not list it yet)."""
        index = self.picker.findData(model_key(path))
        if index < 0:
            self.picker.addItem(shown(model_label(path)), model_key(path))
            index = self.picker.count() - 1
        self.picker.setCurrentIndex(index)

    @Slot()
    def load_or_eject(self) -> None:
        """Load (and Ctrl+L): loads the picker's model, or ejects it when it is the one loaded."""
        if self.chat.model_state is ModelState.LOADING:
            self.chat.model.cancel_load(by_user=True)  # the button says Cancel while a model loads
            return
        loaded = self.chat.loaded
        if (
            self.chat.model_state is ModelState.LOADED
            and loaded is not None
            and picker_model(self.picker.currentData() or "") == loaded.path
        ):
            self.chat.model.unload()
            return
        data = self.picker.currentData()
        if data:
            self.pick(picker_model(data))

    @Slot(int)
    def _on_model_picker_activated(self, index: int) -> None:
        data = self.picker.itemData(index)
        loaded = self.chat.loaded
        if data and (loaded is None or loaded.path != picker_model(data)):
            self.pick(picker_model(data))

    # ------------------------------------------------------------------ the open chat's own model
    def _chat_model(self) -> Path | RemoteModel | None:
        """The model the open chat used (None: no chat open, or it never named one)."""
        conv = self.chat.conversation
        return picker_model(conv.model) if conv is not None and conv.model else None

    def _current_model(self) -> Path | RemoteModel | None:
        """The model the chat talks to, or the one loading for it."""
        pending = self.chat.model.pending
        if self.chat.model_state is ModelState.LOADING and pending is not None:
            return pending.model_path
        loaded = self.chat.loaded
        return loaded.path if loaded is not None and self.chat.model_state is ModelState.LOADED else None

    def _listed(self, model: Path | RemoteModel) -> bool | None:
        """Whether the picker offers ``model`` (None: not known yet, its list is still coming)."""
        if isinstance(model, Path):
            return model in self.models if self._scanned else None
        return model in self.remote_models if self._remotes_listed else None

    @Slot(object, object)
    def _on_chat_conversation_opened(self, conversation: Conversation | None, _messages: object) -> None:
        """Another chat was opened: when the model it used is kept loaded, it is switched to (no
        load); otherwise its model is offered in one line (:meth:`_say_chat_model`)."""
        opened = conversation is not None and conversation.id != self._open_chat
        self._open_chat = conversation.id if conversation is not None else None
        wanted = self._chat_model()
        if opened and wanted is not None and wanted in self._kept and wanted != self._current_model():
            self._select(wanted)
            self.load_model(wanted)  # a switch: the worker makes the kept session the chat's
        self._say_chat_model()

    def _say_chat_model(self) -> None:
        """The line under the model bar: the open chat used another model than the loaded one."""
        offer = self.bar.chat_model
        wanted = self._chat_model()
        current = self._current_model()
        if wanted is None or wanted == current:
            offer.clear()
            return
        listed = self._listed(wanted)
        if listed is None:
            offer.clear()
            return
        label = model_label(wanted)
        if listed:
            kept = wanted in self._kept
            offer.say(
                f"This chat used {label}.",
                "Switch to it" if kept else "Load it",
                f"{'Switch to' if kept else 'Load'} {label} for this chat"
                + (" (it is kept loaded: instant)" if kept else ""),
            )
            return
        # Short, so that it fits at 1024 px; the picker above names the model that goes on. A remote
        # model may only be out of reach: its endpoint did not list it this time.
        gone = "its endpoint does not list it now" if isinstance(wanted, RemoteModel) else "no longer in the library"
        tip = f"The loaded model, {model_label(current)}, answers here." if current is not None else ""
        offer.say(f"This chat used {label}, {gone}.", None)
        offer.setToolTip(plain_tooltip(f"This chat used {label}, {gone}. {tip}".strip()))

    @Slot()
    def _on_chat_model_load_clicked(self) -> None:
        wanted = self._chat_model()
        if wanted is not None:
            self._select(wanted)
            self.load_model(wanted)

    @Slot(object, str)
    def _on_chat_model_state_changed(self, state: ModelState, detail: str) -> None:
        load_button = self.bar.load_button
        if state is ModelState.LOADING:
            self.status.setText("⟳ Loading…")
            self.composer.set_ready(False, f"Loading {detail}…")
            load_button.setText("Cancel")
            load_button.setToolTip(plain_tooltip(f"Stop loading {detail}"))
        elif state is ModelState.LOADED:
            self.status.setText("● Loaded")
            self.composer.set_ready(True)
            self.composer.set_state_text("")
            load_button.setText("Eject")
            load_button.setToolTip("Eject the loaded model, or load the one picked (Ctrl+L)")
        elif state is ModelState.FAILED:
            self.status.setText("✕ Failed")
            self.composer.set_ready(False, detail)
            load_button.setText("Load")
            load_button.setToolTip("Load the selected model (Ctrl+L)")
        else:
            self.status.setText("No model loaded")
            # Why, when it is known (a load the user cancelled), and what to do next.
            self.composer.set_ready(False, f"{detail}: pick a model and press Load" if detail else "No model loaded")
            load_button.setText("Load")
            load_button.setToolTip("Load the selected model (Ctrl+L)")
            self.starter_note.setVisible(False)
        if state is not ModelState.LOADING:
            self.set_models(self.models)  # the marks of what is loaded
        self._say_chat_model()

    @Slot(object)
    def _on_models_library_changed(self, entries: list[LibraryEntry]) -> None:
        self._scanned = True
        self.set_models([e.path for e in entries if e.chat_problem() is None])  # no embedders, no mmproj

    @Slot(object)
    def _on_models_other_folders_found(self, folders: list[OtherAppFolder]) -> None:
        self.models_adapter.library.other_folders_found.disconnect(self._on_models_other_folders_found)
        if folders:
            names = ", ".join(sorted({f.app for f in folders}))
            self._other_apps_note = f"Models from {names} were found here: open Models → Library to use them."
            self.notices.show_status(self._other_apps_note, 20000)

    @Slot(object)
    def _on_chat_resident_models_changed(self, kept: ResidentState) -> None:
        """The models kept loaded beside the chat's (opening a chat that used one switches to it),
        marked in the picker and named after it (choosing one is a switch), and their memory in the
        inspector."""
        self.inspector.set_resident(kept)
        if kept.kept != self._kept:
            self._kept = kept.kept
            self.set_models(self.models)
        labels = list(kept.names)
        label = self.bar.resident
        label.setVisible(bool(labels))
        if not labels:
            label.clear()
            return
        names = ", ".join(labels)
        # Short: the picker lists them, marked; a name here took the picker's room at 1024 px.
        label.setText(f"+{len(labels)} loaded")
        label.setAccessibleName(f"{len(labels)} more kept loaded: {names}")
        label.setToolTip(
            plain_tooltip(
                f"Kept loaded: {names} (marked with a ring in the list of models). Choosing one of them "
                "is instant; each holds its memory (Settings → Models kept loaded). Eject unloads them all."
            )
        )

    @Slot(float)
    def _on_chat_bandwidth_measured(self, gbps: float) -> None:
        self.models_adapter.library.bandwidth_gbps = gbps

    @Slot(object)
    def _on_chat_model_loaded(self, loaded: LoadedModel) -> None:
        from engine.starter import STARTER_MODEL_FILE  # lazy: start-up (+2 ms)

        info = loaded.info
        picked, self._picked = self._picked, None
        conv = self.chat.conversation
        if picked is not None and picked[0] == loaded.path and conv is not None and conv.id == picked[1]:
            self.chat.conversations.remember_model(model_key(loaded.path))  # the user chose it for this chat
            self._say_chat_model()
        self.starter_note.setVisible(loaded.path.name == STARTER_MODEL_FILE)
        self.chat_view.set_assistant_name(loaded.label)
        remote = parse_remote_model(loaded.path)
        model_bytes, cpu_backend = (info.model_bytes, info.cpu_backend) if info.kind == "local" else (None, None)
        self.inspector.set_model(
            model_bytes,
            info.n_ctx,
            loaded.machine_bandwidth_gbps,
            server=f"the server “{remote[0]}”" if remote is not None else None,
        )
        self.inspector.set_cpu_backend(cpu_backend, loaded.backend_note)
        note = self._other_apps_note  # said once more, or the load message would hide it
        self._other_apps_note = ""
        if loaded.kept:
            loaded_text = f"Switched to {loaded.label} in {loaded.load_ms:.0f} ms: it was kept loaded"
        else:
            loaded_text = f"Loaded {loaded.label} in {loaded.load_ms / 1000:.1f} s"
        if loaded.draft_path is not None:
            loaded_text += f", {loaded.draft_path.name} drafting for it"
        self.notices.show_status(f"{loaded_text} · {note}" if note else loaded_text, 20000 if note else 8000)
        if loaded.machine_bandwidth_gbps:
            self.models_adapter.library.bandwidth_gbps = loaded.machine_bandwidth_gbps
        self.notices.clear_error()
        if loaded.draft_note:  # the draft model chosen in Settings was refused: said, not hidden
            self.notices.show_error(loaded.draft_note)
