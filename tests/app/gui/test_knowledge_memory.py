"""The GUI process stays small when the Knowledge page is used (issue 15: it grew from ~152 MB to
~707 MB with torch, the embedder and Chroma in-process): they live in the knowledge process now.

The window runs in a fresh interpreter, so that no other test's imports count.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from knowledge_memory_probe import APP_BUDGET_MB, GUI_BUDGET_MB, run_probe

pytestmark = [pytest.mark.gui, pytest.mark.model, pytest.mark.slow]


def test_the_gui_process_has_no_torch_after_the_knowledge_page(tmp_path: Path, embedder_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "otters.md").write_text("Sea otters hold hands while they sleep so they do not drift apart.\n")
    result = run_probe(tmp_path / "home", docs, embedder_path, idle_s=3.0)
    print(result)  # the numbers, for the record
    assert result["indexed"] == 1
    assert result["passages"] >= 1
    assert result["cited"] == [str(docs / "otters.md")]
    assert result["heavy"] == []
    assert result["after_mb"] < GUI_BUDGET_MB
    # The knowledge process holds what the GUI no longer does...
    assert result["child_mb"] is not None and result["child_mb"] > result["after_mb"] - result["before_mb"]
    assert result["in_use_mb"] > result["after_mb"] + result["child_mb"] * 0.9
    # ... and once idle it stops, with its parser child (multiprocessing's resource tracker stays).
    assert len(result["idle_processes"]) <= 2
    assert result["in_use_processes"] >= len(result["idle_processes"]) + 2
    assert result["idle_mb"] < APP_BUDGET_MB
