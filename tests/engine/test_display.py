"""engine.display.printable: names others chose, shown with nothing hidden (the CLI and the GUI both use it)."""

from __future__ import annotations

import pytest

from engine.display import hidden_characters, printable


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("Qwen3-0.6B-Q4_K_M.gguf", "Qwen3-0.6B-Q4_K_M.gguf"),
        ("modèle 模型 نموذج", "modèle 模型 نموذج"),  # letters of every script, right-to-left ones too
        ("a\x1b[2Jb", "a\\x1b[2Jb"),  # clear screen
        ("x\x1b]0;pwned\x07y", "x\\x1b]0;pwned\\x07y"),  # retitle the terminal
        ("over\rwrite", "over\\rwrite"),
        ("two\nlines\ttab", "two\\nlines\\ttab"),
        ("evil\u202egpj.exe", "evil\\u202egpj.exe"),  # right-to-left override
        ("\u2066isolate\u2069", "\\u2066isolate\\u2069"),
        ("zero\u200bwidth\ufeff", "zero\\u200bwidth\\ufeff"),
        ("c1\x9bcsi\x7f", "c1\\x9bcsi\\x7f"),  # the 8-bit CSI, DEL
        ("nb\u00a0sp\u2028", "nb\\xa0sp\\u2028"),
        ("tag\U000e0041", "tag\\U000e0041"),
        ("lone\ud800", "lone\\ud800"),  # printable as UTF-8, no encoding error
    ],
)
def test_printable_escapes_what_does_not_print_as_itself(text: str, shown: str) -> None:
    assert printable(text) == shown
    assert printable(shown) == shown  # already safe: unchanged
    shown.encode("ascii" if shown.isascii() else "utf-8")


def test_hidden_characters_names_each_once_in_order() -> None:
    assert hidden_characters("a\u202eb\x1bc\u202e") == ["\u202e", "\x1b"]
    assert hidden_characters("plain") == []
