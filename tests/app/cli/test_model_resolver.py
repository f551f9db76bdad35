"""One model resolver for every command: added folders, the download layout, labels, embedders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "engine"))
from tiny_models import write_tiny_llama_gguf

from app.cli.commands.model_resolver import open_library, resolve_model
from app.paths import Paths
from engine.errors import ModelFileError


@pytest.fixture
def library(paths: Paths, tmp_path: Path) -> dict[str, Path]:
    """A model in the download layout (owner/repo/file), one in an added folder, an embedder."""
    downloaded = paths.models / "acme" / "tiny-GGUF" / "tiny-Q8_0.gguf"
    downloaded.parent.mkdir(parents=True)
    write_tiny_llama_gguf(downloaded)
    added = tmp_path / "lmstudio" / "publisher" / "repo"
    added.mkdir(parents=True)
    elsewhere = write_tiny_llama_gguf(added / "elsewhere-F32.gguf", seed=3)
    embedder = write_tiny_llama_gguf(added / "minilm-F32.gguf", arch="bert", seed=4)
    open_library(paths).add_folder(tmp_path / "lmstudio")
    return {"downloaded": downloaded, "elsewhere": elsewhere, "embedder": embedder}


def test_names_in_every_layout_resolve(paths: Paths, library: dict[str, Path]) -> None:
    assert resolve_model("acme/tiny-GGUF/tiny-Q8_0.gguf", paths) == library["downloaded"]
    assert resolve_model("acme/tiny-GGUF", paths) == library["downloaded"]  # the one model in that repo
    assert resolve_model("tiny-Q8_0", paths) == library["downloaded"]
    assert resolve_model("elsewhere-F32.gguf", paths) == library["elsewhere"]  # an added folder
    assert resolve_model("elsewhere-F32", paths) == library["elsewhere"]
    assert resolve_model(str(library["elsewhere"]), paths) == library["elsewhere"]
    open_library(paths).record_provenance(library["elsewhere"], label="My Llama")
    assert resolve_model("my llama", paths) == library["elsewhere"]


def test_misses_and_embedders_are_one_line_errors(paths: Paths, library: dict[str, Path]) -> None:
    with pytest.raises(ModelFileError, match="no model by that name in the library"):
        resolve_model("nothing-like-it", paths)
    with pytest.raises(ModelFileError, match="no such file"):
        resolve_model("/no/such/model.gguf", paths)
    assert resolve_model("minilm-F32", paths) == library["embedder"]  # fine for models info, quantize
    with pytest.raises(ModelFileError, match=r"an embedding model \(bert\)"):
        resolve_model("minilm-F32", paths, for_chat=True)
    with pytest.raises(ModelFileError, match=r"an embedding model \(bert\)"):
        resolve_model(str(library["embedder"]), paths, for_chat=True)


@pytest.mark.model
def test_glassbox_chat_finds_a_model_in_an_added_folder(paths: Paths, library: dict[str, Path]) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    home = str(paths.data.parent)
    base = [
        sys.executable,
        "-m",
        "app",
        "chat",
        "--home",
        home,
        "--max-tokens",
        "3",
        "--temperature",
        "0",
        "--n-ctx",
        "256",
        "--prompt",
        "hi",
        "--json",
    ]
    ok = subprocess.run([*base, "--model", "elsewhere-F32"], capture_output=True, text=True, timeout=180, env=env)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["completion_tokens"] > 0
    refused = subprocess.run([*base, "--model", "minilm-F32"], capture_output=True, text=True, timeout=180, env=env)
    assert refused.returncode == 1
    assert "an embedding model (bert)" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_models_list_marks_the_embedder(paths: Paths, library: dict[str, Path]) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    home = str(paths.data.parent)
    listed = subprocess.run(
        [sys.executable, "-m", "app", "models", "list", "--home", home, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert listed.returncode == 0, listed.stderr
    kinds = {Path(m["path"]).name: m["kind"] for m in json.loads(listed.stdout)["models"]}
    assert kinds == {"tiny-Q8_0.gguf": "chat", "elsewhere-F32.gguf": "chat", "minilm-F32.gguf": "embedding"}
    table = subprocess.run(
        [sys.executable, "-m", "app", "models", "list", "--home", home],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    row = next(line for line in table.stdout.splitlines() if line.startswith("minilm-F32.gguf"))
    assert " embedder " in row
