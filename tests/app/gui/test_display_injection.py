"""Names someone else chose are shown as text (issue 27, "Display injection"): a model file named
with HTML renders as that name, never as an image and a bold fake "You", on the reply card, in the
model picker and its tooltip, in the status bar, on the Models page and in the Delete confirmation;
tool, server, knowledge-base and Hub names likewise; and a name with U+202E or ESC is shown escaped.

Each test plants hostile names, then walks every label, tooltip, list, table, tree, combo box,
menu and message box of what it opened (:func:`leaks`): a leak is markup Qt would render, or a
bidi or control character shown as it is.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from gui_support import send, start_window
from PySide6.QtCore import QAbstractItemModel, QAbstractListModel, QModelIndex, Qt, QTimer
from PySide6.QtGui import Qt as QtText
from PySide6.QtWidgets import QAbstractItemView, QApplication, QComboBox, QLabel, QMessageBox, QWidget

from app.gui.display_text import plain_tooltip, rich, shown
from app.paths import Paths

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "engine"))
from hub_server import FakeHub, random_bytes

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]

MARKUP = "<img src=x width=900 height=40><b>You<b> said"
"""The trial's file name (without ``.gguf``): an image loaded from disk and a bold fake "You"."""
RAW = "<img src=x"
HIDDEN = ("\u202e", "\x1b")
"""U+202E (right-to-left override) and ESC: never shown as they are."""


def _rendered_as_markup(text: str, rich_text: bool | None = None) -> bool:
    """Whether Qt would render ``text``'s planted markup: it holds the raw tag and is rich text."""
    if RAW not in text:
        return False
    return QtText.mightBeRichText(text) if rich_text is None else rich_text


def _model_rows(model: QAbstractItemModel, parent: QModelIndex | None = None) -> Iterator[QModelIndex]:
    parent = parent or QModelIndex()
    flat = isinstance(model, QAbstractListModel)  # its columnCount and hasChildren are private
    columns = 1 if flat else model.columnCount(parent)
    for row in range(model.rowCount(parent)):
        for column in range(columns):
            index = model.index(row, column, parent)
            yield index
            if column == 0 and not flat and model.rowCount(index) > 0:
                yield from _model_rows(model, index)


def leaks(root: QWidget) -> list[str]:
    """Every place under ``root`` (and its menus) where a planted name is rendered as markup or
    shows a hidden character as it is."""
    found: list[str] = []

    def check(where: str, text: object, *, tooltip: bool = False, rich_text: bool | None = None) -> None:
        value = str(text or "")
        if _rendered_as_markup(value, None if tooltip else rich_text):
            found.append(f"{where} renders markup: {value[:80]!r}")
        if any(ch in value for ch in HIDDEN):
            found.append(f"{where} shows a hidden character: {value[:80]!r}")

    widgets = [root, *root.findChildren(QWidget)]
    for widget in widgets:
        name = f"{type(widget).__name__}({widget.objectName()})"
        check(f"{name} tooltip", widget.toolTip(), tooltip=True)
        check(f"{name} window title", widget.windowTitle(), rich_text=False)
        if isinstance(widget, QLabel):
            fmt = widget.textFormat()
            is_rich = None if fmt == Qt.TextFormat.AutoText else fmt == Qt.TextFormat.RichText
            check(f"{name} text", widget.text(), rich_text=is_rich)
        if isinstance(widget, QComboBox):
            for i in range(widget.count()):
                check(f"{name} item {i}", widget.itemText(i), rich_text=False)
                check(f"{name} item {i} tooltip", widget.itemData(i, Qt.ItemDataRole.ToolTipRole), tooltip=True)
        if isinstance(widget, QAbstractItemView) and widget.model() is not None:
            for index in _model_rows(widget.model()):
                check(f"{name} cell", index.data(Qt.ItemDataRole.DisplayRole), rich_text=False)
                check(f"{name} cell tooltip", index.data(Qt.ItemDataRole.ToolTipRole), tooltip=True)
        for action in widget.actions():
            check(f"{name} action", action.text(), rich_text=False)
            if action.toolTip() != action.text().replace("&&", "&"):  # a menu shows only a tooltip of its own
                check(f"{name} action tooltip", action.toolTip(), tooltip=True)
            if action.menu() is not None:
                for sub in action.menu().actions():
                    check(f"{name} submenu action", sub.text(), rich_text=False)
    return found


