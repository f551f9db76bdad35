"""The LLM worker: one QThread owning the engine's ChatSession (CONTRIBUTING.md rules 2, 8, 9, 11).

Requests arrive as queued signals carrying immutable request objects; each generation carries its
own ``threading.Event`` that the GUI sets directly for Stop. Tokens are coalesced here, on the
worker thread, into at most ~30 updates per second, so a fast model never floods the GUI's event
queue.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal, Slot

if TYPE_CHECKING:
    from app.compose import GpuLayers, RemoteModel
    from engine.inference.backends import ChatBackend
    from engine.inference.context import RankedDocuments

log = logging.getLogger(__name__)

COALESCE_S = 1 / 30
"""Minimum time between two text updates sent to the GUI."""


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
    cancel: threading.Event = field(default_factory=threading.Event, compare=False)


@dataclass(frozen=True)
class GenerateRequest:
    """Generate one reply.

    Args:
        request_id: echoed in every signal about this request.
        history: earlier turns as ``(role, content)`` pairs, oldest first.
        user: the new user message.
        params: an ``engine.inference.runtime.GenerationParams``.
        system: the system prompt.
        documents: a documents block built elsewhere, if any (used as it is).
        cancel: set by the GUI thread to stop.
        passages: the passages retrieved for this turn (on the knowledge thread, before the
            request came here), best first: the engine's documents band keeps those that fit
            (``engine.inference.context.fit_documents``) and the outcome says how many it dropped.
        cache_key: ``(conversation id, branch)`` of the KV cache saved with the chat
            (``engine.inference.kv_cache.KvKey``; the branch is the id of the reply being written).
        tools: an ``app.gui.workers.agent_turn.ToolsRequest``: the turn runs the agent loop.
        thinking: the template's thinking switch (None: the template's default).
        thinking_budget: the most tokens of thinking (None: no cap).

    ``history`` entries are ``(role, content)`` pairs or ``engine.inference.context.Message`` objects (a
    reply made with tools: its calls and their results, ``app.agent_history.model_history``).
    """

    request_id: int
    history: tuple[Any, ...]
    user: str
    params: Any
    system: str | None = None
    documents: str | None = None
    cancel: threading.Event = field(default_factory=threading.Event, compare=False)
    passages: RankedDocuments | None = field(default=None, compare=False)
    cache_key: tuple[str, str] | None = None
    tools: Any = None
    thinking: bool | None = None
    thinking_budget: int | None = None


@dataclass(frozen=True)
class LoadedModel:
    """A loaded model, as the GUI sees it (``path``: its file, or an ``app.compose.RemoteModel``)."""

    path: Path | RemoteModel
    label: str
    info: Any  # engine.inference.runtime.ModelInfo
    load_ms: float
    machine_bandwidth_gbps: float | None
    backend_note: str | None = None  # e.g. the CPU variant crashed and the safe one runs
    thinking_controls: tuple[str, ...] = ()  # the template's switches (enable_thinking, reasoning_effort)
    draft_path: Path | None = None  # the draft model loaded with it (speculative decoding)
    draft_note: str | None = None  # one line: why the draft model asked for was not used


@dataclass(frozen=True)
class GenerationOutcome:
    """The end of a generation: the reason, the whole text, and the engine's Stats."""

    request_id: int
    reason: str
    text: str
    stats: Any  # engine.inference.events.Stats
    elapsed_ms: float
    reasoning: dict[str, Any] | None = None  # {"text", "tokens", "ms"} of the thinking, when there was some
    documents_dropped: int = 0  # the lowest-ranked passages the documents band had no room for


SessionFactory = Callable[[LoadRequest, "float | None"], "ChatBackend"]


def default_session_factory(request: LoadRequest, bandwidth: float | None) -> ChatBackend:
    """Builds the real engine session (imports the engine lazily; llama_cpp stays in the child)."""
    from app.compose import BackendOptions, LoadSettings, load_params, open_local

    if not isinstance(request.model_path, Path):
        raise TypeError(f"{request.model_path}: a remote model has no local session")
    load = LoadSettings(request.n_ctx, request.n_threads, request.n_gpu_layers, request.draft_model_path)
    options = BackendOptions(
        overflow_policy=request.overflow_policy,
        reply_reserve=request.reply_reserve,
        machine_bandwidth_gbps=bandwidth,
        backend_state=request.backend_state,
        kv_cache=_kv_cache_config(request),
    )
    return open_local(load_params(request.model_path, load), options)


