"""The main window (started by ``app.gui.launch.run_gui``, the ``glassbox`` command without a subcommand).

The window is built from light widgets only and shown before anything slow happens: at launch it
is built in two steps (ARCHITECTURE.md, "The window's start"): the first frame from a glance at the
settings, then the settings read in full and what drives the widgets. History, the model scan, the
starter model and the model load all start after that, on workers. Importing this module imports no
pydantic, llama_cpp, torch, sentence_transformers, chromadb or huggingface_hub (a test checks it).

The window builds the adapters, the widgets and the controllers that drive them, and wires them:
the chat list (``conversation_controller``), a turn as it runs (``turn_controller``), the
documents (``documents_controller``), the model bar (``model_bar``) and the local API server
(``api_server_control``). Each controller gets its collaborators in its constructor.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QByteArray, QSettings, Qt, QTimer, Signal, Slot
from PySide6.QtGui import (
    QAction,
    QCloseEvent,
    QDragEnterEvent,
    QDropEvent,
    QIcon,
    QKeySequence,
    QPaintEvent,
    QResizeEvent,
)
from PySide6.QtWidgets import (
    QApplication,
    QHBoxLayout,
    QMainWindow,
    QWidget,
)

from app.gui.chat_page import ChatPage
from app.gui.composer import is_media_drop
from app.gui.display_text import plain_tooltip, shown
from app.gui.markdown_render import render_markdown
from app.gui.page_stack import PageStack
from app.gui.tasks import run_in_background, shutdown_background
from app.gui.theme import RESOURCES, apply_theme, resolve_theme
from app.gui.toast import Toast
from app.gui.window_header import NavRailWidget
from app.gui.window_layout import apply_first_geometry, chain_focus, restore_geometry, set_wrapped_text
from app.paths import Paths
from app.settings_glance import SettingsGlance, glance_settings

if TYPE_CHECKING:
    from app.gui.api_server_control import ApiServerControl
    from app.gui.chat_tools_menu import ChatToolsController
    from app.gui.compare_controller import CompareController
    from app.gui.conversation_controller import ConversationController
    from app.gui.documents_controller import DocumentsController
    from app.gui.knowledge_panel import KnowledgePanel
    from app.gui.model_bar import ModelController
    from app.gui.model_panel import ModelPanel
    from app.gui.turn_controller import TurnController
    from app.gui.window_services import SettingsStore
    from app.gui.workers.chat_adapter import ChatAdapter
    from app.gui.workers.history_service import HistoryService
    from app.gui.workers.knowledge_worker import KnowledgeAdapter
    from app.gui.workers.llm_loading import SessionFactory
    from app.gui.workers.llm_requests import LoadedModel
    from app.gui.workers.models_worker import ModelsAdapter
    from app.settings import Settings, SettingsLoad

log = logging.getLogger(__name__)
SHUTDOWN_DEADLINE_S = 5.0
CHAT_PAGE, MODELS_PAGE, KNOWLEDGE_PAGE = 0, 1, 2


FIRST_FRAME_WAIT_MS = 1000
"""A window built in two steps builds the rest this long after it was made if no frame was painted
by then (a window shown minimized paints none)."""


def warm_up_rendering() -> None:
    """Imports the Markdown parser off the GUI thread, so the first reply does not pay for it."""
    render_markdown("*warm* `up`")


class MainWindow(QMainWindow):
    """Glassbox's window: navigation rail, chat page (sidebar, transcript, inspector), models, knowledge.

    Built in one step from ``Settings``, or in two from a function that reads them (the app's
    launch): first what the first frame shows (the rail and the chat page's widgets, from the two
    settings :func:`app.settings_glance.glance_settings` reads without pydantic), then, once that
    frame is on screen, the settings read in full and everything that drives the widgets (the
    adapters and their workers, the controllers, the shortcuts). :meth:`start` builds the rest
    first if it is not built yet.

    Args:
        paths: where data lives.
        settings: the loaded settings, or a function that loads them (two steps).
        safe_mode: do not auto-load a model.
        safe_reason: why safe mode is on (shown to the user).
        session_factory: engine session builder (tests inject fakes).
        history_factory: history store builder (tests may inject fakes).
        kb_factory: KnowledgeBases builder (tests share one loaded embedder).
        settings_warning: why the settings file was not read as it is (shown at start; a function
            in ``settings`` says it itself).
        probe_bandwidth: measure the memory bandwidth when a model loads.

    Signals:
        first_frame_shown(): the window's first frame is on screen; what it left out is built next.
        completed(): what the first frame left out is built.
    """

    first_frame_shown = Signal()
    completed = Signal()
    # Built with the settings read in full (at once, or after the first frame: _finish).
    store: SettingsStore
    history: HistoryService
    knowledge: KnowledgeAdapter
    models_adapter: ModelsAdapter
    chat: ChatAdapter
    api_server: ApiServerControl
    documents: DocumentsController
    model_control: ModelController
    chat_tools: ChatToolsController
    turns: TurnController
    compare: CompareController
    conversations: ConversationController
    shortcuts: dict[str, QAction]

    def __init__(
        self,
        paths: Paths,
        settings: Settings | Callable[[], SettingsLoad],
        *,
        safe_mode: bool = False,
        safe_reason: str | None = None,
        session_factory: SessionFactory | None = None,
        history_factory: Callable[[Path], object] | None = None,
        kb_factory: Callable[[], object] | None = None,
        settings_warning: str | None = None,
        probe_bandwidth: bool = True,
    ) -> None:
        super().__init__()
        self.paths = paths
        self.safe_reason = safe_reason
        self.settings_warning = settings_warning
        self._closing = False
        self._first_frame = True  # the next paint is the first (paintEvent)
        self._complete_done = False
        self._built = False
        # The Models and Knowledge pages are built the first time they are shown (start-up cost).
        self._models_page: ModelPanel | None = None
        self._knowledge_page: KnowledgePanel | None = None
        self.setWindowTitle("Glassbox")
        icon = RESOURCES / "icons" / "glassbox.svg"
        if icon.exists():
            self.setWindowIcon(QIcon(str(icon)))
        apply_first_geometry(self)
        self.setAcceptDrops(True)
        if callable(settings):  # two steps: the first frame from a glance at the file
            read: Callable[[], SettingsLoad] | None = settings
            glance = glance_settings(paths.settings_file)
        else:
            read, glance = None, SettingsGlance(theme=settings.theme, show_inspector=settings.show_inspector)
        self.colors = resolve_theme(glance.theme)
        self._build_pages(glance.show_inspector)
        self.toast = Toast(self)
        # A long status message is cut at the window's edge: its whole text is the bar's tooltip.
        self.statusBar().messageChanged.connect(self._on_status_bar_message_changed)
        self.statusBar().showMessage("Starting…")
        self.apply_colors()
        self._restore_geometry()
        # A timer owned by the window, so it dies with it (a bare singleShot would outlive it).
        self._banner_timer = QTimer(self)
        self._banner_timer.setSingleShot(True)
        self._banner_timer.timeout.connect(self.clear_error)
        self._parts = (safe_mode, probe_bandwidth, session_factory, history_factory, kb_factory)
        self._read_settings = read
        if not callable(settings):
            self._finish(settings, settings_warning)
        else:
            QTimer.singleShot(FIRST_FRAME_WAIT_MS, self, self._complete)  # no frame painted: build anyway

    def _finish(self, settings: Settings, warning: str | None) -> None:
        """The second step: the settings, the adapters, the controllers, the wiring, the shortcuts."""
        # lazy: start-up (they drive the widgets, so they come after the first frame: ~0.1 s)
        from app.gui.window_services import SettingsStore

        self.store = SettingsStore(settings, self.paths.settings_file, self)
        self.settings_warning = warning
        self.chat_page.inspector_choice_changed.connect(self._on_inspector_choice_changed)
        if settings.show_inspector != self.chat_page.inspector_choice:
            self.chat_page.set_inspector_choice(settings.show_inspector)
        safe_mode, probe_bandwidth, session_factory, history_factory, kb_factory = self._parts
        self._build_adapters(session_factory, history_factory, kb_factory)
        self._build_controllers(safe_mode, probe_bandwidth)
        self._wire()
        self._build_shortcuts()
        self._built = True
        colors = resolve_theme(settings.theme)
        if colors != self.colors:  # a migration of an older file changed it (the glance runs none)
            self.colors = colors
            self.apply_colors()

    def _ensure_built(self) -> None:
        """Builds the second step now if it waits for the first frame (:meth:`_finish`)."""
        read, self._read_settings = self._read_settings, None
        if read is not None:
            loaded = read()
            self._finish(loaded.settings, loaded.warning)

    @Slot(bool)
    def _on_inspector_choice_changed(self, show: bool) -> None:
        self.store.current.show_inspector = show

    @property
    def settings(self) -> Settings:
        """The settings as they are now (Settings… replaces them)."""
        return self.store.current

    @settings.setter
    def settings(self, value: Settings) -> None:
        self.store.current = value

    # ------------------------------------------------------------------ building
    def _build_adapters(
        self,
        session_factory: SessionFactory | None,
        history_factory: Callable[[Path], object] | None,
        kb_factory: Callable[[], object] | None,
    ) -> None:
        # lazy: start-up (the adapters and their workers come after the first frame, _finish)
        from app.gui.workers.chat_adapter import ChatAdapter
        from app.gui.workers.history_service import HistoryService
        from app.gui.workers.knowledge_worker import KnowledgeAdapter
        from app.gui.workers.models_worker import ModelsAdapter

        paths, settings = self.paths, self.settings
        self.history = HistoryService(paths.history_db, history_factory)
        embedder = Path(settings.embedding_model) if settings.embedding_model else None
        self.knowledge = KnowledgeAdapter(
            paths.knowledge, embedder, kb_factory, parent=self, idle_stop_s=settings.knowledge_idle_minutes * 60
        )
        folder = settings.models_folder(paths.models)
        self.models_adapter = ModelsAdapter(
            folder, Paths.manifest_of(folder), paths.model_folders, parent=self,
            queue_file=paths.download_queue,
        )  # fmt: skip
        self.chat = ChatAdapter(
            self.history,
            session_factory,
            retriever_factory=self.knowledge.chat_retriever,
            parent=self,
            endpoints_file=paths.endpoints_file,
        )

    def _build_pages(self, show_inspector: bool) -> None:
        root = QWidget()
        root_layout = QHBoxLayout(root)
        root_layout.setContentsMargins(0, 0, 0, 0)
        root_layout.setSpacing(0)
        self.nav_rail = NavRailWidget()  # app/gui/window_header.py
        self.nav_rail.settings_button.clicked.connect(self.open_settings)
        root_layout.addWidget(self.nav_rail)
        self.pages = PageStack(self.nav_rail.nav_group)  # app/gui/page_stack.py
        root_layout.addWidget(self.pages, 1)
        self.setCentralWidget(root)
        self.pages.addWidget(self._build_chat_page(show_inspector))
        self.pages.add_lazy(self._build_models_page)  # MODELS_PAGE, built on first use
        self.pages.add_lazy(self._build_knowledge_page)  # KNOWLEDGE_PAGE, built on first use

    def _build_chat_page(self, show_inspector: bool) -> QWidget:
        """The chat page (``app.gui.chat_page.ChatPage``); its widgets keep a name on the window."""
        page = ChatPage(self.paths, show_inspector)
        self.chat_page = self.splitter = page
        self.header = page.header  # the model bar, the state row (app/gui/window_header.py)
        self.sidebar, self.chat_view, self.composer, self.inspector = (
            page.sidebar,
            page.chat_view,
            page.composer,
            page.inspector,
        )
        self.banner, self.documents_bar = page.banner, page.documents_bar
        self.tools_button = page.header.tools_button  # this chat's Tools switch (app/gui/chat_tools_menu.py)
        self.inspector_button = page.inspector_button
        return page

    def _build_controllers(self, safe_mode: bool, probe_bandwidth: bool) -> None:
        """The controllers, each given what it drives and what it tells (in the order the adapters'
        signals reach them)."""
        # lazy: start-up (the controllers come after the first frame, _finish)
        from app.gui.api_server_control import ApiServerControl
        from app.gui.chat_tools_menu import ChatToolsController
        from app.gui.compare_controller import CompareController
        from app.gui.conversation_controller import ConversationController
        from app.gui.documents_controller import DocumentsController
        from app.gui.model_bar import ModelController
        from app.gui.turn_controller import TurnController

        chat, store, header = self.chat, self.store, self.header
        self.api_server = ApiServerControl(
            settings=store, chat=chat, knowledge=self.knowledge, paths=self.paths,
            status_bar=self.statusBar(), notices=self, parent=self,
        )  # fmt: skip
        self.documents = DocumentsController(
            chat=chat, knowledge=self.knowledge, bar=self.documents_bar, docs_label=header.docs_label,
            index_label=header.index_label, notices=self, selected_knowledge_base=self.selected_knowledge_base,
            show_knowledge=lambda: self.show_page(KNOWLEDGE_PAGE), window=self,
        )  # fmt: skip
        self.model_control = ModelController(
            bar=header.model_bar, status=header.model_status, starter_note=header.starter_note, chat=chat,
            models=self.models_adapter, composer=self.composer, chat_view=self.chat_view, inspector=self.inspector,
            settings=store, paths=self.paths, notices=self, window=self, safe_mode=safe_mode,
            probe_bandwidth=probe_bandwidth,
        )  # fmt: skip
        self.chat_tools = ChatToolsController(self)  # tool cards, approvals, thinking, the loop timeline
        self.turns = TurnController(
            chat=chat, chat_view=self.chat_view, composer=self.composer, inspector=self.inspector,
            sidebar=self.sidebar, tools=self.chat_tools, settings=store, notices=self, window=self,
        )  # fmt: skip
        self.compare = CompareController(
            chat=chat, inspector=self.inspector, turn_context=self.turns.turn_context, window=self
        )  # fmt: skip
        self.conversations = ConversationController(
            chat=chat, history=self.history, sidebar=self.sidebar, chat_view=self.chat_view,
            composer=self.composer, inspector=self.inspector, toast=self.toast, settings=store,
            kv_cache=self.paths.kv_cache, notices=self, window=self,
        )  # fmt: skip

    def _wire(self) -> None:
        self.chat.error_occurred.connect(self.show_error)
        self.knowledge.error_occurred.connect(self.show_error)
        self.models_adapter.error_occurred.connect(self.show_error)
        self.chat.model_loaded.connect(self._on_chat_model_loaded)
        self.header.chat_settings_button.clicked.connect(self.conversations.open_conversation_settings)

    def _build_shortcuts(self) -> None:
        from app.gui.window_shortcuts import let_shortcuts_through  # lazy: start-up (after the first frame)

        def add(name: str, keys: QKeySequence | str, slot: Callable[..., object]) -> QAction:
            action = QAction(name, self)
            action.setShortcut(QKeySequence(keys))
            action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
            action.triggered.connect(slot)
            self.addAction(action)
            return action

        self.shortcuts = {
            "new": add("New chat", "Ctrl+N", self.conversations.new_chat),
            "search": add("Search chats", "Ctrl+K", self._focus_search),
            "stop": add("Stop", "Esc", self.chat.turns.stop),
            "regenerate": add("Regenerate", "Ctrl+Shift+R", self.turns.regenerate_last),
            "inspector": add("Toggle inspector", "Ctrl+I", self.inspector_button.toggle),
            "settings": add("Settings", "Ctrl+,", self.open_settings),
            "load": add("Load model", "Ctrl+L", self.model_control.load_or_eject),
            "export": add("Export chat", "Ctrl+E", lambda: self.conversations.export_conversation(None, "md")),
            "focus": add("Focus composer", "Ctrl+/", self.composer.edit.setFocus),
        }
        for index, key in enumerate(("chat", "models", "knowledge")):
            # triggered(bool) passes ``checked`` first: it must not land in the page index.
            self.shortcuts[f"page_{key}"] = add(
                key, f"Ctrl+{index + 1}", lambda _checked=False, i=index: self.show_page(i)
            )
        # Ctrl+E exports, Ctrl+K searches… also from a text field (X11 gives them to editing).
        let_shortcuts_through((self.sidebar.search, self.composer.edit), self.shortcuts.values())
        # Tab in reading order: the chats, the header, the transcript (its cards' buttons follow it:
        # ChatView.order_focus), the composer, then the inspector.
        bar = self.header.model_bar
        chain_focus(
            [
                self.sidebar.new_button, self.sidebar.search, self.sidebar.list, bar.picker, bar.load_button,
                bar.add_endpoint_button, self.documents_bar.button, self.header.chat_settings_button,
                self.tools_button, self.inspector_button, self.chat_view, self.composer.edit,
                self.composer.send_button, self.composer.stop_button, self.inspector.tabs,
            ]
        )  # fmt: skip
        self.chat_view.focus_after = self.composer.edit

    # ------------------------------------------------------------------ start-up (after first paint)
    def paintEvent(self, event: QPaintEvent) -> None:
        super().paintEvent(event)
        if self._first_frame:
            self._first_frame = False
            # Once this frame is on screen (its paint is flushed before the loop's next turn), the
            # rest is built: the first frame does not wait for what it does not show.
            QTimer.singleShot(0, self, self._complete)

    def _complete(self) -> None:
        if self._complete_done:
            return
        self._complete_done = True
        self.first_frame_shown.emit()
        self._ensure_built()
        self.inspector.ensure_contents()
        self.completed.emit()

    def start(self) -> None:
        """Loads the history, finds the models and (unless in safe mode) loads one, all on workers."""
        self._ensure_built()
        if self.safe_reason:
            self.show_error(self.safe_reason)
        if self.settings_warning:
            self.statusBar().showMessage(self.settings_warning, 15000)
        self.conversations.start()
        self.model_control.start()
        self.models_adapter.unfinished_found.connect(  # they come back as paused rows on Models → Discover
            lambda n: self.statusBar().showMessage(f"{n} unfinished download(s): Models → Discover to resume", 15000)
        )
        self.models_adapter.find_unfinished()
        run_in_background(warm_up_rendering)
        if not self.settings_warning:
            self.statusBar().showMessage("Ready", 3000)

    # ------------------------------------------------------------------ pages
    @property
    def models_page(self) -> ModelPanel:
        """The Models page (``app.gui.model_panel.ModelPanel``), built on first use."""
        self.pages.ensure(MODELS_PAGE)
        assert self._models_page is not None
        return self._models_page

    @property
    def knowledge_page(self) -> KnowledgePanel:
        """The Knowledge page (``app.gui.knowledge_panel.KnowledgePanel``), built on first use."""
        self.pages.ensure(KNOWLEDGE_PAGE)
        assert self._knowledge_page is not None
        return self._knowledge_page

    def _build_models_page(self) -> QWidget:
        from app.gui.model_panel import ModelPanel  # lazy: start-up (built on first use; +16 ms)

        self._ensure_built()

        page = ModelPanel(self.models_adapter, self.settings.n_ctx)
        page.load_requested.connect(self._on_models_page_load_requested)
        page.unload_requested.connect(self.chat.model.unload)
        if self.chat.loaded is not None and isinstance(self.chat.loaded.path, Path):
            page.loaded_path = self.chat.loaded.path
        self._models_page = page
        return page

    def _build_knowledge_page(self) -> QWidget:
        from app.gui.knowledge_panel import KnowledgePanel  # lazy: start-up (built on first use; +8 ms)

        self._ensure_built()

        self._knowledge_page = KnowledgePanel(self.knowledge)
        return self._knowledge_page

    def show_page(self, index: int) -> None:
        """Shows a page (``CHAT_PAGE``, ``MODELS_PAGE``, ``KNOWLEDGE_PAGE``), built if needed."""
        self.pages.show_page(index)

    def selected_knowledge_base(self) -> str | None:
        """The knowledge base selected on the Knowledge page while that page shows (a drop goes there)."""
        page = self._knowledge_page
        if page is not None and self.pages.currentIndex() == KNOWLEDGE_PAGE and page.current:
            return str(page.current)
        return None

    @Slot(object)
    def _on_models_page_load_requested(self, path: Path) -> None:
        self.model_control.load_from_page(path)
        self.show_page(CHAT_PAGE)

    @Slot(object)
    def _on_chat_model_loaded(self, loaded: LoadedModel) -> None:
        if self._models_page is not None:
            self._models_page.set_loaded(loaded.path if isinstance(loaded.path, Path) else None)

    # ------------------------------------------------------------------ settings & theme
    def open_settings(self) -> None:
        from app.gui.settings_dialog import SettingsDialog  # lazy: start-up (built on first use; +8 ms)
        from app.gui.workers.model_routing import parse_remote_model  # lazy: start-up (with the dialog)
        from app.gui.workers.speculative import draft_for  # lazy: start-up (with the dialog)

        self._ensure_built()

        loaded = self.chat.loaded.path if self.chat.loaded is not None else None
        local = loaded if isinstance(loaded, Path) and parse_remote_model(loaded) is None else None
        dialog = SettingsDialog(
            self.settings,
            self,
            server_url=self.api_server.server_url,
            model_path=local,
            kv_cache_dir=self.paths.kv_cache,
            tools_paths=self.paths,
            library=self.models_adapter.library,
        )
        if not dialog.exec():
            return
        old = self.settings
        self.settings = dialog.result_settings()
        self.store.save()
        self.api_server.apply_settings()
        self.knowledge.set_idle_stop(self.settings.knowledge_idle_minutes * 60)
        if self.settings.theme != old.theme:
            self.colors = resolve_theme(self.settings.theme)
            self.apply_colors()
        if self.settings.models_folder(self.paths.models) != old.models_folder(self.paths.models):
            self.model_control.refresh_models()
        engine_keys = ("n_ctx", "n_threads", "gpu_layers", "overflow_policy", "reply_reserve")
        draft_changed = local is not None and draft_for(old, local) != draft_for(self.settings, local)
        if self.chat.loaded is not None and (
            draft_changed or any(getattr(old, k) != getattr(self.settings, k) for k in engine_keys)
        ):
            self.statusBar().showMessage("Reloading the model with the new settings…", 5000)
            self.model_control.load_model(self.chat.loaded.path)

    def apply_colors(self) -> None:
        app = QApplication.instance()
        if isinstance(app, QApplication):
            apply_theme(app, self.colors)
        self.chat_view.set_colors(self.colors.code)
        self.inspector.set_colors(self.colors)
        if self._built and self.chat.thread_messages:
            self.chat_view.set_thread(self.chat.thread_messages)

    # ------------------------------------------------------------------ misc UI
    def _focus_search(self) -> None:
        self.show_page(CHAT_PAGE)
        self.chat_page.focus_search()

    @Slot(str)
    def _on_status_bar_message_changed(self, message: str) -> None:
        self.statusBar().setToolTip(plain_tooltip(message))
        self.statusBar().setAccessibleDescription(message)

    # ------------------------------------------------------------------ notices (app.gui.window_services.Notices)
    def show_error(self, message: str) -> None:
        """Shows an error above the transcript (wrapped, whole) and in the status bar."""
        set_wrapped_text(self.banner, message)
        self.banner.setVisible(True)
        self.statusBar().showMessage(shown(message), 15000)
        self._banner_timer.start(15000)

    def show_status(self, message: str, ms: int = 0) -> None:
        """Shows a line in the status bar for ``ms`` milliseconds (0: until the next one)."""
        self.statusBar().showMessage(shown(message), ms)

    def clear_error(self) -> None:
        """Hides the error banner."""
        self.banner.setVisible(False)

    def activate_from_second_launch(self) -> None:
        """Another launch asked us to come forward."""
        if self.isMinimized():
            self.showNormal()
        self.show()
        self.raise_()
        self.activateWindow()

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self.toast.reposition()

    # ------------------------------------------------------------------ drag and drop (app/gui/documents_controller.py)
    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        mime = event.mimeData()
        if is_media_drop(mime) or (mime.hasUrls() and any(u.isLocalFile() for u in mime.urls())):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        mime = event.mimeData()
        if is_media_drop(mime):  # images and clips go to the message being written
            from app.gui.attachments import media_from_mime  # lazy: start-up (on the first drop)

            event.acceptProposedAction()
            self.composer.attachments.add_sources(media_from_mime(mime))
            return
        paths = [Path(u.toLocalFile()) for u in mime.urls() if u.isLocalFile()]
        if paths:
            self._ensure_built()
            event.acceptProposedAction()
            self.documents.attach_documents(paths)

    # ------------------------------------------------------------------ geometry & shutdown
    def _restore_geometry(self) -> None:
        qs = QSettings(str(self.paths.window_state), QSettings.Format.IniFormat)
        restore_geometry(self, qs.value("geometry"))  # only where it fits a screen as it is now
        state = qs.value("splitter")
        if isinstance(state, QByteArray):
            self.chat_page.restore(state)

    def _save_geometry(self) -> None:
        qs = QSettings(str(self.paths.window_state), QSettings.Format.IniFormat)
        qs.setValue("geometry", self.saveGeometry())
        qs.setValue("splitter", self.splitter.saveState())
        qs.sync()

    def shutdown(self) -> bool:
        """Cancels work, waits with a deadline, closes everything. True when all stopped in time."""
        if self._closing:
            return True
        self._closing = True
        if not self._built:  # closed before the rest was built: nothing runs yet
            self._read_settings = None
            self._save_geometry()
            return True
        self.turns.shutdown()
        self.model_control.shutdown()
        self._save_geometry()
        self.store.save()
        self.api_server.shutdown()
        clean = self.chat.shutdown(SHUTDOWN_DEADLINE_S)
        self.knowledge.shutdown(wait=True)
        self.models_adapter.shutdown(wait=False)
        shutdown_background(wait=False)
        return clean

    def closeEvent(self, event: QCloseEvent) -> None:
        # The window goes at once; the model, the threads and the history close behind it.
        self.hide()
        QApplication.processEvents()
        self.shutdown()
        event.accept()
