"""Downloads survive a restart in the GUI: unfinished ones come back as paused rows that resume
(Range request, same commit, verified file) or are discarded; quitting keeps the partial."""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "engine"))
from gui_support import transfer_buttons
from hub_server import FakeHub, random_bytes

from app.gui.discover_panel import format_progress
from app.gui.model_panel import ModelPanel
from app.gui.workers.models_worker import ModelsAdapter
from app.gui.workers.transfers import Transfer
from app.paths import Paths
from engine.hub.partials import partial_paths, read_partial_meta

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]
REPO = "acme/tiny-GGUF"
NAME = "tiny-Q4_K_M.gguf"
PAYLOAD = random_bytes(3 * 2**20 + 4321, 11)
SHA = hashlib.sha256(PAYLOAD).hexdigest()


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with FakeHub() as server:
        server.add_repo(REPO, {NAME: PAYLOAD, "README.md": b"hi"})
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def shown(button: Any) -> bool:
    return not button.isHidden()


def start_download(qtbot: Any, adapter: ModelsAdapter, panel: ModelPanel) -> Any:
    with qtbot.waitSignal(adapter.downloads.files_listed, timeout=10000):
        adapter.downloads.list_files(REPO)
    panel.files.selectRow(0)
    panel.download_button.click()
    (transfer,) = adapter.downloads.transfers.values()
    return transfer


def latest(adapter: ModelsAdapter, transfer: Transfer) -> Transfer:
    """The newest snapshot of ``transfer`` (snapshots are frozen: each change is a new one)."""
    return adapter.downloads.transfers[transfer.key]


def cdn_ranges(hub: FakeHub) -> list[str | None]:
    return [headers.get("Range") for _method, path, headers in hub.requests if path.startswith("/cdn/")]


def test_quitting_mid_download_keeps_the_partial_and_a_restart_resumes_it(
    qtbot: Any, hub: FakeHub, paths: Paths, open_panel: Any
) -> None:
    hub.faults.throttle_bps = 2 * 2**20
    old_adapter, old_panel = open_panel()
    transfer = start_download(qtbot, old_adapter, old_panel)
    qtbot.waitUntil(lambda: latest(old_adapter, transfer).done >= 2**20, timeout=15000)
    old_adapter.shutdown(wait=False)  # what the main window does when the app quits
    folder = paths.models / "acme" / "tiny-GGUF"  # the one layout, as glassbox models download writes
    final, partial, meta_file = partial_paths(folder, NAME)
    meta = read_partial_meta(folder, NAME)
    assert meta is not None, "quitting must leave the resume checkpoint"
    kept = meta["done"]
    assert 2**20 <= kept < len(PAYLOAD)
    assert partial.stat().st_size >= kept
    assert not final.exists()
    commit = hub.repos[REPO].commit
    assert meta["commit"] == commit
    old_panel.close()  # the old session's page and adapter are gone; nothing is carried over but the disk

    hub.faults.throttle_bps = 0
    _adapter, panel = open_panel()  # the next session
    qtbot.waitUntil(lambda: panel.queue.rowCount() == 1, timeout=10000)
    assert panel.queue.item(0, 0).text() == f"{NAME} ({REPO})"
    assert panel.queue.item(0, 3).text() == f"paused — {format_progress(kept, len(PAYLOAD))}"
    assert panel.queue.item(0, 3).text().endswith(" of 3.0 MiB")
    row = transfer_buttons(panel)
    assert shown(row.resume_button) and shown(row.discard_button)
    assert not shown(row.pause_button) and not shown(row.cancel_button)
    before = len(hub.requests)

    row.resume_button.click()
    assert shown(row.pause_button) and shown(row.cancel_button)  # like a fresh download
    qtbot.waitUntil(lambda: panel.queue.item(0, 3).text().startswith("done"), timeout=20000)
    assert hashlib.sha256(final.read_bytes()).hexdigest() == SHA
    assert not partial.exists() and not meta_file.exists()
    assert cdn_ranges(hub)[-1] == f"bytes={kept}-"  # resumed, not started over
    resumed = [path for _m, path, _h in hub.requests[before:] if "/resolve/" in path]
    assert resumed and all(f"/resolve/{commit}/" in path for path in resumed)
    assert not row.isEnabled()
    qtbot.waitUntil(lambda: panel.library.rowCount() == 1, timeout=10000)  # and it is in the library


