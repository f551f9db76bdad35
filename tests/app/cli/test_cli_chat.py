"""``glassbox chat`` and ``glassbox bench`` from outside, as a user runs them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.model


def glassbox(
    *args: str, home: Path, stdin: str | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args, "--home", str(home)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


STATS_FIELDS = {
    "n_ctx",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "context_used",
    "evicted_messages",
    "ttft_ms",
    "prefill_tps",
    "decode_tps",
    "kv_cache_bytes",
    "model_bytes",
    "bandwidth_gbps",
}


def test_chat_prompt_json_has_reply_and_every_stats_field(starter_model: Path, tmp_path: Path) -> None:
    args = (
        "chat",
        "--model",
        str(starter_model),
        "--prompt",
        "The capital of France is",
        "--temperature",
        "0",
        "--max-tokens",
        "12",
        "--n-ctx",
        "512",
        "--json",
    )
    first = glassbox(*args, home=tmp_path)
    assert first.returncode == 0, first.stderr
    doc = json.loads(first.stdout)
    assert doc["text"].strip()
    assert doc["finish_reason"] in ("stop", "length")
    assert set(doc) >= STATS_FIELDS
    assert doc["sources"] == []
    assert doc["completion_tokens"] > 0
    second = glassbox(*args, home=tmp_path)
    assert json.loads(second.stdout)["text"] == doc["text"], "greedy replies must be deterministic"


def test_chat_reads_turns_from_stdin_as_one_conversation(starter_model: Path, tmp_path: Path) -> None:
    result = glassbox(
        "chat",
        "--model",
        str(starter_model),
        "--temperature",
        "0",
        "--max-tokens",
        "8",
        "--n-ctx",
        "512",
        "--json",
        home=tmp_path,
        stdin="Hello there\nAnd again\n",
    )
    assert result.returncode == 0, result.stderr
    turns = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(turns) == 2
    assert turns[1]["cached_tokens"] >= turns[0]["prompt_tokens"]


def test_chat_plain_output_streams_text(starter_model: Path, tmp_path: Path) -> None:
    result = glassbox(
        "chat",
        "--model",
        str(starter_model),
        "--prompt",
        "One, two, three,",
        "--temperature",
        "0",
        "--max-tokens",
        "6",
        home=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "empty"),
        (b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 12\n", "LFS pointer"),
        (b"<!DOCTYPE html><html><body>Not found</body></html>", "HTML"),
    ],
)
def test_bad_model_file_is_one_line_error(tmp_path: Path, content: bytes, reason: str) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(content)
    result = glassbox("chat", "--model", str(bad), "--prompt", "hi", home=tmp_path)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"glassbox: error: {bad}:")
    assert reason.lower() in lines[0].lower()
    assert "Traceback" not in result.stderr


def test_missing_model_is_one_line_error(tmp_path: Path) -> None:
    result = glassbox("chat", "--model", str(tmp_path / "nope.gguf"), "--prompt", "hi", home=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip() == f"glassbox: error: {tmp_path / 'nope.gguf'}: no such file"


def test_bad_usage_exits_2(tmp_path: Path) -> None:
    result = glassbox("chat", "--prompt", "hi", home=tmp_path)
    assert result.returncode == 2
    assert "glassbox: error:" in result.stderr
    assert "Traceback" not in result.stderr


def test_worker_crash_is_reported_as_an_error_not_a_signal(starter_model: Path, tmp_path: Path) -> None:
    # Kill the inference worker (a child of glassbox) while it generates.
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app",
            "chat",
            "--model",
            str(starter_model),
            "--home",
            str(tmp_path),
            "--temperature",
            "0",
            "--max-tokens",
            "400",
            "--n-ctx",
            "512",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("Tell me a very long story about a dragon.\n")
    proc.stdin.flush()
    proc.stdout.read(1)  # the first streamed character: generation is under way
    import psutil

    children = psutil.Process(proc.pid).children(recursive=True)
    workers = [c for c in children if "spawn_main" in " ".join(c.cmdline())]
    assert workers, [c.cmdline() for c in children]
    for worker in workers:
        worker.send_signal(signal.SIGKILL)
    proc.stdin.close()
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    stderr = proc.stderr.read() if proc.stderr else ""
    assert proc.returncode == 1, stderr
    assert "glassbox: error: the inference worker crashed" in stderr
    assert "SIGKILL" in stderr
    assert "Traceback" not in stderr


def test_bench_prints_both_sides_and_ratios(starter_model: Path, tmp_path: Path) -> None:
    result = glassbox(
        "bench",
        "--model",
        str(starter_model),
        "--rounds",
        "1",
        "--max-tokens",
        "8",
        "--n-ctx",
        "512",
        "--json",
        home=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["engine"]["prefill_tps"] > 0 and doc["raw"]["prefill_tps"] > 0
    assert doc["prefill_ratio"] > 0 and doc["decode_ratio"] > 0
    assert len(doc["runs"]) == 2
