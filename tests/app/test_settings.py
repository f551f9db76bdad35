"""Settings: defaults, atomic round trip, migrations, damaged and newer files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app import settings as settings_mod
from app.settings import SCHEMA_VERSION, Settings, load_settings, save_settings


def test_missing_file_gives_defaults(tmp_path: Path) -> None:
    loaded = load_settings(tmp_path / "settings.json")
    assert loaded.settings == Settings()
    assert loaded.warning is None


def test_round_trip_is_atomic_and_exact(tmp_path: Path) -> None:
    path = tmp_path / "cfg" / "settings.json"
    original = Settings(n_ctx=8192, theme="dark", gpu_layers=12, default_system_prompt="Be brief.")
    save_settings(original, path)
    assert load_settings(path).settings == original
    assert [p.name for p in path.parent.iterdir()] == ["settings.json"]  # no temp file left behind
    assert json.loads(path.read_text())["schema_version"] == SCHEMA_VERSION


def test_damaged_file_is_kept_and_defaults_used(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text("{not json")
    loaded = load_settings(path)
    assert loaded.settings == Settings()
    assert loaded.warning is not None
    assert str(path) in loaded.warning
    assert "\n" not in loaded.warning
    [backup] = tmp_path.glob("settings.json.*.bad")
    assert backup.read_text() == "{not json"
    assert str(backup) in loaded.warning


def test_invalid_value_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"schema_version": 1, "n_ctx": -5}))
    loaded = load_settings(path)
    assert loaded.warning is not None
    assert "n_ctx" in loaded.warning


def test_newer_file_is_read_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"schema_version": SCHEMA_VERSION + 3, "theme": "dark", "future_key": 1}))
    loaded = load_settings(path)
    assert loaded.settings.theme == "dark"
    assert loaded.warning is not None
    assert "newer" in loaded.warning


def test_registered_migrations_run_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settings_mod, "SCHEMA_VERSION", 3)
    monkeypatch.setattr(settings_mod, "MIGRATIONS", {})

    @settings_mod.migration(1)
    def rename_context(raw: dict) -> dict:
        raw["n_ctx"] = raw.pop("context_length")
        return raw

    @settings_mod.migration(2)
    def dark_flag(raw: dict) -> dict:
        raw["theme"] = "dark" if raw.pop("dark_mode") else "light"
        return raw

    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"schema_version": 1, "context_length": 2048, "dark_mode": True}))
    loaded = load_settings(path)
    assert loaded.warning is None
    assert loaded.settings.n_ctx == 2048
    assert loaded.settings.theme == "dark"
    assert loaded.settings.schema_version == 3


def test_presets_fall_back_to_default() -> None:
    s = Settings()
    assert s.preset("Creative").temperature == 1.0
    assert s.preset("no such preset").name == s.default_preset


def test_each_bad_edit_keeps_its_own_copy_and_only_a_few(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "settings.json"
    clock = iter(range(1_800_000_000, 1_800_000_100, 7))
    monkeypatch.setattr(settings_mod.time, "localtime", lambda *_: settings_mod.time.gmtime(next(clock)))
    count = settings_mod.MAX_BAD_COPIES + 2
    edits = [{"schema_version": 1, "theme": "dark", "n_ctx": f"bad {i}"} for i in range(count)]
    warnings = []
    for edit in edits:
        path.write_text(json.dumps(edit))
        loaded = load_settings(path)
        assert loaded.settings.theme == "dark"
        warnings.append(loaded.warning)
        save_settings(loaded.settings, path)  # the app saves; the user edits the file again
    copies = sorted(tmp_path.glob("settings.json.*.bad"))
    assert len(copies) == settings_mod.MAX_BAD_COPIES  # the newest few
    assert [json.loads(c.read_text())["n_ctx"] for c in copies] == [e["n_ctx"] for e in edits[-len(copies) :]]
    for warning, copy in zip(warnings[-len(copies) :], copies, strict=True):
        assert warning is not None and f"kept as {copy}" in warning  # each says where its copy is


def test_the_same_bad_file_read_again_is_copied_once(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text('{"n_ctx": "bad"}')
    first = load_settings(path).warning
    second = load_settings(path).warning
    assert first == second
    assert len(list(tmp_path.glob("settings.json.*.bad"))) == 1


def test_two_bad_edits_in_one_second_keep_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "settings.json"
    monkeypatch.setattr(settings_mod.time, "localtime", lambda *_: settings_mod.time.gmtime(1_800_000_000))
    for value in ("bad 1", "bad 2", "bad 3"):
        path.write_text(json.dumps({"n_ctx": value}))
        load_settings(path)
    copies = settings_mod._bad_copies(path)
    assert [json.loads(c.read_text())["n_ctx"] for c in copies] == ["bad 1", "bad 2", "bad 3"]
