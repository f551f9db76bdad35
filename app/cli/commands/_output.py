"""Shared helpers for subcommands: JSON on stdout, and argument types."""

from __future__ import annotations

import argparse
import json
import sys


def print_json(document: object) -> None:
    """Prints one JSON document on stdout.

    Letters of every script stay as they are; a character that does not print as itself (a bidi
    override, a zero-width space, a lone surrogate: names come from files and servers others
    wrote) is written as its JSON escape, so the document means the same and shows no trick.
    """
    text = json.dumps(document, ensure_ascii=False, indent=None, default=str)
    if not text.isprintable():
        text = "".join(ch if ch.isprintable() else _json_escape(ch) for ch in text)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _json_escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def positive_int(text: str) -> int:
    """An argparse type: a whole number above zero, with a one-line message otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, not {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, not {text}")
    return value
