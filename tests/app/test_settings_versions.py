"""Settings written by another version: a wrong value costs only that value, and what this version
does not understand (unknown keys, a newer schema_version, a newer file's values) survives a save.

Each file is written here as the other version would have written it.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from app.settings import SCHEMA_VERSION, SamplingPreset, Settings, load_settings, save_settings
from tests.disk_support import usual_umask  # noqa: F401 - the fixture pytestmark names

pytestmark = pytest.mark.usefixtures("usual_umask")

KEY = "sk-glassbox-secret-7f3a9c"
NEWER = SCHEMA_VERSION + 3


def _write(path: Path, data: dict[str, Any]) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=2).encode()
    path.write_bytes(text)
    return text


def _read(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _users(**changes: Any) -> dict[str, Any]:
    """A file a user has configured: every value valid, none of them the default."""
    data: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "n_ctx": 8192,
        "theme": "dark",
        "gpu_layers": 12,
        "default_system_prompt": "Be brief.",
        "api_server_key": KEY,
        "last_model": "/models/qwen.gguf",
        "presets": [{"name": "Mine", "temperature": 0.3}, {"name": "Other", "top_k": 7}],
        "default_preset": "Mine",
    }
    data.update(changes)
    return data


def test_one_wrong_typed_value_defaults_only_that_value_and_survives_the_next_save(tmp_path: Path) -> None:
    path = tmp_path / "config" / "settings.json"
    original = _write(path, _users(n_ctx="abc"))
    loaded = load_settings(path)
    s = loaded.settings
    assert s.n_ctx == Settings().n_ctx  # the bad one: its default
    assert (s.theme, s.gpu_layers, s.default_system_prompt, s.api_server_key) == ("dark", 12, "Be brief.", KEY)
    assert s.last_model == "/models/qwen.gguf"
    assert [p.name for p in s.presets] == ["Mine", "Other"]
    assert s.default_preset == "Mine"
    # One line naming the file and the bad key, not the good ones, never the key's value.
    warning = loaded.warning
    assert warning is not None
    assert "\n" not in warning
    assert warning.startswith(f"{path}: ")
    assert "n_ctx" in warning
    for good in ("theme", "gpu_layers", "presets", "api_server_key", "last_model"):
        assert good not in warning
    assert KEY not in warning
    # The file as the user wrote it is kept, owner-only (it holds the API key).
    [backup] = path.parent.glob("settings.json.*.bad")
    assert str(backup) in warning  # where the copy is
    assert backup.read_bytes() == original
    if sys.platform != "win32":
        assert stat.S_IMODE(backup.stat().st_mode) == 0o600
    # The app saves on exit: the user's valid settings are still there at the next start.
    save_settings(s, path)
    again = load_settings(path)
    assert again.warning is None
    assert again.settings == s
    assert _read(path)["theme"] == "dark"
    assert backup.read_bytes() == original  # a good file does not overwrite the copy


def test_every_bad_value_is_named_and_a_bad_preset_costs_only_itself(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    presets = [{"name": "Mine", "temperature": 0.3}, {"name": "Broken", "temperature": "hot"}, {"name": "Third"}]
    _write(path, _users(n_ctx="abc", theme="neon", presets=presets, reply_reserve=None))
    loaded = load_settings(path)
    s = loaded.settings
    assert loaded.warning is not None and "\n" not in loaded.warning
    for bad in ("n_ctx", "theme", "presets[1]", "reply_reserve"):
        assert bad in loaded.warning
    assert "presets[0]" not in loaded.warning and "presets[2]" not in loaded.warning
    defaults = Settings()
    assert (s.n_ctx, s.theme, s.reply_reserve) == (defaults.n_ctx, defaults.theme, defaults.reply_reserve)
    assert s.presets == [SamplingPreset(name="Mine", temperature=0.3), SamplingPreset(name="Third")]
    assert (s.gpu_layers, s.default_system_prompt, s.api_server_key) == (12, "Be brief.", KEY)


def test_a_list_of_only_bad_presets_gets_the_default_presets(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    _write(path, _users(presets=[{"name": "Broken", "top_p": 0}]))
    loaded = load_settings(path)
    assert loaded.warning is not None and "presets[0]" in loaded.warning
    assert loaded.settings.presets == Settings().presets
    assert loaded.settings.preset("Mine").name == "Balanced"  # still answers
    assert loaded.settings.theme == "dark"


def test_unknown_keys_are_written_back_when_the_app_saves(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    future = {"mcp_servers": [{"name": "files", "port": 9000}], "voice": {"enabled": True}}
    _write(path, _users(**future))
    loaded = load_settings(path)
    assert loaded.warning is None  # same version: nothing to say
    # What the settings dialog and the inspector toggle do before a save.
    changed = loaded.settings.model_copy(update={"theme": "light"})
    changed.show_inspector = False
    save_settings(changed, path)
    saved = _read(path)
    assert saved["mcp_servers"] == future["mcp_servers"]
    assert saved["voice"] == future["voice"]
    assert (saved["theme"], saved["show_inspector"], saved["n_ctx"]) == ("light", False, 8192)
    assert saved["schema_version"] == SCHEMA_VERSION
    # And again: a second load and save keeps them too.
    save_settings(load_settings(path).settings, path)
    assert _read(path)["voice"] == future["voice"]


def test_a_newer_file_keeps_its_version_and_its_keys_through_a_save(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    _write(path, _users(schema_version=NEWER, context_shift={"mode": "smart"}, theme="dark"))
    loaded = load_settings(path)
    assert loaded.warning is not None and "\n" not in loaded.warning
    assert loaded.warning.startswith(f"{path}: ")
    assert f"written by a newer Glassbox (schema {NEWER}; this one reads up to {SCHEMA_VERSION})" in loaded.warning
    assert loaded.settings.theme == "dark"
    save_settings(loaded.settings.model_copy(update={"n_ctx": 2048}), path)
    saved = _read(path)
    assert saved["schema_version"] == NEWER  # not silently downgraded
    assert saved["context_shift"] == {"mode": "smart"}
    assert (saved["n_ctx"], saved["theme"]) == (2048, "dark")


def test_a_newer_files_unreadable_values_are_saved_back_unless_the_user_changes_them(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    # A newer Glassbox that widened two settings: values this one cannot read.
    _write(path, _users(schema_version=NEWER, n_ctx="auto", gpu_layers="all"))
    loaded = load_settings(path)
    assert loaded.warning is not None and "\n" not in loaded.warning
    assert "newer" in loaded.warning and "n_ctx" in loaded.warning and "gpu_layers" in loaded.warning
    assert (loaded.settings.n_ctx, loaded.settings.gpu_layers) == (Settings().n_ctx, Settings().gpu_layers)
    assert loaded.settings.theme == "dark"
    save_settings(loaded.settings, path)
    saved = _read(path)
    assert (saved["n_ctx"], saved["gpu_layers"]) == ("auto", "all")  # the newer version gets them back
    # The user sets one of them here: that one is the user's now, the other is still kept.
    save_settings(load_settings(path).settings.model_copy(update={"gpu_layers": 8}), path)
    saved = _read(path)
    assert (saved["n_ctx"], saved["gpu_layers"], saved["schema_version"]) == ("auto", 8, NEWER)
