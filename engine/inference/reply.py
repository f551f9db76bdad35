"""Shapes a reply as it streams: thinking apart from the answer, tool calls out of the text.

The worker streams raw ``Token`` events. :class:`ReplyShaper` runs each token's text through a
:class:`~engine.inference.reasoning.ReasoningSplitter` and then, when tools are offered, a
:class:`~engine.inference.tool_calls.ToolCallParser` (for a gpt-oss model, a
:class:`~engine.inference.harmony.HarmonySplitter` does both), and emits in its place:

* ``Reasoning(text)`` for thinking,
* ``Token`` (the same event with only its answer text) for the answer, as it streams,
* ``ToolCall(id, name, arguments, raw)`` once per complete call (its markup never shows as text),
* ``CallProgress(tokens)`` for each token held back as what may be a call's markup, meanwhile.

It keeps the answer, the reasoning (with its token count and time) and the calls, for the
``Finished`` event that ends the reply. :func:`shaped` wraps the worker's generator with it, and
:func:`within_thinking_budget` also caps the thinking. The session uses them (:mod:`engine.inference.session`,
through :mod:`engine.inference.turn`); a test can drive them with scripted tokens.
"""

from __future__ import annotations

import dataclasses
import secrets
import string
import threading
import time
from collections.abc import Callable, Collection, Generator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

from engine.inference.events import CallProgress, Event, Finished, FinishReason, Reasoning, Stats, Token, ToolCall
from engine.inference.harmony import MARKERS as HARMONY_MARKERS
from engine.inference.harmony import HarmonyPiece, HarmonySplitter
from engine.inference.reasoning import PieceKind, ReasoningSplitter
from engine.inference.tool_calls import (
    DS_CALL_BEGIN,
    DS_CALL_END,
    DS_CALLS_BEGIN,
    DS_CALLS_END,
    DS_SEP,
    LLAMA_PYTHON_TAG,
    MISTRAL_CALLS,
    Family,
    ParsedCall,
    Piece,
    ToolCallParser,
)

if TYPE_CHECKING:
    from engine.inference.runtime import GenerationParams, WorkerResult

R = TypeVar("R")

THINK_END = "\n</think>\n\n"
"""What closes the thinking when its budget runs out (the reply then goes on from there)."""

_ID_ALPHABET = string.ascii_letters + string.digits


MARKERS = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    MISTRAL_CALLS,
    "[ARGS]",
    "[CALL_ID]",
    LLAMA_PYTHON_TAG,
    DS_CALLS_BEGIN,
    DS_CALLS_END,
    DS_CALL_BEGIN,
    DS_CALL_END,
    DS_SEP,
    *HARMONY_MARKERS,
)
"""The markup the parsers look for that a vocabulary may hold as one special token."""


def special_markers(tokenize: Callable[[str], list[int]]) -> dict[int, str]:
    """The markers (:data:`MARKERS`) that are one token of this vocabulary: token id -> text.

    The worker renders generated tokens without their special text (so ``<|im_end|>`` and the like
    never show), which would also hide a control token such as Mistral's ``[TOOL_CALLS]`` or Llama's
    ``<|python_tag|>`` from the parsers; the shaper puts these back (:class:`ReplyShaper`).
    """
    found: dict[int, str] = {}
    for marker in MARKERS:
        ids = tokenize(marker)
        if len(ids) == 1:
            found[ids[0]] = marker
    return found


def new_call_id() -> str:
    """A call id: 9 letters and digits (Mistral's templates refuse any other shape; others take it)."""
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(9))


