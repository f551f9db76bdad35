"""Text contrast in both themes (issue 28, minor): the Library's and Quantize's "● fits in RAM"
(#4F46E5 on #1F232C, about 2.5:1, in the dark theme) and the approval card's border, almost
invisible on the dark transcript. Text has 4.5:1 at least, the card's border 3:1."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from PySide6.QtWidgets import QApplication

from app.gui.quantize_dialog import VERDICT_TEXT, verdict_color
from app.gui.theme import DARK, LIGHT, apply_theme, contrast_ratio, stylesheet

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]


@pytest.mark.parametrize("colors", [LIGHT, DARK], ids=["light", "dark"])
def test_every_fit_verdict_reads_on_the_tables_rows(colors: Any) -> None:
    for verdict in VERDICT_TEXT:
        color = verdict_color(verdict, colors)
        for background in (colors.surface, colors.surface_alt):  # a table's rows alternate
            assert contrast_ratio(color, background) >= 4.5, (colors.name, verdict, color, background)


@pytest.mark.parametrize("colors", [LIGHT, DARK], ids=["light", "dark"])
def test_the_approval_cards_border_stands_out(colors: Any) -> None:
    sheet = stylesheet(colors)
    rule = next(line for line in sheet.splitlines() if line.startswith("#approvalCard"))
    border = rule.split("border: 1px solid ")[1].split(";")[0]
    assert contrast_ratio(border, colors.window) >= 3.0 and contrast_ratio(border, colors.surface) >= 3.0


def test_the_library_shows_the_verdicts_in_the_theme_shown(qtbot: Any, open_panel: Any, paths: Any) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "engine"))
    from tiny_models import write_tiny_llama_gguf

    write_tiny_llama_gguf(paths.models / "tiny-F32.gguf")
    app = QApplication.instance()
    assert isinstance(app, QApplication)
    try:
        apply_theme(app, DARK)
        _adapter, panel = open_panel()
        panel.tabs.setCurrentIndex(0)
        qtbot.waitUntil(lambda: panel.library.rowCount() == 1 and panel.library.item(0, 6).text() != "…", timeout=20000)
        cell = panel.library.item(0, 6)
        verdict = next(key for key, text in VERDICT_TEXT.items() if text in cell.text())
        assert cell.foreground().color().name() == verdict_color(verdict, DARK)
        apply_theme(app, LIGHT)  # switched in Settings: the rows follow
        QApplication.processEvents()
        assert panel.library.item(0, 6).foreground().color().name() == verdict_color(verdict, LIGHT)
    finally:
        apply_theme(app, LIGHT)
