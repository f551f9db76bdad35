"""The LLM worker: one QThread owning the chat backend (CONTRIBUTING.md rules 2, 8, 9, 11).

Requests arrive as queued signals carrying immutable request objects
(:mod:`app.gui.workers.llm_requests`); each generation carries its own ``threading.Event`` that
the GUI sets directly for Stop. Loading a model is :mod:`app.gui.workers.llm_loading`; a turn is
the app's one turn (``app.turn.run_turn``), its calls approved through
:mod:`app.gui.workers.agent_turn`; its text and thinking reach the GUI coalesced by
:class:`Coalescer`, at most ~30 updates per second. This module owns the backend and the signals.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, QTimer, Signal, Slot

from app.agent_history import TextBreak
from app.gui.workers.agent_tools import ToolsetCache
from app.gui.workers.agent_turn import gated_tools
from app.gui.workers.llm_loading import (
    SessionFactory,
    clear_breadcrumb,
    default_session_factory,
    measure_bandwidth,
    resolve_layers,
    write_breadcrumb,
)
from app.gui.workers.llm_requests import (
    CompareOutcome,
    CompareRequest,
    GenerateRequest,
    GenerationOutcome,
    LoadedModel,
    LoadRequest,
    MediaInfoRequest,
    ReasoningSummary,
)
from app.gui.workers.model_routing import RoutingSessionFactory
from app.gui.workers.resident_models import Kept, KeptModel, ResidentModels, ResidentState
from app.gui.workers.speculative import ReplyTokens, load_session
from app.turn import TurnEvent, run_turn
from engine.errors import Cancelled, EngineError
from engine.inference.events import CallProgress, Finished, PrefillProgress, Reasoning, Token, ToolCall

if TYPE_CHECKING:
    from pathlib import Path

    from PySide6.QtCore import SignalInstance

    from engine.inference.backends import ChatBackend

log = logging.getLogger(__name__)

SWEEP_MS = 15_000
"""How often the models kept loaded are checked for their idle unload (and their countdown said)."""


class LlmWorker(QObject):
    """Owns the ChatSession; lives on the ``glassbox-llm`` thread.

    Args:
        session_factory: builds a session for a LoadRequest (the real engine by default).

    Signals:
        model_loaded(object): a :class:`LoadedModel`.
        model_load_failed(object): the exception (EngineError, OSError, ...).
        model_unloaded(): the session was closed (and every model kept loaded beside it).
        resident_changed(object): the models kept loaded beside the chat's: a
            ``resident_models.ResidentState`` (after each load, and every few seconds while some
            are kept: their idle countdown).
        prefill_progressed(int, int, int): request id, tokens evaluated, total new tokens.
        tokens_received(int, str, int): request id, coalesced text delta, number of tokens in it.
        generation_finished(object): a :class:`GenerationOutcome`.
        generation_failed(int, object): request id, the exception.
        prompt_view_ready(object): ``app.gui.workers.speculative.TokensView``: the last prompt and its reply.
        bandwidth_measured(float): the machine's memory bandwidth in GB/s (probed once, cached).
        reasoning_received(int, str): request id, coalesced thinking text.
        agent_recorded(int, object): request id, a record of the agent loop (``app.agent_history``).
        approval_requested(int, object): request id, an ``agent_turn.ApprovalRequest`` to answer.
        call_progressed(int, int): request id, the tokens of the tool call being written (0: none now).
        media_measured(int, object): request id, and each attachment's ``MediaInfo`` (a list) or
            the exception (the model cannot see them: ``engine.media.MediaError``).
        comparison_finished(object): a :class:`CompareOutcome` (its comparison None when stopped).
        comparison_failed(int, object): request id, the exception.
    """

    model_loaded = Signal(object)
    model_load_failed = Signal(object)
    model_unloaded = Signal()
    resident_changed = Signal(object)
    prefill_progressed = Signal(int, int, int)
    tokens_received = Signal(int, str, int)
    generation_finished = Signal(object)
    generation_failed = Signal(int, object)
    prompt_view_ready = Signal(object)
    bandwidth_measured = Signal(float)
    reasoning_received = Signal(int, str)
    agent_recorded = Signal(int, object)
    approval_requested = Signal(int, object)
    call_progressed = Signal(int, int)
    media_measured = Signal(int, object)
    comparison_finished = Signal(object)
    comparison_failed = Signal(int, object)

    def __init__(self, session_factory: SessionFactory | None = None) -> None:
        super().__init__()
        self._factory = session_factory or default_session_factory
        self._session: ChatBackend | None = None
        self._current: Kept | None = None  # the chat's model, as it would be kept
        self._chat_memory: KeptModel | None = None  # the chat's model's memory (None: remote, unknown)
        self._resident = ResidentModels()
        self._sweeper: QTimer | None = None  # unloads idle kept models (made on this thread)
        self._adapters_set: tuple[ChatBackend, tuple[tuple[Path, float], ...]] | None = None  # set on it
        self._bandwidth: float | None = None
        self._bandwidth_done = False
        self._toolsets = ToolsetCache()

    # slots (run on the worker thread) --------------------------------------------------
    @Slot(object)
    def _on_load_requested(self, request: LoadRequest) -> None:
        started = time.perf_counter()
        asked = request
        if self._switch_to_kept(request, started):
            return
        if request.breadcrumb is not None:
            write_breadcrumb(request.breadcrumb, "load model", request.model_path)
        try:
            request = resolve_layers(request)  # "auto" probes the hardware: here, never on the GUI thread
            session, info, request, draft_note = load_session(self._factory, request, self._bandwidth)
        except Exception as exc:  # noqa: BLE001 - boundary: every failure becomes a signal (CONTRIBUTING.md rule 18)
            if request.breadcrumb is not None:
                clear_breadcrumb(request.breadcrumb)
            self.model_load_failed.emit(exc)
            return
        if request.breadcrumb is not None:
            clear_breadcrumb(request.breadcrumb)
        self._session = session
        load_ms = (time.perf_counter() - started) * 1000
        label = request.label or request.model_path.name
        local = session.local
        note = local.backend_note if local is not None else None
        controls = tuple(sorted(session.thinking_controls))
        loaded = LoadedModel(
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
        memory = self._resident.memory_of(asked) if local is not None else None
        self._chat_memory = KeptModel(label, memory, None, request.model_path) if memory is not None else None
        self._current = Kept(asked, session, loaded, memory) if memory is not None and asked.keep_loaded > 1 else None
        # The chat's model counted in memory, said before the load: whoever sees it loaded sees
        # the memory it holds too (the two signals reach the GUI thread in order).
        self.resident_changed.emit(self._resident_state())
        self.model_loaded.emit(loaded)
        if not self._bandwidth_done and request.bandwidth_cache is not None:
            # After the load, so the first reply is not delayed; cached for later runs.
            self._bandwidth = measure_bandwidth(request.bandwidth_cache)
            self._bandwidth_done = True
            if self._bandwidth is not None:
                if local is not None:
                    local.machine_bandwidth_gbps = self._bandwidth
                self.bandwidth_measured.emit(self._bandwidth)

    def _switch_to_kept(self, request: LoadRequest, started: float) -> bool:
        """Lets the chat's model go (kept loaded, when the setting allows and it fits, else closed);
        when ``request`` names a model kept loaded, makes it the chat's at once and says so."""
        self._close_tools()
        self._resident.idle_s = request.kept_idle_s
        kept = self._resident.take(request)
        current, self._current = self._current, None
        if current is None:
            self._close_session()
        self._session = None
        self._resident.keep(current, request.keep_loaded, None if kept is not None else request)
        self._chat_memory = None
        if kept is not None:
            self._session, self._current = kept.session, kept
            self._chat_memory = KeptModel(kept.loaded.label, kept.memory, None, kept.request.model_path)
            if isinstance(self._factory, RoutingSessionFactory):
                self._factory.last_session = kept.session  # the chat's session (ModelSlot.session)
        if self._resident.labels() and self._sweeper is None:
            self._sweeper = QTimer(self)
            self._sweeper.setInterval(SWEEP_MS)
            self._sweeper.timeout.connect(self._sweep_kept)
            self._sweeper.start()
        self.resident_changed.emit(self._resident_state())  # before model_loaded, as after a load
        if kept is not None:
            switch_ms = (time.perf_counter() - started) * 1000
            self.model_loaded.emit(replace(kept.loaded, load_ms=switch_ms, kept=True))
        return kept is not None

    def _resident_state(self) -> ResidentState:
        """The models in memory: those kept, the chat's, and what their workers hold now."""
        chat = self._session
        return self._resident.state(self._chat_memory, [chat] if chat is not None else [])

    @Slot()
    def _sweep_kept(self) -> None:
        """Unloads the kept models idle past Settings' time; says what is kept (the countdown)."""
        if self._resident.sweep() or self._resident.labels():
            self.resident_changed.emit(self._resident_state())

    @Slot(object)
    def _on_media_info_requested(self, request: MediaInfoRequest) -> None:
        """The projector's count for each attachment (a remote model's is its server's: None)."""
        session = self._session
        local = session.local if session is not None else None
        if local is None:
            self.media_measured.emit(request.request_id, None)
            return
        try:
            infos = local.media_info(list(request.media))
        except Exception as exc:  # noqa: BLE001 - boundary: the reason goes to the composer
            self.media_measured.emit(request.request_id, exc)
            return
        self.media_measured.emit(request.request_id, list(infos))

    @Slot()
    def _on_unload_requested(self) -> None:
        self._close_all()
        self.model_unloaded.emit()
        self.resident_changed.emit(self._resident_state())

    @Slot(object)
    def _on_generate_requested(self, request: GenerateRequest) -> None:
        session = self._session
        if session is None:
            self.generation_failed.emit(request.request_id, EngineError("no model is loaded"))
            return
        started = time.perf_counter()
        rid = request.request_id
        stream = Coalescer(
            rid,
            self.tokens_received.emit,
            self.reasoning_received.emit,
            self.prefill_progressed.emit,
            self.call_progressed.emit,
        )
        try:
            self._set_adapters(session, request.adapters)
            turn = request.turn
            if request.tools is not None:
                toolset = self._toolsets.get(request.tools, session)
                ask = partial(self._after_flush, stream, self.approval_requested, rid)
                turn = gated_tools(rid, turn, request.tools, toolset, ask)
            for event in run_turn(session, turn, partial(self._after_flush, stream, self.agent_recorded, rid)):
                if isinstance(event, Finished):
                    stream.flush()
                    self.generation_finished.emit(outcome_of(rid, event, started))
                else:
                    stream.take(event)
        except Exception as exc:  # noqa: BLE001 - boundary: EngineCrashed, ContextOverflow, ... become a signal
            stream.flush()
            self.generation_failed.emit(rid, exc)
            return
        self._emit_prompt_view(session, stream.reply)

    @Slot(object)
    def _on_compare_requested(self, request: CompareRequest) -> None:
        """A reply's prompt decoded greedily with the chat's adapters and without them, on this
        thread; the chat's adapters and KV cache are put back after (``ChatSession.compare_base``)."""
        started = time.perf_counter()
        session = self._session
        local = session.local if session is not None else None
        try:
            if session is None or local is None:
                raise EngineError("comparing with the base model needs a local model loaded")
            self._set_adapters(session, request.adapters)
            turn = request.turn
            comparison = local.compare_base(
                list(turn.history),
                turn.user,
                turn.params,
                system=turn.system,
                cancel=turn.cancel,
                thinking=turn.thinking,
                reasoning_effort=turn.reasoning_effort,
                media=turn.media,
            )
        except Cancelled:
            comparison = None
        except Exception as exc:  # noqa: BLE001 - boundary: every failure becomes a signal (CONTRIBUTING.md rule 18)
            self.comparison_failed.emit(request.request_id, exc)
            return
        elapsed = (time.perf_counter() - started) * 1000
        self.comparison_finished.emit(CompareOutcome(request.request_id, request.reply_id, comparison, elapsed))

    def _set_adapters(self, session: ChatBackend, adapters: tuple[tuple[Path, float], ...]) -> None:
        """The chat's LoRA adapters on the loaded model, when they changed (no reload). Raises
        AdapterMismatch or ModelFileError (one line naming the files), or EngineError for a model
        on a server."""
        local = session.local
        if local is None:
            if adapters:
                raise EngineError("a LoRA adapter applies to a local model; this chat's model runs on a server")
            return
        done = self._adapters_set
        if done is not None and done[0] is session and done[1] == adapters:
            return
        # lazy: start-up (+39 ms)
        from engine.inference.adapters import LoraAdapter

        local.set_adapters([LoraAdapter(path, scale) for path, scale in adapters])
        self._adapters_set = (session, adapters)

    @staticmethod
    def _after_flush(stream: Coalescer, signal: SignalInstance, rid: int, payload: Any) -> None:
        """Sends what was streamed so far, then ``signal``: a step's text and thinking reach the
        view before its record or its call's approval question."""
        stream.flush()
        signal.emit(rid, payload)

    def _emit_prompt_view(self, session: ChatBackend, reply: ReplyTokens | None = None) -> None:
        try:
            view = session.prompt_view()
        except Exception as exc:  # noqa: BLE001 - the prompt view is a nicety; never fail a turn for it
            log.warning("prompt view unavailable: %s", exc)
            return
        self.prompt_view_ready.emit(view if reply is None else reply.view(view))

    @Slot()
    def _on_shutdown_requested(self) -> None:
        self._close_all()

    def _close_all(self) -> None:
        """Closes the chat's model and every model kept loaded beside it."""
        if self._sweeper is not None:
            self._sweeper.stop()
            self._sweeper = None
        self._close_tools()
        self._close_session()
        self._resident.close_all()

    def _close_tools(self) -> None:
        try:
            self._toolsets.close()  # the MCP servers the chat's tools started
        except Exception as exc:  # noqa: BLE001 - closing must never raise into Qt
            log.warning("closing the tools failed: %s", exc)

    def _close_session(self) -> None:
        self._current = None
        self._chat_memory = None
        session, self._session = self._session, None
        if session is not None:
            try:
                session.close()
            except Exception as exc:  # noqa: BLE001 - closing must never raise into Qt
                log.warning("closing the model failed: %s", exc)

    def kill_for_shutdown(self) -> None:
        """Last resort at exit when the thread did not stop in time: kill the inference child."""
        sessions = [self._session, *self._resident.sessions()]
        for local in (s.local for s in sessions if s is not None):
            if local is None:
                continue
            try:
                local.kill_worker(timeout=1.0)
            except Exception as exc:  # noqa: BLE001 - best effort at exit
                log.warning("killing the inference worker failed: %s", exc)


