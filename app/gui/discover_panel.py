"""The Discover tab of the Models page: suggested models, Hub search, a repository's files with
size and fit, and the download queue. The "LoRA adapters" toggle beside the search looks for GGUF
LoRA adapters instead: each hit names the base it adapts, and each file says which chat model of
the library it fits (its header read before download); it downloads as a model does.

Before any search the list holds the suggested chat models shipped in
``resources/curated_models.json`` (:mod:`app.curated_models`), each with its fit verdict for this
machine; they show offline too, and picking one lists its repository (online) with the suggested
file selected, ready to download. A search or a listing that fails (offline, an HTTP error) says
so where it was made, with a Retry button.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTableWidget,
    QVBoxLayout,
    QWidget,
)

from app.gui.display_text import confirm, plain_label, plain_tooltip, rich, shown
from app.gui.quantize_dialog import VERDICT_TEXT
from app.gui.quantize_dialog import table_item as _item
from app.gui.quantize_dialog import verdict_item as _verdict_item
from app.gui.workers.models_worker import ModelsAdapter
from app.gui.workers.transfers import Transfer
from engine.units import format_bytes, format_eta, format_speed

if TYPE_CHECKING:
    from engine.hub.adapters import AdapterHit, AdapterRepo, RemoteAdapter
    from engine.hub.search import RepoFiles, RepoSummary

REPO_ROLE = Qt.ItemDataRole.UserRole
FILE_ROLE = Qt.ItemDataRole.UserRole + 1
ADAPTER_ROLE = Qt.ItemDataRole.UserRole + 2  # on an adapter search's rows: the base its tags name, or ""
SEARCH_HINT = "Search Hugging Face for GGUF models (e.g. qwen 0.5b instruct)"
ADAPTER_HINT = "Search Hugging Face for GGUF LoRA adapters (empty: the most downloaded)"
MODEL_COLUMNS = ["File", "Quant", "Size", "Fit on this machine"]
ADAPTER_COLUMNS = ["File", "Architecture", "Size", "Fits in your library"]


class DiscoverWidget(QWidget):
    """The Discover tab.

    Args:
        adapter: the models adapter (Hub queries and downloads).
        parent: the parent widget.
    """

    def __init__(self, adapter: ModelsAdapter, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        # lazy: start-up (+4 ms)
        from app.curated_models import load_curated

        self.adapter = adapter
        self.repo_files: RepoFiles | None = None
        self.curated = load_curated()
        self._pending_repo: str | None = None  # the repository whose files were asked for last
        self._wanted_file: str | None = None  # the suggested file to select once they are listed
        self._failed_query: str | None = None
        self._listing_adapters = False  # the files asked for last are an adapter repository's
        self._listing_base: str | None = None  # the base that repository's tags name
        self._adapter_repo: AdapterRepo | None = None  # its files' headers, once read
        lay = QVBoxLayout(self)
        lay.addLayout(self._build_search_row())
        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.addWidget(self._build_results())
        splitter.addWidget(self._build_files())
        splitter.setSizes([380, 640])
        lay.addWidget(splitter, 2)
        self._build_queue(lay)
        downloads = adapter.downloads
        downloads.search_finished.connect(self._on_adapter_search_finished)
        downloads.search_failed.connect(self._on_adapter_search_failed)
        downloads.files_listed.connect(self._on_adapter_files_listed)
        downloads.files_failed.connect(self._on_adapter_files_failed)
        downloads.adapters_found.connect(self._on_adapter_adapters_found)
        downloads.adapter_files_listed.connect(self._on_adapter_adapter_files_listed)
        adapter.library.hardware_ready.connect(self._on_adapter_hardware_ready)
        downloads.transfer_changed.connect(self._on_adapter_transfer_changed)
        downloads.transfer_removed.connect(self._on_adapter_transfer_removed)
        self.show_suggestions()
        for transfer in list(downloads.transfers.values()):  # found or started before this page existed
            self._on_adapter_transfer_changed(transfer)

    # ------------------------------------------------------------------ the widgets
    def _build_search_row(self) -> QHBoxLayout:
        row = QHBoxLayout()
        self.search = QLineEdit()
        self.search.setPlaceholderText(SEARCH_HINT)
        self.search.returnPressed.connect(self._on_search_return_pressed)
        self.search_button = QPushButton("Search")
        self.search_button.clicked.connect(self._on_search_return_pressed)
        self.adapters_toggle = QPushButton("LoRA adapters")
        self.adapters_toggle.setCheckable(True)
        self.adapters_toggle.setToolTip(
            "Search LoRA adapters instead of models: each names the base model it changes, and each file "
            "says which model of your library it fits"
        )
        self.adapters_toggle.toggled.connect(self._on_adapters_toggle_toggled)
        row.addWidget(self.search, 1)
        row.addWidget(self.adapters_toggle)
        row.addWidget(self.search_button)
        return row

    def _build_results(self) -> QWidget:
        """The left side: the suggestions or search results, and a search error with Retry."""
        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        self.results_title = plain_label("")
        self.results_title.setObjectName("sectionTitle")
        ll.addWidget(self.results_title)
        self.results = QListWidget()
        self.results.setWordWrap(True)
        self.results.setSpacing(3)  # the two-line entries stay apart
        # The files listed are those of the row the user selects (a click, the arrow keys): not of
        # the row a list makes current by itself when it gets the focus with none current.
        self.results.itemSelectionChanged.connect(self._on_results_item_selection_changed)
        ll.addWidget(self.results, 1)
        self.search_error = plain_label("")
        self.search_error.setObjectName("errorBanner")
        self.search_error.setWordWrap(True)
        self.search_error.setTextFormat(Qt.TextFormat.PlainText)
        self.search_error.setVisible(False)
        ll.addWidget(self.search_error)
        self.search_retry = QPushButton("Retry")
        self.search_retry.setVisible(False)
        self.search_retry.clicked.connect(self._on_search_retry_clicked)
        self.back_to_suggestions = QPushButton("Suggested models")
        self.back_to_suggestions.setToolTip("Show the suggested chat models again (they work offline)")
        self.back_to_suggestions.setVisible(False)
        self.back_to_suggestions.clicked.connect(self._on_back_to_suggestions_clicked)
        retry_row = QHBoxLayout()
        retry_row.addWidget(self.search_retry)
        retry_row.addWidget(self.back_to_suggestions)
        retry_row.addStretch(1)
        ll.addLayout(retry_row)
        return left

    def _build_files(self) -> QWidget:
        """The right side: the chosen repository's files and Download."""
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        self.repo_label = QLabel("Pick a suggested model or a search result to see its files.")
        self.repo_label.setTextFormat(Qt.TextFormat.RichText)  # the repository in bold: its name escaped (rich)
        self.repo_label.setWordWrap(True)
        rl.addWidget(self.repo_label)
        self.files = QTableWidget(0, 4)
        self.files.setHorizontalHeaderLabels(MODEL_COLUMNS)
        self.files.verticalHeader().setVisible(False)
        self.files.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.files.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.files.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.files.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.files.horizontalHeader().setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        self.files.horizontalHeader().setSectionResizeMode(2, QHeaderView.ResizeMode.ResizeToContents)
        self.files.horizontalHeader().setSectionResizeMode(3, QHeaderView.ResizeMode.ResizeToContents)
        rl.addWidget(self.files, 1)
        self.files_error = plain_label("")
        self.files_error.setObjectName("errorBanner")
        self.files_error.setWordWrap(True)
        self.files_error.setTextFormat(Qt.TextFormat.PlainText)
        self.files_error.setVisible(False)
        rl.addWidget(self.files_error)
        buttons = QHBoxLayout()
        self.files_retry = QPushButton("Retry")
        self.files_retry.setVisible(False)
        self.files_retry.clicked.connect(self._on_files_retry_clicked)
        buttons.addWidget(self.files_retry)
        buttons.addStretch(1)
        self.download_button = QPushButton("Download")
        self.download_button.setObjectName("primary")
        self.download_button.clicked.connect(self._on_download_clicked)
        buttons.addWidget(self.download_button)
        rl.addLayout(buttons)
        return right

    def _build_queue(self, lay: QVBoxLayout) -> None:
        """The download list under both."""
        title = plain_label("DOWNLOADS")
        title.setObjectName("sectionTitle")
        lay.addWidget(title)
        self.queue = QTableWidget(0, 5)
        self.queue.setObjectName("downloadQueue")
        self.queue.setHorizontalHeaderLabels(["Model", "Progress", "Speed", "Status", ""])
        self.queue.verticalHeader().setVisible(False)
        self.queue.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.queue.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.queue.horizontalHeader().setSectionResizeMode(3, QHeaderView.ResizeMode.Stretch)
        lay.addWidget(self.queue, 1)

    # ------------------------------------------------------------------ suggestions
    def showing_suggestions(self) -> bool:
        """True while the list holds the suggested models (before any search, or after clearing it)."""
        return self.results_title.text().startswith("SUGGESTED")

    def show_suggestions(self) -> None:
        """Fills the list with the shipped suggestions and their fit verdicts for this machine."""
        self._set_search_error(None)
        self.back_to_suggestions.setVisible(False)
        self.results_title.setText("SUGGESTED CHAT MODELS" if self.curated else "")
        self.results.clear()
        probing = self.adapter.library.hardware is None
        for model in self.curated:
            fit = self.adapter.library.fit_for_size(model.size)
            verdict = "checking this machine…" if probing else VERDICT_TEXT.get(getattr(fit, "verdict", ""), "?")
            item = QListWidgetItem(
                f"{shown(model.label)}  ● {verdict}\n"
                f"{shown(model.params)} · Q4_K_M · ≈ {format_bytes(model.size)} · {shown(model.license)}"
            )
            tip = f"{model.repo}/{model.file}\n{model.about}\nlicence: {model.license}"
            if fit is not None:
                tip += f"\n{fit.message}"
            item.setToolTip(plain_tooltip(tip))
            item.setData(REPO_ROLE, model.repo)
            item.setData(FILE_ROLE, model.file)
            self.results.addItem(item)

    @Slot(object)
    def _on_adapter_hardware_ready(self, _hw: object) -> None:
        if self.showing_suggestions():
            current = self.results.currentRow()
            self.results.blockSignals(True)
            self.show_suggestions()
            self.results.setCurrentRow(current)
            self.results.blockSignals(False)

    # ------------------------------------------------------------------ search
    def _set_search_error(self, message: str | None) -> None:
        self.search_error.setVisible(message is not None)
        self.search_retry.setVisible(message is not None)
        self.search_error.setText(shown(message or ""))
        self.search_error.setToolTip(plain_tooltip(message or ""))

    def searching_adapters(self) -> bool:
        """True while the search looks for LoRA adapters (the toggle beside it is on)."""
        return self.adapters_toggle.isChecked()

    @Slot(bool)
    def _on_adapters_toggle_toggled(self, on: bool) -> None:
        self.search.setPlaceholderText(ADAPTER_HINT if on else SEARCH_HINT)
        self._on_search_return_pressed()

    @Slot()
    def _on_search_return_pressed(self) -> None:
        text = self.search.text().strip()
        adapters = self.searching_adapters()
        if not text and not adapters:
            self.show_suggestions()
            return
        self._set_search_error(None)
        self._failed_query = None
        self.results_title.setText("LORA ADAPTERS" if adapters else "SEARCH RESULTS")
        self.back_to_suggestions.setVisible(bool(self.curated) and not adapters)
        self.results.clear()
        self._add_note("Searching…")
        if adapters:
            self.adapter.downloads.search_adapters(text)
        else:
            self.adapter.downloads.search(text)

    def _add_note(self, text: str) -> None:
        """A line in the results list that says what is happening: not a model, so not selectable."""
        item = QListWidgetItem(text)
        item.setFlags(Qt.ItemFlag.NoItemFlags)
        self.results.addItem(item)

    @Slot()
    def _on_back_to_suggestions_clicked(self) -> None:
        self.search.clear()
        self.show_suggestions()

    @Slot()
    def _on_search_retry_clicked(self) -> None:
        if self._failed_query:
            self.search.setText(self._failed_query)
        self._on_search_return_pressed()

    @Slot(str, object)
    def _on_adapter_adapters_found(self, query: str, hits: list[AdapterHit]) -> None:
        if query != self.search.text().strip() or not self.searching_adapters():
            return
        self.results.clear()
        if not hits:
            self._add_note("No GGUF LoRA adapters found.")
        for hit in hits:
            lock = "  🔒 gated" if hit.gated else ""
            base = f"for {hit.base_model}" if hit.base_model else "base model not named"
            item = QListWidgetItem(f"{shown(hit.id)}{lock}\n{shown(base)} · ↓ {hit.downloads:,}  ♥ {hit.likes:,}")
            item.setToolTip(plain_tooltip(f"{hit.id}\nA LoRA adapter {base}: it changes that model's replies"))
            item.setData(REPO_ROLE, hit.id)
            item.setData(ADAPTER_ROLE, hit.base_model or "")
            self.results.addItem(item)

    @Slot(str, object)
    def _on_adapter_search_finished(self, query: str, hits: list[RepoSummary]) -> None:
        if query != self.search.text().strip() or self.searching_adapters():
            return
        self.results.clear()
        if not hits:
            self._add_note("No GGUF repositories found.")
        for hit in hits:
            lock = "  🔒 gated" if hit.gated else ""
            item = QListWidgetItem(f"{shown(hit.id)}{lock}\n↓ {hit.downloads:,}  ♥ {hit.likes:,}")
            item.setData(REPO_ROLE, hit.id)
            self.results.addItem(item)

    @Slot(str, str)
    def _on_adapter_search_failed(self, query: str, message: str) -> None:
        if query != self.search.text().strip():
            return
        self._failed_query = query
        self.results.clear()
        self._add_note("The search failed.")
        self._set_search_error(f"Could not search Hugging Face: {message}")

    # ------------------------------------------------------------------ a repository's files
    def _set_files_error(self, message: str | None) -> None:
        self.files_error.setVisible(message is not None)
        self.files_retry.setVisible(message is not None)
        self.files_error.setText(shown(message or ""))
        self.files_error.setToolTip(plain_tooltip(message or ""))

    def _list(self, repo: str, adapters: bool = False) -> None:
        self._pending_repo = repo
        self._listing_adapters = adapters
        self.repo_files = None
        self._adapter_repo = None
        self._set_files_error(None)
        self.repo_label.setText(f"<b>{rich(repo)}</b>: {'reading the adapters' if adapters else 'listing files'}…")
        self.files.setRowCount(0)
        self.files.setHorizontalHeaderLabels(ADAPTER_COLUMNS if adapters else MODEL_COLUMNS)
        # An adapter's fit names library models: sized to them once listed, at most a third of the table.
        fit_mode = QHeaderView.ResizeMode.Interactive if adapters else QHeaderView.ResizeMode.ResizeToContents
        self.files.horizontalHeader().setSectionResizeMode(3, fit_mode)
        if adapters:
            self.adapter.downloads.list_adapter_files(repo)
        else:
            self.adapter.downloads.list_files(repo)

    @Slot()
    def _on_results_item_selection_changed(self) -> None:
        selected = self.results.selectedItems()
        item = selected[0] if selected else None
        repo = item.data(REPO_ROLE) if item is not None else None
        if repo and item is not None:
            self._wanted_file = item.data(FILE_ROLE)
            base = item.data(ADAPTER_ROLE)
            self._listing_base = base or None
            self._list(repo, isinstance(base, str))

    @Slot()
    def _on_files_retry_clicked(self) -> None:
        if self._pending_repo:
            self._list(self._pending_repo, self._listing_adapters)

    @Slot(str, object)
    def _on_adapter_adapter_files_listed(self, repo: str, found: AdapterRepo) -> None:
        if repo != self._pending_repo or not self._listing_adapters:
            return  # an answer for a repository picked before the current one
        self.repo_files = files = found.files
        self._adapter_repo = found
        n = sum(a.is_adapter for a in found.adapters)
        extra = " · gated: accept the licence on the website first" if files.gated else ""
        self.repo_label.setText(f"<b>{rich(repo)}</b> — {n} LoRA adapter{'s' if n != 1 else ''}{extra}")
        self.files.setRowCount(len(found.adapters))
        for row, remote in enumerate(found.adapters):
            arch = remote.architecture or "?"
            rank = f" · rank {remote.rank}" if remote.rank else ""
            named = remote.base_model or self._listing_base
            tip = remote.choice.name + (f"\nmade for {named}" if named else "")
            self.files.setItem(row, 0, _item(remote.choice.name, tip))
            self.files.setItem(row, 1, _item(arch + rank))
            self.files.setItem(row, 2, _item(format_bytes(remote.choice.total_size), align_right=True))
            self.files.setItem(row, 3, _item(*adapter_fit_text(remote, self._listing_base)))
        wanted = max(self.files.sizeHintForColumn(3), self.files.horizontalHeader().sectionSizeHint(3))
        self.files.horizontalHeader().resizeSection(3, min(wanted + 8, self.files.viewport().width() // 3))

    @Slot(str, object)
    def _on_adapter_files_listed(self, repo: str, files: RepoFiles) -> None:
        if (self._pending_repo is not None and repo != self._pending_repo) or self._listing_adapters:
            return  # an answer for a repository picked before the current one
        self._pending_repo = repo
        self.repo_files = files
        extra = " · gated: accept the licence on the website first" if files.gated else ""
        unsafe = f" · {len(files.unsafe_names)} unsafe file names hidden" if files.unsafe_names else ""
        self.repo_label.setText(f"<b>{rich(repo)}</b> — {len(files.choices)} models{extra}{unsafe}")
        self.files.setRowCount(len(files.choices))
        wanted = None
        for row, choice in enumerate(files.choices):
            parts = f" ({len(choice.files)} parts)" if len(choice.files) > 1 else ""
            projector = choice.projector
            vision = " + vision projector" if projector is not None else ""
            tip = f"sees images with {projector.filename}, downloaded beside it" if projector is not None else ""
            size = choice.total_size + (projector.size if projector is not None else 0)
            self.files.setItem(row, 0, _item(choice.name + parts + vision, tip))
            self.files.setItem(row, 1, _item(choice.quant or "?"))
            split = f"{format_bytes(choice.total_size)} + projector {format_bytes(projector.size)}" if projector else ""
            self.files.setItem(row, 2, _item(format_bytes(size), split, align_right=True))
            self.files.setItem(row, 3, _verdict_item(self.adapter.library.fit_for_size(size)))
            if self._wanted_file and any(f.filename == self._wanted_file for f in choice.files):
                wanted = row
        if wanted is not None:
            self.files.selectRow(wanted)
        elif self._wanted_file:
            self.repo_label.setText(
                self.repo_label.text() + f" · the suggested {rich(self._wanted_file)} is not there any more"
            )

    @Slot(str, str)
    def _on_adapter_files_failed(self, repo: str, message: str) -> None:
        if self._pending_repo is not None and repo != self._pending_repo:
            return
        self._pending_repo = repo
        self.repo_label.setText(f"<b>{rich(repo)}</b>")
        self._set_files_error(f"Could not list the files of {repo}: {message}")

    @Slot()
    def _on_download_clicked(self) -> None:
        rows = self.files.selectionModel().selectedRows()
        if not rows or self.repo_files is None:
            if self.files_error.isVisible():
                return  # the error and its Retry say what to do
            self.repo_label.setText(self.repo_label.text().split(" · pick")[0] + " · pick a file to download first")
            return
        choice = self.repo_files.choices[rows[0].row()]
        base = None
        if self._listing_adapters and self._adapter_repo is not None:
            remote = self._adapter_repo.adapters[rows[0].row()]
            base = self._listing_base if remote.is_adapter and not remote.base_model else None
        self.adapter.downloads.download(self.repo_files.repo, choice, self.repo_files.commit, base_model=base)

    # ------------------------------------------------------------------ the download queue
    def _queue_row(self, key: str) -> int | None:
        for row in range(self.queue.rowCount()):
            item = self.queue.item(row, 0)
            if item is not None and item.data(Qt.ItemDataRole.UserRole) == key:
                return row
        return None

    @Slot(object)
    def _on_adapter_transfer_changed(self, transfer: Transfer) -> None:
        if transfer.kind != "download":
            return
        row = self._queue_row(transfer.key)
        if row is None:
            row = self.queue.rowCount()
            self.queue.insertRow(row)
            name = _item(transfer.label, "\n".join(str(p) for p in transfer.paths))
            name.setData(Qt.ItemDataRole.UserRole, transfer.key)
            self.queue.setItem(row, 0, name)
            bar = QProgressBar()
            bar.setTextVisible(False)
            self.queue.setCellWidget(row, 1, bar)
            buttons = TransferButtonsWidget(transfer)
            buttons.resume_requested.connect(self._on_transfer_buttons_resume_requested)
            buttons.discard_requested.connect(self._on_transfer_buttons_discard_requested)
            self.queue.setCellWidget(row, 4, buttons)
            # Cell widgets do not take part in ResizeToContents: size the row and column for them.
            hint = buttons.sizeHint()
            self.queue.setRowHeight(row, max(self.queue.rowHeight(row), hint.height() + 6))
            header = self.queue.horizontalHeader()
            header.resizeSection(4, max(header.sectionSize(4), hint.width() + 8))
        name_item = self.queue.item(row, 0)
        if name_item is not None and name_item.text() != shown(transfer.label):  # another transfer took the row over
            name_item.setText(shown(transfer.label))
            name_item.setToolTip(plain_tooltip("\n".join(str(p) for p in transfer.paths)))
        cell = self.queue.cellWidget(row, 1)
        if isinstance(cell, QProgressBar):
            # In permille: QProgressBar takes a 32-bit int, and model files pass 2 GiB.
            cell.setRange(0, 1000)
            cell.setValue(min(1000, transfer.done * 1000 // transfer.total) if transfer.total > 0 else 0)
        speed = format_speed(transfer.speed_bps) if transfer.running else ""
        self.queue.setItem(row, 2, _item(speed, align_right=True))
        self.queue.setItem(row, 3, _item(transfer_status(transfer), transfer.message))
        cell_buttons = self.queue.cellWidget(row, 4)
        if isinstance(cell_buttons, TransferButtonsWidget):
            cell_buttons.update_for(transfer)

    @Slot(object)
    def _on_adapter_transfer_removed(self, transfer: Transfer) -> None:
        row = self._queue_row(transfer.key)
        if row is not None:
            self.queue.removeRow(row)

    @Slot(object)
    def _on_transfer_buttons_resume_requested(self, transfer: Transfer) -> None:
        self.adapter.downloads.resume(transfer)

    @Slot(object)
    def _on_transfer_buttons_discard_requested(self, transfer: Transfer) -> None:
        kept = f" ({format_bytes(transfer.done)} downloaded)" if transfer.done else ""
        complete = ""
        if transfer.files_done and len(transfer.paths) > 1:
            complete = f" The {transfer.files_done} file(s) already complete stay in the models folder."
        if confirm(
            self,
            "Discard download",
            f"Delete the unfinished download of {shown(transfer.label)}{kept}? "
            f"It cannot be resumed afterwards.{complete}",
        ):
            self.adapter.downloads.discard(transfer)


def adapter_fit_text(remote: RemoteAdapter, repo_base: str | None = None) -> tuple[str, str]:
    """The "Fits in your library" cell of an adapter file, and its tooltip; the base named is the
    file's own (its header), else ``repo_base`` (its repository's tags)."""
    if not remote.is_adapter:
        return f"✕ {remote.note or 'not a LoRA adapter'}", remote.note or ""
    if remote.fits:
        names = ", ".join(p.stem for p in remote.fits)
        return f"● fits {names}", "\n".join(str(p) for p in remote.fits)
    named = remote.base_model or repo_base
    base = f" (made for {named})" if named else ""
    return f"no {remote.architecture} model in your library fits{base}", "download its base model first"


def format_progress(done: int, total: int) -> str:
    """``1.2 of 4.0 GiB``: both numbers in the unit of the total (or just the bytes done)."""
    if total <= 0:
        return format_bytes(done)
    unit, scale = "B", 1
    for name, size in (("KiB", 2**10), ("MiB", 2**20), ("GiB", 2**30), ("TiB", 2**40)):
        if total >= size:
            unit, scale = name, size
    if scale == 1:
        return f"{done} of {total} B"
    return f"{done / scale:.1f} of {total / scale:.1f} {unit}"


def transfer_status(transfer: Transfer) -> str:
    """The Status cell of a download row, e.g. ``paused — 1.2 of 4.0 GiB``."""
    if transfer.state == "unreadable":
        size = f" ({format_bytes(transfer.done)} on disk)" if transfer.done else ""
        return f"can't resume — {transfer.message}{size}"
    if transfer.state == "discarded":
        return "discarded"
    state = transfer.state
    if transfer.state == "cancelled" and transfer.done:
        state = "stopped"
    status = f"{state} — {format_progress(transfer.done, transfer.total)}"
    count = len(transfer.paths)
    if transfer.kind == "download" and count > 1:  # a split model (or a model with its mmproj)
        noun = "parts" if not any("mmproj" in p.name.lower() for p in transfer.paths) else "files"
        status += f" · {transfer.files_done} of {count} {noun} done"
    eta = format_eta(transfer.eta_s) if transfer.state == "downloading" else ""
    if eta:
        status += f" · {eta}"
    if transfer.message and transfer.state in ("error", "retrying", "cancelled"):
        status += f" · {transfer.message}"
    return status


class TransferButtonsWidget(QWidget):
    """A download row's buttons: Pause/Cancel while it runs, Resume/Discard once it stopped.

    Pause and Cancel set the transfer's events directly (CONTRIBUTING.md rule 9); Resume and Discard go
    through the panel (Discard asks first).

    Signals:
        resume_requested(object): the :class:`Transfer` to start again from its partial files.
        discard_requested(object): the :class:`Transfer` whose partial files to delete.
    """

    resume_requested = Signal(object)
    discard_requested = Signal(object)

    def __init__(self, transfer: Transfer, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.transfer = transfer
        row = QHBoxLayout(self)
        row.setContentsMargins(2, 0, 2, 0)
        self.pause_button = QPushButton("Pause")
        self.pause_button.setCheckable(True)
        self.pause_button.toggled.connect(self._on_pause_button_toggled)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Stop the download; the bytes so far are kept to resume later")
        self.cancel_button.clicked.connect(self._on_cancel_button_clicked)
        self.resume_button = QPushButton("Resume")
        self.resume_button.setObjectName("primary")
        self.resume_button.clicked.connect(lambda: self.resume_requested.emit(self.transfer))
        self.discard_button = QPushButton("Discard…")
        self.discard_button.setToolTip("Delete the partial download from disk")
        self.discard_button.clicked.connect(lambda: self.discard_requested.emit(self.transfer))
        row.addStretch(1)
        for button in (self.pause_button, self.cancel_button, self.resume_button, self.discard_button):
            row.addWidget(button)
        self.update_for(transfer)

    def update_for(self, transfer: Transfer) -> None:
        """Shows the buttons that fit the transfer's state."""
        self.transfer = transfer
        running = transfer.running
        stopped = not running and transfer.state not in ("done", "discarded")
        self.pause_button.setVisible(running)
        self.cancel_button.setVisible(running)
        self.resume_button.setVisible(stopped and transfer.resumable)
        self.resume_button.setText("Resume" if transfer.done or transfer.restored else "Retry")
        self.discard_button.setVisible(stopped)
        if not running and self.pause_button.isChecked():
            self.pause_button.blockSignals(True)
            self.pause_button.setChecked(False)
            self.pause_button.setText("Pause")
            self.pause_button.blockSignals(False)
        self.setEnabled(transfer.state not in ("done", "discarded"))

    @Slot(bool)
    def _on_pause_button_toggled(self, paused: bool) -> None:
        if paused:
            self.transfer.pause.set()
        else:
            self.transfer.pause.clear()
        self.pause_button.setText("Resume" if paused else "Pause")

    @Slot()
    def _on_cancel_button_clicked(self) -> None:
        self.transfer.pause.clear()
        self.transfer.cancel.set()
