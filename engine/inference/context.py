"""The context-window budget: what goes into the prompt, what is dropped, and where the tokens go.

Contract: ARCHITECTURE.md, 'engine.inference.context'.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from engine.errors import ContextOverflow, EngineError
from engine.inference.events import ToolCall
from engine.inference.reasoning import strip_reasoning
from engine.media import Media

OverflowPolicy = Literal["rolling", "refuse"]
Role = Literal["system", "user", "assistant", "tool"]

BREAKDOWN_KEYS = ("system", "documents", "tools", "history", "tool_results", "media", "current", "reserve", "free")

MEDIA_MARKER = "<__glassbox_media:{digest}__>"
"""Where an image or a clip sits in a rendered prompt: the session splits the prompt there and the
worker's projector puts the media's tokens in its place (engine/inference/projector.py)."""
_MARKER_HEAD = "<__glassbox_media:"
_MARKER_RE = re.compile(r"<__glassbox_media:([0-9a-f]{64})__>")

TRUNCATION_MARKER = "[... tool result truncated: {kept} of {total} tokens kept to fit the context window ...]"
"""Appended to a tool result cut to fit the window (:func:`truncate_to_tokens`): the model and the
user both see that something is missing."""

PROBE_CHARS_PER_TOKEN = 8
"""The first count of a long history takes this many characters of it per token of the budget:
about twice what English packs into a token, so that probe rarely fits when more history waits,
yet its size follows the window, not the history."""

MESSAGE_CHARS = 16
"""A message's role header, in characters, when sizing probes (about 4 tokens of English; the
template's real text is not known here)."""


