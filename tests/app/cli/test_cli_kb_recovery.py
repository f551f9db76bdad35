"""ROBUSTNESS P5 on the command line: ``glassbox kb`` says in one line that the document index was
damaged, where it went, and answers from the rebuilt index."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from app.cli.main import main

pytestmark = pytest.mark.model


def test_kb_query_after_the_index_was_damaged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "bees.txt").write_text("Honey bees dance to tell their hive where the flowers are.\n", encoding="utf-8")
    (docs / "trains.txt").write_text("The night train leaves the station at eleven o'clock.\n", encoding="utf-8")
    assert main(["kb", "create", "notes", "--home", str(home)]) == 0
    assert main(["kb", "add", "notes", str(docs), "--home", str(home)]) == 0
    capsys.readouterr()
    header = next((home / "data" / "knowledge" / "chroma").glob("*/header.bin"))
    header.write_bytes(os.urandom(100))

    code = main(["kb", "query", "notes", "when does the night train leave", "--k", "1", "--json", "--home", str(home)])
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    match = re.fullmatch(
        r"glassbox: the document index was damaged \(chroma index unreadable: \S+/header\.bin is not a valid HNSW "
        r"header\); it was moved to (\S+) and is being rebuilt",
        lines[0],
    )
    assert match, lines[0]
    assert Path(match[1]).name.startswith("chroma.damaged-") and Path(match[1]).is_dir()
    passage = json.loads(out)["passages"][0]
    assert Path(passage["path"]).name == "trains.txt"
    assert passage["dense_score"] is not None

    # Rebuilt and recorded as good: the next command says nothing.
    assert main(["kb", "list", "--home", str(home)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert "notes: 2 documents, 2 chunks" in out
