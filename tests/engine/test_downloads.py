"""engine.hub.downloads against the loopback fake Hub, with every fault it can produce."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import namedtuple
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hub_server import FakeHub, random_bytes

import engine.hub.download_job as download_job
from engine.errors import Cancelled, DownloadError
from engine.hub.download_job import DownloadResult
from engine.hub.downloads import download_file
from engine.hub.http import GatedRepoError, RepoNotFoundError
from engine.hub.partials import discard_partial, partial_paths, read_partial_meta
from engine.hub.queue import DownloadQueue, find_partials
from engine.hub.transfer import DownloadProgress

REPO = "acme/tiny-GGUF"
NAME = "tiny-Q4_K_M.gguf"
SIZE = 3 * 2**20 + 12345
DATA = random_bytes(SIZE, 42)
SHA = hashlib.sha256(DATA).hexdigest()
ROOT = Path(__file__).resolve().parents[2]

# Fast settings for tests: tiny backoff, short stall timeout, no disk margin.
FAST: dict[str, Any] = {"backoff_s": 0.01, "max_backoff_s": 0.05, "stall_timeout_s": 2.0, "disk_margin_bytes": 0}


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    with FakeHub() as server:
        server.add_repo(REPO, {NAME: DATA, "sub/part-Q8_0.gguf": random_bytes(50_000, 1), "config.json": b'{"a": 1}'})
        yield server


@pytest.fixture
def dest(tmp_path: Path) -> Path:
    return tmp_path / "models"


class Recorder:
    """A progress callback that keeps every report."""

    def __init__(self) -> None:
        self.reports: list[DownloadProgress] = []

    def __call__(self, report: DownloadProgress) -> None:
        self.reports.append(report)

    @property
    def states(self) -> list[str]:
        return [r.state for r in self.reports]

    def messages(self) -> str:
        return "\n".join(r.message for r in self.reports)


def ranges(hub: FakeHub) -> list[str | None]:
    """The Range header of each request for the file's bytes (the /cdn hop)."""
    return [headers.get("Range") for method, path, headers in hub.requests if path.startswith("/cdn/")]


def assert_clean(dest: Path, name: str = NAME) -> None:
    final, partial, meta = partial_paths(dest, name)
    assert final.read_bytes() == DATA
    assert not partial.exists()
    assert not meta.exists()


def download(hub: FakeHub, dest: Path, name: str = NAME, **kwargs: Any) -> DownloadResult:
    options = {**FAST, **kwargs}
    return download_file(REPO, name, dest, endpoint=hub.url, **options)


# ------------------------------------------------------------------------------ the happy path


def test_download_verifies_and_moves_into_place(hub: FakeHub, dest: Path) -> None:
    recorder = Recorder()
    result = download(hub, dest, progress=recorder)
    assert result.path == dest / NAME
    assert result.sha256 == SHA
    assert result.size == SIZE
    assert result.repo == REPO
    assert result.revision == hub.repos[REPO].commit  # the commit, not "main"
    assert_clean(dest)
    assert recorder.states[0] == "connecting"
    assert recorder.states[-2:] == ["verifying", "done"]
    assert "downloading" in recorder.states
    done = [r.done for r in recorder.reports]
    assert done == sorted(done)
    assert recorder.reports[-1].total == SIZE
    assert ranges(hub) == [None]


def test_files_in_subfolders_and_small_git_files(hub: FakeHub, dest: Path) -> None:
    result = download(hub, dest, "sub/part-Q8_0.gguf")
    assert result.path == dest / "sub" / "part-Q8_0.gguf"
    assert result.path.read_bytes() == random_bytes(50_000, 1)
    config = download(hub, dest, "config.json")  # not LFS: no sha256 to check, still hashed
    assert config.path.read_bytes() == b'{"a": 1}'
    assert config.sha256 == hashlib.sha256(b'{"a": 1}').hexdigest()


