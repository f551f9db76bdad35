"""The ingest pipeline: states, progress, pause/cancel, queries during indexing, model change,
store repair, and kill -9 convergence."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from standins import FakeEmbedder, MakeKbs, TextParser, paragraph_chunks, write

from rag.errors import KnowledgeBaseError
from rag.ingest import IngestProgress
from rag.knowledge import KnowledgeBases
from rag.registry import DocState
from tests.disk_support import registry_counts

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

WORDS = [
    "river",
    "stone",
    "lantern",
    "harvest",
    "copper",
    "violin",
    "meadow",
    "glacier",
    "orchard",
    "falcon",
    "quartz",
    "ember",
    "tide",
    "willow",
    "saffron",
    "compass",
    "marble",
    "thunder",
    "velvet",
    "canyon",
]


def _paragraph(seed: int, n: int = 30) -> str:
    common = [WORDS[(seed * 7 + i * 3) % len(WORDS)] for i in range(n)]
    unique = [f"token{seed}x{j}" for j in range(12)]  # keeps paragraphs apart for near-dup removal
    return " ".join(common + unique) + "."


def _fake_model(tmp_path: Path, name: str = "fake-model") -> Path:
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    (folder / "modules.json").write_text("[]", encoding="utf-8")
    return folder


def _make_corpus(folder: Path, n_files: int, paragraphs: int = 4) -> list[Path]:
    return [
        write(folder, f"doc{i:03}.txt", "\n\n".join(_paragraph(i * 10 + p) for p in range(paragraphs)))
        for i in range(n_files)
    ]


def test_real_formats_states_and_page_citations(tmp_path: Path, make_kbs: MakeKbs) -> None:
    from fpdf import FPDF

    docs = tmp_path / "docs"
    write(docs, "guide.md", "# Setup\n\nInstall the widget with the blue lever.\n\n## Care\n\nOil it monthly.\n")
    write(docs, "empty.txt", "")
    (docs / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(200))
    pdf = FPDF()
    for text in ("The first page talks about tea ceremonies.", "Volcanoes erupt basalt lava on page two."):
        pdf.add_page()
        pdf.set_font("helvetica", size=12)
        pdf.multi_cell(0, 10, text)
    pdf.output(str(docs / "report.pdf"))

    kbs = make_kbs()
    kbs.create("mixed")
    seen: list[IngestProgress] = []
    report = kbs.add("mixed", [docs], progress=seen.append)
    assert (report.indexed, report.skipped) == (2, 2)
    states = {Path(d.path).name: (d.state, d.reason) for d in kbs.documents("mixed")}
    assert states["guide.md"][0] is DocState.INDEXED
    assert states["report.pdf"][0] is DocState.INDEXED
    assert states["empty.txt"][0] is DocState.SKIPPED
    assert states["image.png"][0] is DocState.SKIPPED
    assert states["image.png"][1]
    assert seen[-1].state == "done"
    assert seen[-1].files_total == 4
    assert [p.files_done for p in seen] == sorted(p.files_done for p in seen)

    top = kbs.query("mixed", "volcano basalt lava", k=1)[0]
    assert Path(top.path).name == "report.pdf"
    assert top.page == 2
    assert top.dense_score is not None
    assert top.bm25_score is not None
    heading = kbs.query("mixed", "how often should I oil it", k=1)[0]
    assert heading.heading is not None
    assert "Care" in heading.heading


def test_queries_are_answered_while_indexing_runs(tmp_path: Path, make_kbs: MakeKbs) -> None:
    model = _fake_model(tmp_path)
    fake = FakeEmbedder(delay_s=0.002)
    kbs = make_kbs(embedders={str(model): fake}, parser=TextParser(), chunker=paragraph_chunks)
    kbs.create("live", embedder_path=model)
    _make_corpus(tmp_path / "docs", 30)
    mid_batch = threading.Event()
    queried = threading.Event()
    answers: list[int] = []

    def progress(p: IngestProgress) -> None:
        if p.chunks_done and not mid_batch.is_set():
            mid_batch.set()
            assert queried.wait(30), "a query could not run while indexing"

    worker = threading.Thread(target=lambda: kbs.add("live", [tmp_path / "docs"], progress=progress))
    worker.start()
    try:
        assert mid_batch.wait(60)
        answers.append(len(kbs.query("live", "river stone lantern", k=3)))
        queried.set()
    finally:
        queried.set()
        worker.join(60)
    assert not worker.is_alive()
    assert answers == [3]


def test_pause_and_cancel_then_resume(tmp_path: Path, make_kbs: MakeKbs) -> None:
    model = _fake_model(tmp_path)
    kbs = make_kbs(embedders={str(model): FakeEmbedder()}, parser=TextParser(), chunker=paragraph_chunks)
    kbs.create("k", embedder_path=model)
    _make_corpus(tmp_path / "docs", 12)

    pause, cancel = threading.Event(), threading.Event()
    pause.set()
    states: list[str] = []
    worker = threading.Thread(
        target=lambda: kbs.add(
            "k", [tmp_path / "docs"], progress=lambda p: states.append(p.state), pause=pause, cancel=cancel
        )
    )
    worker.start()
    deadline = time.monotonic() + 30
    while "paused" not in states and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "paused" in states
    time.sleep(0.2)
    assert "indexing" not in states  # nothing happens while paused
    cancel.set()
    worker.join(30)
    assert states[-1] == "cancelled"
    assert {d.state for d in kbs.documents("k")} == {DocState.QUEUED}

    def cancel_after_three(p: IngestProgress) -> None:
        if p.files_done >= 3:
            cancel.set()

    cancel.clear()
    report = kbs.add("k", [tmp_path / "docs"], progress=cancel_after_three, cancel=cancel)
    assert report.cancelled
    assert 3 <= report.indexed < 12
    resumed = kbs.add("k", [tmp_path / "docs"])
    assert resumed.indexed + report.indexed == 12
    assert {d.state for d in kbs.documents("k")} == {DocState.INDEXED}


def test_switching_the_embedding_model_uses_a_new_collection(tmp_path: Path, make_kbs: MakeKbs) -> None:
    small, other = _fake_model(tmp_path, "small"), _fake_model(tmp_path, "other")
    (other / "config.json").write_text('{"hidden": 32}', encoding="utf-8")
    kbs = make_kbs(
        embedders={str(small): FakeEmbedder(64, "small"), str(other): FakeEmbedder(32, "other")},
        parser=TextParser(),
        chunker=paragraph_chunks,
    )
    before = kbs.create("k", embedder_path=small)
    _make_corpus(tmp_path / "docs", 3)
    kbs.add("k", [tmp_path / "docs"])
    report = kbs.reindex("k", embedder_path=other)
    after = kbs.get("k")
    assert report.indexed == 3
    assert (after.dimension, after.collection != before.collection) == (32, True)
    assert after.embedder_id != before.embedder_id
    assert kbs.query("k", "river stone", k=2)  # no dimension error
    assert kbs.store.count(after.collection) == len(kbs.registry.embedded_ids(after.id))
    names = {getattr(c, "name", c) for c in kbs.store._client.list_collections()}
    assert before.collection not in names


def test_store_is_repaired_from_the_registry(tmp_path: Path, make_kbs: MakeKbs) -> None:
    model = _fake_model(tmp_path)
    fake = FakeEmbedder()
    kbs = make_kbs(embedders={str(model): fake}, parser=TextParser(), chunker=paragraph_chunks)
    kb = kbs.create("k", embedder_path=model)
    _make_corpus(tmp_path / "docs", 5)
    kbs.add("k", [tmp_path / "docs"])
    ids = sorted(kbs.registry.embedded_ids(kb.id))
    kbs.store.delete(kb.collection, ids[:3])
    kbs.store.upsert(kb.collection, [987654], fake.encode(["stray vector nobody owns"]))
    report = kbs.refresh("k")
    assert report.repaired == 3
    assert report.chunks_added == 3
    assert kbs.store.ids(kb.collection) == set(ids)


def test_a_second_process_cannot_open_the_same_folder(tmp_path: Path, make_kbs: MakeKbs) -> None:
    make_kbs(root=tmp_path / "kb")
    with pytest.raises(KnowledgeBaseError) as info:
        KnowledgeBases(tmp_path / "kb")
    assert "in use by another Glassbox process" in str(info.value)
    assert "\n" not in str(info.value)


_CHILD = """
import sys
from pathlib import Path
from standins import FakeEmbedder, TextParser, paragraph_chunks
from rag.knowledge import KnowledgeBases
from rag.errors import KnowledgeBaseError

