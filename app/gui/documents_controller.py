"""The documents controller: the chat header's documents control (which knowledge bases the open
chat answers from, several at once), files dropped anywhere (an overlay says where they go while
they are dragged) or picked with "Add files to this chat…" (both call :meth:`DocumentsController.attach_documents`),
and indexing progress in the header.

Dropped files go to the knowledge base selected on the Knowledge page when that page is shown;
otherwise to the open chat's first knowledge base, or to a new one named after them (the
folder's or the file's name, see :func:`app.gui.documents_bar.documents_name`) that the chat then uses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QEvent, QObject, QTimer, Slot
from PySide6.QtGui import QDragEnterEvent
from PySide6.QtWidgets import QFileDialog, QLabel, QWidget

from app.gui.documents_bar import DocumentsBarWidget, DropOverlayWidget, documents_name

if TYPE_CHECKING:
    from app.gui.window_services import Notices
    from app.gui.workers.chat_adapter import ChatAdapter
    from app.gui.workers.history_reads import DisplayMessage
    from app.gui.workers.knowledge_worker import IndexJob, KnowledgeAdapter
    from engine.history_schema import Conversation
    from rag.ingest import IngestProgress, IngestReport
    from rag.registry import KnowledgeBaseInfo


class _DragWatcher(QObject):
    """Shows the drop overlay while local files are dragged over the window, hides it after."""

    def __init__(self, window: QWidget, overlay: DropOverlayWidget, target_text: Callable[[], str]) -> None:
        super().__init__(window)
        self._overlay = overlay
        self._target_text = target_text

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        del watched  # installed on the window only
        kind = event.type()
        if kind == QEvent.Type.DragEnter and isinstance(event, QDragEnterEvent):
            mime = event.mimeData()
            if mime.hasUrls() and any(u.isLocalFile() for u in mime.urls()):
                self._overlay.show_message(self._target_text())
        elif kind in (QEvent.Type.DragLeave, QEvent.Type.Drop):
            self._overlay.setVisible(False)
        return False  # the window still handles the event


class DocumentsController(QObject):
    """Which documents the open chat uses, and where added files go.

    Args:
        chat: the chat adapter (the open conversation).
        knowledge: the knowledge adapter (names, create, add, indexing progress).
        bar: the header's documents control (its choices are connected here).
        docs_label: the header's plain documents line (hidden: the control says it).
        index_label: the header's indexing line.
        notices: the error banner and the status bar.
        selected_knowledge_base: the knowledge base selected on the Knowledge page while that page
            shows, else None (a drop goes there).
        show_knowledge: shows the Knowledge page ("Manage knowledge bases…").
        window: where files are dropped (the overlay covers it) and the file dialog's parent.
    """

    def __init__(
        self,
        *,
        chat: ChatAdapter,
        knowledge: KnowledgeAdapter,
        bar: DocumentsBarWidget,
        docs_label: QLabel,
        index_label: QLabel,
        notices: Notices,
        selected_knowledge_base: Callable[[], str | None],
        show_knowledge: Callable[[], None],
        window: QWidget,
    ) -> None:
        super().__init__(window)
        self.chat = chat
        self.knowledge = knowledge
        self.documents_bar = bar
        self.docs_label = docs_label
        self.index_label = index_label
        self.notices = notices
        self._selected_knowledge_base = selected_knowledge_base
        self.window = window
        self._missing_said: set[str] = set()  # deleted knowledge bases a notice was shown for
        self._index_timer = QTimer(self)  # owned here, so it dies with the window
        self._index_timer.setSingleShot(True)
        self._index_timer.timeout.connect(lambda: self.index_label.setText(""))
        docs_label.setVisible(False)  # the control says which documents the chat uses
        bar.attachments_changed.connect(self._on_documents_bar_attachments_changed)
        bar.add_files_requested.connect(self._on_documents_bar_add_files_requested)
        bar.manage_requested.connect(show_knowledge)
        bar.menu_opening.connect(knowledge.list_names)
        knowledge.names_listed.connect(bar.set_available)
        knowledge.missing_found.connect(self._on_knowledge_missing_found)
        knowledge.job_started.connect(self._on_knowledge_job_started)
        knowledge.progress_changed.connect(self._on_knowledge_progress_changed)
        knowledge.job_finished.connect(self._on_knowledge_job_finished)
        chat.conversation_opened.connect(self._on_documents_conversation_opened)
        self.drop_overlay = DropOverlayWidget(window)
        window.installEventFilter(_DragWatcher(window, self.drop_overlay, self.drop_target_text))
        QTimer.singleShot(0, knowledge.list_names)  # from the registry file: the process waits

    @Slot(object, object)
    def _on_documents_conversation_opened(
        self, conversation: Conversation | None, _messages: list[DisplayMessage]
    ) -> None:
        kbs = list(getattr(conversation, "knowledge_bases", None) or [])
        self.documents_bar.set_attached(kbs)
        self.docs_label.setText(f"Documents: {', '.join(kbs)}" if kbs else "")

    @Slot(object)
    def _on_knowledge_missing_found(self, names: list[str]) -> None:
        """A chat searched knowledge bases that were deleted: they are skipped, the documents
        button says "(missing)" once the list is read again, and one notice says so (once each)."""
        self.knowledge.list_names()
        new = [name for name in names if name not in self._missing_said]
        if not new:
            return
        self._missing_said.update(new)
        quoted = ", ".join(f"“{name}”" for name in new)
        self.notices.show_status(
            f"Knowledge base {quoted} no longer exists: this chat skips it (untick it under Documents).", 15000
        )

    @Slot(object)
    def _on_documents_bar_attachments_changed(self, names: tuple[str, ...]) -> None:
        self.set_chat_documents(list(names))

    @Slot()
    def _on_documents_bar_add_files_requested(self) -> None:
        # lazy: start-up (+11 ms)
        from app.gui.knowledge_panel import document_file_filter

        files, _ = QFileDialog.getOpenFileNames(self.window, "Add documents to this chat", str(Path.home()),
                                                document_file_filter())  # fmt: skip
        if files:
            self.attach_documents([Path(f) for f in files], to_chat=True)

    def set_chat_documents(self, names: Sequence[str]) -> None:
        """Makes the open chat answer from ``names`` (a new chat is made when none is open)."""
        chosen = list(dict.fromkeys(names))
        if self.chat.conversation is None:
            self._when_a_chat_opens(lambda: self.set_chat_documents(chosen))
            self.chat.conversations.new()
            return
        self.chat.conversations.update(knowledge_bases=chosen)
        self.documents_bar.set_attached(chosen)
        self.docs_label.setText(f"Documents: {', '.join(chosen)}" if chosen else "")

    def _when_a_chat_opens(self, then: Callable[[], None]) -> None:
        """Runs ``then`` once, when the next conversation has opened."""

        def once(conversation: Conversation | None, _messages: list[DisplayMessage]) -> None:
            self.chat.conversation_opened.disconnect(once)
            if conversation is not None:
                then()

        self.chat.conversation_opened.connect(once)

    # ------------------------------------------------------------------ dropped files
    def drop_target_text(self) -> str:
        """What the overlay says while files are dragged over the window."""
        kb = self._selected_knowledge_base()
        if kb is not None:
            return f"Drop to add to the knowledge base “{kb}”"
        conv = self.chat.conversation
        kbs = list(getattr(conv, "knowledge_bases", None) or [])
        if kbs:
            return f"Drop to add to this chat's documents (“{kbs[0]}”)"
        return "Drop files or folders to use them in this chat"

    def attach_documents(self, paths: Sequence[Path], *, to_chat: bool = False) -> None:
        """Indexes files or folders for use in a chat.

        On the Knowledge page with a knowledge base selected they go into it (unless ``to_chat``).
        Otherwise they go into the open chat's first knowledge base, or into a new one named after
        them (``documents_name``) that the chat then uses; a chat is made when none is open.

        Args:
            paths: files and folders (dropped or picked).
            to_chat: always the chat's documents, whatever page is shown.
        """
        items = [Path(p) for p in paths]
        if not items:
            return
        selected = None if to_chat else self._selected_knowledge_base()
        if selected is not None:
            self.knowledge.add(selected, items)
            self.notices.show_status(f"Indexing {len(items)} item(s) into {selected}…", 5000)
            return
        conv = self.chat.conversation
        if conv is None:
            self._when_a_chat_opens(lambda: self.attach_documents(items, to_chat=True))
            self.chat.conversations.new()
            return
        kbs = list(conv.knowledge_bases or [])
        if kbs:
            self.knowledge.add(kbs[0], items)
            self.notices.show_status(f"Indexing {len(items)} item(s) into {kbs[0]}…", 5000)
            return
        conv_id = conv.id
        # lazy: start-up (+22 ms)
        from rag.service import unique_name

        # Attached at once under the name it will most likely get (the header says so while the
        # embedding model loads); corrected below if another took that name meanwhile.
        guess = unique_name(documents_name(items), set(self.knowledge.names))
        self.documents_bar.creating.add(guess)  # not "(missing)" while it is being made
        self.set_chat_documents([guess])
        self.index_label.setText(f"Creating the knowledge base “{guess}”…")

        def created(kb: KnowledgeBaseInfo) -> None:
            self.documents_bar.creating.discard(guess)
            current = self.chat.conversation
            if kb.name != guess and current is not None and current.id == conv_id:
                kept = [n for n in (current.knowledge_bases or self.documents_bar.attached) if n != guess]
                self.set_chat_documents([*kept, kb.name])
            self.knowledge.add(kb.name, items)
            self.notices.show_status(f"Indexing {len(items)} item(s) into {kb.name}…", 5000)

        def failed(_message: str) -> None:
            self.documents_bar.creating.discard(guess)
            self.index_label.setText("")
            current = self.chat.conversation
            if current is not None and current.id == conv_id:
                self.set_chat_documents([n for n in self.documents_bar.attached if n != guess])

        self.knowledge.create(guess, created, failed, unique=True)

    # ------------------------------------------------------------------ indexing progress
    @Slot(object)
    def _on_knowledge_job_started(self, job: IndexJob) -> None:
        self.index_label.setText(f"{job.label}…")

    @Slot(object, object)
    def _on_knowledge_progress_changed(self, job: IndexJob, progress: IngestProgress) -> None:
        # lazy: start-up (+14 ms)
        from app.gui.knowledge_panel import progress_text

        self.index_label.setText(f"{job.kb or job.label}: {progress_text(progress)}")

    @Slot(object, object)
    def _on_knowledge_job_finished(self, job: IndexJob, report: IngestReport | None) -> None:
        if report is None:
            self.index_label.setText("")
            return
        line = report.summary() if hasattr(report, "summary") else "done"
        self.index_label.setText(f"{job.kb or job.label}: {line}")
        self._index_timer.start(10000)
