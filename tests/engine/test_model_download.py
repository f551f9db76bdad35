"""engine.hub.model_download.download_files: every file of a model in order, against the loopback fake Hub."""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hub_server import FakeHub, random_bytes

from engine.errors import Cancelled, DownloadError
from engine.hub.model_download import FileJob, FilesProgress, download_files, model_folder
from engine.hub.partials import partial_paths, read_partial_meta

REPO = "acme/split-GGUF"
PARTS = {f"m-0000{i}-of-00003.gguf": random_bytes(300_000 + i * 1000, i) for i in (1, 2, 3)}
NAMES = list(PARTS)
TOTAL = sum(len(data) for data in PARTS.values())
FAST = {"disk_margin_bytes": 0}


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    with FakeHub() as server:
        server.add_repo(REPO, dict(PARTS))
        yield server


def jobs(hub: FakeHub, dest: Path, *, sizes: bool = True) -> list[FileJob]:
    return [
        FileJob(REPO, name, dest, "main", hub.url, hashlib.sha256(data).hexdigest(), len(data) if sizes else None)
        for name, data in PARTS.items()
    ]


def cdn_ranges(hub: FakeHub) -> list[str | None]:
    return [headers.get("Range") for _m, path, headers in hub.requests if path.startswith("/cdn/")]


def test_every_file_in_order_with_progress_summed_over_the_files(hub: FakeHub, tmp_path: Path) -> None:
    seen: list[FilesProgress] = []
    recorded: list[Path] = []
    outcome = download_files(
        jobs(hub, tmp_path), progress=seen.append, on_file=lambda result: recorded.append(result.path), **FAST
    )
    assert outcome.complete and not outcome.skipped
    assert [r.path for r in outcome.downloaded] == recorded == [tmp_path / n for n in NAMES]
    for name, data in PARTS.items():
        assert (tmp_path / name).read_bytes() == data
    assert all(s.count == 3 and s.total == TOTAL for s in seen)
    dones = [s.done for s in seen]
    assert dones == sorted(dones) and dones[-1] == TOTAL  # never goes back across files
    assert [s.index for s in seen] == sorted(s.index for s in seen)
    first_done = next(s for s in seen if s.file.state == "done")
    assert (first_done.index, first_done.files_done, first_done.state) == (0, 1, "downloading")  # goes on
    assert (seen[-1].files_done, seen[-1].state) == (3, "done")
    with pytest.raises(dataclasses.FrozenInstanceError):
        seen[0].done = 0  # type: ignore[misc]  # a snapshot, safe to hand to another thread


def test_a_single_file_takes_its_total_from_the_server(hub: FakeHub, tmp_path: Path) -> None:
    seen: list[FilesProgress] = []
    (job,) = jobs(hub, tmp_path, sizes=False)[:1]
    download_files([job], progress=seen.append, **FAST)
    assert seen[-1].total == len(PARTS[NAMES[0]]) and seen[-1].done == seen[-1].total


def test_a_resume_skips_the_complete_files_and_resumes_the_partial(hub: FakeHub, tmp_path: Path) -> None:
    (tmp_path / NAMES[0]).write_bytes(PARTS[NAMES[0]])  # part 1 arrived in an earlier run
    cancel = threading.Event()

    def stop_in_part_two(update: FilesProgress) -> None:
        if update.index == 1 and update.file.state == "downloading" and update.file.done > 0:
            cancel.set()

    hub.faults.throttle_bps = 2**19
    with pytest.raises(Cancelled):
        download_files(jobs(hub, tmp_path), cancel=cancel, progress=stop_in_part_two, skip_complete=True, **FAST)
    assert cdn_ranges(hub) == [None]  # part 1 was not fetched again
    meta = read_partial_meta(tmp_path, NAMES[1])
    assert meta is not None and meta["done"] > 0
    kept = meta["done"]

    hub.faults.throttle_bps = 0
    seen: list[FilesProgress] = []
    outcome = download_files(jobs(hub, tmp_path), progress=seen.append, skip_complete=True, **FAST)
    assert outcome.complete
    assert [j.filename for j in outcome.skipped] == [NAMES[0]]
    assert [r.path.name for r in outcome.downloaded] == NAMES[1:]
    assert cdn_ranges(hub)[1:] == [f"bytes={kept}-", None]
    assert seen[0].file.message == "already downloaded" and seen[0].files_done == 1
    assert seen[-1].done == TOTAL
    for name, data in PARTS.items():
        assert (tmp_path / name).read_bytes() == data
        assert not partial_paths(tmp_path, name)[1].exists()


def test_cancel_between_files_stops_before_the_next_one(hub: FakeHub, tmp_path: Path) -> None:
    cancel = threading.Event()

    def stop_after_part_one(update: FilesProgress) -> None:
        if update.files_done == 1:
            cancel.set()

    outcome = download_files(jobs(hub, tmp_path), cancel=cancel, progress=stop_after_part_one, **FAST)
    assert not outcome.complete and [r.path.name for r in outcome.downloaded] == [NAMES[0]]
    assert not (tmp_path / NAMES[1]).exists() and not partial_paths(tmp_path, NAMES[1])[1].exists()


def test_pause_holds_the_running_file_and_it_goes_on_when_cleared(hub: FakeHub, tmp_path: Path) -> None:
    pause = threading.Event()
    states: list[str] = []

    def pause_once(update: FilesProgress) -> None:
        states.append(update.state)
        if update.index == 1 and update.file.done >= 50_000 and "paused" not in states and not pause.is_set():
            pause.set()
            threading.Timer(0.3, pause.clear).start()

    hub.faults.throttle_bps = 2**19
    outcome = download_files(jobs(hub, tmp_path), pause=pause, progress=pause_once, **FAST)
    assert outcome.complete and "paused" in states
    assert states.index("paused") < len(states) - 1


def test_a_corrupted_file_fails_with_its_name_and_the_files_before_it_stay(hub: FakeHub, tmp_path: Path) -> None:
    bad = [*jobs(hub, tmp_path)]
    bad[1] = dataclasses.replace(bad[1], expected_sha256="0" * 64)
    with pytest.raises(DownloadError, match=NAMES[1]):
        download_files(bad, **FAST)
    assert (tmp_path / NAMES[0]).read_bytes() == PARTS[NAMES[0]]
    assert not (tmp_path / NAMES[1]).exists() and not (tmp_path / NAMES[2]).exists()


def test_model_folder_is_owner_slash_repo_and_finds_the_old_layout(tmp_path: Path) -> None:
    names = ["m-00001-of-00002.gguf", "m-00002-of-00002.gguf"]
    new, old = tmp_path / "acme" / "split-GGUF", tmp_path / "acme__split-GGUF"
    assert model_folder(tmp_path, REPO, names) == new  # nothing anywhere: the one layout
    old.mkdir()
    (old / "unrelated.gguf").write_bytes(b"x")
    assert model_folder(tmp_path, REPO, names) == new  # the old folder does not hold these files
    partial_paths(old, names[1])[1].write_bytes(b"half")
    assert model_folder(tmp_path, REPO, names) == old  # a partial there: resumed where it is
    partial_paths(old, names[1])[1].unlink()
    (old / names[0]).write_bytes(b"done")
    assert model_folder(tmp_path, REPO, names) == old  # a complete file there: found, not fetched again
    new.mkdir(parents=True)
    (new / names[1]).write_bytes(b"done")
    assert model_folder(tmp_path, REPO, names) == new  # the new folder holds some: it wins
