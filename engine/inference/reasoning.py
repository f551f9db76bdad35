"""Reasoning models: their thinking told apart from their answer, and never sent back as history.

Reasoning models (Qwen 3, DeepSeek R1 and its distills, QwQ, Phi-4 reasoning, ...) write their
thinking between ``<think>`` and ``</think>`` before the answer. Some chat templates open the block
in the generation prompt themselves (DeepSeek R1's ends with ``<think>\\n``), so the reply starts
inside it and only ``</think>`` appears: :func:`opened_in_prompt` says so from the rendered prompt.

:class:`ReasoningSplitter` splits a streaming reply into ``("reasoning", text)`` and
``("text", text)`` pieces. A ``<think>`` is recognised only at the start of the reply (after
whitespace): further on it is ordinary text (a model explaining the tags). The whitespace after
``</think>`` is dropped from the answer.

Templates that can switch thinking on or off name the switch in their text:
``enable_thinking`` (Qwen 3, and templates written after it) or ``reasoning_effort`` (gpt-oss,
with ``low``/``medium``/``high``); :func:`thinking_controls` finds them, and the renderer passes
the value only when the caller set one (:mod:`engine.inference.templates`).

:func:`strip_reasoning` removes thinking from an assistant message before it goes back into a
prompt: old reasoning wastes the window, and the families' own templates drop it too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

PieceKind = Literal["reasoning", "text"]
EFFORTS = ("low", "medium", "high")

_THINK_BLOCK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


def opened_in_prompt(prompt: str) -> bool:
    """Whether the rendered prompt ends inside an open ``<think>`` block (the reply starts there)."""
    tail = prompt.rstrip()
    return tail.endswith(THINK_OPEN)


def thinking_controls(template_text: str | None) -> frozenset[str]:
    """The thinking switches a chat template reads: ``enable_thinking``, ``reasoning_effort``."""
    text = template_text or ""
    return frozenset(name for name in ("enable_thinking", "reasoning_effort") if name in text)


def strip_reasoning(text: str) -> str:
    """An assistant message without its thinking: ``<think>...</think>`` blocks (and the whitespace
    after them) removed, and a reply that stopped mid-thought (``<think>`` never closed) dropped;
    text that only closes a block (its opening was in the prompt) loses what came before."""
    if THINK_OPEN not in text and THINK_CLOSE not in text:
        return text
    head = text.lstrip()
    if head.startswith(THINK_OPEN) and THINK_CLOSE not in head:
        return ""
    text = _THINK_BLOCK.sub("", text)
    if THINK_CLOSE in text and THINK_OPEN not in text:
        text = text.split(THINK_CLOSE, 1)[1].lstrip()
    return text


@dataclass
class ReasoningSplitter:
    """Splits a streaming reply into its reasoning and its answer.

    Args:
        started: the reply starts inside ``<think>`` (the template opened it in the prompt).
        enabled: recognise thinking at all (False passes everything through as text).
    """

    started: bool = False
    enabled: bool = True
    _state: Literal["start", "reasoning", "after", "text"] = "start"
    _buf: str = ""
    _saw: bool = False

    def __post_init__(self) -> None:
        if not self.enabled:
            self._state = "text"
        elif self.started:
            self._state = "reasoning"
            self._saw = True

    @property
    def in_reasoning(self) -> bool:
        """Whether the text fed so far ends inside the thinking."""
        return self._state == "reasoning"

    @property
    def had_reasoning(self) -> bool:
        """Whether a thinking block was seen (open or closed)."""
        return self._saw

    def feed(self, text: str) -> list[tuple[PieceKind, str]]:
        """Takes the next piece of the reply; returns what is settled, in order."""
        self._buf += text
        out: list[tuple[PieceKind, str]] = []
        while self._buf:
            if self._state == "text":
                out.append(("text", self._buf))
                self._buf = ""
            elif self._state == "start":
                head = self._buf.lstrip()
                if not head or (THINK_OPEN.startswith(head) and len(head) < len(THINK_OPEN)):
                    break  # whitespace or a partial "<think>" so far
                if head.startswith(THINK_OPEN):
                    self._buf = head[len(THINK_OPEN) :]
                    self._state = "reasoning"
                    self._saw = True
                else:
                    self._state = "text"
            elif self._state == "reasoning":
                end = self._buf.find(THINK_CLOSE)
                if end >= 0:
                    if end:
                        out.append(("reasoning", self._buf[:end]))
                    self._buf = self._buf[end + len(THINK_CLOSE) :]
                    self._state = "after"
                    self._saw = True
                    continue
                hold = _held(self._buf, THINK_CLOSE)
                cut = len(self._buf) - hold
                if cut:
                    out.append(("reasoning", self._buf[:cut]))
                    self._buf = self._buf[cut:]
                break
            else:  # "after": drop the whitespace between the thinking and the answer
                head = self._buf.lstrip()
                if not head:
                    self._buf = ""
                    break
                self._buf = head
                self._state = "text"
        return out

    def finish(self) -> list[tuple[PieceKind, str]]:
        """The end of the reply: what was held back."""
        buf, self._buf = self._buf, ""
        if not buf:
            return []
        if self._state == "reasoning":
            return [("reasoning", buf)]
        if self._state == "after":
            return []
        return [("text", buf)]


def _held(text: str, marker: str) -> int:
    """The length of the end of ``text`` that could be the start of ``marker``."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
