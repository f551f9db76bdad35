"""The knowledge panel: knowledge bases, their documents with state, indexing progress, test retrieval."""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Slot
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QHeaderView,
    QInputDialog,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from app.gui.display_text import confirm, plain_label, plain_tooltip, rich, shown
from app.gui.documents_bar import documents_name
from app.gui.window_layout import make_wrapping, set_wrapped_text
from app.gui.workers.knowledge_worker import IndexJob, KnowledgeAdapter
from engine.units import format_eta

if TYPE_CHECKING:
    from rag.ingest import IngestProgress, IngestReport
    from rag.knowledge import KnowledgeBaseSummary
    from rag.registry import DocumentRecord, KnowledgeBaseInfo
    from rag.retrieval import Passage
    from rag.store_health import StoreRecovery

STATE_LABELS = {
    "queued": "queued",
    "indexing": "indexing…",
    "indexed": "indexed",
    "skipped": "skipped",
    "error": "error",
    "interrupted": "interrupted",
    "duplicate": "duplicate",
}


def approximate_eta(seconds: float | None) -> str:
    """'~2 min left' / '~40 s left' / '': ``engine.units.format_eta``'s words, marked as the estimate
    an indexing time left is (``glassbox kb`` says "about")."""
    eta = format_eta(seconds)
    return f"~{eta}" if eta else ""


def progress_text(progress: IngestProgress) -> str:
    """One line for an IngestProgress."""
    state = str(getattr(progress, "state", ""))
    chunks_total = getattr(progress, "chunks_total", None)
    if chunks_total is not None:  # a rebuild re-embeds stored chunks; no files are read
        line = f"{state}: {getattr(progress, 'chunks_done', 0)} of {chunks_total} chunks"
        eta = approximate_eta(getattr(progress, "eta_s", None))
        return f"{line} · {eta}" if eta and state == "rebuilding" else line
    done, total = getattr(progress, "files_done", 0), getattr(progress, "files_total", 0)
    current = getattr(progress, "current_file", None)
    parts = [f"{state}: {done}/{total} files", f"{getattr(progress, 'chunks_done', 0)} chunks"]
    if current:
        parts.append(Path(str(current)).name)
    eta = approximate_eta(getattr(progress, "eta_s", None))
    if eta:
        parts.append(eta)
    return " · ".join(parts)


def document_file_filter() -> str:
    """The file dialog's filters: every supported type first, then one per kind, then all files
    (any other text file is read as plain text)."""
    # lazy: start-up (+8 ms)
    from rag.detect import FILE_TYPES

    def patterns(exts: tuple[str, ...]) -> str:
        return " ".join(f"*{ext}" for ext in exts)

    everything = tuple(ext for _label, exts in FILE_TYPES for ext in exts)
    lines = [f"Supported documents ({patterns(everything)})"]
    lines += [f"{label} ({patterns(exts)})" for label, exts in FILE_TYPES]
    lines.append("All files (*)")
    return ";;".join(lines)


def recovery_text(
    recovery: StoreRecovery, progress: IngestProgress | None = None, report: IngestReport | None = None
) -> str:
    """The one-line notice about a damaged document index (a ``rag.store_health.StoreRecovery``)."""
    head = f"The document index was damaged ({recovery.reason})"
    if report is not None:
        return f"{head}; it was rebuilt from your documents ({report.chunks_added} chunks)."
    if progress is not None and getattr(progress, "chunks_total", None) is not None:
        return f"{head}; rebuilding it from your documents: {progress.chunks_done} of {progress.chunks_total} chunks"
    return f"{head}; rebuilding it from your documents."


