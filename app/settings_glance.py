"""The two settings the window's first frame needs, read without pydantic (start-up cost).

``app.settings`` validates the whole file with pydantic, whose import and model build take about
0.1 s: as long again as the empty PySide6 window this app is measured against. The first frame
needs only the theme and whether the inspector shows, so ``glance_settings`` reads those two with
``json`` and nothing else; the window reads the file in full, with ``load_settings``, right after
that frame, and corrects itself where the full read differs (a value only pydantic's rules accept,
a migration). The glance writes nothing, keeps no copy of a damaged file and never raises: all of
that is ``load_settings``'s.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

THEMES = ("system", "light", "dark")
"""The values of the ``theme`` setting (``app.settings.Theme``)."""


@dataclass(frozen=True)
class SettingsGlance:
    """What the first frame shows before the settings are read in full."""

    theme: str = "system"
    show_inspector: bool = True


def glance_settings(path: Path) -> SettingsGlance:
    """The theme and the inspector's state as ``path`` holds them; the defaults for a missing,
    unreadable or damaged file (or one of no known version) and for a value of another type."""
    default = SettingsGlance()
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return default
    if not isinstance(raw, dict):
        return default
    version = raw.get("schema_version", 1)
    if not isinstance(version, int) or version < 1:
        return default  # a version no Glassbox wrote: the full read uses the defaults
    theme = raw.get("theme", default.theme)
    show = raw.get("show_inspector", default.show_inspector)
    return SettingsGlance(
        theme=theme if theme in THEMES else default.theme,
        show_inspector=show if isinstance(show, bool) else default.show_inspector,
    )
