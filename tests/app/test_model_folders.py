"""Other apps' model folders and the shipped suggestions list, Qt-free."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from app.curated_models import curated_path, load_curated
from app.model_folders import candidate_folders, decline, declined, has_gguf, offered_folders


def test_the_hugging_face_cache_follows_its_environment(tmp_path: Path) -> None:
    home = tmp_path / "home"
    plain = [f.path for f in candidate_folders({}, home)]
    assert plain[0] == home / ".cache" / "huggingface" / "hub"
    assert home / ".lmstudio" / "models" in plain
    assert candidate_folders({"HF_HOME": str(tmp_path / "hf")}, home)[0].path == tmp_path / "hf" / "hub"
    assert candidate_folders({"HF_HUB_CACHE": str(tmp_path / "c"), "HF_HOME": "x"}, home)[0].path == tmp_path / "c"
    assert candidate_folders({"XDG_CACHE_HOME": str(tmp_path / "x")}, home)[0].path == (
        tmp_path / "x" / "huggingface" / "hub"
    )


def test_only_folders_with_a_gguf_not_known_and_not_declined_are_offered(tmp_path: Path) -> None:
    from app.model_folders import OtherAppFolder

    with_model = tmp_path / "a" / "deep" / "er"
    with_model.mkdir(parents=True)
    (with_model / "m.gguf").write_bytes(b"GGUF")
    empty = tmp_path / "b"
    empty.mkdir()
    (empty / ".hidden").mkdir()
    (empty / ".hidden" / "x.gguf").write_bytes(b"GGUF")  # hidden folders are not walked
    candidates = [
        OtherAppFolder("A", tmp_path / "a"),
        OtherAppFolder("B", empty),
        OtherAppFolder("C", tmp_path / "missing"),
    ]
    assert has_gguf(tmp_path / "a") and not has_gguf(empty)
    declined_file = tmp_path / "declined.json"
    assert [f.app for f in offered_folders([], declined_file, candidates)] == ["A"]
    assert offered_folders([tmp_path / "a"], declined_file, candidates) == []  # already in the library
    decline(declined_file, [tmp_path / "a"])
    decline(declined_file, [tmp_path / "a"])  # once
    assert declined(declined_file) == [tmp_path / "a"]
    assert offered_folders([], declined_file, candidates) == []
    declined_file.write_text("{not json")
    assert declined(declined_file) == []


def test_the_shipped_suggestions_are_well_formed() -> None:
    models = load_curated()
    assert curated_path().is_file()
    assert len(models) >= 5
    assert [m.size for m in models] == sorted(m.size for m in models)
    for m in models:
        assert m.file.lower().endswith(".gguf") and "q4_k_m" in m.file.lower()
        assert m.license and m.label and m.params


def test_bad_suggestions_are_left_out_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    good = {"label": "L", "repo": "a/b", "file": "m.gguf", "size": 5, "license": "mit"}
    path = tmp_path / "c.json"
    path.write_text(
        json.dumps(
            {
                "models": [
                    good,
                    {**good, "repo": "../x"},
                    {**good, "file": "../m.gguf"},
                    {**good, "size": -1},
                    {"label": "no repo"},
                ]
            }
        )
    )
    with caplog.at_level(logging.WARNING):
        assert [m.repo for m in load_curated(path)] == ["a/b"]
    assert len([r for r in caplog.records if "left out" in r.getMessage()]) == 4
    path.write_text("not json")
    with caplog.at_level(logging.WARNING):
        assert load_curated(path) == []
    assert load_curated(tmp_path / "missing.json") == []
