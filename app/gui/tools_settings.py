"""Settings → Tools: the MCP servers (add by command or URL, paste an ``mcp.json``, remove), each
one's status and the tools it offers, on/off per tool and per server, the allow list, and the
limits of one turn: the step limit and the per-call timeout (issue 12, "The app").

The list of sources and their state is the dialog's main area, on its first tab, with the selected
row's whole status (a crash line) under it; adding a server selects it. The allow list and the
limits are on a second tab, the paste box opens on demand (issue 28: at 620×520 the list had one row).

Contract: ARCHITECTURE.md, 'app.gui.tools_settings'.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Slot
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QGridLayout,
    QHBoxLayout,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QTabWidget,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)
from shiboken6 import isValid

from app.gui.display_text import plain_label, plain_tooltip, shown
from app.gui.tasks import describe_error, run_in_background
from app.gui.wheel_guard import guard_wheel
from app.gui.window_layout import make_wrapping, set_wrapped_text
from app.tool_config import (
    BUILTIN,
    MAX_STEPS_RANGE,
    TIMEOUT_S_RANGE,
    Permissions,
    ServerEntry,
    ToolLimits,
    ToolSetupError,
    add_server,
    import_servers_text,
    load_servers,
    parse_server,
    remove_server,
)
from engine.agent.mcp_client import McpServer, McpServerError

if TYPE_CHECKING:
    from app.paths import Paths
    from engine.agent.mcp_client import McpServer, McpServerConfig, McpServerStatus
    from engine.inference.tools import ToolSpec

COL_NAME, COL_ON, COL_ALLOW, COL_STATUS = range(4)
ROLE_KEY = Qt.ItemDataRole.UserRole + 1  # (source, tool) of a row; tool "*" for a server's row


def server_entry_for(name: str, target: str) -> dict[str, str | list[str]]:
    """The ``mcp.json`` object for a command line or a URL typed in the Add row.

    Raises:
        ToolSetupError: nothing typed, or a command line with unbalanced quotes.
    """
    target = target.strip()
    if not target:
        raise ToolSetupError("mcp.json", f"server {name!r}: type the command that starts it, or its URL")
    if target.lower().startswith(("http://", "https://")):
        return {"url": target}
    try:
        words = shlex.split(target)
    except ValueError as exc:
        raise ToolSetupError("mcp.json", f"server {name!r}: the command line cannot be read ({exc})") from None
    return {"command": words[0], "args": words[1:]}


def _check_server(config: McpServerConfig, keep: list[McpServer]) -> tuple[list[ToolSpec], McpServerStatus]:
    """Starts one server, lists its tools, stops it (on a background thread)."""

    server = McpServer(config)
    keep.append(server)
    try:
        try:
            return server.tools(), server.status()
        except McpServerError:
            return [], server.status()
    finally:
        server.close()


class ToolsSettingsDialog(QDialog):
    """The Tools page of the settings.

    Args:
        paths: the data folders (``mcp.json``, the permissions).
        check_on_open: start every server at once to show its status and tools.
    """

    def __init__(self, paths: Paths, parent: QWidget | None = None, check_on_open: bool = True) -> None:
        super().__init__(parent)
        self.setWindowTitle("Settings — Tools")
        self.setMinimumSize(620, 520)
        self.paths = paths
        self.permissions: Permissions | None = None
        self.servers: dict[str, ServerEntry] = {}
        self.tools_of: dict[str, list[ToolSpec]] = {}
        self.status_of: dict[str, str] = {}
        self._checking: set[str] = set()
        self._started: list[McpServer] = []  # servers being checked (closed on Stop and at close)
        self._filling = False
        self._selected: tuple[str, str] | None = None  # the row the user picked (kept across refills)

        lay = QVBoxLayout(self)
        self.tabs = QTabWidget()
        lay.addWidget(self.tabs, 1)
        servers = QWidget()
        servers_lay = QVBoxLayout(servers)
        self._build_sources(servers_lay)
        self._build_server_rows(servers_lay)
        self.tabs.addTab(servers, "Servers and tools")
        allowed = QWidget()
        allowed_lay = QVBoxLayout(allowed)
        self._build_allow_list(allowed_lay)
        self._build_limits(allowed_lay)
        self.tabs.addTab(allowed, "Always allowed and limits")
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        lay.addWidget(buttons)
        guard_wheel(self)

        self.reload()
        self._show_progress()
        if check_on_open:
            self.check_all()

    # ------------------------------------------------------------------ layout
    def _build_sources(self, lay: QVBoxLayout) -> None:
        """The intro, the tree of sources and tools, and the checks' busy bar with Stop."""
        intro = plain_label(
            "The tools a chat may offer the model when its Tools switch is on. A call that is not "
            "always allowed asks first, with its exact arguments."
        )
        intro.setObjectName("explain")
        intro.setWordWrap(True)
        lay.addWidget(intro)

        self.tree = QTreeWidget()
        self.tree.setObjectName("toolSources")
        self.tree.setColumnCount(4)
        self.tree.setHeaderLabels(["Source / tool", "On", "Always allow", "Status"])
        self.tree.setAccessibleName("Tool sources and their tools")
        self.tree.setMinimumHeight(160)
        self.tree.itemChanged.connect(self._on_tree_item_changed)
        self.tree.currentItemChanged.connect(self._on_tree_current_item_changed)
        lay.addWidget(self.tree, 1)
        # The selected row's whole state: a server's status or crash line, a tool's description.
        self.details = make_wrapping(plain_label(""))
        self.details.setObjectName("toolDetails")
        self.details.setAccessibleName("The selected source or tool")
        lay.addWidget(self.details)

        progress_row = QHBoxLayout()
        self.progress = QProgressBar()
        self.progress.setRange(0, 0)
        self.progress.setMaximumHeight(10)
        self.progress.setTextVisible(False)
        self.progress_label = plain_label("")
        self.progress_label.setObjectName("explain")
        self.stop_button = QPushButton("Stop checking")
        self.stop_button.clicked.connect(self.stop_checking)
        progress_row.addWidget(self.progress_label, 1)
        progress_row.addWidget(self.progress)
        progress_row.addWidget(self.stop_button)
        lay.addLayout(progress_row)

    def _build_server_rows(self, lay: QVBoxLayout) -> None:
        """Check and Remove, the Add row (name, command or URL), the mcp.json paste and the error line."""
        row = QHBoxLayout()
        self.check_button = QPushButton("Check servers")
        self.check_button.setToolTip("Start each server, show its status and the tools it offers")
        self.check_button.clicked.connect(self.check_all)
        self.remove_button = QPushButton("Remove server")
        self.remove_button.clicked.connect(self._on_remove_button_clicked)
        row.addWidget(self.check_button)
        row.addWidget(self.remove_button)
        row.addStretch(1)
        lay.addLayout(row)

        add_row = QHBoxLayout()
        self.name_edit = QLineEdit()
        self.name_edit.setPlaceholderText("name")
        self.name_edit.setMaximumWidth(140)
        self.name_edit.setAccessibleName("New server's name")
        self.target_edit = QLineEdit()
        self.target_edit.setPlaceholderText("command (npx -y @modelcontextprotocol/server-filesystem ~/notes) or URL")
        self.target_edit.setAccessibleName("New server's command or URL")
        self.add_button = QPushButton("Add server")
        self.add_button.clicked.connect(self._on_add_button_clicked)
        add_row.addWidget(self.name_edit)
        add_row.addWidget(self.target_edit, 1)
        add_row.addWidget(self.add_button)
        lay.addLayout(add_row)

        self.paste_toggle = QPushButton("Paste an mcp.json…")
        self.paste_toggle.setCheckable(True)
        self.paste_toggle.setToolTip("Add the servers of an mcp.json from Claude Desktop, Cursor, …")
        row.insertWidget(2, self.paste_toggle)
        self.paste = QPlainTextEdit()
        self.paste.setPlaceholderText('Paste an mcp.json: {"mcpServers": {"name": {"command": "...", "args": []}}}')
        self.paste.setMaximumHeight(80)
        self.paste.setAccessibleName("Paste an mcp.json")
        self.import_button = QPushButton("Add the pasted servers")
        self.import_button.clicked.connect(self._on_import_button_clicked)
        lay.addWidget(self.paste)
        lay.addWidget(self.import_button, 0, Qt.AlignmentFlag.AlignRight)
        for widget in (self.paste, self.import_button):
            widget.setVisible(False)
            self.paste_toggle.toggled.connect(widget.setVisible)

        self.error_label = plain_label("")
        self.error_label.setObjectName("errorText")
        self.error_label.setWordWrap(True)
        self.error_label.setVisible(False)
        lay.addWidget(self.error_label)

    def _build_allow_list(self, lay: QVBoxLayout) -> None:
        """The tools always allowed, with Ask again."""
        allow_title = plain_label("Always allowed (these run without asking)")
        allow_title.setObjectName("metricLabel")
        lay.addWidget(allow_title)
        allow_row = QHBoxLayout()
        self.allow_list = QListWidget()
        self.allow_list.setAccessibleName("The allow list")
        self.forget_button = QPushButton("Ask again")
        self.forget_button.setToolTip("Take the selected tool off the allow list: its calls ask first again")
        self.forget_button.clicked.connect(self._on_forget_button_clicked)
        allow_row.addWidget(self.allow_list, 1)
        allow_row.addWidget(self.forget_button, 0, Qt.AlignmentFlag.AlignTop)
        lay.addLayout(allow_row, 1)

    def _build_limits(self, lay: QVBoxLayout) -> None:
        """The step limit and the per-call timeout, each with its one-line explanation."""
        title = plain_label("Limits of one reply")
        title.setObjectName("metricLabel")
        lay.addWidget(title)
        grid = QGridLayout()
        self.steps_spin = QSpinBox()
        self.steps_spin.setRange(*MAX_STEPS_RANGE)
        self.steps_spin.setSuffix(" rounds")
        self.steps_spin.setAccessibleName("Step limit")
        self.timeout_spin = QSpinBox()
        self.timeout_spin.setRange(*TIMEOUT_S_RANGE)
        self.timeout_spin.setSuffix(" s")
        self.timeout_spin.setAccessibleName("Timeout per call")
        for row, (label, spin, explain) in enumerate(
            (
                ("Step limit", self.steps_spin, "Rounds of tool calls in one reply; then the model must answer."),
                ("Timeout per call", self.timeout_spin, "A call that runs longer is stopped; the model is told."),
            )
        ):
            note = plain_label(explain)
            note.setObjectName("explain")
            grid.addWidget(plain_label(label), row, 0)
            grid.addWidget(spin, row, 1)
            grid.addWidget(note, row, 2)
            spin.valueChanged.connect(self._on_limit_changed)
        grid.setColumnStretch(2, 1)
        lay.addLayout(grid)

    # ------------------------------------------------------------------ data
    def show_error(self, text: str) -> None:
        """One line under the buttons (empty: hidden)."""
        self.error_label.setText(text)
        self.error_label.setVisible(bool(text))

    def reload(self) -> None:
        """Reads ``mcp.json`` and the permissions again and fills the tree and the allow list."""

        try:
            self.permissions = Permissions.load(self.paths)
            self.servers = load_servers(self.paths)
        except ToolSetupError as exc:
            self.show_error(str(exc))
            self.servers = {}
        self._fill()

    def _builtin_specs(self) -> list[ToolSpec]:
        # lazy: start-up (+8 ms)
        from engine.agent.builtin_tools import BUILTIN_NAMES, BuiltinTools

        # read_file is offered only with attached files: a placeholder lists it (nothing is read).
        return BuiltinTools(list(BUILTIN_NAMES), attached_files=[self.paths.config]).tools()

    def _fill(self) -> None:
        self._filling = True
        self.tree.clear()
        perms = self.permissions
        self._add_source(BUILTIN, "Built-in tools", "always available", self._builtin_specs(), perms)
        for name, entry in self.servers.items():
            described = entry.describe()
            where = described.get("url") or " ".join([described.get("command") or "", *described.get("args", [])])
            status = self.status_of.get(name, "checking…" if name in self._checking else "not started")
            self._add_source(name, name, status, self.tools_of.get(name, []), perms)
            top = self.tree.topLevelItem(self.tree.topLevelItemCount() - 1)
            if top is not None:
                top.setToolTip(COL_NAME, plain_tooltip(f"{described['transport']}: {where.strip()}"))
        self.tree.expandAll()
        for column in (COL_NAME, COL_ON, COL_ALLOW):
            self.tree.resizeColumnToContents(column)
        selected = self.item_for(*self._selected) if self._selected is not None else None
        if selected is not None:
            self.tree.setCurrentItem(selected)
            self.tree.scrollToItem(selected)
        self._filling = False
        self._show_details(self.tree.currentItem())
        self.allow_list.clear()
        if perms is not None:
            self._fill_allow_list(perms)
        limits = perms.limits if perms is not None else ToolLimits()
        self._filling = True
        self.steps_spin.setValue(limits.max_steps)
        self.timeout_spin.setValue(limits.timeout_s)
        self._filling = False
        for spin in (self.steps_spin, self.timeout_spin):
            spin.setEnabled(perms is not None)  # a damaged file is not written over

    def _fill_allow_list(self, perms: Permissions) -> None:
        """The tools always allowed (``source/tool``, each name shown as it is)."""
        self.allow_list.clear()
        for key in perms.allowed():
            item = QListWidgetItem(shown(key))
            item.setData(Qt.ItemDataRole.UserRole, key)
            self.allow_list.addItem(item)

    def _add_source(
        self, source: str, label: str, status: str, specs: list[ToolSpec], perms: Permissions | None
    ) -> None:
        top = QTreeWidgetItem([shown(label), "", "", shown(status)])
        top.setData(COL_NAME, ROLE_KEY, (source, "*"))
        top.setToolTip(COL_STATUS, plain_tooltip(status))
        if source != BUILTIN:
            top.setFlags(top.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            top.setCheckState(
                COL_ON, Qt.CheckState.Unchecked if perms and perms.is_off(source) else Qt.CheckState.Checked
            )
        self.tree.addTopLevelItem(top)
        for spec in specs:
            child = QTreeWidgetItem([shown(spec.name), "", "", shown(" ".join(spec.description.split()))])
            child.setToolTip(COL_STATUS, plain_tooltip(spec.description))
            child.setData(COL_NAME, ROLE_KEY, (source, spec.name))
            child.setFlags(child.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            off = perms is not None and perms.is_off(source, spec.name)
            allowed = perms is not None and perms.always_allows(source, spec.name)
            child.setCheckState(COL_ON, Qt.CheckState.Unchecked if off else Qt.CheckState.Checked)
            child.setCheckState(COL_ALLOW, Qt.CheckState.Checked if allowed else Qt.CheckState.Unchecked)
            top.addChild(child)

    @Slot(QTreeWidgetItem, QTreeWidgetItem)
    def _on_tree_current_item_changed(self, item: QTreeWidgetItem | None, _previous: QTreeWidgetItem | None) -> None:
        if not self._filling:
            self._selected = item.data(COL_NAME, ROLE_KEY) if item is not None else None
            self._show_details(item)

    def _show_details(self, item: QTreeWidgetItem | None) -> None:
        """The selected row's whole state under the list: a server's status (a crash line, in full)
        and how it starts; a tool's description."""
        key = item.data(COL_NAME, ROLE_KEY) if item is not None else None
        if key is None:
            set_wrapped_text(self.details, "Select a source or a tool to see its status in full.")
            return
        source, tool = key
        if tool != "*":
            spec = next((s for s in self._specs_of(source) if s.name == tool), None)
            set_wrapped_text(self.details, f"{tool}: {spec.description if spec is not None else ''}".strip())
            return
        if source == BUILTIN:
            set_wrapped_text(self.details, "Built-in tools: always available.")
            return
        status = self.status_of.get(source, "checking…" if source in self._checking else "not started")
        entry = self.servers.get(source)
        where = ""
        if entry is not None:
            described = entry.describe()
            target = described.get("url") or " ".join([described.get("command") or "", *described.get("args", [])])
            where = f" ({described['transport']}: {target.strip()})"
        set_wrapped_text(self.details, f"{source}{where}: {status}")

    def _specs_of(self, source: str) -> list[ToolSpec]:
        return self._builtin_specs() if source == BUILTIN else self.tools_of.get(source, [])

    def item_for(self, source: str, tool: str = "*") -> QTreeWidgetItem | None:
        """The row of a server (``tool="*"``) or of one of its tools."""
        for i in range(self.tree.topLevelItemCount()):
            top = self.tree.topLevelItem(i)
            if top is None or top.data(COL_NAME, ROLE_KEY) != (source, "*"):
                continue
            if tool == "*":
                return top
            for j in range(top.childCount()):
                child = top.child(j)
                if child is not None and child.data(COL_NAME, ROLE_KEY) == (source, tool):
                    return child
        return None

    def tool_names(self, source: str) -> list[str]:
        top = self.item_for(source)
        if top is None:
            return []
        children = (top.child(j) for j in range(top.childCount()))
        return [child.data(COL_NAME, ROLE_KEY)[1] for child in children if child is not None]

    @Slot()
    def _on_limit_changed(self) -> None:
        if self._filling or self.permissions is None:
            return
        try:
            self.permissions.set_limits(ToolLimits(self.steps_spin.value(), self.timeout_spin.value()))
        except OSError as exc:
            self.show_error(f"{self.paths.tool_permissions}: not saved ({describe_error(exc)})")
            return
        self.show_error("")

    @Slot(QTreeWidgetItem, int)
    def _on_tree_item_changed(self, item: QTreeWidgetItem, column: int) -> None:
        if self._filling or self.permissions is None or column not in (COL_ON, COL_ALLOW):
            return
        source, tool = item.data(COL_NAME, ROLE_KEY)
        checked = item.checkState(column) == Qt.CheckState.Checked
        try:
            if column == COL_ON:
                self.permissions.set_off(source, tool, off=not checked)
            else:
                self.permissions.set_always_allow(source, tool, allow=checked)
        except OSError as exc:
            self.show_error(f"{self.paths.tool_permissions}: not saved ({describe_error(exc)})")
            return
        self.show_error("")
        self._fill_allow_list(self.permissions)

    # ------------------------------------------------------------------ servers
    def check_all(self) -> None:
        """Starts every server (in the background) to show its status and tools."""
        for name in self.servers:
            self.check(name)

    def check(self, name: str) -> None:
        if name in self._checking or name not in self.servers:
            return
        self._checking.add(name)
        self.status_of.pop(name, None)
        config = self.servers[name].config
        started = self._started

        def done(result: tuple[list[ToolSpec], McpServerStatus]) -> None:
            if isValid(self):
                self._after_check(name, *result)

        def failed(exc: BaseException) -> None:
            if isValid(self):
                self._after_check(name, [], None, describe_error(exc))

        run_in_background(lambda: _check_server(config, started), done, failed)
        self._fill()
        self._show_progress()

    def _after_check(
        self, name: str, specs: list[ToolSpec], status: McpServerStatus | None, error: str | None = None
    ) -> None:
        self._checking.discard(name)
        self._started[:] = [s for s in self._started if s.name != name]
        self.tools_of[name] = specs
        if specs and self.permissions is not None:
            try:  # what the chat's Tools menu offers as a named tool choice
                self.permissions.remember_tools(name, [spec.name for spec in specs])
            except OSError:
                pass  # only a convenience: the next check tries again
        reason = error or (status.last_error if status is not None else None)
        if reason:  # the engine's reason is a sentence about the server ("it did not start: ..."): no prefix
            self.status_of[name] = reason[:1].upper() + reason[1:]
        else:
            self.status_of[name] = f"works · {len(specs)} tool{'s' if len(specs) != 1 else ''}"
        self._fill()
        self._show_progress()

    def _show_progress(self) -> None:
        busy = bool(self._checking)
        self.progress.setVisible(busy)
        self.stop_button.setVisible(busy)
        self.progress_label.setText(f"Starting {', '.join(sorted(self._checking))}…" if busy else "")

    @property
    def checking(self) -> bool:
        return bool(self._checking)

    @Slot()
    def stop_checking(self) -> None:
        """Ends the checks in progress (their servers are closed; each row says so)."""
        servers, self._started[:] = list(self._started), []
        for server in servers:
            run_in_background(server.close)

    @Slot()
    def _on_add_button_clicked(self) -> None:
        name = self.name_edit.text().strip()
        try:
            entry = parse_server(name, server_entry_for(name, self.target_edit.text()))
            add_server(self.paths, entry)
        except (ToolSetupError, OSError) as exc:
            self.show_error(describe_error(exc))
            return
        self.show_error("")
        self.name_edit.clear()
        self.target_edit.clear()
        self._selected = (name, "*")  # the new server, its status and its tools are in view
        self.reload()
        self.check(name)

    @Slot()
    def _on_import_button_clicked(self) -> None:
        try:
            names = import_servers_text(self.paths, self.paste.toPlainText())
        except (ToolSetupError, OSError) as exc:
            self.show_error(describe_error(exc))
            return
        self.show_error("")
        self.paste.clear()
        self.paste_toggle.setChecked(False)
        if names:
            self._selected = (names[0], "*")
        self.reload()
        for name in names:
            self.check(name)

    @Slot()
    def _on_remove_button_clicked(self) -> None:
        item = self.tree.currentItem()
        while item is not None and item.parent() is not None:
            item = item.parent()
        key = item.data(COL_NAME, ROLE_KEY) if item is not None else None
        if key is None or key[0] == BUILTIN:
            self.show_error("Select a server to remove (the built-in tools can be turned off, not removed).")
            return
        try:
            remove_server(self.paths, key[0])
        except (ToolSetupError, OSError) as exc:
            self.show_error(describe_error(exc))
            return
        self.tools_of.pop(key[0], None)
        self.status_of.pop(key[0], None)
        self.show_error("")
        self.reload()

    @Slot()
    def _on_forget_button_clicked(self) -> None:
        item = self.allow_list.currentItem()
        if item is None or self.permissions is None:
            return
        source, _, tool = str(item.data(Qt.ItemDataRole.UserRole)).partition("/")
        try:
            self.permissions.set_always_allow(source, tool, allow=False)
        except OSError as exc:
            self.show_error(f"{self.paths.tool_permissions}: not saved ({describe_error(exc)})")
            return
        self._fill()

    def done(self, result: int) -> None:
        self.stop_checking()
        super().done(result)
