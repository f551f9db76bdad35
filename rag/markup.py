"""Structure of marked-up text: Markdown, reStructuredText and HTML as (kind, text, heading) blocks.

Pure functions from a decoded string to blocks; :mod:`rag.loaders` turns blocks into spanned
sections. Headings become a path (``"Install > Linux"``) carried by every block beneath them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from html.parser import HTMLParser
from typing import Literal

SectionKind = Literal["text", "heading", "code", "table"]
Block = tuple[SectionKind, str, str | None]
"""(kind, text, heading path): kind is ``"text"``, ``"heading"``, ``"code"`` or ``"table"``."""


class _Headings:
    """A stack of (level, title) giving the current heading path."""

    def __init__(self) -> None:
        self._stack: list[tuple[int, str]] = []

    def push(self, level: int, title: str) -> None:
        self._stack = [(lvl, t) for lvl, t in self._stack if lvl < level] + [(level, " ".join(title.split()))]

    @property
    def path(self) -> str | None:
        return " > ".join(title for _, title in self._stack) or None


# ---------------------------------------------------------------------------------------- Markdown

_FRONT_MATTER = re.compile(r"\A(?:---|\+\+\+)[ \t]*\n(.*?)\n(?:---|\+\+\+|\.\.\.)[ \t]*(?:\n|\Z)", re.DOTALL)


def markdown_sections(text: str) -> Iterator[Block]:
    """Split Markdown into top-level blocks (CommonMark + tables, via markdown-it-py).

    Headings give the heading path; fenced and indented code blocks are ``"code"`` blocks kept
    whole; tables are ``"table"``; everything else (paragraphs, lists, quotes) is ``"text"`` with its
    original source lines.

    Args:
        text: The Markdown source.

    Yields:
        (kind, text, heading path) per block.
    """
    # lazy: start-up (+39 ms: markdown_it, mdurl)
    from markdown_it import MarkdownIt

    front = _FRONT_MATTER.match(text)
    if front:  # YAML/TOML front matter: metadata text, not a heading or a rule
        yield "text", front.group(1), None
        text = text[front.end() :]
    lines = text.split("\n")
    headings = _Headings()
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    for i, token in enumerate(tokens):
        if token.level != 0 or token.nesting == -1 or token.map is None:
            continue
        source = "\n".join(lines[token.map[0] : token.map[1]])
        if token.type == "heading_open":
            title = tokens[i + 1].content.strip() if i + 1 < len(tokens) else ""
            if title:
                headings.push(int(token.tag[1:]), title)
                yield "heading", title, headings.path
        elif token.type in ("fence", "code_block"):
            yield "code", source, headings.path
        elif token.type == "table_open":
            yield "table", source, headings.path
        elif token.type != "hr":
            yield "text", source, headings.path


# ---------------------------------------------------------------------------------------- reStructuredText

_RST_ADORNMENT = re.compile(r"^([!-/:-@\[-`{-~])\1{2,}\s*$")
_RST_CODE_DIRECTIVE = re.compile(r"^\.\.\s+(?:code-block|code|sourcecode|highlight)::")


def rst_sections(text: str) -> Iterator[Block]:
    """Split reStructuredText into blocks: underlined (and overlined) titles, literal blocks, paragraphs.

    Title levels follow the order in which adornment styles first appear, as docutils does.

    Args:
        text: The reST source.

    Yields:
        (kind, text, heading path) per block.
    """
    lines = text.split("\n")
    styles: list[tuple[str, bool]] = []
    headings = _Headings()
    para: list[str] = []
    literal_next = False
    i = 0

    def flush() -> Iterator[Block]:
        if para:
            yield "text", "\n".join(para), headings.path
            para.clear()

    while i < len(lines):
        line = lines[i]
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        over = bool(_RST_ADORNMENT.match(line)) and i + 2 < len(lines) and lines[i + 2].rstrip() == line.rstrip()
        title_line = lines[i + 1] if over else line
        under = lines[i + 2] if over else nxt
        if (
            not para
            and title_line.strip()
            and not title_line[:1].isspace()
            and _RST_ADORNMENT.match(under)
            and len(under.rstrip()) >= len(title_line.rstrip())
            and not _RST_ADORNMENT.match(title_line)
        ):
            style = (under.strip()[0], over)
            if style not in styles:
                styles.append(style)
            headings.push(styles.index(style) + 1, title_line.strip())
            yield "heading", title_line.strip(), headings.path
            i += 3 if over else 2
            continue
        if not line.strip():
            yield from flush()
            i += 1
            continue
        if literal_next or _RST_CODE_DIRECTIVE.match(line):
            # A literal block: the directive line (if any) plus every following indented or blank line.
            yield from flush()
            block = [] if literal_next else [line]
            j = i if literal_next else i + 1
            while j < len(lines) and (not lines[j].strip() or lines[j][:1].isspace()):
                block.append(lines[j])
                j += 1
            if "\n".join(block).strip():
                yield "code", "\n".join(block).strip("\n"), headings.path
            literal_next = False
            i = j
            continue
        if _RST_ADORNMENT.match(line) and not para:  # a transition line
            i += 1
            continue
        para.append(line)
        if line.rstrip().endswith("::") and not nxt.strip() and not line.lstrip().startswith(".."):
            yield from flush()
            literal_next = True
            i += 2
            continue
        i += 1
    yield from flush()


# ---------------------------------------------------------------------------------------- HTML

_SKIP_TAGS = {
    "script", "style", "template", "noscript", "svg", "math", "head", "iframe", "object", "canvas", "select",
}  # fmt: skip
_BLOCK_TAGS = {
    "p", "div", "section", "article", "header", "footer", "nav", "aside", "main", "li", "ul", "ol", "dl",
    "dt", "dd", "blockquote", "hr", "figure", "figcaption", "form", "address", "details", "summary", "body",
    "caption", "fieldset", "legend",
}  # fmt: skip
_HEADING_TAGS = {"h1", "h2", "h3", "h4", "h5", "h6"}


class _HtmlBlocks(HTMLParser):
    """Collects visible text as blocks; no network access, no entity or script evaluation."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[Block] = []
        self.headings = _Headings()
        self._text: list[str] = []
        self._skip = 0
        self._pre = 0
        self._heading: int | None = None
        self._table = 0
        self._rows: list[list[str]] = []

    def _flush(self) -> None:
        text = "".join(self._text)
        self._text = []
        if self._heading is not None:
            title = " ".join(text.split())
            if title:
                self.headings.push(self._heading, title)
                self.blocks.append(("heading", title, self.headings.path))
            self._heading = None
            return
        text = " ".join(text.split())
        if text:
            self.blocks.append(("text", text, self.headings.path))

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:  # noqa: ARG002
        if tag in _SKIP_TAGS:
            self._skip += 1
        if self._skip:
            return
        if self._table:
            if tag == "table":
                self._table += 1
            elif tag == "tr" and self._table == 1:
                self._cell_end()
                self._rows.append([])
            elif tag in ("td", "th") and self._table == 1:
                self._cell_start()
            elif tag == "br":
                self._text.append(" ")
            return
        if tag == "table":
            self._flush()
            self._table, self._rows = 1, []
        elif tag == "pre":
            self._flush()
            self._pre += 1
        elif tag in _HEADING_TAGS:
            self._flush()
            self._heading = int(tag[1])
        elif tag in _BLOCK_TAGS and not self._pre:
            self._flush()
        elif tag == "br":
            self._text.append("\n")

    def _cell_start(self) -> None:
        self._cell_end()  # end tags of cells are optional in HTML
        if not self._rows:
            self._rows.append([])
        self._rows[-1].append("")
        self._text = []

    def _cell_end(self) -> None:
        if self._rows and self._rows[-1]:
            self._rows[-1][-1] += " ".join("".join(self._text).split())
        self._text = []

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIP_TAGS:
            self._skip = max(0, self._skip - 1)
            return
        if self._skip:
            return
        if self._table:
            if tag in ("td", "th", "tr") and self._table == 1:
                self._cell_end()
            elif tag == "table":
                self._table -= 1
                if not self._table:
                    self._cell_end()
                    rows = [" | ".join(cells) for cells in self._rows]
                    text = "\n".join(row for row in rows if row.strip(" |"))
                    if text:
                        self.blocks.append(("table", text, self.headings.path))
                    self._rows = []
            return
        if tag == "pre" and self._pre:
            self._pre -= 1
            code = "".join(self._text).strip("\n")
            self._text = []
            if code.strip():
                self.blocks.append(("code", code, self.headings.path))
        elif (tag in _HEADING_TAGS or tag in _BLOCK_TAGS) and not self._pre:
            self._flush()

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self._text.append(data)

    def close(self) -> None:
        super().close()
        self._skip = 0  # an unclosed <script> or <style> must not swallow what came before it
        if self._table:
            self._table = 1
            self.handle_endtag("table")
        self._pre = 0
        self._flush()


def html_sections(text: str) -> Iterator[Block]:
    """Visible text of an HTML (or XHTML) page as blocks, with the stdlib parser.

    Scripts, styles, comments and ``<head>`` are dropped; ``h1``–``h6`` give the heading path;
    ``<pre>`` is code; tables become ``cell | cell`` rows. Nothing is fetched.

    Args:
        text: The HTML source.

    Yields:
        (kind, text, heading path) per block.
    """
    parser = _HtmlBlocks()
    parser.feed(text)
    parser.close()
    yield from parser.blocks
