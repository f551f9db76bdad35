"""``glassbox kb add`` is never silent while it indexes (issue 15): a progress bar on a terminal,
a line every few seconds elsewhere, one line per file with ``--verbose``, nothing extra with
``--json``."""

from __future__ import annotations

import io
import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.cli.commands.kb import _Progress
from app.cli.main import main
from rag.ingest import IngestProgress


def _docs(folder: Path) -> Path:
    folder.mkdir()
    (folder / "kiwi.txt").write_text("The kiwi is a flightless bird that lives in New Zealand.\n", encoding="utf-8")
    (folder / "owl.md").write_text("# Owls\n\nOwls turn their heads far around to look behind them.\n")
    (folder / "blob.bin").write_bytes(b"\x7fELF" + bytes(300))
    return folder


def test_the_terminal_bar_overwrites_itself_and_ends_with_a_newline(monkeypatch: pytest.MonkeyPatch) -> None:
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    progress = _Progress(terminal=True, verbose=False)
    progress(IngestProgress(0, 4, 0, None, None, "scanning"))
    time.sleep(0.11)
    progress(IngestProgress(2, 4, 7, "/d/owl.md", 30.0, "indexing"))
    progress(IngestProgress(4, 4, 12, None, 0.0, "done"))
    text = err.getvalue()
    frames = text.split("\r")[1:]
    assert len(frames) == 3
    assert frames[1].startswith("[############------------] indexing 2/4 files, 7 chunks, about 30 s left owl.md")
    assert frames[2].startswith("[########################] done 4/4 files, 12 chunks")
    assert text.endswith("\n") and text.count("\n") == 1


def test_off_a_terminal_a_plain_line_every_few_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(_Progress, "QUIET_LINE_S", 0.05)
    progress = _Progress(terminal=False, verbose=False)
    progress(IngestProgress(0, 211, 0, None, None, "scanning"))
    progress(IngestProgress(1, 211, 3, "/d/a.pdf", None, "indexing"))  # within the interval: dropped
    time.sleep(0.06)
    progress(IngestProgress(40, 211, 120, "/d/b.pdf", 400.0, "indexing"))
    progress(IngestProgress(211, 211, 700, None, 0.0, "done"))  # the summary says it on stdout
    lines = err.getvalue().splitlines()
    assert len(lines) == 2
    assert "\r" not in err.getvalue()
    assert lines[1].startswith("glassbox: indexing 40/211 files, 120 chunks, about 7 min left b.pdf (")


@pytest.mark.model
def test_verbose_lists_each_file_and_json_adds_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    docs = _docs(tmp_path / "docs")
    assert main(["kb", "create", "notes", "--home", str(home)]) == 0
    capsys.readouterr()
    assert main(["kb", "add", "notes", str(docs), "--verbose", "--home", str(home)]) == 0
    out, _err = capsys.readouterr()
    lines = out.splitlines()
    assert f"  indexed: {docs / 'kiwi.txt'}" in lines
    assert f"  indexed: {docs / 'owl.md'}" in lines
    assert any(line.startswith("  skipped: binary file") and line.endswith("blob.bin") for line in lines), lines
    assert lines[-1].startswith("notes: 2 indexed")

    (docs / "kiwi.txt").write_text("Kiwi lay very large eggs for their size.\n", encoding="utf-8")
    assert main(["kb", "add", "notes", str(docs), "--verbose", "--json", "--home", str(home)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert json.loads(out)["indexed"] == 1  # one JSON document, nothing else


@pytest.mark.model
@pytest.mark.slow
def test_a_real_terminal_shows_the_bar(tmp_path: Path) -> None:
    home = tmp_path / "home"
    docs = _docs(tmp_path / "docs")
    assert main(["kb", "create", "notes", "--home", str(home)]) == 0
    leader, follower = pty.openpty()
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "app", "kb", "add", "notes", str(docs), "--home", str(home)],
            stdout=subprocess.PIPE, stderr=follower, env={**os.environ, "COLUMNS": "120"},
        )  # fmt: skip
        os.close(follower)
        follower = -1
        seen = b""
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(leader, 4096)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                seen += chunk
            elif process.poll() is not None:
                break
        out, _ = process.communicate(timeout=60)
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    assert process.returncode == 0
    text = seen.decode(errors="replace")
    assert "\r[" in text and "] done 3/3 files" in text, text[-2000:]
    assert out.decode().splitlines()[-1].startswith("notes: 2 indexed")
