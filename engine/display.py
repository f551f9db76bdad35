"""Names from untrusted places, made safe to print on a terminal or show in a label.

A model file, a Hub repository, an MCP server's tool or its description is text someone else chose.
Printed raw, an ESC sequence clears the screen or retitles the terminal, a CR overwrites the line,
U+202E (right-to-left override) shows ``photo_gpj.exe`` as ``photo_exe.jpg``, a zero-width space
makes two different names look the same. :func:`printable` is the one way the command line and
the GUI show such a name: every character that does not print as itself is written as its escape
(``\\x1b``, ``\\r``, ``\\u202e``), so it is visible and nothing is hidden. Plain text stays as it is,
letters of every script included.
"""

from __future__ import annotations

__all__ = ["hidden_characters", "printable"]

_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(ch: str) -> str:
    short = _SHORT.get(ch)
    if short is not None:
        return short
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def printable(text: str) -> str:
    """``text`` with every character that does not print as itself escaped.

    Escaped: control characters (ESC, CR, LF, tab, DEL, C1), bidi controls (U+202A–U+202E,
    U+2066–U+2069, U+200E/F, U+061C), zero-width and other format characters (U+200B, U+FEFF,
    tag characters), line and paragraph separators, spaces other than the plain space, lone
    surrogates, private-use and unassigned code points: Python's ``str.isprintable``, which
    follows Unicode's categories. ``printable("a\\x1b[2Jb") == "a\\\\x1b[2Jb"``,
    ``printable("evil\\u202egpj.exe") == "evil\\\\u202egpj.exe"``; ``printable("modèle 模型") ==
    "modèle 模型"``.
    """
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)


def hidden_characters(text: str) -> list[str]:
    """The characters of ``text`` that :func:`printable` escapes, each once, in order (for a
    warning such as "this name contains U+202E")."""
    seen: dict[str, None] = {}
    for ch in text:
        if not ch.isprintable():
            seen.setdefault(ch)
    return list(seen)
