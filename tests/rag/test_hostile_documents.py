"""Hostile documents through ``kb add`` (ROBUSTNESS I2, I4, I6, I8): each ends with the file skipped
(one line saying why) or indexed, in bounded time and memory, and the rest of the batch indexed.

Every case is a folder of three ordinary notes plus one hostile entry, added with the real loaders in
their child process (``rag.parsing.ParserPool``, one for this module) and the real chunker; the
embedder is the hashed bag of words of ``standins`` (no model to load). The bounds asserted:

- time: each ``add`` ends within ``DEADLINE_S`` (it runs in a thread; the test fails instead of
  hanging), and the parser's own per-file limit (60 s) is never what ended it;
- memory: the parser child runs under an address-space limit (``RLIMIT_AS``, checked in
  ``/proc/<pid>/limits``: ``rag.parsing.DEFAULT_MAX_MEMORY_BYTES``, 2 GiB), and its peak resident
  size (``VmHWM``, read after every file it parsed) stays under ``PEAK_RSS_BYTES``; the test process
  never reads a hostile file whole (the 1 GiB zip member and the 2 GiB sparse file are written in
  1 MiB steps, and a 2 GiB file is refused before it is hashed).

The fixtures are built here, in streaming fashion: a DOCX whose ``word/document.xml`` inflates to
1 GiB (as the zip says, and once with sizes that lie), a PDF with 100,000 empty pages (a page tree
of 1,000 nodes written by hand), HTML nested 100,000 elements deep, a 2 GiB sparse text file
(``os.truncate``), symlink loops in a folder, and files rewritten while they are indexed.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import sqlite3
import struct
import sys
import threading
import time
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from doc_fixtures import write_docx
from standins import FakeEmbedder, write

from rag import ingest
from rag.errors import KnowledgeBaseError
from rag.ingest import IngestReport
from rag.knowledge import KnowledgeBases
from rag.parsing import DEFAULT_MAX_MEMORY_BYTES, ParserPool
from rag.registry import DocState

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS, /proc and sparse files as on Linux"),
    pytest.mark.timeout(180),
]

MiB = 2**20
GiB = 2**30
DEADLINE_S = 45.0  # the slowest case (100,000 PDF pages) takes about 6 s here
PEAK_RSS_BYTES = 1 * GiB  # half the child's address-space limit
NOTES = {
    "a-lighthouse.txt": "Lighthouses guide ships past the rocks at night.\n\nThe keeper trims the wick.",
    "b-orchard.md": "# Orchard\n\nApple trees blossom in spring and are picked in autumn.",
    "c-station.txt": "The night train leaves the station at eleven o'clock.",
}


# ---------------------------------------------------------------------------------------- fixtures


class PeakParser:
    """The module's parser pool, recording the child's peak RSS after each file and who was parsed;
    ``before`` runs before a file is handed to the child (to rewrite it)."""

    def __init__(self, pool: ParserPool) -> None:
        self.pool = pool
        self.max_file_bytes = pool.max_file_bytes
        self.parsed: list[Path] = []
        self.peaks: list[int] = []
        self.address_space: set[str] = set()
        self.before: Callable[[Path], None] | None = None

    def parse(self, path: Path, timeout_s: float = 60.0, *, cancel: threading.Event | None = None) -> Any:
        self.parsed.append(path)
        if self.before is not None:
            self.before(path)
        try:
            return self.pool.parse(path, timeout_s, cancel=cancel)
        finally:
            self._record()

    def _record(self) -> None:
        pid = self.pool.pid
        if pid is None:
            return
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                self.peaks.append(int(line.split()[1]) * 1024)
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
            if line.startswith("Max address space"):
                self.address_space.add(line.split()[3])  # the soft limit


@pytest.fixture(scope="module")
def pool() -> Iterator[ParserPool]:
    with ParserPool() as opened:
        yield opened


@pytest.fixture
def parser(pool: ParserPool) -> PeakParser:
    return PeakParser(pool)


@pytest.fixture
def kbs(tmp_path: Path, parser: PeakParser) -> Iterator[KnowledgeBases]:
    model = tmp_path / "fake-model"
    model.mkdir()
    (model / "modules.json").write_text("[]", encoding="utf-8")
    fake = FakeEmbedder()
    with KnowledgeBases(tmp_path / "kb", model, embedder_factory=lambda folder: fake, parser=parser) as opened:
        opened.create("k", embedder_path=model)
        yield opened


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    folder = tmp_path / "docs"
    for name, text in NOTES.items():
        write(folder, name, text)
    return folder


def _add_within(kbs: KnowledgeBases, paths: list[Path]) -> tuple[IngestReport, float]:
    """``kbs.add("k", paths)`` in a thread; fails the test if it has not ended within ``DEADLINE_S``."""
    done: list[IngestReport] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            done.append(kbs.add("k", paths))
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    started = time.monotonic()
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(DEADLINE_S)
    assert not worker.is_alive(), f"kb add did not end within {DEADLINE_S:g} s"
    if errors:
        raise errors[0]
    return done[0], time.monotonic() - started


def _check_batch(kbs: KnowledgeBases, report: IngestReport, parser: PeakParser) -> dict[str, Any]:
    """The bounds every case shares; returns the registry's documents by file name."""
    by_name = {Path(d.path).name: d for d in kbs.documents("k")}
    for name in NOTES:
        assert by_name[name].state is DocState.INDEXED, (name, by_name[name].reason)
    for path, reason in report.failures:
        assert "\n" not in reason and "Traceback" not in reason, (path, reason)
        assert "took longer than" not in reason, reason  # ended by the bound on time, not by the check
    assert parser.peaks, "the parser child was never asked"
    assert parser.address_space == {str(DEFAULT_MAX_MEMORY_BYTES)}, parser.address_space
    assert max(parser.peaks) < PEAK_RSS_BYTES, f"parser peak RSS {max(parser.peaks) / MiB:.0f} MiB"
    return by_name


