"""``glassbox --self-test``: passes on an installed app, fails with one line when a part is missing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.gui.selftest import run_self_test
from app.paths import Paths

ROOT = Path(__file__).resolve().parents[3]


def test_missing_starter_model_fails_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import engine.starter

    monkeypatch.setattr(engine.starter, "install_starter_model", lambda _folder: None)
    assert run_self_test(Paths.resolve(tmp_path)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("glassbox: self-test failed: starter model:")
    assert not any(tmp_path.iterdir())  # the given home is never touched


@pytest.mark.model
@pytest.mark.slow
def test_self_test_passes_end_to_end(tmp_path: Path, starter_model: Path) -> None:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "app", "--self-test", "--home", str(tmp_path / "home")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert "self-test passed" in result.stdout
    assert "generate 5 tokens" in result.stdout
    assert not (tmp_path / "home").exists()
    # The first step names the CPU code llama.cpp ran on.
    assert "tokens on CPU code " in result.stdout


@pytest.mark.model
@pytest.mark.slow
def test_self_test_json_names_the_cpu_variant_and_the_build(tmp_path: Path, starter_model: Path) -> None:
    import json

    from engine.cpu_backend import variant_files

    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "app", "--self-test", "--json", "--home", str(tmp_path / "home")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["passed"] is True and report["error"] is None
    # the model, the documents, an MCP server and the window
    assert [step["ok"] for step in report["steps"]] == [True, True, True, True]
    backend = report["cpu_backend"]
    files = variant_files()
    if files:  # the portable build: the variant it ran is one that is installed
        assert backend["build"] == "variants"
        assert files[backend["variant"]].name == backend["file"]
        assert report["llama_build"] is not None and "-DGGML_NATIVE=OFF" in report["llama_build"]["cmake_args"]
    else:
        assert backend["build"] == "single"
    assert backend["features"] and backend["label"]


def test_json_before_a_subcommand_is_refused(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "app", "--json", "models", "list", "--home", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 2
    assert "--json before a subcommand goes with --self-test only" in result.stderr


@pytest.mark.model
@pytest.mark.slow
def test_self_test_explains_a_cpu_crash_that_repeats(tmp_path: Path, starter_model: Path) -> None:
    # Every CPU variant "crashes" with SIGILL on the first token, as wrong CPU code would.
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(ROOT), "GLASSBOX_TEST_SIGILL": "generate"}
    result = subprocess.run(
        [sys.executable, "-m", "app", "--self-test", "--home", str(tmp_path / "home")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("glassbox: self-test failed: load the starter model and generate 5 tokens: ")
    assert "(killed by SIGILL): llama.cpp was built for CPU instructions this machine cannot run (" in lines[0]