@dataclass
class ReplyShaper:
    """Turns raw tokens into answer tokens, reasoning and tool calls (see the module docstring).

    Args:
        family: the tool-call format to parse; ``None`` when no tools are offered (calls are text).
        harmony: the reply is in OpenAI's harmony format (gpt-oss, engine/inference/harmony.py): its channels
            give the thinking, the answer and the calls (``family`` then only says whether tools
            were offered).
        tool_names: the tools offered.
        think_started: the reply starts inside ``<think>`` (the prompt opened it).
        thinking: recognise ``<think>`` at all.
        clock: seconds, for the reasoning time (tests pass their own).
        specials: marker tokens whose text the worker leaves out (:func:`special_markers`).
    """

    family: Family | None = None
    harmony: bool = False
    tool_names: Collection[str] = ()
    think_started: bool = False
    thinking: bool = True
    clock: Callable[[], float] = time.perf_counter
    specials: Mapping[int, str] = field(default_factory=dict)
    answer: str = ""
    reasoning: str = ""
    reasoning_tokens: int = 0
    calls: list[ToolCall] = field(default_factory=list)
    call_tokens: int = 0
    """Tokens held back as the markup of the call being written (0 when none is)."""
    _reasoning_start: float | None = None
    _reasoning_end: float | None = None
    _last: Token | None = None

    def __post_init__(self) -> None:
        self._splitter = ReasoningSplitter(started=self.think_started, enabled=self.thinking)
        self._harmony = HarmonySplitter(tools_offered=self.family is not None) if self.harmony else None
        self._parser = (
            ToolCallParser(self.family, self.tool_names) if self.family is not None and not self.harmony else None
        )

    @property
    def in_reasoning(self) -> bool:
        """Whether the reply so far ends inside the thinking."""
        return self._harmony.in_reasoning if self._harmony is not None else self._splitter.in_reasoning

    def _feed(self, text: str) -> list[HarmonyPiece]:
        if self._harmony is not None:
            return self._harmony.feed(text)
        return list(self._splitter.feed(text))

    def _finish_split(self) -> list[HarmonyPiece]:
        if self._harmony is not None:
            return self._harmony.finish()
        return list(self._splitter.finish())

    @property
    def reasoning_ms(self) -> float:
        """From the first thinking token to the token that closed the thinking (or the last one)."""
        if self._reasoning_start is None:
            return 0.0
        end = self._reasoning_end if self._reasoning_end is not None else self.clock()
        return round((end - self._reasoning_start) * 1000, 2)

    def on_token(self, token: Token) -> list[Event]:
        """The events that replace one raw token."""
        if not token.text and token.token_id in self.specials:
            token = replace(token, text=self.specials[token.token_id])
        self._last = token
        now = self.clock()
        was_reasoning = self.in_reasoning or (self.think_started and self._reasoning_start is None)
        pieces = self._feed(token.text)
        is_reasoning = self.in_reasoning
        if was_reasoning or is_reasoning or any(isinstance(p, tuple) and p[0] == "reasoning" for p in pieces):
            self.reasoning_tokens += 1
            if self._reasoning_start is None:
                self._reasoning_start = now
            if not is_reasoning and self._reasoning_end is None:
                self._reasoning_end = now
        events = self._route(pieces, token)
        if any(isinstance(event, (Token, ToolCall)) for event in events):
            self.call_tokens = 0
        elif self._parser is not None and self._parser.in_call:
            self.call_tokens += 1  # held back as a call's markup: said, so a front end shows it is written
            events.append(CallProgress(self.call_tokens))
        return events

    def finish(self) -> list[Event]:
        """The events for what was held back at the end of the reply."""
        if self.in_reasoning and self._reasoning_end is None and self._reasoning_start is not None:
            self._reasoning_end = self.clock()
        events = self._route(self._finish_split(), self._last)
        if self._parser is not None:
            events.extend(self._emit(self._parser.finish(), self._last))
        return events

    def finished(self, reason: FinishReason, stats: Stats) -> Finished:
        """The ``Finished`` event of this reply: the answer, the reasoning and the calls."""
        return Finished(
            reason=reason,
            stats=stats,
            text=self.answer,
            reasoning=self.reasoning,
            reasoning_tokens=self.reasoning_tokens,
            reasoning_ms=self.reasoning_ms,
            tool_calls=tuple(self.calls),
        )

    def _route(self, pieces: Sequence[HarmonyPiece | tuple[PieceKind, str]], token: Token | None) -> list[Event]:
        events: list[Event] = []
        for piece in pieces:
            if isinstance(piece, ParsedCall):
                events.extend(self._emit([piece], token))
                continue
            kind, text = piece
            if kind == "reasoning":
                self.reasoning += text
                events.append(Reasoning(text))
            elif self._parser is not None:
                events.extend(self._emit(self._parser.feed(text), token))
            else:
                events.extend(self._emit([text], token))
        return events

    def _emit(self, pieces: list[Piece], token: Token | None) -> list[Event]:
        events: list[Event] = []
        for piece in pieces:
            if isinstance(piece, ParsedCall):
                call = ToolCall(new_call_id(), piece.name, piece.arguments, piece.raw)
                self.calls.append(call)
                events.append(call)
            elif piece:
                self.answer += piece
                events.append(replace(token, text=piece) if token is not None else Token(piece, -1))
        return events


