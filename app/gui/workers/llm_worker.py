"""The LLM worker: one QThread owning the engine's ChatSession (CONTRIBUTING.md rules 2, 8, 9, 11).

Requests arrive as queued signals carrying immutable request objects
(:mod:`app.gui.workers.llm_requests`); each generation carries its own ``threading.Event`` that
the GUI sets directly for Stop. Loading a model is :mod:`app.gui.workers.llm_loading`; a turn's
events and their coalescing into at most ~30 updates per second are
:mod:`app.gui.workers.llm_generate`. This module owns the session and the signals.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Signal, Slot

from app.gui.workers.llm_loading import (
    SessionFactory,
    clear_breadcrumb,
    default_session_factory,
    measure_bandwidth,
    resolve_layers,
    write_breadcrumb,
)
from app.gui.workers.llm_requests import GenerateRequest, LoadedModel, LoadRequest, MediaInfoRequest

if TYPE_CHECKING:
    from PySide6.QtCore import SignalInstance

    from app.gui.workers.llm_generate import Coalescer
    from app.gui.workers.speculative import ReplyTokens
    from engine.inference.backends import ChatBackend

log = logging.getLogger(__name__)


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
        reasoning_received(int, str): request id, coalesced thinking text.
        agent_recorded(int, object): request id, a record of the agent loop (agent_turn.agent_events).
        approval_requested(int, object): request id, an ``agent_turn.ApprovalRequest`` to answer.
        call_progressed(int, int): request id, the tokens of the tool call being written (0: none now).
        media_measured(int, object): request id, and each attachment's ``MediaInfo`` (a list) or
            the exception (the model cannot see them: ``engine.media.MediaError``).
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
    reasoning_received = Signal(int, str)
    agent_recorded = Signal(int, object)
    approval_requested = Signal(int, object)
    call_progressed = Signal(int, int)
    media_measured = Signal(int, object)

    def __init__(self, session_factory: SessionFactory | None = None) -> None:
        super().__init__()
        self._factory = session_factory or default_session_factory
        self._session: ChatBackend | None = None
        self._bandwidth: float | None = None
        self._bandwidth_done = False
        from app.gui.workers.agent_tools import ToolsetCache

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
                if local is not None:
                    local.machine_bandwidth_gbps = self._bandwidth
                self.bandwidth_measured.emit(self._bandwidth)

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
        from app.gui.workers.llm_generate import Coalescer, outcome_of, turn_events

        rid = request.request_id
        stream = Coalescer(
            rid,
            self.tokens_received.emit,
            self.reasoning_received.emit,
            self.prefill_progressed.emit,
            self.call_progressed.emit,
        )
        try:
            from app.gui.workers.agent_tools import offers_search
            from engine.inference.context import Message
            from engine.inference.events import Finished

            history = [m if isinstance(m, Message) else Message(*m) for m in request.history]
            toolset = self._toolsets.get(request.tools, session) if request.tools is not None else None
            # With search_knowledge offered the model retrieves when it decides to: no passages up front.
            searches = toolset is not None and offers_search(toolset)
            documents = request.passages.documents if request.passages is not None and not searches else None
            events = turn_events(
                session,
                request,
                history,
                toolset,
                documents,
                lambda ask: self._after_flush(stream, self.approval_requested, rid, ask),
                lambda rec: self._after_flush(stream, self.agent_recorded, rid, rec),
            )
            for event in events:
                if isinstance(event, Finished):
                    stream.flush()
                    self.generation_finished.emit(outcome_of(request, event, started))
                else:
                    stream.take(event)
        except Exception as exc:  # noqa: BLE001 - boundary: EngineCrashed, ContextOverflow, ... become a signal
            stream.flush()
            self.generation_failed.emit(rid, exc)
            return
        self._emit_prompt_view(session, stream.reply)

    @staticmethod
    def _after_flush(stream: Coalescer, signal: SignalInstance, rid: int, payload: object) -> None:
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
        local = self._session.local if self._session is not None else None
        if local is not None:
            try:
                local.kill_worker(timeout=1.0)
            except Exception as exc:  # noqa: BLE001 - best effort at exit
                log.warning("killing the inference worker failed: %s", exc)
