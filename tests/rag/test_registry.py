"""The registry's incremental rules: unchanged, changed, deleted, duplicated, and a 1,000-file rescan."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from standins import CountingParser, FakeEmbedder, MakeKbs, TextParser, paragraph_chunks, write

import rag.ingest
from rag.errors import KnowledgeBaseError
from rag.registry import DocState, Registry, fts_query


def _consistent(kbs, name: str) -> tuple[int, int]:
    """Asserts Chroma holds exactly the registry's embedded chunks; returns (chunks, vectors)."""
    kb = kbs.get(name)
    expected = kbs.registry.embedded_ids(kb.id)
    present = kbs.store.ids(kb.collection)
    assert present == expected
    assert kbs.registry.count_pending(kb.id) == 0
    return len(expected), len(present)


def test_fts_query_drops_stop_words_and_quotes_every_term() -> None:
    assert fts_query("What is the capital of France?") == '"capital" OR "france"'
    assert fts_query('say "NEAR(a b)" -x* AND col:val') == '"near" OR "col" OR "val"'
    assert fts_query("the a of") == ""
    assert fts_query('it"s') == ""  # single letters dropped, quote never reaches FTS5


def test_bm25_survives_hostile_queries(tmp_path: Path) -> None:
    with Registry(tmp_path / "r.sqlite3") as reg:
        kb = reg.create_kb(
            "k",
            embedder_id="m",
            embedder_path="/m",
            dimension=4,
            max_tokens=64,
            overlap_tokens=8,
            collection="c",
        )
        reg.queue(kb.id, [("/doc.txt", 1, 1)])
        doc = reg.document(kb.id, "/doc.txt")
        assert doc is not None
        chunk = type(
            "C",
            (),
            {"text": 'The "quoted" NEAR(term) col:val', "page": 2, "heading": "H", "start": 0, "end": 10},
        )()
        reg.store_content(kb.id, doc.id, sha256="s", size=1, mtime_ns=1, chunks=[chunk])
        ids = [i for i, _ in reg.pending_chunks(kb.id, 10)]
        reg.mark_embedded(ids)
        for query in ['"', "NEAR(", "col:val", "* OR AND", "'; DROP TABLE chunks; --", "quoted"]:
            reg.bm25(kb.id, query, 5)  # must not raise
        assert [i for i, _ in reg.bm25(kb.id, "quoted term", 5)] == ids
        assert reg.document(kb.id, "/doc.txt").state is DocState.INDEXED  # type: ignore[union-attr]


def test_bm25_finds_a_small_kb_crowded_out_by_a_big_one(tmp_path: Path) -> None:
    with Registry(tmp_path / "r.sqlite3") as reg:
        kbs = [
            reg.create_kb(
                name, embedder_id="m", embedder_path="/m", dimension=4, max_tokens=64, overlap_tokens=8, collection=name
            )
            for name in ("big", "small")
        ]
        for kb, texts in ((kbs[0], ["apple apple apple pie"] * 80), (kbs[1], ["one apple among many other words"])):
            reg.queue(kb.id, [("/d", 1, 1)])
            doc = reg.document(kb.id, "/d")
            assert doc is not None
            chunks = [type("C", (), {"text": t, "page": None, "heading": None, "start": 0, "end": 1})() for t in texts]
            reg.store_content(kb.id, doc.id, sha256=kb.name, size=1, mtime_ns=1, chunks=chunks)
            reg.mark_embedded([i for i, _ in reg.pending_chunks(kb.id, 100)])
        small = reg.bm25(kbs[1].id, "apple", 5)
        assert len(small) == 1
        assert len(reg.bm25(kbs[0].id, "apple", 5)) == 5
        assert reg.bm25(kbs[0].id, "banana", 5) == []


def test_names_are_validated_and_unique(tmp_path: Path) -> None:
    with Registry(tmp_path / "r.sqlite3") as reg:
        args = {
            "embedder_id": "m",
            "embedder_path": "/m",
            "dimension": 4,
            "max_tokens": 64,
            "overlap_tokens": 8,
            "collection": "c",
        }
        reg.create_kb("notes", **args)
        with pytest.raises(KnowledgeBaseError, match="already exists"):
            reg.create_kb("notes", **args)
        with pytest.raises(KnowledgeBaseError, match="one line"):
            reg.create_kb("bad\nname", **args)
        with pytest.raises(KnowledgeBaseError) as info:
            reg.get_kb("missing")
        assert str(info.value) == "missing: no such knowledge base"


