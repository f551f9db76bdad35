"""The typed events a generation streams back (ARCHITECTURE.md, "Engine events").

Plain frozen dataclasses: they cross the pipe from the inference worker and the Qt adapter turns
them into signals.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length", "cancelled", "error"]


@dataclass(frozen=True)
class PrefillProgress:
    """Prompt evaluation progress: ``done`` of ``total`` new tokens evaluated; ``encoding`` > 0
    while an image or a clip of that many tokens is being encoded by the projector."""

    done: int
    total: int
    encoding: int = 0


@dataclass(frozen=True)
class Token:
    """One generated token and its text (text may be empty for a partial UTF-8 sequence).

    ``logprob`` and ``top_logprobs`` (the most likely alternatives, as text and log-probability,
    best first) are set when GenerationParams.logprobs > 0; ``drafted`` when speculative decoding
    proposed the token and the model accepted it.
    """

    text: str
    token_id: int
    logprob: float | None = None
    top_logprobs: tuple[tuple[str, float], ...] = ()
    drafted: bool = False


@dataclass(frozen=True)
class Stats:
    """What one generation cost, and what it says about memory.

    ``bandwidth_gbps`` is the bytes the decoder must read per token (weights plus the KV cache in
    use) times decode tokens per second; ``machine_bandwidth_gbps`` is this machine's measured limit.
    """

    n_ctx: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    context_used: int = 0
    evicted_messages: int = 0
    ttft_ms: float = 0.0
    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    prefill_tps: float = 0.0
    decode_tps: float = 0.0
    kv_cache_bytes: int = 0
    kv_used_bytes: int = 0
    model_bytes: int = 0
    bandwidth_gbps: float = 0.0
    machine_bandwidth_gbps: float | None = None
    template: str = ""
    draft_tokens: int = 0
    accepted_tokens: int = 0
    kv_restored_tokens: int = 0
    """Of ``cached_tokens``, those loaded from the chat's saved KV cache on disk (engine.inference.kv_cache)."""
    kv_restore_ms: float = 0.0
    """How long finding, checking and loading that saved cache took."""
    kv_saved_bytes: int = 0
    """The KV state saved to disk after this turn (written in the background)."""
    draft_restores: int = 0
    """Rejected drafts taken back by restoring a copy of the model's recurrent state (a Mamba-style
    memory cannot drop its last tokens: engine.inference.seq_memory)."""
    speculation_note: str = ""
    """Why speculative decoding was off for this reply although it was asked for ("" otherwise)."""
    cpu_note: str = ""
    """What happened to llama.cpp's CPU code during this reply: it crashed and the reply went on on
    the safe variant (said on the reply it happened in only; "" otherwise)."""
    encode_ms: float = 0.0
    """Time the projector took to encode this turn's images and clips (before ``prefill_ms``, which
    excludes it: the timeline is encode, prefill, decode)."""
    media_tokens: int = 0
    """Of ``prompt_tokens``, the positions images and clips take (mtmd's count)."""
    media_encoded: int = 0
    """Image and audio chunks encoded this turn (0 when the KV cache held them all)."""
    media_dropped: int = 0
    """Images and clips of earlier messages left out because this model cannot read them (no projector)."""
    adapters: str = ""
    """The LoRA adapters the reply ran with, ``file:scale`` each ("" for the base model alone)."""
    recomputed_tokens: int = 0
    """Prompt tokens the KV cache held but had to read again because the adapters or their scales
    changed since the last turn (what the cache holds was computed with the old ones)."""
    recompute_ms: float = 0.0
    """What reading those tokens again cost: their share of this turn's prefill."""
    documents_kept: int = 0
    """The retrieved passages, the best-ranked, that the documents band kept in the prompt."""
    documents_dropped: int = 0
    """The lowest-ranked passages the documents band had no room for (left out, not refused)."""
    budget: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Every field, as JSON; the documents counts only where there are some (a turn without
        passages, or whose passages all fit, reads as before they existed)."""
        out = asdict(self)
        for key in ("documents_kept", "documents_dropped"):
            if not out[key]:
                del out[key]
        return out


@dataclass(frozen=True)
class Reasoning:
    """A piece of the model's thinking (``<think>...</think>``), streamed apart from the answer so
    the UI can fold it; it is never sent back as history."""

    text: str


@dataclass(frozen=True)
class ToolCall:
    """One complete call the model made (engine/inference/tool_calls.py parses it out of the stream).

    Attributes:
        id: unique within the conversation (``call_...``), for the ``tool`` message that answers it.
        name: the function called.
        arguments: the parsed JSON arguments.
        raw: the text the model wrote for this call (its markup included).
    """

    id: str
    name: str
    arguments: dict[str, Any]
    raw: str


@dataclass(frozen=True)
class Finished:
    """The end of a generation. ``text`` is the reply (partial when cancelled): the answer only,
    without the reasoning and without the markup of tool calls.

    Attributes:
        reasoning: the thinking text, apart from the answer ("" when none).
        reasoning_tokens: tokens the thinking took.
        reasoning_ms: time from its first token to its end.
        tool_calls: the calls the model made, in order (the caller runs them: engine/agent/loop.py).
        stop_sequence: the stop string that ended the reply (``reason`` "stop"), None when none did
            (the end-of-generation token, or a remote backend, which does not say). A chat turn's
            stop strings are the request's and its template's, so the caller checks which it was.
    """

    reason: FinishReason
    stats: Stats
    text: str = ""
    error: str | None = None
    reasoning: str = ""
    reasoning_tokens: int = 0
    reasoning_ms: float = 0.0
    tool_calls: tuple[ToolCall, ...] = ()
    stop_sequence: str | None = None


@dataclass(frozen=True)
class CallProgress:
    """A generated token that went into what may be a tool call's markup, held back from the
    answer as the model writes it (engine/inference/tool_calls.py); ``tokens`` counts this
    generation's held tokens so far. The markup comes out later as a :class:`ToolCall`, or as
    ``Token`` text once it is plain that it is no call; meanwhile a front end can show that the
    model is writing a call, and how fast."""

    tokens: int


Event = PrefillProgress | Token | Stats | Finished | Reasoning | ToolCall | CallProgress
