"""Shapes a reply as it streams: thinking apart from the answer, tool calls out of the text.

Contract: ARCHITECTURE.md, 'engine.inference.reply'.
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
from engine.inference.harmony import Dialect, HarmonySplitter
from engine.inference.reasoning import THINK_FORMATS, ReasoningSplitter, think_format
from engine.inference.tool_calls import (
    FORMATS,
    Family,
    ParsedCall,
    Piece,
    Schemas,
    SplitPiece,
    ToolCallParser,
    call_markers,
    partial_suffix,
)
from engine.inference.tool_calls.functionary import FunctionarySplitter
from engine.inference.tool_calls.kimi_k3 import CLOSE as KIMI_CLOSE
from engine.inference.tool_calls.kimi_k3 import OPEN as KIMI_OPEN
from engine.inference.tool_calls.kimi_k3 import SEP as KIMI_SEP
from engine.inference.tool_calls.kimi_k3 import KimiK3Splitter, Section

if TYPE_CHECKING:
    from engine.inference.runtime import GenerationParams, WorkerResult

R = TypeVar("R")

THINK_END = "\n</think>\n\n"
"""What closes ``<think>`` thinking when its budget runs out (the reply then goes on from there)."""

_BUDGET_CLOSE = {
    "harmony": "<|end|><|start|>assistant<|channel|>final<|message|>",
    "kimi_k3": f"{KIMI_CLOSE}think{KIMI_SEP}{KIMI_OPEN}response{KIMI_SEP}",
}

_ID_ALPHABET = string.ascii_letters + string.digits

_EXTRA_MARKERS = ("<|role_sep|>", "<|role_end|>", "<|im_end|>")

MARKERS = tuple(
    dict.fromkeys(
        [
            *(marker for fmt in THINK_FORMATS.values() for marker in fmt.markers()),
            *call_markers(),
            *HARMONY_MARKERS,
            *_EXTRA_MARKERS,
        ]
    )
)
"""The markup the splitters and parsers look for that a vocabulary may hold as one special token."""


def special_markers(tokenize: Callable[[str], list[int]]) -> dict[int, str]:
    """The markers (:data:`MARKERS`) that are one token of this vocabulary: token id -> text.

    The worker renders generated tokens without their special text (so ``<|im_end|>`` and the like
    never show), which would also hide a control token such as Mistral's ``[TOOL_CALLS]`` or Llama's
    ``<|python_tag|>`` from the parsers; the shaper puts these back (:class:`ReplyShaper`), those
    of the template's own formats only (:func:`format_markers`).
    """
    found: dict[int, str] = {}
    for marker in MARKERS:
        ids = tokenize(marker)
        if len(ids) == 1:
            found[ids[0]] = marker
    return found


def format_markers(think: str, families: Collection[Family | None], harmony: bool) -> frozenset[str]:
    """The markers of one template's formats: its thinking's, its calls' (the template's own format
    and the one a turn parses, the fallback prompt's when the template renders no tools), harmony's
    if it is one."""
    found = set(think_format(think).markers())
    for family in families:
        if family is None or family not in FORMATS:
            continue
        found.update(FORMATS[family].all_markers())
        if FORMATS[family].kind == "kimi_k3":
            found.update((KIMI_OPEN, KIMI_CLOSE, KIMI_SEP))
        if family in ("harmony", "muse"):
            found.update(HARMONY_MARKERS)
    if harmony:
        found.update(HARMONY_MARKERS)
    return frozenset(found)


def new_call_id() -> str:
    """A call id: 9 letters and digits (Mistral's templates refuse any other shape; others take it)."""
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(9))


class _ThinkingCalls:
    """The thinking from a call's opening marker on, held until the thinking closes (it was not a
    call: it streams on as thinking) or the reply ends (the calls in it are parsed out)."""

    def __init__(self, opens: Sequence[str]) -> None:
        self._opens = tuple(opens)
        self.held = ""
        self._tail = ""

    def feed(self, text: str) -> str:
        """Takes thinking text; returns what can stream as thinking now."""
        text = self._tail + text
        self._tail = ""
        if self.held:
            self.held += text
            return ""
        found = [at for at in (text.find(marker) for marker in self._opens) if at >= 0]
        if found:
            at = min(found)
            self.held = text[at:]
            return text[:at]
        hold = partial_suffix(text, self._opens)
        self._tail = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold]

    def release(self) -> str:
        """All that was held (the thinking closed: it was thinking)."""
        out, self.held, self._tail = self.held + self._tail, "", ""
        return out


