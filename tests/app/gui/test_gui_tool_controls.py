"""The agent's controls in the app (issue 12, "The app"): the chat's Tools menu sets the tool
choice per chat (Auto, Required, None, one named tool), shown in the button's text when it is not
Auto and saved with the chat; Settings → Tools sets the step limit and the per-call timeout, saved
next to the permissions (older files without them read as the defaults); the agent turn gets all
three, and a named tool that is no longer on falls back to Auto with a one-line notice."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gui_support import FakeSession, start_window
from PySide6.QtCore import Qt

from app.gui.workers.chat_state import ChatState
from app.paths import Paths
from app.tool_config import DEFAULT_MAX_STEPS, DEFAULT_TIMEOUT_S, Permissions, ToolLimits
from engine.inference.events import Finished, PrefillProgress, Stats, Token, ToolCall
from engine.inference.tools import ToolResult, ToolSpec
from tests.fake_backend import StreamCall

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]

ADD = ToolSpec(
    "add",
    "Adds two integers.",
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]},
    source="fake",
)
SHOTS = Path(os.environ.get("GLASSBOX_SHOTS", "/tmp/glassbox_tool_controls"))


class ChoiceSession(FakeSession):
    """Calls ``add`` only when it must: under ``required`` or ``add`` (always, with ``eager``, as
    long as tools are offered and the choice is not ``none``); otherwise answers. Records each
    generation's ``tool_choice``."""

    def __init__(self, request: Any, bandwidth: float | None, eager: bool = False) -> None:
        super().__init__(request, bandwidth)
        self.eager = eager

    def script(self, call: StreamCall) -> Iterator[Any]:
        choice = call.tool_choice
        yield PrefillProgress(10, 10)
        stats = Stats(n_ctx=self.request.n_ctx, prompt_tokens=30, completion_tokens=2, context_used=32)
        must = choice in ("required", "add") or (self.eager and choice != "none")
        if call.tools and must:
            made = ToolCall(f"call_{len(self.calls)}", "add", {"a": 2, "b": 3}, "<tool_call>{}</tool_call>")
            yield stats
            yield Finished("stop", stats, "", tool_calls=(made,))
            return
        yield Token("Done.", 1)
        yield stats
        yield Finished("stop", stats, "Done.")


class AllowedToolSet:
    """One tool, ``add``, always allowed (no approval), that records each call and its timeout."""

    def __init__(self) -> None:
        self.ran: list[dict[str, Any]] = []
        self.timeouts: list[float] = []
        self.problems: list[str] = []

    def tools(self) -> list[ToolSpec]:
        return [ADD]

    def always_allows(self, name: str) -> bool:
        return True

    def allow_always(self, name: str) -> None:
        pass

    def call(
        self, name: str, arguments: dict[str, Any], *, timeout_s: float, cancel: threading.Event | None = None
    ) -> ToolResult:
        self.ran.append(dict(arguments))
        self.timeouts.append(timeout_s)
        return ToolResult(str(arguments["a"] + arguments["b"]))

    def close(self) -> None:
        pass


@pytest.fixture
def toolset(monkeypatch: pytest.MonkeyPatch) -> AllowedToolSet:
    fake = AllowedToolSet()
    monkeypatch.setattr("app.gui.workers.agent_tools.default_open_tools", lambda request, session: fake)
    return fake


@pytest.fixture
def open_window(qtbot: Any, paths: Paths, fake_model: Path) -> Iterator[Any]:
    windows: list[Any] = []

    def build(eager: bool = False) -> Any:
        w = start_window(qtbot, paths, lambda r, b: ChoiceSession(r, b, eager=eager), fake_model)
        windows.append(w)
        return w

    yield build
    for w in windows:
        if not w._closing:
            w.shutdown()


def send(qtbot: Any, w: Any, text: str) -> None:
    w.composer.edit.setPlainText(text)
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not w.chat.busy and w.chat.state is ChatState.IDLE, timeout=10000)
    qtbot.waitUntil(lambda: w.chat.thread_messages and w.chat.thread_messages[-1].state != "pending", timeout=10000)


def choices(w: Any) -> list[Any]:
    return [call.tool_choice for call in w.sessions[-1].calls]


# ---------------------------------------------------------------------- the menu


