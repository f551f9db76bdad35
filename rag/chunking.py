"""Structure-aware chunking sized in tokens of the embedding model, with overlap and exact spans.

How a document becomes chunks:

1. Sections are grouped into runs with the same page and heading; a chunk never crosses a group,
   so each chunk has one page and one heading to cite.
2. Each section becomes *pieces*, the smallest units a chunk is built from, each counted once with
   ``count_tokens``: sentences for prose; whole blocks for code, tables and headings when they fit
   (else blank-line blocks, then lines). A piece still over ``max_tokens`` is halved at the
   whitespace nearest its middle, and only a single over-long word is cut between characters.
3. Pieces are packed greedily up to ``max_tokens``. When the next piece does not fit, the chunk
   ends at the strongest boundary (section > paragraph > line > sentence > word) in its second
   half. The next chunk starts with the last pieces of the previous one, up to ``overlap_tokens``.
4. Each chunk's text is ``full_text[start:end]`` exactly, and is counted once more to guarantee
   the bound even for tokenizers where counts are not additive.

``count_tokens`` is therefore called about twice per sentence, never on growing prefixes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from rag.loaders import ParsedDocument, Section

_SECTION, _PARAGRAPH, _LINE, _SENTENCE, _WORD, _CHAR = 5, 4, 3, 2, 1, 0
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n\s*")
_SENTENCE_END = re.compile(r"[.!?…]+[\"'”’)\]]*\s+|[。！？]+[」』”’)]*\s*")
_SPACE = re.compile(r"\s+")
_NEWLINE = re.compile(r"\n")


@dataclass(frozen=True)
class Chunk:
    """A passage to embed and cite.

    Attributes:
        text: Exactly ``doc.full_text()[start:end]``.
        page: 1-based page (PDFs), else None.
        heading: The heading path of the section it comes from, or None.
        start: Start offset in the document's full text.
        end: End offset (exclusive).
        index: Position of the chunk in the document, from 0.
    """

    text: str
    page: int | None
    heading: str | None
    start: int
    end: int
    index: int


class _Piece(NamedTuple):
    start: int
    end: int
    tokens: int
    strength: int  # how good a place to cut the boundary *before* this piece is


class _Splitter:
    """Cuts sections into counted pieces, each within ``max_tokens``."""

    def __init__(self, text: str, count_tokens: Callable[[str], int], max_tokens: int) -> None:
        self.text = text
        self.count = count_tokens
        self.max_tokens = max_tokens

    def _span(self, start: int, end: int) -> tuple[int, int]:
        """Shrink a span to exclude leading and trailing whitespace."""
        text = self.text
        while start < end and text[start].isspace():
            start += 1
        while end > start and text[end - 1].isspace():
            end -= 1
        return start, end

    def piece(self, start: int, end: int, strength: int, tokens: int | None = None) -> Iterator[_Piece]:
        """Yield ``[start, end)`` as one piece if it fits, else halves of it (at whitespace if any)."""
        start, end = self._span(start, end)
        if start >= end:
            return
        if tokens is None:
            tokens = self.count(self.text[start:end])
        if tokens <= self.max_tokens or end - start == 1:
            yield _Piece(start, end, tokens, strength)
            return
        mid = (start + end) // 2
        after = _SPACE.search(self.text, mid, end)
        before = max(self.text.rfind(ch, start, mid) for ch in " \n\t")
        if after is None and before <= start:
            yield from self.piece(start, mid, strength)
            yield from self.piece(mid, end, _CHAR)
            return
        if after is not None and (before <= start or after.start() - mid <= mid - before):
            cut, resume = after.start(), after.end()
        else:
            cut, resume = before, before + 1
        yield from self.piece(start, cut, strength)
        yield from self.piece(resume, end, _WORD)

    def prose(self, section: Section, strength: int) -> Iterator[_Piece]:
        """Sentences of a text section; the first of each paragraph carries a paragraph boundary."""
        text = self.text
        for n, (para_start, para_end) in enumerate(
            _split(text, _PARAGRAPH_BREAK, section.start, section.end)
        ):
            pos, boundary = para_start, strength if n == 0 else _PARAGRAPH
            for match in _SENTENCE_END.finditer(text, para_start, para_end):
                yield from self.piece(pos, match.end(), boundary)
                pos, boundary = match.end(), _SENTENCE
            if pos < para_end:
                yield from self.piece(pos, para_end, boundary)

    def block(self, section: Section, strength: int) -> Iterator[_Piece]:
        """A code block, table or heading: whole if it fits, else blank-line blocks, then lines."""
        tokens = self.count(section.text)
        if tokens <= self.max_tokens:
            yield _Piece(section.start, section.end, tokens, strength)
            return
        for n, (para_start, para_end) in enumerate(
            _split(self.text, _PARAGRAPH_BREAK, section.start, section.end)
        ):
            para_strength = strength if n == 0 else _PARAGRAPH
            tokens = self.count(self.text[para_start:para_end])
            if tokens <= self.max_tokens:
                yield _Piece(para_start, para_end, tokens, para_strength)
                continue
            lines = _split(self.text, _NEWLINE, para_start, para_end)
            for m, (line_start, line_end) in enumerate(lines):
                yield from self.piece(line_start, line_end, para_strength if m == 0 else _LINE)


def _split(text: str, pattern: re.Pattern[str], start: int, end: int) -> list[tuple[int, int]]:
    """Spans of ``text[start:end]`` between matches of ``pattern``."""
    spans = []
    pos = start
    for match in pattern.finditer(text, start, end):
        spans.append((pos, match.start()))
        pos = match.end()
    spans.append((pos, end))
    trimmed = []
    for s, e in spans:
        while s < e and text[s].isspace():
            s += 1
        while e > s and text[e - 1].isspace():
            e -= 1
        if s < e:
            trimmed.append((s, e))
    return trimmed


def _pack(
    pieces: list[_Piece],
    text: str,
    count_tokens: Callable[[str], int],
    max_tokens: int,
    overlap_tokens: int,
) -> Iterator[tuple[int, int]]:
    """Yield (start, end) spans of chunks made of consecutive pieces."""
    i, n = 0, len(pieces)
    while i < n:
        total, j = 0, i
        while j < n and total + pieces[j].tokens <= max_tokens:
            total += pieces[j].tokens
            j += 1
        j = max(j, i + 1)
        k = j
        if j < n:  # choose the strongest boundary in the second half of the chunk
            acc = 0
            best = pieces[j].strength
            for m in range(i + 1, j):
                acc += pieces[m - 1].tokens
                if acc * 2 >= max_tokens and pieces[m].strength > best:
                    best, k = pieces[m].strength, m
        while k - 1 > i and count_tokens(text[pieces[i].start : pieces[k - 1].end]) > max_tokens:
            k -= 1  # counts were not additive (separators, merges): drop pieces until it fits
        yield pieces[i].start, pieces[k - 1].end
        if k >= n:
            return
        m, overlap = k, 0
        while (
            m - 1 > i
            and overlap + pieces[m - 1].tokens <= overlap_tokens
            and overlap + pieces[m - 1].tokens + pieces[k].tokens <= max_tokens
        ):
            overlap += pieces[m - 1].tokens
            m -= 1
        if m == k and overlap_tokens:  # the last sentence is too long to repeat whole: repeat its last words
            tail = _tail(
                pieces[k - 1], text, count_tokens, min(overlap_tokens, max_tokens - pieces[k].tokens)
            )
            if tail is not None:
                m -= 1
                pieces[m] = tail  # only pieces from m on are read again
        i = m


def _tail(piece: _Piece, text: str, count_tokens: Callable[[str], int], budget: int) -> _Piece | None:
    """The longest word-aligned end of ``piece`` found within ``budget`` tokens (a few counts), or None."""
    if budget < 1:
        return None
    starts = [match.end() for match in _SPACE.finditer(text, piece.start, piece.end)]
    words = max(1, budget * 3 // 4)  # about 1.3 tokens per word in English WordPiece
    while words and starts:
        start = starts[-min(words, len(starts))]
        tokens = count_tokens(text[start : piece.end])
        if tokens <= budget:
            return _Piece(start, piece.end, tokens, _WORD)
        words //= 2
    return None


def chunk_document(
    doc: ParsedDocument,
    *,
    count_tokens: Callable[[str], int],
    max_tokens: int = 256,
    overlap_tokens: int = 32,
) -> list[Chunk]:
    """Split a parsed document into chunks of at most ``max_tokens`` tokens.

    Args:
        doc: The parsed document.
        count_tokens: Counts tokens as the embedding model will (e.g. its tokenizer without
            special tokens; then leave room for them in ``max_tokens``).
        max_tokens: The largest chunk, in tokens (256 is all-MiniLM-L6-v2's max_seq_length).
        overlap_tokens: How many tokens of the previous chunk (whole sentences or lines) the next
            chunk repeats, within one heading and page.

    Returns:
        Chunks in document order; ``doc.full_text()[c.start:c.end] == c.text`` for each.

    Raises:
        ValueError: ``max_tokens < 1`` or ``overlap_tokens`` not in ``[0, max_tokens)``.
    """
    if max_tokens < 1 or not 0 <= overlap_tokens < max_tokens:
        raise ValueError(
            f"need 1 <= max_tokens and 0 <= overlap_tokens < max_tokens: {max_tokens}, {overlap_tokens}"
        )
    text = doc.full_text()
    splitter = _Splitter(text, count_tokens, max_tokens)
    chunks: list[Chunk] = []
    group: list[_Piece] = []
    key: tuple[int | None, str | None] | None = None

    def flush(page: int | None, heading: str | None) -> None:
        for start, end in _pack(group, text, count_tokens, max_tokens, overlap_tokens):
            chunks.append(Chunk(text[start:end], page, heading, start, end, len(chunks)))
        group.clear()

    for section in doc.sections:
        if (section.page, section.heading) != key:
            if group and key is not None:
                flush(*key)
            key = (section.page, section.heading)
        if section.kind == "text":
            group.extend(splitter.prose(section, _SECTION))
        else:
            group.extend(splitter.block(section, _SECTION))
    if group and key is not None:
        flush(*key)
    return chunks
