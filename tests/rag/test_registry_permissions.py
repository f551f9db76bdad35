"""The knowledge folder is private: the registry (every indexed document's text) and its WAL/SHM files
are 0600, the knowledge folder and its Chroma folder 0700.

The tests run under an ordinary umask (022), where SQLite and Chroma alone create files 0644 in
folders 0755, so each one fails if the documents' text is created, or kept, readable by others.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
from standins import FakeEmbedder, TextParser, paragraph_chunks, write

from rag.knowledge import KnowledgeBases
from rag.registry import Registry
from tests.disk_support import file_mode, usual_umask  # noqa: F401 - a fixture pytestmark names

pytestmark = [
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX permission bits"),
    pytest.mark.usefixtures("usual_umask"),
]


def test_new_registry_with_its_wal_and_shm_files_is_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "knowledge" / "registry.sqlite3"
    with Registry(path) as registry:
        registry.create_kb(
            "notes", embedder_id="m", embedder_path="/m", dimension=4, max_tokens=64, overlap_tokens=0, collection="c"
        )
        wal = path.with_name("registry.sqlite3-wal")
        shm = path.with_name("registry.sqlite3-shm")
        assert wal.exists() and shm.exists()
        assert {p.name: file_mode(p) for p in (path, wal, shm)} == {
            "registry.sqlite3": 0o600,
            "registry.sqlite3-wal": 0o600,
            "registry.sqlite3-shm": 0o600,
        }
    assert file_mode(path.parent) == 0o700


def test_loose_registry_of_an_older_version_is_made_owner_only_once_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "registry.sqlite3"
    Registry(path).close()
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING):
        Registry(path).close()
    assert file_mode(path) == 0o600
    said = [r.getMessage() for r in caplog.records]
    assert f"{path}: other users could read it (mode 644); made it owner-only (600)" in said
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        Registry(path).close()
    assert [r.getMessage() for r in caplog.records if "owner-only" in r.getMessage()] == []


def _open(root: Path, tmp_path: Path) -> KnowledgeBases:
    embedder = FakeEmbedder()
    folder = tmp_path / "fake-embedder"
    folder.mkdir(exist_ok=True)
    return KnowledgeBases(
        root,
        folder,
        embedder_factory=lambda _folder: embedder,
        parser=TextParser(),
        chunker=paragraph_chunks,
        check_timeout_s=None,
    )


def test_knowledge_and_chroma_folders_are_owner_only(tmp_path: Path) -> None:
    root = tmp_path / "data" / "knowledge"
    docs = tmp_path / "docs"
    write(docs, "diary.txt", "A private diary entry about the archaeopteryx.")
    with _open(root, tmp_path) as kbs:
        kbs.create("diary")
        kbs.add("diary", [docs])
        assert [p.text for p in kbs.query("diary", "archaeopteryx")] != []
    chroma = root / "chroma"
    assert (chroma / "chroma.sqlite3").is_file()  # Chroma wrote its files inside the private folder
    assert {p.name: file_mode(p) for p in (root, chroma)} == {"knowledge": 0o700, "chroma": 0o700}
    registry = root / "registry.sqlite3"
    assert file_mode(registry) == 0o600


def test_loose_knowledge_and_chroma_folders_are_made_owner_only_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "knowledge"
    (root / "chroma").mkdir(parents=True, mode=0o755)
    root.chmod(0o755)
    with caplog.at_level(logging.WARNING), _open(root, tmp_path):
        pass
    assert {p.name: file_mode(p) for p in (root, root / "chroma")} == {"knowledge": 0o700, "chroma": 0o700}
    said = [r.getMessage() for r in caplog.records]
    assert f"{root}: other users could read it (mode 755); made it owner-only (700)" in said
    assert f"{root / 'chroma'}: other users could read it (mode 755); made it owner-only (700)" in said