def test_the_menu_sets_the_choice_and_the_button_shows_it_only_when_not_auto(qtbot: Any, paths: Paths) -> None:
    from app.gui.chat_tools_menu import ChatToolsButton

    button = ChatToolsButton(paths)
    qtbot.addWidget(button)
    emitted: list[dict[str, Any]] = []
    button.changed.connect(emitted.append)
    button.set_conversation_settings({"tools": {"on": True, "sources": ["builtin"]}})
    button.build_menu()
    auto = button.action("choice_auto")
    assert auto is not None and auto.isChecked() and button.text() == "Tools: builtin"

    required = button.action("choice_required")
    assert required is not None
    required.trigger()
    assert button.text() == "Tools: builtin · required"
    assert emitted[-1]["tools"] == {"on": True, "sources": ["builtin"], "choice": "required"}

    button.build_menu()
    assert button.action("choice_required").isChecked() and not button.action("choice_auto").isChecked()
    named = button.action("choice_tool_calculator")  # a built-in, in the "Always call one tool" submenu
    assert named is not None and not named.isChecked()
    named.trigger()
    assert button.text() == "Tools: builtin · calculator"
    button.build_menu()
    assert button.action("choice_tool_calculator").isChecked()

    button.action("choice_none").trigger()
    assert button.text() == "Tools: builtin · none"
    button.build_menu()
    button.action("choice_auto").trigger()
    assert button.text() == "Tools: builtin" and "choice" not in emitted[-1]["tools"]


def test_a_named_tool_no_longer_on_is_shown_as_such_and_servers_tools_come_from_the_last_check(
    qtbot: Any, paths: Paths
) -> None:
    from app.gui.chat_tools_menu import ChatToolsButton

    permissions = Permissions.load(paths)
    permissions.remember_tools("files", ["read_notes", "list_notes"])
    permissions.set_off("files", "list_notes")
    permissions.set_off("builtin", "calculator")
    button = ChatToolsButton(paths)
    qtbot.addWidget(button)
    button.set_conversation_settings({"tools": {"on": True, "sources": ["builtin", "files"], "choice": "calculator"}})
    assert button.tool_names(["builtin", "files"]) == ["current_time", "read_notes"]
    button.build_menu()
    gone = button.action("choice_tool_calculator")
    assert gone is not None and gone.isChecked() and "Auto is used" in gone.text()
    assert button.action("choice_tool_read_notes") is not None
    assert button.action("choice_tool_list_notes") is None  # turned off in Settings → Tools


def test_a_real_servers_tools_found_in_settings_are_offered_as_a_named_choice(qtbot: Any, paths: Paths) -> None:
    from app.gui.chat_tools_menu import ChatToolsButton
    from app.gui.tools_settings import ToolsSettingsDialog
    from tests.mcp_servers import register

    register(paths, "testtools")
    button = ChatToolsButton(paths)
    qtbot.addWidget(button)
    button.set_conversation_settings({"tools": {"on": True, "sources": ["testtools"]}})
    assert button.tool_names(["testtools"]) == []  # never checked: not started just to fill a menu
    dialog = ToolsSettingsDialog(paths)
    qtbot.addWidget(dialog)
    qtbot.waitUntil(lambda: not dialog.checking, timeout=60000)
    dialog.close()
    assert {"add", "echo", "whoami"} <= set(button.tool_names(["testtools"]))
    button.build_menu()
    add = button.action("choice_tool_add")
    assert add is not None
    add.trigger()
    assert button.text() == "Tools: testtools · add"


def test_old_chats_without_a_choice_read_as_auto_and_the_turn_gets_the_choice_and_limits(paths: Paths) -> None:
    from app.gui.chat_tools_menu import describe, tool_choice, turn_options

    old = {"tools": {"on": True, "sources": ["builtin"]}}
    assert tool_choice(old) is None and tool_choice({}) is None and tool_choice({"tools": {"choice": 3}}) is None
    tools, _, _ = turn_options(old, paths)
    assert tools is not None and tools.tool_choice is None
    assert (tools.max_steps, tools.timeout_s) == (DEFAULT_MAX_STEPS, DEFAULT_TIMEOUT_S)
    Permissions.load(paths).set_limits(ToolLimits(max_steps=3, timeout_s=20))
    tools, _, _ = turn_options({"tools": {**old["tools"], "choice": "required"}}, paths)
    assert tools is not None and (tools.tool_choice, tools.max_steps, tools.timeout_s) == ("required", 3, 20.0)
    assert describe({"tools": {"on": False, "sources": ["builtin"], "choice": "none"}}) == "Tools: off"


# ---------------------------------------------------------------------- Settings → Tools