def shaped(source: Generator[Event, None, R], shaper: ReplyShaper) -> Generator[Event, None, R]:
    """Re-yields ``source``'s events with its tokens shaped; returns what ``source`` returns."""
    try:
        while True:
            try:
                event = next(source)
            except StopIteration as stop:
                result: R = stop.value
                yield from shaper.finish()
                return result
            if isinstance(event, Token):
                yield from shaper.on_token(event)
            else:
                yield event
    finally:
        source.close()


class _EitherStop(threading.Event):
    """Set by its own ``set()`` or when the caller's cancel is set (the worker only asks ``is_set``)."""

    def __init__(self, outer: threading.Event | None) -> None:
        super().__init__()
        self.outer = outer

    def is_set(self) -> bool:
        return super().is_set() or (self.outer is not None and self.outer.is_set())


Generate = Callable[
    [Sequence[int], "GenerationParams", "threading.Event | None"], Generator[Event, None, "WorkerResult"]
]


def within_thinking_budget(
    generate: Generate,
    tokens: Sequence[int],
    params: GenerationParams,
    cancel: threading.Event | None,
    shaper: ReplyShaper,
    budget: int,
    tokenize: Callable[[str], list[int]],
) -> Generator[Event, None, WorkerResult]:
    """Generates with at most ``budget`` tokens of thinking.

    When the thinking reaches the budget, the generation is stopped, :data:`THINK_END` is added
    after the tokens generated so far, and a second generation goes on from there (its prompt
    shares the whole first one, so only the closing tag is prefilled); the result adds both up.
    A reply that stops thinking in time, or never thinks, is one generation as usual.

    Args:
        generate: the worker's ``generate``.
        tokens: the prompt.
        params: the sampling parameters (``max_tokens`` covers both generations).
        cancel: the caller's Stop.
        shaper: the reply's shaper (fed every token, of both generations).
        budget: the most thinking tokens.
        tokenize: the prompt tokenizer (special tokens parsed), for the closing tag.
    """
    stop = _EitherStop(cancel)
    generated: list[int] = []
    source = generate(tokens, params, stop)
    try:
        while True:
            try:
                event = next(source)
            except StopIteration as done:
                first: WorkerResult = done.value
                break
            if isinstance(event, Token):
                generated.append(event.token_id)
                yield from shaper.on_token(event)
                if shaper.in_reasoning and shaper.reasoning_tokens >= budget:
                    stop.set()
            else:
                yield event
    finally:
        source.close()
    over_budget = super(_EitherStop, stop).is_set() and not (cancel is not None and cancel.is_set())
    left = params.max_tokens - first.completion_tokens
    if not over_budget or first.reason != "cancelled" or left < 1:
        yield from shaper.finish()
        return first
    yield from shaper.on_token(Token(THINK_END, -1))
    more = [*tokens, *generated, *tokenize(THINK_END)]
    second = yield from shaped(generate(more, params.model_copy(update={"max_tokens": left}), cancel), shaper)
    return _joined(first, second, THINK_END)


def _joined(first: WorkerResult, second: WorkerResult, glue: str) -> WorkerResult:
    extra: dict[str, Any] = {}
    for name in ("draft_tokens", "accepted_tokens", "draft_restores"):
        if hasattr(first, name):
            extra[name] = getattr(first, name) + getattr(second, name)
    return dataclasses.replace(
        second,
        text=first.text + glue + second.text,
        prompt_tokens=first.prompt_tokens,
        cached_tokens=first.cached_tokens,
        completion_tokens=first.completion_tokens + second.completion_tokens,
        ttft_ms=first.ttft_ms,
        prefill_ms=first.prefill_ms + second.prefill_ms,
        decode_ms=first.decode_ms + second.decode_ms,
        **extra,
    )