def answer_next_box(qtbot: Any, seen: list[list[str]], texts: list[str]) -> None:
    """When the next message box opens: records its leaks and its text, then closes it with No."""

    def look() -> None:
        box = QApplication.activeModalWidget()
        if not isinstance(box, QMessageBox):
            QTimer.singleShot(20, look)
            return
        seen.append(leaks(box))
        texts.append(box.text())
        no = box.button(QMessageBox.StandardButton.No)
        if no is not None:
            no.click()
        else:
            box.reject()

    QTimer.singleShot(0, look)


# ---------------------------------------------------------------------------- the helpers themselves
def test_shown_escapes_what_does_not_print_and_keeps_every_script() -> None:
    assert shown("evil\u202egpj.exe") == "evil\\u202egpj.exe"
    assert shown("a\x1b[2Jb\r") == "a\\x1b[2Jb\\r"
    assert shown("modèle 模型 نموذج") == "modèle 模型 نموذج"
    assert rich("<b>x</b>\u202e") == "&lt;b&gt;x&lt;/b&gt;\\u202e"


def test_a_plain_tooltip_shows_its_text_whatever_it_starts_with() -> None:
    assert plain_tooltip("a plain line") == "a plain line"
    tip = plain_tooltip(f"{MARKUP}.gguf\n/models/{MARKUP}.gguf")
    # Rich text on purpose, whose markup draws the characters: nothing in it is a tag of the name.
    assert QtText.mightBeRichText(tip) and RAW not in tip and "&lt;img" in tip
    assert "<br" in tip  # the line break stays one


# ---------------------------------------------------------------------------- a model file named with HTML
@pytest.fixture(params=["markup", "markup and U+202E"])
def hostile_model(paths: Paths, request: pytest.FixtureRequest) -> Path:
    from tests.engine.gguf_fixtures import build

    model = paths.models / (f"{MARKUP}.gguf" if request.param == "markup" else f"{MARKUP}\u202e.gguf")
    model.write_bytes(build().data)
    return model


def test_a_model_named_with_html_is_its_name_in_the_chat(qtbot: Any, paths: Paths, hostile_model: Path) -> None:
    w = start_window(qtbot, paths)
    try:
        picker = w.header.model_bar.picker
        qtbot.waitUntil(lambda: picker.count() >= 1, timeout=10000)
        assert picker.itemText(picker.currentIndex()) == shown(hostile_model.stem)
        send(qtbot, w, "hello")
        card = w.chat_view.cards[-1]
        role = card.findChild(QLabel, "roleLabel")
        assert role is not None and role.textFormat() == Qt.TextFormat.PlainText
        assert role.text() == shown(hostile_model.stem)  # the whole name, "You" not bold, no image
        assert role.sizeHint().height() < 40  # no 40-px image drawn in it
        assert RAW not in card.toolTip() and "&lt;img" in card.toolTip()  # the stats tooltip: escaped
        assert leaks(w) == []
    finally:
        w.shutdown()


