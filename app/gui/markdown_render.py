# ruff: noqa: ARG001 - markdown-it render rules have a fixed signature
"""Model output to safe rich text (ROBUSTNESS.md U3, OWASP LLM05).

Markdown is rendered by markdown-it-py with raw HTML disabled, so nothing the model writes becomes
active markup. Images are never loaded: they render as their alt text. Links keep only http(s) and
mailto targets and open only on an explicit click. A single newline is a line break. Code blocks
get a header with the language and a "Copy" link (``gb-copy:N``); tables get borders that Qt's
rich-text engine understands.
"""

from __future__ import annotations

import html
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from markdown_it import MarkdownIt
    from markdown_it.renderer import RendererProtocol
    from markdown_it.token import Token
    from markdown_it.utils import OptionsDict

COPY_SCHEME = "gb-copy"
SAFE_LINK_SCHEMES = ("http://", "https://", "mailto:")


@dataclass(frozen=True)
class CodeColors:
    """Colours for code blocks and tables (they follow the theme)."""

    code_bg: str = "#f3f4f6"
    code_header_bg: str = "#e5e7eb"
    code_fg: str = "#111827"
    muted: str = "#6b7280"
    border: str = "#d1d5db"
    link: str = "#1d4ed8"  # 4.5:1 or more on every light background a link sits on


DARK_CODE = CodeColors(
    code_bg="#161b22",
    code_header_bg="#21262d",
    code_fg="#e6edf3",
    muted="#8b949e",
    border="#30363d",
    link="#58a6ff",
)
LIGHT_CODE = CodeColors()


@dataclass(frozen=True)
class RenderedMarkdown:
    """The rich-text HTML for a Qt label and the raw text of each code block (for Copy)."""

    html: str
    code_blocks: tuple[str, ...]


@dataclass
class _RenderState:
    """One render: the theme's colours, what it collects (the code blocks' raw text), and whether
    each open link was kept."""

    colors: CodeColors = LIGHT_CODE
    code_blocks: list[str] = field(default_factory=list)
    link_stack: list[bool] = field(default_factory=list)


_STATE = "glassbox_state"
Env = MutableMapping[str, object]
"""markdown-it's ``env`` of one render: it carries the :class:`_RenderState`."""


def _state(env: Env) -> _RenderState:
    """The render's state in markdown-it's ``env`` (made on first use)."""
    state = env.get(_STATE)
    if not isinstance(state, _RenderState):
        state = _RenderState()
        env[_STATE] = state
    return state


def _code_block(code: str, language: str, index: int, colors: CodeColors) -> str:
    lang = html.escape(language or "code")
    body = html.escape(code.rstrip("\n"))
    return (
        f'<table width="100%" cellspacing="0" cellpadding="6" bgcolor="{colors.code_bg}" '
        f'style="border: 1px solid {colors.border}; margin-top: 4px; margin-bottom: 6px;">'
        f'<tr><td bgcolor="{colors.code_header_bg}">'
        f'<span style="color:{colors.muted}; font-size: small;">{lang}'
        f'</span>&nbsp;&nbsp;&nbsp;<a href="{COPY_SCHEME}:{index}" style="color:{colors.link}; '
        f'text-decoration: none; font-size: small;">Copy</a></td></tr>'
        f'<tr><td><pre style="color:{colors.code_fg}; margin: 0;">{body}</pre></td></tr></table>'
    )


# The render rules (markdown-it's fixed signature: the renderer, the tokens, the index, the options, env).


def _fence(self: RendererProtocol, tokens: Sequence[Token], idx: int, options: OptionsDict, env: Env) -> str:
    token = tokens[idx]
    state = _state(env)
    state.code_blocks.append(token.content)
    language = token.info.split()[0] if token.info else ""
    return _code_block(token.content, language, len(state.code_blocks) - 1, state.colors)


def _image(self: RendererProtocol, tokens: Sequence[Token], idx: int, options: OptionsDict, env: Env) -> str:
    token = tokens[idx]
    alt = html.escape("".join(child.content for child in token.children or []) or "image")
    return f'<span style="color:{_state(env).colors.muted};">[image: {alt}]</span>'


def _link_open(self: RendererProtocol, tokens: Sequence[Token], idx: int, options: OptionsDict, env: Env) -> str:
    href = str(tokens[idx].attrGet("href") or "")
    safe = href.lower().startswith(SAFE_LINK_SCHEMES)
    state = _state(env)
    state.link_stack.append(safe)
    if not safe:
        return "<span>"
    return f'<a href="{html.escape(href, quote=True)}" style="color:{state.colors.link};">'


def _link_close(self: RendererProtocol, tokens: Sequence[Token], idx: int, options: OptionsDict, env: Env) -> str:
    stack = _state(env).link_stack
    safe = stack.pop() if stack else False
    return "</a>" if safe else "</span>"


def _table_open(self: RendererProtocol, tokens: Sequence[Token], idx: int, options: OptionsDict, env: Env) -> str:
    return (
        f'<table border="1" cellspacing="0" cellpadding="5" '
        f'style="border-color:{_state(env).colors.border}; border-collapse: collapse; margin: 4px 0;">\n'
    )


def _code_inline(self: RendererProtocol, tokens: Sequence[Token], idx: int, options: OptionsDict, env: Env) -> str:
    content = html.escape(tokens[idx].content)
    return f'<code style="background-color:{_state(env).colors.code_bg};">&nbsp;{content}&nbsp;</code>'


@lru_cache(maxsize=1)
def _parser() -> MarkdownIt:
    from markdown_it import MarkdownIt  # lazy: start-up (+33 ms: markdown_it), imported on first render

    # breaks: a single newline in a reply is a line break, as the model meant it ("cat\ncat"), not
    # CommonMark's soft break that joins the lines.
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False, "breaks": True})
    md.enable(["table", "strikethrough"])
    md.add_render_rule("fence", _fence)
    md.add_render_rule("code_block", _fence)
    md.add_render_rule("image", _image)
    md.add_render_rule("link_open", _link_open)
    md.add_render_rule("link_close", _link_close)
    md.add_render_rule("table_open", _table_open)
    md.add_render_rule("code_inline", _code_inline)
    return md


def render_markdown(text: str, colors: CodeColors = LIGHT_CODE) -> RenderedMarkdown:
    """Renders model output as safe rich text.

    Args:
        text: Markdown (possibly incomplete, while streaming).
        colors: the theme's code and table colours.

    Returns:
        The HTML and the code blocks' raw text.
    """
    state = _RenderState(colors)
    env: Env = {_STATE: state}
    body = str(_parser().render(text, env))
    return RenderedMarkdown(html=body, code_blocks=tuple(state.code_blocks))


def plain_html(text: str) -> str:
    """Text shown verbatim (user messages): escaped, line breaks kept."""
    return html.escape(text).replace("\n", "<br>")


def split_blocks(text: str) -> list[str]:
    """Splits Markdown at blank lines outside code fences.

    While a reply streams, every block but the last is finished: the chat view renders each block
    once and re-renders only the last one, so an update costs the same at token 10 and token 2,000.
    """
    blocks: list[str] = []
    current: list[str] = []
    fence: str | None = None
    for line in text.split("\n"):
        stripped = line.lstrip()
        if fence is None and stripped.startswith(("```", "~~~")):
            fence = stripped[:3]
        elif fence is not None and stripped.startswith(fence):
            fence = None
        if fence is None and not line.strip() and current:
            blocks.append("\n".join(current))
            current = []
            continue
        if line.strip() or current or fence is not None:
            current.append(line)
    if current:
        blocks.append("\n".join(current))
    return blocks