def test_settings_limits_round_trip_and_old_files_read_as_the_defaults(qtbot: Any, paths: Paths) -> None:
    from app.gui.tools_settings import ToolsSettingsDialog

    paths.tool_permissions.parent.mkdir(parents=True, exist_ok=True)
    paths.tool_permissions.write_text(json.dumps({"format": 1, "always_allow": ["builtin/calculator"], "off": []}))
    dialog = ToolsSettingsDialog(paths, check_on_open=False)
    qtbot.addWidget(dialog)
    assert (dialog.steps_spin.value(), dialog.timeout_spin.value()) == (DEFAULT_MAX_STEPS, DEFAULT_TIMEOUT_S)
    assert (dialog.steps_spin.minimum(), dialog.steps_spin.maximum()) == (1, 64)
    assert (dialog.timeout_spin.minimum(), dialog.timeout_spin.maximum()) == (5, 600)
    assert "max_steps" not in json.loads(paths.tool_permissions.read_text())  # opening writes nothing
    dialog.steps_spin.setValue(1)
    dialog.timeout_spin.setValue(90)
    saved = json.loads(paths.tool_permissions.read_text())
    assert (saved["max_steps"], saved["timeout_s"]) == (1, 90) and saved["always_allow"] == ["builtin/calculator"]
    dialog.timeout_spin.setValue(1000)  # past the range: clamped by the box
    assert json.loads(paths.tool_permissions.read_text())["timeout_s"] == 600
    dialog.close()

    again = ToolsSettingsDialog(paths, check_on_open=False)
    qtbot.addWidget(again)
    assert (again.steps_spin.value(), again.timeout_spin.value()) == (1, 600)
    assert Permissions.load(paths).limits == ToolLimits(1, 600)


def test_a_bad_limit_in_the_file_is_one_line_naming_the_field_and_the_file_is_not_written_over(
    qtbot: Any, paths: Paths
) -> None:
    from app.gui.tools_settings import ToolsSettingsDialog
    from app.tool_config import ToolSetupError, load_limits

    paths.tool_permissions.parent.mkdir(parents=True, exist_ok=True)
    paths.tool_permissions.write_text(json.dumps({"always_allow": [], "max_steps": 0}))
    with pytest.raises(ToolSetupError, match=r"tool_permissions.json: max_steps: must be a whole number from 1 to 64"):
        Permissions.load(paths)
    assert load_limits(paths) == ToolLimits()  # a turn still runs, with the defaults
    dialog = ToolsSettingsDialog(paths, check_on_open=False)
    qtbot.addWidget(dialog)
    assert "max_steps" in dialog.error_label.text() and "\n" not in dialog.error_label.text()
    assert not dialog.steps_spin.isEnabled()
    assert json.loads(paths.tool_permissions.read_text())["max_steps"] == 0


def test_an_open_toolsets_permissions_saving_later_keep_the_limits_and_tools_set_meanwhile(paths: Paths) -> None:
    worker_copy = Permissions.load(paths)  # what an open ToolSet holds
    settings_page = Permissions.load(paths)
    settings_page.set_limits(ToolLimits(max_steps=2, timeout_s=30))
    settings_page.remember_tools("files", ["read_notes"])
    worker_copy.set_always_allow("builtin", "calculator")  # "Always allow" during a turn
    saved = Permissions.load(paths)
    assert saved.limits == ToolLimits(2, 30) and saved.seen_tools("files") == ["read_notes"]
    assert saved.always_allows("builtin", "calculator")
    saved.forget_source("files")
    assert Permissions.load(paths).seen_tools("files") == []


# ---------------------------------------------------------------------- the agent turn


def test_a_turn_with_required_calls_a_tool_and_auto_lets_the_model_answer(
    qtbot: Any, open_window: Any, toolset: AllowedToolSet
) -> None:
    w = open_window()
    w.tools_button.set_tools_on(True)
    send(qtbot, w, "Answer")
    assert toolset.ran == [] and choices(w) == [None]  # Auto: this model answers without a call
    w.tools_button.set_tool_choice("required")
    assert w.tools_button.text().endswith("· required")
    send(qtbot, w, "Add them")
    assert toolset.ran == [{"a": 2, "b": 3}]
    assert choices(w)[1:] == ["required", "auto"]  # forced once, then the model decides
    assert toolset.timeouts == [float(DEFAULT_TIMEOUT_S)]
    qtbot.waitUntil(lambda: (w.chat.conversation.settings or {}).get("tools", {}).get("choice") == "required")