def _reason(kbs: KnowledgeBases, name: str) -> str:
    (doc,) = [d for d in kbs.documents("k") if Path(d.path).name == name]
    assert doc.state is DocState.SKIPPED, (doc.state, doc.reason)
    assert doc.reason is not None and "\n" not in doc.reason
    return doc.reason


# ---------------------------------------------------------------------------------------- builders


def _bomb_docx(path: Path, member_bytes: int = GiB) -> Path:
    """A DOCX (from python-docx) whose ``word/document.xml`` is ``member_bytes`` of spaces,
    deflated in 1 MiB writes: the zip says its true size."""
    source = write_docx(path.with_suffix(".src.docx"))
    block = b" " * MiB
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as out:
        for info in src.infolist():
            if info.filename != "word/document.xml":
                out.writestr(info, src.read(info.filename))
        with out.open("word/document.xml", "w") as member:
            for _ in range(member_bytes // MiB):
                member.write(block)
    source.unlink()
    return path


def _lie_about_sizes(bomb: Path, path: Path, declared: int, *, forge_crc: bool = False) -> Path:
    """A copy of ``bomb`` whose local and central headers say ``word/document.xml`` holds only
    ``declared`` bytes (a ratio under the per-member check), while its data still inflates to 1 GiB;
    ``forge_crc`` also gives it the CRC of its first ``declared`` bytes, so a reader that stops
    there finds nothing wrong."""
    data = bytearray(bomb.read_bytes())
    name = b"word/document.xml"
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as zf:
        info = zf.getinfo(name.decode())
    assert info.file_size == GiB and declared // max(info.compress_size, 1) < 100
    local = info.header_offset
    assert data[local : local + 4] == b"PK\x03\x04"
    struct.pack_into("<I", data, local + 22, declared)  # uncompressed size in the local header
    central = data.index(b"PK\x01\x02", local + info.compress_size)
    while data[central + 46 : central + 46 + len(name)] != name:  # the name follows the 46-byte header
        central = data.index(b"PK\x01\x02", central + 4)
    struct.pack_into("<I", data, central + 24, declared)  # and in the central directory
    if forge_crc:
        crc, block = 0, b" " * MiB
        for _ in range(declared // MiB):
            crc = zlib.crc32(block, crc)
        struct.pack_into("<I", data, local + 14, crc)
        struct.pack_into("<I", data, central + 16, crc)
    path.write_bytes(bytes(data))
    return path


def _empty_pages_pdf(path: Path, n_pages: int, fanout: int = 100) -> Path:
    """A PDF with ``n_pages`` empty pages under a two-level page tree, with a correct xref table."""
    out = io.BytesIO()
    out.write(b"%PDF-1.7\n")
    offsets: dict[int, int] = {}

    def obj(number: int, body: bytes) -> None:
        offsets[number] = out.tell()
        out.write(b"%d 0 obj\n%s\nendobj\n" % (number, body))

    n_nodes = -(-n_pages // fanout)
    first_node, first_page = 3, 3 + n_nodes
    obj(1, b"<< /Type /Catalog /Pages 2 0 R >>")
    kids = b" ".join(b"%d 0 R" % (first_node + i) for i in range(n_nodes))
    obj(2, b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, n_pages))
    for node in range(n_nodes):
        pages = range(node * fanout, min(n_pages, (node + 1) * fanout))
        refs = b" ".join(b"%d 0 R" % (first_page + p) for p in pages)
        obj(first_node + node, b"<< /Type /Pages /Parent 2 0 R /Kids [%s] /Count %d >>" % (refs, len(pages)))
    for page in range(n_pages):
        parent = first_node + page // fanout
        obj(first_page + page, b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 612 792] >>" % parent)
    total = first_page + n_pages
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % total)
    out.write(b"".join(b"%010d 00000 n \n" % offsets[n] for n in range(1, total)))
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (total, xref))
    path.write_bytes(out.getvalue())
    return path