def test_cancel_keeps_the_partial_with_resume_and_discard_deletes_it(
    qtbot: Any, hub: FakeHub, paths: Paths, open_panel: Any, monkeypatch: pytest.MonkeyPatch
) -> None:

    hub.faults.throttle_bps = 2 * 2**20
    adapter, panel = open_panel()
    transfer = start_download(qtbot, adapter, panel)
    qtbot.waitUntil(lambda: latest(adapter, transfer).done >= 2**19, timeout=15000)
    transfer_buttons(panel).cancel_button.click()
    qtbot.waitUntil(lambda: not latest(adapter, transfer).running, timeout=10000)
    folder = paths.models / "acme" / "tiny-GGUF"
    _, partial, meta_file = partial_paths(folder, NAME)
    assert partial.exists() and meta_file.exists()
    assert panel.queue.item(0, 3).text().startswith("stopped — ")
    row = transfer_buttons(panel)
    assert shown(row.resume_button) and shown(row.discard_button) and not shown(row.cancel_button)

    asked: list[str] = []

    def answer(_parent: Any, _title: str, text: str) -> bool:
        asked.append(text)
        return True

    monkeypatch.setattr("app.gui.discover_panel.confirm", answer)
    with qtbot.waitSignal(adapter.downloads.transfer_removed, timeout=10000):
        row.discard_button.click()
    assert asked and NAME in asked[0]
    assert not partial.exists() and not meta_file.exists()
    assert panel.queue.rowCount() == 0
    assert adapter.downloads.transfers == {}


def test_corrupt_metadata_shows_the_reason_and_can_only_be_discarded(
    qtbot: Any, paths: Paths, open_panel: Any, monkeypatch: pytest.MonkeyPatch
) -> None:

    folder = paths.models / "acme__tiny-GGUF"
    folder.mkdir(parents=True)
    _, partial, meta_file = partial_paths(folder, NAME)
    partial.write_bytes(b"x" * 5000)
    meta_file.write_text('{"format": 1, "repo": "acme/tiny-GG', encoding="utf-8")
    adapter, panel = open_panel()
    qtbot.waitUntil(lambda: panel.queue.rowCount() == 1, timeout=10000)
    assert panel.queue.item(0, 0).text() == NAME
    assert panel.queue.item(0, 3).text() == "can't resume — its resume metadata is corrupt (not JSON) (4.9 KiB on disk)"
    row = transfer_buttons(panel)
    assert not shown(row.resume_button) and shown(row.discard_button)

    monkeypatch.setattr("app.gui.discover_panel.confirm", lambda *_a: False)
    row.discard_button.click()
    assert partial.exists() and meta_file.exists() and panel.queue.rowCount() == 1

    monkeypatch.setattr("app.gui.discover_panel.confirm", lambda *_a: True)
    with qtbot.waitSignal(adapter.downloads.transfer_removed, timeout=10000):
        row.discard_button.click()
    assert not partial.exists() and not meta_file.exists()
    assert panel.queue.rowCount() == 0


def test_partials_in_an_added_folder_are_found(qtbot: Any, paths: Paths, tmp_path: Path, open_panel: Any) -> None:
    from engine.library import ModelLibrary

    other = tmp_path / "lm-studio"
    _, partial, meta_file = partial_paths(other, NAME)
    other.mkdir()
    partial.write_bytes(b"x" * 2**20)
    meta_file.write_text(
        json.dumps(
            {
                "format": 1,
                "repo": REPO,
                "filename": NAME,
                "revision": "main",
                "total": 4 * 2**30,
                "done": 2**20,
            }
        ),
        encoding="utf-8",
    )
    ModelLibrary(
        paths.models, manifest_path=paths.models / "manifest.json", folders_file=paths.config / "model_folders.json"
    ).add_folder(other)
    (other / "stray.gguf.partial").write_bytes(b"not ours")  # not Glassbox's: ignored outside its folder
    _adapter, panel = open_panel()
    qtbot.waitUntil(lambda: panel.queue.rowCount() == 1, timeout=10000)
    assert panel.queue.item(0, 3).text() == "paused — 0.0 of 4.0 GiB"
    assert panel.queue.item(0, 0).toolTip() == str(other / NAME)


