"""Paths names every file Glassbox keeps, each under one of the four re-rootable folders."""

from __future__ import annotations

from pathlib import Path

from app.paths import Paths


def _named_files(paths: Paths) -> dict[str, Path]:
    names = [n for n, v in vars(Paths).items() if isinstance(v, property) and n not in ("folders",)]
    return {name: getattr(paths, name) for name in names}


def test_every_named_file_lives_under_the_home_it_was_given(tmp_path: Path) -> None:
    paths = Paths.resolve(tmp_path / "home")
    files = _named_files(paths)
    assert {"endpoints_file", "model_folders", "models_manifest", "window_state", "selftest_document"} <= set(files)
    roots = (paths.data, paths.cache, paths.config, paths.logs)
    for name, path in files.items():
        assert any(path.is_relative_to(root) for root in roots), f"{name}: {path} is outside the home"
    assert len(set(files.values())) == len(files), "two names for one file"


def test_a_models_folder_elsewhere_keeps_its_own_manifest(tmp_path: Path) -> None:
    paths = Paths.resolve(tmp_path / "home")
    assert paths.models_manifest == Paths.manifest_of(paths.models) == paths.models / "manifest.json"
    assert Paths.manifest_of(tmp_path / "elsewhere") == tmp_path / "elsewhere" / "manifest.json"
