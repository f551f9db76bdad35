"""Kimi K3's replies: sections in XTML tags, ``<|open|>NAME attrs<|sep|>`` ... ``<|close|>NAME<|sep|>``.

An assistant message holds a ``think`` section (the thinking), a ``response`` section (the answer)
and a ``tools`` section of ``call`` elements, each with ``argument`` elements
(``<|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>``) or one ``json``
element of the whole arguments. The generation prompt opens the message and its first section
(``think``, or ``response`` with the thinking off), so a reply starts inside it; a section's
opening tag closes the one before; ``<|close|>message<|sep|>`` ends the reply.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from engine.inference.tool_calls.call import MAX_CALL_CHARS, ParsedCall, Schemas, SplitPiece, partial_suffix
from engine.inference.tool_calls.values import property_schema, typed_value

OPEN, CLOSE, SEP = "<|open|>", "<|close|>", "<|sep|>"
END_OF_MESSAGE = "<|end_of_msg|>"
MARKERS = (OPEN, CLOSE, SEP, END_OF_MESSAGE)
Section = Literal["think", "response", "tools", ""]

_TAG = re.compile(
    re.escape(OPEN) + r"([^\s<|]+)([^<]*?)" + re.escape(SEP) + r"|" + re.escape(CLOSE) + r"([^\s<|]+)" + re.escape(SEP)
)
_MAX_TAG = 512
"""A tag's most characters: an opening marker with no end after this many is text."""
_ATTR = re.compile(r'(\w+)="([^"]*)"')


def prompt_section(prompt: str) -> Section:
    """The section a rendered prompt leaves open (the reply starts inside it)."""
    tail = prompt.rstrip()
    names: tuple[Section, ...] = ("think", "response")
    for name in names:
        if tail.endswith(f"{OPEN}{name}{SEP}"):
            return name
    return ""


@dataclass
class KimiK3Splitter:
    """Splits a streaming Kimi K3 reply (see the module docstring).

    Args:
        section: the section the prompt opened (:func:`prompt_section`).
        tools_offered: calls are parsed only when tools were offered (otherwise shown as text).
        schemas: the tools' argument schemas, for arguments typed ``string`` or not at all.
    """

    section: Section = "response"
    tools_offered: bool = True
    schemas: Schemas | None = None
    _buf: str = ""
    _done: bool = False

    @property
    def in_reasoning(self) -> bool:
        """Whether the text so far ends inside the thinking."""
        return self.section == "think" and not self._done

    @property
    def in_call(self) -> bool:
        """Whether the text so far ends inside the ``tools`` section (held until it closes)."""
        return self.section == "tools" and self.tools_offered and not self._done

    def feed(self, text: str) -> list[SplitPiece]:
        """Takes the next piece of the reply; returns what is settled, in order."""
        self._buf += text
        out: list[SplitPiece] = []
        while self._buf and not self._done:
            if self.section == "tools":
                end = self._buf.find(f"{CLOSE}tools{SEP}")
                if end < 0:
                    if len(self._buf) > MAX_CALL_CHARS:
                        out.append(("text", self._buf))
                        self._buf, self.section = "", ""
                    break
                out.extend(self._calls(self._buf[:end]))
                self._buf = self._buf[end + len(f"{CLOSE}tools{SEP}") :]
                self.section = ""
                continue
            tag = _TAG.search(self._buf)
            if tag is None:
                hold = partial_suffix(self._buf, (OPEN, CLOSE, END_OF_MESSAGE))
                start = max(self._buf.rfind(OPEN), self._buf.rfind(CLOSE))
                if start >= 0 and len(self._buf) - start <= _MAX_TAG:
                    hold = max(hold, len(self._buf) - start)  # a tag in progress
                cut = len(self._buf) - hold
                self._emit(self._buf[:cut], out)
                self._buf = self._buf[cut:]
                break
            self._emit(self._buf[: tag.start()], out)
            self._buf = self._buf[tag.end() :]
            if tag.group(1):
                self.section = tag.group(1) if tag.group(1) in ("think", "response", "tools") else self.section  # type: ignore[assignment]
            elif tag.group(3) == "message":
                self._done = True
            elif tag.group(3) == self.section:
                self.section = ""
        return out

    def finish(self) -> list[SplitPiece]:
        """The end of the reply: what was held back."""
        buf, self._buf = self._buf, ""
        out: list[SplitPiece] = []
        if self._done:
            return out
        if self.section == "tools":
            out.extend(self._calls(buf))
        else:
            self._emit(buf, out)
        return out

    def _emit(self, text: str, out: list[SplitPiece]) -> None:
        text = text.replace(END_OF_MESSAGE, "")
        if not text:
            return
        out.append(("reasoning" if self.section == "think" else "text", text))

    def _calls(self, body: str) -> list[SplitPiece]:
        raw = f"{OPEN}tools{SEP}{body}{CLOSE}tools{SEP}"
        if not self.tools_offered:
            return [("text", raw)]
        calls = parse_calls(body, self.schemas or {})
        return list(calls) if calls else [("text", raw)]


def parse_calls(body: str, schemas: Schemas) -> list[ParsedCall] | None:
    """The ``call`` elements of a ``tools`` section; None when it is not one."""
    calls: list[ParsedCall] = []
    at = 0
    while True:
        opened = _TAG.search(body, at)
        if opened is None:
            return calls or None if not body[at:].strip() else None
        if body[at : opened.start()].strip() or opened.group(1) != "call":
            return None
        attrs = dict(_ATTR.findall(opened.group(2)))
        name = attrs.get("tool", "")
        end = body.find(f"{CLOSE}call{SEP}", opened.end())
        if not name or end < 0:
            return None
        arguments = _arguments(body[opened.end() : end], schemas.get(name))
        if arguments is None:
            return None
        at = end + len(f"{CLOSE}call{SEP}")
        calls.append(ParsedCall(name, arguments, body[opened.start() : at]))


def _arguments(inner: str, tool: Any) -> dict[str, Any] | None:
    arguments: dict[str, Any] = {}
    at = 0
    while True:
        opened = _TAG.search(inner, at)
        if opened is None:
            return arguments if not inner[at:].strip() else None
        kind = opened.group(1)
        if inner[at : opened.start()].strip() or kind not in ("argument", "json"):
            return None
        end = inner.find(f"{CLOSE}{kind}{SEP}", opened.end())
        if end < 0:
            return None
        value = inner[opened.end() : end]
        at = end + len(f"{CLOSE}{kind}{SEP}")
        if kind == "json":
            try:
                whole = json.loads(value)
            except (json.JSONDecodeError, RecursionError):
                return None
            if not isinstance(whole, dict):
                return None
            arguments.update(whole)
            continue
        attrs = dict(_ATTR.findall(opened.group(2)))
        key = attrs.get("key", "")
        if not key:
            return None
        declared = attrs.get("type")
        if declared == "string":
            arguments[key] = value
        elif declared in ("number", "boolean", "null", "object", "array"):
            try:
                arguments[key] = json.loads(value)
            except (json.JSONDecodeError, RecursionError):
                arguments[key] = typed_value(value, property_schema(tool, key))
        else:
            arguments[key] = typed_value(value, property_schema(tool, key))
