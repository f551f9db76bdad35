"""Light and dark themes: a palette, a stylesheet and the colours custom-painted widgets use.

The stylesheet template lives in ``resources/glassbox.qss`` with ``@name`` placeholders filled from
a :class:`ThemeColors`. "system" follows the OS colour scheme (Qt 6.5+ ``styleHints``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication

from app.gui.markdown_render import DARK_CODE, LIGHT_CODE, CodeColors
from app.paths import resource_path

RESOURCES = resource_path("")  # the folder: in the source tree, or in the frozen bundle


@dataclass(frozen=True)
class ThemeColors:
    """Named colours of one theme."""

    name: str
    window: str
    surface: str
    surface_alt: str
    border: str
    text: str
    muted: str
    accent: str
    accent_text: str
    user_bubble: str
    danger: str
    warning: str
    ok: str
    # context-map segments: system, documents, tools, history, tool results, current, reserve, free
    seg_system: str
    seg_documents: str
    seg_history: str
    seg_current: str
    seg_reserve: str
    seg_free: str
    seg_tools: str = "#0ea5e9"
    seg_tool_results: str = "#65a30d"
    seg_media: str = "#e11d48"  # images and clips: a colour of their own in the context map
    toast_action: str = "#a5b4fc"
    """The toast's action ("Undo") on its inverted background."""
    danger_text: str = "#ffffff"
    """Text on the danger colour (the Stop button, the error banner)."""
    focus: str = "#4f46e5"
    """The keyboard focus ring."""
    # The "will it fit" verdicts (the Models page, Discover, Quantize): text, 4.5:1 on the surface
    # and on the alternate rows of a table.
    fit_gpu: str = "#166534"
    fit_partial: str = "#0e7490"
    fit_ram: str = "#4f46e5"
    fit_no: str = "#b91c1c"

    @property
    def code(self) -> CodeColors:
        return DARK_CODE if self.name == "dark" else LIGHT_CODE

    def segment(self, key: str) -> str:
        return str(getattr(self, f"seg_{key}", self.muted))


LIGHT = ThemeColors(
    name="light",
    window="#f6f7f9",
    surface="#ffffff",
    surface_alt="#eef0f4",
    border="#dde1e7",
    text="#1f2328",
    muted="#6b7280",
    accent="#4f46e5",
    accent_text="#ffffff",
    user_bubble="#eef2ff",
    danger="#dc2626",
    warning="#d97706",
    ok="#16a34a",
    seg_system="#8b5cf6",
    seg_documents="#f59e0b",
    seg_history="#3b82f6",
    seg_current="#10b981",
    seg_reserve="#f472b6",
    seg_free="#e5e7eb",
)

DARK = ThemeColors(
    name="dark",
    window="#0f1115",
    surface="#171a21",
    surface_alt="#1f232c",
    border="#2b303b",
    text="#e6e8ee",
    muted="#9aa3b2",
    accent="#818cf8",
    accent_text="#0f1115",
    user_bubble="#1e2340",
    danger="#f87171",
    warning="#fbbf24",
    ok="#4ade80",
    seg_system="#a78bfa",
    seg_documents="#fbbf24",
    seg_history="#60a5fa",
    seg_current="#34d399",
    seg_reserve="#f9a8d4",
    seg_free="#2b303b",
    seg_tools="#38bdf8",
    seg_tool_results="#a3e635",
    seg_media="#fb7185",
    toast_action="#3730a3",
    danger_text="#111318",
    focus="#a5b4fc",
    fit_gpu="#4ade80",
    fit_partial="#22d3ee",
    fit_ram="#a5b4fc",
    fit_no="#f87171",
)

_applied: list[ThemeColors] = [LIGHT]


def applied_colors() -> ThemeColors:
    """The theme the application shows now (:func:`apply_theme`), for colours set in code."""
    return _applied[0]


def resolve_theme(setting: str) -> ThemeColors:
    """The colours for a theme setting ("light", "dark" or "system")."""
    if setting == "dark":
        return DARK
    if setting == "light":
        return LIGHT
    hints = QGuiApplication.styleHints()
    scheme = hints.colorScheme() if hints is not None else Qt.ColorScheme.Unknown
    return DARK if scheme == Qt.ColorScheme.Dark else LIGHT


def stylesheet(colors: ThemeColors) -> str:
    """The application stylesheet with the theme's colours filled in."""
    template = (RESOURCES / "glassbox.qss").read_text(encoding="utf-8")
    values = asdict(colors)
    values["icons"] = (RESOURCES / "icons").as_posix()
    # Longest names first so that @surface_alt is not eaten by @surface.
    for key in sorted(values, key=len, reverse=True):
        template = template.replace(f"@{key}", str(values[key]))
    return template


def contrast_ratio(foreground: str, background: str) -> float:
    """The WCAG 2 contrast ratio of two colours (1 to 21; text needs 4.5, large text and UI 3)."""

    def luminance(name: str) -> float:
        color = QColor(name)
        channels = []
        for value in (color.redF(), color.greenF(), color.blueF()):
            channels.append(value / 12.92 if value <= 0.04045 else ((value + 0.055) / 1.055) ** 2.4)
        return 0.2126 * channels[0] + 0.7152 * channels[1] + 0.0722 * channels[2]

    light, dark = sorted((luminance(foreground), luminance(background)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


_FUSION = "glassbox_fusion"  # a property of an application started in the Fusion style


def new_application(argv: list[str]) -> QApplication:
    """The application, started in the Fusion style.

    Qt sets a style named on the command line (``-style fusion``) as it starts; set afterwards
    (``QApplication.setStyle``), the style comes back to Python, and PySide6 builds the Python
    ``QStyle`` class and its enums for it: 6-9 ms of the window's first frame, measured.
    """
    app = QApplication([*argv, "-style", "fusion"])
    app.setProperty(_FUSION, True)
    return app


def apply_theme(app: QApplication, colors: ThemeColors) -> None:
    """Sets the Fusion style (unless :func:`new_application` started the application in it), a
    matching palette and the stylesheet."""
    if app.property(_FUSION) is not True:
        app.setStyle("Fusion")
        app.setProperty(_FUSION, True)
    palette = QPalette()
    role = QPalette.ColorRole
    palette.setColor(role.Window, QColor(colors.window))
    palette.setColor(role.WindowText, QColor(colors.text))
    palette.setColor(role.Base, QColor(colors.surface))
    palette.setColor(role.AlternateBase, QColor(colors.surface_alt))
    palette.setColor(role.Text, QColor(colors.text))
    palette.setColor(role.Button, QColor(colors.surface))
    palette.setColor(role.ButtonText, QColor(colors.text))
    palette.setColor(role.Highlight, QColor(colors.accent))
    palette.setColor(role.HighlightedText, QColor(colors.accent_text))
    palette.setColor(role.ToolTipBase, QColor(colors.surface_alt))
    palette.setColor(role.ToolTipText, QColor(colors.text))
    palette.setColor(role.PlaceholderText, QColor(colors.muted))
    palette.setColor(role.Link, QColor(colors.accent))
    palette.setColor(QPalette.ColorGroup.Disabled, role.Text, QColor(colors.muted))
    palette.setColor(QPalette.ColorGroup.Disabled, role.ButtonText, QColor(colors.muted))
    _applied[0] = colors  # first: widgets that set colours in code read it as the palette changes
    app.setPalette(palette)
    app.setStyleSheet(stylesheet(colors))
