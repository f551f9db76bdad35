"""OpenAI's harmony format (gpt-oss) and Muse's recipient messages: a reply made of addressed
messages, split as it streams.

Contract: ARCHITECTURE.md, 'engine.inference.harmony'.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Literal

from engine.inference.tool_calls import MAX_CALL_CHARS, ParsedCall, Schemas, SplitPiece, partial_suffix
from engine.inference.tool_calls.xml_calls import atem

START, CHANNEL, MESSAGE, END, CALL, RETURN, CONSTRAIN = (
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|end|>",
    "<|call|>",
    "<|return|>",
    "<|constrain|>",
)
END_OF_MESSAGE, END_OF_TURN = "<|eom|>", "<|eot|>"
MARKERS = (START, CHANNEL, MESSAGE, END, CALL, RETURN, CONSTRAIN, END_OF_MESSAGE, END_OF_TURN)
_TERMINATORS = (END, CALL, RETURN, START, END_OF_MESSAGE, END_OF_TURN)
_HEADER_STARTS = (CHANNEL, START, "to=", "assistant")

_CHANNEL_NAME = re.compile(re.escape(CHANNEL) + r"\s*([A-Za-z_]+)")
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_NOT_TOOLS = frozenset({"assistant", "user", "all"})

Dialect = Literal["harmony", "muse"]
HarmonyPiece = SplitPiece


@dataclass
class HarmonySplitter:
    """Splits a streaming harmony (or Muse) reply (see the module docstring).

    Args:
        tools_offered: a message to a tool is a call only when tools were offered (otherwise it is
            shown as text).
        dialect: ``"harmony"`` (gpt-oss) or ``"muse"``.
        schemas: the tools' argument schemas (Muse writes arguments as text).
    """

    tools_offered: bool = True
    dialect: Dialect = "harmony"
    schemas: Schemas | None = None
    _state: Literal["header", "body", "plain"] = "header"
    _buf: str = ""
    _channel: str = ""
    _recipient: str = ""
    _header: str = ""

    @property
    def in_reasoning(self) -> bool:
        """Whether the text so far ends inside the thinking (the analysis channel, Muse's ``self``)."""
        return self._state == "body" and self._kind() == "reasoning"

    @property
    def in_call(self) -> bool:
        """Whether the text so far ends inside a call's body (held until its message ends)."""
        return self._state == "body" and self._is_call()

    def feed(self, text: str) -> list[HarmonyPiece]:
        """Takes the next piece of the reply; returns what is settled, in order."""
        self._buf += text
        out: list[HarmonyPiece] = []
        while self._buf:
            if self._state == "plain":
                out.append(("text", self._buf))
                self._buf = ""
            elif self._state == "header":
                if not self._read_header():
                    break
            elif not self._read_body(out):
                break
        return out

    def finish(self) -> list[HarmonyPiece]:
        """The end of the reply: what was held back (an unterminated call is parsed)."""
        out: list[HarmonyPiece] = []
        buf, self._buf = self._buf, ""
        if self._state == "body":
            out.extend(self._close_body(buf))
        elif self._state == "plain" and buf:
            out.append(("text", buf))
        elif self._state == "header" and buf.strip() and not self._header:
            out.append(("text", buf))  # never looked like harmony
        self._state = "header"
        return out

    # ---------------------------------------------------------------- header and body
    def _read_header(self) -> bool:
        """Collects a message header up to ``<|message|>``; False: wait for more text."""
        head = self._buf.lstrip()
        if not self._header and head and not any(head.startswith(s) or s.startswith(head) for s in _HEADER_STARTS):
            self._state = "plain"  # the reply is not harmony at all
            return True
        at = self._buf.find(MESSAGE)
        if at < 0:
            if len(self._buf) > 4096:  # a runaway header: show it rather than hold it forever
                self._state = "plain"
                return True
            return False
        header, self._buf = self._buf[:at], self._buf[at + len(MESSAGE) :]
        self._header = header
        channels = _CHANNEL_NAME.findall(header)
        recipients = [r for r in _RECIPIENT.findall(header) if r not in _NOT_TOOLS]
        self._channel = channels[-1] if channels else ("" if self.dialect == "muse" else "final")
        self._recipient = recipients[-1] if recipients else ""
        if self.dialect == "muse":
            found = _RECIPIENT.findall(header)
            self._channel = found[-1] if found else "user"
        self._state = "body"
        return True

    def _read_body(self, out: list[HarmonyPiece]) -> bool:
        """Streams a message body (a call's is held whole); False: wait for more text."""
        found = [(self._buf.find(marker), marker) for marker in _TERMINATORS if marker in self._buf]
        if found:
            at, marker = min(found)
            body = self._buf[:at]
            self._buf = self._buf[at + (len(marker) if marker != START else 0) :]
            out.extend(self._close_body(body))
            if marker == START:
                self._buf = self._buf[len(START) :]
            self._state = "header"
            self._header = "(after)"  # later headers never turn the reply into plain text
            return True
        if self._is_call():
            return False
        hold = partial_suffix(self._buf, _TERMINATORS)
        cut = len(self._buf) - hold
        if cut:
            out.append((self._kind(), self._buf[:cut]))
            self._buf = self._buf[cut:]
        return False

    def _close_body(self, body: str) -> list[HarmonyPiece]:
        if not self._is_call():
            return [(self._kind(), body)] if body else []
        raw = f"{self._header}{MESSAGE}{body}"
        if self.dialect == "muse":
            calls = atem(_strip_wrapper(body), raw, self.schemas or {}) if len(body) <= MAX_CALL_CHARS else None
            if isinstance(calls, list):
                return list(calls)
            return [("text", body)]
        name = self._recipient.removeprefix("functions.")
        arguments = _json_object(body)
        if arguments is None:
            return [("text", body)]
        return [ParsedCall(name, arguments, raw)]

    def _is_call(self) -> bool:
        if not self.tools_offered:
            return False
        if self.dialect == "muse":
            return self._channel not in ("self", "user", "")
        return self._recipient.startswith("functions.")

    def _kind(self) -> Literal["reasoning", "text"]:
        if self.dialect == "muse":
            return "reasoning" if self._channel == "self" else "text"
        if self._channel == "analysis" or (self._recipient and not self._recipient.startswith("functions.")):
            return "reasoning"  # thinking, or a message to a built-in tool Glassbox does not run
        return "text"


def _strip_wrapper(body: str) -> str:
    text = body.strip()
    text = text.removeprefix("<atem:function_calls>")
    return text.removesuffix("</atem:function_calls>")


def _json_object(text: str) -> dict[str, object] | None:
    if len(text) > MAX_CALL_CHARS:
        return None
    stripped = text.strip()
    if not stripped:
        return {}
    try:
        value = json.loads(stripped)
    except (json.JSONDecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def is_harmony(template_text: str | None) -> bool:
    """Whether a chat template writes the harmony format."""
    return bool(template_text) and CHANNEL in (template_text or "") and MESSAGE in (template_text or "")
