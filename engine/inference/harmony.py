"""OpenAI's harmony format (gpt-oss): a reply made of channel messages, split as it streams.

A gpt-oss reply is a sequence of messages, each ``<|channel|>NAME[ to=RECIPIENT][ <|constrain|>json]
<|message|>BODY`` ended by ``<|end|>`` (more follows, from ``<|start|>assistant``), ``<|call|>`` (a
tool call: the turn waits for its result) or ``<|return|>`` (the reply is over):

* ``analysis``: the thinking (never shown as the answer, never sent back);
* ``final``: the answer;
* ``commentary`` with ``to=functions.NAME``: a call of tool NAME, its body the JSON arguments;
  ``commentary`` without a recipient: a preamble the user may see (text).

:class:`HarmonySplitter` turns the streaming text into ``("reasoning", text)``, ``("text", text)``
and :class:`~engine.inference.tool_calls.ParsedCall` pieces; thinking and text stream as they come, a call is
emitted whole when its message ends. A reply that does not start like a harmony message is plain
text. The markers are special tokens: the session puts their text back for the worker's output
(:func:`engine.inference.reply.special_markers`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Literal

from engine.inference.tool_calls import MAX_CALL_CHARS, ParsedCall, partial_suffix

START, CHANNEL, MESSAGE, END, CALL, RETURN, CONSTRAIN = (
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|end|>",
    "<|call|>",
    "<|return|>",
    "<|constrain|>",
)
MARKERS = (START, CHANNEL, MESSAGE, END, CALL, RETURN, CONSTRAIN)
_TERMINATORS = (END, CALL, RETURN, START)
_HEADER_STARTS = (CHANNEL, START, "to=", "assistant")

_CHANNEL_NAME = re.compile(re.escape(CHANNEL) + r"\s*([A-Za-z_]+)")
_RECIPIENT = re.compile(r"to=([^\s<]+)")

HarmonyPiece = tuple[Literal["reasoning", "text"], str] | ParsedCall


@dataclass
class HarmonySplitter:
    """Splits a streaming harmony reply (see the module docstring).

    Args:
        tools_offered: a message to ``functions.NAME`` is a call only when tools were offered
            (otherwise it is shown as text).
    """

    tools_offered: bool = True
    _state: Literal["header", "body", "plain"] = "header"
    _buf: str = ""
    _channel: str = ""
    _recipient: str = ""
    _header: str = ""

    @property
    def in_reasoning(self) -> bool:
        """Whether the text so far ends inside the thinking (the analysis channel)."""
        return self._state == "body" and self._channel == "analysis"

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
        channel = _CHANNEL_NAME.search(header)
        recipient = _RECIPIENT.search(header)
        self._channel = channel.group(1) if channel else "final"
        self._recipient = recipient.group(1) if recipient else ""
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
        name = self._recipient.removeprefix("functions.")
        arguments = _json_object(body)
        if arguments is None:
            return [("text", body)]
        return [ParsedCall(name, arguments, f"{self._header}{MESSAGE}{body}")]

    def _is_call(self) -> bool:
        return self.tools_offered and self._recipient.startswith("functions.")

    def _kind(self) -> Literal["reasoning", "text"]:
        return "reasoning" if self._channel == "analysis" else "text"


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
