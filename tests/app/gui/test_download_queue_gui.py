"""The download queue in the GUI: a split model (and its mmproj) is remembered whole when the user
asks for it, so a restart brings it back as one row, parts not yet started included, that resumes
every part, or is discarded with all its partials; an item whose files all arrived is dropped."""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "engine"))
from gui_support import transfer_buttons
from hub_server import FakeHub, random_bytes
from tiny_models import write_tiny_llama_gguf

from app.gui.discover_panel import format_progress
from app.gui.model_panel import ModelPanel
from app.gui.workers.models_worker import ModelsAdapter
from app.gui.workers.transfers import Transfer
from app.paths import Paths
from engine.hub.partials import partial_paths, read_partial_meta
from engine.hub.queue import DownloadQueue, QueueFile, make_item
from engine.units import format_bytes

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_ignore("propagateSizeHints")]
REPO = "acme/split-GGUF"
VISION_REPO = "acme/vision-GGUF"
STEM = "tiny-Q4_K_M"
PART_NAMES = [f"{STEM}-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
MMPROJ = "mmproj-tiny-F16.gguf"
MMPROJ_BYTES = random_bytes(300_000, 5)


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """A real split GGUF (the library reads its headers): three parts of about 2 MB."""
    folder = tmp_path_factory.mktemp("split")
    write_tiny_llama_gguf(folder / f"{STEM}.gguf", split_max_tensors=8)
    files = {name: (folder / name).read_bytes() for name in PART_NAMES}
    assert all(len(data) > 1_500_000 for data in files.values())
    return files


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, parts: dict[str, bytes]) -> Iterator[FakeHub]:
    with FakeHub() as server:
        server.add_repo(REPO, {**parts, "README.md": b"hi"})
        # The projector in two types: a download fetches the one a load picks (F16), not both.
        server.add_repo(VISION_REPO, {**parts, MMPROJ: MMPROJ_BYTES, "mmproj-tiny-F32.gguf": MMPROJ_BYTES * 2})
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def queued(paths: Paths) -> list[dict[str, Any]]:
    """The queue file's items, as the next session reads them."""
    if not paths.download_queue.exists():
        return []
    items: list[dict[str, Any]] = json.loads(paths.download_queue.read_text(encoding="utf-8"))["items"]
    return items


def start_download(qtbot: Any, adapter: ModelsAdapter, panel: ModelPanel, repo: str) -> Transfer:
    with qtbot.waitSignal(adapter.downloads.files_listed, timeout=10000):
        adapter.downloads.list_files(repo)
    assert panel.files.rowCount() == 1  # the three parts are one choice
    panel.files.selectRow(0)
    panel.download_button.click()
    (transfer,) = adapter.downloads.transfers.values()
    return transfer


def latest(adapter: ModelsAdapter, transfer: Transfer) -> Transfer:
    """The newest snapshot of ``transfer`` (snapshots are frozen: each change is a new one)."""
    return adapter.downloads.transfers[transfer.key]


def quit_app(adapter: ModelsAdapter, panel: ModelPanel) -> None:
    """What the main window does on quit; nothing but the disk is carried to the next session."""
    adapter.shutdown(wait=False)
    panel.close()


def cdn_ranges(hub: FakeHub, since: int = 0) -> list[str | None]:
    return [headers.get("Range") for _m, path, headers in hub.requests[since:] if path.startswith("/cdn/")]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_split_model_stopped_in_part_one_comes_back_as_one_row_and_resumes_every_part(
    qtbot: Any, hub: FakeHub, paths: Paths, open_panel: Any, parts: dict[str, bytes]
) -> None:
    hub.faults.throttle_bps = 2**20
    old_adapter, old_panel = open_panel()
    transfer = start_download(qtbot, old_adapter, old_panel, REPO)
    qtbot.waitUntil(lambda: latest(old_adapter, transfer).done >= 2**19, timeout=15000)
    assert latest(old_adapter, transfer).files_done == 0
    (item,) = queued(paths)  # remembered whole while part 1 runs
    assert [f["filename"] for f in item["files"]] == PART_NAMES
    assert item["state"] == "downloading"
    quit_app(old_adapter, old_panel)

    folder = paths.models / "acme" / "split-GGUF"
    meta = read_partial_meta(folder, PART_NAMES[0])
    assert meta is not None
    kept = meta["done"]
    assert 2**19 <= kept < len(parts[PART_NAMES[0]])
    for name in PART_NAMES[1:]:  # never started: only the queue knows about them
        final, partial, meta_file = partial_paths(folder, name)
        assert not final.exists() and not partial.exists() and not meta_file.exists()
    (item,) = queued(paths)
    commit = hub.repos[REPO].commit
    assert (item["repo"], item["revision"], item["dest_dir"]) == (REPO, commit, str(folder))
    assert item["state"] == "paused"
    assert [f["expected_sha256"] for f in item["files"]] == [sha(parts[n]) for n in PART_NAMES]
    assert [f["expected_size"] for f in item["files"]] == [len(parts[n]) for n in PART_NAMES]

    hub.faults.throttle_bps = 0
    adapter, panel = open_panel()  # the next session
    qtbot.waitUntil(lambda: panel.queue.rowCount() == 1, timeout=10000)
    total = sum(len(data) for data in parts.values())
    assert panel.queue.item(0, 0).text() == f"{STEM}.gguf (3 parts, {REPO})"
    assert panel.queue.item(0, 3).text() == f"paused — {format_progress(kept, total)} · 0 of 3 parts done"
    assert panel.queue.item(0, 3).text().endswith(" of 5.8 MiB · 0 of 3 parts done")
    assert len(adapter.downloads.transfers) == 1
    row = transfer_buttons(panel)
    assert not row.resume_button.isHidden() and not row.discard_button.isHidden()
    before = len(hub.requests)

    row.resume_button.click()
    qtbot.waitUntil(lambda: panel.queue.item(0, 3).text().startswith("done"), timeout=30000)
    assert panel.queue.item(0, 3).text() == f"done — {format_progress(total, total)} · 3 of 3 parts done"
    for name in PART_NAMES:
        final, partial, meta_file = partial_paths(folder, name)
        assert sha(final.read_bytes()) == sha(parts[name])
        assert not partial.exists() and not meta_file.exists()
    # Part 1 resumed where it stopped; parts 2 and 3 were fetched whole, in order.
    assert cdn_ranges(hub, before) == [f"bytes={kept}-", None, None]
    fetched = [path for _m, path, _h in hub.requests[before:] if "/resolve/" in path]
    assert [path.rsplit("/", 1)[-1] for path in fetched] == PART_NAMES
    assert all(f"/resolve/{commit}/" in path for path in fetched)
    qtbot.waitUntil(lambda: queued(paths) == [], timeout=10000)
    qtbot.waitUntil(lambda: panel.library.rowCount() == 1, timeout=10000)  # the model, once
    (entry,) = adapter.entries
    assert entry.error is None
    assert [p.name for p in entry.parts] == PART_NAMES