def test_incremental_rules(tmp_path: Path, make_kbs: MakeKbs) -> None:
    docs = tmp_path / "docs"
    a = write(docs, "a.md", "# Apples\n\nApples grow on trees in orchards.\n")
    b = write(docs, "b.txt", "Bananas are yellow and grow in bunches.\n")
    write(docs, "sub/c.txt", "Cherries are small red stone fruits.\n")
    kbs = make_kbs()
    parser: CountingParser = kbs._parser  # type: ignore[assignment]
    kbs.create("fruit")

    first = kbs.add("fruit", [docs])
    assert (first.indexed, first.unchanged) == (3, 0)
    chunks, _ = _consistent(kbs, "fruit")
    assert chunks == 3

    # Unchanged: a stat, no parse.
    parser.parsed.clear()
    again = kbs.add("fruit", [docs])
    assert (again.indexed, again.unchanged, parser.parsed) == (0, 3, [])

    # Touched but identical: hashed, not parsed, still the same chunks.
    st = a.stat()
    os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    touched = kbs.add("fruit", [docs])
    assert (touched.indexed, parser.parsed) == (0, [])
    assert _consistent(kbs, "fruit")[0] == 3

    # Changed: its chunks are replaced, nothing else re-parsed.
    kb = kbs.get("fruit")
    old_ids = kbs.registry.embedded_ids(kb.id)
    b.write_text("Bananas are yellow. Plantains are their starchy cousins.\n", encoding="utf-8")
    changed = kbs.add("fruit", [docs])
    assert changed.indexed == 1
    assert parser.parsed == [b]
    new_ids = kbs.registry.embedded_ids(kb.id)
    assert len(new_ids) == 3
    assert len(old_ids & new_ids) == 2
    assert "Plantains" in kbs.query("fruit", "starchy plantains", k=1)[0].text

    # Same content twice: stored once, both paths listed.
    dup = write(docs, "copy-of-a.md", a.read_text(encoding="utf-8"))
    dupe = kbs.add("fruit", [dup])
    assert dupe.duplicates == 1
    assert _consistent(kbs, "fruit")[0] == 3
    states = {Path(d.path).name: (d.state, d.n_chunks) for d in kbs.documents("fruit")}
    assert states["copy-of-a.md"] == (DocState.INDEXED, 1)

    # Deleting one of two copies keeps the shared content; deleting the other drops it.
    a.unlink()
    pruned = kbs.add("fruit", [docs])
    assert pruned.removed == 1
    assert _consistent(kbs, "fruit")[0] == 3
    assert kbs.remove("fruit", dup) == 1
    assert _consistent(kbs, "fruit")[0] == 2

    # Removing a folder forgets everything under it (the files stay on disk).
    assert kbs.remove("fruit", docs / "sub") == 1
    assert (docs / "sub" / "c.txt").exists()
    assert [Path(d.path).name for d in kbs.documents("fruit")] == ["b.txt"]
    with pytest.raises(KnowledgeBaseError, match="not in knowledge base fruit"):
        kbs.remove("fruit", docs / "sub")


def test_rescan_of_1000_unchanged_files_reads_none_and_queries_in_bulk(
    tmp_path: Path, make_kbs: MakeKbs, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = tmp_path / "many"
    for i in range(1000):
        write(docs, f"d{i // 100}/f{i}.txt", f"note number {i}\n")
    fake = FakeEmbedder()
    model = tmp_path / "fake-model"
    kbs = make_kbs(embedders={str(model): fake}, parser=TextParser(), chunker=paragraph_chunks)
    model.mkdir()
    (model / "modules.json").write_text("[]", encoding="utf-8")
    kbs.create("many", embedder_path=model)
    first = kbs.add("many", [docs])
    assert first.indexed == 1000
    assert first.chunks_added == 1000

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("an unchanged file was read")

    monkeypatch.setattr(rag.ingest, "sha256_file", forbidden)
    monkeypatch.setattr(kbs, "_parser", type("P", (), {"parse": forbidden})())
    encoded = fake.encoded
    statements: list[str] = []  # what the rescan asked of the registry's database
    kbs.registry._db.set_trace_callback(statements.append)
    try:
        again = kbs.add("many", [docs])
    finally:
        kbs.registry._db.set_trace_callback(None)
    assert again.unchanged == 1000
    assert again.indexed == 0
    assert fake.encoded == encoded
    # Counted, not timed: a handful of statements for all 1,000 files (5 here), not one or more per file.
    assert len(statements) <= 50, len(statements)
