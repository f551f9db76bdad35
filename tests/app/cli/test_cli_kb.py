"""``glassbox kb ...`` as a user runs it.

Loading torch and the embedding model costs a subprocess about 12 CPU seconds, so one query runs as
a real subprocess and the other steps call the same entry point in-process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli.main import main

pytestmark = pytest.mark.model


def glassbox(*args: str, home: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args, "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, result.stderr
    return result


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Runs the CLI in this process (for steps that load no model)."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_kb_lifecycle_with_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "lighthouse.md").write_text(
        "# Lighthouses\n\nThe Pharos of Alexandria was one of the Seven Wonders of the Ancient World.\n",
        encoding="utf-8",
    )
    (docs / "kiwi.txt").write_text("The kiwi is a flightless bird that lives in New Zealand.\n", encoding="utf-8")
    (docs / "blob.bin").write_bytes(b"\x7fELF" + bytes(300))

    code, out, err = _run(capsys, "kb", "create", "notes", "--json", "--home", str(home))
    assert code == 0, err
    created = json.loads(out)
    assert created["name"] == "notes"
    assert created["dimension"] == 384

    code, out, err = _run(capsys, "kb", "add", "notes", str(docs), "--json", "--home", str(home))
    assert code == 0, err
    added = json.loads(out)
    assert (added["indexed"], added["skipped"], added["chunks_added"]) == (2, 1, 2)
    assert [Path(f["path"]).name for f in added["failures"]] == ["blob.bin"]

    found = json.loads(
        _ok(glassbox("kb", "query", "notes", "Which bird cannot fly?", "--k", "2", "--json", home=home)).stdout
    )
    top = found["passages"][0]
    assert Path(top["path"]).name == "kiwi.txt"
    assert {"dense_score", "bm25_score", "fused_score", "page", "heading", "start", "end"} <= set(top)

    code, out, _ = _run(capsys, "kb", "add", "notes", str(docs), "--home", str(home))
    assert code == 0
    assert out.strip().splitlines()[-1].startswith("notes: 0 indexed, 3 unchanged")

    code, out, _ = _run(capsys, "kb", "list", "notes", "--json", "--home", str(home))
    assert {Path(d["path"]).name: d["state"] for d in json.loads(out)["documents"]} == {
        "blob.bin": "skipped",
        "kiwi.txt": "indexed",
        "lighthouse.md": "indexed",
    }
    code, out, _ = _run(capsys, "kb", "remove", "notes", str(docs / "kiwi.txt"), "--json", "--home", str(home))
    assert json.loads(out) == {"kb": "notes", "removed": 1}
    code, out, _ = _run(capsys, "kb", "list", "--json", "--home", str(home))
    assert [(s["name"], s["embedded"]) for s in json.loads(out)] == [("notes", 1)]
    code, out, _ = _run(capsys, "kb", "drop", "notes", "--home", str(home))
    assert (code, out) == (0, "dropped notes\n")
    code, out, _ = _run(capsys, "kb", "list", "--json", "--home", str(home))
    assert json.loads(out) == []


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("kb", "query", "missing", "anything"), 1, "glassbox: error: missing: no such knowledge base"),
        (("kb", "add", "missing", "."), 1, "glassbox: error: missing: no such knowledge base"),
        (
            ("kb", "list", "--chroma-url", "ftp://nowhere"),
            1,
            "glassbox: error: ftp://nowhere: a Chroma URL looks like http://host:port",
        ),
        (("kb", "query", "missing", "x", "--k", "0"), 2, "glassbox: error: --k must be at least 1"),
        (
            ("kb", "create", "x", "--embedder", "/no/such/model"),
            1,
            "glassbox: error: /no/such/model: not a sentence-transformers model folder (no modules.json)",
        ),
    ],
)
def test_kb_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], code: int, message: str
) -> None:
    result, out, err = _run(capsys, *args, "--home", str(tmp_path / "home"))
    assert result == code
    assert err.strip().splitlines() == [message]
    assert out == ""


def test_kb_error_from_a_subprocess_has_no_traceback(tmp_path: Path) -> None:
    result = glassbox("kb", "add", "nothing-here", str(tmp_path), home=tmp_path / "home")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == ["glassbox: error: nothing-here: no such knowledge base"]
