"""What the inspector's numbers are called: the context window's bands, the memory wall's
explanation and the tokens/s format. Plain Python: :mod:`app.gui.inspector` shows them in its first
frame, and its painted pieces (:mod:`app.gui.inspector_widgets`) come after it."""

from __future__ import annotations

SEGMENTS: tuple[tuple[str, str], ...] = (
    ("system", "System prompt"),
    ("documents", "Documents"),
    ("tools", "Tool definitions"),
    ("history", "History"),
    ("tool_results", "Tool results"),
    ("media", "Images"),
    ("current", "Current message"),
    ("reserve", "Reply reserve"),
    ("free", "Free"),
)
OPTIONAL_SEGMENTS = ("tools", "tool_results", "media")
"""Legend rows shown only when the turn used them (a chat with tools, a message with images)."""
WALL_EXPLANATION = (
    "Decode reads every weight once per token, so memory bandwidth caps the speed: "
    "tokens/s ≤ bandwidth ÷ (weights + KV cache in use)."
)


def format_tps(value: float | None) -> str:
    return "—" if not value else f"{value:.1f} tok/s"
