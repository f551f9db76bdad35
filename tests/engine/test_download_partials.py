"""engine.download_queue.find_partials: what a restarted app offers to resume or discard."""

from __future__ import annotations

import json
from pathlib import Path

from engine.download_queue import find_partials
from engine.downloads import discard_partial, partial_paths

REPO = "acme/tiny-GGUF"
COMMIT = "a" * 40


def write_partial(dest: Path, name: str, data: bytes, **meta: object) -> tuple[Path, Path]:
    """A partial download as the engine leaves it: the bytes and the resume metadata."""
    _, partial, meta_path = partial_paths(dest, name)
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_bytes(data)
    document = {"format": 1, "repo": REPO, "filename": name, "revision": "main", "commit": COMMIT,
                "endpoint": "http://127.0.0.1:9", "expected_size": 1000, "expected_sha256": "b" * 64,
                "total": 1000, "done": len(data), "updated_at": 5.0, **meta}
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
