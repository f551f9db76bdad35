"""Discover's LoRA adapter search against the loopback fake Hub (issue 26): the toggle beside the
search lists adapter repositories with the base each adapts, a repository's files say which chat
model of the library each fits (headers read before download), and Download puts the adapter in
the library, listed as an adapter with its base and never offered for chat."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "engine"))
from hub_server import FakeHub
from lora_fixtures import write_gguf_lora
from tiny_models import write_tiny_llama_gguf

from app.gui.discover_panel import REPO_ROLE
from app.paths import Paths

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]

LLAMA_REPO = "acme/tiny-pirate-lora-GGUF"
GEMMA_REPO = "acme/gemma-3-270m-style-lora-GGUF"


def test_adapters_are_found_matched_and_downloaded_into_the_library(
    qtbot: Any, open_panel: Any, monkeypatch: pytest.MonkeyPatch, paths: Paths, starter_model: Path, tmp_path: Path
) -> None:
    tiny = write_tiny_llama_gguf(paths.models / "tiny-chat.gguf", n_layer=2)
    pirate = write_gguf_lora(tmp_path / "pirate-lora.gguf", tiny)  # its header names no base: its tags do
    style = write_gguf_lora(tmp_path / "style-lora.gguf", starter_model)
    with FakeHub() as hub:
        hub.add_repo(
            LLAMA_REPO,
            {"pirate-lora-f32.gguf": pirate.read_bytes()},
            tags=["lora", "base_model:adapter:acme/tiny-chat"],
            downloads=20,
        )
        hub.add_repo(
            GEMMA_REPO,
            {"style-lora-f32.gguf": style.read_bytes()},
            tags=["lora", "base_model:adapter:google/gemma-3-270m"],
            downloads=10,
        )
        hub.add_repo("acme/tiny-GGUF", {"tiny-Q8_0.gguf": tiny.read_bytes()}, downloads=99)  # a model
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        adapter, panel = open_panel()
        qtbot.waitUntil(lambda: any(e.kind == "chat" for e in adapter.library.entries), timeout=15000)
        d = panel.discover

        d.adapters_toggle.click()  # an empty search: the most downloaded adapters
        assert d.search.placeholderText().startswith("Search Hugging Face for GGUF LoRA adapters")
        qtbot.waitUntil(lambda: d.results.count() == 2 and d.results.item(0).data(REPO_ROLE) is not None, timeout=15000)
        assert d.results_title.text() == "LORA ADAPTERS"
        rows = [d.results.item(i).text() for i in range(2)]
        assert rows[0].startswith(LLAMA_REPO) and "for acme/tiny-chat" in rows[0]
        assert rows[1].startswith(GEMMA_REPO) and "for google/gemma-3-270m" in rows[1]

        d.results.setCurrentRow(1)
        qtbot.waitUntil(lambda: d.files.rowCount() == 1 and d.files.item(0, 3) is not None, timeout=15000)
        assert d.files.horizontalHeaderItem(3).text() == "Fits in your library"
        assert d.files.item(0, 1).text() == "gemma3 · rank 4"
        assert d.files.item(0, 3).text() == "no gemma3 model in your library fits (made for google/gemma-3-270m)"

        d.results.setCurrentRow(0)
        qtbot.waitUntil(lambda: d.files.rowCount() == 1 and "pirate" in d.files.item(0, 0).text(), timeout=15000)
        qtbot.waitUntil(lambda: d.files.item(0, 3) is not None, timeout=15000)
        assert d.files.item(0, 3).text() == "● fits tiny-chat"
        assert "1 LoRA adapter" in d.repo_label.text()
        d.files.selectRow(0)
        d.download_button.click()
        qtbot.waitUntil(lambda: d.queue.rowCount() == 1 and "done" in d.queue.item(0, 3).text(), timeout=30000)

        def downloaded() -> Any:
            return next((e for e in adapter.library.entries if e.name == "pirate-lora-f32.gguf"), None)

        qtbot.waitUntil(lambda: downloaded() is not None, timeout=15000)
    entry = downloaded()
    assert entry.path.read_bytes() == pirate.read_bytes()
    assert entry.path.parent == paths.models / "acme" / "tiny-pirate-lora-GGUF"
    assert entry.kind == "adapter" and entry.base_model == "acme/tiny-chat"  # recorded from the repo's tag
    assert entry.chat_problem() is not None  # the model bar offers only entries without one
    names = [panel.library.item(r, 0).text() for r in range(panel.library.rowCount())]
    row = names.index("pirate-lora-f32")
    assert panel.library.item(row, 1).text() == "llama (LoRA adapter for acme/tiny-chat)"
    assert panel.library.item(row, 6).text() == "not a chat model (LoRA adapter)"

    d.adapters_toggle.click()  # back to models: the suggestions again
    assert d.showing_suggestions() and d.search.placeholderText().startswith("Search Hugging Face for GGUF models")