def test_discard_of_a_split_row_removes_every_partial_and_its_queue_item(
    qtbot: Any,
    hub: FakeHub,
    paths: Paths,
    open_panel: Any,
    parts: dict[str, bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:

    first = len(parts[PART_NAMES[0]])
    hub.faults.throttle_bps = 2 * 2**20
    old_adapter, old_panel = open_panel()
    transfer = start_download(qtbot, old_adapter, old_panel, VISION_REPO)
    assert transfer.label == f"{STEM}.gguf (3 parts + mmproj, {VISION_REPO})"
    size = old_panel.files.item(0, 2)  # what the download takes: the parts and that projector
    assert size.text() == format_bytes(sum(len(d) for d in parts.values()) + len(MMPROJ_BYTES))
    assert MMPROJ in old_panel.files.item(0, 0).toolTip()
    # part 1 done, part 2 running
    qtbot.waitUntil(lambda: latest(old_adapter, transfer).done >= first + 2**19, timeout=20000)
    quit_app(old_adapter, old_panel)
    folder = paths.models / "acme" / "vision-GGUF"
    (item,) = queued(paths)
    assert [f["filename"] for f in item["files"]] == [*PART_NAMES, MMPROJ]  # the mmproj, not started, too
    assert (folder / PART_NAMES[0]).is_file()
    assert partial_paths(folder, PART_NAMES[1])[1].is_file()

    adapter, panel = open_panel()
    qtbot.waitUntil(lambda: panel.queue.rowCount() == 1, timeout=10000)
    assert panel.queue.item(0, 0).text() == f"{STEM}.gguf (3 parts + mmproj, {VISION_REPO})"
    assert panel.queue.item(0, 3).text().endswith(" · 1 of 4 files done")
    (restored,) = adapter.downloads.transfers.values()
    assert restored.files_done == 1 and restored.done > first

    asked: list[str] = []

    def answer(_parent: Any, _title: str, text: str) -> bool:
        asked.append(text)
        return True

    monkeypatch.setattr("app.gui.discover_panel.confirm", answer)
    with qtbot.waitSignal(adapter.downloads.transfer_removed, timeout=10000):
        transfer_buttons(panel).discard_button.click()
    assert asked and "already complete stay" in asked[0]
    assert not list(folder.rglob("*.partial")) and not list(folder.rglob("*.partial.json"))
    assert queued(paths) == []
    assert panel.queue.rowCount() == 0 and adapter.downloads.transfers == {}
    assert sorted(p.name for p in folder.iterdir()) == [PART_NAMES[0]]  # a complete part is not a partial

    quit_app(adapter, panel)
    _adapter, again = open_panel()  # and nothing comes back
    qtbot.waitUntil(lambda: again.library.rowCount() == 1, timeout=10000)
    assert again.queue.rowCount() == 0


def test_a_queue_item_whose_files_are_all_present_is_dropped_at_startup(
    qtbot: Any, hub: FakeHub, paths: Paths, open_panel: Any, parts: dict[str, bytes]
) -> None:
    folder = paths.models / "acme__split-GGUF"
    folder.mkdir(parents=True)
    for name, data in parts.items():  # the app was killed right after the last rename
        (folder / name).write_bytes(data)
    commit = hub.repos[REPO].commit
    queue = DownloadQueue(paths.download_queue)
    item = queue.put(
        make_item(
            REPO,
            f"{STEM}.gguf",
            folder,
            [QueueFile(name, sha(data), len(data)) for name, data in parts.items()],
            revision=commit,
        )
    )
    queue.set_state(item.key, "downloading")
    assert len(queued(paths)) == 1
    requests = len(hub.requests)

    adapter, panel = open_panel()
    qtbot.waitUntil(lambda: queued(paths) == [], timeout=10000)
    qtbot.waitUntil(
        lambda: len(adapter.entries) == 1 and adapter.entries[0].provenance.get("revision") == commit, timeout=10000
    )
    assert adapter.entries[0].provenance["sha256"] == sha(parts[PART_NAMES[0]])
    assert panel.queue.rowCount() == 0 and adapter.downloads.transfers == {}
    assert panel.library.rowCount() == 1
    assert len(hub.requests) == requests  # nothing fetched
