"""engine.hub.queue.find_partials: what a restarted app offers to resume or discard."""

from __future__ import annotations

import json
from pathlib import Path

from engine.hub.partials import discard_partial, partial_paths
from engine.hub.queue import find_partials

REPO = "acme/tiny-GGUF"
COMMIT = "a" * 40


def write_partial(dest: Path, name: str, data: bytes, **meta: object) -> tuple[Path, Path]:
    """A partial download as the engine leaves it: the bytes and the resume metadata."""
    _, partial, meta_path = partial_paths(dest, name)
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_bytes(data)
    document = {
        "format": 1,
        "repo": REPO,
        "filename": name,
        "revision": "main",
        "commit": COMMIT,
        "endpoint": "http://127.0.0.1:9",
        "expected_size": 1000,
        "expected_sha256": "b" * 64,
        "total": 1000,
        "done": len(data),
        "updated_at": 5.0,
        **meta,
    }
    meta_path.write_text(json.dumps(document), encoding="utf-8")
    return partial, meta_path


def test_a_partial_reports_what_a_resume_needs(tmp_path: Path) -> None:
    write_partial(tmp_path / "acme__tiny-GGUF", "sub/tiny-Q4_K_M.gguf", b"x" * 300)
    (found,) = find_partials(tmp_path)
    assert found.resumable
    assert found.path == tmp_path / "acme__tiny-GGUF" / "sub" / "tiny-Q4_K_M.gguf"
    assert found.dest_dir == tmp_path / "acme__tiny-GGUF"
    assert (found.repo, found.filename, found.revision, found.commit) == (REPO, "sub/tiny-Q4_K_M.gguf", "main", COMMIT)
    assert (found.done, found.total, found.expected_size, found.expected_sha256) == (300, 1000, 1000, "b" * 64)
    assert found.endpoint == "http://127.0.0.1:9"


def test_done_never_counts_bytes_that_are_not_on_disk(tmp_path: Path) -> None:
    partial, _ = write_partial(tmp_path, "a.gguf", b"x" * 300, done=900)
    assert find_partials(tmp_path)[0].done == 300
    partial.unlink()
    assert find_partials(tmp_path)[0].done == 0


def test_unreadable_metadata_is_listed_with_the_reason(tmp_path: Path) -> None:
    _, corrupt = write_partial(tmp_path, "corrupt.gguf", b"x" * 10)
    corrupt.write_text("{not json", encoding="utf-8")
    write_partial(tmp_path, "foreign.gguf", b"x" * 20, format=99)
    write_partial(tmp_path, "unsafe.gguf", b"x" * 30, filename="../unsafe.gguf")
    write_partial(tmp_path, "moved.gguf", b"x" * 40, filename="other.gguf")
    write_partial(tmp_path, "norepo.gguf", b"x" * 50, repo=None)
    reasons = {p.path.name: (p.error, p.done) for p in find_partials(tmp_path)}
    assert reasons == {
        "corrupt.gguf": ("its resume metadata is corrupt (not JSON)", 10),
        "foreign.gguf": ("its resume metadata has an unknown format", 20),
        "unsafe.gguf": (reasons["unsafe.gguf"][0], 30),
        "moved.gguf": ("its resume metadata names another file (other.gguf)", 40),
        "norepo.gguf": ("its resume metadata does not name the repository and file", 50),
    }
    assert str(reasons["unsafe.gguf"][0]).startswith("its resume metadata is not valid")
    for found in find_partials(tmp_path):
        assert not found.resumable
        assert discard_partial(found.dest_dir, found.filename)
    assert list(tmp_path.iterdir()) == []


def test_orphan_partials_only_where_asked(tmp_path: Path) -> None:
    (tmp_path / "lonely.gguf.partial").write_bytes(b"x" * 7)
    assert find_partials(tmp_path) == []
    (found,) = find_partials(tmp_path, orphans=True)
    assert (found.path, found.done, found.error) == (tmp_path / "lonely.gguf", 7, "its resume metadata is missing")


def test_a_missing_folder_has_no_partials(tmp_path: Path) -> None:
    assert find_partials(tmp_path / "nope", orphans=True) == []


# ------------------------------------------------------------------------------------ the queue


def test_check_on_disk_tells_complete_partial_and_not_started_files(tmp_path: Path) -> None:
    from engine.hub.queue import QueueFile, check_on_disk, make_item

    names = [f"m-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    item = make_item(REPO, "m.gguf", tmp_path, [QueueFile(n, "b" * 64, 1000) for n in names], revision=COMMIT)
    (tmp_path / names[0]).write_bytes(b"x" * 1000)
    write_partial(tmp_path, names[1], b"x" * 300)
    status = check_on_disk(item)
    assert [(f.complete, f.done, f.total) for f in status.files] == [
        (True, 1000, 1000),
        (False, 300, 1000),
        (False, 0, 1000),
    ]
    assert (status.done, status.total, status.files_done, status.complete) == (1300, 3000, 1, False)
    (tmp_path / names[0]).write_bytes(b"x" * 999)  # not the promised size: not complete
    assert not check_on_disk(item).files[0].complete


def test_queue_items_list_every_file_and_a_format_1_file_still_loads(tmp_path: Path) -> None:
    from engine.hub.queue import DownloadQueue, QueueFile, make_item

    state = tmp_path / "queue.json"
    state.write_text(
        json.dumps(
            {
                "format": 1,
                "items": [
                    {
                        "repo": REPO,
                        "filename": "old.gguf",
                        "dest_dir": str(tmp_path),
                        "revision": "main",
                        "expected_sha256": None,
                        "expected_size": 5,
                        "state": "paused",
                        "error": None,
                        "added_at": 1.0,
                    }
                ],
            }
        ),
        encoding="utf-8",
    )
    queue = DownloadQueue(state)
    (old,) = queue.items()
    assert (old.name, old.filename, old.expected_size, old.state) == ("old.gguf", "old.gguf", 5, "paused")
    files = [
        QueueFile("a-00001-of-00002.gguf", "c" * 64, 10),
        QueueFile("a-00002-of-00002.gguf", None, 20),
        QueueFile("mmproj-a.gguf"),
    ]
    first = queue.put(make_item(REPO, "a.gguf", tmp_path, files, revision=COMMIT, endpoint="http://x"))
    again = queue.put(make_item(REPO, "a.gguf", tmp_path, files[:2], revision=COMMIT))  # the same choice, again
    assert again.added_at == first.added_at
    queue.set_state(first.key, "downloading")
    items = DownloadQueue(state).items()
    assert [(i.name, len(i.files), i.state) for i in items] == [("old.gguf", 1, "paused"), ("a.gguf", 2, "downloading")]
    assert items[1].paths == [tmp_path / f.filename for f in files[:2]]
    assert json.loads(state.read_text(encoding="utf-8"))["format"] == 2


def test_a_queue_state_from_a_newer_app_reads_as_paused(tmp_path: Path) -> None:
    from engine.hub.queue import DownloadQueue

    state = tmp_path / "queue.json"
    state.write_text(
        json.dumps(
            {
                "format": 2,
                "items": [
                    {
                        "repo": REPO,
                        "name": "a.gguf",
                        "dest_dir": str(tmp_path),
                        "files": [{"filename": "a.gguf"}],
                        "state": "verifying-later",
                        "future_field": 1,
                    }
                ],
            }
        ),
        encoding="utf-8",
    )
    (item,) = DownloadQueue(state).items()
    assert item.state == "paused"
