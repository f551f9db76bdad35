"""The chat's Tools switch: per conversation, off by default; which sources (the built-in tools,
each MCP server of ``mcp.json``), the tool choice (Auto, Required, None or one named tool) and the
thinking switch (model's default, on, off, a budget in tokens) — issue 12, "The app".

The choice is saved in the conversation's ``settings`` (``"tools": {"on", "sources", "choice"}``,
``choice`` absent for Auto, else ``required``, ``none`` or a tool's name as ``--tool-choice`` takes
it; ``"thinking": "on" | "off" | TOKENS``); :func:`turn_options` turns it, with the step limit and
the per-call timeout of Settings → Tools (``app.tool_config.ToolLimits``), into the turn's
``ToolsRequest`` and thinking keywords. :class:`ChatToolsController` wires the switch, the
transcript's tool cards, approvals and thinking, and the inspector's loop timeline into the main
window, so the window only creates it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from PySide6.QtCore import QEvent, QObject, QSize, Qt, Signal, Slot
from PySide6.QtGui import QAction, QResizeEvent
from PySide6.QtWidgets import QMenu, QSizePolicy, QToolButton, QWidget, QWidgetAction

from app.gui.display_text import plain_label, plain_tooltip, shown
from app.gui.workers.agent_tools import ToolsRequest

if TYPE_CHECKING:
    from app.gui.main_window import MainWindow
    from app.gui.workers.agent_turn import ApprovalRequest
    from app.gui.workers.llm_requests import LoadedModel
    from app.paths import Paths
    from engine.history_schema import Conversation

BUILTIN = "builtin"
"""``app.tool_config.BUILTIN`` (not imported here: it brings the MCP client, the window need not)."""
DEFAULT_THINKING_BUDGET = 1024
CHOICES = (
    (None, "Auto — the model decides"),
    ("required", "Required — always call a tool"),
    ("none", "None — offer no tools"),
)
"""The tool choices that are not one named tool, with their menu labels (None is Auto)."""


def tools_choice(settings: Mapping[str, object] | None) -> tuple[bool, list[str]]:
    """``(on, sources)`` saved with a conversation (off, built-in tools, when nothing is saved)."""
    saved = (settings or {}).get("tools")
    if not isinstance(saved, dict):
        return False, [BUILTIN]
    sources = [str(s) for s in saved.get("sources", [BUILTIN]) if isinstance(s, str)]
    return bool(saved.get("on")), sources


def tool_choice(settings: Mapping[str, object] | None) -> str | None:
    """The chat's tool choice: None (Auto), ``required``, ``none`` or a tool's name."""
    saved = (settings or {}).get("tools")
    choice = saved.get("choice") if isinstance(saved, dict) else None
    return choice if isinstance(choice, str) and choice.strip() and choice != "auto" else None


def thinking_choice(settings: Mapping[str, object] | None) -> str | int | None:
    """``"on"``, ``"off"``, a budget in tokens, or None (the model's default)."""
    value = (settings or {}).get("thinking")
    if value in ("on", "off"):
        return str(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def turn_options(
    settings: Mapping[str, object] | None, paths: Paths, thinking_controls: Sequence[str] = ()
) -> tuple[ToolsRequest | None, bool | None, int | None]:
    """The turn's tools request, thinking switch and thinking budget for a conversation's settings.

    The switch is sent only when the loaded model's template has one (``enable_thinking``);
    a budget works for any model that writes ``<think>``.
    """
    on, sources = tools_choice(settings)
    tools = None
    if on and sources:
        # lazy: start-up (+46 ms)
        from app.tool_config import load_limits

        limits = load_limits(paths)
        tools = ToolsRequest(
            tuple(sources),
            paths,
            tool_choice=tool_choice(settings),
            max_steps=limits.max_steps,
            timeout_s=float(limits.timeout_s),
        )
    thinking = thinking_choice(settings)
    if thinking in ("on", "off"):
        return tools, (thinking == "on") if "enable_thinking" in thinking_controls else None, None
    if isinstance(thinking, int):
        return tools, None, thinking
    return tools, None, None


def describe(settings: Mapping[str, object] | None) -> str:
    """The switch's text: ``Tools: off``, ``Tools: builtin, testtools`` or, when the tool choice is
    not Auto, ``Tools: builtin · required`` (``· none``, ``· calculator``)."""
    on, sources = tools_choice(settings)
    text = f"Tools: {shown(', '.join(sources)) or 'none'}" if on else "Tools: off"
    choice = tool_choice(settings)
    if on and choice is not None:
        text += f" · {shown(choice)}"
    thinking = thinking_choice(settings)
    if thinking is not None:
        text += f" · thinking {thinking if isinstance(thinking, str) else f'≤ {thinking}'}"
    return text


def add_heading(menu: QMenu, text: str) -> QWidgetAction:
    """A separator and a small heading over a group of the menu. ``QMenu.addSection``'s text is
    drawn by few styles (not Fusion, not macOS's native menus), which left "On" and "Off" with no
    word of what they switch; a label is drawn everywhere, and the keyboard skips it."""
    menu.addSeparator()
    label = plain_label(text)
    label.setObjectName("menuHeading")
    label.setStyleSheet("font-weight: 600; padding: 4px 10px 2px 10px;")
    label.setEnabled(False)  # drawn in the palette's muted colour, like a group title
    action = QWidgetAction(menu)
    action.setDefaultWidget(label)
    action.setEnabled(False)
    menu.addAction(action)
    return action


MAX_SWITCH_WIDTH = 260
"""The widest the Tools switch grows (its text elides beyond it)."""
TOOLS_TIP = "Let the model call tools in this chat (off by default); its thinking switch"


class ChatToolsButton(QToolButton):
    """The Tools switch in the chat header (a menu).

    Args:
        paths: where ``mcp.json`` is (the servers are listed when the menu opens).

    Signals:
        changed(object): the conversation's new ``tools`` and ``thinking`` settings (a dict).
        settings_requested(): the user chose Settings → Tools….
    """

    changed = Signal(object)
    settings_requested = Signal()

    def __init__(self, paths: Paths, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.paths = paths
        self.setObjectName("toolsSwitch")
        self.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self._full = ""
        policy = self.sizePolicy()
        policy.setHorizontalPolicy(QSizePolicy.Policy.Preferred)  # it may elide (a tool button's is Fixed)
        self.setSizePolicy(policy)
        self.setAccessibleName("Tools in this chat")
        self.menu_ = QMenu(self)
        self.menu_.aboutToShow.connect(self._on_menu_about_to_show)
        self.setMenu(self.menu_)
        self.settings: dict[str, object] = {}
        self.thinking_controls: tuple[str, ...] = ()
        self.server_problem: str | None = None
        self.set_conversation_settings({})

    def set_conversation_settings(self, settings: Mapping[str, object] | None) -> None:
        self.settings = {k: v for k, v in (settings or {}).items() if k in ("tools", "thinking")}
        self._full = describe(self.settings)
        self.setToolTip(plain_tooltip(f"{self._full}. {TOOLS_TIP}"))
        self.updateGeometry()
        self._elide()

    # ------------------------------------------------------------------ its text, elided
    # "Tools: builtin, testtools · required · thinking on" grows with the choice: the switch elides
    # to the room the header's row gives it (the whole text in its tooltip) instead of pushing the
    # Inspector button onto a row of its own.
    def text(self) -> str:
        """The whole text (what is shown may be elided)."""
        return self._full

    def shown_text(self) -> str:
        """What the button shows now."""
        return super().text()

    def _chrome(self) -> int:
        """The width beyond the text (padding, the menu arrow), from the style's own size hint."""
        natural = super().sizeHint().width() - self.fontMetrics().horizontalAdvance(super().text())
        return max(natural, 28)

    def sizeHint(self) -> QSize:
        hint = super().sizeHint()
        width = self.fontMetrics().horizontalAdvance(self._full) + self._chrome()
        return QSize(min(width, MAX_SWITCH_WIDTH), hint.height())

    def minimumSizeHint(self) -> QSize:
        hint = super().minimumSizeHint()
        width = self.fontMetrics().horizontalAdvance("Tools: builtin…") + self._chrome()  # still says something
        return QSize(min(width, self.sizeHint().width()), hint.height())

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._elide()

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange):
            self.updateGeometry()
            self._elide()

    def _elide(self) -> None:
        room = max(self.width() - self._chrome(), 20)
        metrics = self.fontMetrics()
        fits = metrics.horizontalAdvance(self._full) <= room
        text = self._full if fits else metrics.elidedText(self._full, Qt.TextElideMode.ElideRight, room)
        if text != super().text():
            super().setText(text)

    def set_thinking_controls(self, controls: Sequence[str]) -> None:
        self.thinking_controls = tuple(controls)

    def server_names(self) -> list[str]:
        """The MCP servers of ``mcp.json`` (a damaged file: none, and the reason is kept)."""
        # lazy: start-up (+45 ms)
        from app.tool_config import ToolSetupError, load_servers

        try:
            names = sorted(load_servers(self.paths))
        except ToolSetupError as exc:
            self.server_problem = str(exc)
            return []
        self.server_problem = None
        return names

    def build_menu(self) -> None:
        """Fills the menu for the current choice (also called by the tests)."""
        menu = self.menu_
        menu.clear()
        on, sources = tools_choice(self.settings)
        use = menu.addAction("Use tools in this chat")
        use.setCheckable(True)
        use.setChecked(on)
        use.toggled.connect(self._on_use_action_toggled)
        add_heading(menu, "Sources")
        configured = self.server_names()
        gone = [n for n in sources if n != BUILTIN and n not in configured]  # removed from mcp.json since
        for name, label in (
            (BUILTIN, "Built-in tools (date and time, calculator, this chat's documents)"),
            *((n, f"MCP server {n}") for n in configured),
            *((n, f"MCP server {n} (not configured any more: untick it)") for n in gone),
        ):
            action = menu.addAction(shown(label).replace("&", "&&"))
            action.setObjectName(f"source_{name}")
            action.setCheckable(True)
            action.setChecked(name in sources)
            action.toggled.connect(lambda checked, n=name: self.set_source(n, checked))
        if self.server_problem:
            menu.addAction(shown(self.server_problem).replace("&", "&&")).setEnabled(False)
        self._add_choice_section(menu, sources)
        add_heading(menu, "Thinking")
        thinking = thinking_choice(self.settings)
        switch = "enable_thinking" in self.thinking_controls
        for label, value, enabled in (("Model's default", None, True), ("On", "on", switch), ("Off", "off", switch)):
            action = menu.addAction(label)
            action.setCheckable(True)
            action.setChecked(thinking == value)
            action.setEnabled(enabled)
            if not enabled:
                action.setToolTip("This model's chat template has no thinking switch")
            action.triggered.connect(lambda _=False, v=value: self.set_thinking(v))
        budget = menu.addAction(
            f"At most {thinking} tokens of thinking…" if isinstance(thinking, int) else "A thinking budget…"
        )
        budget.setCheckable(True)
        budget.setChecked(isinstance(thinking, int))
        budget.triggered.connect(self._on_budget_action_triggered)
        menu.addSeparator()
        menu.addAction("Settings → Tools…").triggered.connect(self.settings_requested)
        menu.setToolTipsVisible(True)

    def _add_choice_section(self, menu: QMenu, sources: Sequence[str]) -> None:
        """Auto, Required, None, and one named tool of the sources ticked (a submenu)."""
        add_heading(menu, "Tool choice")
        choice = tool_choice(self.settings)
        for value, label in CHOICES:
            action = menu.addAction(label)
            action.setObjectName(f"choice_{value or 'auto'}")
            action.setCheckable(True)
            action.setChecked(choice == value)
            action.triggered.connect(lambda _=False, v=value: self.set_tool_choice(v))
        names = self.tool_names(sources)
        named = choice if choice is not None and choice not in ("required", "none") else None
        sub = menu.addMenu(f"Always call {shown(named)}".replace("&", "&&") if named else "Always call one tool")
        sub.setObjectName("choice_named")
        sub.setToolTipsVisible(True)
        entries = [(n, n) for n in names]
        if named and named not in names:
            entries.append((named, f"{named} (not on in this chat: Auto is used)"))
        for name, label in entries:
            action = sub.addAction(shown(label).replace("&", "&&"))
            action.setObjectName(f"choice_tool_{name}")
            action.setCheckable(True)
            action.setChecked(name == named)
            action.triggered.connect(lambda _=False, n=name: self.set_tool_choice(n))
        if not entries:
            sub.addAction("No tools known: tick a source, or check servers in Settings → Tools").setEnabled(False)

    def tool_names(self, sources: Sequence[str]) -> list[str]:
        """The tools the sources ticked offer, as far as known without starting a server: the
        built-ins (``read_file`` and ``search_knowledge`` only with files or knowledge bases
        attached, so they are not listed) and the tools Settings → Tools last found on each
        server; the tools turned off there are left out."""
        # lazy: start-up (+43 ms)
        from app.tool_config import Permissions, ToolSetupError

        try:
            permissions: Permissions | None = Permissions.load(self.paths)
        except ToolSetupError:
            permissions = None
        names: list[str] = []
        for source in sources:
            if source == BUILTIN:
                # lazy: start-up (+7 ms)
                from engine.agent.builtin_tools import CALCULATOR, CURRENT_TIME

                found = [CURRENT_TIME, CALCULATOR]
            else:
                found = permissions.seen_tools(source) if permissions is not None else []
            off = permissions is not None and permissions.is_off(source)
            names += [n for n in found if not off and not (permissions and permissions.is_off(source, n))]
        return list(dict.fromkeys(names))

    def action(self, name: str) -> QAction | None:
        """The menu's action whose object name is ``name`` (``source_builtin``, ``choice_required``,
        ``choice_tool_calculator`` in the named-tool submenu...)."""
        actions = list(self.menu_.actions())
        actions += [a for m in self.menu_.findChildren(QMenu) for a in m.actions()]
        return next((a for a in actions if a.objectName() == name), None)

    def set_tools_on(self, on: bool) -> None:
        _, sources = tools_choice(self.settings)
        self._change({"tools": self._tools_entry(on, sources, tool_choice(self.settings))})

    def set_source(self, name: str, chosen: bool) -> None:
        on, sources = tools_choice(self.settings)
        sources = [s for s in sources if s != name] + ([name] if chosen else [])
        self._change({"tools": self._tools_entry(on or chosen, sources, tool_choice(self.settings))})

    def set_tool_choice(self, choice: str | None) -> None:
        """None (Auto), ``required``, ``none`` or a tool's name (Required or a name turns the tools on)."""
        on, sources = tools_choice(self.settings)
        self._change({"tools": self._tools_entry(on or choice not in (None, "none"), sources, choice)})

    @staticmethod
    def _tools_entry(on: bool, sources: Sequence[str], choice: str | None) -> dict[str, object]:
        entry: dict[str, object] = {"on": on, "sources": list(sources)}
        if choice is not None and choice != "auto":
            entry["choice"] = choice
        return entry

    def set_thinking(self, value: str | int | None) -> None:
        self._change({"thinking": value})

    def _change(self, update: Mapping[str, object]) -> None:
        merged = {**self.settings, **update}
        if merged.get("thinking") is None:
            merged.pop("thinking", None)
        self.set_conversation_settings(merged)
        self.changed.emit(dict(self.settings))

    @Slot()
    def _on_menu_about_to_show(self) -> None:
        self.build_menu()

    @Slot(bool)
    def _on_use_action_toggled(self, checked: bool) -> None:
        self.set_tools_on(checked)

    @Slot()
    def _on_budget_action_triggered(self) -> None:
        from PySide6.QtWidgets import QInputDialog  # lazy: start-up (the window's first frame shows this button)

        current = thinking_choice(self.settings)
        value, ok = QInputDialog.getInt(
            self,
            "Thinking budget",
            "The most tokens the model may think before it must answer:",
            current if isinstance(current, int) else DEFAULT_THINKING_BUDGET,
            0,
            1_000_000,
            64,
        )
        self.set_thinking(value if ok else current)


class ChatToolsController(QObject):
    """Wires the Tools switch and the agent's signals into the main window (created by it once).

    Args:
        window: the MainWindow (its ``chat`` adapter, ``chat_view``, ``inspector``, ``tools_button``).
    """

    def __init__(self, window: MainWindow) -> None:
        super().__init__(window)
        self.window = window
        self.button: ChatToolsButton = window.tools_button
        self._unsaved: dict[str, object] | None = None  # chosen before the chat existed
        chat = window.chat
        chat.reasoning_delta.connect(window.chat_view.append_reasoning)
        chat.tool_step_added.connect(self._on_chat_tool_step_added)
        chat.approval_requested.connect(self._on_chat_approval_requested)
        chat.loop_updated.connect(window.inspector.set_loop)
        chat.conversation_opened.connect(self._on_chat_conversation_opened)
        chat.model_loaded.connect(self._on_chat_model_loaded)
        self.button.changed.connect(self._on_button_changed)
        self.button.settings_requested.connect(self.open_tools_settings)

    def turn_options(self) -> tuple[ToolsRequest | None, bool | None, int | None]:
        """The running chat's tools request, thinking switch and budget.

        With the built-in tools on and knowledge bases attached, the request carries them and the
        knowledge service (``KnowledgeAdapter.chat_searcher``: a deleted one is skipped), so the model
        gets ``search_knowledge`` (it decides when to retrieve).
        """
        loaded = self.window.chat.loaded
        controls = loaded.thinking_controls if loaded is not None else ()
        tools, thinking, budget = turn_options(self.button.settings, self.window.paths, controls)
        kbs = tuple(getattr(self.window.chat.conversation, "knowledge_bases", None) or ())
        if tools is not None and kbs and BUILTIN in tools.selection:
            tools = replace(tools, knowledge_bases=kbs, searcher=self.window.knowledge.chat_searcher)
        return tools, thinking, budget

    @Slot(object)
    def _on_button_changed(self, choice: Mapping[str, object]) -> None:
        conv = self.window.chat.conversation
        if conv is None:
            self._unsaved = dict(choice)  # saved with the chat the first message creates
            return
        settings = {k: v for k, v in dict(conv.settings or {}).items() if k not in ("tools", "thinking")}
        self.window.chat.conversations.update(settings={**settings, **choice})

    @Slot(object, object)
    def _on_chat_conversation_opened(self, conversation: Conversation | None, _messages: object) -> None:
        settings = dict(getattr(conversation, "settings", None) or {})
        if self._unsaved is not None and conversation is not None and "tools" not in settings:
            choice, self._unsaved = self._unsaved, None
            self.button.set_conversation_settings(choice)
            self._on_button_changed(choice)
            return
        if conversation is not None:
            self._unsaved = None
            self.button.set_conversation_settings(settings)

    @Slot(object)
    def _on_chat_approval_requested(self, request: ApprovalRequest) -> None:
        card = self.window.chat_view.show_approval(request)
        if card is not None:
            composer = self.window.composer
            composer.set_state_text(f"Waiting for you: allow the call to {request.name}?")
            card.decided.connect(
                lambda d: composer.set_state_text(
                    f"Running {request.name}…" if d != "deny" else "Telling the model the call was denied…"
                )
            )
            # The card's buttons go once answered: the focus goes back to the composer, not to
            # the next widget in the chain (the rail).
            card.decided.connect(lambda _d: composer.edit.setFocus(Qt.FocusReason.OtherFocusReason))

    @Slot(object)
    def _on_chat_tool_step_added(self, step: Mapping[str, object]) -> None:
        self.window.chat_view.add_tool_step(step)
        self.window.composer.set_state_text(f"{step.get('name', 'The tool')} done; the model goes on…")

    @Slot(object)
    def _on_chat_model_loaded(self, loaded: LoadedModel | None) -> None:
        self.button.set_thinking_controls(loaded.thinking_controls if loaded is not None else ())

    @Slot()
    def open_tools_settings(self) -> None:
        # lazy: start-up (+53 ms)
        from app.gui.tools_settings import ToolsSettingsDialog

        ToolsSettingsDialog(self.window.paths, self.window).exec()
