"""The first frame's glance at the settings agrees with the full read (``app.settings.load_settings``)."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest

from app.settings import Theme, load_settings
from app.settings_glance import THEMES, SettingsGlance, glance_settings


def test_the_glance_knows_the_same_themes_as_the_settings() -> None:
    assert set(THEMES) == set(typing.get_args(Theme))


@pytest.mark.parametrize(
    "text",
    [
        None,  # no file
        "{}",
        '{"theme": "dark", "show_inspector": false}',
        '{"theme": "light", "show_inspector": true, "n_ctx": 8192}',
        '{"theme": "purple", "show_inspector": false}',  # a theme no version knows
        '{"theme": 3, "show_inspector": null}',
        '{"theme": "dark", "n_ctx": "lots"}',  # another setting is bad: these two still hold
        "[1, 2]",  # not an object
        "{ not json",
        '{"schema_version": 99, "theme": "dark", "show_inspector": false}',  # from a newer version
        '{"schema_version": 0, "theme": "dark"}',  # unmigratable: the defaults
    ],
)
def test_the_glance_gives_what_the_full_read_gives(tmp_path: Path, text: str | None) -> None:
    path = tmp_path / "settings.json"
    if text is not None:
        path.write_text(text, encoding="utf-8")
    glance = glance_settings(path)  # first: the full read may keep a copy of a damaged file
    settings = load_settings(path).settings
    assert glance == SettingsGlance(theme=settings.theme, show_inspector=settings.show_inspector)


def test_the_glance_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text("{ not json", encoding="utf-8")
    assert glance_settings(path) == SettingsGlance()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["settings.json"]  # no copy kept: load_settings keeps it


def test_a_value_only_the_full_read_accepts_is_the_glance_default(tmp_path: Path) -> None:
    """pydantic reads "false" as False; the glance does not guess (the window corrects itself after
    the full read: tests/app/gui/test_window_two_steps.py)."""
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"show_inspector": "false"}), encoding="utf-8")
    assert glance_settings(path).show_inspector is True
    assert load_settings(path).settings.show_inspector is False
