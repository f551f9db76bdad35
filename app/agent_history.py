"""How a turn made with tools is stored in the history, for the app and ``glassbox chat`` alike.

Contract: ARCHITECTURE.md, 'app.agent_history'.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from engine.inference.events import ToolCall

if TYPE_CHECKING:
    from engine.agent.loop import ToolStep
    from engine.inference.context import Message
    from engine.inference.events import Finished
    from engine.media import Media

Record = dict[str, object]
"""One JSON record of the loop, as it is stored in a reply's ``stats``."""

INTERRUPTED_RESULT = "not run: the reply was interrupted before this call finished"
"""The result a call gets when its reply was saved without one (the app or the CLI was killed)."""
TEXT_BREAK = "\n\n"
"""What separates the text of two generations of one turn."""


def call_dict(call: ToolCall) -> Record:
    """An ``engine.inference.events.ToolCall`` as JSON."""
    return {"id": call.id, "name": call.name, "arguments": dict(call.arguments)}


def message_dict(message: Message) -> Record:
    """An ``engine.inference.context.Message`` as JSON (for the reply's ``agent_messages``)."""
    out: Record = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [call_dict(call) for call in message.tool_calls]
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    if message.name:
        out["name"] = message.name
    return out


def step_dict(step: ToolStep) -> Record:
    """An ``engine.agent.loop.ToolStep`` as JSON (what a tool card shows)."""
    return {
        "id": step.call.id,
        "round": step.round,
        "name": step.call.name,
        "arguments": dict(step.call.arguments),
        "source": step.source,
        "approval": step.approval,
        "ran": step.ran,
        "result": step.result.content,
        "is_error": step.result.is_error,
        "ms": step.ms,
        "tokens": step.tokens,
        "truncated": step.truncated,
    }


def message_record(message: Message, step: ToolStep | None) -> Record:
    """The record of one new message of the loop (``engine.agent.loop.Agent``'s ``on_step``)."""
    return {"kind": "message", "message": message_dict(message), "step": step_dict(step) if step is not None else None}


def generation_record(round_: int, finished: Finished) -> Record:
    """The record of one generation of the loop (its ``Finished``), for the timeline: its times,
    its tokens, and where its prompt came from (``cached_tokens`` reused, ``kv_restored_tokens``
    of them from the KV cache saved with the chat); ``reasoning_chars`` and ``reasoning_tokens``
    say how much of the turn's joined thinking is this generation's (its fold in the transcript)."""
    stats = finished.stats
    return {
        "kind": "generation",
        "round": round_,
        "ttft_ms": stats.ttft_ms,
        "prefill_ms": stats.prefill_ms,
        "decode_ms": stats.decode_ms,
        "tokens": stats.completion_tokens,
        "calls": len(finished.tool_calls),
        "reasoning_ms": finished.reasoning_ms,
        "reasoning_chars": len(finished.reasoning),
        "reasoning_tokens": finished.reasoning_tokens,
        "prompt_tokens": stats.prompt_tokens,
        "cached_tokens": stats.cached_tokens,
        "kv_restored_tokens": stats.kv_restored_tokens,
    }


@dataclass(frozen=True)
class TextBreak:
    """Text between two generations of one turn (the streamed reply reads as the saved one)."""

    text: str = TEXT_BREAK


def reasoning_dict(text: str, tokens: int, ms: float) -> dict[str, str | int | float]:
    """The thinking as it is stored (and printed by ``glassbox chat --json``)."""
    return {"text": text, "tokens": tokens, "ms": round(ms, 2)}


class ReplyText:
    """The text of a reply made of several generations, as it streams and as it is saved: a
    :data:`TEXT_BREAK` between a generation's text and the text before it."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._fresh = False  # a generation ended: the next text starts a new paragraph
        self._has_text = False

    def add(self, text: str) -> str:
        """Takes a token's text; returns the break put before it ("" when none)."""
        brk = TEXT_BREAK if self._fresh and text and self._has_text else ""
        if brk:
            self._parts.append(brk)
        self._fresh = self._fresh and not text
        self._parts.append(text)
        self._has_text = self._has_text or bool(text.strip())
        return brk

    def end_generation(self) -> None:
        """One generation of the turn ended."""
        self._fresh = True

    @property
    def text(self) -> str:
        return "".join(self._parts)