def test_the_step_limit_and_the_timeout_from_settings_reach_the_loop(
    qtbot: Any, open_window: Any, toolset: AllowedToolSet, paths: Paths
) -> None:
    Permissions.load(paths).set_limits(ToolLimits(max_steps=1, timeout_s=7))
    w = open_window(eager=True)  # calls a tool whenever it may
    w.tools_button.set_tools_on(True)
    send(qtbot, w, "Keep calling")
    assert len(toolset.ran) == 1 and toolset.timeouts == [7.0]  # one step, then it had to answer
    assert choices(w) == [None, "none"]
    assert w.chat.thread_messages[-1].content.endswith("Done.")


def test_a_named_tool_no_longer_on_falls_back_to_auto_with_a_notice(
    qtbot: Any, open_window: Any, toolset: AllowedToolSet
) -> None:
    w = open_window()
    notices: list[str] = []
    w.chat.error_occurred.connect(notices.append)
    w.tools_button.set_tool_choice("gone_tool")
    send(qtbot, w, "Go")
    assert choices(w) == [None] and toolset.ran == []
    assert w.chat.thread_messages[-1].content == "Done."  # the turn ran
    assert any("gone_tool is not on any more" in n and "Auto" in n and "\n" not in n for n in notices)
    w.tools_button.set_tool_choice("add")  # a tool that is on: called by name
    send(qtbot, w, "Add")
    assert choices(w)[-2:] == ["add", "auto"] and len(toolset.ran) == 1


def test_the_choice_is_kept_per_chat(qtbot: Any, open_window: Any, toolset: AllowedToolSet) -> None:
    w = open_window()
    w.tools_button.set_tool_choice("required")  # before the chat exists: saved with it
    send(qtbot, w, "First chat")
    first = w.chat.conversation.id
    qtbot.waitUntil(lambda: (w.chat.conversation.settings or {}).get("tools", {}).get("choice") == "required")
    w.conversations.new_chat()
    qtbot.waitUntil(lambda: w.chat.conversation is not None and w.chat.conversation.id != first, timeout=10000)
    assert w.tools_button.text() == "Tools: off"  # a new chat: off, Auto
    w.tools_button.set_tool_choice(None)
    w.tools_button.set_tools_on(True)
    send(qtbot, w, "Second chat")
    second = w.chat.conversation.id
    assert second != first and w.tools_button.text() == "Tools: builtin"
    w.shutdown()

    w2 = open_window()  # a restart: each chat's choice comes back with it
    qtbot.waitUntil(lambda: w2.sidebar.list.count() == 2, timeout=10000)  # the list is filled off-thread
    for conv_id, text in ((first, "Tools: builtin · required"), (second, "Tools: builtin"), (first, None)):
        w2.chat.conversations.open(conv_id)
        qtbot.waitUntil(lambda c=conv_id: w2.chat.conversation is not None and w2.chat.conversation.id == c)
        if text is not None:
            qtbot.waitUntil(lambda t=text: w2.tools_button.text() == t, timeout=5000)
    assert w2.tools_button.text() == "Tools: builtin · required"


# ---------------------------------------------------------------------- pictures


@pytest.mark.qt_log_ignore("propagateSizeHints", "raise", "grabbing the keyboard")
def test_pictures_of_the_menu_and_the_settings_page(qtbot: Any, paths: Paths) -> None:
    """Saves PNGs (in ``$GLASSBOX_SHOTS``, default /tmp/glassbox_tool_controls) to look at."""
    from app.gui.chat_tools_menu import ChatToolsButton
    from app.gui.tools_settings import ToolsSettingsDialog

    SHOTS.mkdir(parents=True, exist_ok=True)
    button = ChatToolsButton(paths)
    qtbot.addWidget(button)
    button.set_conversation_settings({"tools": {"on": True, "sources": ["builtin"], "choice": "required"}})
    button.build_menu()
    button.menu_.adjustSize()
    button.menu_.show()
    sub = button.menu_.findChild(type(button.menu_), "choice_named")
    menu_png = SHOTS / "tools_menu.png"
    assert button.menu_.grab().save(str(menu_png))
    if sub is not None:
        sub.adjustSize()
        assert sub.grab().save(str(SHOTS / "tools_menu_named.png"))
    button.menu_.hide()
    button.show()
    assert button.grab().save(str(SHOTS / "tools_button.png")) and button.text() == "Tools: builtin · required"

    dialog = ToolsSettingsDialog(paths, check_on_open=False)
    qtbot.addWidget(dialog)
    dialog.resize(760, 640)
    dialog.show()
    assert dialog.grab().save(str(SHOTS / "settings_tools.png"))
    assert menu_png.stat().st_size > 1000