def test_an_existing_verified_file_is_not_downloaded_again(hub: FakeHub, dest: Path) -> None:
    download(hub, dest)
    before = len(hub.requests)
    result = download(hub, dest, expected_sha256=SHA)
    assert result.sha256 == SHA
    assert len(hub.requests) == before


def test_progress_reports_speed_and_eta(hub: FakeHub, dest: Path) -> None:
    hub.faults.throttle_bps = 4 * 2**20
    recorder = Recorder()
    download(hub, dest, progress=recorder)
    moving = [r for r in recorder.reports if r.state == "downloading" and r.speed_bps > 0]
    assert moving, recorder.reports
    assert all(r.eta_s is not None and r.eta_s >= 0 for r in moving)
    speeds = [r.speed_bps for r in moving[len(moving) // 2 :]]
    assert 1 * 2**20 < sum(speeds) / len(speeds) < 12 * 2**20  # about the throttle rate


# --------------------------------------------------------------------------- network faults


def test_dropped_connections_resume_with_range(hub: FakeHub, dest: Path) -> None:
    hub.faults.drop_after = 2**20
    hub.faults.drop_times = 2
    recorder = Recorder()
    result = download(hub, dest, progress=recorder)
    assert result.sha256 == SHA
    assert ranges(hub) == [None, f"bytes={2**20}-", f"bytes={2 * 2**20}-"]
    assert recorder.states.count("retrying") == 2
    assert "the connection dropped at 1048576 of" in recorder.messages()
    assert max(r.attempt for r in recorder.reports) == 3
    # after the first answer the download is pinned to the commit it resolved
    commit = hub.repos[REPO].commit
    assert hub.count("GET", f"/resolve/{commit}/") == 2
    assert_clean(dest)


def test_a_connection_that_always_drops_gives_up_and_keeps_the_partial(hub: FakeHub, dest: Path) -> None:
    hub.faults.drop_after = 0
    hub.faults.drop_times = 99
    with pytest.raises(DownloadError) as caught:
        download(hub, dest, max_retries=2)
    message = str(caught.value)
    assert message.startswith(f"{NAME}: the connection dropped at 0 of {SIZE} bytes; gave up after 2 retries")
    assert "\n" not in message
    assert len(ranges(hub)) == 3
    assert not (dest / NAME).exists()


def test_server_ignoring_range_restarts_from_zero(hub: FakeHub, dest: Path) -> None:
    hub.faults.drop_after = 2**20
    hub.faults.drop_times = 1
    hub.faults.ignore_range = True
    recorder = Recorder()
    result = download(hub, dest, progress=recorder)
    assert result.sha256 == SHA
    assert ranges(hub) == [None, f"bytes={2**20}-"]
    assert "the server ignored the resume request; starting over" in recorder.messages()
    assert_clean(dest)


def test_short_body_is_not_accepted_as_complete(hub: FakeHub, dest: Path) -> None:
    hub.faults.short_body_times = 1
    recorder = Recorder()
    result = download(hub, dest, progress=recorder)
    assert result.sha256 == SHA
    assert ranges(hub) == [None, f"bytes={SIZE // 2}-"]
    assert "dropped" in recorder.messages()


def test_short_bodies_forever_fail_without_a_final_file(hub: FakeHub, dest: Path) -> None:
    hub.faults.short_body_times = 99
    hub.faults.ignore_range = True  # so every answer is short of the whole file
    with pytest.raises(DownloadError, match="gave up after 1 retries"):
        download(hub, dest, max_retries=1)
    assert not (dest / NAME).exists()


def test_stall_is_detected_and_the_download_reconnects(hub: FakeHub, dest: Path) -> None:
    hub.faults.stall_after = 2**20
    hub.faults.stall_s = 60.0
    hub.faults.stall_times = 1
    recorder = Recorder()
    began = time.monotonic()
    result = download(hub, dest, progress=recorder, stall_timeout_s=0.4)
    assert result.sha256 == SHA
    # Did not wait for the server to wake up: a hang guard, 15 s of the 60 s stall (0.55 s here).
    assert time.monotonic() - began < 15
    assert "no data for 0.4 s (stalled); reconnecting" in recorder.messages()
    assert ranges(hub) == [None, f"bytes={2**20}-"]


def test_a_server_that_never_answers_is_cut_by_the_watchdog(hub: FakeHub, dest: Path) -> None:
    hub.faults.stall_headers_times = 1
    hub.faults.stall_s = 60.0
    recorder = Recorder()
    began = time.monotonic()
    assert download(hub, dest, progress=recorder, stall_timeout_s=0.4).sha256 == SHA
    assert time.monotonic() - began < 15  # a hang guard: 15 s of the 60 s stall (0.5 s here)
    assert "no answer for 0.4 s (stalled)" in recorder.messages()


def test_flipped_byte_is_caught_and_downloaded_again(hub: FakeHub, dest: Path) -> None:
    hub.faults.flip_byte_times = 1
    recorder = Recorder()
    result = download(hub, dest, progress=recorder)
    assert result.sha256 == SHA
    assert "checksum mismatch" in recorder.messages()
    assert ranges(hub) == [None, None]
    assert_clean(dest)


def test_persistent_corruption_deletes_the_file_and_says_so(hub: FakeHub, dest: Path) -> None:
    hub.faults.flip_byte_times = 99
    with pytest.raises(DownloadError) as caught:
        download(hub, dest)
    message = str(caught.value)
    assert message.startswith(f"{NAME}: checksum mismatch (expected sha256 {SHA[:12]}")
    assert message.endswith("the download was corrupted; deleted, please retry")
    final, partial, meta = partial_paths(dest, NAME)
    assert not final.exists()
    assert not partial.exists()
    assert not meta.exists()


def test_listing_hash_disagreeing_with_the_server_is_an_error(hub: FakeHub, dest: Path) -> None:
    with pytest.raises(DownloadError, match="the server's sha256 differs from the one expected"):
        download(hub, dest, expected_sha256="0" * 64)
    with pytest.raises(DownloadError, match=f"size mismatch: expected 5 bytes but the server has {SIZE}"):
        download(hub, dest, expected_size=5)
    assert not (dest / NAME).exists()


def test_rate_limit_on_the_file_honours_retry_after(hub: FakeHub, dest: Path) -> None:
    hub.faults.status.append(("/resolve/", 429, 1, 0.3))
    recorder = Recorder()
    began = time.monotonic()
    assert download(hub, dest, progress=recorder).sha256 == SHA
    assert time.monotonic() - began >= 0.3
    assert "rate limited" in recorder.messages()


def test_gated_file_needs_the_token_which_never_reaches_the_cdn(dest: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeHub(cdn_host="localhost") as server:
        server.add_repo(REPO, {NAME: DATA}, gated=True, token="hf_s3cret")
        monkeypatch.delenv("HF_TOKEN", raising=False)
        with pytest.raises(GatedRepoError) as caught:
            download_file(REPO, NAME, dest, endpoint=server.url, **FAST)
        assert str(caught.value) == (
            f"{REPO}/{NAME}: gated or private: accept the licence on the model page and set HF_TOKEN"
        )
        assert not partial_paths(dest, NAME)[1].exists()
        monkeypatch.setenv("HF_TOKEN", "hf_s3cret")
        assert download_file(REPO, NAME, dest, endpoint=server.url, **FAST).sha256 == SHA
        hub_auth = [h.get("Authorization") for _, p, h in server.requests if "/resolve/" in p]
        cdn_auth = [h.get("Authorization") for _, p, h in server.requests if p.startswith("/cdn/")]
        assert hub_auth[-1] == "Bearer hf_s3cret"
        assert cdn_auth == [None]  # another host: the token stays home


def test_missing_file_is_404(hub: FakeHub, dest: Path) -> None:
    with pytest.raises(RepoNotFoundError, match=f"{REPO}/nope.gguf: no such repository/file"):
        download(hub, dest, "nope.gguf")
    assert not partial_paths(dest, "nope.gguf")[1].exists()


def test_unreachable_endpoint_is_offline(dest: Path) -> None:
    with FakeHub() as server:
        endpoint = server.url
    with pytest.raises(DownloadError) as caught:
        download_file(REPO, NAME, dest, endpoint=endpoint, max_retries=1, **FAST)
    message = str(caught.value)
    assert message.startswith(f"{NAME}: offline: cannot reach {endpoint} (connection refused)")
    assert "gave up after 1 retries" in message
    assert not partial_paths(dest, NAME)[1].exists()  # nothing to resume: no empty leftovers


# ------------------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    "name",
    [
        "../evil.gguf",
        "/etc/x.gguf",
        "C:\\x.gguf",
        "C:x.gguf",
        "\\\\server\\share\\x.gguf",
        "a\\b.gguf",
        "a\x00.gguf",
        "a/../../b.gguf",
    ],
)
def test_unsafe_names_are_refused_before_any_request(hub: FakeHub, dest: Path, name: str) -> None:
    with pytest.raises(DownloadError, match="unsafe file name"):
        download(hub, dest, name)
    assert hub.requests == []
    assert not dest.exists()


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt", "x.ckpt", "w.pth"])
def test_pickle_files_are_refused(hub: FakeHub, dest: Path, name: str) -> None:
    with pytest.raises(DownloadError, match="pickle weights"):
        download(hub, dest, name)
    assert hub.requests == []


def test_second_download_of_the_same_file_is_refused_while_the_first_runs(hub: FakeHub, dest: Path) -> None:
    hub.faults.throttle_bps = 2 * 2**20
    started = threading.Event()
    outcome: list[object] = []

    def first() -> None:
        outcome.append(download(hub, dest, progress=lambda r: started.set() if r.done else None))

    thread = threading.Thread(target=first)
    thread.start()
    assert started.wait(10)
    with pytest.raises(DownloadError, match="already being downloaded by another Glassbox window or process"):
        download(hub, dest)
    thread.join(20)
    assert outcome
    assert_clean(dest)


# ---------------------------------------------------------------------------------- disk space


def _fake_usage(free: int) -> Any:
    usage = namedtuple("usage", "total used free")
    return lambda path: usage(10 * free, 9 * free, free)


def test_disk_precheck_refuses_before_downloading(hub: FakeHub, dest: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "disk_usage", _fake_usage(2**20))
    with pytest.raises(DownloadError) as caught:
        download(hub, dest, expected_size=SIZE, disk_margin_bytes=512 * 2**20)
    assert str(caught.value) == (f"not enough disk space for {NAME}: need 515.0 MiB, 1.0 MiB free on {dest}")
    assert hub.requests == []


def test_disk_check_runs_once_the_size_is_known(hub: FakeHub, dest: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "disk_usage", _fake_usage(SIZE - 1))
    with pytest.raises(DownloadError, match=f"not enough disk space for {NAME}: need 3.0 MiB, 3.0 MiB free"):
        download(hub, dest)
    assert not (dest / NAME).exists()
    assert not partial_paths(dest, NAME)[1].exists()  # the redirect told the size: no byte written


def test_disk_full_while_writing_keeps_the_partial_for_later(
    hub: FakeHub, dest: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = download_job.write_all
    written = [0]

    def write_until_full(fd: int, data: bytes | memoryview) -> None:
        if written[0] >= 2**20:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(fd, data)
        written[0] += len(data)

    monkeypatch.setattr(download_job, "write_all", write_until_full)
    with pytest.raises(DownloadError) as caught:
        download(hub, dest)
    message = str(caught.value)
    assert message.startswith(f"not enough disk space for {NAME}: need ")
    kept = rf" [\d.]+ (B|KiB|MiB|GiB) free on {re.escape(str(dest))} \(the partial download is kept"
    assert re.search(kept, message), message
    assert "\n" not in message
    final, partial, _ = partial_paths(dest, NAME)
    assert not final.exists()
    meta = read_partial_meta(dest, NAME)
    assert meta is not None
    assert meta["done"] == written[0] == partial.stat().st_size
    monkeypatch.setattr(download_job, "write_all", real_write)
    assert download(hub, dest).sha256 == SHA
    assert ranges(hub)[-1] == f"bytes={written[0]}-"
    assert_clean(dest)


def test_disk_full_reported_by_the_final_fsync_is_the_same_clear_error(
    hub: FakeHub, dest: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(download_job.os, "fsync", full)
    with pytest.raises(DownloadError, match=f"not enough disk space for {NAME}: need"):
        download(hub, dest)
    assert not (dest / NAME).exists()
    monkeypatch.undo()
    assert download(hub, dest).sha256 == SHA
    assert_clean(dest)


def test_unwritable_folder_is_a_clear_error(hub: FakeHub, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x", encoding="utf-8")
    with pytest.raises(DownloadError, match="cannot create the folder"):
        download(hub, blocker / "models")
    assert hub.requests == []


# ----------------------------------------------------------------------- cancel, pause, resume


def test_cancel_keeps_the_partial_and_a_later_call_resumes(hub: FakeHub, dest: Path) -> None:
    hub.faults.throttle_bps = 8 * 2**20
    cancel = threading.Event()

    def cancel_after_a_mib(report: DownloadProgress) -> None:
        if report.done >= 2**20:
            cancel.set()

    with pytest.raises(Cancelled, match=f"{NAME}: download cancelled"):
        download(hub, dest, cancel=cancel, progress=cancel_after_a_mib)
    meta = read_partial_meta(dest, NAME)
    assert meta is not None
    assert meta["repo"] == REPO
    assert meta["commit"] == hub.repos[REPO].commit
    assert meta["expected_sha256"] == SHA
    assert meta["total"] == SIZE
    kept = meta["done"]
    assert kept >= 2**20
    assert not (dest / NAME).exists()
    hub.faults.throttle_bps = 0
    recorder = Recorder()
    assert download(hub, dest, progress=recorder).sha256 == SHA
    assert ranges(hub)[-1] == f"bytes={kept}-"
    assert recorder.states[0] == "verifying"  # re-hashed the bytes it kept
    assert_clean(dest)


def test_resume_with_listing_facts_added_later_still_resumes(hub: FakeHub, dest: Path) -> None:
    hub.faults.throttle_bps = 8 * 2**20
    cancel = threading.Event()
    with pytest.raises(Cancelled):
        download(hub, dest, cancel=cancel, progress=lambda r: cancel.set() if r.done >= 2**20 else None)
    hub.faults.throttle_bps = 0
    result = download(hub, dest, expected_sha256=SHA.upper(), expected_size=SIZE)
    assert result.sha256 == SHA
    assert str(ranges(hub)[-1]).startswith("bytes=")


def test_cancel_while_stalled_takes_effect_at_once(hub: FakeHub, dest: Path) -> None:
    hub.faults.stall_after = 2**20
    hub.faults.stall_s = 60.0
    hub.faults.stall_times = 1
    cancel = threading.Event()

    def cancel_soon(report: DownloadProgress) -> None:
        if report.done >= 2**20 and not cancel.is_set():
            threading.Timer(0.2, cancel.set).start()

    began = time.monotonic()
    with pytest.raises(Cancelled):
        download(hub, dest, cancel=cancel, progress=cancel_soon, stall_timeout_s=30)
    # A hang guard: 15 s, under the 30 s watchdog and the 60 s stall, over 10x the 1.3 s here.
    assert time.monotonic() - began < 15


def test_pause_stops_the_transfer_and_resumes_when_cleared(hub: FakeHub, dest: Path) -> None:
    hub.faults.throttle_bps = 8 * 2**20
    pause = threading.Event()
    recorder = Recorder()

    def pause_once(report: DownloadProgress) -> None:
        recorder(report)
        if report.done >= 2**20 and "paused" not in recorder.states and not pause.is_set():
            pause.set()
            threading.Timer(0.5, pause.clear).start()

    assert download(hub, dest, pause=pause, progress=pause_once).sha256 == SHA
    assert "paused" in recorder.states
    resumed = ranges(hub)
    assert len(resumed) == 2
    assert resumed[1] is not None
    assert resumed[1].startswith("bytes=")
    paused_at = recorder.states.index("paused")
    assert recorder.states[paused_at + 1] == "connecting"
    assert_clean(dest)


def test_a_partial_that_is_already_complete_is_only_verified(hub: FakeHub, dest: Path) -> None:
    # killed after the last byte but before the rename: the server answers 416 to the resume
    dest.mkdir()
    _, partial, meta = partial_paths(dest, NAME)
    partial.write_bytes(DATA)
    meta.write_text(
        json.dumps(
            {
                "format": 1,
                "repo": REPO,
                "filename": NAME,
                "revision": "main",
                "commit": hub.repos[REPO].commit,
                "expected_sha256": SHA,
                "expected_size": None,
                "total": SIZE,
                "done": SIZE,
            }
        ),
        encoding="utf-8",
    )
    assert download(hub, dest).sha256 == SHA
    assert ranges(hub) == [f"bytes={SIZE}-"]
    assert_clean(dest)


def test_garbage_metadata_restarts_safely(hub: FakeHub, dest: Path) -> None:
    _, partial, meta = partial_paths(dest, NAME)
    dest.mkdir()
    partial.write_bytes(b"\x00" * 5000)
    meta.write_text("{not json", encoding="utf-8")
    assert download(hub, dest).sha256 == SHA
    assert ranges(hub) == [None]
    assert_clean(dest)


def test_metadata_for_another_revision_is_not_trusted(hub: FakeHub, dest: Path) -> None:
    dest.mkdir()
    _, partial, meta = partial_paths(dest, NAME)
    partial.write_bytes(DATA[: 2**20])
    meta.write_text(
        json.dumps({"format": 1, "repo": REPO, "filename": NAME, "revision": "v2", "done": 2**20}), encoding="utf-8"
    )
    assert download(hub, dest).sha256 == SHA
    assert ranges(hub) == [None]


def test_resume_sticks_to_the_commit_it_started_with(hub: FakeHub, dest: Path) -> None:
    hub.faults.throttle_bps = 8 * 2**20
    cancel = threading.Event()
    with pytest.raises(Cancelled):
        download(hub, dest, cancel=cancel, progress=lambda r: cancel.set() if r.done >= 2**20 else None)
    old_commit = hub.repos[REPO].commit
    hub.faults.throttle_bps = 0
    hub.add_repo(REPO, {NAME: random_bytes(SIZE, 7)})  # main moves on to new bytes
    result = download(hub, dest)
    assert result.sha256 == SHA  # the old version, whole, never a mix of two
    assert result.revision == old_commit


def test_partials_are_found_and_discarded(hub: FakeHub, dest: Path) -> None:
    hub.faults.throttle_bps = 8 * 2**20
    cancel = threading.Event()
    with pytest.raises(Cancelled):
        download(hub, dest, cancel=cancel, progress=lambda r: cancel.set() if r.done else None)
    (found,) = find_partials(dest.parent)
    assert found.path == dest / NAME
    assert (found.repo, found.filename, found.revision, found.total) == (REPO, NAME, "main", SIZE)
    assert 0 < found.done < SIZE
    assert discard_partial(dest, NAME)
    assert find_partials(dest) == []
    assert not discard_partial(dest, NAME)
    assert list(dest.iterdir()) == []


_CHILD = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from engine.hub.downloads import download_file
    result = download_file(sys.argv[1], sys.argv[2], Path(sys.argv[3]), endpoint=sys.argv[4],
                           backoff_s=0.01, disk_margin_bytes=0)
    print(json.dumps(result.to_dict()))
""")


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_download_killed_with_sigkill_resumes_in_a_new_process(hub: FakeHub, dest: Path) -> None:
    hub.faults.throttle_bps = 1.5 * 2**20
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, REPO, NAME, str(dest), hub.url],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            meta = read_partial_meta(dest, NAME)
            if meta is not None and meta["done"] >= 2**20:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the child never got a MiB in")
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(10)
    assert child.returncode == -signal.SIGKILL
    final, partial, _ = partial_paths(dest, NAME)
    assert not final.exists()  # never a half file at the final path
    assert partial.exists()
    kept = read_partial_meta(dest, NAME)
    assert kept is not None
    hub.faults.throttle_bps = 0
    second = subprocess.run(
        [sys.executable, "-c", _CHILD, REPO, NAME, str(dest), hub.url],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result = json.loads(second.stdout)
    assert result["sha256"] == SHA
    assert result["size"] == SIZE
    resumed_from = int(str(ranges(hub)[-1]).removeprefix("bytes=").rstrip("-"))
    assert resumed_from >= kept["done"] >= 2**20
    assert_clean(dest)


# ------------------------------------------------------------------------------------ queue


def test_queue_persists_across_instances(tmp_path: Path) -> None:
    state = tmp_path / "state" / "downloads.json"
    queue = DownloadQueue(state)
    first = queue.add(REPO, NAME, tmp_path / "models", expected_size=SIZE, expected_sha256=SHA)
    queue.add("other/repo-GGUF", "b.gguf", tmp_path / "models")
    assert queue.add(REPO, NAME, tmp_path / "models") == first  # no duplicates
    queue.set_state(first.key, "paused")
    again = DownloadQueue(state)
    items = again.items()
    assert [(i.repo, i.filename, i.state) for i in items] == [
        (REPO, NAME, "paused"),
        ("other/repo-GGUF", "b.gguf", "queued"),
    ]
    assert items[0].expected_sha256 == SHA
    assert again.next_queued() == items[1]
    assert again.remove(first.key)
    assert [i.filename for i in DownloadQueue(state).items()] == ["b.gguf"]


def test_queue_survives_a_corrupt_state_file(tmp_path: Path) -> None:
    state = tmp_path / "downloads.json"
    state.write_text("[[[ nope", encoding="utf-8")
    queue = DownloadQueue(state)
    assert queue.items() == []
    queue.add(REPO, NAME, tmp_path)
    assert len(DownloadQueue(state).items()) == 1
    assert list(tmp_path.glob("downloads.json.corrupt*"))


def test_queue_refuses_unsafe_names(tmp_path: Path) -> None:
    with pytest.raises(DownloadError, match="unsafe file name"):
        DownloadQueue(tmp_path / "q.json").add(REPO, "../x.gguf", tmp_path)


def test_background_sync_flushes_once_enough_bytes_are_dirty(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from engine.hub.transfer import BackgroundSync

    synced = threading.Event()
    calls: list[int] = []

    def fake_sync(fd: int) -> None:
        calls.append(fd)
        synced.set()

    monkeypatch.setattr(os, "fdatasync", fake_sync, raising=False)
    monkeypatch.setattr(os, "fsync", fake_sync)
    with open(tmp_path / "f", "wb") as fh, BackgroundSync(fh.fileno(), dirty_bytes=1000, interval_s=60) as sync:
        sync.wrote(999)
        assert not synced.wait(0.2), "synced before enough bytes were dirty"
        sync.wrote(1)
        assert synced.wait(5), "1000 dirty bytes did not start a writeback"
        assert calls == [fh.fileno()]