COALESCE_S = 1 / 30
"""Minimum time between two text updates sent to the GUI."""


class Coalescer:
    """One turn's text, thinking and prefill progress, sent to the GUI at most every COALESCE_S.

    Args:
        request_id: the turn's request.
        send_text: ``(request id, text, tokens in it)``: the worker's ``tokens_received``.
        send_thinking: ``(request id, text)``: the worker's ``reasoning_received``.
        send_prefill: ``(request id, done, total)``: the worker's ``prefill_progressed``.
        send_call: ``(request id, tokens)``: the worker's ``call_progressed``: the tokens of the tool
            call being written (0 once it is written, or turned out to be text).
    """

    def __init__(
        self,
        request_id: int,
        send_text: Callable[[int, str, int], None],
        send_thinking: Callable[[int, str], None],
        send_prefill: Callable[[int, int, int], None],
        send_call: Callable[[int, int], None] | None = None,
    ) -> None:
        self._id = request_id
        self._send_text = send_text
        self._send_thinking = send_thinking
        self._send_prefill = send_prefill
        self._send_call = send_call
        self._call_tokens = 0  # the tokens of the call being written (CallProgress)
        self._call_sent = 0
        self._pending: list[str] = []
        self._pending_tokens = 0
        self._thinking: list[str] = []
        self._last_emit = 0.0
        self._last_prefill = 0.0
        self.reply = ReplyTokens()
        """The reply's tokens, for the inspector's token view (accepted drafts tinted)."""

    def take(self, event: TurnEvent) -> None:
        """Gathers a Token, Reasoning, TextBreak or CallProgress, reports a PrefillProgress; a
        ToolCall ends the call being written; ignores the rest (Stats, a ToolStep: the loop's
        records say it)."""
        now = time.perf_counter()
        if isinstance(event, (Reasoning, TextBreak)):
            (self._thinking if isinstance(event, Reasoning) else self._pending).append(event.text)
            if isinstance(event, TextBreak):
                self.reply = ReplyTokens()  # the last prompt holds the generations before it
            self._flush_due(now)
        elif isinstance(event, Token):
            self._pending.append(event.text)
            self._pending_tokens += 1
            self._call_tokens = 0
            self.reply.add(event)
            self._flush_due(now)
        elif isinstance(event, CallProgress):
            self._pending_tokens += 1  # generated, held back: counted for the speed, shown later
            self._call_tokens = event.tokens
            self._flush_due(now)
        elif isinstance(event, ToolCall):
            self._call_tokens = 0
        elif isinstance(event, PrefillProgress) and (
            now - self._last_prefill >= COALESCE_S or event.done >= event.total
        ):
            self._send_prefill(self._id, event.done, event.total)
            self._last_prefill = now

    def _flush_due(self, now: float) -> None:
        if now - self._last_emit >= COALESCE_S:
            self.flush()
            self._last_emit = now

    def flush(self) -> None:
        """Sends the thinking and the text gathered since the last update."""
        if self._thinking:
            self._send_thinking(self._id, "".join(self._thinking))
            self._thinking.clear()
        if self._pending or self._pending_tokens:
            self._send_text(self._id, "".join(self._pending), self._pending_tokens)
            self._pending.clear()
        self._pending_tokens = 0
        if self._send_call is not None and self._call_tokens != self._call_sent:
            self._send_call(self._id, self._call_tokens)
            self._call_sent = self._call_tokens


def outcome_of(request_id: int, event: Finished, started: float) -> GenerationOutcome:
    """The turn's outcome for its ``Finished`` (``started``: its ``time.perf_counter()``)."""
    elapsed = (time.perf_counter() - started) * 1000
    reasoning: ReasoningSummary | None = (
        {"text": event.reasoning, "tokens": event.reasoning_tokens, "ms": round(event.reasoning_ms, 2)}
        if event.reasoning
        else None
    )
    return GenerationOutcome(request_id, event.reason, event.text, event.stats, elapsed, reasoning)
