"""The main window and ``run_gui`` (the ``glassbox`` command without a subcommand).

The window is built from light widgets only and shown before anything slow happens: history,
the model scan, the starter model and the model load all start after the first paint, on workers.
Importing this module imports no llama_cpp, torch, sentence_transformers, chromadb or
huggingface_hub (a test checks it).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from PySide6.QtCore import QByteArray, QSettings, Qt, QTimer, Slot
from PySide6.QtGui import (
    QAction,
    QCloseEvent,
    QDragEnterEvent,
    QDropEvent,
    QGuiApplication,
    QIcon,
    QKeySequence,
    QScreen,
)
from PySide6.QtWidgets import (
    QApplication,
    QFrame,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QScrollArea,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from app.gui.chat_view import ChatView, open_source
from app.gui.composer import Composer
from app.gui.conversation_settings import conversation_sampling
from app.gui.inspector import InspectorPanel
from app.gui.lifecycle import quit_on_signals, safe_mode_reason
from app.gui.sidebar import Sidebar
from app.gui.tasks import describe_error, run_in_background, shutdown_background
from app.gui.theme import RESOURCES, apply_theme, resolve_theme
from app.gui.toast import Toast
from app.gui.window_conversations import ConversationActions
from app.gui.window_documents import DocumentActions
from app.gui.window_header import ChatHeaderWidget, NavRailWidget
from app.gui.window_layout import (
    FIRST_SIZE,
    ChatSplitter,
    geometry_fits,
    initial_geometry,
    make_wrapping,
    set_wrapped_text,
)
from app.gui.window_models import ModelActions
from app.gui.workers.chat_adapter import ChatAdapter, ChatState, ModelState, TurnContext
from app.gui.workers.history_service import HistoryService
from app.gui.workers.knowledge_worker import KnowledgeAdapter
from app.gui.workers.llm_worker import SessionFactory
from app.gui.workers.models_worker import ModelsAdapter
from app.paths import Paths
from app.settings import Settings, load_settings, save_settings

log = logging.getLogger(__name__)
SHUTDOWN_DEADLINE_S = 5.0
CHAT_COLUMN_MIN_WIDTH = 460


def warm_up_rendering() -> None:
    """Imports the Markdown parser off the GUI thread, so the first reply does not pay for it."""
    from app.gui.markdown_render import render_markdown

    render_markdown("*warm* `up`")


class MainWindow(ConversationActions, DocumentActions, ModelActions, QMainWindow):
    """Glassbox's window: navigation rail, chat page (sidebar, transcript, inspector), models, knowledge.

    Args:
        paths: where data lives.
        settings: the loaded settings.
        safe_mode: do not auto-load a model.
        safe_reason: why safe mode is on (shown to the user).
        session_factory: engine session builder (tests inject fakes).
        history_factory: history store builder (tests may inject fakes).
        kb_factory: KnowledgeBases builder (tests share one loaded embedder).
    """

    def __init__(
        self,
        paths: Paths,
        settings: Settings,
        *,
        safe_mode: bool = False,
        safe_reason: str | None = None,
        session_factory: SessionFactory | None = None,
        history_factory: Any = None,
        kb_factory: Any = None,
        settings_warning: str | None = None,
        probe_bandwidth: bool = True,
    ) -> None:
        super().__init__()
        self.paths = paths
        self.settings = settings
        self.safe_mode = safe_mode
        self.safe_reason = safe_reason
        self.settings_warning = settings_warning
        self.probe_bandwidth = probe_bandwidth
        self.models: list[Path] = []
        self._closing = False
        self._pending_delete: int | None = None
        self._auto_toggle = False  # the inspector toggle is being set by the layout, not the user
        self._inspector_reply: int | None = None  # the reply whose numbers the inspector shows
        self._inspector_collapsed = False  # collapsed because the window is narrow
        self.setWindowTitle("Glassbox")
        icon = RESOURCES / "icons" / "glassbox.svg"
        if icon.exists():
            self.setWindowIcon(QIcon(str(icon)))
        self._apply_first_geometry()
        self.setAcceptDrops(True)

        self.history = HistoryService(paths.history_db, history_factory)
        embedder = Path(settings.embedding_model) if settings.embedding_model else None
        self.knowledge = KnowledgeAdapter(paths.knowledge, embedder, kb_factory, parent=self)
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
        from app.gui.endpoints_dialog import RemoteIntegration

        self.remote = RemoteIntegration(self)
        self.colors = resolve_theme(settings.theme)

        root = QWidget()
        root_layout = QHBoxLayout(root)
        root_layout.setContentsMargins(0, 0, 0, 0)
        root_layout.setSpacing(0)
        root_layout.addWidget(self._build_nav_rail())
        self.pages = QStackedWidget()
        root_layout.addWidget(self.pages, 1)
        self.setCentralWidget(root)

        self.pages.addWidget(self._build_chat_page())
        # The Models and Knowledge pages are built the first time they are shown (start-up cost).
        self._models_page: Any = None
        self._knowledge_page: Any = None
        self.pages.addWidget(QWidget())
        self.pages.addWidget(QWidget())

        self.toast = Toast(self)
        # A long status message is cut at the window's edge: its whole text is the bar's tooltip.
        self.statusBar().messageChanged.connect(self._on_status_bar_message_changed)
        self.statusBar().showMessage("Starting…")
        self._wire()
        self._build_shortcuts()
        self.apply_colors()
        self._restore_geometry()
        # Timers owned by the window, so they die with it (a bare singleShot would outlive it).
        self._banner_timer = QTimer(self)
        self._banner_timer.setSingleShot(True)
        self._banner_timer.timeout.connect(lambda: self.banner.setVisible(False))
        self._index_timer = QTimer(self)
        self._index_timer.setSingleShot(True)
        self._index_timer.timeout.connect(lambda: self.index_label.setText(""))
        self._live_timer = QTimer(self)
        self._live_timer.setInterval(250)
        self._live_timer.timeout.connect(self._on_live_timer_timeout)

    # ------------------------------------------------------------------ layout
    def _build_nav_rail(self) -> QWidget:
        rail = NavRailWidget()  # app/gui/window_header.py
        self.nav_group = rail.nav_group
        self.nav_buttons = rail.nav_buttons
        self.settings_button = rail.settings_button
        self.nav_group.idClicked.connect(self._on_nav_group_id_clicked)
        self.settings_button.clicked.connect(self.open_settings)
        return rail

    def _build_chat_page(self) -> QWidget:
        self.splitter = ChatSplitter(self._on_splitter_narrow_changed)
        self.splitter.setHandleWidth(1)
        self.sidebar = Sidebar()
        self.sidebar.setMinimumWidth(200)
        self.splitter.addWidget(self.sidebar)

        center = QWidget()
        center.setObjectName("chatColumn")
        # Room for a readable conversation: below it, the side panels give way (ChatSplitter).
        center.setMinimumWidth(CHAT_COLUMN_MIN_WIDTH)
        column = QVBoxLayout(center)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(0)
        column.addWidget(self._build_chat_header())

        self.banner = QLabel()
        self.banner.setObjectName("errorBanner")
        make_wrapping(self.banner)
        self.banner.setVisible(False)
        self.banner.setContentsMargins(0, 0, 0, 0)
        self.banner.setAccessibleName("Error")
        column.addWidget(self.banner)

        self.chat_view = ChatView()
        column.addWidget(self.chat_view, 1)
        self.composer = Composer()
        self.composer.set_ready(False, "Preparing…")
        column.addWidget(self.composer)
        self.splitter.addWidget(center)

        self.inspector = InspectorPanel()
        self.splitter.addWidget(self.inspector)
        self.inspector.setVisible(self.settings.show_inspector)
        self.splitter.setStretchFactor(0, 0)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setStretchFactor(2, 0)
        self.splitter.setCollapsible(1, False)
        self.splitter.setSizes([250, 720, 340])
        return self.splitter

    def _build_chat_header(self) -> QFrame:
        """The chat header and its model bar (``app.gui.window_header.ChatHeaderWidget``); its controls
        keep their names on the window, and the documents control goes in its slot."""
        header = ChatHeaderWidget(self.paths, self.settings.show_inspector)
        self.model_picker = header.model_picker
        self.load_button = header.load_button
        self.add_endpoint_button = header.add_endpoint_button
        self.model_status = header.model_status
        self.docs_label = header.docs_label
        self.documents_slot = header.documents_slot
        self.index_label = header.index_label
        self.chat_settings_button = header.chat_settings_button
        self.tools_button = header.tools_button  # this chat's Tools switch (app/gui/chat_tools_menu.py)
        self.inspector_button = header.inspector_button
        self.starter_note = header.starter_note
        self.load_button.clicked.connect(self._on_load_button_clicked)
        self.add_endpoint_button.clicked.connect(lambda: self.remote.add_endpoint())
        self.chat_settings_button.clicked.connect(self.open_conversation_settings)
        self.inspector_button.toggled.connect(self._on_inspector_button_toggled)
        self.documents_slot.addWidget(self._build_documents_bar())  # app/gui/documents_bar.py (DocumentActions)
        return header

    def _wire(self) -> None:
        chat = self.chat
        chat.state_changed.connect(self._on_chat_state_changed)
        chat.model_state_changed.connect(self._on_chat_model_state_changed)
        chat.model_loaded.connect(self._on_chat_model_loaded)
        chat.conversations_changed.connect(self.sidebar.set_conversations)
        chat.conversation_opened.connect(self._on_chat_conversation_opened)
        chat.reply_started.connect(self._on_chat_reply_started)
        chat.reply_delta.connect(self._on_chat_reply_delta)
        chat.prefill_progressed.connect(self._on_chat_prefill_progressed)
        chat.reply_finished.connect(self._on_chat_reply_finished)
        chat.stats_updated.connect(self.inspector.set_stats)
        chat.model_loaded.connect(self._on_chat_model_loaded_kv)
        chat.prompt_view_updated.connect(self.inspector.set_prompt_view)
        chat.bandwidth_measured.connect(self.inspector.set_machine_bandwidth)
        chat.error_occurred.connect(self.show_error)
        chat.sources_found.connect(self._on_chat_sources_found)
        from app.gui.chat_tools_menu import ChatToolsController

        self.chat_tools = ChatToolsController(self)  # tool cards, approvals, thinking, the loop timeline
        self.knowledge.error_occurred.connect(self.show_error)
        self.models_adapter.error_occurred.connect(self.show_error)
        self.models_adapter.library_changed.connect(self._on_models_library_changed)
        chat.bandwidth_measured.connect(self._on_chat_bandwidth_measured)
        self.knowledge.job_started.connect(self._on_knowledge_job_started)
        self.knowledge.progress_changed.connect(self._on_knowledge_progress_changed)
        self.knowledge.job_finished.connect(self._on_knowledge_job_finished)

        self.composer.send_requested.connect(self._on_composer_send_requested)
        self.composer.stop_requested.connect(chat.stop)
        self.chat_view.edit_requested.connect(self.composer.begin_edit)
        self.chat_view.regenerate_requested.connect(self._on_chat_view_regenerate_requested)
        self.chat_view.branch_requested.connect(chat.select_branch)
        self.chat_view.source_activated.connect(self._on_chat_view_source_activated)

        self.sidebar.new_requested.connect(self.new_chat)
        self.sidebar.conversation_selected.connect(self._on_sidebar_conversation_selected)
        self.sidebar.hit_selected.connect(self._on_sidebar_hit_selected)
        self.sidebar.rename_requested.connect(self._on_sidebar_rename_requested)
        self.sidebar.delete_requested.connect(self.delete_conversation)
        self.sidebar.search_requested.connect(self._on_sidebar_search_requested)
        self.sidebar.export_requested.connect(self.export_conversation)
        self.model_picker.activated.connect(self._on_model_picker_activated)
        self._wire_history_safety()  # a full disk or an unreadable history file (window_conversations.py)

    def _build_shortcuts(self) -> None:
        def add(name: str, keys: QKeySequence | str, slot: Any) -> QAction:
            action = QAction(name, self)
            action.setShortcut(QKeySequence(keys))
            action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
            action.triggered.connect(slot)
            self.addAction(action)
            return action

        self.shortcuts = {
            "new": add("New chat", "Ctrl+N", self.new_chat),
            "search": add("Search chats", "Ctrl+K", self._focus_search),
            "stop": add("Stop", "Esc", self.chat.stop),
            "regenerate": add("Regenerate", "Ctrl+Shift+R", self.regenerate_last),
            "inspector": add("Toggle inspector", "Ctrl+I", self.inspector_button.toggle),
            "settings": add("Settings", "Ctrl+,", self.open_settings),
            "load": add("Load model", "Ctrl+L", self._on_load_button_clicked),
            "export": add("Export chat", "Ctrl+E", lambda: self.export_conversation(None, "md")),
            "focus": add("Focus composer", "Ctrl+/", self.composer.edit.setFocus),
        }
        for index, key in enumerate(("chat", "models", "knowledge")):
            # triggered(bool) passes ``checked`` first: it must not land in the page index.
            self.shortcuts[f"page_{key}"] = add(
                key, f"Ctrl+{index + 1}", lambda _checked=False, i=index: self.show_page(i)
            )
        QWidget.setTabOrder(self.composer.edit, self.composer.send_button)
        QWidget.setTabOrder(self.composer.send_button, self.sidebar.search)
        QWidget.setTabOrder(self.sidebar.search, self.sidebar.list)
        QWidget.setTabOrder(self.sidebar.list, self.model_picker)

    # ------------------------------------------------------------------ start-up (after first paint)
    def start(self) -> None:
        """Loads the history, finds the models and (unless in safe mode) loads one, all on workers."""
        if self.safe_reason:
            self.show_error(self.safe_reason)
        if self.settings_warning:
            self.statusBar().showMessage(self.settings_warning, 15000)
        self.history.call(lambda s: s.recover_pending(), None, lambda e: self.show_error(describe_error(e)))
        self.history.call(lambda s: s.list_conversations(), self._on_first_conversations, self._on_history_failed)
        self.refresh_models(first_start=True)
        self.models_adapter.unfinished_found.connect(  # they come back as paused rows on Models → Discover
            lambda n: self.statusBar().showMessage(f"{n} unfinished download(s): Models → Discover to resume", 15000)
        )
        self.models_adapter.find_unfinished()
        self.remote.refresh_models()
        run_in_background(warm_up_rendering)
        if not self.settings_warning:
            self.statusBar().showMessage("Ready", 3000)

    def _on_first_conversations(self, conversations: list[Any]) -> None:
        self.sidebar.set_conversations(conversations)
        if conversations:
            self.sidebar.set_current(conversations[0].id)
            self.chat.open_conversation(conversations[0].id)

    @property
    def models_page(self) -> Any:
        """The Models page (``app.gui.model_panel.ModelPanel``), built on first use."""
        if self._models_page is None:
            from app.gui.model_panel import ModelPanel

            page = ModelPanel(self.models_adapter, self.settings.n_ctx)
            page.load_requested.connect(self._on_models_page_load_requested)
            page.unload_requested.connect(self.chat.unload_model)
            if self.chat.loaded is not None and isinstance(self.chat.loaded.path, Path):
                page.loaded_path = self.chat.loaded.path
            self._replace_page(1, page)
            self._models_page = page
        return self._models_page

    @property
    def knowledge_page(self) -> Any:
        """The Knowledge page (``app.gui.knowledge_panel.KnowledgePanel``), built on first use."""
        if self._knowledge_page is None:
            from app.gui.knowledge_panel import KnowledgePanel

            page = KnowledgePanel(self.knowledge)
            self._replace_page(2, page)
            self._knowledge_page = page
        return self._knowledge_page

    def _replace_page(self, index: int, page: QWidget) -> None:
        """Puts a page in place, inside a scroll area: a page that needs more room than the window
        has scrolls instead of widening the window past the screen or being cut."""
        current = self.pages.currentIndex()
        old = self.pages.widget(index)
        holder = QScrollArea()
        holder.setObjectName(f"pageScroll{index}")
        holder.setFrameShape(QFrame.Shape.NoFrame)
        holder.setWidgetResizable(True)
        holder.setWidget(page)
        self.pages.insertWidget(index, holder)
        if old is not None:
            self.pages.removeWidget(old)
            old.deleteLater()
        self.pages.setCurrentIndex(current)

    # ------------------------------------------------------------------ chat
    def turn_context(self) -> TurnContext:
        from app.gui.workers.speculative import speculative_mode
        from engine.inference.runtime import GenerationParams

        conv = self.chat.conversation
        conv_settings = dict(getattr(conv, "settings", None) or {})
        preset = conversation_sampling(self.settings, conv_settings)
        system = getattr(conv, "system_prompt", None)
        if system is None:
            system = self.settings.default_system_prompt or None
        params = GenerationParams(
            max_tokens=preset.max_tokens,
            temperature=preset.temperature,
            top_k=preset.top_k,
            top_p=preset.top_p,
            min_p=preset.min_p,
            repeat_penalty=preset.repeat_penalty,
            seed=preset.seed,
            speculative=speculative_mode(self.chat.loaded, self.settings),  # app/workers/speculative.py
        )
        kbs = tuple(getattr(conv, "knowledge_bases", None) or ())
        self.inspector.set_reply_limit(params.max_tokens)
        tools, thinking, budget = self.chat_tools.turn_options()
        return TurnContext(
            system=system, params=params, knowledge_bases=kbs, tools=tools, thinking=thinking, thinking_budget=budget
        )

    @Slot(str, object)
    def _on_composer_send_requested(self, text: str, editing: int | None) -> None:
        if not self.chat.send(text, self.turn_context(), edit_of=editing):
            self.show_error("The model is not ready yet.")

    @Slot(int)
    def _on_chat_view_regenerate_requested(self, message_id: int) -> None:
        self.chat.regenerate(message_id, self.turn_context())

    def regenerate_last(self) -> None:
        for message in reversed(self.chat.thread_messages):
            if message.role == "assistant":
                self.chat.regenerate(message.id, self.turn_context())
                return

    @Slot(object, object)
    def _on_chat_conversation_opened(self, conversation: Any, messages: list[Any]) -> None:
        stats = messages[-1].stats if messages and messages[-1].role == "assistant" else None
        evicted = int((stats or {}).get("evicted_messages", 0) or 0)
        self.chat_view.set_thread(messages, evicted=evicted)
        self.sidebar.set_current(conversation.id if conversation is not None else None)
        title = getattr(conversation, "title", "") or "New chat"
        self.setWindowTitle(f"{title} — Glassbox")
        kbs = list(getattr(conversation, "knowledge_bases", None) or [])
        self.docs_label.setText(f"Documents: {', '.join(kbs)}" if kbs else "")
        if not self.chat.busy:
            last_id = messages[-1].id if messages else None
            if last_id is None or last_id != self._inspector_reply:
                # Another chat (or branch): its saved numbers, said so, or none; never the last turn's.
                self._inspector_reply = None
                if stats:
                    self.inspector.set_stats(stats, saved=True)
                else:
                    self.inspector.clear_turn()

    @Slot(int)
    def _on_chat_reply_started(self, reply_id: int) -> None:
        self.chat_view.begin_stream(reply_id)
        self._inspector_reply = reply_id
        self.inspector.begin_generation()
        self._live_timer.start()

    @Slot(str, int)
    def _on_chat_reply_delta(self, text: str, _count: int) -> None:
        self.chat_view.append_stream(text)

    @Slot(int, int)
    def _on_chat_prefill_progressed(self, done: int, total: int) -> None:
        self.inspector.set_prefill(done, total)
        self.composer.set_state_text(f"Reading the prompt… {done}/{total} tokens")

    @Slot(object)
    def _on_chat_reply_finished(self, _outcome: Any) -> None:
        self.chat_view.end_stream()

    @Slot(object)
    def _on_chat_model_loaded_kv(self, loaded: Any) -> None:
        """The KV cache the model allocated, from its header (off the GUI thread: a big vocabulary
        takes tens of ms to read); shown before the first turn."""
        from app.gui.workers.model_routing import parse_remote_model

        n_ctx = int(getattr(loaded.info, "n_ctx", 0) or 0)
        if parse_remote_model(loaded.path) is not None or not n_ctx:
            return
        path = loaded.path

        def estimate() -> int:
            from engine.fit import kv_cache_bytes
            from engine.gguf import read_gguf_info

            return int(kv_cache_bytes(read_gguf_info(path), n_ctx))

        def show(kv_bytes: int) -> None:
            if self.chat.loaded is not None and self.chat.loaded.path == path:
                self.inspector.set_kv_allocation(kv_bytes)

        run_in_background(
            estimate,
            self._while_open(show),  # the window may close before the answer
            lambda exc: log.info("KV size unknown for %s: %s", path, exc),
        )

    @Slot()
    def _on_live_timer_timeout(self) -> None:
        tokens, _elapsed, _first = self.chat.live_tokens()
        self.inspector.live_sample(tokens)

    @Slot(object)
    def _on_chat_state_changed(self, state: ChatState) -> None:
        busy = state in (
            ChatState.PROCESSING_PROMPT,
            ChatState.GENERATING,
            ChatState.RETRIEVING,
            ChatState.CANCELLING,
        )
        self.composer.set_busy(busy and self.chat.busy)
        if state is ChatState.IDLE:
            self._live_timer.stop()
            self.chat_view.end_stream()
            if self.chat.model_state is ModelState.LOADED:
                self.composer.set_state_text("")
        elif state is not ChatState.LOADING_MODEL:
            self.composer.set_state_text(state.value + "…")

    @Slot(object)
    def _on_chat_view_source_activated(self, source: dict[str, Any]) -> None:
        if not open_source(source):
            self.show_error(f"Could not open {source.get('path', 'the file')}")

    # ------------------------------------------------------------------ settings & theme
    def open_settings(self) -> None:
        from app.gui.settings_dialog import SettingsDialog
        from app.gui.workers.model_routing import parse_remote_model
        from app.gui.workers.speculative import draft_for

        loaded = self.chat.loaded.path if self.chat.loaded is not None else None
        local = loaded if isinstance(loaded, Path) and parse_remote_model(loaded) is None else None
        dialog = SettingsDialog(
            self.settings,
            self,
            server_url=self.remote.server_url,
            model_path=local,
            kv_cache_dir=self.paths.kv_cache,
            tools_paths=self.paths,
            library=self.models_adapter.library,
        )
        if not dialog.exec():
            return
        old = self.settings
        self.settings = dialog.result_settings()
        self.save_settings()
        self.remote.apply_server_settings()
        if self.settings.theme != old.theme:
            self.colors = resolve_theme(self.settings.theme)
            self.apply_colors()
        if self.settings.models_folder(self.paths.models) != old.models_folder(self.paths.models):
            self.refresh_models()
        engine_keys = ("n_ctx", "n_threads", "gpu_layers", "overflow_policy", "reply_reserve")
        draft_changed = local is not None and draft_for(old, local) != draft_for(self.settings, local)
        if self.chat.loaded is not None and (
            draft_changed or any(getattr(old, k) != getattr(self.settings, k) for k in engine_keys)
        ):
            self.statusBar().showMessage("Reloading the model with the new settings…", 5000)
            self.load_model(self.chat.loaded.path)

    def save_settings(self) -> None:
        try:
            save_settings(self.settings, self.paths.settings_file)
        except OSError as exc:
            self.show_error(f"Could not save settings: {describe_error(exc)}")

    def apply_colors(self) -> None:
        app = QApplication.instance()
        if isinstance(app, QApplication):
            apply_theme(app, self.colors)
        self.chat_view.set_colors(self.colors.code)
        self.inspector.set_colors(self.colors)
        if self.chat.thread_messages:
            self.chat_view.set_thread(self.chat.thread_messages)

    # ------------------------------------------------------------------ misc UI
    def _ensure_page(self, index: int) -> None:
        if index == 1:
            _ = self.models_page
        elif index == 2:
            _ = self.knowledge_page

    def show_page(self, index: int) -> None:
        self._ensure_page(index)
        self.pages.setCurrentIndex(index)
        button = self.nav_group.button(index)
        if button is not None:
            button.setChecked(True)

    @Slot(int)
    def _on_nav_group_id_clicked(self, index: int) -> None:
        self._ensure_page(index)
        self.pages.setCurrentIndex(index)

    @Slot(bool)
    def _on_inspector_button_toggled(self, checked: bool) -> None:
        if not self._auto_toggle:
            # The user's choice: kept for the next start only when the window has room for it.
            if not self.splitter.narrow:
                self.settings.show_inspector = checked
            self._inspector_collapsed = False
        self._apply_side_panels()

    def _apply_side_panels(self) -> None:
        """Shows the inspector as its toggle says; on a narrow window the chat list gives way to it."""
        show = self.inspector_button.isChecked()
        self.inspector.setVisible(show)
        self.sidebar.setVisible(not (show and self.splitter.narrow))
        tip = "Show or hide the inspector (Ctrl+I)"
        if self.splitter.narrow:
            tip += ". The window is narrow: the chat list hides while the inspector shows"
        self.inspector_button.setToolTip(tip)

    def _on_splitter_narrow_changed(self, narrow: bool) -> None:
        """Too narrow for three panels: the inspector collapses to its toggle; wide again: it comes back."""
        self._auto_toggle = True
        try:
            if narrow and self.inspector_button.isChecked():
                self._inspector_collapsed = True
                self.inspector_button.setChecked(False)
            elif not narrow and self._inspector_collapsed:
                self._inspector_collapsed = False
                self.inspector_button.setChecked(self.settings.show_inspector)
        finally:
            self._auto_toggle = False
        self._apply_side_panels()

    @Slot(str)
    def _on_status_bar_message_changed(self, message: str) -> None:
        self.statusBar().setToolTip(message)
        self.statusBar().setAccessibleDescription(message)

    def show_error(self, message: str) -> None:
        """Shows an error above the transcript (wrapped, whole) and in the status bar."""
        set_wrapped_text(self.banner, message)
        self.banner.setVisible(True)
        self.statusBar().showMessage(message, 15000)

        self._banner_timer.start(15000)

    def activate_from_second_launch(self) -> None:
        """Another launch asked us to come forward."""
        if self.isMinimized():
            self.showNormal()
        self.show()
        self.raise_()
        self.activateWindow()

    def resizeEvent(self, event: Any) -> None:
        super().resizeEvent(event)
        self.toast.reposition()

    # ------------------------------------------------------------------ drag and drop (see DocumentActions)
    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if event.mimeData().hasUrls() and any(u.isLocalFile() for u in event.mimeData().urls()):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        paths = [Path(u.toLocalFile()) for u in event.mimeData().urls() if u.isLocalFile()]
        if paths:
            event.acceptProposedAction()
            self.attach_documents(paths)

    # ------------------------------------------------------------------ geometry & shutdown
    def _apply_first_geometry(self) -> None:
        """Sizes the window to its screen's available geometry (a small screen gets all of it)."""
        screen: QScreen | None = self.screen() or QGuiApplication.primaryScreen()
        if screen is None:  # no screen at all (some offscreen setups): the plain first size
            self.resize(FIRST_SIZE)
            return
        self.setGeometry(initial_geometry(screen.availableGeometry()))

    def _restore_geometry(self) -> None:
        """Restores the saved geometry only where it fits a screen as it is now, else keeps the first
        size (a window saved on a big monitor must not open past the edge of a laptop's screen)."""
        qs = QSettings(str(self.paths.window_state), QSettings.Format.IniFormat)
        geometry = qs.value("geometry")
        if isinstance(geometry, QByteArray):
            first = self.geometry()
            if self.restoreGeometry(geometry) and not self._fits_a_screen():
                self.setWindowState(Qt.WindowState.WindowNoState)
                self.setGeometry(first)
        state = qs.value("splitter")
        if isinstance(state, QByteArray):
            self.splitter.restoreState(state)
            self.sidebar.setVisible(True)
            self.inspector.setVisible(self.inspector_button.isChecked())

    def _fits_a_screen(self) -> bool:
        if self.isMaximized() or self.isFullScreen():
            return True
        frame = self.frameGeometry()
        return any(geometry_fits(frame, screen.availableGeometry()) for screen in QGuiApplication.screens())

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
        self._live_timer.stop()
        self._save_geometry()
        self.save_settings()
        self.remote.shutdown()
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


