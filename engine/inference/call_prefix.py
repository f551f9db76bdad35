"""Whether a reply that starts like a bare tool call can still be one, as it streams.

Contract: ARCHITECTURE.md, 'engine.inference.call_prefix'.
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["BareCallPrefix"]

_WS = " \t\r\n"
_SEPARATORS = _WS + ",;"
_LITERALS = ("true", "false", "null")
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_NUMBER_CHARS = frozenset("0123456789+-.eE")
_HEX = frozenset("0123456789abcdefABCDEF")
_ESCAPES = frozenset('"\\/bfnrtu')


class BareCallPrefix:
    """Reads a held reply piece by piece; :attr:`possible` turns False once it cannot be a call.

    Args:
        is_call: whether one whole top-level value (its text) is a call (or a list of calls).

    The text fed is the reply from its start: optional whitespace, an optional fence header
    (three backticks, ``json`` or nothing, a newline), then JSON values separated by whitespace,
    commas or semicolons, each an object or an array, then the closing fence if one opened.
    """

    def __init__(self, is_call: Callable[[str], bool]) -> None:
        self._is_call = is_call
        self.possible = True
        self._text: list[str] = []
        self._size = 0
        self._fence: str | None = None  # the fence header read so far; "" once it is closed by \n
        self._fenced = False
        self._closing = 0  # backticks of the closing fence read so far
        self._closed = False
        self._stack: list[str] = []  # "{" / "["
        self._mode = "top"  # top | value | key | colon | after | string | number | literal | python
        self._string_is_key = False
        self._escape = 0  # 0 none, 1 after a backslash, 2..5 reading \\u hex digits
        self._scalar = ""
        self._start = 0  # where the current top-level value began
        self._first = True  # no character of a value read yet (a fence may open)

    def feed(self, piece: str) -> bool:
        """Reads the next piece; returns :attr:`possible`."""
        for ch in piece:
            if not self.possible:
                break
            self._text.append(ch)
            self._size += 1
            self._step(ch)
        return self.possible

    # ---------------------------------------------------------------- the automaton
    def _dead(self) -> None:
        self.possible = False

    def _step(self, ch: str) -> None:
        if self._closed:
            if ch not in _WS:
                self._dead()
            return
        if self._fence is not None and self._fence != "":
            self._read_fence_header(ch)
            return
        mode = self._mode
        if mode == "string":
            self._in_string(ch)
        elif mode == "number":
            if ch in _NUMBER_CHARS:
                self._scalar += ch
                return
            if not _NUMBER.fullmatch(self._scalar):
                self._dead()
                return
            self._mode = "after"
            self._step_after(ch)
        elif mode == "literal":
            if ch.isalpha():
                self._scalar += ch
                if not any(word.startswith(self._scalar) for word in _LITERALS):
                    self._dead()
                return
            if self._scalar not in _LITERALS:
                self._dead()
                return
            self._mode = "after"
            self._step_after(ch)
        elif mode == "python":
            return  # a Python-style call list: only its end says (the parser's is_call)
        elif mode == "top":
            self._step_top(ch)
        elif mode == "value":
            self._step_value(ch)
        elif mode == "key":
            if ch in _WS:
                return
            if ch == '"':
                self._begin_string(key=True)
            elif ch == "}" and self._scalar == "{":  # "{}" (an empty object)
                self._close("{")
            else:
                self._dead()
        elif mode == "colon":
            if ch == ":":
                self._mode = "value"
            elif ch not in _WS:
                self._dead()
        elif mode == "after":
            self._step_after(ch)

    def _read_fence_header(self, ch: str) -> None:
        assert self._fence is not None
        if ch == "\n":
            if self._fence.strip() not in ("", "json"):
                self._dead()
            self._fence = ""
            self._fenced = True
            return
        self._fence += ch
        if not "json".startswith(self._fence.strip()) and self._fence.strip():
            self._dead()

    def _step_top(self, ch: str) -> None:
        """Between top-level values: separators, the next value (an object or an array), a fence."""
        if self._closing:
            if ch == "`":
                self._closing += 1
                if self._closing == 3:
                    self._closed = True
                return
            self._dead()
            return
        if ch in (_WS if self._first else _SEPARATORS):
            return
        if ch == "`":
            if self._first and not self._fenced:
                self._fence_start()
                return
            if self._fenced:
                self._closing = 1
                return
            self._dead()
            return
        if ch in "{[":
            self._first = False
            self._start = self._size - 1
            self._open(ch)
            return
        self._dead()

    def _fence_start(self) -> None:
        """A backtick where the first value would start: the fence's three, then its header."""
        self._scalar += "`"
        if self._scalar == "```":
            self._scalar = ""
            self._fence = " "  # reading the header (a space marks "started", stripped when checked)

    def _step_value(self, ch: str) -> None:
        if ch in _WS:
            return
        if ch in "{[":
            self._open(ch)
        elif ch == '"':
            self._begin_string(key=False)
        elif ch == "-" or ch.isdigit():
            self._mode, self._scalar = "number", ch
        elif ch in "tfn":
            self._mode, self._scalar = "literal", ch
        elif ch == "]" and self._scalar == "[":  # "[]" (an empty array)
            self._close("[")
        elif self._stack == ["["] and self._scalar == "[" and (ch.isalpha() or ch == "_"):
            self._mode = "python"  # "[f(a=1), ...]": a Python-style call list (Llama 3.2)
        else:
            self._dead()

    def _step_after(self, ch: str) -> None:
        """After a value inside a container: a comma, or the container's end."""
        if ch in _WS:
            return
        top = self._stack[-1] if self._stack else None
        if ch == ",":
            self._mode, self._scalar = ("key" if top == "{" else "value"), ""
        elif (ch == "}" and top == "{") or (ch == "]" and top == "["):
            self._close(ch)
        else:
            self._dead()

    def _open(self, ch: str) -> None:
        self._stack.append(ch)
        self._mode = "key" if ch == "{" else "value"
        self._scalar = ch  # the container just opened (for "{}" and "[]")

    def _close(self, _ch: str) -> None:
        self._stack.pop()
        self._scalar = ""
        if self._stack:
            self._mode = "after"
            return
        self._mode = "top"
        value = "".join(self._text[self._start :])
        if not self._is_call(value):
            self._dead()

    def _begin_string(self, key: bool) -> None:
        self._mode, self._string_is_key, self._escape, self._scalar = "string", key, 0, ""

    def _in_string(self, ch: str) -> None:
        if self._escape == 1:
            if ch not in _ESCAPES:
                self._dead()
                return
            self._escape = 2 if ch == "u" else 0
            return
        if self._escape >= 2:
            if ch not in _HEX:
                self._dead()
                return
            self._escape = 0 if self._escape == 5 else self._escape + 1
            return
        if ch == "\\":
            self._escape = 1
        elif ch == '"':
            self._mode = "colon" if self._string_is_key else "after"
        elif ord(ch) < 0x20:
            self._dead()  # a raw control character: never in a JSON string
