"""Reasoning models: their thinking told apart from their answer, and never sent back as history.

Contract: ARCHITECTURE.md, 'engine.inference.reasoning'.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

PieceKind = Literal["reasoning", "text"]
EFFORTS = ("low", "medium", "high")

__all__ = [
    "EFFORTS",
    "THINK_CLOSE",
    "THINK_FORMATS",
    "THINK_OPEN",
    "PieceKind",
    "ReasoningSplitter",
    "ThinkFormat",
    "detect_thinking",
    "opened_in_prompt",
    "strip_reasoning",
    "thinking_controls",
]

_THINK_BLOCK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


@dataclass(frozen=True)
class ThinkFormat:
    """How one family marks its thinking.

    Attributes:
        name: the format.
        open: the opening marker; empty when the whole reply up to ``close`` is thinking.
        close: the closing marker.
        signatures: markers that say a template uses this format (its rendering or its text).
        skip_after_open: text right after the opening marker that belongs to it (Gemma 4's newline).
        anywhere: a thinking block may also start later in the reply.
        drop: stray markers removed from the answer.
        stutter: a prefix of the opening marker a model may write twice (Gemma 4's ``<|channel>``).
        budget_close: what closes the thinking for the model when its budget runs out.
    """

    name: str
    open: str
    close: str
    signatures: tuple[str, ...] = ()
    skip_after_open: str = ""
    anywhere: bool = False
    drop: tuple[str, ...] = ()
    stutter: str = ""
    budget_close: str = ""

    @property
    def closing(self) -> str:
        """The text that closes the thinking when its budget runs out."""
        return self.budget_close or self.close

    def markers(self) -> tuple[str, ...]:
        """The control tokens of the format (put back where a vocabulary holds them)."""
        return tuple(m for m in (self.open, self.close, *self.drop) if m)


THINK = ThinkFormat("think", THINK_OPEN, THINK_CLOSE, (THINK_OPEN,), budget_close="\n</think>\n\n")

THINK_FORMATS: dict[str, ThinkFormat] = {
    fmt.name: fmt
    for fmt in (
        ThinkFormat(
            "gemma4",
            "<|channel>thought",
            "<channel|>",
            ("<|channel>thought",),
            skip_after_open="\n",
            anywhere=True,
            drop=("<channel|>", "<|channel>"),
            stutter="<|channel>",
        ),
        ThinkFormat("mistral", "[THINK]", "[/THINK]", ("[THINK]",)),
        ThinkFormat("seed", "<seed:think>", "</seed:think>", ("<seed:think>",), budget_close="\n</seed:think>\n"),
        ThinkFormat("minimax_m3", "<mm:think>", "</mm:think>", ("<mm:think>",)),
        ThinkFormat("hunyuan", "<think:opensource>", "</think:opensource>", ("<think{}>",)),
        ThinkFormat(
            "cohere",
            "<|START_THINKING|>",
            "<|END_THINKING|>",
            ("<|START_THINKING|>",),
            drop=("<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_TEXT|>", "<|END_TEXT|>"),
        ),
        ThinkFormat(
            "apriel",
            "",
            "[BEGIN FINAL RESPONSE]",
            ("[BEGIN FINAL RESPONSE]",),
            drop=("[END FINAL RESPONSE]",),
            budget_close="\n[BEGIN FINAL RESPONSE]\n",
        ),
        ThinkFormat("solar", "<|think|>", "<|end|>", ("<|think|>",), drop=("<|begin|>assistant", "<|content|>")),
        ThinkFormat("kimi_vl", "◁think▷", "◁/think▷", ("◁think▷",)),
        ThinkFormat("apertus", "<|inner_prefix|>", "<|inner_suffix|>", ("<|inner_prefix|>",)),
        ThinkFormat(
            "granite", THINK_OPEN, THINK_CLOSE, ("<response>", "<|start_of_role|>"), drop=("<response>", "</response>")
        ),
        THINK,
    )
}
"""Every thinking format, in the order :func:`detect_thinking` tries them (the most specific first)."""


def detect_thinking(template_text: str | None, rendered: str | None = None) -> str:
    """The thinking format of a template: the first whose markers its rendering holds, else its
    text; ``"think"`` when neither says (a ``<think>`` at the start of a reply is thinking anyway).

    Args:
        template_text: the chat template.
        rendered: a rendering of a conversation by it, when there is one.
    """
    for text in (rendered or "", template_text or ""):
        for fmt in THINK_FORMATS.values():
            if fmt.signatures and all(marker in text for marker in fmt.signatures):
                return fmt.name
    return THINK.name


def think_format(name: str) -> ThinkFormat:
    """A thinking format by name (``"think"`` for an unknown one)."""
    return THINK_FORMATS.get(name, THINK)


def opened_in_prompt(prompt: str, fmt: str = "think") -> bool:
    """Whether the rendered prompt ends inside an open thinking block (the reply starts there)."""
    spec = think_format(fmt)
    if not spec.open:
        return True  # the whole reply up to its closing marker is thinking
    return prompt.rstrip().endswith(spec.open)


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
        started: the reply starts inside the thinking (the template opened it in the prompt).
        enabled: recognise thinking at all (False passes everything through as text).
        fmt: the thinking format (:data:`THINK_FORMATS`).
    """

    started: bool = False
    enabled: bool = True
    fmt: str = "think"
    _state: Literal["start", "reasoning", "after", "text"] = "start"
    _buf: str = ""
    _fresh: bool = False
    _skip: bool = False

    def __post_init__(self) -> None:
        self._spec = think_format(self.fmt)
        self._text_holds = (*self._spec.drop, *((self._spec.open,) if self._spec.anywhere else ()))
        if not self.enabled:
            self._state = "text"
        elif self.started or not self._spec.open:
            self._state = "reasoning"
            self._fresh = True
            self._skip = bool(self._spec.skip_after_open)

    @property
    def in_reasoning(self) -> bool:
        """Whether the text fed so far ends inside the thinking."""
        return self._state == "reasoning"

    def feed(self, text: str) -> list[tuple[PieceKind, str]]:
        """Takes the next piece of the reply; returns what is settled, in order."""
        self._buf += text
        out: list[tuple[PieceKind, str]] = []
        spec = self._spec
        while self._buf:
            if self._state == "text":
                if not self._read_text(out):
                    break
            elif self._state == "start":
                head = self._buf.lstrip()
                if spec.stutter:
                    while head.startswith(spec.stutter * 2):
                        head = head[len(spec.stutter) :]
                if not head or _prefix_of(head, spec.open) or _prefix_of(head, spec.close):
                    break  # whitespace or a partial marker so far
                if spec.open and head.startswith(spec.open):
                    self._buf = head[len(spec.open) :]
                    self._enter_reasoning()
                elif head.startswith(spec.close):
                    self._buf = head[len(spec.close) :]
                    self._state = "after"  # a bare closing marker: no thinking this time
                else:
                    self._state = "text"
            elif self._state == "reasoning":
                if not self._read_reasoning(out):
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
        text = self._dropped(buf)
        return [("text", text)] if text else []

    # ---------------------------------------------------------------- states
    def _enter_reasoning(self) -> None:
        self._state = "reasoning"
        self._fresh = True
        self._skip = bool(self._spec.skip_after_open)

    def _read_reasoning(self, out: list[tuple[PieceKind, str]]) -> bool:
        spec = self._spec
        if self._skip:
            if _prefix_of(self._buf, spec.skip_after_open):
                return False
            self._buf = self._buf.removeprefix(spec.skip_after_open)
            self._skip = False
            if not self._buf:
                return False
        if self._fresh and spec.open:
            stripped = self._buf.lstrip()
            if not stripped or _prefix_of(stripped, spec.open):
                return False  # the model may be opening the block the prompt opened
            if stripped.startswith(spec.open):
                self._buf = stripped[len(spec.open) :]
        self._fresh = False
        end = self._buf.find(spec.close)
        if end >= 0:
            if end:
                out.append(("reasoning", self._buf[:end]))
            self._buf = self._buf[end + len(spec.close) :]
            self._state = "after"
            return True
        hold = _held(self._buf, spec.close)
        cut = len(self._buf) - hold
        if cut:
            out.append(("reasoning", self._buf[:cut]))
            self._buf = self._buf[cut:]
        return False

    def _read_text(self, out: list[tuple[PieceKind, str]]) -> bool:
        spec = self._spec
        if spec.anywhere and spec.open:
            at = self._buf.find(spec.open)
            if at >= 0:
                text = self._dropped(self._buf[:at])
                if text:
                    out.append(("text", text))
                self._buf = self._buf[at + len(spec.open) :]
                self._enter_reasoning()
                return True
        hold = max((_held(self._buf, marker) for marker in self._text_holds), default=0)
        cut = len(self._buf) - hold
        if cut:
            text = self._dropped(self._buf[:cut])
            if text:
                out.append(("text", text))
            self._buf = self._buf[cut:]
        return False

    def _dropped(self, text: str) -> str:
        return drop_markers(text, self._spec.drop)


def drop_markers(text: str, markers: tuple[str, ...]) -> str:
    """``text`` without any of ``markers``, also those that removing one made (``<|END_<x>RESPONSE|>``)."""
    while markers and any(marker in text for marker in markers):
        for marker in markers:
            text = text.replace(marker, "")
    return text


def _prefix_of(head: str, marker: str) -> bool:
    """``head`` is a proper start of ``marker`` (more text may complete it)."""
    return bool(marker) and len(head) < len(marker) and marker.startswith(head)


def _held(text: str, marker: str) -> int:
    """The length of the end of ``text`` that could be the start of ``marker``."""
    if not marker:
        return 0
    first = marker[0]
    at = text.find(first, max(0, len(text) - len(marker) + 1))
    while at >= 0:  # the earliest start of a partial marker is the longest one
        if marker.startswith(text[at:]):
            return len(text) - at
        at = text.find(first, at + 1)
    return 0
