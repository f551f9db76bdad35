"""``glassbox chat --speculative off|lookup|MODEL_PATH`` from outside, with its ``--json`` counters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.model

QUOTE = "Repeat after me: the cat sat on the mat, the dog sat on the log, the cat sat on the mat, the dog"


def glassbox(*args: str, home: Path, timeout: float = 180, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args, "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
    )


def _chat(starter_model: Path, home: Path, *extra: str, **env: str) -> subprocess.CompletedProcess[str]:
    return glassbox(
        "chat",
        "--model",
        str(starter_model),
        "--prompt",
        QUOTE,
        "--temperature",
        "0",
        "--max-tokens",
        "40",
        "--n-ctx",
        "512",
        "--no-kv-cache",
        "--json",
        *extra,
        home=home,
        **env,
    )


def test_speculative_modes_give_counters_and_the_draft_model_drafts(starter_model: Path, tmp_path: Path) -> None:
    off = _chat(starter_model, tmp_path, "--speculative", "off")
    assert off.returncode == 0, off.stderr
    doc_off = json.loads(off.stdout)
    assert doc_off["draft_tokens"] == doc_off["accepted_tokens"] == 0
    default = json.loads(_chat(starter_model, tmp_path).stdout)  # lookup is the default
    assert {"draft_tokens", "accepted_tokens"} <= set(default)
    assert 0 <= default["accepted_tokens"] <= default["draft_tokens"]
    # The starter as its own draft: as costly as the target, so the policy never drafts with it...
    costly = _chat(starter_model, tmp_path, "--speculative", str(starter_model))
    assert costly.returncode == 0, costly.stderr
    assert json.loads(costly.stdout)["draft_tokens"] == 0
    # ...unless told to: then it drafts, and agrees with itself (the replies may still part at a
    # near tie: llama.cpp's arithmetic depends on the batch's shape, see engine.inference.speculative).
    drafted = _chat(starter_model, tmp_path, "--speculative", str(starter_model), GLASSBOX_TEST_DRAFT_FIXED="4")
    assert drafted.returncode == 0, drafted.stderr
    doc = json.loads(drafted.stdout)
    assert doc["draft_tokens"] > 0 and doc["accepted_tokens"] > doc["draft_tokens"] * 0.8
    assert doc["completion_tokens"] > 0


def test_a_missing_draft_model_is_one_line(starter_model: Path, tmp_path: Path) -> None:
    result = _chat(starter_model, tmp_path, "--speculative", str(tmp_path / "nope.gguf"))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "nope.gguf" in lines[0] and lines[0].startswith("glassbox: error:")


def test_speculative_with_an_endpoint_is_a_usage_error(tmp_path: Path) -> None:
    result = glassbox("chat", "--endpoint", "somewhere", "--prompt", "hi", "--speculative", "lookup", home=tmp_path)
    assert result.returncode == 2
    assert "--speculative applies to local models" in result.stderr


def test_without_the_flag_the_settings_decide(starter_model: Path, tmp_path: Path) -> None:
    from app.paths import Paths
    from app.settings import Settings, save_settings

    paths = Paths.resolve(tmp_path).ensure()
    save_settings(Settings(speculative="off"), paths.settings_file)
    off = _chat(starter_model, tmp_path)
    assert off.returncode == 0, off.stderr
    assert json.loads(off.stdout)["draft_tokens"] == 0
    # A draft model set for this model in Settings is the one loaded (a missing one says so)...
    missing = tmp_path / "gone-draft.gguf"
    save_settings(Settings(draft_models={str(starter_model.resolve()): str(missing)}), paths.settings_file)
    refused = _chat(starter_model, tmp_path)
    assert refused.returncode == 1 and "gone-draft.gguf" in refused.stderr
    # ...and the flag overrides the settings.
    assert _chat(starter_model, tmp_path, "--speculative", "lookup").returncode == 0