def _resolve_gpu_layers(request: LoadRequest) -> LoadRequest:
    """``request`` with ``n_gpu_layers="auto"`` replaced by the count (computed once per load)."""
    if request.n_gpu_layers != "auto":
        return request
    from dataclasses import replace

    from app.compose import resolve_gpu_layers

    layers = resolve_gpu_layers("auto", request.model_path, request.n_ctx, request.draft_model_path)
    return replace(request, n_gpu_layers=layers)


def _kv_cache_config(request: LoadRequest) -> Any:
    """The engine's KvCacheConfig for a load, or None when chats' KV caches are not saved."""
    if request.kv_cache_dir is None or request.kv_cache_max_bytes <= 0:
        return None
    from engine.inference.kv_cache import KvCacheConfig

    return KvCacheConfig(request.kv_cache_dir, request.kv_cache_max_bytes)


def measure_bandwidth(cache: Path | None) -> float | None:
    """The machine's memory bandwidth in GB/s from the cached probe, or None when unavailable."""
    if cache is None:
        return None
    try:
        from engine.hardware import cached_memory_bandwidth
    except ImportError:
        return None
    try:
        return float(cached_memory_bandwidth(cache))
    except (OSError, ValueError) as exc:
        log.warning("memory bandwidth probe failed: %s", exc)
        return None


INFERENCE_NICENESS = 5
"""How much lower than the GUI the inference process runs (POSIX nice)."""


def lower_priority(session: Any) -> None:
    """Runs the inference child at a lower CPU priority than the GUI.

    Decoding keeps every core busy; at equal priority the GUI thread waits for a time slice and
    the window stutters. With the child niced, the GUI gets the CPU the moment it needs it and
    generation loses almost nothing (the GUI needs little). llama.cpp's compute threads are
    created by the child's main thread, so they inherit its priority. Best effort: POSIX only.
    """
    worker = getattr(session, "worker", None)
    pid = getattr(worker, "pid", None)
    if not pid or not hasattr(os, "setpriority"):
        return
    try:
        current = os.getpriority(os.PRIO_PROCESS, pid)
        os.setpriority(os.PRIO_PROCESS, pid, min(current + INFERENCE_NICENESS, 19))
    except OSError as exc:
        log.info("could not lower the inference process's priority: %s", exc)


def write_breadcrumb(path: Path, what: str, target: Path | RemoteModel) -> None:
    """Records risky work about to start, so the next launch can tell what crashed."""
    from app.compose import model_key
    from engine.atomic import write_text_atomic

    document = {"attempting": what, "path": model_key(target), "at": time.time()}
    write_text_atomic(path, json.dumps(document), durable=False)  # cheap to lose: no fsync, as before


def clear_breadcrumb(path: Path) -> None:
    """Removes the breadcrumb: the risky work ended (well or with a handled error)."""
    path.unlink(missing_ok=True)