@pytest.fixture(scope="module")
def bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built once (about 1.5 s, 5 MB on disk)."""
    return _bomb_docx(tmp_path_factory.mktemp("bomb") / "bomb.docx")


# ---------------------------------------------------------------------------------------- cases


def test_a_docx_whose_document_inflates_to_1_gib_is_skipped(
    kbs: KnowledgeBases, docs: Path, parser: PeakParser, bomb: Path
) -> None:
    target = docs / "d-bomb.docx"
    target.write_bytes(bomb.read_bytes())
    report, _ = _add_within(kbs, [docs])
    _check_batch(kbs, report, parser)
    reason = _reason(kbs, target.name)
    assert re.fullmatch(r"archive unpacks to 1,02\d MB, limit 256 MB \(possible zip bomb\)", reason), reason


@pytest.mark.parametrize(
    ("forge_crc", "expected"),
    [
        (False, "corrupt archive (Bad CRC-32 for file 'word/document.xml')"),  # stopped at the declared size
        (True, "corrupt DOCX (bad XML: "),  # read as declared (200 MiB of spaces), which is no XML
    ],
    ids=["crc-of-1-gib", "crc-forged"],
)
def test_a_docx_that_lies_about_its_sizes_is_skipped_with_memory_bounded(
    kbs: KnowledgeBases, docs: Path, parser: PeakParser, bomb: Path, forge_crc: bool, expected: str
) -> None:
    target = _lie_about_sizes(bomb, docs / "d-liar.docx", declared=200 * MiB, forge_crc=forge_crc)
    report, _ = _add_within(kbs, [docs])
    _check_batch(kbs, report, parser)  # the child's peak RSS: under 1 GiB, not the 1 GiB member
    assert _reason(kbs, target.name).startswith(expected)


@pytest.mark.slow  # about 6 s: pypdf walks 100,000 page objects
def test_a_pdf_with_100k_empty_pages_is_skipped(kbs: KnowledgeBases, docs: Path, parser: PeakParser) -> None:
    target = _empty_pages_pdf(docs / "d-pages.pdf", 100_000)
    report, _ = _add_within(kbs, [docs])
    _check_batch(kbs, report, parser)
    reason = _reason(kbs, target.name)
    assert reason.startswith(("could not be parsed safely (possible PDF bomb", "no text layer")), reason


def test_html_nested_100k_deep_is_indexed(kbs: KnowledgeBases, docs: Path, parser: PeakParser) -> None:
    n = 100_000
    target = docs / "d-deep.html"
    with target.open("w", encoding="utf-8") as fh:
        fh.write("<html><body><h1>Deep</h1>")
        for opening in ("<div>", "<span>", "<table><tr><td>", "<ul><li>"):
            fh.write(opening * (n // 4))
        fh.write("The treasure lies at the bottom of the well.")
        for closing in ("</li></ul>", "</td></tr></table>", "</span>", "</div>"):
            fh.write(closing * (n // 4))
        fh.write("<p>After the nesting.</p></body></html>")
    report, _ = _add_within(kbs, [docs])
    by_name = _check_batch(kbs, report, parser)
    assert by_name[target.name].state is DocState.INDEXED, by_name[target.name].reason
    hits = kbs.registry.bm25(kbs.get("k").id, "treasure well", 3)
    assert hits, "the text at the bottom of the nesting was not indexed"


def test_a_2_gib_sparse_text_file_is_skipped_without_being_read(
    kbs: KnowledgeBases, docs: Path, parser: PeakParser, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = docs / "d-huge.txt"
    with target.open("wb") as fh:
        fh.write(b"A text file that is mostly hole.\n")
    os.truncate(target, 2 * GiB)
    hashed: list[Path] = []
    real_hash = ingest.sha256_file
    monkeypatch.setattr(ingest, "sha256_file", lambda path: hashed.append(path) or real_hash(path))
    report, _ = _add_within(kbs, [docs])  # its DEADLINE_S is the hang guard; the bound is counted:
    _check_batch(kbs, report, parser)
    assert _reason(kbs, target.name) == "too large: 2,048.0 MB, limit 512 MB"
    assert target not in hashed and target not in parser.parsed  # a stat, not a read of 2 GiB


def test_symlink_loops_in_a_folder_are_left_out(kbs: KnowledgeBases, docs: Path, parser: PeakParser) -> None:
    (docs / "loop").symlink_to("loop")  # itself
    (docs / "ping").symlink_to("pong")
    (docs / "pong").symlink_to("ping")
    sub = docs / "sub"
    sub.mkdir()
    write(sub, "d-inner.txt", "A note in a sub-folder, next to links that go round in circles.")
    (sub / "up").symlink_to("..")
    (sub / "here").symlink_to(".")
    (sub / "root").symlink_to(docs)
    report, _ = _add_within(kbs, [docs])
    by_name = _check_batch(kbs, report, parser)
    assert sorted(by_name) == sorted([*NOTES, "d-inner.txt"])  # each file once, no link followed
    assert by_name["d-inner.txt"].state is DocState.INDEXED
    with pytest.raises(KnowledgeBaseError, match="a symbolic link loop") as caught:
        kbs.add("k", [docs / "loop"])
    assert "\n" not in str(caught.value)


def _content(kbs: KnowledgeBases, path: Path) -> tuple[str | None, str]:
    """(the sha256 the registry holds for ``path``, the text of its stored chunks)."""
    db = sqlite3.connect(f"file:{kbs.root / 'registry.sqlite3'}?mode=ro", uri=True)
    try:
        sha, content_id = db.execute("SELECT sha256, content_id FROM documents WHERE path = ?", (str(path),)).fetchone()
        texts = db.execute("SELECT text FROM chunks WHERE content_id = ? ORDER BY idx", (content_id,)).fetchall()
    finally:
        db.close()
    return sha, " ".join(t for (t,) in texts)


def test_a_file_rewritten_while_it_is_indexed_is_indexed_as_it_now_is(
    kbs: KnowledgeBases, docs: Path, parser: PeakParser
) -> None:
    target = write(docs, "d-draft.txt", "First draft: the meeting is on Monday.")
    copy = docs / "e-copy-of-first-draft.txt"
    rewritten: list[Path] = []

    def rewrite_once(path: Path) -> None:  # after it was hashed, before the parser reads it
        if path == target and not rewritten:
            rewritten.append(path)
            target.write_text("Second draft: the meeting moved to Thursday afternoon.", encoding="utf-8")

    parser.before = rewrite_once
    report, _ = _add_within(kbs, [docs])
    by_name = _check_batch(kbs, report, parser)
    assert rewritten and by_name[target.name].state is DocState.INDEXED
    sha, text = _content(kbs, target)
    assert sha == hashlib.sha256(target.read_bytes()).hexdigest()  # the hash of what was chunked
    assert "Thursday" in text and "Monday" not in text

    # A file with the first draft's bytes is indexed as the first draft, not as what the rewrite left.
    copy.write_text("First draft: the meeting is on Monday.", encoding="utf-8")
    _add_within(kbs, [docs])
    assert "Monday" in _content(kbs, copy)[1]


def test_a_file_that_keeps_changing_is_skipped_and_indexed_once_it_stops(
    kbs: KnowledgeBases, docs: Path, parser: PeakParser
) -> None:
    target = write(docs, "d-log.txt", "log line 0")
    writes = [0]

    def append(path: Path) -> None:
        if path == target:
            writes[0] += 1
            with target.open("a", encoding="utf-8") as fh:
                fh.write(f"\nlog line {writes[0]}")

    parser.before = append
    report, _ = _add_within(kbs, [docs])
    _check_batch(kbs, report, parser)
    assert writes[0] == 2  # read twice at most, then left for later
    assert _reason(kbs, target.name).startswith("the file changed while it was being indexed")

    parser.before = None
    _add_within(kbs, [docs])
    (doc,) = [d for d in kbs.documents("k") if d.path == str(target)]
    assert doc.state is DocState.INDEXED
    assert "log line 2" in _content(kbs, target)[1]
