"""``glassbox chat --conversation ID`` and ``--no-kv-cache`` from outside: conversations saved to the
history, continued in a new process from the KV cache saved with them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.model

DOCUMENT = " ".join(f"Item {i}: the pump on line {i % 7} was serviced at {i % 24:02d}:00." for i in range(30))


def glassbox(*args: str, home: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args, "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def chat(model: Path, home: Path, prompt: str, *extra: str) -> dict[str, object]:
    result = glassbox(
        "chat",
        "--model",
        str(model),
        "--prompt",
        prompt,
        "--temperature",
        "0",
        "--max-tokens",
        "10",
        "--n-ctx",
        "1024",
        "--json",
        *extra,
        home=home,
    )
    assert result.returncode == 0, result.stderr
    doc: dict[str, object] = json.loads(result.stdout)
    return doc


def test_a_conversation_is_saved_and_continued_in_a_new_process_from_its_kv_cache(
    starter_model: Path, tmp_path: Path
) -> None:
    from engine.history import HistoryStore

    first = chat(starter_model, tmp_path, f"Read this log. {DOCUMENT}")
    conversation = first["conversation_id"]
    assert isinstance(conversation, int)
    assert first["kv_saved_bytes"] > 0 and first["kv_restored_tokens"] == 0  # type: ignore[operator]
    cache = tmp_path / "data" / "kv_cache"
    assert len(list(cache.glob("*.kv"))) == 1

    # The same continuation twice, from the same state: from the saved cache, and cold (a copy).
    shutil.copytree(tmp_path, tmp_path.parent / "cold-home")
    warm = chat(starter_model, tmp_path, "Which line was serviced at 03:00?", "--conversation", str(conversation))
    assert warm["conversation_id"] == conversation
    assert warm["kv_restored_tokens"] >= first["prompt_tokens"] - 1  # type: ignore[operator]
    assert warm["kv_restore_ms"] > 0  # type: ignore[operator]
    assert warm["prompt_tokens"] - warm["cached_tokens"] < 64  # type: ignore[operator]

    with HistoryStore(tmp_path / "data" / "history.sqlite3") as store:
        thread = store.thread(conversation)
        assert [(m.role, m.state) for m in thread] == [("user", "complete"), ("assistant", "complete")] * 2
        assert thread[1].content == first["text"] and thread[3].content == warm["text"]
        assert thread[3].stats is not None and thread[3].stats["kv_restored_tokens"] == warm["kv_restored_tokens"]
    cold = chat(
        starter_model,
        tmp_path.parent / "cold-home",
        "Which line was serviced at 03:00?",
        "--conversation",
        str(conversation),
        "--no-kv-cache",
    )
    assert cold["kv_restored_tokens"] == 0 and cold["kv_saved_bytes"] == 0 and cold["cached_tokens"] == 0
    assert cold["prompt_tokens"] == warm["prompt_tokens"]
    assert cold["text"] == warm["text"]


def test_a_new_conversation_prints_its_id_first(starter_model: Path, tmp_path: Path) -> None:
    result = glassbox(
        "chat",
        "--model",
        str(starter_model),
        "--prompt",
        "Hello",
        "--temperature",
        "0",
        "--max-tokens",
        "4",
        "--n-ctx",
        "512",
        home=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines()[0] == "[conversation 1: continue it with --conversation 1]"


def test_an_unknown_conversation_is_a_one_line_error(starter_model: Path, tmp_path: Path) -> None:
    result = glassbox("chat", "--model", str(starter_model), "--prompt", "Hello", "--conversation", "42", home=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().endswith("no conversation with id 42")
    assert len(result.stderr.strip().splitlines()) == 1