def run_gui(paths: Paths, safe_mode: bool = False) -> int:
    """Starts the desktop app; returns the exit code.

    Args:
        paths: where data lives (``--home`` already applied).
        safe_mode: do not load a model automatically.
    """
    from app.gui.lifecycle import start_error
    from app.gui.single_instance import SingleInstance

    app = QApplication.instance() or QApplication(sys.argv[:1])
    assert isinstance(app, QApplication)
    app.setApplicationName("Glassbox")
    app.setOrganizationName("Glassbox")
    app.setDesktopFileName("glassbox")
    try:
        paths.ensure()
        instance = SingleInstance(paths.lock_file)
        acquired = instance.acquire()
    except OSError as exc:  # ReadOnlyFolder among them: one line, exit code 1, no traceback
        print(f"glassbox: error: {start_error(exc)}", file=sys.stderr)  # noqa: T201
        return 1
    if not acquired:
        if instance.notify_running():
            print("glassbox: already running; brought its window forward", file=sys.stderr)  # noqa: T201
            return 0
        print(f"glassbox: error: {paths.lock_file}: another Glassbox holds this data folder", file=sys.stderr)  # noqa: T201
        return 1
    reason = safe_mode_reason(paths)
    loaded = load_settings(paths.settings_file)
    window = MainWindow(
        paths,
        loaded.settings,
        safe_mode=safe_mode or reason is not None,
        safe_reason=reason,
        settings_warning=loaded.warning,
    )
    instance.activation_requested.connect(window.activate_from_second_launch)
    quit_on_signals(app)
    window.show()
    window.composer.edit.setFocus()  # a user can type at once
    QTimer.singleShot(0, window.start)
    try:
        return int(app.exec())
    finally:
        window.shutdown()
        instance.release()