@dataclass(frozen=True)
class Message:
    """One chat message.

    Attributes:
        role: ``system``, ``user``, ``assistant`` or ``tool`` (a tool's result).
        content: the text (an assistant message's answer only: its reasoning is never kept here).
        tool_calls: on an assistant message, the calls it made.
        tool_call_id: on a ``tool`` message, the call it answers.
        name: on a ``tool`` message, the tool's name.
        media: on a ``user`` message, the images and clips attached to it (they come before its
            text in the prompt, in order, each on a line of its own).
    """

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    name: str = ""
    media: tuple[Media, ...] = ()

    def template_dict(self) -> dict[str, Any]:
        """The message as chat templates take it (engine/inference/templates.py); reasoning left in the text
        by an older version is removed (engine/inference/reasoning.py); each attached image or clip
        is a :data:`MEDIA_MARKER` line before the text (text that looks like one is defused)."""
        content = strip_reasoning(self.content) if self.role == "assistant" else self.content
        if _MARKER_HEAD in content:
            content = content.replace(_MARKER_HEAD, "<__glassbox\u200bmedia:")
        if self.media:
            content = "".join(MEDIA_MARKER.format(digest=m.digest) + "\n" for m in self.media) + content
        out: dict[str, Any] = {"role": self.role, "content": content}
        if self.tool_calls:
            out["tool_calls"] = [
                {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
                for call in self.tool_calls
            ]
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        if self.name:
            out["name"] = self.name
        return out


@dataclass(frozen=True)
class ContextPlan:
    """What to render and how the context window is spent.

    Attributes:
        messages: in order: the system message (system prompt and documents; absent when both are
            empty), the kept history, the new user message.
        evicted: history messages dropped (oldest first, whole turns).
        prompt_tokens: tokens of the rendered prompt.
        breakdown: tokens per part; keys ``system``, ``documents``, ``history``, ``current``,
            ``reserve``, ``free``; the values sum to the context window size.
        documents_kept: the passages, the best-ranked, in the documents block.
        documents_dropped: the lowest-ranked passages the documents band had no room for.
    """

    messages: list[Message]
    evicted: int
    prompt_tokens: int
    breakdown: dict[str, int]
    documents_kept: int = 0
    documents_dropped: int = 0

    @property
    def reserve(self) -> int:
        """Tokens kept free for the reply."""
        return self.breakdown["reserve"]


DOCUMENTS_SHARE = 0.35
"""The share of the context window that retrieved passages may take: the documents band."""

DEFAULT_DOCUMENTS_WINDOW = 4096
"""The window the documents band is a share of when the model's is not known (a server may not say)."""

MIN_DOCUMENTS_TOKENS = 64
"""The documents band of a tiny window is at least this many tokens."""


class RankedDocuments(Protocol):
    """Retrieved passages, best first, not yet fitted (``rag.citations.CitedPassages`` satisfies it).

    The block for a prefix keeps the passages' numbers, so the ``[n]`` the model cites name the
    same sources whatever was dropped.
    """

    @property
    def count(self) -> int:
        """How many passages there are."""
        ...

    def text(self, kept: int) -> str:
        """The documents block with the ``kept`` best passages ("" when ``kept`` is 0)."""
        ...


@dataclass(frozen=True)
class DocumentsFit:
    """What :func:`fit_documents` kept of the passages.

    Attributes:
        text: the documents block to pin after the system prompt (None when nothing was kept).
        kept: how many passages, the best ones, are in it.
        dropped: how many of the lowest-ranked passages did not fit the band.
        tokens: the block's tokens.
    """

    text: str | None
    kept: int
    dropped: int
    tokens: int


NO_DOCUMENTS = DocumentsFit(None, 0, 0, 0)
"""The fit of a turn without documents."""


def documents_band(n_ctx: int) -> int:
    """Tokens the documents block may take in a window of ``n_ctx`` tokens (:data:`DOCUMENTS_SHARE`)."""
    return max(MIN_DOCUMENTS_TOKENS, int(n_ctx * DOCUMENTS_SHARE))


def fit_documents(documents: RankedDocuments, n_ctx: int, count_text: Callable[[str], int]) -> DocumentsFit:
    """Keeps the best passages that fit the documents band; the lowest-ranked ones are dropped.

    This is the one place that decides how much of the window retrieved passages take (the app
    and rag hand over all they found); nothing is refused for being too long: passages are dropped
    from the bottom of the ranking, down to none, and the fit says how many went. The whole set is
    counted first (it usually fits), else a binary search over the prefixes counts O(log n) blocks.

    Args:
        documents: the passages, best first.
        n_ctx: the context window in tokens.
        count_text: the chat model's token counter.

    Returns:
        The fit.
    """
    band = documents_band(n_ctx)
    total = max(documents.count, 0)
    counted: dict[int, int] = {0: 0}

    def tokens(kept: int) -> int:
        if kept not in counted:
            counted[kept] = count_text(documents.text(kept))
        return counted[kept]

    low = total
    if total and tokens(total) > band:
        low, high = 0, total - 1
        while low < high:  # the most passages whose block fits the band
            middle = (low + high + 1) // 2
            if tokens(middle) <= band:
                low = middle
            else:
                high = middle - 1
    text = documents.text(low) if low else ""
    return DocumentsFit(text or None, low, total - low, tokens(low) if text else 0)


def effective_reserve(n_ctx: int, reply_reserve: int) -> int:
    """The reply reserve actually kept: ``reply_reserve``, but at most a quarter of the window."""
    return max(0, min(reply_reserve, n_ctx // 4))


def _turns(history: Sequence[Message]) -> list[list[Message]]:
    """Split history into turns: each starts at a user message and runs until the next one."""
    turns: list[list[Message]] = []
    for message in history:
        if message.role == "user" or not turns:
            turns.append([message])
        else:
            turns[-1].append(message)
    return turns


def split_media(prompt: str) -> list[str | tuple[str, str]]:
    """A rendered prompt cut at its media markers: text parts and ``("media", digest)`` parts, in
    order (a prompt without media is one text part)."""
    parts: list[str | tuple[str, str]] = []
    at = 0
    for match in _MARKER_RE.finditer(prompt):
        parts.append(prompt[at : match.start()])
        parts.append(("media", match.group(1)))
        at = match.end()
    parts.append(prompt[at:])
    return parts


def has_media(prompt: str) -> bool:
    """Whether a rendered prompt holds a media marker."""
    return _MARKER_RE.search(prompt) is not None


def system_message(system: str | None, documents: str | None) -> Message | None:
    """The pinned system message: the system prompt, a blank line, the documents (None when empty)."""
    parts = [part for part in (system, documents) if part]
    return Message("system", "\n\n".join(parts)) if parts else None


def plan_context(
    *,
    system: str | None,
    documents: RankedDocuments | None,
    history: Sequence[Message],
    user: str | None,
    n_ctx: int,
    reply_reserve: int,
    count_tokens: Callable[[Sequence[Message]], int],
    count_text: Callable[[str], int],
    policy: OverflowPolicy = "rolling",
    tools_tokens: int = 0,
    media_tokens: Callable[[Message], int] | None = None,
    user_media: Sequence[Media] = (),
    documents_window: int | None = None,
) -> ContextPlan:
    """Fit a conversation into the context window.

    Args:
        system: the system prompt (pinned).
        documents: the retrieved passages, best first, not fitted: the best-ranked that fit the
            documents band are pinned after the system prompt (:func:`fit_documents`, which drops
            the lowest-ranked rather than refuse; the plan says how many it kept and dropped).
        history: earlier messages, oldest first.
        user: the new user message; None continues the last turn of ``history`` (after a tool
            result), which is then pinned like a new message.
        n_ctx: the context window in tokens.
        reply_reserve: tokens to keep free for the reply (capped at ``n_ctx // 4``).
        count_tokens: renders the chat template for messages and counts the prompt's tokens.
        count_text: counts the tokens of a plain text.
        policy: ``"rolling"`` drops the oldest turns when history does not fit; ``"refuse"`` raises.
        tools_tokens: what the tool definitions add to the prompt (``count_tokens`` renders them).
        media_tokens: the positions a message's images and clips take (the projector's count);
            ``count_tokens`` counts them in the prompt, this puts them in the ``media`` band.
        user_media: the images and clips attached to the new message ``user``.
        documents_window: the window the documents band is a share of (default ``n_ctx``; a
            server that does not say its window gives :data:`DEFAULT_DOCUMENTS_WINDOW`).

    Returns:
        The plan.

    Raises:
        ContextOverflow: the documents kept (a tiny window's band is larger than its budget), or
            the system prompt, documents and new message together, do not fit even without
            history; or history does not fit and the policy is ``"refuse"``. The message gives the
            numbers and what to do.
        EngineError: ``n_ctx`` is not positive, ``reply_reserve`` is negative, ``policy`` is
            unknown, or ``user`` is None with no history to continue.
        TemplateError: raised by ``count_tokens`` when the chat template refuses the messages.
    """
    if n_ctx <= 0:
        raise EngineError(f"context window must be positive, got {n_ctx}")
    if reply_reserve < 0:
        raise EngineError(f"reply reserve must not be negative, got {reply_reserve}")
    if policy not in ("rolling", "refuse"):
        raise EngineError(f"unknown overflow policy {policy!r} (use 'rolling' or 'refuse')")
    reserve = effective_reserve(n_ctx, reply_reserve)
    budget = n_ctx - reserve
    where = f"the context window is {n_ctx} (reserve {reserve})"

    fit = fit_documents(documents, documents_window or n_ctx, count_text) if documents is not None else NO_DOCUMENTS
    documents_tokens = fit.tokens
    if documents_tokens > budget:
        raise ContextOverflow(
            f"the documents block needs {documents_tokens} tokens but {where}: "
            "use fewer or shorter passages or raise the context length",
            n_ctx=n_ctx,
            prompt_tokens=documents_tokens,
            reserve=reserve,
        )
    head = system_message(system, fit.text)
    lead = [head] if head is not None else []
    turns = _turns(history)
    if user is not None:
        current = [Message("user", user, media=tuple(user_media))]
        what = "new message"
    elif turns:
        current = turns.pop()
        what = "turn in progress (with its tool results)"
    else:
        raise EngineError("there is no turn to continue: give a user message or a history")
    base_tokens = count_tokens([*lead, *current])
    if base_tokens > budget:
        tools_part = " and tool definitions" if tools_tokens else ""
        raise ContextOverflow(
            f"the system prompt, documents{tools_part} and {what} need {base_tokens} tokens but {where}: "
            "shorten them or raise the context length",
            n_ctx=n_ctx,
            prompt_tokens=base_tokens,
            reserve=reserve,
        )

    counted: dict[int, int] = {len(turns): base_tokens}

    def tokens_without(dropped: int) -> int:
        if dropped not in counted:
            kept = [m for turn in turns[dropped:] for m in turn]
            counted[dropped] = count_tokens([*lead, *kept, *current])
        return counted[dropped]

    dropped = 0
    if turns and policy == "refuse":
        if tokens_without(0) > budget:
            raise ContextOverflow(
                f"conversation needs {tokens_without(0)} tokens but {where}: start a new chat, "
                "raise the context length or switch the overflow policy to rolling",
                n_ctx=n_ctx,
                prompt_tokens=tokens_without(0),
                reserve=reserve,
            )
    elif turns:
        dropped = _fewest_to_drop(turns, budget, tokens_without)

    kept = [m for turn in turns[dropped:] for m in turn]
    prompt_tokens = tokens_without(dropped)
    breakdown = _breakdown(
        system_tokens=count_text(system) if system else 0,
        documents_tokens=documents_tokens,
        tools_tokens=tools_tokens,
        history_results=_result_tokens(kept, count_text),
        current_results=_result_tokens(current, count_text),
        history_media=sum(media_tokens(m) for m in kept if m.media) if media_tokens else 0,
        current_media=sum(media_tokens(m) for m in current if m.media) if media_tokens else 0,
        base_tokens=base_tokens,
        prompt_tokens=prompt_tokens,
        reserve=reserve,
        n_ctx=n_ctx,
    )
    return ContextPlan(
        messages=[*lead, *kept, *current],
        evicted=sum(len(turn) for turn in turns[:dropped]),
        prompt_tokens=prompt_tokens,
        breakdown=breakdown,
        documents_kept=fit.kept,
        documents_dropped=fit.dropped,
    )


def _fewest_to_drop(turns: list[list[Message]], budget: int, tokens_without: Callable[[int], int]) -> int:
    """The fewest oldest turns to drop so that the rest fits ``budget`` (dropping all always fits).

    Probes grow from the newest turns (see the module docstring): ``tokens_without(d)`` counts the
    prompt without the ``d`` oldest turns, and never with more than about twice the text known to
    fit, a window's worth, or one turn more than fitted.
    """
    n = len(turns)
    # text[d]: the characters of turns[d:], which shrink as d grows.
    text = [0] * (n + 1)
    for index in range(n - 1, -1, -1):
        text[index] = text[index + 1] + sum(len(m.content) + MESSAGE_CHARS for m in turns[index])

    def widest(limit: int) -> int:
        """The fewest turns to drop for the rest to hold at most ``limit`` characters."""
        return bisect.bisect_left(text, -limit, key=lambda size: -size)

    fits = n  # dropping this many is known to fit
    probe = min(widest(budget * PROBE_CHARS_PER_TOKEN), n - 1)  # at least the newest turn
    while tokens_without(probe) <= budget:
        fits = probe
        if probe == 0:
            return 0
        probe = min(widest(2 * text[probe]), probe - 1)
    # Dropping ``probe`` turns does not fit, dropping ``fits`` does: the answer lies between.
    low, high = probe + 1, fits
    while low < high:
        middle = (low + high) // 2
        if tokens_without(middle) <= budget:
            high = middle
        else:
            low = middle + 1
    return low


def _result_tokens(messages: Sequence[Message], count_text: Callable[[str], int]) -> int:
    return sum(count_text(m.content) for m in messages if m.role == "tool" and m.content)


def _breakdown(
    *,
    system_tokens: int,
    documents_tokens: int,
    tools_tokens: int,
    history_results: int,
    current_results: int,
    base_tokens: int,
    history_media: int = 0,
    current_media: int = 0,
    prompt_tokens: int,
    reserve: int,
    n_ctx: int,
) -> dict[str, int]:
    """Per-part token counts that add up exactly (see the module docstring)."""
    history = max(prompt_tokens - base_tokens, 0)
    history_results = min(history_results, history)
    history_media = min(history_media, history - history_results)
    parts = {
        "system": system_tokens,
        "documents": documents_tokens,
        "tools": tools_tokens,
        "history": history - history_results - history_media,
        "tool_results": history_results + current_results,
        "media": history_media + current_media,
        "current": max(
            base_tokens - system_tokens - documents_tokens - tools_tokens - current_results - current_media, 0
        ),
    }
    # Tokenizing the pieces apart can give more tokens than the joined prompt: take the excess back.
    excess = sum(parts.values()) - prompt_tokens
    for key in ("current", "history", "tool_results", "documents", "tools", "system"):
        taken = min(max(excess, 0), parts[key])
        parts[key] -= taken
        excess -= taken
    return {**parts, "reserve": reserve, "free": n_ctx - prompt_tokens - reserve}


def truncate_to_tokens(text: str, max_tokens: int, count_text: Callable[[str], int]) -> tuple[str, int, bool]:
    """Cuts ``text`` to at most ``max_tokens`` tokens, marker included, when it is longer.

    The cut text ends with :data:`TRUNCATION_MARKER` (how many tokens were kept of how many), so
    neither the model nor the user takes it for the whole result. Counting is bounded: the text is
    first cut to 32 characters per allowed token, then a binary search over the length calls
    ``count_text`` O(log n) times.

    Args:
        text: a tool result.
        max_tokens: the most tokens it may take.
        count_text: counts the tokens of a plain text.

    Returns:
        ``(text, tokens, truncated)``: the text to use, its tokens, whether it was cut.
    """
    total = count_text(text) if text else 0
    if total <= max_tokens:
        return text, total, False
    marker = "\n" + TRUNCATION_MARKER.format(kept=max_tokens, total=total)
    room = max_tokens - count_text(marker)
    if room <= 0:
        return "", 0, True
    low, high = 0, min(len(text), room * 32)
    while low < high:  # the longest prefix that fits ``room``
        middle = (low + high + 1) // 2
        if count_text(text[:middle]) <= room:
            low = middle
        else:
            high = middle - 1
    kept = count_text(text[:low]) if low else 0
    marker = "\n" + TRUNCATION_MARKER.format(kept=kept, total=total)
    cut = text[:low] + marker
    return cut, count_text(cut), True
