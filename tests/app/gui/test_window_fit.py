"""The main window fits small screens: first size, saved geometry, long status lines, the header and
the inspector on a narrow window, the page shortcuts, the toast's colours (issue 15)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gui_support import make_window, start_window
from PySide6.QtCore import QByteArray, QRect, QSettings, QSize, Qt
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QApplication, QLabel, QWidget

from app.gui.theme import DARK, LIGHT, apply_theme, contrast_ratio
from app.gui.window_layout import ElidedLabel, geometry_fits, initial_geometry, wrap_anywhere
from app.paths import Paths
from app.settings import Settings

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]

LONG = "Skipped /home/user/Documents/" + "very-long-folder-name/" * 12 + "scan.pdf: " + "no text layer " * 14


@pytest.fixture
def window(qtbot: Any, paths: Paths, fake_model: Path) -> Any:
    w = start_window(qtbot, paths)
    yield w
    w.shutdown()


def test_first_window_fits_small_screens() -> None:
    for width, height in ((1366, 768), (1024, 700), (1280, 800)):
        screen = QRect(0, 0, width, height - 32)  # a panel takes the rest
        first = initial_geometry(screen)
        assert screen.contains(first), (screen, first)
        assert first.width() >= width * 0.9 and first.height() >= (height - 32) * 0.9
    big = QRect(0, 0, 2560, 1400)
    assert initial_geometry(big).size() == QSize(1320, 820)
    assert big.contains(initial_geometry(big))
    assert not geometry_fits(QRect(40, 30, 1320, 820), QRect(0, 0, 1366, 736))
    assert geometry_fits(QRect(40, 30, 1200, 650), QRect(0, 0, 1366, 736))


def test_saved_geometry_that_does_not_fit_the_screen_is_not_restored(qtbot: Any, paths: Paths) -> None:
    probe = QWidget()
    probe.setGeometry(0, 0, 3000, 2000)
    qs = QSettings(str(paths.config / "window.ini"), QSettings.Format.IniFormat)
    qs.setValue("geometry", probe.saveGeometry())
    qs.sync()
    w = make_window(paths, None, probe_bandwidth=False)
    qtbot.addWidget(w)
    available = w.screen().availableGeometry()
    assert w.width() <= available.width() and w.height() <= available.height()
    assert isinstance(qs.value("geometry"), QByteArray)


def test_long_status_lines_never_widen_the_window(qtbot: Any, window: Any) -> None:
    window.show_error(LONG)
    window.header.model_status.setText(LONG)
    window.header.docs_label.setText(LONG)
    window.header.index_label.setText(LONG)
    window.composer.set_ready(False, LONG)
    window.statusBar().showMessage(LONG)
    window.toast.show_message(LONG, "Undo", lambda: None)
    window.show_page(1)
    window.show_page(2)
    page = window.knowledge_page
    for name in ("progress_label", "notice", "summary"):
        label = getattr(page, name, None)
        if label is not None:
            label.setText(LONG)
    window.show_page(0)
    QApplication.processEvents()
    hint = window.minimumSizeHint()
    assert hint.width() <= 1024, hint
    assert hint.height() <= 700, hint
    # The whole text stays reachable.
    assert window.header.model_status.toolTip() == "" or window.header.model_status.toolTip() == LONG
    window.resize(1024, 700)
    qtbot.waitUntil(lambda: window.width() == 1024, timeout=2000)
    QApplication.processEvents()
    assert window.header.model_status.toolTip() == LONG
    assert window.composer.state_label.text() == LONG
    assert window.banner.toolTip() == LONG
    assert window.statusBar().toolTip() == LONG


def test_elided_label_keeps_the_whole_text() -> None:
    label = ElidedLabel("x" * 300)
    label.resize(120, 20)
    assert label.minimumSizeHint().width() < 120
    assert label.text() == "x" * 300
    assert label.shown_text().endswith("…")
    assert label.toolTip() == "x" * 300
    assert "\u200b" in wrap_anywhere("/a/" + "b" * 80)


def _visible_in(widget: QWidget, top: QWidget) -> bool:
    rect = QRect(widget.mapTo(top, widget.rect().topLeft()), widget.size())
    return widget.isVisible() and top.rect().contains(rect)


@pytest.mark.parametrize("size", [(1024, 700), (1366, 768)])
def test_header_and_composer_fit_a_small_window(qtbot: Any, window: Any, size: tuple[int, int]) -> None:
    window.resize(*size)
    qtbot.waitUntil(lambda: window.size() == QSize(*size), timeout=2000)
    QApplication.processEvents()
    header = window.header.chat_settings_button.parentWidget()
    bar = window.header.model_bar  # the model bar's controls are the header's first row
    for inspector_open in (window.inspector_button.isChecked(), not window.inspector_button.isChecked()):
        if window.inspector_button.isChecked() != inspector_open:
            window.inspector_button.click()
            QApplication.processEvents()
        controls = [
            w for w in header.findChildren(QWidget) if w.isVisibleTo(header) and w.parentWidget() in (header, bar)
        ]
        buttons = [w for w in controls if not isinstance(w, QLabel) and w is not bar]
        assert window.inspector_button in buttons and window.header.model_bar.load_button in buttons
        for button in [window.composer.send_button, window.nav_rail.settings_button]:
            assert _visible_in(button, window), (inspector_open, button)
        for button in buttons:
            assert _visible_in(button, header), (inspector_open, button)  # not cut by the header's edge
        assert _visible_in(window.statusBar(), window)
        rects = [QRect(b.mapTo(window, b.rect().topLeft()), b.size()) for b in buttons]
        for i, a in enumerate(rects):
            for b in rects[i + 1 :]:
                assert not a.intersects(b), (inspector_open, a, b)
        for button in buttons:  # no control squeezed below what it needs
            assert button.width() >= button.minimumSizeHint().width(), (inspector_open, button)


def test_inspector_collapses_to_its_toggle_on_a_narrow_window(qtbot: Any, window: Any) -> None:
    window.resize(1366, 768)
    qtbot.waitUntil(lambda: window.width() == 1366, timeout=2000)
    QApplication.processEvents()
    assert window.inspector.isVisible() and window.sidebar.isVisible()
    assert window.inspector_button.isChecked()
    window.resize(1024, 700)
    qtbot.waitUntil(lambda: window.width() == 1024, timeout=2000)
    QApplication.processEvents()
    assert not window.inspector.isVisible()
    assert not window.inspector_button.isChecked()
    assert window.sidebar.isVisible()
    window.inspector_button.click()  # opening it on a narrow window: the chat list gives way
    QApplication.processEvents()
    assert window.inspector.isVisible() and not window.sidebar.isVisible()
    center = window.splitter.widget(1)
    assert center.width() >= center.minimumSizeHint().width()
    window.inspector_button.click()
    QApplication.processEvents()
    assert window.sidebar.isVisible() and not window.inspector.isVisible()
    window.inspector_button.click()
    window.resize(1366, 768)  # wide again: all three
    qtbot.waitUntil(lambda: window.width() == 1366, timeout=2000)
    QApplication.processEvents()
    assert window.inspector.isVisible() and window.sidebar.isVisible()
    assert window.settings.show_inspector


def test_ctrl_digit_shortcuts_reach_every_page(qtbot: Any, window: Any) -> None:
    for key, index in ((Qt.Key.Key_2, 1), (Qt.Key.Key_3, 2), (Qt.Key.Key_1, 0)):
        qtbot.keyClick(window, key, Qt.KeyboardModifier.ControlModifier)
        qtbot.waitUntil(lambda i=index: window.pages.currentIndex() == i, timeout=3000)
        assert window.nav_rail.nav_group.checkedId() == index


@pytest.mark.parametrize("theme", [LIGHT, DARK])
def test_toast_text_reads_on_its_background(qtbot: Any, paths: Paths, theme: Any) -> None:
    w = make_window(paths, None, settings=Settings(theme=theme.name), probe_bandwidth=False)
    qtbot.addWidget(w)
    w.show()
    w.toast.show_message("Chat deleted.", "Undo", lambda: None)
    QApplication.processEvents()
    text = w.toast.label.palette().color(QPalette.ColorRole.WindowText).name()
    action = w.toast.action.palette().color(QPalette.ColorRole.ButtonText).name()
    background = theme.text  # the toast is drawn in the inverted colours
    assert text != background
    assert contrast_ratio(text, background) >= 4.5, (text, background)
    assert contrast_ratio(action, background) >= 4.5, (action, background)
    image = w.toast.grab().toImage()
    colors = {image.pixelColor(x, y).name() for x in range(0, image.width(), 2) for y in range(image.height())}
    assert text in colors  # the letters are painted in it
    w.shutdown()
    apply_theme(QApplication.instance(), LIGHT)


def test_dark_theme_checkbox_and_checked_toggle_are_visible(qtbot: Any) -> None:
    from PySide6.QtWidgets import QCheckBox, QPushButton, QVBoxLayout

    app = QApplication.instance()
    apply_theme(app, DARK)
    try:
        holder = QWidget()
        layout = QVBoxLayout(holder)
        box = QCheckBox("Load the last model")
        toggle = QPushButton("Inspector")
        toggle.setCheckable(True)
        layout.addWidget(box)
        layout.addWidget(toggle)
        qtbot.addWidget(holder)
        holder.show()
        QApplication.processEvents()
        image = box.grab().toImage()
        indicator = [image.pixelColor(x, y).name() for x in range(0, 22) for y in range(image.height())]
        best = max(contrast_ratio(color, DARK.window) for color in indicator)
        assert best >= 3.0, best  # the unchecked box's border reads on the dark background
        unchecked = toggle.grab().toImage()
        toggle.setChecked(True)
        QApplication.processEvents()
        checked = toggle.grab().toImage()
        assert checked != unchecked
        middle = checked.pixelColor(checked.width() // 4, checked.height() // 2).name()
        assert middle == DARK.user_bubble  # the checked look: the accent-tinted fill
    finally:
        apply_theme(app, LIGHT)


def test_closing_hides_the_window_before_the_slow_shutdown(qtbot: Any, window: Any, monkeypatch: Any) -> None:
    seen: list[bool] = []
    real = window.chat.shutdown

    def shutdown(deadline_s: float = 5.0) -> bool:
        seen.append(window.isVisible())
        return bool(real(deadline_s))

    monkeypatch.setattr(window.chat, "shutdown", shutdown)
    window.close()
    assert seen == [False]  # the model and the threads close after the window is gone


def test_flow_layout_wraps_instead_of_cutting(qtbot: Any) -> None:
    from PySide6.QtWidgets import QPushButton

    from app.gui.window_layout import FlowLayout

    holder = QWidget()
    flow = FlowLayout(holder)
    buttons = [QPushButton(f"Button number {i}") for i in range(6)]
    for button in buttons:
        flow.addWidget(button)
    qtbot.addWidget(holder)
    one_line = flow.sizeHint().height()
    narrow = buttons[0].sizeHint().width() + 20
    assert holder.minimumSizeHint().width() <= narrow
    assert flow.heightForWidth(narrow) >= 5 * one_line  # one button a line
    holder.resize(narrow, flow.heightForWidth(narrow))
    holder.show()
    QApplication.processEvents()
    rects = [b.geometry() for b in buttons]
    assert all(holder.rect().contains(r) for r in rects)
    assert all(not a.intersects(b) for i, a in enumerate(rects) for b in rects[i + 1 :])
    assert all(b.width() >= b.sizeHint().width() for b in buttons)


def test_search_shortcut_brings_the_chat_list_back_on_a_narrow_window(qtbot: Any, window: Any) -> None:
    window.resize(1024, 700)
    qtbot.waitUntil(lambda: window.width() == 1024, timeout=2000)
    QApplication.processEvents()
    window.inspector_button.click()
    QApplication.processEvents()
    assert not window.sidebar.isVisible()
    qtbot.keyClick(window, Qt.Key.Key_K, Qt.KeyboardModifier.ControlModifier)
    QApplication.processEvents()
    assert window.sidebar.isVisible() and not window.inspector.isVisible()
