"""The main window's documents actions: files dropped anywhere go into the open chat's knowledge
base (created on the first drop), with progress in the header. A mixin of
:class:`app.main_window.MainWindow` (kept apart for size)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QTimer, Slot

if TYPE_CHECKING:
    from PySide6.QtWidgets import QLabel, QStatusBar

    from app.chat_view import ChatView
    from app.workers.chat_adapter import ChatAdapter
    from app.workers.history_service import HistoryService
    from app.workers.knowledge_worker import IndexJob, KnowledgeAdapter


class DocumentActions:
    """Documents actions of the main window (needs the attributes annotated below)."""

    chat: ChatAdapter
    history: HistoryService
    knowledge: KnowledgeAdapter
    chat_view: ChatView
    docs_label: QLabel
    index_label: QLabel
    _index_timer: QTimer

    if TYPE_CHECKING:  # provided by MainWindow / QMainWindow; declared for the type checker only

        def statusBar(self) -> QStatusBar: ...
        def _on_history_failed(self, exc: BaseException) -> None: ...

    def add_documents(self, paths: list[Path]) -> None:
        """Adds dropped files or folders to the current chat's knowledge base (created on first drop)."""
        conv = self.chat.conversation
        if conv is None:
            # A new chat to hold the documents; continue once it exists.
            def create(store: Any) -> tuple[Any, list[Any]]:
                return store.create_conversation(title="Documents"), []

            def created(result: tuple[Any, list[Any]]) -> None:
                self.chat._after_create(result)
                self.add_documents(paths)

            self.history.call(create, created, self._on_history_failed)
            return
        kbs = list(conv.knowledge_bases or [])
        name = kbs[0] if kbs else f"chat-{conv.id}"
        self.knowledge.ensure(name)
        if name not in kbs:
            self.chat.update_conversation(knowledge_bases=[*kbs, name])
            self.docs_label.setText(f"Documents: {', '.join([*kbs, name])}")
        self.knowledge.add(name, paths)
        self.statusBar().showMessage(f"Indexing {len(paths)} item(s) into {name}…", 5000)

    @Slot(object)
    def _on_knowledge_job_started(self, job: IndexJob) -> None:
        self.index_label.setText(f"{job.label}…")

    @Slot(object, object)
    def _on_knowledge_progress_changed(self, job: IndexJob, progress: Any) -> None:
        from app.knowledge_panel import progress_text

        self.index_label.setText(f"{job.kb or job.label}: {progress_text(progress)}")

    @Slot(object, object)
    def _on_knowledge_job_finished(self, job: IndexJob, report: Any) -> None:
        if report is None:
            self.index_label.setText("")
            return
        line = report.summary() if hasattr(report, "summary") else "done"
        self.index_label.setText(f"{job.kb or job.label}: {line}")
        self._index_timer.start(10000)

    @Slot(object)
    def _on_chat_sources_found(self, sources: list[dict[str, Any]]) -> None:
        card = self.chat_view._streaming
        if card is not None:
            card.set_sources(sources)