def test_the_models_page_and_the_delete_question_show_the_name(qtbot: Any, paths: Paths, hostile_model: Path) -> None:
    w = start_window(qtbot, paths)
    try:
        page = w.models_page
        w.show_page(1)
        qtbot.waitUntil(lambda: page.library.rowCount() >= 1, timeout=15000)
        page.select_model(hostile_model)
        assert page.library.item(0, 0).text().startswith(shown(hostile_model.stem))
        seen: list[list[str]] = []
        texts: list[str] = []
        answer_next_box(qtbot, seen, texts)
        page.delete_button.click()
        qtbot.waitUntil(lambda: bool(seen), timeout=5000)
        assert seen == [[]]
        assert shown(hostile_model.name) in texts[0]
        assert hostile_model.exists()  # No was the answer
        assert leaks(w) == []
    finally:
        w.shutdown()


# ---------------------------------------------------------------------------- tools and servers
def test_tool_and_server_names_are_text_on_the_cards_and_in_settings(qtbot: Any, paths: Paths) -> None:
    import threading

    from app.gui.tool_card import ApprovalCardWidget, ToolCallCardWidget
    from app.gui.tools_settings import ToolsSettingsDialog
    from app.gui.workers.agent_turn import ApprovalGate, ApprovalRequest
    from app.tool_config import Permissions, add_server, parse_server
    from engine.inference.tools import ToolSpec

    name = f"{MARKUP}\u202e\x1b]0;pwned\x07"
    request = ApprovalRequest(
        1, "call_1", name, {"x": name}, "srv", f"{MARKUP} does it", ApprovalGate(threading.Event())
    )
    approval = ApprovalCardWidget(request)
    step = {"id": "call_1", "name": name, "source": "srv", "approval": "allowed", "ran": True, "result": name}
    card = ToolCallCardWidget(step)
    for widget in (approval, card):
        qtbot.addWidget(widget)
        assert leaks(widget) == []
    assert shown(name) in approval.title.text()

    add_server(paths, parse_server("srv", {"url": "http://127.0.0.1:9/mcp"}))
    Permissions.load(paths).remember_tools("srv", [name])
    dialog = ToolsSettingsDialog(paths, check_on_open=False)
    qtbot.addWidget(dialog)
    dialog.tools_of["srv"] = [ToolSpec(name, f"{MARKUP} tool", {"type": "object"}, "srv")]
    dialog.status_of["srv"] = f"did not start: {name}"
    dialog.reload()
    assert leaks(dialog) == []
    assert dialog.tool_names("srv") == [name]  # what the row stands for is the real name


def test_the_tools_menu_lists_a_hostile_tool_name_as_text(qtbot: Any, paths: Paths) -> None:
    from app.gui.chat_tools_menu import ChatToolsButton
    from app.tool_config import Permissions, add_server, parse_server

    name = f"{MARKUP}\u202e"
    add_server(paths, parse_server("srv", {"url": "http://127.0.0.1:9/mcp"}))
    Permissions.load(paths).remember_tools("srv", [name])
    button = ChatToolsButton(paths)
    qtbot.addWidget(button)
    button.set_conversation_settings({"tools": {"on": True, "sources": ["srv"], "choice": name}})
    button.build_menu()
    assert leaks(button) == [] and leaks(button.menu_) == []


# ---------------------------------------------------------------------------- Hub names
def test_discover_shows_hostile_hub_file_names_as_text(
    qtbot: Any, open_panel: Callable[[], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeHub() as hub:
        hub.add_repo(
            "acme/tricky-GGUF",
            {f"{MARKUP}\u202e-Q4_K_M.gguf": random_bytes(4096, 1), "plain-Q8_0.gguf": random_bytes(4096, 2)},
        )
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        _adapter, panel = open_panel()
        panel.search.setText("tricky")
        panel.search_button.click()
        qtbot.waitUntil(lambda: "acme/tricky-GGUF" in panel.results.item(0).text(), timeout=15000)
        panel.results.setCurrentRow(0)
        qtbot.waitUntil(lambda: panel.files.rowCount() == 2, timeout=15000)
        names = [panel.files.item(row, 0).text() for row in range(2)]
        assert any(shown(MARKUP + "\u202e") in n for n in names)
        assert leaks(panel) == []