class LlmWorker(QObject):
    """Owns the ChatSession; lives on the ``glassbox-llm`` thread.

    Args:
        session_factory: builds a session for a LoadRequest (the real engine by default).

    Signals:
        model_loaded(object): a :class:`LoadedModel`.
        model_load_failed(object): the exception (EngineError, OSError, ...).
        model_unloaded(): the session was closed.
        prefill_progressed(int, int, int): request id, tokens evaluated, total new tokens.
        tokens_received(int, str, int): request id, coalesced text delta, number of tokens in it.
        generation_finished(object): a :class:`GenerationOutcome`.
        generation_failed(int, object): request id, the exception.
        prompt_view_ready(object): ``app.gui.workers.speculative.TokensView``: the last prompt and its reply.
        bandwidth_measured(float): the machine's memory bandwidth in GB/s (probed once, cached).
        retrieval_failed(int, object): request id and the exception: the passages could not be
            fitted (the reply goes on without them).
        reasoning_received(int, str): request id, coalesced thinking text.
        agent_recorded(int, object): request id, a record of the agent loop (agent_turn.agent_events).
        approval_requested(int, object): request id, an ``agent_turn.ApprovalRequest`` to answer.
    """

    model_loaded = Signal(object)
    model_load_failed = Signal(object)
    model_unloaded = Signal()
    prefill_progressed = Signal(int, int, int)
    tokens_received = Signal(int, str, int)
    generation_finished = Signal(object)
    generation_failed = Signal(int, object)
    prompt_view_ready = Signal(object)
    bandwidth_measured = Signal(float)
    retrieval_failed = Signal(int, object)
    reasoning_received = Signal(int, str)
    agent_recorded = Signal(int, object)
    approval_requested = Signal(int, object)

    def __init__(self, session_factory: SessionFactory | None = None) -> None:
        super().__init__()
        self._factory = session_factory or default_session_factory
        self._session: ChatBackend | None = None
        self._bandwidth: float | None = None
        self._bandwidth_done = False
        from app.gui.workers.agent_turn import ToolsetCache

        self._toolsets = ToolsetCache()

    # slots (run on the worker thread) --------------------------------------------------
    @Slot(object)
    def _on_load_requested(self, request: LoadRequest) -> None:
        self._close_session()
        started = time.perf_counter()
        if request.breadcrumb is not None:
            write_breadcrumb(request.breadcrumb, "load model", request.model_path)
        try:
            from app.gui.workers.speculative import load_session

            request = _resolve_gpu_layers(request)  # "auto" probes the hardware: here, never on the GUI thread
            session, info, request, draft_note = load_session(self._factory, request, self._bandwidth)
        except Exception as exc:  # noqa: BLE001 - boundary: every failure becomes a signal (CONTRIBUTING.md rule 18)
            if request.breadcrumb is not None:
                clear_breadcrumb(request.breadcrumb)
            self.model_load_failed.emit(exc)
            return
        if request.breadcrumb is not None:
            clear_breadcrumb(request.breadcrumb)
        self._session = session
        lower_priority(session)
        load_ms = (time.perf_counter() - started) * 1000
        label = request.label or request.model_path.name
        note = getattr(session, "backend_note", None)
        controls = tuple(sorted(getattr(getattr(session, "template", None), "thinking", None) or ()))
        self.model_loaded.emit(
            LoadedModel(
                request.model_path,
                label,
                info,
                load_ms,
                self._bandwidth,
                note,
                controls,
                request.draft_model_path,
                draft_note,
            )
        )
        if not self._bandwidth_done and request.bandwidth_cache is not None:
            # After the load, so the first reply is not delayed; cached for later runs.
            self._bandwidth = measure_bandwidth(request.bandwidth_cache)
            self._bandwidth_done = True
            if self._bandwidth is not None:
                if hasattr(session, "machine_bandwidth_gbps"):
                    session.machine_bandwidth_gbps = self._bandwidth
                self.bandwidth_measured.emit(self._bandwidth)

    @Slot()
    def _on_unload_requested(self) -> None:
        self._close_session()
        self.model_unloaded.emit()

    @Slot(object)
    def _on_generate_requested(self, request: GenerateRequest) -> None:
        session = self._session
        if session is None:
            from engine.errors import EngineError

            self.generation_failed.emit(request.request_id, EngineError("no model is loaded"))
            return
        started = time.perf_counter()
        pending: list[str] = []
        pending_tokens = 0
        thinking: list[str] = []
        last_emit = 0.0
        last_prefill = 0.0
        from app.gui.workers.speculative import ReplyTokens

        reply = ReplyTokens()  # for the inspector's token view (accepted drafts tinted)
        try:
            from app.gui.workers.agent_turn import TextBreak, agent_events, offers_search, stream_accepts
            from engine.inference.context import Message
            from engine.inference.events import Finished, PrefillProgress, Reasoning, Token

            history = [m if isinstance(m, Message) else Message(*m) for m in request.history]
            toolset = self._toolsets.get(request.tools, session) if request.tools is not None else None
            # With search_knowledge offered the model retrieves when it decides to: no passages up front.
            searches = toolset is not None and offers_search(toolset)
            documents, dropped = self._documents(request, session, searches)
            saved: dict[str, Any] = {}  # the KV cache saved with the chat, when the session keeps them
            if request.cache_key is not None and getattr(session, "kv_cache", None) is not None:
                from engine.inference.kv_cache import KvKey

                saved["cache_key"] = KvKey(*request.cache_key)
            if request.thinking is not None:
                saved["thinking"] = request.thinking
            if request.thinking_budget is not None:
                if not stream_accepts(session, "thinking_budget"):
                    from engine.errors import EngineError

                    raise EngineError(
                        "a thinking budget needs a local model (this one decodes on its server): "
                        "choose the model's default in the chat's Tools menu"
                    )
                saved["thinking_budget"] = request.thinking_budget
            if request.tools is not None:
                rid = request.request_id
                events = agent_events(
                    session,
                    toolset,
                    request,
                    history,
                    documents,
                    saved,
                    lambda ask: self.approval_requested.emit(rid, ask),
                    lambda rec: self.agent_recorded.emit(rid, rec),
                )
            else:
                events = session.stream(
                    history,
                    request.user,
                    request.params,
                    system=request.system,
                    documents=documents,
                    cancel=request.cancel,
                    **saved,
                )
            for event in events:
                now = time.perf_counter()
                if isinstance(event, (Reasoning, TextBreak)):
                    (thinking if isinstance(event, Reasoning) else pending).append(event.text)
                    if isinstance(event, TextBreak):
                        reply = ReplyTokens()  # the last prompt holds the generations before it
                    if now - last_emit >= COALESCE_S:
                        self._flush(request.request_id, thinking, pending, pending_tokens)
                        pending_tokens = 0
                        last_emit = now
                elif isinstance(event, Token):
                    pending.append(event.text)
                    pending_tokens += 1
                    reply.add(event)
                    if now - last_emit >= COALESCE_S:
                        self._flush(request.request_id, thinking, pending, pending_tokens)
                        pending_tokens = 0
                        last_emit = now
                elif isinstance(event, PrefillProgress):
                    if now - last_prefill >= COALESCE_S or event.done >= event.total:
                        self.prefill_progressed.emit(request.request_id, event.done, event.total)
                        last_prefill = now
                elif isinstance(event, Finished):
                    self._flush(request.request_id, thinking, pending, pending_tokens)
                    elapsed = (time.perf_counter() - started) * 1000
                    reasoning = (
                        {"text": event.reasoning, "tokens": event.reasoning_tokens, "ms": round(event.reasoning_ms, 2)}
                        if event.reasoning
                        else None
                    )
                    outcome = GenerationOutcome(
                        request.request_id, event.reason, event.text, event.stats, elapsed, reasoning, dropped
                    )
                    self.generation_finished.emit(outcome)
        except Exception as exc:  # noqa: BLE001 - boundary: EngineCrashed, ContextOverflow, ... become a signal
            self._flush(request.request_id, thinking, pending, pending_tokens)
            self.generation_failed.emit(request.request_id, exc)
            return
        self._emit_prompt_view(session, reply)

    def _documents(self, request: GenerateRequest, session: ChatBackend, searches: bool) -> tuple[str | None, int]:
        """The documents block of a turn and how many passages the documents band dropped.

        The passages came with the request; the engine's band fits them with this session's
        token counter. A fit that fails (the counter raised) is reported and the turn goes on
        without them.
        """
        if request.passages is None or searches:
            return request.documents, 0
        from engine.inference.context import fit_documents

        n_ctx = getattr(getattr(session, "info", None), "n_ctx", None) or 4096  # a remote server may not say
        try:
            fit = fit_documents(request.passages, n_ctx, session.count_text)
        except Exception as exc:  # noqa: BLE001 - documents are optional: answer without them
            self.retrieval_failed.emit(request.request_id, exc)
            return request.documents, 0
        return fit.text, fit.dropped

    def _flush(self, request_id: int, thinking: list[str], pending: list[str], tokens: int) -> None:
        """Sends the thinking and the text gathered since the last update, and empties both lists."""
        if thinking:
            self.reasoning_received.emit(request_id, "".join(thinking))
            thinking.clear()
        if pending:
            self.tokens_received.emit(request_id, "".join(pending), tokens)
            pending.clear()

    def _emit_prompt_view(self, session: ChatBackend, reply: Any = None) -> None:
        try:
            view = session.prompt_view()
        except Exception as exc:  # noqa: BLE001 - the prompt view is a nicety; never fail a turn for it
            log.warning("prompt view unavailable: %s", exc)
            return
        self.prompt_view_ready.emit(view if reply is None else reply.view(view))

    @Slot()
    def _on_shutdown_requested(self) -> None:
        self._close_session()

    def _close_session(self) -> None:
        try:
            self._toolsets.close()  # the MCP servers the chat's tools started
        except Exception as exc:  # noqa: BLE001 - closing must never raise into Qt
            log.warning("closing the tools failed: %s", exc)
        session, self._session = self._session, None
        if session is not None:
            try:
                session.close()
            except Exception as exc:  # noqa: BLE001 - closing must never raise into Qt
                log.warning("closing the model failed: %s", exc)

    def kill_for_shutdown(self) -> None:
        """Last resort at exit when the thread did not stop in time: kill the inference child."""
        session = self._session
        worker = getattr(session, "worker", None)
        if worker is not None:
            try:
                worker.close(kill=True, timeout=1.0)
            except Exception as exc:  # noqa: BLE001 - best effort at exit
                log.warning("killing the inference worker failed: %s", exc)
