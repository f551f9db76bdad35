"""``glassbox chat --lora FILE --compare-base`` from outside: after the reply, the line the window's
inspector shows, where the adapter changed the greedy reply; refused without an adapter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.inference.adapters import LoraAdapter
from engine.inference.runtime import GenerationParams, LoadParams
from engine.inference.session import ChatSession
from tests.engine.lora_fixtures import write_gguf_lora

QUESTION = "Write one sentence about the sea."


def glassbox(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args, "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


@pytest.mark.model
def test_compare_base_prints_where_the_adapter_changed_the_reply(starter_model: Path, tmp_path: Path) -> None:
    adapter = write_gguf_lora(tmp_path / "starter-lora.gguf", starter_model, strength=1.0)
    result = glassbox(
        "chat", "--model", str(starter_model), "--lora", f"{adapter}:1", "--compare-base", "--prompt", QUESTION,
        "--temperature", "0", "--max-tokens", "24", "--no-kv-cache", home=tmp_path / "home",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("compare with base: ")]
    # The same comparison made in this process, on the engine directly.
    params = GenerationParams(max_tokens=24, temperature=0.0)
    with ChatSession(LoadParams(model_path=starter_model, n_ctx=4096)) as session:
        session.set_adapters([LoraAdapter(adapter, 1.0)])
        comparison = session.compare_base([], QUESTION, params)
    assert comparison.divergence is not None
    assert lines[0] == f"compare with base: {comparison.summary()}"
    assert "the adapter chose" in lines[0] and "base p=" in lines[0]


def test_compare_base_needs_an_adapter(tmp_path: Path) -> None:
    result = glassbox("chat", "--model", "starter", "--compare-base", "--prompt", "hi", home=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "glassbox: error: --compare-base compares the --lora adapters with the base model: give --lora FILE[:SCALE]"
    )


def test_compare_base_is_not_for_a_reply_with_tools_or_documents(tmp_path: Path) -> None:
    result = glassbox(
        "chat", "--model", "starter", "--lora", "a.gguf", "--compare-base", "--kb", "notes", "--prompt", "hi",
        home=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2
    assert "not with --json, --tools or --kb" in result.stderr