class KnowledgePanel(QWidget):
    """Knowledge bases on the left, the selected one's documents and tools on the right.

    Args:
        adapter: the knowledge adapter.
    """

    def __init__(self, adapter: KnowledgeAdapter, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.adapter = adapter
        self.current: str | None = None
        self.creating: str | None = None  # the name of a knowledge base being created
        self.job: IndexJob | None = None
        self._loaded = False

        outer = QHBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        splitter = QSplitter(Qt.Orientation.Horizontal)
        outer.addWidget(splitter)
        splitter.addWidget(self._build_list_side())
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(18, 14, 18, 14)
        rl.setSpacing(8)
        self._build_heading(rl)
        rl.addLayout(self._build_tools_row())
        self._build_progress(rl)
        rl.addWidget(self._build_documents_table(), 2)
        self._build_test_retrieval(rl)
        splitter.addWidget(right)
        splitter.setSizes([260, 900])

        adapter.kbs_changed.connect(self._on_adapter_kbs_changed)
        adapter.documents_changed.connect(self._on_adapter_documents_changed)
        adapter.job_started.connect(self._on_adapter_job_started)
        adapter.progress_changed.connect(self._on_adapter_progress_changed)
        adapter.job_finished.connect(self._on_adapter_job_finished)
        adapter.query_finished.connect(self._on_adapter_query_finished)
        adapter.store_recovered.connect(self._on_adapter_store_recovered)
        if adapter.recovery is not None:
            self._on_adapter_store_recovered(adapter.recovery)
        self._update_buttons()

    # ------------------------------------------------------------------ layout
    def _build_list_side(self) -> QFrame:
        """The left side: New, the knowledge bases, Delete."""
        left = QFrame()
        left.setObjectName("sidebar")
        left.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        ll = QVBoxLayout(left)
        ll.setContentsMargins(10, 12, 10, 10)
        self.new_button = QPushButton("+  New knowledge base")
        self.new_button.setObjectName("primary")
        self.new_button.clicked.connect(self._on_new_button_clicked)
        ll.addWidget(self.new_button)
        title = plain_label("KNOWLEDGE BASES")
        title.setObjectName("sectionTitle")
        ll.addWidget(title)
        self.kb_list = QListWidget()
        self.kb_list.currentItemChanged.connect(self._on_kb_list_current_item_changed)
        ll.addWidget(self.kb_list, 1)
        self.drop_button = QPushButton("Delete knowledge base…")
        self.drop_button.clicked.connect(self._on_drop_button_clicked)
        ll.addWidget(self.drop_button)
        return left

    def _build_heading(self, rl: QVBoxLayout) -> None:
        """The selected knowledge base's name, its summary and the damaged-index notice."""
        self.heading = QLabel("<h2>Knowledge</h2>")
        self.heading.setTextFormat(Qt.TextFormat.RichText)  # a heading: the name in it is escaped (rich)
        rl.addWidget(self.heading)
        self.summary = plain_label(
            "Create a knowledge base and add files, then use it in a chat from the chat's Documents button; "
            "or drop files or folders anywhere on the window."
        )
        self.summary.setObjectName("explain")
        make_wrapping(self.summary)
        rl.addWidget(self.summary)
        self.notice = plain_label("")
        self.notice.setObjectName("indexNotice")
        make_wrapping(self.notice)
        self.notice.setToolTip("Your documents and chats are untouched; only the search index is rebuilt.")
        self.notice.setVisible(False)
        rl.addWidget(self.notice)

    def _build_tools_row(self) -> QHBoxLayout:
        """Add files, Add folder, Remove, Re-index."""
        tools = QHBoxLayout()
        self.add_files_button = QPushButton("Add files…")
        self.add_files_button.clicked.connect(self._on_add_files_button_clicked)
        self.add_folder_button = QPushButton("Add folder…")
        self.add_folder_button.clicked.connect(self._on_add_folder_button_clicked)
        self.remove_button = QPushButton("Remove")
        self.remove_button.setToolTip("Forget the selected documents (your files are not touched)")
        self.remove_button.clicked.connect(self._on_remove_button_clicked)
        self.reindex_button = QPushButton("Re-index")
        self.reindex_button.clicked.connect(self._on_reindex_button_clicked)
        for button in (
            self.add_files_button,
            self.add_folder_button,
            self.remove_button,
            self.reindex_button,
        ):
            tools.addWidget(button)
        tools.addStretch(1)
        return tools

    def _build_progress(self, rl: QVBoxLayout) -> None:
        """The indexing job's bar with Pause and Cancel, and its line of text."""
        progress_row = QHBoxLayout()
        self.progress = QProgressBar()
        self.progress.setTextVisible(False)
        self.progress.setFixedHeight(8)
        self.progress_label = plain_label("")
        self.progress_label.setObjectName("explain")
        make_wrapping(self.progress_label)  # a long skip report wraps; it never widens the window
        self.pause_button = QPushButton("Pause")
        self.pause_button.setCheckable(True)
        self.pause_button.toggled.connect(self._on_pause_button_toggled)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self._on_cancel_button_clicked)
        progress_row.addWidget(self.progress, 1)
        progress_row.addWidget(self.pause_button)
        progress_row.addWidget(self.cancel_button)
        rl.addLayout(progress_row)
        rl.addWidget(self.progress_label)
        self._show_job(None)

    def _build_documents_table(self) -> QTableWidget:
        """The selected knowledge base's documents: name, state, chunks, details."""
        self.docs = QTableWidget(0, 4)
        self.docs.setHorizontalHeaderLabels(["Document", "State", "Chunks", "Details"])
        self.docs.verticalHeader().setVisible(False)
        self.docs.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.docs.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.docs.setAlternatingRowColors(True)
        header = self.docs.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(3, QHeaderView.ResizeMode.Stretch)
        return self.docs

    def _build_test_retrieval(self, rl: QVBoxLayout) -> None:
        """A query box and the passages a chat would get, with their scores."""
        test_title = plain_label("TEST RETRIEVAL")
        test_title.setObjectName("sectionTitle")
        rl.addWidget(test_title)
        qrow = QHBoxLayout()
        self.query = QLineEdit()
        self.query.setPlaceholderText("Ask something to see which passages a chat would get…")
        self.query.returnPressed.connect(self._on_query_return_pressed)
        self.query_button = QPushButton("Search")
        self.query_button.clicked.connect(self._on_query_return_pressed)
        qrow.addWidget(self.query, 1)
        qrow.addWidget(self.query_button)
        rl.addLayout(qrow)
        self.results = QTextBrowser()
        self.results.setOpenLinks(False)
        self.results.setPlaceholderText("Passages appear here with their dense, keyword (BM25) and fused scores.")
        rl.addWidget(self.results, 1)

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if not self._loaded:
            self._loaded = True
            self.adapter.refresh()

    # ------------------------------------------------------------------ adapter events
    @Slot(object)
    def _on_adapter_kbs_changed(self, summaries: list[KnowledgeBaseSummary]) -> None:
        self._loaded = True
        keep = self.current
        self.kb_list.blockSignals(True)
        self.kb_list.clear()
        for summary in summaries:
            name = summary.info.name
            docs = sum(summary.stats.documents.values())
            noun = "document" if docs == 1 else "documents"
            item = QListWidgetItem(f"{shown(name)}\n{docs} {noun} · {summary.stats.chunks} chunks")
            item.setData(Qt.ItemDataRole.UserRole, name)
            item.setToolTip(
                plain_tooltip(f"Embedding model: {summary.info.embedder_id} ({summary.info.dimension} dimensions)")
            )
            self.kb_list.addItem(item)
            if name == keep:
                self.kb_list.setCurrentItem(item)
        self.kb_list.blockSignals(False)
        if keep is None and self.kb_list.count():
            self.kb_list.setCurrentRow(0)
        elif keep is not None and not any(
            self.kb_list.item(i).data(Qt.ItemDataRole.UserRole) == keep for i in range(self.kb_list.count())
        ):
            self.current = None
            self.docs.setRowCount(0)
        self._update_buttons()

    @Slot(object)
    def _on_adapter_store_recovered(self, recovery: StoreRecovery) -> None:
        self.notice.setText(recovery_text(recovery))
        self.notice.setVisible(True)

    @Slot(QListWidgetItem, QListWidgetItem)
    def _on_kb_list_current_item_changed(self, item: QListWidgetItem | None, _previous: QListWidgetItem | None) -> None:
        self.current = item.data(Qt.ItemDataRole.UserRole) if item is not None else None
        self.heading.setText(f"<h2>{rich(self.current or 'Knowledge')}</h2>")
        if self.current:
            self.adapter.load_documents(self.current)
        self._update_buttons()

    @Slot(str, object)
    def _on_adapter_documents_changed(self, name: str, docs: list[DocumentRecord]) -> None:
        if name != self.current:
            return
        self.docs.setRowCount(len(docs))
        counts: dict[str, int] = {}
        for row, doc in enumerate(docs):
            state = str(doc.state)
            counts[state] = counts.get(state, 0) + 1
            path_item = QTableWidgetItem(shown(Path(doc.path).name))
            path_item.setToolTip(plain_tooltip(doc.path))
            path_item.setData(Qt.ItemDataRole.UserRole, doc.path)
            self.docs.setItem(row, 0, path_item)
            self.docs.setItem(row, 1, QTableWidgetItem(STATE_LABELS.get(state, state)))
            chunks = QTableWidgetItem(str(doc.n_chunks))
            chunks.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            self.docs.setItem(row, 2, chunks)
            reason = QTableWidgetItem(shown(doc.reason or ""))
            reason.setToolTip(plain_tooltip(doc.reason or ""))
            self.docs.setItem(row, 3, reason)
        summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no documents yet"
        noun = "document" if len(docs) == 1 else "documents"
        self.summary.setText(f"{len(docs)} {noun}: {summary}. Drop files or folders on the window to add more.")

    @Slot(object)
    def _on_adapter_job_started(self, job: IndexJob) -> None:
        self._show_job(job)
        set_wrapped_text(self.progress_label, f"{job.label}: starting…")

    @Slot(object, object)
    def _on_adapter_progress_changed(self, job: IndexJob, progress: IngestProgress) -> None:
        if job is not self.job:
            self._show_job(job)
        chunks_total = getattr(progress, "chunks_total", None)
        if chunks_total is not None:
            self.progress.setRange(0, max(int(chunks_total), 1))
            self.progress.setValue(int(progress.chunks_done))
            if self.adapter.recovery is not None and not job.kb:
                self.notice.setText(recovery_text(self.adapter.recovery, progress))
        else:
            self.progress.setRange(0, max(int(progress.files_total), 1))
            self.progress.setValue(int(progress.files_done))
        set_wrapped_text(self.progress_label, f"{job.label} — {progress_text(progress)}")

    @Slot(object, object)
    def _on_adapter_job_finished(self, job: IndexJob, report: IngestReport | None) -> None:
        if job is self.job:
            self._show_job(None)
        if report is not None and not job.kb and self.adapter.recovery is not None and not report.cancelled:
            self.notice.setText(recovery_text(self.adapter.recovery, report=report))
        if report is not None:
            line = report.summary() if hasattr(report, "summary") else str(report)
            set_wrapped_text(self.progress_label, f"{job.label}: {line}")
            self.progress_label.setVisible(True)
            failures = getattr(report, "failures", [])
            if failures:
                shown = "; ".join(f"{Path(p).name}: {r}" for p, r in failures[:5])
                set_wrapped_text(self.progress_label, f"{job.label}: {line}. Skipped: {shown}")

    @Slot(str, object)
    def _on_adapter_query_finished(self, text: str, passages: list[Passage]) -> None:
        if not passages:
            self.results.setHtml(f"<p>No passages found for <b>{html.escape(text)}</b>.</p>")
            return
        rows = []
        for i, p in enumerate(passages, 1):
            where = Path(p.path).name + (f", p. {p.page}" if p.page else "")
            dense = "—" if p.dense_score is None else f"{p.dense_score:.3f}"
            bm25 = "—" if p.bm25_score is None else f"{p.bm25_score:.2f}"
            snippet = html.escape(" ".join(p.text.split())[:320])  # document text, not a name
            rows.append(
                f"<p><b>[{i}] {rich(where)}</b> &nbsp; <small>dense {dense} · BM25 {bm25} · "
                f"fused {p.fused_score:.4f}</small><br>{snippet}</p>"
            )
        self.results.setHtml("".join(rows))

    # ------------------------------------------------------------------ actions
    def _show_job(self, job: IndexJob | None) -> None:
        self.job = job
        running = job is not None
        for widget in (self.progress, self.pause_button, self.cancel_button):
            widget.setVisible(running)
        self.pause_button.blockSignals(True)
        self.pause_button.setChecked(bool(job and job.pause.is_set()))
        self.pause_button.setText("Resume" if job and job.pause.is_set() else "Pause")
        self.pause_button.blockSignals(False)

    def _update_buttons(self) -> None:
        has = self.current is not None
        for button in (self.remove_button, self.reindex_button, self.drop_button, self.query_button):
            button.setEnabled(has)
        # Adding works with none selected too: the files go into a new knowledge base, named first.
        for button in (self.add_files_button, self.add_folder_button):
            button.setEnabled(self.creating is None)
            button.setToolTip(
                f"Add documents to “{shown(self.current)}”"
                if has
                else "Add documents to a new knowledge base (you name it next)"
            )

    def ask_name(self, suggested: str = "") -> str | None:
        """Asks for a new knowledge base's name (None: cancelled), in a dialog wide enough for its
        title (a narrow one showed "New k…e base")."""
        dialog = QInputDialog(self)
        dialog.setObjectName("newKnowledgeBaseDialog")
        dialog.setWindowTitle("New knowledge base")
        dialog.setLabelText("Name of the new knowledge base:")
        dialog.setTextValue(suggested)
        # Wide enough for the title, the window's buttons and a margin (the dialog's layout sets its
        # own minimum size from its contents, so the width is asked of the name's box).
        title = dialog.fontMetrics().horizontalAdvance(dialog.windowTitle())
        edit = dialog.findChild(QLineEdit)
        if edit is not None:
            edit.setMinimumWidth(max(380, title + 180))
        if not dialog.exec():
            return None
        name = dialog.textValue().strip()
        return name or None

    @Slot()
    def _on_new_button_clicked(self) -> None:
        name = self.ask_name()
        if name:
            self.create_kb(name)

    def create_kb(self, name: str, then: Callable[[str], object] | None = None) -> None:
        """Creates a knowledge base, saying so while it is made (loading the embedding model takes
        a few seconds the first time), and selects it once it exists; ``then(name)`` follows."""
        self.creating = name
        self.heading.setText(f"<h2>{rich(name)}</h2>")
        self.summary.setText(f"Creating the knowledge base “{name}”: loading the embedding model…")
        self.progress.setRange(0, 0)  # busy
        self.progress.setVisible(True)
        self.new_button.setEnabled(False)
        self._update_buttons()

        def done(kb: KnowledgeBaseInfo) -> None:
            self.creating = None
            self.current = kb.name
            self.progress.setRange(0, 1)
            self._show_job(self.job)
            self.new_button.setEnabled(True)
            self.summary.setText(f"“{kb.name}” is ready: add files or folders, then use it in a chat "
                                 "from the chat's Documents button.")  # fmt: skip
            self.heading.setText(f"<h2>{rich(kb.name)}</h2>")
            self._update_buttons()
            if then is not None:
                then(kb.name)

        def failed(message: str) -> None:
            self.creating = None
            self.progress.setRange(0, 1)
            self._show_job(self.job)
            self.new_button.setEnabled(True)
            self.heading.setText(f"<h2>{rich(self.current or 'Knowledge')}</h2>")
            set_wrapped_text(self.summary, message)
            self._update_buttons()

        self.adapter.create(name, done, failed)

    @Slot()
    def _on_drop_button_clicked(self) -> None:
        if self.current is None:
            return
        if confirm(
            self,
            "Delete knowledge base",
            f"Delete the knowledge base “{shown(self.current)}” and its index? Your files are not touched.",
        ):
            self.adapter.drop(self.current)
            self.current = None

    @Slot()
    def _on_add_files_button_clicked(self) -> None:
        files, _ = QFileDialog.getOpenFileNames(self, "Add documents", str(Path.home()), document_file_filter())
        if files:
            self.add_documents([Path(f) for f in files])

    @Slot()
    def _on_add_folder_button_clicked(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Add a folder", str(Path.home()))
        if folder:
            self.add_documents([Path(folder)])

    def add_documents(self, paths: list[Path]) -> None:
        """Adds ``paths`` to the selected knowledge base; with none selected, to a new one the user
        names (suggested from what was chosen), made first."""
        if self.current is not None:
            self.adapter.add(self.current, paths)
            return

        name = self.ask_name(documents_name(paths))
        if name:
            self.create_kb(name, then=lambda kb: self.adapter.add(kb, paths))

    @Slot()
    def _on_remove_button_clicked(self) -> None:
        if self.current is None:
            return
        rows = {index.row() for index in self.docs.selectedIndexes()}
        for row in rows:
            item = self.docs.item(row, 0)
            if item is not None:
                self.adapter.remove(self.current, Path(item.data(Qt.ItemDataRole.UserRole)))

    @Slot()
    def _on_reindex_button_clicked(self) -> None:
        if self.current is not None:
            self.adapter.reindex(self.current)

    @Slot(bool)
    def _on_pause_button_toggled(self, paused: bool) -> None:
        if self.job is None:
            return
        if paused:
            self.job.pause.set()
        else:
            self.job.pause.clear()
        self.pause_button.setText("Resume" if paused else "Pause")

    @Slot()
    def _on_cancel_button_clicked(self) -> None:
        if self.job is not None:
            self.job.pause.clear()
            self.job.cancel.set()
            set_wrapped_text(self.progress_label, f"{self.job.label}: cancelling…")

    @Slot()
    def _on_query_return_pressed(self) -> None:
        text = self.query.text().strip()
        if text and self.current is not None:
            self.results.setHtml("<p><i>Searching…</i></p>")
            self.adapter.test_query([self.current], text)
