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
    """Prompt evaluation progress: ``done`` of ``total`` new tokens evaluated."""

    done: int
    total: int


@dataclass(frozen=True)
class Token:
    """One generated token and its text (text may be empty for a partial UTF-8 sequence)."""

    text: str
    token_id: int


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
    budget: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Finished:
    """The end of a generation. ``text`` is the whole reply (partial when cancelled)."""

    reason: FinishReason
    stats: Stats
    text: str = ""
    error: str | None = None


Event = PrefillProgress | Token | Stats | Finished