root, docs, model = (Path(a) for a in sys.argv[1:4])
fake = FakeEmbedder(delay_s=float(sys.argv[4]))
with KnowledgeBases(root, model, embedder_factory=lambda p: fake, parser=TextParser(),
                    chunker=paragraph_chunks) as kbs:
    try:
        kbs.get("k")
    except KnowledgeBaseError:
        kbs.create("k", embedder_path=model)
    report = kbs.add("k", [docs])
    print("chunks_added", report.chunks_added, flush=True)
"""


@pytest.mark.slow
def test_kill_9_during_indexing_converges_without_duplicates(tmp_path: Path) -> None:
    docs, root, model = tmp_path / "docs", tmp_path / "kb", _fake_model(tmp_path)
    files = _make_corpus(docs, 40, paragraphs=6)
    script = tmp_path / "child.py"
    script.write_text(_CHILD, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)])}
    db = root / "registry.sqlite3"

    # Kill once while chunks are being stored, once while batches are being embedded.
    for ready in (lambda d, e: d >= 3, lambda d, e: e > 0):
        child = subprocess.Popen(
            [sys.executable, str(script), str(root), str(docs), str(model), "0.01"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 120
        while child.poll() is None and time.monotonic() < deadline and not ready(*registry_counts(db)):
            time.sleep(0.005)
        assert child.poll() is None, f"the child finished before it could be killed: {child.stderr.read()!r}"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
        assert child.returncode == -signal.SIGKILL
    _, embedded_before = registry_counts(db)
    assert embedded_before > 0

    fake = FakeEmbedder()
    with KnowledgeBases(
        root, model, embedder_factory=lambda p: fake, parser=TextParser(), chunker=paragraph_chunks
    ) as kbs:
        report = kbs.add("k", [docs])
        kb = kbs.get("k")
        expected = sum(
            len(paragraph_chunks(TextParser().parse(f), count_tokens=fake.count_tokens, max_tokens=kb.max_tokens))
            for f in files
        )
        registry_ids = kbs.registry.embedded_ids(kb.id)
        assert {d.state for d in kbs.documents("k")} == {DocState.INDEXED}
        assert len(registry_ids) == expected
        assert kbs.store.ids(kb.collection) == registry_ids
        assert kbs.store.count(kb.collection) == expected
        # Work committed before the kills was kept, not redone.
        assert report.chunks_added <= expected - embedded_before + 512
        assert fake.encoded == report.chunks_added
    con = sqlite3.connect(db)
    try:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert con.execute("SELECT count(*) FROM contents").fetchone()[0] == len(files)
    finally:
        con.close()