def test_downloading_the_same_file_again_takes_over_its_paused_row(
    qtbot: Any, hub: FakeHub, paths: Paths, open_panel: Any
) -> None:
    """In the page's old folder (models/owner__repo/, before one layout): the partial there is resumed."""
    folder = paths.models / "acme__tiny-GGUF"
    final, partial, meta_file = partial_paths(folder, NAME)
    folder.mkdir(parents=True)
    partial.write_bytes(PAYLOAD[: 2**20])
    meta_file.write_text(
        json.dumps(
            {
                "format": 1,
                "repo": REPO,
                "filename": NAME,
                "revision": hub.repos[REPO].commit,
                "total": len(PAYLOAD),
                "done": 2**20,
                "expected_sha256": SHA,
                "expected_size": len(PAYLOAD),
            }
        ),
        encoding="utf-8",
    )
    adapter, panel = open_panel()
    qtbot.waitUntil(lambda: panel.queue.rowCount() == 1, timeout=10000)
    assert panel.queue.item(0, 3).text() == "paused — 1.0 of 3.0 MiB"
    restored = next(iter(adapter.downloads.transfers.values()))
    assert restored.restored
    with qtbot.waitSignal(adapter.downloads.files_listed, timeout=10000):
        adapter.downloads.list_files(REPO)
    panel.files.selectRow(0)
    panel.download_button.click()
    (fresh,) = adapter.downloads.transfers.values()
    assert fresh is not restored and not fresh.restored
    assert panel.queue.rowCount() == 1
    assert panel.queue.item(0, 0).data(Qt.ItemDataRole.UserRole) == fresh.key
    qtbot.waitUntil(lambda: panel.queue.item(0, 3).text().startswith("done"), timeout=20000)
    assert hashlib.sha256(final.read_bytes()).hexdigest() == SHA
    assert cdn_ranges(hub) == [f"bytes={2**20}-"]


def test_a_model_in_the_old_folder_is_found_not_fetched_again(
    qtbot: Any, hub: FakeHub, paths: Paths, open_panel: Any
) -> None:
    """Before one layout the page saved to models/owner__repo/: a complete file there is verified in place."""
    old = paths.models / "acme__tiny-GGUF"
    old.mkdir(parents=True)
    (old / NAME).write_bytes(PAYLOAD)
    adapter, panel = open_panel()
    start_download(qtbot, adapter, panel)
    qtbot.waitUntil(lambda: panel.queue.item(0, 3).text().startswith("done"), timeout=20000)
    assert cdn_ranges(hub) == []
    assert not (paths.models / "acme").exists()
    assert panel.queue.item(0, 0).toolTip() == str(old / NAME)


def test_progress_reaches_the_page_as_frozen_snapshots_of_one_run(qtbot: Any, hub: FakeHub, open_panel: Any) -> None:
    """Each change is a new frozen Transfer made on the GUI thread; none is changed after it was emitted."""
    import dataclasses

    hub.faults.throttle_bps = 4 * 2**20
    adapter, panel = open_panel()
    seen: list[Transfer] = []
    adapter.downloads.transfer_changed.connect(seen.append)
    first = start_download(qtbot, adapter, panel)
    qtbot.waitUntil(lambda: not latest(adapter, first).running, timeout=20000)
    assert seen[0] is first and (first.state, first.running, first.done) == ("queued", True, 0)  # as emitted
    assert len({id(s) for s in seen}) == len(seen) > 2
    assert all(s.same_run(first) for s in seen)
    dones = [s.done for s in seen]
    assert dones == sorted(dones) and dones[-1] == len(PAYLOAD)
    assert (seen[-1].state, seen[-1].running, seen[-1].files_done) == ("done", False, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        seen[-1].done = 0  # type: ignore[misc]