class StoredRow(Protocol):
    """A message of a stored thread (``engine.history.StoredMessage``, the GUI's ``DisplayMessage``)."""

    @property
    def role(self) -> str: ...

    @property
    def content(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def stats(self) -> Mapping[str, object] | None: ...


def _message_from(data: object) -> Message | None:
    """A stored ``agent_messages`` entry back as an ``engine.inference.context.Message`` (None if unusable)."""
    # engine.inference.context loads with the first turn, not with the window (ARCHITECTURE.md).
    # lazy: start-up (+42 ms)
    from engine.inference.context import Message

    role = data.get("role") if isinstance(data, dict) else None
    if not isinstance(data, dict) or (role != "assistant" and role != "tool"):
        return None
    calls = tuple(
        ToolCall(str(c.get("id", "")), str(c.get("name", "")), dict(c.get("arguments") or {}), "")
        for c in data.get("tool_calls") or ()
        if isinstance(c, dict)
    )
    return Message(
        role,
        str(data.get("content") or ""),
        tool_calls=calls,
        tool_call_id=str(data.get("tool_call_id") or ""),
        name=str(data.get("name") or ""),
    )


def _answer_every_call(messages: list[Message]) -> list[Message]:
    """Each assistant message's calls followed by a result for each: a call whose result was never
    saved (a crash mid-call) gets :data:`INTERRUPTED_RESULT`, so the history stays well formed."""
    # engine.inference.context loads with the first turn, not with the window (ARCHITECTURE.md).
    # lazy: start-up (+41 ms)
    from engine.inference.context import Message

    out: list[Message] = []
    i = 0
    while i < len(messages):
        message = messages[i]
        out.append(message)
        i += 1
        if message.role != "assistant" or not message.tool_calls:
            continue
        answered: set[str] = set()
        while i < len(messages) and messages[i].role == "tool":
            answered.add(messages[i].tool_call_id)
            out.append(messages[i])
            i += 1
        out.extend(
            Message("tool", INTERRUPTED_RESULT, tool_call_id=call.id, name=call.name)
            for call in message.tool_calls
            if call.id not in answered
        )
    return out


def model_history(
    messages: Sequence[StoredRow], media: Callable[[StoredRow], tuple[Media, ...]] | None = None
) -> tuple[Message, ...]:
    """The messages sent to the model for the earlier turns of a thread (``DisplayMessage`` or
    ``engine.history.StoredMessage`` rows), as ``engine.inference.context.Message``: the one shape a
    message has between the history and the engine.

    A reply made with tools is its calls, their results and its answer (``agent_messages``), every
    call answered. Failed replies and empty ones are left out, and thinking never goes back.
    ``media`` gives a user row's images and clips (read back from the data folder); such a row is a
    ``Message`` with them, even without text.
    """
    # engine.inference.context loads with the first turn, not with the window (ARCHITECTURE.md).
    # lazy: start-up (+40 ms)
    from engine.inference.context import Message

    out: list[Message] = []
    for m in messages:
        if m.role not in ("user", "assistant") or m.state == "error":
            continue
        attached = media(m) if media is not None and m.role == "user" else ()
        if attached:
            out.append(Message("user", m.content, media=attached))
            continue
        agent = (m.stats or {}).get("agent_messages") if m.role == "assistant" else None
        if isinstance(agent, list) and agent:
            rebuilt = [msg for msg in (_message_from(d) for d in agent) if msg is not None]
            if rebuilt:
                out.extend(_answer_every_call(rebuilt))
                continue
        if m.content:
            out.append(Message("user" if m.role == "user" else "assistant", m.content))
    return tuple(out)


@dataclass
class AgentRecord:
    """A turn's tool steps, messages, timeline and thinking, as they arrive."""

    steps: list[Record] = field(default_factory=list)
    messages: list[Record] = field(default_factory=list)
    loop: list[Record] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    reasoning_done: Mapping[str, object] | None = None

    def add(self, record: Mapping[str, object]) -> None:
        """Takes one record (:func:`message_record`, :func:`generation_record`)."""
        if record.get("kind") == "message":
            message = record.get("message")
            if isinstance(message, dict):
                self.messages.append(message)
            step = record.get("step")
            if isinstance(step, dict):
                self.steps.append(step)
                self.loop.append(
                    {
                        "kind": "tool",
                        "name": step["name"],
                        "ms": step["ms"],
                        "ran": step["ran"],
                        "tokens": step["tokens"],
                    }
                )
        elif record.get("kind") == "generation":
            self.loop.append({k: v for k, v in record.items() if k != "kind"} | {"kind": "generate"})

    def stats(self) -> dict[str, object]:
        """What the reply's stats get (nothing for a plain turn without thinking)."""
        out: dict[str, object] = {}
        if self.messages:
            out["agent_messages"] = list(self.messages)
            out["tool_steps"] = list(self.steps)
            out["loop"] = list(self.loop)
        reasoning = self.reasoning_done
        if reasoning is None and self.reasoning:
            reasoning = {"text": "".join(self.reasoning), "tokens": 0, "ms": 0.0}
        if reasoning and reasoning.get("text"):
            out["reasoning"] = dict(reasoning)
        return out