@dataclass
class ReplyShaper:
    """Turns raw tokens into answer tokens, reasoning and tool calls (see the module docstring).

    Args:
        family: the tool-call format to parse; ``None`` when no tools are offered (calls are text).
        harmony: the reply is in OpenAI's harmony format (gpt-oss, engine/inference/harmony.py): its channels
            give the thinking, the answer and the calls (``family`` then only says whether tools
            were offered).
        tool_names: the tools offered.
        think_started: the reply starts inside the thinking (the prompt opened it).
        thinking: recognise thinking at all.
        clock: seconds, for the reasoning time (tests pass their own).
        specials: marker tokens whose text the worker leaves out (:func:`special_markers`).
        schemas: the tools' argument schemas by name (formats that write arguments as text).
        think_format: the template's thinking format (engine/inference/reasoning.py).
        syntax: the template's own call format, for a reply that is a whole structure (Kimi K3,
            functionary v3.2, Muse), parsed for its thinking and answer even with no tools offered.
    """

    family: Family | None = None
    harmony: bool = False
    tool_names: Collection[str] = ()
    think_started: bool = False
    thinking: bool = True
    clock: Callable[[], float] = time.perf_counter
    specials: Mapping[int, str] = field(default_factory=dict)
    schemas: Schemas | None = None
    think_format: str = "think"
    syntax: Family | None = None
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
        offered = self.family is not None
        kind = "harmony" if self.harmony else FORMATS[self.family or self.syntax or "json"].kind
        self._structure = kind
        self._whole: HarmonySplitter | KimiK3Splitter | FunctionarySplitter | None = None
        if kind in ("harmony", "muse"):
            dialect: Dialect = "muse" if kind == "muse" else "harmony"
            self._whole = HarmonySplitter(tools_offered=offered, dialect=dialect, schemas=self.schemas)
        elif kind == "kimi_k3":
            section: Section = "think" if self.think_started and self.thinking else "response"
            self._whole = KimiK3Splitter(section=section, tools_offered=offered, schemas=self.schemas)
        elif kind == "functionary_v32":
            self._whole = FunctionarySplitter(tools_offered=offered)
        self._splitter = ReasoningSplitter(started=self.think_started, enabled=self.thinking, fmt=self.think_format)
        blocks = self.family is not None and self._whole is None
        self._parser = ToolCallParser(self.family, self.tool_names, self.schemas) if blocks and self.family else None
        opens = [block.open for block in FORMATS[self.family].blocks] if self._parser and self.family else []
        self._watch = _ThinkingCalls(opens) if opens and self.thinking else None

    @property
    def in_reasoning(self) -> bool:
        """Whether the reply so far ends inside the thinking."""
        return self._whole.in_reasoning if self._whole is not None else self._splitter.in_reasoning

    @property
    def in_call(self) -> bool:
        """Whether the reply so far ends inside a call's markup (held back until it is complete)."""
        if self._whole is not None:
            return self._whole.in_call
        return self._parser is not None and self._parser.in_call

    @property
    def budget_close(self) -> str:
        """What closes the thinking for the model when its budget runs out."""
        return _BUDGET_CLOSE.get(self._structure) or think_format(self.think_format).closing

    def _feed(self, text: str) -> list[SplitPiece]:
        if self._whole is not None:
            return self._whole.feed(text)
        return self._watched(self._splitter.feed(text))

    def _finish_split(self) -> list[SplitPiece]:
        if self._whole is not None:
            return self._whole.finish()
        pieces = self._watched(self._splitter.finish(), end=True)
        rest = self._watch.release() if self._watch is not None else ""
        if rest:
            pieces.extend(self._calls_in_thinking(rest))
        return pieces

    def _watched(self, pieces: Sequence[tuple[str, str]], end: bool = False) -> list[SplitPiece]:
        """Thinking through the watch for calls written inside it (see the module docstring)."""
        out: list[SplitPiece] = []
        for kind, text in pieces:
            if kind == "reasoning":
                shown = self._watch.feed(text) if self._watch is not None else text
                if shown:
                    out.append(("reasoning", shown))
                continue
            if self._watch is not None:
                held = self._watch.release()
                if held:
                    out.append(("reasoning", held))
            out.append(("text", text))
        if not end and self._watch is not None and not self._splitter.in_reasoning:
            held = self._watch.release()
            if held:
                out.append(("reasoning", held))
        return out

    def _calls_in_thinking(self, held: str) -> list[SplitPiece]:
        """The reply ended inside the thinking with a call's markup held: its calls, the rest thinking."""
        assert self.family is not None
        parser = ToolCallParser(self.family, self.tool_names, self.schemas)
        pieces = parser.feed(held) + parser.finish()
        if not any(isinstance(piece, ParsedCall) for piece in pieces):
            return [("reasoning", held)]
        return [piece if isinstance(piece, ParsedCall) else ("reasoning", piece) for piece in pieces]

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
        elif self.in_call:
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

    def _route(self, pieces: Sequence[SplitPiece], token: Token | None) -> list[Event]:
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
                if token is None:
                    events.append(Token(piece, -1))
                else:
                    events.append(token if token.text == piece else replace(token, text=piece))
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

    When the thinking reaches the budget, the generation is stopped, the thinking's closing marker
    (:attr:`ReplyShaper.budget_close`; :data:`THINK_END` for ``<think>``) is added after the tokens
    generated so far, and a second generation goes on from there (its prompt
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
    close = shaper.budget_close
    yield from shaper.on_token(Token(close, -1))
    more = [*tokens, *generated, *tokenize(close)]
    second = yield from shaped(generate(more, params.model_copy(update={"max_tokens": left}), cancel), shaper)
    return _joined(first, second, close)


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
