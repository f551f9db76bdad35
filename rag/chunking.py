"""Structure-aware chunking sized in tokens of the embedding model, with overlap and exact spans.

Contract: ARCHITECTURE.md, 'rag.chunking'.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from rag.sections import ParsedDocument, Section

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
    tokens: int  # exact if ``exact``, else estimated from the enclosing paragraph's count
    strength: int  # how good a place to cut the boundary *before* this piece is
    exact: bool


class _Splitter:
    """Cuts sections into pieces whose (estimated) token counts are within ``max_tokens``."""

    def __init__(self, text: str, count_tokens: Callable[[str], int], max_tokens: int) -> None:
        self.text = text
        self.count = count_tokens
        self.max_tokens = max_tokens
        self.known: dict[tuple[int, int], int] = {}  # exact counts already paid for, by span

    def exact_count(self, start: int, end: int) -> int:
        tokens = self.known.get((start, end))
        if tokens is None:
            tokens = self.known[start, end] = self.count(self.text[start:end])
        return tokens

    def pieces(self, start: int, end: int, strength: int, ratio: float | None) -> Iterator[_Piece]:
        """``[start, end)`` as one piece if it fits, else its halves (cut at whitespace if any).

        With ``ratio`` (tokens per character) counts are estimated; without, they are exact.
        """
        text = self.text
        while start < end and text[start].isspace():
            start += 1
        while end > start and text[end - 1].isspace():
            end -= 1
        if start >= end:
            return
        if ratio is None:
            tokens = self.exact_count(start, end)
        else:
            tokens = max(1, math.ceil((end - start) * ratio))
        if tokens <= self.max_tokens or end - start == 1:
            yield _Piece(start, end, tokens, strength, ratio is None)
            return
        mid = (start + end) // 2
        after = _SPACE.search(text, mid, end)
        before = max(text.rfind(ch, start, mid) for ch in " \n\t")
        if after is None and before <= start:
            yield from self.pieces(start, mid, strength, ratio)
            yield from self.pieces(mid, end, _CHAR, ratio)
            return
        if after is not None and (before <= start or after.start() - mid <= mid - before):
            cut, resume = after.start(), after.end()
        else:
            cut, resume = before, before + 1
        yield from self.pieces(start, cut, strength, ratio)
        yield from self.pieces(resume, end, _WORD, ratio)

    def _ratio(self, start: int, end: int) -> float:
        return self.exact_count(start, end) / max(1, end - start)

    def prose(self, section: Section, strength: int) -> Iterator[_Piece]:
        """Sentences of a text section; the first of each paragraph carries a paragraph boundary."""
        text = self.text
        for n, (para_start, para_end) in enumerate(_split(text, _PARAGRAPH_BREAK, section.start, section.end)):
            boundary = strength if n == 0 else _PARAGRAPH
            ends = [m.end() for m in _SENTENCE_END.finditer(text, para_start, para_end)]
            if not ends or ends[-1] < para_end:
                ends.append(para_end)
            if len(ends) == 1:  # one sentence: count it exactly
                yield from self.pieces(para_start, para_end, boundary, None)
                continue
            ratio = self._ratio(para_start, para_end)
            pos = para_start
            for end in ends:
                yield from self.pieces(pos, end, boundary, ratio)
                pos, boundary = end, _SENTENCE

    def block(self, section: Section, strength: int) -> Iterator[_Piece]:
        """A code block, table or heading: whole if it fits, else blank-line blocks, then lines."""
        tokens = self.exact_count(section.start, section.end)
        if tokens <= self.max_tokens:
            yield _Piece(section.start, section.end, tokens, strength, True)
            return
        ratio = tokens / max(1, section.end - section.start)
        for n, (para_start, para_end) in enumerate(_split(self.text, _PARAGRAPH_BREAK, section.start, section.end)):
            para_strength = strength if n == 0 else _PARAGRAPH
            if (para_end - para_start) * ratio <= self.max_tokens:
                yield from self.pieces(para_start, para_end, para_strength, ratio)
                continue
            lines = _split(self.text, _NEWLINE, para_start, para_end)
            for m, (line_start, line_end) in enumerate(lines):
                yield from self.pieces(line_start, line_end, para_strength if m == 0 else _LINE, ratio)


def _split(text: str, pattern: re.Pattern[str], start: int, end: int) -> list[tuple[int, int]]:
    """Whitespace-trimmed, non-empty spans of ``text[start:end]`` between matches of ``pattern``."""
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


def _pack(pieces: list[_Piece], splitter: _Splitter, overlap_tokens: int) -> Iterator[tuple[int, int]]:
    """Yield (start, end) spans of chunks made of consecutive pieces; ``pieces`` is edited in place."""
    max_tokens = splitter.max_tokens
    i = fresh = 0  # pieces before ``fresh`` were in the previous chunk (the overlap)
    while i < len(pieces):
        n = len(pieces)
        total, j = 0, i
        while j < n and total + pieces[j].tokens <= max_tokens:
            total += pieces[j].tokens
            j += 1
        j = max(j, i + 1)
        k = j
        if j < n:  # choose the strongest boundary in the second half of the chunk
            acc, best = 0, pieces[j].strength
            for m in range(i + 1, j):
                acc += pieces[m - 1].tokens
                if acc * 2 >= max_tokens and pieces[m].strength > best:
                    best, k = pieces[m].strength, m
        # Verify with one exact count; drop pieces from the end while the estimate was too low.
        while k - 1 > i and splitter.exact_count(pieces[i].start, pieces[k - 1].end) > max_tokens:
            k -= 1
        if k <= fresh:  # only repeated pieces would be left: give up the overlap instead
            i = fresh
            continue
        first = pieces[i]
        if k - 1 == i and not first.exact and splitter.exact_count(first.start, first.end) > max_tokens:
            pieces[i : i + 1] = list(splitter.pieces(first.start, first.end, first.strength, None))
            continue  # a lone piece whose estimate was too low: split it with exact counts, repack
        yield pieces[i].start, pieces[k - 1].end
        if k >= len(pieces):
            return
        fresh = k
        i = _overlap_start(pieces, i, k, splitter, overlap_tokens)


def _overlap_start(pieces: list[_Piece], i: int, k: int, splitter: _Splitter, overlap_tokens: int) -> int:
    """Where the chunk after pieces[i:k] starts: back over about ``overlap_tokens`` of whole pieces.

    If the last piece alone is too long to repeat, its last words are repeated instead (the piece
    list gets a shortened copy of it at k - 1).
    """
    room = min(overlap_tokens, splitter.max_tokens - pieces[k].tokens)
    m, overlap = k, 0
    while m - 1 > i and overlap + pieces[m - 1].tokens <= room:
        overlap += pieces[m - 1].tokens
        m -= 1
    if m < k or room < 1:
        return m
    last = pieces[k - 1]
    starts = [match.end() for match in _SPACE.finditer(splitter.text, last.start, last.end)]
    if not starts:
        return k
    per_char = last.tokens / max(1, last.end - last.start)
    chars = int(room / max(per_char, 1e-9))
    start = next((s for s in starts if last.end - s <= chars), None)
    if start is None:
        return k
    pieces[k - 1] = _Piece(start, last.end, max(1, math.ceil((last.end - start) * per_char)), _WORD, False)
    return k - 1


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
            special tokens; then leave room for them in ``max_tokens``). Called about once per
            paragraph plus once per chunk.
        max_tokens: The largest chunk, in tokens (256 is all-MiniLM-L6-v2's max_seq_length).
        overlap_tokens: About how many tokens of the previous chunk (whole sentences or lines, or
            the last words of a long sentence) the next chunk repeats, within one heading and page.

    Returns:
        Chunks in document order; ``doc.full_text()[c.start:c.end] == c.text`` for each.

    Raises:
        ValueError: ``max_tokens < 1`` or ``overlap_tokens`` not in ``[0, max_tokens)``.
    """
    if max_tokens < 1 or not 0 <= overlap_tokens < max_tokens:
        raise ValueError(f"need 1 <= max_tokens and 0 <= overlap_tokens < max_tokens: {max_tokens}, {overlap_tokens}")
    text = doc.full_text()
    splitter = _Splitter(text, count_tokens, max_tokens)
    chunks: list[Chunk] = []
    group: list[_Piece] = []
    key: tuple[int | None, str | None] | None = None

    def flush(page: int | None, heading: str | None) -> None:
        for start, end in _pack(group, splitter, overlap_tokens):
            chunks.append(Chunk(text[start:end], page, heading, start, end, len(chunks)))
        group.clear()
        splitter.known.clear()

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
