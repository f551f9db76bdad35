"""What crosses the ``glassbox-llm`` thread: the requests the GUI sends the LLM worker and what it sends back.

Every object here is a frozen dataclass (CONTRIBUTING.md rule 9): a request is built on the GUI
thread and read on the worker's; a :class:`LoadedModel` or :class:`GenerationOutcome` is built on
the worker's and read on the GUI's. Each generation carries its own ``threading.Event`` for Stop.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypedDict

if TYPE_CHECKING:
    from app.compose import GpuLayers, RemoteModel
    from app.gui.workers.agent_tools import ToolsRequest
    from app.turn import TurnRequest
    from engine.inference.base_compare import BaseComparison
    from engine.inference.events import Stats
    from engine.inference.remote import RemoteInfo
    from engine.inference.runtime import ModelInfo
    from engine.media import Media


@dataclass(frozen=True)
class LoadRequest:
    """Load (or replace) the model.

    Args:
        model_path: the GGUF file, or an ``app.compose.RemoteModel`` (a model on a saved endpoint).
        n_ctx: context length.
        n_threads: CPU threads (None: llama.cpp decides).
        n_gpu_layers: layers to offload (0 on CPU-only builds), or "auto": computed on the worker
            thread before the load (``app.compose.resolve_gpu_layers``; it probes the hardware).
        overflow_policy: "rolling" or "refuse".
        reply_reserve: tokens kept free for the reply.
        label: the name shown in the UI.
        breadcrumb: file written before the load and removed after it (crash detection).
        bandwidth_cache: where the measured memory bandwidth is cached (None: skip the probe).
        backend_state: where this machine's CPU-variant verdicts are kept (engine.cpu_backend).
        kv_cache_dir: where the KV cache of each chat is saved (engine.inference.kv_cache); None: not saved.
        kv_cache_max_bytes: the size cap of those files (0: none saved).
        draft_model_path: a smaller model of the same vocabulary that drafts for speculative
            decoding (``settings.draft_models``); refused by the engine, the model loads without it.
        mmproj_path: the projector loaded beside it (the library's choice), "auto" (the one found
            beside it: ``app.compose.projector_for``) or None (text only).
        keep_loaded: how many local models the worker keeps loaded, this one included (Settings'
            ``models_kept_loaded``; ``app.gui.workers.resident_models``): the chat's model until now
            stays loaded beside this one when it fits, and loading it again is a switch.
        kept_idle_s: a kept model unused this long is unloaded (Settings' ``models_idle_minutes``;
            None: never).
    """

    model_path: Path | RemoteModel
    n_ctx: int = 4096
    n_threads: int | None = None
    n_gpu_layers: GpuLayers = 0
    overflow_policy: str = "rolling"
    reply_reserve: int = 512
    label: str = ""
    breadcrumb: Path | None = None
    bandwidth_cache: Path | None = None
    backend_state: Path | None = None
    kv_cache_dir: Path | None = None
    kv_cache_max_bytes: int = 0
    draft_model_path: Path | None = None
    mmproj_path: Path | Literal["auto"] | None = "auto"
    keep_loaded: int = field(default=1, compare=False)
    kept_idle_s: float | None = field(default=300.0, compare=False)
    cancel: threading.Event = field(default_factory=threading.Event, compare=False)


@dataclass(frozen=True)
class GenerateRequest:
    """Generate one reply.

    Args:
        request_id: echoed in every signal about this request.
        turn: the turn (``app.turn.TurnRequest``: the conversation, the new message, its passages,
            the sampling, the KV cache key, the thinking options, the Stop event).
        tools: the chat's tools (None: a plain generation): the worker opens them (and keeps them
            open between turns) and the turn runs the agent loop with them.
        adapters: the chat's LoRA adapters, ``(file, scale)`` each: the worker sets them on the
            loaded model before the turn (no reload; a change empties the KV cache).
    """

    request_id: int
    turn: TurnRequest
    tools: ToolsRequest | None = None
    adapters: tuple[tuple[Path, float], ...] = ()

    @property
    def cancel(self) -> threading.Event:
        """The turn's Stop."""
        return self.turn.cancel


@dataclass(frozen=True)
class MediaInfoRequest:
    """Measure what attachments cost the loaded model (the projector's own count), before a send.

    Args:
        request_id: echoed in the answer (a later request supersedes an earlier one).
        media: the attachments.
    """

    request_id: int
    media: tuple[Media, ...]


@dataclass(frozen=True)
class LoadedModel:
    """A loaded model, as the GUI sees it (``path``: its file, or an ``app.compose.RemoteModel``).

    ``info`` is what the backend's ``load`` reported: a ``ModelInfo`` locally, a ``RemoteInfo`` for a
    server (``info.kind`` says which).
    """

    path: Path | RemoteModel
    label: str
    info: ModelInfo | RemoteInfo
    load_ms: float
    machine_bandwidth_gbps: float | None
    backend_note: str | None = None  # e.g. the CPU variant crashed and the safe one runs
    thinking_controls: tuple[str, ...] = ()  # the template's switches (enable_thinking, reasoning_effort)
    draft_path: Path | None = None  # the draft model loaded with it (speculative decoding)
    draft_note: str | None = None  # one line: why the draft model asked for was not used
    kept: bool = False  # it was kept loaded: switched to (``load_ms`` is the switch), not loaded again


class ReasoningSummary(TypedDict):
    """The thinking of a reply: its text, its tokens and how long it took."""

    text: str
    tokens: int
    ms: float


@dataclass(frozen=True)
class GenerationOutcome:
    """The end of a generation: the reason, the whole text, and the engine's Stats (the passages
    the documents band kept and dropped among them)."""

    request_id: int
    reason: str
    text: str
    stats: Stats
    elapsed_ms: float
    reasoning: ReasoningSummary | None = None  # the thinking, when there was some


@dataclass(frozen=True)
class CompareRequest:
    """Decode a reply's prompt greedily with the chat's adapters and without them
    (``engine.inference.base_compare``): nothing is saved, the chat's state is put back after.

    Args:
        request_id: echoed in the answer.
        reply_id: the reply whose prompt is compared (its history row).
        turn: the reply's turn as it was asked (the conversation before it, its question, the
            sampling: greedy both ways, ``max_tokens`` as the reply's), and the Stop event.
        adapters: the chat's LoRA adapters, ``(file, scale)`` each.
    """

    request_id: int
    reply_id: int
    turn: TurnRequest
    adapters: tuple[tuple[Path, float], ...] = ()

    @property
    def cancel(self) -> threading.Event:
        """The comparison's Stop."""
        return self.turn.cancel


@dataclass(frozen=True)
class CompareOutcome:
    """A comparison's end: the comparison (None: it was stopped) and how long it took."""

    request_id: int
    reply_id: int
    comparison: BaseComparison | None
    elapsed_ms: float
