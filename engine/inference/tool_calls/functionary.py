"""Functionary v3.2's replies: messages addressed by recipient, ``>>>RECIPIENT\\nBODY``.

The generation prompt ends with ``>>>``, so a reply starts with its first recipient. ``all`` is the
user (the body is the answer, streamed); any other recipient is a tool, the body its JSON
arguments (the ``python`` tool takes code as it is). The next ``>>>`` starts another message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from engine.inference.tool_calls.call import MAX_CALL_CHARS, ParsedCall, SplitPiece, arguments_object, partial_suffix

SEPARATOR = ">>>"
TO_USER = "all"


@dataclass
class FunctionarySplitter:
    """Splits a streaming functionary v3.2 reply (see the module docstring).

    Args:
        tools_offered: a message to a tool is a call only when tools were offered (otherwise text).
    """

    tools_offered: bool = True
    _state: Literal["recipient", "body"] = "recipient"
    _buf: str = ""
    _recipient: str = ""
    _pieces: list[SplitPiece] = field(default_factory=list)

    @property
    def in_reasoning(self) -> bool:
        """Functionary does not think apart: never."""
        return False

    @property
    def in_call(self) -> bool:
        """Whether the text so far ends inside a message to a tool (held until it ends)."""
        return self._state == "body" and self._recipient != TO_USER and self.tools_offered

    def feed(self, text: str) -> list[SplitPiece]:
        """Takes the next piece of the reply; returns what is settled, in order."""
        self._buf += text
        out: list[SplitPiece] = []
        while self._buf:
            if self._state == "recipient":
                head = self._buf.lstrip(">")
                newline = head.find("\n")
                if newline < 0:
                    if len(head) > 256 or (head and not _could_be_name(head)):
                        self._recipient, self._state, self._buf = TO_USER, "body", head
                        continue
                    break
                self._recipient = head[:newline].strip()
                self._buf = head[newline + 1 :]
                self._state = "body"
                if not _could_be_name(self._recipient):
                    self._buf = head  # not a recipient line: the reply is plain text
                    self._recipient = TO_USER
            elif not self._read_body(out):
                break
        return out

    def finish(self) -> list[SplitPiece]:
        """The end of the reply: what was held back."""
        buf, self._buf = self._buf, ""
        out: list[SplitPiece] = []
        if self._state == "body":
            out.extend(self._close(buf))
        elif buf.strip():
            out.append(("text", buf))
        self._state = "recipient"
        return out

    def _read_body(self, out: list[SplitPiece]) -> bool:
        at = self._buf.find(SEPARATOR)
        if at >= 0:
            body, self._buf = self._buf[:at], self._buf[at:]
            out.extend(self._close(body))
            self._state = "recipient"
            return True
        if self._recipient != TO_USER and self.tools_offered:
            return False  # a call's body is held whole
        hold = partial_suffix(self._buf, (SEPARATOR,))
        cut = len(self._buf) - hold
        if cut:
            out.append(("text", self._buf[:cut]))
            self._buf = self._buf[cut:]
        return False

    def _close(self, body: str) -> list[SplitPiece]:
        if self._recipient == TO_USER or not self.tools_offered:
            return [("text", body)] if body else []
        raw = f"{SEPARATOR}{self._recipient}\n{body}"
        if self._recipient == "python" and not body.lstrip().startswith("{"):
            return [ParsedCall("python", {"code": body.strip()}, raw)]
        arguments = arguments_object(body.strip()) if len(body) <= MAX_CALL_CHARS else None
        if arguments is None:
            return [("text", raw)]
        return [ParsedCall(self._recipient, arguments, raw)]


def _could_be_name(text: str) -> bool:
    return all(char.isalnum() or char in "_-." for char in text.strip())
