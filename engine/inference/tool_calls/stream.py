"""The streaming parser of every block-shaped call format (:class:`ToolCallParser`).

Contract: ARCHITECTURE.md, 'engine.inference.tool_calls.stream'.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal

from engine.inference.call_prefix import BareCallPrefix
from engine.inference.tool_calls.call import (
    INCOMPLETE,
    MAX_CALL_CHARS,
    Parsed,
    ParsedCall,
    Piece,
    Schemas,
    merge,
    partial_suffix,
)
from engine.inference.tool_calls.formats import FAMILIES, FORMATS, Block, Family

_WS = " \t\r\n"

MAX_TRIES = 16
"""How many closing markers inside one call's markup are tried as its end while it streams (an
argument may hold the marker); past them the markup is parsed once, at the end of the reply."""

MAX_PARSE_WORK = 8 * MAX_CALL_CHARS
"""The most characters one reply's parser gives its body parsers in all: a reply that keeps
writing closing markers inside an argument cannot make parsing quadratic."""


class ToolCallParser:
    """Splits a streaming reply into text and complete calls.

    Args:
        family: the call format (:data:`~engine.inference.tool_calls.formats.FAMILIES`, a block-shaped one).
        tool_names: the tools offered; in the ``json`` family a bare JSON object is a call only
            when its name is one of them (empty: any name).
        schemas: the tools' argument schemas by name, for formats that write arguments as text.

    Feed it the reply's text as it arrives (any piece sizes); each call returns what is settled so
    far: text pieces, and a :class:`ParsedCall` when a call's markup is complete. Call
    :meth:`finish` at the end of the reply for what was held back.

    Raises:
        ValueError: an unknown family, or one whose replies are whole structures (harmony...).
    """

    def __init__(self, family: Family = "json", tool_names: Collection[str] = (), schemas: Schemas | None = None):
        fmt = FORMATS.get(family)
        if fmt is None:
            raise ValueError(f"unknown tool-call family {family!r} (one of {', '.join(FAMILIES)})")
        if fmt.kind != "blocks":
            raise ValueError(f"the {family!r} format is a whole-reply structure, not call blocks")
        self.family = family
        self.tool_names = frozenset(tool_names)
        self.schemas: Schemas = schemas or {}
        self._blocks = fmt.blocks
        self._opens = tuple(block.open for block in fmt.blocks)
        self._drop = fmt.drop
        self._held_markers = (*self._opens, *self._drop)
        self._bare = fmt.bare
        self._buf = ""
        self._ws = ""
        self._pre = ""
        self._state: Literal["start", "text", "block", "bare"] = "start" if fmt.bare else "text"
        self._block: Block | None = None
        self._search = 0
        self._first_close = -1
        self._after_call = False
        self._calls = 0
        self._prefix: BareCallPrefix | None = None
        self._prefix_read = 0
        self._tries = 0
        self.parsed_chars = 0
        """The characters given to body parsers so far (bounded by :data:`MAX_PARSE_WORK`)."""

    @property
    def calls_found(self) -> int:
        """How many calls were emitted so far."""
        return self._calls

    @property
    def in_call(self) -> bool:
        """Whether the text so far ends inside a call's markup (or a reply held as a possible call)."""
        return self._state in ("block", "bare")

    def feed(self, text: str) -> list[Piece]:
        """Takes the next piece of the reply; returns the text and calls now settled."""
        self._buf += text
        out: list[Piece] = []
        while True:
            if self._state == "start" and not self._decide_start():
                break
            if self._state == "text":
                if not self._scan_text(out):
                    break
            elif self._state == "block":
                if not self._scan_block(out):
                    break
            elif self._state == "bare":
                if self._still_a_call():
                    break
                self._state = "text"  # it cannot be a call any more: the held text streams as text
        return merge(out)

    def _still_a_call(self) -> bool:
        """Whether the reply held as a bare call can still be one (engine/inference/call_prefix.py)."""
        if self._prefix is None:
            self._prefix = BareCallPrefix(lambda value: bool(self._parse_bare(value)))
            self._prefix_read = 0
        possible = self._prefix.feed(self._buf[self._prefix_read :])
        self._prefix_read = len(self._buf)
        return possible

    def finish(self) -> list[Piece]:
        """The end of the reply: parses what was held back (or returns it as text)."""
        out: list[Piece] = []
        buf, self._buf = self._buf, ""
        while self._state == "block" and self._block is not None:
            rest = self._finish_block(buf, out)
            if rest is None:
                buf = ""
                break
            out.extend(self.feed(rest))  # what followed a broken call's first closing marker
            buf, self._buf = self._buf, ""
        if self._state == "bare":
            self._state = "text"
            calls = self._parse_bare(buf)
            if calls:
                self._emit_calls(calls, out)
            elif buf:
                out.append(buf)
        elif buf:
            self._text(buf, out, final=True)
        if self._ws:
            out.append(self._ws)
        self._ws = ""
        self._state, self._block = "text", None
        return merge(out)

    # ---------------------------------------------------------------- states
    def _decide_start(self) -> bool:
        """At the reply's start: a bare call (held until the end), or text. False: wait for more."""
        head = self._buf.lstrip()
        if not head:
            return False
        if head[0] in "{[":
            self._state = "bare"
            return True
        if len(head) < 3 and "```".startswith(head):
            return False  # "`" or "``" so far: could open a fence
        if head.startswith("```"):
            fence = head[3:]
            if len(fence) < 4 and "\n" not in fence and "json".startswith(fence):
                return False  # "```js..." so far: could be a JSON fence
            if fence.startswith(("json", "\n")):
                self._state = "bare"
                return True
        self._state = "text"
        return True

    def _scan_text(self, out: list[Piece]) -> bool:
        """Emits text up to the next opening marker; False when it must wait for more text."""
        found = self._earliest()
        if found is None:
            hold = partial_suffix(self._buf, self._held_markers)
            cut = len(self._buf) - hold
            if cut:
                self._text(self._buf[:cut], out)
                self._buf = self._buf[cut:]
            return False
        at, block = found
        if at:
            self._text(self._buf[:at], out)
        self._pre, self._ws = self._ws, ""  # whitespace before a call is the format's (kept if it is not one)
        self._buf = self._buf[at + (0 if block.keep_open else len(block.open)) :]
        self._state, self._block = "block", block
        self._search, self._first_close, self._tries = (len(block.open) if block.keep_open else 0), -1, 0
        return True

    def _scan_block(self, out: list[Piece]) -> bool:
        """Inside a call's markup: parses it once a closing marker arrives."""
        block = self._block
        assert block is not None
        if len(self._buf) > MAX_CALL_CHARS + len(block.close or ""):
            self._give_up(out)
            return True
        if block.close is None:
            return False
        while True:
            end = self._buf.find(block.close, self._search)
            if end < 0:
                self._search = max(self._search, len(self._buf) - len(block.close) + 1)
                return False
            if self._first_close < 0:
                self._first_close = end
            body = self._buf[:end]
            raw = self._raw(body) + block.close
            if self._tries >= MAX_TRIES:
                self._search = end + 1  # parsed once more at the end of the reply
                continue
            self._tries += 1
            parsed = self._parse(block, body, raw)
            if parsed is INCOMPLETE:
                self._search = end + 1
                continue
            self._buf = self._buf[end + len(block.close) :]
            self._state, self._block = "text", None
            if isinstance(parsed, list):
                self._emit_calls(parsed, out)
            else:
                self._after_call = False
                out.append(self._pre + raw)
            return True

    def _finish_block(self, buf: str, out: list[Piece]) -> str | None:
        """The reply ended inside a call: parse it as it is; else its markup is text up to its
        first closing marker, and what followed that is returned, to be read again."""
        block = self._block
        assert block is not None
        self._state, self._block = "text", None
        last = buf.rfind(block.close) if block.close else -1
        if last > self._first_close >= 0 and last <= MAX_CALL_CHARS:
            # closing markers inside an argument past the ones tried while it streamed: the last one
            parsed = self._parse(block, buf[:last], self._raw(buf[:last], block) + (block.close or ""))
            if isinstance(parsed, list):
                self._emit_calls(parsed, out)
                return buf[last + len(block.close or "") :]
        parsed = self._parse(block, buf, self._raw(buf, block)) if len(buf) <= MAX_CALL_CHARS else None
        if isinstance(parsed, list):
            self._emit_calls(parsed, out)
            return None
        self._after_call = False
        first = self._first_close
        if first < 0 or block.close is None:
            out.append(self._pre + self._raw(buf, block))
            return None
        cut = first + len(block.close)
        out.append(self._pre + self._raw(buf[:cut], block))
        return buf[cut:]

    def _give_up(self, out: list[Piece]) -> None:
        """A call's markup over the size limit: it is text."""
        block = self._block
        assert block is not None
        out.append(self._pre + self._raw(self._buf, block))
        self._buf = ""
        self._state, self._block = "text", None
        self._after_call = False

    # ---------------------------------------------------------------- helpers
    def _raw(self, body: str, block: Block | None = None) -> str:
        block = block or self._block
        assert block is not None
        return body if block.keep_open else block.open + body

    def _text(self, text: str, out: list[Piece], final: bool = False) -> None:
        """Answer text: the format's stray markers dropped, the whitespace after a call dropped,
        trailing whitespace held (it is dropped too when a call follows)."""
        text = _drop(text, self._drop)
        if self._after_call:
            text = text.lstrip(_WS)
            if not text:
                return
            self._after_call = False
        text, self._ws = self._ws + text, ""
        if final:
            if text:
                out.append(text)
            return
        body = text.rstrip(_WS)
        self._ws = text[len(body) :]
        if body:
            out.append(body)

    def _parse(self, block: Block, body: str, raw: str) -> Parsed:
        """A body parsed, within the reply's parsing budget (past it, markup is text)."""
        if self.parsed_chars + len(body) > MAX_PARSE_WORK:
            return None
        self.parsed_chars += len(body)
        return block.parse(body, raw, self.schemas)

    def _emit_calls(self, calls: list[ParsedCall], out: list[Piece]) -> None:
        self._ws = ""
        self._after_call = True
        self._calls += len(calls)
        out.extend(calls)

    def _earliest(self) -> tuple[int, Block] | None:
        best: tuple[int, Block] | None = None
        for block in self._blocks:
            at = self._buf.find(block.open)
            if at >= 0 and (best is None or at < best[0]):
                best = (at, block)
        return best

    def _parse_bare(self, text: str) -> list[ParsedCall]:
        if self._bare is None or len(text) > MAX_CALL_CHARS:
            return []
        if self.parsed_chars + len(text) > MAX_PARSE_WORK:
            return []
        self.parsed_chars += len(text)
        parsed = self._bare(text, text, self.schemas)
        if not isinstance(parsed, list):
            return []
        if self.family == "json" and self.tool_names and any(c.name not in self.tool_names for c in parsed):
            return []
        return parsed


def _drop(text: str, markers: tuple[str, ...]) -> str:
    """``text`` without the format's stray markers (also those that removing one made)."""
    while markers and any(marker in text for marker in markers):
        for marker in markers:
            text = text.replace(marker, "")
    return text


def parse_tool_calls(
    text: str, family: Family = "json", tool_names: Collection[str] = (), schemas: Schemas | None = None
) -> tuple[str, list[ParsedCall]]:
    """Parses a whole reply at once.

    Args:
        text: the reply.
        family: its call format.
        tool_names: the tools offered (see :class:`ToolCallParser`).
        schemas: the tools' argument schemas.

    Returns:
        The reply's text without the calls' markup, and the calls in order.
    """
    parser = ToolCallParser(family, tool_names, schemas)
    pieces = parser.feed(text) + parser.finish()
    return (
        "".join(piece for piece in pieces if isinstance(piece, str)),
        [piece for piece in pieces if isinstance(piece, ParsedCall)],
    )
